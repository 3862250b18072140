"""Transfer scenarios shared by the Mooncake self-test and the pdx<->Mooncake tests.

Every function takes an initiator peer and a target peer (peer_client.Peer,
either kind, in separate processes) plus their prepared buffers (`Side`), runs
one scenario and asserts on the outcome. The self-test runs them with Mooncake
on both ends, which checks the scenarios themselves against the reference.

Return codes: a Mooncake initiator reports 0 or a negative wheel code
(usually -1); a pdx initiator reports a pdx_status (0 ok, negative error,
PDX_ERR_REMOTE_REJECTED = -16 for an address the peer refused).
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass

from peer_client import Buf, Peer
from peer_common import stream

KiB = 1 << 10
MiB = 1 << 20
PDX_ERR_REMOTE_REJECTED = -16
PDX_STATE_COMPLETED = 1  # pdx_batch_wait's out_state for a finished batch (PDX_TASK_COMPLETED, src/ffi/engine/mod.rs)

# Offsets inside the big buffer: deliberately unaligned.
SRC_OFF = 3 * KiB + 1
DST_OFF = 1 * MiB + 7
GUARD = 4 * KiB
GUARD_BYTE = 0xA5
BIG_MARGIN = 2 * MiB  # big buffer = largest size + margin


def proto_of(peer: Peer) -> str:
    """"v1" when the peer was started with MC_TCP_PROTO=1 (it initiates with v1), else "v2"."""
    return "v1" if peer.env.get("MC_TCP_PROTO") == "1" else "v2"


def io_timeout(size: int) -> float:
    """Deadline for one command moving or hashing `size` bytes (generous: 2-core CI)."""
    return 60.0 + size / (5 * MiB)


@dataclass
class Side:
    peer: Peer
    big: Buf  # registered, room for the largest transfer at SRC_OFF and DST_OFF
    fence: Buf  # 4 MiB, two adjacent registrations: [1, 2) MiB and [2, 3) MiB; rest unregistered

    @property
    def kind(self) -> str:
        return self.peer.kind


def prepare(peer: Peer, max_size: int) -> Side:
    big = peer.alloc(max(max_size, 8 * MiB) + BIG_MARGIN)
    fence = peer.alloc(4 * MiB, register=False)
    for offset in (1 * MiB, 2 * MiB):
        r = peer.call("register", buf=fence.id, offset=offset, len=1 * MiB)
        assert r["rc"] == 0, f"{peer.name}: register fence part at +{offset}: {r}"
    return Side(peer, big, fence)


def _assert_ok(what: str, initiator: Peer, reply: dict):
    assert reply["rc"] == 0, f"{what}: {initiator.name} returned {reply}\n--- log ---\n{initiator.log_tail(15)}"
    if "state" in reply:  # pdx asynchronous path: the batch must have completed
        assert reply["state"] == PDX_STATE_COMPLETED, f"{what}: {initiator.name} batch state {reply}"


def _verify(side: Side, what: str, *, wait: bool, **kwargs):
    """Verify a range on `side`; with wait=True, poll (v1 writes are reported done before they land)."""
    deadline = time.monotonic() + (20.0 if wait else 0.0)
    while True:
        r = side.peer.verify(side.big, timeout=io_timeout(kwargs.get("length") or 0), **kwargs)
        if r["equal"] or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    assert r["equal"], f"{what}: data mismatch on {side.peer.name}: {r}"


def _lands_late(initiator: Peer, op: str) -> bool:
    # A v1 WRITE has no acknowledgement: the wheel reports success once the
    # bytes left its socket, so the target may not hold them yet. pdx must
    # report success only once the bytes are at the target, even with v1
    # (it fences v1 writes with a read), so it is checked at once.
    return op == "write" and proto_of(initiator) == "v1" and initiator.kind == "mooncake"


# --------------------------------------------------------------------------
# single transfers


def single(init: Side, target: Side, op: str, size: int, seed: int, notify: tuple[str, str] | None = None):
    """One transfer of `size` random bytes; checks the destination and the bytes around it."""
    src, dst = (init, target) if op == "write" else (target, init)
    t = io_timeout(size)
    dst.peer.fill(dst.big, DST_OFF - GUARD, size + 2 * GUARD, byte=GUARD_BYTE, timeout=t)
    src.peer.fill(src.big, SRC_OFF, size, seed=seed, timeout=t)
    if op == "write":
        local_off, remote = SRC_OFF, target.big.addr + DST_OFF
    else:
        local_off, remote = DST_OFF, target.big.addr + SRC_OFF
    reply = init.peer.transfer(op, target.peer, init.big, local_off, remote, size, notify=notify, timeout=t)
    _assert_ok(f"{op} {size} bytes", init.peer, reply)
    what = f"{init.kind}->{target.kind} {op} {size} bytes ({proto_of(init.peer)})"
    _verify(dst, what, wait=_lands_late(init.peer, op), offset=DST_OFF, length=size, seed=seed, pos=SRC_OFF)
    for off in (DST_OFF - GUARD, DST_OFF + size):
        r = dst.peer.verify(dst.big, off, GUARD, byte=GUARD_BYTE)
        assert r["equal"], f"{what}: bytes next to the destination changed at +{off}: {r}"


# --------------------------------------------------------------------------
# batches


def make_entries(rng: random.Random, sizes: list[int], gap_max: int = 64):
    """Place `sizes` packed (with random gaps) on the source side and shuffled on the destination side.

    Returns [(src_off, dst_off, len)], relative to SRC_OFF and DST_OFF, and the span of each side.
    """
    src_pos, dst_pos = [], [0] * len(sizes)
    at = 0
    for n in sizes:
        src_pos.append(at)
        at += n + rng.randrange(gap_max + 1)
    src_span = at
    order = list(range(len(sizes)))
    rng.shuffle(order)
    at = 0
    for i in order:
        dst_pos[i] = at
        at += sizes[i] + rng.randrange(gap_max + 1)
    return [(s, d, n) for s, d, n in zip(src_pos, dst_pos, sizes)], src_span, at


def batch(init: Side, target: Side, op: str, sizes: list[int], seed: int,
          notify: tuple[str, str] | None = None):
    """One batch of len(sizes) entries, scattered in a shuffled order; checks every destination byte."""
    rng = random.Random(seed)
    entries, src_span, dst_span = make_entries(rng, sizes)
    total = sum(sizes)
    t = io_timeout(total + src_span + dst_span)
    src, dst = (init, target) if op == "write" else (target, init)
    dst.peer.fill(dst.big, DST_OFF, dst_span, byte=GUARD_BYTE, timeout=t)
    src.peer.fill(src.big, SRC_OFF, src_span, seed=seed, timeout=t)
    if op == "write":
        wire = [(SRC_OFF + s, target.big.addr + DST_OFF + d, n) for s, d, n in entries]
    else:
        wire = [(DST_OFF + d, target.big.addr + SRC_OFF + s, n) for s, d, n in entries]
    reply = init.peer.batch(op, target.peer, init.big, wire, notify=notify, timeout=t)
    what = f"{init.kind}->{target.kind} batch {op} of {len(sizes)} entries ({proto_of(init.peer)})"
    _assert_ok(what, init.peer, reply)

    expected = bytearray([GUARD_BYTE]) * dst_span
    for s, d, n in entries:
        expected[d : d + n] = stream(seed, SRC_OFF + s, n)
    want = hashlib.sha256(expected).hexdigest()
    deadline = time.monotonic() + (20.0 if _lands_late(init.peer, op) else 0.0)
    while True:
        got = dst.peer.sha256(dst.big, DST_OFF, dst_span, timeout=t)
        if got == want or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if got != want:
        bad = []
        for i, (s, d, n) in enumerate(entries):
            r = dst.peer.verify(dst.big, DST_OFF + d, n, seed=seed, pos=SRC_OFF + s)
            if not r["equal"]:
                bad.append((i, n, r))
                if len(bad) >= 5:
                    break
        raise AssertionError(f"{what}: destination differs; first bad entries (index, len, detail): {bad}")


def random_sizes(seed: int, count: int, small_max: int = 4 * KiB, big: list[int] = ()) -> list[int]:
    """`count` sizes: 1, 2, a spread of small random sizes, and the given big ones, in random order."""
    rng = random.Random(seed)
    sizes = [1, 2] + list(big)
    while len(sizes) < count:
        sizes.append(rng.randint(1, small_max))
    rng.shuffle(sizes)
    return sizes


# --------------------------------------------------------------------------
# probe and notify


def probe(init: Side, target: Side):
    _assert_ok("probe", init.peer, init.peer.probe(target.peer))


def probe_unreachable(init: Side):
    """A probe to a port nobody listens on fails (and does not hang)."""
    r = init.peer.probe("127.0.0.1:1", timeout=30)
    assert r["rc"] != 0, f"probe to a closed port succeeded: {r}"


def expect_notifies(target: Side, wanted: list[tuple[str, str]]):
    got = target.peer.wait_notifies(len(wanted))
    assert sorted(got) == sorted(wanted), f"{target.peer.name} received {got}, expected {wanted}"


# --------------------------------------------------------------------------
# refused addresses


def refused_ranges(target: Side) -> list[tuple[str, int, int]]:
    """(label, remote address, length) that `target` must refuse."""
    base = target.fence.addr
    return [
        ("across two adjacent registrations", base + 2 * MiB - 8, 16),
        ("one byte past the end", base + 3 * MiB, 1),
        ("straddling the end", base + 3 * MiB - 8, 16),
        ("straddling the start", base + 1 * MiB - 1, 2),
        ("far outside (page 1)", 4096, 8),
        ("wrapping past 2^64", (1 << 64) - 8, 16),
    ]


def assert_refused(init: Side, reply: dict, label: str, *, exact: bool):
    rc = reply["rc"]
    if init.kind == "pdx" and exact:
        assert rc == PDX_ERR_REMOTE_REJECTED, f"{label}: pdx returned {reply}, expected PDX_ERR_REMOTE_REJECTED"
    else:
        assert rc < 0, f"{label}: {init.kind} initiator returned {reply}, expected a failure"


def refused(init: Side, target: Side, op: str):
    """Out-of-range requests are refused and change nothing; the target keeps serving.

    v2 (acknowledged): both reads and writes must fail at the initiator;
    pdx must say PDX_ERR_REMOTE_REJECTED.
    v1: a READ must fail. A v1 WRITE has no reply on the wire: the wheel
    reports 0 for it (its status is not checked, only that nothing was
    written), while pdx, which confirms v1 writes, must fail it.
    """
    peer = target.peer
    fence = target.fence
    peer.fill(fence, 0, None, byte=GUARD_BYTE)
    init.peer.fill(init.big, 0, 64 * KiB, seed=91)
    v1 = proto_of(init.peer) == "v1"
    for label, addr, length in refused_ranges(target):
        reply = init.peer.transfer(op, target.peer, init.big, 0, addr, length, timeout=60)
        if op == "write" and v1 and init.kind == "mooncake":
            continue
        wraps = addr + length > (1 << 64)
        # An initiator may refuse a wrapping range itself; everything else must be the peer's refusal.
        assert_refused(init, reply, f"{op} {label}", exact=not wraps and not v1)
    r = peer.verify(fence, 0, None, byte=GUARD_BYTE)
    assert r["equal"], f"{init.kind}->{target.kind} refused {op}s changed {peer.name}'s memory: {r}"

    # The target still serves valid requests (the initiator reconnects as needed).
    # After a silent v1 refusal (a WRITE gets no reply) the next request may go
    # out on the connection the target closed, and one failure is allowed there.
    # The wheel as initiator does not retry such a request, and after a run of
    # refused v1 READs it was also seen failing the next request once, so it gets
    # the same allowance; pdx must recover at once after a refused read.
    # A v1 WRITE from the wheel reports 0 even when it went out on a lane the
    # target had closed (the bytes are silently lost, as between two Mooncake
    # engines), and the refused writes above may have broken every one of its
    # lanes (up to 4): it is retried until the data lands, a few times at most.
    if op == "write" and v1 and init.kind == "mooncake":
        for attempt in range(6):
            reply = init.peer.transfer("write", target.peer, init.big, 0, fence.addr + 1 * MiB, 4096)
            deadline = time.monotonic() + 2.0
            while True:
                r = peer.verify(fence, 1 * MiB, 4096, seed=91, pos=0)
                if r["equal"] or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
            if r["equal"]:
                break
        assert r["equal"], f"valid v1 write after refused ones never landed in 6 attempts: {r}"
        return
    attempts = 2 if v1 and init.kind == "mooncake" else 1
    for attempt in range(attempts):
        if op == "write":
            reply = init.peer.transfer("write", target.peer, init.big, 0, fence.addr + 1 * MiB, 4096)
        else:
            peer.fill(fence, 2 * MiB, 4096, seed=92, pos=0)
            reply = init.peer.transfer("read", target.peer, init.big, 0, fence.addr + 2 * MiB, 4096)
        if reply["rc"] == 0:
            break
    _assert_ok(f"valid {op} after refused ones", init.peer, reply)
    if op == "write":
        deadline = time.monotonic() + (20.0 if _lands_late(init.peer, "write") else 0.0)
        while True:
            r = peer.verify(fence, 1 * MiB, 4096, seed=91, pos=0)
            if r["equal"] or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    else:
        r = init.peer.verify(init.big, 0, 4096, seed=92, pos=0)
    assert r["equal"], f"valid {op} after refused ones: wrong data: {r}"


def refused_after_unregister(init: Side, target: Side):
    """A region the target unregistered is refused (the initiator's cached descriptor is stale)."""
    peer = target.peer
    extra = peer.alloc(64 * KiB)
    try:
        init.peer.fill(init.big, 0, 4096, seed=93)
        reply = init.peer.transfer("write", peer, init.big, 0, extra.addr, 4096)
        _assert_ok("write into a registered region", init.peer, reply)
        r = peer.call("unregister", buf=extra.id)
        assert r["rc"] == 0, f"unregister: {r}"
        peer.fill(extra, byte=0)
        reply = init.peer.transfer("read", peer, init.big, 0, extra.addr, 4096)
        v1 = proto_of(init.peer) == "v1"
        assert_refused(init, reply, "read from an unregistered region", exact=not v1)
        reply = init.peer.transfer("write", peer, init.big, 0, extra.addr, 4096)
        if not (v1 and init.kind == "mooncake"):  # the wheel reports a refused v1 write as done
            assert_refused(init, reply, "write into an unregistered region", exact=not v1)
        time.sleep(0.2)
        r = peer.verify(extra, byte=0)
        assert r["equal"], f"an unregistered region was written: {r}"
    finally:
        peer.call("free", buf=extra.id)
