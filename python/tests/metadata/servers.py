"""Real metadata servers for the directory tests (fixtures in conftest.py): Mooncake's HTTP metadata
server (from the Mooncake wheel) and etcd (Debian's etcd-server), each
started on free ports (etcd with a temporary data directory) and stopped
after the test. A test that needs one that is not installed is skipped,
saying which."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NODE = HERE / "node.py"
# The pdx package (python/), for node.py run as a script of its own.
PACKAGE_DIR = str(HERE.parents[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{what} not within {seconds} s")


class HttpMetadata:
    """Mooncake's HTTP metadata server; `get`/`put`/`delete` talk to it directly."""

    def __init__(self, port: int, proc: subprocess.Popen):
        self.port, self.proc = port, proc
        self.url = f"http://127.0.0.1:{port}/metadata"

    def _req(self, method: str, key: str, body: bytes | None = None) -> tuple[int, bytes]:
        url = f"{self.url}?key={urllib.parse.quote(key, safe='')}"
        req = urllib.request.Request(url, data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def get(self, key: str) -> bytes | None:
        status, body = self._req("GET", key)
        return body if status == 200 else None

    def put(self, key: str, value: bytes) -> int:
        return self._req("PUT", key, value)[0]

    def delete(self, key: str) -> int:
        return self._req("DELETE", key)[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


class Etcd:
    """A one-member etcd; `get`/`put` through its v3 JSON gateway."""

    def __init__(self, port: int, proc: subprocess.Popen):
        self.port, self.proc = port, proc
        self.endpoint = f"127.0.0.1:{port}"

    def _post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"http://{self.endpoint}{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def get(self, key: str) -> bytes | None:
        reply = self._post("/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()})
        kvs = reply.get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def put(self, key: str, value: bytes) -> None:
        b64 = base64.b64encode
        self._post("/v3/kv/put", {"key": b64(key.encode()).decode(), "value": b64(value).decode()})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def need_mooncake() -> None:
    try:
        import mooncake.engine  # noqa: F401
    except Exception as exc:  # pragma: no cover - CI installs the wheel
        pytest.skip(f"the Mooncake wheel is not importable: {exc}")


class Node:
    """A node.py process (target or initiator)."""

    def __init__(self, impl: str, role: str, name: str, metadata: str, target: str = "", env: dict | None = None):
        args = [sys.executable, str(NODE), impl, role, name, metadata] + ([target] if target else [])
        # A file, not a pipe: a chatty engine (glog) never blocks on it.
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_DIR, os.environ.get("PYTHONPATH")])),
                 **(env or {})},
        )
        self.name = name

    def ready(self, seconds: float = 30) -> tuple[int, int]:
        """Wait for READY; (buffer address, rpc port)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("READY"):
                _, addr, port = line.split()
                return int(addr), int(port)
            if not line:
                break
        self.kill()
        raise AssertionError(f"{self.name} did not start: {self.stderr()[-3000:]}")

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def finish(self, seconds: float = 60) -> tuple[int, str, str]:
        try:
            out, _ = self.proc.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            out, _ = self.proc.communicate()
        return self.proc.returncode, out, self.stderr()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


class EtcdCluster:
    """Three etcd members on loopback (free ports, temporary data
    directories): kill, freeze (SIGSTOP), thaw and restart a member, find
    the leader, read keys through any member that answers."""

    def __init__(self, exe: str, data: str, size: int = 3):
        self.exe, self.data = exe, data
        self.names = [f"m{i}" for i in range(size)]
        self.clients = [free_port() for _ in range(size)]
        self.peers = [free_port() for _ in range(size)]
        self.procs: list[subprocess.Popen | None] = [None] * size
        self.token = f"pdx-{os.getpid()}-{self.clients[0]}"

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.clients]

    def start(self, i: int) -> None:
        cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peers))
        self.procs[i] = subprocess.Popen(
            [
                self.exe,
                f"--name={self.names[i]}",
                f"--data-dir={self.data}/{self.names[i]}",
                f"--listen-client-urls=http://127.0.0.1:{self.clients[i]}",
                f"--advertise-client-urls=http://127.0.0.1:{self.clients[i]}",
                f"--listen-peer-urls=http://127.0.0.1:{self.peers[i]}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{self.peers[i]}",
                f"--initial-cluster={cluster}",
                f"--initial-cluster-token={self.token}",
                "--initial-cluster-state=new",
                "--log-level=error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _post(self, i: int, path: str, body: dict, timeout: float = 2) -> dict:
        req = urllib.request.Request(
            f"http://{self.endpoints[i]}{path}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def leader(self) -> int | None:
        """The member that leads now, as a live member says (None: none yet)."""
        for i, proc in enumerate(self.procs):
            if proc is None or proc.poll() is not None:
                continue
            try:
                status = self._post(i, "/v3/maintenance/status", {}, timeout=1)
            except (OSError, ValueError):
                continue
            leader = status.get("leader")
            if leader and leader != "0":
                for j in range(len(self.procs)):
                    try:
                        if self._post(j, "/v3/maintenance/status", {}, timeout=1)["header"]["member_id"] == leader:
                            return j
                    except (OSError, ValueError, KeyError):
                        continue
        return None

    def wait_healthy(self, seconds: float = 30) -> int:
        found: list[int] = []

        def check() -> bool:
            leader = self.leader()
            if leader is None:
                return False
            found.append(leader)
            return self.get("probe") is None

        wait_until(check, seconds, "an etcd leader")
        return found[-1]

    def get(self, key: str) -> bytes | None:
        kv = self.get_kv(key)
        return base64.b64decode(kv.get("value", "")) if kv else None

    def get_kv(self, key: str) -> dict | None:
        last: Exception | None = None
        for i, proc in enumerate(self.procs):
            if proc is None or proc.poll() is not None:
                continue
            try:
                reply = self._post(i, "/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()})
            except (OSError, ValueError) as e:
                last = e
                continue
            kvs = reply.get("kvs") or []
            return kvs[0] if kvs else None
        raise OSError(f"no etcd member answered: {last}")

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def freeze(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(19)  # SIGSTOP

    def thaw(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        proc.send_signal(18)  # SIGCONT

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                self.thaw(i)
                self.kill(i)
