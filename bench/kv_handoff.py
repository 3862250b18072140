#!/usr/bin/env python3
"""A KV-cache handoff of a real model's shape, side by side on loopback:
pdx's KV API (pdx.kv, one call) against the same handoff planned in Python
the way SGLang's conn.py does and sent through
pdx.mooncake.TransferEngine.batch_transfer_sync_write.

    PYTHONPATH=python python3 bench/kv_handoff.py                 # qwen3-8b, 8k tokens
    PYTHONPATH=python python3 bench/kv_handoff.py --tokens 32768 --json out.json

Sections, all in one run:
  1. pages vs requests, and planning time: pdx.kv.Plan (pdx_kv_plan_new +
     pdx_kv_plan_requests) vs conn.py's grouping and per-layer block lists;
  2. tokens/s of Plan.transfer (pdx_kv_transfer_sync) vs the Python-planned
     blocks through TransferEngine.batch_transfer_sync_write, alternating
     which goes first, every destination byte verified after each;
  3. heterogeneous TP 8 -> 2 heads per token (2 of the 8 local heads go to a
     2-head decode rank): a pdx head-slice plan vs one entry per token slot
     per buffer (conn.py's send_kvcache_slice);
  4. layer-wise with simulated per-layer compute: time from the last layer's
     submit to "landed" vs one whole-request transfer after compute.
Every engine runs in this process on 127.0.0.1 (native TCP engine).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import statistics
import sys
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import pdx  # noqa: E402
from pdx.kv import Heads, KvBuffer, Plan  # noqa: E402
from pdx.mooncake import TransferEngine  # noqa: E402

SHAPES = {"qwen3-8b": (36, 8, 128, 2), "llama3-8b": (32, 8, 128, 2), "llama3-70b": (80, 8, 128, 2)}


def scattered_pages(rng: random.Random, pool: int, count: int) -> list[int]:
    """`count` distinct pages out of `pool` in runs of 1..8 (as pdx-bench)."""
    used, out = bytearray(pool), []
    while len(out) < count:
        start, run = rng.randrange(pool), rng.randint(1, 8)
        for p in range(start, min(start + run, pool)):
            if len(out) < count and not used[p]:
                used[p] = 1
                out.append(p)
    return out


def conn_py_blocks(src, dst, local_bases, remote_bases, item_len):
    """conn.py's _send_kvcache_generic: group_concurrent_contiguous, then one
    block per run per layer buffer."""
    n = len(src)
    brk = [0] + [i for i in range(1, n) if src[i] - src[i - 1] != 1 or dst[i] - dst[i - 1] != 1] + [n]
    groups = [(src[a], dst[a], b - a) for a, b in zip(brk, brk[1:])]
    srcs, dsts, lens = [], [], []
    for lb, rb in zip(local_bases, remote_bases):
        for s, d, k in groups:
            srcs.append(lb + s * item_len)
            dsts.append(rb + d * item_len)
            lens.append(k * item_len)
    return srcs, dsts, lens


def conn_py_slices(src, dst, local_bases, remote_bases, tpp, lh, rh, lf, rf, count, hb):
    """conn.py's send_kvcache_slice: one entry per token slot per page per buffer."""
    srcs, dsts, lens = [], [], []
    for lb, rb in zip(local_bases, remote_bases):
        for s, d in zip(src, dst):
            for t in range(tpp):
                srcs.append(lb + ((s * tpp + t) * lh + lf) * hb)
                dsts.append(rb + ((d * tpp + t) * rh + rf) * hb)
                lens.append(count * hb)
    return [srcs], [dsts], [lens]


