"""cgru.tf — TensorFlow's CudnnRNN ops (every cuDNN mode) on the CPU.

1. ``params_size`` against ``torch.nn.GRU`` parameter counts.
2. Canonical lists ↔ opaque params: exact round trips; the layout exactly as
   docs/semantics.md §8.1 writes it.
3. ``torch.nn.GRU`` weights → canonical lists → params: outputs, final states and every gradient
   (V1; V3 time-major and batch-major with unsorted variable lengths; float64 and float32).
4. Keras: the flat vector Keras builds for ``CudnnRNNV3`` equals ``canonical_to_params``, and
   running it reproduces a NumPy Keras GRU cell.
5. skip_input / auto_select: against the reference, and against linear_input with identities.
6. Dropout: seeds, masks against the reference, gradients by float64 finite differences.
7. Output contracts (empty dummies, reserve kinds, overwrite semantics, inputs untouched).
8. Every validation error.
9. The other modes (``lstm`` with and without ``num_proj``, ``rnn_tanh``, ``rnn_relu``; TF's
   default mode is ``lstm``): ``params_size`` against torch's parameter counts; canonical
   lists (V1 and V2, the projection ``[P, H]`` last in each pseudo-layer) ↔ params round trips;
   ``torch.nn.LSTM`` (``proj_size``) / ``nn.RNN`` for the forward and every backprop output
   in the opaque and canonical layouts (time-major and batch-major, unsorted lengths with 0,
   bidirectional, stacked); float64 central finite differences of every backprop output;
   V1 = V2 = V3; Keras' LSTM ``CudnnRNNV3`` vector; bad input naming the argument; bytes.

Torch / canonical mapping used throughout (written out here, independent of cgru): torch's
``weight_ih_l{l}[_reverse]`` ``[G·H, in]`` holds the row blocks of cuDNN linLayerIDs 0…G−1 (GRU
r, z, n; LSTM i, f, g, o; RNN one block); ``weight_hh`` the blocks of IDs G…2G−1; an
``nn.LSTM(proj_size=P)``'s ``weight_hr`` ``[P, H]`` is the projection, last in the
pseudo-layer's weights (TF's ``CudnnRNNParamsToCanonicalV2``); ``bias_ih`` / ``bias_hh`` like
the weights.  The opaque layout is ``concat(all weights raveled) ++ concat(all biases)`` in
canonical-list order.
"""
import numpy as np
import pytest

import cgru
from cgru import Network, Topology
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
    """The opaque layout of docs/semantics.md §8.1, written out: all matrices raveled, then all
    biases."""
    return np.concatenate([w.ravel() for w in weights] + [b.ravel() for b in biases])


def _suffix(layer, d):
    return f"_l{layer}" + ("_reverse" if d else "")


def _torch_gru(I, H, L, bidirectional, dtype, seed, batch_first=False):
    torch = _torch()
    torch.manual_seed(seed)
    return torch.nn.GRU(I, H, num_layers=L, bidirectional=bidirectional, batch_first=batch_first,
                        dtype=torch.float64 if dtype == np.float64 else torch.float32)


_TORCH_GATES = {"GRU": 3, "LSTM": 4, "RNN_TANH": 1, "RNN_RELU": 1}


def _canonical_from_torch(module, grad=False):
    """TF canonical lists from a torch.nn.GRU / LSTM / RNN's weights (or their gradients)."""
    H, D = module.hidden_size, 2 if module.bidirectional else 1
    G = _TORCH_GATES[module.mode]
    weights, biases = [], []
    for layer in range(module.num_layers):
        for d in range(D):
            def get(name):
                p = getattr(module, name + _suffix(layer, d))
                return (p.grad if grad else p).detach().numpy()
            for name in ("weight_ih", "weight_hh"):
                weights += [get(name)[k * H:(k + 1) * H].copy() for k in range(G)]
            if getattr(module, "proj_size", 0):
                weights.append(get("weight_hr").copy())
            for name in ("bias_ih", "bias_hh"):
                biases += [get(name)[k * H:(k + 1) * H].copy() for k in range(G)]
    return weights, biases


def _random_canonical(rng, L, H, I, D, dtype, skip=False):
    """Canonical lists with TF's shapes (docs/semantics.md §8.1): weights[(l·D+d)·6+k]
    [H, width], biases [H]."""
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
                           direction=DIRECTION[bidirectional], rnn_mode="gru")
        assert type(n) is int
        assert n == count


def test_params_size_auto_select_follows_tf():
    """auto_select = skip_input when input_size == num_units, else linear_input (TF's
    ToRNNInputMode); also accepts TF-style int32 scalar arrays for the sizes."""
    H = 5
    for I in (H, 3):
        want = tf.params_size(2, H, I, input_mode="skip_input" if I == H else "linear_input",
                              direction="bidirectional", rnn_mode="gru")
        got = tf.params_size(np.int32(2), np.array(H, np.int32), I, input_mode="auto_select",
                             direction="bidirectional", rnn_mode="gru")
        assert got == want
    assert tf.params_size(1, H, H, input_mode="auto_select", rnn_mode="gru") < \
        tf.params_size(1, H, H, rnn_mode="gru")


# --- 2. canonical lists ↔ opaque params ----------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("L,bidirectional,input_mode,I", [
    (1, False, "linear_input", 3), (3, True, "linear_input", 3), (2, False, "linear_input", 5),
    (2, True, "skip_input", 4), (3, False, "auto_select", 4), (2, True, "auto_select", 2)])
