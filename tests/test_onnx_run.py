"""cgru.onnx.run on whole ONNX files, and cgru.onnx.recurrent_layers.

The files are written at test time by torch.onnx.export — the TorchScript exporter
(dynamo=False, opsets 7 to 23) and, where onnxscript is installed, the dynamo exporter — for
nn.GRU / nn.LSTM / nn.RNN models: one layer, two bidirectional layers, batch_first, with and
without h0 as a model input, Embedding → GRU → Linear, and pack_padded_sequence inside
forward (the TorchScript exporter writes it as the GRU's sequence_lens; the dynamo exporter
cannot export it).  Each runs in onnxruntime and in cgru.onnx.run (recurrent nodes by cgru,
counted, the rest by the ONNX reference evaluator): same output names, float32 values within
1e-5.  Hand-built graphs cover what the exporters do not write: glue nodes fed by graph
inputs, control flow and local functions around recurrent nodes, omitted outputs.
"""
import io
import warnings

import numpy as np
import pytest

import cgru
import cgru.onnx as connx
from cgru import convert

try:
    import torch
except ImportError:             # the tests that export (fixture `needs_torch`) then skip
    torch = None
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

F32 = dict(rtol=1e-5, atol=1e-5)
LEGACY_OPSETS = [9, 14, 17, 23]


def _export(module, args, *, input_names, output_names=None, opset=17, dynamo=False,
            tmp_path=None, **kw):
    """The ONNX bytes torch.onnx.export writes for ``module(*args)``."""
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            pytest.importorskip("onnxscript")
            path = tmp_path / "model.onnx"
            torch.onnx.export(module, args, str(path), dynamo=True, opset_version=opset,
                              input_names=input_names, output_names=output_names,
                              verbose=False, external_data=False, **kw)
            return path.read_bytes()
        f = io.BytesIO()
        torch.onnx.export(module, args, f, dynamo=False, opset_version=opset,
                          input_names=input_names, output_names=output_names, **kw)
        return f.getvalue()


@pytest.fixture
def needs_torch():
    return pytest.importorskip("torch")


@pytest.fixture
def counted(monkeypatch):
    """How often each cgru operator ran (proof that run() gave the node to cgru)."""
    calls = {op: 0 for op in connx.OPERATORS}

    def wrap(op, fn):
        def counting(*a, **kw):
            calls[op] += 1
            return fn(*a, **kw)
        return counting

    for op, fn in list(connx.OPERATORS.items()):
        monkeypatch.setitem(connx.OPERATORS, op, wrap(op, fn))
    return calls


def _compare(model, feeds, counted=None, nodes=None):
    """cgru.onnx.run against onnxruntime on the same file: names and values."""
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(None, feeds)))
    got = connx.run(model, feeds)
    assert list(got) == names
    for n in names:
        assert got[n].shape == want[n].shape and got[n].dtype == want[n].dtype, n
        np.testing.assert_allclose(got[n], want[n], err_msg=n, **F32)
    if counted is not None:
        assert counted == nodes, counted
    return got


def _count(model_bytes):
    m = onnx.load_model_from_string(model_bytes)
    out = {op: 0 for op in connx.OPERATORS}
    for n in m.graph.node:
        if n.op_type in out:
            out[n.op_type] += 1
    return out


# --- torch.onnx.export, TorchScript exporter ------------------------------------------------
_MODULES = {
    "gru": lambda: torch.nn.GRU(4, 5),
    "gru_2layer_bi": lambda: torch.nn.GRU(4, 5, num_layers=2, bidirectional=True),
    "gru_batch_first": lambda: torch.nn.GRU(4, 5, num_layers=2, batch_first=True),
    "lstm_2layer_bi": lambda: torch.nn.LSTM(4, 5, num_layers=2, bidirectional=True),
    "lstm_batch_first": lambda: torch.nn.LSTM(4, 5, batch_first=True),
    "rnn_tanh_bi": lambda: torch.nn.RNN(4, 5, bidirectional=True),
    "rnn_relu_2layer": lambda: torch.nn.RNN(4, 5, num_layers=2, nonlinearity="relu"),
}


