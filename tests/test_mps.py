"""cgru.mps: MPSGraph's GRU / GRUGradients against MPSGraph's documented equations (an
independent NumPy implementation written here, in MPSGraph's own gate order), against
cgru.reference, against float64 central finite differences, and against torch.nn.GRU in the
PyTorch-equivalent configuration."""
import itertools

import numpy as np
import pytest

import cgru
from cgru._kernels import gru as gru_kernels
from cgru import mps
from cgru.core import reference
from cgru.core.cells import Cell
from cgru.core.network import LayerParams, Network, Topology

T, N, I, H = 3, 2, 3, 2
FLAGS = ("reverse", "bidirectional", "reset_gate_first", "reset_after", "flip_z")
OPTIONAL = ("input_weight", "bias", "init_state", "mask", "secondary_bias")


# --- MPSGraph's documented equations, in its own gate order -----------------------------------
def _act(name, x):
    if name == "none":
        return x
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "tanh":
        return np.tanh(x)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if name == "hard_sigmoid":
        return np.clip(0.2 * x + 0.5, 0.0, 1.0)
    raise AssertionError(name)


def mps_equations(desc, source, recurrent_weight, input_weight=None, bias=None,
                  init_state=None, mask=None, secondary_bias=None):
    """``(output [T, N, D·H], gates [T, N, D·3H])`` per the header's GRU comment; ``gates``
    are the activated r, z, o of the step producing output[t], canonical order per direction.
    """
    T_, N_, _ = source.shape
    H_ = recurrent_weight.shape[-1]
    D = 2 if desc.bidirectional else 1
    order = ("r", "z", "o") if desc.reset_gate_first else ("z", "r", "o")
    sl = {g: slice(k * H_, (k + 1) * H_) for k, g in enumerate(order)}
    m = np.ones((T_, N_, D * H_)) if mask is None else \
        np.broadcast_to(mask.astype(source.dtype), (T_, N_, D * H_))
    y = np.zeros((T_, N_, D * H_), source.dtype)
    gates = np.zeros((T_, N_, D * 3 * H_), source.dtype)
    for d in range(D):
        R = recurrent_weight if D == 1 else recurrent_weight[d]
        W = None if input_weight is None else input_weight[d * 3 * H_:(d + 1) * 3 * H_]
        b = np.zeros(3 * H_) if bias is None else bias[d * 3 * H_:(d + 1) * 3 * H_]
        b2 = np.zeros(H_) if secondary_bias is None else secondary_bias[d * H_:(d + 1) * H_]
        h = np.zeros((N_, H_)) if init_state is None else init_state[:, d * H_:(d + 1) * H_]
        backwards = d == 1 or (desc.reverse and not desc.bidirectional)
        for t in (range(T_ - 1, -1, -1) if backwards else range(T_)):
            xw = source[t, :, d * 3 * H_:(d + 1) * 3 * H_] if W is None else source[t] @ W.T
            mt = m[t, :, d * H_:(d + 1) * H_]
            z = _act(desc.update_gate_activation,
                     (h * mt) @ R[sl["z"]].T + xw[:, sl["z"]] + b[sl["z"]])
            r = _act(desc.reset_gate_activation,
                     (h * mt) @ R[sl["r"]].T + xw[:, sl["r"]] + b[sl["r"]])
            if desc.reset_after:
                c = ((h * mt) @ R[sl["o"]].T + b2) * r
            else:
                c = (h * r * mt) @ R[sl["o"]].T
            o = _act(desc.output_gate_activation, c + xw[:, sl["o"]] + b[sl["o"]])
            h = (1 - z) * h + z * o if desc.flip_z else z * h + (1 - z) * o
            y[t, :, d * H_:(d + 1) * H_] = h
            gates[t, :, d * 3 * H_:(d + 1) * 3 * H_] = np.concatenate([r, z, o], axis=1)
    return y, gates


# --- the same op through cgru.reference (canonical params built here, not by cgru.convert) ----
_CGRU_ACT = {"none": "identity", "relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid",
             "hard_sigmoid": "hard_sigmoid"}


