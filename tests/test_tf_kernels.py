"""cgru.tf.load_kernels — TensorFlow's own CudnnRNN ops running on the CPU, computed by cgru.

1. The eleven ops against torch.nn.GRU / nn.LSTM (proj_size) / nn.RNN autograd through TF's
   canonical weights: torch's weights → ``CudnnRNNCanonicalToParams[V2]`` → the forward op
   under a ``tf.GradientTape`` (TF's registered gradients call the ``Backprop`` ops) →
   ``CudnnRNNParamsToCanonical[V2]`` of the params gradient; ``CudnnRNNParamsSize`` against
   torch's parameter count.  Every mode, stacked and bidirectional, time_major both ways,
   unsorted sequence lengths, float64 (≤ 1e-10 relative) and float32 (≤ 2e-5).
2. The same calls against cgru.tf's NumPy functions, op by op: bitwise equal (one engine), and
   what torch cannot check: lengths of 0, dropout with seeds, skip_input / auto_select.
3. Eager = tf.function with dynamic T and N = a SavedModel reloaded in a fresh process (its
   forward and its gradients), and without load_kernels the same SavedModel fails there.
4. tf_keras's CuDNNGRU / CuDNNLSTM on the CPU against the standard GRU / LSTM layers loaded with
   the same weights through Keras's own converter (outputs, states, weight gradients) and
   training with fit.
5. Several threads at once (bitwise equal to one at a time); float16 / bfloat16 (computed in
   float32, rounded); TF's output shapes and dummies; inputs and the reserve never modified.
6. Errors: every bad input is a TF error naming it; a reserve of another call or of an
   inference forward is refused.
7. The loader: the cache key, one build under concurrent processes (file lock), no partial
   library after a failed build, the missing-compiler / missing-headers errors, idempotence,
   ``python -m cgru --tf-kernels``, and ``import cgru.tf`` not importing TensorFlow.
8. TensorFlow's C API in a C program without Python: TF_LoadLibrary, then CudnnRNN (libcgru
   starts the Python runtime itself).

Torch ↔ canonical mapping (written out here, independent of cgru): torch's
``weight_ih_l{l}[_reverse]`` ``[G·H, in]`` holds the row blocks of cuDNN linLayerIDs 0…G−1 (GRU
r, z, n; LSTM i, f, g, o; RNN one block), ``weight_hh`` those of G…2G−1, ``weight_hr`` ``[P, H]``
is the projection (last of each pseudo-layer); ``bias_ih`` / ``bias_hh`` likewise.  Anything
that could hang (processes, threads) runs in a subprocess with a timeout.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import cgru.tf as ctf  # noqa: E402
from cgru import tf_kernels  # noqa: E402
from conftest import PACKAGE_DIR, package_env  # noqa: E402

TOL = {np.float64: 1e-10, np.float32: 2e-5}
MODES = [("gru", 0), ("lstm", 0), ("lstm", 4), ("rnn_tanh", 0), ("rnn_relu", 0)]
GATES = {"gru": 3, "lstm": 4, "rnn_tanh": 1, "rnn_relu": 1}
T_, N_, I_, H_ = 6, 4, 5, 7
TIMEOUT = 900

pytestmark = pytest.mark.usefixtures("poison")


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return ctf.load_kernels()


def _torch():
    return pytest.importorskip("torch")


def _env(**extra):
    env = package_env(TF_CPP_MIN_LOG_LEVEL="2")
    env.update(extra)
    return env


def _run_script(code, *args, env=None, check=True):
    """Run ``code`` in a fresh Python (``args`` as sys.argv[1:]); its CompletedProcess."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=TIMEOUT,
                          env=env or _env(), cwd=PACKAGE_DIR)
    if check:
        assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    return proc


def _rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.size == 0:
        return 0.0
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))


def _assert_rel(got, want, dtype, what):
    err = _rel_err(got, want)
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]}"


# --- the ops, called as TensorFlow users call them ---------------------------------------------
def _attrs(mode, proj, bidirectional, **more):
    a = dict(rnn_mode=mode, direction="bidirectional" if bidirectional else "unidirectional",
             **more)
    if proj:
        a["num_proj"] = proj
    return a


def _forward(version, x, h, c, params, lengths=None, *, time_major=True, is_training=True,
             **attrs):
    """The forward op of ``version`` (1, 2, 3); its outputs as a list."""
    common = dict(input=x, input_h=h, input_c=c, params=params, is_training=is_training)
    if version == 1:
        return list(tf.raw_ops.CudnnRNN(**common, **attrs))
    if version == 2:
        return list(tf.raw_ops.CudnnRNNV2(**common, **attrs))
    return list(tf.raw_ops.CudnnRNNV3(**common, sequence_lengths=lengths, time_major=time_major,
                                      **attrs))


def _params_size(L, H, I, dtype, S=tf.int32, **attrs):
    return int(tf.raw_ops.CudnnRNNParamsSize(num_layers=L, num_units=H, input_size=I,
                                             T=tf.as_dtype(dtype), S=S, **attrs)[0])


def _to_params(v2, L, H, I, weights, biases, **attrs):
    op = tf.raw_ops.CudnnRNNCanonicalToParamsV2 if v2 else tf.raw_ops.CudnnRNNCanonicalToParams
    return op(num_layers=L, num_units=H, input_size=I, weights=weights, biases=biases,
              **attrs).numpy()


def _to_canonical(v2, L, H, I, params, K, B, **attrs):
    if v2:
        w, b = tf.raw_ops.CudnnRNNParamsToCanonicalV2(
            num_layers=L, num_units=H, input_size=I, params=params, num_params_weights=K,
            num_params_biases=B, **attrs)
    else:
        w, b = tf.raw_ops.CudnnRNNParamsToCanonical(num_layers=L, num_units=H, input_size=I,
                                                    params=params, num_params=K, **attrs)
    return [a.numpy() for a in w], [a.numpy() for a in b]


def _counts(mode, proj, L, D):
    G = GATES[mode]
    return (2 * G + bool(proj)) * L * D, 2 * G * L * D


def _state_tf(a, time_major):
    """torch's [L·D, N, ·] state in TF's layout ([N, L·D, ·] batch-major) and back."""
    return a if time_major else np.ascontiguousarray(a.transpose(1, 0, 2))


# --- torch ---------------------------------------------------------------------------------
def _torch_module(mode, proj, L, bidirectional, dtype, batch_first, seed):
    torch = _torch()
    torch.manual_seed(seed)
    kw = dict(num_layers=L, bidirectional=bidirectional, batch_first=batch_first,
              dtype=torch.float64 if dtype == np.float64 else torch.float32)
    if mode == "gru":
        return torch.nn.GRU(I_, H_, **kw)
    if mode == "lstm":
        return torch.nn.LSTM(I_, H_, proj_size=proj, **kw)
    return torch.nn.RNN(I_, H_, nonlinearity=mode[4:], **kw)


def _canonical(module, grad=False):
    """TF canonical lists of a torch module's weights (or of their gradients)."""
    G = {"GRU": 3, "LSTM": 4}.get(module.mode, 1)
    H, D = module.hidden_size, 2 if module.bidirectional else 1
    weights, biases = [], []
    for layer in range(module.num_layers):
        for d in range(D):
            def get(name):
                p = getattr(module, f"{name}_l{layer}" + ("_reverse" if d else ""))
                return (p.grad if grad else p).detach().numpy()
            for name in ("weight_ih", "weight_hh"):
                weights += [get(name)[k * H:(k + 1) * H].copy() for k in range(G)]
            if getattr(module, "proj_size", 0):
                weights.append(get("weight_hr").copy())
            for name in ("bias_ih", "bias_hh"):
                biases += [get(name)[k * H:(k + 1) * H].copy() for k in range(G)]
    return weights, biases


def _torch_run(module, x, h0, c0, lengths, batch_first, dy, dhy, dcy):
    """torch's outputs and the autograd gradients of Σ y·dy + Σ hy·dhy (+ Σ cy·dcy)."""
    torch = _torch()
    lstm = module.mode == "LSTM"
    T = x.shape[1] if batch_first else x.shape[0]
    xt = torch.tensor(x, requires_grad=True)
    ht = torch.tensor(h0, requires_grad=True)
    ct = torch.tensor(c0, requires_grad=True) if lstm else None
    inp = xt
    if lengths is not None:
        inp = torch.nn.utils.rnn.pack_padded_sequence(xt, torch.as_tensor(lengths, dtype=torch.int64),
                                                      batch_first=batch_first, enforce_sorted=False)
    y, state = module(inp, (ht, ct) if lstm else ht)
    if lengths is not None:
        y = torch.nn.utils.rnn.pad_packed_sequence(y, batch_first=batch_first, total_length=T)[0]
    hy, cy = state if lstm else (state, None)
    loss = (y * torch.tensor(dy)).sum() + (hy * torch.tensor(dhy)).sum()
    if lstm:
        loss = loss + (cy * torch.tensor(dcy)).sum()
    module.zero_grad()
    loss.backward()
    out = dict(y=y.detach().numpy(), hy=hy.detach().numpy(), dx=xt.grad.numpy(),
               dh=ht.grad.numpy())
    if lstm:
        out.update(cy=cy.detach().numpy(), dc=ct.grad.numpy())
    out["dweights"], out["dbiases"] = _canonical(module, grad=True)
    return out