def test_canonical_round_trip(dtype, L, bidirectional, input_mode, I):
    H, D = 4, 2 if bidirectional else 1
    skip = input_mode == "skip_input" or (input_mode == "auto_select" and I == H)
    attrs = dict(rnn_mode="gru", input_mode=input_mode, direction=DIRECTION[bidirectional])
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
                                    direction="bidirectional", rnn_mode="gru")
    out = tf.params_to_canonical(2, 3, 2, params, num_params_weights=24, num_params_biases=24,
                                 direction="bidirectional", rnn_mode="gru")
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
    attrs = dict(rnn_mode="gru", direction=DIRECTION[bidirectional], time_major=time_major)
    params = tf.canonical_to_params(L, H, I, weights, biases, direction=attrs["direction"],
                                    rnn_mode="gru")
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
                                    direction="bidirectional", rnn_mode="gru")
    rng = _rng(11)
    x = _std(rng, (T, N, I), np.float64)
    h0 = _std(rng, (2 * L, N, H), np.float64)
    dy = _std(rng, (T, N, 2 * H), np.float64)
    dhy = _std(rng, (2 * L, N, H), np.float64)
    fwd = tf.cudnn_rnn(x, h0, None, params, direction="bidirectional", rnn_mode="gru")
    bp = tf.cudnn_rnn_backprop(x, h0, None, params, fwd.output, fwd.output_h, fwd.output_c,
                               dy, dhy, None, fwd.reserve_space, direction="bidirectional",
                               rnn_mode="gru")
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
        v3 = tf.cudnn_rnn_v3(x, h0, None, params, lengths, direction="bidirectional",
                             rnn_mode="gru")
        np.testing.assert_array_equal(v3.output, fwd.output)
        np.testing.assert_array_equal(v3.output_h, fwd.output_h)
        bp1 = tf.cudnn_rnn_backprop(x, h0, None, params, v3.output, v3.output_h, v3.output_c,
                                    dy, dhy, None, v3.reserve_space, direction="bidirectional",
                                    rnn_mode="gru")
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
    params = tf.canonical_to_params(1, H, I, weights, biases, rnn_mode="gru")
    np.testing.assert_array_equal(params, _keras_flat(kernel, recurrent_kernel, bias))

    if dtype == np.float64:      # Keras's own call: batch-major, input_h [N, 1, H]
        N, T = 3, 4
        x = _std(rng, (N, T, I), dtype)
        h0 = _std(rng, (N, H), dtype)
        out = tf.cudnn_rnn_v3(x, h0[:, None, :], 0, _keras_flat(kernel, recurrent_kernel, bias),
                              np.full(N, T, np.int32), time_major=False, rnn_mode="gru")
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
    attrs = dict(rnn_mode="gru", direction="bidirectional", input_mode=input_mode)
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
                                    direction="bidirectional", input_mode="skip_input",
                                    rnn_mode="gru")
    f = tf.cudnn_rnn_v3(c["x"], c["h0"], None, params, lengths, direction="bidirectional",
                        input_mode="skip_input", rnn_mode="gru")
    topo = Topology(H, H, L, "bidirectional", "skip")
    y, hy = reference.forward(Network.from_flat(topo, params), c["x"], c["h0"], lengths=lengths)
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
                                         direction="bidirectional", input_mode="skip_input",
                                         rnn_mode="gru")
    lin_params = tf.canonical_to_params(L, H, H, lin_weights, c["biases"],
                                        direction="bidirectional", input_mode="linear_input",
                                        rnn_mode="gru")
    lengths = np.array([4, 1, 3])
    fs, gs = _fwd_bwd(c, skip_params, "skip_input", lengths)
    fl, gl = _fwd_bwd(c, lin_params, "linear_input", lengths)
    tol = dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(fs.output, fl.output, **tol)
    np.testing.assert_allclose(fs.output_h, fl.output_h, **tol)
    np.testing.assert_allclose(gs.input_backprop, gl.input_backprop, **tol)
    np.testing.assert_allclose(gs.input_h_backprop, gl.input_h_backprop, **tol)
    dw_lin, db_lin = tf.params_to_canonical(L, H, H, gl.params_backprop,
                                            direction="bidirectional", rnn_mode="gru")
    dw_skip, db_skip = tf.params_to_canonical(L, H, H, gs.params_backprop,
                                              direction="bidirectional", input_mode="skip_input",
                                              rnn_mode="gru")
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
                                    direction="bidirectional", input_mode="skip_input",
                                    rnn_mode="gru")
    fs, gs = _fwd_bwd(c, params, "skip_input")
    fa, ga = _fwd_bwd(c, params, "auto_select")
    np.testing.assert_array_equal(fa.output, fs.output)
    np.testing.assert_array_equal(ga.params_backprop, gs.params_backprop)
    # input_size != num_units: auto_select is linear_input
    rng = _rng(2)
    x = _std(rng, (3, 2, 5), np.float64)
    h0 = _std(rng, (2, 2, H), np.float64)
    p = _std(rng, (tf.params_size(2, H, 5, rnn_mode="gru"),), np.float64)
    np.testing.assert_array_equal(tf.cudnn_rnn(x, h0, None, p, input_mode="auto_select",
                                               rnn_mode="gru").output,
                                  tf.cudnn_rnn(x, h0, None, p, rnn_mode="gru").output)


# --- 6. dropout ----------------------------------------------------------------------------

def _dropout_case(dtype=np.float64, time_major=True):
    T, N, I, H, L = 4, 3, 2, 3, 2
    rng = _rng(31)
    n = tf.params_size(L, H, I, direction="bidirectional", rnn_mode="gru")
    params = _std(rng, (n,), dtype) * 0.5
    x = _std(rng, (T, N, I) if time_major else (N, T, I), dtype)
    h0 = _std(rng, (2 * L, N, H), dtype)
    return T, N, I, H, L, params, x, h0


