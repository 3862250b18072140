#!/usr/bin/env python3
"""One TransferEngine (Mooncake's wheel or pdx's drop-in) joined to a metadata server.

    node.py IMPL ROLE NAME METADATA [TARGET]

IMPL is ``mooncake`` or ``pdx``; ROLE is:

- ``target``: initialize as NAME, allocate a managed buffer (1 MiB, or
  ``NODE_TARGET_BYTES``), print
  ``READY <buffer address> <rpc port>``, wait until stdin closes (or is
  killed), then print ``NOTIFIES`` and the notifications it received as JSON;
- ``initiator``: initialize as NAME, find TARGET's buffer by name
  (``get_first_buffer_address``), then move random strings there and back
  the ways Mooncake's own Python tests do (sync write/read, sync batches,
  async batch, ``transfer_submit_write``, a write with a notification),
  probe TARGET and an unpublished
  name, and print ``OK`` with a JSON line of what it checked.

Exit status 0 only when every check held; the reason is printed otherwise.
"""

from __future__ import annotations

import json
import os
import random
import string
import sys
import time


def engine_class(impl: str):
    os.environ["MC_FORCE_TCP"] = "1"
    if impl == "mooncake":
        from mooncake.engine import TransferEngine
    else:
        from pdx.mooncake import TransferEngine
    return TransferEngine


def fail(why: str) -> None:
    print(f"FAIL {why}", flush=True)
    sys.exit(1)


def random_text(n: int) -> bytes:
    return "".join(random.choices(string.ascii_letters + string.digits, k=n)).encode()


def run_target(engine) -> None:
    buf = engine.allocate_managed_buffer(int(os.environ.get("NODE_TARGET_BYTES", 1 << 20)))
    if buf == 0:
        fail("allocate_managed_buffer returned 0")
    print(f"READY {buf} {engine.get_rpc_port()}", flush=True)
    sys.stdin.read()
    notes = [[n.name, n.msg] for n in engine.get_notifies()]
    print("NOTIFIES " + json.dumps(notes), flush=True)


def run_initiator(engine, target: str, impl_name: str) -> None:
    checks: dict[str, object] = {}
    remote = 0
    deadline = time.monotonic() + 10
    while remote == 0 and time.monotonic() < deadline:
        remote = engine.get_first_buffer_address(target)
        if remote == 0:
            time.sleep(0.1)
    if remote == 0:
        fail(f"get_first_buffer_address({target!r}) stayed 0")
    checks["remote"] = remote
    local = engine.allocate_managed_buffer(1 << 20)
    back = engine.allocate_managed_buffer(1 << 20)
    if not local or not back:
        fail("allocate_managed_buffer returned 0")
    if engine.send_probe(target) != 0:
        fail(f"send_probe({target!r}) != 0")
    # A managed buffer of the wheel may sit anywhere in its pool: use its first bytes.
    for size in (13, 4096, 65536):
        data = random_text(size)
        engine.write_bytes_to_buffer(local, data, size)
        if engine.transfer_sync_write(target, local, remote, size) != 0:
            fail(f"transfer_sync_write of {size} bytes failed")
        if engine.transfer_sync_read(target, back, remote, size) != 0:
            fail(f"transfer_sync_read of {size} bytes failed")
        got = engine.read_bytes_from_buffer(back, size)
        if got != data:
            fail(f"{size} bytes read back differ")
    checks["sync"] = True
    # Batches: two halves of 8 KiB.
    data = random_text(8192)
    engine.write_bytes_to_buffer(local, data, 8192)
    addrs, peers, lens = [local, local + 4096], [remote, remote + 4096], [4096, 4096]
    if engine.batch_transfer_sync_write(target, addrs, peers, lens) != 0:
        fail("batch_transfer_sync_write failed")
    if engine.batch_transfer_sync_read(target, [back, back + 4096], peers, lens) != 0:
        fail("batch_transfer_sync_read failed")
    if engine.read_bytes_from_buffer(back, 8192) != data:
        fail("batch bytes differ")
    checks["batch_sync"] = True
    data = random_text(8192)
    engine.write_bytes_to_buffer(local, data, 8192)
    batch = engine.batch_transfer_async_write(target, addrs, peers, lens)
    if batch == 0:
        fail("batch_transfer_async_write returned 0")
    if engine.get_batch_transfer_status([batch]) != 0:
        fail("async batch failed")
    if engine.transfer_sync_read(target, back, remote, 8192) != 0 or engine.read_bytes_from_buffer(back, 8192) != data:
        fail("async batch bytes differ")
    checks["batch_async"] = True
    data = random_text(4096)
    engine.write_bytes_to_buffer(local, data, 4096)
    batch = engine.transfer_submit_write(target, local, remote, 4096)
    if batch <= 0:
        fail(f"transfer_submit_write returned {batch}")
    state = 0
    deadline = time.monotonic() + 10
    while state == 0 and time.monotonic() < deadline:
        state = engine.transfer_check_status(batch)
        time.sleep(0.01)
    if state != 1:
        fail(f"transfer_check_status ended at {state}")
    if engine.transfer_sync_read(target, back, remote, 4096) != 0 or engine.read_bytes_from_buffer(back, 4096) != data:
        fail("transfer_submit_write bytes differ")
    checks["submit_write"] = True
    # A notification with a write reaches the target (through its rpc_meta).
    if impl_name == "mooncake":
        from mooncake.engine import TransferNotify, TransferOpcode
    else:
        from pdx.mooncake import TransferNotify, TransferOpcode
    note = TransferNotify("node", "hello " + target)
    if engine.transfer_sync(target, local, remote, 16, TransferOpcode.Write, note) != 0:
        fail("transfer_sync with a notification failed")
    checks["notify"] = True
    # An unpublished name fails without hanging.
    t0 = time.monotonic()
    unknown = "127.0.0.1:1"
    probe = engine.send_probe(unknown)
    if probe != -200:
        fail(f"probe of an unpublished name answered {probe}, not the wheel's -200 (ERR_METADATA)")
    if engine.batch_transfer_async_write(unknown, [local], [remote], [16]) != 0:
        fail("async submit to an unpublished name did not return 0")
    checks["unknown"] = {"probe": probe, "seconds": round(time.monotonic() - t0, 2)}
    if time.monotonic() - t0 > 15:
        fail("the unpublished name took too long")
    print("OK " + json.dumps(checks), flush=True)


def main() -> None:
    impl, role, name, metadata = sys.argv[1:5]
    engine = engine_class(impl)()
    rc = engine.initialize(name, metadata, "tcp", "")
    if rc != 0:
        fail(f"initialize returned {rc}")
    if role == "target":
        run_target(engine)
    else:
        run_initiator(engine, sys.argv[5], impl)


if __name__ == "__main__":
    main()