# --- 1 + 2: every op against torch and cgru.tf ------------------------------------------------
def _problem(mode, proj, L, bidirectional, time_major, dtype, seed, lengths):
    """Random inputs in TF's layouts, torch's module and everything both sides need."""
    rng = np.random.default_rng(seed)
    D, S = 2 if bidirectional else 1, proj or H_
    module = _torch_module(mode, proj, L, bidirectional, dtype, not time_major, seed)
    weights, biases = _canonical(module)
    x = rng.standard_normal((T_, N_, I_) if time_major else (N_, T_, I_)).astype(dtype)
    h0 = rng.standard_normal((L * D, N_, S)).astype(dtype)             # torch's layout
    c0 = rng.standard_normal((L * D, N_, H_)).astype(dtype)
    dy = rng.standard_normal((T_, N_, D * S) if time_major else (N_, T_, D * S)).astype(dtype)
    dhy = rng.standard_normal(h0.shape).astype(dtype)
    dcy = rng.standard_normal(c0.shape).astype(dtype)
    return dict(module=module, weights=weights, biases=biases, x=x, h0=h0, c0=c0, dy=dy,
                dhy=dhy, dcy=dcy, lengths=lengths, D=D)


CASES = ([(3, m, p, L, b, tm, np.float64) for m, p in MODES for L, b in ((1, False), (2, True))
          for tm in (True, False)]
         + [(3, m, p, 2, True, False, np.float32) for m, p in MODES]
         + [(v, m, 0, 2, True, True, np.float64) for v in (1, 2) for m, p in MODES if not p]
         + [(v, m, 0, 1, False, True, np.float32) for v in (1, 2) for m in ("gru", "lstm")])


@pytest.mark.parametrize("version,mode,proj,L,bidirectional,time_major,dtype", CASES)
def test_every_op_matches_torch_and_cgru_tf(version, mode, proj, L, bidirectional, time_major,
                                            dtype):
    lengths = np.array([T_, 1, T_ - 2, 3], np.int32) if version == 3 else None
    p = _problem(mode, proj, L, bidirectional, time_major, dtype, seed=L + 7 * version, lengths=lengths)
    attrs = _attrs(mode, proj, bidirectional)
    v2 = version == 3                     # V3 (and the projection) use the V2 params ops
    lstm = mode == "lstm"
    K, B = _counts(mode, proj, L, p["D"])

    # params: size and packing (torch's weights in TF's canonical lists)
    params = _to_params(v2, L, H_, I_, p["weights"], p["biases"], **attrs)
    n_torch = sum(t.numel() for t in p["module"].parameters())
    assert _params_size(L, H_, I_, dtype, **attrs) == params.size == n_torch
    assert params.dtype == dtype
    np.testing.assert_array_equal(params, ctf.canonical_to_params_v2(L, H_, I_, p["weights"],
                                                                     p["biases"], **attrs))

    # the forward and TF's registered gradient (the Backprop op) under a tape
    h_tf, c_tf = _state_tf(p["h0"], time_major), _state_tf(p["c0"], time_major)
    inputs = [tf.constant(p["x"]), tf.constant(h_tf),
              tf.constant(c_tf if lstm else np.zeros((), dtype)), tf.constant(params)]
    dh_tf, dc_tf = _state_tf(p["dhy"], time_major), _state_tf(p["dcy"], time_major)
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        out = _forward(version, *inputs, lengths, time_major=time_major, **attrs)
        loss = tf.reduce_sum(out[0] * p["dy"]) + tf.reduce_sum(out[1] * dh_tf)
        if lstm:
            loss += tf.reduce_sum(out[2] * dc_tf)
    dx, dh, dc, dparams = [g.numpy() for g in tape.gradient(loss, inputs)]
    dweights, dbiases = _to_canonical(v2, L, H_, I_, dparams, K, B, **attrs)
    inference = _forward(version, *inputs, lengths, time_major=time_major, is_training=False,
                         **attrs)
    for a, b in zip(inference[:3 if lstm else 2], out):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    want = _torch_run(p["module"], p["x"], p["h0"], p["c0"], lengths, not time_major, p["dy"],
                      p["dhy"], p["dcy"])
    _assert_rel(out[0].numpy(), want["y"], dtype, "output")
    _assert_rel(_state_tf(out[1].numpy(), time_major), want["hy"], dtype, "output_h")
    _assert_rel(dx, want["dx"], dtype, "input_backprop")
    _assert_rel(_state_tf(dh, time_major), want["dh"], dtype, "input_h_backprop")
    if lstm:
        _assert_rel(_state_tf(out[2].numpy(), time_major), want["cy"], dtype, "output_c")
        _assert_rel(_state_tf(dc, time_major), want["dc"], dtype, "input_c_backprop")
    for i, (g, w) in enumerate(zip(dweights + dbiases, want["dweights"] + want["dbiases"])):
        _assert_rel(g, w, dtype, f"params_backprop, canonical array {i}")

    # cgru.tf's NumPy functions, op by op: bitwise equal
    np_in = (p["x"], h_tf, c_tf, params)
    kw = dict(time_major=time_major) if version == 3 else {}
    fwd = {1: ctf.cudnn_rnn, 2: ctf.cudnn_rnn_v2, 3: ctf.cudnn_rnn_v3}[version]
    ref = fwd(*np_in, *([lengths] if version == 3 else []), **kw, **attrs)
    for name, got in zip(("output", "output_h"), out):
        np.testing.assert_array_equal(got.numpy(), getattr(ref, name), err_msg=name)
    if lstm:
        np.testing.assert_array_equal(out[2].numpy(), ref.output_c)
    grads = ctf.cudnn_rnn_backprop_v3(*np_in, lengths, ref.output, ref.output_h, ref.output_c,
                                      p["dy"], dh_tf, dc_tf if lstm else None, ref.reserve_space,
                                      time_major=time_major, **attrs)
    for got, name in zip((dx, dh, dc, dparams), grads._fields):
        if lstm or name != "input_c_backprop":
            np.testing.assert_array_equal(got, getattr(grads, name), err_msg=name)
    ref_w, ref_b = ctf.params_to_canonical_v2(L, H_, I_, dparams, **attrs)
    for got, w in zip(dweights + dbiases, ref_w + ref_b):
        np.testing.assert_array_equal(got, w)


def _np_inputs(rng, mode, proj, L, D, dtype, time_major=True, T=T_, N=N_, I=I_, H=H_,
               input_mode="linear_input"):
    S = proj or H
    n = ctf.params_size(L, H, I, rnn_mode=mode, num_proj=proj, input_mode=input_mode,
                        direction="bidirectional" if D == 2 else "unidirectional")
    x = rng.standard_normal((T, N, I) if time_major else (N, T, I)).astype(dtype)
    h = rng.standard_normal((L * D, N, S) if time_major else (N, L * D, S)).astype(dtype)
    c = rng.standard_normal((L * D, N, H) if time_major else (N, L * D, H)).astype(dtype)
    return x, h, c, (rng.standard_normal(n) * 0.4).astype(dtype)


def _forward_and_backprop(x, h, c, params, lengths, dy, dh, dc, time_major=True, **attrs):
    """TF's V3 forward and its Backprop op called directly; both output lists."""
    out = _forward(3, x, h, c, params, lengths, time_major=time_major, **attrs)
    back = tf.raw_ops.CudnnRNNBackpropV3(
        input=x, input_h=h, input_c=c, params=params, sequence_lengths=lengths, output=out[0],
        output_h=out[1], output_c=out[2], output_backprop=dy, output_h_backprop=dh,
        output_c_backprop=dc, reserve_space=out[3], host_reserved=out[4],
        time_major=time_major, **attrs)
    return out, back


@pytest.mark.parametrize("mode,proj", MODES)
@pytest.mark.parametrize("time_major", [True, False])
def test_lengths_with_zeros_and_dropout_equal_cgru_tf(mode, proj, time_major):
    """What torch cannot check: sequences of length 0 (outputs 0, states passed through) and
    seeded inter-layer dropout, forward and backprop bitwise equal to cgru.tf."""
    rng = np.random.default_rng(3)
    x, h, c, params = _np_inputs(rng, mode, proj, 3, 2, np.float64, time_major)
    lengths = np.array([0, T_, 2, 0], np.int32)
    attrs = _attrs(mode, proj, True, dropout=0.375, seed=11, seed2=-5)
    ref = ctf.cudnn_rnn_v3(x, h, c, params, lengths, time_major=time_major, **attrs)
    dy, dh = rng.standard_normal(ref.output.shape), rng.standard_normal(h.shape)
    dc = rng.standard_normal(c.shape) if mode == "lstm" else np.zeros(())
    out, back = _forward_and_backprop(x, h, c, params, lengths, dy, dh, dc, time_major, **attrs)
    np.testing.assert_array_equal(out[0].numpy(), ref.output)
    np.testing.assert_array_equal(out[1].numpy(), ref.output_h)
    grads = ctf.cudnn_rnn_backprop_v3(x, h, c, params, lengths, ref.output, ref.output_h,
                                      ref.output_c, dy, dh, dc if mode == "lstm" else None,
                                      ref.reserve_space, time_major=time_major, **attrs)
    names = grads._fields if mode == "lstm" else ("input_backprop", "input_h_backprop", None,
                                                   "params_backprop")
    for got, name in zip(back, names):
        if name:
            np.testing.assert_array_equal(got.numpy(), getattr(grads, name), err_msg=name)
    # the dropout is live: another seed changes the output
    other = _forward(3, x, h, c, params, lengths, time_major=time_major,
                     **dict(attrs, seed=12))[0].numpy()
    assert not np.array_equal(other, out[0].numpy())


