"""Property-based fuzzing (hypothesis) of the core and every frontend.

For random shapes and options — dtypes, T, N, I, H, layers, directions, input modes, every
activation with its alpha/beta, clip, flip_z, both candidate forms, lengths (zeros included),
layouts, masks, dropout, thread counts — every call either raises a documented error
(``ValueError`` / ``TypeError`` whose message starts with the argument's name) or returns
results equal to a NumPy reference:

* the core: ``cgru.forward`` against ``cgru.reference.forward``; ``cgru.backward`` against a
  directional central difference in float64 (``⟨∇loss, v⟩`` for a random direction ``v``
  over ``x``, ``h0`` and every parameter);
* the frontends: against references written here from each system's own documented
  equations and tensor layouts (ONNX ``z, r, h``; MPSGraph ``z, r, o``; cuDNN/TF's opaque
  buffer; Arraymancer's ``W3s0 … bU3s``), so that a layout or gate-order slip in a frontend
  cannot hide behind the converter it shares with the core; and the gradient ops against
  directional differences.

Examples are bounded (``max_examples``) and derandomized, so CI runs the same cases every
time; the whole file runs in well under a minute.  ``CGRU_FUZZ_SCALE=k`` runs ``k`` times as many
examples, drawn at random, for a longer search (``test_onnx_hostile``'s fuzz reads it too).  Array contents come from a NumPy generator
seeded by a drawn integer (hypothesis' own floats favour 0.0, exactly the kink of relu).
"""
import math
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import cgru  # noqa: E402
from cgru.core import gradcheck  # noqa: E402
from cgru import Activation, Cell, Network, Topology  # noqa: E402
from cgru.core import reference
from cgru import arraymancer as am  # noqa: E402
from cgru import mps, tf  # noqa: E402
from cgru import onnx as connx  # noqa: E402


# CGRU_FUZZ_SCALE=k: a longer campaign — k times the examples, drawn at random (new cases every
# run) instead of CI's fixed ones
SCALE = int(os.environ.get("CGRU_FUZZ_SCALE") or 0)


