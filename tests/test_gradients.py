"""``cgru.backward`` against float64 central finite differences of ``cgru.forward``.

For every cell option and sequence feature (default cell, reset-before, flip_z, every activation
kind at every gate position, clip, state masks, reverse, zero lengths, skip / projected input,
dropout) and for three losses — on the outputs only (``dhy=None``), on the final states only
(``dy=None``) and on both — EVERY gradient (``dx``, ``dh0``, each ``W``, ``R``, ``b_W``, ``b_R``
of each layer-direction) is compared with central differences of
``loss = Σ y·dy + Σ hy·dhy`` (sums with ``math.fsum``).  Shapes are tiny so that differencing
over all parameters stays fast.  Also: the weight-gradient modes (overwrite / accumulate) and
all-zero gradients without any output gradient.

Every test runs with the ``poison`` fixture (engine buffers start as NaN).
"""
import functools
import math

import numpy as np
import pytest

import cgru
from cgru import Activation, Cell, Network, Topology
from cgru.core import gradcheck
from conftest import ACTIVATION_AB, ACTIVATION_KINDS, activation_cell

pytestmark = pytest.mark.usefixtures("poison")

EPS = 1e-6                             # central-difference step
FD_TOL = dict(rtol=1e-6, atol=1e-8)    # backward vs finite differences (float64)
LOSSES = ("y", "hy", "both")           # which output gradients are given

_KINDS = ACTIVATION_KINDS
_AB = ACTIVATION_AB


def _activation_cell(k):
    return activation_cell(k, z_shift=7, g_shift=3, parity=1)


def _case(T=4, N=3, I=3, H=2, L=1, direction="forward", input_mode="linear", cell=Cell(),
          lengths=None, h0=True, mask=None, batch_major=False, dropout=0.0, seed=0,
          scale=None):
    return dict(T=T, N=N, I=I, H=H, L=L, direction=direction, input_mode=input_mode, cell=cell,
                lengths=lengths, h0=h0, mask=mask, batch_major=batch_major, dropout=dropout,
                seed=seed, scale=scale)


CASES = {
    "default": _case(T=3),
    "default_L2_bi_lengths": _case(L=2, direction="bidirectional", lengths=[2, 4, 1]),
    "default_L2_bi_batch_major_no_h0": _case(T=3, L=2, direction="bidirectional", h0=False,
                                             batch_major=True, lengths=[3, 1, 2]),
    "default_L3": _case(T=3, N=2, I=2, L=3, lengths=[1, 3]),
    "reset_before": _case(L=2, direction="bidirectional", cell=Cell(reset_after=False),
                          lengths=[4, 1, 3]),
    "flip_z": _case(L=2, cell=Cell(flip_z=True), lengths=[2, 4, 3]),
    "reset_before_flip_z": _case(cell=Cell(reset_after=False, flip_z=True), batch_major=True),
    **{f"act{k}-{_KINDS[k]}": _case(T=3, direction="bidirectional" if k % 2 else "forward",
                                   cell=_activation_cell(k), scale=0.6,
                                   lengths=[3, 1, 2] if k % 3 == 2 else None)
       for k in range(len(_KINDS))},
    "clip": _case(L=2, direction="bidirectional", cell=Cell(clip=1.2), scale=0.8,
                  lengths=[4, 3, 1]),
    "clip_reset_before_general": _case(cell=Cell(reset_after=False, clip=1.0, g="softsign"),
                                       scale=0.8),
    "mask_full": _case(L=2, direction="bidirectional", mask="full", lengths=[3, 4, 1]),
    "mask_full_reset_before": _case(L=2, cell=Cell(reset_after=False), mask="full"),
    "mask_features": _case(direction="bidirectional", mask=(4,)),
    "mask_time_reset_before": _case(L=2, mask=(4, 1, 1), cell=Cell(reset_after=False)),
    "mask_batch_major": _case(direction="bidirectional", mask=(3, 1, 4), batch_major=True,
                              lengths=[2, 4, 3]),
    "mask_zeros": _case(L=2, direction="bidirectional", mask="zeros",
                        cell=Cell(reset_after=False)),
    "reverse": _case(L=2, direction="reverse", lengths=[3, 1, 4]),
    "reverse_reset_before": _case(direction="reverse", cell=Cell(reset_after=False),
                                  batch_major=True),
    "zero_lengths": _case(L=2, direction="bidirectional", lengths=[0, 3, 0]),
    "all_zero_lengths": _case(T=2, N=2, L=2, direction="bidirectional", lengths=[0, 0]),
    "skip": _case(I=2, H=2, L=2, direction="bidirectional", input_mode="skip",
                  lengths=[4, 2, 3]),
    "skip_reset_before": _case(I=2, H=2, direction="reverse", input_mode="skip",
                               cell=Cell(reset_after=False)),
    "projected": _case(T=3, N=2, I=12, H=2, L=2, direction="bidirectional",
                       input_mode="projected", lengths=[1, 3]),
    "projected_general": _case(T=3, I=6, H=2, input_mode="projected", mask=(1, 1, 2),
                               cell=Cell(reset_after=False, f_z="hard_sigmoid", g="relu")),
    "dropout": _case(T=3, N=2, I=2, L=3, direction="bidirectional", dropout=0.3, seed=(5, 7),
                     lengths=[3, 2]),
    "dropout_general": _case(T=3, L=2, dropout=0.5, seed=11, mask="full",
                             cell=Cell(reset_after=False, clip=1.0, g="elu")),
}