@pytest.mark.parametrize("input_mode", ["skip_input", "auto_select"])
@pytest.mark.parametrize("mode,proj", MODES)
def test_skip_and_auto_select_equal_cgru_tf(input_mode, mode, proj):
    """skip_input (I = H: layer 0's input matrices are the identity, [H, 0] in the canonical
    lists) and auto_select (skip when input_size == num_units) equal cgru.tf in every op."""
    rng = np.random.default_rng(4)
    L, H = 2, 6
    for I in (H, 3) if input_mode == "auto_select" else (H,):
        attrs = _attrs(mode, proj, True, input_mode=input_mode)
        x, h, c, params = _np_inputs(rng, mode, proj, L, 2, np.float64, I=I, H=H,
                                     input_mode=input_mode)
        assert _params_size(L, H, I, np.float64, **attrs) == params.size
        K, B = _counts(mode, proj, L, 2)
        w, b = _to_canonical(True, L, H, I, params, K, B, **attrs)
        ref_w, ref_b = ctf.params_to_canonical_v2(L, H, I, params, **attrs)
        assert [a.shape for a in w] == [a.shape for a in ref_w]
        assert (w[0].shape == (H, 0)) == (I == H)
        for got, want in zip(w + b, ref_w + ref_b):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(_to_params(True, L, H, I, w, b, **attrs), params)
        lengths = np.array([T_, 3, 1, 5], np.int32)
        ref = ctf.cudnn_rnn_v3(x, h, c, params, lengths, **attrs)
        dy = rng.standard_normal(ref.output.shape)
        dc = np.ones(c.shape) if mode == "lstm" else np.zeros(())
        out, back = _forward_and_backprop(x, h, c, params, lengths, dy, np.ones(h.shape), dc,
                                          **attrs)
        np.testing.assert_array_equal(out[0].numpy(), ref.output)
        grads = ctf.cudnn_rnn_backprop_v3(x, h, c, params, lengths, ref.output, ref.output_h,
                                          ref.output_c, dy, np.ones(h.shape),
                                          dc if mode == "lstm" else None, ref.reserve_space,
                                          **attrs)
        np.testing.assert_array_equal(back[0].numpy(), grads.input_backprop)
        np.testing.assert_array_equal(back[3].numpy(), grads.params_backprop)


@pytest.mark.parametrize("S", [tf.int32, tf.int64])
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_params_size_every_dtype_and_index_type(S, dtype):
    for mode, proj in MODES:
        for direction in ("unidirectional", "bidirectional"):
            got = tf.raw_ops.CudnnRNNParamsSize(num_layers=3, num_units=9, input_size=4, T=dtype,
                                                S=S, rnn_mode=mode, direction=direction,
                                                num_proj=proj)
            assert got.dtype == S and got.shape == (1,)
            assert int(got[0]) == ctf.params_size(3, 9, 4, rnn_mode=mode, direction=direction,
                                                  num_proj=proj)


# --- TF's shapes and dummies; inputs untouched ---------------------------------------------
@pytest.mark.parametrize("version", [1, 2, 3])
def test_output_shapes_dummies_and_dtypes_follow_tf(version):
    """TF's kernels: output_c (and input_c_backprop) is a scalar without a cell state, the
    inference reserve_space a scalar, host_reserved int8 [2] for a V2 training forward and a
    scalar otherwise; the training reserve_space is a vector of dtype T."""
    rng = np.random.default_rng(5)
    x, h, c, params = _np_inputs(rng, "gru", 0, 1, 1, np.float32)
    for is_training in (True, False):
        out = _forward(version, x, h, 0.0, params, np.full(N_, T_, np.int32),
                       is_training=is_training, rnn_mode="gru")
        assert out[2].shape == () and out[2].dtype == tf.float32 and float(out[2]) == 0
        assert out[3].dtype == tf.float32
        assert out[3].shape == ((out[3].shape[0],) if is_training else ())
        if version > 1:
            assert out[4].dtype == tf.int8
            assert out[4].shape == ((2,) if version == 2 and is_training else ())
    with tf.GradientTape() as tape:
        c0 = tf.constant(0.0)
        tape.watch(c0)
        y = _forward(version, x, h, c0, params, np.full(N_, T_, np.int32), rnn_mode="gru")[0]
        loss = tf.reduce_sum(y)
    dc = tape.gradient(loss, c0)
    assert dc.shape == () and float(dc) == 0


def test_inputs_and_the_reserve_are_never_modified():
    """The backprop works on a private copy of the reserve (the C ABI's backward writes into
    its reserve space): the forward's inputs and its reserve_space keep their bytes, and a
    second backprop from the same reserve gives the same gradients."""
    rng = np.random.default_rng(6)
    x, h, c, params = _np_inputs(rng, "lstm", 4, 2, 2, np.float64)
    lengths = np.array([T_, 2, 0, 5], np.int32)
    dy = rng.standard_normal((T_, N_, 8))
    dh, dc = rng.standard_normal(h.shape), rng.standard_normal(c.shape)
    arrays = [x, h, c, params, lengths, dy, dh, dc]
    copies = [a.copy() for a in arrays]
    attrs = _attrs("lstm", 4, True)
    out = _forward(3, x, h, c, params, lengths, **attrs)
    reserve = out[3].numpy().copy()
    results = []
    for _ in range(2):
        back = tf.raw_ops.CudnnRNNBackpropV3(
            input=x, input_h=h, input_c=c, params=params, sequence_lengths=lengths,
            output=out[0], output_h=out[1], output_c=out[2], output_backprop=dy,
            output_h_backprop=dh, output_c_backprop=dc, reserve_space=out[3],
            host_reserved=out[4], **attrs)
        results.append([b.numpy() for b in back])
        np.testing.assert_array_equal(out[3].numpy(), reserve)
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(arrays, copies):
        np.testing.assert_array_equal(a, b)
    # a persistent tape differentiating twice through one forward
    xt = tf.constant(x)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(xt)
        y = _forward(3, xt, h, c, params, lengths, **attrs)[0]
        loss = tf.reduce_sum(y * y)
    first, second = tape.gradient(loss, xt).numpy(), tape.gradient(loss, xt).numpy()
    np.testing.assert_array_equal(first, second)


# --- float16 / bfloat16 ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("mode,proj", [("gru", 0), ("lstm", 3)])
def test_half_types_compute_in_float32_and_round(dtype, mode, proj):
    """float16 / bfloat16: the inputs widened exactly to float32, cgru's float32 result
    rounded to the type — forward, backprop and the params ops."""
    rng = np.random.default_rng(7)
    x, h, c, params = _np_inputs(rng, mode, proj, 2, 2, np.float32, time_major=False)
    lengths = np.array([T_, 2, 4, 1], np.int32)
    attrs = _attrs(mode, proj, True)

    def half(a):
        return tf.cast(a, dtype)

    def wide(a):
        return tf.cast(half(a), tf.float32).numpy()

    ref = ctf.cudnn_rnn_v3(wide(x), wide(h), wide(c), wide(params), lengths, time_major=False,
                           **attrs)
    dy = rng.standard_normal(ref.output.shape).astype(np.float32)
    dc = half(c) if mode == "lstm" else half(np.zeros((), np.float32))
    out, back = _forward_and_backprop(half(x), half(h), half(c), half(params), lengths,
                                      half(dy), half(h), dc, time_major=False, **attrs)
    assert out[0].dtype == dtype and back[3].dtype == dtype
    np.testing.assert_array_equal(out[0].numpy(), half(ref.output).numpy())
    np.testing.assert_array_equal(out[1].numpy(), half(ref.output_h).numpy())
    grads = ctf.cudnn_rnn_backprop_v3(wide(x), wide(h), wide(c), wide(params), lengths,
                                      ref.output, ref.output_h, ref.output_c, wide(dy), wide(h),
                                      wide(c) if mode == "lstm" else None, ref.reserve_space,
                                      time_major=False, **attrs)
    np.testing.assert_array_equal(back[0].numpy(), half(grads.input_backprop).numpy())
    np.testing.assert_array_equal(back[3].numpy(), half(grads.params_backprop).numpy())
    K, B = _counts(mode, proj, 2, 2)
    w, b = _to_canonical(True, 2, H_, I_, half(params), K, B, **attrs)
    assert w[0].dtype == dtype.as_numpy_dtype
    np.testing.assert_array_equal(_to_params(True, 2, H_, I_, w, b, **attrs),
                                  half(params).numpy())