def fuzz(n):
    """Settings of a fuzz test: ``n`` derandomized examples (``SCALE``: ``n·SCALE`` random
    ones), no deadline."""
    return settings(max_examples=n * max(SCALE, 1), deadline=None, derandomize=not SCALE,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


SEEDS = st.integers(0, 2 ** 32 - 1)
DTYPES = st.sampled_from([np.float64, np.float32])


def _assume_in_range(dtype, *refs):
    """Only cases whose reference results stay well inside ``dtype``'s range are compared:
    near overflow, where unbounded activations take some draws, whether a value becomes
    ``inf`` or ``nan`` depends on the order of floating-point operations, which neither
    implementation fixes."""
    bound = np.sqrt(np.finfo(dtype).max)
    assume(all(bool(np.all(np.abs(r) < bound)) for r in refs))     # NaN is out of range too


def _tol(dtype, ref):
    """``assert_allclose`` tolerances for a result of magnitude ``ref``."""
    scale = max(1.0, float(np.nanmax(np.abs(ref), initial=0.0)))
    if dtype == np.float64:
        return dict(rtol=1e-10, atol=1e-12 * scale)
    return dict(rtol=2e-4, atol=3e-5 * scale)


# --- activations (cgru names, ONNX parameters) ------------------------------------------------
_PARAMETRIC = {
    "hard_sigmoid": (st.floats(0.05, 0.5), st.floats(0.2, 0.8)),
    "affine": (st.floats(-1.5, 1.5), st.floats(-0.5, 0.5)),
    "leaky_relu": (st.floats(0.0, 0.5), st.just(None)),
    "thresholded_relu": (st.floats(-0.5, 0.5), st.just(None)),
    "scaled_tanh": (st.floats(0.3, 2.0), st.floats(0.3, 2.0)),
    "elu": (st.floats(0.3, 2.0), st.just(None)),
}


@st.composite
def activations(draw, smooth=False):
    """A ``cgru.Activation``: any kind with random alpha/beta; ``smooth`` leaves out
    thresholded_relu (a jump: a float32 rounding or a finite difference across it is O(1))."""
    names = [n for n in cgru.ACTIVATION_NAMES if not (smooth and n == "thresholded_relu")]
    name = draw(st.sampled_from(names))
    if name in _PARAMETRIC:
        a, b = _PARAMETRIC[name]
        return Activation(name, draw(a), draw(b))
    return Activation(name)


@st.composite
def cells(draw, smooth=False):
    return Cell(reset_after=draw(st.booleans()), flip_z=draw(st.booleans()),
                f_r=draw(activations(smooth)), f_z=draw(activations(smooth)),
                g=draw(activations(smooth)),
                clip=draw(st.one_of(st.none(), st.floats(0.25, 3.0))))


# --- the core -------------------------------------------------------------------------------------
@st.composite
def core_cases(draw, dtype=None, smooth=False):
    """Everything one core forward/backward call needs, as a dict."""
    dtype = draw(DTYPES) if dtype is None else dtype
    T, N, H, L = (draw(st.integers(1, 6)), draw(st.integers(1, 5)), draw(st.integers(1, 4)),
                  draw(st.integers(1, 3)))
    direction = draw(st.sampled_from(("forward", "reverse", "bidirectional")))
    D = 2 if direction == "bidirectional" else 1
    mode = draw(st.sampled_from(("linear", "linear", "skip", "projected")))
    I = H if mode == "skip" else D * 3 * H if mode == "projected" else draw(st.integers(1, 5))
    dropout = draw(st.sampled_from((0.0, 0.0, 0.3, 0.7))) if L > 1 else 0.0
    return dict(
        dtype=dtype, T=T, N=N, topo=Topology(I, H, L, direction, mode),
        cell=draw(cells(smooth or dtype == np.float32)),
        lengths=draw(st.one_of(st.none(), st.lists(st.integers(0, T), min_size=N, max_size=N))),
        batch_major=draw(st.booleans()), h0=draw(st.booleans()),
        mask=draw(st.sampled_from((None, None, "full", "time", "batch", "feature", "one"))),
        dropout=dropout, training=dropout > 0 or draw(st.booleans()),
        seed=(draw(SEEDS), draw(SEEDS)), num_threads=draw(st.sampled_from((1, 2))),
        data=draw(SEEDS))


def _core_arrays(c):
    """``(params, x, h0, state_mask, dy, dhy)`` of a case (NumPy generator from its seed)."""
    rng = np.random.default_rng(c["data"])
    topo, dt, T, N = c["topo"], c["dtype"], c["T"], c["N"]
    H, DH, LD = topo.hidden_size, topo.output_size, topo.num_layer_directions
    params = Network.random(topo, dt, seed=c["data"] % 1000, scale=0.8, cell=c["cell"])
    xs = (N, T, topo.input_size) if c["batch_major"] else (T, N, topo.input_size)
    ys = (N, T, DH) if c["batch_major"] else (T, N, DH)
    x = rng.standard_normal(xs).astype(dt)
    h0 = rng.standard_normal((LD, N, H)).astype(dt) if c["h0"] else None
    mshape = {None: None, "full": ys, "one": (1,), "feature": (DH,),
              "time": (ys[0], 1, 1) if not c["batch_major"] else (1, ys[1], 1),
              "batch": (1, ys[1], DH) if not c["batch_major"] else (ys[0], 1, DH)}[c["mask"]]
    mask = None if mshape is None else rng.uniform(0.0, 1.5, mshape).astype(dt)
    dy = rng.standard_normal(ys).astype(dt)
    dhy = rng.standard_normal((LD, N, H)).astype(dt)
    return params, x, h0, mask, dy, dhy


def _forward_kw(c, mask):
    return dict(lengths=None if c["lengths"] is None else np.array(c["lengths"]),
                batch_major=c["batch_major"], state_mask=mask, training=c["training"],
                dropout=c["dropout"], seed=c["seed"], num_threads=c["num_threads"])


@fuzz(150)
@given(c=core_cases())
def test_core_forward_equals_the_reference(c):
    params, x, h0, mask, _, _ = _core_arrays(c)
    kw = _forward_kw(c, mask)
    with np.errstate(all="ignore"):     # (an overflowed output times a dropped mask: NaN)
        f = cgru.forward(params, x, h0, **kw)
    drop = (cgru.dropout_masks(c["topo"], c["T"], c["N"], dropout=c["dropout"], seed=c["seed"],
                               dtype=c["dtype"]) if c["training"] and c["dropout"] else None)
    with np.errstate(all="ignore"):     # unbounded activations may overflow: inf/NaN compare
        y, hy = reference.forward(params, x, h0, lengths=kw["lengths"],
                                  batch_major=c["batch_major"], state_mask=mask,
                                  dropout_masks=drop)
    assert f.y.dtype == c["dtype"] and f.y.shape == y.shape and f.hy.shape == hy.shape
    _assume_in_range(c["dtype"], y, hy)
    try:
        np.testing.assert_allclose(f.y, y, **_tol(c["dtype"], y))
        np.testing.assert_allclose(f.hy, hy, **_tol(c["dtype"], hy))
    except AssertionError:
        if c["dtype"] != np.float32:
            raise
        _within_float32s_own_error((f.y, f.hy), params, x, h0, mask, kw, drop)
    assert (f.reserve is None) != c["training"]


def _within_float32s_own_error(got, params, x, h0, mask, kw, drop):
    """float32 results ``(y, hy)`` of a case the reference's float32 does not reproduce within
    ``_tol``: judged against the float64 reference of the same values instead, allowed four
    times what float32 itself loses on the case — the largest error of the float32 reference
    run on the values and on them moved by one ulp each way at random.  Cells drawn here can
    amplify rounding a thousandfold in a few steps (a tanh update gate below 0, an unbounded
    candidate: 1.4 % between two float32 computations, both as far from float64); on a case
    that does not, the allowance is the fixed tolerance's."""
    rng = np.random.default_rng(0)
    arrays = [x, h0, mask] + [a for lp in params for a in lp.arrays().values()]

    def run(values, dtype):
        xs, h, m, *ws = [None if v is None else v.astype(dtype) for v in values]
        it = iter(ws)
        net = Network(params.topology, [cgru.LayerParams(**{k: next(it) for k in lp.arrays()})
                                        for lp in params], params.cell)
        with np.errstate(all="ignore"):
            return reference.forward(net, xs, h, lengths=kw["lengths"],
                                     batch_major=kw["batch_major"], state_mask=m,
                                     dropout_masks=None if drop is None else
                                     [d.astype(dtype) for d in drop])

    def nudged(a):
        if a is None:
            return None
        away = np.where(rng.random(a.shape) < 0.5, -np.inf, np.inf).astype(a.dtype)
        return np.nextafter(a, away)

    exact = run(arrays, np.float64)
    lost = max(max(float(np.abs(r.astype(np.float64) - e).max()) for r, e in zip(out, exact))
               for out in [run(arrays, np.float32)] +
               [run([nudged(a) for a in arrays], np.float32) for _ in range(2)])
    for g, e in zip(got, exact):
        allowed = _tol(np.float32, e)["atol"] + 4 * lost
        assert np.abs(g.astype(np.float64) - e).max() <= allowed, (
            np.abs(g.astype(np.float64) - e).max(), lost)


def _loss(y, hy, dy, dhy):
    return math.fsum((y * dy).ravel()) + math.fsum((hy * dhy).ravel())


def _directional_check(loss_at, grads, inputs, rng, eps=1e-6, tol=2e-6):
    """``⟨grads, v⟩`` against central differences of ``loss_at(list)`` along a random ``v``.

    ``inputs``/``grads``: lists of float64 arrays of equal shapes.  The same direction is
    differenced at ``ε`` and ``2ε`` and the two are combined by Richardson extrapolation,
    ``(4·fd(ε) − fd(2ε)) / 3``, which cancels the ``ε²`` term of the central difference; what
    remains of the truncation error is bounded by ``|fd(ε) − fd(2ε)|``, which is added to the
    tolerance.  A single difference is not enough on the cells drawn here: an unbounded
    activation through three layers can make the loss ~1e13 with a third derivative large
    enough that ``fd(ε)`` misses the exact directional derivative by 1 %."""
    state = rng.bit_generator.state
    fd, pred = gradcheck.directional(loss_at, grads, inputs, rng, eps)
    rng.bit_generator.state = state
    fd2, pred2 = gradcheck.directional(loss_at, grads, inputs, rng, 2 * eps)
    assert pred2 == pred
    richardson = (4 * fd - fd2) / 3
    bound = tol * max(1.0, abs(pred), abs(fd)) + abs(fd - fd2)
    assert abs(richardson - pred) <= bound, (richardson, fd, fd2, pred)


def _kinks(act):
    """The arguments at which ``act``'s derivative jumps (``smooth`` cells have no others)."""
    if act.name in ("relu", "leaky_relu") or (act.name == "elu" and act.alpha != 1):
        return (0.0,)
    if act.name == "hard_sigmoid" and act.alpha:
        return (-act.beta / act.alpha, (1 - act.beta) / act.alpha)
    return ()


def _kink_sides(net, x, h0, kw):
    """The side of every kink of the forward's pieces — ONNX's clip at ±clip, an
    activation's own (``_kinks``) — on which each of their arguments lies, one array for the
    whole forward (the NumPy reference's, its clip and activations watched).  A central
    difference over an interval holding a kink measures a mix of the slopes on both sides,
    not the derivative: the backward check compares these sides across the interval."""
    from unittest import mock

    from cgru.core import activations
    from cgru.core.kinds import gru as kind
    sides = []

    def clamp(cell, a):
        if cell.clip is not None:
            sides.append(np.sign(np.abs(a) - cell.clip).ravel())
        return activations.clamp(cell, a)

    def activate(act, a):
        sides.extend(np.sign(a - k).ravel() for k in _kinks(act))
        return activations.activate(act, a)

    drop = cgru.dropout_masks(net.topology, x.shape[1] if kw["batch_major"] else x.shape[0],
                              x.shape[0] if kw["batch_major"] else x.shape[1],
                              dropout=kw["dropout"], seed=kw["seed"], dtype=net.dtype) \
        if kw["dropout"] else None
    with mock.patch.object(kind, "clamp", clamp), mock.patch.object(kind, "activate", activate), \
            np.errstate(all="ignore"):
        reference.forward(net, x, h0, lengths=kw["lengths"], batch_major=kw["batch_major"],
                          state_mask=kw["state_mask"], dropout_masks=drop)
    return np.concatenate(sides) if sides else np.zeros(0)


def test_kink_sides_see_a_clip_crossed():
    """``_kink_sides`` changes where a pre-activation crosses the clip, and not elsewhere."""
    topo = Topology(2, 2)
    cell = Cell(clip=0.5, g=Activation("relu"))
    net = Network.random(topo, np.float64, seed=3, cell=cell)
    x = np.random.default_rng(0).standard_normal((3, 2, 2))
    kw = dict(lengths=None, batch_major=False, state_mask=None, dropout=0.0, seed=(0, 0))
    base = _kink_sides(net, x, None, kw)
    assert base.size and np.array_equal(base, _kink_sides(net, x + 1e-9, None, kw))
    # move the input until some pre-activation crosses ±0.5 or a relu argument crosses 0
    assert any(not np.array_equal(base, _kink_sides(net, x + s, None, kw))
               for s in np.linspace(-1, 1, 41))


def test_the_directional_check_fails_a_wrong_gradient():
    """The check's tolerance, widened by the truncation estimate, still refuses a gradient
    that is off by a small fraction, on a smooth loss and on one with large derivatives."""
    a = np.random.default_rng(5).standard_normal(7)
    for scale in (1.0, 3.0):
        loss_at = lambda vals: math.fsum(np.exp(scale * vals[0]).ravel())
        grad = scale * np.exp(scale * a)
        _directional_check(loss_at, [grad], [a], np.random.default_rng(6))
        for wrong in (grad * (1 + 1e-4), grad + 1e-4 * np.abs(grad).max() * (np.arange(7) == 3)):
            with pytest.raises(AssertionError):
                _directional_check(loss_at, [wrong], [a], np.random.default_rng(6))


@fuzz(100)
@given(c=core_cases(dtype=np.float64, smooth=True))
def test_core_backward_equals_directional_differences(c):
    params, x, h0, mask, dy, dhy = _core_arrays(c)
    c = dict(c, training=True)
    kw = _forward_kw(c, mask)
    if h0 is None:
        h0 = np.zeros((c["topo"].num_layer_directions, c["N"], c["topo"].hidden_size))
    with np.errstate(all="ignore"):
        f = cgru.forward(params, x, h0, **kw)
    # An unbounded z gate (identity, softplus, …) can grow the state towards float64's limit
    # within a few steps, where a difference quotient means nothing; states below ~1e19
    # (float32's bound) leave the quotient's rounding far below the tolerance.
    _assume_in_range(np.float32, f.y, f.hy)
    g = cgru.backward(params, x, f.reserve, dy, dhy, state_mask=mask,
                      batch_major=c["batch_major"], num_threads=c["num_threads"])
    assert g.dx.shape == x.shape and g.dh0.shape == h0.shape
    names = [(i, k) for i, lp in enumerate(params) for k in lp.arrays()]

    def loss_at(vals):
        p = Network(params.topology, [
            cgru.LayerParams(**{k: vals[2 + names.index((i, k))] for k in lp.arrays()})
            for i, lp in enumerate(params)], params.cell)
        out = cgru.forward(p, vals[0], vals[1], **{**kw, "num_threads": 1})
        return _loss(out.y, out.hy, dy, dhy)

    inputs = [x, h0] + [getattr(params[i], k) for i, k in names]
    grads = [g.dx, g.dh0] + [getattr(g.dparams[i], k) for i, k in names]
    rng = np.random.default_rng(c["data"] + 1)
    state = rng.bit_generator.state
    v = [rng.standard_normal(a.shape) for a in inputs]  # the direction the check draws
    rng.bit_generator.state = state

    def sides_at(s):
        vals = [a + s * d for a, d in zip(inputs, v)]
        p = Network(params.topology, [
            cgru.LayerParams(**{k: vals[2 + names.index((i, k))] for k in lp.arrays()})
            for i, lp in enumerate(params)], params.cell)
        return _kink_sides(p, vals[0], vals[1], kw)

    # the differences span ±2ε along v: no kink of the loss may lie in between
    assume(all(np.array_equal(sides_at(0.0), sides_at(s)) for s in (-2e-6, 2e-6)))
    _directional_check(loss_at, grads, inputs, rng)


# Corruptions of a valid call and the argument the error must name.
_CORRUPTIONS = ("lengths_range", "lengths_count", "lengths_float", "h0_shape", "x_features",
                "x_dtype", "dropout", "mask_shape", "dy_shape", "dhy_layers", "reserve_size",
                "num_threads")


@fuzz(120)
@given(c=core_cases(), what=st.sampled_from(_CORRUPTIONS), k=st.integers(1, 3),
       bad=st.sampled_from((-1e-9, 1.0, 1.5, -0.5, float("nan"), float("inf"))))
def test_core_bad_input_raises_a_documented_error(c, what, k, bad):
    params, x, h0, mask, dy, dhy = _core_arrays(c)
    c = dict(c, training=True)
    kw = _forward_kw(c, mask)
    T, N, topo = c["T"], c["N"], c["topo"]
    reserve = cgru.forward(params, x, h0, **kw).reserve
    bw = dict(state_mask=mask, batch_major=c["batch_major"])
    fw_call = lambda **over: cgru.forward(params, over.pop("x", x), over.pop("h0", h0),
                                          **{**kw, **over})
    bw_call = lambda **over: cgru.backward(params, x, over.pop("reserve", reserve),
                                           over.pop("dy", dy), over.pop("dhy", dhy),
                                           **{**bw, **over})
    other = np.float32 if c["dtype"] == np.float64 else np.float64
    if what == "lengths_range":
        lengths = np.full(N, T)
        lengths[k % N] = T + k if k % 2 else -k
        name, exc, call = "lengths", ValueError, lambda: fw_call(lengths=lengths)
    elif what == "lengths_count":
        name, exc, call = "lengths", ValueError, lambda: fw_call(lengths=np.full(N + k, T))
    elif what == "lengths_float":
        name, exc, call = "lengths", TypeError, lambda: fw_call(lengths=np.full(N, float(T)))
    elif what == "h0_shape":
        shape = [topo.num_layer_directions, N, topo.hidden_size]
        shape[k - 1] += k
        name, exc, call = "h0", ValueError, lambda: fw_call(h0=np.zeros(shape, c["dtype"]))
    elif what == "x_features":
        xb = np.concatenate([x] + [x[..., :1]] * k, axis=2)
        name, exc, call = "x", ValueError, lambda: fw_call(x=xb)
    elif what == "x_dtype":
        name, exc, call = "x", TypeError, lambda: fw_call(x=x.astype(other))
    elif what == "dropout":
        name, exc, call = "dropout", ValueError, lambda: fw_call(dropout=bad)
        if 0.0 <= bad < 1.0:
            return
    elif what == "mask_shape":
        m = np.ones((T + k, N, topo.output_size), c["dtype"])
        name, exc, call = "state_mask", ValueError, lambda: fw_call(state_mask=m)
    elif what == "dy_shape":
        name, exc, call = "dy", ValueError, lambda: bw_call(dy=np.concatenate([dy] * (k + 1)))
    elif what == "dhy_layers":
        name, exc, call = "dhy", ValueError, lambda: bw_call(dhy=np.concatenate([dhy] * (k + 1)))
    elif what == "reserve_size":
        name, exc, call = "reserve", ValueError, lambda: bw_call(reserve=reserve[:-8 * k])
    else:
        name, exc, call = "num_threads", ValueError, lambda: fw_call(num_threads=0)
    with pytest.raises(exc) as info:
        call()
    assert str(info.value).startswith(name + ":"), str(info.value)


# --- per-system NumPy references ------------------------------------------------------------------
def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _onnx_act(name, alpha, beta):
    """An ONNX activation function (operator definitions), alpha/beta given explicitly."""
    return {
        "Relu": lambda x: np.maximum(x, 0), "Tanh": np.tanh,
        "Sigmoid": _sigmoid,
        "Affine": lambda x: alpha * x + beta,
        "LeakyRelu": lambda x: np.where(x >= 0, x, alpha * x),
        "ThresholdedRelu": lambda x: np.where(x > alpha, x, 0),
        "ScaledTanh": lambda x: alpha * np.tanh(beta * x),
        "HardSigmoid": lambda x: np.clip(alpha * x + beta, 0, 1),
        "Elu": lambda x: np.where(x >= 0, x, alpha * (np.exp(np.minimum(x, 0)) - 1)),
        "Softsign": lambda x: x / (1 + np.abs(x)),
        "Softplus": lambda x: np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0),
        "none": lambda x: x,
    }[name]


