"""pdx.mooncake beyond the shared scenario (python/tests/dropin): what only pdx
can be asked (the calls it cannot honour, stale ids that would crash the
wheel, protocols that need Mooncake's library, logging of failures)."""

from __future__ import annotations

import ctypes
import logging
import time

import pytest

import pdx
import pdx.mooncake as mc


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> mc.TransferEngine:
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    e = mc.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return e


@pytest.mark.parametrize(
    "name,args",
    [
        ("get_engine", ()),
        ("get_engine_ptr", ()),
        ("get_local_topology", ()),
    ],
)
def test_calls_pdx_cannot_honour_raise(engine: mc.TransferEngine, name: str, args: tuple[object, ...]) -> None:
    with pytest.raises(NotImplementedError) as err:
        getattr(engine, name)(*args)
    assert name in str(err.value) and "pdx" in str(err.value)


def test_get_engine_says_why(engine: mc.TransferEngine) -> None:
    with pytest.raises(NotImplementedError, match="no C\\+\\+ mooncake::TransferEngine object"):
        engine.get_engine()


def test_stale_and_made_up_batch_ids_fail_cleanly(engine: mc.TransferEngine) -> None:
    peer = mc.TransferEngine()
    assert peer.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src, dst = ctypes.create_string_buffer(b"abc", 16), ctypes.create_string_buffer(16)
    assert peer.register_memory(ctypes.addressof(dst), 16) == 0
    session = f"127.0.0.1:{peer.get_rpc_port()}"
    batch = engine.batch_transfer_async_write(session, [ctypes.addressof(src)], [ctypes.addressof(dst)], [3])
    assert batch != 0
    assert engine.get_batch_transfer_status([batch]) == 0 and dst.value == b"abc"
    assert engine.get_batch_transfer_status([batch]) == -1  # freed: the wheel would dereference it
    assert engine.transfer_check_status(batch) == -1
    assert engine.get_batch_transfer_status([12345]) == -1
    submitted = engine.transfer_submit_write(session, ctypes.addressof(src), ctypes.addressof(dst) + 8, 3)
    while (state := engine.transfer_check_status(submitted)) == 0:
        pass
    assert state == 1 and dst.raw[8:11] == b"abc"
    assert engine.transfer_check_status(submitted) == -1


