"""The same-host link between processes, through Python (issue 20): this
process's engine and a pdx peer process move bytes both ways over it (each
side as initiator), with every size and 2048 scattered pages; `off` on
either side means TCP with the reason, and so does a target in another pid
namespace or running as another user; a Mooncake peer on the same host is
reached over TCP both ways (its descriptor carries no host identity)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys

import pytest

import pdx
from peer_client import Peer

MiB = 1 << 20
SIZES = [1, 4097, 8 * MiB + 3, 256 * MiB]


def _data(n: int, seed: int) -> bytes:
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest() * (1 << 15)  # 1 MiB
    return (block * (n // len(block) + 1))[:n]


def test_both_ways_every_size_over_the_same_host_link():
    with pdx.Engine("127.0.0.1", "tcp") as a, Peer("pdx", name="same-host-target") as p:
        remote = p.alloc(256 * MiB + 4096)
        session = p.call("session")["session"]
        moved = 0
        for i, n in enumerate(SIZES):
            # Registered, as a serving stack registers its pools: the link
            # copies only memory the initiator registered.
            data, back = bytearray(_data(n, i)), bytearray(n)
            a.batch_register([data, back])
            a.write(session, data, remote.addr + i)
            assert p.sha256(remote, i, n) == hashlib.sha256(data).hexdigest(), n
            a.read(session, back, remote.addr + i)
            assert back == data, n
            a.batch_unregister([data, back])
            moved += n
        info = a.peer_info(session)
        assert info["path"] == "same-host", info
        assert (info["same_host_bytes_written"], info["same_host_bytes_read"]) == (moved, moved)

        # 2048 scattered pages: page i to slot (i * 613) % 2048.
        pages, page = 2048, 4096
        src = _data(pages * page, 99)
        entries = [(src[i * page:(i + 1) * page], remote.addr + (i * 613) % pages * page) for i in range(pages)]
        a.batch_write(session, entries)
        for i in (0, 1, 777, pages - 1):
            slot = (i * 613) % pages * page
            assert p.sha256(remote, slot, page) == hashlib.sha256(src[i * page:(i + 1) * page]).hexdigest()

        # The peer process as initiator, into this process's memory.
        local = bytearray(16 * MiB)
        addr = a.register(local)
        p.fill(remote, 0, 16 * MiB, seed=5)
        assert p.transfer("write", a.session_id, remote, 0, addr, 16 * MiB)["rc"] == 0
        p.fill(remote, 0, 16 * MiB, byte=0)
        assert p.transfer("read", a.session_id, remote, 0, addr, 16 * MiB)["rc"] == 0
        assert p.verify(remote, 0, 16 * MiB, seed=5)["equal"]
        theirs = p.call("peer_info", target=a.session_id)["info"]
        assert theirs["path"] == "same-host", theirs

        # Out of range on the link: refused as over TCP, the link kept.
        with pytest.raises(pdx.PdxError) as refused:
            a.write(session, b"x" * 8192, remote.addr + remote.size - 4096)
        assert refused.value.status == pdx.PDX_ERR_REMOTE_REJECTED
        assert a.peer_info(session)["path"] == "same-host"


@pytest.mark.parametrize("off_on", ["initiator", "target"])
def test_off_on_either_side_means_tcp_with_the_reason(off_on, monkeypatch):
    env = {"PDX_SAME_HOST": "off"} if off_on == "target" else {}
    options = {"same_host": "off"} if off_on == "initiator" else {}
    with pdx.Engine("127.0.0.1", "tcp", **options) as a, Peer("pdx", env, name=f"off-{off_on}") as p:
        remote = p.alloc(MiB)
        session = p.call("session")["session"]
        data = _data(MiB, 1)
        a.write(session, data, remote.addr)
        assert p.sha256(remote, 0, MiB) == hashlib.sha256(data).hexdigest()
        info = a.peer_info(session)
        assert info["path"] == "tcp", info
        assert "PDX_SAME_HOST=off" in info["reason"], info
        assert info["same_host_bytes_written"] == 0


def test_a_mooncake_peer_on_the_same_host_is_reached_over_tcp_both_ways():
    pytest.importorskip("mooncake.engine", reason="the mooncake-transfer-engine-non-cuda wheel is not installed")
    with pdx.Engine("127.0.0.1", "tcp") as a, Peer("mooncake", name="same-host-mooncake") as m:
        remote = m.alloc(4 * MiB)
        session = m.call("session")["session"]
        data = _data(4 * MiB, 3)
        a.write(session, data, remote.addr)
        assert m.sha256(remote, 0, 4 * MiB) == hashlib.sha256(data).hexdigest()
        info = a.peer_info(session)
        assert info["path"] == "tcp" and "Mooncake" in info["reason"], info
        # Mooncake as initiator into this engine.
        local = bytearray(4 * MiB)
        addr = a.register(local)
        assert m.transfer("write", a.session_id, remote, 0, addr, 4 * MiB)["rc"] == 0
        assert bytes(local) == data
        assert os.environ.get("PDX_SAME_HOST", "auto") != "off"


# A target the link cannot reach: its transfers succeed over TCP, and the
# reason names the cause. The other user needs an interpreter it may run
# (this one may live under /root) and root to switch to it.
UNREACHABLE = [
    ("pid namespace", ["unshare", "--pid", "--fork", "--kill-child"], sys.executable),
    ("uid 65534", ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"], "/usr/bin/python3"),
]


@pytest.mark.parametrize("cause,wrapper,python", UNREACHABLE, ids=["pid-namespace", "other-user"])
def test_a_target_the_link_cannot_reach_falls_back_to_tcp_with_the_cause(cause, wrapper, python):
    if os.geteuid() != 0 or shutil.which(wrapper[0]) is None or not os.access(python, os.X_OK):
        pytest.skip(f"needs root, {wrapper[0]} and {python}")
    with pdx.Engine("127.0.0.1", "tcp") as a, Peer("pdx", name=f"unreachable-{wrapper[0]}", wrapper=wrapper,
                                                    python=python) as p:
        remote = p.alloc(4 * MiB)
        session = p.call("session")["session"]
        data = _data(4 * MiB, 7)
        a.write(session, data, remote.addr)
        back = bytearray(4 * MiB)
        a.read(session, back, remote.addr)
        assert back == data
        info = a.peer_info(session)
        assert info["path"] == "tcp" and cause in info["reason"], info
