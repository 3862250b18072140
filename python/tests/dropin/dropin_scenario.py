#!/usr/bin/env python3
"""One scenario for Mooncake's ``TransferEngine`` API, run against any implementation.

    dropin_scenario.py --initiator wheel --target pdx     # prints the outcome as JSON

``wheel`` is ``mooncake.engine.TransferEngine`` from the PyPI wheel, ``pdx`` is
``pdx.mooncake.TransferEngine``. The initiator runs in this process; the
target is this script again (``--serve IMPL``) in a child process, driven by
JSON lines. Every call's return value (or the exception's type), the bytes
that arrived (sha256 of the target's / initiator's ranges), notifications,
batch statuses and the public attributes of the class go into one JSON
document, so runs with different implementations can be compared key by key.
Both engines use protocol ``tcp`` with ``MC_FORCE_TCP=1`` on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import random
import socket
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(os.path.dirname(HERE))  # python/ of the checkout
HOST = "127.0.0.1"
KiB = 1024
SIZE = 1024 * KiB
GAP = (512 * KiB, 516 * KiB)  # never registered on the target: refused addresses
NO_SUCH_HOST = "pdx-no-such-host.invalid:12345"


def load(impl: str) -> Any:
    """The module that provides TransferEngine, TransferNotify and TransferOpcode."""
    os.environ["MC_FORCE_TCP"] = "1"
    if impl == "wheel":
        import mooncake.engine as module
    elif impl == "pdx":
        if PYTHON_DIR not in sys.path:
            sys.path.insert(0, PYTHON_DIR)
        import pdx.mooncake as module
    else:
        raise SystemExit(f"unknown implementation {impl!r}")
    return module


class Region:
    """An anonymous mapping and its address."""

    def __init__(self, size: int):
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.anchor = ctypes.c_char.from_buffer(self.map)
        self.addr = ctypes.addressof(self.anchor)

    def fill(self, offset: int, length: int, seed: int) -> None:
        self.map[offset : offset + length] = random.Random(seed).randbytes(length)

    def sha(self, offset: int, length: int) -> str:
        return hashlib.sha256(self.map[offset : offset + length]).hexdigest()[:16]


def start_engine(module: Any) -> Any:
    engine = module.TransferEngine()
    rc = engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise SystemExit(f"initialize returned {rc}")
    return engine


# ------------------------------------------------------------------ target


def serve(impl: str) -> int:
    """The target: one engine, one 1 MiB region registered except GAP; commands on stdin."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # native logging that writes to fd 1 must not reach the reply pipe
    module = load(impl)
    engine = start_engine(module)
    region = Region(SIZE)
    for start, end in ((0, GAP[0]), (GAP[1], SIZE)):
        assert engine.register_memory(region.addr + start, end - start) == 0
    reply.write(json.dumps({"session": f"{HOST}:{engine.get_rpc_port()}", "base": region.addr}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            break
        if op == "fill":
            region.fill(cmd["offset"], cmd["len"], cmd["seed"])
            out: Any = None
        elif op == "sha":
            out = region.sha(cmd["offset"], cmd["len"])
        elif op == "notifies":
            deadline = time.monotonic() + 10
            got: list[list[str]] = []
            while len(got) < cmd["expect"] and time.monotonic() < deadline:
                got += [[n.name, n.msg] for n in engine.get_notifies()]
                time.sleep(0.01)
            out = got
        else:
            out = f"unknown op {op}"
        reply.write(json.dumps({"result": out}) + "\n")
    reply.close()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown with engine threads alive


class Target:
    def __init__(self, impl: str):
        env = dict(os.environ, MC_FORCE_TCP="1")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", impl],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        hello = json.loads(self._line())
        self.session: str = hello["session"]
        self.base: int = hello["base"]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"target exited with {self.proc.wait()}")
        return line

    def call(self, **cmd: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())["result"]

    def close(self) -> None:
        try:
            self.call(op="quit")
        except (SystemExit, BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --------------------------------------------------------------- initiator


def closed_port() -> int:
    s = socket.socket()
    s.bind((HOST, 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def run(initiator: str, target_impl: str) -> dict[str, Any]:
    module = load(initiator)
    TE, Notify, Op = module.TransferEngine, module.TransferNotify, module.TransferOpcode
    # Not part of the outcome: which class actually ran (the shim serves pdx's as mooncake.engine).
    sys.stdout.write(f"SERVED_BY {TE.__module__}\n")
    out: dict[str, Any] = {}

    def record(name: str, fn: Any, *args: Any) -> Any:
        try:
            value = fn(*args)
        except Exception as exc:  # the outcome is the exception's type
            out[name] = f"raises {type(exc).__name__}"
            return None
        out[name] = value
        return value

    # The class itself.
    out["public_attributes"] = sorted(n for n in dir(TE) if not n.startswith("_"))
    out["opcodes"] = {name: int(member) for name, member in Op.__members__.items()}
    out["class_opcode_is_module_opcode"] = TE.TransferOpcode is Op
    out["notify_fields"] = [Notify("a", "b").name, Notify("a", "b").msg, Notify().name]
    record("constructor_with_argument", TE, 1)

    target = Target(target_impl)
    try:
        engine = TE()
        out["initialize"] = engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
        port = engine.get_rpc_port()
        out["rpc_port_is_int"] = isinstance(port, int) and 0 < port < 65536
        t, tb = target.session, target.base
        dead = f"{HOST}:{closed_port()}"

        local, spare = Region(SIZE), Region(64 * KiB)
        la = local.addr
        # Registration.
        out["register"] = engine.register_memory(la, SIZE)
        out["register_again"] = engine.register_memory(la, SIZE)
        out["register_overlapping"] = engine.register_memory(la + 4 * KiB, 4 * KiB)
        out["register_zero_length"] = engine.register_memory(spare.addr, 0)
        out["unregister_unknown"] = engine.unregister_memory(spare.addr + 8)
        halves = [spare.addr, spare.addr + 32 * KiB]
        out["batch_register"] = engine.batch_register_memory(halves, [32 * KiB, 32 * KiB])
        out["batch_register_overlapping"] = engine.batch_register_memory([spare.addr + 16], [4])
        out["batch_unregister"] = engine.batch_unregister_memory(halves)
        out["batch_unregister_unknown"] = engine.batch_unregister_memory(halves)
        out["register_spare"] = engine.register_memory(spare.addr, 64 * KiB)
        out["unregister_spare"] = engine.unregister_memory(spare.addr)
        out["unregister_spare_again"] = engine.unregister_memory(spare.addr)

        # Synchronous single transfers.
        local.fill(0, 256 * KiB, seed=1)
        out["write"] = engine.transfer_sync_write(t, la, tb, 256 * KiB)
        out["write_arrived"] = target.call(op="sha", offset=0, len=256 * KiB) == local.sha(0, 256 * KiB)
        out["write_target_sha"] = target.call(op="sha", offset=0, len=256 * KiB)
        target.call(op="fill", offset=256 * KiB, len=64 * KiB, seed=2)
        out["read"] = engine.transfer_sync_read(t, la + 600 * KiB, tb + 256 * KiB, 64 * KiB)
        out["read_local_sha"] = local.sha(600 * KiB, 64 * KiB)
        out["read_matches"] = local.sha(600 * KiB, 64 * KiB) == target.call(op="sha", offset=256 * KiB, len=64 * KiB)
        out["write_zero_length"] = engine.transfer_sync_write(t, la, tb, 0)
        out["write_hint"] = engine.transfer_sync_write(t, la, tb, 16, "")

        # Synchronous batches: 16 scattered 4 KiB pieces.
        local.fill(700 * KiB, 64 * KiB, seed=3)
        srcs = [la + 700 * KiB + i * 4 * KiB for i in range(16)]
        dsts = [tb + 320 * KiB + (15 - i) * 8 * KiB for i in range(16)]
        out["batch_write"] = engine.batch_transfer_sync_write(t, srcs, dsts, [4 * KiB] * 16)
        out["batch_write_target_sha"] = target.call(op="sha", offset=320 * KiB, len=128 * KiB)
        out["batch_read"] = engine.batch_transfer_sync_read(
            t, [la + 800 * KiB + i * 4 * KiB for i in range(16)], dsts, [4 * KiB] * 16
        )
        out["batch_read_local_sha"] = local.sha(800 * KiB, 64 * KiB)
        out["batch_tuples"] = engine.batch_transfer_sync_write(t, (la,), (tb,), (8,))
        out["batch_empty"] = engine.batch_transfer_sync_write(t, [], [], [])
        out["batch_mismatched_lists"] = engine.batch_transfer_sync_write(t, [la], [tb, tb], [4])
        out["batch_sync_opcode"] = engine.batch_transfer_sync(t, [la], [tb + 4 * KiB], [4 * KiB], Op.Write)

        # Asynchronous batches.
        local.fill(900 * KiB, 64 * KiB, seed=4)
        a = engine.batch_transfer_async_write(t, [la + 900 * KiB], [tb + 600 * KiB], [64 * KiB])
        out["async_write_id_nonzero"] = isinstance(a, int) and a != 0
        out["async_write_status"] = engine.get_batch_transfer_status([a])
        out["async_write_target_sha"] = target.call(op="sha", offset=600 * KiB, len=64 * KiB)
        b = engine.batch_transfer_async_read(t, [la + 960 * KiB], [tb + 256 * KiB], [32 * KiB])
        c = engine.batch_transfer_async(t, [la + 992 * KiB], [tb + 320 * KiB], [32 * KiB], Op.Read)
        out["async_read_ids_nonzero"] = [b != 0, c != 0]
        out["async_two_status"] = engine.get_batch_transfer_status([b, c])
        out["async_read_local_sha"] = local.sha(960 * KiB, 64 * KiB)
        out["async_status_empty_list"] = engine.get_batch_transfer_status([])
        e = engine.batch_transfer_async_write(t, [], [], [])
        out["async_empty_id_nonzero"] = e != 0
        out["async_empty_status"] = engine.get_batch_transfer_status([e])
        out["async_mismatched_lists"] = engine.batch_transfer_async_write(t, [la], [tb, tb], [4])
        s = engine.transfer_submit_write(t, la, tb + 700 * KiB, 4 * KiB)
        out["submit_id_nonzero"] = s != 0
        deadline, check = time.monotonic() + 30, 0
        while check == 0 and time.monotonic() < deadline:
            check = engine.transfer_check_status(s)
        out["check_status_final"] = check

        # Notifications.
        out["transfer_sync_notify"] = engine.transfer_sync(t, la, tb, 8, Op.Write, Notify("n1", "m1"))
        out["batch_sync_notify"] = engine.batch_transfer_sync(t, [la], [tb], [8], Op.Write, Notify("n2", "m2"))
        out["transfer_sync_no_notify"] = engine.transfer_sync(t, la, tb, 8, Op.Write)
        out["notifies_at_target"] = target.call(op="notifies", expect=2)
        out["initiator_notifies"] = [[n.name, n.msg] for n in engine.get_notifies()]
        # Names and messages as bytes (what pybind11 takes for a std::string too); text reads back as str.
        out["notify_bytes_fields"] = [Notify(b"a", b"b").name, Notify(b"a", b"b").msg]
        setter = Notify()
        setter.name, setter.msg = b"x", "y"
        out["notify_set_fields"] = [setter.name, setter.msg]
        record("notify_int_name", Notify, 1, "m")
        utf8 = Notify(b"n3", "m3 \u00e9".encode())
        out["transfer_sync_notify_bytes"] = engine.transfer_sync(t, la, tb, 8, Op.Write, utf8)
        out["notifies_at_target_bytes"] = target.call(op="notifies", expect=1)

        # Refused addresses: the target's GAP is not registered.
        gap = tb + GAP[0]
        out["write_unregistered"] = engine.transfer_sync_write(t, la, gap, 4 * KiB)
        out["write_straddling"] = engine.transfer_sync_write(t, la, gap - 2 * KiB, 4 * KiB)
        out["read_unregistered"] = engine.transfer_sync_read(t, la, gap, 4 * KiB)
        out["batch_one_unregistered"] = engine.batch_transfer_sync_write(t, [la, la], [tb, gap], [8, 8])
        out["batch_read_one_unregistered"] = engine.batch_transfer_sync_read(t, [la, la], [tb, gap], [8, 8])
        f = engine.batch_transfer_async_write(t, [la], [gap], [8])
        out["async_unregistered_id_nonzero"] = f != 0
        out["async_unregistered_status"] = engine.get_batch_transfer_status([f])
        out["after_refusals_write"] = engine.transfer_sync_write(t, la, tb, 8)

        # Unknown sessions.
        out["write_closed_port"] = engine.transfer_sync_write(dead, la, tb, 8)
        out["write_closed_port_bytes_name"] = engine.transfer_sync_write(dead.encode(), la, tb, 8)
        out["read_closed_port"] = engine.transfer_sync_read(dead, la, tb, 8)
        out["batch_closed_port"] = engine.batch_transfer_sync_write(dead, [la], [tb], [8])
        out["async_closed_port"] = engine.batch_transfer_async_write(dead, [la], [tb], [8])
        out["submit_closed_port"] = engine.transfer_submit_write(dead, la, tb, 8)
        out["write_unresolvable"] = engine.transfer_sync_write(NO_SUCH_HOST, la, tb, 8)

        # Probes.
        out["probe_target"] = engine.send_probe(t)
        out["probe_closed_port"] = engine.send_probe(dead)
        out["probe_unresolvable"] = engine.send_probe(NO_SUCH_HOST)

        # Local buffers and the rest of the class.
        out["write_bytes"] = engine.write_bytes_to_buffer(la, b"pdx!", 4)
        out["write_bytes_str"] = engine.write_bytes_to_buffer(la + 4, "ok", 2)
        out["read_bytes"] = engine.read_bytes_from_buffer(la, 6).decode()
        m = engine.allocate_managed_buffer(4096)
        out["managed_nonzero"] = m != 0
        out["managed_write"] = engine.transfer_sync_read(t, m, tb, 4096)
        out["managed_free"] = engine.free_managed_buffer(m, 4096)
        out["warmup_efa_segment"] = engine.warmup_efa_segment(t)

        # Bad arguments: the wheel's exceptions.
        record("register_str_address", engine.register_memory, "x", 4)
        record("register_float_address", engine.register_memory, 1.5, 4)
        record("register_negative_address", engine.register_memory, -1, 4)
        record("register_none_address", engine.register_memory, None, 4)
        record("register_negative_length", engine.register_memory, la, -1)
        record("register_too_large_length", engine.register_memory, la, 1 << 64)
        record("write_none_session", engine.transfer_sync_write, None, la, tb, 4)
        record("write_int_hint", engine.transfer_sync_write, t, la, tb, 4, 5)
        record("write_too_many_args", engine.transfer_sync_write, t, la, tb, 4, "", 1)
        record("batch_float_length", engine.batch_transfer_sync_write, t, [la], [tb], [4.0])
        record("batch_str_lengths", engine.batch_transfer_sync_write, t, [la], [tb], "ab")
        record("batch_negative_length", engine.batch_transfer_sync_write, t, [la], [tb], [-4])
        record("status_str_ids", engine.get_batch_transfer_status, "x")
        record("transfer_sync_int_opcode", engine.transfer_sync, t, la, tb, 4, 1)
        record("unregister_float", engine.unregister_memory, 2.5)

        # initialize: the metadata server and the protocol (MC_FORCE_TCP=1 is set, as for mooncake_tcp).
        out["initialize_http_metadata"] = TE().initialize(HOST, "http://127.0.0.1:1/metadata", "tcp", "")
        out["initialize_xgmi"] = TE().initialize(HOST, "P2PHANDSHAKE", "xgmi", "")
        forced = TE()
        out["initialize_rdma_forced_to_tcp"] = forced.initialize(HOST, "P2PHANDSHAKE", "rdma", "")
        out["forced_engine_probe"] = forced.send_probe(t)
        out["forced_engine_write"] = forced.transfer_sync_write(t, la, tb, 8)
        out["initialize_ext"] = TE().initialize_ext(HOST, "P2PHANDSHAKE", "tcp", "", "")

        out["unregister"] = engine.unregister_memory(la)
    finally:
        target.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--initiator", choices=("wheel", "pdx"))
    parser.add_argument("--target", choices=("wheel", "pdx"))
    parser.add_argument("--serve", choices=("wheel", "pdx"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve)
    if not (args.initiator and args.target):
        parser.error("--initiator and --target are required")
    outcome = run(args.initiator, args.target)
    reply = json.dumps(outcome, sort_keys=True)
    sys.stdout.write("OUTCOME " + reply + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown with engine threads alive


if __name__ == "__main__":
    sys.exit(main())