def _direction(xp, h0, R, rb, f_r, f_z, g, *, reset_after, flip=False, clip=None,
               reverse=False, lengths=None, mask=None):
    """One direction of a GRU in named gates, float64.

    ``xp[k]`` ``[T, N, H]``: the input pre-activation of gate ``k`` in ``"r", "z", "n"``,
    input biases included; ``R[k]`` ``[H, H]``; ``rb[k]`` ``[H]`` the biases added to the
    recurrent term (inside the reset product for ``n`` with ``reset_after``); ``mask``
    ``[T, N, H]`` multiplies ``h`` where it enters a recurrent product at the step producing
    output ``t``.  Rows ``t ≥ lengths[b]`` are skipped and output 0.  Returns ``y`` ``[T, N, H]``
    and the final state ``[N, H]``."""
    T, N, H = xp["r"].shape
    c = (lambda a: a) if clip is None else (lambda a: np.clip(a, -clip, clip))
    lengths = np.full(N, T) if lengths is None else np.asarray(lengths)
    h = h0.astype(np.float64).copy()
    y = np.zeros((T, N, H))
    for t in (range(T - 1, -1, -1) if reverse else range(T)):
        m = 1.0 if mask is None else mask[t]
        hm = h * m
        r = f_r(c(xp["r"][t] + hm @ R["r"].T + rb["r"]))
        z = f_z(c(xp["z"][t] + hm @ R["z"].T + rb["z"]))
        if reset_after:
            n = g(c(xp["n"][t] + r * (hm @ R["n"].T + rb["n"])))
        else:
            n = g(c(xp["n"][t] + (r * hm) @ R["n"].T + rb["n"]))
        new = z * n + (1 - z) * h if flip else (1 - z) * n + z * h
        active = (t < lengths)[:, None]
        h = np.where(active, new, h)
        y[t] = np.where(active, new, 0.0)
    return y, h