def _to_rzn(a, H_, reset_gate_first, axis=0):
    """Blocks of H along ``axis`` from the descriptor's gate order to r, z, n."""
    blocks = np.split(a, 3, axis=axis)
    return blocks if reset_gate_first else [blocks[1], blocks[0], blocks[2]]


def via_cgru_reference(desc, source, recurrent_weight, input_weight=None, bias=None,
                       init_state=None, mask=None, secondary_bias=None):
    H_ = recurrent_weight.shape[-1]
    D = 2 if desc.bidirectional else 1
    dt = source.dtype
    rgf = desc.reset_gate_first
    direction = "bidirectional" if D == 2 else ("reverse" if desc.reverse else "forward")
    layers = []
    x = source
    xs = []
    for d in range(D):
        R = recurrent_weight if D == 1 else recurrent_weight[d]
        b = np.zeros(3 * H_, dt) if bias is None else bias[d * 3 * H_:(d + 1) * 3 * H_]
        b_R = np.zeros(3 * H_, dt)
        if secondary_bias is not None:
            b_R[2 * H_:] = secondary_bias[d * H_:(d + 1) * H_]
        if input_weight is None:
            W = np.zeros((3 * H_, 0), dt)
            xs.append(np.concatenate(_to_rzn(source[..., d * 3 * H_:(d + 1) * 3 * H_], H_, rgf,
                                             axis=-1), axis=-1))
        else:
            W = np.concatenate(_to_rzn(input_weight[d * 3 * H_:(d + 1) * 3 * H_], H_, rgf))
        layers.append(LayerParams(W, np.concatenate(_to_rzn(R, H_, rgf)),
                                  np.concatenate(_to_rzn(b, H_, rgf)), b_R))
    if input_weight is None:
        topo = Topology(D * 3 * H_, H_, 1, direction, "projected")
        x = np.concatenate(xs, axis=-1)
    else:
        topo = Topology(source.shape[-1], H_, 1, direction)
    cell = Cell(reset_after=desc.reset_after, flip_z=desc.flip_z,
                f_r=_CGRU_ACT[desc.reset_gate_activation],
                f_z=_CGRU_ACT[desc.update_gate_activation],
                g=_CGRU_ACT[desc.output_gate_activation])
    h0 = None if init_state is None else \
        init_state.reshape(source.shape[1], D, H_).transpose(1, 0, 2)
    m = None if mask is None else mask.astype(dt)
    y, _ = reference.forward(Network(topo, layers), x, h0, cell=cell, state_mask=m)
    return y


# --- test data --------------------------------------------------------------------------------
def make_inputs(desc, present, seed, dtype=np.float64, mask_shape="full"):
    """Random inputs of the op; the optional ones only when in ``present``."""
    rng = np.random.default_rng(seed)
    D = 2 if desc.bidirectional else 1
    u = lambda *s: rng.uniform(-1, 1, s).astype(dtype)
    projected = "input_weight" not in present
    a = {"source": u(T, N, D * 3 * H if projected else I),
         "recurrent_weight": u(3 * H, H) if D == 1 else u(2, 3 * H, H)}
    if "input_weight" in present:
        a["input_weight"] = u(D * 3 * H, I)
    if "bias" in present:
        a["bias"] = u(D * 3 * H)
    if "init_state" in present:
        a["init_state"] = u(N, D * H)
    if "mask" in present:
        shape = {"full": (T, N, D * H), "no_time": (N, D * H), "one_row": (T, 1, D * H)}
        a["mask"] = rng.uniform(0.0, 1.5, shape[mask_shape]).astype(dtype)
    if "secondary_bias" in present and desc.reset_after:
        a["secondary_bias"] = u(D * H)
    return a


def _flag_cases():
    """Every flag combination × three optional-input sets (all, none, and a mixed set that
    alternates with the combination), so every optional input is present and absent at least
    once per combination."""
    cases = []
    for k, flags in enumerate(itertools.product((False, True), repeat=len(FLAGS))):
        mixed = OPTIONAL[0::2] if k % 2 else OPTIONAL[1::2]
        for label, present in (("all", OPTIONAL), ("none", ()), ("mixed", mixed)):
            ident = "-".join(f for f, v in zip(FLAGS, flags) if v) or "defaults"
            cases.append(pytest.param(dict(zip(FLAGS, flags)), present, k,
                                      id=f"{ident}-{label}"))
    return cases