def _case(name, with_h0, seed=0):
    torch.manual_seed(seed)
    module = _MODULES[name]()
    T, N = 6, 3
    x = torch.randn((N, T, 4) if module.batch_first else (T, N, 4))
    args, feeds, names = (x,), {"x": x.numpy()}, ["x"]
    if with_h0:
        LD = module.num_layers * (2 if module.bidirectional else 1)
        h0 = torch.randn(LD, N, 5)
        if isinstance(module, torch.nn.LSTM):
            c0 = torch.randn(LD, N, 5)
            args = (x, (h0, c0))
            feeds.update(h0=h0.numpy(), c0=c0.numpy())
            names += ["h0", "c0"]
        else:
            args = (x, h0)
            feeds["h0"] = h0.numpy()
            names.append("h0")
    return module, args, feeds, names


def _torch_outputs(module, args):
    with torch.no_grad():
        out = module(*args)
    y, state = out
    states = state if isinstance(state, tuple) else (state,)
    return [y.numpy()] + [s.numpy() for s in states]


@pytest.mark.parametrize("opset", LEGACY_OPSETS)
@pytest.mark.parametrize("name", sorted(_MODULES))
@pytest.mark.parametrize("with_h0", [False, True])
def test_torchscript_export_runs_like_onnxruntime(name, with_h0, opset, counted, needs_torch):
    module, args, feeds, names = _case(name, with_h0, seed=opset)
    outs = ["y", "h", "c"][:len(_torch_outputs(module, args))]
    model = _export(module, args, input_names=names, output_names=outs, opset=opset)
    got = _compare(model, feeds, counted, _count(model))
    for n, want in zip(outs, _torch_outputs(module, args)):    # and it is torch's function
        np.testing.assert_allclose(got[n], want, **F32)


@pytest.mark.parametrize("opset", [7, 8])
@pytest.mark.parametrize("name", ["gru_2layer_bi", "lstm_2layer_bi", "rnn_tanh_bi"])
def test_torchscript_export_opset7_weights_through_glue_nodes(name, opset, counted, needs_torch):
    """At opsets 7 and 8 the exporter lists the weights as graph inputs (with initializers)
    and feeds them to the node through Slice/Concat/Unsqueeze nodes (gate reordering, bias
    concatenation) at run time."""
    module, args, feeds, names = _case(name, True, seed=opset)
    model = _export(module, args, input_names=names, opset=opset)
    m = onnx.load_model_from_string(model)
    inits = {t.name for t in m.graph.initializer}
    assert inits <= {i.name for i in m.graph.input}
    rec = [n for n in m.graph.node if n.op_type in connx.OPERATORS]
    assert all(n.input[1] not in inits and n.input[3] not in inits for n in rec)   # glue
    _compare(model, feeds, counted, _count(model))
    # the weights resolve statically through the glue, to the arrays opset 14 stores
    layers7 = connx.recurrent_layers(model)
    layers14 = connx.recurrent_layers(_export(module, args, input_names=names, opset=14))
    assert len(layers7) == len(layers14) == module.num_layers
    for a, b in zip(layers7, layers14):
        assert a.network.cell == b.network.cell and a.network.topology == b.network.topology
        for lp, lq in zip(a.network, b.network):
            for k, v in lp.arrays().items():
                np.testing.assert_array_equal(v, lq.arrays()[k])


def test_torchscript_export_opset7_without_h0_needs_constantfill(needs_torch):
    """Without h0 the opset-7/8 exporter writes an experimental ConstantFill, which neither
    onnxruntime nor the reference evaluator implements: a clear error."""
    module, args, feeds, names = _case("gru", False)
    model = _export(module, args, input_names=names, opset=7)
    with pytest.raises(NotImplementedError, match="ConstantFill.*reference"):
        connx.run(model, feeds)


def _embed_gru():
    class EmbedGRU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(11, 4)
            self.gru = torch.nn.GRU(4, 6, batch_first=True, bidirectional=True)
            self.out = torch.nn.Linear(12, 3)

        def forward(self, tokens):
            y, h = self.gru(self.emb(tokens))
            return self.out(y).softmax(-1), h

    return EmbedGRU()


