"""cgru.mps LSTM / LSTMGradients and singleGateRNN / singleGateRNNGradients against MPSGraph's
documented equations (an independent NumPy loop written here, in MPSGraph's own gate order,
with Apple's full peephole p ⊙ c[t−1] on all four gates), against float64 central finite
differences (cgru.core.gradcheck), against torch.nn.LSTM / nn.RNN in the configurations that
coincide, and for its refusals and the immutability of its inputs."""
import itertools

import numpy as np
import pytest

from cgru import mps
from cgru.core import gradcheck

T, N, I, H = 3, 2, 3, 2
LSTM_FLAGS = ("reverse", "bidirectional", "forget_gate_last")
RNN_FLAGS = ("reverse", "bidirectional")
LSTM_OPTIONAL = ("input_weight", "bias", "init_state", "init_cell", "mask", "peephole")
RNN_OPTIONAL = ("input_weight", "bias", "init_state", "mask")
LSTM_GRAD_ORDER = ("source", "recurrent_weight", "input_weight", "bias", "peephole",
                   "init_state", "init_cell")
RNN_GRAD_ORDER = ("source", "recurrent_weight", "input_weight", "bias", "init_state")


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


def _D(desc):
    return 2 if desc.bidirectional else 1


def _backwards(desc, d):
    return d == 1 or (desc.reverse and not desc.bidirectional)


def lstm_equations(desc, source, recurrent_weight, input_weight=None, bias=None,
                   init_state=None, init_cell=None, mask=None, peephole=None):
    """``(output, cell [T, N, D·H], gates [T, N, D·4H])`` per the header's LSTM comment:
    ``[i, f, z, o] = f(h[t−1]·m·Rᵀ + x[t]·Wᵀ + b + p·c[t−1])``, ``c = f·c + i·z``,
    ``h = o·g(c)``; gates in the descriptor's order ``[i, f, z, o]`` / ``[i, z, f, o]``
    (forget_gate_last); ``gates`` are the activated ones in order i, f, z, o per direction."""
    T_, N_, _ = source.shape
    H_ = recurrent_weight.shape[-1]
    D = _D(desc)
    order = ("i", "z", "f", "o") if desc.forget_gate_last else ("i", "f", "z", "o")
    sl = {g: slice(k * H_, (k + 1) * H_) for k, g in enumerate(order)}
    act = {"i": desc.input_gate_activation, "f": desc.forget_gate_activation,
           "z": desc.cell_gate_activation, "o": desc.output_gate_activation}
    m = np.ones((T_, N_, D * H_)) if mask is None else \
        np.broadcast_to(mask.astype(np.float64), (T_, N_, D * H_))
    y = np.zeros((T_, N_, D * H_))
    cell = np.zeros((T_, N_, D * H_))
    gates = np.zeros((T_, N_, D * 4 * H_))
    for d in range(D):
        R = recurrent_weight if D == 1 else recurrent_weight[d]
        W = None if input_weight is None else input_weight[d * 4 * H_:(d + 1) * 4 * H_]
        b = np.zeros(4 * H_) if bias is None else bias[d * 4 * H_:(d + 1) * 4 * H_]
        p = np.zeros(4 * H_) if peephole is None else peephole.reshape(D, 4 * H_)[d]
        h = np.zeros((N_, H_)) if init_state is None else init_state[:, d * H_:(d + 1) * H_]
        c = np.zeros((N_, H_)) if init_cell is None else init_cell[:, d * H_:(d + 1) * H_]
        for t in (range(T_ - 1, -1, -1) if _backwards(desc, d) else range(T_)):
            xw = source[t, :, d * 4 * H_:(d + 1) * 4 * H_] if W is None else source[t] @ W.T
            a = (h * m[t, :, d * H_:(d + 1) * H_]) @ R.T + xw + b + np.tile(c, 4) * p
            g = {k: _act(act[k], a[:, sl[k]]) for k in order}
            c = g["f"] * c + g["i"] * g["z"]
            h = g["o"] * _act(desc.activation, c)
            y[t, :, d * H_:(d + 1) * H_] = h
            cell[t, :, d * H_:(d + 1) * H_] = c
            gates[t, :, d * 4 * H_:(d + 1) * 4 * H_] = np.concatenate(
                [g["i"], g["f"], g["z"], g["o"]], axis=1)
    return y, cell, gates


def rnn_equations(desc, source, recurrent_weight, input_weight=None, bias=None,
                  init_state=None, mask=None):
    """``(output, z)`` ``[T, N, D·H]`` per the header: ``z = x·Wᵀ + (h·m)·Rᵀ + b``,
    ``h = activation(z)``."""
    T_, N_, _ = source.shape
    H_ = recurrent_weight.shape[-1]
    D = _D(desc)
    m = np.ones((T_, N_, D * H_)) if mask is None else \
        np.broadcast_to(mask.astype(np.float64), (T_, N_, D * H_))
    y = np.zeros((T_, N_, D * H_))
    zs = np.zeros((T_, N_, D * H_))
    for d in range(D):
        R = recurrent_weight if D == 1 else recurrent_weight[d]
        W = None if input_weight is None else input_weight[d * H_:(d + 1) * H_]
        b = np.zeros(H_) if bias is None else bias[d * H_:(d + 1) * H_]
        h = np.zeros((N_, H_)) if init_state is None else init_state[:, d * H_:(d + 1) * H_]
        for t in (range(T_ - 1, -1, -1) if _backwards(desc, d) else range(T_)):
            xw = source[t, :, d * H_:(d + 1) * H_] if W is None else source[t] @ W.T
            z = xw + (h * m[t, :, d * H_:(d + 1) * H_]) @ R.T + b
            h = _act(desc.activation, z)
            y[t, :, d * H_:(d + 1) * H_] = h
            zs[t, :, d * H_:(d + 1) * H_] = z
    return y, zs


