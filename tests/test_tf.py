"""cgru.tf — TensorFlow's CudnnRNN ops (GRU) on the CPU.

1. ``params_size`` against ``torch.nn.GRU`` parameter counts.
2. Canonical lists ↔ opaque params: exact round trips; the layout exactly as SPEC §4.1 writes it.
3. ``torch.nn.GRU`` weights → canonical lists → params: outputs, final states and every gradient
   (V1; V3 time-major and batch-major with unsorted variable lengths; float64 and float32).
4. Keras: the flat vector Keras builds for ``CudnnRNNV3`` equals ``canonical_to_params``, and
   running it reproduces a NumPy Keras GRU cell.
5. skip_input / auto_select: against the reference, and against linear_input with identities.
6. Dropout: seeds, masks against the reference, gradients by float64 finite differences.
7. Output contracts (empty dummies, reserve kinds, overwrite semantics, inputs untouched).
8. Every validation error.

Torch / canonical mapping used throughout (written out here, independent of cgru): torch's
``weight_ih_l{l}[_reverse]`` ``[3H, in]`` holds row blocks r, z, n = cuDNN linLayerIDs 0, 1, 2;
``weight_hh`` blocks are IDs 3, 4, 5; ``bias_ih`` / ``bias_hh`` likewise.  The opaque layout is
``concat(all weights raveled) ++ concat(all biases)`` in canonical-list order.
"""
import numpy as np
import pytest

import cgru
from cgru import Params, Topology
from cgru.core import reference
from cgru import tf

pytestmark = pytest.mark.usefixtures("poison")

TOL = {np.float64: dict(rtol=1e-10, atol=1e-10), np.float32: dict(rtol=1e-5, atol=1e-5)}
DIRECTION = {False: "unidirectional", True: "bidirectional"}


def _torch():
    return pytest.importorskip("torch")


def _rng(seed):
    return np.random.default_rng(seed)


def _std(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _opaque(weights, biases):
    """SPEC §4.1's opaque layout, written out: all matrices raveled, then all biases."""
    return np.concatenate([w.ravel() for w in weights] + [b.ravel() for b in biases])


def _suffix(layer, d):
    return f"_l{layer}" + ("_reverse" if d else "")


def _torch_gru(I, H, L, bidirectional, dtype, seed, batch_first=False):
    torch = _torch()
    torch.manual_seed(seed)
    return torch.nn.GRU(I, H, num_layers=L, bidirectional=bidirectional, batch_first=batch_first,
                        dtype=torch.float64 if dtype == np.float64 else torch.float32)


def _canonical_from_torch(gru, grad=False):
    """TF canonical lists from a torch.nn.GRU's weights (or their gradients)."""
    H, D = gru.hidden_size, 2 if gru.bidirectional else 1
    weights, biases = [], []
    for layer in range(gru.num_layers):
        for d in range(D):
            def get(name):
                p = getattr(gru, name + _suffix(layer, d))
                return (p.grad if grad else p).detach().numpy()
            for name in ("weight_ih", "weight_hh"):
                weights += [get(name)[k * H:(k + 1) * H].copy() for k in range(3)]
            for name in ("bias_ih", "bias_hh"):
                biases += [get(name)[k * H:(k + 1) * H].copy() for k in range(3)]
    return weights, biases


def _random_canonical(rng, L, H, I, D, dtype, skip=False):
    """Canonical lists with SPEC's shapes: weights[(l·D+d)·6+k] [H, width], biases [H]."""
    weights, biases = [], []
    for layer in range(L):
        for _ in range(D):
            width = (0 if skip else I) if layer == 0 else D * H
            weights += [_std(rng, (H, width if k < 3 else H), dtype) for k in range(6)]
            biases += [_std(rng, (H,), dtype) for _ in range(6)]
    return weights, biases


def _run_torch(gru, x, h0, lengths, dy, dhy, batch_first):
    """torch's (y, hy, dx, dh0) for loss Σ y·dy + Σ hy·dhy; h0/hy/dh0 are [L·D, N, H]."""
    torch = _torch()
    T = x.shape[1] if batch_first else x.shape[0]
    xt = torch.from_numpy(x.copy()).requires_grad_()
    ht = torch.from_numpy(h0.copy()).requires_grad_()
    gru.zero_grad()
    if lengths is None:
        y, hy = gru(xt, ht)
    else:
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            xt, torch.as_tensor(lengths.astype(np.int64)), batch_first=batch_first,
            enforce_sorted=False)
        y, hy = gru(packed, ht)
        y, _ = torch.nn.utils.rnn.pad_packed_sequence(y, batch_first=batch_first,
                                                      total_length=T)
    ((y * torch.from_numpy(dy)).sum() + (hy * torch.from_numpy(dhy)).sum()).backward()
    return y.detach().numpy(), hy.detach().numpy(), xt.grad.numpy(), ht.grad.numpy()


# --- 1. params_size ------------------------------------------------------------------------

@pytest.mark.parametrize("L", [1, 2, 3])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("input_mode", ["linear_input", "skip_input"])
def test_params_size_matches_torch(L, bidirectional, input_mode):
    H = 4
    I = H if input_mode == "skip_input" else 3
    D = 2 if bidirectional else 1
    gru = _torch_gru(I, H, L, bidirectional, np.float32, seed=0)
    count = sum(p.numel() for p in gru.parameters())
    if input_mode == "skip_input":
        count -= D * 3 * H * I          # layer-0 input matrices: identity, not stored
    for dtype in (np.float32, np.float64):
        n = tf.params_size(L, H, I, dtype=dtype, input_mode=input_mode,
                           direction=DIRECTION[bidirectional])
        assert type(n) is int
        assert n == count


