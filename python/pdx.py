"""ctypes binding for libpdx.

Every exported C function is declared here with its argtypes and restype, so
a wrong call fails in Python instead of corrupting memory. Errors become
`PdxError` with the status code, its name and pdx's last error message.

The library is found through `PDX_LIB` (a path to libpdx.so), else
`target/release/libpdx.so`, else `target/debug/libpdx.so` next to this folder.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_char_p, c_int32, c_size_t, c_uint16, c_uint64, c_void_p
from pathlib import Path

pdx_status = c_int32

STATUS_NAMES = {
    0: "PDX_OK",
    -1: "PDX_ERR_NULL_ARGUMENT",
    -2: "PDX_ERR_INVALID_UTF8",
    -3: "PDX_ERR_INVALID_ARGUMENT",
    -4: "PDX_ERR_PANIC",
    -5: "PDX_ERR_UNKNOWN_KEY",
    -6: "PDX_ERR_INVALID_VALUE",
    -7: "PDX_ERR_VALUE_ERROR",
    -8: "PDX_ERR_ASSERTION",
    -9: "PDX_ERR_RUNTIME",
    -10: "PDX_ERR_UNKNOWN_PROTOCOL",
    -11: "PDX_ERR_BACKEND_UNAVAILABLE",
    -12: "PDX_ERR_INDEX_OUT_OF_RANGE",
    -13: "PDX_ERR_IO",
    -14: "PDX_ERR_INVALID_HANDLE",
    -15: "PDX_ERR_ADDRESS_NOT_REGISTERED",
    -16: "PDX_ERR_REMOTE_REJECTED",
    -17: "PDX_ERR_ADDRESS_OVERLAP",
    -18: "PDX_ERR_TIMEOUT",
    -19: "PDX_ERR_PEER_UNREACHABLE",
    -20: "PDX_ERR_CONNECTION_LOST",
    -21: "PDX_ERR_PROTOCOL",
    -22: "PDX_ERR_BUSY",
    -23: "PDX_ERR_NOT_FOUND",
    -24: "PDX_ERR_SHUTDOWN",
    -25: "PDX_ERR_NOTIFY_REJECTED",
}
globals().update({name: code for code, name in STATUS_NAMES.items()})


class PdxError(Exception):
    """A pdx call returned a negative status."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.name = STATUS_NAMES.get(status, f"status {status}")
        self.message = message
        super().__init__(f"{self.name}: {message}")


def _find_library() -> str:
    explicit = os.environ.get("PDX_LIB")
    if explicit:
        return explicit
    root = Path(__file__).resolve().parent.parent
    for profile in ("release", "debug"):
        candidate = root / "target" / profile / "libpdx.so"
        if candidate.exists():
            return str(candidate)
    raise OSError("libpdx.so not found: build it with `cargo build --release` or set PDX_LIB")


# (name, restype, argtypes) for every exported function.
_SIGNATURES = [
    ("pdx_version", c_char_p, []),
    ("pdx_status_str", c_char_p, [pdx_status]),
    ("pdx_last_error_message", c_char_p, []),
]


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(_find_library())
    for name, restype, argtypes in _SIGNATURES:
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


lib = _load()


def last_error() -> str:
    return lib.pdx_last_error_message().decode()


def check(status: int) -> None:
    """Raise PdxError for a negative status."""
    if status != 0:
        raise PdxError(status, last_error())


def version() -> str:
    return lib.pdx_version().decode()


def status_str(status: int) -> str:
    return lib.pdx_status_str(status).decode()


def _enc(text: str | None) -> bytes | None:
    return None if text is None else text.encode()
