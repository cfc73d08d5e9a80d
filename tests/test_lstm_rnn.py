"""The LSTM (with cuDNN's recurrent projection) and the vanilla RNN in the core engine.

Oracles, each able to fail:

1. ``torch.nn.LSTM`` (with and without ``proj_size``) and ``torch.nn.RNN`` (tanh, relu) with
   autograd: outputs, final states and every gradient, over layers, directions, batch-first,
   packed unsorted sequences and both dtypes.
2. float64 central finite differences (``cgru.core.gradcheck``) of every input, state and
   weight of every mode, including what torch lacks: reverse, masks, clip and other
   activations, skip and projected input, dropout, zero lengths.
3. The NumPy reference over dtypes, directions, depths and lengths; onnxruntime's ``LSTM`` and
   ``RNN`` operators for the forward.
4. Thread-count independence (bitwise), the reserve's size query, bad input.

Every test runs with the ``poison`` fixture (engine buffers start as NaN), so an element a
kernel or the engine leaves unwritten shows.
"""
import math

import numpy as np
import pytest

import cgru
from cgru import LSTMCell, Network, RNNCell, Topology
from cgru.core import gradcheck, reference
from conftest import run_torch_rnn

pytestmark = pytest.mark.usefixtures("poison")

KINDS = {
    "lstm": LSTMCell(),
    "rnn_tanh": RNNCell("tanh"),
    "rnn_relu": RNNCell("relu"),
}
TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


def _net(kind_or_cell, I=4, H=5, L=1, direction="forward", proj=0, input_mode="linear",
         dtype=np.float64, seed=0, scale=None):
    cell = KINDS[kind_or_cell] if isinstance(kind_or_cell, str) else kind_or_cell
    topo = Topology(I, H, L, direction, input_mode, proj_size=proj)
    return Network.random(topo, dtype, seed=seed, scale=scale, cell=cell)


def _inputs(net, T, N, seed=1, batch_first=False):
    rng = np.random.default_rng(seed)
    topo, dt = net.topology, net.dtype
    xs = (N, T, topo.input_size) if batch_first else (T, N, topo.input_size)
    ys = (N, T, topo.output_size) if batch_first else (T, N, topo.output_size)
    LD = topo.num_layer_directions
    a = dict(x=rng.standard_normal(xs).astype(dt),
             h0=rng.standard_normal((LD, N, topo.state_size)).astype(dt),
             dy=rng.standard_normal(ys).astype(dt),
             dhy=rng.standard_normal((LD, N, topo.state_size)).astype(dt))
    if net.cell.has_cell_state:
        a["c0"] = rng.standard_normal((LD, N, topo.hidden_size)).astype(dt)
        a["dcy"] = rng.standard_normal((LD, N, topo.hidden_size)).astype(dt)
    return a


def _cgru(net, a, lengths=None, batch_major=False, **kw):
    f = cgru.forward(net, a["x"], a["h0"], c0=a.get("c0"), lengths=lengths,
                     batch_major=batch_major, training=True, **kw)
    g = cgru.backward(net, a["x"], f.reserve, a["dy"], a["dhy"], dcy=a.get("dcy"),
                      batch_major=batch_major, state_mask=kw.get("state_mask"),
                      num_threads=kw.get("num_threads"))
    return f, g


def _close(a, b, tol, what):
    np.testing.assert_allclose(a, b, **tol, err_msg=what)


# --- 1. against torch ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lengths", [None, [6, 2, 5, 1]], ids=["full", "packed"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("L,direction", [(1, "forward"), (2, "bidirectional"), (3, "forward")])
@pytest.mark.parametrize("kind,proj", [("lstm", 0), ("lstm", 3), ("rnn_tanh", 0),
                                       ("rnn_relu", 0)])
def test_matches_torch_with_autograd(kind, proj, L, direction, batch_first, lengths, dtype):
    pytest.importorskip("torch")
    T, N = 6, 4
    net = _net(kind, L=L, direction=direction, proj=proj, dtype=dtype)
    a = _inputs(net, T, N, batch_first=batch_first)
    lengths = None if lengths is None else np.array(lengths)
    f, g = _cgru(net, a, lengths=lengths, batch_major=batch_first)
    want = run_torch_rnn(net, a["x"], a["h0"], a.get("c0"), lengths=lengths,
                         batch_first=batch_first, dy=a["dy"], dhy=a["dhy"], dcy=a.get("dcy"))
    tol = TOL[dtype]
    _close(f.y, want["y"], tol, "y")
    _close(f.hy, want["hy"], tol, "hy")
    _close(g.dx, want["dx"], tol, "dx")
    _close(g.dh0, want["dh0"], tol, "dh0")
    if kind == "lstm":
        _close(f.cy, want["cy"], tol, "cy")
        _close(g.dc0, want["dc0"], tol, "dc0")
    for i, (mine, theirs) in enumerate(zip(g.dparams, want["dparams"])):
        assert mine.arrays().keys() == theirs.arrays().keys()
        for name, v in mine.arrays().items():
            _close(v, getattr(theirs, name), tol, f"d{name}[{i}]")