# --- test data --------------------------------------------------------------------------------
def make_inputs(kind, desc, present, seed, dtype=np.float64, mask_shape="full"):
    """Random inputs of the op; the optional ones only when in ``present`` (a peephole has
    all four gate blocks random)."""
    rng = np.random.default_rng(seed)
    D = _D(desc)
    G = 4 if kind == "lstm" else 1
    u = lambda *s: rng.uniform(-1, 1, s).astype(dtype)
    projected = "input_weight" not in present
    a = {"source": u(T, N, D * G * H if projected else I),
         "recurrent_weight": u(G * H, H) if D == 1 else u(2, G * H, H)}
    if "input_weight" in present:
        a["input_weight"] = u(D * G * H, I)
    if "bias" in present:
        a["bias"] = u(D * G * H)
    if "init_state" in present:
        a["init_state"] = u(N, D * H)
    if "init_cell" in present and kind == "lstm":
        a["init_cell"] = u(N, D * H)
    if "mask" in present:
        shape = {"full": (T, N, D * H), "no_time": (N, D * H), "one_row": (T, 1, D * H)}
        a["mask"] = rng.uniform(0.0, 1.5, shape[mask_shape]).astype(dtype)
    if "peephole" in present and kind == "lstm":
        p = u(D, 4 * H)
        a["peephole"] = p[0] if D == 1 else p
    return a


def _cases(flags, optional):
    """Every flag combination × (all, none, a mixed set alternating with the combination)."""
    cases = []
    for k, values in enumerate(itertools.product((False, True), repeat=len(flags))):
        mixed = optional[0::2] if k % 2 else optional[1::2]
        ident = "-".join(f for f, v in zip(flags, values) if v) or "defaults"
        for label, present in (("all", optional), ("none", ()), ("mixed", mixed)):
            cases.append(pytest.param(dict(zip(flags, values)), present, k,
                                      id=f"{ident}-{label}"))
    return cases


LSTM_CASES = _cases(LSTM_FLAGS, LSTM_OPTIONAL)
RNN_CASES = _cases(RNN_FLAGS, RNN_OPTIONAL)


def _rel(got, want, floor=1e-30):
    """Largest error relative to the largest magnitude of ``want`` (at least ``floor``)."""
    return float(np.abs(np.asarray(got, np.float64) - want).max() /
                 max(np.abs(want).max(), floor))


# Finite differences in float64 (eps = 1e-6) carry ~1e-10 of round-off in absolute terms, so a
# gradient whose entries are all tiny (a saturated path) is compared relative to at least 1e-2.
FD_FLOOR = 1e-2


def _rest(a):
    return {k: v for k, v in a.items() if k not in ("source", "recurrent_weight")}


def _final(desc, seq):
    """``[N, D·H]`` = [fwd | bwd]: each direction's value after its last step."""
    Hh = seq.shape[-1] // _D(desc)
    if desc.bidirectional:
        return np.concatenate([seq[-1, :, :Hh], seq[0, :, Hh:]], axis=1)
    return seq[0] if desc.reverse else seq[-1]


def _final_probe(desc, v, shape):
    """``v`` ``[N, D·H]`` placed where ``_final`` reads it: ∂(Σ final·v)/∂seq."""
    probe = np.zeros(shape)
    Hh = shape[-1] // _D(desc)
    if desc.bidirectional:
        probe[-1, :, :Hh] = v[:, :Hh]
        probe[0, :, Hh:] = v[:, Hh:]
    else:
        probe[0 if desc.reverse else -1] = v
    return probe


# --- LSTM forward -----------------------------------------------------------------------------
@pytest.mark.parametrize("flags,present,k", LSTM_CASES)
def test_lstm_forward_matches_documented_equations(flags, present, k, poison):
    """(``poison``: every engine buffer starts as NaN, so an unwritten element fails.)"""
    desc = mps.LSTMDescriptor(training=True, **flags)
    a = make_inputs("lstm", desc, present, seed=k,
                    mask_shape=("full", "no_time", "one_row")[k % 3])
    y, cell, z_state = mps.lstm(**a, descriptor=desc)
    want_y, want_c, want_gates = lstm_equations(desc, **a)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cell, want_c, rtol=1e-12, atol=1e-12)
    # z_state: the activated gates, i, f, z, o per direction (whatever forget_gate_last)
    np.testing.assert_allclose(z_state, want_gates, rtol=1e-12, atol=1e-12)
    # inference returns the output alone; produce_cell adds the cell; the same values
    (y_inf,) = mps.lstm(**a, descriptor=mps.LSTMDescriptor(**flags))
    np.testing.assert_array_equal(y_inf, y)
    y_pc, c_pc = mps.lstm(**a, descriptor=mps.LSTMDescriptor(produce_cell=True, **flags))
    np.testing.assert_array_equal(y_pc, y)
    np.testing.assert_array_equal(c_pc, cell)


LSTM_ACT_FIELDS = ("input_gate_activation", "forget_gate_activation", "cell_gate_activation",
                   "output_gate_activation", "activation")
# A Latin square: every activation on every one of the five slots once.
LSTM_ACT_ROWS = [tuple(mps.MPS_ACTIVATIONS[(i + j) % 5] for j in range(5)) for i in range(5)]


