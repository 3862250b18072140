"""pdx's metadata directory against real components: Mooncake's HTTP metadata
server and etcd, with pdx and Mooncake engines finding each other both ways,
and the behaviours Mooncake lacks (leases, restarts, name ownership, faults)."""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import shutil
import subprocess
import time

import pytest
from servers import Etcd, HttpMetadata, Node, free_port, need_mooncake, wait_until

import pdx
from pdx.mooncake import TransferEngine

PAIRS = [("pdx", "pdx"), ("pdx", "mooncake"), ("mooncake", "pdx")]


def metadata_string(kind: str, http_server: HttpMetadata | None, etcd_server: Etcd | None) -> str:
    if kind == "http":
        assert http_server is not None
        return http_server.url
    assert etcd_server is not None
    return f"etcd://{etcd_server.endpoint}" if kind == "etcd" else etcd_server.endpoint


@pytest.fixture(params=["http", "etcd", "etcd-bare"])
def metadata(request: pytest.FixtureRequest) -> str:
    if request.param == "http":
        return metadata_string("http", request.getfixturevalue("http_metadata"), None)
    return metadata_string(request.param, None, request.getfixturevalue("etcd"))


def name() -> str:
    # Names carry a port that is only part of the name in these modes.
    return f"127.0.0.1:{free_port()}"


