"""pdx.kv: page plans against a reference planner written from SGLang's rule
(random page maps, every byte verified at the target), heterogeneous-TP head
slices verified head by head, index arrays of every accepted kind, bad
inputs, and a layer-wise submit whose notification follows all its layers."""

import ctypes
import random
import time
from array import array

import pytest

import pdx
from pdx.kv import Heads, KvBuffer, Plan, group_concurrent_contiguous_count

WAIT_MS = 30000


def reference_runs(src, dst):
    """SGLang's group_concurrent_contiguous: break where either step is not 1."""
    runs, start = [], 0
    for i in range(1, len(src) + 1):
        if i == len(src) or src[i] - src[i - 1] != 1 or dst[i] - dst[i - 1] != 1:
            if i > start:
                runs.append((src[start], dst[start], i - start))
            start = i
    return runs


class Pair:
    def __init__(self):
        self.a = pdx.Engine("127.0.0.1", "tcp")
        self.b = pdx.Engine("127.0.0.1", "tcp")
        self.session = self.b.session_id


@pytest.fixture(scope="module")
def pair():
    p = Pair()
    yield p
    p.a.close()
    p.b.close()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("MC_FORCE_TCP", "MOONCAKE_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)


def layout(engine, page_bytes, pages, fill_seed=None):
    """One registered pool holding a buffer per entry of `page_bytes`."""
    total = sum(pb * pages for pb in page_bytes)
    pool = bytearray(random.Random(fill_seed).randbytes(total)) if fill_seed is not None else bytearray(total)
    base = engine.register(pool)
    bufs, at = [], 0
    for pb in page_bytes:
        bufs.append(KvBuffer(base + at, pb, pages))
        at += pb * pages
    return pool, base, bufs


def random_map(rng, n, pool, contiguous):
    if contiguous:
        s0, d0 = rng.randrange(pool - n + 1), rng.randrange(pool - n + 1)
        src, dst = list(range(s0, s0 + n)), list(range(d0, d0 + n))
        for _ in range(rng.randrange(4) if n > 1 else 0):
            i, j = rng.randrange(n), rng.randrange(n)
            src[i], src[j] = src[j], src[i]
        return src, dst
    return rng.sample(range(pool), n), rng.sample(range(pool), n)


@pytest.mark.parametrize("contiguous", [False, True])
def test_random_maps_match_the_reference_byte_for_byte(pair, contiguous):
    rng = random.Random(21 + contiguous)
    for round_ in range(25):
        pool_pages, nb = rng.randrange(1, 80), rng.randrange(1, 5)
        n = rng.randrange(pool_pages + 1)
        pbs = [16 * rng.randrange(1, 6) for _ in range(nb)]
        lpool, lbase, local = layout(pair.a, pbs, pool_pages, fill_seed=round_)
        rpool, rbase, remote = layout(pair.b, pbs, pool_pages, fill_seed=1000 + round_)
        src, dst = random_map(rng, n, pool_pages, contiguous)
        want = bytearray(rpool)
        runs = reference_runs(src, dst)
        for lb, rb in zip(local, remote):
            for s, d, k in runs:
                lo, ro = lb.base - lbase + s * lb.page_bytes, rb.base - rbase + d * rb.page_bytes
                want[ro:ro + k * lb.page_bytes] = lpool[lo:lo + k * lb.page_bytes]
        with Plan(local, remote, array("i", src), array("i", dst)) as plan:
            assert plan.requests() == nb * len(runs)
            assert group_concurrent_contiguous_count(src, dst) == len(runs)
            if n:
                if round_ % 2:
                    plan.transfer(pair.a, pair.session)
                else:
                    ids = [plan.submit(pair.a, pair.session, b, b + 1) for b in range(nb)]
                    for i in ids:
                        assert pair.a.wait(i, WAIT_MS) == pdx.PDX_TASK_COMPLETED
                        pair.a.free(i)
        assert rpool == want
        pair.a.unregister(lpool)
        pair.b.unregister(rpool)


@pytest.mark.parametrize("lh,rh,lf,rf,count", [(8, 2, 2, 0, 2), (8, 2, 6, 0, 2), (2, 8, 0, 4, 2), (4, 4, 0, 0, 4)])
@pytest.mark.parametrize("tpp", [1, 16])
def test_head_slices_head_by_head(pair, lh, rh, lf, rf, count, tpp):
    hb, pages = 4, 12
    heads = Heads(tpp, lh, rh, lf, rf, count, hb)
    lpool, lbase, local = layout(pair.a, [tpp * lh * hb] * 2, pages, fill_seed=lh * 10 + rh)
    rpool, rbase, remote = layout(pair.b, [tpp * rh * hb] * 2, pages, fill_seed=7)
    before = bytes(rpool)
    src, dst = [3, 4, 5, 0, 9], [1, 2, 3, 7, 0]
    with Plan(local, remote, src, dst, heads) as plan:
        if count == lh == rh:
            with Plan(local, remote, src, dst) as whole:
                assert plan.requests() == whole.requests() == 2 * len(reference_runs(src, dst))
        else:
            assert plan.requests() == 2 * len(src) * tpp
        plan.transfer(pair.a, pair.session)
    for lb, rb in zip(local, remote):
        for s, d in zip(src, dst):
            for t in range(tpp):
                for h in range(rh):
                    ro = rb.base - rbase + d * rb.page_bytes + (t * rh + h) * hb
                    if rf <= h < rf + count:
                        lo = lb.base - lbase + s * lb.page_bytes + (t * lh + lf + h - rf) * hb
                        assert rpool[ro:ro + hb] == lpool[lo:lo + hb]
                    else:
                        assert rpool[ro:ro + hb] == before[ro:ro + hb]
    pair.a.unregister(lpool)
    pair.b.unregister(rpool)


def test_index_arrays_of_every_kind():
    one = [(0x10000, 64, 100)]
    want = Plan(one, one, [0, 1, 2, 50], [9, 10, 11, 3]).requests()
    kinds = [
        (array("i", [0, 1, 2, 50]), array("i", [9, 10, 11, 3])),
        (array("q", [0, 1, 2, 50]), array("h", [9, 10, 11, 3])),
        (array("i", [0, 1, 2, 50]).tobytes(), bytearray(array("i", [9, 10, 11, 3]).tobytes())),
        (memoryview(array("i", [0, 1, 2, 50])), (9, 10, 11, 3)),
    ]
    for src, dst in kinds:
        assert Plan(one, one, src, dst).requests() == want == 2


def test_numpy_index_arrays():
    """numpy arrays of every integer width, as the README shows them: the
    same runs as from a list."""
    np = pytest.importorskip("numpy", reason="numpy is in python/requirements-test.txt")
    one = [(0x10000, 64, 100)]
    maps = [([0, 1, 2, 50], [9, 10, 11, 3], 2), ([5, 6, 7, 8], [1, 2, 3, 4], 1), ([0, 2, 4, 6], [0, 1, 2, 3], 4)]
    for src, dst, runs in maps:
        assert Plan(one, one, src, dst).requests() == runs
        for dtype in (np.int32, np.int64, np.int16, np.uint8, np.intp):
            assert Plan(one, one, np.array(src, dtype=dtype), np.array(dst, dtype=dtype)).requests() == runs, dtype
    # A strided view (every other element) is read as its values, not its memory.
    wide = np.array([5, -1, 6, -1, 7, -1, 8, -1], dtype=np.int32)[::2]
    assert Plan(one, one, wide, np.array([1, 2, 3, 4])).requests() == 1
    with pytest.raises(ValueError, match="does not fit int32"):
        Plan(one, one, np.array([1 << 40], dtype=np.int64), np.array([0]))


def test_bad_inputs():
    one = [(0x10000, 64, 8)]
    with pytest.raises(ValueError) as e:
        Plan(one, one, [0, 1], [0])
    assert str(e.value) == "group_concurrent_contiguous requires equal-length src/dst index arrays, got 2 and 1"
    with pytest.raises(ValueError, match="not a whole number of int32"):
        Plan(one, one, b"\0\0\0", [0])
    with pytest.raises(ValueError, match="does not fit int32"):
        Plan(one, one, [1 << 40], [0])
    cases = [
        (([], [], [], []), "buffers is 0: a plan needs at least one buffer"),
        ((one, one, [0, -1], [0, 1]), "src_pages[1] is -1, below 0"),
        ((one, one, [0], [8]), "dst_pages[0] is 8, not below remote[0].pages 8"),
        ((one, one, [0, 1], [3, 3]), "dst_pages[1] is 3, as is dst_pages[0]: two writes to one page"),
        ((one, [(0x90000, 0, 8)], [0], [0]), "remote[0].page_bytes is 0"),
    ]
    for args, text in cases:
        with pytest.raises(pdx.PdxError) as err:
            Plan(*args)
        assert err.value.status == pdx.PDX_ERR_INVALID_ARGUMENT and err.value.message == text
    with pytest.raises(pdx.PdxError) as err:
        Plan([(0x10000, 4 * 8 * 2, 8)], [(0x90000, 4 * 2 * 2, 8)], [0], [0], Heads(4, 8, 2, 7, 0, 2, 2))
    assert "heads.local_first 7 + heads.count 2 = 9 is above heads.local_heads 8" in err.value.message
    plan = Plan(one, one, [0], [1])
    with pytest.raises(pdx.PdxError, match="first_buffer 1 is not below end_buffer 1"):
        plan.requests(1, 1)
    plan.close()
    plan.close()
    with pytest.raises(pdx.PdxError) as err:
        pdx.check(pdx.lib.pdx_kv_plan_requests(plan.handle, 0, 1, None))
    assert err.value.status == pdx.PDX_ERR_NULL_ARGUMENT


def test_freed_plan_is_an_error_not_a_crash():
    one = [(0x10000, 64, 8)]
    plan = Plan(one, one, [0], [1])
    raw = plan.handle.value
    plan.close()
    out = ctypes.c_size_t()
    assert pdx.lib.pdx_kv_plan_requests(raw, 0, 1, ctypes.byref(out)) == pdx.PDX_ERR_INVALID_HANDLE
    pdx.lib.pdx_kv_plan_free(raw)  # twice: recorded, ignored
    assert "is not live" in pdx.last_error()


def test_a_held_back_notification_reports_the_rejected_layers_own_status(pair):
    """Layer 1 writes outside the peer's memory: the notification is held
    back, and says so with that layer's status (not a lost connection, which
    a caller would retry)."""
    lpool, _, local = layout(pair.a, [256] * 3, 16, fill_seed=7)
    rpool, _, remote = layout(pair.b, [256] * 3, 16)
    remote[1] = KvBuffer(remote[1].base + (1 << 40), 256, 16)
    with Plan(local, remote, [0, 1], [4, 5]) as plan:
        ids = [plan.submit(pair.a, pair.session, layer, layer + 1) for layer in range(2)]
        ids.append(plan.submit(pair.a, pair.session, 2, 3, notify=("kv_done", "room-rejected")))
        for i in ids:
            pair.a.wait(i, WAIT_MS)
        assert Plan.notify_wait(pair.a, ids[-1], WAIT_MS) == pdx.PDX_ERR_REMOTE_REJECTED
        text = pdx.last_error()
        assert text.startswith(f"batch {ids[1]:#x} of this plan failed: ") and "rejected WRITE" in text, text
        for i in ids:
            pair.a.free(i)
    assert [n for n in pair.b.drain_notifications() if n[0] == "kv_done"] == []
    pair.a.unregister(lpool)
    pair.b.unregister(rpool)


def test_layerwise_notification_follows_every_layer(pair):
    layers, pages = 4, 16
    pbs = [1 << 20] * 2 + [256] * (2 * layers - 2)  # layer 0 is 32 MiB, the rest tiny
    lpool, _, local = layout(pair.a, pbs, pages, fill_seed=5)
    rpool, _, remote = layout(pair.b, pbs, pages)
    src, dst = list(range(pages)), list(reversed(range(pages)))
    with Plan(local, remote, src, dst) as plan:
        ids = []
        for layer in range(layers):
            last = layer == layers - 1
            ids.append(plan.submit(pair.a, pair.session, 2 * layer, 2 * layer + 2,
                                   notify=("kv_done", "room-1") if last else None))
        got, deadline = [], time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = [n for n in pair.b.drain_notifications() if n == ("kv_done", "room-1")]
            time.sleep(0.001)
        assert got == [("kv_done", "room-1")]
        # When the notification is there, so is every byte of every layer.
        for lb, rb in zip(local, remote):
            for s, d in zip(src, dst):
                lo = lb.base - local[0].base + s * lb.page_bytes
                ro = rb.base - remote[0].base + d * rb.page_bytes
                assert rpool[ro:ro + rb.page_bytes] == lpool[lo:lo + lb.page_bytes]
        assert Plan.notify_wait(pair.a, ids[-1], WAIT_MS) == pdx.PDX_OK
        for i in ids:
            assert pair.a.wait(i, WAIT_MS) == pdx.PDX_TASK_COMPLETED
            pair.a.free(i)
    time.sleep(0.05)
    assert [n for n in pair.b.drain_notifications() if n[0] == "kv_done"] == []
    pair.a.unregister(lpool)
    pair.b.unregister(rpool)
