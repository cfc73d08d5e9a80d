"""One checked call: a call validates, copies and fingerprints each array once.

A frontend checks its arguments in its own words and builds the core's call value from them
(``cgru.core.calls``); the engine trusts it.  These tests walk an argument from a frontend to
the time loop and count what happens to it on the way: a TF backprop used to re-run its checks
(a second copy of the weights) and open the reserve twice — three weight digests and three
input digests per training step.
"""
import numpy as np
import pytest

import cgru
from cgru import tf
from cgru.core import calls, reserve, validate, weights


@pytest.fixture
def counts(monkeypatch):
    """Counters of the per-array work of a call: ``copies`` (weight arrays copied into kept
    copies), ``proofs`` (weight arrays compared with their kept copy), ``macs`` (MACs of a call
    argument, by label), ``lengths`` (sequence-length checks)."""
    seen = {"copies": 0, "proofs": 0, "macs": {}, "lengths": 0, "freeze": 0}
    real_copy, real_same, real_mac = weights._copy, weights.same_bytes, reserve.data_mac
    real_lengths, real_freeze = validate.lengths, weights.freeze

    def copy(a, fingerprinted=False):
        seen["copies"] += 1
        return real_copy(a, fingerprinted)

    def same(a, b, num_threads=1):
        seen["proofs"] += 1
        return real_same(a, b, num_threads)

    def mac(label, *arrays):
        seen["macs"][label] = seen["macs"].get(label, 0) + 1
        return real_mac(label, *arrays)

    def lengths(*args, **kw):
        seen["lengths"] += 1
        return real_lengths(*args, **kw)

    def freeze(net, num_threads=1, fingerprinted=False):
        seen["freeze"] += 1
        return real_freeze(net, num_threads, fingerprinted)
    monkeypatch.setattr(weights, "_copy", copy)
    monkeypatch.setattr(weights, "same_bytes", same)
    monkeypatch.setattr(reserve, "data_mac", mac)
    monkeypatch.setattr(validate, "lengths", lengths)
    monkeypatch.setattr(calls.weights, "freeze", freeze)
    cgru.release_memory()

    def reset():
        seen.update(copies=0, proofs=0, macs={}, lengths=0, freeze=0)
    seen["reset"] = reset
    return seen


def test_a_tf_training_step_takes_each_array_once(counts):
    """``cudnn_rnn_v3`` then ``cudnn_rnn_backprop_v3``: the forward copies each weight array
    once (views of the opaque params, never a copy of the buffer itself), fingerprints the input
    once; the backprop proves the weights once (a byte comparison each, no copy) and
    fingerprints the input once — one open of the reserve."""
    rng = np.random.default_rng(0)
    L, H, I, T, N = 2, 4, 3, 5, 2
    n = tf.params_size(L, H, I, rnn_mode="gru", dtype=np.float64)
    params = rng.standard_normal(n)
    x = rng.standard_normal((N, T, I))
    h = np.zeros((N, L, H))
    lengths = np.array([5, 3])
    arrays = 4 * L                                       # W, R, b_W, b_R per layer
    fwd = tf.cudnn_rnn_v3(x, h, h, params, lengths, rnn_mode="gru", time_major=False)
    assert counts["freeze"] == 1 and counts["copies"] == arrays and counts["proofs"] == 0
    assert counts["macs"][b"x"] == 1 and counts["lengths"] == 1
    counts["reset"]()
    tf.cudnn_rnn_backprop_v3(x, h, h, params, lengths, fwd.output, fwd.output_h, fwd.output_c,
                             np.ones_like(fwd.output), None, None, fwd.reserve_space,
                             rnn_mode="gru", time_major=False)
    assert counts["freeze"] == 1 and counts["copies"] == 0 and counts["proofs"] == arrays
    assert counts["macs"][b"x"] == 1 and counts["macs"][b"h0"] == 1
    assert counts["lengths"] == 1