@pytest.mark.parametrize("initiator,target", PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_engines_find_each_other_and_move_bytes(metadata: str, initiator: str, target: str) -> None:
    if "mooncake" in (initiator, target):
        need_mooncake()
    target_name = name()
    with Node(target, "target", target_name, metadata) as t:
        t.ready()
        with Node(initiator, "initiator", name(), metadata, target_name) as i:
            rc, out, err = i.finish()
            assert rc == 0 and "OK" in out, f"{out}\n{err[-3000:]}"
        _, said, _ = t.finish()
    assert f'NOTIFIES [["node", "hello {target_name}"]]' in said, said


def started(segment: str, metadata: str, **env: str) -> TransferEngine:
    engine = TransferEngine()
    assert engine.initialize(segment, metadata, "tcp", "") == 0
    return engine


def test_keys_and_values_are_mooncakes_and_go_at_free(http_metadata: HttpMetadata) -> None:
    segment = name()
    engine = started(segment, http_metadata.url)
    buf = engine.allocate_managed_buffer(4096)
    desc = json.loads(http_metadata.get(f"mooncake/ram/{segment}") or b"{}")
    assert desc["name"] == segment and desc["protocol"] == "tcp" and desc["tcp_proto_version"] == 2
    assert desc["buffers"] == [{"addr": buf, "length": 4096, "name": segment}]
    rpc = json.loads(http_metadata.get(f"mooncake/rpc_meta/{segment}") or b"{}")
    assert rpc == {"ip_or_host_name": "127.0.0.1", "rpc_port": engine.get_rpc_port()}
    assert engine.get_first_buffer_address(segment) == buf
    # Re-published whole on unregister.
    assert engine.free_managed_buffer(buf, 4096) == 0
    assert json.loads(http_metadata.get(f"mooncake/ram/{segment}") or b"{}")["buffers"] == []
    del engine
    gc.collect()
    wait_until(lambda: http_metadata.get(f"mooncake/ram/{segment}") is None, 10, "the descriptor's removal")
    assert http_metadata.get(f"mooncake/rpc_meta/{segment}") is None


def test_cluster_id_namespaces_the_keys(http_metadata: HttpMetadata, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MC_METADATA_CLUSTER_ID", "blue")
    segment = name()
    engine = started(segment, http_metadata.url)
    assert http_metadata.get(f"mooncake/blue/rpc_meta/{segment}") is not None
    assert http_metadata.get(f"mooncake/rpc_meta/{segment}") is None
    del engine


def seconds_until_gone(store: Etcd, key: str, limit: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if store.get(key) is None:
            return time.monotonic() - t0
        time.sleep(0.1)
    return None


def test_a_killed_engines_etcd_keys_vanish_within_the_lease(etcd: Etcd) -> None:
    segment = name()
    with Node("pdx", "target", segment, etcd.endpoint, env={"PDX_METADATA_LEASE_TTL_S": "3"}) as t:
        t.ready()
        assert etcd.get(f"mooncake/ram/{segment}") is not None
        time.sleep(2)  # past one renewal: the keys outlive a keep-alive
        assert etcd.get(f"mooncake/ram/{segment}") is not None
        t.proc.kill()
        gone = seconds_until_gone(etcd, f"mooncake/ram/{segment}", 10)
    # The time to live after the last renewal, plus etcd's expiry check (slower under load).
    assert gone is not None and gone <= 5.5, gone
    assert etcd.get(f"mooncake/rpc_meta/{segment}") is None


def test_a_killed_mooncake_engines_keys_stay(etcd: Etcd) -> None:
    need_mooncake()
    segment = name()
    with Node("mooncake", "target", segment, etcd.endpoint) as t:
        t.ready()
        t.proc.kill()
    assert seconds_until_gone(etcd, f"mooncake/ram/{segment}", 5) is None


@pytest.mark.parametrize("kind", ["http", "etcd"])
def test_a_peer_restarted_under_its_name_is_reached_at_its_new_ports(kind: str, request: pytest.FixtureRequest) -> None:
    server = request.getfixturevalue("http_metadata" if kind == "http" else "etcd")
    metadata = server.url if kind == "http" else server.endpoint
    segment = name()
    engine = started(name(), metadata)
    local = engine.allocate_managed_buffer(4096)
    engine.write_bytes_to_buffer(local, b"x" * 64, 64)
    with Node("pdx", "target", segment, metadata) as t:
        remote, port = t.ready()
        assert engine.transfer_sync_write(segment, local, remote, 64) == 0
        t.proc.kill()
    # Restarted at once: the dead holder's keys are still there (and, over
    # HTTP, its rpc_meta that the server refuses to overwrite).
    with Node("pdx", "target", segment, metadata) as t2:
        remote2, port2 = t2.ready()
        assert port2 != port
        assert engine.transfer_sync_write(segment, local, remote2, 64) == 0
        assert engine.get_first_buffer_address(segment) == remote2


def test_a_live_name_is_refused_naming_its_holder(
    http_metadata: HttpMetadata, caplog: pytest.LogCaptureFixture
) -> None:
    segment = name()
    first = started(segment, http_metadata.url)
    second = TransferEngine()
    with caplog.at_level(logging.ERROR, logger="pdx.mooncake"):
        assert second.initialize(segment, http_metadata.url, "tcp", "") == -1
    assert f"held by a live engine at 127.0.0.1:{first.get_rpc_port()}" in caplog.text
    # The holder's keys are untouched.
    assert first.get_first_buffer_address(segment) == 0
    assert http_metadata.get(f"mooncake/rpc_meta/{segment}") is not None


def test_republishing_ones_own_keys_is_idempotent(http_metadata: HttpMetadata) -> None:
    segment = name()
    engine = started(segment, http_metadata.url)
    for _ in range(3):
        buf = engine.allocate_managed_buffer(4096)
        assert buf and engine.get_first_buffer_address(segment) == buf
        assert engine.free_managed_buffer(buf, 4096) == 0


def test_a_segment_published_after_the_first_lookup_is_found(http_metadata: HttpMetadata) -> None:
    segment = name()
    engine = started(name(), http_metadata.url)
    assert engine.get_first_buffer_address(segment) == 0
    assert engine.send_probe(segment) != 0
    with Node("pdx", "target", segment, http_metadata.url) as t:
        remote, _ = t.ready()
        assert engine.get_first_buffer_address(segment) == remote
        assert engine.send_probe(segment) == 0


@pytest.mark.parametrize("kind", ["http", "etcd"])
def test_known_peers_keep_working_when_the_store_goes_away(kind: str, request: pytest.FixtureRequest) -> None:
    server = request.getfixturevalue("http_metadata" if kind == "http" else "etcd")
    metadata = server.url if kind == "http" else server.endpoint
    segment = name()
    engine = started(name(), metadata)
    local = engine.allocate_managed_buffer(4096)
    with Node("pdx", "target", segment, metadata) as t:
        remote, _ = t.ready()
        assert engine.transfer_sync_write(segment, local, remote, 4096) == 0
        server.stop()
        assert engine.transfer_sync_write(segment, local, remote, 4096) == 0
        t0 = time.monotonic()
        assert engine.get_first_buffer_address(name()) == 0
        assert f"127.0.0.1:{server.port}" in pdx.last_error() and "did not answer" in pdx.last_error()
        assert engine.batch_transfer_async_write(name(), [local], [remote], [16]) == 0
        assert time.monotonic() - t0 < 10


def test_malformed_and_oversized_values_are_refused_naming_the_key(http_metadata: HttpMetadata) -> None:
    engine = started(name(), http_metadata.url)
    local = engine.allocate_managed_buffer(4096)
    bad = {
        "garbage": b"\xff{not json",
        "no-port": b'{"protocol":"tcp","buffers":[]}',
        "zero-addr": b'{"protocol":"tcp","tcp_data_port":7,"buffers":[{"name":"x","addr":0,"length":4}]}',
    }
    for label, value in bad.items():
        segment = f"127.0.0.1:{label}"
        assert http_metadata.put(f"mooncake/ram/{segment}", value) == 200
        assert http_metadata.put(f"mooncake/rpc_meta/{segment}", b'{"ip_or_host_name":"","rpc_port":0}') == 200
        assert engine.get_first_buffer_address(segment) == 0
        message = pdx.last_error()
        assert f"mooncake/ram/{segment}" in message, (label, message)
        assert engine.transfer_sync_write(segment, local, 4096, 16) != 0
        assert engine.send_probe(segment) != 0
        assert f"mooncake/rpc_meta/{segment}" in pdx.last_error()


def test_an_oversized_value_is_refused_naming_the_key(etcd: Etcd) -> None:
    # Over pdx's bound (1 MiB, the handshake frame limit) and under etcd's request limit.
    engine = started(name(), etcd.endpoint)
    segment = "127.0.0.1:huge"
    etcd.put(f"mooncake/ram/{segment}", b'{"protocol":"tcp","tcp_data_port":7,"pad":"' + b"a" * (1200 << 10) + b'"}')
    assert engine.get_first_buffer_address(segment) == 0
    message = pdx.last_error()
    assert f"mooncake/ram/{segment}" in message and "larger than" in message, message


@pytest.mark.parametrize(
    "metadata,says",
    [
        ("redis://127.0.0.1:6379", "redis"),
        ("zk://127.0.0.1:1", "unknown scheme"),
        ("localhost", "not host:port"),
    ],
)
def test_unknown_metadata_strings_fail_init_naming_them(
    metadata: str, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="pdx.mooncake"):
        assert TransferEngine().initialize(name(), metadata, "tcp", "") == -1
    assert metadata in caplog.text and says in caplog.text


@pytest.mark.parametrize("kind", ["http", "etcd"])
def test_an_unreachable_server_fails_init_within_a_bound(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    metadata = f"http://127.0.0.1:{port}/metadata" if kind == "http" else f"etcd://127.0.0.1:{port}"
    t0 = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="pdx.mooncake"):
        assert TransferEngine().initialize(name(), metadata, "tcp", "") == -1
    assert time.monotonic() - t0 < 10
    assert f"127.0.0.1:{port}" in caplog.text


def test_initialize_ext_builds_type_url(etcd: Etcd) -> None:
    engine = TransferEngine()
    segment = name()
    assert engine.initialize_ext(segment, etcd.endpoint, "tcp", "", "etcd") == 0
    assert etcd.get(f"mooncake/rpc_meta/{segment}") is not None


def test_mooncakes_benchmark_writes_to_a_pdx_target_through_http(http_metadata: HttpMetadata) -> None:
    bench = shutil.which("transfer_engine_bench")
    if bench is None:
        pytest.skip("transfer_engine_bench (from the Mooncake wheel) is not installed")
    segment = name()
    with Node("pdx", "target", segment, http_metadata.url, env={"NODE_TARGET_BYTES": str(64 << 20)}) as t:
        t.ready()
        args = [bench, "--mode=initiator", f"--metadata_server={http_metadata.url}", f"--local_server_name={name()}"]
        args += [f"--segment_id={segment}", "--protocol=tcp", "--operation=write", "--duration=2", "--threads=2"]
        args += ["--batch_size=16", "--block_size=65536", f"--buffer_size={32 << 20}"]
        run = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**os.environ, "MC_FORCE_TCP": "1"})
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    found = re.search(r"batch count (\d+), throughput ([\d.]+)", log)
    assert found and int(found.group(1)) > 0 and float(found.group(2)) > 0, log[-3000:]


def test_the_c_abi_option_and_its_variable_choose_the_directory(
    http_metadata: HttpMetadata, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pdx.Engine is pdx_engine_init_with: the option, then the variable; neither keeps P2P.
    by_option = pdx.Engine("127.0.0.1:1001", "tcp", metadata_server=http_metadata.url)
    assert by_option.session_id == "127.0.0.1:1001"
    assert http_metadata.get("mooncake/rpc_meta/127.0.0.1:1001") is not None
    monkeypatch.setenv("PDX_METADATA_SERVER", http_metadata.url)
    by_variable = pdx.Engine("127.0.0.1:1002", "tcp")
    assert http_metadata.get("mooncake/rpc_meta/127.0.0.1:1002") is not None
    # The drop-in's argument wins over the variable.
    p2p = TransferEngine()
    assert p2p.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert p2p._engine is not None and p2p._engine.session_id == f"127.0.0.1:{p2p.get_rpc_port()}"
    monkeypatch.delenv("PDX_METADATA_SERVER")
    plain = pdx.Engine("127.0.0.1", "tcp")
    assert plain.session_id == f"127.0.0.1:{plain.rpc_port}"
    for engine in (by_option, by_variable, plain):
        engine.close()
    assert http_metadata.get("mooncake/rpc_meta/127.0.0.1:1001") is None
