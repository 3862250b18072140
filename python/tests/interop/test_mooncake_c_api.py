"""pdx's libtransfer_engine.so (Mooncake's C API on pdx) <-> the Mooncake wheel's Python engine.

Our side runs in this process through Mooncake's C API (ctypes on
libtransfer_engine.so, the calls NIXL's Mooncake plugin makes); the wheel runs
in its own process (mooncake_peer.py). Both directions, with notifications:
the C API initiator writes and reads the wheel's memory and its notification
(with the data, and alone through genNotifyInEngine) reaches the wheel's
queue; the wheel writes and reads the C API engine's memory and its
notification comes out of getNotifsFromEngine.

The library is $PDX_TRANSFER_ENGINE_LIB, else target/release of this
checkout ($CARGO_TARGET_DIR honoured); the tests skip when it is not built
or the wheel is not installed.
"""

import ctypes
import hashlib
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("mooncake.engine", reason="the mooncake-transfer-engine-non-cuda wheel is not installed")

from peer_client import Peer  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
MiB = 1 << 20


def _library() -> Path | None:
    explicit = os.environ.get("PDX_TRANSFER_ENGINE_LIB")
    if explicit:
        return Path(explicit)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    path = target / "release" / "libtransfer_engine.so"
    return path if path.exists() else None


LIB_PATH = _library()
pytestmark = pytest.mark.skipif(LIB_PATH is None, reason="libtransfer_engine.so is not built (cargo build --release -p pdx-mooncake-c)")


class TransferRequest(ctypes.Structure):
    _fields_ = [("opcode", ctypes.c_int), ("source", ctypes.c_void_p), ("target_id", ctypes.c_int32),
                ("target_offset", ctypes.c_uint64), ("length", ctypes.c_uint64)]


class TransferStatus(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("transferred_bytes", ctypes.c_uint64)]


class NotifyMsg(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("msg", ctypes.c_char_p)]


READ, WRITE = 0, 1
WAITING, PENDING, COMPLETED, FAILED = 0, 1, 4, 6


def _load():
    lib = ctypes.CDLL(str(LIB_PATH), mode=ctypes.RTLD_LOCAL)
    E = ctypes.c_void_p
    sig = {
        "createTransferEngine": (E, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_int]),
        "destroyTransferEngine": (None, [E]),
        "getLocalIpAndPort": (ctypes.c_int, [E, ctypes.c_char_p, ctypes.c_size_t]),
        "openSegment": (ctypes.c_int32, [E, ctypes.c_char_p]),
        "registerLocalMemory": (ctypes.c_int, [E, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int]),
        "unregisterLocalMemory": (ctypes.c_int, [E, ctypes.c_void_p]),
        "allocateBatchID": (ctypes.c_uint64, [E, ctypes.c_size_t]),
        "submitTransfer": (ctypes.c_int, [E, ctypes.c_uint64, ctypes.POINTER(TransferRequest), ctypes.c_size_t]),
        "submitTransferWithNotify": (ctypes.c_int, [E, ctypes.c_uint64, ctypes.POINTER(TransferRequest),
                                                    ctypes.c_size_t, NotifyMsg]),
        "getTransferStatus": (ctypes.c_int, [E, ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER(TransferStatus)]),
        "freeBatchID": (ctypes.c_int, [E, ctypes.c_uint64]),
        "getNotifsFromEngine": (ctypes.POINTER(NotifyMsg), [E, ctypes.POINTER(ctypes.c_int)]),
        "freeNotifsMsgBuf": (ctypes.c_int, [ctypes.POINTER(NotifyMsg), ctypes.c_int]),
        "genNotifyInEngine": (ctypes.c_int, [E, ctypes.c_uint64, NotifyMsg]),
        "pdx_last_error_message": (ctypes.c_char_p, []),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


class CEngine:
    """One engine of Mooncake's C API, used as NIXL's plugin uses it."""

    def __init__(self, lib, size):
        self.lib = lib
        self.e = lib.createTransferEngine(b"P2PHANDSHAKE", b"127.0.0.1", b"", 0, 1)
        assert self.e, self.why()
        name = ctypes.create_string_buffer(64)
        assert lib.getLocalIpAndPort(self.e, name, 64) == 0
        self.name = name.value.decode()
        self.buf = ctypes.create_string_buffer(size)
        self.addr = ctypes.addressof(self.buf)
        assert lib.registerLocalMemory(self.e, self.addr, size, b"*", 1) == 0, self.why()

    def why(self):
        return self.lib.pdx_last_error_message().decode(errors="replace")

    def post(self, seg, op, entries, notify=None):
        """entries: (local offset, remote address, length); 0 when every task completed."""
        lib = self.lib
        batch = lib.allocateBatchID(self.e, 1024)
        reqs = (TransferRequest * len(entries))(
            *[TransferRequest(op, self.addr + lo, seg, ra, n) for lo, ra, n in entries])
        if notify:
            rc = lib.submitTransferWithNotify(self.e, batch, reqs, len(entries),
                                              NotifyMsg(notify[0].encode(), notify[1].encode()))
        else:
            rc = lib.submitTransfer(self.e, batch, reqs, len(entries))
        assert rc == 0, self.why()
        deadline = time.monotonic() + 60
        while True:
            states = []
            for t in range(len(entries)):
                s = TransferStatus()
                assert lib.getTransferStatus(self.e, batch, t, ctypes.byref(s)) == 0, self.why()
                states.append(s.status)
            if all(x not in (WAITING, PENDING) for x in states) or time.monotonic() > deadline:
                break
        assert lib.freeBatchID(self.e, batch) == 0, self.why()
        return 0 if all(x == COMPLETED for x in states) else -1

    def notifications(self, want, timeout=20.0):
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            size = ctypes.c_int(0)
            msgs = self.lib.getNotifsFromEngine(self.e, ctypes.byref(size))
            got += [(msgs[i].name.decode(), msgs[i].msg.decode()) for i in range(size.value)]
            assert self.lib.freeNotifsMsgBuf(msgs, size.value) == 0
            time.sleep(0.01)
        return got

    def close(self):
        assert self.lib.unregisterLocalMemory(self.e, self.addr) == 0
        self.lib.destroyTransferEngine(self.e)


