"""cgru.onnx: the ONNX GRU operator against onnxruntime, the ONNX reference evaluator and
ONNX's own backend node tests.

1. gru() vs onnxruntime's CPU GRU (float32; onnxruntime has no float64 GRU) over
   linear_before_reset, directions, sequence_lens with zeros, initial_h, activations with
   alpha/beta, clip, no bias.
2. layout=1 (onnxruntime's CPU provider refuses it) vs onnx.reference.ReferenceEvaluator and vs
   the transposed layout-0 result.
3. The expect() cases of onnx/backend/test/case/node/gru.py through cgru.onnx.run.
4. float64 against the NumPy reference; argument errors.
"""
import numpy as np
import pytest

import cgru
import cgru.onnx as connx
from cgru.core import reference

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

F32 = dict(rtol=2e-5, atol=2e-6)
_INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h")


def _model(attrs, present, dtype=np.float32, opset=22, outputs=("Y", "Y_h")):
    """A one-GRU-node model; ``present`` names the inputs that are given (others '')."""
    tp = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT
    ins = [n if n in present else "" for n in _INPUTS]
    while ins and ins[-1] == "":
        ins.pop()
    node = helper.make_node("GRU", ins, list(outputs), **attrs)
    vis = [helper.make_tensor_value_info(n, TensorProto.INT32 if n == "sequence_lens" else tp,
                                         None) for n in ins if n]
    outs = [helper.make_tensor_value_info(n, tp, None) for n in outputs if n]
    graph = helper.make_graph([node], "gru", vis, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort(inputs, attrs):
    ort = pytest.importorskip("onnxruntime")
    attrs = dict(attrs, hidden_size=inputs["R"].shape[-1])    # onnxruntime requires it
    model = _model(attrs, inputs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["Y", "Y_h"], inputs)


def _problem(T=4, N=5, I=3, H=4, D=1, seed=0, scale=0.7, bias=True, h0=True, lens=None,
             dtype=np.float32):
    rng = np.random.default_rng(seed)
    d = {"X": rng.standard_normal((T, N, I)),
         "W": rng.uniform(-scale, scale, (D, 3 * H, I)),
         "R": rng.uniform(-scale, scale, (D, 3 * H, H))}
    if bias:
        d["B"] = rng.uniform(-scale, scale, (D, 6 * H))
    if h0:
        d["initial_h"] = rng.uniform(-1, 1, (D, N, H))
    d = {k: v.astype(dtype) for k, v in d.items()}
    if lens is not None:
        d["sequence_lens"] = np.asarray(lens, np.int32)
    return d


def _cgru(inputs, attrs):
    return connx.gru(inputs["X"], inputs["W"], inputs["R"], inputs.get("B"),
                     inputs.get("sequence_lens"), inputs.get("initial_h"), **attrs)


def _check_against_ort(inputs, attrs, tol=F32):
    Y, Y_h = _cgru(inputs, attrs)
    Y_ort, Y_h_ort = _ort(inputs, attrs)
    assert Y.shape == Y_ort.shape and Y_h.shape == Y_h_ort.shape
    np.testing.assert_allclose(Y, Y_ort, **tol)
    np.testing.assert_allclose(Y_h, Y_h_ort, **tol)
    return Y, Y_h


# --- 1. against onnxruntime -----------------------------------------------------------------
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lbr", [0, 1])
def test_against_onnxruntime_lengths_and_initial_h(direction, lbr):
    D = 2 if direction == "bidirectional" else 1
    lens = [4, 0, 2, 3, 1]                      # full length, zero, and in-between, unsorted
    inputs = _problem(D=D, lens=lens, seed=lbr * 10 + D)
    attrs = dict(hidden_size=4, direction=direction, linear_before_reset=lbr)
    Y, Y_h = _check_against_ort(inputs, attrs)
    # the ORT conventions hold (and are not vacuous): zeros past the end, Y_h = 0 for len 0
    assert np.all(Y[2:, :, 2] == 0) and np.all(Y[:, :, 1] == 0) and np.all(Y_h[:, 1] == 0)
    assert np.all(Y[:2, :, 2] != 0) and np.all(Y_h[:, 2] != 0)
    # the other candidate form is a different function (guards RA/RB mixing)
    Y2, _ = _cgru(inputs, dict(attrs, linear_before_reset=1 - lbr))
    assert np.abs(Y2 - Y).max() > 1e-3


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_against_onnxruntime_batch_without_bias(direction):
    D = 2 if direction == "bidirectional" else 1
    inputs = _problem(T=3, N=4, I=2, H=3, D=D, bias=False, h0=False, seed=7)
    _check_against_ort(inputs, dict(hidden_size=3, direction=direction))


@pytest.mark.parametrize("lbr", [0, 1])
def test_against_onnxruntime_activations_alpha_beta(lbr):
    # Different activations per direction; alpha and beta lists are consumed only by the
    # activations that take them: LeakyRelu(α), ScaledTanh(α, β), HardSigmoid(α, β), Elu(α).
    inputs = _problem(D=2, lens=[4, 3, 0, 1, 2], seed=3 + lbr)
    attrs = dict(direction="bidirectional", linear_before_reset=lbr,
                 activations=["LeakyRelu", "ScaledTanh", "HardSigmoid", "Elu"],
                 activation_alpha=[0.05, 0.9, 0.3, 0.7], activation_beta=[1.3, 0.45])
    Y, _ = _check_against_ort(inputs, attrs)
    # names match case-insensitively
    Y_lower, _ = _cgru(inputs, dict(attrs, activations=["leakyrelu", "SCALEDTANH",
                                                        "hardSigmoid", "elu"]))
    np.testing.assert_array_equal(Y_lower, Y)
    # the alpha values matter (the test would notice them being dropped)
    Y_other, _ = _cgru(inputs, dict(attrs, activation_alpha=[0.05, 0.9, 0.3, 0.2]))
    assert np.abs(Y_other - Y).max() > 1e-4


def test_against_onnxruntime_more_activations_and_defaults():
    # LeakyRelu, HardSigmoid and Elu have the same defaults in ONNX and onnxruntime
    inputs = _problem(D=2, seed=11)
    _check_against_ort(inputs, dict(direction="bidirectional",
                                    activations=["HardSigmoid", "Elu", "Sigmoid", "LeakyRelu"]))
    _check_against_ort(inputs, dict(direction="bidirectional",
                                    activations=["Softsign", "Softplus", "Relu", "Tanh"]))
    # Affine / ThresholdedRelu with explicit values (onnxruntime's defaults differ from ONNX's)
    _check_against_ort(inputs, dict(direction="bidirectional",
                                    activations=["Affine", "ThresholdedRelu", "Sigmoid", "Affine"],
                                    activation_alpha=[0.4, 0.1, 1.1],
                                    activation_beta=[0.5, -0.2]))


def test_onnx_defaults_for_affine_and_scaled_tanh():
    # ONNX's defaults (Affine 1, 0; ScaledTanh 1, 1): the same as passing them explicitly,
    # i.e. Affine is the identity and ScaledTanh is tanh
    inputs = _problem(seed=5)
    Y_def, _ = _cgru(inputs, dict(activations=["Sigmoid", "Affine"]))
    Y_exp, _ = _check_against_ort(inputs, dict(activations=["Sigmoid", "Affine"],
                                               activation_alpha=[1.0], activation_beta=[0.0]))
    np.testing.assert_array_equal(Y_def, Y_exp)
    Y_st, _ = _cgru(inputs, dict(activations=["Sigmoid", "ScaledTanh"]))
    Y_tanh, _ = _cgru(inputs, {})
    np.testing.assert_allclose(Y_st, Y_tanh, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("lbr", [0, 1])
def test_against_onnxruntime_clip(lbr):
    inputs = _problem(D=2, seed=21, scale=2.0)
    attrs = dict(direction="bidirectional", linear_before_reset=lbr, clip=0.6)
    Y, _ = _check_against_ort(inputs, attrs)
    Y_noclip, _ = _cgru(inputs, dict(attrs, clip=None))
    assert np.abs(Y - Y_noclip).max() > 1e-2


# --- 2. layout = 1 --------------------------------------------------------------------------
def _batch_major(inputs):
    out = dict(inputs)
    out["X"] = np.ascontiguousarray(inputs["X"].transpose(1, 0, 2))
    if "initial_h" in inputs:
        out["initial_h"] = np.ascontiguousarray(inputs["initial_h"].transpose(1, 0, 2))
    return out


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lbr", [0, 1])
def test_layout1_against_reference_evaluator(direction, lbr):
    from onnx.reference import ReferenceEvaluator
    D = 2 if direction == "bidirectional" else 1
    inputs = _batch_major(_problem(D=D, seed=31 + D + lbr))
    attrs = dict(hidden_size=4, direction=direction, linear_before_reset=lbr, layout=1)
    Y, Y_h = _cgru(inputs, attrs)
    assert Y.shape == (5, 4, D, 4) and Y_h.shape == (5, D, 4)
    ref = ReferenceEvaluator(_model(attrs, inputs))
    Y_ref, Y_h_ref = ref.run(None, inputs)
    np.testing.assert_allclose(Y, Y_ref, **F32)
    np.testing.assert_allclose(Y_h, Y_h_ref, **F32)


@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_layout1_equals_transposed_layout0(direction):
    D = 2 if direction == "bidirectional" else 1
    inputs = _problem(D=D, lens=[4, 0, 2, 3, 1], seed=41)
    attrs = dict(direction=direction, linear_before_reset=1, clip=1.5,
                 activations=["HardSigmoid", "Softsign"] * D, activation_alpha=[0.3] * D)
    Y0, Y_h0 = _cgru(inputs, attrs)
    Y1, Y_h1 = _cgru(_batch_major(inputs), dict(attrs, layout=1))
    np.testing.assert_array_equal(Y1, Y0.transpose(2, 0, 1, 3))
    np.testing.assert_array_equal(Y_h1, Y_h0.transpose(1, 0, 2))


# --- 3. ONNX's backend node tests through run() ---------------------------------------------
def _onnx_backend_gru_cases():
    """Every ``expect(node, inputs, outputs, name)`` call of onnx's backend test module for
    GRU, captured by running its ``export_*`` functions with ``expect`` replaced.  They draw
    some inputs from NumPy's global generator, so it is seeded here (and restored): the cases
    are the same whatever ran before in the process."""
    import onnx.backend.test.case.node.gru as gru_cases
    captured = []
    real_expect = gru_cases.expect
    gru_cases.expect = lambda node, inputs, outputs, name, **kw: captured.append(
        (node, inputs, outputs, name))
    state = np.random.get_state()
    np.random.seed(0)
    try:
        for attr in sorted(vars(gru_cases.GRU)):
            if attr.startswith("export"):
                getattr(gru_cases.GRU, attr)()
    finally:
        gru_cases.expect = real_expect
        np.random.set_state(state)
    return captured


def test_onnx_backend_node_cases():
    cases = _onnx_backend_gru_cases()
    names = {c[3] for c in cases}
    assert {"test_gru_defaults", "test_gru_with_initial_bias", "test_gru_seq_length",
            "test_gru_batchwise"} <= names, names
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


def test_run_from_file_with_initializers(tmp_path):
    inputs = _problem(D=2, lens=[4, 2, 0, 1, 3], seed=51)
    attrs = dict(hidden_size=4, direction="bidirectional", linear_before_reset=1,
                 activations=["Sigmoid", "Tanh", "Relu", "Tanh"])
    model = _model(attrs, inputs, outputs=("", "Y_h"))
    # W and R as graph initializers rather than inputs
    model.graph.initializer.extend([onnx.numpy_helper.from_array(inputs[k], k) for k in "WR"])
    path = tmp_path / "gru.onnx"
    onnx.save(model, str(path))
    feeds = {k: v for k, v in inputs.items() if k not in "WR"}
    got = connx.run(str(path), feeds)
    assert list(got) == ["Y_h"]
    np.testing.assert_array_equal(got["Y_h"], _cgru(inputs, attrs)[1])
    got_path = connx.run(path, feeds)          # a pathlib.Path and the bytes work too
    np.testing.assert_array_equal(got_path["Y_h"], got["Y_h"])
    got_bytes = connx.run(model.SerializeToString(), feeds)
    np.testing.assert_array_equal(got_bytes["Y_h"], got["Y_h"])


def test_run_errors():
    inputs = _problem(seed=1)
    model = _model({}, inputs)
    with pytest.raises(ValueError, match="missing 'X'"):
        connx.run(model, {k: v for k, v in inputs.items() if k != "X"})
    with pytest.raises(ValueError, match="'x' is not an input of the graph"):
        connx.run(model, dict(inputs, x=inputs["X"]))
    with pytest.raises(TypeError, match=r"inputs\['X'\]: expected dtype float32"):
        connx.run(model, dict(inputs, X=inputs["X"].astype(np.float64)))
    with pytest.raises(ValueError, match="outputs: \\['Q'\\] are not values"):
        connx.run(model, inputs, outputs=["Q"])
    # a graph of more nodes runs whole: the GRU by cgru, the Relu by the reference evaluator
    two = _model({}, inputs)
    two.graph.node.append(helper.make_node("Relu", ["Y"], ["Z"]))
    got = connx.run(two, inputs, outputs=["Z", "Y"])
    assert list(got) == ["Z", "Y"]
    np.testing.assert_array_equal(got["Z"], np.maximum(got["Y"], 0))
    with pytest.raises(ValueError, match="opset 3"):
        connx.run(_model({}, inputs, opset=3), inputs)
    with pytest.raises(TypeError, match="model"):
        connx.run(42, inputs)


# --- 4. float64 and errors ------------------------------------------------------------------
@pytest.mark.parametrize("lbr", [0, 1])
def test_float64_against_numpy_reference(lbr):
    inputs = _problem(D=2, lens=[4, 0, 2, 3, 1], seed=61, dtype=np.float64)
    Y, Y_h = _cgru(inputs, dict(direction="bidirectional", linear_before_reset=lbr, clip=0.9))
    H = 4
    perm = np.r_[H:2 * H, 0:H, 2 * H:3 * H]               # ONNX z, r, h → r, z, n rows
    layers = [cgru.LayerParams(W=inputs["W"][d][perm], R=inputs["R"][d][perm],
                               b_W=inputs["B"][d][:3 * H][perm], b_R=inputs["B"][d][3 * H:][perm])
              for d in range(2)]
    params = cgru.Network(cgru.Topology(3, H, 1, "bidirectional"), layers)
    y, hy = reference.forward(params, inputs["X"], inputs["initial_h"],
                              cell=cgru.Cell(reset_after=bool(lbr), clip=0.9),
                              lengths=inputs["sequence_lens"])
    np.testing.assert_allclose(Y, y.reshape(4, 5, 2, H).transpose(0, 2, 1, 3), rtol=1e-12,
                               atol=1e-13)
    hy[:, 1] = 0                                           # length 0 → Y_h = 0
    np.testing.assert_allclose(Y_h, hy, rtol=1e-12, atol=1e-13)


def test_argument_errors():
    p = _problem(seed=2)
    X, W, R = p["X"], p["W"], p["R"]
    with pytest.raises(ValueError, match="activations: expected 2 names"):
        connx.gru(X, W, R, activations=["Sigmoid", "Tanh", "Tanh"])
    with pytest.raises(ValueError, match="unknown ONNX activation 'Gelu'"):
        connx.gru(X, W, R, activations=["Sigmoid", "Gelu"])
    with pytest.raises(ValueError, match="left over"):
        connx.gru(X, W, R, activations=["Sigmoid", "Tanh"], activation_alpha=[0.1])
    with pytest.raises(ValueError, match="hidden_size: 5"):
        connx.gru(X, W, R, hidden_size=5)
    with pytest.raises(ValueError, match=r"W: expected shape \[D=1, 3H=12, I=3\]"):
        connx.gru(X, W[:, :, :2], R)
    with pytest.raises(ValueError, match="B: expected shape"):
        connx.gru(X, W, R, B=np.zeros((1, 12), np.float32))
    with pytest.raises(TypeError, match="B: expected dtype float32"):
        connx.gru(X, W, R, B=np.zeros((1, 24)))
    with pytest.raises(ValueError, match="sequence_lens: expected values in"):
        connx.gru(X, W, R, sequence_lens=np.array([1, 2, 5, 0, 1], np.int32))
    with pytest.raises(ValueError, match="direction"):
        connx.gru(X, W, R, direction="backward")
    with pytest.raises(ValueError, match="initial_h: expected shape"):
        connx.gru(X, W, R, initial_h=p["initial_h"], layout=1)
    with pytest.raises(ValueError, match="clip"):
        connx.gru(X, W, R, clip=-1.0)
    with pytest.raises(ValueError, match="linear_before_reset"):
        connx.gru(X, W, R, linear_before_reset=2)


def test_run_without_onnx_package_says_so(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "onnx", None)          # "import onnx" now fails
    inputs = _problem(seed=3)
    with pytest.raises(ImportError, match="needs the 'onnx' package"):
        connx.run("model.onnx", inputs)
    Y, _ = _cgru(inputs, {})                                 # gru() does not need onnx
    assert Y.shape == (4, 1, 5, 4)