# --- 2. against finite differences -------------------------------------------------------------
GRAD_CASES = {
    "lstm": dict(kind="lstm"),
    "lstm_proj_bi_L2_lengths": dict(kind="lstm", proj=2, L=2, direction="bidirectional",
                                    lengths=[4, 1, 0]),
    "lstm_reverse_mask": dict(kind="lstm", direction="reverse", mask=True, lengths=[3, 4, 2]),
    "lstm_general_clip": dict(kind=LSTMCell(f_f="hard_sigmoid", g="softsign", h=("elu", 0.7),
                                            f_o=("scaled_tanh", 0.8, 1.2), clip=1.5),
                              scale=1.2),
    "lstm_skip_dropout": dict(kind="lstm", I=3, H=3, L=2, input_mode="skip", dropout=0.4),
    "lstm_projected_bi": dict(kind="lstm", I=24, H=3, direction="bidirectional",
                              input_mode="projected"),
    "lstm_proj_mask_batch_major": dict(kind="lstm", proj=2, mask=True, batch_major=True),
    "lstm_peepholes_bi_lengths": dict(kind=LSTMCell(peepholes=True), L=2,
                                      direction="bidirectional", lengths=[4, 2, 0], scale=0.8),
    "lstm_ifgo_peepholes_bi_lengths": dict(kind=LSTMCell(peepholes="ifgo"), L=2,
                                           direction="bidirectional", lengths=[4, 2, 0],
                                           scale=0.8),
    "lstm_ifgo_peepholes_general_mask": dict(
        kind=LSTMCell(peepholes="ifgo", f_i="hard_sigmoid", g="softsign", clip=1.4),
        mask=True, direction="reverse", scale=1.2),
    "lstm_input_forget_proj": dict(kind=LSTMCell(input_forget=True), proj=2,
                                   direction="reverse"),
    "lstm_peepholes_input_forget_clip_mask": dict(
        kind=LSTMCell(peepholes=True, input_forget=True, clip=1.2, f_i="hard_sigmoid",
                      h="softsign"), mask=True, scale=1.2),
    "rnn_tanh_bi_L2": dict(kind="rnn_tanh", L=2, direction="bidirectional", lengths=[4, 2, 3]),
    "rnn_relu_reverse": dict(kind="rnn_relu", direction="reverse", scale=0.8),
    "rnn_general_clip_mask": dict(kind=RNNCell(("leaky_relu", 0.2), clip=1.0), mask=True,
                                  scale=1.5),
    "rnn_skip_projected": dict(kind="rnn_tanh", I=3, H=3, input_mode="skip"),
    "rnn_projected": dict(kind="rnn_relu", I=6, H=3, direction="bidirectional",
                          input_mode="projected", lengths=[0, 4, 2]),
}


