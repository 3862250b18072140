"""Logging into Python's `logging` and engine statistics, through the C ABI."""

import logging
import threading

import pytest

import pdx


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured():
    logger = logging.getLogger("pdx-test")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    cap = Capture()
    logger.addHandler(cap)
    yield logger, cap
    pdx.remove_log_handler()
    logger.removeHandler(cap)


def refused_write(a: pdx.Engine, b: pdx.Engine) -> None:
    pool = bytearray(4096)
    remote = b.register(pool)
    with pytest.raises(pdx.PdxError) as e:
        a.write(b.session_id, b"x" * 64, remote + 8192)
    assert e.value.status == pdx.PDX_ERR_REMOTE_REJECTED


def test_records_reach_logging_with_module_names_and_threads(captured):
    logger, cap = captured
    pdx.set_log_handler(logger, level=pdx.PDX_LOG_DEBUG)
    with pdx.Engine("127.0.0.1", "tcp") as a, pdx.Engine("127.0.0.1", "tcp") as b:
        refused_write(a, b)
    names = {r.name for r in cap.records}
    assert "pdx-test.engine.batch" in names, names
    warning = [r for r in cap.records if r.name == "pdx-test.engine.batch"][0]
    assert warning.levelno == logging.WARNING and "rejected WRITE of 64 bytes" in warning.getMessage()
    # The target refuses on its own data-connection thread, not on ours.
    served = [r for r in cap.records if r.name == "pdx-test.engine.server.data"]
    assert served and all(r.thread != threading.get_ident() for r in served)


def test_level_filter_and_removal(captured):
    logger, cap = captured
    pdx.set_log_handler(logger, level=logging.WARNING)
    with pdx.Engine("127.0.0.1", "tcp") as a, pdx.Engine("127.0.0.1", "tcp") as b:
        refused_write(a, b)
        assert cap.records and all(r.levelno >= logging.WARNING for r in cap.records)
        pdx.remove_log_handler()
        seen = len(cap.records)
        refused_write(a, b)
    assert len(cap.records) == seen, "records after removal"


def test_stats_count_a_known_workload():
    with pdx.Engine("127.0.0.1", "tcp") as a, pdx.Engine("127.0.0.1", "tcp") as b:
        assert a.stats()["tasks_written"] == 0
        pool = bytearray(1 << 16)
        remote = b.register(pool)
        a.write(b.session_id, b"a" * 1000, remote)
        a.batch_write(b.session_id, [(b"b" * 10, remote + 2000), (b"c" * 20, remote + 3000)])
        got = bytearray(500)
        a.read(b.session_id, got, remote)
        with pytest.raises(pdx.PdxError):
            a.read(b.session_id, got, remote + (1 << 16))
        sa, sb = a.stats(), b.stats()
    assert (sa["tasks_written"], sa["bytes_written"], sa["tasks_read"], sa["bytes_read"]) == (3, 1030, 1, 500)
    assert (sa["tasks_failed"], sa["failed_remote_rejected"], sa["peers_connected"]) == (1, 1, 1)
    assert 0 < sa["latency_p50_us"] <= sa["latency_p99_us"]
    assert (sb["served_writes"], sb["served_bytes_written"], sb["served_reads"], sb["requests_refused"]) == (
        3, 1030, 1, 1)
    assert set(sa) == set(pdx.STATS_FIELDS)


def test_stats_struct_matches_the_header():
    import re
    from pathlib import Path

    header = (Path(__file__).resolve().parents[2] / "include" / "pdx.h").read_text()
    body = header[: header.index("} pdx_stats;")].rsplit("typedef struct {", 1)[1]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = re.findall(r"\b(\w+);", body)
    assert fields == ["size", *pdx.STATS_FIELDS]
    assert ctypes_sizeof_stats() == 8 + 8 * len(pdx.STATS_FIELDS)


def ctypes_sizeof_stats() -> int:
    import ctypes

    return ctypes.sizeof(pdx.Stats)


def test_capabilities_list_backends_and_memory():
    caps = pdx.capabilities()
    assert caps["version"] == pdx.version().split("/")[1]
    by_name = {b["name"]: b for b in caps["backends"]}
    assert by_name["tcp"]["available"] is True
    assert by_name["mooncake"]["available"] == pdx.backend_available("mooncake")
    # The reason is the one pdx_backend_unavailable_reason gives (null when
    # available), and a library is named exactly when it loaded.
    mooncake = by_name["mooncake"]
    assert mooncake["reason"] == (pdx.backend_unavailable_reason("mooncake") or None)
    assert isinstance(mooncake["library"], str) == mooncake["available"]
    assert {m["kind"] for m in caps["memory"]} >= {"cpu"}