def test_params_size_auto_select_follows_tf():
    """auto_select = skip_input when input_size == num_units, else linear_input (TF's
    ToRNNInputMode); also accepts TF-style int32 scalar arrays for the sizes."""
    H = 5
    for I in (H, 3):
        want = tf.params_size(2, H, I, input_mode="skip_input" if I == H else "linear_input",
                              direction="bidirectional")
        got = tf.params_size(np.int32(2), np.array(H, np.int32), I, input_mode="auto_select",
                             direction="bidirectional")
        assert got == want
    assert tf.params_size(1, H, H, input_mode="auto_select") < tf.params_size(1, H, H)


# --- 2. canonical lists ↔ opaque params ----------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("L,bidirectional,input_mode,I", [
    (1, False, "linear_input", 3), (3, True, "linear_input", 3), (2, False, "linear_input", 5),
    (2, True, "skip_input", 4), (3, False, "auto_select", 4), (2, True, "auto_select", 2)])
def test_canonical_round_trip(dtype, L, bidirectional, input_mode, I):
    H, D = 4, 2 if bidirectional else 1
    skip = input_mode == "skip_input" or (input_mode == "auto_select" and I == H)
    attrs = dict(input_mode=input_mode, direction=DIRECTION[bidirectional])
    rng = _rng(L * 10 + I)
    weights, biases = _random_canonical(rng, L, H, I, D, dtype, skip)

    params = tf.canonical_to_params(L, H, I, weights, biases, **attrs)
    assert params.dtype == dtype and params.shape == (tf.params_size(L, H, I, **attrs),)
    np.testing.assert_array_equal(params, _opaque(weights, biases))

    w2, b2 = tf.params_to_canonical(L, H, I, params, num_params=6 * L * D, **attrs)
    assert len(w2) == len(b2) == 6 * L * D
    for got, want in zip(w2 + b2, weights + biases):
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    if skip:
        assert all(w2[d * 6 + k].shape == (H, 0) for d in range(D) for k in range(3))

    other = _std(rng, params.shape, dtype)          # params → canonical → params
    back = tf.canonical_to_params(L, H, I, *tf.params_to_canonical(L, H, I, other, **attrs),
                                  **attrs)
    np.testing.assert_array_equal(back, other)


def test_canonical_to_params_accepts_int32_scalar_sizes_and_v2_counts():
    rng = _rng(3)
    weights, biases = _random_canonical(rng, 2, 3, 2, 2, np.float64)
    params = tf.canonical_to_params(np.array(2, np.int32), np.array(3, np.int32),
                                    np.array(2, np.int32), weights, biases,
                                    direction="bidirectional")
    out = tf.params_to_canonical(2, 3, 2, params, num_params_weights=24, num_params_biases=24,
                                 direction="bidirectional")
    assert out.weights[23].shape == (3, 3) and out.weights[12].shape == (3, 6)
    np.testing.assert_array_equal(out.biases[23], biases[23])


# --- 3. against torch.nn.GRU ---------------------------------------------------------------

@pytest.mark.parametrize("L", [1, 2, 3])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("time_major", [True, False], ids=["tm", "bm"])
def test_v3_matches_torch_with_unsorted_lengths(L, bidirectional, time_major):
    _v3_against_torch(L, bidirectional, time_major, np.float64, seed=L)


def test_v3_matches_torch_float32():
    _v3_against_torch(2, True, False, np.float32, seed=7)


def _v3_against_torch(L, bidirectional, time_major, dtype, seed):
    T, N, I, H = 5, 4, 3, 4
    D = 2 if bidirectional else 1
    gru = _torch_gru(I, H, L, bidirectional, dtype, seed, batch_first=not time_major)
    weights, biases = _canonical_from_torch(gru)
    attrs = dict(direction=DIRECTION[bidirectional], time_major=time_major)
    params = tf.canonical_to_params(L, H, I, weights, biases, direction=attrs["direction"])
    rng = _rng(seed + 100)
    x = _std(rng, (T, N, I) if time_major else (N, T, I), dtype)
    h0 = _std(rng, (L * D, N, H), dtype)                   # torch's layout
    lengths = np.array([3, 5, 1, 4], np.int32)             # unsorted, includes 1 and T
    dy = _std(rng, (T, N, D * H) if time_major else (N, T, D * H), dtype)
    dhy = _std(rng, (L * D, N, H), dtype)

    def tf_state(a):                                        # [L·D, N, H] → TF's layout
        return a if time_major else np.ascontiguousarray(a.transpose(1, 0, 2))

    fwd = tf.cudnn_rnn_v3(x, tf_state(h0), None, params, lengths, **attrs)
    bp = tf.cudnn_rnn_backprop_v3(x, tf_state(h0), None, params, lengths, fwd.output,
                                  fwd.output_h, fwd.output_c, dy, tf_state(dhy), None,
                                  fwd.reserve_space, fwd.host_reserved, **attrs)
    y, hy, dx, dh0 = _run_torch(gru, x, h0, lengths, dy, dhy, batch_first=not time_major)
    want_dparams = _opaque(*_canonical_from_torch(gru, grad=True))

    tol = TOL[dtype]
    np.testing.assert_allclose(fwd.output, y, **tol)
    np.testing.assert_allclose(fwd.output_h, tf_state(hy), **tol)
    np.testing.assert_allclose(bp.input_backprop, dx, **tol)
    np.testing.assert_allclose(bp.input_h_backprop, tf_state(dh0), **tol)
    np.testing.assert_allclose(bp.params_backprop, want_dparams, **tol)
    for a in (fwd.output, fwd.output_h, bp.input_backprop, bp.input_h_backprop,
              bp.params_backprop):
        assert a.dtype == dtype
    t = np.arange(T)[:, None] if time_major else np.arange(T)[None, :]
    padded = t >= (lengths[None, :] if time_major else lengths[:, None])
    assert (fwd.output[padded] == 0).all()                  # cuDNN's paddingFill = 0
    assert (bp.input_backprop[padded] == 0).all()