def _split(a, H, order, axis=0):
    """``{gate: block}`` of ``a`` whose ``H``-blocks along ``axis`` are in ``order``."""
    return {k: np.take(a, range(j * H, (j + 1) * H), axis=axis) for j, k in enumerate(order)}


# --- ONNX ---------------------------------------------------------------------------------------
_ONNX_NAMES = ("Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu",
               "ScaledTanh", "HardSigmoid", "Elu", "Softsign", "Softplus")
_ONNX_AB = {"Affine": (True, True), "LeakyRelu": (True, False), "ThresholdedRelu": (True, False),
            "ScaledTanh": (True, True), "HardSigmoid": (True, True), "Elu": (True, False)}


@st.composite
def onnx_cases(draw):
    dtype = draw(DTYPES)
    T, N, I, H = (draw(st.integers(1, 6)), draw(st.integers(1, 5)), draw(st.integers(1, 5)),
                  draw(st.integers(1, 4)))
    direction = draw(st.sampled_from(("forward", "reverse", "bidirectional")))
    D = 2 if direction == "bidirectional" else 1
    names = draw(st.one_of(st.none(), st.lists(
        st.sampled_from([n for n in _ONNX_NAMES if dtype == np.float64
                         or n != "ThresholdedRelu"]), min_size=2 * D, max_size=2 * D)))
    alphas, betas = [], []
    for n in names or ():
        ta, tb = _ONNX_AB.get(n, (False, False))
        if ta:
            alphas.append(draw(st.floats(0.1, 1.0)))
        if tb:
            betas.append(draw(st.floats(0.1, 1.0)))
    return dict(dtype=dtype, T=T, N=N, I=I, H=H, direction=direction, D=D,
                lbr=draw(st.sampled_from((0, 1))), activations=names,
                alphas=alphas, betas=betas,
                case=draw(st.sampled_from(("Sigmoid", "sigmoid", "SIGMOID"))),
                clip=draw(st.one_of(st.none(), st.floats(0.3, 3.0))),
                layout=draw(st.sampled_from((0, 1))), B=draw(st.booleans()),
                initial_h=draw(st.booleans()),
                lens=draw(st.one_of(st.none(), st.lists(st.integers(0, T), min_size=N,
                                                          max_size=N))),
                data=draw(SEEDS))