def test_dropout_seed_and_seed2_reproducible():
    T, N, I, H, L, params, x, h0 = _dropout_case()
    attrs = dict(rnn_mode="gru", direction="bidirectional", dropout=0.5)

    def run(seed, seed2, is_training=True):
        return tf.cudnn_rnn(x, h0, None, params, seed=seed, seed2=seed2,
                            is_training=is_training, **attrs).output

    a = run(1, 2)
    np.testing.assert_array_equal(run(1, 2), a)
    assert not np.allclose(run(3, 2), a)
    assert not np.allclose(run(1, 3), a)
    assert not np.allclose(run(2, 1), a)
    np.testing.assert_array_equal(run(0, 0), run(0, 0))       # 0, 0 is an ordinary seed
    no_dropout = tf.cudnn_rnn(x, h0, None, params, direction="bidirectional", rnn_mode="gru").output
    np.testing.assert_allclose(run(1, 2, is_training=False), no_dropout, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("time_major", [True, False], ids=["tm", "bm"])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_dropout_against_reference_with_the_engines_masks(time_major, dropout):
    T, N, I, H, L, params, x, h0 = _dropout_case(time_major=time_major)
    lengths = np.array([4, 2, 3])
    seed, seed2 = 5, 9
    h_in = h0 if time_major else np.ascontiguousarray(h0.transpose(1, 0, 2))
    out = tf.cudnn_rnn_v3(x, h_in, None, params, lengths, direction="bidirectional",
                          dropout=dropout, seed=seed, seed2=seed2, time_major=time_major,
                          rnn_mode="gru")
    topo = Topology(I, H, L, "bidirectional")
    masks = cgru.dropout_masks(topo, T, N, dropout=dropout, seed=(seed, seed2),
                               dtype=np.float64)
    if dropout:
        assert (masks[0] == 0).any() and (masks[0] != 0).any()
    y, hy = reference.forward(Network.from_flat(topo, params), x, h0, lengths=lengths,
                              batch_major=not time_major,
                              dropout_masks=masks if dropout else None)
    np.testing.assert_allclose(out.output, y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.output_h, hy if time_major else hy.transpose(1, 0, 2),
                               rtol=1e-12, atol=1e-12)


def test_gradients_through_dropout_by_finite_differences():
    T, N, I, H, L, params, x, h0 = _dropout_case(time_major=False)
    h_in = np.ascontiguousarray(h0.transpose(1, 0, 2))              # [N, L·D, H]
    lengths = np.array([4, 1, 3])
    attrs = dict(rnn_mode="gru", direction="bidirectional", dropout=0.5, seed=4, seed2=8,
                 time_major=False,
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
    attrs = dict(rnn_mode="gru", direction="bidirectional")
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
    params = _std(rng, (tf.params_size(L, H, I, direction="bidirectional", rnn_mode="gru"),),
                  np.float32)
    x = _std(rng, (T, N, I), np.float32)
    h0 = _std(rng, (2 * L, N, H), np.float32)
    attrs = dict(rnn_mode="gru", direction="bidirectional")
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
        tf.params_size(0, 4, 3, rnn_mode="gru")
    with pytest.raises(TypeError, match="num_units"):
        tf.params_size(1, 4.0, 3, rnn_mode="gru")
    with pytest.raises(TypeError, match="input_size"):
        tf.params_size(1, 4, np.array([3]), rnn_mode="gru")
    with pytest.raises(TypeError, match="float32 or float64"):
        tf.params_size(1, 4, 3, dtype=np.float16, rnn_mode="gru")


def test_skip_input_needs_input_size_equal_num_units(small):
    s = small
    match = "skip_input.*input_size == num_units.*input_size=3, num_units=2"
    with pytest.raises(ValueError, match=match):
        tf.params_size(1, 2, 3, input_mode="skip_input", rnn_mode="gru")
    with pytest.raises(ValueError, match=match):
        tf.canonical_to_params(1, 2, 3, [], [], input_mode="skip_input", rnn_mode="gru")
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
    tf.canonical_to_params(1, H, H, ws, bs, input_mode="skip_input", rnn_mode="gru")
    ws[1] = np.eye(H, dtype=np.float32)
    with pytest.raises(ValueError, match=r"weights\[1\] W_z.*expected shape \[2,0\]"):
        tf.canonical_to_params(1, H, H, ws, bs, input_mode="skip_input", rnn_mode="gru")


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
    p = _std(rng, (tf.params_size(1, 2, 3, direction="bidirectional", rnn_mode="gru"),), np.float64)
    f = tf.cudnn_rnn_v3(x, h0, None, p, direction="bidirectional", time_major=True, rnn_mode="gru")
    with pytest.raises(ValueError, match="different layout"):
        tf.cudnn_rnn_backprop_v3(x, h0, None, p, None, f.output, f.output_h, None, None, None,
                                 None, f.reserve_space, None, direction="bidirectional",
                                 time_major=False, rnn_mode="gru")


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


# --- 9. every mode: LSTM (with and without num_proj), vanilla RNN tanh / relu --------------
MODE_CASES = [("lstm", 0), ("lstm", 2), ("rnn_tanh", 0), ("rnn_relu", 0)]
MODE_IDS = ["lstm", "lstm_proj", "rnn_tanh", "rnn_relu"]
GATES = {"gru": 3, "lstm": 4, "rnn_tanh": 1, "rnn_relu": 1}


def _torch_module(mode, I, H, L, bidirectional, dtype, seed, proj=0, batch_first=False):
    torch = _torch()
    torch.manual_seed(seed)
    kw = dict(num_layers=L, bidirectional=bidirectional, batch_first=batch_first,
              dtype=torch.float64 if dtype == np.float64 else torch.float32)
    if mode == "gru":
        return torch.nn.GRU(I, H, **kw)
    if mode == "lstm":
        return torch.nn.LSTM(I, H, proj_size=proj, **kw)
    return torch.nn.RNN(I, H, nonlinearity=mode[4:], **kw)


def _run_module(m, x, h0, c0, lengths, dy, dhy, dcy, batch_first):
    """torch's outputs and autograd gradients of Σ y·dy + Σ hy·dhy (+ Σ cy·dcy), states
    ``[L·D, N, ·]``.  torch refuses length-0 sequences, so it runs the others; a length-0
    sequence has, by the op's contract, output 0, final states = initial states, and passes
    the state gradients through (dx = 0) — filled in here."""
    torch = _torch()
    lstm = c0 is not None
    b_axis = 0 if batch_first else 1
    keep = np.flatnonzero(lengths > 0)
    sub = lambda a, axis=1: np.ascontiguousarray(np.take(a, keep, axis=axis))  # noqa: E731
    xt = torch.from_numpy(sub(x, b_axis)).requires_grad_()
    ht = torch.from_numpy(sub(h0)).requires_grad_()
    ct = torch.from_numpy(sub(c0)).requires_grad_() if lstm else None
    m.zero_grad()
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        xt, torch.as_tensor(lengths[keep].astype(np.int64)), batch_first=batch_first,
        enforce_sorted=False)
    y, state = m(packed, (ht, ct) if lstm else ht)
    T = x.shape[1] if batch_first else x.shape[0]
    y, _ = torch.nn.utils.rnn.pad_packed_sequence(y, batch_first=batch_first, total_length=T)
    hy, cy = state if lstm else (state, None)
    loss = (y * torch.from_numpy(sub(dy, b_axis))).sum() + \
        (hy * torch.from_numpy(sub(dhy))).sum()
    if lstm:
        loss = loss + (cy * torch.from_numpy(sub(dcy))).sum()
    loss.backward()

    def full(part, like, axis=1, fill=None):
        out = np.zeros_like(like) if fill is None else fill.copy()
        idx = [slice(None)] * out.ndim
        idx[axis] = keep
        out[tuple(idx)] = part
        return out
    out = dict(y=full(y.detach().numpy(), dy, b_axis), hy=full(hy.detach().numpy(), h0, fill=h0),
               dx=full(xt.grad.numpy(), x, b_axis), dh0=full(ht.grad.numpy(), h0, fill=dhy))
    if lstm:
        out.update(cy=full(cy.detach().numpy(), c0, fill=c0),
                   dc0=full(ct.grad.numpy(), c0, fill=dcy))
    return out


def _tf_state(a, time_major):
    """A state ``[L·D, N, ·]`` in TF's layout."""
    return a if time_major else np.ascontiguousarray(a.transpose(1, 0, 2))


def _mode_attrs(mode, proj, bidirectional):
    return dict(rnn_mode=mode, direction=DIRECTION[bidirectional], num_proj=proj)


def _random_canonical_mode(rng, mode, L, H, I, D, dtype, proj=0, skip=False):
    """Canonical lists as TF's CudnnRNNParamsToCanonicalV2 shapes them: per pseudo-layer G
    input matrices [H, width], G recurrent [H, S], the projection [P, H]; 2G biases [H]."""
    G, S = GATES[mode], proj or H
    weights, biases = [], []
    for layer in range(L):
        for _ in range(D):
            width = (0 if skip else I) if layer == 0 else D * S
            weights += [_std(rng, (H, width), dtype) for _ in range(G)]
            weights += [_std(rng, (H, S), dtype) for _ in range(G)]
            if proj:
                weights.append(_std(rng, (proj, H), dtype))
            biases += [_std(rng, (H,), dtype) for _ in range(2 * G)]
    return weights, biases


@pytest.mark.parametrize("L,bidirectional", [(1, False), (2, True), (3, False)])
@pytest.mark.parametrize("mode,proj", MODE_CASES, ids=MODE_IDS)
def test_params_size_every_mode_matches_torch(mode, proj, L, bidirectional):
    H, I = 4, 3
    m = _torch_module(mode, I, H, L, bidirectional, np.float32, seed=0, proj=proj)
    count = sum(p.numel() for p in m.parameters())
    for dtype in (np.float32, np.float64):
        assert tf.params_size(L, H, I, dtype=dtype, **_mode_attrs(mode, proj, bidirectional)) \
            == count
    if not proj:        # skip_input: layer-0 input matrices are the identity, not stored
        D = 2 if bidirectional else 1
        assert tf.params_size(L, H, H, input_mode="skip_input", rnn_mode=mode,
                              direction=DIRECTION[bidirectional]) == \
            sum(p.numel() for p in _torch_module(mode, H, H, L, bidirectional, np.float32,
                                                 0).parameters()) - D * GATES[mode] * H * H


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode,proj,L,bidirectional,input_mode,I", [
    ("lstm", 0, 2, True, "linear_input", 3), ("lstm", 2, 3, True, "linear_input", 3),
    ("lstm", 3, 2, False, "linear_input", 5), ("lstm", 2, 2, True, "skip_input", 4),
    ("lstm", 0, 2, False, "auto_select", 4), ("rnn_tanh", 0, 3, True, "linear_input", 3),
    ("rnn_relu", 0, 2, False, "skip_input", 4), ("rnn_relu", 0, 1, True, "auto_select", 2)])
