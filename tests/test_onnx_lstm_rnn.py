"""cgru.onnx.lstm and cgru.onnx.rnn: the ONNX LSTM and RNN operators.

1. Against onnxruntime's CPU LSTM / RNN (float32; it has no float64 for them and refuses
   layout=1): directions, peepholes, input_forget, sequence_lens with zeros, initial states,
   activations with alpha/beta, clip, no bias, output subsets.
2. layout=1: the transposed layout-0 result, and the ONNX reference evaluator (whose LSTM and
   RNN ignore activations beyond Tanh/Affine, clip, input_forget and sequence_lens, so it is
   compared where it computes the operator).
3. ONNX's backend node test cases (onnx.backend.test.case.node.lstm / rnn) through
   cgru.onnx.run.
4. torch nn.LSTM / nn.RNN where the functions coincide (their weights in ONNX's gate order).
5. float64: the NumPy reference; central differences of every gradient (X, initial_h,
   initial_c, W, R, B, P) with peepholes and input_forget, through the converter route
   (cgru.convert.from_onnx → cgru.backward → cgru.convert.to_onnx); float32 against float64.
6. Argument errors name the ONNX argument; the inputs are not modified.
"""
import numpy as np
import pytest

import cgru
import cgru.onnx as connx
from cgru import convert
from cgru.core import engine, gradcheck, reference

F32 = dict(rtol=2e-5, atol=2e-6)
GATES = {"LSTM": 4, "RNN": 1}


def _problem(op="LSTM", T=4, N=5, I=3, H=4, D=1, seed=0, scale=0.7, bias=True, h0=True,
             c0=True, peepholes=False, lens=None, dtype=np.float32):
    """ONNX inputs of one node (time-major)."""
    rng = np.random.default_rng(seed)
    G = GATES[op]
    d = {"X": rng.standard_normal((T, N, I)),
         "W": rng.uniform(-scale, scale, (D, G * H, I)),
         "R": rng.uniform(-scale, scale, (D, G * H, H))}
    if bias:
        d["B"] = rng.uniform(-scale, scale, (D, 2 * G * H))
    if h0:
        d["initial_h"] = rng.uniform(-1, 1, (D, N, H))
    if c0 and op == "LSTM":
        d["initial_c"] = rng.uniform(-1, 1, (D, N, H))
    if peepholes:
        d["P"] = rng.uniform(-scale, scale, (D, 3 * H))
    d = {k: v.astype(dtype) for k, v in d.items()}
    if lens is not None:
        d["sequence_lens"] = np.asarray(lens, np.int32)
    return d


def _cgru(op, inputs, attrs):
    fn = connx.lstm if op == "LSTM" else connx.rnn
    return fn(**inputs, **attrs)


def _model(op, attrs, inputs, outputs=None, opset=22, dtype=None):
    from onnx import TensorProto, helper
    outputs = outputs or list(connx.OUTPUTS[op])
    ins = [n if n in inputs else "" for n in connx.INPUTS[op]]
    while ins and ins[-1] == "":
        ins.pop()
    node = helper.make_node(op, ins, outputs, **attrs)
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
            np.dtype(np.int32): TensorProto.INT32}
    vis = [helper.make_tensor_value_info(n, elem[inputs[n].dtype], inputs[n].shape)
           for n in ins if n]
    tp = TensorProto.DOUBLE if inputs["X"].dtype == np.float64 else TensorProto.FLOAT
    outs = [helper.make_tensor_value_info(n, tp, None) for n in outputs if n]
    return helper.make_model(helper.make_graph([node], op.lower(), vis, outs),
                             opset_imports=[helper.make_opsetid("", opset)])


def _ort(op, inputs, attrs, outputs=None):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    attrs = dict(attrs, hidden_size=inputs["R"].shape[-1])      # onnxruntime requires it
    model = _model(op, attrs, inputs, outputs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def _check_against_ort(op, inputs, attrs, tol=F32):
    got = _cgru(op, inputs, attrs)
    want = _ort(op, inputs, attrs)
    assert len(got) == len(want) == len(connx.OUTPUTS[op])
    for name, g, w in zip(connx.OUTPUTS[op], got, want):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, err_msg=name, **tol)
    return got


# --- 1. against onnxruntime -----------------------------------------------------------------
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("peepholes,input_forget", [(False, 0), (True, 0), (False, 1),
                                                    (True, 1)])