FLAG_CASES = _flag_cases()


# --- forward ----------------------------------------------------------------------------------
@pytest.mark.parametrize("flags,present,k", FLAG_CASES)
def test_forward_matches_documented_equations_and_reference(flags, present, k, poison):
    """(``poison``: every engine buffer starts as NaN, so an unwritten element fails.)"""
    desc = mps.GRUDescriptor(training=True, **flags)
    a = make_inputs(desc, present, seed=k, mask_shape=("full", "no_time", "one_row")[k % 3])
    y, z_state = mps.gru(**a, descriptor=desc)
    want_y, want_gates = mps_equations(desc, **a)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    # z_state: the activated gates, canonical r, z, n per direction, at output time
    np.testing.assert_allclose(z_state, want_gates, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(y, via_cgru_reference(desc, **a), rtol=1e-12, atol=1e-12)
    # inference returns the output alone, the same values
    (y_inf,) = mps.gru(**a, descriptor=mps.GRUDescriptor(**flags))
    np.testing.assert_array_equal(y_inf, y)


# --- gradients --------------------------------------------------------------------------------
GRAD_ORDER = ("source", "recurrent_weight", "input_weight", "bias", "init_state",
              "secondary_bias")


def _jacobians(desc, a, eps=1e-6):
    """``{name: dy/d(name)}`` as ``[*name.shape, T, N, D·H]`` by central differences."""
    inference = mps.GRUDescriptor(**{**desc.__dict__, "training": False})
    jac = {}
    for name in GRAD_ORDER:
        if name not in a:
            continue
        base = a[name]
        cols = []
        for idx in np.ndindex(base.shape):
            plus, minus = base.copy(), base.copy()
            plus[idx] += eps
            minus[idx] -= eps
            yp = mps.gru(**{**a, name: plus}, descriptor=inference)[0]
            ym = mps.gru(**{**a, name: minus}, descriptor=inference)[0]
            cols.append((yp - ym) / (2 * eps))
        jac[name] = np.stack(cols).reshape(base.shape + cols[0].shape)
    return jac


def _final_state(desc, y):
    """``[N, D·H]`` = [fwd | bwd]: each direction's state after its last step."""
    Hh = y.shape[-1] // (2 if desc.bidirectional else 1)
    if desc.bidirectional:
        return np.concatenate([y[-1, :, :Hh], y[0, :, Hh:]], axis=1)
    return y[0] if desc.reverse else y[-1]


def _check_gradients(desc, a, rng, rtol=1e-7, atol=1e-8):
    y, z_state = mps.gru(**a, descriptor=desc)
    jac = _jacobians(desc, a)
    dy = rng.standard_normal(y.shape)
    dstate = rng.standard_normal((y.shape[1], y.shape[2]))
    given = [n for n in GRAD_ORDER if n in a]
    forward_inputs = {k: v for k, v in a.items() if k not in ("source", "recurrent_weight")}
    for label, sg, sv in (("outputs", dy, None), ("final state", None, dstate),
                          ("both", dy, dstate)):
        grads = mps.gru_gradients(a["source"], a["recurrent_weight"], sg, z_state, y,
                                  state_gradient=sv, **forward_inputs, descriptor=desc)
        assert len(grads) == len(given), label
        # the loss Σ y·dy + Σ final·dstate, differentiated through the Jacobians
        dL_dy = np.zeros_like(y) if sg is None else sg.copy()
        if sv is not None:
            probe = np.zeros_like(y)
            Hh = y.shape[-1] // (2 if desc.bidirectional else 1)
            if desc.bidirectional:
                probe[-1, :, :Hh] += sv[:, :Hh]
                probe[0, :, Hh:] += sv[:, Hh:]
            else:
                probe[0 if desc.reverse else -1] += sv
            dL_dy = dL_dy + probe
        for name, g in zip(given, grads):
            assert g.shape == a[name].shape, (label, name)
            want = np.tensordot(jac[name], dL_dy, axes=3)
            np.testing.assert_allclose(g, want, rtol=rtol, atol=atol,
                                       err_msg=f"d{name}, loss on {label}")


@pytest.mark.parametrize("flags,present,k", FLAG_CASES)
def test_gradients_match_finite_differences(flags, present, k, poison):
    desc = mps.GRUDescriptor(training=True, **flags)
    a = make_inputs(desc, present, seed=100 + k, mask_shape=("full", "one_row")[k % 2])
    _check_gradients(desc, a, np.random.default_rng(k))


def test_final_state_probe_matches_state_gradient_meaning():
    """The backward half of state_gradient is the gradient of output[0, :, H:] (bidirectional)
    — checked against a loss on that slice given as source_gradient."""
    desc = mps.GRUDescriptor(training=True, bidirectional=True, reset_after=True)
    a = make_inputs(desc, OPTIONAL, seed=7)
    y, zs = mps.gru(**a, descriptor=desc)
    rng = np.random.default_rng(3)
    sv = rng.standard_normal((N, 2 * H))
    as_output = np.zeros_like(y)
    as_output[-1, :, :H] = sv[:, :H]
    as_output[0, :, H:] = sv[:, H:]
    rest = {k: v for k, v in a.items() if k not in ("source", "recurrent_weight")}
    g1 = mps.gru_gradients(a["source"], a["recurrent_weight"], None, zs, y, state_gradient=sv,
                           **rest, descriptor=desc)
    g2 = mps.gru_gradients(a["source"], a["recurrent_weight"], as_output, zs, y, **rest,
                           descriptor=desc)
    assert any(np.abs(g).max() > 1e-3 for g in g1)
    for u, v in zip(g1, g2):
        np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-14)