# --- 3. eager = tf.function = a SavedModel in a fresh process ----------------------------------
MODEL = '''
import numpy as np
import tensorflow as tf
import cgru.tf

I, H, P = 5, 6, 3


def make_model():
    """What a GPU machine exports: a 2-layer bidirectional GRU (CudnnRNN, time-major) feeding an
    LSTM with a projection (CudnnRNNV3, batch-major, sequence lengths); the function returns
    outputs and the gradients of a loss (TF's registered gradients: the Backprop ops)."""
    rng = np.random.default_rng(0)
    n_gru = cgru.tf.params_size(2, H, I, rnn_mode="gru", direction="bidirectional")
    n_lstm = cgru.tf.params_size(1, H, 2 * H, rnn_mode="lstm", num_proj=P)
    return Model(rng.uniform(-0.3, 0.3, n_gru), rng.uniform(-0.3, 0.3, n_lstm))


def compute(model, x, lengths):
    with tf.GradientTape() as tape:
        tape.watch(x)
        N = tf.shape(x)[0]
        zero = tf.constant(0.0, tf.float64)
        y1, _, _, _ = tf.raw_ops.CudnnRNN(input=tf.transpose(x, [1, 0, 2]),
                                          input_h=tf.zeros([4, N, H], tf.float64), input_c=zero,
                                          params=model.gru, rnn_mode="gru",
                                          direction="bidirectional")
        y2, h2, c2, _, _ = tf.raw_ops.CudnnRNNV3(
            input=tf.transpose(y1, [1, 0, 2]), input_h=tf.zeros([N, 1, P], tf.float64),
            input_c=tf.ones([N, 1, H], tf.float64), params=model.lstm, sequence_lengths=lengths,
            rnn_mode="lstm", num_proj=P, time_major=False)
        loss = tf.reduce_sum(y2 * y2) + tf.reduce_sum(c2)
    dx, dgru, dlstm = tape.gradient(loss, [x, model.gru, model.lstm])
    return {"y": y2, "h": h2, "c": c2, "dx": dx, "dgru": dgru, "dlstm": dlstm}


class Model(tf.Module):
    def __init__(self, gru, lstm):
        self.gru, self.lstm = tf.Variable(gru), tf.Variable(lstm)

    @tf.function(input_signature=[tf.TensorSpec([None, None, I], tf.float64),
                                  tf.TensorSpec([None], tf.int32)])
    def __call__(self, x, lengths):
        return compute(self, x, lengths)


def inputs(seed, N, T):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, T, I)), rng.integers(0, T + 1, N).astype(np.int32)
'''

SAVE = MODEL + '''
import sys
tf.saved_model.save(make_model(), sys.argv[1])
'''

RUN = MODEL + '''
import sys
if sys.argv[3] == "load_kernels":
    cgru.tf.load_kernels()
model = tf.saved_model.load(sys.argv[1])
x, lengths = inputs(1, 3, 7)
try:
    out = model(x, lengths)
except Exception as e:
    print(type(e).__name__ + ": " + str(e).splitlines()[0])
    sys.exit(3)
np.savez(sys.argv[2], **{k: v.numpy() for k, v in out.items()})
'''


def _model_namespace():
    ns = {}
    exec(MODEL, ns)
    return ns


def test_eager_tf_function_and_a_saved_model_in_a_fresh_process_agree(tmp_path):
    model_dir, result = tmp_path / "model", tmp_path / "out.npz"
    _run_script(SAVE, model_dir)          # tracing needs no kernel: a GPU-less export
    without = _run_script(RUN, model_dir, result, "no", check=False)
    assert without.returncode == 3, without.stderr[-3000:]
    assert "No OpKernel was registered to support Op 'CudnnRNN" in without.stdout
    assert not result.exists()
    _run_script(RUN, model_dir, result, "load_kernels")
    saved = dict(np.load(result))

    ns = _model_namespace()
    model = ns["make_model"]()
    for seed, N, T in ((1, 3, 7), (2, 5, 4)):           # tf.function: dynamic N and T
        x, lengths = ns["inputs"](seed, N, T)
        eager = {k: v.numpy() for k, v in ns["compute"](model, tf.constant(x), lengths).items()}
        graph = {k: v.numpy() for k, v in model(x, lengths).items()}
        for k in eager:
            np.testing.assert_array_equal(graph[k], eager[k], err_msg=k)
            if seed == 1:
                np.testing.assert_array_equal(saved[k], eager[k], err_msg=k)
        assert eager["y"].shape == (N, T, ns["P"])


# --- 4. tf_keras's CuDNNGRU / CuDNNLSTM -----------------------------------------------------
KERAS = '''
import json
import numpy as np
import tensorflow as tf
import cgru.tf
from tf_keras.src.saving.legacy.hdf5_format import _convert_rnn_weights   # Keras's converter

cgru.tf.load_kernels()
tf.keras.utils.set_random_seed(0)           # the layers' initializers (tf_keras)
layers = tf.compat.v1.keras.layers          # TF_USE_LEGACY_KERAS=1: tf_keras
assert type(layers.CuDNNGRU).__module__.startswith("tf_keras") or \\
    layers.CuDNNGRU.__module__.startswith("tf_keras"), layers.CuDNNGRU.__module__
rng = np.random.default_rng(0)
N, T, I, H = 6, 9, 5, 8
x = rng.standard_normal((N, T, I)).astype(np.float32)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


report = {}
cases = (("gru", layers.GRU, dict(reset_after=True, recurrent_activation="sigmoid"),
          layers.CuDNNGRU),
         ("lstm", layers.LSTM, dict(recurrent_activation="sigmoid"), layers.CuDNNLSTM))
for name, std_cls, kw, cudnn_cls in cases:
    std = std_cls(H, return_sequences=True, return_state=True, **kw)
    std(x)
    std.set_weights([w + rng.standard_normal(w.shape).astype(np.float32) * 0.3
                     for w in std.get_weights()])
    cudnn = cudnn_cls(H, return_sequences=True, return_state=True)
    cudnn(x)
    cudnn.set_weights(_convert_rnn_weights(cudnn, std.get_weights()))
    weights = [rng.standard_normal(o.shape).astype(np.float32) for o in std(x)]
    with tf.GradientTape(persistent=True) as tape:
        out_std, out_cudnn = std(x), cudnn(x)
        loss_std = sum(tf.reduce_sum(o * w) for o, w in zip(out_std, weights))
        loss_cudnn = sum(tf.reduce_sum(o * w) for o, w in zip(out_cudnn, weights))
    g_std = [g.numpy() for g in tape.gradient(loss_std, std.trainable_weights)]
    g_cudnn = [g.numpy() for g in tape.gradient(loss_cudnn, cudnn.trainable_weights)]
    # the converter is a permutation of the weights, so it maps gradients too — except the
    # LSTM's bias, which cuDNN splits in two halves that each get the whole gradient
    want = _convert_rnn_weights(cudnn, g_std)
    if name == "lstm":
        want[2] = np.tile(g_std[2], 2)
    report[name] = {"outputs": [rel(a, b) for a, b in zip(out_cudnn, out_std)],
                    "gradients": [rel(a, b) for a, b in zip(g_cudnn, want)]}

    target = rng.standard_normal((N, 1)).astype(np.float32)
    model = tf.compat.v1.keras.Sequential([cudnn_cls(H), layers.Dense(1)])
    model.compile(optimizer=tf.compat.v1.keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(x, target, epochs=8, batch_size=3, shuffle=False, verbose=0)
    report[name]["losses"] = [float(v) for v in history.history["loss"]]
print(json.dumps(report))
'''


def test_tf_keras_cudnn_layers_match_the_standard_layers_and_train():
    pytest.importorskip("tf_keras")
    proc = _run_script(KERAS, env=_env(TF_USE_LEGACY_KERAS="1"))
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("gru", "lstm"):
        r = report[name]
        assert max(r["outputs"]) <= 2e-5, (name, r["outputs"])
        assert max(r["gradients"]) <= 2e-5, (name, r["gradients"])
        assert r["losses"][-1] < 0.8 * r["losses"][0], (name, r["losses"])