def test_v1_matches_torch_and_v3():
    T, N, I, H, L = 4, 3, 3, 4, 2
    gru = _torch_gru(I, H, L, True, np.float64, seed=11)
    params = tf.canonical_to_params(L, H, I, *_canonical_from_torch(gru),
                                    direction="bidirectional")
    rng = _rng(11)
    x = _std(rng, (T, N, I), np.float64)
    h0 = _std(rng, (2 * L, N, H), np.float64)
    dy = _std(rng, (T, N, 2 * H), np.float64)
    dhy = _std(rng, (2 * L, N, H), np.float64)
    fwd = tf.cudnn_rnn(x, h0, None, params, direction="bidirectional")
    bp = tf.cudnn_rnn_backprop(x, h0, None, params, fwd.output, fwd.output_h, fwd.output_c,
                               dy, dhy, None, fwd.reserve_space, direction="bidirectional")
    y, hy, dx, dh0 = _run_torch(gru, x, h0, None, dy, dhy, batch_first=False)
    tol = TOL[np.float64]
    np.testing.assert_allclose(fwd.output, y, **tol)
    np.testing.assert_allclose(fwd.output_h, hy, **tol)
    np.testing.assert_allclose(bp.input_backprop, dx, **tol)
    np.testing.assert_allclose(bp.input_h_backprop, dh0, **tol)
    np.testing.assert_allclose(bp.params_backprop, _opaque(*_canonical_from_torch(gru, True)),
                               **tol)
    # V3 time-major with full lengths (or none) is V1, and its reserve serves V1's backprop.
    for lengths in (None, np.full(N, T, np.int32)):
        v3 = tf.cudnn_rnn_v3(x, h0, None, params, lengths, direction="bidirectional")
        np.testing.assert_array_equal(v3.output, fwd.output)
        np.testing.assert_array_equal(v3.output_h, fwd.output_h)
        bp1 = tf.cudnn_rnn_backprop(x, h0, None, params, v3.output, v3.output_h, v3.output_c,
                                    dy, dhy, None, v3.reserve_space, direction="bidirectional")
        np.testing.assert_array_equal(bp1.params_backprop, bp.params_backprop)


# --- 4. Keras ------------------------------------------------------------------------------

def _keras_flat(kernel, recurrent_kernel, bias):
    """The params vector Keras hands to CudnnRNNV3 (keras/src/backend/tensorflow/rnn.py,
    ``_cudnn_gru`` + ``_standardize_cudnn_weights``), written out: split the kernels per gate
    (Keras order z, r, h), swap the z/r blocks into cuDNN's r, z, h, transpose each block,
    flatten; six weights then six biases."""
    w = np.split(kernel, 3, axis=1) + np.split(recurrent_kernel, 3, axis=1)
    b = np.split(bias.reshape(-1), 6)
    w[0], w[1] = w[1], w[0]
    w[3], w[4] = w[4], w[3]
    b[0], b[1] = b[1], b[0]
    b[3], b[4] = b[4], b[3]
    return np.concatenate([blk.T.reshape(-1) for blk in w] + [blk.reshape(-1) for blk in b])


def _keras_gru(x, h, kernel, recurrent_kernel, bias):
    """Keras GRUCell (reset_after=True) over batch-major x [N, T, I]: Keras's equations."""
    H = h.shape[1]
    outs = []
    for t in range(x.shape[1]):
        xk = x[:, t] @ kernel + bias[0]
        rec = h @ recurrent_kernel + bias[1]
        z = 1 / (1 + np.exp(-(xk[:, :H] + rec[:, :H])))
        r = 1 / (1 + np.exp(-(xk[:, H:2 * H] + rec[:, H:2 * H])))
        hh = np.tanh(xk[:, 2 * H:] + r * rec[:, 2 * H:])
        h = z * h + (1 - z) * hh
        outs.append(h)
    return np.stack(outs, axis=1), h


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_keras_cudnn_flat_vector_equals_canonical_to_params(dtype):
    I, H = 3, 4
    rng = _rng(5)
    kernel = _std(rng, (I, 3 * H), dtype)
    recurrent_kernel = _std(rng, (H, 3 * H), dtype)
    bias = _std(rng, (2, 3 * H), dtype)
    z, r, n = slice(0, H), slice(H, 2 * H), slice(2 * H, 3 * H)
    weights = [np.ascontiguousarray(m[:, g].T) for m in (kernel, recurrent_kernel)
               for g in (r, z, n)]
    biases = [bias[row, g].copy() for row in (0, 1) for g in (r, z, n)]
    params = tf.canonical_to_params(1, H, I, weights, biases)
    np.testing.assert_array_equal(params, _keras_flat(kernel, recurrent_kernel, bias))

    if dtype == np.float64:      # Keras's own call: batch-major, input_h [N, 1, H]
        N, T = 3, 4
        x = _std(rng, (N, T, I), dtype)
        h0 = _std(rng, (N, H), dtype)
        out = tf.cudnn_rnn_v3(x, h0[:, None, :], 0, _keras_flat(kernel, recurrent_kernel, bias),
                              np.full(N, T, np.int32), time_major=False)
        y, hT = _keras_gru(x, h0, kernel, recurrent_kernel, bias)
        np.testing.assert_allclose(out.output, y, **TOL[dtype])
        np.testing.assert_allclose(out.output_h[:, 0, :], hT, **TOL[dtype])


# --- 5. skip_input / auto_select -----------------------------------------------------------