def test_canonical_round_trip_every_mode(dtype, mode, proj, L, bidirectional, input_mode, I):
    H, D, G = 4, 2 if bidirectional else 1, GATES[mode]
    K = 2 * G + bool(proj)
    skip = input_mode == "skip_input" or (input_mode == "auto_select" and I == H)
    attrs = dict(_mode_attrs(mode, proj, bidirectional), input_mode=input_mode)
    rng = _rng(L * 10 + I + proj)
    weights, biases = _random_canonical_mode(rng, mode, L, H, I, D, dtype, proj, skip)

    params = tf.canonical_to_params_v2(L, H, I, weights, biases, **attrs)
    assert params.dtype == dtype and params.shape == (tf.params_size(L, H, I, **attrs),)
    np.testing.assert_array_equal(params, _opaque(weights, biases))
    np.testing.assert_array_equal(tf.canonical_to_params(L, H, I, weights, biases, **attrs),
                                  params)

    w2, b2 = tf.params_to_canonical_v2(L, H, I, params, num_params_weights=K * L * D,
                                       num_params_biases=2 * G * L * D, **attrs)
    assert len(w2) == K * L * D and len(b2) == 2 * G * L * D
    for got, want in zip(w2 + b2, weights + biases):
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    if proj:                        # the projection: last in each pseudo-layer, [P, H]
        assert all(w2[i * K + K - 1].shape == (proj, H) for i in range(L * D))
    else:                           # V1 with num_params: the same lists
        w1, b1 = tf.params_to_canonical(L, H, I, params, num_params=2 * G * L * D, **attrs)
        for got, want in zip(w1 + b1, w2 + b2):
            np.testing.assert_array_equal(got, want)

    other = _std(rng, params.shape, dtype)          # params → canonical → params
    back = tf.canonical_to_params_v2(L, H, I, *tf.params_to_canonical_v2(L, H, I, other,
                                                                         **attrs), **attrs)
    np.testing.assert_array_equal(back, other)


def _every_mode_against_torch(mode, proj, L, bidirectional, time_major, dtype, seed):
    T, N, I, H = 5, 4, 3, 4
    D, S, lstm = 2 if bidirectional else 1, proj or H, mode == "lstm"
    m = _torch_module(mode, I, H, L, bidirectional, dtype, seed, proj, not time_major)
    attrs = dict(_mode_attrs(mode, proj, bidirectional), time_major=time_major)
    params = tf.canonical_to_params_v2(L, H, I, *_canonical_from_torch(m),
                                       **_mode_attrs(mode, proj, bidirectional))
    rng = _rng(seed + 100)
    x = _std(rng, (T, N, I) if time_major else (N, T, I), dtype)
    h0 = _std(rng, (L * D, N, S), dtype)                   # torch's layout
    c0 = _std(rng, (L * D, N, H), dtype) if lstm else None
    lengths = np.array([3, 5, 0, 4], np.int32)             # unsorted, with 0 and T
    dy = _std(rng, (T, N, D * S) if time_major else (N, T, D * S), dtype)
    dhy = _std(rng, (L * D, N, S), dtype)
    dcy = _std(rng, (L * D, N, H), dtype) if lstm else None

    def st(a):
        return None if a is None else _tf_state(a, time_major)

    fwd = tf.cudnn_rnn_v3(x, st(h0), st(c0), params, lengths, **attrs)
    bp = tf.cudnn_rnn_backprop_v3(x, st(h0), st(c0), params, lengths, fwd.output,
                                  fwd.output_h, fwd.output_c, dy, st(dhy), st(dcy),
                                  fwd.reserve_space, fwd.host_reserved, **attrs)
    want = _run_module(m, x, h0, c0, lengths, dy, dhy, dcy, batch_first=not time_major)
    tol = TOL[dtype]
    np.testing.assert_allclose(fwd.output, want["y"], **tol)
    np.testing.assert_allclose(fwd.output_h, st(want["hy"]), **tol)
    np.testing.assert_allclose(bp.input_backprop, want["dx"], **tol)
    np.testing.assert_allclose(bp.input_h_backprop, st(want["dh0"]), **tol)
    if lstm:
        np.testing.assert_allclose(fwd.output_c, st(want["cy"]), **tol)
        np.testing.assert_allclose(bp.input_c_backprop, st(want["dc0"]), **tol)
    else:
        assert fwd.output_c.shape == (0,) and bp.input_c_backprop.shape == (0,)
    # params_backprop in the opaque layout, and in the canonical one
    dweights, dbiases = _canonical_from_torch(m, grad=True)
    np.testing.assert_allclose(bp.params_backprop, _opaque(dweights, dbiases), **tol)
    gw, gb = tf.params_to_canonical_v2(L, H, I, bp.params_backprop,
                                       **_mode_attrs(mode, proj, bidirectional))
    for k, (got, theirs) in enumerate(zip(gw + gb, dweights + dbiases)):
        np.testing.assert_allclose(got, theirs, **tol, err_msg=f"canonical gradient {k}")
    for a in (fwd.output, fwd.output_h, fwd.output_c, bp.input_backprop, bp.input_h_backprop,
              bp.input_c_backprop, bp.params_backprop):
        assert a.dtype == dtype


@pytest.mark.parametrize("time_major", [True, False], ids=["tm", "bm"])
@pytest.mark.parametrize("L,bidirectional", [(1, False), (2, True), (3, False)])
@pytest.mark.parametrize("mode,proj", MODE_CASES, ids=MODE_IDS)
def test_v3_every_mode_matches_torch_with_unsorted_lengths(mode, proj, L, bidirectional,
                                                           time_major):
    _every_mode_against_torch(mode, proj, L, bidirectional, time_major, np.float64, seed=L)