def test_activation_cases_cover_every_kind_at_every_position():
    cells = [c["cell"] for k, c in CASES.items() if k.startswith("act")]
    for pos in ("f_r", "f_z", "g"):
        assert sorted(getattr(c, pos).name for c in cells) == sorted(_KINDS)


def _problem(c):
    """(params, x, h0 or None, dy, dhy, forward kwargs, backward kwargs) of a case dict."""
    topo = Topology(c["I"], c["H"], c["L"], c["direction"], c["input_mode"])
    params = Network.random(topo, np.float64, seed=21, scale=c["scale"], cell=c["cell"])
    rng = np.random.default_rng(22)
    T, N, DH = c["T"], c["N"], topo.output_size
    x = rng.standard_normal((N, T, c["I"]) if c["batch_major"] else (T, N, c["I"]))
    h0 = rng.standard_normal((topo.num_layer_directions, N, c["H"])) if c["h0"] else None
    out_shape = (N, T, DH) if c["batch_major"] else (T, N, DH)
    mask = c["mask"]
    if mask == "full":
        mask = rng.uniform(0.0, 1.5, out_shape) * (rng.random(out_shape) > 0.25)
    elif mask == "zeros":
        mask = np.zeros(out_shape)
    elif mask is not None:
        mask = rng.uniform(0.2, 1.5, mask)
    dy = rng.standard_normal(out_shape)
    dhy = rng.standard_normal((topo.num_layer_directions, N, c["H"]))
    lengths = None if c["lengths"] is None else np.array(c["lengths"])
    fkw = dict(lengths=lengths, batch_major=c["batch_major"], state_mask=mask,
               training=c["dropout"] > 0, dropout=c["dropout"], seed=c["seed"])
    bkw = dict(batch_major=c["batch_major"], state_mask=mask)
    return params, x, h0, dy, dhy, fkw, bkw


def _differentiable(params, x, h0):
    """``[(name, array)]``: every input the loss depends on, as the arrays forward reads."""
    items = [("x", x), ("h0", h0)]
    for i, lp in enumerate(params):
        items += [(f"{k}[{i}]", a) for k, a in lp.arrays().items()]
    return items


def _fd_gradients(params, x, h0, dy, dhy, fkw):
    """``{name: (d Σ y·dy, d Σ hy·dhy)}`` by central differences (``cgru.core.gradcheck``).
    The many tiny forwards run single-threaded: results do not depend on the thread count
    (test_engine checks it), and waking a thread per tiny call is slow on a busy machine."""
    def losses():
        f = cgru.forward(params, x, h0, **fkw, num_threads=1)
        return math.fsum((f.y * dy).ravel()), math.fsum((f.hy * dhy).ravel())

    items = _differentiable(params, x, h0)
    grads = gradcheck.central_differences(losses, [a for _, a in items], EPS)
    return {name: g for (name, _), g in zip(items, grads)}