def test_lstm_against_onnxruntime(direction, peepholes, input_forget):
    D = 2 if direction == "bidirectional" else 1
    lens = [4, 0, 2, 3, 1]                      # full length, zero, in-between, unsorted
    inputs = _problem(D=D, lens=lens, peepholes=peepholes, seed=D + 3 * input_forget)
    attrs = dict(hidden_size=4, direction=direction, input_forget=input_forget)
    Y, Y_h, Y_c = _check_against_ort("LSTM", inputs, attrs)
    # onnxruntime's conventions hold and are not vacuous
    assert np.all(Y[2:, :, 2] == 0) and np.all(Y[:, :, 1] == 0)
    assert np.all(Y_h[:, 1] == 0) and np.all(Y_c[:, 1] == 0)
    assert np.all(Y[:2, :, 2] != 0) and np.all(Y_c[:, 2] != 0)
    if peepholes:       # the peepholes matter
        Y0, _, _ = _cgru("LSTM", {k: v for k, v in inputs.items() if k != "P"}, attrs)
        assert np.abs(Y0 - Y).max() > 1e-3


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_rnn_against_onnxruntime(direction):
    D = 2 if direction == "bidirectional" else 1
    inputs = _problem("RNN", D=D, lens=[4, 0, 2, 3, 1], seed=10 + D)
    Y, Y_h = _check_against_ort("RNN", inputs, dict(hidden_size=4, direction=direction))
    assert np.all(Y[2:, :, 2] == 0) and np.all(Y_h[:, 1] == 0) and np.all(Y_h[:, 2] != 0)