@pytest.mark.parametrize("mode,proj", MODE_CASES, ids=MODE_IDS)
def test_v3_every_mode_matches_torch_float32(mode, proj):
    _every_mode_against_torch(mode, proj, 2, True, False, np.float32, seed=7)


def _v123_case(mode, dtype=np.float64, seed=11):
    T, N, I, H, L = 4, 3, 3, 4, 2
    lstm = mode == "lstm"
    rng = _rng(seed)
    attrs = dict(rnn_mode=mode, direction="bidirectional")
    params = _std(rng, (tf.params_size(L, H, I, **attrs),), dtype) * 0.5
    x = _std(rng, (T, N, I), dtype)
    h0 = _std(rng, (2 * L, N, H), dtype)
    c0 = _std(rng, (2 * L, N, H), dtype) if lstm else None
    dy = _std(rng, (T, N, 2 * H), dtype)
    dhy = _std(rng, (2 * L, N, H), dtype)
    dcy = _std(rng, (2 * L, N, H), dtype) if lstm else None
    return attrs, params, x, h0, c0, dy, dhy, dcy


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_v1_v2_v3_agree_in_every_mode(mode):
    """Time-major with full lengths, the three versions are one op: the same outputs and
    reserves bit for bit, and each one's reserve serves the others' backprop."""
    attrs, params, x, h0, c0, dy, dhy, dcy = _v123_case(mode)
    N, T = x.shape[1], x.shape[0]
    f1 = tf.cudnn_rnn(x, h0, c0, params, **attrs)
    f2 = tf.cudnn_rnn_v2(x, h0, c0, params, **attrs)
    assert isinstance(f2, tf.CudnnRNNV2) and f2.host_reserved.dtype == np.int8
    runs = [f1, f2] + [tf.cudnn_rnn_v3(x, h0, c0, params, lengths, **attrs)
                       for lengths in (None, np.full(N, T, np.int32))]
    for f in runs[1:]:
        for a, b in zip(f[:4], f1):
            np.testing.assert_array_equal(a, b)
    args = (x, h0, c0, params)
    outs = (f1.output, f1.output_h, f1.output_c, dy, dhy, dcy)
    grads = []
    for f in runs:
        grads.append(tf.cudnn_rnn_backprop(*args, *outs, f.reserve_space, **attrs))
        grads.append(tf.cudnn_rnn_backprop_v2(*args, *outs, f.reserve_space, f2.host_reserved,
                                              **attrs))
        grads.append(tf.cudnn_rnn_backprop_v3(*args, None, *outs, f.reserve_space, None,
                                              **attrs))
    for g in grads[1:]:
        for a, b in zip(g, grads[0]):
            np.testing.assert_array_equal(a, b)
    assert np.abs(grads[0].params_backprop).max() > 0


@pytest.mark.parametrize("mode", ["lstm", "rnn_tanh", "rnn_relu"])
def test_v1_matches_torch_every_mode(mode):
    attrs, _, x, h0, c0, dy, dhy, dcy = _v123_case(mode)
    L, H, I = 2, 4, 3
    m = _torch_module(mode, I, H, L, True, np.float64, seed=12)
    params = tf.canonical_to_params(L, H, I, *_canonical_from_torch(m), **attrs)
    f = tf.cudnn_rnn(x, h0, c0, params, **attrs)
    g = tf.cudnn_rnn_backprop(x, h0, c0, params, f.output, f.output_h, f.output_c, dy, dhy, dcy,
                              f.reserve_space, **attrs)
    want = _run_module(m, x, h0, c0, np.full(x.shape[1], x.shape[0]), dy, dhy, dcy, False)
    tol = TOL[np.float64]
    for got, key in ((f.output, "y"), (f.output_h, "hy"), (g.input_backprop, "dx"),
                     (g.input_h_backprop, "dh0")) + (((f.output_c, "cy"),
                                                      (g.input_c_backprop, "dc0"))
                                                     if mode == "lstm" else ()):
        np.testing.assert_allclose(got, want[key], **tol, err_msg=key)
    np.testing.assert_allclose(g.params_backprop, _opaque(*_canonical_from_torch(m, True)),
                               **tol)


FD_CASES = {
    "gru": dict(mode="gru"),
    "lstm": dict(mode="lstm"),
    "lstm_proj": dict(mode="lstm", proj=2),
    "lstm_proj_time_major": dict(mode="lstm", proj=1, time_major=True),
    "rnn_tanh": dict(mode="rnn_tanh"),
    "rnn_relu": dict(mode="rnn_relu", time_major=True),
}


@pytest.mark.parametrize("case", list(FD_CASES))
def test_backprop_every_mode_by_finite_differences(case):
    """float64 central differences (cgru.core.gradcheck) of Σ output·gy + Σ output_h·gh
    (+ Σ output_c·gc) with respect to input, input_h, input_c and params: every backprop
    output, through the TF ops alone (two bidirectional layers, lengths with 0)."""
    from cgru.core import gradcheck
    import math
    c = dict(FD_CASES[case])
    mode, proj, time_major = c["mode"], c.get("proj", 0), c.get("time_major", False)
    T, N, I, H, L = 3, 3, 2, 3, 2
    lstm, S = mode == "lstm", proj or H
    attrs = dict(_mode_attrs(mode, proj, True), time_major=time_major, num_threads=1)
    rng = _rng(81)
    params = _std(rng, (tf.params_size(L, H, I, **_mode_attrs(mode, proj, True)),),
                  np.float64) * 0.6
    x = _std(rng, (T, N, I) if time_major else (N, T, I), np.float64)
    h = _std(rng, (2 * L, N, S) if time_major else (N, 2 * L, S), np.float64)
    cst = _std(rng, (2 * L, N, H) if time_major else (N, 2 * L, H), np.float64) if lstm \
        else None
    lengths = np.array([3, 0, 2])
    f = tf.cudnn_rnn_v3(x, h, cst, params, lengths, **attrs)
    gy = _std(rng, f.output.shape, np.float64)
    gh = _std(rng, f.output_h.shape, np.float64)
    gc = _std(rng, f.output_c.shape, np.float64) if lstm else None
    bp = tf.cudnn_rnn_backprop_v3(x, h, cst, params, lengths, f.output, f.output_h,
                                  f.output_c, gy, gh, gc, f.reserve_space, f.host_reserved,
                                  **attrs)

    def loss():
        o = tf.cudnn_rnn_v3(x, h, cst, params, lengths, is_training=False, **attrs)
        total = math.fsum((o.output * gy).ravel()) + math.fsum((o.output_h * gh).ravel())
        return total + (math.fsum((o.output_c * gc).ravel()) if lstm else 0.0)

    arrays = [x, h, params] + ([cst] if lstm else [])
    got = [bp.input_backprop, bp.input_h_backprop, bp.params_backprop] + \
        ([bp.input_c_backprop] if lstm else [])
    numeric = gradcheck.central_differences(loss, arrays)
    for name, g, num in zip(["input", "input_h", "params", "input_c"], got, numeric):
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8, err_msg=f"{name}_backprop")
    # length 0: the state gradients pass through, the input gets none
    b = (slice(None), 1) if time_major else (1,)
    np.testing.assert_array_equal(bp.input_h_backprop[b], gh[b])
    assert not np.any(bp.input_backprop[b])


