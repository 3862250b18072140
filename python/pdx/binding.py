"""The binding to libpdx, pdx's C ABI (``include/pdx.h``): loading the library,
the status codes and :class:`PdxError`, the declared prototypes, and the
helpers every other module of the package builds on (text in and out, owned
handles, the backend queries).

Every exported C function is declared in ``_SIGNATURES`` with its argtypes
and restype, so a wrong call fails in Python instead of corrupting memory;
each module declares its own functions into it on import. Errors become
:class:`PdxError` with the status code, its name and pdx's last error
message.

The library is looked up, in order (see :func:`find_library`):

1. ``PDX_LIB``: a path to ``libpdx.so``, or a directory holding it. When set,
   it is the only place tried (a wrong explicit path is an error, never
   silently replaced by another build);
2. the package directory (the copy a wheel bundles);
3. ``target/release`` then ``target/debug`` of the source checkout this
   package sits in (``python/pdx`` of a checkout);
4. the system loader (``LD_LIBRARY_PATH``, ``ldconfig``) by the name
   ``libpdx.so``.

If none loads, :class:`OSError` names every place tried and why it failed.
"""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Callable, Iterator
from ctypes import POINTER, c_char_p, c_int32, c_size_t, c_uint16, c_void_p
from pathlib import Path
from typing import Any, TypeVar

pdx_status = c_int32

# Status codes (pdx_status in include/pdx.h; never reused, new ones appended). These and STATUS_NAMES are
# checked against the Rust table (src/ffi/status.rs) by a test there that fails on any difference.
PDX_OK = 0
PDX_ERR_NULL_ARGUMENT = -1
PDX_ERR_INVALID_UTF8 = -2
PDX_ERR_INVALID_ARGUMENT = -3
PDX_ERR_PANIC = -4
PDX_ERR_UNKNOWN_KEY = -5
PDX_ERR_INVALID_VALUE = -6
PDX_ERR_VALUE_ERROR = -7
PDX_ERR_ASSERTION = -8
PDX_ERR_RUNTIME = -9
PDX_ERR_UNKNOWN_PROTOCOL = -10
PDX_ERR_BACKEND_UNAVAILABLE = -11
PDX_ERR_INDEX_OUT_OF_RANGE = -12
PDX_ERR_IO = -13
PDX_ERR_INVALID_HANDLE = -14
PDX_ERR_ADDRESS_NOT_REGISTERED = -15
PDX_ERR_REMOTE_REJECTED = -16
PDX_ERR_ADDRESS_OVERLAP = -17
PDX_ERR_TIMEOUT = -18
PDX_ERR_PEER_UNREACHABLE = -19
PDX_ERR_CONNECTION_LOST = -20
PDX_ERR_PROTOCOL = -21
PDX_ERR_BUSY = -22
PDX_ERR_NOT_FOUND = -23
PDX_ERR_SHUTDOWN = -24
PDX_ERR_NOTIFY_REJECTED = -25
PDX_ERR_DEVICE_UNAVAILABLE = -26
PDX_ERR_DEVICE = -27
PDX_ERR_CANCELED = -28

