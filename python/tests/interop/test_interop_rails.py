"""pdx with PDX_TCP_RAILS=auto <-> the real Mooncake Transfer Engine (PyPI wheel).

A pdx engine with rails advertises `pdx_rails` in its descriptor, which a
Mooncake initiator must ignore; a pdx initiator with rails finds no
`pdx_rails` in Mooncake's descriptor and uses its one address, as without
rails. Both directions, a few sizes and a batch of large entries, checked
byte for byte (the full matrix is test_interop_pdx.py, without rails).
"""

import pytest

pytest.importorskip("mooncake.engine", reason="the mooncake-transfer-engine-non-cuda wheel is not installed")

import scenarios as sc  # noqa: E402
from peer_client import Peer  # noqa: E402
from test_interop_pdx import DIRECTION_IDS, DIRECTIONS, _pick, _REASON  # noqa: E402

pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

KiB, MiB = sc.KiB, sc.MiB
MAX = 64 * MiB


@pytest.fixture(scope="module")
def sides():
    """A pdx engine with rails (the same-host link off, so rails would apply
    to a pdx peer) and a Mooncake engine, each in its own process."""
    with Peer("pdx", {"PDX_TCP_RAILS": "auto", "PDX_SAME_HOST": "off"}, name="pdx-rails") as p, \
            Peer("mooncake", {}, name="mc-rails") as m:
        yield {"pdx": sc.prepare(p, MAX), "mooncake": sc.prepare(m, MAX)}


@pytest.mark.parametrize("size", [1, 64 * KiB + 1, 16 * MiB + 5])
@pytest.mark.parametrize("op", ["write", "read"])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=DIRECTION_IDS)
def test_single_with_rails(sides, direction, op, size):
    init, target = _pick(sides, direction)
    sc.single(init, target, op, size, seed=2000 + size % 997)


@pytest.mark.parametrize("op", ["write", "read"])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=DIRECTION_IDS)
def test_batch_large_entries_with_rails(sides, direction, op):
    init, target = _pick(sides, direction)
    sc.batch(init, target, op, [32 * MiB + 1, 1, 16 * MiB, 64 * KiB + 1, 7], seed=24)


@pytest.mark.parametrize("direction", DIRECTIONS, ids=DIRECTION_IDS)
def test_probe_with_rails(sides, direction):
    init, target = _pick(sides, direction)
    sc.probe(init, target)


def test_a_pdx_initiator_with_rails_uses_mooncake_s_one_address(sides):
    p, m = sides["pdx"], sides["mooncake"]
    sc.single(p, m, "write", 1 * MiB + 3, seed=2100)
    r = p.peer.call("peer_info", target=m.peer.session)
    assert r["rc"] == 0, r
    info = r["info"]
    assert "rails" not in info and info["path"] == "tcp", info