def _keras_lstm_flat(kernel, recurrent_kernel, bias):
    """The params vector Keras hands to CudnnRNNV3 for an LSTM (keras/src/backend/tensorflow/
    rnn.py, ``_cudnn_lstm``), written out: split the kernels per gate (Keras order i, f, c, o
    = cuDNN's), transpose each block, flatten; the biases are zeros on the input side and
    Keras' one bias on the recurrent side."""
    w = np.split(kernel, 4, axis=1) + np.split(recurrent_kernel, 4, axis=1)
    b = np.split(np.concatenate([np.zeros_like(bias), bias]), 8)
    return np.concatenate([blk.T.reshape(-1) for blk in w] + b)


def _keras_lstm(x, h, c, kernel, recurrent_kernel, bias):
    """Keras LSTMCell over batch-major x [N, T, I] (its equations; sigmoid / tanh)."""
    H = h.shape[1]
    sig = lambda a: 1 / (1 + np.exp(-a))          # noqa: E731
    outs = []
    for t in range(x.shape[1]):
        z = x[:, t] @ kernel + h @ recurrent_kernel + bias
        i, f, g, o = (z[:, k * H:(k + 1) * H] for k in range(4))
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        outs.append(h)
    return np.stack(outs, axis=1), h, c


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_keras_lstm_cudnn_flat_vector_equals_canonical_to_params(dtype):
    """Also: TF's default rnn_mode is "lstm" — no rnn_mode is passed here."""
    I, H = 3, 4
    rng = _rng(6)
    kernel = _std(rng, (I, 4 * H), dtype)
    recurrent_kernel = _std(rng, (H, 4 * H), dtype)
    bias = _std(rng, (4 * H,), dtype)
    gates = [slice(k * H, (k + 1) * H) for k in range(4)]
    weights = [np.ascontiguousarray(m[:, g].T) for m in (kernel, recurrent_kernel)
               for g in gates]
    biases = [np.zeros(H, dtype) for _ in gates] + [bias[g].copy() for g in gates]
    params = tf.canonical_to_params(1, H, I, weights, biases)
    np.testing.assert_array_equal(params, _keras_lstm_flat(kernel, recurrent_kernel, bias))
    if dtype == np.float64:      # Keras's own call: batch-major, input_h / input_c [N, 1, H]
        N, T = 3, 4
        x = _std(rng, (N, T, I), dtype)
        h0, c0 = _std(rng, (N, H), dtype), _std(rng, (N, H), dtype)
        out = tf.cudnn_rnn_v3(x, h0[:, None, :], c0[:, None, :], params,
                              np.full(N, T, np.int32), time_major=False)
        y, hT, cT = _keras_lstm(x, h0, c0, kernel, recurrent_kernel, bias)
        np.testing.assert_allclose(out.output, y, **TOL[dtype])
        np.testing.assert_allclose(out.output_h[:, 0, :], hT, **TOL[dtype])
        np.testing.assert_allclose(out.output_c[:, 0, :], cT, **TOL[dtype])


def test_default_rnn_mode_is_lstm():
    H, I = 4, 3
    n = tf.params_size(1, H, I)
    assert n == tf.params_size(1, H, I, rnn_mode="lstm") == 4 * H * (I + H) + 8 * H
    rng = _rng(7)
    x, h0, c0 = _std(rng, (2, 2, I), np.float64), _std(rng, (1, 2, H), np.float64), \
        _std(rng, (1, 2, H), np.float64)
    f = tf.cudnn_rnn(x, h0, c0, _std(rng, (n,), np.float64))
    assert f.output_c.shape == (1, 2, H)
    # a GRU buffer without rnn_mode="gru" is refused, saying which mode was assumed
    gru = _std(rng, (tf.params_size(1, H, I, rnn_mode="gru"),), np.float64)
    with pytest.raises(ValueError, match="Invalid params size.*rnn_mode='lstm'"):
        tf.cudnn_rnn(x, h0, c0, gru)


@pytest.mark.parametrize("time_major", [True, False], ids=["tm", "bm"])
@pytest.mark.parametrize("mode", ["gru", "rnn_tanh", "rnn_relu", "lstm"])
def test_cell_state_outputs_per_mode(mode, time_major):
    """LSTM: output_c / input_c_backprop shaped like input_c in the op's layout; the other
    modes ignore input_c (anything) and return empty ones, as TF does."""
    T, N, I, H, L = 3, 2, 3, 4, 1
    rng = _rng(8)
    attrs = dict(rnn_mode=mode, direction="bidirectional", time_major=time_major)
    params = _std(rng, (tf.params_size(L, H, I, rnn_mode=mode, direction="bidirectional"),),
                  np.float32)
    x = _std(rng, (T, N, I) if time_major else (N, T, I), np.float32)
    state = (2 * L, N, H) if time_major else (N, 2 * L, H)
    h0, c0 = _std(rng, state, np.float32), _std(rng, state, np.float32)
    if mode == "lstm":
        f = tf.cudnn_rnn_v3(x, h0, c0, params, **attrs)
        g = tf.cudnn_rnn_backprop_v3(x, h0, c0, params, None, f.output, f.output_h,
                                     f.output_c, None, None, np.ones_like(c0),
                                     f.reserve_space, **attrs)
        assert f.output_c.shape == g.input_c_backprop.shape == state
        assert f.output_c.dtype == g.input_c_backprop.dtype == np.float32
        return
    f = tf.cudnn_rnn_v3(x, h0, None, params, **attrs)
    for input_c in (0, c0, "anything"):
        np.testing.assert_array_equal(tf.cudnn_rnn_v3(x, h0, input_c, params, **attrs).output,
                                      f.output)
    g = tf.cudnn_rnn_backprop_v3(x, h0, "anything", params, None, f.output, f.output_h,
                                 "ignored", np.ones_like(f.output), None, "ignored too",
                                 f.reserve_space, **attrs)
    assert f.output_c.shape == g.input_c_backprop.shape == (0,)
    assert f.output_c.dtype == g.input_c_backprop.dtype == np.float32


@pytest.fixture
def lstm_small():
    """A trained LSTM forward with a projection: L=2 bidirectional, T=3, N=2, I=3, H=4, P=2."""
    T, N, I, H, L, P = 3, 2, 3, 4, 2, 2
    rng = _rng(52)
    attrs = dict(rnn_mode="lstm", direction="bidirectional", num_proj=P)
    params = _std(rng, (tf.params_size(L, H, I, **attrs),), np.float32)
    x = _std(rng, (T, N, I), np.float32)
    h0 = _std(rng, (2 * L, N, P), np.float32)
    c0 = _std(rng, (2 * L, N, H), np.float32)
    f = tf.cudnn_rnn_v3(x, h0, c0, params, **attrs)
    return dict(T=T, N=N, I=I, H=H, L=L, P=P, params=params, x=x, h0=h0, c0=c0, attrs=attrs,
                f=f)


