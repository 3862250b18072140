"""Fixtures of the metadata tests: Mooncake's HTTP metadata server and etcd,
each started on free ports for one test (helpers in servers.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from servers import Etcd, EtcdCluster, HttpMetadata, free_port, wait_until  # noqa: E402


@pytest.fixture
def http_metadata() -> Iterator[HttpMetadata]:
    exe = shutil.which("mooncake_http_metadata_server")
    if exe is None:
        pytest.skip("mooncake_http_metadata_server (from the Mooncake wheel) is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--host", "127.0.0.1", "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = HttpMetadata(port, proc)
    try:
        wait_until(lambda: server.get("probe") is None and proc.poll() is None, 30, "the HTTP metadata server")
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd() -> Iterator[Etcd]:
    exe = shutil.which("etcd")
    if exe is None:
        pytest.skip("etcd (Debian's etcd-server) is not installed")
    client, peer = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="pdx-etcd-") as data:
        proc = subprocess.Popen(
            [
                exe,
                "--name=t",
                f"--data-dir={data}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=t=http://127.0.0.1:{peer}",
                "--log-level=error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        server = Etcd(client, proc)
        try:
            wait_until(lambda: server.get("probe") is None, 30, "etcd")
            yield server
        finally:
            server.stop()


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    exe = shutil.which("etcd")
    if exe is None:
        pytest.skip("etcd (Debian's etcd-server) is not installed")
    with tempfile.TemporaryDirectory(prefix="pdx-etcd-cluster-") as data:
        cluster = EtcdCluster(exe, data)
        try:
            for i in range(3):
                cluster.start(i)
            cluster.wait_healthy()
            yield cluster
        finally:
            cluster.stop()
