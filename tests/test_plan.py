"""cgru.core.plan: the work split and the buffers of a call, and the pool of recycled blocks.

The pool hands a workspace block or a reserve out again only when nothing refers to it any
more: a reserve the caller still holds is never overwritten by the next call.
"""
import numpy as np
import pytest

import cgru
from cgru.core import plan


@pytest.fixture(autouse=True)
def fresh_pool():
    plan.release_memory()
    yield
    plan.release_memory()


def _net_and_x():
    net = cgru.Network.random(cgru.Topology(4, 6, 2), np.float64, seed=1, cell=cgru.GRUCell())
    x = np.random.default_rng(2).standard_normal((5, 3, 4))
    return net, x


def test_a_released_reserve_is_reused_and_a_held_one_never():
    net, x = _net_and_x()
    f1 = cgru.forward(net, x, training=True)
    held = f1.reserve
    addr = held.ctypes.data
    snapshot = held.copy()
    f2 = cgru.forward(net, x * 2, training=True)           # f1's reserve is still held
    assert f2.reserve.ctypes.data != addr
    np.testing.assert_array_equal(held, snapshot)          # untouched
    del f1, held
    f3 = cgru.forward(net, x, training=True)               # now free: handed out again
    assert f3.reserve.ctypes.data == addr
    np.testing.assert_array_equal(f3.reserve, snapshot)    # and written as by a fresh call
    g = cgru.backward(net, x, f3.reserve, np.ones_like(f3.y))
    assert np.isfinite(g.dx).all()


def test_a_view_keeps_a_reserve_from_reuse():
    net, x = _net_and_x()
    f = cgru.forward(net, x, training=True)
    view = f.reserve[16:]
    addr = f.reserve.ctypes.data
    del f
    f2 = cgru.forward(net, x, training=True)
    assert f2.reserve.ctypes.data != addr
    assert view.base is not None


def test_a_reserve_made_read_only_is_writable_again_when_reused():
    net, x = _net_and_x()
    f = cgru.forward(net, x, training=True)
    f.reserve.flags.writeable = False
    addr = f.reserve.ctypes.data
    del f
    f2 = cgru.forward(net, x, training=True)
    assert f2.reserve.ctypes.data == addr and f2.reserve.flags.writeable


def test_the_pool_is_bounded_and_can_be_emptied(monkeypatch):
    monkeypatch.setattr(plan, "POOL_BYTES", 1 << 20)
    blocks = [plan.recycled(200_000) for _ in range(8)]       # all held: all new
    assert len({b.ctypes.data for b in blocks}) == 8
    assert sum(b.size for b in plan._pool) <= 1 << 20
    del blocks
    plan.recycled(300_000)                                     # above POOL_BYTES / 4: unpooled
    assert all(b.size != 300_000 for b in plan._pool)
    plan.release_memory()
    assert plan._pool == []


def test_n_chunks_and_loop_threads_depend_on_shapes_only():
    assert [plan.n_chunks(n) for n in (1, 15, 16, 32, 48, 64, 1000)] == [1, 1, 2, 2, 3, 4, 4]
    assert [plan.n_chunks(n, 1024) for n in (20, 47, 48)] == [1, 1, 3]
    assert plan.loop_threads(2, 1, 1, 8, 1, 3) == 1           # too small for a second thread
    assert plan.loop_threads(2, 100, 32, 256, 1, 3) == 2


# --- the packed-weight cache -------------------------------------------------------------------
def _count_packs(monkeypatch):
    calls = []
    real = plan.pack_rhs

    def counting(B, forward):
        calls.append((B.shape, bool(forward)))
        return real(B, forward)
    monkeypatch.setattr(plan, "pack_rhs", counting)
    return calls


@pytest.mark.parametrize("cell", [cgru.GRUCell(), cgru.GRUCell(reset_after=False),
                                  cgru.LSTMCell(), cgru.RNNCell("relu")], ids=repr)
