"""The slice of pdx's engine C ABI that the interop tests use, through ctypes.

It uses the pdx package's declarations but not its Engine wrapper: it opens its own
ctypes handle on the same libpdx.so, and the tests call exactly the C
functions of the ABI. Methods return the raw
`pdx_status` (0 ok, negative error) so tests can check exact codes; the last
error text comes from `pdx.last_error()`.
"""

from __future__ import annotations

import ctypes
import sys
from ctypes import byref, c_char_p, c_int32, c_size_t, c_uint64, c_void_p
from pathlib import Path

_PYTHON_DIR = Path(__file__).resolve().parents[2]
if str(_PYTHON_DIR) not in sys.path:
    sys.path.insert(0, str(_PYTHON_DIR))

import pdx  # noqa: E402  (python/pdx/: finds and loads libpdx.so)

PDX_OK = 0
PDX_ERR_TIMEOUT = -18
PDX_ERR_REMOTE_REJECTED = -16
OPCODE_READ = 0
OPCODE_WRITE = 1

# The engine functions the interop tests call, with the pdx package's declarations
# (one source of truth for argtypes/restype).
_USED = {
    "pdx_engine_init", "pdx_engine_free", "pdx_engine_session_id", "pdx_engine_rpc_port", "pdx_engine_protocol",
    "pdx_register_memory", "pdx_unregister_memory", "pdx_batch_register_memory", "pdx_batch_unregister_memory",
    "pdx_transfer_sync_write", "pdx_transfer_sync_read", "pdx_batch_transfer_sync_write",
    "pdx_batch_transfer_sync_read", "pdx_send_probe", "pdx_send_notify", "pdx_notifications_drain",
    "pdx_notifications_count", "pdx_notification_get", "pdx_notifications_free", "pdx_batch_submit",
    "pdx_batch_wait", "pdx_batch_free", "pdx_peer_info", "pdx_send_notify_bytes", "pdx_notification_get_bytes",
    "pdx_batch_submit_notify_bytes",
}
_ENGINE_FUNCTIONS = [sig for sig in pdx._SIGNATURES if sig[0] in _USED]


def has_engine_api() -> bool:
    """True when the loaded libpdx.so exports the engine ABI."""
    return hasattr(pdx.lib, "pdx_engine_init")


def missing_functions() -> list[str]:
    return [name for name, _, _ in _ENGINE_FUNCTIONS if not hasattr(pdx.lib, name)]


