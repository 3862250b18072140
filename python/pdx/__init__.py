"""pdx: KV-cache transfer for prefill/decode disaggregation, from Python.

A ctypes binding of libpdx's C ABI (``include/pdx.h``). This module only hands
on the names of the modules that do the work:

- :mod:`pdx.binding`: loading libpdx (``PDX_LIB``, the package, the checkout,
  the system loader; see :func:`find_library`), status codes and
  :class:`PdxError`, the declared prototypes, backend queries;
- :mod:`pdx.args`: SGLang's PD arguments (:class:`Args`), transport
  resolution and IB device configuration;
- :mod:`pdx.options`: engine options and :func:`resolve_transport_with`;
- :mod:`pdx.engine`: the transfer engine (:class:`Engine`);
- :mod:`pdx.log`: pdx's log records in Python's ``logging``;
- :mod:`pdx.kv`: KV-cache page plans; :mod:`pdx.metrics`: a Prometheus
  collector; :mod:`pdx.mooncake`: Mooncake's ``TransferEngine`` API on pdx.

Every C function is declared (argtypes, restype) before use, so a wrong call
fails in Python instead of corrupting memory; errors become :class:`PdxError`
with the status code, its name and pdx's last error message.
"""

from __future__ import annotations

__all__ = [
    "Args",
    "BatchSummary",
    "Engine",
    "PdxError",
    "TransportChoice",
    "add_transfer_backend_choice",
    "backend_available",
    "backend_unavailable_reason",
    "check",
    "check_efa_allocator",
    "find_library",
    "get_ib_devices_for_gpu",
    "last_error",
    "lib",
    "library_path",
    "parse_ib_device_config",
    "resolve_transport",
    "resolve_transport_with",
    "session_id",
    "status_str",
    "validate_ib_devices",
    "version",
]

from .binding import (
    _candidates as _candidates,
    _dec as _dec,
    _declare as _declare,
    _enc as _enc,
    _grown_text as _grown_text,
    _H as _H,
    _Handle as _Handle,
    _library_where as _library_where,
    _package_candidates as _package_candidates,
    _PACKAGE_DIR as _PACKAGE_DIR,
    _Signature as _Signature,
    _SIGNATURES as _SIGNATURES,
    _text as _text,
    backend_available as backend_available,
    backend_unavailable_reason as backend_unavailable_reason,
    capabilities as capabilities,
    check as check,
    find_library as find_library,
    last_error as last_error,
    lib as lib,
    LIBRARY_NAME as LIBRARY_NAME,
    library_path as library_path,
    PDX_ERR_ADDRESS_NOT_REGISTERED as PDX_ERR_ADDRESS_NOT_REGISTERED,
    PDX_ERR_ADDRESS_OVERLAP as PDX_ERR_ADDRESS_OVERLAP,
    PDX_ERR_ASSERTION as PDX_ERR_ASSERTION,
    PDX_ERR_BACKEND_UNAVAILABLE as PDX_ERR_BACKEND_UNAVAILABLE,
    PDX_ERR_BUSY as PDX_ERR_BUSY,
    PDX_ERR_CANCELED as PDX_ERR_CANCELED,
    PDX_ERR_CONNECTION_LOST as PDX_ERR_CONNECTION_LOST,
    PDX_ERR_DEVICE as PDX_ERR_DEVICE,
    PDX_ERR_DEVICE_UNAVAILABLE as PDX_ERR_DEVICE_UNAVAILABLE,
    PDX_ERR_INDEX_OUT_OF_RANGE as PDX_ERR_INDEX_OUT_OF_RANGE,
    PDX_ERR_INVALID_ARGUMENT as PDX_ERR_INVALID_ARGUMENT,
    PDX_ERR_INVALID_HANDLE as PDX_ERR_INVALID_HANDLE,
    PDX_ERR_INVALID_UTF8 as PDX_ERR_INVALID_UTF8,
    PDX_ERR_INVALID_VALUE as PDX_ERR_INVALID_VALUE,
    PDX_ERR_IO as PDX_ERR_IO,
    PDX_ERR_NOT_FOUND as PDX_ERR_NOT_FOUND,
    PDX_ERR_NOTIFY_REJECTED as PDX_ERR_NOTIFY_REJECTED,
    PDX_ERR_NULL_ARGUMENT as PDX_ERR_NULL_ARGUMENT,
    PDX_ERR_PANIC as PDX_ERR_PANIC,
    PDX_ERR_PEER_UNREACHABLE as PDX_ERR_PEER_UNREACHABLE,
    PDX_ERR_PROTOCOL as PDX_ERR_PROTOCOL,
    PDX_ERR_REMOTE_REJECTED as PDX_ERR_REMOTE_REJECTED,
    PDX_ERR_RUNTIME as PDX_ERR_RUNTIME,
    PDX_ERR_SHUTDOWN as PDX_ERR_SHUTDOWN,
    PDX_ERR_TIMEOUT as PDX_ERR_TIMEOUT,
    PDX_ERR_UNKNOWN_KEY as PDX_ERR_UNKNOWN_KEY,
    PDX_ERR_UNKNOWN_PROTOCOL as PDX_ERR_UNKNOWN_PROTOCOL,
    PDX_ERR_VALUE_ERROR as PDX_ERR_VALUE_ERROR,
    PDX_OK as PDX_OK,
    pdx_status as pdx_status,
    PdxError as PdxError,
    session_id as session_id,
    STATUS_NAMES as STATUS_NAMES,
    status_str as status_str,
    version as version,
)