def _onnx_reference(c, X, W, R, B, lens, h0):
    """ONNX GRU (operator definition; sequence_lens as onnxruntime), time-major float64."""
    T, N, H, D = c["T"], c["N"], c["H"], c["D"]
    names = c["activations"] or ["Sigmoid", "Tanh"] * D
    alphas, betas = list(c["alphas"]), list(c["betas"])
    defaults = {"Affine": (1.0, 0.0), "LeakyRelu": (0.01, 0.0), "ThresholdedRelu": (1.0, 0.0),
                "ScaledTanh": (1.0, 1.0), "HardSigmoid": (0.2, 0.5), "Elu": (1.0, 0.0)}
    fs = []
    for n in names:
        ta, tb = _ONNX_AB.get(n, (False, False))
        da, db = defaults.get(n, (0.0, 0.0))
        fs.append(_onnx_act(n, alphas.pop(0) if ta else da, betas.pop(0) if tb else db))
    Y = np.zeros((T, D, N, H))
    Y_h = np.zeros((D, N, H))
    for d in range(D):
        Wd, Rd = _split(W[d], H, "zrn"), _split(R[d], H, "zrn")
        Wb = _split(B[d][:3 * H], H, "zrn")
        Rb = _split(B[d][3 * H:], H, "zrn")
        xp = {k: X @ Wd[k].T + Wb[k] for k in "rzn"}
        rb = dict(Rb)
        y, h = _direction(xp, h0[d], Rd, rb, fs[2 * d], fs[2 * d], fs[2 * d + 1],
                          reset_after=bool(c["lbr"]), clip=c["clip"],
                          reverse=d == 1 or c["direction"] == "reverse", lengths=lens)
        Y[:, d] = y
        Y_h[d] = h
    if lens is not None:
        Y_h[:, np.asarray(lens) == 0] = 0
    return Y, Y_h