def _skip_case(dtype=np.float64):
    T, N, H, L, D = 4, 3, 3, 2, 2
    rng = _rng(21)
    weights, biases = _random_canonical(rng, L, H, H, D, dtype, skip=True)
    x = _std(rng, (T, N, H), dtype)
    h0 = _std(rng, (L * D, N, H), dtype)
    dy = _std(rng, (T, N, D * H), dtype)
    dhy = _std(rng, (L * D, N, H), dtype)
    return dict(T=T, N=N, H=H, L=L, D=D, weights=weights, biases=biases, x=x, h0=h0, dy=dy,
                dhy=dhy)


def _fwd_bwd(c, params, input_mode, lengths=None):
    attrs = dict(direction="bidirectional", input_mode=input_mode)
    f = tf.cudnn_rnn_v3(c["x"], c["h0"], None, params, lengths, **attrs)
    g = tf.cudnn_rnn_backprop_v3(c["x"], c["h0"], None, params, lengths, f.output, f.output_h,
                                 f.output_c, c["dy"], c["dhy"], None, f.reserve_space,
                                 f.host_reserved, **attrs)
    return f, g


def test_skip_input_matches_reference():
    c = _skip_case()
    H, L = c["H"], c["L"]
    lengths = np.array([2, 4, 0])
    params = tf.canonical_to_params(L, H, H, c["weights"], c["biases"],
                                    direction="bidirectional", input_mode="skip_input")
    f = tf.cudnn_rnn_v3(c["x"], c["h0"], None, params, lengths, direction="bidirectional",
                        input_mode="skip_input")
    topo = Topology(H, H, L, "bidirectional", "skip")
    y, hy = reference.forward(Params.from_flat(topo, params), c["x"], c["h0"], lengths=lengths)
    np.testing.assert_allclose(f.output, y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(f.output_h, hy, rtol=1e-12, atol=1e-12)


def test_skip_input_equals_linear_input_with_identity_matrices():
    """cuDNN skip input: W_r = W_z = W_n = I in layer 0, input biases still applied — forward
    and every gradient; skip's params_backprop is linear's without the layer-0 matrices."""
    c = _skip_case()
    H, L, D = c["H"], c["L"], c["D"]
    lin_weights = list(c["weights"])
    for d in range(D):
        for k in range(3):
            lin_weights[d * 6 + k] = np.eye(H)
    skip_params = tf.canonical_to_params(L, H, H, c["weights"], c["biases"],
                                         direction="bidirectional", input_mode="skip_input")
    lin_params = tf.canonical_to_params(L, H, H, lin_weights, c["biases"],
                                        direction="bidirectional", input_mode="linear_input")
    lengths = np.array([4, 1, 3])
    fs, gs = _fwd_bwd(c, skip_params, "skip_input", lengths)
    fl, gl = _fwd_bwd(c, lin_params, "linear_input", lengths)
    tol = dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fs.output, fl.output, **tol)
    np.testing.assert_allclose(fs.output_h, fl.output_h, **tol)
    np.testing.assert_allclose(gs.input_backprop, gl.input_backprop, **tol)
    np.testing.assert_allclose(gs.input_h_backprop, gl.input_h_backprop, **tol)
    dw_lin, db_lin = tf.params_to_canonical(L, H, H, gl.params_backprop,
                                            direction="bidirectional")
    dw_skip, db_skip = tf.params_to_canonical(L, H, H, gs.params_backprop,
                                              direction="bidirectional", input_mode="skip_input")
    for i in range(6 * L * D):
        np.testing.assert_allclose(db_skip[i], db_lin[i], **tol)
        if i >= 6 * D or i % 6 >= 3:
            np.testing.assert_allclose(dw_skip[i], dw_lin[i], **tol)
        else:
            assert dw_skip[i].shape == (H, 0) and np.abs(dw_lin[i]).max() > 0


def test_auto_select_is_skip_when_sizes_match_else_linear():
    c = _skip_case()
    H, L = c["H"], c["L"]
    params = tf.canonical_to_params(L, H, H, c["weights"], c["biases"],
                                    direction="bidirectional", input_mode="skip_input")
    fs, gs = _fwd_bwd(c, params, "skip_input")
    fa, ga = _fwd_bwd(c, params, "auto_select")
    np.testing.assert_array_equal(fa.output, fs.output)
    np.testing.assert_array_equal(ga.params_backprop, gs.params_backprop)
    # input_size != num_units: auto_select is linear_input
    rng = _rng(2)
    x = _std(rng, (3, 2, 5), np.float64)
    h0 = _std(rng, (2, 2, H), np.float64)
    p = _std(rng, (tf.params_size(2, H, 5),), np.float64)
    np.testing.assert_array_equal(tf.cudnn_rnn(x, h0, None, p, input_mode="auto_select").output,
                                  tf.cudnn_rnn(x, h0, None, p).output)


# --- 6. dropout ----------------------------------------------------------------------------

def _dropout_case(dtype=np.float64, time_major=True):
    T, N, I, H, L = 4, 3, 2, 3, 2
    rng = _rng(31)
    params = _std(rng, (tf.params_size(L, H, I, direction="bidirectional"),), dtype) * 0.5
    x = _std(rng, (T, N, I) if time_major else (N, T, I), dtype)
    h0 = _std(rng, (2 * L, N, H), dtype)
    return T, N, I, H, L, params, x, h0