# --- 5. threads -------------------------------------------------------------------------------
THREADS = '''
import json, sys, threading
import numpy as np
import tensorflow as tf
import cgru.tf

tf.config.threading.set_inter_op_parallelism_threads(4)
cgru.tf.load_kernels()
rng = np.random.default_rng(0)
K, N, T, I, H, P = 6, 5, 8, 4, 7, 3
attrs = dict(rnn_mode="lstm", direction="bidirectional", num_proj=P, time_major=False)
params = rng.standard_normal(cgru.tf.params_size(2, H, I, rnn_mode="lstm", num_proj=P,
                                                 direction="bidirectional")) * 0.3
problems = [(rng.standard_normal((N, T, I)), rng.standard_normal((N, 4, P)),
             rng.standard_normal((N, 4, H)), rng.integers(0, T + 1, N).astype(np.int32))
            for _ in range(K)]


def forward(x, h, c, lengths):
    return tf.raw_ops.CudnnRNNV3(input=x, input_h=h, input_c=c, params=params,
                                 sequence_lengths=lengths, **attrs)


def run(i):
    x, h, c, lengths = problems[i]
    y, hy, cy, reserve, host = forward(x, h, c, lengths)
    back = tf.raw_ops.CudnnRNNBackpropV3(
        input=x, input_h=h, input_c=c, params=params, sequence_lengths=lengths, output=y,
        output_h=hy, output_c=cy, output_backprop=y, output_h_backprop=hy, output_c_backprop=cy,
        reserve_space=reserve, host_reserved=host, **attrs)
    return [a.numpy() for a in (y, hy, cy, *back)]


alone = [run(i) for i in range(K)]
barrier = threading.Barrier(K)
together = [None] * K


def worker(i):
    barrier.wait()
    together[i] = [run(i) for _ in range(3)]


threads = [threading.Thread(target=worker, args=(i,)) for i in range(K)]
for t in threads:
    t.start()
for t in threads:
    t.join()
threads_equal = all(np.array_equal(a, b) for i in range(K) for rep in together[i]
                    for a, b in zip(rep, alone[i]))


@tf.function
def in_one_graph():          # K independent ops: TF's inter-op threads run them at once
    return [forward(*p)[0] for p in problems]


graph_equal = all(np.array_equal(a.numpy(), alone[i][0]) for i, a in enumerate(in_one_graph()))
print(json.dumps({"threads": threads_equal, "graph": graph_equal}))

# problem 0's training forward, for a backprop in another process
x, h, c, lengths = problems[0]
y, hy, cy, reserve, host = forward(x, h, c, lengths)
np.savez(sys.argv[1], x=x, h=h, c=c, lengths=lengths, params=params, y=y.numpy(),
         hy=hy.numpy(), cy=cy.numpy(), reserve=reserve.numpy(), host=host.numpy(),
         attrs=json.dumps(attrs))
'''


@pytest.fixture(scope="module")
def threads_process(tmp_path_factory):
    """THREADS run once in a fresh process: its printed verdict and the path of its saved
    forward (one subprocess serves both tests below; starting TensorFlow costs seconds)."""
    path = tmp_path_factory.mktemp("threads") / "forward.npz"
    proc = _run_script(THREADS, path)
    return json.loads(proc.stdout.strip().splitlines()[-1]), path


def test_ops_from_several_threads_at_once_are_bitwise_equal(threads_process):
    verdict, _ = threads_process
    assert verdict == {"threads": True, "graph": True}


def test_a_reserve_from_another_process_is_refused(threads_process):
    """The seal's key is drawn once per process: a reserve_space written elsewhere (same inputs,
    same library; THREADS' process) is refused, as the C ABI's reserve spaces are; this
    process's own forward of the same call is accepted.  (Beside the test above, so that
    pytest-xdist's load scheduling tends to give both, and the one subprocess, to one worker.)"""
    f = np.load(threads_process[1])
    attrs = json.loads(str(f["attrs"]))
    call = dict(input=f["x"], input_h=f["h"], input_c=f["c"], params=f["params"],
                sequence_lengths=f["lengths"], **attrs)
    args = dict(call, output=f["y"], output_h=f["hy"], output_c=f["cy"], output_backprop=f["y"],
                output_h_backprop=f["hy"], output_c_backprop=f["cy"], host_reserved=f["host"])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=_NOT_VERIFIED + r".* or written in another process"):
        tf.raw_ops.CudnnRNNBackpropV3(**args, reserve_space=f["reserve"])
    here = tf.raw_ops.CudnnRNNV3(**call)
    np.testing.assert_array_equal(here[0].numpy(), f["y"])
    tf.raw_ops.CudnnRNNBackpropV3(**args, reserve_space=here[3])


# --- 6. errors --------------------------------------------------------------------------------
@pytest.fixture
def small():
    """A valid LSTM V3 call (bidirectional, num_proj=3) and its training forward."""
    rng = np.random.default_rng(8)
    x, h, c, params = _np_inputs(rng, "lstm", 3, 2, 2, np.float64)
    lengths = np.array([T_, 1, 0, 4], np.int32)
    attrs = _attrs("lstm", 3, True)
    out = _forward(3, x, h, c, params, lengths, **attrs)
    return dict(x=x, h=h, c=c, params=params, lengths=lengths, attrs=attrs, out=out,
                dy=np.ones(out[0].shape), dh=np.ones(h.shape), dc=np.ones(c.shape))


def _backprop(s, **over):
    args = dict(input=s["x"], input_h=s["h"], input_c=s["c"], params=s["params"],
                sequence_lengths=s["lengths"], output=s["out"][0], output_h=s["out"][1],
                output_c=s["out"][2], output_backprop=s["dy"], output_h_backprop=s["dh"],
                output_c_backprop=s["dc"], reserve_space=s["out"][3],
                host_reserved=s["out"][4], **s["attrs"])
    args.update(over)
    return tf.raw_ops.CudnnRNNBackpropV3(**args)


def _v3(s, **over):
    args = dict(input=s["x"], input_h=s["h"], input_c=s["c"], params=s["params"],
                sequence_lengths=s["lengths"], **s["attrs"])
    args.update(over)
    return tf.raw_ops.CudnnRNNV3(**args)


BAD_FORWARD = [
    (dict(params=np.zeros(10)), r"Invalid params size: expected a 1-D array of \d+ elements"),
    (dict(input=np.zeros((6, 4))), r"RNN input must be a 3-D array \[T, N, I\]"),
    (dict(input=np.zeros((0, 4, 5))), r"input: expected max_seq_length ≥ 1"),
    (dict(input_h=np.zeros((4, 3, 3))), r"Invalid input_h shape: \[4,3,3\]"),
    (dict(input_h=np.zeros((3, 4, 3))), r"L·D a positive multiple of D=2"),
    (dict(input_c=np.zeros((4, 4, 2))), r"Invalid input_c shape: \[4,4,2\]"),
    (dict(sequence_lengths=np.array([6, 7, 0, 1], np.int32)),
     r"sequence_lengths: expected values in \[0, max_seq_length=6\], got "
     r"sequence_lengths\[1\] = 7"),
    (dict(sequence_lengths=np.array([6, 1], np.int32)), r"sequence_lengths: expected shape \[4\]"),
    (dict(rnn_mode="gru"), r"num_proj: expected 0 for rnn_mode='gru'"),
    (dict(dropout=1.5), r"dropout: expected a float in \[0, 1\)"),
    (dict(input_mode="skip_input"), r"input_mode='skip_input' needs input_size == num_units"),
]


@pytest.mark.parametrize("over,match", BAD_FORWARD, ids=[m[:30] for _, m in BAD_FORWARD])
def test_bad_forward_inputs_are_tf_errors_naming_them(small, over, match):
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        _v3(small, **over)


def test_bad_backprop_inputs_and_foreign_reserves_are_refused(small):
    s = small
    cases = [
        (dict(output_backprop=np.ones((6, 4, 5))), r"Invalid output_backprop shape"),
        (dict(output_c_backprop=np.ones((4, 4, 3))), r"Invalid output_c_backprop shape"),
        (dict(output_h=np.ones((4, 4, 7))), r"Invalid output_h shape"),
        (dict(reserve_space=_v3(s, is_training=False)[3]),
         r"reserve_space: empty — it comes from a forward with is_training=False"),
        (dict(input=s["x"] + 1e-9),
         r"reserve_space: comes from a forward call with a different input \(input\[0,0,0\] is "),
        (dict(params=s["params"] * 1.5),
         r"reserve_space: written by a forward with a different params \(weights\)"),
        (dict(input_c=s["c"][::-1].copy()),
         r"reserve_space: comes from a forward call with a different input_c \(input_c\[0,0,0\]"),
        (dict(sequence_lengths=np.array([6, 1, 0, 5], np.int32)),
         r"reserve_space: comes from a forward call with a different sequence_lengths "
         r"\(sequence_lengths\[3\] is 5 here, 4 in the forward\); pass the sequence_lengths of "
         r"the forward that wrote reserve_space"),
        (dict(dropout=0.5), r"reserve_space: the forward ran with a different dropout"),
        (dict(reserve_space=s["out"][3][:-1]), r"reserve_space: expected \d+ elements"),
        (dict(reserve_space=tf.random.uniform(s["out"][3].shape, dtype=tf.float64)),
         r"reserve_space: not a cgru reserve space \(bad header\)"),
        (dict(reserve_space=tf.zeros([3], tf.float64)), r"reserve_space: .* is too small"),
    ]
    for over, match in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            _backprop(s, **over)
    _backprop(s, seed=99, seed2=3)         # seeds count only with dropout (as in cgru.tf)
    attrs = dict(s["attrs"], dropout=0.25, seed=1)
    fwd = _v3(s, **attrs)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"different seed than this backprop"):
        _backprop(s, output=fwd[0], output_h=fwd[1], output_c=fwd[2], reserve_space=fwd[3],
                  **dict(attrs, seed=2))


def test_backprop_refuses_a_reserve_of_the_other_layout():
    """T = N = L·D: both layouts have the same shapes, only the reserve tells them apart."""
    rng = np.random.default_rng(9)
    x, h, c, params = _np_inputs(rng, "gru", 0, 2, 2, np.float64, T=4, N=4)
    attrs = _attrs("gru", 0, True)
    lengths = np.array([4, 2, 3, 1], np.int32)
    out = _forward(3, x, h, 0.0, params, lengths, time_major=False, **attrs)
    args = dict(input=x, input_h=h, input_c=0.0, params=params, sequence_lengths=lengths,
                output=out[0], output_h=out[1], output_c=out[2], output_backprop=out[0],
                output_h_backprop=out[1], output_c_backprop=out[2], reserve_space=out[3],
                host_reserved=out[4], **attrs)
    tf.raw_ops.CudnnRNNBackpropV3(**args, time_major=False)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"reserve_space: the forward ran with a different layout "
                             r"\(time_major=False\) than this backprop call \(time_major=True\)"):
        tf.raw_ops.CudnnRNNBackpropV3(**args, time_major=True)