@fuzz(80)
@given(c=onnx_cases())
def test_onnx_gru_equals_the_operator_definition(c):
    rng = np.random.default_rng(c["data"])
    T, N, I, H, D, dt = c["T"], c["N"], c["I"], c["H"], c["D"], c["dtype"]
    u = lambda *s: rng.uniform(-0.8, 0.8, s)
    X, W, R = rng.standard_normal((T, N, I)), u(D, 3 * H, I), u(D, 3 * H, H)
    B, h0 = u(D, 6 * H), rng.standard_normal((D, N, H))
    names = c["activations"]
    if names:
        names = [c["case"] if n == "Sigmoid" else n for n in names]
    kw = dict(hidden_size=H, direction=c["direction"], linear_before_reset=c["lbr"],
              activations=names, activation_alpha=c["alphas"] or None,
              activation_beta=c["betas"] or None, clip=c["clip"], layout=c["layout"])
    lens = None if c["lens"] is None else np.array(c["lens"], np.int32)
    Xin = X.transpose(1, 0, 2) if c["layout"] else X
    h_in = h0.transpose(1, 0, 2) if c["layout"] else h0
    Y, Y_h = connx.gru(Xin.astype(dt), W.astype(dt), R.astype(dt),
                       B.astype(dt) if c["B"] else None, lens,
                       h_in.astype(dt) if c["initial_h"] else None, **kw)
    cast = lambda a: a.astype(dt).astype(np.float64)          # the reference sees dt's values
    Yr, Yhr = _onnx_reference(c, cast(X), cast(W), cast(R),
                              cast(B) if c["B"] else np.zeros((D, 6 * H)), lens,
                              cast(h0) if c["initial_h"] else np.zeros((D, N, H)))
    if c["layout"]:
        Yr, Yhr = Yr.transpose(2, 0, 1, 3), Yhr.transpose(1, 0, 2)
    assert Y.dtype == dt and Y.shape == Yr.shape and Y_h.shape == Yhr.shape
    _assume_in_range(dt, Yr, Yhr)      # (unbounded activations: float32 overflows, NaN vs inf)
    np.testing.assert_allclose(Y, Yr, **_tol(dt, Yr))
    np.testing.assert_allclose(Y_h, Yhr, **_tol(dt, Yhr))


# --- MPSGraph -----------------------------------------------------------------------------------
_MPS_ACTS = {"none": lambda x: x, "relu": lambda x: np.maximum(x, 0), "tanh": np.tanh,
             "sigmoid": _sigmoid,
             "hard_sigmoid": lambda x: np.clip(0.2 * x + 0.5, 0, 1)}


@st.composite
def mps_cases(draw, dtype=None, smooth=False):
    acts = list(_MPS_ACTS)
    desc = dict(reverse=draw(st.booleans()), bidirectional=draw(st.booleans()),
                training=True, reset_gate_first=draw(st.booleans()),
                reset_after=draw(st.booleans()), flip_z=draw(st.booleans()),
                update_gate_activation=draw(st.sampled_from(acts)),
                reset_gate_activation=draw(st.sampled_from(acts)),
                output_gate_activation=draw(st.sampled_from(acts)))
    present = draw(st.sets(st.sampled_from(("input_weight", "bias", "init_state", "mask",
                                            "secondary_bias"))))
    return dict(dtype=draw(DTYPES) if dtype is None else dtype, desc=desc, present=present,
                T=draw(st.integers(1, 6)), N=draw(st.integers(1, 5)), I=draw(st.integers(1, 5)),
                H=draw(st.integers(1, 4)), state_gradient=draw(st.booleans()),
                mask_shape=draw(st.sampled_from(("full", "no_time", "one_row", "bool"))),
                data=draw(SEEDS))


def _mps_inputs(c):
    rng = np.random.default_rng(c["data"])
    T, N, I, H, dt = c["T"], c["N"], c["I"], c["H"], c["dtype"]
    D = 2 if c["desc"]["bidirectional"] else 1
    u = lambda *s: rng.uniform(-0.8, 0.8, s).astype(dt)
    p = c["present"]
    a = {"source": rng.standard_normal((T, N, I if "input_weight" in p else D * 3 * H))
         .astype(dt), "recurrent_weight": u(3 * H, H) if D == 1 else u(2, 3 * H, H)}
    if "input_weight" in p:
        a["input_weight"] = u(D * 3 * H, I)
    if "bias" in p:
        a["bias"] = u(D * 3 * H)
    if "init_state" in p:
        a["init_state"] = u(N, D * H)
    if "mask" in p:
        shape = {"full": (T, N, D * H), "no_time": (N, D * H), "one_row": (T, 1, D * H),
                 "bool": (T, N, D * H)}[c["mask_shape"]]
        m = rng.uniform(0.0, 1.5, shape)
        a["mask"] = (m > 0.4) if c["mask_shape"] == "bool" else m.astype(dt)
    if "secondary_bias" in p and c["desc"]["reset_after"]:
        a["secondary_bias"] = u(D * H)
    return a


def _mps_reference(desc, a, T, N, H):
    """MPSGraph GRU per its header comment (gate order z, r, o or r, z, o), float64."""
    D = 2 if desc["bidirectional"] else 1
    order = "rzn" if desc["reset_gate_first"] else "zrn"
    f = {k: _MPS_ACTS[desc[k]] for k in ("update_gate_activation", "reset_gate_activation",
                                         "output_gate_activation")}
    m = None if "mask" not in a else np.broadcast_to(a["mask"], (T, N, D * H)).astype(np.float64)
    y = np.zeros((T, N, D * H))
    src = a["source"].astype(np.float64)
    for d in range(D):
        R = a["recurrent_weight"] if D == 1 else a["recurrent_weight"][d]
        b = a.get("bias", np.zeros(D * 3 * H))[d * 3 * H:(d + 1) * 3 * H]
        if "input_weight" in a:
            xw = src @ a["input_weight"][d * 3 * H:(d + 1) * 3 * H].T
        else:
            xw = src[..., d * 3 * H:(d + 1) * 3 * H]
        xp = {k: v + _split(b, H, order)[k] for k, v in _split(xw, H, order, axis=2).items()}
        rb = {"r": 0.0, "z": 0.0,
              "n": a["secondary_bias"][d * H:(d + 1) * H] if "secondary_bias" in a else 0.0}
        h0 = a["init_state"][:, d * H:(d + 1) * H] if "init_state" in a else np.zeros((N, H))
        yd, _ = _direction(xp, h0, _split(np.asarray(R, np.float64), H, order), rb,
                           f["reset_gate_activation"], f["update_gate_activation"],
                           f["output_gate_activation"], reset_after=desc["reset_after"],
                           flip=desc["flip_z"],
                           reverse=d == 1 or (desc["reverse"] and D == 1),
                           mask=None if m is None else m[..., d * H:(d + 1) * H])
        y[..., d * H:(d + 1) * H] = yd
    return y


