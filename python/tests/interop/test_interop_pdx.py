"""pdx <-> real Mooncake Transfer Engine (PyPI wheel) over TCP, in separate processes.

Each engine runs in its own peer process (pdx_peer.py, mooncake_peer.py) driven
through peer_client.Peer; the same scenarios run in both directions:
pdx initiates against a Mooncake target, and Mooncake initiates against a pdx
target. Protocol v2 is the default; the "v1" runs start both processes with
MC_TCP_PROTO=1, which makes both the wheel and pdx initiate with v1 framing.

These tests skip, with the reason shown, until libpdx.so exports the engine
C ABI (`pdx_engine_init` ...), and when the Mooncake wheel is not installed.
"""

import pytest

pytest.importorskip("mooncake.engine", reason="the mooncake-transfer-engine-non-cuda wheel is not installed")

import mooncake_writer  # noqa: E402
import scenarios as sc  # noqa: E402
from peer_client import Peer  # noqa: E402


def _skip_reason():
    try:
        import pdx_engine_api
    except Exception as exc:  # libpdx.so missing or unloadable
        return f"pdx library not loadable: {type(exc).__name__}: {exc}"
    if not pdx_engine_api.has_engine_api():
        return "libpdx.so does not export pdx_engine_init yet (the engine C ABI has not landed)"
    missing = pdx_engine_api.missing_functions()
    if missing:
        return f"libpdx.so lacks engine functions: {', '.join(missing)}"
    return None


_REASON = _skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

KiB, MiB = sc.KiB, sc.MiB
MAX = 256 * MiB
PROTOS = ["v2", "v1"]
DIRECTIONS = [("pdx", "mooncake"), ("mooncake", "pdx")]
DIRECTION_IDS = ["pdx_to_mc", "mc_to_pdx"]
SIZES = [1, 2, 4095, 64 * KiB, 64 * KiB + 1, 1 * MiB + 3, 16 * MiB + 5, 256 * MiB]
NOTE = 'req 7: "ok" \\ ü €'  # quotes, a backslash and non-ASCII must survive both JSON codecs


def _env(proto):
    return {"MC_TCP_PROTO": "1"} if proto == "v1" else {}


@pytest.fixture(scope="module", params=PROTOS)
def sides(request):
    """A pdx engine and a Mooncake engine, each in its own process, with 256 MiB buffers."""
    env = _env(request.param)
    with Peer("pdx", env, name=f"pdx-{request.param}") as p, \
            Peer("mooncake", env, name=f"mc-{request.param}") as m:
        yield {"pdx": sc.prepare(p, MAX), "mooncake": sc.prepare(m, MAX)}


@pytest.fixture(params=PROTOS)
def fresh(request):
    """Fresh engines for the refusal tests: they leave connections closed by the target behind."""
    env = _env(request.param)
    with Peer("pdx", env, name=f"pdx-{request.param}") as p, \
            Peer("mooncake", env, name=f"mc-{request.param}") as m:
        yield {"pdx": sc.prepare(p, 1 * MiB), "mooncake": sc.prepare(m, 1 * MiB)}


def _pick(sides, direction):
    init, target = direction
    return sides[init], sides[target]


def test_pdx_identity(sides):
    p = sides["pdx"].peer
    assert p.info["kind"] == "pdx"
    assert p.info["protocol"] == "tcp"
    assert p.session == f"127.0.0.1:{p.rpc_port}"
    assert 0 < p.rpc_port < 65536


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", ["write", "read"])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=DIRECTION_IDS)
def test_single(sides, direction, op, size):
    init, target = _pick(sides, direction)
    sc.single(init, target, op, size, seed=1000 + size % 997)


@pytest.mark.parametrize("op", ["write", "read"])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=DIRECTION_IDS)
def test_batch_1100_entries(sides, direction, op):
    init, target = _pick(sides, direction)
    sizes = sc.random_sizes(21, 1100, small_max=8 * KiB, big=[1 * MiB + 1, 3 * MiB + 5])
    sc.batch(init, target, op, sizes, seed=22)


@pytest.mark.parametrize("op", ["write", "read"])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=DIRECTION_IDS)
def test_batch_large_entries(sides, direction, op):
    """Few large entries: the initiator may spread them over several connections at once."""
    init, target = _pick(sides, direction)
    sizes = [32 * MiB + 1, 1, 16 * MiB, 64 * KiB + 1, 48 * MiB - 3, 7]
    sc.batch(init, target, op, sizes, seed=23)


@pytest.mark.parametrize("direction", DIRECTIONS, ids=DIRECTION_IDS)
def test_many_small_transfers(sides, direction):
    """Back-to-back small requests on reused connections, alternating writes and reads."""
    init, target = _pick(sides, direction)
    for i in range(40):
        sc.single(init, target, "write" if i % 2 == 0 else "read", 1 + 97 * i, seed=300 + i)


@pytest.mark.parametrize("direction", DIRECTIONS, ids=DIRECTION_IDS)
def test_probe(sides, direction):
    init, target = _pick(sides, direction)
    sc.probe(init, target)