def test_unchanged_weights_are_packed_once(monkeypatch, cell):
    calls = _count_packs(monkeypatch)
    net = cgru.Network.random(cgru.Topology(4, 6, 2, "bidirectional"), np.float64, seed=1,
                              cell=cell)
    x = np.random.default_rng(2).standard_normal((5, 3, 4))
    first = cgru.forward(net, x, training=True)
    cgru.backward(net, x, first.reserve, np.ones_like(first.y))
    n = len(calls)
    assert n >= 2 * 4                       # forward and backward packs, 4 layer-directions
    for _ in range(3):
        f = cgru.forward(net, x, training=True)
        cgru.backward(net, x, f.reserve, np.ones_like(f.y))
        cgru.forward(net, x)
    assert len(calls) == n                  # every later call found its packs
    plan.release_memory()
    cgru.forward(net, x)
    assert len(calls) > n                   # emptied: packed again


@pytest.mark.parametrize("cell", [cgru.GRUCell(), cgru.GRUCell(reset_after=False),
                                  cgru.LSTMCell(), cgru.RNNCell()], ids=repr)
def test_weights_changed_in_place_are_never_served_a_stale_pack(cell):
    """The cache is keyed by the weights' contents: an in-place update (an optimizer step) is
    seen by the very next call, forward and backward, with no call to make."""
    kw = dict(proj_size=3) if cell.kind == "lstm" else {}
    net = cgru.Network.random(cgru.Topology(4, 6, 1, **kw), np.float64, seed=3, cell=cell)
    x = np.random.default_rng(4).standard_normal((5, 3, 4))
    dy = np.random.default_rng(5).standard_normal(cgru.forward(net, x).y.shape)
    before = cgru.forward(net, x).y
    for name in ("R", "W_p") if kw else ("R",):
        getattr(net[0], name)[1, 2] += 0.25             # in place: same array object
        getattr(net[0], name)[-1, 0] -= 0.25            # (a GRU's r/z and n blocks both)
        f = cgru.forward(net, x, training=True)
        g = cgru.backward(net, x, f.reserve, dy)
        fresh = net.copy()
        plan.release_memory()
        f_ref = cgru.forward(fresh, x, training=True)
        g_ref = cgru.backward(fresh, x, f_ref.reserve, dy)
        assert not np.array_equal(f.y, before)
        np.testing.assert_array_equal(f.y, f_ref.y)
        np.testing.assert_array_equal(g.dx, g_ref.dx)
        for a, b in zip(g.dparams, g_ref.dparams):
            for k, v in a.arrays().items():
                np.testing.assert_array_equal(v, b.arrays()[k])
        before = f.y


def test_cached_packs_are_read_only_and_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(plan, "PACK_BYTES", 1 << 20)
    rng = np.random.default_rng(6)
    Rs = [rng.standard_normal((96, 32)) for _ in range(12)]    # ~25 KiB packed each
    packs = [plan.packed(R, True) for R in Rs]
    assert all(not p.flags.writeable for p in packs)
    assert plan.packed(Rs[-1].copy(), True) is packs[-1]        # same contents: same pack
    assert plan.packed(Rs[-1], False) is not packs[-1]          # the backward's is another
    big = rng.standard_normal((512, 256))                      # 1 MiB > PACK_BYTES / 4
    plan.packed(big, True)
    assert sum(a.nbytes for a in plan._packs.values()) <= 1 << 20
    assert all(a.shape != plan.pack_rhs(big, True).shape for a in plan._packs.values())


def test_threads_sharing_the_cache_get_their_own_weights_bits():
    """Calls from several threads at once, each with its own weights (and two with equal
    weights in different arrays), give the bits of the same calls made one after the other."""
    import threading
    rng = np.random.default_rng(7)
    x = rng.standard_normal((7, 3, 4))
    nets = [cgru.Network.random(cgru.Topology(4, 6, 2), np.float64, seed=s % 3, cell=cell)
            for s, cell in enumerate([cgru.GRUCell(), cgru.LSTMCell(), cgru.RNNCell()] * 2)]

    def call(net):
        f = cgru.forward(net, x, training=True)
        g = cgru.backward(net, x, f.reserve, np.ones_like(f.y))
        return [f.y, g.dx] + [a for lp in g.dparams for a in lp.arrays().values()]
    want = [call(net) for net in nets]
    plan.release_memory()
    got, errors = [None] * len(nets), []

    def worker(i):
        try:
            for _ in range(5):
                got[i] = call(nets[i])
        except Exception as exc:      # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(nets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for a, b in zip(got, want):
        assert all(np.array_equal(u, v) for u, v in zip(a, b))