STATUS_NAMES: dict[int, str] = {
    PDX_OK: "PDX_OK",
    PDX_ERR_NULL_ARGUMENT: "PDX_ERR_NULL_ARGUMENT",
    PDX_ERR_INVALID_UTF8: "PDX_ERR_INVALID_UTF8",
    PDX_ERR_INVALID_ARGUMENT: "PDX_ERR_INVALID_ARGUMENT",
    PDX_ERR_PANIC: "PDX_ERR_PANIC",
    PDX_ERR_UNKNOWN_KEY: "PDX_ERR_UNKNOWN_KEY",
    PDX_ERR_INVALID_VALUE: "PDX_ERR_INVALID_VALUE",
    PDX_ERR_VALUE_ERROR: "PDX_ERR_VALUE_ERROR",
    PDX_ERR_ASSERTION: "PDX_ERR_ASSERTION",
    PDX_ERR_RUNTIME: "PDX_ERR_RUNTIME",
    PDX_ERR_UNKNOWN_PROTOCOL: "PDX_ERR_UNKNOWN_PROTOCOL",
    PDX_ERR_BACKEND_UNAVAILABLE: "PDX_ERR_BACKEND_UNAVAILABLE",
    PDX_ERR_INDEX_OUT_OF_RANGE: "PDX_ERR_INDEX_OUT_OF_RANGE",
    PDX_ERR_IO: "PDX_ERR_IO",
    PDX_ERR_INVALID_HANDLE: "PDX_ERR_INVALID_HANDLE",
    PDX_ERR_ADDRESS_NOT_REGISTERED: "PDX_ERR_ADDRESS_NOT_REGISTERED",
    PDX_ERR_REMOTE_REJECTED: "PDX_ERR_REMOTE_REJECTED",
    PDX_ERR_ADDRESS_OVERLAP: "PDX_ERR_ADDRESS_OVERLAP",
    PDX_ERR_TIMEOUT: "PDX_ERR_TIMEOUT",
    PDX_ERR_PEER_UNREACHABLE: "PDX_ERR_PEER_UNREACHABLE",
    PDX_ERR_CONNECTION_LOST: "PDX_ERR_CONNECTION_LOST",
    PDX_ERR_PROTOCOL: "PDX_ERR_PROTOCOL",
    PDX_ERR_BUSY: "PDX_ERR_BUSY",
    PDX_ERR_NOT_FOUND: "PDX_ERR_NOT_FOUND",
    PDX_ERR_SHUTDOWN: "PDX_ERR_SHUTDOWN",
    PDX_ERR_NOTIFY_REJECTED: "PDX_ERR_NOTIFY_REJECTED",
    PDX_ERR_DEVICE_UNAVAILABLE: "PDX_ERR_DEVICE_UNAVAILABLE",
    PDX_ERR_DEVICE: "PDX_ERR_DEVICE",
    PDX_ERR_CANCELED: "PDX_ERR_CANCELED",
}


class PdxError(Exception):
    """A pdx call returned a negative status.

    ``status`` is the code (``PDX_ERR_*``), ``name`` its constant's name and
    ``message`` pdx's last error message for the failing call.
    """

    def __init__(self, status: int, message: str):
        """An error for `status` with pdx's `message`."""
        self.status = status
        self.name = STATUS_NAMES.get(status, f"status {status}")
        self.message = message
        super().__init__(f"{self.name}: {message}")


LIBRARY_NAME = "libpdx.so"
_PACKAGE_DIR = Path(__file__).resolve().parent


def _package_candidates() -> list[Path]:
    """The library files a wheel may have bundled next to this file.

    setuptools-rust names the copy after the extension (``libpdx.abi3.so``);
    a plain ``libpdx.so`` dropped in by hand is accepted too."""
    found = [_PACKAGE_DIR / LIBRARY_NAME]
    found += sorted(p for p in _PACKAGE_DIR.glob("libpdx.*.so") if p not in found)
    return found


def _candidates() -> Iterator[tuple[str, Callable[[], ctypes.CDLL]]]:
    """(description, loader) for every place tried, in order."""

    def from_file(path: Path) -> Callable[[], ctypes.CDLL]:
        def load() -> ctypes.CDLL:
            if not path.is_file():
                raise OSError("no such file")
            return ctypes.CDLL(str(path))

        return load

    explicit = os.environ.get("PDX_LIB")
    if explicit:
        path = Path(explicit)
        if path.is_dir():
            path = path / LIBRARY_NAME
        yield f"PDX_LIB={explicit} ({path})", from_file(path)
        return
    for path in _package_candidates():
        yield f"package directory ({path})", from_file(path)
    root = _PACKAGE_DIR.parent.parent  # <checkout>/python/pdx -> <checkout>
    if (root / "Cargo.toml").is_file():
        for profile in ("release", "debug"):
            path = root / "target" / profile / LIBRARY_NAME
            yield f"checkout build ({path})", from_file(path)
    yield f"system loader ({LIBRARY_NAME} via LD_LIBRARY_PATH / ldconfig)", lambda: ctypes.CDLL(LIBRARY_NAME)


def find_library() -> tuple[ctypes.CDLL, str]:
    """Load libpdx: (the library, a description of where it came from).

    Raises OSError naming every place tried (see the module docstring)."""
    tried = []
    for where, load in _candidates():
        try:
            return load(), where
        except OSError as exc:
            tried.append(f"  {where}: {exc}")
    raise OSError(
        "libpdx.so not found; tried, in order:\n"
        + "\n".join(tried)
        + "\nbuild it with `cargo build --release`, install the wheel (`pip install .`), or set PDX_LIB"
    )