def test_cancel_transfer_leaves_the_buffer_untouched(engine: mc.TransferEngine, monkeypatch) -> None:
    """pdx's extension (a module function: the class keeps the wheel's attributes): a read
    cancelled in flight writes nothing into its buffer once cancel_transfer returned 0; the
    id is freed; unknown ids give -1."""
    monkeypatch.setenv("PDX_SAME_HOST", "off")
    peer = mc.TransferEngine()
    assert peer.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    n = 64 << 20
    remote = (ctypes.c_char * n).from_buffer(bytearray(bytes(range(128)) * (n // 128)))
    local = (ctypes.c_char * n)()
    assert peer.register_memory(ctypes.addressof(remote), n) == 0
    assert engine.register_memory(ctypes.addressof(local), n) == 0
    session = f"127.0.0.1:{peer.get_rpc_port()}"
    batch = engine.batch_transfer_async_read(session, [ctypes.addressof(local)], [ctypes.addressof(remote)], [n])
    assert batch != 0
    assert mc.cancel_transfer(engine, batch) == 0
    ctypes.memset(local, 0xA5, n)
    time.sleep(1.0)
    assert bytes(local).count(0xA5) == n, "late bytes in a cancelled read's buffer"
    assert mc.cancel_transfer(engine, batch) == -1  # freed
    assert engine.get_batch_transfer_status([batch]) == -1
    assert mc.cancel_transfer(engine, 12345) == -1
    batch = engine.batch_transfer_async_read(session, [ctypes.addressof(local)], [ctypes.addressof(remote)], [n])
    assert engine.get_batch_transfer_status([batch]) == 0 and bytes(local) == bytes(remote)


def test_protocols_other_than_tcp_need_mooncakes_library(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    monkeypatch.setenv("PDX_MOONCAKE_LIB", "/nonexistent/libtransfer_engine.so")
    with caplog.at_level(logging.ERROR, logger="pdx.mooncake"):
        assert mc.TransferEngine().initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == -1
    assert "PDX_ERR_BACKEND_UNAVAILABLE" in caplog.text and "rdma" in caplog.text
    # MC_FORCE_TCP (any value) forces tcp, through pdx's resolver.
    monkeypatch.setenv("MC_FORCE_TCP", "0")
    forced = mc.TransferEngine()
    assert forced.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    assert forced._engine is not None and forced._engine.protocol == "tcp"


def test_unserved_metadata_servers_are_refused_with_a_reason(caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="pdx.mooncake"):
        assert mc.TransferEngine().initialize("127.0.0.1", "redis://10.0.0.1:6379", "tcp", "") == -1
        assert mc.TransferEngine().initialize_ext("127.0.0.1", "10.0.0.1:6379", "tcp", "", "redis") == -1
    assert caplog.text.count("redis metadata is not supported") == 2
    assert "redis://10.0.0.1:6379" in caplog.text


def test_get_first_buffer_address_of_own_and_unknown_segments(engine: mc.TransferEngine) -> None:
    own = engine._engine.session_id  # type: ignore[union-attr]
    assert engine.get_first_buffer_address(own) == 0
    buf = engine.allocate_managed_buffer(4096)
    assert engine.get_first_buffer_address(own) == buf
    # P2P: a name nothing answers at is unknown.
    assert engine.get_first_buffer_address("127.0.0.1:1") == 0


def test_failures_are_logged(engine: mc.TransferEngine, caplog) -> None:
    buf = ctypes.create_string_buffer(64)
    with caplog.at_level(logging.ERROR, logger="pdx.mooncake"):
        assert engine.transfer_sync_write("127.0.0.1:1", ctypes.addressof(buf), 0x1000, 8) == -1
        assert engine.unregister_memory(ctypes.addressof(buf)) == -3
    assert "transfer_sync_write to 127.0.0.1:1" in caplog.text and "unregister_memory" in caplog.text


def test_uninitialized_engine_raises_instead_of_crashing() -> None:
    e = mc.TransferEngine()
    with pytest.raises(RuntimeError, match="initialize"):
        e.register_memory(4096, 16)
    with pytest.raises(RuntimeError, match="initialize"):
        e.get_rpc_port()
    assert e.send_probe("127.0.0.1:1") == -1


def test_module_names(engine: mc.TransferEngine) -> None:
    assert mc.Read is mc.TransferOpcode.Read and mc.Write == 1 and str(mc.Write) == "TransferOpcode.Write"
    assert mc.TransferEngine.TransferOpcode is mc.TransferOpcode
    assert not mc.SUPPORT_CUDA
    with pytest.raises(AttributeError, match="pdx serves the TransferEngine API only"):
        mc.RpcInterface  # noqa: B018
    assert mc.TransferNotify("a", "b") == mc.TransferNotify(name="a", msg="b")


def test_reinitialize_replaces_the_engine(engine: mc.TransferEngine) -> None:
    first = engine.get_rpc_port()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert engine.get_rpc_port() != first
    assert engine.send_probe(f"127.0.0.1:{first}") == mc.ERR_SOCKET  # the old one is closed


def test_managed_buffers(engine: mc.TransferEngine) -> None:
    addr = engine.allocate_managed_buffer(1 << 20)
    assert addr != 0
    assert engine.register_memory(addr, 16) == mc.ERR_ADDRESS_OVERLAPPED  # it is registered
    assert engine.write_bytes_to_buffer(addr, b"xyz", 3) == 0 and engine.read_bytes_from_buffer(addr, 3) == b"xyz"
    assert engine.free_managed_buffer(addr, 1 << 20) == 0
    assert engine.free_managed_buffer(addr, 1 << 20) == -1
    assert engine.allocate_managed_buffer(0) == 0


def test_pdx_status_names_are_used(engine: mc.TransferEngine, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="pdx.mooncake"):
        engine.register_memory(4096, 0)
        mem = ctypes.create_string_buffer(32)
        assert engine.register_memory(ctypes.addressof(mem), 32) == 0
        assert engine.register_memory(ctypes.addressof(mem), 32) == -7
    assert "PDX_ERR_ADDRESS_OVERLAP" in caplog.text
    assert pdx.PDX_ERR_ADDRESS_OVERLAP == -17


def test_notifications_are_bytes(engine: mc.TransferEngine) -> None:
    """TransferNotify takes str or bytes, as the wheel's does; text reads back as
    str, and bytes that are not UTF-8 (where the wheel's getter raises
    UnicodeDecodeError) as bytes. Between pdx engines they arrive intact."""
    push = b"PUSH_REG:" + bytes([0x82, 0xA4]) + b"name" + bytes([0xA1, 0x41, 0x8B, 0x00, 0xFF])
    n = mc.TransferNotify(b"PUSH_REG", push)
    assert (n.name, n.msg, n.name_bytes, n.msg_bytes) == ("PUSH_REG", push, b"PUSH_REG", push)
    assert mc.TransferNotify("caf\u00e9", "m").name_bytes == "caf\u00e9".encode()
    n.msg = "text"
    assert n.msg == "text" and n == mc.TransferNotify(b"PUSH_REG", b"text")
    with pytest.raises(TypeError):
        n.name = 5  # type: ignore[assignment]
    with pytest.raises(TypeError):
        mc.TransferNotify(1, "m")  # type: ignore[arg-type]

    peer = mc.TransferEngine()
    assert peer.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src, dst = ctypes.create_string_buffer(b"abc", 16), ctypes.create_string_buffer(16)
    assert peer.register_memory(ctypes.addressof(dst), 16) == 0
    assert engine.register_memory(ctypes.addressof(src), 16) == 0
    session = f"127.0.0.1:{peer.get_rpc_port()}"
    every = bytes(range(256))
    for note in (mc.TransferNotify(b"PUSH_REG", push), mc.TransferNotify(every, every), mc.TransferNotify("n", "m")):
        assert engine.transfer_sync(session, ctypes.addressof(src), ctypes.addressof(dst), 3, mc.Write, note) == 0
    got = peer.get_notifies()
    assert [(g.name_bytes, g.msg_bytes) for g in got] == [(b"PUSH_REG", push), (every, every), (b"n", b"m")]
    assert [(g.name, g.msg) for g in got][2] == ("n", "m")
    assert got[0].msg == push and isinstance(got[0].msg, bytes)
    # Over the peer's frame limit (MC_HANDSHAKE_MAX_LENGTH): refused, nothing sent.
    big = mc.TransferNotify("kv", bytes(8 << 20))
    assert engine.transfer_sync(session, ctypes.addressof(src), ctypes.addressof(dst), 3, mc.Write, big) == -1
    assert peer.get_notifies() == []