# --- the reserve's binding: exact, and sealed -------------------------------------------------
# The forward's reserve_space used to record 64-bit multiply-rotate digests of input, input_h,
# input_c, params and sequence_lengths (docs/tf_kernels.md tells what replaced them).  Anyone can
# evaluate such a hash, and each of its lanes is invertible, so two inputs with one digest are
# easy to craft.  The model below is that removed hash, kept to build such pairs: the backprop
# must refuse them now that it compares bytes.
_MASK64 = (1 << 64) - 1
_OLD_C1, _OLD_C2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9
_OLD_LANES = (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89)


def _rotl64(v, r):
    return ((v << r) | (v >> (64 - r))) & _MASK64


def _old_mix(lane, word):
    return (_rotl64(lane ^ ((word * _OLD_C1) & _MASK64), 29) * _OLD_C2) & _MASK64


def _old_digest(data):
    """The removed reserve digest of ``data`` (bytes): four lanes over 32-byte blocks, then the
    remaining 8-byte words, the tail bytes and the length, then a final mix."""
    n = len(data)
    word = lambda k: int.from_bytes(data[k:k + 8], "little")  # noqa: E731
    blocks_end, words_end = n - n % 32, n - n % 8
    lanes = list(_OLD_LANES)
    for i in range(0, blocks_end, 32):
        lanes = [_old_mix(lanes[k], word(i + 8 * k)) for k in range(4)]
    h = lanes[0] ^ _rotl64(lanes[1], 17) ^ _rotl64(lanes[2], 31) ^ _rotl64(lanes[3], 47)
    for i in range(blocks_end, words_end, 8):
        h = _old_mix(h, word(i))
    h = _old_mix(_old_mix(h, int.from_bytes(data[words_end:], "little")), n)
    h ^= h >> 31
    return ((h * 0x94D049BB133111EB) & _MASK64) ^ (h >> 29)


def _old_digest_collision(a):
    """An array of ``a``'s dtype and shape, different from ``a``, with the same old digest:
    lane 0 reads word 0 of block 0, then word 0 of block 1; flip a bit of the first and solve
    the second so that the lane ends where it did (both multipliers are odd, hence invertible
    modulo 2^64)."""
    data = bytearray(a.tobytes())
    assert len(data) >= 64
    w0, w1 = (int.from_bytes(data[k:k + 8], "little") for k in (0, 32))
    after = _old_mix(_old_mix(_OLD_LANES[0], w0), w1)
    w0 ^= 1 << 51
    mid = _old_mix(_OLD_LANES[0], w0)
    t = (after * pow(_OLD_C2, -1, 1 << 64)) & _MASK64
    w1 = (((t >> 29) | (t << 35)) & _MASK64 ^ mid) * pow(_OLD_C1, -1, 1 << 64) & _MASK64
    data[0:8], data[32:40] = w0.to_bytes(8, "little"), w1.to_bytes(8, "little")
    out = np.frombuffer(bytes(data), a.dtype).reshape(a.shape)
    assert not np.array_equal(out, a) and _old_digest(out.tobytes()) == _old_digest(a.tobytes())
    return out


_C_ABI_MAGIC = 0x49424143_75726763  # the C ABI reserve space's first int64 ("cgruCABI")
_NOT_VERIFIED = r"reserve_space: its record of the forward does not verify"


def _bytes_of(t):
    return t.numpy().view(np.uint8).copy()


def _as_reserve(raw):
    """A reserve_space of dtype float64 holding the bytes ``raw``."""
    return tf.constant(np.frombuffer(raw.tobytes(), np.float64))


def _c_abi_start(raw):
    """Where the C ABI's reserve space starts in a reserve_space's bytes: the first 64-byte
    aligned int64 holding its magic number (its header is cgru/capi/__init__.py's)."""
    words = raw[:raw.size - raw.size % 8].view(np.int64)
    hits = np.flatnonzero(words[::8] == _C_ABI_MAGIC)
    assert hits.size, "no C ABI reserve space found"
    return int(hits[0]) * 64


def test_inputs_with_the_old_digest_of_the_forwards_are_refused(small):
    """input, input_h and input_c crafted to keep the removed digest (each differs from the
    forward's in two elements) are refused, naming the first difference; before, the backprop
    accepted them and computed the gradient at the forward's arrays."""
    s = small
    for name, key in (("input", "x"), ("input_h", "h"), ("input_c", "c")):
        crafted = _old_digest_collision(s[key])
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"reserve_space: comes from a forward call with a different "
                                 rf"{name} \({name}\[0,0,0\] is "):
            _backprop(s, **{name: crafted})
    _backprop(s)


def _changed(a, index):
    """``a`` with element ``index`` moved to the next representable value (lengths: by one)."""
    out = a.copy()
    if out.dtype.kind == "i":
        out[index] = out[index] - 1 if out[index] > 0 else out[index] + 1
    else:
        out[index] = np.nextafter(out[index], np.inf)
    return out


@pytest.mark.parametrize("name,key", [("input", "x"), ("input_h", "h"), ("input_c", "c"),
                                      ("sequence_lengths", "lengths"), ("params", "params")])
def test_any_single_element_change_of_a_backprop_argument_is_refused(small, name, key):
    """Every element of input, input_h, input_c and sequence_lengths, changed by one step on its
    own (one ulp; a length by one), is refused, naming the argument; so is one element of
    params in each 32-element stretch (the engine's keyed MAC of the weights refuses them; a
    sample keeps the test fast)."""
    s = small
    match = (r"reserve_space: written by a forward with a different params" if name == "params"
             else rf"reserve_space: comes from a forward call with a different {name} \({name}\[")
    indices = list(np.ndindex(s[key].shape))
    if name == "params":
        indices = indices[::32] + [indices[-1]]
    for index in indices:
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            _backprop(s, **{name: _changed(s[key], index)})


def _index_pattern(index):
    return r"\[" + ",".join(map(str, index)) + r"\]"


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32])
def test_one_ulp_of_a_narrow_input_is_refused(dtype):
    """float16 / bfloat16 inputs are compared as the forward handed them to the C ABI (widened
    to float32, exactly): one ulp of one element, or the sign of a zero, is refused."""
    rng = np.random.default_rng(21)
    x, h, c, params = _np_inputs(rng, "gru", 0, 1, 1, np.float32)
    x[2, 1, 3] = 0.0
    xs, hs, ps = (tf.cast(a, dtype) for a in (x, h, params))
    none = tf.zeros([], dtype)
    out = _forward(1, xs, hs, none, ps, rnn_mode="gru")
    args = dict(input_h=hs, input_c=none, params=ps, output=out[0], output_h=out[1],
                output_c=out[2], output_backprop=out[0], output_h_backprop=out[1],
                output_c_backprop=out[2], reserve_space=out[3], rnn_mode="gru")
    tf.raw_ops.CudnnRNNBackprop(input=xs, **args)
    unsigned = tf.uint16 if dtype.size == 2 else tf.uint32
    bits = tf.bitcast(xs, unsigned).numpy()
    sign = 1 << (8 * dtype.size - 1)
    for index, flip in (((0, 0, 0), 1), ((5, 3, 4), 1), ((2, 1, 3), sign)):
        other = bits.copy()
        other[index] ^= flip
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"comes from a forward call with a different input \(input"
                                 + _index_pattern(index)):
            tf.raw_ops.CudnnRNNBackprop(input=tf.bitcast(tf.constant(other), dtype), **args)


def test_an_edited_reserve_record_is_refused(small):
    """One bit changed in any 8-byte word of the header the TF kernels put in front of the C
    ABI's reserve space (magic, version, region sizes, shapes, attributes, seeds, the seal) or
    of the C ABI's and the engine's headers it seals, or in any 64-byte line of its copies of
    input_h, input_c and sequence_lengths (padding included), is refused: the record is sealed
    as a whole.  (The magic and version words, and the copies' offset, are read first.)"""
    s = small
    raw = _bytes_of(s["out"][3])
    start = _c_abi_start(raw)
    assert start >= 256  # the header (then the copies)
    offsets = [*range(0, 256, 8), *range(256, start, 64), *range(start, start + 256 + 128, 8)]
    first_read = {0: r"reserve_space: not a cgru reserve space \(bad header\)",
                  8: r"reserve_space: not a cgru reserve space \(bad header\)",
                  16: r"reserve_space: bad header \(its C ABI reserve space would start at byte"}
    for offset in offsets:
        edited = raw.copy()
        edited[offset] ^= 1
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=first_read.get(offset, _NOT_VERIFIED)):
            _backprop(s, reserve_space=_as_reserve(edited))
    _backprop(s, reserve_space=_as_reserve(raw))