@fuzz(80)
@given(c=mps_cases())
def test_mps_gru_equals_the_documented_equations(c):
    a = _mps_inputs(c)
    out, z_state = mps.gru(descriptor=mps.GRUDescriptor(**c["desc"]), **a)
    D = 2 if c["desc"]["bidirectional"] else 1
    ref = _mps_reference(c["desc"], {k: np.asarray(v, np.float64) if v.dtype != bool else v
                                     for k, v in a.items()}, c["T"], c["N"], c["H"])
    assert out.dtype == c["dtype"] and z_state.shape == (c["T"], c["N"], D * 3 * c["H"])
    _assume_in_range(c["dtype"], ref)
    np.testing.assert_allclose(out, ref, **_tol(c["dtype"], ref))


@fuzz(60)
@given(c=mps_cases(dtype=np.float64))
def test_mps_gradients_equal_directional_differences(c):
    a = _mps_inputs(c)
    desc = mps.GRUDescriptor(**c["desc"])
    out, z_state = mps.gru(descriptor=desc, **a)
    rng = np.random.default_rng(c["data"] + 1)
    D = 2 if c["desc"]["bidirectional"] else 1
    dy = rng.standard_normal(out.shape)
    dhy = rng.standard_normal((c["N"], D * c["H"])) if c["state_gradient"] else None
    opt = {k: v for k, v in a.items() if k not in ("source", "recurrent_weight")}
    grads = mps.gru_gradients(a["source"], a["recurrent_weight"], dy, z_state, out,
                              state_gradient=dhy, descriptor=desc, **opt)
    names = ["source", "recurrent_weight"] + [k for k in ("input_weight", "bias", "init_state",
                                                          "secondary_bias") if k in a]
    assert len(grads) == len(names)

    def final_states(y):
        """[N, D·H]: the forward direction's state after the last step, the reverse one's
        after its last step (original time 0)."""
        H = c["H"]
        last = [0 if (d == 1 or c["desc"]["reverse"] and D == 1) else -1 for d in range(D)]
        return np.concatenate([y[last[d], :, d * H:(d + 1) * H] for d in range(D)], axis=1)

    def loss_at(vals):
        b = dict(a, **dict(zip(names, vals)))
        (y,) = mps.gru(descriptor=mps.GRUDescriptor(**{**c["desc"], "training": False}), **b)
        return _loss(y, final_states(y), dy, 0 if dhy is None else dhy)

    _directional_check(loss_at, grads, [a[k] for k in names], rng)


# --- TF / cuDNN ---------------------------------------------------------------------------------
@st.composite
def tf_cases(draw, dtype=None):
    H = draw(st.integers(1, 4))
    mode = draw(st.sampled_from(("linear_input", "skip_input", "auto_select")))
    I = H if mode == "skip_input" else draw(st.integers(1, 5))
    L = draw(st.integers(1, 2))
    N, T = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    return dict(dtype=draw(DTYPES) if dtype is None else dtype, T=T, N=N, I=I, H=H, L=L,
                mode=mode, bidirectional=draw(st.booleans()), time_major=draw(st.booleans()),
                lengths=draw(st.one_of(st.none(), st.lists(st.integers(0, T), min_size=N,
                                                             max_size=N))),
                dropout=draw(st.sampled_from((0.0, 0.0, 0.4))) if L > 1 else 0.0,
                seeds=(draw(st.integers(0, 99)), draw(st.integers(0, 99))), data=draw(SEEDS))


def _tf_unpack(flat, L, D, H, I, skip):
    """The opaque buffer as ``[(W, R, b_W, b_R)]`` per pseudo-layer (docs/semantics.md §8.1):
    every matrix of pseudo-layer 0 (linLayerIDs 0…5, each [H, width] row-major), then
    pseudo-layer 1, …; then every bias in the same order.  Gates r, z, n."""
    pos, mats = 0, []
    for i in range(L * D):
        width = 0 if (i < D and skip) else (I if i < D else D * H)
        ws = []
        for k in range(6):
            w = width if k < 3 else H
            ws.append(flat[pos:pos + H * w].reshape(H, w))
            pos += H * w
        mats.append(ws)
    out = []
    for i in range(L * D):
        bs = [flat[pos + k * H:pos + (k + 1) * H] for k in range(6)]
        pos += 6 * H
        out.append((mats[i], bs))
    assert pos == flat.size
    return out


def _tf_reference(c, x, h0, flat):
    """cuDNN GRU over the opaque buffer, time-major float64: ``(y [T, N, D·H], hy [L·D, N, H])``."""
    T, N, I, H, L = c["T"], c["N"], c["I"], c["H"], c["L"]
    D = 2 if c["bidirectional"] else 1
    skip = c["mode"] == "skip_input" or (c["mode"] == "auto_select" and I == H)
    layers = _tf_unpack(flat, L, D, H, I, skip)
    drop = None
    if c["dropout"]:
        drop = cgru.dropout_masks(Topology(I, H, L, "bidirectional" if D == 2 else "forward"),
                                  T, N, dropout=c["dropout"], seed=c["seeds"],
                                  dtype=np.float64)
    sig = _sigmoid
    inp, hy = x, np.zeros((L * D, N, H))
    for l in range(L):
        out = np.zeros((T, N, D * H))
        for d in range(D):
            ws, bs = layers[l * D + d]
            proj = [inp if (l == 0 and skip) else inp @ ws[k].T for k in range(3)]
            xp = {g: proj[k] + bs[k] for k, g in enumerate("rzn")}
            R = {g: ws[3 + k] for k, g in enumerate("rzn")}
            rb = {g: bs[3 + k] for k, g in enumerate("rzn")}
            y, h = _direction(xp, h0[l * D + d], R, rb, sig, sig, np.tanh, reset_after=True,
                              reverse=d == 1, lengths=c["lengths"])
            out[..., d * H:(d + 1) * H] = y
            hy[l * D + d] = h
        inp = out if l == L - 1 or drop is None else out * drop[l]
    return out, hy


def _tf_arrays(c):
    rng = np.random.default_rng(c["data"])
    D = 2 if c["bidirectional"] else 1
    n = tf.params_size(c["L"], c["H"], c["I"], input_mode=c["mode"], rnn_mode="gru",
                       direction="bidirectional" if D == 2 else "unidirectional")
    x = rng.standard_normal((c["T"], c["N"], c["I"]))
    h0 = rng.standard_normal((c["L"] * D, c["N"], c["H"]))
    return x, h0, rng.uniform(-0.8, 0.8, n)