@pytest.mark.parametrize("acts", LSTM_ACT_ROWS, ids=["-".join(r) for r in LSTM_ACT_ROWS])
def test_lstm_activation_kinds(acts):
    flags = [dict(bidirectional=True), dict(reverse=True, forget_gate_last=True),
             dict(forget_gate_last=True)][LSTM_ACT_ROWS.index(acts) % 3]
    desc = mps.LSTMDescriptor(training=True, **dict(zip(LSTM_ACT_FIELDS, acts)), **flags)
    a = make_inputs("lstm", desc, LSTM_OPTIONAL, seed=300 + LSTM_ACT_ROWS.index(acts))
    a["source"] *= 3.0          # reach the flat parts of hard_sigmoid and relu
    y, cell, z_state = mps.lstm(**a, descriptor=desc)
    want_y, want_c, want_gates = lstm_equations(desc, **a)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cell, want_c, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(z_state, want_gates, rtol=1e-12, atol=1e-12)
    _check_lstm_gradients(desc, a, np.random.default_rng(1))


@pytest.mark.parametrize("forget_gate_last", [False, True])
def test_forget_gate_last_is_the_written_order_i_z_f_o(forget_gate_last):
    """One step, zero weights, sigmoid(±40) gates: only the block read as the forget gate
    keeps the initial cell (c' = f·c0 + i·z)."""
    desc = mps.LSTMDescriptor(produce_cell=True, forget_gate_last=forget_gate_last,
                              cell_gate_activation="none", activation="none")
    big = 40.0
    # blocks: [i, f, z, o] or [i, z, f, o]: i ≈ 0, f ≈ 1, z = 3, o ≈ 1
    blocks = {"i": -big, "f": big, "z": 3.0, "o": big}
    order = "izfo" if forget_gate_last else "ifzo"
    bias = np.array([blocks[g] for g in order])
    _, cell = mps.lstm(np.zeros((1, 1, 4)), np.zeros((4, 1)), None, bias,
                       np.zeros((1, 1)), np.array([[5.0]]), descriptor=desc)
    np.testing.assert_allclose(cell.ravel(), [5.0], rtol=1e-12)