@pytest.mark.parametrize("opset", [9, 17, 23])
def test_embedding_gru_linear(opset, counted, needs_torch):
    torch.manual_seed(3)
    module = _embed_gru()
    tokens = torch.randint(0, 11, (2, 7))
    model = _export(module, (tokens,), input_names=["tokens"], output_names=["p", "h"],
                    opset=opset)
    got = _compare(model, {"tokens": tokens.numpy()}, counted, {"GRU": 1, "LSTM": 0, "RNN": 0})
    with torch.no_grad():
        p, h = module(tokens)
    np.testing.assert_allclose(got["p"], p.numpy(), **F32)
    np.testing.assert_allclose(got["h"], h.numpy(), **F32)


def _packed(kind):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class Packed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[kind](4, 5,
                                                                         bidirectional=True)

        def forward(self, x, lengths):
            packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
            y, state = self.rnn(packed)
            y, _ = pad_packed_sequence(y, total_length=x.shape[0])
            return (y, state) if isinstance(state, torch.Tensor) else (y, *state)

    return Packed()


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("opset", [11, 17])
def test_packed_sequence_export_is_sequence_lens(kind, opset, counted, needs_torch):
    torch.manual_seed(5)
    module = _packed(kind)
    x = torch.randn(6, 4, 4)
    lengths = torch.tensor([6, 2, 4, 1])
    model = _export(module, (x, lengths), input_names=["x", "lengths"], opset=opset)
    m = onnx.load_model_from_string(model)
    rec = [n for n in m.graph.node if n.op_type in ("GRU", "LSTM")]
    assert len(rec) == 1 and rec[0].input[4] != ""          # sequence_lens is used
    feeds = {"x": x.numpy(), "lengths": lengths.numpy()}
    got = _compare(model, feeds, counted, _count(model))
    with torch.no_grad():
        want = module(x, lengths)
    for g, w in zip(got.values(), want):
        np.testing.assert_allclose(g, w.numpy(), **F32)
    # padding is zero after each sequence's end, as pad_packed_sequence gives
    y = list(got.values())[0]
    assert np.all(y[2:, 1] == 0) and np.all(y[1:, 3] == 0)


def test_packed_sequence_cannot_be_exported_by_dynamo(tmp_path, needs_torch):
    pytest.importorskip("onnxscript")
    module = _packed("gru")
    x, lengths = torch.randn(6, 4, 4), torch.tensor([6, 2, 4, 1])
    with pytest.raises(Exception):
        _export(module, (x, lengths), input_names=["x", "lengths"], dynamo=True, opset=18,
                tmp_path=tmp_path)


# --- torch.onnx.export, dynamo exporter ----------------------------------------------------
@pytest.mark.parametrize("name,with_h0,opset", [
    ("gru_2layer_bi", False, 18), ("gru_batch_first", True, 23), ("lstm_2layer_bi", True, 18),
    ("lstm_batch_first", False, 23), ("rnn_relu_2layer", True, 20)])
def test_dynamo_export_runs_like_onnxruntime(name, with_h0, opset, tmp_path, counted, needs_torch):
    module, args, feeds, names = _case(name, with_h0, seed=opset)
    model = _export(module, args, input_names=names, opset=opset, dynamo=True,
                    tmp_path=tmp_path)
    got = _compare(model, feeds, counted, _count(model))
    for g, want in zip(got.values(), _torch_outputs(module, args)):
        np.testing.assert_allclose(g, want, **F32)


