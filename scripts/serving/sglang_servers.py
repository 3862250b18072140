"""SGLang's own PD servers on pdx, on CPU (run by scripts/test-serving.sh).

SGLang's `python -m sglang.launch_server` prefill and decode servers
(`--disaggregation-transfer-backend mooncake_tcp`) move the KV of a tiny
random-weight llama through `mooncake.engine`: pdx's drop-in when the process
runs with PDX_MOONCAKE_SHIM=1, the Mooncake wheel otherwise. The decode
server's tokens and logprobs must equal a plain (non-PD) server's:

- pdx -> pdx, requests through `sglang-router` (PD mode);
- Mooncake wheel (prefill) -> pdx (decode);
- pdx (prefill) -> Mooncake wheel (decode);
- negative control: a prefill whose pdx returns success for every write and
  moves nothing (aux data, the first token, over SGLang's ZMQ side channel):
  every prompt's later tokens or logprobs must differ from the plain server's.

Usage: sglang_servers.py --model DIR --workdir DIR [--cases a,b,...]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
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
START_DEADLINE_S = 420.0  # a server start on 2 busy cores: ~60 s idle
REQUEST_TIMEOUT_S = 300.0
NEW_TOKENS = 12
LOGPROB_TOLERANCE = 1e-3

# Prompt lengths: inside one page, exactly one, across many (page size 16).
CHECKED_LENGTHS = (5, 16, 37, 100, 171)
CONTROL_LENGTHS = (23, 64, 150)

COMMON_FLAGS = [
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--skip-tokenizer-init",
    "--page-size", "16",
    "--dtype", "float32",
    # On CPU SGLang sizes the pool from the memory left after loading, which a server starting
    # beside it also takes: a fraction with room, and a token cap so the pool stays small (~8 MB).
    "--mem-fraction-static", "0.3",
    "--max-total-tokens", "8192",
    "--max-running-requests", "8",
    "--log-level", "info",
]  # fmt: skip


def prompts(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in lengths]


def env_for(use_pdx: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SGLANG_USE_CPU_ENGINE="1",
        SGLANG_HOST_IP=HOST,
        PYTHONPATH=str(PYTHONPATH_DIR),
        PYTHONUNBUFFERED="1",
        # No hub, no telemetry: the model is local.
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.pop("PDX_MOONCAKE_SHIM", None)
    env.pop("PDX_SERVING_DROP_KV", None)
    if use_pdx:
        env["PDX_MOONCAKE_SHIM"] = "1"
    env.update(extra or {})
    return env


class Cluster:
    def __init__(self, procs: Procs, model: Path, python: str):
        self.procs = procs
        self.model = model
        self.python = python
        self.engines: dict[str, bool] = {}  # PD server name -> runs pdx's drop-in

    def server(self, name: str, flags: list[str], env: dict[str, str]) -> tuple[Proc, int]:
        port = free_port()
        argv = [self.python, "-m", "sglang.launch_server", "--model-path", str(self.model)]
        argv += ["--host", HOST, "--port", str(port), *COMMON_FLAGS, *flags]
        return self.procs.start(name, argv, env), port

    def plain(self) -> tuple[Proc, int]:
        return self.server("sglang-plain", [], env_for(False))

    def prefill(self, name: str, use_pdx: bool, extra_env: dict[str, str] | None = None) -> tuple[Proc, int, int]:
        bootstrap = free_port()
        flags = [
            "--disaggregation-mode", "prefill",
            "--disaggregation-transfer-backend", "mooncake_tcp",
            "--disaggregation-bootstrap-port", str(bootstrap),
        ]  # fmt: skip
        # Its default path pins memory and records a CUDA event.
        extra = {"SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": "1", **(extra_env or {})}
        proc, port = self.server(name, flags, env_for(use_pdx, extra))
        self.engines[name] = use_pdx
        return proc, port, bootstrap

    def decode(self, name: str, use_pdx: bool) -> tuple[Proc, int]:
        flags = [
            "--disaggregation-mode", "decode",
            "--disaggregation-transfer-backend", "mooncake_tcp",
            "--disaggregation-decode-retraction-backup", "cpu_tensor",
        ]  # fmt: skip
        self.engines[name] = use_pdx
        return self.server(name, flags, env_for(use_pdx))

    def wait_ready(self, procs_ports: list[tuple[Proc, int]]) -> None:
        for proc, port in procs_ports:
            wait_until(f"{proc.name} /health", answers_200(f"http://{HOST}:{port}/health"), START_DEADLINE_S, [proc])
            if proc.name in self.engines:
                check_engine(proc, self.engines[proc.name])


def request(input_ids: list[int]) -> dict[str, Any]:
    return {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True},
        "return_logprob": True,
    }


def outcome(answer: dict[str, Any]) -> tuple[list[int], list[float]]:
    pairs = answer["meta_info"]["output_token_logprobs"]
    ids = [int(t) for _, t, _ in pairs]
    if ids != answer["output_ids"]:
        raise TierFailure(f"output_ids {answer['output_ids']} disagree with their logprobs' tokens {ids}")
    return ids, [float(lp) for lp, _, _ in pairs]


def generate_plain(port: int, batch: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    return [outcome(post_json(f"http://{HOST}:{port}/generate", request(p), REQUEST_TIMEOUT_S)) for p in batch]


def generate_pd(prefill_port: int, bootstrap: int, decode_port: int, batch: list[list[int]]) -> list[Any]:
    """What sglang-router does: the same request, with one bootstrap room, to both servers at once."""
    results: list[Any] = []
    for ids in batch:
        body = dict(request(ids), bootstrap_host=HOST, bootstrap_port=bootstrap, bootstrap_room=random.getrandbits(62))
        answers: dict[str, Any] = {}

        def send(role: str, port: int) -> None:
            try:
                answers[role] = post_json(f"http://{HOST}:{port}/generate", body, REQUEST_TIMEOUT_S)
            except Exception as err:  # noqa: BLE001  (reported below, with the other side's)
                answers[role] = err

        threads = [threading.Thread(target=send, args=a) for a in (("prefill", prefill_port), ("decode", decode_port))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(REQUEST_TIMEOUT_S + 30)
        for role in ("prefill", "decode"):
            if isinstance(answers.get(role), Exception) or role not in answers:
                raise TierFailure(f"PD request to the {role} server failed: {answers.get(role)!r}")
        results.append(outcome(answers["decode"]))
    return results


def generate_router(port: int, batch: list[list[int]]) -> list[Any]:
    return [outcome(post_json(f"http://{HOST}:{port}/generate", request(p), REQUEST_TIMEOUT_S)) for p in batch]


def same(case: str, got: list[Any], want: list[Any], batch: list[list[int]]) -> None:
    for (ids, lps), (want_ids, want_lps), prompt in zip(got, want, batch):
        worst = max(abs(a - b) for a, b in zip(lps, want_lps))
        if ids != want_ids or worst > LOGPROB_TOLERANCE:
            raise TierFailure(
                f"{case}: prompt of {len(prompt)} tokens decoded {ids} (logprobs {lps}),"
                f" the plain server {want_ids} (logprobs {want_lps})"
            )
    log(f"PASS {case}: {len(batch)} prompts ({sum(map(len, batch))} prompt tokens), tokens and logprobs equal")


def differs(case: str, got: list[Any], want: list[Any], batch: list[list[int]]) -> None:
    """Every prompt's tokens after the first (the first comes from the prefill) must change."""
    for (ids, lps), (want_ids, want_lps), prompt in zip(got, want, batch):
        if ids[0] != want_ids[0]:
            raise TierFailure(f"{case}: the first token (sent with the aux data) should be intact: {ids} {want_ids}")
        worst = max(abs(a - b) for a, b in zip(lps[1:], want_lps[1:]))
        if ids[1:] == want_ids[1:] and worst <= LOGPROB_TOLERANCE:
            raise TierFailure(
                f"{case}: with every KV page dropped the decode server still matched the plain server"
                f" for a prompt of {len(prompt)} tokens ({ids}): the comparison does not see the KV"
            )
    log(f"PASS {case}: every prompt's decode changed with its KV pages dropped")