@pytest.mark.parametrize("forget_gate_last", [False, True])
@pytest.mark.parametrize("block", [0, 1, 2, 3])
def test_each_peephole_block_adds_p_times_the_previous_cell_to_its_gate(block,
                                                                        forget_gate_last):
    """A peephole on one gate only (descriptor order): every step's gate sees the previous
    cell state c[t−1] — the output gate too (not c[t], ONNX's form)."""
    desc = mps.LSTMDescriptor(produce_cell=True, training=True, forget_gate_last=forget_gate_last)
    rng = np.random.default_rng(5)
    a = make_inputs("lstm", desc, ("input_weight", "bias", "init_cell"), seed=6)
    p = np.zeros(4 * H)
    p[block * H:(block + 1) * H] = rng.uniform(1, 2, H)
    y0, c0, _ = mps.lstm(**a, descriptor=desc)
    y1, c1, _ = mps.lstm(**a, peephole=p, descriptor=desc)
    want_y, want_c, _ = lstm_equations(desc, **a, peephole=p)
    np.testing.assert_allclose(y1, want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(c1, want_c, rtol=1e-12, atol=1e-12)
    assert np.abs(y1 - y0).max() > 1e-3


def test_lstm_reverse_is_ignored_when_bidirectional():
    flags = dict(bidirectional=True, training=True)
    a = make_inputs("lstm", mps.LSTMDescriptor(**flags), LSTM_OPTIONAL, seed=9)
    for u, v in zip(mps.lstm(**a, descriptor=mps.LSTMDescriptor(reverse=True, **flags)),
                    mps.lstm(**a, descriptor=mps.LSTMDescriptor(**flags))):
        np.testing.assert_array_equal(u, v)
    a1 = make_inputs("lstm", mps.LSTMDescriptor(), LSTM_OPTIONAL, seed=9)
    f = mps.lstm(**a1, descriptor=mps.LSTMDescriptor())[0]
    r = mps.lstm(**a1, descriptor=mps.LSTMDescriptor(reverse=True))[0]
    assert np.abs(f - r).max() > 1e-3


# --- LSTM gradients ---------------------------------------------------------------------------
def _lstm_jacobians(desc, a):
    """``{name: d[output, cell]/d(name)}`` ``[*name.shape, 2, T, N, D·H]`` by central differences
    (cgru.core.gradcheck) through cgru's own forward; for the peephole also through the
    equations above (MPSGraph's documented function), which must agree."""
    desc_pc = mps.LSTMDescriptor(**{**desc.__dict__, "training": False, "produce_cell": True})
    mine = {k: v.copy() for k, v in a.items()}

    def cgru_fn():
        return np.stack(mps.lstm(**mine, descriptor=desc_pc))

    def doc_fn():
        return np.stack(lstm_equations(desc, **mine)[:2])

    names = [n for n in LSTM_GRAD_ORDER if n in a]
    jac = dict(zip(names, gradcheck.central_differences(cgru_fn, [mine[n] for n in names])))
    if "peephole" in a:
        (doc,) = gradcheck.central_differences(doc_fn, [mine["peephole"]])
        assert _rel(jac["peephole"], doc, FD_FLOOR) <= 1e-7
    return jac


def _check_lstm_gradients(desc, a, rng, tol=1e-7):
    y, cell, z_state = mps.lstm(**a, descriptor=desc)
    jac = _lstm_jacobians(desc, a)
    given = [n for n in LSTM_GRAD_ORDER if n in a]
    dy = rng.standard_normal(y.shape)
    dh = rng.standard_normal((N, y.shape[2]))
    dc = rng.standard_normal((N, y.shape[2]))
    for label, sg, sv, cv in (("outputs", dy, None, None), ("final state", None, dh, None),
                              ("final cell", None, None, dc), ("all", dy, dh, dc)):
        grads = mps.lstm_gradients(a["source"], a["recurrent_weight"], sg, z_state, cell,
                                   state_gradient=sv, cell_gradient=cv, **_rest(a),
                                   descriptor=desc)
        assert len(grads) == len(given), label
        d_out = np.stack([np.zeros(y.shape) + (0 if sg is None else sg) +
                          (0 if sv is None else _final_probe(desc, sv, y.shape)),
                          np.zeros(y.shape) if cv is None else _final_probe(desc, cv, y.shape)])
        for name, g in zip(given, grads):
            assert g.shape == a[name].shape and g.dtype == a[name].dtype, (label, name)
            want = np.tensordot(jac[name], d_out, axes=4)
            assert _rel(g, want, FD_FLOOR) <= tol, (label, name, _rel(g, want, FD_FLOOR))


@pytest.mark.parametrize("flags,present,k", [c for c in LSTM_CASES if "none" not in c.id])
def test_lstm_gradients_match_finite_differences(flags, present, k, poison):
    desc = mps.LSTMDescriptor(training=True, **flags)
    a = make_inputs("lstm", desc, present, seed=100 + k, mask_shape=("full", "one_row")[k % 2])
    _check_lstm_gradients(desc, a, np.random.default_rng(k))


@pytest.mark.parametrize("forget_gate_last", [False, True])
def test_lstm_gradients_without_optional_inputs(forget_gate_last):
    """The smallest overload: source and recurrent weight only (projected source)."""
    desc = mps.LSTMDescriptor(training=True, forget_gate_last=forget_gate_last)
    a = make_inputs("lstm", desc, (), seed=77)
    _check_lstm_gradients(desc, a, np.random.default_rng(2))


def test_lstm_peephole_gradient_at_nonzero_input_forget_blocks_and_a_mask():
    """Bidirectional, forget_gate_last, projected source, peephole and mask together."""
    desc = mps.LSTMDescriptor(training=True, bidirectional=True, forget_gate_last=True)
    a = make_inputs("lstm", desc, ("bias", "init_state", "init_cell", "mask", "peephole"),
                    seed=88)
    _check_lstm_gradients(desc, a, np.random.default_rng(3))


# --- single-gate RNN --------------------------------------------------------------------------
@pytest.mark.parametrize("activation", mps.MPS_ACTIVATIONS)
@pytest.mark.parametrize("flags,present,k", RNN_CASES)
def test_rnn_forward_matches_documented_equations(flags, present, k, activation, poison):
    desc = mps.SingleGateRNNDescriptor(training=True, activation=activation, **flags)
    a = make_inputs("rnn", desc, present, seed=k,
                    mask_shape=("full", "no_time", "one_row")[k % 3])
    y, z_state = mps.single_gate_rnn(**a, descriptor=desc)
    want_y, want_z = rnn_equations(desc, **a)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    # z_state: the pre-activations z[t] (Apple's documented second output)
    np.testing.assert_allclose(z_state, want_z, rtol=1e-12, atol=1e-12)
    (y_inf,) = mps.single_gate_rnn(**a, descriptor=mps.SingleGateRNNDescriptor(
        activation=activation, **flags))
    np.testing.assert_array_equal(y_inf, y)


def _check_rnn_gradients(desc, a, rng, tol=1e-7):
    y, z_state = mps.single_gate_rnn(**a, descriptor=desc)
    inference = mps.SingleGateRNNDescriptor(**{**desc.__dict__, "training": False})
    mine = {k: v.copy() for k, v in a.items()}
    given = [n for n in RNN_GRAD_ORDER if n in a]
    jacs = gradcheck.central_differences(
        lambda: mps.single_gate_rnn(**mine, descriptor=inference)[0], [mine[n] for n in given])
    dy = rng.standard_normal(y.shape)
    dh = rng.standard_normal((N, y.shape[2]))
    for label, sg, sv in (("outputs", dy, None), ("final state", None, dh), ("both", dy, dh)):
        grads = mps.single_gate_rnn_gradients(a["source"], a["recurrent_weight"], sg, z_state,
                                              state_gradient=sv, **_rest(a), descriptor=desc)
        assert len(grads) == len(given), label
        d_out = np.zeros(y.shape) + (0 if sg is None else sg) + \
            (0 if sv is None else _final_probe(desc, sv, y.shape))
        for name, g, jac in zip(given, grads, jacs):
            assert g.shape == a[name].shape and g.dtype == a[name].dtype, (label, name)
            want = np.tensordot(jac, d_out, axes=3)
            assert _rel(g, want, FD_FLOOR) <= tol, (label, name, _rel(g, want, FD_FLOOR))


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid"])
@pytest.mark.parametrize("flags,present,k", RNN_CASES)
def test_rnn_gradients_match_finite_differences(flags, present, k, activation, poison):
    desc = mps.SingleGateRNNDescriptor(training=True, activation=activation, **flags)
    a = make_inputs("rnn", desc, present, seed=400 + k, mask_shape=("full", "one_row")[k % 2])
    _check_rnn_gradients(desc, a, np.random.default_rng(k))


def test_rnn_default_activation_is_relu():
    desc = mps.SingleGateRNNDescriptor()
    assert (desc.reverse, desc.bidirectional, desc.training, desc.activation) == \
        (False, False, False, "relu")
    (y,) = mps.single_gate_rnn(np.array([[[-2.0]], [[3.0]]]), np.zeros((1, 1)),
                               descriptor=desc)
    np.testing.assert_array_equal(y.ravel(), [0.0, 3.0])


def test_lstm_descriptor_defaults():
    d = mps.LSTMDescriptor()
    assert (d.reverse, d.bidirectional, d.produce_cell, d.training, d.forget_gate_last) == \
        (False,) * 5
    assert tuple(getattr(d, f) for f in LSTM_ACT_FIELDS) == \
        ("sigmoid", "sigmoid", "tanh", "sigmoid", "tanh")


# --- float32 --------------------------------------------------------------------------------
def test_float32_matches_the_documented_equations_and_float64():
    desc = mps.LSTMDescriptor(training=True, bidirectional=True, forget_gate_last=True)
    a = make_inputs("lstm", desc, LSTM_OPTIONAL, seed=11)
    a32 = {k: v.astype(np.float32) for k, v in a.items()}
    out32 = mps.lstm(**a32, descriptor=desc)
    for got, want in zip(out32, lstm_equations(desc, **a)):
        assert got.dtype == np.float32
        assert _rel(got, want) <= 1e-5
    out64 = mps.lstm(**a, descriptor=desc)
    ones = np.ones((T, N, 2 * H))
    g32 = mps.lstm_gradients(a32["source"], a32["recurrent_weight"], ones.astype(np.float32),
                             out32[2], out32[1], **_rest(a32), descriptor=desc)
    g64 = mps.lstm_gradients(a["source"], a["recurrent_weight"], ones, out64[2], out64[1],
                             **_rest(a), descriptor=desc)
    for u, v in zip(g32, g64):
        assert u.dtype == np.float32
        assert _rel(u, v) <= 1e-5

    rdesc = mps.SingleGateRNNDescriptor(training=True, bidirectional=True, activation="tanh")
    r = make_inputs("rnn", rdesc, RNN_OPTIONAL, seed=12)
    r32 = {k: v.astype(np.float32) for k, v in r.items()}
    y32, z32 = mps.single_gate_rnn(**r32, descriptor=rdesc)
    for got, want in zip((y32, z32), rnn_equations(rdesc, **r)):
        assert got.dtype == np.float32
        assert _rel(got, want) <= 1e-5
    y64, z64 = mps.single_gate_rnn(**r, descriptor=rdesc)
    g32 = mps.single_gate_rnn_gradients(r32["source"], r32["recurrent_weight"],
                                        ones.astype(np.float32), z32, **_rest(r32),
                                        descriptor=rdesc)
    g64 = mps.single_gate_rnn_gradients(r["source"], r["recurrent_weight"], ones, z64,
                                        **_rest(r), descriptor=rdesc)
    for u, v in zip(g32, g64):
        assert u.dtype == np.float32
        assert _rel(u, v) <= 1e-5


# --- PyTorch-equivalent configurations -------------------------------------------------------
def _torch_inputs(rng, dtype, D):
    x = rng.standard_normal((T, N, I)).astype(dtype)
    h0 = rng.standard_normal((D, N, H)).astype(dtype)
    dy = rng.standard_normal((T, N, D * H)).astype(dtype)
    dhy = rng.standard_normal((D, N, H)).astype(dtype)
    return x, h0, dy, dhy


def _mps_state(a):
    """torch's ``[D, N, H]`` → MPSGraph's ``[N, D·H]``."""
    return np.ascontiguousarray(a.transpose(1, 0, 2)).reshape(a.shape[1], -1)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lstm_matches_torch(bidirectional, dtype):
    """torch.nn.LSTM's gates are i, f, g, o: MPSGraph's default order, sigmoid/tanh."""
    torch = pytest.importorskip("torch")
    D = 2 if bidirectional else 1
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    torch.manual_seed(0)
    net = torch.nn.LSTM(I, H, bidirectional=bidirectional, dtype=tdt)
    rng = np.random.default_rng(21)
    x, h0, dy, dhy = _torch_inputs(rng, dtype, D)
    c0 = rng.standard_normal((D, N, H)).astype(dtype)
    dcy = rng.standard_normal((D, N, H)).astype(dtype)
    xt, ht, ct = (torch.from_numpy(v).requires_grad_() for v in (x, h0, c0))
    yt, (hyt, cyt) = net(xt, (ht, ct))
    ((yt * torch.from_numpy(dy)).sum() + (hyt * torch.from_numpy(dhy)).sum()
     + (cyt * torch.from_numpy(dcy)).sum()).backward()
    sfx = ["_l0", "_l0_reverse"][:D]
    p = {k: v.detach().numpy() for k, v in net.named_parameters()}
    g = {k: v.grad.numpy() for k, v in net.named_parameters()}
    a = dict(source=x,
             recurrent_weight=p["weight_hh_l0"] if D == 1 else
             np.stack([p["weight_hh" + s] for s in sfx]),
             input_weight=np.concatenate([p["weight_ih" + s] for s in sfx]),
             bias=np.concatenate([p["bias_ih" + s] + p["bias_hh" + s] for s in sfx]),
             init_state=_mps_state(h0), init_cell=_mps_state(c0))
    desc = mps.LSTMDescriptor(bidirectional=bidirectional, training=True)
    y, cell, zs = mps.lstm(**a, descriptor=desc)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    assert _rel(y, yt.detach().numpy()) <= tol
    assert _rel(_final(desc, cell), _mps_state(cyt.detach().numpy())) <= tol
    grads = mps.lstm_gradients(x, a["recurrent_weight"], dy, zs, cell,
                               state_gradient=_mps_state(dhy), cell_gradient=_mps_state(dcy),
                               **_rest(a), descriptor=desc)
    d_src, d_rw, d_iw, d_b, d_h0, d_c0 = grads
    assert _rel(d_src, xt.grad.numpy()) <= tol
    assert _rel(d_rw, g["weight_hh_l0"] if D == 1 else
                np.stack([g["weight_hh" + s] for s in sfx])) <= tol
    assert _rel(d_iw, np.concatenate([g["weight_ih" + s] for s in sfx])) <= tol
    # one MPSGraph bias per gate: its gradient is PyTorch's (equal) bias_ih = bias_hh one
    assert _rel(d_b, np.concatenate([g["bias_ih" + s] for s in sfx])) <= tol
    assert _rel(d_b, np.concatenate([g["bias_hh" + s] for s in sfx])) <= tol
    assert _rel(d_h0, _mps_state(ht.grad.numpy())) <= tol
    assert _rel(d_c0, _mps_state(ct.grad.numpy())) <= tol


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rnn_matches_torch(bidirectional, dtype, activation):
    torch = pytest.importorskip("torch")
    D = 2 if bidirectional else 1
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    torch.manual_seed(1)
    net = torch.nn.RNN(I, H, nonlinearity=activation, bidirectional=bidirectional, dtype=tdt)
    x, h0, dy, dhy = _torch_inputs(np.random.default_rng(22), dtype, D)
    xt, ht = (torch.from_numpy(v).requires_grad_() for v in (x, h0))
    yt, hyt = net(xt, ht)
    ((yt * torch.from_numpy(dy)).sum() + (hyt * torch.from_numpy(dhy)).sum()).backward()
    sfx = ["_l0", "_l0_reverse"][:D]
    p = {k: v.detach().numpy() for k, v in net.named_parameters()}
    g = {k: v.grad.numpy() for k, v in net.named_parameters()}
    a = dict(source=x,
             recurrent_weight=p["weight_hh_l0"] if D == 1 else
             np.stack([p["weight_hh" + s] for s in sfx]),
             input_weight=np.concatenate([p["weight_ih" + s] for s in sfx]),
             bias=np.concatenate([p["bias_ih" + s] + p["bias_hh" + s] for s in sfx]),
             init_state=_mps_state(h0))
    desc = mps.SingleGateRNNDescriptor(bidirectional=bidirectional, activation=activation,
                                       training=True)
    y, zs = mps.single_gate_rnn(**a, descriptor=desc)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    assert _rel(y, yt.detach().numpy()) <= tol
    grads = mps.single_gate_rnn_gradients(x, a["recurrent_weight"], dy, zs,
                                          state_gradient=_mps_state(dhy), **_rest(a),
                                          descriptor=desc)
    d_src, d_rw, d_iw, d_b, d_h0 = grads
    assert _rel(d_src, xt.grad.numpy()) <= tol
    assert _rel(d_rw, g["weight_hh_l0"] if D == 1 else
                np.stack([g["weight_hh" + s] for s in sfx])) <= tol
    assert _rel(d_iw, np.concatenate([g["weight_ih" + s] for s in sfx])) <= tol
    assert _rel(d_b, np.concatenate([g["bias_ih" + s] for s in sfx])) <= tol
    assert _rel(d_h0, _mps_state(ht.grad.numpy())) <= tol


# --- inputs are never modified ---------------------------------------------------------------
def _frozen(a):
    """Read-only copies (a write into one raises) and the originals' bytes to compare."""
    out = {}
    for k, v in a.items():
        c = v.copy()
        c.flags.writeable = False
        out[k] = c
    return out


def test_inputs_are_not_modified():
    desc = mps.LSTMDescriptor(training=True, bidirectional=True)
    a = _frozen(make_inputs("lstm", desc, LSTM_OPTIONAL, seed=30))
    before = {k: v.copy() for k, v in a.items()}
    y, cell, zs = mps.lstm(**a, descriptor=desc)
    extra = _frozen(dict(sg=np.ones_like(y), zs=zs, cell=cell, sv=np.ones((N, 2 * H)),
                         cv=np.ones((N, 2 * H))))
    extra_before = {k: v.copy() for k, v in extra.items()}
    mps.lstm_gradients(a["source"], a["recurrent_weight"], extra["sg"], extra["zs"],
                       extra["cell"], state_gradient=extra["sv"], cell_gradient=extra["cv"],
                       **_rest(a), descriptor=desc)
    # projected source with forget_gate_last (reordered internally) and a bool mask
    desc2 = mps.LSTMDescriptor(training=True, forget_gate_last=True)
    b = make_inputs("lstm", desc2, ("bias", "peephole"), seed=31)
    b["mask"] = np.random.default_rng(0).random((T, N, H)) > 0.3
    b = _frozen(b)
    b_before = {k: v.copy() for k, v in b.items()}
    y2, c2, z2 = mps.lstm(**b, descriptor=desc2)
    mps.lstm_gradients(b["source"], b["recurrent_weight"], np.ones_like(y2), z2, c2,
                       **_rest(b), descriptor=desc2)
    rdesc = mps.SingleGateRNNDescriptor(training=True, reverse=True)
    r = _frozen(make_inputs("rnn", rdesc, RNN_OPTIONAL, seed=32))
    r_before = {k: v.copy() for k, v in r.items()}
    yr, zr = mps.single_gate_rnn(**r, descriptor=rdesc)
    zr.flags.writeable = False
    mps.single_gate_rnn_gradients(r["source"], r["recurrent_weight"], np.ones_like(yr), zr,
                                  state_gradient=np.ones((N, H)), **_rest(r), descriptor=rdesc)
    for now, then in ((a, before), (extra, extra_before), (b, b_before), (r, r_before)):
        for k in now:
            np.testing.assert_array_equal(now[k], then[k], err_msg=k)


def test_bool_mask_equals_float_mask():
    desc = mps.LSTMDescriptor(bidirectional=True)
    a = make_inputs("lstm", desc, ("input_weight", "bias", "init_state"), seed=10)
    mask = np.random.default_rng(1).random((T, N, 2 * H)) > 0.4
    (yb,) = mps.lstm(**a, mask=mask, descriptor=desc)
    (yf,) = mps.lstm(**a, mask=mask.astype(np.float64), descriptor=desc)
    (yn,) = mps.lstm(**a, descriptor=desc)
    np.testing.assert_array_equal(yb, yf)
    assert np.abs(yb - yn).max() > 1e-6


# --- errors -----------------------------------------------------------------------------------
def _valid_lstm():
    desc = mps.LSTMDescriptor(bidirectional=True, training=True)
    return desc, make_inputs("lstm", desc, LSTM_OPTIONAL, seed=13)


def _valid_rnn():
    desc = mps.SingleGateRNNDescriptor(bidirectional=True, training=True)
    return desc, make_inputs("rnn", desc, RNN_OPTIONAL, seed=14)


@pytest.mark.parametrize("name,bad", [
    ("source", np.zeros((T, N))),
    ("recurrent_weight", np.zeros((4 * H, H))),          # uni shape for a bidirectional op
    ("input_weight", np.zeros((4 * H, I))),
    ("bias", np.zeros(4 * H)),
    ("init_state", np.zeros((N, H))),
    ("init_cell", np.zeros((N, H))),
    ("mask", np.zeros((T, N, 3))),
    ("peephole", np.zeros(8 * H)),                       # [8H]: the gradient comment's shape
])
def test_lstm_shape_errors_name_the_argument(name, bad):
    desc, a = _valid_lstm()
    a[name] = bad
    with pytest.raises(ValueError, match=name):
        mps.lstm(**a, descriptor=desc)


@pytest.mark.parametrize("name,bad", [
    ("source", np.zeros((T, N, I, 1))),
    ("recurrent_weight", np.zeros((H, H))),
    ("input_weight", np.zeros((H, I))),
    ("bias", np.zeros(H)),
    ("init_state", np.zeros((N, H))),
    ("mask", np.zeros((T, 3, 2 * H))),
])
def test_rnn_shape_errors_name_the_argument(name, bad):
    desc, a = _valid_rnn()
    a[name] = bad
    with pytest.raises(ValueError, match=name):
        mps.single_gate_rnn(**a, descriptor=desc)


def test_projected_source_width_is_checked():
    desc, a = _valid_lstm()
    del a["input_weight"]               # source [T, N, I=3] is then not [T, N, 8H]
    with pytest.raises(ValueError, match=r"source.*8H=16"):
        mps.lstm(**a, descriptor=desc)
    rdesc, r = _valid_rnn()
    del r["input_weight"]
    with pytest.raises(ValueError, match=r"source.*2H=4"):
        mps.single_gate_rnn(**r, descriptor=rdesc)


@pytest.mark.parametrize("name", ["source_gradient", "z_state", "cell_output_fwd",
                                  "state_gradient", "cell_gradient"])
def test_lstm_gradient_argument_shapes_are_checked(name):
    desc, a = _valid_lstm()
    y, cell, zs = mps.lstm(**a, descriptor=desc)
    args = dict(source_gradient=np.ones_like(y), z_state=zs, cell_output_fwd=cell,
                state_gradient=np.zeros((N, 2 * H)), cell_gradient=np.zeros((N, 2 * H)))
    args[name] = np.zeros((T, N, H))
    with pytest.raises(ValueError, match=name):
        mps.lstm_gradients(a["source"], a["recurrent_weight"], args["source_gradient"],
                           args["z_state"], args["cell_output_fwd"],
                           state_gradient=args["state_gradient"],
                           cell_gradient=args["cell_gradient"], **_rest(a), descriptor=desc)


@pytest.mark.parametrize("name", ["source_gradient", "z_state", "state_gradient"])
def test_rnn_gradient_argument_shapes_are_checked(name):
    desc, a = _valid_rnn()
    y, zs = mps.single_gate_rnn(**a, descriptor=desc)
    args = dict(source_gradient=np.ones_like(y), z_state=zs,
                state_gradient=np.zeros((N, 2 * H)))
    args[name] = np.zeros((T, N, H))
    with pytest.raises(ValueError, match=name):
        mps.single_gate_rnn_gradients(a["source"], a["recurrent_weight"],
                                      args["source_gradient"], args["z_state"],
                                      state_gradient=args["state_gradient"], **_rest(a),
                                      descriptor=desc)


@pytest.mark.parametrize("name", ["bias", "init_cell", "peephole", "recurrent_weight"])
def test_dtype_mismatch_names_the_argument(name):
    desc, a = _valid_lstm()
    a[name] = a[name].astype(np.float32)
    with pytest.raises(TypeError, match=f"{name}.*float64"):
        mps.lstm(**a, descriptor=desc)
    desc, a = _valid_lstm()
    a["mask"] = a["mask"].astype(np.int32)
    with pytest.raises(TypeError, match="mask"):
        mps.lstm(**a, descriptor=desc)
    with pytest.raises(TypeError, match="source.*float"):
        mps.single_gate_rnn(np.zeros((T, N, I), np.int64), np.zeros((H, H)),
                            descriptor=mps.SingleGateRNNDescriptor())


@pytest.mark.parametrize("field", LSTM_ACT_FIELDS)
def test_unknown_lstm_activation_names_are_refused(field):
    with pytest.raises(ValueError, match=f"{field}.*'hard_sigmoid'"):
        mps.LSTMDescriptor(**{field: "softplus"})
    desc, a = _valid_lstm()
    setattr(desc, field, "Sigmoid")          # the descriptor is mutable; checked at each call
    with pytest.raises(ValueError, match=field):
        mps.lstm(**a, descriptor=desc)
    assert mps.LSTMDescriptor(**{field: b"relu"}) is not None        # bytes are names too


def test_rnn_descriptor_is_checked():
    with pytest.raises(ValueError, match="activation"):
        mps.SingleGateRNNDescriptor(activation="leaky_relu")
    with pytest.raises(TypeError, match="descriptor.training"):
        mps.SingleGateRNNDescriptor(training=1)
    _, a = _valid_rnn()
    with pytest.raises(TypeError, match="SingleGateRNNDescriptor"):
        mps.single_gate_rnn(**a, descriptor=mps.LSTMDescriptor(bidirectional=True))


def test_descriptor_type_and_flag_types_are_checked():
    _, a = _valid_lstm()
    with pytest.raises(TypeError, match="descriptor"):
        mps.lstm(**a, descriptor={"bidirectional": True})
    with pytest.raises(TypeError, match="LSTMDescriptor"):
        mps.lstm(**a, descriptor=mps.GRUDescriptor(bidirectional=True))
    for flag in ("reverse", "bidirectional", "produce_cell", "training", "forget_gate_last"):
        with pytest.raises(TypeError, match=f"descriptor.{flag}"):
            mps.LSTMDescriptor(**{flag: "yes"})


def test_weight_mapping_round_trip():
    """cgru.systems.mps: to/from the canonical network (the ops' mapping) round-trips, refuses
    what MPSGraph cannot express, and computes what the op computes."""
    from cgru.core import engine
    from cgru.core.cells import LSTMCell, RNNCell
    from cgru.core.network import Network, Topology
    from cgru.systems import mps as system
    rng = np.random.default_rng(40)
    for fgl in (False, True):
        desc = mps.LSTMDescriptor(bidirectional=True, forget_gate_last=fgl)
        a = make_inputs("lstm", desc, ("input_weight", "bias", "peephole"), seed=41)
        layer = {k: a[k] for k in ("recurrent_weight", "input_weight", "bias", "peephole")}
        net = system.from_mps_lstm([layer], bidirectional=True, forget_gate_last=fgl)
        assert net.cell == LSTMCell(peepholes="ifgo")
        (back,), d = system.to_mps_lstm(net, forget_gate_last=fgl)
        assert d["bidirectional"] and d["forget_gate_last"] == fgl
        for k, v in layer.items():
            np.testing.assert_array_equal(back[k], v, err_msg=k)
        (want,) = mps.lstm(**a, descriptor=desc)
        np.testing.assert_allclose(engine.forward(net, a["source"]).y, want, rtol=1e-13,
                                   atol=1e-13)
    onnx_like = Network.random(Topology(I, H), np.float64, cell=LSTMCell(peepholes=True))
    with pytest.raises(ValueError, match="output-gate peephole"):
        system.to_mps_lstm(onnx_like)
    for lp in onnx_like:                      # "ifo" without P_o: MPSGraph's form, P_g = P_o = 0
        lp.P[2 * H:] = 0
    (layer,), d = system.to_mps_lstm(onnx_like)
    np.testing.assert_array_equal(layer["peephole"][2 * H:], 0)
    x = rng.standard_normal((T, N, I))
    np.testing.assert_allclose(engine.forward(system.from_mps_lstm([layer], **d), x).y,
                               engine.forward(onnx_like, x).y, rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="clip"):
        system.to_mps_lstm(Network.random(Topology(I, H), cell=LSTMCell(clip=1.0)))
    with pytest.raises(ValueError, match="proj"):
        system.to_mps_lstm(Network.random(Topology(I, H, proj_size=1), cell=LSTMCell()))
    rnn = Network.random(Topology(I, H, 1, "reverse"), np.float64, cell=RNNCell("sigmoid"))
    (layer,), d = system.to_mps_rnn(rnn)
    assert d == {"reverse": True, "bidirectional": False, "activation": "sigmoid"}
    again = system.from_mps_rnn([layer], **d)
    assert again.cell == rnn.cell
    x = rng.standard_normal((T, N, I))
    np.testing.assert_allclose(engine.forward(again, x).y, engine.forward(rnn, x).y,
                               rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="activation"):
        system.to_mps_rnn(Network.random(Topology(I, H), cell=RNNCell("softplus")))


def test_gradient_ops_read_the_training_state():
    """As in MPSGraph, the gradient operators differentiate the forward their training state
    records (cgru rebuilds its reserve from it): another z_state or cell gives other
    gradients, the forward's own gives the finite-difference ones (tests above)."""
    desc = mps.LSTMDescriptor(training=True)
    a = make_inputs("lstm", desc, ("input_weight", "bias", "init_state", "init_cell"), seed=51)
    y, cell, z = mps.lstm(**a, descriptor=desc)
    dy = np.ones_like(y)
    base = mps.lstm_gradients(a["source"], a["recurrent_weight"], dy, z, cell, **_rest(a),
                              descriptor=desc)
    for zz, cc in ((z * 0.9, cell), (z, cell * 0.9)):
        other = mps.lstm_gradients(a["source"], a["recurrent_weight"], dy, zz, cc, **_rest(a),
                                   descriptor=desc)
        assert np.abs(other[1] - base[1]).max() > 1e-6
    rdesc = mps.SingleGateRNNDescriptor(training=True)
    r = make_inputs("rnn", rdesc, ("input_weight", "bias"), seed=52)
    ry, rz = mps.single_gate_rnn(**r, descriptor=rdesc)
    rest = {k: r[k] for k in ("input_weight", "bias")}
    g1 = mps.single_gate_rnn_gradients(r["source"], r["recurrent_weight"], np.ones_like(ry), rz,
                                       **rest, descriptor=rdesc)
    g2 = mps.single_gate_rnn_gradients(r["source"], r["recurrent_weight"], np.ones_like(ry),
                                       rz + 0.1, **rest, descriptor=rdesc)
    assert np.abs(g1[1] - g2[1]).max() > 1e-6