# --- recurrent_layers --------------------------------------------------------------------
def test_recurrent_layers_of_a_torch_export_compute_torch_and_its_gradients(needs_torch):
    """The listed networks run layer by layer as the torch module, and cgru.backward on them
    gives torch's weight gradients (mapped with cgru.convert.to_torch)."""
    module, args, feeds, names = _case("gru_2layer_bi", True, seed=11)
    model = _export(module, args, input_names=names, opset=17)
    layers = connx.recurrent_layers(model)
    assert [(l.op_type, l.index > 0, sorted(l.weights)) for l in layers] == \
        [("GRU", True, ["B", "R", "W"])] * 2
    assert all(l.attributes["linear_before_reset"] == 1 and not l.batch_major for l in layers)
    x, h0 = feeds["x"], feeds["h0"]
    out, hs = x, []
    for l, layer in enumerate(layers):
        f = cgru.forward(layer.network, out, np.ascontiguousarray(h0[2 * l:2 * l + 2]))
        out = f.y
        hs.append(f.hy)
    y_t, h_t = _torch_outputs(module, args)
    np.testing.assert_allclose(out, y_t, **F32)
    np.testing.assert_allclose(np.concatenate(hs), h_t, **F32)
    # layer(X) is the node itself
    Y, Y_h = layers[0](x, initial_h=h0[:2])
    np.testing.assert_allclose(Y.transpose(0, 2, 1, 3).reshape(6, 3, 10),
                               cgru.forward(layers[0].network, x, h0[:2]).y, rtol=0, atol=0)

    # gradients of layer 0 against torch autograd on a one-layer copy
    one = torch.nn.GRU(4, 5, bidirectional=True)
    one.load_state_dict({k: v for k, v in module.state_dict().items() if "_l0" in k})
    tx = torch.from_numpy(x).requires_grad_()
    y1, _ = one(tx, torch.from_numpy(h0[:2]))
    dy = np.random.default_rng(12).standard_normal(y1.shape).astype(np.float32)
    y1.backward(torch.from_numpy(dy))
    net = layers[0].network
    f = cgru.forward(net, x, np.ascontiguousarray(h0[:2]), training=True)
    g = cgru.backward(net, x, f.reserve, dy)
    np.testing.assert_allclose(g.dx, tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    grads = convert.to_torch(g.dparams)
    for k, p in one.named_parameters():
        np.testing.assert_allclose(grads[k], p.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=k)


def test_recurrent_layers_static_initial_states_and_lstm(tmp_path, needs_torch):
    """The dynamo exporter stores a zero initial state as an initializer: listed in
    ``initial``; an LSTM layer's networks and the node agree."""
    pytest.importorskip("onnxscript")
    module, args, feeds, names = _case("lstm_batch_first", False, seed=13)
    model = _export(module, args, input_names=names, opset=18, dynamo=True, tmp_path=tmp_path)
    (layer,) = connx.recurrent_layers(model)
    assert layer.op_type == "LSTM" and layer.network.cell == cgru.LSTMCell()
    assert layer.attributes["direction"] == "forward"            # decoded from bytes
    assert sorted(layer.initial) == ["initial_c", "initial_h"]
    assert not np.any(layer.initial["initial_h"]) and layer.initial["initial_h"].shape == (1, 3, 5)
    Y, Y_h, Y_c = layer(np.ascontiguousarray(feeds["x"].transpose(1, 0, 2)))
    np.testing.assert_allclose(Y_h, _torch_outputs(module, args)[1], **F32)
    np.testing.assert_allclose(Y_c, _torch_outputs(module, args)[2], **F32)


def _graph_model(nodes, inputs, outputs, initializers=(), opset=22, functions=()):
    return helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers)),
        opset_imports=[helper.make_opsetid("", opset)]
        + ([helper.make_opsetid("local", 1)] if functions else []),
        functions=list(functions))