def test_gradients_do_not_rerun_the_forward_time_loop(monkeypatch):
    desc = mps.GRUDescriptor(training=True, bidirectional=True, reset_after=True)
    a = make_inputs(desc, OPTIONAL, seed=8)
    y, zs = mps.gru(**a, descriptor=desc)
    want = mps.gru_gradients(a["source"], a["recurrent_weight"], np.ones_like(y), zs, y,
                             **{k: v for k, v in a.items()
                                if k not in ("source", "recurrent_weight")}, descriptor=desc)

    def refuse(*args, **kwargs):
        raise AssertionError("gru_gradients ran the forward time loop")
    monkeypatch.setattr(gru_kernels, "forward_layer", refuse)
    got = mps.gru_gradients(a["source"], a["recurrent_weight"], np.ones_like(y), zs, y,
                            **{k: v for k, v in a.items()
                               if k not in ("source", "recurrent_weight")}, descriptor=desc)
    for u, v in zip(got, want):
        np.testing.assert_array_equal(u, v)


# --- activations ------------------------------------------------------------------------------
# A Latin square: every activation on every gate (update, reset, output) once.
KINDS = mps.MPS_ACTIVATIONS
ACT_ROWS = [tuple(KINDS[(i + j) % 5] for j in range(3)) for i in range(5)]


@pytest.mark.parametrize("acts", ACT_ROWS, ids=["-".join(r) for r in ACT_ROWS])
@pytest.mark.parametrize("flags", [dict(reset_after=True, flip_z=True),
                                   dict(bidirectional=True, reset_gate_first=True),
                                   dict(reverse=True, reset_after=True)],
                         ids=["ra-flip", "bi-rgf", "rev-ra"])