def load() -> ctypes.CDLL:
    """A private ctypes handle on libpdx.so with the engine functions declared."""
    lib = ctypes.CDLL(pdx.lib._name)
    missing = missing_functions()
    if missing:
        raise OSError(f"libpdx.so lacks {', '.join(missing)}")
    for name, restype, argtypes in _ENGINE_FUNCTIONS:
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def _b(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _arrays(locals_, remotes, lens):
    n = len(locals_)
    return (
        (c_void_p * n)(*locals_),
        (c_uint64 * n)(*remotes),
        (c_size_t * n)(*lens),
        n,
    )


class Engine:
    """A pdx engine. Methods return the raw status code; `last_error()` explains failures."""

    def __init__(self, hostname: str = "127.0.0.1", protocol: str | None = "tcp", device: str | None = ""):
        self.lib = load()
        handle = c_void_p()
        status = self.lib.pdx_engine_init(_b(hostname), _b(protocol), _b(device), byref(handle))
        if status != PDX_OK or not handle.value:
            raise RuntimeError(f"pdx_engine_init failed: status {status}: {pdx.last_error()}")
        self.handle = handle

    @staticmethod
    def last_error() -> str:
        return pdx.last_error()

    def close(self):
        if self.handle:
            self.lib.pdx_engine_free(self.handle)
            self.handle = None

    def session_id(self) -> str:
        return self.lib.pdx_engine_session_id(self.handle).decode()

    def rpc_port(self) -> int:
        return int(self.lib.pdx_engine_rpc_port(self.handle))

    def protocol(self) -> str:
        return self.lib.pdx_engine_protocol(self.handle).decode()

    def register_memory(self, addr: int, length: int) -> int:
        return self.lib.pdx_register_memory(self.handle, addr, length)

    def unregister_memory(self, addr: int) -> int:
        return self.lib.pdx_unregister_memory(self.handle, addr)

    def batch_register_memory(self, addrs, lens) -> int:
        n = len(addrs)
        return self.lib.pdx_batch_register_memory(self.handle, (c_void_p * n)(*addrs), (c_size_t * n)(*lens), n)

    def batch_unregister_memory(self, addrs) -> int:
        n = len(addrs)
        return self.lib.pdx_batch_unregister_memory(self.handle, (c_void_p * n)(*addrs), n)

    def transfer_sync_write(self, session: str, local: int, remote: int, length: int) -> int:
        return self.lib.pdx_transfer_sync_write(self.handle, _b(session), local, remote, length)

    def transfer_sync_read(self, session: str, local: int, remote: int, length: int) -> int:
        return self.lib.pdx_transfer_sync_read(self.handle, _b(session), local, remote, length)

    def batch_transfer_sync_write(self, session: str, locals_, remotes, lens) -> int:
        return self.lib.pdx_batch_transfer_sync_write(self.handle, _b(session), *_arrays(locals_, remotes, lens))

    def batch_transfer_sync_read(self, session: str, locals_, remotes, lens) -> int:
        return self.lib.pdx_batch_transfer_sync_read(self.handle, _b(session), *_arrays(locals_, remotes, lens))

    def peer_info(self, session: str) -> tuple[int, str]:
        """`pdx_peer_info`: (status, JSON text)."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = c_size_t()
        rc = self.lib.pdx_peer_info(self.handle, _b(session), buf, len(buf), byref(n))
        return rc, buf.value.decode() if rc == PDX_OK else ""

    def send_probe(self, session: str) -> int:
        return self.lib.pdx_send_probe(self.handle, _b(session))

    def send_notify(self, session: str, name: str, msg: str) -> int:
        return self.lib.pdx_send_notify(self.handle, _b(session), _b(name), _b(msg))

    def send_notify_bytes(self, session: str, name: bytes, msg: bytes) -> int:
        note, _keep = pdx.engine.notify_struct((name, msg))
        return self.lib.pdx_send_notify_bytes(self.handle, _b(session), note)

    def drain_notifications_bytes(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        out = c_void_p()
        status = self.lib.pdx_notifications_drain(self.handle, byref(out))
        if status != PDX_OK:
            return status, []
        pairs = []
        try:
            for i in range(self.lib.pdx_notifications_count(out)):
                note = pdx.NotifyBytes()
                status = self.lib.pdx_notification_get_bytes(out, i, byref(note))
                if status != PDX_OK:
                    return status, pairs
                pairs.append((ctypes.string_at(note.name, note.name_len), ctypes.string_at(note.msg, note.msg_len)))
        finally:
            self.lib.pdx_notifications_free(out)
        return PDX_OK, pairs

    def drain_notifications(self) -> tuple[int, list[tuple[str, str]]]:
        out = c_void_p()
        status = self.lib.pdx_notifications_drain(self.handle, byref(out))
        if status != PDX_OK:
            return status, []
        pairs = []
        try:
            for i in range(self.lib.pdx_notifications_count(out)):
                name, msg = c_char_p(), c_char_p()
                status = self.lib.pdx_notification_get(out, i, byref(name), byref(msg))
                if status != PDX_OK:
                    return status, pairs
                pairs.append(((name.value or b"").decode(), (msg.value or b"").decode()))
        finally:
            self.lib.pdx_notifications_free(out)
        return PDX_OK, pairs

    def batch_submit(self, session: str, opcode: int, locals_, remotes, lens,
                     notify_name: str | bytes | None = None, notify_msg: str | bytes | None = None) -> tuple[int, int]:
        batch = c_uint64(0)
        if isinstance(notify_name, bytes) or isinstance(notify_msg, bytes):
            note, _keep = pdx.engine.notify_struct((notify_name, notify_msg))
            status = self.lib.pdx_batch_submit_notify_bytes(
                self.handle, _b(session), opcode, *_arrays(locals_, remotes, lens), note, byref(batch)
            )
            return status, batch.value
        status = self.lib.pdx_batch_submit(self.handle, _b(session), opcode, *_arrays(locals_, remotes, lens),
                                           _b(notify_name), _b(notify_msg), byref(batch))
        return status, batch.value

    def batch_wait(self, batch: int, timeout_ms: int) -> tuple[int, int]:
        state = c_int32(-1)
        status = self.lib.pdx_batch_wait(self.handle, batch, timeout_ms, byref(state))
        return status, state.value

    def batch_free(self, batch: int) -> int:
        return self.lib.pdx_batch_free(self.handle, batch)