@functools.lru_cache(maxsize=None)
def _case_data(case_id):
    """The problem and its finite differences (one sweep serves all three losses)."""
    params, x, h0, dy, dhy, fkw, bkw = _problem(CASES[case_id])
    h0_fd = h0 if h0 is not None else np.zeros(
        (params.topology.num_layer_directions, x.shape[0 if fkw["batch_major"] else 1],
         params.topology.hidden_size))
    fd = _fd_gradients(params, x, h0_fd, dy, dhy, fkw)
    return params, x, h0, dy, dhy, fkw, bkw, fd


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("case_id", list(CASES))
def test_backward_matches_finite_differences(case_id, loss):
    params, x, h0, dy, dhy, fkw, bkw, fd = _case_data(case_id)
    f = cgru.forward(params, x, h0, **{**fkw, "training": True})
    g = cgru.backward(params, x, f.reserve, dy if loss != "hy" else None,
                      dhy if loss != "y" else None, **bkw)
    got = dict(_differentiable(g.dparams, g.dx, g.dh0))
    assert got.keys() == fd.keys()
    largest = 0.0
    for name, (gy, gh) in fd.items():
        want = {"y": gy, "hy": gh, "both": gy + gh}[loss]
        assert got[name].shape == want.shape, name
        np.testing.assert_allclose(got[name], want, **FD_TOL, err_msg=f"loss on {loss}: {name}")
        largest = max(largest, np.abs(want).max(initial=0.0))
    # a non-trivial check (only with every length 0 does the output loss not depend on anything)
    assert largest > 1e-2 or (case_id == "all_zero_lengths" and loss == "y")


def test_clip_cases_clip():
    """The clip cases really clamp some (not all) pre-activations at the first step."""
    for case_id in ("clip", "clip_reset_before_general"):
        c = CASES[case_id]
        params, x, h0, *_ = _problem(c)
        lp, H = params[0], c["H"]
        pre_rz = np.abs((x[0] @ lp.W.T + lp.b_W + h0[0] @ lp.R.T + lp.b_R)[:, :2 * H])
        assert (pre_rz > c["cell"].clip).any() and (pre_rz < c["cell"].clip).any(), case_id


def test_dropout_case_drops():
    """The dropout cases' training forward differs from inference (the masks are applied)."""
    for case_id in ("dropout", "dropout_general"):
        params, x, h0, _, _, fkw, _ = _problem(CASES[case_id])
        train = cgru.forward(params, x, h0, **fkw).y
        infer = cgru.forward(params, x, h0, **{**fkw, "training": False}).y
        assert np.abs(train - infer).max() > 1e-3, case_id


# --- weight-gradient modes -------------------------------------------------------------------

def _small_training_problem(dtype, cell, input_mode):
    I, H = (3, 3) if input_mode == "skip" else (2, 3)
    topo = Topology(I, H, 2, "bidirectional", input_mode)
    params = Network.random(topo, dtype, seed=31, cell=cell)
    rng = np.random.default_rng(31)
    x = rng.standard_normal((4, 3, I)).astype(dtype)
    h0 = rng.standard_normal((4, 3, H)).astype(dtype)
    mask = rng.uniform(0.5, 1.5, (4, 3, 2 * H)).astype(dtype)
    f = cgru.forward(params, x, h0, lengths=[4, 1, 3], state_mask=mask,
                     training=True, dropout=0.2, seed=3)
    dy = rng.standard_normal(f.y.shape).astype(dtype)
    dhy = rng.standard_normal(f.hy.shape).astype(dtype)
    return params, x, f.reserve, dy, dhy, dict(state_mask=mask)


def _arrays(params):
    return [a for lp in params for a in lp.arrays().values()]


_MODE_PARAMS = [
    pytest.param(np.float64, Cell(), "linear", id="f64-default"),
    pytest.param(np.float32, Cell(reset_after=False), "linear", id="f32-reset_before"),
    pytest.param(np.float64, Cell(reset_after=False, g="softsign"), "skip", id="f64-skip"),
]


@pytest.mark.parametrize("dtype, cell, input_mode", _MODE_PARAMS)
def test_dparams_overwrite(dtype, cell, input_mode):
    """accumulate=False writes every element of the given dparams (prefilled with garbage)."""
    params, x, reserve, dy, dhy, kw = _small_training_problem(dtype, cell, input_mode)
    fresh = cgru.backward(params, x, reserve, dy, dhy, **kw)
    dp = fresh.dparams.map(lambda a: np.full_like(a, np.nan))
    dp.layers[0].R[0, 0] = 1e30                      # NaN and huge garbage
    targets = _arrays(dp)
    g = cgru.backward(params, x, reserve, dy, dhy, dparams=dp, accumulate=False, **kw)
    assert g.dparams is dp
    for before, after, want in zip(targets, _arrays(g.dparams), _arrays(fresh.dparams)):
        assert after is before                       # written in place
        np.testing.assert_array_equal(after, want)
    np.testing.assert_array_equal(g.dx, fresh.dx)
    np.testing.assert_array_equal(g.dh0, fresh.dh0)
    assert any(np.abs(a).max(initial=0.0) > 1e-3 for a in _arrays(fresh.dparams))