def _lstm_backprop(s, **over):
    a = dict(input=s["x"], input_h=s["h0"], input_c=s["c0"], params=s["params"],
             sequence_lengths=None, output=s["f"].output, output_h=s["f"].output_h,
             output_c=s["f"].output_c, output_backprop=np.ones_like(s["f"].output),
             output_h_backprop=None, output_c_backprop=np.ones_like(s["c0"]),
             reserve_space=s["f"].reserve_space)
    attrs = dict(s["attrs"])
    for k, v in over.items():
        (a if k in a else attrs)[k] = v
    return tf.cudnn_rnn_backprop_v3(**a, **attrs)


def test_lstm_fixture_call_works(lstm_small):
    g = _lstm_backprop(lstm_small)
    assert g.input_c_backprop.shape == lstm_small["c0"].shape
    assert g.input_h_backprop.shape == lstm_small["h0"].shape


@pytest.mark.parametrize("mode", ["gru", "rnn_tanh", "rnn_relu", b"rnn_relu"])
def test_num_proj_with_another_mode_is_refused_in_every_op(lstm_small, mode):
    s = lstm_small
    L, H, I = s["L"], s["H"], s["I"]
    attrs = dict(s["attrs"], rnn_mode=mode)
    calls = [
        lambda: tf.params_size(L, H, I, **attrs),
        lambda: tf.params_to_canonical_v2(L, H, I, s["params"], **attrs),
        lambda: tf.params_to_canonical(L, H, I, s["params"], **attrs),
        lambda: tf.canonical_to_params_v2(L, H, I, [], [], **attrs),
        lambda: tf.cudnn_rnn_v3(s["x"], s["h0"], s["c0"], s["params"], **attrs),
        lambda: _lstm_backprop(s, rnn_mode=mode),
    ]
    name = mode.decode() if isinstance(mode, bytes) else mode
    for call in calls:
        with pytest.raises(ValueError, match=rf"^num_proj: expected 0 for rnn_mode='{name}'"):
            call()


@pytest.mark.parametrize("value,exc,match", [
    (5, ValueError, r"^num_proj: expected at most num_units=4"),
    (-1, ValueError, r"^num_proj: expected 0 \(no projection\) or a positive int"),
    (1.5, TypeError, r"^num_proj: expected an int"),
    (True, TypeError, r"^num_proj: expected an int"),
])
def test_bad_num_proj(value, exc, match):
    for call in (lambda: tf.params_size(1, 4, 3, num_proj=value),
                 lambda: tf.params_to_canonical_v2(1, 4, 3, np.zeros(200), num_proj=value),
                 lambda: tf.canonical_to_params_v2(1, 4, 3, [], [], num_proj=value)):
        with pytest.raises(exc, match=match):
            call()


def test_wrong_input_c_for_lstm(lstm_small):
    s = lstm_small
    x, h0, c0, p, attrs = s["x"], s["h0"], s["c0"], s["params"], s["attrs"]
    for bad, exc, match in [
        (None, TypeError, r"^input_c: expected a numpy array \[L·D, N, H\] \(rnn_mode='lstm' "
                          r"needs the initial cell state\), got NoneType"),
        (c0.astype(np.float64), TypeError, r"^input_c: expected dtype float32"),
        (c0[0], ValueError, r"^RNN input_c must be a 3-D array"),
        (c0[:, :1], ValueError, r"^Invalid input_c shape: \[4,1,4\] \[4,2\]\+\[H ≥ num_proj=2\] "
                                r"\(input_c: expected"),
        (c0[:, :, :1], ValueError, r"^Invalid input_c shape: \[4,2,1\]"),
    ]:
        with pytest.raises(exc, match=match):
            tf.cudnn_rnn_v3(x, h0, bad, p, **attrs)
        with pytest.raises(exc, match=match):
            _lstm_backprop(s, input_c=bad)
    # input_h of the projection's width
    with pytest.raises(ValueError, match=r"^Invalid input_h shape: \[4,2,4\] \[4,2,2\] "
                                         r"\(input_h: expected \[L·D, N, num_proj\]"):
        tf.cudnn_rnn_v3(x, c0, c0, p, **attrs)
    # without a projection input_c must be shaped like input_h (V1, and V3 batch-major)
    rng = _rng(53)
    q = _std(rng, (tf.params_size(1, 4, 3, direction="bidirectional"),), np.float32)
    h = _std(rng, (2, 2, 4), np.float32)
    with pytest.raises(ValueError, match=r"^Invalid input_c shape: \[2,2,3\] \[2,2,4\] "
                                         r"\(input_c: expected the shape of input_h"):
        tf.cudnn_rnn(x, h, h[:, :, :3], q, direction="bidirectional")
    xb = np.ascontiguousarray(x.transpose(1, 0, 2))
    hb = _std(rng, (2, 2, 4), np.float32)           # [N, L·D, H] with N = L·D = 2
    tf.cudnn_rnn_v3(xb, hb, hb, q, direction="bidirectional", time_major=False)
    with pytest.raises(ValueError, match=r"^Invalid input_c shape: \[2,2,3\] \[2,2,4\]"):
        tf.cudnn_rnn_v3(xb, hb, hb[:, :, :3], q, direction="bidirectional", time_major=False)


