"""cgru.convert: every system's weights to and from the canonical parameters.

For each system: the round trips are exact; a model converted from the system computes what
the system computes — checked against the system itself where it runs here (torch.nn.GRU /
LSTM / RNN with autograd, onnxruntime's GRU / LSTM / RNN) and against that system's equations
written out independently below (Keras GRU / LSTM / SimpleRNN, MPSGraph, oneDNN GRU / LBR GRU /
LSTM with projection / vanilla RNN); and lossy conversions are refused with the reason.  The
GRU section ends with the whole GRU conversion matrix (the README's table); the LSTM / RNN
section (the second half) with the LSTM and RNN matrices, every source to every target.
"""
import re

import numpy as np
import pytest

import cgru
from cgru import convert
from cgru.arraymancer import gru as am_gru, gru_backward as am_gru_backward
from cgru.arraymancer import gru_forward as am_gru_forward

F64 = dict(rtol=1e-12, atol=1e-13)
F32 = dict(rtol=2e-5, atol=2e-6)


def _rng(seed):
    return np.random.default_rng(seed)


def _params(I=3, H=2, L=1, direction="forward", seed=0, dtype=np.float64, input_mode="linear",
            cell=None):
    return cgru.Network.random(cgru.Topology(I, H, L, direction, input_mode), dtype, seed=seed,
                               scale=0.8, cell=cell)


def _assert_params_equal(a, b):
    assert a.topology == b.topology
    for i, (x, y) in enumerate(zip(a, b)):
        for name, arr in x.arrays().items():
            other = getattr(y, name)
            assert arr.dtype == other.dtype, (i, name)
            np.testing.assert_array_equal(arr, other, err_msg=f"layer-direction {i} {name}")


def _run(net, x, h0=None, **kw):
    """The network's own function: no cell is passed (the network carries it)."""
    return cgru.forward(net, x, h0, **kw)[:2]


def _x(T, N, I, seed=1, dtype=np.float64):
    return _rng(seed).standard_normal((T, N, I)).astype(dtype)


# --- PyTorch ---------------------------------------------------------------------------------
torch_cases = [(1, False, True), (2, False, True), (2, True, True), (3, True, False)]


@pytest.mark.parametrize("L,bidirectional,bias", torch_cases)
def test_torch_module_outputs_and_gradients(L, bidirectional, bias):
    torch = pytest.importorskip("torch")
    torch.manual_seed(L + 2 * bidirectional)
    m = torch.nn.GRU(4, 3, L, bias=bias, bidirectional=bidirectional).double()
    sd = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    net = convert.from_torch(sd)
    assert isinstance(net, cgru.Network) and net.cell == cgru.Cell()
    D = 2 if bidirectional else 1
    assert net.topology == cgru.Topology(4, 3, L, "bidirectional" if D == 2 else "forward")
    # round trip state_dict → canonical → state_dict is bitwise
    back = convert.to_torch(net, bias=bias)
    assert list(back) == list(sd)
    for k in sd:
        np.testing.assert_array_equal(back[k], sd[k])

    T, N = 5, 3
    x, h0 = _x(T, N, 4), _rng(2).standard_normal((L * D, N, 3))
    rng = _rng(3)
    dy, dhy = rng.standard_normal((T, N, D * 3)), rng.standard_normal((L * D, N, 3))
    tx = torch.from_numpy(x).requires_grad_()
    th0 = torch.from_numpy(h0).requires_grad_()
    y_t, hy_t = m(tx, th0)
    ((y_t * torch.from_numpy(dy)).sum() + (hy_t * torch.from_numpy(dhy)).sum()).backward()

    y, hy, reserve = cgru.forward(net, x, h0, training=True)
    np.testing.assert_allclose(y, y_t.detach().numpy(), **F64)
    np.testing.assert_allclose(hy, hy_t.detach().numpy(), **F64)
    dx, dh0, dparams = cgru.backward(net, x, reserve, dy, dhy)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dh0, th0.grad.numpy(), rtol=1e-10, atol=1e-12)
    # gradients map to PyTorch's layout with the same converter as the weights
    dsd = convert.to_torch(dparams)
    for name, p in m.named_parameters():
        np.testing.assert_allclose(dsd[name], p.grad.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)


def test_torch_round_trip_from_canonical_and_tensors():
    torch = pytest.importorskip("torch")
    p = _params(3, 2, 2, "bidirectional", seed=4, dtype=np.float32)
    sd = convert.to_torch(p)
    q = convert.from_torch({k: torch.from_numpy(v) for k, v in sd.items()})  # tensors too
    _assert_params_equal(q, p)
    # the arrays are copies: changing the output leaves the source alone
    sd["weight_hh_l0"][:] = 0
    assert np.any(p[0].R)


def test_torch_skip_input_becomes_identity_matrices():
    torch = pytest.importorskip("torch")
    p = _params(3, 3, 2, "bidirectional", seed=5, input_mode="skip")
    sd = convert.to_torch(p)
    eye = np.eye(3)
    np.testing.assert_array_equal(sd["weight_ih_l0"], np.concatenate([eye, eye, eye]))
    m = torch.nn.GRU(3, 3, 2, bidirectional=True).double()
    m.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})
    x = _x(4, 2, 3)
    y_t, _ = m(torch.from_numpy(x))
    np.testing.assert_allclose(_run(p, x)[0], y_t.detach().numpy(), **F64)


def test_torch_refusals():
    p = _params(seed=6)
    with pytest.raises(ValueError, match="reset-after"):
        convert.to_torch(p.with_cell(cgru.Cell(reset_after=False)))
    with pytest.raises(ValueError, match="flip_z"):
        convert.to_torch(p.with_cell(cgru.Cell(flip_z=True)))
    with pytest.raises(ValueError, match="clip"):
        convert.to_torch(p.with_cell(cgru.Cell(clip=3.0)))
    with pytest.raises(ValueError, match="fixed activations"):
        convert.to_torch(p.with_cell(cgru.Cell(g="relu")))
    with pytest.raises(ValueError, match="direction='reverse'"):
        convert.to_torch(_params(direction="reverse"))
    with pytest.raises(ValueError, match="non-zero biases"):
        convert.to_torch(p, bias=False)
    with pytest.raises(ValueError, match="projected"):
        convert.to_torch(_params(6, 2, input_mode="projected"))
    with pytest.raises(ValueError, match="unexpected key"):
        convert.from_torch({"weight_ih_l0": np.zeros((6, 3)), "running_mean": np.zeros(3)})
    sd = convert.to_torch(_params(3, 2, 2))
    del sd["weight_hh_l1"]
    with pytest.raises(ValueError, match="missing 'weight_hh_l1'"):
        convert.from_torch(sd)


# --- Keras: its equations, written out from the Keras GRUCell (semantics.md §8) ---------------
_ACT = {"sigmoid": lambda a: 1 / (1 + np.exp(-a)), "tanh": np.tanh,
        "relu": lambda a: np.maximum(a, 0), "linear": lambda a: a,
        "none": lambda a: a, "hard_sigmoid": lambda a: np.clip(0.2 * a + 0.5, 0, 1),
        "softsign": lambda a: a / (1 + np.abs(a)),
        "elu": lambda a: np.where(a >= 0, a, np.expm1(np.minimum(a, 0))),
        "softplus": lambda a: np.log1p(np.exp(a))}


def _keras_gru(x, kernel, rec, bias, reset_after, act, rec_act, go_backwards=False):
    """One Keras GRU layer, batch-major ``x [N, T, I]``: outputs in processing order."""
    N, T, _ = x.shape
    H = rec.shape[0]
    f, g = _ACT[rec_act], _ACT[act]
    Kz, Kr, Kh = kernel[:, :H], kernel[:, H:2 * H], kernel[:, 2 * H:]
    Uz, Ur, Uh = rec[:, :H], rec[:, H:2 * H], rec[:, 2 * H:]
    if bias is None:
        bi, br = np.zeros(3 * H), np.zeros(3 * H)
    elif reset_after:
        bi, br = bias[0], bias[1]
    else:
        bi, br = bias, None
    h = np.zeros((N, H))
    outs = []
    for t in (reversed(range(T)) if go_backwards else range(T)):
        xt = x[:, t]
        if reset_after:
            z = f(xt @ Kz + bi[:H] + h @ Uz + br[:H])
            r = f(xt @ Kr + bi[H:2 * H] + h @ Ur + br[H:2 * H])
            hh = g(xt @ Kh + bi[2 * H:] + r * (h @ Uh + br[2 * H:]))
        else:
            z = f(xt @ Kz + bi[:H] + h @ Uz)
            r = f(xt @ Kr + bi[H:2 * H] + h @ Ur)
            hh = g(xt @ Kh + bi[2 * H:] + (r * h) @ Uh)
        h = z * h + (1 - z) * hh
        outs.append(h)
    return np.stack(outs, axis=1)


def _keras_stack(x, layers, reset_after, bidirectional, act="tanh", rec_act="sigmoid"):
    """Stacked ``GRU`` / ``Bidirectional(GRU, merge_mode='concat')`` layers, return_sequences."""
    for w in layers:
        per = len(w) // (2 if bidirectional else 1)
        fwd = w[:per]
        y = _keras_gru(x, fwd[0], fwd[1], fwd[2] if per == 3 else None, reset_after, act, rec_act)
        if bidirectional:
            bwd = w[per:]
            yb = _keras_gru(x, bwd[0], bwd[1], bwd[2] if per == 3 else None, reset_after, act,
                            rec_act, go_backwards=True)
            y = np.concatenate([y, yb[:, ::-1]], axis=-1)
        x = y
    return x


def _random_keras(I, H, L, reset_after, bidirectional, use_bias=True, seed=0):
    rng = _rng(seed)
    D = 2 if bidirectional else 1
    layers = []
    for l in range(L):
        w = []
        for _ in range(D):
            w += [rng.uniform(-0.8, 0.8, (I if l == 0 else D * H, 3 * H)),
                  rng.uniform(-0.8, 0.8, (H, 3 * H))]
            if use_bias:
                w.append(rng.uniform(-0.8, 0.8, (2, 3 * H) if reset_after else (3 * H,)))
        layers.append(w)
    return layers