def test_activation_kinds(acts, flags):
    desc = mps.GRUDescriptor(training=True, update_gate_activation=acts[0],
                             reset_gate_activation=acts[1], output_gate_activation=acts[2],
                             **flags)
    seed = ACT_ROWS.index(acts)
    a = make_inputs(desc, OPTIONAL, seed=200 + seed)
    a["source"] *= 3.0  # reach the flat parts of hard_sigmoid and relu
    y, zs = mps.gru(**a, descriptor=desc)
    want_y, want_gates = mps_equations(desc, **a)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(zs, want_gates, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(y, via_cgru_reference(desc, **a), rtol=1e-12, atol=1e-12)
    _check_gradients(desc, a, np.random.default_rng(seed))


def test_hard_sigmoid_is_0_2x_plus_0_5_clamped():
    """One step, zero weights: output = (1 − z)·o with z = hard_sigmoid(b_z)."""
    desc = mps.GRUDescriptor(update_gate_activation="hard_sigmoid",
                             output_gate_activation="none")
    src = np.zeros((1, 1, 3))
    bias = np.array([-1.0, 0.0, 2.0])            # z pre-activation −1, o = 2
    (y,) = mps.gru(src, np.zeros((3, 1)), None, bias, descriptor=desc)
    z = 0.2 * -1.0 + 0.5
    np.testing.assert_allclose(y.ravel(), [(1 - z) * 2.0], rtol=1e-15)
    bias[0] = 4.0                                 # clamped: z = 1, h' = h = 0
    (y,) = mps.gru(src, np.zeros((3, 1)), None, bias, descriptor=desc)
    assert y.ravel()[0] == 0.0


@pytest.mark.parametrize("flip_z", [False, True])
def test_flip_z_follows_the_operation_documentation(flip_z):
    """z = σ(0) = 0.5 is not informative: use z = sigmoid(large) ≈ 1 so h' picks one side."""
    desc = mps.GRUDescriptor(flip_z=flip_z, output_gate_activation="none")
    bias = np.array([40.0, 0.0, 3.0])            # z ≈ 1, o = 3 (gate order z, r, o)
    init = np.array([[-5.0]])
    (y,) = mps.gru(np.zeros((1, 1, 3)), np.zeros((3, 1)), None, bias, init, descriptor=desc)
    # flip_z=False: h' = z⊙h + (1−z)⊙o ≈ h;  flip_z=True: h' = (1−z)⊙h + z⊙o ≈ o
    np.testing.assert_allclose(y.ravel(), [3.0 if flip_z else -5.0], rtol=1e-12)


# --- options ----------------------------------------------------------------------------------
def test_reverse_is_ignored_when_bidirectional():
    flags = dict(bidirectional=True, reset_after=True, training=True)
    a = make_inputs(mps.GRUDescriptor(**flags), OPTIONAL, seed=9)
    y1, z1 = mps.gru(**a, descriptor=mps.GRUDescriptor(reverse=True, **flags))
    y2, z2 = mps.gru(**a, descriptor=mps.GRUDescriptor(**flags))
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(z1, z2)
    # and the unidirectional reverse really differs from forward
    a1 = make_inputs(mps.GRUDescriptor(), OPTIONAL, seed=9)
    f = mps.gru(**a1, descriptor=mps.GRUDescriptor())[0]
    r = mps.gru(**a1, descriptor=mps.GRUDescriptor(reverse=True))[0]
    assert np.abs(f - r).max() > 1e-3


def test_bool_mask_equals_float_mask():
    desc = mps.GRUDescriptor(bidirectional=True)
    a = make_inputs(desc, ("input_weight", "bias", "init_state"), seed=10)
    mask = np.random.default_rng(1).random((T, N, 2 * H)) > 0.4
    (yb,) = mps.gru(**a, mask=mask, descriptor=desc)
    (yf,) = mps.gru(**a, mask=mask.astype(np.float64), descriptor=desc)
    (yn,) = mps.gru(**a, descriptor=desc)
    np.testing.assert_array_equal(yb, yf)
    assert np.abs(yb - yn).max() > 1e-6


def test_float32_matches_float64():
    desc = mps.GRUDescriptor(bidirectional=True, reset_after=True, training=True)
    a = make_inputs(desc, OPTIONAL, seed=11)
    a32 = {k: v.astype(np.float32) for k, v in a.items()}
    y64, z64 = mps.gru(**a, descriptor=desc)
    y32, z32 = mps.gru(**a32, descriptor=desc)
    assert y32.dtype == np.float32 and z32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=1e-5, atol=1e-6)
    rest = {k: v for k, v in a32.items() if k not in ("source", "recurrent_weight")}
    g32 = mps.gru_gradients(a32["source"], a32["recurrent_weight"], np.ones_like(y32), z32,
                            y32, **rest, descriptor=desc)
    rest = {k: v for k, v in a.items() if k not in ("source", "recurrent_weight")}
    g64 = mps.gru_gradients(a["source"], a["recurrent_weight"], np.ones_like(y64), z64, y64,
                            **rest, descriptor=desc)
    for u, v in zip(g32, g64):
        assert u.dtype == np.float32
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-5)


