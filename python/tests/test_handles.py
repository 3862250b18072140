"""Stale handles from Python: free, make again, use the freed handle.

pdx reuses a freed object's slot, so a new object can sit where the old one
was; the old handle must still be refused every time (PDX_ERR_INVALID_HANDLE)
and never reach the new object.
"""

import ctypes
from ctypes import byref, c_char_p, c_void_p

import pdx

CYCLES = 1000


def test_stale_args_handles_are_refused_every_cycle():
    lib = pdx.lib
    old = c_void_p()
    pdx.check(lib.pdx_args_new(byref(old)))
    refused = 0
    for _ in range(CYCLES):
        lib.pdx_args_free(old)
        fresh = c_void_p()
        pdx.check(lib.pdx_args_new(byref(fresh)))
        assert fresh.value != old.value
        status = lib.pdx_args_set(old, b"disaggregation_mode", b"decode")
        mode = c_char_p()
        pdx.check(lib.pdx_args_get(fresh, b"disaggregation_mode", byref(mode)))
        assert mode.value == b"null", "the stale handle reached the new object"
        if status == pdx.PDX_ERR_INVALID_HANDLE:
            refused += 1
        old = fresh
    lib.pdx_args_free(old)
    assert refused == CYCLES, f"{refused} of {CYCLES} refused"


def test_stale_engine_handles_are_refused_every_cycle():
    lib = pdx.lib
    region = ctypes.create_string_buffer(64)
    old = c_void_p()
    pdx.check(lib.pdx_engine_init(b"127.0.0.1", b"tcp", None, byref(old)))
    refused = 0
    for _ in range(CYCLES):
        lib.pdx_engine_free(old)
        fresh = c_void_p()
        pdx.check(lib.pdx_engine_init(b"127.0.0.1", b"tcp", None, byref(fresh)))
        status = lib.pdx_register_memory(old, ctypes.addressof(region), 64)
        # Had the stale handle reached the new engine, this would overlap.
        pdx.check(lib.pdx_register_memory(fresh, ctypes.addressof(region), 64))
        if status == pdx.PDX_ERR_INVALID_HANDLE and lib.pdx_engine_session_id(old) is None:
            refused += 1
        old = fresh
    lib.pdx_engine_free(old)
    assert refused == CYCLES, f"{refused} of {CYCLES} refused"
