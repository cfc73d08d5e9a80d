"""The core engine (``cgru.forward`` / ``cgru.backward``) against PyTorch and the NumPy reference.

1. ``torch.nn.GRU`` (CPU): layers, directions, layouts, h0, unsorted lengths, both dtypes —
   outputs, final states and every gradient from autograd.
2. ``cgru.reference.forward`` for what PyTorch lacks: reset-before, flip_z, every activation,
   clip, state masks, reverse direction, zero lengths, skip / projected input, dropout.
3. Dropout determinism, inference ignoring dropout, thread-count independence (bitwise).

Every test runs with the ``poison`` fixture: engine buffers start as NaN, so any element the
engine forgets to write fails the comparison.
"""
import dataclasses

import numpy as np
import pytest

import cgru
from cgru import Activation, Cell, Network, Topology
from cgru.core import reference
from cgru.core import plan
from conftest import ACTIVATION_AB, ACTIVATION_KINDS, activation_cell

pytestmark = pytest.mark.usefixtures("poison")

# Tolerances, stated once.  Against PyTorch: float64 agrees to rounding (~1e-15 seen), float32
# to a few ulps of the largest gradient (bias gradients sum T·N terms).  Against the reference
# (same dtype, different operation order).
TOL_TORCH = {np.float64: dict(rtol=1e-10, atol=1e-10), np.float32: dict(rtol=1e-5, atol=1e-5)}
TOL_REF = {np.float64: dict(rtol=1e-12, atol=1e-12), np.float32: dict(rtol=1e-5, atol=1e-5)}


def _rng(seed):
    return np.random.default_rng(seed)