# --- PyTorch-equivalent configuration --------------------------------------------------------
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pytorch_equivalent_configuration(bidirectional, dtype):
    torch = pytest.importorskip("torch")
    D = 2 if bidirectional else 1
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    torch.manual_seed(0)
    net = torch.nn.GRU(I, H, bidirectional=bidirectional, dtype=tdt)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((T, N, I)).astype(dtype)
    h0 = rng.standard_normal((D, N, H)).astype(dtype)
    dy = rng.standard_normal((T, N, D * H)).astype(dtype)
    dhy = rng.standard_normal((D, N, H)).astype(dtype)
    xt = torch.from_numpy(x).requires_grad_()
    ht = torch.from_numpy(h0).requires_grad_()
    yt, hyt = net(xt, ht)
    ((yt * torch.from_numpy(dy)).sum() + (hyt * torch.from_numpy(dhy)).sum()).backward()

    sfx = ["_l0", "_l0_reverse"][:D]
    p = {k: v.detach().numpy() for k, v in net.named_parameters()}
    g = {k: v.grad.numpy() for k, v in net.named_parameters()}
    # bias = [b_ir + b_hr, b_iz + b_hz, b_in], secondary_bias = b_hn
    mps_bias = lambda b_ih, b_hh: np.concatenate([b_ih[:2 * H] + b_hh[:2 * H], b_ih[2 * H:]])
    a = dict(source=x,
             recurrent_weight=p["weight_hh_l0"] if D == 1 else
             np.stack([p["weight_hh" + s] for s in sfx]),
             input_weight=np.concatenate([p["weight_ih" + s] for s in sfx]),
             bias=np.concatenate([mps_bias(p["bias_ih" + s], p["bias_hh" + s]) for s in sfx]),
             init_state=h0.transpose(1, 0, 2).reshape(N, D * H),
             secondary_bias=np.concatenate([p["bias_hh" + s][2 * H:] for s in sfx]))
    desc = mps.GRUDescriptor(bidirectional=bidirectional, reset_gate_first=True,
                             reset_after=True, flip_z=False, training=True)
    y, zs = mps.gru(**a, descriptor=desc)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, yt.detach().numpy(), **tol)
    rest = {k: v for k, v in a.items() if k not in ("source", "recurrent_weight")}
    grads = mps.gru_gradients(x, a["recurrent_weight"], dy, zs, y,
                              state_gradient=dhy.transpose(1, 0, 2).reshape(N, D * H), **rest,
                              descriptor=desc)
    d_src, d_rw, d_iw, d_b, d_init, d_b2 = grads
    want_b = np.concatenate([np.concatenate([g["bias_ih" + s][:2 * H], g["bias_ih" + s][2 * H:]])
                             for s in sfx])
    # r and z get one bias each in MPSGraph: its gradient is PyTorch's (equal) b_ih = b_hh one
    for s in sfx:
        np.testing.assert_allclose(g["bias_ih" + s][:2 * H], g["bias_hh" + s][:2 * H], **tol)
    np.testing.assert_allclose(d_src, xt.grad.numpy(), **tol)
    np.testing.assert_allclose(d_rw, g["weight_hh_l0"] if D == 1 else
                               np.stack([g["weight_hh" + s] for s in sfx]), **tol)
    np.testing.assert_allclose(d_iw, np.concatenate([g["weight_ih" + s] for s in sfx]), **tol)
    np.testing.assert_allclose(d_b, want_b, **tol)
    np.testing.assert_allclose(d_init, ht.grad.numpy().transpose(1, 0, 2).reshape(N, D * H),
                               **tol)
    np.testing.assert_allclose(d_b2, np.concatenate([g["bias_hh" + s][2 * H:] for s in sfx]),
                               **tol)


