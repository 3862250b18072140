"""SGLang's own KV manager classes on pdx, in two processes (run by scripts/test-serving.sh).

A prefill process runs SGLang 0.5.23's `MooncakeKVManager` (prefill mode),
a `MooncakeKVSender` per request and SGLang's bootstrap server
(`MooncakeKVBootstrapServer`, started in the prefill process as SGLang's
prefill server starts it); a decode process runs a `MooncakeKVManager`
(decode mode) and a `MooncakeKVReceiver` per request. Their KV buffers are
SGLang's own `MHATokenToKVPool` built on the CPU (4 layers, 2 KV heads,
head dim 32, bfloat16, page size 16, 511 usable pages), their auxiliary data
SGLang's own `MetadataBuffers`; everything reaches the managers through a
`KVArgs` filled the way SGLang's prefill and decode schedulers fill it, with
the process's config published through SGLang's runtime context
(`--disaggregation-transfer-backend mooncake_tcp`).

Both pools start with random bytes (different on each side). Each case sends
4 requests at once, each of 40 to 100 pages picked at random, scattered and
out of order on both sides (mostly single pages, some runs of 2 or 3 that are
contiguous on both sides, which SGLang merges into one range), in chunks of random sizes (as a chunked prefill
sends them), plus one row of auxiliary data. After the transfer the decode
process's pool and aux buffers must equal, byte for byte, what they were
before with exactly the requested pages and rows replaced by the prefill's.

Cases (each a prefill process of its own, all against one pdx decode
process, so `mooncake.engine` is pdx's drop-in there; PDX_MOONCAKE_SHIM=1):
- pdx -> pdx, SGLang's default path: one `batch_transfer_sync` per chunk
  covering every layer's K and V;
- pdx -> pdx, layer-wise: with `SGLANG_MOONCAKE_CUSTOM_MEM_POOL=BAREX` the
  prefill manager sends each layer's K and each layer's V as its own
  `batch_transfer_sync` on its thread pool, concurrently (SGLang's path for a
  Mooncake custom memory pool; the pool itself is the plain CPU one here);
- Mooncake wheel -> pdx, with `SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES=7`
  (SGLang's bounded batches: a chunk split into transfers of at most 7 pages);
- negative control: a pdx prefill with PDX_SERVING_DROP_KV=1 (every transfer
  reports success and moves nothing): every request must conclude with
  success and every page and aux row must then differ from the prefill's,
  so the comparison is shown to catch a dropped transfer.

With PDX_SERVING_DROP_KV=1 in its own environment the script checks
itself: every pdx prefill then drops its transfers while the cases still
expect the bytes, and it must fail.

Usage: sglang_kv_manager.py --model DIR --workdir DIR      (the driver)
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import secrets
import sys
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402
    HOST,
    Proc,
    Procs,
    TierFailure,
    check_drops,
    check_engine,
    free_port,
    log,
)

PYTHONPATH_DIR = Path(__file__).resolve().parent / "pythonpath"
START_DEADLINE_S = 420.0  # process start-up: imports of torch and sglang on 2 busy cores
TRANSFER_DEADLINE_S = 120.0
PAGE_SIZE = 16
LAYERS = 4
HEADS = 2
HEAD_DIM = 32
POOL_TOKENS = 8192  # 512 pages; page 0 is SGLang's padding page and is never handed out
AUX_ROWS = 16
REQUESTS_PER_CASE = 4
PAGES_PER_REQUEST = (40, 100)
MAX_TRANSFER_BATCH_INDICES = 7

CASES: list[tuple[str, str, bool, dict[str, str]]] = [
    # (case, process name, runs pdx's drop-in, extra environment)
    ("pdx -> pdx, one batch per chunk", "kvm-prefill-pdx", True, {}),
    (
        "pdx -> pdx, layer-wise (SGLANG_MOONCAKE_CUSTOM_MEM_POOL=BAREX)",
        "kvm-prefill-pdx-layerwise",
        True,
        # The thread pool SGLang sizes for a node with 128 or more CPUs: 2 threads per transfer queue.
        {"SGLANG_MOONCAKE_CUSTOM_MEM_POOL": "BAREX", "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE": "8"},
    ),
    (
        f"Mooncake wheel -> pdx, batches of {MAX_TRANSFER_BATCH_INDICES} pages",
        "kvm-prefill-wheel",
        False,
        {"SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES": str(MAX_TRANSFER_BATCH_INDICES)},
    ),
]
DROP_CASE = ("negative control: pdx drops every transfer", "kvm-prefill-pdx-drops", True, {"PDX_SERVING_DROP_KV": "1"})


# ---------------------------------------------------------------- one side (a process of its own)


class Side:
    """One PD role: SGLang's pool, metadata buffers and KV manager, built as SGLang's schedulers build them."""

    def __init__(self, role: str, model: Path, bootstrap_port: int, seed: int):
        import torch
        from sglang.srt.disaggregation.utils import (
            DisaggregationMode,
            KVClassType,
            MetadataBuffers,
            TransferBackend,
            build_kv_layer_ids,
            get_kv_class,
            get_kv_transfer_buf_infos,
            get_pd_kv_layout,
            setup_state_kv_args,
        )
        from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (
            get_mooncake_transfer_engine,
            maybe_init_shared_mooncake_transfer_engine,
        )
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish
        from sglang.srt.server_args import ServerArgs

        self.role = role
        server_args = ServerArgs(
            model_path=str(model),
            device="cpu",
            host=HOST,
            page_size=PAGE_SIZE,
            skip_tokenizer_init=True,
            attention_backend="torch_native",
            disable_cuda_graph=True,
            disaggregation_mode=role,
            disaggregation_transfer_backend="mooncake_tcp",
            disaggregation_bootstrap_port=bootstrap_port,
        )
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
        # One rank, no torch.distributed: the prefill manager keeps the pipeline group, which it
        # uses only with pp_size > 1.
        get_parallel().override_permanently(pp_group=None)
        maybe_init_shared_mooncake_transfer_engine(gpu_id=0)
        engine = get_mooncake_transfer_engine()
        if engine is None:
            raise RuntimeError("SGLang did not start its shared Mooncake transfer engine")
        self.engine_module = type(engine.engine).__module__

        self.pool = MHATokenToKVPool(
            size=POOL_TOKENS,
            page_size=PAGE_SIZE,
            dtype=torch.bfloat16,
            head_num=HEADS,
            head_dim=HEAD_DIM,
            layer_num=LAYERS,
            device="cpu",
            enable_memory_saver=False,
        )
        self.metadata = MetadataBuffers(
            size=AUX_ROWS, hidden_size=64, hidden_states_dtype=torch.float32, max_sampling_mask_tokens=0
        )

        kv_args = get_kv_class(TransferBackend.MOONCAKE, KVClassType.KVARGS)()
        kv_args.engine_rank = 0
        kv_args.pp_rank = 0
        kv_args.system_dp_rank = 0
        kv_args.rust_http_port = None
        kv_args.kv_cache_dtype_str = "bfloat16"
        kv_args.kv_layout = get_pd_kv_layout(self.pool)
        kv_args.prefill_start_layer = 0
        kv_args.prefill_end_layer = getattr(self.pool, "end_layer", None)
        ptrs, lens, item_lens = get_kv_transfer_buf_infos(self.pool)
        kv_args.kv_data_ptrs, kv_args.kv_data_lens, kv_args.kv_item_lens = ptrs, lens, item_lens
        kv_args.num_draft_entries = 0
        kv_args.kv_layer_ids = build_kv_layer_ids(
            token_to_kv_pool=self.pool, draft_token_to_kv_pool=None, num_draft_entries=0, num_hidden_layers=LAYERS
        )
        kv_args.kv_head_num = self.pool.head_num
        kv_args.total_kv_head_num = HEADS
        kv_args.page_size = PAGE_SIZE
        kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = self.metadata.get_buf_infos()
        kv_args.ib_device = None
        kv_args.gpu_id = 0
        setup_state_kv_args(kv_args, self.pool, None, LAYERS, req_to_token_pool=None)
        self.kv_args = kv_args

        # Random contents, different on each side, in every byte SGLang registers.
        gen = torch.Generator().manual_seed(seed)
        for tensor in self._tensors():
            raw = tensor.view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))

        if role == "prefill":
            server_class = get_kv_class(TransferBackend.MOONCAKE, KVClassType.BOOTSTRAP_SERVER)
            self.bootstrap = server_class(host=HOST, port=bootstrap_port)
            mode = DisaggregationMode.PREFILL
        else:
            mode = DisaggregationMode.DECODE
        manager_class = get_kv_class(TransferBackend.MOONCAKE, KVClassType.MANAGER)
        self.manager = manager_class(kv_args, mode, server_args, False)
        # Count SGLang's transfer calls (its engine wrapper's batch_transfer_sync, which every path
        # here goes through), so the driver can tell which path ran: (thread, ranges) per call.
        self.calls: list[tuple[int, int]] = []
        inner = engine.batch_transfer_sync

        def counted(session_id: str, buffers: list[int], peer_addresses: list[int], lengths: list[int]) -> int:
            self.calls.append((threading.get_ident(), len(lengths)))
            ret: int = inner(session_id, buffers, peer_addresses, lengths)
            return ret

        engine.batch_transfer_sync = counted
        self.sender_class = get_kv_class(TransferBackend.MOONCAKE, KVClassType.SENDER)
        self.receiver_class = get_kv_class(TransferBackend.MOONCAKE, KVClassType.RECEIVER)
        self.peers: dict[int, Any] = {}

    def _tensors(self) -> list[Any]:
        """Every registered region as a tensor: the pool's K and V per layer, then the aux buffers."""
        import torch

        regions = list(zip(self.kv_args.kv_data_ptrs, self.kv_args.kv_data_lens))
        regions += list(zip(self.kv_args.aux_data_ptrs, self.kv_args.aux_data_lens))
        by_ptr = {}
        candidates = list(self.pool.k_buffer) + list(self.pool.v_buffer) + list(self._aux_tensors())
        for t in candidates:
            by_ptr[t.data_ptr()] = t
        out = []
        for ptr, length in regions:
            t = by_ptr.get(ptr)
            if t is None or t.nbytes < length:
                raise RuntimeError(f"no tensor behind the registered region {ptr:#x}+{length}")
            out.append(t.view(torch.uint8).reshape(-1)[:length])
        return out

    def _aux_tensors(self) -> list[Any]:
        m = self.metadata
        names = [n for n, v in vars(m).items() if hasattr(v, "data_ptr")]
        return [getattr(m, n) for n in names]

    def dump(self) -> list[bytes]:
        return [t.numpy().tobytes() for t in self._tensors()]

    def layout(self) -> dict[str, Any]:
        return {
            "kv_item_lens": list(self.kv_args.kv_item_lens),
            "aux_item_lens": list(self.kv_args.aux_item_lens),
            "engine_module": self.engine_module,
            "custom_mem_pool": bool(getattr(self.manager, "enable_custom_mem_pool", False)),
            "max_transfer_batch_indices": int(getattr(self.manager, "max_transfer_batch_indices", 0) or 0),
        }

    # Prefill: a sender per request, opened before the decode side asks (as the prefill scheduler
    # opens it when the request arrives), then fed page chunks once the decode side's metadata is in.
    def open(self, requests: list[dict[str, Any]], bootstrap_addr: str) -> None:
        for r in requests:
            sender = self.sender_class(mgr=self.manager, bootstrap_addr=bootstrap_addr, bootstrap_room=r["room"])
            self.peers[r["room"]] = sender

    def send(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        import numpy as np
        from sglang.srt.disaggregation.base.conn import KVPoll

        waiting = {r["room"]: r for r in requests}
        deadline = time.monotonic() + TRANSFER_DEADLINE_S
        started: set[int] = set()
        while len(started) < len(waiting):
            for room, r in waiting.items():
                if room in started:
                    continue
                sender = self.peers[room]
                state = sender.poll()
                if state == KVPoll.Failed:
                    return {"error": f"room {room}: the sender failed before sending: {sender.failure_exception()!r}"}
                if state != KVPoll.WaitingForInput:
                    continue
                pages = r["src_pages"]
                sender.init(len(pages), r["src_aux"])
                for lo, hi in zip([0, *r["chunks"]], [*r["chunks"], len(pages)]):
                    sender.send(np.array(pages[lo:hi], dtype=np.int32))
                started.add(room)
            if time.monotonic() > deadline:
                return {"error": f"rooms {sorted(set(waiting) - started)} never reached WaitingForInput"}
            time.sleep(0.01)
        return self._wait(list(waiting))

    # Decode: a receiver per request, the way the decode scheduler drives it.
    def receive(self, requests: list[dict[str, Any]], bootstrap_addr: str) -> dict[str, Any]:
        import numpy as np

        deadline = time.monotonic() + TRANSFER_DEADLINE_S
        while not self.manager.try_ensure_parallel_info(bootstrap_addr):
            if time.monotonic() > deadline:
                return {"error": f"no parallel info from the bootstrap server {bootstrap_addr}"}
            time.sleep(0.1)
        for r in requests:
            receiver = self.receiver_class(mgr=self.manager, bootstrap_addr=bootstrap_addr, bootstrap_room=r["room"])
            receiver.init(0)
            receiver.send_metadata(np.array(r["dst_pages"], dtype=np.int32), r["dst_aux"])
            self.peers[r["room"]] = receiver
        return {"ok": True}

    def wait(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        return self._wait([r["room"] for r in requests])

    def _wait(self, rooms: list[int]) -> dict[str, Any]:
        from sglang.srt.disaggregation.base.conn import KVPoll

        deadline = time.monotonic() + TRANSFER_DEADLINE_S
        states: dict[int, str] = {}
        while len(states) < len(rooms):
            for room in rooms:
                if room in states:
                    continue
                state = self.peers[room].poll()
                if state == KVPoll.Success:
                    states[room] = "success"
                elif state == KVPoll.Failed:
                    states[room] = f"failed: {self.peers[room].failure_exception()!r}"
            if time.monotonic() > deadline:
                left = sorted(set(rooms) - set(states))
                return {"error": f"rooms {left} did not conclude in {TRANSFER_DEADLINE_S:.0f} s"}
            time.sleep(0.01)
        for room in rooms:
            self.peers.pop(room).clear()
        return {"states": {str(k): v for k, v in states.items()}}


def side_main(role: str, model: Path, bootstrap_port: int, driver_port: int, seed: int) -> int:
    conn = Client((HOST, driver_port), authkey=bytes.fromhex(os.environ.pop("PDX_KVM_AUTHKEY")))
    conn.send(os.getpid())  # who this is: the driver pairs the channel with its process
    try:
        side = Side(role, model, bootstrap_port, seed)
    except Exception as err:  # noqa: BLE001  (handed to the driver, which fails the case with it)
        import traceback

        conn.send({"error": f"{role} set-up failed: {err!r}\n{traceback.format_exc()}"})
        return 1
    conn.send({"ready": side.layout()})
    while True:
        try:
            cmd, arg = conn.recv()
        except EOFError:
            return 0
        try:
            if cmd == "open":
                side.open(arg["requests"], arg["bootstrap_addr"])
                conn.send({"ok": True})
            elif cmd == "send":
                conn.send(side.send(arg["requests"]))
            elif cmd == "receive":
                conn.send(side.receive(arg["requests"], arg["bootstrap_addr"]))
            elif cmd == "wait":
                conn.send(side.wait(arg["requests"]))
            elif cmd == "calls":
                conn.send({"calls": list(side.calls)})
                side.calls.clear()
            elif cmd == "dump":
                conn.send({"regions": side.dump()})
            elif cmd == "quit":
                conn.send({"ok": True})
                return 0
            else:
                conn.send({"error": f"unknown command {cmd!r}"})
        except Exception as err:  # noqa: BLE001
            import traceback

            conn.send({"error": f"{role} {cmd} failed: {err!r}\n{traceback.format_exc()}"})


# ---------------------------------------------------------------- the driver


class Remote:
    """A side process and its command channel."""

    def __init__(self, name: str, proc: Proc, conn: Connection | None = None):
        self.name, self.proc, self.conn = name, proc, conn
        self.layout: dict[str, Any] = {}

    def call(self, cmd: str, arg: Any = None, timeout_s: float = TRANSFER_DEADLINE_S + 60) -> dict[str, Any]:
        assert self.conn is not None
        self.conn.send((cmd, arg))
        end = time.monotonic() + timeout_s
        while not self.conn.poll(1.0):
            if not self.proc.alive():
                code = self.proc.popen.returncode
                raise TierFailure(f"{self.name} exited ({code}) during {cmd}:\n{self.proc.tail()}")
            if time.monotonic() > end:
                raise TierFailure(f"{self.name}: no answer to {cmd} in {timeout_s:.0f} s:\n{self.proc.tail()}")
        answer: dict[str, Any] = self.conn.recv()
        if "error" in answer:
            raise TierFailure(f"{self.name}: {answer['error']}")
        return answer


def start_side(
    procs: Procs, listener: Listener, authkey: str, name: str, role: str, use_pdx: bool,
    extra_env: dict[str, str], model: Path, bootstrap_port: int, seed: int,
) -> Remote:  # fmt: skip
    env = dict(os.environ)
    for k in ("PDX_MOONCAKE_SHIM", "PDX_SERVING_DROP_KV", "SGLANG_MOONCAKE_CUSTOM_MEM_POOL",
              "SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES", "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE",
              "SGLANG_MOONCAKE_SEND_AUX_TCP", "MC_FORCE_TCP"):  # fmt: skip
        env.pop(k, None)
    env.update(
        SGLANG_USE_CPU_ENGINE="1",
        SGLANG_HOST_IP=HOST,
        PYTHONPATH=str(PYTHONPATH_DIR),
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PDX_KVM_AUTHKEY=authkey,
        **extra_env,
    )
    if use_pdx:
        env["PDX_MOONCAKE_SHIM"] = "1"
    argv = [
        sys.executable, __file__, "--side", role, "--model", str(model),
        "--bootstrap-port", str(bootstrap_port), "--driver-port", str(listener.address[1]), "--seed", str(seed),
    ]  # fmt: skip
    return Remote(name, procs.start(name, argv, env))


def accept_all(listener: Listener, remotes: list[Remote]) -> None:
    """Pair each connecting side with its process (each sends its pid first), then wait until all are ready."""
    arrived: queue.Queue[Any] = queue.Queue()

    def accept() -> None:
        while True:
            try:
                conn = listener.accept()
                arrived.put((conn.recv(), conn))
            except (OSError, EOFError):
                return  # the listener was closed

    threading.Thread(target=accept, name="kvm-accept", daemon=True).start()
    pending = {r.proc.popen.pid: r for r in remotes}
    end = time.monotonic() + START_DEADLINE_S
    while pending:
        for r in pending.values():
            if not r.proc.alive():
                raise TierFailure(f"{r.name} exited ({r.proc.popen.returncode}) while starting:\n{r.proc.tail()}")
        if time.monotonic() > end:
            raise TierFailure(f"{sorted(r.name for r in pending.values())} did not connect in {START_DEADLINE_S:.0f} s")
        try:
            pid, conn = arrived.get(timeout=1.0)
        except queue.Empty:
            continue
        remote = pending.pop(pid, None)
        if remote is None:
            raise TierFailure(f"a side with an unknown pid {pid} connected")
        remote.conn = conn
    for r in remotes:
        assert r.conn is not None
        while not r.conn.poll(1.0):
            if not r.proc.alive():
                raise TierFailure(f"{r.name} exited ({r.proc.popen.returncode}) while starting:\n{r.proc.tail()}")
            if time.monotonic() > end:
                raise TierFailure(f"{r.name} not ready in {START_DEADLINE_S:.0f} s:\n{r.proc.tail()}")
        answer = r.conn.recv()
        if "error" in answer:
            raise TierFailure(f"{r.name}: {answer['error']}")
        r.layout = answer["ready"]
        log(f"{r.name}: ready ({r.layout['engine_module']})")


def take_run(rng: random.Random, free: set[int], k: int) -> list[int]:
    """k consecutive free pages at a random place (fewer if none fit), removed from `free`."""
    while k > 1:
        starts = [p for p in free if all(p + d in free for d in range(1, k))]
        if starts:
            start = rng.choice(starts)
            break
        k -= 1
    else:
        start = rng.choice(sorted(free))
    run = list(range(start, start + k))
    free.difference_update(run)
    return run


def plan(
    rng: random.Random, rooms: list[int], src_free: set[int], dst_free: set[int], aux: list[int]
) -> list[dict[str, Any]]:
    """Each request's pages: scattered over the pool in random order, mostly single pages, some runs of
    2 or 3 (contiguous on both sides, so SGLang merges them into one range), disjoint across requests;
    and where its chunks end."""
    out = []
    for room in rooms:
        want = rng.randint(*PAGES_PER_REQUEST)
        src: list[int] = []
        dst: list[int] = []
        while len(src) < want:
            k = min(rng.choice((1, 1, 1, 1, 2, 3)), want - len(src))
            a = take_run(rng, src_free, k)
            b = take_run(rng, dst_free, len(a))
            if len(b) < len(a):
                src_free.update(a[len(b) :])
                a = a[: len(b)]
            src += a
            dst += b
        cuts = sorted(rng.sample(range(1, want), rng.randint(1, 4)))
        out.append({"room": room, "src_pages": src, "dst_pages": dst, "chunks": cuts,
                    "src_aux": aux.pop(), "dst_aux": aux.pop()})  # fmt: skip
    return out


def ranges(src: list[int], dst: list[int]) -> int:
    """How many ranges SGLang makes of these page pairs (group_concurrent_contiguous: runs contiguous on both sides)."""
    return 1 + sum(1 for i in range(1, len(src)) if src[i] != src[i - 1] + 1 or dst[i] != dst[i - 1] + 1)


def expected_calls(requests: list[dict[str, Any]], layer_wise: bool, batch_pages: int, aux_buffers: int) -> list[int]:
    """The ranges of each batch_transfer_sync SGLang makes for these requests, sorted: per chunk one call
    over every layer's K and V, or (layer-wise) one per layer's K and one per layer's V, or (bounded batches)
    one per `batch_pages` pages of the chunk; and one call per request for its aux row."""
    regions = 2 * LAYERS
    calls = []
    for r in requests:
        src, dst, cuts = r["src_pages"], r["dst_pages"], r["chunks"]
        for lo, hi in zip([0, *cuts], [*cuts, len(src)]):
            if layer_wise:
                calls += [ranges(src[lo:hi], dst[lo:hi])] * regions
            elif batch_pages > 0 and hi - lo > batch_pages:
                calls += [regions * ranges(src[b : min(b + batch_pages, hi)], dst[b : min(b + batch_pages, hi)])
                          for b in range(lo, hi, batch_pages)]  # fmt: skip
            else:
                calls.append(regions * ranges(src[lo:hi], dst[lo:hi]))
        calls.append(aux_buffers)
    return sorted(calls)


def expected_decode(
    before: list[bytes], prefill: list[bytes], requests: list[dict[str, Any]], kv_items: list[int], aux_items: list[int]
) -> list[bytearray]:
    want = [bytearray(b) for b in before]
    for r in requests:
        for i, item in enumerate(kv_items):
            for s, d in zip(r["src_pages"], r["dst_pages"]):
                want[i][d * item : (d + 1) * item] = prefill[i][s * item : (s + 1) * item]
        for j, item in enumerate(aux_items):
            i = len(kv_items) + j
            s, d = r["src_aux"], r["dst_aux"]
            want[i][d * item : (d + 1) * item] = prefill[i][s * item : (s + 1) * item]
    return want


def differences(got: list[bytes], want: list[bytearray], items: list[int]) -> list[tuple[int, int]]:
    """(region, item) pairs whose bytes differ."""
    out = []
    for i, (g, w) in enumerate(zip(got, want)):
        if len(g) != len(w):
            raise TierFailure(f"region {i}: {len(g)} bytes, expected {len(w)}")
        if g == w:
            continue
        item = items[i]
        out += [(i, k) for k in range(len(g) // item) if g[k * item : (k + 1) * item] != w[k * item : (k + 1) * item]]
    return out


def run_case(
    case: str, prefill: Remote, decode: Remote, bootstrap_port: int, rng: random.Random, next_room: list[int],
    expect_dropped: bool = False,
) -> None:  # fmt: skip
    kv_items = decode.layout["kv_item_lens"]
    aux_items = decode.layout["aux_item_lens"]
    if prefill.layout["kv_item_lens"] != kv_items or prefill.layout["aux_item_lens"] != aux_items:
        raise TierFailure(f"{case}: the two sides' layouts differ: {prefill.layout} {decode.layout}")
    pages = POOL_TOKENS // PAGE_SIZE
    rooms = [next_room[0] + i for i in range(REQUESTS_PER_CASE)]
    next_room[0] += REQUESTS_PER_CASE
    requests = plan(rng, rooms, set(range(1, pages)), set(range(1, pages)), rng.sample(range(AUX_ROWS), 2 * len(rooms)))
    addr = f"{HOST}:{bootstrap_port}"
    before = decode.call("dump")["regions"]
    source = prefill.call("dump")["regions"]
    t0 = time.monotonic()
    prefill.call("open", {"requests": requests, "bootstrap_addr": addr})
    decode.call("receive", {"requests": requests, "bootstrap_addr": addr})
    sent = prefill.call("send", {"requests": requests})["states"]
    got_states = decode.call("wait", {"requests": requests})["states"]
    elapsed = time.monotonic() - t0
    for who, states in (("prefill", sent), ("decode", got_states)):
        bad = {k: v for k, v in states.items() if v != "success"}
        if bad:
            raise TierFailure(f"{case}: the {who} side did not conclude every request with success: {bad}")
    calls = prefill.call("calls")["calls"]
    after = decode.call("dump")["regions"]
    if prefill.call("dump")["regions"] != source:
        raise TierFailure(f"{case}: the prefill side's buffers changed during the transfer")
    want = expected_decode(before, source, requests, kv_items, aux_items)
    diff = differences(after, want, kv_items + aux_items)
    n_pages = sum(len(r["src_pages"]) for r in requests)
    n_ranges = sum(ranges(r["src_pages"], r["dst_pages"]) for r in requests)
    layer_wise = prefill.layout["custom_mem_pool"]
    batch_pages = prefill.layout["max_transfer_batch_indices"]
    want_calls = expected_calls(requests, layer_wise, batch_pages, len(aux_items))
    got_calls = sorted(n for _, n in calls)
    if got_calls != want_calls:
        raise TierFailure(
            f"{case}: SGLang made transfer calls of {got_calls} ranges, the plan gives {want_calls}"
            f" (layer-wise {layer_wise}, batches of {batch_pages} pages)"
        )
    threads = len({t for t, _ in calls})
    shape = "one per chunk"
    if layer_wise:
        shape = "one per layer's K and per layer's V per chunk"
    elif batch_pages:
        shape = f"at most {batch_pages} pages each"
    path = f"{len(calls)} batch_transfer_sync calls from {threads} threads ({shape}, plus one per aux row)"
    kv_bytes = n_pages * sum(kv_items)
    if not expect_dropped:
        if diff:
            raise TierFailure(f"{case}: {len(diff)} pages/rows differ from the expected bytes, first {diff[:8]}")
        log(
            f"PASS sglang KV manager {case}: {len(requests)} requests, {n_pages} pages in {n_ranges} scattered runs"
            f" ({kv_bytes} bytes over {LAYERS * 2} K/V regions) and {len(requests)} aux rows equal byte for byte,"
            f" nothing else touched; {path} ({elapsed:.2f} s)"
        )
        return
    # The control: every requested page of every region, and every aux row, must have been missed.
    requested = {(i, d) for r in requests for i in range(len(kv_items)) for d in r["dst_pages"]}
    requested |= {(len(kv_items) + j, r["dst_aux"]) for r in requests for j in range(len(aux_items))}
    caught = set(diff)
    if not requested <= caught or caught - requested:
        raise TierFailure(
            f"{case}: with every transfer dropped the comparison flagged {len(caught)} pages/rows,"
            f" the requests covered {len(requested)}: it does not see the transfer"
        )
    log(
        f"PASS sglang KV manager {case}: every request concluded with success, and all {len(requested)}"
        f" requested pages/rows are flagged as differing ({path})"
    )


def driver_main(model: Path, workdir: Path) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    procs = Procs(workdir)
    authkey = secrets.token_hex(16)
    listener = Listener((HOST, 0), authkey=bytes.fromhex(authkey))
    rng = random.Random(44)
    # PDX_SERVING_DROP_KV=1 in the driver's environment: every pdx prefill drops its transfers while the
    # cases still expect the bytes, so each pdx case must fail (a check of this script itself).
    sabotage = os.environ.get("PDX_SERVING_DROP_KV") == "1"
    if sabotage:
        log("PDX_SERVING_DROP_KV=1: every pdx prefill drops its transfers, the pdx cases must fail")
    t0 = time.monotonic()
    try:
        decode = start_side(procs, listener, authkey, "kvm-decode-pdx", "decode", True, {}, model, free_port(), seed=1)
        prefills = []
        for n, (case, name, use_pdx, env) in enumerate([*CASES, DROP_CASE]):
            port = free_port()
            side_env = dict(env)
            if sabotage and use_pdx:
                side_env["PDX_SERVING_DROP_KV"] = "1"
            side = start_side(procs, listener, authkey, name, "prefill", use_pdx, side_env, model, port, seed=100 + n)
            prefills.append((case, port, env, use_pdx, side))
        accept_all(listener, [decode, *(p[-1] for p in prefills)])
        check_engine(decode.proc, True)
        for *_, use_pdx, side in prefills:
            check_engine(side.proc, use_pdx)
        next_room = [1000]
        for case, port, env, _, prefill in prefills:
            if "SGLANG_MOONCAKE_CUSTOM_MEM_POOL" in env and not prefill.layout["custom_mem_pool"]:
                raise TierFailure(f"{case}: the prefill manager did not take the layer-wise path")
            batches = prefill.layout["max_transfer_batch_indices"]
            if "SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES" in env and batches != MAX_TRANSFER_BATCH_INDICES:
                raise TierFailure(f"{case}: the prefill manager did not take the bounded batches")
            dropped = "PDX_SERVING_DROP_KV" in env
            if dropped:
                check_drops(prefill.proc)
            run_case(case, prefill, decode, port, rng, next_room, expect_dropped=dropped)
        for r in (decode, *(p[-1] for p in prefills)):
            r.call("quit")
    except TierFailure as err:
        log(f"FAIL {err}")
        return 1
    finally:
        listener.close()
        procs.stop_all()
    log(f"sglang KV manager: all cases passed in {time.monotonic() - t0:.0f} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--side", choices=("prefill", "decode"))
    parser.add_argument("--bootstrap-port", type=int)
    parser.add_argument("--driver-port", type=int)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.side:
        return side_main(args.side, args.model, args.bootstrap_port, args.driver_port, args.seed)
    if args.workdir is None:
        parser.error("--workdir is required")
    return driver_main(args.model, args.workdir)


if __name__ == "__main__":
    sys.exit(main())