def _std(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _assert_params_close(got, want, tol, what):
    assert got.topology == want.topology
    for i, (g, w) in enumerate(zip(got, want)):
        for name in ("W", "R", "b_W", "b_R"):
            a, b = getattr(g, name), getattr(w, name)
            assert a.dtype == b.dtype and a.shape == b.shape, f"{what}[{i}].{name}"
            np.testing.assert_allclose(a, b, **tol, err_msg=f"{what}[{i}].{name}")


def test_poison_fixture_is_active():
    """The fixture really poisons the engine's allocation hook (so the other tests can fail)."""
    assert np.isnan(plan.empty((3, 2), np.float32)).all()
    assert np.isnan(plan.empty(4, np.float64)).all()
    assert (plan.empty(16, np.uint8) == 0xFF).all()
    assert np.isnan(plan.empty(16, np.uint8).view(np.float64)).all()
    from cgru.core.backend import BACKEND
    assert np.isnan(BACKEND.empty((3, 2), np.float32)).all()     # the hook the engine calls


def test_poison_reaches_every_result_of_a_call(monkeypatch):
    """Every array a forward and a backward return was made by the poisoned hook (the backend
    looks ``plan.empty`` up at each call), so an element the engine forgets is a NaN."""
    made = []

    def recording(shape, dtype):
        a = poisoned(shape, dtype)
        made.append(a)
        return a

    poisoned = plan.empty
    monkeypatch.setattr(plan, "empty", recording)
    topo = Topology(3, 4, 2, "bidirectional")
    net = Network.random(topo, np.float64, seed=0)
    rng = _rng(0)
    x, h0 = _std(rng, (5, 2, 3), np.float64), _std(rng, (4, 2, 4), np.float64)
    f = cgru.forward(net, x, h0, training=True)
    g = cgru.backward(net, x, f.reserve, _std(rng, f.y.shape, np.float64),
                      _std(rng, f.hy.shape, np.float64))

    def ours(a):
        return any(np.shares_memory(a, m) for m in made)

    for name, a in (("y", f.y), ("hy", f.hy), ("reserve", f.reserve), ("dx", g.dx),
                    ("dh0", g.dh0)):
        assert ours(a), f"{name} was not made by plan.empty"
    for lp in g.dparams:
        assert all(ours(getattr(lp, n)) for n in ("W", "R", "b_W", "b_R"))


# --- 1. against torch.nn.GRU ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("L", [1, 2, 3])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("batch_major", [False, True], ids=["tm", "bm"])
@pytest.mark.parametrize("with_h0", [False, True], ids=["no_h0", "h0"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_matches_torch(torch_gru_run, dtype, L, direction, batch_major, with_h0, with_lengths):
    T, N, I, H = 5, 4, 3, 4
    topo = Topology(I, H, L, direction)
    params = Network.random(topo, dtype, seed=L + 10 * batch_major)
    rng = _rng(100 * L + 10 * with_h0 + with_lengths)
    xshape = (N, T, I) if batch_major else (T, N, I)
    x = _std(rng, xshape, dtype)
    h0 = _std(rng, (topo.num_layer_directions, N, H), dtype) if with_h0 else None
    lengths = np.array([3, 5, 1, 4]) if with_lengths else None   # unsorted, includes 1 and T

    f = cgru.forward(params, x, h0, lengths=lengths, batch_major=batch_major, training=True)
    dy = _std(rng, f.y.shape, dtype)
    dhy = _std(rng, f.hy.shape, dtype)
    g = cgru.backward(params, x, f.reserve, dy, dhy, batch_major=batch_major)
    want = torch_gru_run(params, x, h0, lengths=lengths, batch_first=batch_major, dy=dy, dhy=dhy)

    tol = TOL_TORCH[dtype]
    assert f.y.shape == xshape[:2] + (topo.output_size,) and f.y.dtype == dtype
    assert f.hy.shape == (topo.num_layer_directions, N, H) and f.hy.dtype == dtype
    np.testing.assert_allclose(f.y, want["y"], **tol, err_msg="y")
    np.testing.assert_allclose(f.hy, want["hy"], **tol, err_msg="hy")
    assert g.dx.shape == x.shape and g.dx.dtype == dtype
    assert g.dh0.shape == f.hy.shape and g.dh0.dtype == dtype
    np.testing.assert_allclose(g.dx, want["dx"], **tol, err_msg="dx")
    np.testing.assert_allclose(g.dh0, want["dh0"], **tol, err_msg="dh0")
    _assert_params_close(g.dparams, want["dparams"], tol, "dparams")
    if with_lengths:   # padding is exactly zero, in y and in dx
        y_tm = f.y.transpose(1, 0, 2) if batch_major else f.y
        dx_tm = g.dx.transpose(1, 0, 2) if batch_major else g.dx
        for b, n in enumerate(lengths):
            assert np.all(y_tm[n:, b] == 0) and np.all(dx_tm[n:, b] == 0)


def test_inference_equals_training_forward(torch_gru_run):
    """training=False gives the same y, hy (bitwise) and no reserve."""
    topo = Topology(3, 4, 2, "bidirectional")
    params = Network.random(topo, np.float32, seed=4)
    x = _std(_rng(4), (5, 3, 3), np.float32)
    inf = cgru.forward(params, x, lengths=[5, 2, 3])
    tr = cgru.forward(params, x, lengths=[5, 2, 3], training=True)
    assert inf.reserve is None
    assert tr.reserve.dtype == np.uint8
    assert tr.reserve.size == cgru.reserve_nbytes(topo, 5, 3, dtype=np.float32)
    np.testing.assert_array_equal(inf.y, tr.y)
    np.testing.assert_array_equal(inf.hy, tr.hy)
    want = torch_gru_run(params, x, lengths=[5, 2, 3])
    np.testing.assert_allclose(inf.y, want["y"], **TOL_TORCH[np.float32])


# --- 2. against the NumPy reference --------------------------------------------------------------

_KINDS = ACTIVATION_KINDS
_AB = ACTIVATION_AB


def _activation_cell(k):
    return activation_cell(k, z_shift=5, g_shift=9, parity=0)


def test_activation_cases_cover_every_kind_at_every_position():
    cells = [_activation_cell(k) for k in range(len(_KINDS))]
    for pos in ("f_r", "f_z", "g"):
        assert sorted(getattr(c, pos).name for c in cells) == sorted(_KINDS)
    for c in cells:
        for pos in ("f_r", "f_z", "g"):
            a = getattr(c, pos)
            if a.name in _AB:
                assert (a.alpha, a.beta) != (Activation(a.name).alpha, Activation(a.name).beta)


def _case(name, T=4, N=3, I=3, H=3, L=1, direction="forward", input_mode="linear",
          cell=Cell(), lengths=None, h0=True, mask=None, batch_major=False, dropout=0.0,
          seed=0, scale=None):
    return pytest.param(dict(T=T, N=N, I=I, H=H, L=L, direction=direction,
                             input_mode=input_mode, cell=cell, lengths=lengths, h0=h0,
                             mask=mask, batch_major=batch_major, dropout=dropout, seed=seed,
                             scale=scale), id=name)


REF_CASES = [
    _case("reset_before", L=2, direction="bidirectional", cell=Cell(reset_after=False),
          lengths=[4, 1, 3]),
    _case("flip_z", L=2, cell=Cell(flip_z=True), lengths=[2, 4, 3]),
    _case("reset_before_flip_z", cell=Cell(reset_after=False, flip_z=True), batch_major=True),
    *[_case(f"act{k}-{_KINDS[k]}", L=2, direction="bidirectional" if k % 2 else "forward",
            cell=_activation_cell(k), lengths=[4, 2, 3] if k % 3 == 1 else None, scale=0.4)
      for k in range(len(_KINDS))],
    _case("clip", L=2, direction="bidirectional", cell=Cell(clip=0.6), scale=1.5,
          lengths=[4, 3, 1]),
    _case("clip_reset_before_general", cell=Cell(reset_after=False, clip=0.5, g="softsign"),
          scale=1.5),
    _case("mask_full", L=2, direction="bidirectional", mask="full", lengths=[3, 4, 1]),
    _case("mask_full_reset_before", L=2, cell=Cell(reset_after=False), mask="full"),
    _case("mask_features", direction="bidirectional", mask=(6,)),
    _case("mask_time", L=2, mask=(4, 1, 1), cell=Cell(reset_after=False)),
    _case("mask_batch", mask=(1, 3, 3), lengths=[1, 4, 2]),
    _case("mask_batch_major", direction="bidirectional", mask=(3, 1, 6), batch_major=True,
          lengths=[2, 4, 3]),
    _case("mask_zeros", L=2, direction="bidirectional", mask="zeros"),
    _case("reverse", L=2, direction="reverse", lengths=[3, 1, 4]),
    _case("reverse_reset_before", direction="reverse", cell=Cell(reset_after=False),
          batch_major=True),
    _case("zero_lengths", L=2, direction="bidirectional", lengths=[0, 3, 0]),
    _case("all_zero_lengths", L=2, direction="bidirectional", lengths=[0, 0, 0],
          cell=Cell(reset_after=False)),
    _case("skip", I=3, H=3, L=2, direction="bidirectional", input_mode="skip", lengths=[4, 2, 3]),
    _case("skip_reverse", I=3, H=3, direction="reverse", input_mode="skip"),
    _case("projected", I=18, H=3, L=2, direction="bidirectional", input_mode="projected",
          lengths=[1, 4, 3]),
    _case("projected_general", I=9, H=3, input_mode="projected",
          cell=Cell(reset_after=False, f_z="hard_sigmoid", g="relu"), mask=(1, 1, 3)),
    _case("dropout", L=3, direction="bidirectional", dropout=0.4, seed=(3, 4), lengths=[4, 2, 3]),
    _case("dropout_general", L=2, dropout=0.5, seed=11, cell=Cell(reset_after=False, clip=2.0),
          mask="full"),
]
_CASE = {p.id: p.values[0] for p in REF_CASES}


def make_problem(c, dtype):
    """(params, x, h0, mask, lengths, dropout masks, forward kwargs) of a case dict."""
    topo = Topology(c["I"], c["H"], c["L"], c["direction"], c["input_mode"])
    params = Network.random(topo, dtype, seed=7, scale=c["scale"], cell=c["cell"])
    rng = _rng(8)
    T, N, DH = c["T"], c["N"], topo.output_size
    x = _std(rng, (N, T, c["I"]) if c["batch_major"] else (T, N, c["I"]), dtype)
    h0 = _std(rng, (topo.num_layer_directions, N, c["H"]), dtype) if c["h0"] else None
    out_shape = (N, T, DH) if c["batch_major"] else (T, N, DH)
    mask = c["mask"]
    if mask == "full":
        mask = rng.uniform(0.0, 1.5, out_shape) * (rng.random(out_shape) > 0.25)
    elif mask == "zeros":
        mask = np.zeros(out_shape)
    elif mask is not None:
        mask = rng.uniform(0.2, 1.5, mask)
    mask = None if mask is None else mask.astype(dtype)
    lengths = None if c["lengths"] is None else np.array(c["lengths"])
    training = c["dropout"] > 0
    drop = (cgru.dropout_masks(topo, T, N, dropout=c["dropout"], seed=c["seed"], dtype=dtype)
            if training else None)
    kw = dict(lengths=lengths, batch_major=c["batch_major"], state_mask=mask,
              training=training, dropout=c["dropout"], seed=c["seed"])
    return params, x, h0, drop, kw


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("c", REF_CASES)
def test_matches_reference(c, dtype):
    params, x, h0, drop, kw = make_problem(c, dtype)
    f = cgru.forward(params, x, h0, **kw)
    y_ref, hy_ref = reference.forward(params, x, h0, lengths=kw["lengths"],
                                      batch_major=kw["batch_major"],
                                      state_mask=kw["state_mask"], dropout_masks=drop)
    assert f.y.shape == y_ref.shape and f.y.dtype == dtype
    assert f.hy.shape == hy_ref.shape and f.hy.dtype == dtype
    np.testing.assert_allclose(f.y, y_ref, **TOL_REF[dtype], err_msg="y")
    np.testing.assert_allclose(f.hy, hy_ref, **TOL_REF[dtype], err_msg="hy")
    assert (f.reserve is not None) == kw["training"]
    if c["lengths"] is None or max(c["lengths"]) > 0:
        assert np.abs(f.y).max() > 1e-3            # a non-trivial output


def test_clip_triggers():
    """The clip cases really clamp: some step-0 pre-activations exceed the clip, some do not,
    and the output differs from the unclipped cell."""
    for c in (_CASE["clip"], _CASE["clip_reset_before_general"]):
        assert c["cell"].clip is not None
        params, x, h0, _, kw = make_problem(c, np.float64)
        lp, H = params[0], c["H"]
        pre = x[0] @ lp.W.T + lp.b_W + h0[0] @ lp.R.T + lp.b_R       # [N, 3H] rz exactly
        pre_rz = np.abs(pre[:, :2 * H])
        assert (pre_rz > c["cell"].clip).any() and (pre_rz < c["cell"].clip).any()
        unclipped = dataclasses.replace(c["cell"], clip=None)
        y_clip = cgru.forward(params, x, h0, **kw).y
        y_free = cgru.forward(params.with_cell(unclipped), x, h0, **kw).y
        assert np.abs(y_clip - y_free).max() > 1e-3


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("batch_major", [False, True], ids=["tm", "bm"])
def test_zero_lengths_keep_h0(dtype, batch_major):
    """len = 0: output rows are 0, hy = h0 exactly; in the backward dh0 = dhy, dx = 0."""
    T, N, I, H = 3, 4, 2, 3
    topo = Topology(I, H, 2, "bidirectional")
    params = Network.random(topo, dtype, seed=9)
    rng = _rng(9)
    x = _std(rng, (N, T, I) if batch_major else (T, N, I), dtype)
    h0 = _std(rng, (4, N, H), dtype)
    lengths = np.array([0, 3, 0, 1])
    f = cgru.forward(params, x, h0, lengths=lengths, batch_major=batch_major, training=True)
    dy = _std(rng, f.y.shape, dtype)
    dhy = _std(rng, f.hy.shape, dtype)
    g = cgru.backward(params, x, f.reserve, dy, dhy, batch_major=batch_major)
    y_bm = f.y if batch_major else f.y.transpose(1, 0, 2)
    dx_bm = g.dx if batch_major else g.dx.transpose(1, 0, 2)
    for b in (0, 2):
        assert np.all(y_bm[b] == 0)
        np.testing.assert_array_equal(f.hy[:, b], h0[:, b])
        np.testing.assert_array_equal(g.dh0[:, b], dhy[:, b])
        assert np.all(dx_bm[b] == 0)
    assert np.all(np.abs(y_bm[1]).sum(axis=-1) > 0)
    assert not np.allclose(f.hy[:, 1], h0[:, 1])
    assert np.all(np.isfinite(g.dx)) and all(np.isfinite(a).all() for lp in g.dparams
                                             for a in lp.arrays().values())


# --- 3. dropout and determinism ------------------------------------------------------------------

def _dropout_problem(dtype=np.float64):
    topo = Topology(3, 4, 3, "bidirectional")
    params = Network.random(topo, dtype, seed=12)
    rng = _rng(12)
    x = _std(rng, (5, 3, 3), dtype)
    h0 = _std(rng, (6, 3, 4), dtype)
    return topo, params, x, h0


def test_dropout_masks_values():
    topo = Topology(3, 4, 3, "bidirectional")
    masks = cgru.dropout_masks(topo, 50, 20, dropout=0.3, seed=(5, 7), dtype=np.float64)
    assert len(masks) == 2
    for m in masks:
        assert m.shape == (50, 20, 8) and m.dtype == np.float64
        assert set(np.unique(m)) == {0.0, 1.0 / 0.7}
        assert 0.25 < (m == 0).mean() < 0.35
    assert not np.array_equal(masks[0], masks[1])            # each layer draws its own mask


def test_dropout_same_seed_is_bitwise_reproducible():
    _, params, x, h0 = _dropout_problem()
    a = cgru.forward(params, x, h0, training=True, dropout=0.3, seed=(5, 7))
    b = cgru.forward(params, x, h0, training=True, dropout=0.3, seed=(5, 7))
    np.testing.assert_array_equal(a.y, b.y)
    np.testing.assert_array_equal(a.hy, b.hy)
    np.testing.assert_array_equal(a.reserve, b.reserve)
    dy = _std(_rng(1), a.y.shape, np.float64)
    ga = cgru.backward(params, x, a.reserve, dy)
    gb = cgru.backward(params, x, b.reserve, dy)
    np.testing.assert_array_equal(ga.dx, gb.dx)
    for la, lb in zip(ga.dparams, gb.dparams):
        for k in ("W", "R", "b_W", "b_R"):
            np.testing.assert_array_equal(getattr(la, k), getattr(lb, k))


@pytest.mark.parametrize("other", [(5, 8), (6, 7), 5])
def test_dropout_different_seed_differs(other):
    _, params, x, h0 = _dropout_problem()
    a = cgru.forward(params, x, h0, training=True, dropout=0.3, seed=(5, 7))
    b = cgru.forward(params, x, h0, training=True, dropout=0.3, seed=other)
    assert np.abs(a.y - b.y).max() > 1e-3


def test_inference_ignores_dropout():
    _, params, x, h0 = _dropout_problem()
    plain = cgru.forward(params, x, h0)
    inf = cgru.forward(params, x, h0, training=False, dropout=0.5, seed=(5, 7))
    np.testing.assert_array_equal(inf.y, plain.y)
    np.testing.assert_array_equal(inf.hy, plain.hy)
    y_ref, _ = reference.forward(params, x, h0)
    np.testing.assert_allclose(inf.y, y_ref, **TOL_REF[np.float64])
    dropped = cgru.forward(params, x, h0, training=True, dropout=0.5, seed=(5, 7))
    assert np.abs(dropped.y - plain.y).max() > 1e-3          # ... while training applies it
    zero = cgru.forward(params, x, h0, training=True, dropout=0.0, seed=(5, 7))
    np.testing.assert_array_equal(zero.y, plain.y)


def test_dropout_on_one_layer_warns_and_changes_nothing():
    """Inter-layer dropout on a 1-layer network has nothing to drop: the result is the
    dropout-free one, and a warning says so (PyTorch warns alike), pointing at the caller."""
    topo = Topology(3, 4, 1, "bidirectional")
    params = Network.random(topo, np.float64, seed=2)
    x = _std(_rng(3), (5, 2, 3), np.float64)
    plain = cgru.forward(params, x, training=True)
    with pytest.warns(UserWarning, match=r"dropout=0\.5 has no effect on a 1-layer") as seen:
        dropped = cgru.forward(params, x, training=True, dropout=0.5, seed=(5, 7))
    assert [w.filename for w in seen] == [__file__]
    np.testing.assert_array_equal(dropped.y, plain.y)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # no warning where dropout applies or is off
        cgru.forward(params, x, training=False, dropout=0.5)
        cgru.forward(params, x, training=True, dropout=0.0)
        cgru.forward(Network.random(Topology(3, 4, 2), np.float64, seed=2), x, training=True,
                     dropout=0.5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cell", [Cell(), Cell(reset_after=False, flip_z=True, clip=1.5,
                                             g="softsign")], ids=["fast", "general"])
@pytest.mark.parametrize("D", [1, 2], ids=["uni", "bi"])
def test_thread_count_does_not_change_results(dtype, cell, D, monkeypatch):
    """num_threads=1 and 2 give bitwise identical y, hy, reserve and gradients, also with
    lengths, mask and dropout; and run to run. N = 40: one direction runs as 2 batch chunks on
    2 threads and as one on 1 thread; two directions as one chunk each on 1 and 2 threads."""
    T, N, I, H = 6, 40, 5, 8
    monkeypatch.setattr(plan, "_MIN_PARALLEL_WORK", 0)   # small work still gets threads
    assert plan.loop_threads(2, T, N, H, D, 3) == 2
    assert [plan.loop_chunks(N, H, nt, D) for nt in (1, 2)] == [1, 2 if D == 1 else 1]
    topo = Topology(I, H, 2, "bidirectional" if D == 2 else "forward")
    params = Network.random(topo, dtype, seed=13, cell=cell)
    rng = _rng(13)
    x = _std(rng, (T, N, I), dtype)
    h0 = _std(rng, (2 * D, N, H), dtype)
    lengths = rng.integers(0, T + 1, N)
    mask = rng.uniform(0.5, 1.5, (T, N, D * H)).astype(dtype)
    dy = _std(rng, (T, N, D * H), dtype)
    dhy = _std(rng, (2 * D, N, H), dtype)

    def run(nt):
        kw = dict(state_mask=mask, num_threads=nt)
        f = cgru.forward(params, x, h0, lengths=lengths, training=True, dropout=0.25, seed=3,
                         **kw)
        g = cgru.backward(params, x, f.reserve, dy, dhy, **kw)
        return [f.y, f.hy, f.reserve, g.dx, g.dh0] + [a for lp in g.dparams
                                                      for a in lp.arrays().values()]

    one, two, again = run(1), run(2), run(2)
    assert np.isfinite(one[0]).all() and np.abs(one[3]).max() > 0
    for a, b, c in zip(one, two, again):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(b, c)