def _vi(name, elem=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _gru_arrays(D=1, seed=21, I=3, H=4):
    rng = np.random.default_rng(seed)
    return {"W": rng.uniform(-0.5, 0.5, (D, 3 * H, I)).astype(np.float32),
            "R": rng.uniform(-0.5, 0.5, (D, 3 * H, H)).astype(np.float32),
            "B": rng.uniform(-0.5, 0.5, (D, 6 * H)).astype(np.float32),
            "X": rng.standard_normal((5, 2, I)).astype(np.float32)}


def test_recurrent_layers_through_constant_and_identity_and_what_stays_dynamic():
    a = _gru_arrays()
    from onnx import numpy_helper
    W_T = np.ascontiguousarray(a["W"].transpose(0, 2, 1))
    nodes = [helper.make_node("Constant", [], ["Wt"], value=numpy_helper.from_array(W_T)),
             helper.make_node("Transpose", ["Wt"], ["W"], perm=[0, 2, 1], name="t"),
             helper.make_node("Identity", ["r_init"], ["R"], name="id"),
             helper.make_node("GRU", ["X", "W", "R", "B"], ["Y", "Y_h"], name="gru",
                              hidden_size=4)]
    inits = [numpy_helper.from_array(a["R"], "r_init"), numpy_helper.from_array(a["B"], "B")]
    model = _graph_model(nodes, [_vi("X")], [_vi("Y"), _vi("Y_h")], inits)
    (layer,) = connx.recurrent_layers(model)
    for k in "WRB":
        np.testing.assert_array_equal(layer.weights[k], a[k])
    np.testing.assert_array_equal(connx.run(model, {"X": a["X"]})["Y"],
                                  connx.gru(a["X"], a["W"], a["R"], a["B"])[0])

    # W from a graph input through glue: run() computes it, recurrent_layers says why not
    nodes[0] = helper.make_node("Identity", ["w_in"], ["Wt"], name="idw")
    dyn = _graph_model(nodes, [_vi("X"), _vi("w_in")], [_vi("Y")], inits)
    with pytest.raises(ValueError, match=r"GRU node 'gru' \(graph node 3\): its W input 'W' "
                                         r"cannot be resolved statically: 'W' ← Transpose node "
                                         r"'t' ← Identity node 'idw' ← graph input 'w_in'"):
        connx.recurrent_layers(dyn)
    got = connx.run(dyn, {"X": a["X"], "w_in": W_T})
    np.testing.assert_array_equal(got["Y"], connx.gru(a["X"], a["W"], a["R"], a["B"])[0])


def test_recurrent_layers_with_directions_of_different_activations():
    a = _gru_arrays(D=2)
    from onnx import numpy_helper
    node = helper.make_node("GRU", ["X", "W", "R", "B"], ["Y"], direction="bidirectional",
                            activations=["Sigmoid", "Tanh", "HardSigmoid", "Softsign"])
    model = _graph_model([node], [_vi("X")], [_vi("Y")],
                         [numpy_helper.from_array(a[k], k) for k in "WRB"])
    (layer,) = connx.recurrent_layers(model)
    assert [n.topology.direction for n in layer.networks] == ["forward", "reverse"]
    with pytest.raises(ValueError, match="use .networks"):
        layer.network
    Y = connx.run(model, {"X": a["X"]})["Y"]
    np.testing.assert_array_equal(layer(a["X"])[0], Y)
    y_rev = cgru.forward(layer.networks[1], a["X"]).y
    np.testing.assert_array_equal(y_rev, Y[:, 1])


# --- run(): graphs the exporters do not write ----------------------------------------------
def test_initializers_listed_as_inputs_may_be_overridden(needs_torch):
    module, args, feeds, names = _case("gru", True, seed=31)
    model = _export(module, args, input_names=names, opset=14,
                    keep_initializers_as_inputs=True)
    m = onnx.load_model_from_string(model)
    init = {t.name for t in m.graph.initializer}
    assert init <= {i.name for i in m.graph.input}
    name = sorted(init)[0]
    value = onnx.numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == name))
    _compare(model, dict(feeds, **{name: value * 0.5}))
    plain = _export(module, args, input_names=names, opset=14)
    with pytest.raises(ValueError, match="'q' is not an input of the graph"):
        connx.run(plain, dict(feeds, q=value))
    # an initializer that is not a graph input may be replaced too (onnxruntime refuses
    # that): the same as a model storing the new value
    m = onnx.load_model_from_string(plain)
    t = next(t for t in m.graph.initializer if list(t.dims) == [1, 15, 4])   # W [1, 3H, I]
    w_name, W = t.name, onnx.numpy_helper.to_array(t)
    t.CopyFrom(onnx.numpy_helper.from_array(W * 0.5, w_name))
    swapped = connx.run(plain, dict(feeds, **{w_name: W * 0.5}))
    want = _compare(m.SerializeToString(), feeds)
    for n in want:
        np.testing.assert_array_equal(swapped[n], want[n])
    assert np.abs(swapped[n] - connx.run(plain, feeds)[n]).max() > 1e-3
    with pytest.raises(TypeError, match=rf"inputs\['{w_name}'\]: expected dtype float32"):
        connx.run(plain, dict(feeds, **{w_name: W.astype(np.float64)}))


