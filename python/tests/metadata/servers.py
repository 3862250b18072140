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
