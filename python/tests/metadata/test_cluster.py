"""The directory under faults and contention: a three-member etcd cluster
losing its leader, a frozen member, a restarted member, Mooncake's `;`
endpoint lists, and names that cannot be stolen or split (stalled, paused
and unauthenticated holders, twenty engines claiming one name at once).
Each etcd runs on loopback with a temporary data directory and free ports;
a test is skipped, saying why, where etcd or Mooncake's server is missing."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from servers import Etcd, EtcdCluster, HttpMetadata, Node, free_port, wait_until

import pdx
from pdx.binding import PdxError, lib

REPO = Path(__file__).resolve().parents[3]


def name() -> str:
    return f"127.0.0.1:{free_port()}"


def etcd_list(cluster: EtcdCluster, order: list[int], sep: str = ",") -> str:
    return "etcd://" + sep.join(cluster.endpoints[i] for i in order)


def buffers(store, segment: str) -> list[int] | None:
    """The buffer addresses `segment` advertises, sorted: the engine lists them by address, not by age."""
    raw = store.get(f"mooncake/ram/{segment}")
    return None if raw is None else sorted(b["addr"] for b in json.loads(raw)["buffers"])


def rpc_port(store, segment: str) -> int | None:
    raw = store.get(f"mooncake/rpc_meta/{segment}")
    return None if raw is None else int(json.loads(raw)["rpc_port"])


def register(engine: pdx.Engine, size: int = 4096) -> int:
    """Register a fresh buffer (kept alive by the engine); its address."""
    return engine.register(bytearray(size))


def first_buffer(engine: pdx.Engine, segment: str) -> int:
    """pdx_first_buffer_address: `segment`'s first buffer read from the directory (0: none)."""
    out = ctypes.c_uint64()
    rc = lib.pdx_first_buffer_address(engine.handle, segment.encode(), ctypes.byref(out))
    return out.value if rc == 0 else 0


def test_engines_start_and_register_while_the_leader_is_killed(etcd_cluster: EtcdCluster) -> None:
    cluster = etcd_cluster
    leader = cluster.leader()
    assert leader is not None
    # The leader listed first, as an operator's list often has it.
    metadata = etcd_list(cluster, [leader] + [i for i in range(3) if i != leader])
    before = pdx.Engine(name(), "tcp", metadata_server=metadata)
    cluster.kill(leader)
    started: dict[str, pdx.Engine] = {}
    took: list[float] = []
    failures: list[str] = []

    def start() -> None:
        segment = name()
        t0 = time.monotonic()
        try:
            engine = pdx.Engine(segment, "tcp", metadata_server=metadata)
        except PdxError as e:
            failures.append(str(e))
            return
        took.append(time.monotonic() - t0)
        started[segment] = engine

    threads = [threading.Thread(target=start) for _ in range(5)]
    for t in threads:
        t.start()
    # A register during the election: its descriptor must reach the store.
    registered = register(before)
    for t in threads:
        t.join()
    assert not failures, failures
    print(f"init during the election: {sorted(round(s, 2) for s in took)} s")
    wait_until(lambda: registered in (buffers(cluster, before.session_id) or []), 15, "the register's descriptor")
    for segment, engine in started.items():
        addr = register(engine)
        wait_until(lambda: addr in (buffers(cluster, segment) or []), 15, f"{segment}'s descriptor")
        assert first_buffer(before, segment) == addr
    for engine in [before, *started.values()]:
        engine.close()


def test_a_frozen_member_listed_first_costs_one_bounded_wait(etcd_cluster: EtcdCluster) -> None:
    cluster = etcd_cluster
    leader = cluster.leader()
    frozen = next(i for i in range(3) if i != leader)
    cluster.freeze(frozen)
    try:
        metadata = etcd_list(cluster, [frozen] + [i for i in range(3) if i != frozen])
        t0 = time.monotonic()
        engine = pdx.Engine(name(), "tcp", metadata_server=metadata)
        assert time.monotonic() - t0 < 10
        peer = pdx.Engine(name(), "tcp", metadata_server=metadata)
        addr = register(engine)
        assert first_buffer(peer, engine.session_id) == addr
    finally:
        cluster.thaw(frozen)
    engine.close()
    peer.close()