# (name, restype, argtypes) for every exported function.
_Signature = tuple[str, Any, list[Any]]
_SIGNATURES: list[_Signature] = [
    ("pdx_version", c_char_p, []),
    ("pdx_status_str", c_char_p, [pdx_status]),
    ("pdx_last_error_message", c_char_p, []),
    ("pdx_backend_available", c_int32, [c_char_p]),
    ("pdx_session_id", pdx_status, [c_char_p, c_uint16, POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
    ("pdx_backend_unavailable_reason", pdx_status, [c_char_p, POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
    ("pdx_capabilities", pdx_status, [POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t)]),
]


def _declare(lib: ctypes.CDLL, signatures: list[_Signature]) -> None:
    for name, restype, argtypes in signatures:
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


lib, _library_where = find_library()
_declare(lib, _SIGNATURES)


def library_path() -> str:
    """Where the loaded libpdx came from (the description find_library gave)."""
    return _library_where


def last_error() -> str:
    """pdx's last error message on this thread ("" before any failure)."""
    raw: bytes = lib.pdx_last_error_message()
    return raw.decode(errors="replace")


def check(status: int) -> None:
    """Raise PdxError for a non-zero status (with the last error message)."""
    if status != 0:
        raise PdxError(status, last_error())


def version() -> str:
    """The library's version string ("pdx/X.Y.Z")."""
    raw: bytes = lib.pdx_version()
    return raw.decode()


def status_str(status: int) -> str:
    """pdx's short description of a status code."""
    raw: bytes = lib.pdx_status_str(status)
    return raw.decode()


def _enc(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _dec(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()


def _text(raw: bytes | None) -> str:
    """A string pdx documents as never NULL for a valid handle."""
    if raw is None:
        check(PDX_ERR_NULL_ARGUMENT)
    assert raw is not None
    return raw.decode()


_H = TypeVar("_H", bound="_Handle")


class _Handle:
    """An owned pdx handle `_h`, freed once (by `_free`): at `close()`, at
    the end of a `with` block, or when collected."""

    _h: c_void_p

    def _free(self, handle: c_void_p) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Free the handle (idempotent)."""
        if self._h:
            self._free(self._h)
            self._h = c_void_p()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _grown_text(call: Callable[[Any, int, Any], int]) -> str:
    """A text a pdx function copies out, when its length may change between
    the call that asks for the length and the one that copies."""
    needed = c_size_t()
    check(call(None, 0, ctypes.byref(needed)))
    while True:
        buf = ctypes.create_string_buffer(needed.value + 1 + needed.value // 8)
        check(call(buf, len(buf), ctypes.byref(needed)))
        if needed.value < len(buf):
            return buf.raw[: needed.value].decode()


def backend_available(name: str) -> bool:
    """Whether backend `name` ("tcp", "mooncake") can run in this process."""
    return bool(lib.pdx_backend_available(_enc(name)) == 1)


def backend_unavailable_reason(name: str) -> str:
    """Why `backend_available(name)` is false ("" when it is available)."""
    needed = c_size_t()
    check(lib.pdx_backend_unavailable_reason(_enc(name), None, 0, ctypes.byref(needed)))
    buf = ctypes.create_string_buffer(needed.value + 1)
    check(lib.pdx_backend_unavailable_reason(_enc(name), buf, len(buf), ctypes.byref(needed)))
    return buf.value.decode()


def capabilities() -> dict[str, Any]:
    """What this build and machine can serve: backends (native tcp; Mooncake's
    engine and whether its library loads, and why not) and memory kinds (see
    `pdx_capabilities`)."""
    needed = c_size_t()
    check(lib.pdx_capabilities(None, 0, ctypes.byref(needed)))
    buf = ctypes.create_string_buffer(needed.value + 1)
    check(lib.pdx_capabilities(buf, len(buf), ctypes.byref(needed)))
    parsed: dict[str, Any] = json.loads(buf.value.decode())
    return parsed


def session_id(host: str, port: int) -> str:
    """`host:port` as Mooncake names sessions (IPv6 literals bracketed)."""
    buf = ctypes.create_string_buffer(300)
    needed = c_size_t()
    check(lib.pdx_session_id(_enc(host), port, buf, len(buf), ctypes.byref(needed)))
    if needed.value >= len(buf):
        buf = ctypes.create_string_buffer(needed.value + 1)
        check(lib.pdx_session_id(_enc(host), port, buf, len(buf), ctypes.byref(needed)))
    return buf.value.decode()