def test_omitted_outputs_do_not_leak_into_optional_inputs(counted):
    """GRU(..) → ("", Y_h), then Clip(Y_h, "", max): the omitted min must stay omitted."""
    a = _gru_arrays()
    from onnx import numpy_helper
    nodes = [helper.make_node("GRU", ["X", "W", "R", "B"], ["", "Y_h"], hidden_size=4),
             helper.make_node("Clip", ["Y_h", "", "hi"], ["Z"])]
    inits = [numpy_helper.from_array(a[k], k) for k in "WRB"] + \
        [numpy_helper.from_array(np.array(0.1, np.float32), "hi")]
    model = _graph_model(nodes, [_vi("X")], [_vi("Z")], inits)
    got = _compare(model.SerializeToString(), {"X": a["X"]})
    _, Y_h = connx.gru(a["X"], a["W"], a["R"], a["B"])
    np.testing.assert_array_equal(got["Z"], np.minimum(Y_h, 0.1))
    assert counted["GRU"] == 1


def test_recurrent_nodes_in_if_branches_and_local_functions(counted):
    a = _gru_arrays(D=2)
    from onnx import numpy_helper
    inits = [numpy_helper.from_array(a[k], k) for k in "WRB"]
    rng = np.random.default_rng(41)
    lstm_w = {"LW": rng.uniform(-0.5, 0.5, (1, 16, 3)).astype(np.float32),
              "LR": rng.uniform(-0.5, 0.5, (1, 16, 4)).astype(np.float32),
              "LP": rng.uniform(-0.5, 0.5, (1, 12)).astype(np.float32)}
    inits += [numpy_helper.from_array(v, k) for k, v in lstm_w.items()]
    then = helper.make_graph([helper.make_node("LSTM", ["X", "LW", "LR", "", "", "", "", "LP"],
                                               ["Yl"], hidden_size=4, clip=0.8)],
                             "then", [], [_vi("Yl")])
    other = helper.make_graph([helper.make_node("Neg", ["X"], ["Yn"])], "else", [],
                              [_vi("Yn")])
    fn = helper.make_function("local", "BiGRU", ["x", "w", "r", "b"], ["y"],
                              [helper.make_node("GRU", ["x", "w", "r", "b"], ["y"],
                                                direction="bidirectional", hidden_size=4,
                                                linear_before_reset=1)],
                              [helper.make_opsetid("", 22)])
    nodes = [helper.make_node("If", ["cond"], ["Yif"], then_branch=then, else_branch=other),
             helper.make_node("BiGRU", ["X", "W", "R", "B"], ["Yg"], domain="local")]
    model = _graph_model(nodes, [_vi("X"), _vi("cond", TensorProto.BOOL, [])],
                         [_vi("Yif"), _vi("Yg")], inits, functions=[fn])
    got = connx.run(model, {"X": a["X"], "cond": np.array(True)})
    assert counted == {"GRU": 1, "LSTM": 1, "RNN": 0}
    np.testing.assert_array_equal(got["Yif"], connx.lstm(
        a["X"], lstm_w["LW"], lstm_w["LR"], P=lstm_w["LP"], clip=0.8)[0])
    np.testing.assert_array_equal(got["Yg"], connx.gru(
        a["X"], a["W"], a["R"], a["B"], direction="bidirectional", linear_before_reset=1,
        hidden_size=4)[0])
    # onnxruntime agrees (its LSTM honours the clip, which the reference evaluator's ignores)
    _compare(model.SerializeToString(), {"X": a["X"], "cond": np.array(True)})