def _tf_attrs(c):
    return dict(rnn_mode="gru", input_mode=c["mode"], dropout=c["dropout"], seed=c["seeds"][0],
                seed2=c["seeds"][1],
                direction="bidirectional" if c["bidirectional"] else "unidirectional",
                time_major=c["time_major"])


def _tf_layout(c, x, h0):
    """time-major x [T, N, I], h0 [L·D, N, H] in the call's layout."""
    if c["time_major"]:
        return x, h0
    return np.ascontiguousarray(x.transpose(1, 0, 2)), np.ascontiguousarray(h0.transpose(1, 0, 2))


@fuzz(80)
@given(c=tf_cases())
def test_tf_cudnn_rnn_v3_equals_cudnn_over_the_opaque_buffer(c):
    x, h0, flat = _tf_arrays(c)
    dt = c["dtype"]
    xin, hin = _tf_layout(c, x.astype(dt), h0.astype(dt))
    lengths = None if c["lengths"] is None else np.array(c["lengths"])
    f = tf.cudnn_rnn_v3(xin, hin, None, flat.astype(dt), lengths, is_training=True,
                        **_tf_attrs(c))
    cast = lambda a: a.astype(dt).astype(np.float64)
    y, hy = _tf_reference(c, cast(x), cast(h0), cast(flat))
    if not c["time_major"]:
        y, hy = y.transpose(1, 0, 2), hy.transpose(1, 0, 2)
    assert f.output.dtype == dt and f.output.shape == y.shape
    np.testing.assert_allclose(f.output, y, **_tol(dt, y))
    np.testing.assert_allclose(f.output_h, hy, **_tol(dt, hy))


@fuzz(60)
@given(c=tf_cases(dtype=np.float64))
def test_tf_backprop_v3_equals_directional_differences(c):
    x, h0, flat = _tf_arrays(c)
    xin, hin = _tf_layout(c, x, h0)
    lengths = None if c["lengths"] is None else np.array(c["lengths"])
    attrs = _tf_attrs(c)
    f = tf.cudnn_rnn_v3(xin, hin, None, flat, lengths, is_training=True, **attrs)
    rng = np.random.default_rng(c["data"] + 1)
    dy, dhy = rng.standard_normal(f.output.shape), rng.standard_normal(f.output_h.shape)
    g = tf.cudnn_rnn_backprop_v3(xin, hin, None, flat, lengths, f.output, f.output_h, None, dy,
                                 dhy, None, f.reserve_space, f.host_reserved, **attrs)

    def loss_at(vals):
        o = tf.cudnn_rnn_v3(vals[0], vals[1], None, vals[2], lengths, is_training=True, **attrs)
        return _loss(o.output, o.output_h, dy, dhy)

    _directional_check(loss_at, [g.input_backprop, g.input_h_backprop, g.params_backprop],
                       [xin, hin, flat], rng)


# --- Arraymancer ----------------------------------------------------------------------------------
@st.composite
def am_cases(draw, dtype=None):
    return dict(dtype=draw(DTYPES) if dtype is None else dtype, T=draw(st.integers(1, 6)),
                N=draw(st.integers(1, 5)), I=draw(st.integers(1, 5)), H=draw(st.integers(1, 4)),
                L=draw(st.integers(1, 3)), data=draw(SEEDS))


def _am_arrays(c):
    rng = np.random.default_rng(c["data"])
    T, N, I, H, L, dt = c["T"], c["N"], c["I"], c["H"], c["L"], c["dtype"]
    u = lambda *s: rng.uniform(-0.8, 0.8, s).astype(dt)
    return [rng.standard_normal((T, N, I)).astype(dt), u(L, N, H), u(3 * H, I),
            u(L - 1, 3 * H, H), u(L, 3 * H, H), u(L, 1, 3 * H), u(L, 1, 3 * H)]


def _am_reference(args):
    """Arraymancer's stacked GRU (nnp_gru.nim: gates r, z, n; n = tanh(W_n·x + bW_n + r ⊙
    (U_n·h + bU_n)); h' = (1 − z)·n + z·h), float64."""
    x, h0, W3s0, W3sN, U3s, bW3s, bU3s = [np.asarray(a, np.float64) for a in args]
    H = U3s.shape[2]
    sig = _sigmoid
    hy = np.zeros_like(h0)
    for l in range(U3s.shape[0]):
        W = W3s0 if l == 0 else W3sN[l - 1]
        Wg, bW = _split(W, H, "rzn"), _split(bW3s[l, 0], H, "rzn")
        xp = {k: x @ Wg[k].T + bW[k] for k in "rzn"}
        x, hy[l] = _direction(xp, h0[l], _split(U3s[l], H, "rzn"), _split(bU3s[l, 0], H, "rzn"),
                              sig, sig, np.tanh, reset_after=True)
    return x, hy


@fuzz(60)
@given(c=am_cases())
def test_arraymancer_gru_equals_its_equations(c):
    args = _am_arrays(c)
    y, hy = am.gru(*args)
    yr, hyr = _am_reference(args)
    assert y.dtype == c["dtype"]
    _assume_in_range(c["dtype"], yr, hyr)
    np.testing.assert_allclose(y, yr, **_tol(c["dtype"], yr))
    np.testing.assert_allclose(hy, hyr, **_tol(c["dtype"], hyr))


@fuzz(40)
@given(c=am_cases(dtype=np.float64))
def test_arraymancer_backward_equals_directional_differences(c):
    args = _am_arrays(c)
    y, hy, cache = am.gru_forward(*args)
    rng = np.random.default_rng(c["data"] + 1)
    dy, dhy = rng.standard_normal(y.shape), rng.standard_normal(hy.shape)
    grads = am.gru_backward(dy, dhy, cache)
    assert [g.shape for g in grads] == [a.shape for a in args]
    _directional_check(lambda vals: _loss(*am.gru(*vals), dy, dhy), list(grads), args, rng)