@pytest.mark.parametrize("loss", ["y", "states", "both"])
@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_backward_matches_finite_differences(case, loss):
    c = dict(GRAD_CASES[case])
    kind = c.pop("kind")
    lengths = c.pop("lengths", None)
    mask = c.pop("mask", False)
    dropout = c.pop("dropout", 0.0)
    batch_major = c.pop("batch_major", False)
    T, N = 4, 3
    net = _net(kind, **{"I": 3, "H": 3, **c})
    a = _inputs(net, T, N, batch_first=batch_major)
    topo = net.topology
    if loss == "y":
        a["dhy"] = None
        a.pop("dcy", None)
    elif loss == "states":
        a["dy"] = None
    m = None
    if mask:
        shape = (N, T, topo.output_size) if batch_major else (T, N, topo.output_size)
        m = np.random.default_rng(5).uniform(0.5, 1.5, shape)
    lengths = None if lengths is None else np.array(lengths)
    kw = dict(lengths=lengths, batch_major=batch_major, state_mask=m, dropout=dropout, seed=3)
    f = cgru.forward(net, a["x"], a["h0"], c0=a.get("c0"), training=True, **kw)
    g = cgru.backward(net, a["x"], f.reserve, a["dy"], a["dhy"], dcy=a.get("dcy"),
                      batch_major=batch_major, state_mask=m)

    def losses():
        r = cgru.forward(net, a["x"], a["h0"], c0=a.get("c0"), training=True, num_threads=1,
                         **kw)
        total = gradcheck.loss(r.y, r.hy, a["dy"], a["dhy"])
        if a.get("dcy") is not None:
            total += math.fsum((r.cy * a["dcy"]).ravel())
        return total

    items = [("dx", a["x"], g.dx), ("dh0", a["h0"], g.dh0)]
    if net.cell.has_cell_state:
        items.append(("dc0", a["c0"], g.dc0))
    for i, (lp, glp) in enumerate(zip(net, g.dparams)):
        items += [(f"d{k}[{i}]", v, getattr(glp, k)) for k, v in lp.arrays().items()]
    numeric = gradcheck.central_differences(losses, [v for _, v, _ in items])
    worst = 0.0
    for (name, _, got), num in zip(items, numeric):
        np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-8, err_msg=name)
        if num.size:
            worst = max(worst, float(np.abs(got - num).max() / max(np.abs(num).max(), 1e-12)))
    assert worst < 1e-6


# --- 3. against the NumPy reference ----------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("L", [1, 2])
@pytest.mark.parametrize("kind,proj", [("lstm", 0), ("lstm", 2), ("rnn_tanh", 0),
                                       ("rnn_relu", 0), ("lstm_peepholes", 0),
                                       ("lstm_peepholes_ifgo", 2), ("lstm_input_forget", 2)])
def test_matches_the_reference(kind, proj, L, direction, dtype):
    T, N = 5, 18                          # N = 18: two batch chunks per direction
    cell = {"lstm_peepholes": LSTMCell(peepholes=True),
            "lstm_peepholes_ifgo": LSTMCell(peepholes="ifgo"),
            "lstm_input_forget": LSTMCell(input_forget=True)}.get(kind, kind)
    net = _net(cell, L=L, direction=direction, proj=proj, dtype=dtype, H=4)
    a = _inputs(net, T, N)
    lengths = np.random.default_rng(2).integers(0, T + 1, N)
    f, g = _cgru(net, a, lengths=lengths)
    r = reference.forward(net, a["x"], a["h0"], c0=a.get("c0"), lengths=lengths)
    rb = reference.backward(net, a["x"], a["dy"], a["dhy"], a["h0"], c0=a.get("c0"),
                            dcy=a.get("dcy"), lengths=lengths)
    tol = TOL[dtype] if dtype == np.float64 else dict(rtol=2e-5, atol=2e-5)
    _close(f.y, r[0], tol, "y")
    _close(f.hy, r[1], tol, "hy")
    _close(g.dx, rb[0], tol, "dx")
    _close(g.dh0, rb[1], tol, "dh0")
    if net.cell.kind == "lstm":
        _close(f.cy, r[2], tol, "cy")
        _close(g.dc0, rb[2], tol, "dc0")
    _close(g.dparams.flat(), rb[-1].flat(), tol, "dparams")