def start_router(procs: Procs, python: str, prefill_port: int, bootstrap: int, decode_port: int) -> tuple[Proc, int]:
    port = free_port()
    argv = [
        python, "-m", "sglang_router.launch_router", "--pd-disaggregation",
        "--prefill", f"http://{HOST}:{prefill_port}", str(bootstrap),
        "--decode", f"http://{HOST}:{decode_port}",
        "--host", HOST, "--port", str(port),
        "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = procs.start("sglang-router", argv, env)
    # The router answers 503 until it has activated both workers: wait for a real answer.
    probe = request([7, 8, 9])

    def answers() -> bool:
        return http("POST", f"http://{HOST}:{port}/generate", probe, timeout=60)[0] == 200

    wait_until("sglang-router serving both workers", answers, START_DEADLINE_S, [proc], poll_s=2.0)
    return proc, port


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--cases", default="router,wheel-to-pdx,drop-control,pdx-to-wheel")
    args = parser.parse_args()
    cases = args.cases.split(",")
    args.workdir.mkdir(parents=True, exist_ok=True)
    procs = Procs(args.workdir)
    cluster = Cluster(procs, args.model, sys.executable)
    checked = prompts(CHECKED_LENGTHS, seed=1)
    control = prompts(CONTROL_LENGTHS, seed=2)
    t0 = time.monotonic()
    try:
        plain = cluster.plain()
        cluster.wait_ready([plain])
        want = generate_plain(plain[1], checked)
        want_control = generate_plain(plain[1], control)
        # Twice: the reference itself must be stable within the tolerance (a prefix-cache hit may move
        # the last bits of a logprob, never a token).
        same("sglang plain server, asked twice", generate_plain(plain[1], checked), want, checked)
        procs.stop(plain[0])
        log(f"plain server: {len(checked) + len(control)} prompts answered")

        if any(c in cases for c in ("router", "wheel-to-pdx", "drop-control")):
            decode, d_port = cluster.decode("sglang-decode-pdx", use_pdx=True)
            if "router" in cases:
                prefill, p_port, boot = cluster.prefill("sglang-prefill-pdx", use_pdx=True)
                cluster.wait_ready([(decode, d_port), (prefill, p_port)])
                router, r_port = start_router(procs, sys.executable, p_port, boot, d_port)
                same("sglang pdx -> pdx through sglang-router", generate_router(r_port, checked), want, checked)
                procs.stop(router, prefill)
            if "wheel-to-pdx" in cases:
                prefill, p_port, boot = cluster.prefill("sglang-prefill-wheel", use_pdx=False)
                cluster.wait_ready([(decode, d_port), (prefill, p_port)])
                same("sglang Mooncake wheel -> pdx", generate_pd(p_port, boot, d_port, checked), want, checked)
                procs.stop(prefill)
            if "drop-control" in cases:
                drop_env = {"PDX_SERVING_DROP_KV": "1", "SGLANG_MOONCAKE_SEND_AUX_TCP": "1"}
                prefill, p_port, boot = cluster.prefill("sglang-prefill-pdx-drops-kv", True, drop_env)
                cluster.wait_ready([(decode, d_port), (prefill, p_port)])
                check_drops(prefill)
                got = generate_pd(p_port, boot, d_port, control)
                differs("sglang negative control (pdx drops every KV page)", got, want_control, control)
                procs.stop(prefill)
            procs.stop(decode)

        if "pdx-to-wheel" in cases:
            decode, d_port = cluster.decode("sglang-decode-wheel", use_pdx=False)
            prefill, p_port, boot = cluster.prefill("sglang-prefill-pdx-to-wheel", use_pdx=True)
            cluster.wait_ready([(decode, d_port), (prefill, p_port)])
            same("sglang pdx -> Mooncake wheel", generate_pd(p_port, boot, d_port, checked), want, checked)
    except TierFailure as err:
        log(f"FAIL {err}")
        return 1
    finally:
        procs.stop_all()
    log(f"sglang servers: all cases passed in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