@pytest.mark.parametrize("reset_after", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_keras_weights_compute_the_keras_function(reset_after, bidirectional):
    weights = _random_keras(3, 2, 2, reset_after, bidirectional, seed=7 + reset_after)
    net = convert.from_keras(weights, reset_after=reset_after, bidirectional=bidirectional)
    assert net.cell.reset_after == reset_after
    x = _x(3, 4, 5, seed=8).transpose(1, 0, 2)[:, :, :3].copy()          # [N, T, I]
    y, _ = _run(net, x, batch_major=True)
    np.testing.assert_allclose(y, _keras_stack(x, weights, reset_after, bidirectional), **F64)
    # round trip Keras → canonical → Keras is bitwise
    back = convert.to_keras(net)
    for wa, wb in zip(back, weights):
        assert len(wa) == len(wb)
        for a, b in zip(wa, wb):
            np.testing.assert_array_equal(a, b)
    assert convert.keras_config(net) == {"activation": "tanh", "recurrent_activation": "sigmoid",
                                        "reset_after": reset_after}
    assert convert.keras_config(net.cell) == convert.keras_config(net)


def test_keras_no_bias_and_other_activations():
    weights = _random_keras(3, 2, 1, True, False, use_bias=False, seed=9)
    net = convert.from_keras(weights, activation="relu", recurrent_activation="sigmoid")
    assert net.cell.g.name == "relu" and all(not np.any(lp.b_W) for lp in net)
    x = _x(4, 2, 3, seed=10).transpose(1, 0, 2).copy()
    np.testing.assert_allclose(_run(net, x, batch_major=True)[0],
                               _keras_stack(x, weights, True, False, act="relu"), **F64)
    back = convert.to_keras(net, use_bias=False)
    assert len(back[0]) == 2
    assert convert.keras_config(net)["activation"] == "relu"


@pytest.mark.parametrize("reset_after", [True, False])
def test_canonical_to_keras_keeps_the_function(reset_after):
    cell = cgru.Cell(reset_after=reset_after, f_r="relu", f_z="relu", g="identity")
    p = _params(3, 2, 2, "bidirectional", seed=11, cell=cell)
    weights = convert.to_keras(p)
    cfg = convert.keras_config(p)
    assert cfg == {"activation": "linear", "recurrent_activation": "relu",
                   "reset_after": reset_after}
    x = _x(4, 3, 3, seed=12).transpose(1, 0, 2).copy()
    np.testing.assert_allclose(
        _keras_stack(x, weights, reset_after, True, cfg["activation"], cfg["recurrent_activation"]),
        _run(p, x, batch_major=True)[0], **F64)
    q = convert.from_keras(weights, bidirectional=True, **cfg)
    assert q.cell == cell
    if reset_after:
        _assert_params_equal(q, p)
    else:   # reset-before Keras holds one bias vector: the sums, exact as a function
        for lp, lq in zip(p, q):
            np.testing.assert_array_equal(lq.W, lp.W)
            np.testing.assert_array_equal(lq.b_W, lp.b_W + lp.b_R)
            assert not np.any(lq.b_R)
        np.testing.assert_allclose(_run(q, x, batch_major=True)[0],
                                   _run(p, x, batch_major=True)[0], **F64)


def test_keras_refusals():
    p = _params(seed=13)
    with pytest.raises(ValueError, match="one activation for both gates"):
        convert.to_keras(p.with_cell(cgru.Cell(f_r="relu")))
    with pytest.raises(ValueError, match="hard_sigmoid"):
        convert.to_keras(p.with_cell(cgru.Cell(f_r="hard_sigmoid", f_z="hard_sigmoid")))
    with pytest.raises(ValueError, match="clip"):
        convert.to_keras(p.with_cell(cgru.Cell(clip=1.0)))
    with pytest.raises(ValueError, match="flip_z"):
        convert.to_keras(p.with_cell(cgru.Cell(flip_z=True)))
    with pytest.raises(ValueError, match="go_backwards"):
        convert.to_keras(_params(direction="reverse"))
    with pytest.raises(ValueError, match="reset-before"):
        convert.to_keras(p, reset_after=False)
    with pytest.raises(ValueError, match="non-zero biases"):
        convert.to_keras(p, use_bias=False)
    with pytest.raises(ValueError, match="no exact cgru equivalent"):
        convert.from_keras(_random_keras(3, 2, 1, True, False), activation="gelu")
    with pytest.raises(ValueError, match=r"bias: expected shape \[2, 6\]"):
        convert.from_keras(_random_keras(3, 2, 1, False, False), reset_after=True)


# --- TF CudnnRNN canonical lists and opaque params -------------------------------------------
def test_tf_canonical_round_trip_and_order():
    p = _params(3, 2, 2, "bidirectional", seed=14)
    weights, biases = convert.to_tf_canonical(p)
    assert len(weights) == len(biases) == 24
    q = convert.from_tf_canonical(weights, biases, direction="bidirectional")
    _assert_params_equal(q, p)
    assert q.cell == cgru.Cell()
    # index (l·D + d)·6 + k, k = cuDNN linLayerID, equals PyTorch's row blocks (no permutation)
    sd = convert.to_torch(p)
    H = 2
    for l in range(2):
        for d in range(2):
            sfx = f"_l{l}" + ("_reverse" if d else "")
            for k in range(6):
                name = ("weight_ih" if k < 3 else "weight_hh") + sfx
                blk = slice((k % 3) * H, (k % 3 + 1) * H)
                np.testing.assert_array_equal(weights[(l * 2 + d) * 6 + k], sd[name][blk])
                bname = ("bias_ih" if k < 3 else "bias_hh") + sfx
                np.testing.assert_array_equal(biases[(l * 2 + d) * 6 + k], sd[bname][blk])


def test_tf_canonical_skip_mode():
    p = _params(2, 2, 2, seed=15, input_mode="skip")
    weights, biases = convert.to_tf_canonical(p)
    assert [w.shape for w in weights[:3]] == [(2, 0)] * 3
    q = convert.from_tf_canonical(weights, biases, input_mode="skip")
    _assert_params_equal(q, p)


def test_tf_opaque_round_trip_and_keras_cudnn_layout():
    p = _params(3, 2, 2, "bidirectional", seed=16, dtype=np.float32)
    flat = convert.to_tf_opaque(p)
    np.testing.assert_array_equal(flat, p.flat())
    q = convert.from_tf_opaque(flat, p.topology)
    _assert_params_equal(q, p)
    # one unidirectional layer: the flat vector Keras builds for CudnnRNNV3
    # (_standardize_cudnn_weights: split kernel/recurrent_kernel columns into z, r, h, swap
    # to r, z, h, transpose each block, flatten; then the six biases)
    kernel, rec, bias = _random_keras(3, 2, 1, True, False, seed=17)[0]
    H = 2
    blocks = lambda m: [m[:, g * H:(g + 1) * H] for g in range(3)]     # noqa: E731
    kz, kr, kh = blocks(kernel)
    rz, rr, rh = blocks(rec)
    b = bias.reshape(-1)
    want = np.concatenate([m.T.ravel() for m in (kr, kz, kh, rr, rz, rh)] +
                          [b[H:2 * H], b[:H], b[2 * H:3 * H], b[4 * H:5 * H], b[3 * H:4 * H],
                           b[5 * H:]])
    net = convert.from_keras([[kernel, rec, bias]])
    np.testing.assert_array_equal(convert.to_tf_opaque(net), want)


def test_tf_refusals():
    with pytest.raises(ValueError, match="reset-after"):
        convert.to_tf_canonical(_params(cell=cgru.Cell(reset_after=False)))
    with pytest.raises(ValueError, match="direction='reverse'"):
        convert.to_tf_opaque(_params(direction="reverse"))
    with pytest.raises(ValueError, match="6·L·D"):
        convert.from_tf_canonical([np.zeros((2, 3))] * 5, [np.zeros(2)] * 5)


# --- ONNX: against onnxruntime ---------------------------------------------------------------
def _ort_node(X, layer, attrs, h0=None):
    """One ONNX GRU node in onnxruntime (float32): ``(Y, Y_h)``."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    feeds = {"X": X, **{k: v for k, v in layer.items() if v is not None}}
    names = ["X", "W", "R", "B", "", "initial_h"] if h0 is not None else ["X", "W", "R", "B"]
    if h0 is not None:
        feeds["initial_h"] = h0
    node = helper.make_node("GRU", names, ["Y", "Y_h"], **attrs)
    vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h")]
    model = helper.make_model(helper.make_graph([node], "g", vis, outs),
                              opset_imports=[helper.make_opsetid("", 22)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


onnx_cases = [("forward", 0, None), ("reverse", 1, None), ("bidirectional", 0, None),
              ("bidirectional", 1, dict(activations=["HardSigmoid", "Elu"] * 2,
                                        activation_alpha=[0.3, 0.8] * 2,
                                        activation_beta=[0.6] * 2, clip=1.2))]


@pytest.mark.parametrize("direction,lbr,extra", onnx_cases)
def test_onnx_node_weights_compute_the_onnxruntime_function(direction, lbr, extra):
    D = 2 if direction == "bidirectional" else 1
    H, I, T, N = 3, 4, 5, 3
    rng = _rng(18 + lbr)
    layer = {"W": rng.uniform(-1, 1, (D, 3 * H, I)).astype(np.float32),
             "R": rng.uniform(-1, 1, (D, 3 * H, H)).astype(np.float32),
             "B": rng.uniform(-1, 1, (D, 6 * H)).astype(np.float32)}
    attrs = dict(hidden_size=H, direction=direction, linear_before_reset=lbr, **(extra or {}))
    X = _x(T, N, I, seed=19, dtype=np.float32)
    h0 = rng.uniform(-1, 1, (D, N, H)).astype(np.float32)
    Y, Y_h = _ort_node(X, layer, attrs, h0)
    net = convert.from_onnx(layer, **attrs)
    y, hy = _run(net, X, h0)
    np.testing.assert_allclose(y, Y.transpose(0, 2, 1, 3).reshape(T, N, D * H), **F32)
    np.testing.assert_allclose(hy, Y_h, **F32)
    # round trip ONNX → canonical → ONNX: the same arrays and attributes
    layers, attrs2 = convert.to_onnx(net)
    for k in "WRB":
        np.testing.assert_array_equal(layers[0][k], layer[k])
    assert attrs2 == attrs


def test_canonical_stack_to_onnx_nodes_in_onnxruntime():
    # a 2-layer bidirectional stack becomes two nodes, Y reshaped to the next X
    cell = cgru.Cell(clip=0.9, f_r="hard_sigmoid", f_z="hard_sigmoid", g="identity")
    p = _params(4, 3, 2, "bidirectional", seed=20, dtype=np.float32, cell=cell)
    layers, attrs = convert.to_onnx(p)
    assert attrs["activations"] == ["HardSigmoid", "Affine"] * 2
    assert attrs["activation_alpha"] == [0.2, 1.0] * 2
    assert attrs["activation_beta"] == [0.5, 0.0] * 2
    X = _x(5, 3, 4, seed=21, dtype=np.float32)
    x = X
    for layer in layers:
        Y, _ = _ort_node(x, layer, attrs)
        x = np.ascontiguousarray(Y.transpose(0, 2, 1, 3).reshape(5, 3, 6))
    np.testing.assert_allclose(x, _run(p, X)[0], **F32)
    q = convert.from_onnx(layers, **attrs)
    assert q.cell == cell
    _assert_params_equal(q, p)


def test_onnx_refusals():
    p = _params(seed=22)
    with pytest.raises(ValueError, match="flip_z"):
        convert.to_onnx(p.with_cell(cgru.Cell(flip_z=True)))
    with pytest.raises(ValueError, match="one activation for both gates"):
        convert.to_onnx(p.with_cell(cgru.Cell(f_z="relu")))
    with pytest.raises(ValueError, match="reset-before"):
        convert.to_onnx(p, linear_before_reset=0)
    layers, attrs = convert.to_onnx(_params(direction="bidirectional", seed=23))
    with pytest.raises(ValueError, match="different activations"):
        convert.from_onnx(layers, **dict(attrs, activations=["Sigmoid", "Tanh", "Relu", "Tanh"]))


# --- MPSGraph: its documented equations (docs/semantics.md §8.2) -----------------------------
def _mps_op(src, op, desc, init_state=None):
    """One MPSGraph GRU op, time-major ``src [T, N, I]`` → output ``[T, N, D·H]``."""
    T, N, _ = src.shape
    D = 2 if desc["bidirectional"] else 1
    RW = op["recurrent_weight"].reshape(D, *op["recurrent_weight"].shape[-2:])
    H = RW.shape[-1]
    G = "rzo" if desc["reset_gate_first"] else "zro"
    f = {"z": _ACT[desc["update_gate_activation"]], "r": _ACT[desc["reset_gate_activation"]],
         "o": _ACT[desc["output_gate_activation"]]}
    out = np.zeros((T, N, D * H))
    for d in range(D):
        def blocks(a):
            return {g: a[k * H:(k + 1) * H] for k, g in enumerate(G)}
        if op["input_weight"] is None:
            xs = src[:, :, d * 3 * H:(d + 1) * 3 * H]
            proj = {g: xs[:, :, k * H:(k + 1) * H] for k, g in enumerate(G)}
        else:
            W = blocks(op["input_weight"][d * 3 * H:(d + 1) * 3 * H])
            proj = {g: src @ W[g].T for g in G}
        R = blocks(RW[d])
        b = blocks(op["bias"][d * 3 * H:(d + 1) * 3 * H])
        b2 = op["secondary_bias"][d * H:(d + 1) * H] if desc["reset_after"] else None
        h = np.zeros((N, H)) if init_state is None else init_state[:, d * H:(d + 1) * H]
        backwards = d == 1 or (D == 1 and desc["reverse"])
        for t in (reversed(range(T)) if backwards else range(T)):
            z = f["z"](h @ R["z"].T + proj["z"][t] + b["z"])
            r = f["r"](h @ R["r"].T + proj["r"][t] + b["r"])
            c = (h @ R["o"].T + b2) * r if desc["reset_after"] else (h * r) @ R["o"].T
            o = f["o"](c + proj["o"][t] + b["o"])
            h = (1 - z) * h + z * o if desc["flip_z"] else z * h + (1 - z) * o
            out[t, :, d * H:(d + 1) * H] = h
    return out


def _random_mps(I, H, L, D, reset_after, seed):
    rng = _rng(seed)
    u = lambda *s: rng.uniform(-0.9, 0.9, s)        # noqa: E731
    return [{"input_weight": u(D * 3 * H, I if l == 0 else D * H),
             "recurrent_weight": u(3 * H, H) if D == 1 else u(2, 3 * H, H),
             "bias": u(D * 3 * H), "secondary_bias": u(D * H) if reset_after else None}
            for l in range(L)]


mps_cases = [(rgf, ra, fz, dirn) for rgf in (False, True) for ra in (False, True)
             for fz, dirn in ((False, "forward"), (True, "bidirectional"), (False, "reverse"))]


@pytest.mark.parametrize("reset_gate_first,reset_after,flip_z,direction", mps_cases)
def test_mps_tensors_compute_the_mps_function(reset_gate_first, reset_after, flip_z, direction):
    D = 2 if direction == "bidirectional" else 1
    ops = _random_mps(3, 2, 2, D, reset_after, seed=24 + reset_after + 2 * reset_gate_first)
    desc = dict(reverse=direction == "reverse", bidirectional=D == 2,
                reset_gate_first=reset_gate_first, reset_after=reset_after, flip_z=flip_z,
                update_gate_activation="hard_sigmoid", reset_gate_activation="sigmoid",
                output_gate_activation="tanh" if reset_after else "relu")
    net = convert.from_mps(ops, **desc)
    x = _x(4, 3, 3, seed=25)
    want = x
    for op in ops:
        want = _mps_op(want, op, desc)
    np.testing.assert_allclose(_run(net, x)[0], want, **F64)
    # MPS → canonical → MPS is bitwise (the gate sums sit in b_W, zeros in b_R)
    back, desc2 = convert.to_mps(net, reset_gate_first=reset_gate_first)
    assert desc2 == desc
    for a, b in zip(back, ops):
        for k in a:
            if b[k] is None:
                assert a[k] is None
            else:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("reset_after", [False, True])
def test_canonical_to_mps_sums_biases_exactly(reset_after):
    cell = cgru.Cell(reset_after=reset_after)
    p = _params(3, 2, 1, "bidirectional", seed=26, cell=cell)
    for rgf in (False, True):
        ops, desc = convert.to_mps(p, reset_gate_first=rgf)
        H = 2
        z = 1 if rgf else 0              # where z sits in MPS' order
        np.testing.assert_array_equal(ops[0]["bias"][z * H:(z + 1) * H],
                                      p[0].b_W[H:2 * H] + p[0].b_R[H:2 * H])
        x = _x(4, 3, 3, seed=27)
        np.testing.assert_allclose(_mps_op(x, ops[0], desc), _run(p, x)[0], **F64)
        q = convert.from_mps(ops, **desc)
        assert q.cell == cell
        np.testing.assert_allclose(_run(q, x)[0], _run(p, x)[0], **F64)


def test_mps_projected_input():
    p = _params(12, 2, 1, "bidirectional", seed=28, input_mode="projected")
    ops, desc = convert.to_mps(p, reset_gate_first=True)
    assert ops[0]["input_weight"] is None
    x = _x(4, 3, 12, seed=29)
    np.testing.assert_allclose(_mps_op(x, ops[0], desc), _run(p, x)[0], **F64)
    q = convert.from_mps(ops, **desc)
    assert q.topology.input_mode == "projected"
    with pytest.raises(ValueError, match="reset_gate_first=True"):
        convert.to_mps(p)
    with pytest.raises(ValueError, match="reset_gate_first=True"):
        convert.from_mps(ops, **dict(desc, reset_gate_first=False))


def test_mps_refusals():
    p = _params(seed=30)
    with pytest.raises(ValueError, match="clip"):
        convert.to_mps(p.with_cell(cgru.Cell(clip=2.0)))
    with pytest.raises(ValueError, match="elu"):
        convert.to_mps(p.with_cell(cgru.Cell(g="elu")))
    with pytest.raises(ValueError, match="hard_sigmoid"):
        convert.to_mps(p.with_cell(cgru.Cell(f_z=("hard_sigmoid", 0.25, 0.5))))
    with pytest.raises(ValueError, match="resetAfter=NO"):
        convert.to_mps(p, reset_after=False)
    with pytest.raises(ValueError, match="update_gate_activation"):
        convert.from_mps(_random_mps(3, 2, 1, 1, False, 0), update_gate_activation="gelu")


# --- Arraymancer -----------------------------------------------------------------------------
def test_arraymancer_round_trip_outputs_and_gradients():
    p = _params(4, 3, 3, seed=31)
    t = convert.to_arraymancer(p)
    assert t["w3sN"].shape == (2, 9, 3) and t["bW3s"].shape == (3, 1, 9)
    q = convert.from_arraymancer(**t)
    _assert_params_equal(q, p)
    x, h0 = _x(4, 2, 4, seed=32), _rng(33).standard_normal((3, 2, 3))
    args = (t["w3s0"], t["w3sN"], t["u3s"], t["bW3s"], t["bU3s"])
    y, hy = am_gru(x, h0, *args)
    y2, hy2 = _run(q, x, h0)
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_array_equal(hy, hy2)
    # gradients: Arraymancer's backward = the core's gradients through the same converter
    dy = _rng(34).standard_normal(y.shape)
    _, _, cache = am_gru_forward(x, h0, *args)
    grads = am_gru_backward(dy, None, cache)
    _, _, reserve = cgru.forward(p, x, h0, training=True)
    dparams = cgru.backward(p, x, reserve, dy).dparams
    dt = convert.to_arraymancer(dparams)
    for g, name in zip(grads[2:], ("w3s0", "w3sN", "u3s", "bW3s", "bU3s")):
        np.testing.assert_array_equal(g, dt[name], err_msg=name)


def test_arraymancer_refusals():
    with pytest.raises(ValueError, match="unidirectional forward only"):
        convert.to_arraymancer(_params(direction="bidirectional"))
    with pytest.raises(ValueError, match="reset-after"):
        convert.to_arraymancer(_params(cell=cgru.Cell(reset_after=False)))
    t = convert.to_arraymancer(_params(3, 2, 2))
    with pytest.raises(ValueError, match=r"bU3s: expected shape \[2, 1, 6\]"):
        convert.from_arraymancer(**dict(t, bU3s=t["bU3s"][:, 0]))


# --- oneDNN: its documented equations (doc/primitives/rnn.md, GRU and LBR GRU) ---------------
def _onednn(x, wl, wi, bias, direction):
    """oneDNN GRU / LBR GRU over ldigo/ldgo tensors: u, r, o gates,
    h = u·h + (1 − u)·o; LBR: o = tanh(W_o·x + r·(U_o·h + B_u') + B_o)."""
    L, D, _, _, H = wl.shape
    lbr = bias.shape[2] == 4
    sig = _ACT["sigmoid"]
    T, N, _ = x.shape
    for l in range(L):
        out = np.zeros((T, N, D * H))
        for d in range(D):
            Wl, Wi, B = wl[l, d], wi[l, d], bias[l, d]          # [I,3,H], [H,3,H], [G,H]
            h = np.zeros((N, H))
            backwards = d == 1 or direction == "unidirectional_right2left"
            for t in (reversed(range(T)) if backwards else range(T)):
                u = sig(x[t] @ Wl[:, 0] + h @ Wi[:, 0] + B[0])
                r = sig(x[t] @ Wl[:, 1] + h @ Wi[:, 1] + B[1])
                if lbr:
                    o = np.tanh(x[t] @ Wl[:, 2] + r * (h @ Wi[:, 2] + B[3]) + B[2])
                else:
                    o = np.tanh(x[t] @ Wl[:, 2] + (r * h) @ Wi[:, 2] + B[2])
                h = u * h + (1 - u) * o
                out[t, :, d * H:(d + 1) * H] = h
        x = out
    return x


@pytest.mark.parametrize("lbr", [False, True])
@pytest.mark.parametrize("direction", ["unidirectional_left2right", "unidirectional_right2left",
                                       "bidirectional_concat"])
def test_onednn_tensors_compute_the_onednn_function(lbr, direction):
    D, H = (2, 2) if direction == "bidirectional_concat" else (1, 3)
    L, I = 2, D * H
    rng = _rng(35 + lbr)
    wl = rng.uniform(-0.9, 0.9, (L, D, I, 3, H))
    wi = rng.uniform(-0.9, 0.9, (L, D, H, 3, H))
    bias = rng.uniform(-0.9, 0.9, (L, D, 4 if lbr else 3, H))
    net = convert.from_onednn(wl, wi, bias, direction=direction)
    assert net.cell.reset_after == lbr
    x = _x(4, 3, I, seed=36)
    np.testing.assert_allclose(_run(net, x)[0], _onednn(x, wl, wi, bias, direction), **F64)
    back = convert.to_onednn(net)
    assert back["cell_kind"] == ("lbr_gru" if lbr else "vanilla_gru")
    assert back["direction"] == direction
    for k, v in (("weights_layer", wl), ("weights_iter", wi), ("bias", bias)):
        np.testing.assert_array_equal(back[k], v, err_msg=k)


def test_canonical_to_onednn_and_refusals():
    p = _params(5, 2, 1, "bidirectional", seed=37)
    for reset_after in (False, True):
        t = convert.to_onednn(p.with_cell(cgru.Cell(reset_after=reset_after)))
        assert t["bias"].shape == (1, 2, 4 if reset_after else 3, 2)
        x = _x(3, 2, 5, seed=38)
        np.testing.assert_allclose(_onednn(x, t["weights_layer"], t["weights_iter"], t["bias"],
                                           t["direction"]),
                                   _run(p.with_cell(cgru.Cell(reset_after=reset_after)), x)[0],
                                   **F64)
    with pytest.raises(ValueError, match="input_size == D·H"):
        convert.to_onednn(_params(5, 2, 2))
    with pytest.raises(ValueError, match="flip_z"):
        convert.to_onednn(p.with_cell(cgru.Cell(flip_z=True)))
    with pytest.raises(ValueError, match="fixed activations"):
        convert.to_onednn(p.with_cell(cgru.Cell(g="relu")))
    with pytest.raises(ValueError, match="reset-before"):
        convert.to_onednn(p, cell_kind="vanilla_gru")
    t = convert.to_onednn(p)
    with pytest.raises(ValueError, match="bidirectional_sum"):
        convert.from_onednn(t["weights_layer"], t["weights_iter"], t["bias"],
                            direction="bidirectional_sum")


# --- the network carries its cell: from_* results compute the source's function ------------
# Each model goes through cgru.forward WITHOUT a cell argument and is compared with the source
# system's own answer.  Before networks carried their cells, these conversions returned
# (Params, Cell) and a forgotten cell silently computed cuDNN's cell instead.
def _onnx_system(X, layer, attrs):
    """``Y`` of one ONNX GRU node as the ONNX side computes it: onnxruntime where it is
    installed, the ONNX reference evaluator otherwise."""
    pytest.importorskip("onnx")
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        if "activations" in attrs or "clip" in attrs:
            pytest.skip("the ONNX reference evaluator's GRU has the default activations only")
        from onnx import TensorProto, helper
        from onnx.reference import ReferenceEvaluator
        node = helper.make_node("GRU", ["X", "W", "R", "B"], ["Y", "Y_h"], **attrs)
        vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "XWRB"]
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h")]
        model = helper.make_model(helper.make_graph([node], "g", vis, outs),
                                  opset_imports=[helper.make_opsetid("", 22)])
        return ReferenceEvaluator(model).run(None, {"X": X, **layer})[0]
    return _ort_node(X, layer, attrs)[0]


@pytest.mark.parametrize("attrs", [
    {},                                                    # ONNX's default: reset-before
    {"direction": "reverse"},
    {"direction": "bidirectional"},
    {"direction": "bidirectional", "activations": ["HardSigmoid", "Softsign"] * 2,
     "activation_alpha": [0.3] * 2, "activation_beta": [0.4] * 2, "clip": 1.5},
], ids=["default", "reverse", "bidirectional", "bidirectional-activations-clip"])
def test_from_onnx_network_computes_the_onnx_function_without_a_cell(attrs):
    D = 2 if attrs.get("direction") == "bidirectional" else 1
    H, I, T, N = 3, 4, 5, 2
    rng = _rng(60)
    layer = {"W": rng.uniform(-1, 1, (D, 3 * H, I)).astype(np.float32),
             "R": rng.uniform(-1, 1, (D, 3 * H, H)).astype(np.float32),
             "B": rng.uniform(-1, 1, (D, 6 * H)).astype(np.float32)}
    X = _x(T, N, I, seed=61, dtype=np.float32)
    attrs = dict(hidden_size=H, **attrs)
    Y = _onnx_system(X, layer, attrs)
    net = convert.from_onnx(layer, **attrs)
    assert not net.cell.reset_after                       # linear_before_reset=0
    y = cgru.forward(net, X).y
    np.testing.assert_allclose(y, Y.transpose(0, 2, 1, 3).reshape(T, N, D * H), **F32)
    # cuDNN's cell on the same weights is another function: the cell is not a detail
    cudnn = cgru.forward(net.with_cell(cgru.Cell()), X).y
    assert np.abs(cudnn - y).max() > 1e-2


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("act,rec_act", [("tanh", "sigmoid"), ("softsign", "relu")])
def test_from_keras_reset_before_network_computes_the_keras_function_without_a_cell(
        bidirectional, act, rec_act):
    weights = _random_keras(3, 2, 2, False, bidirectional, seed=62)
    net = convert.from_keras(weights, reset_after=False, bidirectional=bidirectional,
                             activation=act, recurrent_activation=rec_act)
    x = _x(5, 3, 3, seed=63).transpose(1, 0, 2).copy()                 # [N, T, I]
    y = cgru.forward(net, x, batch_major=True).y
    np.testing.assert_allclose(y, _keras_stack(x, weights, False, bidirectional, act, rec_act),
                               **F64)
    cudnn = cgru.forward(net.with_cell(cgru.Cell()), x, batch_major=True).y
    assert np.abs(cudnn - y).max() > 1e-3


@pytest.mark.parametrize("desc", [
    {},                                                    # MPSGraph's default: reset-before
    {"reset_gate_first": True, "flip_z": True, "update_gate_activation": "hard_sigmoid"},
    {"reverse": True, "reset_after": True, "output_gate_activation": "relu"},
    {"bidirectional": True, "reset_gate_activation": "none", "flip_z": True},
], ids=["default", "rgf-flipz-hardsigmoid", "reverse-resetafter-relu", "bidirectional"])
def test_from_mps_network_computes_the_mps_function_without_a_cell(desc):
    from cgru import mps
    D = 2 if desc.get("bidirectional") else 1
    (op,) = _random_mps(3, 2, 1, D, desc.get("reset_after", False), seed=64)
    x = _x(4, 3, 3, seed=65)
    want = mps.gru(x, op["recurrent_weight"], op["input_weight"], op["bias"],
                   secondary_bias=op["secondary_bias"],
                   descriptor=mps.GRUDescriptor(**desc))[0]
    net = convert.from_mps([op], **desc)
    np.testing.assert_allclose(cgru.forward(net, x).y, want, **F64)


def test_a_contradicting_cell_is_refused():
    net = convert.from_onnx({"W": _rng(66).uniform(-1, 1, (1, 6, 3)),
                             "R": _rng(67).uniform(-1, 1, (1, 6, 2))})      # reset-before
    x = _x(4, 2, 3, seed=68)
    # the old silent mismatch — running an ONNX model with cuDNN's cell — cannot happen
    with pytest.raises(ValueError, match="contradicts the network's own cell"):
        cgru.forward(net, x, cell=cgru.Cell())
    for to in (lambda: convert.to_torch(net, cgru.Cell()),
               lambda: convert.to_onnx(net, cgru.Cell(reset_after=True)),
               lambda: convert.to_keras(net, cgru.Cell(flip_z=True)),
               lambda: convert.to_mps(net, cgru.Cell()),
               lambda: convert.to_onednn(net, cgru.Cell()),
               lambda: convert.to_tf_canonical(net, cgru.Cell()),
               lambda: convert.to_arraymancer(net, cgru.Cell())):
        with pytest.raises(ValueError, match="contradicts the network's own cell"):
            to()
    # the same cell is redundant (a DeprecationWarning), and converts
    with pytest.warns(DeprecationWarning, match="redundant"):
        layers, attrs = convert.to_onnx(net, net.cell)
    assert attrs["linear_before_reset"] == 0


def test_the_old_explicit_cell_form_still_works_with_a_warning():
    p = _params(seed=69)                        # a network built without a cell
    cell = cgru.Cell(reset_after=False)
    with pytest.warns(DeprecationWarning, match="deprecated"):
        layers, attrs = convert.to_onnx(p, cell)
    assert attrs["linear_before_reset"] == 0
    _assert_params_equal(convert.from_onnx(layers, **attrs), p)


def test_option_strings_may_be_bytes():
    """ONNX attributes (onnx.helper.get_attribute_value) and TF's op.get_attr give bytes."""
    p = _params(3, 2, 1, "bidirectional", seed=70)
    layers, attrs = convert.to_onnx(p.with_cell(cgru.Cell(f_r="relu", f_z="relu", g="elu")))
    as_bytes = dict(attrs, direction=attrs["direction"].encode(),
                    activations=[a.encode() for a in attrs["activations"]])
    _assert_params_equal(convert.from_onnx(layers, **as_bytes), convert.from_onnx(layers, **attrs))
    assert convert.from_onnx(layers, **as_bytes).cell == convert.from_onnx(layers, **attrs).cell
    keras = _random_keras(3, 2, 1, True, False, seed=71)
    assert convert.from_keras(keras, activation=b"relu", recurrent_activation=b"linear").cell \
        == convert.from_keras(keras, activation="relu", recurrent_activation="linear").cell
    ops = _random_mps(3, 2, 1, 1, False, seed=72)
    assert convert.from_mps(ops, update_gate_activation=b"hard_sigmoid",
                            reset_gate_activation=b"none", output_gate_activation=b"relu").cell \
        == convert.from_mps(ops, update_gate_activation="hard_sigmoid",
                            reset_gate_activation="none", output_gate_activation="relu").cell
    o = convert.to_onednn(p, cell_kind=b"lbr_gru")
    assert o["cell_kind"] == "lbr_gru"
    _assert_params_equal(convert.from_onednn(o["weights_layer"], o["weights_iter"], o["bias"],
                                             direction=o["direction"].encode()),
                         convert.from_onednn(o["weights_layer"], o["weights_iter"], o["bias"],
                                             direction=o["direction"]))
    w, b = convert.to_tf_canonical(p)
    _assert_params_equal(convert.from_tf_canonical(w, b, direction=b"bidirectional",
                                                   input_mode=b"linear"), p)
    with pytest.raises(ValueError, match="direction"):
        convert.from_onnx(layers, **dict(attrs, direction=b"Bidirectional"))
    with pytest.raises(ValueError, match="activation"):
        convert.from_keras(keras, activation=b"gelu")
    with pytest.raises(ValueError, match="direction"):
        convert.from_onednn(o["weights_layer"], o["weights_iter"], o["bias"],
                            direction=b"bidirectional_sum")


# --- the conversion matrix -------------------------------------------------------------------
# Rows: source, columns: target, for a one-layer forward model with the system's default
# activations.  E = exact (bit for bit), S = exact (bias sums), R = refused.  This is the
# README's table (there with the reasons spelled out).
MATRIX = """
            PT TF AM O1 O0 KA KB MA MB DL DG
PyTorch     E  E  E  E  R  E  R  S  R  S  R
TF          E  E  E  E  R  E  R  S  R  S  R
Arraymancer E  E  E  E  R  E  R  S  R  S  R
ONNX1       E  E  E  E  R  E  R  S  R  S  R
ONNX0       R  R  R  R  E  R  S  R  S  R  S
KerasRA     E  E  E  E  R  E  R  S  R  S  R
KerasRB     R  R  R  R  E  R  E  R  E  R  E
MpsRA       E  E  E  E  R  E  R  E  R  E  R
MpsRB       R  R  R  R  E  R  E  R  E  R  E
OnednnLBR   E  E  E  E  R  E  R  E  R  E  R
OnednnGRU   R  R  R  R  E  R  E  R  E  R  E
"""


def _native(system, I=3, H=2, seed=0):
    """A random one-layer forward model in ``system``'s own tensors, as a network (with the
    system's cell)."""
    rng = _rng(seed)
    u = lambda *s: rng.uniform(-0.9, 0.9, s)        # noqa: E731
    if system in ("PyTorch", "TF", "Arraymancer"):
        p = convert.from_torch({"weight_ih_l0": u(3 * H, I), "weight_hh_l0": u(3 * H, H),
                                "bias_ih_l0": u(3 * H), "bias_hh_l0": u(3 * H)})
        if system == "TF":
            return convert.from_tf_canonical(*convert.to_tf_canonical(p))
        return convert.from_arraymancer(**convert.to_arraymancer(p)) \
            if system == "Arraymancer" else p
    if system.startswith("ONNX"):
        return convert.from_onnx({"W": u(1, 3 * H, I), "R": u(1, 3 * H, H), "B": u(1, 6 * H)},
                                 linear_before_reset=int(system == "ONNX1"))
    if system.startswith("Keras"):
        ra = system == "KerasRA"
        return convert.from_keras([[u(I, 3 * H), u(H, 3 * H), u(2, 3 * H) if ra else u(3 * H)]],
                                  reset_after=ra)
    if system.startswith("Mps"):
        return convert.from_mps(_random_mps(I, H, 1, 1, system == "MpsRA", seed),
                                reset_after=system == "MpsRA")
    lbr = system == "OnednnLBR"
    return convert.from_onednn(u(1, 1, I, 3, H), u(1, 1, H, 3, H), u(1, 1, 4 if lbr else 3, H))


def _through(target, p):
    """Network → ``target``'s tensors → network (the cell travels with the network)."""
    if target == "PT":
        return convert.from_torch(convert.to_torch(p))
    if target == "TF":
        return convert.from_tf_canonical(*convert.to_tf_canonical(p),
                                         direction=p.topology.direction,
                                         input_mode=p.topology.input_mode)
    if target == "AM":
        return convert.from_arraymancer(**convert.to_arraymancer(p))
    if target in ("O1", "O0"):
        layers, attrs = convert.to_onnx(p, linear_before_reset=int(target == "O1"))
        return convert.from_onnx(layers, **attrs)
    if target in ("KA", "KB"):
        ra = target == "KA"
        w = convert.to_keras(p, reset_after=ra)
        return convert.from_keras(w, bidirectional=p.topology.num_directions == 2,
                                  **convert.keras_config(p, reset_after=ra))
    if target in ("MA", "MB"):
        ops, desc = convert.to_mps(p, reset_after=target == "MA")
        return convert.from_mps(ops, **desc)
    t = convert.to_onednn(p, cell_kind="lbr_gru" if target == "DL" else "vanilla_gru")
    return convert.from_onednn(t["weights_layer"], t["weights_iter"], t["bias"],
                               direction=t["direction"])


def _classify(target, p, x):
    try:
        q = _through(target, p)
    except ValueError:
        return "R"
    assert q.cell == p.cell
    y = _run(p, x)[0]
    np.testing.assert_allclose(_run(q, x)[0], y, **F64)
    same = all(np.array_equal(getattr(a, k), getattr(b, k))
               for a, b in zip(p, q) for k in ("W", "R", "b_W", "b_R"))
    if same:
        return "E"
    for a, b in zip(p, q):                # only the biases moved: r/z sums into b_W
        np.testing.assert_array_equal(a.W, b.W)
        np.testing.assert_array_equal(a.R, b.R)
        np.testing.assert_allclose(a.b_W + a.b_R, b.b_W + b.b_R, **F64)
    return "S"


def test_conversion_matrix():
    lines = MATRIX.strip().splitlines()
    targets = lines[0].split()
    x = _x(4, 3, 3, seed=39)
    got, want = {}, {}
    for i, line in enumerate(lines[1:]):
        source, *cells = line.split()
        p = _native(source, seed=40 + i)
        for target, expected in zip(targets, cells):
            want[source, target] = expected
            got[source, target] = _classify(target, p, x)
    assert got == want


# Which targets can express a feature of the source (all other targets refuse it).
FEATURES = {
    "bidirectional": ({"PT", "TF", "O1", "KA", "MA", "DL"},
                      lambda: _params(3, 2, 1, "bidirectional", seed=50, cell=cgru.Cell())),
    "reverse": ({"O1", "MA", "DL"}, lambda: _params(3, 2, 1, "reverse", seed=51,
                                                    cell=cgru.Cell())),
    "relu gates": ({"O1", "KA", "MA"},
                   lambda: _params(seed=52, cell=cgru.Cell(f_r="relu", f_z="relu"))),
    "different gate activations": ({"MA"}, lambda: _params(seed=53, cell=cgru.Cell(f_r="relu"))),
    "clip": ({"O1"}, lambda: _params(seed=54, cell=cgru.Cell(clip=0.5))),
    "flip_z": ({"MA"}, lambda: _params(seed=55, cell=cgru.Cell(flip_z=True))),
    "elu candidate": ({"O1", "KA"}, lambda: _params(seed=56, cell=cgru.Cell(g="elu"))),
    "skip input": ({"PT", "TF", "AM", "O1", "KA", "MA", "DL"},
                   lambda: _params(2, 2, 1, seed=57, input_mode="skip", cell=cgru.Cell())),
}


def _targets_that_express(p, targets, through, seed):
    """The targets among ``targets`` that convert ``p`` (``through(target, p)``), each checked
    to compute ``p``'s function."""
    x = _x(4, 3, p.topology.input_size, seed=seed)
    got = set()
    for target in targets:
        try:
            q = through(target, p)
        except ValueError:
            continue
        got.add(target)
        np.testing.assert_allclose(_run(q, x)[0], _run(p, x)[0], **F64)
    return got


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_features_refused_by_targets_that_lack_them(feature):
    allowed, make = FEATURES[feature]
    assert _targets_that_express(make(), ("PT", "TF", "AM", "O1", "KA", "MA", "DL"), _through,
                                 58) == allowed


# =============================================================================================
# LSTM (with and without a projection) and vanilla RNN: every system that has them
# =============================================================================================
LSTM, RNN_TANH, RNN_RELU = cgru.LSTMCell(), cgru.RNNCell("tanh"), cgru.RNNCell("relu")


def _net(cell, I=3, H=2, L=1, direction="forward", proj=0, seed=0, dtype=np.float64,
         input_mode="linear"):
    topo = cgru.Topology(I, H, L, direction, input_mode, proj_size=proj)
    return cgru.Network.random(topo, dtype, seed=seed, scale=0.8, cell=cell)


def _forward(net, x, h0=None, c0=None, **kw):
    f = cgru.forward(net, x, h0, c0=c0, **kw)
    return f.y, f.hy, f.cy


# --- PyTorch nn.LSTM (proj_size) and nn.RNN ---------------------------------------------------
torch_kind_cases = [("lstm", 0, 1, False, True), ("lstm", 0, 2, True, True),
                    ("lstm", 2, 2, True, True), ("lstm", 1, 3, False, False),
                    ("rnn_tanh", 0, 2, True, True), ("rnn_relu", 0, 2, False, False)]


@pytest.mark.parametrize("mode,proj,L,bidirectional,bias", torch_kind_cases)
def test_torch_lstm_and_rnn_modules_outputs_and_gradients(mode, proj, L, bidirectional, bias):
    torch = pytest.importorskip("torch")
    torch.manual_seed(L + 2 * bidirectional + proj)
    I, H = 4, 3
    if mode == "lstm":
        m = torch.nn.LSTM(I, H, L, bias=bias, bidirectional=bidirectional, proj_size=proj)
    else:
        m = torch.nn.RNN(I, H, L, bias=bias, bidirectional=bidirectional,
                         nonlinearity=mode[4:])
    m = m.double()
    sd = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    net = convert.from_torch(sd, nonlinearity=mode[4:] if mode != "lstm" else None)
    assert net.cell == {"lstm": LSTM, "rnn_tanh": RNN_TANH, "rnn_relu": RNN_RELU}[mode]
    D, S = 2 if bidirectional else 1, proj or H
    assert net.topology == cgru.Topology(I, H, L, "bidirectional" if D == 2 else "forward",
                                         proj_size=proj)
    back = convert.to_torch(net, bias=bias)             # state_dict → network → state_dict
    assert list(back) == list(sd)
    for k in sd:
        np.testing.assert_array_equal(back[k], sd[k])
    assert convert.from_torch(sd, mode=mode).cell == net.cell     # mode confirms

    T, N = 5, 3
    rng = _rng(3)
    x = _x(T, N, I)
    h0 = rng.standard_normal((L * D, N, S))
    c0 = rng.standard_normal((L * D, N, H)) if mode == "lstm" else None
    dy, dhy = rng.standard_normal((T, N, D * S)), rng.standard_normal((L * D, N, S))
    dcy = rng.standard_normal((L * D, N, H)) if mode == "lstm" else None
    tx = torch.from_numpy(x).requires_grad_()
    th = torch.from_numpy(h0).requires_grad_()
    tc = torch.from_numpy(c0).requires_grad_() if mode == "lstm" else None
    y_t, state = m(tx, (th, tc) if mode == "lstm" else th)
    hy_t, cy_t = state if mode == "lstm" else (state, None)
    loss = (y_t * torch.from_numpy(dy)).sum() + (hy_t * torch.from_numpy(dhy)).sum()
    if mode == "lstm":
        loss = loss + (cy_t * torch.from_numpy(dcy)).sum()
    loss.backward()

    f = cgru.forward(net, x, h0, c0=c0, training=True)
    np.testing.assert_allclose(f.y, y_t.detach().numpy(), **F64)
    np.testing.assert_allclose(f.hy, hy_t.detach().numpy(), **F64)
    g = cgru.backward(net, x, f.reserve, dy, dhy, dcy=dcy)
    tol = dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g.dx, tx.grad.numpy(), **tol)
    np.testing.assert_allclose(g.dh0, th.grad.numpy(), **tol)
    if mode == "lstm":
        np.testing.assert_allclose(f.cy, cy_t.detach().numpy(), **F64)
        np.testing.assert_allclose(g.dc0, tc.grad.numpy(), **tol)
    dsd = convert.to_torch(g.dparams)      # bias=False: the bias gradients are just not read
    for name, p in m.named_parameters():
        np.testing.assert_allclose(dsd[name], p.grad.numpy(), **tol, err_msg=name)


def test_from_torch_takes_the_module_itself():
    """The module knows what its state_dict does not: an nn.RNN's nonlinearity."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    x = _rng(2).standard_normal((5, 2, 3)).astype(np.float32)
    for m, cell in [(torch.nn.RNN(3, 4, nonlinearity="relu"), RNN_RELU),
                    (torch.nn.RNN(3, 4, 2, bidirectional=True), RNN_TANH),
                    (torch.nn.GRU(3, 4), cgru.Cell()),
                    (torch.nn.LSTM(3, 4, proj_size=2), LSTM)]:
        net = convert.from_torch(m)
        assert net.cell == cell
        with torch.no_grad():
            want = m(torch.from_numpy(x))[0].numpy()
        np.testing.assert_allclose(cgru.forward(net, x).y, want, rtol=1e-5, atol=1e-6)
    relu = torch.nn.RNN(3, 4, nonlinearity="relu")
    assert convert.from_torch(relu, mode="rnn_relu").cell == RNN_RELU
    with pytest.raises(ValueError, match=r"mode='rnn_tanh' contradicts the module's own mode "
                                         r"'rnn_relu'"):
        convert.from_torch(relu, mode="rnn_tanh")
    with pytest.raises(TypeError, match=r"^state_dict: expected a torch.nn.GRU, nn.LSTM or "
                                        r"nn.RNN module or a state_dict"):
        convert.from_torch(torch.nn.Linear(3, 4))


def test_from_torch_reads_the_kind_and_refuses_contradictions():
    H, I, u = 3, 2, lambda *s: _rng(1).uniform(-1, 1, s)
    sd = lambda G, S=H: {"weight_ih_l0": u(G * H, I), "weight_hh_l0": u(G * H, S),  # noqa: E731
                         "bias_ih_l0": u(G * H), "bias_hh_l0": u(G * H)}
    assert convert.from_torch(sd(3)).cell == cgru.Cell()
    assert convert.from_torch(sd(4)).cell == LSTM
    with pytest.raises(ValueError, match=r"^nonlinearity: an nn.RNN state_dict does not record "
                                         r"whether the RNN is tanh or relu"):
        convert.from_torch(sd(1))                  # read as tanh, a relu RNN was 0.76 off
    assert convert.from_torch(sd(1), nonlinearity="tanh").cell == RNN_TANH
    assert convert.from_torch(sd(1), nonlinearity="relu").cell == RNN_RELU
    assert convert.from_torch(sd(1), mode=b"rnn_relu").cell == RNN_RELU
    proj = dict(sd(4, 2), weight_hr_l0=u(2, H))
    assert convert.from_torch(proj).topology.proj_size == 2
    for kw, match in [
        (dict(mode="lstm"), r"mode='lstm' \(nn.LSTM, weight_hh \[4H, H\]\) contradicts the "
                            r"state_dict: state_dict\['weight_hh_l0'\] \[9, 3\] is nn.GRU's"),
        (dict(mode="gru"), r"mode='gru'.*nn.LSTM's"),
        (dict(nonlinearity="relu"), r"^nonlinearity: is nn.RNN's option"),
        (dict(mode="rnn"), r"^mode: expected one of"),
    ]:
        with pytest.raises(ValueError, match=match):
            convert.from_torch(sd(3) if "lstm" in str(kw) or "relu" in str(kw) or
                               kw.get("mode") == "rnn" else sd(4), **kw)
    with pytest.raises(ValueError, match=r"nonlinearity='tanh' contradicts mode='rnn_relu'"):
        convert.from_torch(sd(1), mode="rnn_relu", nonlinearity="tanh")
    with pytest.raises(ValueError, match=r"^state_dict\['weight_hh_l0'\]: expected \[G·H, H\] "
                                         r"with G = 3 \(nn.GRU\), 4 \(nn.LSTM\) or 1"):
        convert.from_torch(sd(2))
    with pytest.raises(ValueError, match=r"mode='gru'.*an nn.LSTM with a projection"):
        convert.from_torch(proj, mode="gru")
    with pytest.raises(ValueError, match=r"weight_hh_l0'\]: expected \[G·H, H\]"):
        convert.from_torch(dict(proj, weight_hr_l0=u(2, H + 1)))        # 4H ≠ 4·(H+1)
    bad = dict(proj)
    del bad["weight_hr_l0"]                           # weight_hh [4H, P] alone fits no module
    with pytest.raises(ValueError, match=r"got \[12, 2\]"):
        convert.from_torch(bad)


def test_torch_refusals_for_lstm_and_rnn():
    for cell, match in [(cgru.LSTMCell(clip=2.0), "no clip"),
                        (cgru.LSTMCell(g="relu"), "fixed activations"),
                        (cgru.RNNCell("sigmoid"), "no activation equal to the source's sigmoid"),
                        (cgru.RNNCell("relu", clip=1.0), "no clip")]:
        with pytest.raises(ValueError, match=match):
            convert.to_torch(_net(cell))
    with pytest.raises(ValueError, match="direction='reverse'"):
        convert.to_torch(_net(LSTM, direction="reverse"))
    with pytest.raises(ValueError, match=r"nn.LSTM\(bias=False\) has no biases"):
        convert.to_torch(_net(LSTM), bias=False)


# --- Keras LSTM and SimpleRNN: their equations, written out -----------------------------------
def _keras_lstm(x, kernel, rec, bias, act, rec_act, go_backwards=False):
    """One Keras LSTM layer (its LSTMCell), batch-major ``x [N, T, I]``, outputs in processing
    order: c = f·c + i·act(z_c), h = o·act(c); gates i, f, c, o; one bias."""
    N, T, _ = x.shape
    H = rec.shape[0]
    f_, g_ = _ACT[rec_act], _ACT[act]
    b = np.zeros(4 * H) if bias is None else bias
    h, c = np.zeros((N, H)), np.zeros((N, H))
    outs = []
    for t in (reversed(range(T)) if go_backwards else range(T)):
        z = x[:, t] @ kernel + h @ rec + b
        i, f, cc, o = (z[:, k * H:(k + 1) * H] for k in range(4))
        c = f_(f) * c + f_(i) * g_(cc)
        h = f_(o) * g_(c)
        outs.append(h)
    return np.stack(outs, axis=1)


def _keras_simple_rnn(x, kernel, rec, bias, act, rec_act=None, go_backwards=False):
    """One Keras SimpleRNN layer: h = act(x·K + h·U + b)."""
    N, T, _ = x.shape
    H = rec.shape[0]
    b = np.zeros(H) if bias is None else bias
    h, outs = np.zeros((N, H)), []
    for t in (reversed(range(T)) if go_backwards else range(T)):
        h = _ACT[act](x[:, t] @ kernel + h @ rec + b)
        outs.append(h)
    return np.stack(outs, axis=1)


def _keras_layers(x, layers, layer_fn, bidirectional, act="tanh", rec_act="sigmoid"):
    """Stacked layers / ``Bidirectional(merge_mode='concat')``, return_sequences."""
    for w in layers:
        per = len(w) // (2 if bidirectional else 1)
        run = lambda ws, back=False: layer_fn(x, ws[0], ws[1], ws[2] if per == 3 else None,  # noqa
                                              act, rec_act, go_backwards=back)
        y = run(w[:per])
        if bidirectional:
            y = np.concatenate([y, run(w[per:], True)[:, ::-1]], axis=-1)
        x = y
    return x


def _random_keras_kind(G, I, H, L, bidirectional, use_bias=True, seed=0):
    rng = _rng(seed)
    D = 2 if bidirectional else 1
    return [[a for _ in range(D) for a in
             [rng.uniform(-0.8, 0.8, (I if l == 0 else D * H, G * H)),
              rng.uniform(-0.8, 0.8, (H, G * H))] +
             ([rng.uniform(-0.8, 0.8, (G * H,))] if use_bias else [])] for l in range(L)]


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("layer,act,rec_act", [
    ("LSTM", "tanh", "sigmoid"), ("LSTM", "softsign", "relu"), ("SimpleRNN", "tanh", None),
    ("SimpleRNN", "relu", None), ("SimpleRNN", "linear", None)])
def test_keras_lstm_and_simple_rnn_compute_the_keras_function(layer, act, rec_act,
                                                              bidirectional):
    G, fn = (4, _keras_lstm) if layer == "LSTM" else (1, _keras_simple_rnn)
    weights = _random_keras_kind(G, 3, 2, 2, bidirectional, seed=80 + G)
    net = convert.from_keras(weights, bidirectional=bidirectional, activation=act,
                             recurrent_activation=rec_act)
    assert net.cell.kind == ("lstm" if G == 4 else "rnn")
    assert convert.from_keras(weights, bidirectional=bidirectional, activation=act,
                              recurrent_activation=rec_act, layer=layer).cell == net.cell
    x = _x(3, 4, 5, seed=81).transpose(1, 0, 2)[:, :, :3].copy()          # [N, T, I]
    y, _, _ = _forward(net, x, batch_major=True)
    np.testing.assert_allclose(y, _keras_layers(x, weights, fn, bidirectional, act, rec_act),
                               **F64)
    back = convert.to_keras(net)                      # Keras → network → Keras is bitwise
    for wa, wb in zip(back, weights):
        assert len(wa) == len(wb)
        for a, b in zip(wa, wb):
            np.testing.assert_array_equal(a, b)
    cfg = {"activation": act} if G == 1 else {"activation": act, "recurrent_activation": rec_act}
    assert convert.keras_config(net) == cfg
    for lp in net:                                    # the one bias maps to b_W, b_R = 0
        assert not np.any(lp.b_R)


@pytest.mark.parametrize("cell", [LSTM, cgru.LSTMCell(f_i="relu", f_f="relu", f_o="relu",
                                                      g="elu", h="elu"), RNN_RELU,
                                  cgru.RNNCell("softplus")], ids=str)
def test_canonical_lstm_and_rnn_to_keras_keep_the_function(cell):
    p = _net(cell, 3, 2, 2, "bidirectional", seed=82)
    weights = convert.to_keras(p)
    cfg = convert.keras_config(p)
    x = _x(4, 3, 3, seed=83).transpose(1, 0, 2).copy()
    fn = _keras_lstm if cell.kind == "lstm" else _keras_simple_rnn
    np.testing.assert_allclose(_keras_layers(x, weights, fn, True, cfg["activation"],
                                             cfg.get("recurrent_activation")),
                               _forward(p, x, batch_major=True)[0], **F64)
    q = convert.from_keras(weights, bidirectional=True, **cfg)
    assert q.cell == cell
    for lp, lq in zip(p, q):              # one Keras bias: the sums, exact as a function
        np.testing.assert_array_equal(lq.W, lp.W)
        np.testing.assert_array_equal(lq.R, lp.R)
        np.testing.assert_array_equal(lq.b_W, lp.b_W + lp.b_R)
        assert not np.any(lq.b_R)


def test_keras_refusals_for_lstm_and_rnn():
    lstm = _random_keras_kind(4, 3, 2, 1, False, seed=84)
    rnn = _random_keras_kind(1, 3, 2, 1, False, seed=85)
    for net, match in [
        (_net(LSTM, proj=1), "Keras LSTM has no LSTM recurrent projection"),
        (_net(cgru.LSTMCell(g="relu")), r"one activation for the cell input and the output"),
        (_net(cgru.LSTMCell(f_f="relu")), r"one activation for the i, f and o gates"),
        (_net(cgru.LSTMCell(clip=1.0)), "Keras LSTM has no clip"),
        (_net(cgru.RNNCell("hard_sigmoid")), "Keras SimpleRNN has no activation equal"),
        (_net(LSTM, direction="reverse"), "go_backwards"),
    ]:
        with pytest.raises(ValueError, match=match):
            convert.to_keras(net)
    with pytest.raises(ValueError, match=r"^reset_after: is a Keras GRU option"):
        convert.keras_config(LSTM, reset_after=True)
    with pytest.raises(ValueError, match=r"^reset_after: is a Keras GRU option"):
        convert.from_keras(lstm, reset_after=False)
    with pytest.raises(ValueError, match=r"^recurrent_activation: a Keras SimpleRNN has none"):
        convert.from_keras(rnn, recurrent_activation="sigmoid")
    with pytest.raises(ValueError, match=r"^layer='GRU' contradicts the weights: layers\[0\] "
                                         r"recurrent_kernel \[2, 8\] is a Keras LSTM's"):
        convert.from_keras(lstm, layer="GRU")
    with pytest.raises(ValueError, match=r"^layers\[0\] recurrent_kernel: expected shape "
                                         r"\[H, G·H\]"):
        convert.from_keras([[lstm[0][0][:, :4], lstm[0][1][:, :4]]])        # G = 2
    with pytest.raises(ValueError, match=r"bias: expected shape \[8\]"):
        convert.from_keras([[lstm[0][0], lstm[0][1], np.zeros((2, 8))]])


# --- TF canonical lists and opaque params for every mode --------------------------------------
@pytest.mark.parametrize("cell,proj", [(LSTM, 0), (LSTM, 2), (RNN_TANH, 0), (RNN_RELU, 0)],
                         ids=["lstm", "lstm_proj", "rnn_tanh", "rnn_relu"])
def test_tf_canonical_and_opaque_every_mode(cell, proj):
    p = _net(cell, 3, 3, 2, "bidirectional", proj=proj, seed=86, dtype=np.float32)
    mode = "lstm" if cell.kind == "lstm" else f"rnn_{cell.activation.name}"
    weights, biases = convert.to_tf_canonical(p)
    G, H, K = cell.gates, 3, 2 * cell.gates + bool(proj)
    assert len(weights) == K * 4 and len(biases) == 2 * G * 4
    q = convert.from_tf_canonical(weights, biases, direction="bidirectional", rnn_mode=mode)
    _assert_params_equal(q, p)
    assert q.cell == cell
    # index (l·D + d)·K + k: PyTorch's row blocks (same gate order), the projection last
    sd = convert.to_torch(p)
    for i in range(4):
        sfx = f"_l{i // 2}" + ("_reverse" if i % 2 else "")
        for k in range(2 * G):
            name = ("weight_ih" if k < G else "weight_hh") + sfx
            blk = slice((k % G) * H, (k % G + 1) * H)
            np.testing.assert_array_equal(weights[i * K + k], sd[name][blk])
            np.testing.assert_array_equal(
                biases[i * 2 * G + k], sd[("bias_ih" if k < G else "bias_hh") + sfx][blk])
        if proj:
            np.testing.assert_array_equal(weights[i * K + K - 1], sd["weight_hr" + sfx])
    flat = convert.to_tf_opaque(p)
    np.testing.assert_array_equal(flat, np.concatenate([w.ravel() for w in weights + biases]))
    _assert_params_equal(convert.from_tf_opaque(flat, p.topology, rnn_mode=mode), p)
    # the lists do not say their mode: the wrong one is refused by the shapes
    with pytest.raises(ValueError, match=r"rnn_mode='gru'|weights\[3\]"):
        convert.from_tf_canonical(weights, biases, direction="bidirectional")


def test_tf_refusals_for_lstm_and_rnn():
    for net, match in [(_net(cgru.LSTMCell(clip=1.0)), "no clip"),
                       (_net(cgru.LSTMCell(h="relu")), "fixed activations"),
                       (_net(cgru.RNNCell("sigmoid")), "no activation equal"),
                       (_net(RNN_TANH, direction="reverse"), "direction='reverse'")]:
        with pytest.raises(ValueError, match=match):
            convert.to_tf_canonical(net)
    w, b = convert.to_tf_canonical(_net(LSTM))
    with pytest.raises(ValueError, match=r"expected two lists of 8·L·D entries \(9·L·D weights "
                                         r"with a projection\) for rnn_mode='lstm'"):
        convert.from_tf_canonical(w[:-1], b, rnn_mode="lstm")
    with pytest.raises(ValueError, match="rnn_mode"):
        convert.from_tf_canonical(w, b, rnn_mode="LSTM")


# --- ONNX LSTM and RNN: against onnxruntime ---------------------------------------------------
def _ort(op, X, layer, attrs):
    """One ONNX ``op`` node (LSTM / RNN / GRU) in onnxruntime (float32): its ``Y``."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    names = ["X", "W", "R", "B"] + (["", "", "", "P"] if "P" in layer else [])
    feeds = {"X": X, **layer}
    node = helper.make_node(op, names, ["Y"], **attrs)
    vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n]
    model = helper.make_model(
        helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(
            "Y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 22)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


onnx_kind_cases = [
    ("LSTM", "forward", {}), ("LSTM", "bidirectional", {}), ("LSTM", "reverse", {"P": True}),
    ("LSTM", "bidirectional", dict(activations=["HardSigmoid", "Softsign", "Elu"] * 2,
                                   activation_alpha=[0.3, 0.8] * 2, activation_beta=[0.6] * 2,
                                   clip=1.2)),
    ("RNN", "forward", {}), ("RNN", "bidirectional", dict(activations=["Relu"] * 2)),
    ("RNN", "reverse", dict(activations=["LeakyRelu"], activation_alpha=[0.2], clip=0.9)),
]


@pytest.mark.parametrize("op,direction,extra", onnx_kind_cases)
def test_onnx_lstm_and_rnn_nodes_compute_the_onnxruntime_function(op, direction, extra):
    D = 2 if direction == "bidirectional" else 1
    G = 4 if op == "LSTM" else 1
    H, I, T, N = 3, 4, 5, 3
    rng = _rng(87 + G)
    layer = {"W": rng.uniform(-1, 1, (D, G * H, I)).astype(np.float32),
             "R": rng.uniform(-1, 1, (D, G * H, H)).astype(np.float32),
             "B": rng.uniform(-1, 1, (D, 2 * G * H)).astype(np.float32)}
    extra = dict(extra)
    if extra.pop("P", False):                    # all-zero peepholes: the same function
        layer["P"] = np.zeros((D, 3 * H), np.float32)
    attrs = dict(hidden_size=H, direction=direction, **extra)
    X = _x(T, N, I, seed=88, dtype=np.float32)
    Y = _ort(op, X, layer, attrs)
    net = convert.from_onnx(layer, op_type=op, **attrs)
    assert net.cell.kind == ("lstm" if op == "LSTM" else "rnn")
    np.testing.assert_allclose(_forward(net, X)[0],
                               Y.transpose(0, 2, 1, 3).reshape(T, N, D * H), **F32)
    layers, attrs2 = convert.to_onnx(net)            # ONNX → network → ONNX, bit for bit
    for k in "WRB":
        np.testing.assert_array_equal(layers[0][k], layer[k])
    assert "P" not in layers[0] and attrs2 == attrs


def test_canonical_lstm_stack_to_onnx_nodes_in_onnxruntime():
    cell = cgru.LSTMCell(f_i="hard_sigmoid", f_f="hard_sigmoid", f_o="hard_sigmoid",
                         g="identity", h="softsign", clip=1.5)
    p = _net(cell, 4, 3, 2, "bidirectional", seed=89, dtype=np.float32)
    layers, attrs = convert.to_onnx(p)
    assert attrs["activations"] == ["HardSigmoid", "Affine", "Softsign"] * 2
    X = x = _x(5, 3, 4, seed=90, dtype=np.float32)
    for layer in layers:
        Y = _ort("LSTM", x, layer, attrs)
        x = np.ascontiguousarray(Y.transpose(0, 2, 1, 3).reshape(5, 3, 6))
    np.testing.assert_allclose(x, _forward(p, X)[0], **F32)
    q = convert.from_onnx(layers, op_type="LSTM", **attrs)
    assert q.cell == cell
    _assert_params_equal(q, p)


@pytest.mark.parametrize("direction,input_forget,peep", [
    ("forward", 0, True), ("reverse", 1, False), ("bidirectional", 1, True),
    ("bidirectional", 0, "first")])
def test_onnx_lstm_peepholes_and_input_forget_convert_exactly(direction, input_forget, peep):
    """ONNX P [D, 3H] (i, o, f) and input_forget=1 map onto LSTMCell(peepholes, input_forget)
    and LayerParams.P (i, f, o): the network computes onnxruntime's function, and converts
    back bit for bit."""
    D = 2 if direction == "bidirectional" else 1
    H, I, T, N = 3, 4, 5, 3
    rng = _rng(97 + D + input_forget)
    layer = {"W": rng.uniform(-1, 1, (D, 4 * H, I)).astype(np.float32),
             "R": rng.uniform(-1, 1, (D, 4 * H, H)).astype(np.float32),
             "B": rng.uniform(-1, 1, (D, 8 * H)).astype(np.float32)}
    if peep:
        layer["P"] = rng.uniform(-1, 1, (D, 3 * H)).astype(np.float32)
        if peep == "first":                    # one direction without peepholes: zeros
            layer["P"][1:] = 0
    attrs = dict(hidden_size=H, direction=direction, clip=2.5)
    if input_forget:
        attrs["input_forget"] = 1
    X = _x(T, N, I, seed=98, dtype=np.float32)
    Y = _ort("LSTM", X, layer, attrs)
    net = convert.from_onnx(layer, op_type="LSTM", **attrs)
    assert net.cell.peepholes == ("ifo" if peep else False)
    assert net.cell.input_forget == bool(input_forget)
    if peep:        # canonical P = [P_i, P_f, P_o] of ONNX's [P_i, P_o, P_f]
        np.testing.assert_array_equal(net[0].P, layer["P"][0][np.r_[0:H, 2 * H:3 * H, H:2 * H]])
    np.testing.assert_allclose(_forward(net, X)[0],
                               Y.transpose(0, 2, 1, 3).reshape(T, N, D * H), **F32)
    layers, attrs2 = convert.to_onnx(net)
    assert attrs2 == attrs and sorted(layers[0]) == sorted(layer)
    for k in layer:
        np.testing.assert_array_equal(layers[0][k], layer[k])
    # the coupled gates ignore the forget gate's own weights (and P_f), as onnxruntime does
    if input_forget:
        other = {k: v.copy() for k, v in layer.items()}
        other["W"][:, 2 * H:3 * H] += 1.0
        if peep:
            other["P"][:, 2 * H:] += 1.0
        np.testing.assert_array_equal(_forward(convert.from_onnx(other, op_type="LSTM", **attrs),
                                               X)[0], _forward(net, X)[0])


def test_onnx_zero_peepholes_are_no_peepholes():
    """An all-zero P is the same function as none: no peephole cell (cuDNN's fast LSTM), and
    P is not written back; a stack where one node has peepholes gives every node P."""
    lstm_layers, attrs = convert.to_onnx(_net(LSTM, L=2, seed=99))
    zero = [dict(l, P=np.zeros((1, 6))) for l in lstm_layers]
    net = convert.from_onnx(zero, op_type="LSTM", **attrs)
    assert net.cell == LSTM and "P" not in convert.to_onnx(net)[0][0]
    P = np.zeros((1, 6))
    P[0, 2] = 0.5
    net = convert.from_onnx([dict(lstm_layers[0], P=P), lstm_layers[1]], op_type="LSTM", **attrs)
    assert net.cell.peepholes
    back, _ = convert.to_onnx(net)
    np.testing.assert_array_equal(back[0]["P"], P)
    np.testing.assert_array_equal(back[1]["P"], np.zeros((1, 6)))


def test_onnx_refusals_for_lstm_and_rnn():
    lstm_layers, lstm_attrs = convert.to_onnx(_net(LSTM, seed=91))
    for net, kw, match in [
        (_net(LSTM, proj=1), {}, "ONNX LSTM has no LSTM recurrent projection"),
        (_net(cgru.LSTMCell(f_f="relu")), {}, "one activation for the i, f and o gates"),
        (_net(LSTM), dict(linear_before_reset=1), r"^linear_before_reset: is an ONNX GRU "
                                                  r"attribute"),
    ]:
        with pytest.raises(ValueError, match=match):
            convert.to_onnx(net, **kw)
    P = np.zeros((1, 6))
    P[0, 2] = 0.5
    with pytest.raises(ValueError, match=r"layers\[0\]\['P'\]: expected shape \[1, 6\]"):
        convert.from_onnx(dict(lstm_layers[0], P=np.zeros((1, 8))), op_type="LSTM")
    with pytest.raises(ValueError, match=r"^input_forget: expected one of 0, 1"):
        convert.from_onnx(lstm_layers, op_type="LSTM", input_forget=2)
    with pytest.raises(ValueError, match=r"^input_forget: is an ONNX LSTM attribute"):
        convert.from_onnx(lstm_layers, op_type="RNN", input_forget=1)
    with pytest.raises(ValueError, match=r"^linear_before_reset: is an ONNX GRU attribute"):
        convert.from_onnx(lstm_layers, op_type="LSTM", linear_before_reset=1)
    # the default operator is GRU: an LSTM's R says which op_type to pass
    with pytest.raises(ValueError, match=r"for op_type='GRU'.* an ONNX LSTM's R: pass "
                                         r"op_type='LSTM'"):
        convert.from_onnx(lstm_layers)
    with pytest.raises(ValueError, match=r"^activations: expected 3 names \(f, g, h for each"):
        convert.from_onnx(lstm_layers, op_type="LSTM", activations=["Sigmoid", "Tanh"])
    with pytest.raises(ValueError, match=r"^op_type: expected one of"):
        convert.from_onnx(lstm_layers, op_type="lstm")
    with pytest.raises(ValueError, match=r"unexpected keys \['P'\]"):
        convert.from_onnx(dict(convert.to_onnx(_net(RNN_TANH))[0][0], P=P), op_type="RNN")


# --- oneDNN vanilla_lstm (LSTMP) and vanilla_rnn: its documented equations --------------------
def _onednn_kind(x, t):
    """oneDNN's vanilla LSTM (with the LSTMP projection h = R·(tanh(c)·o)) and vanilla RNN
    (doc/primitives/rnn.md) over ldigo / ldgo / ldio tensors, zero initial states."""
    wl, wi, bias = t["weights_layer"], t["weights_iter"], t["bias"]
    L, D, _, G, H = wl.shape
    wp = t.get("weights_projection")
    act = {"eltwise_tanh": np.tanh, "eltwise_relu": _ACT["relu"],
           "eltwise_logistic": _ACT["sigmoid"]}.get(t.get("activation"))
    sig = _ACT["sigmoid"]
    T, N, _ = x.shape
    for l in range(L):
        out = None
        for d in range(D):
            Wl, Wi, B = wl[l, d], wi[l, d], bias[l, d]
            h, c = np.zeros((N, Wi.shape[0])), np.zeros((N, H))
            ys = np.zeros((T, N, h.shape[1]))
            backwards = d == 1 or t["direction"] == "unidirectional_right2left"
            for s in (reversed(range(T)) if backwards else range(T)):
                a = [x[s] @ Wl[:, g] + h @ Wi[:, g] + B[g] for g in range(G)]
                if G == 1:
                    h = act(a[0])
                else:
                    c = sig(a[1]) * c + sig(a[0]) * np.tanh(a[2])
                    h = np.tanh(c) * sig(a[3])
                    if wp is not None:
                        h = h @ wp[l, d]
                ys[s] = h
            out = ys if out is None else np.concatenate([out, ys], axis=-1)
        x = out
    return x


@pytest.mark.parametrize("kind,proj,direction", [
    ("vanilla_lstm", 0, "unidirectional_left2right"), ("vanilla_lstm", 0, "bidirectional_concat"),
    ("vanilla_lstm", 2, "unidirectional_right2left"), ("vanilla_lstm", 1, "bidirectional_concat"),
    ("vanilla_rnn", "eltwise_tanh", "unidirectional_left2right"),
    ("vanilla_rnn", "eltwise_relu", "bidirectional_concat"),
    ("vanilla_rnn", "eltwise_logistic", "unidirectional_right2left")])
def test_onednn_lstm_and_rnn_tensors_compute_the_onednn_function(kind, proj, direction):
    lstm = kind == "vanilla_lstm"
    D, H = (2, 3) if direction == "bidirectional_concat" else (1, 3)
    G, P = (4, proj) if lstm else (1, 0)
    S, L = P or H, 2
    I = D * S
    rng = _rng(92 + G)
    u = lambda *s: rng.uniform(-0.9, 0.9, s)        # noqa: E731
    t = {"weights_layer": u(L, D, I, G, H), "weights_iter": u(L, D, S, G, H),
         "bias": u(L, D, G, H), "direction": direction}
    if P:
        t["weights_projection"] = u(L, D, H, P)
    if not lstm:
        t["activation"] = proj
    net = convert.from_onednn(**t)
    assert net.cell.kind == ("lstm" if lstm else "rnn") and net.topology.proj_size == P
    x = _x(4, 3, I, seed=93)
    np.testing.assert_allclose(_forward(net, x)[0], _onednn_kind(x, t), **F64)
    back = convert.to_onednn(net)
    assert back.pop("cell_kind") == kind
    assert set(back) == set(t)
    for k, v in t.items():
        if isinstance(v, str):
            assert back[k] == v
        else:
            np.testing.assert_array_equal(back[k], v, err_msg=k)


def test_onednn_refusals_for_lstm_and_rnn():
    t = convert.to_onednn(_net(LSTM, 4, 2, 2, "bidirectional", seed=94))
    r = convert.to_onednn(_net(RNN_TANH, 2, 2, seed=95))
    assert r["activation"] == "eltwise_tanh" and r["cell_kind"] == "vanilla_rnn"
    for net, kw, match in [
        (_net(cgru.RNNCell("softsign")), {}, "oneDNN vanilla_rnn has no activation equal"),
        (_net(cgru.LSTMCell(clip=1.0)), {}, "oneDNN vanilla_lstm has no clip"),
        (_net(LSTM), dict(cell_kind="lbr_gru"), "oneDNN lbr_gru has GRUs only: the network's "
                                                "cell is an LSTM"),
        (_net(LSTM, 5, 2, 2, proj=1), {}, r"input_size == D·P = 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            convert.to_onednn(net, **kw)
    args = {k: t[k] for k in ("weights_layer", "weights_iter", "bias", "direction")}
    with pytest.raises(ValueError, match=r"^cell_kind='vanilla_rnn' .* contradicts the tensors"):
        convert.from_onednn(**args, cell_kind="vanilla_rnn")
    with pytest.raises(ValueError, match=r"^activation: is vanilla_rnn's option"):
        convert.from_onednn(**args, activation="eltwise_tanh")
    with pytest.raises(ValueError, match=r"^weights_projection: is vanilla_lstm's"):
        convert.from_onednn(r["weights_layer"], r["weights_iter"], r["bias"],
                            activation="eltwise_relu", weights_projection=np.zeros((1, 1, 2, 1)))
    with pytest.raises(ValueError, match=r"^activation: a vanilla_rnn needs its activation"):
        convert.from_onednn(r["weights_layer"], r["weights_iter"], r["bias"])
    with pytest.raises(ValueError, match=r"^activation: expected one of"):
        convert.from_onednn(r["weights_layer"], r["weights_iter"], r["bias"], activation="tanh")
    with pytest.raises(ValueError, match=r"^bias: expected ldgo \[L, D, G_b, H\] with G_b = 4"):
        convert.from_onednn(t["weights_layer"], t["weights_iter"], t["bias"][:, :, :3],
                            direction=t["direction"])


# --- MPSGraph and Arraymancer have GRUs only (for now) ----------------------------------------
@pytest.mark.parametrize("cell", [LSTM, RNN_TANH], ids=["lstm", "rnn"])
def test_gru_only_systems_refuse_lstm_and_rnn(cell):
    net = _net(cell)
    what = "an LSTM" if cell.kind == "lstm" else "a vanilla RNN"
    for to in (convert.to_mps, convert.to_arraymancer):
        with pytest.raises(ValueError, match=rf"has GRUs only: the network's cell is {what}"):
            to(net)


# --- the conversion matrices of the LSTM and the vanilla RNN ---------------------------------
# One forward layer.  E = exact (bit for bit), S = exact with the bias sums (b_W + b_R into
# b_W, b_R = 0); refused with the reason: Rk = the target lacks the cell kind, Rp = the LSTM
# projection, Ra = the activation.
LSTM_MATRIX = """
            PT TF ON KE DN MP AM
PyTorch     E  E  E  S  S  Rk Rk
TF          E  E  E  S  S  Rk Rk
ONNX        E  E  E  S  S  Rk Rk
Keras       E  E  E  E  E  Rk Rk
oneDNN      E  E  E  E  E  Rk Rk
PyTorchP    E  E  Rp Rp S  Rk Rk
TFP         E  E  Rp Rp S  Rk Rk
oneDNNP     E  E  Rp Rp E  Rk Rk
"""
RNN_MATRIX = """
                PT TF ON KE DN MP AM
PyTorchTanh     E  E  E  S  S  Rk Rk
PyTorchRelu     E  E  E  S  S  Rk Rk
TFRelu          E  E  E  S  S  Rk Rk
ONNXTanh        E  E  E  S  S  Rk Rk
ONNXSigmoid     Ra Ra E  S  S  Rk Rk
KerasRelu       E  E  E  E  E  Rk Rk
KerasSoftsign   Ra Ra E  E  Ra Rk Rk
oneDNNTanh      E  E  E  E  E  Rk Rk
oneDNNLogistic  Ra Ra E  E  E  Rk Rk
"""
REASONS = {"Rk": r"has GRUs only: the network's cell is",
           "Rp": r"has no LSTM recurrent projection",
           "Ra": r"has no activation equal to the source's"}


def _native_kind(source, I=3, H=2, P=2, seed=0):
    """A random one-layer forward LSTM / RNN in ``source``'s own tensors, as a network."""
    rng = _rng(seed)
    u = lambda *s: rng.uniform(-0.9, 0.9, s)        # noqa: E731
    lstm = source in ("PyTorch", "TF", "ONNX", "Keras", "oneDNN") or source.endswith("P")
    G, act = (4, None) if lstm else (1, [a for a in ("Tanh", "Relu", "Sigmoid", "Softsign",
                                                     "Logistic") if source.endswith(a)][0])
    system = source[:-len(act)] if act else source.rstrip("P") if source != "TFP" else "TF"
    proj = P if lstm and source.endswith("P") else 0
    S = proj or H
    if system == "PyTorch":
        sd = {"weight_ih_l0": u(G * H, I), "weight_hh_l0": u(G * H, S), "bias_ih_l0": u(G * H),
              "bias_hh_l0": u(G * H)}
        if proj:
            sd["weight_hr_l0"] = u(proj, H)
        return convert.from_torch(sd, nonlinearity=act.lower() if act else None)
    if system == "TF":
        weights = [u(H, I) for _ in range(G)] + [u(H, S) for _ in range(G)] + \
            ([u(proj, H)] if proj else [])
        return convert.from_tf_canonical(weights, [u(H) for _ in range(2 * G)],
                                         rnn_mode="lstm" if lstm else f"rnn_{act.lower()}")
    if system == "ONNX":
        return convert.from_onnx({"W": u(1, G * H, I), "R": u(1, G * H, H), "B": u(1, 2 * G * H)},
                                 op_type="LSTM" if lstm else "RNN",
                                 activations=None if lstm else [act])
    if system == "Keras":
        return convert.from_keras([[u(I, G * H), u(H, G * H), u(G * H)]],
                                  activation=act.lower() if act else "tanh")
    t = {"weights_layer": u(1, 1, I, G, H), "weights_iter": u(1, 1, S, G, H),
         "bias": u(1, 1, G, H)}
    if proj:
        t["weights_projection"] = u(1, 1, H, proj)
    return convert.from_onednn(**t, activation=f"eltwise_{act.lower()}" if act else None)


def _through_kind(target, p):
    """Network → ``target``'s tensors → network, every system's own round trip."""
    cell = p.cell
    if target == "PT":
        return convert.from_torch(convert.to_torch(p), nonlinearity=getattr(
            getattr(cell, "activation", None), "name", None))
    if target == "TF":
        mode = "lstm" if cell.kind == "lstm" else f"rnn_{cell.activation.name}"
        return convert.from_tf_canonical(*convert.to_tf_canonical(p), rnn_mode=mode,
                                         direction=p.topology.direction,
                                         input_mode=p.topology.input_mode)
    if target == "ON":
        layers, attrs = convert.to_onnx(p)
        return convert.from_onnx(layers, op_type="LSTM" if cell.kind == "lstm" else "RNN",
                                 **attrs)
    if target == "KE":
        return convert.from_keras(convert.to_keras(p), **convert.keras_config(p),
                                  bidirectional=p.topology.num_directions == 2)
    if target == "DN":
        return convert.from_onednn(**convert.to_onednn(p))
    if target == "MP":
        return convert.from_mps(*convert.to_mps(p))
    return convert.from_arraymancer(**convert.to_arraymancer(p))


def _classify_kind(target, p, x):
    try:
        q = _through_kind(target, p)
    except ValueError as e:
        for code, reason in REASONS.items():
            if re.search(reason, str(e)):
                return code
        raise AssertionError(f"{target}: refused without a known reason: {e}")
    assert q.cell == p.cell and q.topology == p.topology
    h0 = _rng(9).standard_normal((1, x.shape[1], p.topology.state_size))
    c0 = _rng(10).standard_normal((1, x.shape[1], 2)) if p.cell.kind == "lstm" else None
    for a, b in zip(_forward(q, x, h0, c0), _forward(p, x, h0, c0)):
        if b is not None:
            np.testing.assert_allclose(a, b, **F64)
    for a, b in zip(p, q):
        for k in ("W", "R", "W_p"):
            np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
    if all(np.array_equal(a.b_W, b.b_W) and np.array_equal(a.b_R, b.b_R) for a, b in zip(p, q)):
        return "E"
    for a, b in zip(p, q):                      # the biases summed into b_W, exactly
        np.testing.assert_array_equal(b.b_W, a.b_W + a.b_R)
        assert not np.any(b.b_R)
    return "S"


@pytest.mark.parametrize("matrix", [LSTM_MATRIX, RNN_MATRIX], ids=["lstm", "rnn"])
def test_conversion_matrix_lstm_and_rnn(matrix):
    lines = matrix.strip().splitlines()
    targets = lines[0].split()
    x = _x(4, 3, 3, seed=96)
    got, want = {}, {}
    for i, line in enumerate(lines[1:]):
        source, *cells = line.split()
        p = _native_kind(source, seed=97 + i)
        for target, expected in zip(targets, cells):
            want[source, target] = expected
            got[source, target] = _classify_kind(target, p, x)
    assert got == want


def test_every_lstm_and_rnn_system_round_trips_its_own_tensors_bitwise():
    """to_X(from_X(w)) == w for the systems' native tensors (the matrix's diagonal checks the
    network side)."""
    rng = _rng(98)
    u = lambda *s: rng.uniform(-1, 1, s)            # noqa: E731
    sd = {"weight_ih_l0": u(8, 3), "weight_hh_l0": u(8, 1), "bias_ih_l0": u(8),
          "bias_hh_l0": u(8), "weight_hr_l0": u(1, 2)}
    for k, v in convert.to_torch(convert.from_torch(sd)).items():
        np.testing.assert_array_equal(v, sd[k])
    w = [u(2, 3)] * 4 + [u(2, 1)] * 4 + [u(1, 2)]
    b = [u(2)] * 8
    w2, b2 = convert.to_tf_canonical(convert.from_tf_canonical(w, b, rnn_mode="lstm"))
    for x, y in zip(w + b, w2 + b2):
        np.testing.assert_array_equal(x, y)
    node = {"W": u(2, 2, 3), "R": u(2, 2, 2), "B": u(2, 4)}
    attrs = dict(direction="bidirectional", activations=["Softplus", "Softplus"], clip=2.0)
    layers, attrs2 = convert.to_onnx(convert.from_onnx(node, op_type="RNN", **attrs))
    assert attrs2 == dict(attrs, hidden_size=2)
    for k in node:
        np.testing.assert_array_equal(layers[0][k], node[k])
    keras = [[u(3, 8), u(2, 8), u(8), u(3, 8), u(2, 8), u(8)], [u(4, 8), u(2, 8), u(8)] * 2]
    for la, lb in zip(convert.to_keras(convert.from_keras(keras, bidirectional=True)), keras):
        for x, y in zip(la, lb):
            np.testing.assert_array_equal(x, y)


# Which targets can express a feature of an LSTM / RNN source (all others refuse it).
RELU = cgru.Activation("relu")
ONNX_PEEPHOLES = {"ON"}
KIND_FEATURES = {
    "lstm bidirectional": ({"PT", "TF", "ON", "KE", "DN"},
                           lambda: _net(LSTM, 3, 2, 1, "bidirectional", seed=60)),
    "lstm reverse": ({"ON", "DN"}, lambda: _net(LSTM, direction="reverse", seed=61)),
    "lstm clip": ({"ON"}, lambda: _net(cgru.LSTMCell(clip=0.5), seed=62)),
    "lstm relu gates": ({"ON", "KE"},
                        lambda: _net(cgru.LSTMCell(f_i=RELU, f_f=RELU, f_o=RELU), seed=63)),
    "lstm other output activation": ({"ON"}, lambda: _net(cgru.LSTMCell(h="softsign"),
                                                          seed=64)),
    "lstm skip input": ({"PT", "TF", "ON", "KE", "DN"},
                        lambda: _net(LSTM, 2, 2, input_mode="skip", seed=65)),
    "lstm projection bidirectional": ({"PT", "TF", "DN"},
                                      lambda: _net(LSTM, 3, 2, 1, "bidirectional", proj=1,
                                                   seed=66)),
    # ONNX has peepholes in the "ifo" form and coupled gates, nobody else has either (an
    # "ifgo" cell converts through MPSGraph's LSTM operator): a drop would change the function
    "lstm peepholes ifo": (ONNX_PEEPHOLES,
                           lambda: _net(cgru.LSTMCell(peepholes="ifo"), seed=73)),
    "lstm peepholes ifgo": (set(), lambda: _net(cgru.LSTMCell(peepholes="ifgo"), seed=74)),
    "lstm input_forget": (ONNX_PEEPHOLES,
                          lambda: _net(cgru.LSTMCell(input_forget=True), seed=75)),
    "rnn bidirectional relu": ({"PT", "TF", "ON", "KE", "DN"},
                               lambda: _net(RNN_RELU, 3, 2, 1, "bidirectional", seed=67)),
    "rnn reverse": ({"ON", "DN"}, lambda: _net(RNN_TANH, direction="reverse", seed=68)),
    "rnn clip": ({"ON"}, lambda: _net(cgru.RNNCell("tanh", clip=0.5), seed=69)),
    "rnn sigmoid": ({"ON", "KE", "DN"}, lambda: _net(cgru.RNNCell("sigmoid"), seed=70)),
    "rnn leaky_relu": ({"ON"}, lambda: _net(cgru.RNNCell(("leaky_relu", 0.3)), seed=71)),
}


@pytest.mark.parametrize("feature", sorted(KIND_FEATURES))
def test_lstm_and_rnn_features_refused_by_targets_that_lack_them(feature):
    allowed, make = KIND_FEATURES[feature]
    assert _targets_that_express(make(), ("PT", "TF", "ON", "KE", "DN", "MP", "AM"),
                                 _through_kind, 72) == allowed
