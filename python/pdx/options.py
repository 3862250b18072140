"""Engine options (``pdx_engine_options``, ``src/ffi/engine_options.rs``): the
keyword arguments of :class:`pdx.Engine`, and the transport an engine would
resolve with them."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_void_p

from .args import TransportChoice, _take_choice
from .binding import _declare, _enc, _Handle, _Signature, _SIGNATURES, check, lib, pdx_status

_OPTIONS_SIGNATURES: list[_Signature] = [
    ("pdx_engine_options_new", pdx_status, [POINTER(c_void_p)]),
    ("pdx_engine_options_free", None, [c_void_p]),
    ("pdx_engine_options_set", pdx_status, [c_void_p, c_char_p, c_char_p]),
    ("pdx_engine_options_get", pdx_status, [c_void_p, c_char_p, POINTER(c_char_p)]),
    ("pdx_resolve_transport_with", pdx_status, [c_char_p, c_char_p, c_char_p, c_void_p, POINTER(c_void_p)]),
]
_SIGNATURES += _OPTIONS_SIGNATURES
_declare(lib, _OPTIONS_SIGNATURES)


def _option_text(value: object) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    return None if value is None else str(value)


class _Options(_Handle):
    """A `pdx_engine_options` built from keyword arguments (None: not set)."""

    def __init__(self, options: dict[str, object]):
        self._h = c_void_p()
        check(lib.pdx_engine_options_new(ctypes.byref(self._h)))
        try:
            for key, value in options.items():
                text = _option_text(value)
                if text is not None:
                    check(lib.pdx_engine_options_set(self._h, key.encode(), text.encode()))
        except BaseException:
            self.close()
            raise

    def _free(self, handle: c_void_p) -> None:
        lib.pdx_engine_options_free(handle)


def resolve_transport_with(
    hostname: str, protocol: str | None = None, device: str | None = None, **options: object
) -> TransportChoice:
    """The transport `Engine(hostname, protocol, device, **options)` would use,
    without starting one (pdx_resolve_transport_with)."""
    handle = c_void_p()
    with _Options(options) as o:
        check(lib.pdx_resolve_transport_with(_enc(hostname), _enc(protocol), _enc(device), o._h, ctypes.byref(handle)))
    return _take_choice(handle)