from .args import (
    _CONFIG_SIGNATURES as _CONFIG_SIGNATURES,
    _environ_snapshot as _environ_snapshot,
    _take_choice as _take_choice,
    add_transfer_backend_choice as add_transfer_backend_choice,
    Args as Args,
    check_efa_allocator as check_efa_allocator,
    get_ib_devices_for_gpu as get_ib_devices_for_gpu,
    parse_ib_device_config as parse_ib_device_config,
    PDX_IB_CONFIG_ALL_GPUS as PDX_IB_CONFIG_ALL_GPUS,
    PDX_IB_CONFIG_NONE as PDX_IB_CONFIG_NONE,
    PDX_IB_CONFIG_PER_GPU as PDX_IB_CONFIG_PER_GPU,
    PDX_LOG_INFO as PDX_LOG_INFO,
    PDX_LOG_WARNING as PDX_LOG_WARNING,
    resolve_transport as resolve_transport,
    TransportChoice as TransportChoice,
    validate_ib_devices as validate_ib_devices,
)

from .options import (
    _option_text as _option_text,
    _Options as _Options,
    resolve_transport_with as resolve_transport_with,
)

from .engine import (
    _ENGINE_SIGNATURES as _ENGINE_SIGNATURES,
    _entries as _entries,
    _memory as _memory,
    _opcode as _opcode,
    BatchSummary as BatchSummary,
    Engine as Engine,
    Entry as Entry,
    Memory as Memory,
    NoteText as NoteText,
    NotifyBytes as NotifyBytes,
    PDX_OPCODE_READ as PDX_OPCODE_READ,
    PDX_OPCODE_WRITE as PDX_OPCODE_WRITE,
    PDX_TASK_CANCELED as PDX_TASK_CANCELED,
    PDX_TASK_COMPLETED as PDX_TASK_COMPLETED,
    PDX_TASK_FAILED as PDX_TASK_FAILED,
    PDX_TASK_PENDING as PDX_TASK_PENDING,
    Stats as Stats,
    STATS_FIELDS as STATS_FIELDS,
)

from .log import (
    _detach_log_handler as _detach_log_handler,
    _log_callback as _log_callback,
    _LOG_SIGNATURES as _LOG_SIGNATURES,
    LOG_CALLBACK as LOG_CALLBACK,
    PDX_LOG_DEBUG as PDX_LOG_DEBUG,
    PDX_LOG_ERROR as PDX_LOG_ERROR,
    PDX_LOG_TRACE as PDX_LOG_TRACE,
    remove_log_handler as remove_log_handler,
    set_log_handler as set_log_handler,
)

# The KV API declares its functions into _SIGNATURES on import, so that the
# package's list is complete once `import pdx` returns.
from . import kv as kv