def test_onnx_lengths_are_checked_once(counts):
    """``cgru.onnx.gru`` with ``sequence_lens``: the lengths are checked once (in ONNX's words)
    and handed to the core as checked."""
    import cgru.onnx as onnx
    rng = np.random.default_rng(1)
    D, H, I, T, N = 2, 3, 2, 4, 3
    X = rng.standard_normal((T, N, I))
    W, R = rng.standard_normal((D, 3 * H, I)), rng.standard_normal((D, 3 * H, H))
    onnx.gru(X, W, R, None, np.array([4, 0, 2]), direction="bidirectional")
    assert counts["lengths"] == 1 and counts["freeze"] == 1


def test_core_calls_take_each_array_once(counts):
    net = cgru.Network.random(cgru.Topology(3, 4, 2), np.float64, seed=2)
    x = np.random.default_rng(3).standard_normal((5, 2, 3))
    f = cgru.forward(net, x, training=True)
    assert counts["freeze"] == 1 and counts["copies"] == 8 and counts["macs"][b"x"] == 1
    counts["reset"]()
    cgru.backward(net, x, f.reserve, np.ones_like(f.y))
    assert counts["freeze"] == 1 and counts["proofs"] == 8 and counts["copies"] == 0
    assert counts["macs"][b"x"] == 1


def test_a_torch_training_step_takes_each_weight_once(counts, monkeypatch):
    """``cgru.torch.LSTM`` forward then backward: the weights' network is built once, for the
    forward, its backward and the module's next calls (found by the tensors' identity and
    layout, also after an in-place step); the forward copies each weight once, the backward computes with those copies
    (no freeze, no byte comparison), the next forward proves each once; the weight gradients
    are the engine's arrays as tensors (no dparams network, no copy into torch-made
    buffers)."""
    torch = pytest.importorskip("torch")
    import cgru.torch
    built = []
    real_network = cgru.torch._Model.network

    def network(self, tensors, fill):
        built.append(len(tensors))
        return real_network(self, tensors, fill)
    monkeypatch.setattr(cgru.torch._Model, "network", network)
    torch.manual_seed(0)
    m = cgru.torch.LSTM(3, 4, num_layers=2, dtype=torch.float64)
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    arrays = 4 * 2
    counts["reset"]()
    y, _ = m(x)
    assert built == [arrays] and counts["freeze"] == 1 and counts["copies"] == arrays
    assert counts["macs"][b"x"] == 1 and counts["proofs"] == 0
    counts["reset"]()
    y.sum().backward()
    assert built == [arrays] and counts["freeze"] == 0 and counts["proofs"] == 0
    assert counts["copies"] == 0 and counts["macs"][b"x"] == 1
    counts["reset"]()
    y, _ = m(x)
    assert built == [arrays] and counts["freeze"] == 1 and counts["proofs"] == arrays
    assert counts["copies"] == 0
    # an in-place change of a weight (an optimizer step): the same network of views, and the
    # changed weight's new bytes copied (the others proven)
    with torch.no_grad():
        m.weight_hh_l1.mul_(0.5)
    counts["reset"]()
    y2, _ = m(x)
    assert built == [arrays] and counts["copies"] == 1 and counts["proofs"] == arrays
    y2.sum().backward()
    assert built == [arrays]
    ref = torch.nn.LSTM(3, 4, num_layers=2, dtype=torch.float64)
    ref.load_state_dict(m.state_dict())
    torch.testing.assert_close(y2, ref(x)[0], rtol=1e-12, atol=1e-12)


def _call_value(call):
    return {name: getattr(call, name) for name in calls.ForwardCall.__slots__}


def _same_call(a, b):
    _same_values(_call_value(a), _call_value(b))


def _same_values(va, vb):
    """Two call values' fields, ``{name: value}``, the same (arrays: type, dtype and values)."""
    for name in va:
        x, y = va[name], vb[name]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert type(x) is type(y) and np.array_equal(x, y) and x.dtype == y.dtype, name
        else:
            assert x is y or x == y, name


