"""Run SGLang's own PD rules on cases read from stdin; write the outcomes.

Runs under the oracle environment's Python (scripts/sglang-oracle-env.sh:
sglang installed with --no-deps, plus msgspec), never under pdx's. For each
case it builds a real `ServerArgs` (0.5.23 constructs it unresolved), sets
the case's environment, and runs, in the order 0.5.23's resolution pipeline
does, `handle_deprecated_dp_attention`, `handle_pd_disaggregation` and
`handle_load_balance_method`; then `handle_encoder_disaggregation` up to its
IB validation. It records the resolved fields (the declarations over the
record, and `enable_dp_attention` as `resolved_dict` reports it), the
environment afterwards, the exception (class and text), and every log line
and Python warning in order. It also runs `validate_ib_devices` and
`_validate_efa_allocator_compatibility` on their own cases.

How it imports SGLang without torch. `sglang/__init__.py` (the frontend
API) is skipped by registering a bare `sglang` package; the modules the
argument code imports but never calls on these paths (platform discovery,
`srt.utils`, distributed, model configs, kernels, layers, hardware
backends, and any third-party module the environment lacks, torch
included) are served as stubs. A stub only records at import time; once
the cases run it raises on any use (attribute, call, iteration), and the
runner reports every use, so a rule that reaches stubbed code fails the
oracle instead of passing quietly. The test asserts the list is empty.

One function is replaced: 0.5.23's `rust_server_serves_kv_bootstrap`
imports every backend's connection module (torch, CUDA) to ask whether the
backend's bootstrap server derives from `CommonKVBootstrapServer`. The
runner answers the same question from the installed sources, read with
`ast`: `get_kv_class`'s backend-to-bootstrap-class table and the class
hierarchy of `srt/disaggregation/*/conn.py`, behind the real
`TransferBackend(name)` enum conversion (built from the enum's members, so
an unknown name raises Python's own `ValueError`).
"""

from __future__ import annotations

import ast
import enum
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
import types
import warnings
from pathlib import Path

STUBBED_SGLANG = (
    "sglang.srt.platforms",
    "sglang.srt.utils",
    "sglang.srt.distributed",
    "sglang.srt.configs",
    "sglang.kernels",
    "sglang.srt.hardware_backend",
    "sglang.srt.layers",
)
# Real modules below stubbed packages: the IB parser the IB validator calls.
REAL_UNDER_STUBS = ("sglang.srt.distributed.device_communicators.mooncake_transfer_engine",)
ARMED = False
TOUCHED: list[str] = []


class OracleStubTouched(Exception):
    """A rule under test used a stubbed module."""


class Stub:
    """Any name taken from a stubbed module."""

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def _touch(self, what):
        name = object.__getattribute__(self, "_name")
        if ARMED:
            TOUCHED.append(f"{name} {what}")
            raise OracleStubTouched(f"{name} {what}")
        return Stub(f"{name}{what}")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self._touch("." + attr)

    def __call__(self, *args, **kwargs):
        if not ARMED and len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # a decorator at import time
        return self._touch("()")

    def __mro_entries__(self, bases):
        self._touch(" subclassed")
        return (object,)

    def __getitem__(self, key):
        return self._touch("[]")

    def __iter__(self):
        self._touch(" iterated")
        return iter(())

    def _op(self, *args):
        return self._touch(" operated on")

    __or__ = __ror__ = __add__ = __radd__ = __sub__ = __mul__ = __and__ = __rand__ = _op

    def __hash__(self):
        return id(self)


class StubModule(types.ModuleType):
    def __init__(self, name):
        super().__init__(name)
        self.__path__ = []

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if ARMED:
            TOUCHED.append(f"{self.__name__}.{attr}")
            raise OracleStubTouched(f"{self.__name__}.{attr}")
        return Stub(f"{self.__name__}.{attr}")


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    root = None

    def find_spec(self, name, path, target=None):
        if name in REAL_UNDER_STUBS:
            file = self.root.joinpath(*name.split(".")[1:]).with_suffix(".py")
            return importlib.util.spec_from_file_location(name, file)
        if name.split(".")[0] == "sglang":
            if not any(name == p or name.startswith(p + ".") for p in STUBBED_SGLANG):
                return None
        else:
            for finder in sys.meta_path:
                if finder is self:
                    continue
                try:
                    if finder.find_spec(name, path, target) is not None:
                        return None
                except Exception:
                    pass
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return StubModule(spec.name)

    def exec_module(self, module):
        pass


def install_import_shims():
    spec = importlib.util.find_spec("sglang")
    package = types.ModuleType("sglang")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["sglang"] = package
    finder = StubFinder()
    finder.root = Path(package.__path__[0])
    sys.meta_path.insert(0, finder)
    return finder.root