@pytest.fixture
def sides():
    lib = _load()
    with Peer("mooncake", {}, name="mc-capi") as mc:
        ours = CEngine(lib, 8 * MiB)
        try:
            yield ours, mc, mc.alloc(8 * MiB)
        finally:
            ours.close()


def _pattern(n, salt):
    return bytes((i * 31 + salt) & 0xFF for i in range(n))


def test_c_api_initiator_to_wheel_target(sides):
    ours, mc, buf = sides
    seg = ours.lib.openSegment(ours.e, mc.session.encode())
    assert seg > 0, ours.why()
    data = _pattern(4 * MiB, 3)
    ctypes.memmove(ours.addr, data, len(data))
    entries = [(i * MiB, buf.addr + i * MiB, MiB) for i in range(4)]
    assert ours.post(seg, WRITE, entries, notify=("capi", "wrote 4")) == 0
    assert mc.sha256(buf, 0, 4 * MiB) == hashlib.sha256(data).hexdigest()
    assert mc.wait_notifies(1) == [("capi", "wrote 4")]
    # READ back what the wheel holds into another part of our memory.
    mc.fill(buf, 4 * MiB, 2 * MiB, byte=0x5A)
    assert ours.post(seg, READ, [(4 * MiB, buf.addr + 4 * MiB, 2 * MiB)]) == 0
    assert ours.buf.raw[4 * MiB:6 * MiB] == b"\x5a" * (2 * MiB)
    # A notification alone (genNotifyInEngine), with characters JSON escapes.
    note = 'req 7: "ok" \\ ü €'
    assert ours.lib.genNotifyInEngine(ours.e, seg, NotifyMsg(b"capi", note.encode())) == 0, ours.why()
    assert mc.wait_notifies(1) == [("capi", note)]


def test_wheel_initiator_to_c_api_target(sides):
    ours, mc, buf = sides
    mc.fill(buf, 0, 3 * MiB, byte=0xC3)
    entries = [(i * MiB, ours.addr + i * MiB, MiB) for i in range(3)]
    r = mc.batch("write", ours.name, buf, entries, notify=("wheel", "kv ready"))
    assert r["rc"] == 0, r
    assert ours.buf.raw[:3 * MiB] == b"\xc3" * (3 * MiB)
    assert ours.notifications(1) == [("wheel", "kv ready")]
    data = _pattern(MiB, 9)
    ctypes.memmove(ours.addr + 5 * MiB, data, MiB)
    r = mc.transfer("read", ours.name, buf, 6 * MiB, ours.addr + 5 * MiB, MiB)
    assert r["rc"] == 0, r
    assert mc.sha256(buf, 6 * MiB, MiB) == hashlib.sha256(data).hexdigest()
    assert ours.notifications(0) == []


def test_notification_bytes_both_ways(sides):
    """Names and messages as bytes through Mooncake's C API: the C strings'
    bytes (not UTF-8, msgpack) reach the wheel's queue intact; what the wheel
    sends comes out of getNotifsFromEngine as the wheel's JSON writer left it
    (mooncake_writer.received), cut at the first NUL as Mooncake's own
    library cuts it."""
    import mooncake_writer

    ours, mc, buf = sides
    seg = ours.lib.openSegment(ours.e, mc.session.encode())
    assert seg > 0, ours.why()
    every = bytes(range(1, 256))
    push = b"PUSH_REG:\x82\xa4name\xa1A\x8b\xff"
    mc.notifies_bytes()
    assert ours.lib.genNotifyInEngine(ours.e, seg, NotifyMsg(b"n\xff", every)) == 0, ours.why()
    assert ours.post(seg, WRITE, [(0, buf.addr, 4096)], notify=("push", "x")) == 0
    assert ours.lib.genNotifyInEngine(ours.e, seg, NotifyMsg(b"PUSH_REG", push)) == 0, ours.why()
    # Three sends that may ride different connections: their order of arrival is not
    # promised (by Mooncake either), their bytes are.
    assert sorted(mc.wait_notifies_bytes(3)) == sorted([(b"n\xff", every), (b"push", b"x"), (b"PUSH_REG", push)])

    sent = [(b"PUSH_REG", push), (b"every", every), (b"nul", b"before\x00after")]
    for i, (name, msg) in enumerate(sent):
        r = mc.transfer("write", ours.name, buf, 0, ours.addr + i * 4096, 64, notify=(name, msg))
        assert r["rc"] == 0, r
    got = []
    deadline = time.monotonic() + 20
    while len(got) < len(sent) and time.monotonic() < deadline:
        size = ctypes.c_int(0)
        msgs = ours.lib.getNotifsFromEngine(ours.e, ctypes.byref(size))
        got += [(msgs[i].name, msgs[i].msg) for i in range(size.value)]  # c_char_p: the bytes up to NUL
        assert ours.lib.freeNotifsMsgBuf(msgs, size.value) == 0
        time.sleep(0.01)
    cut = [(mooncake_writer.received(n).split(b"\0")[0], mooncake_writer.received(m).split(b"\0")[0]) for n, m in sent]
    assert sorted(got) == sorted(cut)
    assert (b"nul", b"before") in got