def _variants():
    """(x, h0) pairs of the common call: plain ones, and every way of being not quite plain."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 3, 4))
    h0 = rng.standard_normal((2, 3, 6))
    yield "plain", x, h0
    yield "no h0", x, None
    yield "x Fortran-ordered", np.asfortranarray(x), h0
    yield "x a strided view", rng.standard_normal((5, 3, 8))[:, :, ::2], h0
    yield "h0 Fortran-ordered", x, np.asfortranarray(h0)
    yield "x float32", x.astype(np.float32), h0
    yield "h0 float32", x, h0.astype(np.float32)
    yield "x 2-D", x[0], h0
    yield "x of another width", rng.standard_normal((5, 3, 5)), h0
    yield "x empty", x[:0], h0
    yield "x of no sequence", x[:, :0], h0[:, :0]
    yield "h0 of another batch", x, h0[:, :2]
    yield "x a masked array", np.ma.masked_array(x), h0
    yield "x a list", x.tolist(), h0
    yield "h0 a masked array", x, np.ma.masked_array(h0)
    yield "h0 a subclass", x, h0.view(_Sub)


class _Sub(np.ndarray):
    pass


@pytest.mark.parametrize("training", [False, True])
def test_the_common_call_is_checked_as_every_call_is(training, monkeypatch):
    """``ForwardCall.check``'s fast path (x and h0 only) gives the very value the whole way
    gives (here forced by an equivalent ``seed=(0, 0)``), or leaves the call to the whole way,
    which refuses it with the same error."""
    net = cgru.Network.random(cgru.Topology(4, 6, 2), np.float64, seed=12)
    fast = []
    for name, x, h0 in _variants():
        _checked_alike(
            monkeypatch, name, fast, lambda: calls.ForwardCall.check(
                net, x, h0, training=training, seed=(0, 0)),
            lambda: calls.ForwardCall.check(net, x, h0, training=training), _same_call)
    assert fast == ["plain", "no h0"]
    with pytest.raises(TypeError, match="net: expected a cgru.Network, got list"):
        calls.ForwardCall.check([net], np.zeros((5, 3, 4)), training=training)


def _cell_state_variants(c):
    """Variants of an LSTM's ``c0`` (or ``dcy``): plain, absent, and not quite plain."""
    yield "plain", c
    yield "none", None
    yield "Fortran-ordered", np.asfortranarray(c)
    yield "a strided view", np.repeat(c, 2, axis=2)[:, :, ::2]
    yield "float32", c.astype(np.float32)
    yield "of another batch", c[:, :2]
    yield "of the state width", c[:, :, :-1]
    yield "a masked array", np.ma.masked_array(c)
    yield "a subclass", c.view(_Sub)
    yield "a list", c.tolist()


@pytest.mark.parametrize("training", [False, True])
def test_an_lstms_cell_state_is_checked_on_the_common_call_as_every_call_is(training,
                                                                            monkeypatch):
    """The forward's fast path takes an LSTM's ``c0`` and the backward's its ``dcy`` — the
    very values the whole way gives, or the whole way's own error (a GRU's ``c0``, say)."""
    net = cgru.Network.random(cgru.Topology(4, 6, 2, proj_size=3), np.float64, seed=12,
                              cell=cgru.LSTMCell())
    rng = np.random.default_rng(13)
    x = rng.standard_normal((5, 3, 4))
    h0, c = rng.standard_normal((2, 3, 3)), rng.standard_normal((2, 3, 6))
    fast = []
    for name, c0 in _cell_state_variants(c):
        _checked_alike(
            monkeypatch, name, fast, lambda: calls.ForwardCall.check(
                net, x, h0, c0=c0, training=training, seed=(0, 0)),
            lambda: calls.ForwardCall.check(net, x, h0, c0=c0, training=training), _same_call)
    assert fast == ["plain", "none"]
    gru = cgru.Network.random(cgru.Topology(4, 6, 2), np.float64, seed=12)
    with pytest.raises(ValueError, match="only LSTM cells have a cell state"):
        calls.ForwardCall.check(gru, x, c0=c)
    if not training:
        return
    f = cgru.forward(net, x, h0, c0=c, training=True)
    dy, dhy = rng.standard_normal(f.y.shape), rng.standard_normal(f.hy.shape)
    fast = []
    for name, dcy in _cell_state_variants(c):
        _checked_alike(
            monkeypatch, name, fast, lambda: calls.BackwardCall.check(
                net, x, f.reserve, dy, dhy, dcy=dcy, batch_major=np.False_),
            lambda: calls.BackwardCall.check(net, x, f.reserve, dy, dhy, dcy=dcy),
            _same_backward)
    assert fast == ["plain", "none"]
    fg = cgru.forward(gru, x, training=True)
    with pytest.raises(ValueError, match="only LSTM cells have a cell state"):
        calls.BackwardCall.check(gru, x, fg.reserve, dcy=c)