def rust_server_serves_kv_bootstrap_from_sources(package: Path):
    """0.5.23's `rust_server_serves_kv_bootstrap`, its backend imports
    answered from the sources (see the module docstring)."""
    disagg = package / "srt" / "disaggregation"
    utils = ast.parse((disagg / "utils.py").read_text(encoding="utf-8"))
    members = {}
    bootstrap = {}
    for node in utils.body:
        if isinstance(node, ast.ClassDef) and node.name == "TransferBackend":
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
                    members[stmt.targets[0].id] = stmt.value.value
        if isinstance(node, ast.FunctionDef) and node.name == "get_kv_class":
            for branch in ast.walk(node):
                if not isinstance(branch, ast.If):
                    continue
                test = branch.test
                if not (isinstance(test, ast.Compare) and isinstance(test.comparators[0], ast.Attribute)):
                    continue
                member = test.comparators[0].attr
                found = None
                for stmt in branch.body:
                    for d in ast.walk(stmt):
                        if isinstance(d, ast.Dict):
                            for k, v in zip(d.keys, d.values):
                                if isinstance(k, ast.Attribute) and k.attr == "BOOTSTRAP_SERVER":
                                    found = v.id
                bootstrap[member] = found
    bases = {}
    for conn in disagg.glob("*/conn.py"):
        for node in ast.parse(conn.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and node.bases and isinstance(node.bases[0], ast.Name):
                bases[node.name] = node.bases[0].id

    def derives(name):
        while name is not None:
            if name == "CommonKVBootstrapServer":
                return True
            name = bases.get(name)
        return False

    transfer_backend = enum.Enum("TransferBackend", members)

    def rust_server_serves_kv_bootstrap(backend: str) -> bool:
        member = transfer_backend(backend)
        server_class = bootstrap.get(member.name)
        return server_class is not None and derives(server_class)

    return rust_server_serves_kv_bootstrap


class Events(logging.Handler):
    """Log records and Python warnings, in the order they happen."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append([record.levelno, record.getMessage()])

    def warning(self, message, *args, **kwargs):
        self.lines.append([logging.WARNING, str(message)])


def plain(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return None
    if isinstance(value, float):
        return repr(value)
    return str(value)


def main():
    global ARMED
    request = json.load(sys.stdin)
    package = install_import_shims()

    from sglang.srt.arg_groups import validation_hook
    from sglang.srt.arg_groups.model_override_base import _declaration_overlay, resolving_view
    from sglang.srt.arg_groups.parallel_hook import handle_deprecated_dp_attention
    from sglang.srt.arg_groups.pd_disaggregation_hook import (
        handle_encoder_disaggregation,
        handle_pd_disaggregation,
    )
    from sglang.srt.arg_groups.serving_hook import handle_load_balance_method
    from sglang.srt.disaggregation.mooncake.utils import (
        _validate_efa_allocator_compatibility,
        check_mooncake_custom_mem_pool_enabled,
    )
    from sglang.srt.server_args import ServerArgs

    # What handle_encoder_disaggregation imports when called, imported now.
    import sglang.srt.arg_groups.model_hook  # noqa: F401

    service = types.ModuleType("sglang.srt.managers.disagg_service")
    service.rust_server_serves_kv_bootstrap = rust_server_serves_kv_bootstrap_from_sources(package)
    sys.modules["sglang.srt.managers.disagg_service"] = service

    # validate_ib_devices reads /sys/class/infiniband; point it at the case's directory.
    sysfs = {"root": None}
    real_isdir, real_listdir = os.path.isdir, os.listdir

    def isdir(path):
        return real_isdir(sysfs["root"] if path == "/sys/class/infiniband" else path)

    def listdir(path="."):
        return real_listdir(sysfs["root"] if path == "/sys/class/infiniband" else path)

    os.path.isdir, os.listdir = isdir, listdir

    class IbCalled(Exception):
        pass

    ib_calls = []

    def recording_validate_ib_devices(value):
        ib_calls.append(value)
        raise IbCalled

    watched = set(request["env_names"])
    events = Events()
    root_logger = logging.getLogger("sglang")
    root_logger.addHandler(events)
    root_logger.setLevel(logging.DEBUG)
    root_logger.propagate = False
    warnings.showwarning = events.warning
    warnings.simplefilter("always")

    def with_env(env):
        for name in watched:
            os.environ.pop(name, None)
        os.environ.update(env)

    def run(fn):
        try:
            return fn(), None
        except OracleStubTouched:
            raise
        except Exception as e:  # noqa: BLE001 - the class is the result
            return None, [type(e).__name__, str(e)]

    ARMED = True
    out = {"cases": [], "ib": [], "efa": [], "touched": TOUCHED}
    for case in request["cases"]:
        with_env(case["env"])
        events.lines = []
        args = ServerArgs(model_path="dummy", **case["fields"])

        def rules():
            handle_deprecated_dp_attention(args)
            handle_pd_disaggregation(args)
            handle_load_balance_method(args)

        _, error = run(rules)
        result = {"error": error, "messages": list(events.lines)}
        if error is None:
            overlay = _declaration_overlay(args)
            resolved = {f: plain(overlay.get(f, getattr(args, f))) for f in request["fields"]}
            resolved["enable_dp_attention"] = plain(resolving_view(args).attn_dp_size > 1)
            result["resolved"] = resolved
            # 0.5.23's IB-validation placement, its own code up to the call.
            ib_calls.clear()
            saved = validation_hook.validate_ib_devices
            validation_hook.validate_ib_devices = recording_validate_ib_devices
            try:
                handle_encoder_disaggregation(args)
            except IbCalled:
                pass
            except OracleStubTouched:
                # Past the IB check it reads the model: not a rule under test.
                result["after_ib"] = TOUCHED.pop()
            except Exception as e:  # noqa: BLE001 - an encoder refusal before the IB check
                result["placement_error"] = [type(e).__name__, str(e)]
            finally:
                validation_hook.validate_ib_devices = saved
            result["ib_validated"] = bool(ib_calls)
        result["env"] = {n: os.environ.get(n) for n in sorted(watched)}
        out["cases"].append(result)

    for case in request["ib"]:
        sysfs["root"] = case["sysfs"]
        events.lines = []
        value, error = run(lambda: validation_hook.validate_ib_devices(case["devices"]))
        out["ib"].append({"value": value, "error": error, "messages": events.lines})

    for case in request["efa"]:
        with_env(case["env"])
        events.lines = []
        _, error = run(lambda: _validate_efa_allocator_compatibility(*check_mooncake_custom_mem_pool_enabled()))
        out["efa"].append({"error": error, "messages": events.lines})

    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