def test_run_errors_name_the_node_and_the_argument():
    a = _gru_arrays()
    from onnx import numpy_helper
    node = helper.make_node("GRU", ["X", "W", "R"], ["Y"], name="g1", hidden_size=5)
    model = _graph_model([node], [_vi("X")], [_vi("Y")],
                         [numpy_helper.from_array(a[k], k) for k in "WR"])
    with pytest.raises(ValueError, match=r"^GRU node 'g1': hidden_size: 5 disagrees"):
        connx.run(model, {"X": a["X"]})
    node = helper.make_node("LSTM", ["X", "W", "R"], ["Y"], name="l1", linear_before_reset=1)
    model = _graph_model([node], [_vi("X")], [_vi("Y")],
                         [numpy_helper.from_array(a[k], k) for k in "WR"])
    with pytest.raises(ValueError, match="unsupported LSTM attribute 'linear_before_reset'"):
        connx.run(model, {"X": a["X"]})
    with pytest.raises(ValueError, match=r"inputs\['X'\]: expected shape \[5, 2, 3\]"):
        connx.run(_graph_model([helper.make_node("Relu", ["X"], ["Y"])],
                               [_vi("X", shape=[5, 2, 3])], [_vi("Y")]),
                  {"X": a["X"][:, :1]})
    with pytest.raises(ValueError, match=r"missing 'X' \(the GRU input X of GRU node 'g1'\)"):
        connx.run(_graph_model([helper.make_node("GRU", ["X", "W", "R"], ["Y"], name="g1")],
                               [_vi("X")], [_vi("Y")],
                               [numpy_helper.from_array(a[k], k) for k in "WR"]), {})


# --- control flow: where the reference evaluator differs from onnxruntime -------------------
def _loop_model(value_shape):
    """A Loop of M iterations whose one scan output is the iteration number (as float) in a
    tensor of ``value_shape`` (``[]``: a scalar)."""
    body_nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                  helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT)]
    if value_shape:
        body_nodes += [helper.make_node("Constant", [], ["shape"], value=helper.make_tensor(
                           "shape", TensorProto.INT64, [len(value_shape)], value_shape)),
                       helper.make_node("Expand", ["i_f", "shape"], ["v"])]
    else:
        body_nodes.append(helper.make_node("Identity", ["i_f"], ["v"]))
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond"], ["vs"], body=body)], "loop",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("vs", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("value_shape", [[], [4], [2, 3]])
def test_loop_scan_outputs_are_stacked_as_onnx_says(value_shape):
    # onnx's reference evaluator stacks a Loop's scan outputs with np.vstack ([n, 1] for
    # scalars, [n·2, 3] for [2, 3] values); cgru.onnx.run gives ONNX's [n, *value_shape], as
    # onnxruntime does
    model = _loop_model(value_shape)
    feeds = {"M": np.array(3, np.int64), "cond": np.array(True)}
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = connx.run(model, feeds)["vs"]
    assert got.shape == want.shape == (3, *value_shape)
    np.testing.assert_array_equal(got, want)


def test_a_loop_of_no_iteration_with_scan_outputs_is_refused():
    # a documented limitation: onnxruntime returns an empty [0] tensor; the reference
    # evaluator cannot stack no values, and cgru says so instead of guessing a shape
    model = _loop_model([])
    feeds = {"M": np.array(0, np.int64), "cond": np.array(True)}
    assert ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0].shape == (0,)
    with pytest.raises(ValueError, match="reference evaluator failed"):
        connx.run(model, feeds)


@pytest.mark.parametrize("reverse_output", [False, True])
def test_a_scan_in_reverse_is_refused(reverse_output):
    # a documented limitation: the reference evaluator runs Scan forward only (directions and
    # axes 0); onnxruntime runs the rest, cgru.onnx.run refuses it before anything runs
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["y_t"])], "body",
        [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [2])])
    direction = {"scan_output_directions": [1]} if reverse_output \
        else {"scan_input_directions": [1]}
    graph = helper.make_graph(
        [helper.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, num_scan_inputs=1,
                          **direction)], "scan",
        [helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"s0": np.zeros(2, np.float32), "x": np.arange(6, dtype=np.float32).reshape(3, 2)}
    ort.InferenceSession(model.SerializeToString()).run(None, feeds)     # onnxruntime runs it
    with pytest.raises(ValueError, match="reference evaluator"):
        connx.run(model, feeds)