def test_a_record_moved_onto_another_forwards_computation_is_refused(small):
    """Two forwards that differ only in input_h (and input_c): the record (header and copies) of
    one in front of the other's C ABI reserve space is refused for either call's arguments —
    before, the backprop accepted it and differentiated at the other forward's states."""
    s = small
    rng = np.random.default_rng(22)
    h2, c2 = rng.standard_normal(s["h"].shape), rng.standard_normal(s["c"].shape)
    other = _v3(s, input_h=h2, input_c=c2)
    mine, theirs = _bytes_of(s["out"][3]), _bytes_of(other[3])
    start = _c_abi_start(mine)
    assert _c_abi_start(theirs) == start and mine.size == theirs.size
    spliced = np.concatenate([theirs[:start], mine[start:]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=_NOT_VERIFIED):
        _backprop(s, input_h=h2, input_c=c2, output=other[0], output_h=other[1],
                  output_c=other[2], reserve_space=_as_reserve(spliced))
    spliced = np.concatenate([mine[:start], theirs[start:]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=_NOT_VERIFIED):
        _backprop(s, reserve_space=_as_reserve(spliced))


def test_the_c_abi_copy_of_input_is_bound_to_the_forward(small):
    """input is compared with the C ABI's copy of x; that copy is the engine's to vouch for: one
    edited element, with input edited the same way, is refused by the engine's MAC of x."""
    s = small
    raw = _bytes_of(s["out"][3])
    start = _c_abi_start(raw)
    x_at = start + int(raw[start + 40:start + 48].view(np.int64)[0])  # header slot 5
    np.testing.assert_array_equal(raw[x_at:x_at + s["x"].nbytes].view(np.float64),
                                  s["x"].reshape(-1))
    x = _changed(s["x"], (1, 2, 3))
    edited = raw.copy()
    edited[x_at:x_at + x.nbytes] = x.reshape(-1).view(np.uint8)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"reserve_space: written by a forward with a different x"):
        _backprop(s, input=x, reserve_space=_as_reserve(edited))


def test_backprop_refuses_a_mix_of_v3_and_v2_reserves():
    """A V3 forward records its sequence_lengths, a V1 / V2 forward none: a backprop of the
    other kind is refused, in TF's words."""
    rng = np.random.default_rng(23)
    x, h, c, params = _np_inputs(rng, "gru", 0, 1, 1, np.float64)
    attrs = _attrs("gru", 0, False)
    full = np.full(N_, T_, np.int32)
    v3 = _forward(3, x, h, 0.0, params, full, **attrs)
    v2 = _forward(2, x, h, 0.0, params, **attrs)
    common = dict(input=x, input_h=h, input_c=0.0, params=params, output=v2[0],
                  output_h=v2[1], output_c=v2[2], output_backprop=v2[0],
                  output_h_backprop=v2[1], output_c_backprop=v2[2], **attrs)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"reserve_space: the forward ran with sequence_lengths \(CudnnRNNV3 "
                             r"takes them\) and this backprop call without them"):
        tf.raw_ops.CudnnRNNBackpropV2(**common, reserve_space=v3[3], host_reserved=v3[4])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"reserve_space: the forward ran without sequence_lengths"):
        tf.raw_ops.CudnnRNNBackpropV3(**common, sequence_lengths=full, reserve_space=v2[3],
                                      host_reserved=v2[4])


def test_bad_params_op_inputs_are_tf_errors_naming_them():
    sizes = dict(num_layers=2, num_units=7, input_size=5)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"num_layers: expected a positive int, got 0"):
        tf.raw_ops.CudnnRNNParamsSize(**dict(sizes, num_layers=0), T=tf.float32, S=tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"num_units: expected an int32 scalar"):
        tf.raw_ops.CudnnRNNParamsSize(**dict(sizes, num_units=[7]), T=tf.float32, S=tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"do not fit the output dtype S=int32"):
        tf.raw_ops.CudnnRNNParamsSize(num_layers=2, num_units=40000, input_size=40000,
                                      T=tf.float32, S=tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"num_proj: expected at most "
                                                             r"num_units=7"):
        tf.raw_ops.CudnnRNNParamsSize(**sizes, T=tf.float32, S=tf.int32, num_proj=8)
    assert _params_size(2, 40000, 40000, np.float32, S=tf.int64) == ctf.params_size(2, 40000,
                                                                                     40000)
    params = np.zeros(ctf.params_size(2, 7, 5, rnn_mode="gru"), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"num_params: expected 12 \(6 per "
                                                             r"layer and direction"):
        tf.raw_ops.CudnnRNNParamsToCanonical(**sizes, params=params, num_params=6, rnn_mode="gru")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"Invalid params size"):
        tf.raw_ops.CudnnRNNParamsToCanonical(**sizes, params=params[1:], num_params=12,
                                             rnn_mode="gru")
    w, b = ctf.params_to_canonical(2, 7, 5, params, rnn_mode="gru")
    w[3] = np.zeros((7, 6), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"weights\[3\] R_r \(layer 0, direction 0, linLayerID 3\): Params "
                             r"size mismatch: expected shape \[7,7\]"):
        tf.raw_ops.CudnnRNNCanonicalToParams(**sizes, weights=w, biases=b, rnn_mode="gru")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"num_params_biases: expected 16"):
        tf.raw_ops.CudnnRNNCanonicalToParamsV2(**sizes, weights=w[:9] * 2, biases=b[:8],
                                               rnn_mode="lstm", num_proj=3)
    # as TF's kernel, only the element count of a canonical array matters
    w, b = ctf.params_to_canonical(2, 7, 5, params + 1, rnn_mode="gru")
    flat = [a.ravel() for a in w]
    np.testing.assert_array_equal(
        tf.raw_ops.CudnnRNNCanonicalToParams(**sizes, weights=flat, biases=b, rnn_mode="gru"),
        params + 1)


# --- 7. the loader -----------------------------------------------------------------------------
FAKE_CXX = '''
import os, sys, time
args = sys.argv[1:]
if "--version" in args:
    print("fake-c++ 1.0")
    sys.exit(0)
out = args[args.index("-o") + 1]
with open(os.environ["FAKE_CXX_LOG"], "a") as f:
    f.write(f"{os.getpid()}\\n")
with open(out, "wb") as f:
    f.write(b"partial")
time.sleep(float(os.environ.get("FAKE_CXX_SLEEP", "0")))
if os.environ.get("FAKE_CXX_FAIL"):
    print("fake.cc:1:1: error: boom", file=sys.stderr)
    sys.exit(1)
with open(out, "ab") as f:
    f.write(b" library")
'''

RACE = '''
import os, sys, time
import tensorflow
from cgru import tf_kernels
ready, go = sys.argv[1], sys.argv[2]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
print(tf_kernels.library_path())
'''


@pytest.fixture
def fake_cxx(tmp_path, monkeypatch):
    """A stand-in compiler (counts its builds in FAKE_CXX_LOG) and a fresh cache directory."""
    script = tmp_path / "fake_cxx.py"
    script.write_text(FAKE_CXX)
    log = tmp_path / "builds.log"
    env = dict(CXX=f"{sys.executable} {script}", FAKE_CXX_LOG=str(log),
               CGRU_CACHE_DIR=str(tmp_path / "cache"))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env, log


def _builds(log):
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CGRU_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "b"))
    assert tf_kernels.cache_dir() == str(tmp_path / "a")
    monkeypatch.delenv("CGRU_CACHE_DIR")
    assert tf_kernels.cache_dir() == str(tmp_path / "b" / "cgru")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tf_kernels.cache_dir() == str(tmp_path / "home" / ".cache" / "cgru")


def test_the_cache_is_keyed_by_the_build_configuration(kernels):
    config = tf_kernels.build_config()
    assert config["tensorflow"] == tf.__version__
    assert "-D_GLIBCXX_USE_CXX11_ABI" in " ".join(config["compile_flags"])   # the C++ ABI
    directory = os.path.join(tf_kernels.cache_dir(), "tf_kernels", tf_kernels._key(config))
    assert kernels == os.path.join(directory, tf_kernels.LIBRARY)
    with open(os.path.join(directory, "build.json")) as f:
        assert json.load(f) == config
    for field, value in (("tensorflow", "0.0"), ("compile_flags", []), ("link_flags", []),
                         ("compiler_version", "other"), ("sources", "0"),
                         ("cgru_libdir", "/elsewhere")):
        assert tf_kernels._key(dict(config, **{field: value})) != tf_kernels._key(config)


