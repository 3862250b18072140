"""Process and HTTP plumbing for the serving tier (scripts/test-serving.sh).

Every server runs in its own process group, logs to a file under the run's
work directory, and is killed (SIGTERM, then SIGKILL) when the tier ends,
whatever happens: normal exit, an exception, SIGINT or SIGTERM. Every wait has
a deadline and also stops as soon as the awaited process has died. Ports are
free ports on 127.0.0.1, handed out once per run.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

HOST = "127.0.0.1"


class TierFailure(AssertionError):
    """A case of the tier failed (the message says which and why)."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


_handed_out: set[int] = set()


def free_port() -> int:
    """A port nobody listens on now, never handed out twice in this run."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        # Servers often open port+1 and the like: keep some distance between ours.
        if all(abs(port - p) > 8 for p in _handed_out) and port < 60000:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free port on 127.0.0.1")


class Proc:
    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path):
        self.name = name
        self.popen = popen
        self.log_path = log_path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def stop(self, grace_s: float = 15.0) -> None:
        if self.popen.poll() is not None:
            return
        _signal_group(self.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.popen.poll() is None:
            time.sleep(0.2)
        _signal_group(self.popen.pid, signal.SIGKILL)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Procs:
    """Every process the tier started; all are killed by stop_all (also at exit and on signals)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: list[Proc] = []
        atexit.register(self.stop_all)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop_all()
        sys.exit(128 + signum)

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        path = self.workdir / f"{name}.log"
        out = open(path, "ab")
        log(f"start {name}: {' '.join(argv)}")
        popen = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
        out.close()
        proc = Proc(name, popen, path)
        self.procs.append(proc)
        return proc

    def stop(self, *procs: Proc) -> None:
        for p in procs:
            p.stop()
            if p in self.procs:
                self.procs.remove(p)

    def stop_all(self) -> None:
        for p in list(self.procs):
            _signal_group(p.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(p.alive() for p in self.procs):
            time.sleep(0.2)
        for p in list(self.procs):
            p.stop(grace_s=0)
        self.procs.clear()


def http(method: str, url: str, body: Optional[Any] = None, timeout: float = 30.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def post_json(url: str, body: Any, timeout: float = 120.0) -> Any:
    status, data = http("POST", url, body, timeout=timeout)
    if status != 200:
        raise TierFailure(f"POST {url} answered {status}: {data[:2000]!r}")
    return json.loads(data)


def wait_until(
    what: str, ready: Callable[[], bool], deadline_s: float, watch: list[Proc], poll_s: float = 1.0
) -> None:
    """Poll `ready` until it is true; fail at the deadline or as soon as a watched process died."""
    end = time.monotonic() + deadline_s
    started = time.monotonic()
    while True:
        for p in watch:
            if not p.alive():
                raise TierFailure(f"{p.name} exited ({p.popen.returncode}) while waiting for {what}:\n{p.tail()}")
        try:
            if ready():
                log(f"{what}: ready after {time.monotonic() - started:.0f} s")
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() > end:
            tails = "\n".join(f"--- {p.name} ---\n{p.tail()}" for p in watch)
            raise TierFailure(f"{what}: not ready after {deadline_s:.0f} s\n{tails}")
        time.sleep(poll_s)


def answers_200(url: str, timeout: float = 5.0) -> Callable[[], bool]:
    return lambda: http("GET", url, timeout=timeout)[0] == 200


def check_engine(proc: Proc, use_pdx: bool) -> None:
    """The server's `mooncake.engine` is the one the case names: pdx's drop-in or the Mooncake wheel's.

    pdx's shim writes its start-up line in every interpreter it serves; the wheel's C++ engine logs
    from transfer_engine_impl.cpp when it starts."""
    text = proc.log_path.read_text(errors="replace")
    served = "`import mooncake.engine` is served by pdx" in text
    wheel = "transfer_engine_impl.cpp" in text
    if use_pdx and (not served or wheel):
        raise TierFailure(f"{proc.name} should run pdx's drop-in (shim line: {served}, wheel engine: {wheel})")
    if not use_pdx and (served or not wheel):
        raise TierFailure(f"{proc.name} should run the Mooncake wheel (shim line: {served}, wheel engine: {wheel})")


# The line scripts/serving/pythonpath/sitecustomize.py prints (its DROP_KV_BANNER).
DROP_KV_BANNER = "pdx-serving: PDX_SERVING_DROP_KV=1, every transfer of pdx's TransferEngine is dropped"


def check_drops(proc: Proc) -> None:
    """The process ran with the dropped-KV hook (scripts/serving/pythonpath/sitecustomize.py)."""
    if DROP_KV_BANNER not in proc.log_path.read_text(errors="replace"):
        raise TierFailure(f"{proc.name} should run with PDX_SERVING_DROP_KV=1, its log lacks the hook's line")