def _checked_alike(monkeypatch, name, fast, whole, common, same):
    """``common()`` (a call that may take the fast path) gives what ``whole()`` (the same call
    forced the whole way) gives — the same value (``same``) or the same error; ``name`` joins
    ``fast`` when the fast path alone made it (the whole way refused)."""
    try:
        want = whole()
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)) as got:
            common()
        assert str(got.value) == str(exc), name
        return
    got = None
    with monkeypatch.context() as m:
        m.setattr(calls, "_check_common", lambda *a: pytest.fail("the whole way"))
        try:
            got = common()
            fast.append(name)
        except pytest.fail.Exception:
            pass
    if got is None:
        got = common()
    same(got, want)


def _backward_variants(x, dy, dhy):
    """(dy, dhy) pairs of the backward's common call: plain ones, and every way of being not
    quite plain (with the forward's x; x's own variants are the forward's)."""
    yield "plain", dy, dhy
    yield "no dy", None, dhy
    yield "no dhy", dy, None
    yield "neither", None, None
    yield "dy Fortran-ordered", np.asfortranarray(dy), dhy
    yield "dy a strided view", np.repeat(dy, 2, axis=2)[:, :, ::2], dhy
    yield "dhy Fortran-ordered", dy, np.asfortranarray(dhy)
    yield "dy float32", dy.astype(np.float32), dhy
    yield "dhy float32", dy, dhy.astype(np.float32)
    yield "dy of another width", dy[:, :, :-1], dhy
    yield "dy of another length", dy[:-1], dhy
    yield "dhy of another batch", dy, dhy[:, :2]
    yield "dy a masked array", np.ma.masked_array(dy), dhy
    yield "dy a list", dy.tolist(), dhy
    yield "dhy a subclass", dy, dhy.view(_Sub)


def _backward_value(call):
    value = {name: getattr(call, name) for name in calls.BackwardCall.__slots__
             if name != "opened"}
    opened = call.opened
    value.update(lengths=opened.lengths, dropout=opened.dropout, seed=opened.seed,
                 header=list(opened.header))
    return value


def test_the_backward_common_call_is_checked_as_every_call_is(monkeypatch):
    """``BackwardCall.check``'s fast path (x, reserve, dy and dhy only) gives the very value
    the whole way gives (here forced by an equivalent ``batch_major=np.False_``), or leaves the
    call to the whole way, which refuses it with the same error; the reserve is opened alike
    (its checks: the reserve tests)."""
    net = cgru.Network.random(cgru.Topology(4, 6, 2), np.float64, seed=12)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 3, 4))
    f = cgru.forward(net, x, training=True)
    dy, dhy = rng.standard_normal(f.y.shape), rng.standard_normal(f.hy.shape)
    fast = []
    cases = [(name, x, d, h) for name, d, h in _backward_variants(x, dy, dhy)]
    cases += [("x Fortran-ordered", np.asfortranarray(x), dy, dhy),
              ("x of no sequence", x[:, :0], dy[:, :0], dhy[:, :0]),
              ("x float32", x.astype(np.float32), dy, dhy), ("x a list", x.tolist(), dy, dhy)]
    for name, xv, d, h in cases:
        _checked_alike(
            monkeypatch, name, fast, lambda: calls.BackwardCall.check(
                net, xv, f.reserve, d, h, batch_major=np.False_),
            lambda: calls.BackwardCall.check(net, xv, f.reserve, d, h), _same_backward)
    assert fast == ["plain", "no dy", "no dhy", "neither"]
    with pytest.raises(TypeError, match="net: expected a cgru.Network, got list"):
        calls.BackwardCall.check([net], x, f.reserve, dy, dhy)


def _same_backward(a, b):
    _same_values(_backward_value(a), _backward_value(b))