def test_keys_live_through_a_restarted_member_and_a_killed_leader(etcd_cluster: EtcdCluster) -> None:
    cluster = etcd_cluster
    engine = pdx.Engine(name(), "tcp", metadata_server=etcd_list(cluster, [0, 1, 2]), metadata_lease_ttl_s=2)
    segment = engine.session_id
    leader = cluster.leader()
    follower = next(i for i in range(3) if i != leader)
    cluster.kill(follower)
    time.sleep(1)
    cluster.start(follower)
    cluster.wait_healthy()
    cluster.kill(cluster.leader() or 0)
    # Three times to live (renewed every 0.67 s): the keys stay throughout.
    missing = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 6:
        try:
            if rpc_port(cluster, segment) is None or buffers(cluster, segment) is None:
                missing.append(round(time.monotonic() - t0, 1))
        except OSError:
            pass  # no member answered this read (the election)
        time.sleep(0.2)
    wait_until(lambda: rpc_port(cluster, segment) == engine.rpc_port, 10, "the keys after the election")
    assert len(missing) <= 2, f"keys missing at {missing} s"
    engine.close()


def test_endpoint_lists_with_semicolons_work_in_every_entry_point(
    etcd_cluster: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, c = etcd_cluster.endpoints
    lists = [f"etcd://{a};{b};{c}", f"{a} ; {b} ; {c}", f"etcd://{a}, {b};{c}"]
    from pdx.mooncake import TransferEngine

    for metadata in lists:
        segment = name()
        drop_in = TransferEngine()
        assert drop_in.initialize(segment, metadata, "tcp", "") == 0, metadata
        assert rpc_port(etcd_cluster, segment) == drop_in.get_rpc_port()
        by_option = pdx.Engine(name(), "tcp", metadata_server=metadata)
        assert rpc_port(etcd_cluster, by_option.session_id) == by_option.rpc_port
        monkeypatch.setenv("PDX_METADATA_SERVER", metadata)
        by_variable = pdx.Engine(name(), "tcp")
        monkeypatch.delenv("PDX_METADATA_SERVER")
        assert rpc_port(etcd_cluster, by_variable.session_id) == by_variable.rpc_port
        for engine in (by_option, by_variable):
            engine.close()
        del drop_in
    bench = REPO / "target" / "release" / "pdx-bench"
    if not bench.exists():
        bench = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release" / "pdx-bench"
    if not bench.exists():
        pytest.skip(f"pdx-bench is not built ({bench})")
    args = [str(bench), "--metadata", lists[1], "--workload", "blocks", "--block", "64K", "--total", "1M"]
    args += ["--duration", "0.2", "--buffer", "4M"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"metadata: etcd://{a},{b},{c} (peers found through etcd)" in run.stdout, run.stdout[-2000:]


def test_a_holder_stopped_past_its_lease_does_not_take_its_name_back(etcd: Etcd) -> None:
    segment = name()
    with Node("pdx", "target", segment, etcd.endpoint, env={"PDX_METADATA_LEASE_TTL_S": "2"}) as stalled:
        stalled.ready()
        stalled.proc.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: etcd.get(f"mooncake/rpc_meta/{segment}") is None, 10, "the stalled holder's lease end")
            newcomer = pdx.Engine(segment, "tcp", metadata_server=etcd.endpoint)
            addr = register(newcomer)
        finally:
            stalled.proc.send_signal(signal.SIGCONT)
        time.sleep(2.5)  # the stalled engine's keeper finds its lease lost
        assert rpc_port(etcd, segment) == newcomer.rpc_port
        assert buffers(etcd, segment) == [addr]
        rc, _, err = stalled.finish()  # a clean stop: it must leave the newcomer's keys
    assert rpc_port(etcd, segment) == newcomer.rpc_port, err[-2000:]
    assert buffers(etcd, segment) == [addr]
    # Every key is there after the newcomer's next re-publish.
    second = register(newcomer)
    assert rpc_port(etcd, segment) == newcomer.rpc_port
    assert buffers(etcd, segment) == sorted([addr, second])
    peer = pdx.Engine(name(), "tcp", metadata_server=etcd.endpoint)
    peer.probe(segment)
    newcomer.close()
    peer.close()


def secret_file(tmp_path: Path) -> str:
    path = tmp_path / "secret"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return str(path)


def test_a_newcomer_without_the_secret_leaves_a_live_holder_alone(etcd: Etcd, tmp_path: Path) -> None:
    segment = name()
    env = {"PDX_PEER_SECRET_FILE": secret_file(tmp_path)}
    with Node("pdx", "target", segment, etcd.endpoint, env=env) as holder:
        _, port = holder.ready()
        with pytest.raises(PdxError) as refused:
            pdx.Engine(segment, "tcp", metadata_server=etcd.endpoint)
        assert f"held by a live engine at 127.0.0.1:{port}" in str(refused.value)
        assert rpc_port(etcd, segment) == port


def test_a_newcomer_facing_a_paused_holder_waits_for_its_answer(etcd: Etcd) -> None:
    segment = name()
    with Node("pdx", "target", segment, etcd.endpoint) as holder:
        _, port = holder.ready()
        holder.proc.send_signal(signal.SIGSTOP)
        outcome: list[object] = []

        def claim() -> None:
            try:
                # Its probe gives up after 1 s, well before the holder wakes:
                # the holder's lease, not one probe, says whether it lives.
                engine = pdx.Engine(segment, "tcp", metadata_server=etcd.endpoint, handshake_timeout_ms=1000)
                outcome.append(engine)
            except PdxError as e:
                outcome.append(e)

        newcomer = threading.Thread(target=claim)
        newcomer.start()
        time.sleep(2.5)
        holder.proc.send_signal(signal.SIGCONT)
        newcomer.join(60)
        assert len(outcome) == 1 and isinstance(outcome[0], PdxError), outcome
        assert f"held by a live engine at 127.0.0.1:{port}" in str(outcome[0])
        assert rpc_port(etcd, segment) == port


@pytest.mark.parametrize("kind", ["etcd", "http"])
def test_twenty_simultaneous_claims_of_one_name_have_one_winner(kind: str, request: pytest.FixtureRequest) -> None:
    server = request.getfixturevalue("etcd" if kind == "etcd" else "http_metadata")
    metadata = server.endpoint if kind == "etcd" else server.url
    for trial in range(5):
        segment = name()
        gate = threading.Barrier(20)
        won: list[pdx.Engine] = []
        refused: list[str] = []

        def claim() -> None:
            gate.wait()
            try:
                won.append(pdx.Engine(segment, "tcp", metadata_server=metadata))
            except PdxError as e:
                refused.append(str(e))

        threads = [threading.Thread(target=claim) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(won) == 1, f"trial {trial}: {len(won)} winners; refusals: {refused[:2]}"
        assert all("held by a live engine" in r for r in refused), refused[:3]
        assert rpc_port(server, segment) == won[0].rpc_port
        won[0].close()


def test_a_failed_publish_is_shown_behind_and_lands_later(etcd_cluster: EtcdCluster) -> None:
    cluster = etcd_cluster
    engine = pdx.Engine(name(), "tcp", metadata_server=etcd_list(cluster, [0, 1, 2]), metadata_timeout_ms=500)
    segment = engine.session_id
    for i in range(3):
        cluster.freeze(i)
    try:
        addr = register(engine)  # its publish fails: the store is frozen
        directory = engine.peer_info(segment)["directory"]
        assert directory["behind"] is True and directory["publish_failures"] >= 1, directory
        assert "pdx_directory_behind 1" in engine.metrics_text()
    finally:
        for i in range(3):
            cluster.thaw(i)
    wait_until(lambda: addr in (buffers(cluster, segment) or []), 15, "the background publish")
    wait_until(lambda: engine.peer_info(segment)["directory"]["behind"] is False, 5, "the directory catching up")
    assert "pdx_directory_behind 0" in engine.metrics_text()
    engine.close()


def test_http_mode_claims_and_releases_only_its_own_name(http_metadata: HttpMetadata) -> None:
    segment = name()
    first = pdx.Engine(segment, "tcp", metadata_server=http_metadata.url)
    with pytest.raises(PdxError):
        pdx.Engine(segment, "tcp", metadata_server=http_metadata.url)
    # Another engine took the name over while this one was not looking:
    # this one's stop leaves it.
    assert http_metadata.delete(f"mooncake/rpc_meta/{segment}") == 200
    assert http_metadata.put(f"mooncake/rpc_meta/{segment}", b'{"ip_or_host_name":"127.0.0.1","rpc_port":1}') == 200
    first.close()
    assert http_metadata.get(f"mooncake/rpc_meta/{segment}") is not None
