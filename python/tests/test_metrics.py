"""Operators' view (issue 23): the Prometheus exposition parsed with
prometheus_client's own parser, per-peer figures, the periodic line, and the
address allowlist."""

import logging
import socket
import time

import pytest

import pdx

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client is in requirements-test.txt")


def families(engine: pdx.Engine) -> dict:
    return {f.name: f for f in parser.text_string_to_metric_families(engine.metrics_text())}


def value(fams: dict, family: str, sample: str, **labels: str) -> float:
    for s in fams[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{sample} {labels}")


def test_completed_work_is_split_by_path():
    """The same workload over the same-host link: bytes and tasks under
    path="same-host", none under "tcp"; the peer's figures say why."""
    with pdx.Engine("127.0.0.1", "tcp") as a, pdx.Engine("127.0.0.1", "tcp") as b:
        known_workload(a, b)
        fa = families(a)
        info = a.peer_info(b.session_id)
    for path, (w_bytes, r_bytes, w_tasks) in [("same-host", (1030, 500, 3)), ("tcp", (0, 0, 0))]:
        w, r = {"direction": "write", "path": path}, {"direction": "read", "path": path}
        assert value(fa, "pdx_transferred_bytes", "pdx_transferred_bytes_total", **w) == w_bytes
        assert value(fa, "pdx_transferred_bytes", "pdx_transferred_bytes_total", **r) == r_bytes
        assert value(fa, "pdx_tasks_completed", "pdx_tasks_completed_total", **w) == w_tasks
    assert info["path"] == "same-host" and "nonce" in info["reason"], info
    assert (info["same_host_bytes_written"], info["same_host_bytes_read"]) == (1030, 500)


def known_workload(a: pdx.Engine, b: pdx.Engine) -> tuple[int, bytearray]:
    """Writes of 1000, 10 and 20 bytes, a read of 500, a read refused."""
    pool = bytearray(1 << 16)
    remote = b.register(pool)
    a.write(b.session_id, b"a" * 1000, remote)
    a.batch_write(b.session_id, [(b"b" * 10, remote + 2000), (b"c" * 20, remote + 3000)])
    got = bytearray(500)
    a.read(b.session_id, got, remote)
    with pytest.raises(pdx.PdxError):
        a.read(b.session_id, got, remote + (1 << 16))
    return remote, pool


def test_metrics_parse_and_equal_a_known_workload():
    # Over TCP (two engines of one process would otherwise take the same-host link).
    with pdx.Engine("127.0.0.1", "tcp", same_host="off") as a, pdx.Engine("127.0.0.1", "tcp") as b:
        known_workload(a, b)
        fa, fb = families(a), families(b)
    w, r = {"direction": "write", "path": "tcp"}, {"direction": "read", "path": "tcp"}
    assert value(fa, "pdx_transferred_bytes", "pdx_transferred_bytes_total", **w) == 1030
    assert value(fa, "pdx_transferred_bytes", "pdx_transferred_bytes_total", **r) == 500
    assert value(fa, "pdx_tasks_completed", "pdx_tasks_completed_total", **w) == 3
    assert value(fa, "pdx_tasks_completed", "pdx_tasks_completed_total", **r) == 1
    assert value(fa, "pdx_tasks_failed", "pdx_tasks_failed_total", kind="remote_rejected") == 1
    assert sum(s.value for s in fa["pdx_tasks_failed"].samples) == 1
    assert value(fa, "pdx_peers_connected", "pdx_peers_connected") == 1
    assert value(fa, "pdx_tasks_queued", "pdx_tasks_queued") == 0
    assert value(fb, "pdx_served_requests", "pdx_served_requests_total", direction="write") == 3
    assert value(fb, "pdx_served_bytes", "pdx_served_bytes_total", direction="write") == 1030
    assert value(fb, "pdx_served_requests", "pdx_served_requests_total", direction="read") == 1
    assert value(fb, "pdx_served_refusals", "pdx_served_refusals_total", reason="range") == 1
    assert value(fb, "pdx_handshakes", "pdx_handshakes_total") >= 1
    # Histograms: every task in both (the failed read too, at its requested size).
    for fam, labels, count, total in [
        ("pdx_task_size_bytes", w, 3, 1030),
        ("pdx_task_size_bytes", r, 2, 1000),
        ("pdx_task_latency_seconds", w, 3, None),
        ("pdx_task_latency_seconds", r, 2, None),
    ]:
        samples = [s for s in fa[fam].samples if all(s.labels.get(k) == v for k, v in labels.items())]
        buckets = [(float(s.labels["le"]), s.value) for s in samples if s.name.endswith("_bucket")]
        assert buckets == sorted(buckets), "le ascending"
        assert all(x[1] <= y[1] for x, y in zip(buckets, buckets[1:])), f"{fam} buckets not monotone"
        assert buckets[-1] == (float("inf"), count)
        assert value(fa, fam, fam + "_count", **labels) == count
        if total is not None:
            assert value(fa, fam, fam + "_sum", **labels) == total
    assert value(fa, "pdx_task_size_bytes", "pdx_task_size_bytes_bucket", le="1024.0", **w) == 3
    assert not any(name.startswith("pdx_peer_") for name in fa), "per-peer series only when asked"
    for f in fa.values():
        assert f.name.startswith("pdx_") and f.documentation, f.name


def test_per_peer_series_and_peer_info():
    with pdx.Engine("127.0.0.1", "tcp", metrics_per_peer="1", same_host="off") as a, pdx.Engine("127.0.0.1", "tcp") as b:
        remote, _pool = known_workload(a, b)
        fa = families(a)
        peer = b.session_id
        assert value(fa, "pdx_peer_transferred_bytes", "pdx_peer_transferred_bytes_total", peer=peer,
                     direction="write") == 1030
        assert value(fa, "pdx_peer_tasks_failed", "pdx_peer_tasks_failed_total", peer=peer) == 1
        info = a.peer_info(peer)
        assert (info["path"], info["tasks_written"], info["bytes_written"], info["tasks_read"]) == ("tcp", 3, 1030, 1)
        assert info["reason"] and info["failures"]["remote_rejected"] == 1 and info["tasks_failed"] == 1
        assert "rejected" in info["last_error"] and info["last_error_unix_s"] <= time.time()
        assert info["tasks_queued"] == 0
        a.write(peer, b"z", remote)  # the refused read closed its lane: open one
        info = a.peer_info(peer)
        assert (info["lanes_open"], info["tasks_written"], info["bytes_written"]) == (1, 4, 1031)
        with pytest.raises(pdx.PdxError) as e:
            a.peer_info("127.0.0.1:1")
        assert e.value.status == pdx.PDX_ERR_INVALID_ARGUMENT
        # The descriptor cache forgets the peer once its lanes are gone and it
        # is unused for a second; its figures stay.
        b.close()
        deadline = time.time() + 20
        while time.time() < deadline and (a.stats()["peers_connected"] or a.peer_info(peer)["lanes_open"]):
            time.sleep(0.2)
        assert a.stats()["peers_connected"] == 0
        assert a.peer_info(peer)["bytes_written"] == 1031


def test_collector_for_prometheus_client():
    prometheus_client = pytest.importorskip("prometheus_client")
    import pdx.metrics

    registry = prometheus_client.CollectorRegistry()
    with pdx.Engine("127.0.0.1", "tcp", same_host="off") as a, pdx.Engine("127.0.0.1", "tcp") as b:
        pdx.metrics.register(a, registry)
        known_workload(a, b)
        got = registry.get_sample_value(
            "pdx_transferred_bytes_total", {"direction": "write", "path": "tcp", "engine": a.session_id})
        assert got == 1030
        text = prometheus_client.generate_latest(registry).decode()
        assert "pdx_task_latency_seconds_bucket" in text
    assert list(registry.collect()) == [], "a closed engine yields nothing"


def test_periodic_metrics_line():
    logger = logging.getLogger("pdx-metrics-test")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger.addHandler(Keep())
    pdx.set_log_handler(logger, level=logging.INFO)
    try:
        with pdx.Engine("127.0.0.1", "tcp", metrics_interval_s="0.2") as a, pdx.Engine("127.0.0.1", "tcp") as b:
            known_workload(a, b)
            session = a.session_id
            deadline = time.time() + 10
            while time.time() < deadline and not any("written 1030 B in 3 tasks" in x for x in lines):
                time.sleep(0.05)
    finally:
        pdx.remove_log_handler()
    ours = [x for x in lines if x.startswith(f"pdx metrics {session}")]
    assert ours and "written 1030 B in 3 tasks" in ours[-1], lines[-5:]


def test_allowlist_refuses_another_loopback_address_before_reading():
    with pdx.Engine("127.0.0.1", "tcp", allowed_peers="127.0.0.1/32") as b, pdx.Engine("127.0.0.1", "tcp") as a:
        pool = bytearray(4096)
        remote = b.register(pool)
        # A client bound to 127.0.0.2 sends a whole Probe frame: closed unanswered.
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.settimeout(10)
        s.connect(("127.0.0.1", b.rpc_port))
        body = b"\x03{}\n"
        try:
            s.sendall(len(body).to_bytes(8, "little") + body)
            answer = s.recv(64)
        except ConnectionResetError:
            answer = b""
        s.close()
        assert answer == b""
        fb = families(b)
        assert value(fb, "pdx_inbound_connections_refused", "pdx_inbound_connections_refused_total",
                     reason="address") == 1
        assert value(fb, "pdx_inbound_connections", "pdx_inbound_connections_total") == 0, "never served"
        assert value(fb, "pdx_handshakes", "pdx_handshakes_total") == 0
        # The listed address is served.
        a.write(b.session_id, b"x" * 100, remote)
        assert bytes(pool[:100]) == b"x" * 100


def test_a_malformed_allowlist_entry_fails_init_naming_it():
    with pytest.raises(pdx.PdxError) as e:
        pdx.Engine("127.0.0.1", "tcp", allowed_peers="127.0.0.1, 10.0.0.0/40")
    assert "10.0.0.0/40" in str(e.value)


def test_per_peer_series_stay_within_the_bound_with_300_peers():
    with pdx.Engine("127.0.0.1", "tcp", metrics_per_peer="1", connect_timeout_ms="2000") as a:
        peers = [f"127.0.{i // 200}.{1 + i % 200}:1" for i in range(300)]  # nothing listens on port 1
        for i, peer in enumerate(peers):
            # Peers differ in how busy they were: the i-th failed i % 7 + 1 tasks.
            for _ in range(i % 7 + 1):
                with pytest.raises(pdx.PdxError):
                    a.write(peer, b"x", 4096)
        fams = families(a)
    seen = {s.labels["peer"] for f in fams.values() if f.name.startswith("pdx_peer_") for s in f.samples}
    assert len(seen) == 100
    failed = {s.labels["peer"]: s.value for s in fams["pdx_peer_tasks_failed"].samples}
    counts = {peer: i % 7 + 1 for i, peer in enumerate(peers)}
    threshold = sorted(counts.values(), reverse=True)[99]
    assert set(failed) == seen and all(failed[p] == counts[p] for p in seen)
    assert min(failed.values()) == threshold, "the busiest peers are the ones shown"
    assert {p for p, n in counts.items() if n > threshold} <= seen
    assert value(fams, "pdx_tasks_failed", "pdx_tasks_failed_total", kind="peer_unreachable") == sum(
        i % 7 + 1 for i in range(300))