@pytest.mark.parametrize("dtype, cell, input_mode", _MODE_PARAMS)
def test_dparams_accumulate(dtype, cell, input_mode):
    """accumulate=True adds the fresh gradient to what dparams holds (twice: twice)."""
    params, x, reserve, dy, dhy, kw = _small_training_problem(dtype, cell, input_mode)
    fresh = cgru.backward(params, x, reserve, dy, dhy, **kw)
    rng = np.random.default_rng(5)
    prefill = fresh.dparams.map(lambda a: rng.standard_normal(a.shape).astype(dtype))
    dp = prefill.copy()
    targets = _arrays(dp)
    g = cgru.backward(params, x, reserve, dy, dhy, dparams=dp, accumulate=True, **kw)
    assert g.dparams is dp
    tol = dict(rtol=1e-13, atol=1e-13) if dtype == np.float64 else dict(rtol=1e-6, atol=1e-6)
    for before, after, p0, d in zip(targets, _arrays(dp), _arrays(prefill),
                                    _arrays(fresh.dparams)):
        assert after is before
        np.testing.assert_allclose(after, p0 + d, **tol)
    np.testing.assert_array_equal(g.dx, fresh.dx)
    np.testing.assert_array_equal(g.dh0, fresh.dh0)
    cgru.backward(params, x, reserve, dy, dhy, dparams=dp, accumulate=True, **kw)
    for after, p0, d in zip(_arrays(dp), _arrays(prefill), _arrays(fresh.dparams)):
        np.testing.assert_allclose(after, p0 + 2 * d, **tol)


def test_accumulate_needs_dparams():
    params, x, reserve, dy, dhy, kw = _small_training_problem(np.float64, Cell(), "linear")
    with pytest.raises(ValueError, match="dparams"):
        cgru.backward(params, x, reserve, dy, dhy, accumulate=True, **kw)


@pytest.mark.parametrize("dtype, cell, input_mode", _MODE_PARAMS)
def test_no_output_gradient_gives_zero_gradients(dtype, cell, input_mode):
    """dy=None and dhy=None: dx, dh0 and every parameter gradient are exactly 0 (also when
    overwriting a garbage-filled dparams)."""
    params, x, reserve, _, _, kw = _small_training_problem(dtype, cell, input_mode)
    dp = params.map(lambda a: np.full_like(a, np.nan))
    for g in (cgru.backward(params, x, reserve, None, None, **kw),
              cgru.backward(params, x, reserve, dparams=dp, **kw)):
        assert g.dx.shape == x.shape and g.dh0.shape == (4, 3, params.topology.hidden_size)
        for a in [g.dx, g.dh0] + _arrays(g.dparams):
            assert a.dtype == dtype
            np.testing.assert_array_equal(a, np.zeros_like(a))


_NEED_DX_CASES = [
    pytest.param(np.float64, Cell(), "linear", id="gru-f64"),
    pytest.param(np.float32, Cell(reset_after=False), "linear", id="gru-reset_before-f32"),
    pytest.param(np.float64, Cell(reset_after=False, g="softsign"), "skip", id="gru-skip"),
    pytest.param(np.float64, cgru.LSTMCell(), "linear", id="lstm-f64"),
    pytest.param(np.float32, cgru.RNNCell(), "linear", id="rnn-f32"),
]