def test_concurrent_processes_build_once(fake_cxx, tmp_path):
    """Two processes asking for the library at the same moment: one compiles (under the file
    lock), the other waits and gets the same, complete library."""
    env, log = fake_cxx
    env = _env(**env, FAKE_CXX_SLEEP="2")
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path / f"ready{i}"), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=PACKAGE_DIR) for i in range(2)]
    try:
        import time
        deadline = time.monotonic() + TIMEOUT
        while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        go.touch()
        outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), outs
    paths = {o[0].strip() for o in outs}
    assert len(paths) == 1 and _builds(log) == 1
    path = paths.pop()
    with open(path, "rb") as f:
        assert f.read() == b"partial library"
    assert [n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")] == []


def test_a_failed_build_leaves_no_library_and_says_why(fake_cxx, monkeypatch):
    env, log = fake_cxx
    monkeypatch.setenv("FAKE_CXX_FAIL", "1")
    with pytest.raises(tf_kernels.BuildError, match=r"(?s)failed \(exit status 1\).*error: "
                                                    r"boom.*full log: .*build\.log"):
        tf_kernels.library_path()
    directory = os.path.join(env["CGRU_CACHE_DIR"], "tf_kernels")
    (key,) = os.listdir(directory)
    assert sorted(os.listdir(os.path.join(directory, key))) == ["build.lock", "build.log"]
    monkeypatch.delenv("FAKE_CXX_FAIL")           # the failure is not cached
    path = tf_kernels.library_path()
    assert _builds(log) == 2 and open(path, "rb").read() == b"partial library"
    assert tf_kernels.library_path() == path and _builds(log) == 2


def test_missing_compiler_or_headers_say_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(tf_kernels.BuildError, match=r"CXX='/nonexistent/c\+\+'.*install a C\+\+17 "
                                                    r"compiler \(Debian/Ubuntu: apt-get install g\+\+"):
        tf_kernels.library_path()
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(tf_kernels.BuildError, match=r"no C\+\+ compiler found.*apt-get install"):
        tf_kernels.library_path()
    monkeypatch.undo()
    monkeypatch.setattr(tf.sysconfig, "get_include", lambda: str(tmp_path))
    with pytest.raises(tf_kernels.BuildError, match=r"TensorFlow's C\+\+ headers are missing.*"
                                                    r"pip install tensorflow-cpu"):
        tf_kernels.library_path()


def test_load_kernels_is_idempotent(kernels, monkeypatch):
    loads = []
    monkeypatch.setattr(tf, "load_op_library", loads.append)
    assert ctf.load_kernels() == kernels and loads == []           # loaded once already
    monkeypatch.setattr(tf_kernels, "_loaded", None)               # as in a fresh process
    assert ctf.load_kernels() == kernels and ctf.load_kernels() == kernels
    assert loads == [kernels]


def test_cli_prints_the_library_path(kernels, monkeypatch, capsys):
    proc = subprocess.run([sys.executable, "-m", "cgru", "--tf-kernels"], capture_output=True,
                          text=True, timeout=TIMEOUT, env=_env(), cwd=PACKAGE_DIR)
    assert proc.returncode == 0 and proc.stdout.strip() == kernels, proc.stderr[-3000:]
    from cgru.__main__ import main
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert main(["--tf-kernels"]) == 1
    assert "install a C++17 compiler" in capsys.readouterr().err


def test_an_unwritable_cache_says_so(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("CGRU_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(tf_kernels.BuildError, match=r"cannot create the cache directory .* set "
                                                    r"CGRU_CACHE_DIR to a writable directory"):
        tf_kernels.library_path()


def test_import_cgru_tf_does_not_import_tensorflow_and_says_what_to_install():
    proc = _run_script("import sys, cgru.tf; print('tensorflow' in sys.modules)")
    assert proc.stdout.strip() == "False"
    proc = _run_script("import sys; sys.modules['tensorflow'] = None\n"
                       "import cgru.tf\ncgru.tf.load_kernels()", check=False)
    assert proc.returncode == 1 and 'pip install "cgru[tf]"' in proc.stderr


# --- TensorFlow's C API in a program without Python --------------------------------------------
C_HOST = r"""/* TensorFlow's C API in a program without Python: load cgru's CudnnRNN CPU kernels with
 * TF_LoadLibrary and run a GRU forward (CudnnRNN) eagerly; print the output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorflow/c/c_api.h"
#include "tensorflow/c/eager/c_api.h"

enum { T = 3, N = 2, I = 4, H = 5, P = 3 * (H * I + H * H + 2 * H) };

static void check(TF_Status *s, const char *what)
{
    if (TF_GetCode(s) != TF_OK) {
        fprintf(stderr, "%s: %s\n", what, TF_Message(s));
        exit(1);
    }
}

static TFE_TensorHandle *tensor(const float *data, const int64_t *dims, int rank, TF_Status *s)
{
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)dims[i];
    TF_Tensor *t = TF_AllocateTensor(TF_FLOAT, dims, rank, n * sizeof(float));
    memcpy(TF_TensorData(t), data, n * sizeof(float));
    TFE_TensorHandle *h = TFE_NewTensorHandle(t, s);
    TF_DeleteTensor(t);
    check(s, "TFE_NewTensorHandle");
    return h;
}

int main(int argc, char **argv)
{
    TF_Status *s = TF_NewStatus();
    if (argc != 2) {
        fprintf(stderr, "usage: %s libcgru_tf_kernels.so\n", argv[0]);
        return 2;
    }
    TF_LoadLibrary(argv[1], s);
    check(s, "TF_LoadLibrary");
    TFE_ContextOptions *options = TFE_NewContextOptions();
    TFE_Context *ctx = TFE_NewContext(options, s);
    check(s, "TFE_NewContext");

    static float x[T * N * I], h[N * H], params[P], zero[1];
    for (int i = 0; i < T * N * I; i++)
        x[i] = 0.1f * (float)(i % 7) - 0.3f;
    for (int i = 0; i < P; i++)
        params[i] = 0.05f * (float)(i % 11) - 0.25f;
    const int64_t x_dims[] = {T, N, I}, h_dims[] = {1, N, H}, p_dims[] = {P};
    TFE_TensorHandle *inputs[] = {tensor(x, x_dims, 3, s), tensor(h, h_dims, 3, s),
                                  tensor(zero, NULL, 0, s), tensor(params, p_dims, 1, s)};

    TFE_Op *op = TFE_NewOp(ctx, "CudnnRNN", s);
    check(s, "TFE_NewOp");
    for (int i = 0; i < 4; i++) {
        TFE_OpAddInput(op, inputs[i], s);
        check(s, "TFE_OpAddInput");
    }
    TFE_OpSetAttrType(op, "T", TF_FLOAT);
    TFE_OpSetAttrString(op, "rnn_mode", "gru", 3);
    TFE_OpSetAttrBool(op, "is_training", 0);
    TFE_TensorHandle *outputs[4];
    int num_outputs = 4;
    TFE_Execute(op, outputs, &num_outputs, s);
    check(s, "TFE_Execute CudnnRNN");

    TF_Tensor *y = TFE_TensorHandleResolve(outputs[0], s);
    check(s, "TFE_TensorHandleResolve");
    const float *v = TF_TensorData(y);
    for (int i = 0; i < T * N * H; i++)
        printf("%.9g\n", (double)v[i]);
    TF_DeleteTensor(y);
    return 0;
}
"""


def test_tf_c_api_in_a_program_without_python_runs_the_kernels(kernels, tmp_path):
    """A C program on TensorFlow's C API (the pip wheel's libtensorflow_cc) loads the library
    with TF_LoadLibrary and runs CudnnRNN eagerly; libcgru starts the Python runtime itself.
    The output equals cgru.tf's bitwise.  The program links the system libcrypto ahead of
    TensorFlow's libraries: libtensorflow_framework exports BoringSSL's symbols, which would
    otherwise capture the calls of the OpenSSL that Python's hashlib loads (docs/tf_kernels.md)."""
    import ctypes.util
    import shutil
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    tf_dir = os.path.dirname(tf.sysconfig.get_lib() + "/")
    if not os.path.isfile(os.path.join(tf_dir, "libtensorflow_cc.so.2")):
        pytest.skip("this TensorFlow has no libtensorflow_cc.so.2 (its C API)")
    crypto = ctypes.util.find_library("crypto")
    source, program = tmp_path / "run_cudnn_rnn.c", tmp_path / "run_cudnn_rnn"
    source.write_text(C_HOST)
    command = ([cc, "-std=c99", "-Wall", "-Wextra", "-Werror",
                f"-I{tf.sysconfig.get_include()}", str(source), "-o", str(program),
                "-Wl,--no-as-needed"] + ([f"-l:{crypto}"] if crypto else [])
               + [f"-L{tf_dir}", "-l:libtensorflow_cc.so.2", "-l:libtensorflow_framework.so.2",
                  f"-Wl,-rpath,{tf_dir}"])
    subprocess.run(command, check=True, capture_output=True, timeout=TIMEOUT)
    proc = subprocess.run([str(program), kernels], capture_output=True, text=True,
                          timeout=TIMEOUT, env={"PATH": "/usr/local/bin:/usr/bin:/bin",
                                                "LC_ALL": "C.UTF-8", "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    T, N, I, H = 3, 2, 4, 5
    f32 = np.float32            # the program's inputs, in its float32 arithmetic
    x = (f32(0.1) * (np.arange(T * N * I) % 7).astype(f32) - f32(0.3)).reshape(T, N, I)
    n = 3 * (H * I + H * H + 2 * H)
    params = f32(0.05) * (np.arange(n) % 11).astype(f32) - f32(0.25)
    want = ctf.cudnn_rnn(x, np.zeros((1, N, H), np.float32), None, params, rnn_mode="gru",
                         is_training=False).output
    got = np.array([float(v) for v in proc.stdout.split()], np.float32).reshape(T, N, H)
    np.testing.assert_array_equal(got, want)