def median_ms(v: list[float]) -> float:
    return statistics.median(v) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--page-tokens", type=int, default=16)
    ap.add_argument("--hetero-tokens", type=int, default=2048, help="tokens of the 8 -> 2 heads section")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layer-compute-ms", type=float, default=5.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    layers, kv_heads, head_dim, dtype = SHAPES[a.model]
    buffers, tpp = 2 * layers, a.page_tokens
    page_bytes = tpp * kv_heads * head_dim * dtype
    pages = -(-a.tokens // tpp)
    pool = pages + pages // 2  # room to scatter
    rng = random.Random(21)
    src, dst = scattered_pages(rng, pool, pages), scattered_pages(rng, pool, pages)
    out: dict[str, object] = {"model": a.model, "tokens": a.tokens, "page_tokens": tpp, "buffers": buffers}

    decode, prefill = pdx.Engine("127.0.0.1", "tcp"), pdx.Engine("127.0.0.1", "tcp")
    mc = TransferEngine()
    if mc.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit("cannot start the Mooncake-API engine")
    total = buffers * pool * page_bytes
    local, remote = bytearray(total), bytearray(total)
    chunk = random.Random(1).randbytes(1 << 20)
    for at in range(0, total, len(chunk)):
        local[at:at + len(chunk)] = chunk[:total - at]
    lbase, rbase = prefill.register(local), decode.register(remote)
    mc.register_memory(lbase, len(local))
    peer = decode.session_id
    # Section 2 runs both paths on the one pdx engine under the Mooncake API,
    # so that only the planning and the calls differ.
    same_engine = mc._engine or prefill
    lbufs = [KvBuffer(lbase + b * pool * page_bytes, page_bytes, pool) for b in range(buffers)]
    rbufs = [KvBuffer(rbase + b * pool * page_bytes, page_bytes, pool) for b in range(buffers)]

    # 1. Planning.
    pdx_plan, py_plan = [], []
    for _ in range(max(a.rounds, 5)):
        t = time.perf_counter()
        with Plan(lbufs, rbufs, array("i", src), array("i", dst)) as p:
            requests = p.requests()
        pdx_plan.append(time.perf_counter() - t)
        t = time.perf_counter()
        blocks = conn_py_blocks(src, dst, [b.base for b in lbufs], [b.base for b in rbufs], page_bytes)
        py_plan.append(time.perf_counter() - t)
    print(f"\nKV handoff: {a.model}, {a.tokens} tokens, {tpp} tokens/page, {buffers} buffers (K and V of {layers} layers)")
    print(f"  pages {pages}, requests {requests} (conn.py blocks {len(blocks[0])}; {buffers * pages} page copies)")
    print(f"  planning: pdx.kv.Plan {median_ms(pdx_plan):.3f} ms, conn.py-style in Python {median_ms(py_plan):.3f} ms")

    # 2. Throughput, every destination byte verified after each transfer.
    plan = Plan(lbufs, rbufs, array("i", src), array("i", dst))
    lview, rview = memoryview(local), memoryview(remote)

    def landed() -> bool:
        return all(rview[d_ - rbase:d_ - rbase + n_] == lview[s_ - lbase:s_ - lbase + n_] for s_, d_, n_ in zip(*blocks))
    times: dict[str, list[float]] = {"pdx_kv_transfer_sync": [], "conn.py + batch_transfer_sync_write": []}
    for r in range(a.rounds):
        order = list(times) if r % 2 == 0 else list(reversed(times))
        for name in order:
            ctypes.memset(rbase, 0, len(remote))
            t = time.perf_counter()
            if name == "pdx_kv_transfer_sync":
                plan.transfer(same_engine, peer)
            else:
                srcs, dsts, lens = conn_py_blocks(src, dst, [b.base for b in lbufs], [b.base for b in rbufs], page_bytes)
                if mc.batch_transfer_sync_write(peer, srcs, dsts, lens) != 0:
                    raise SystemExit("batch_transfer_sync_write failed")
            times[name].append(time.perf_counter() - t)
            if not landed():
                raise SystemExit(f"{name}: the destination differs from the expected bytes")
    print("  tokens/s (median of %d, planning included):" % a.rounds)
    for name, v in times.items():
        print(f"    {name:<40} {a.tokens / statistics.median(v):>12.0f}   ({median_ms(v):.1f} ms)")
    out["requests"], out["pages"] = requests, pages
    out["planning_ms"] = {"pdx": median_ms(pdx_plan), "conn_py": median_ms(py_plan)}
    out["tokens_per_s"] = {k: a.tokens / statistics.median(v) for k, v in times.items()}
    plan.close()

    # 3. Heterogeneous TP: 8 -> 2 heads per token, 2 heads of each token sent.
    hp = -(-a.hetero_tokens // tpp)
    hsrc, hdst = src[:hp], dst[:hp]
    lh, rh, lf, rf, count, hb = 8, 2, 2, 0, 2, head_dim * dtype
    lpb, rpb = tpp * lh * hb, tpp * rh * hb
    hl = [KvBuffer(lbase + b * pool * lpb, lpb, pool) for b in range(buffers)]
    hr = [KvBuffer(rbase + b * pool * rpb, rpb, pool) for b in range(buffers)]
    heads = Heads(tpp, lh, rh, lf, rf, count, hb)
    ht: dict[str, list[float]] = {"pdx head-slice plan": [], "per-token-slot entries": []}
    for r in range(a.rounds):
        for name in list(ht) if r % 2 == 0 else list(reversed(ht)):
            t = time.perf_counter()
            if name == "pdx head-slice plan":
                with Plan(hl, hr, array("i", hsrc), array("i", hdst), heads) as p:
                    hreq = p.requests()
                    p.transfer(prefill, peer)
            else:
                s_, d_, n_ = conn_py_slices(hsrc, hdst, [b.base for b in hl], [b.base for b in hr], tpp, lh, rh, lf, rf,
                                            count, hb)
                entries = len(s_[0])
                if mc.batch_transfer_sync_write(peer, s_[0], d_[0], n_[0]) != 0:
                    raise SystemExit("per-token batch_transfer_sync_write failed")
            ht[name].append(time.perf_counter() - t)
    print(f"  heterogeneous TP 8 -> 2 heads, {a.hetero_tokens} tokens: pdx requests {hreq}, per-token-slot entries {entries}")
    for name, v in ht.items():
        print(f"    {name:<40} {a.hetero_tokens / statistics.median(v):>12.0f} tokens/s ({median_ms(v):.1f} ms)")
    out["hetero_tp"] = {"requests": hreq, "entries": entries,
                        "tokens_per_s": {k: a.hetero_tokens / statistics.median(v) for k, v in ht.items()}}

    # 4. Layer-wise with simulated compute.
    plan = Plan(lbufs, rbufs, array("i", src), array("i", dst))
    compute = a.layer_compute_ms / 1e3
    whole, layered = [], []
    for r in range(a.rounds):
        for _ in range(layers):
            time.sleep(compute)
        t = time.perf_counter()
        plan.transfer(prefill, peer)
        whole.append(time.perf_counter() - t)
        ids = []
        for layer in range(layers):
            time.sleep(compute)
            last = layer == layers - 1
            ids.append(plan.submit(prefill, peer, 2 * layer, 2 * layer + 2,
                                   notify=("kv_done", f"room-{r}") if last else None))
        t = time.perf_counter()
        if Plan.notify_wait(prefill, ids[-1]) != pdx.PDX_OK:
            raise SystemExit("the layer-wise notification failed")
        layered.append(time.perf_counter() - t)
        for i in ids:
            prefill.wait(i)
            prefill.free(i)
    plan.close()
    print(f"  layer-wise, {layers} layers x {a.layer_compute_ms} ms compute: last submit -> notified "
          f"{median_ms(layered):.1f} ms; whole request after compute -> landed {median_ms(whole):.1f} ms")
    out["layerwise_ms"] = {"last_submit_to_notified": median_ms(layered), "whole_after_compute": median_ms(whole)}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    prefill.close()
    decode.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