@pytest.mark.parametrize("dtype, cell, input_mode", _NEED_DX_CASES)
@pytest.mark.parametrize("batch_major", [False, True], ids=["time_major", "batch_major"])
def test_without_the_input_gradient_the_rest_is_the_same(dtype, cell, input_mode,
                                                         batch_major):
    """``need_dx=False``: ``dx`` is None, the first layer's input-gradient products are not
    run, and ``dh0``, ``dc0`` and every weight gradient are those of the full backward, bit
    for bit — two layers, both directions, padded sequences, a state mask, dropout."""
    params, x, reserve, dy, dhy, kw = _small_training_problem(dtype, cell, input_mode)
    if batch_major:
        x, dy, mask = (np.ascontiguousarray(a.swapaxes(0, 1))
                       for a in (x, dy, kw["state_mask"]))
        kw = dict(state_mask=mask, batch_major=True)
        reserve = cgru.forward(params, x, lengths=[4, 1, 3], training=True, dropout=0.2,
                               seed=3, **kw).reserve
    full = cgru.backward(params, x, reserve, dy, dhy, **kw)
    from cgru.core import engine
    products = []
    real = engine.BACKEND.gemm_packed

    def counted(A, Bp, C, beta1=False, nt=1):
        products.append(C.shape)
        return real(A, Bp, C, beta1, nt)
    engine.BACKEND.gemm_packed = counted
    try:
        part = cgru.backward(params, x, reserve, dy, dhy, need_dx=False, **kw)
        with_dx = len(products)
        cgru.backward(params, x, reserve, dy, dhy, **kw)
    finally:
        del engine.BACKEND.gemm_packed
    # the first layer's input gradient: one product per direction (none with input_mode
    # "skip", whose input matrices are the identity)
    assert len(products) - 2 * with_dx == (0 if input_mode == "skip" else 2)
    assert part.dx is None and full.dx.shape == x.shape
    np.testing.assert_array_equal(part.dh0, full.dh0)
    if full.dc0 is not None:
        np.testing.assert_array_equal(part.dc0, full.dc0)
    for a, b in zip(_arrays(part.dparams), _arrays(full.dparams)):
        np.testing.assert_array_equal(a, b)
    dp = full.dparams.map(lambda a: np.full_like(a, np.nan))
    g = cgru.backward(params, x, reserve, dy, dhy, dparams=dp, need_dx=False, **kw)
    assert g.dx is None and g.dparams is dp
    for a, b in zip(_arrays(dp), _arrays(full.dparams)):
        np.testing.assert_array_equal(a, b)


def test_need_dx_is_a_bool():
    params, x, reserve, dy, dhy, kw = _small_training_problem(np.float64, Cell(), "linear")
    for bad in (0, "no", None):
        with pytest.raises(TypeError, match=r"need_dx: expected a bool, got"):
            cgru.backward(params, x, reserve, dy, dhy, need_dx=bad, **kw)


@pytest.mark.parametrize("dtype, cell, input_mode", _NEED_DX_CASES + [
    pytest.param(np.float64, cgru.LSTMCell(peepholes="ifo"), "linear", id="lstm-peepholes")])
def test_without_the_weight_gradients_the_rest_is_the_same(dtype, cell, input_mode):
    """``need_dparams=False``: ``dparams`` is None, no weight-gradient product runs, and
    ``dx``, ``dh0`` and ``dc0`` are those of the full backward, bit for bit; with ``need_dx``
    False too, only ``dh0`` (and ``dc0``) are left."""
    params, x, reserve, dy, dhy, kw = _small_training_problem(dtype, cell, input_mode)
    full = cgru.backward(params, x, reserve, dy, dhy, **kw)
    from cgru.core import engine
    products = []
    for name in ("gemm", "gemm_t"):
        real = getattr(engine.BACKEND, name)
        setattr(engine.BACKEND, name,
                lambda *a, _real=real, _name=name, **k: (products.append(_name), _real(*a, **k)))
    try:
        part = cgru.backward(params, x, reserve, dy, dhy, need_dparams=False, **kw)
        assert products == []
        cgru.backward(params, x, reserve, dy, dhy, **kw)
        assert products                  # (the counting sees the weight gradients' products)
    finally:
        del engine.BACKEND.gemm, engine.BACKEND.gemm_t
    assert part.dparams is None
    np.testing.assert_array_equal(part.dx, full.dx)
    np.testing.assert_array_equal(part.dh0, full.dh0)
    if full.dc0 is not None:
        np.testing.assert_array_equal(part.dc0, full.dc0)
    least = cgru.backward(params, x, reserve, dy, dhy, need_dparams=False, need_dx=False, **kw)
    assert least.dx is None and least.dparams is None
    np.testing.assert_array_equal(least.dh0, full.dh0)
    with pytest.raises(ValueError, match="dparams: given, but need_dparams=False"):
        cgru.backward(params, x, reserve, dy, dhy, dparams=full.dparams, need_dparams=False,
                      **kw)
    with pytest.raises(TypeError, match=r"need_dparams: expected a bool, got"):
        cgru.backward(params, x, reserve, dy, dhy, need_dparams=1, **kw)
