"""pdx's log records in Python's :mod:`logging` (``pdx_set_log_callback``,
``src/ffi/log.rs``); levels are on logging's scale."""

from __future__ import annotations

import atexit
import ctypes
import logging
from ctypes import POINTER, c_int32, c_size_t, c_void_p
from typing import Any

from .binding import _declare, _Signature, _SIGNATURES, check, lib, pdx_status

PDX_LOG_TRACE = 5
PDX_LOG_DEBUG = 10
PDX_LOG_ERROR = 40
#: void (*)(void *userdata, int32_t level, const char *module, size_t module_len,
#:          const char *message, size_t message_len); LOG_CALLBACK() is NULL.
LOG_CALLBACK = ctypes.CFUNCTYPE(None, c_void_p, c_int32, POINTER(ctypes.c_char), c_size_t,
                                POINTER(ctypes.c_char), c_size_t)
_LOG_SIGNATURES: list[_Signature] = [
    ("pdx_set_log_callback", pdx_status, [LOG_CALLBACK, c_void_p, c_int32]),
]
_SIGNATURES += _LOG_SIGNATURES
_declare(lib, _LOG_SIGNATURES)

# The installed callback: kept referenced while pdx may call it.
_log_callback: Any = None


def set_log_handler(logger: logging.Logger | None = None, level: int | None = None) -> None:
    """Route pdx's log records into Python's `logging`, or back to stderr.

    Records go to the child of `logger` named after the pdx module that
    logged (`pdx::engine::batch` -> `<logger>.engine.batch`); `logger`
    defaults to `logging.getLogger("pdx")`. Records below `level` (default:
    the logger's effective level) are dropped inside pdx, before any Python
    code runs. `remove_log_handler()` undoes it.
    Records logged from pdx's own threads arrive on those threads.
    """
    global _log_callback
    target = logger if logger is not None else logging.getLogger("pdx")
    threshold = target.getEffectiveLevel() if level is None else level

    def deliver(_userdata: object, lvl: int, module: Any, module_len: int, message: Any, message_len: int) -> None:
        try:
            name = ctypes.string_at(module, module_len).decode("utf-8", "replace")
            text = ctypes.string_at(message, message_len).decode("utf-8", "replace")
            parts = name.split("::")[1:]
            child = target.getChild(".".join(parts)) if parts else target
            child.log(lvl, "%s", text)
        except Exception:  # a handler must never unwind into pdx
            pass

    callback = LOG_CALLBACK(deliver)
    check(lib.pdx_set_log_callback(callback, None, threshold))
    _log_callback = callback


def remove_log_handler() -> None:
    """Send pdx's records to stderr again (`RUST_LOG` filters them). Returns
    once no call into the previous handler is running."""
    global _log_callback
    check(lib.pdx_set_log_callback(LOG_CALLBACK(), None, 0))
    _log_callback = None


@atexit.register
def _detach_log_handler() -> None:
    # pdx threads may still log while the interpreter shuts down.
    if _log_callback is not None:
        lib.pdx_set_log_callback(LOG_CALLBACK(), None, 0)
