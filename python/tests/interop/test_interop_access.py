"""Who may connect (issue 23), against the real Mooncake Transfer Engine wheel:
an address allowlist that lists the Mooncake peer changes nothing, while a
pdx engine with a peer secret refuses the Mooncake peer both ways (Mooncake
cannot authenticate), leaves its memory untouched, and says so in its log.
With neither set, test_interop_pdx.py is the check that nothing changed."""

import os
import time

import pytest

pytest.importorskip("mooncake.engine", reason="the mooncake-transfer-engine-non-cuda wheel is not installed")

import scenarios as sc  # noqa: E402
from peer_client import Peer  # noqa: E402
from test_interop_pdx import _REASON  # noqa: E402

pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

MiB = sc.MiB


@pytest.mark.parametrize("direction", [("pdx", "mooncake"), ("mooncake", "pdx")], ids=["pdx_to_mc", "mc_to_pdx"])
def test_an_allowlist_naming_the_peer_changes_nothing(direction):
    env = {"PDX_ALLOWED_PEERS": "127.0.0.1/32, ::1"}
    with Peer("pdx", env, name="pdx-allow") as p, Peer("mooncake", name="mc-allow") as m:
        sides = {"pdx": sc.prepare(p, 1 * MiB), "mooncake": sc.prepare(m, 1 * MiB)}
        init, target = sides[direction[0]], sides[direction[1]]
        for op in ("write", "read"):
            sc.single(init, target, op, 64 * 1024 + 1, seed=7)
        sc.probe(init, target)


def test_a_peer_secret_refuses_the_mooncake_peer(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(48))
    secret.chmod(0o600)
    with Peer("pdx", {"PDX_PEER_SECRET_FILE": str(secret)}, name="pdx-secret") as p, \
            Peer("mooncake", name="mc-secret") as m:
        pdx_side, mc_side = sc.prepare(p, 1 * MiB), sc.prepare(m, 1 * MiB)
        size = 4096
        pdx_side.peer.fill(pdx_side.big, sc.DST_OFF, size, byte=0x11)
        mc_side.peer.fill(mc_side.big, sc.SRC_OFF, size, byte=0x22)
        mc_side.peer.fill(mc_side.big, sc.DST_OFF, size, byte=0x33)
        # Mooncake -> pdx: refused at the handshake; pdx's memory is unchanged.
        r = m.transfer("write", p, mc_side.big, sc.SRC_OFF, pdx_side.big.addr + sc.DST_OFF, size, timeout=60)
        assert r["rc"] != 0, f"a Mooncake write into a pdx engine with a secret succeeded: {r}"
        assert p.verify(pdx_side.big, sc.DST_OFF, size, byte=0x11)["equal"]
        r = m.transfer("read", p, mc_side.big, sc.DST_OFF, pdx_side.big.addr + sc.DST_OFF, size, timeout=60)
        assert r["rc"] != 0, f"a Mooncake read from a pdx engine with a secret succeeded: {r}"
        assert m.verify(mc_side.big, sc.DST_OFF, size, byte=0x33)["equal"]
        # pdx -> Mooncake: pdx does not talk to a peer that cannot authenticate.
        r = p.transfer("write", m, pdx_side.big, sc.DST_OFF, mc_side.big.addr + sc.DST_OFF, size, timeout=60)
        assert r["rc"] != 0 and "authentication" in r.get("error", ""), r
        assert m.verify(mc_side.big, sc.DST_OFF, size, byte=0x33)["equal"]
        deadline = time.monotonic() + 10
        while "did not authenticate" not in p.log_path.read_text(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.1)
        log = p.log_path.read_text(errors="replace")
        assert "a Mooncake peer cannot" in log, log[-2000:]