def test_dropout_seed_and_seed2_reproducible():
    T, N, I, H, L, params, x, h0 = _dropout_case()
    attrs = dict(direction="bidirectional", dropout=0.5)

    def run(seed, seed2, is_training=True):
        return tf.cudnn_rnn(x, h0, None, params, seed=seed, seed2=seed2,
                            is_training=is_training, **attrs).output

    a = run(1, 2)
    np.testing.assert_array_equal(run(1, 2), a)
    assert not np.allclose(run(3, 2), a)
    assert not np.allclose(run(1, 3), a)
    assert not np.allclose(run(2, 1), a)
    np.testing.assert_array_equal(run(0, 0), run(0, 0))       # 0, 0 is an ordinary seed
    no_dropout = tf.cudnn_rnn(x, h0, None, params, direction="bidirectional").output
    np.testing.assert_allclose(run(1, 2, is_training=False), no_dropout, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("time_major", [True, False], ids=["tm", "bm"])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_dropout_against_reference_with_the_engines_masks(time_major, dropout):
    T, N, I, H, L, params, x, h0 = _dropout_case(time_major=time_major)
    lengths = np.array([4, 2, 3])
    seed, seed2 = 5, 9
    h_in = h0 if time_major else np.ascontiguousarray(h0.transpose(1, 0, 2))
    out = tf.cudnn_rnn_v3(x, h_in, None, params, lengths, direction="bidirectional",
                          dropout=dropout, seed=seed, seed2=seed2, time_major=time_major)
    topo = Topology(I, H, L, "bidirectional")
    masks = cgru.dropout_masks(topo, T, N, dropout=dropout, seed=(seed, seed2),
                               dtype=np.float64)
    if dropout:
        assert (masks[0] == 0).any() and (masks[0] != 0).any()
    y, hy = reference.forward(Params.from_flat(topo, params), x, h0, lengths=lengths,
                              batch_major=not time_major,
                              dropout_masks=masks if dropout else None)
    np.testing.assert_allclose(out.output, y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.output_h, hy if time_major else hy.transpose(1, 0, 2),
                               rtol=1e-12, atol=1e-12)


def test_gradients_through_dropout_by_finite_differences():
    T, N, I, H, L, params, x, h0 = _dropout_case(time_major=False)
    h_in = np.ascontiguousarray(h0.transpose(1, 0, 2))              # [N, L·D, H]
    lengths = np.array([4, 1, 3])
    attrs = dict(direction="bidirectional", dropout=0.5, seed=4, seed2=8, time_major=False,
                 num_threads=1)       # hundreds of tiny calls: no thread start-up per call
    masks = cgru.dropout_masks(Topology(I, H, L, "bidirectional"), T, N, dropout=0.5,
                               seed=(4, 8), dtype=np.float64)
    assert (masks[0] == 0).any()
    rng = _rng(41)
    fwd = tf.cudnn_rnn_v3(x, h_in, None, params, lengths, **attrs)
    gy = _std(rng, fwd.output.shape, np.float64)
    gh = _std(rng, fwd.output_h.shape, np.float64)
    bp = tf.cudnn_rnn_backprop_v3(x, h_in, None, params, lengths, fwd.output, fwd.output_h,
                                  fwd.output_c, gy, gh, None, fwd.reserve_space,
                                  fwd.host_reserved, **attrs)

    def loss(x_, h_, p_):
        o = tf.cudnn_rnn_v3(x_, h_, None, p_, lengths, **attrs)
        return float((o.output * gy).sum() + (o.output_h * gh).sum())

    def numeric(which):
        args = [x.copy(), h_in.copy(), params.copy()]
        flat = args[which].reshape(-1)
        grad = np.empty(flat.size)
        eps = 1e-6
        for j in range(flat.size):
            v = flat[j]
            flat[j] = v + eps
            up = loss(*args)
            flat[j] = v - eps
            down = loss(*args)
            flat[j] = v
            grad[j] = (up - down) / (2 * eps)
        return grad.reshape(args[which].shape)

    tol = dict(rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(bp.input_backprop, numeric(0), **tol)
    np.testing.assert_allclose(bp.input_h_backprop, numeric(1), **tol)
    np.testing.assert_allclose(bp.params_backprop, numeric(2), **tol)


# --- 7. output contracts -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_outputs_dummies_and_reserve_kinds(dtype):
    T, N, I, H, L, params, x, h0 = _dropout_case(dtype)
    attrs = dict(direction="bidirectional")
    x_before, h_before, p_before = x.copy(), h0.copy(), params.copy()
    train = tf.cudnn_rnn_v3(x, h0, None, params, **attrs)
    infer = tf.cudnn_rnn_v3(x, h0, None, params, is_training=False, **attrs)
    assert isinstance(train, tf.CudnnRNNV3) and train._fields == (
        "output", "output_h", "output_c", "reserve_space", "host_reserved")
    assert train.output.shape == (T, N, 2 * H) and train.output_h.shape == (2 * L, N, H)
    assert train.output_c.shape == (0,) and train.output_c.dtype == dtype
    assert train.host_reserved.shape == (0,) and train.host_reserved.dtype == np.int8
    assert train.reserve_space.dtype == np.uint8 and train.reserve_space.ndim == 1
    assert train.reserve_space.size > 64
    assert infer.reserve_space.shape == (0,) and infer.reserve_space.dtype == np.uint8
    np.testing.assert_array_equal(infer.output, train.output)
    np.testing.assert_array_equal(infer.output_h, train.output_h)
    # input_c is ignored, as TF does for GRU
    for input_c in (0, np.ones((2 * L, N, H), dtype), "anything"):
        np.testing.assert_array_equal(tf.cudnn_rnn(x, h0, input_c, params, **attrs).output,
                                      train.output)
    # params_backprop is this call's gradient: a second call gives the same, not twice it
    dy = np.ones_like(train.output)
    g1 = tf.cudnn_rnn_backprop(x, h0, None, params, train.output, train.output_h, None, dy,
                               None, None, train.reserve_space, **attrs)
    g2 = tf.cudnn_rnn_backprop(x, h0, None, params, train.output, train.output_h, None, dy,
                               None, None, train.reserve_space, **attrs)
    assert isinstance(g1, tf.CudnnRNNBackprop)
    assert g1.input_c_backprop.shape == (0,) and g1.input_c_backprop.dtype == dtype
    assert g1.params_backprop.shape == params.shape and g1.params_backprop.dtype == dtype
    assert np.abs(g1.params_backprop).max() > 0
    np.testing.assert_array_equal(g2.params_backprop, g1.params_backprop)
    # output_h_backprop None is zeros
    g3 = tf.cudnn_rnn_backprop(x, h0, None, params, train.output, train.output_h, None, dy,
                               np.zeros_like(h0), None, train.reserve_space, **attrs)
    np.testing.assert_array_equal(g3.params_backprop, g1.params_backprop)
    # num_threads (cgru's extension) does not change a bit
    one = tf.cudnn_rnn_v3(x, h0, None, params, num_threads=1, **attrs)
    np.testing.assert_array_equal(one.output, train.output)
    np.testing.assert_array_equal(one.reserve_space, train.reserve_space)
    g4 = tf.cudnn_rnn_backprop(x, h0, None, params, train.output, train.output_h, None, dy,
                               None, None, train.reserve_space, num_threads=1, **attrs)
    np.testing.assert_array_equal(g4.params_backprop, g1.params_backprop)
    for before, after in ((x_before, x), (h_before, h0), (p_before, params)):
        np.testing.assert_array_equal(before, after)


# --- 8. validation errors ------------------------------------------------------------------

@pytest.fixture
def small():
    """A trained-forward call: L=2 bidirectional, T=3, N=2, I=3, H=2, float32."""
    T, N, I, H, L = 3, 2, 3, 2, 2
    rng = _rng(51)
    params = _std(rng, (tf.params_size(L, H, I, direction="bidirectional"),), np.float32)
    x = _std(rng, (T, N, I), np.float32)
    h0 = _std(rng, (2 * L, N, H), np.float32)
    attrs = dict(direction="bidirectional")
    f = tf.cudnn_rnn(x, h0, None, params, **attrs)
    return dict(T=T, N=N, I=I, H=H, L=L, params=params, x=x, h0=h0, attrs=attrs, f=f)


def _backprop(s, **over):
    a = dict(input=s["x"], input_h=s["h0"], input_c=None, params=s["params"],
             output=s["f"].output, output_h=s["f"].output_h, output_c=None,
             output_backprop=np.ones_like(s["f"].output), output_h_backprop=None,
             output_c_backprop=None, reserve_space=s["f"].reserve_space)
    attrs = dict(s["attrs"])
    for k, v in over.items():
        (a if k in a else attrs)[k] = v
    return tf.cudnn_rnn_backprop(**a, **attrs)


def test_backprop_fixture_call_works(small):
    """The unmodified call of the error tests below succeeds (so each error is caused by the
    one thing each test changes)."""
    g = _backprop(small)
    assert g.input_backprop.shape == small["x"].shape


@pytest.mark.parametrize("mode", ["lstm", "rnn_relu", "rnn_tanh"])
def test_unsupported_rnn_mode_is_not_implemented_in_every_op(small, mode):
    s = small
    L, H, I = s["L"], s["H"], s["I"]
    calls = [
        lambda: tf.params_size(L, H, I, rnn_mode=mode),
        lambda: tf.params_to_canonical(L, H, I, s["params"], rnn_mode=mode),
        lambda: tf.canonical_to_params(L, H, I, [], [], rnn_mode=mode),
        lambda: tf.cudnn_rnn(s["x"], s["h0"], None, s["params"], rnn_mode=mode),
        lambda: tf.cudnn_rnn_v3(s["x"], s["h0"], None, s["params"], rnn_mode=mode),
        lambda: _backprop(s, rnn_mode=mode),
        lambda: tf.cudnn_rnn_backprop_v3(s["x"], s["h0"], None, s["params"], None, None, None,
                                         None, None, None, None, s["f"].reserve_space,
                                         rnn_mode=mode),
    ]
    for call in calls:
        with pytest.raises(NotImplementedError, match=f"rnn_mode='{mode}'"):
            call()


@pytest.mark.parametrize("attr,value,exc,match", [
    ("rnn_mode", "GRU", ValueError, "Invalid RNN mode"),
    ("input_mode", "linear", ValueError, "Invalid RNN input mode"),
    ("direction", "forward", ValueError, "Invalid RNN direction mode"),
    ("dropout", 1.0, ValueError, "dropout"),
    ("dropout", -0.1, ValueError, "dropout"),
    ("dropout", "0.1", TypeError, "dropout"),
    ("seed", 1.5, TypeError, "seed"),
    ("seed2", None, TypeError, "seed2"),
    ("num_proj", 2, ValueError, "num_proj"),
    ("is_training", "yes", TypeError, "is_training"),
    ("time_major", 1, TypeError, "time_major"),
])
def test_bad_attributes(small, attr, value, exc, match):
    s = small
    with pytest.raises(exc, match=match):
        tf.cudnn_rnn_v3(s["x"], s["h0"], None, s["params"], **{**s["attrs"], attr: value})


def test_bad_sizes_and_dtype_of_params_size():
    with pytest.raises(ValueError, match="num_layers"):
        tf.params_size(0, 4, 3)
    with pytest.raises(TypeError, match="num_units"):
        tf.params_size(1, 4.0, 3)
    with pytest.raises(TypeError, match="input_size"):
        tf.params_size(1, 4, np.array([3]))
    with pytest.raises(TypeError, match="float32 or float64"):
        tf.params_size(1, 4, 3, dtype=np.float16)


def test_skip_input_needs_input_size_equal_num_units(small):
    s = small
    match = "skip_input.*input_size == num_units.*input_size=3, num_units=2"
    with pytest.raises(ValueError, match=match):
        tf.params_size(1, 2, 3, input_mode="skip_input")
    with pytest.raises(ValueError, match=match):
        tf.canonical_to_params(1, 2, 3, [], [], input_mode="skip_input")
    with pytest.raises(ValueError, match=match):
        tf.cudnn_rnn(s["x"], s["h0"], None, s["params"], input_mode="skip_input", **s["attrs"])


@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_params_size(small, delta):
    s = small
    n = s["params"].size
    bad = np.zeros(n + delta, np.float32)
    match = f"Invalid params size: expected a 1-D array of {n} elements"
    with pytest.raises(ValueError, match=match):
        tf.cudnn_rnn(s["x"], s["h0"], None, bad, **s["attrs"])
    with pytest.raises(ValueError, match=match):
        tf.params_to_canonical(s["L"], s["H"], s["I"], bad, **s["attrs"])
    with pytest.raises(ValueError, match=match):
        _backprop(s, params=bad)


def test_params_shape_and_dtype(small):
    s = small
    with pytest.raises(ValueError, match="Invalid params size"):
        tf.cudnn_rnn(s["x"], s["h0"], None, s["params"].reshape(1, -1), **s["attrs"])
    with pytest.raises(TypeError, match="params: expected dtype float32"):
        tf.cudnn_rnn(s["x"], s["h0"], None, s["params"].astype(np.float64), **s["attrs"])
    with pytest.raises(TypeError, match="params"):
        tf.cudnn_rnn(s["x"], s["h0"], None, list(s["params"]), **s["attrs"])
    with pytest.raises(TypeError, match="float32 or float64"):
        tf.params_to_canonical(s["L"], s["H"], s["I"], s["params"].astype(np.float16),
                               **s["attrs"])


@pytest.mark.parametrize("shape", [(4, 3, 2), (3, 2, 2), (4, 2), (0, 2, 2), (4, 2, 0)])
def test_wrong_input_h_shape(small, shape):
    s = small
    with pytest.raises(ValueError, match="Invalid input_h shape|input_h must be a 3-D"):
        tf.cudnn_rnn(s["x"], np.zeros(shape, np.float32), None, s["params"], **s["attrs"])


def test_wrong_input_h_layout_for_batch_major(small):
    """V3 time_major=False wants [N, L·D, H]; the time-major [L·D, N, H] is refused."""
    s = small
    xb = np.ascontiguousarray(s["x"].transpose(1, 0, 2))
    with pytest.raises(ValueError, match=r"Invalid input_h shape: \[4,2,2\] \[2,2,2\]"):
        tf.cudnn_rnn_v3(xb, s["h0"], None, s["params"], time_major=False, **s["attrs"])


def test_input_and_input_h_dtypes_and_ranks(small):
    s = small
    with pytest.raises(ValueError, match="RNN input must be a 3-D"):
        tf.cudnn_rnn(s["x"][0], s["h0"], None, s["params"], **s["attrs"])
    with pytest.raises(TypeError, match="float32 or float64"):
        tf.cudnn_rnn(s["x"].astype(np.int32), s["h0"], None, s["params"], **s["attrs"])
    with pytest.raises(TypeError, match="input_h: expected dtype float32"):
        tf.cudnn_rnn(s["x"], s["h0"].astype(np.float64), None, s["params"], **s["attrs"])
    with pytest.raises(TypeError, match="input:"):
        tf.cudnn_rnn(s["x"].tolist(), s["h0"], None, s["params"], **s["attrs"])
    with pytest.raises(ValueError, match="max_seq_length ≥ 1"):
        tf.cudnn_rnn(s["x"][:0], s["h0"], None, s["params"], **s["attrs"])


@pytest.mark.parametrize("lengths,exc,match", [
    ([3, 4], ValueError, r"\[0, max_seq_length=3\].*sequence_lengths\[1\] = 4"),
    ([-1, 2], ValueError, r"sequence_lengths\[0\] = -1"),
    ([1, 2, 3], ValueError, r"sequence_lengths: expected shape \[2\]"),
    ([[1, 2]], ValueError, r"sequence_lengths: expected shape \[2\]"),
    ([1.0, 2.0], TypeError, "sequence_lengths: expected an integer array"),
])
def test_sequence_lengths_out_of_range(small, lengths, exc, match):
    s = small
    with pytest.raises(exc, match=match):
        tf.cudnn_rnn_v3(s["x"], s["h0"], None, s["params"], lengths, **s["attrs"])


def test_num_params_mismatch(small):
    s = small
    for name in ("num_params", "num_params_weights", "num_params_biases"):
        with pytest.raises(ValueError, match=f"{name}: expected 24"):
            tf.params_to_canonical(s["L"], s["H"], s["I"], s["params"], **{name: 12},
                                   **s["attrs"])


def test_bad_canonical_lists(small):
    s = small
    L, H, I = s["L"], s["H"], s["I"]
    w, b = tf.params_to_canonical(L, H, I, s["params"], **s["attrs"])
    tf.canonical_to_params(L, H, I, w, b, **s["attrs"])        # the unmodified lists work
    with pytest.raises(ValueError, match="weights: expected 24 arrays"):
        tf.canonical_to_params(L, H, I, w[:-1], b, **s["attrs"])
    with pytest.raises(ValueError, match="biases: expected 24 arrays"):
        tf.canonical_to_params(L, H, I, w, b + b[:1], **s["attrs"])
    bad = list(w)
    bad[12] = np.zeros((H, I), np.float32)          # layer 1 input matrix must be [H, 2H]
    with pytest.raises(ValueError, match=r"weights\[12\] W_r \(layer 1, direction 0, "
                                         r"linLayerID 0\).*expected shape \[2,4\], got \[2,3\]"):
        tf.canonical_to_params(L, H, I, bad, b, **s["attrs"])
    bad = list(b)
    bad[5] = np.zeros(H + 1, np.float32)
    with pytest.raises(ValueError, match=r"biases\[5\] b_Rn"):
        tf.canonical_to_params(L, H, I, w, bad, **s["attrs"])
    bad = list(b)
    bad[7] = bad[7].astype(np.float64)
    with pytest.raises(TypeError, match=r"biases\[7\].*expected dtype float32"):
        tf.canonical_to_params(L, H, I, w, bad, **s["attrs"])
    bad = list(w)
    bad[0] = bad[0].tolist()
    with pytest.raises(TypeError, match=r"weights\[0\]"):
        tf.canonical_to_params(L, H, I, bad, b, **s["attrs"])
    # skip_input: layer-0 input matrices must be the [H, 0] placeholders
    ws, bs = _random_canonical(_rng(1), 1, H, H, 1, np.float32, skip=True)
    tf.canonical_to_params(1, H, H, ws, bs, input_mode="skip_input")
    ws[1] = np.eye(H, dtype=np.float32)
    with pytest.raises(ValueError, match=r"weights\[1\] W_z.*expected shape \[2,0\]"):
        tf.canonical_to_params(1, H, H, ws, bs, input_mode="skip_input")


def test_backprop_refuses_inference_reserve(small):
    s = small
    infer = tf.cudnn_rnn(s["x"], s["h0"], None, s["params"], is_training=False, **s["attrs"])
    with pytest.raises(ValueError, match="empty.*is_training=False"):
        _backprop(s, reserve_space=infer.reserve_space)


def test_backprop_refuses_reserve_of_another_call(small):
    s = small
    rng = _rng(61)
    x2 = _std(rng, s["x"].shape, np.float32)                    # same shapes, other input
    other = tf.cudnn_rnn(x2, s["h0"], None, s["params"], **s["attrs"])
    match = "does not come from a forward call with these input"
    with pytest.raises(ValueError, match=match):
        _backprop(s, reserve_space=other.reserve_space)
    with pytest.raises(ValueError, match=match):
        _backprop(s, params=s["params"] + np.float32(1))       # params changed since
    with pytest.raises(ValueError, match=match):
        _backprop(s, input_h=s["h0"] * 2)
    # other sizes (T = 2): the reserve does not fit this call
    short = tf.cudnn_rnn(s["x"][:2], s["h0"], None, s["params"], **s["attrs"])
    with pytest.raises(ValueError, match="reserve_space"):
        _backprop(s, reserve_space=short.reserve_space)
    # other lengths (V3)
    lengths = np.array([3, 1])
    v3 = tf.cudnn_rnn_v3(s["x"], s["h0"], None, s["params"], lengths, **s["attrs"])
    with pytest.raises(ValueError, match=match):
        tf.cudnn_rnn_backprop_v3(s["x"], s["h0"], None, s["params"], np.array([3, 2]),
                                 v3.output, v3.output_h, None, None, None, None,
                                 v3.reserve_space, None, **s["attrs"])


@pytest.mark.parametrize("attr,value", [("dropout", 0.3), ("seed", 1), ("seed2", 1)])
def test_backprop_refuses_other_attributes(small, attr, value):
    s = dict(small, attrs=dict(small["attrs"], dropout=0.2))
    s["f"] = tf.cudnn_rnn(s["x"], s["h0"], None, s["params"], **s["attrs"])
    _backprop(s)                                            # the same attributes work
    with pytest.raises(ValueError, match=f"different {attr} than"):
        _backprop(s, **{attr: value})


def test_backprop_ignores_seeds_without_dropout(small):
    g = _backprop(small)
    np.testing.assert_array_equal(_backprop(small, seed=3, seed2=4).params_backprop,
                                  g.params_backprop)


def test_backprop_refuses_other_time_major():
    """T = N = L·D = 2, so the shapes agree in both layouts; the layout flag catches it."""
    rng = _rng(71)
    x = _std(rng, (2, 2, 3), np.float64)
    h0 = _std(rng, (2, 2, 2), np.float64)
    p = _std(rng, (tf.params_size(1, 2, 3, direction="bidirectional"),), np.float64)
    f = tf.cudnn_rnn_v3(x, h0, None, p, direction="bidirectional", time_major=True)
    with pytest.raises(ValueError, match="different layout"):
        tf.cudnn_rnn_backprop_v3(x, h0, None, p, None, f.output, f.output_h, None, None, None,
                                 None, f.reserve_space, None, direction="bidirectional",
                                 time_major=False)


def test_backprop_refuses_damaged_reserve(small):
    s = small
    r = s["f"].reserve_space
    with pytest.raises(ValueError, match="too small"):
        _backprop(s, reserve_space=r[:10].copy())
    with pytest.raises(ValueError, match="truncated or padded"):
        _backprop(s, reserve_space=r[:-64].copy())
    bad = r.copy()
    bad[0] ^= 0xFF
    with pytest.raises(ValueError, match="not a cgru.tf reserve space"):
        _backprop(s, reserve_space=bad)
    for byte in (40, 72):               # the header's model digest, its digest of input
        bad = r.copy()
        bad[byte] ^= 0xFF
        with pytest.raises(ValueError, match="reserve"):
            _backprop(s, reserve_space=bad)
    with pytest.raises(TypeError, match="uint8"):
        _backprop(s, reserve_space=r.view(np.int8))
    with pytest.raises(TypeError, match="reserve_space"):
        _backprop(s, reserve_space=list(r))


@pytest.mark.parametrize("name", ["output", "output_h", "output_backprop", "output_h_backprop"])
def test_backprop_wrong_shapes_and_dtypes(small, name):
    s = small
    like = s["f"].output if name in ("output", "output_backprop") else s["f"].output_h
    with pytest.raises(ValueError, match=f"Invalid {name} shape"):
        _backprop(s, **{name: np.zeros(like.shape[:-1] + (like.shape[-1] + 1,), np.float32)})
    with pytest.raises(TypeError, match=f"{name}: expected dtype float32"):
        _backprop(s, **{name: like.astype(np.float64)})