@pytest.mark.parametrize("op", ["LSTM", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_against_onnxruntime_without_bias_and_states(op, direction):
    D = 2 if direction == "bidirectional" else 1
    inputs = _problem(op, T=3, N=4, I=2, H=3, D=D, bias=False, h0=False, c0=False, seed=7)
    _check_against_ort(op, inputs, dict(direction=direction))


def test_lstm_activations_alpha_beta_against_onnxruntime():
    # different activations per direction; alpha/beta consumed only by those that take them:
    # HardSigmoid(α, β), LeakyRelu(α), ScaledTanh(α, β), Elu(α), Affine(α, β)
    inputs = _problem(D=2, lens=[4, 3, 0, 1, 2], peepholes=True, seed=21)
    attrs = dict(direction="bidirectional",
                 activations=["HardSigmoid", "LeakyRelu", "ScaledTanh",
                              "Sigmoid", "Elu", "Affine"],
                 activation_alpha=[0.3, 0.05, 0.9, 0.7, 0.8],
                 activation_beta=[0.45, 1.3, 0.1])
    Y, _, _ = _check_against_ort("LSTM", inputs, attrs)
    Y_lower, _, _ = _cgru("LSTM", inputs, dict(attrs, activations=[
        a.lower() for a in attrs["activations"]]))
    np.testing.assert_array_equal(Y_lower, Y)
    Y_bytes, _, _ = _cgru("LSTM", inputs, dict(attrs, activations=[
        a.encode() for a in attrs["activations"]], direction=b"bidirectional"))
    np.testing.assert_array_equal(Y_bytes, Y)
    Y_other, _, _ = _cgru("LSTM", inputs, dict(attrs, activation_alpha=[0.3, 0.05, 0.9, 0.7,
                                                                        0.2]))
    assert np.abs(Y_other - Y).max() > 1e-4
    _check_against_ort("LSTM", inputs, dict(direction="bidirectional", activations=[
        "Softsign", "Softplus", "Relu", "Sigmoid", "Tanh", "Softsign"]))


def test_rnn_activations_alpha_beta_against_onnxruntime():
    inputs = _problem("RNN", D=2, lens=[4, 3, 0, 1, 2], seed=23)
    for acts, alpha, beta in [(["Relu", "LeakyRelu"], [0.2], None),
                              (["ScaledTanh", "HardSigmoid"], [0.9, 0.3], [1.2, 0.4]),
                              (["Elu", "Affine"], [0.6, 0.5], [0.1]),
                              (["Softsign", "Softplus"], None, None),
                              (["ThresholdedRelu", "Sigmoid"], [0.1], None)]:
        _check_against_ort("RNN", inputs, dict(direction="bidirectional", activations=acts,
                                               activation_alpha=alpha, activation_beta=beta))


def test_rnn_two_activations_for_one_direction_read_the_first():
    # ONNX's default for RNN lists two names (Tanh, Tanh) whatever the direction;
    # onnxruntime reads the first for a one-direction node, and so does cgru
    inputs = _problem("RNN", seed=25)
    Y, _ = _check_against_ort("RNN", inputs, dict(activations=["Relu", "Tanh"]))
    np.testing.assert_array_equal(Y, _cgru("RNN", inputs, dict(activations=["Relu"]))[0])
    Y, _ = _check_against_ort("RNN", inputs, dict(activations=["Tanh", "Tanh"]))
    np.testing.assert_array_equal(Y, _cgru("RNN", inputs, {})[0])
    with pytest.raises(ValueError, match=r"activations: expected 1 names"):
        _cgru("RNN", inputs, dict(activations=["Tanh"] * 3))


@pytest.mark.parametrize("op", ["LSTM", "RNN"])
def test_clip_against_onnxruntime(op):
    inputs = _problem(op, D=2, seed=31, scale=2.0, peepholes=op == "LSTM",
                      lens=[4, 2, 0, 3, 1])
    attrs = dict(direction="bidirectional", clip=0.6)
    if op == "LSTM":
        for input_forget in (0, 1):
            got = _check_against_ort(op, inputs, dict(attrs, input_forget=input_forget))
    else:
        got = _check_against_ort(op, inputs, attrs)
    unclipped = _cgru(op, inputs, dict(attrs, clip=None))
    assert np.abs(got[0] - unclipped[0]).max() > 1e-2


@pytest.mark.parametrize("op", ["LSTM", "RNN"])
def test_output_subsets_in_onnxruntime_and_run(op):
    pytest.importorskip("onnx")
    inputs = _problem(op, D=2, seed=33, lens=[4, 1, 0, 2, 3])
    attrs = dict(hidden_size=4, direction="bidirectional")
    full = _cgru(op, inputs, attrs)
    for outputs in (["", "Y_h"], ["Y"], ["", "", "Y_c"] if op == "LSTM" else ["", "Y_h"]):
        named = [(n, v) for n, v in zip(outputs, full) if n]
        want = _ort(op, inputs, attrs, outputs)
        got = connx.run(_model(op, attrs, inputs, outputs), inputs)
        assert list(got) == [n for n, _ in named]
        for (n, v), w in zip(named, want):
            np.testing.assert_allclose(v, w, **F32)
            np.testing.assert_array_equal(got[n], v)


# --- 2. layout = 1 --------------------------------------------------------------------------
def _batch_major(inputs):
    out = dict(inputs)
    for k in ("X", "initial_h", "initial_c"):
        if k in inputs:
            out[k] = np.ascontiguousarray(inputs[k].transpose(1, 0, 2))
    return out


@pytest.mark.parametrize("op", ["LSTM", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_layout1_equals_transposed_layout0(op, direction):
    D = 2 if direction == "bidirectional" else 1
    inputs = _problem(op, D=D, lens=[4, 0, 2, 3, 1], seed=41, peepholes=op == "LSTM")
    attrs = dict(direction=direction, clip=1.5)
    if op == "LSTM":
        attrs.update(input_forget=1, activations=["HardSigmoid", "Softsign", "Tanh"] * D,
                     activation_alpha=[0.3] * D)
    else:
        attrs.update(activations=["Softsign"] * D)
    got0 = _cgru(op, inputs, attrs)
    got1 = _cgru(op, _batch_major(inputs), dict(attrs, layout=1))
    np.testing.assert_array_equal(got1[0], got0[0].transpose(2, 0, 1, 3))
    for s0, s1 in zip(got0[1:], got1[1:]):
        np.testing.assert_array_equal(s1, s0.transpose(1, 0, 2))


@pytest.mark.parametrize("op", ["LSTM", "RNN"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_against_reference_evaluator(op, layout, direction):
    """The reference evaluator's LSTM (default activations, peepholes) and RNN (Tanh;
    Affine): it ignores clip, input_forget and sequence_lens, so none is given."""
    pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator
    D = 2 if direction == "bidirectional" else 1
    inputs = _problem(op, D=D, seed=51 + D + layout, peepholes=op == "LSTM")
    if layout:
        inputs = _batch_major(inputs)
    attr_sets = [dict(hidden_size=4, direction=direction, layout=layout)]
    if op == "RNN":
        attr_sets.append(dict(attr_sets[0], activations=["Affine"] * D,
                              activation_alpha=[0.7] * D, activation_beta=[0.2] * D))
    for attrs in attr_sets:
        got = _cgru(op, inputs, attrs)
        want = ReferenceEvaluator(_model(op, attrs, inputs)).run(None, inputs)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, **F32)


def test_onnxruntime_refuses_layout1_and_float64():
    """What onnxruntime's CPU provider does not run (so the tests above use other oracles)."""
    ort = pytest.importorskip("onnxruntime")
    inputs = _batch_major(_problem(seed=55))
    model = _model("LSTM", dict(hidden_size=4, layout=1), inputs)
    with pytest.raises(Exception, match="layout"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs64 = _problem("RNN", seed=56, dtype=np.float64)
    model = _model("RNN", dict(hidden_size=4), inputs64)
    with pytest.raises(Exception):
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        sess.run(None, inputs64)
    connx.rnn(**inputs64)                   # cgru computes both


# --- 3. ONNX's backend node tests through run() ---------------------------------------------
def _onnx_backend_cases(module_name, cls_name):
    """Every ``expect(node, inputs, outputs, name)`` of an onnx backend test module, captured
    by running its ``export_*`` functions with ``expect`` replaced."""
    import importlib
    mod = importlib.import_module(f"onnx.backend.test.case.node.{module_name}")
    captured = []
    real_expect = mod.expect
    mod.expect = lambda node, inputs, outputs, name, **kw: captured.append(
        (node, inputs, outputs, name))
    try:
        cls = getattr(mod, cls_name)
        for attr in sorted(vars(cls)):
            if attr.startswith("export"):
                getattr(cls, attr)()
    finally:
        mod.expect = real_expect
    return captured


@pytest.mark.parametrize("module_name,cls_name,expected", [
    ("lstm", "LSTM", {"test_lstm_defaults", "test_lstm_with_initial_bias",
                      "test_lstm_with_peepholes", "test_lstm_batchwise"}),
    ("rnn", "RNN", {"test_simple_rnn_defaults", "test_simple_rnn_with_initial_bias",
                    "test_rnn_seq_length", "test_simple_rnn_batchwise"})])
def test_onnx_backend_node_cases(module_name, cls_name, expected):
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    cases = _onnx_backend_cases(module_name, cls_name)
    names = {c[3] for c in cases}
    assert expected <= names, names
    for node, inputs, outputs, name in cases:
        present = [n for n in node.input if n]
        feeds = dict(zip(present, inputs))
        graph = helper.make_graph(
            [node], name,
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for n, a in feeds.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in node.output if n])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
        got = connx.run(model, feeds)
        out_names = [n for n in node.output if n]
        assert list(got) == out_names, name
        for n, want in zip(out_names, outputs):
            np.testing.assert_allclose(got[n], want, rtol=1e-5, atol=1e-6, err_msg=name)


# --- 4. torch nn.LSTM / nn.RNN ----------------------------------------------------------------
def _torch_to_onnx(module, op, H):
    """The ONNX W, R, B of a one-layer torch module (torch LSTM gates i, f, g, o → ONNX
    i, o, f, c), written out here independently of cgru's converters."""
    sd = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    order = np.r_[0:H, 3 * H:4 * H, H:2 * H, 2 * H:3 * H] if op == "LSTM" else np.arange(H)
    suffixes = [""] + (["_reverse"] if module.bidirectional else [])
    W = np.stack([sd[f"weight_ih_l0{s}"][order] for s in suffixes])
    R = np.stack([sd[f"weight_hh_l0{s}"][order] for s in suffixes])
    B = np.stack([np.concatenate([sd[f"bias_ih_l0{s}"][order], sd[f"bias_hh_l0{s}"][order]])
                  for s in suffixes])
    return W, R, B


@pytest.mark.parametrize("op,kw", [("LSTM", {}), ("LSTM", dict(bidirectional=True)),
                                   ("RNN", {}), ("RNN", dict(nonlinearity="relu",
                                                             bidirectional=True))])
def test_against_torch(op, kw):
    torch = pytest.importorskip("torch")
    torch.manual_seed(61)
    T, N, I, H = 5, 3, 4, 3
    D = 2 if kw.get("bidirectional") else 1
    module = (torch.nn.LSTM if op == "LSTM" else torch.nn.RNN)(I, H, **kw).double()
    W, R, B = _torch_to_onnx(module, op, H)
    rng = np.random.default_rng(62)
    X = rng.standard_normal((T, N, I))
    h0 = rng.standard_normal((D, N, H))
    c0 = rng.standard_normal((D, N, H))
    attrs = dict(hidden_size=H, direction="bidirectional" if D == 2 else "forward")
    if op == "RNN" and kw.get("nonlinearity") == "relu":
        attrs["activations"] = ["Relu"] * D
    with torch.no_grad():
        if op == "LSTM":
            y, (hy, cy) = module(torch.from_numpy(X), (torch.from_numpy(h0),
                                                       torch.from_numpy(c0)))
            Y, Y_h, Y_c = connx.lstm(X, W, R, B, None, h0, c0, **attrs)
            np.testing.assert_allclose(Y_c, cy.numpy(), rtol=1e-12, atol=1e-13)
        else:
            y, hy = module(torch.from_numpy(X), torch.from_numpy(h0))
            Y, Y_h = connx.rnn(X, W, R, B, None, h0, **attrs)
    np.testing.assert_allclose(Y.transpose(0, 2, 1, 3).reshape(T, N, D * H), y.numpy(),
                               rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(Y_h, hy.numpy(), rtol=1e-12, atol=1e-13)


# --- 5. float64: reference, finite differences, float32 ------------------------------------
def _canonical(inputs, H, D, op):
    """The canonical layer-directions of ONNX W, R, B, P, written out here (LSTM i, o, f, c →
    i, f, g, o; P i, o, f → i, f, o)."""
    perm = np.r_[0:H, 2 * H:3 * H, 3 * H:4 * H, H:2 * H] if op == "LSTM" else np.arange(H)
    pperm = np.r_[0:H, 2 * H:3 * H, H:2 * H]
    G = GATES[op]
    out = []
    for d in range(D):
        b = inputs["B"][d]
        out.append(cgru.LayerParams(
            W=inputs["W"][d][perm], R=inputs["R"][d][perm], b_W=b[:G * H][perm],
            b_R=b[G * H:][perm], P=inputs["P"][d][pperm] if "P" in inputs else None))
    return out


@pytest.mark.parametrize("op,cell_kw,attrs", [
    ("LSTM", dict(peepholes=True, input_forget=True, clip=0.9),
     dict(input_forget=1, clip=0.9)),
    ("LSTM", dict(peepholes=True, f_i="hard_sigmoid", f_f="hard_sigmoid", f_o="hard_sigmoid",
                  g="softsign", h="elu"),
     dict(activations=["HardSigmoid", "Softsign", "Elu"] * 2)),
    ("RNN", dict(activation="leaky_relu", clip=1.1),
     dict(activations=["LeakyRelu"] * 2, activation_alpha=[0.01] * 2, clip=1.1))])
def test_float64_against_numpy_reference(op, cell_kw, attrs):
    H, D = 4, 2
    inputs = _problem(op, D=D, lens=[4, 0, 2, 3, 1], seed=71, dtype=np.float64,
                      peepholes=op == "LSTM")
    got = _cgru(op, inputs, dict(attrs, direction="bidirectional"))
    cell = cgru.LSTMCell(**cell_kw) if op == "LSTM" else cgru.RNNCell(**cell_kw)
    net = cgru.Network(cgru.Topology(3, H, 1, "bidirectional"), _canonical(inputs, H, D, op),
                       cell)
    ref = reference.forward(net, inputs["X"], inputs["initial_h"],
                            c0=inputs.get("initial_c"), lengths=inputs["sequence_lens"])
    y, states = ref[0], list(ref[1:])
    np.testing.assert_allclose(got[0], y.reshape(4, 5, D, H).transpose(0, 2, 1, 3),
                               rtol=1e-12, atol=1e-13)
    for g, s in zip(got[1:], states):
        s = np.array(s)
        s[:, 1] = 0                                      # length 0 → Y_h = Y_c = 0
        np.testing.assert_allclose(g, s, rtol=1e-12, atol=1e-13)


_GRAD_CASES = {
    "lstm_peepholes_input_forget_clip": ("LSTM", dict(input_forget=1, clip=2.0), True),
    "lstm_peepholes_activations": ("LSTM", dict(activations=["HardSigmoid", "Elu",
                                                             "Softsign"] * 2,
                                                activation_alpha=[0.3, 0.9] * 2), True),
    "lstm_plain_lengths": ("LSTM", {}, False),
    "rnn_softsign_clip": ("RNN", dict(activations=["Softsign"] * 2, clip=1.5), False),
}


@pytest.mark.parametrize("case", sorted(_GRAD_CASES))
def test_gradients_through_the_converter_against_finite_differences(case):
    """Every gradient of an ONNX node — X, initial_h, initial_c, W, R, B and P — from
    cgru.backward on cgru.convert.from_onnx's network, mapped back with cgru.convert.to_onnx,
    against central differences of the operator itself (cgru.onnx.lstm / rnn), float64."""
    op, extra, peepholes = _GRAD_CASES[case]
    T, N, I, H, D = 4, 3, 2, 2, 2
    lens = [4, 0, 2]
    inputs = _problem(op, T=T, N=N, I=I, H=H, D=D, seed=81, scale=0.8, dtype=np.float64,
                      peepholes=peepholes, lens=lens)
    if peepholes:
        assert np.all(inputs["P"] != 0)
    attrs = dict(hidden_size=H, direction="bidirectional", **extra)
    rng = np.random.default_rng(82)
    outs = _cgru(op, inputs, attrs)
    douts = [rng.standard_normal(o.shape) for o in outs]

    # analytic: the converter's network, the core's backward
    layer = {k: inputs[k] for k in ("W", "R", "B", "P") if k in inputs}
    net = convert.from_onnx(layer, op_type=op, **attrs)
    assert net.cell.kind == op.lower() and \
        getattr(net.cell, "peepholes", False) == ("ifo" if peepholes else False)
    x, h0, c0 = inputs["X"], inputs["initial_h"], inputs.get("initial_c")
    f = engine.forward(net, x, h0, c0=c0, lengths=inputs["sequence_lens"], training=True)
    dy = douts[0].transpose(0, 2, 1, 3).reshape(T, N, D * H)       # Y [T, D, N, H] → y
    dstates = [np.array(d) for d in douts[1:]]
    for d in dstates:        # ONNX's Y_h, Y_c are 0 (constant) for a length-0 sequence
        d[:, np.asarray(lens) == 0] = 0
    g = engine.backward(net, x, f.reserve, dy, dstates[0],
                        **({"dcy": dstates[1]} if op == "LSTM" else {}))
    grads_onnx, _ = convert.to_onnx(g.dparams)
    analytic = {"X": g.dx, "initial_h": g.dh0, **grads_onnx[0]}
    if op == "LSTM":
        analytic["initial_c"] = g.dc0
    assert sorted(analytic) == sorted(k for k in inputs if k != "sequence_lens")

    # numeric: the ONNX operator's loss Σ Y·dY + Σ Y_h·dY_h (+ Σ Y_c·dY_c)
    names = sorted(analytic)
    arrays = {k: inputs[k].copy() for k in names}
    args = dict(inputs, **arrays)

    def loss():
        return sum(gradcheck.loss(o, None, d, None) for o, d in
                   zip(_cgru(op, args, attrs), douts))

    numeric = gradcheck.central_differences(loss, [arrays[k] for k in names])
    for k, num in zip(names, numeric):
        err = np.abs(analytic[k] - num).max() / max(np.abs(num).max(), 1e-30)
        assert err <= 1e-7, (case, k, err)
        assert np.abs(num).max() > 1e-3, (case, k)      # not vacuous
    if extra.get("input_forget"):
        # the coupled forget gate's own weights and P_f take no gradient
        for k in ("W", "R"):
            assert np.all(analytic[k][:, 2 * H:3 * H] == 0)
        assert np.all(analytic["B"][:, 2 * H:3 * H] == 0)
        assert np.all(analytic["P"][:, 2 * H:] == 0)


@pytest.mark.parametrize("op", ["LSTM", "RNN"])
def test_float32_against_float64(op):
    inputs = _problem(op, D=2, lens=[4, 0, 2, 3, 1], seed=91, dtype=np.float64,
                      peepholes=op == "LSTM")
    attrs = dict(direction="bidirectional", clip=2.0)
    if op == "LSTM":
        attrs["input_forget"] = 1
    got64 = _cgru(op, inputs, attrs)
    got32 = _cgru(op, {k: v.astype(np.float32) if v.dtype == np.float64 else v
                       for k, v in inputs.items()}, attrs)
    for a, b in zip(got32, got64):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --- 6. errors, inputs untouched ------------------------------------------------------------
def test_lstm_argument_errors():
    p = _problem(peepholes=True, seed=101)
    X, W, R = p["X"], p["W"], p["R"]
    cases = [
        (dict(activations=["Sigmoid", "Tanh"]), ValueError,
         r"activations: expected 3 names \(f, g, h for each of the 1 direction"),
        (dict(activations=["Sigmoid", "Tanh", "Gelu"]), ValueError,
         "unknown ONNX activation 'Gelu'"),
        (dict(input_forget=2), ValueError, "input_forget: expected one of 0, 1"),
        (dict(hidden_size=5), ValueError, "hidden_size: 5 disagrees"),
        (dict(W=W[:, :, :2]), ValueError, r"W: expected shape \[D=1, 4H=16, I=3\]"),
        (dict(R=R[:, :12]), ValueError, r"R: expected shape \[D=1, 4H=16, H=4\]"),
        (dict(B=np.zeros((1, 24), np.float32)), ValueError, r"B: expected shape \[D=1, 8H=32\]"),
        (dict(P=np.zeros((1, 8), np.float32)), ValueError, r"P: expected shape \[D=1, 3H=12\]"),
        (dict(P=np.zeros((1, 12))), TypeError, "P: expected dtype float32"),
        (dict(initial_c=np.zeros((2, 5, 4), np.float32)), ValueError,
         r"initial_c: expected shape \[D=1, N=5, H=4\]"),
        (dict(initial_c=p["initial_c"], layout=1), ValueError, "initial_c: expected shape"),
        (dict(sequence_lens=np.array([1, 2, 5, 0, 1], np.int32)), ValueError,
         "sequence_lens: expected values in"),
        (dict(direction="backward"), ValueError, "direction"),
        (dict(layout=2), ValueError, "layout"),
        (dict(clip=0.0), ValueError, "clip"),
        (dict(X=X[0]), ValueError, r"X: expected a 3-D array \[T, N, I\]"),
    ]
    for kw, exc, match in cases:
        args = {**dict(X=X, W=W, R=R), **kw}
        with pytest.raises(exc, match=match):
            connx.lstm(**args)
    with pytest.raises(TypeError, match="linear_before_reset"):
        connx.lstm(X, W, R, linear_before_reset=1)


def test_rnn_argument_errors():
    p = _problem("RNN", seed=102)
    X, W, R = p["X"], p["W"], p["R"]
    for kw, exc, match in [
        (dict(W=W[:, :, :2]), ValueError, r"W: expected shape \[D=1, H=4, I=3\]"),
        (dict(B=np.zeros((1, 4), np.float32)), ValueError, r"B: expected shape \[D=1, 2H=8\]"),
        (dict(direction="bidirectional"), ValueError, r"R: expected shape \[D=2, H=4, H=4\]"),
        (dict(activations=["Tanh"], activation_alpha=[0.5]), ValueError, "left over"),
        (dict(initial_h=p["initial_h"].astype(np.float64)), TypeError,
         "initial_h: expected dtype float32"),
    ]:
        with pytest.raises(exc, match=match):
            connx.rnn(**{**dict(X=X, W=W, R=R), **kw})
    with pytest.raises(TypeError):
        connx.rnn(X, W, R, input_forget=1)          # not an RNN attribute


@pytest.mark.parametrize("op", ["LSTM", "RNN"])
def test_inputs_are_not_modified(op):
    inputs = _problem(op, D=2, lens=[4, 0, 2, 3, 1], seed=111, peepholes=op == "LSTM")
    before = {k: v.copy() for k, v in inputs.items()}
    attrs = dict(direction="bidirectional", layout=0)
    _cgru(op, inputs, attrs)
    _cgru(op, _batch_major(inputs), dict(attrs, layout=1))
    for k in inputs:
        np.testing.assert_array_equal(inputs[k], before[k], err_msg=k)