def test_wrong_num_params_counts(lstm_small):
    s = lstm_small
    L, H, I, P, attrs = s["L"], s["H"], s["I"], s["P"], s["attrs"]
    p = s["params"]
    w, b = tf.params_to_canonical_v2(L, H, I, p, num_params_weights=36, num_params_biases=32,
                                     **attrs)
    assert len(w) == 36 and len(b) == 32
    with pytest.raises(ValueError, match=r"^num_params_weights: expected 36 \(9 per layer and "
                                         r"direction for rnn_mode='lstm', the projection last"):
        tf.params_to_canonical_v2(L, H, I, p, num_params_weights=32, **attrs)
    with pytest.raises(ValueError, match=r"^num_params_biases: expected 32 \(8 per layer"):
        tf.params_to_canonical_v2(L, H, I, p, num_params_biases=36, **attrs)
    with pytest.raises(TypeError, match=r"^num_params_weights: expected an int"):
        tf.params_to_canonical_v2(L, H, I, p, num_params_weights="36", **attrs)
    with pytest.raises(ValueError, match=r"^num_params: CudnnRNNParamsToCanonical \(V1\) has no "
                                         r"projection"):
        tf.params_to_canonical(L, H, I, p, num_params=32, **attrs)
    q = np.zeros(tf.params_size(L, H, I, rnn_mode="rnn_relu"), np.float32)
    with pytest.raises(ValueError, match=r"^num_params: expected 4 \(2 per layer and direction "
                                         r"for rnn_mode='rnn_relu'"):
        tf.params_to_canonical(L, H, I, q, num_params=6, rnn_mode="rnn_relu")
    # canonical_to_params_v2: TF's counts are the lists' lengths
    with pytest.raises(ValueError, match=r"^weights: expected 36 arrays \(TF's "
                                         r"num_params_weights: 9 per layer and direction"):
        tf.canonical_to_params_v2(L, H, I, [a for i, a in enumerate(w) if i % 9 != 8], b,
                                  **attrs)
    with pytest.raises(ValueError, match=r"^biases: expected 32 arrays \(TF's "
                                         r"num_params_biases: 8 per layer"):
        tf.canonical_to_params_v2(L, H, I, w, b[:-1], **attrs)
    # the projection is [num_proj, H]: its transpose is refused
    bad = list(w)
    bad[8] = np.ascontiguousarray(w[8].T)
    with pytest.raises(ValueError, match=r"^weights\[8\] W_p \(layer 0, direction 0, linLayerID "
                                         r"8\): Params size mismatch: expected shape \[2,4\], "
                                         r"got \[4,2\]"):
        tf.canonical_to_params_v2(L, H, I, bad, b, **attrs)
    bad = list(w)
    bad[18] = np.zeros((H, I), np.float32)    # layer 1 input matrix is [H, D·P]
    with pytest.raises(ValueError, match=r"^weights\[18\] W_i \(layer 1, direction 0, "
                                         r"linLayerID 0\).*expected shape \[4,4\]"):
        tf.canonical_to_params_v2(L, H, I, bad, b, **attrs)
    np.testing.assert_array_equal(tf.canonical_to_params_v2(L, H, I, w, b, **attrs), p)


def test_lstm_backprop_refuses_a_reserve_of_another_call(lstm_small):
    s = lstm_small
    with pytest.raises(ValueError, match="does not come from a forward call with these input"):
        _lstm_backprop(s, input_c=s["c0"] * 2)            # another initial cell state
    # a GRU reserve is not an LSTM's
    gp = _std(_rng(54), (tf.params_size(2, 2, 3, rnn_mode="gru", direction="bidirectional"),),
              np.float32)
    gf = tf.cudnn_rnn(s["x"], s["h0"], None, gp, rnn_mode="gru", direction="bidirectional")
    with pytest.raises(ValueError, match="reserve_space"):
        _lstm_backprop(s, reserve_space=gf.reserve_space)


@pytest.mark.parametrize("name", ["output_c", "output_c_backprop"])
def test_lstm_backprop_wrong_cell_state_shapes_and_dtypes(lstm_small, name):
    s = lstm_small
    c = s["c0"]
    with pytest.raises(ValueError, match=rf"^Invalid {name} shape: \[4,2,5\] \[4,2,4\]"):
        _lstm_backprop(s, **{name: np.zeros((4, 2, 5), np.float32)})
    with pytest.raises(TypeError, match=rf"^{name}: expected dtype float32"):
        _lstm_backprop(s, **{name: c.astype(np.float64)})
    _lstm_backprop(s, **{name: None})                      # None: zeros (or not checked)


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_string_attributes_may_be_bytes_in_every_mode(mode):
    """TF's ``op.get_attr`` returns bytes (``b"lstm"``): the same results as str."""
    as_str = dict(rnn_mode=mode, input_mode="linear_input", direction="bidirectional")
    as_bytes = {k: v.encode() for k, v in as_str.items()}
    attrs, params, x, h0, c0, dy, dhy, dcy = _v123_case(mode, seed=13)
    L, H, I = 2, 4, 3

    def run(a):
        out = [np.array(tf.params_size(L, H, I, **a))]
        w, b = tf.params_to_canonical_v2(L, H, I, params, **a)
        out += w + b + [tf.canonical_to_params_v2(L, H, I, w, b, **a)]
        f = tf.cudnn_rnn_v3(x, h0, c0, params, **a)
        g = tf.cudnn_rnn_backprop_v3(x, h0, c0, params, None, f.output, f.output_h, f.output_c,
                                     dy, dhy, dcy, f.reserve_space, **a)
        return out + list(f[:3]) + list(g)
    for u, v in zip(run(as_bytes), run(as_str)):
        np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("mode,proj", MODE_CASES, ids=MODE_IDS)
def test_skip_input_every_mode_equals_linear_input_with_identity_matrices(mode, proj):
    """cuDNN skip input in every mode (also with a projection): every layer-0 input matrix is
    the identity, the input biases still apply — forward and every gradient."""
    T, N, H, L, D = 4, 3, 3, 2, 2
    G, lstm = GATES[mode], mode == "lstm"
    rng = _rng(22)
    weights, biases = _random_canonical_mode(rng, mode, L, H, H, D, np.float64, proj, skip=True)
    K = 2 * G + bool(proj)
    lin = list(weights)
    for d in range(D):
        for k in range(G):
            lin[d * K + k] = np.eye(H)
    attrs = _mode_attrs(mode, proj, True)
    skip_p = tf.canonical_to_params_v2(L, H, H, weights, biases, input_mode="skip_input",
                                       **attrs)
    lin_p = tf.canonical_to_params_v2(L, H, H, lin, biases, **attrs)
    S = proj or H
    x = _std(rng, (T, N, H), np.float64)
    h0 = _std(rng, (L * D, N, S), np.float64)
    c0 = _std(rng, (L * D, N, H), np.float64) if lstm else None
    dy = _std(rng, (T, N, D * S), np.float64)
    lengths = np.array([4, 0, 2])

    def run(params, input_mode):
        f = tf.cudnn_rnn_v3(x, h0, c0, params, lengths, input_mode=input_mode, **attrs)
        g = tf.cudnn_rnn_backprop_v3(x, h0, c0, params, lengths, f.output, f.output_h,
                                     f.output_c, dy, f.output_h, f.output_c, f.reserve_space,
                                     input_mode=input_mode, **attrs)
        return f, g
    fs, gs = run(skip_p, "skip_input")
    fl, gl = run(lin_p, "linear_input")
    fa, ga = run(skip_p, "auto_select")             # input_size == num_units: skip
    tol = dict(rtol=1e-12, atol=1e-12)
    for a, b in zip(list(fs[:3]) + list(gs[:3]), list(fl[:3]) + list(gl[:3])):
        np.testing.assert_allclose(a, b, **tol)
    for a, b in zip(list(fa[:3]) + list(ga), list(fs[:3]) + list(gs)):
        np.testing.assert_array_equal(a, b)
    dw_s, db_s = tf.params_to_canonical_v2(L, H, H, gs.params_backprop,
                                           input_mode="skip_input", **attrs)
    dw_l, db_l = tf.params_to_canonical_v2(L, H, H, gl.params_backprop, **attrs)
    for i, (a, b) in enumerate(zip(dw_s + db_s, dw_l + db_l)):
        if i < len(dw_s) and i < D * K and i % K < G:
            assert a.shape == (H, 0) and np.abs(b).max() > 0
        else:
            np.testing.assert_allclose(a, b, **tol)