# --- errors -----------------------------------------------------------------------------------
def _valid(desc=None):
    desc = desc or mps.GRUDescriptor(bidirectional=True, reset_after=True, training=True)
    return desc, make_inputs(desc, OPTIONAL, seed=13)


def test_secondary_bias_without_reset_after_is_an_error():
    desc, a = _valid(mps.GRUDescriptor(training=True))
    a["secondary_bias"] = np.zeros(H)
    with pytest.raises(ValueError, match="secondary_bias.*reset_after"):
        mps.gru(**a, descriptor=desc)
    y = np.zeros((T, N, H))
    with pytest.raises(ValueError, match="secondary_bias.*reset_after"):
        mps.gru_gradients(a["source"], a["recurrent_weight"], y, np.zeros((T, N, 3 * H)), y,
                          input_weight=a["input_weight"], secondary_bias=a["secondary_bias"],
                          descriptor=desc)


@pytest.mark.parametrize("name,bad", [
    ("source", np.zeros((T, N))),
    ("recurrent_weight", np.zeros((3 * H, H))),          # uni shape for a bidirectional op
    ("input_weight", np.zeros((3 * H, I))),
    ("bias", np.zeros(3 * H)),
    ("init_state", np.zeros((N, H))),
    ("mask", np.zeros((T, N, 3))),
    ("secondary_bias", np.zeros(H)),
])
def test_shape_errors_name_the_argument(name, bad):
    desc, a = _valid()
    a[name] = bad
    with pytest.raises(ValueError, match=name):
        mps.gru(**a, descriptor=desc)


def test_projected_source_width_is_checked():
    desc, a = _valid()
    del a["input_weight"]           # source [T, N, I=3] is then not [T, N, 6H]
    with pytest.raises(ValueError, match=r"source.*6H=12"):
        mps.gru(**a, descriptor=desc)


@pytest.mark.parametrize("name", ["source_gradient", "z_state", "output_fwd", "state_gradient"])
def test_gradient_argument_shapes_are_checked(name):
    desc, a = _valid()
    y, zs = mps.gru(**a, descriptor=desc)
    args = dict(source_gradient=np.ones_like(y), z_state=zs, output_fwd=y,
                state_gradient=np.zeros((N, 2 * H)))
    args[name] = np.zeros((T, N, H))
    rest = {k: v for k, v in a.items() if k not in ("source", "recurrent_weight")}
    with pytest.raises(ValueError, match=name):
        mps.gru_gradients(a["source"], a["recurrent_weight"], args["source_gradient"],
                          args["z_state"], args["output_fwd"],
                          state_gradient=args["state_gradient"], **rest, descriptor=desc)


def test_dtype_mismatch_names_the_argument():
    desc, a = _valid()
    a["bias"] = a["bias"].astype(np.float32)
    with pytest.raises(TypeError, match="bias.*float64"):
        mps.gru(**a, descriptor=desc)


@pytest.mark.parametrize("field", ["update_gate_activation", "reset_gate_activation",
                                   "output_gate_activation"])
def test_unknown_activation_names_are_refused(field):
    with pytest.raises(ValueError, match=f"{field}.*'hard_sigmoid'"):
        mps.GRUDescriptor(**{field: "softplus"})
    desc, a = _valid()
    setattr(desc, field, "Sigmoid")          # the descriptor is mutable; checked at each call
    with pytest.raises(ValueError, match=field):
        mps.gru(**a, descriptor=desc)


def test_descriptor_type_and_flag_types_are_checked():
    _, a = _valid()
    with pytest.raises(TypeError, match="descriptor"):
        mps.gru(**a, descriptor={"bidirectional": True})
    with pytest.raises(TypeError, match="descriptor.reverse"):
        mps.GRUDescriptor(reverse="yes")
    d = mps.GRUDescriptor()
    assert (d.reverse, d.bidirectional, d.training, d.reset_gate_first, d.reset_after,
            d.flip_z) == (False,) * 6
    assert (d.update_gate_activation, d.reset_gate_activation,
            d.output_gate_activation) == ("sigmoid", "sigmoid", "tanh")