def test_pdx_probe_unreachable(sides):
    sc.probe_unreachable(sides["pdx"])


def test_notify_mooncake_to_pdx(sides):
    """Mooncake sends notifies with a transfer; pdx's descriptor must name its RPC endpoint."""
    m, p = sides["mooncake"], sides["pdx"]
    p.peer.notifies()  # start empty
    sc.single(m, p, "write", 4096, seed=41, notify=("kv-done", NOTE))
    sc.batch(m, p, "read", sc.random_sizes(42, 30), seed=43, notify=("batch-done", "req 8"))
    sc.expect_notifies(p, [("kv-done", NOTE), ("batch-done", "req 8")])
    assert m.peer.notifies() == []


def test_notify_pdx_to_mooncake(sides):
    """pdx sends a notify alone and with asynchronous transfers (pdx_batch_submit)."""
    p, m = sides["pdx"], sides["mooncake"]
    m.peer.notifies()
    r = p.peer.notify(m.peer, "alone", NOTE)
    assert r["rc"] == 0, f"pdx_send_notify: {r}"
    sc.single(p, m, "write", 4096, seed=44, notify=("kv-done", "req 9"))
    sc.batch(p, m, "read", sc.random_sizes(45, 30), seed=46, notify=("batch-done", "req 10"))
    sc.expect_notifies(m, [("alone", NOTE), ("kv-done", "req 9"), ("batch-done", "req 10")])
    assert p.peer.notifies() == []


# Names and messages as bytes: every byte value, msgpack as vLLM's push
# connector sends it, NUL, valid UTF-8 up to U+10FFFF, lone lead bytes.
PUSH_REG = b"PUSH_REG:" + bytes([0x82, 0xA4]) + b"name" + bytes([0xA1, 0x41, 0xA4]) + b"mems" + bytes(
    [0x92, 0xCD, 0x10, 0x8B, 0xCE, 0xFF, 0xFF, 0xFF, 0xFF, 0x00, 0x01]
)
BYTE_CASES = [
    (b"every", bytes(range(256))),
    (b"\xff\x00name", PUSH_REG),
    (b"each-then-A", b"".join(bytes([b]) + b"A" for b in range(0x80, 0x100))),
    (b"utf8", "\u00e9\u20ac\U0001F600\U0003FFFF\U00040000\U0010FFFF".encode()),
    (b"tails", b"x\xc3"),
    (b"tails", b"x\xe2\x82"),
    (b"tails", b"x\xf4\x8f\xbf"),
]


def test_notify_bytes_pdx_to_mooncake(sides):
    """pdx sends names and messages as bytes; the Mooncake peer's queue holds
    every byte as it was sent (NUL included), alone and with a transfer."""
    p, m = sides["pdx"], sides["mooncake"]
    m.peer.notifies_bytes()
    for name, msg in BYTE_CASES:
        r = p.peer.notify(m.peer, name, msg)
        assert r["rc"] == 0, f"pdx_send_notify_bytes: {r}"
    sc.single(p, m, "write", 4096, seed=47, notify=(b"kv\x8b", PUSH_REG))
    got = m.peer.wait_notifies_bytes(len(BYTE_CASES) + 1)
    assert sorted(got) == sorted(BYTE_CASES + [(b"kv\x8b", PUSH_REG)])


def test_notify_bytes_mooncake_to_pdx(sides):
    """The Mooncake wheel re-encodes bytes that are not UTF-8 (and code points
    from U+40000) as it writes its JSON: pdx receives exactly what that
    writing leaves (mooncake_writer.received), a NUL and valid UTF-8 below
    U+40000 intact."""
    m, p = sides["mooncake"], sides["pdx"]
    p.peer.notifies_bytes()
    for i, (name, msg) in enumerate(BYTE_CASES):
        sc.single(m, p, "write", 64, seed=48 + i, notify=(name, msg))
    got = p.peer.wait_notifies_bytes(len(BYTE_CASES))
    expected = [(mooncake_writer.received(n), mooncake_writer.received(x)) for n, x in BYTE_CASES]
    assert sorted(got) == sorted(expected)
    assert (b"x\xef\xbf\xbd" in [x for _, x in got]) and (b"every" in [n for n, _ in got])
    push = dict(zip([n for n, _ in BYTE_CASES], expected))[b"\xff\x00name"][1]
    assert push.startswith(b"PUSH_REG:\xc2\xa4name") and push != PUSH_REG  # 0x82 0xa4 became U+00A4


@pytest.mark.parametrize("op", ["write", "read"])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=DIRECTION_IDS)
def test_refused(fresh, direction, op):
    init, target = _pick(fresh, direction)
    sc.refused(init, target, op)


@pytest.mark.parametrize("direction", DIRECTIONS, ids=DIRECTION_IDS)
def test_refused_after_unregister(fresh, direction):
    init, target = _pick(fresh, direction)
    sc.refused_after_unregister(init, target)