@pytest.mark.parametrize("kind,ort_op", [("lstm", "LSTM"), ("rnn_tanh", "RNN"),
                                         ("rnn_relu", "RNN")])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_forward_matches_onnxruntime(kind, ort_op, direction):
    """onnxruntime's LSTM / RNN operator on the same weights (ONNX gate order i, o, f, c)."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    T, N, I, H = 5, 3, 4, 6
    net = _net(kind, I=I, H=H, direction=direction, dtype=np.float32)
    D = net.topology.num_directions
    a = _inputs(net, T, N)
    lengths = np.array([5, 2, 4], np.int32)
    order = [0, 3, 1, 2] if kind == "lstm" else [0]       # canonical i, f, g, o → ONNX i, o, f, c
    G = len(order)

    def onnx_blocks(M):
        return np.concatenate([M[g * H:(g + 1) * H] for g in order])
    W = np.stack([onnx_blocks(net[0, d].W) for d in range(D)])
    R = np.stack([onnx_blocks(net[0, d].R) for d in range(D)])
    B = np.stack([np.concatenate([onnx_blocks(net[0, d].b_W), onnx_blocks(net[0, d].b_R)])
                  for d in range(D)])
    inputs = dict(X=a["x"], W=W, R=R, B=B, sequence_lens=lengths, initial_h=a["h0"])
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h"]
    if kind == "lstm":
        inputs["initial_c"] = a["c0"]
        names.append("initial_c")
    attrs = dict(hidden_size=H, direction=direction)
    if kind == "rnn_relu":
        attrs["activations"] = ["Relu"] * D
    node = helper.make_node(ort_op, names, ["Y", "Y_h"] + (["Y_c"] if kind == "lstm" else []),
                            **attrs)
    vi = lambda n, arr: helper.make_tensor_value_info(
        n, TensorProto.INT32 if arr.dtype == np.int32 else TensorProto.FLOAT, arr.shape)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in node.output]
    graph = helper.make_graph([node], "g", [vi(n, inputs[n]) for n in names], outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = dict(zip(node.output, sess.run(None, {n: inputs[n] for n in names})))
    f = cgru.forward(net, a["x"], a["h0"], c0=a.get("c0"), lengths=lengths)
    # ONNX Y [T, D, N, H]; cgru y [T, N, D·H]; onnxruntime zeroes Y_h of len 0 (none here)
    np.testing.assert_allclose(f.y, got["Y"].transpose(0, 2, 1, 3).reshape(T, N, D * H),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(f.hy, got["Y_h"], rtol=1e-5, atol=1e-5)
    if kind == "lstm":
        np.testing.assert_allclose(f.cy, got["Y_c"], rtol=1e-5, atol=1e-5)
    del onnx


# --- 4. threads, sizes, errors -----------------------------------------------------------------
@pytest.mark.parametrize("kind,proj", [("lstm", 0), ("lstm", 3), ("rnn_relu", 0)])
def test_thread_count_does_not_change_results(kind, proj, monkeypatch):
    from cgru.core import plan
    monkeypatch.setattr(plan, "_MIN_PARALLEL_WORK", 0)
    T, N = 6, 40                                 # two batch chunks per direction
    net = _net(kind, L=2, direction="bidirectional", proj=proj, dtype=np.float32, H=8)
    a = _inputs(net, T, N)
    lengths = np.random.default_rng(4).integers(0, T + 1, N)
    mask = np.random.default_rng(5).uniform(0.5, 1.5, (T, N, net.topology.output_size))
    mask = mask.astype(np.float32)
    runs = []
    for nt in (1, 2, 1):
        f, g = _cgru(net, a, lengths=lengths, state_mask=mask, dropout=0.3, num_threads=nt)
        runs.append([f.y, f.hy, f.reserve, g.dx, g.dh0, g.dparams.flat()]
                    + ([f.cy, g.dc0] if kind == "lstm" else []))
    for other in runs[1:]:
        for u, v in zip(runs[0], other):
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("kind,proj", [("lstm", 0), ("lstm", 2), ("rnn_tanh", 0),
                                       ("lstm_general", 0), ("rnn_general", 0)])
def test_reserve_nbytes_matches_the_reserve(kind, proj):
    cell = {"lstm_general": LSTMCell(clip=2.0), "rnn_general": RNNCell("softsign")}.get(kind,
                                                                                         kind)
    net = _net(cell, L=2, direction="bidirectional", proj=proj)
    a = _inputs(net, 5, 3)
    f = cgru.forward(net, a["x"], a["h0"], c0=a.get("c0"), training=True)
    assert f.reserve.size == cgru.reserve_nbytes(net, 5, 3)
    assert f.reserve.size == cgru.reserve_nbytes(net.topology, 5, 3, cell=net.cell,
                                                 dtype=net.dtype)


def test_bad_input_names_the_argument():
    lstm, gru = _net("lstm", proj=2), Network.random(Topology(4, 5), np.float64)
    x = np.zeros((3, 2, 4))
    with pytest.raises(ValueError, match=r"^c0: only LSTM cells have a cell state"):
        cgru.forward(gru, x, c0=np.zeros((1, 2, 5)))
    with pytest.raises(ValueError, match=r"^c0: expected shape \[L·D=1, N=2, H=5\], got \[1, 2, 2\]"):
        cgru.forward(lstm, x, c0=np.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match=r"^h0: expected shape \[L·D=1, N=2, P=2\], got \[1, 2, 5\]"):
        cgru.forward(lstm, x, np.zeros((1, 2, 5)))
    with pytest.raises(ValueError, match=r"^proj_size: a recurrent projection exists for LSTM"):
        Network.random(Topology(4, 5, proj_size=2), np.float64, cell=RNNCell())
    with pytest.raises(ValueError, match=r"^proj_size: expected at most hidden_size=5"):
        Topology(4, 5, proj_size=6)
    f = cgru.forward(lstm, x, training=True)
    with pytest.raises(ValueError, match=r"^dcy: expected shape \[L·D=1, N=2, H=5\]"):
        cgru.backward(lstm, x, f.reserve, dcy=np.zeros((1, 2, 2)))
    rnn = _net("rnn_tanh")
    fr = cgru.forward(rnn, x, training=True)
    with pytest.raises(ValueError, match=r"^dcy: only LSTM cells have a cell state"):
        cgru.backward(rnn, x, fr.reserve, dcy=np.zeros((1, 2, 5)))
    # a GRU reserve is not an LSTM's
    with pytest.raises(ValueError, match="reserve:"):
        cgru.backward(lstm, x, cgru.forward(gru, x, training=True).reserve)


def test_forward_and_gradients_results_unpack_as_before():
    """``.cy`` / ``.dc0`` are attributes: the results still unpack into three values."""
    net = _net("lstm")
    a = _inputs(net, 3, 2)
    y, hy, reserve = f = cgru.forward(net, a["x"], c0=a["c0"], training=True)
    dx, dh0, dparams = g = cgru.backward(net, a["x"], reserve, a["dy"], dcy=a["dcy"])
    assert f.cy.shape == (1, 2, 5) and g.dc0.shape == (1, 2, 5)
    import pickle
    f2 = pickle.loads(pickle.dumps(f))
    np.testing.assert_array_equal(f2.cy, f.cy)


def test_peepholes_are_weights_of_their_own():
    """An LSTM with peepholes has P [3H] per layer-direction (i, f, o), in its flat layout
    after the biases; a network without them refuses P."""
    cell = LSTMCell(peepholes=True)
    net = _net(cell, L=2, direction="bidirectional")
    assert all(lp.P.shape == (15,) for lp in net)
    flat = net.flat()
    assert flat.size == net.flat_size() == Topology(4, 5, 2, "bidirectional").flat_size(4) + 4 * 15
    np.testing.assert_array_equal(flat[-15:], net[3].P)
    back = Network.from_flat(net.topology, flat, cell=cell)
    np.testing.assert_array_equal(back.flat(), flat)
    plain = _net("lstm")
    lp = plain[0]
    with pytest.raises(ValueError, match=r"params\[0\]\.P: given, but the cell has no peepholes"):
        Network(plain.topology, [cgru.LayerParams(lp.W, lp.R, lp.b_W, lp.b_R, P=np.zeros(15))],
                LSTMCell())
    with pytest.raises(TypeError, match=r"params\[0\]\.P: expected a numpy array \[15\]"):
        Network(plain.topology, [lp], cell)


def test_ifgo_peepholes_follow_their_equations():
    """peepholes="ifgo" (MPSGraph's form): every gate sees the previous cell state through
    P = [P_i, P_f, P_g, P_o] [4H] — written out here step by step, independently of the
    reference module."""
    T, N, I, H = 4, 3, 2, 5
    cell = LSTMCell(peepholes="ifgo")
    net = Network.random(Topology(I, H), np.float64, seed=3, cell=cell)
    assert net[0].P.shape == (4 * H,) and net.flat_size() == Topology(I, H).flat_size(4) + 4 * H
    rng = np.random.default_rng(4)
    x, h, c = rng.standard_normal((T, N, I)), rng.standard_normal((N, H)), \
        rng.standard_normal((N, H))
    f = cgru.forward(net, x, h[None], c0=c[None])
    lp = net[0]
    sig = lambda v: 1 / (1 + np.exp(-v))
    for t in range(T):
        a = x[t] @ lp.W.T + lp.b_W + h @ lp.R.T + lp.b_R + np.tile(lp.P, 1) * np.tile(c, 4)
        i, fg, g, o = sig(a[:, :H]), sig(a[:, H:2 * H]), np.tanh(a[:, 2 * H:3 * H]), \
            sig(a[:, 3 * H:])
        c = fg * c + i * g
        h = o * np.tanh(c)
        np.testing.assert_allclose(f.y[t], h, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(f.cy[0], c, rtol=1e-13, atol=1e-13)
    # "ifo" differs: its output gate sees the new cell state, and it has no P_g
    assert LSTMCell(peepholes=True).peepholes == "ifo" and LSTMCell().peepholes is False
    with pytest.raises(ValueError, match=r"LSTMCell.peepholes: expected False, True, 'ifo' or "
                                         r"'ifgo', got 'iofc'"):
        LSTMCell(peepholes="iofc")
