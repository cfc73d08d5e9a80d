"""The NumPy reference (cgru.reference) against PyTorch and against hand-written formulas.

1. torch.nn.GRU (the default cell): layers, directions, layouts, h0, unsorted lengths.
2. The reverse direction equals a forward run on time-flipped input (per-row for lengths).
3. Single-step checks, independent of the reference, for every option PyTorch lacks.
4. Inter-layer dropout masks against two hand-chained single-layer runs.
"""
import math

import numpy as np
import pytest

import cgru.core.reference as ref
from cgru.core.cells import _KINDS, Activation, Cell
from cgru.core.network import LayerParams, Network, Topology

torch = pytest.importorskip("torch")

TIGHT = dict(rtol=1e-12, atol=1e-12)


def _rng(seed):
    return np.random.default_rng(seed)


# --- 1. against torch.nn.GRU --------------------------------------------------------------------

def _torch_gru(params, batch_first):
    topo = params.topology
    dtype = torch.float64 if params.dtype == np.float64 else torch.float32
    gru = torch.nn.GRU(topo.input_size, topo.hidden_size, num_layers=topo.num_layers,
                       bidirectional=topo.direction == "bidirectional",
                       batch_first=batch_first, dtype=dtype)
    D = topo.num_directions
    with torch.no_grad():
        for l in range(topo.num_layers):
            for d in range(D):
                lp = params[l, d]
                sfx = f"_l{l}" + ("_reverse" if d == 1 else "")
                getattr(gru, "weight_ih" + sfx).copy_(torch.from_numpy(lp.W))
                getattr(gru, "weight_hh" + sfx).copy_(torch.from_numpy(lp.R))
                getattr(gru, "bias_ih" + sfx).copy_(torch.from_numpy(lp.b_W))
                getattr(gru, "bias_hh" + sfx).copy_(torch.from_numpy(lp.b_R))
    return gru


def _run_torch(params, x, h0, lengths, batch_first):
    gru = _torch_gru(params, batch_first)
    xt = torch.from_numpy(x)
    ht = None if h0 is None else torch.from_numpy(h0)
    with torch.no_grad():
        if lengths is None:
            y, hy = gru(xt, ht)
        else:
            T = x.shape[1] if batch_first else x.shape[0]
            packed = torch.nn.utils.rnn.pack_padded_sequence(
                xt, torch.as_tensor(lengths), batch_first=batch_first, enforce_sorted=False)
            y, hy = gru(packed, ht)
            y, _ = torch.nn.utils.rnn.pad_packed_sequence(y, batch_first=batch_first,
                                                          total_length=T)
    return y.numpy(), hy.numpy()


@pytest.mark.parametrize("L", [1, 2, 3])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_matches_torch_float64(L, direction, batch_first, with_h0, with_lengths):
    T, N, I, H = 5, 4, 3, 4
    topo = Topology(I, H, L, direction)
    params = Network.random(topo, np.float64, seed=L + 10 * batch_first)
    rng = _rng(L * 7 + with_h0)
    x = rng.standard_normal((N, T, I) if batch_first else (T, N, I))
    h0 = rng.standard_normal((L * topo.num_directions, N, H)) if with_h0 else None
    lengths = np.array([3, 5, 1, 4]) if with_lengths else None    # unsorted, includes 1 and T

    y, hy = ref.forward(params, x, h0, lengths=lengths, batch_major=batch_first)
    y_t, hy_t = _run_torch(params, x, h0, lengths, batch_first)

    assert y.shape == y_t.shape == ((N, T, topo.output_size) if batch_first
                                    else (T, N, topo.output_size))
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, y_t, **TIGHT)
    np.testing.assert_allclose(hy, hy_t, **TIGHT)
    if with_lengths:   # padding really is zero (and not trivially: valid outputs are not)
        y_tm = y.transpose(1, 0, 2) if batch_first else y
        for b, n in enumerate(lengths):
            assert np.all(y_tm[n:, b] == 0)
            assert np.all(np.abs(y_tm[:n, b]).sum(axis=-1) > 0)


def test_matches_torch_float32():
    T, N, I, H = 6, 3, 5, 4
    topo = Topology(I, H, 2, "bidirectional")
    params = Network.random(topo, np.float32, seed=3)
    rng = _rng(3)
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    h0 = rng.standard_normal((4, N, H)).astype(np.float32)
    y, hy = ref.forward(params, x, h0, lengths=[6, 2, 4])
    assert y.dtype == np.float32 and hy.dtype == np.float32
    y_t, hy_t = _run_torch(params, x, h0, [6, 2, 4], False)
    np.testing.assert_allclose(y, y_t, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hy, hy_t, rtol=1e-5, atol=1e-6)


# --- 2. reverse direction ----------------------------------------------------------------------

def _same_layers(params, topology):
    return Network(topology, [LayerParams(**lp.arrays()) for lp in params])


@pytest.mark.parametrize("L", [1, 2])
def test_reverse_equals_forward_on_flipped_input(L):
    T, N, I, H = 6, 3, 3, 4
    rev = Network.random(Topology(I, H, L, "reverse"), np.float64, seed=5)
    fwd = _same_layers(rev, Topology(I, H, L, "forward"))
    rng = _rng(5)
    x = rng.standard_normal((T, N, I))
    h0 = rng.standard_normal((L, N, H))
    y_r, hy_r = ref.forward(rev, x, h0)
    y_f, hy_f = ref.forward(fwd, x[::-1], h0)
    np.testing.assert_allclose(y_r, y_f[::-1], **TIGHT)
    np.testing.assert_allclose(hy_r, hy_f, **TIGHT)
    assert not np.allclose(y_r, ref.forward(fwd, x, h0)[0])      # the direction matters


@pytest.mark.parametrize("L", [1, 2])
def test_reverse_with_lengths_flips_each_row(L):
    T, N, I, H = 6, 4, 3, 3
    rev = Network.random(Topology(I, H, L, "reverse"), np.float64, seed=6)
    fwd = _same_layers(rev, Topology(I, H, L, "forward"))
    rng = _rng(6)
    lengths = np.array([4, 0, 6, 1])
    x = rng.standard_normal((T, N, I))
    h0 = rng.standard_normal((L, N, H))
    mask = rng.uniform(0.2, 1.5, (T, N, H))
    # per row: flip the first len steps of the input and of the mask
    x_f, mask_f = x.copy(), mask.copy()
    for b, n in enumerate(lengths):
        x_f[:n, b] = x[:n, b][::-1]
        mask_f[:n, b] = mask[:n, b][::-1]
    y_r, hy_r = ref.forward(rev, x, h0, lengths=lengths, state_mask=mask)
    y_f, hy_f = ref.forward(fwd, x_f, h0, lengths=lengths, state_mask=mask_f)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(y_r[:n, b], y_f[:n, b][::-1], **TIGHT)
        assert np.all(y_r[n:, b] == 0)
    np.testing.assert_allclose(hy_r, hy_f, **TIGHT)
    np.testing.assert_array_equal(hy_r[:, 1], h0[:, 1])              # len = 0 keeps h0


def test_bidirectional_is_forward_and_reverse_side_by_side():
    T, N, I, H = 5, 2, 3, 3
    bi = Network.random(Topology(I, H, 1, "bidirectional"), np.float64, seed=8)
    fwd = Network(Topology(I, H, 1, "forward"), [bi[0, 0]])
    rev = Network(Topology(I, H, 1, "reverse"), [bi[0, 1]])
    rng = _rng(8)
    x = rng.standard_normal((T, N, I))
    h0 = rng.standard_normal((2, N, H))
    lengths = [2, 5]
    cell = Cell(reset_after=False, flip_z=True)
    y, hy = ref.forward(bi.with_cell(cell), x, h0, lengths=lengths)
    y_f, hy_f = ref.forward(fwd.with_cell(cell), x, h0[:1], lengths=lengths)
    y_r, hy_r = ref.forward(rev.with_cell(cell), x, h0[1:], lengths=lengths)
    np.testing.assert_allclose(y, np.concatenate([y_f, y_r], axis=-1), **TIGHT)
    np.testing.assert_allclose(hy, np.concatenate([hy_f, hy_r]), **TIGHT)


# --- 3. single-step checks for options PyTorch lacks ---------------------------------------------

def _scalar_act(name, a, b, v):
    """The activations written one scalar at a time with ``math`` (independent of NumPy)."""
    return {
        "sigmoid": lambda: 1.0 / (1.0 + math.exp(-v)),
        "tanh": lambda: math.tanh(v),
        "relu": lambda: max(v, 0.0),
        "identity": lambda: v,
        "hard_sigmoid": lambda: min(max(a * v + b, 0.0), 1.0),
        "affine": lambda: a * v + b,
        "leaky_relu": lambda: v if v >= 0 else a * v,
        "thresholded_relu": lambda: v if v > a else 0.0,
        "scaled_tanh": lambda: a * math.tanh(b * v),
        "elu": lambda: v if v >= 0 else a * (math.exp(v) - 1.0),
        "softsign": lambda: v / (1.0 + abs(v)),
        "softplus": lambda: math.log1p(math.exp(v)),
    }[name]()


def test_activation_names_are_all_covered():
    assert set(_KINDS) == {"sigmoid", "tanh", "relu", "identity", "hard_sigmoid", "affine",
                           "leaky_relu", "thresholded_relu", "scaled_tanh", "elu", "softsign",
                           "softplus"}


@pytest.mark.parametrize("name", sorted(_KINDS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_activate_every_kind_with_non_default_alpha_beta(name, dtype):
    act = Activation(name, 0.7, -0.3)
    xs = np.array([-6.0, -2.5, -0.7, -0.1, 0.0, 0.3, 0.7, 0.71, 1.9, 5.0], dtype=dtype)
    got = ref.activate(act, xs)
    assert got.dtype == dtype and got.shape == xs.shape
    want = np.array([_scalar_act(name, 0.7, -0.3, float(v)) for v in xs])
    tol = 1e-14 if dtype == np.float64 else 2e-7
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_activate_defaults_and_extremes():
    x = np.array([-1000.0, -40.0, 0.0, 40.0, 1000.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):   # stable: no inf, no NaN
        sig = ref.activate(Activation("sigmoid"), x)
        sp = ref.activate(Activation("softplus"), x)
        elu = ref.activate(Activation("elu"), x)
    np.testing.assert_allclose(sig, [0.0, math.exp(-40) / (1 + math.exp(-40)), 0.5,
                                     1 / (1 + math.exp(-40)), 1.0], rtol=1e-15, atol=0)
    np.testing.assert_allclose(sp, [0.0, math.log1p(math.exp(-40)), math.log(2), 40.0, 1000.0],
                               rtol=1e-15, atol=0)
    np.testing.assert_allclose(elu, [-1.0, math.exp(-40) - 1, 0.0, 40.0, 1000.0], rtol=1e-15)
    hs = ref.activate(Activation("hard_sigmoid"), np.array([-3.0, 0.0, 1.0, 3.0]))
    np.testing.assert_allclose(hs, [0.0, 0.5, 0.7, 1.0], rtol=1e-15)
    tr = ref.activate(Activation("thresholded_relu"), np.array([0.5, 1.0, 1.5]))
    np.testing.assert_array_equal(tr, [0.0, 0.0, 1.5])      # strict: x > alpha = 1


# The hand example (H = 1, N = 1, identity activations so every number is exact):
#   h = 2, x_proj = [1, 0.25, 3], R = [0.5, 0, 1], b_W = 0, b_R = [0, 0, 1]
#   r = 1 + 0.5·2 = 2,  z = 0.25
#   reset_after : n = 3 + r·(1·2 + 1) = 9     reset_before: n = 3 + (r·2)·1 + 1 = 8
#   h' = 0.75·n + 0.25·2;  flip_z: h' = 0.25·n + 0.75·2
#   mask m = 0.5 (h_m = 1): r = 1.5;  after: n = 3 + 1.5·(1 + 1) = 6;  before: n = 3 + 1.5 + 1
#   clip = 2.5: r = clip(2) = 2, z = 0.25, after: n = clip(9) = 2.5
_HAND = dict(x_proj=np.array([[1.0, 0.25, 3.0]]), h=np.array([[2.0]]),
             lp_R=np.array([[0.5], [0.0], [1.0]]), b_W=np.zeros(3), b_R=np.array([0.0, 0.0, 1.0]))
_IDENT = dict(f_r="identity", f_z="identity", g="identity")


@pytest.mark.parametrize("reset_after, flip_z, mask, clip, expected", [
    (True, False, None, None, 0.75 * 9 + 0.25 * 2),
    (False, False, None, None, 0.75 * 8 + 0.25 * 2),
    (True, True, None, None, 0.25 * 9 + 0.75 * 2),
    (False, True, None, None, 0.25 * 8 + 0.75 * 2),
    (True, False, 0.5, None, 0.75 * 6 + 0.25 * 2),        # blend uses the unmasked h = 2
    (False, False, 0.5, None, 0.75 * 5.5 + 0.25 * 2),
    (True, False, None, 2.5, 0.75 * 2.5 + 0.25 * 2),
    (False, False, None, 2.5, 0.75 * 2.5 + 0.25 * 2),
    (True, False, None, 1.5, 0.75 * 1.5 + 0.25 * 2),     # r clipped to 1.5: n = 3+1.5·3 → 1.5
])
def test_cell_step_by_hand(reset_after, flip_z, mask, clip, expected):
    cell = Cell(reset_after=reset_after, flip_z=flip_z, clip=clip, **_IDENT)
    m = None if mask is None else np.array([[mask]])
    h_new = ref.cell_step(cell, mask=m, **_HAND)
    assert h_new.shape == (1, 1)
    assert h_new[0, 0] == pytest.approx(expected, rel=1e-15, abs=1e-15)


def test_cell_step_clip_clamps_negative_side_with_biases():
    # pre-activation of z = −4 + b_Wz(−1) + b_Rz(−1) = −6 → clamped to −3 before the activation
    cell = Cell(clip=3.0, f_r="identity", f_z="identity", g="identity")
    x_proj = np.array([[0.0, -4.0, 0.0]])
    h = np.array([[0.0]])
    out = ref.cell_step(cell, x_proj, h, np.zeros((3, 1)), np.array([0.0, -1.0, 0.5]),
                        np.array([0.0, -1.0, 0.25]))
    # r = 0, z = −3 (not −6), n = 0.5 + r·(0 + 0.25) = 0.5;  h' = (1 − z)·n + z·0 = 2
    assert out[0, 0] == pytest.approx(2.0, rel=1e-15)


def _scalar_step(cell, x_proj, h, R, b_W, b_R, mask):
    """An independent one-row GRU step with plain Python loops and ``math``."""
    H = len(h)
    hm = [h[j] * (1.0 if mask is None else mask[j]) for j in range(H)]

    def pre(act, v):
        if cell.clip is not None:
            v = min(max(v, -cell.clip), cell.clip)
        return _scalar_act(act.name, act.alpha, act.beta, v)

    r = [pre(cell.f_r, x_proj[i] + b_W[i] + sum(R[i][j] * hm[j] for j in range(H)) + b_R[i])
         for i in range(H)]
    z = [pre(cell.f_z, x_proj[H + i] + b_W[H + i]
              + sum(R[H + i][j] * hm[j] for j in range(H)) + b_R[H + i]) for i in range(H)]
    n = []
    for i in range(H):
        k = 2 * H + i
        if cell.reset_after:
            v = x_proj[k] + b_W[k] + r[i] * (sum(R[k][j] * hm[j] for j in range(H)) + b_R[k])
        else:
            v = x_proj[k] + sum(R[k][j] * r[j] * hm[j] for j in range(H)) + b_W[k] + b_R[k]
        n.append(pre(cell.g, v))
    if cell.flip_z:
        return [z[i] * n[i] + (1 - z[i]) * h[i] for i in range(H)]
    return [(1 - z[i]) * n[i] + z[i] * h[i] for i in range(H)]


_CELLS = [
    Cell(reset_after=False),
    Cell(flip_z=True),
    Cell(reset_after=False, flip_z=True, clip=0.8),
    Cell(f_r="hard_sigmoid", f_z=("hard_sigmoid", 0.3, 0.4), g="relu"),
    Cell(f_r=("scaled_tanh", 0.9, 1.3), f_z="softsign", g=("elu", 0.6)),
    Cell(f_r=("leaky_relu", 0.2), f_z="softplus", g=("thresholded_relu", 0.1), clip=1.2),
    Cell(reset_after=False, f_r=("affine", 0.5, 0.2), f_z="sigmoid", g="identity"),
]


@pytest.mark.parametrize("cell", _CELLS, ids=[str(i) for i in range(len(_CELLS))])
@pytest.mark.parametrize("with_mask", [False, True])
def test_cell_step_matches_scalar_formula(cell, with_mask):
    N, H = 3, 4
    rng = _rng(11)
    x_proj = rng.standard_normal((N, 3 * H))
    h = rng.standard_normal((N, H))
    R = rng.uniform(-0.8, 0.8, (3 * H, H))
    b_W, b_R = rng.uniform(-0.5, 0.5, (2, 3 * H))
    mask = (rng.uniform(size=(N, H)) > 0.4) * rng.uniform(0.5, 2.0, (N, H)) if with_mask else None
    got = ref.cell_step(cell, x_proj, h, R, b_W, b_R, mask)
    want = np.array([_scalar_step(cell, x_proj[b].tolist(), h[b].tolist(), R.tolist(),
                                  b_W.tolist(), b_R.tolist(),
                                  None if mask is None else mask[b].tolist()) for b in range(N)])
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    if with_mask:   # the mask changed something, so the comparison above tests it
        assert not np.allclose(got, ref.cell_step(cell, x_proj, h, R, b_W, b_R))


def test_forward_one_step_applies_the_state_mask_of_its_output_time():
    # T = 2, reverse direction: the step producing y[1] is the first one and uses mask[1].
    H = 2
    params = Network.random(Topology(3, H, 1, "reverse"), np.float64, seed=2)
    lp = params[0]
    rng = _rng(2)
    x = rng.standard_normal((2, 1, 3))
    h0 = rng.standard_normal((1, 1, H))
    mask = rng.uniform(0.1, 1.0, (2, 1, H))
    cell = Cell(reset_after=False)
    y, hy = ref.forward(params.with_cell(cell), x, h0, state_mask=mask)
    h1 = _scalar_step(cell, (x[1, 0] @ lp.W.T).tolist(), h0[0, 0].tolist(), lp.R.tolist(),
                      lp.b_W.tolist(), lp.b_R.tolist(), mask[1, 0].tolist())
    h2 = _scalar_step(cell, (x[0, 0] @ lp.W.T).tolist(), h1, lp.R.tolist(),
                      lp.b_W.tolist(), lp.b_R.tolist(), mask[0, 0].tolist())
    np.testing.assert_allclose(y[:, 0], [h2, h1], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(hy[0, 0], h2, rtol=1e-13, atol=1e-13)


def test_state_mask_batch_major_and_broadcast():
    T, N, I, H = 4, 3, 2, 3
    params = Network.random(Topology(I, H, 2, "bidirectional"), np.float64, seed=4)
    rng = _rng(4)
    x = rng.standard_normal((T, N, I))
    mask = rng.uniform(0.0, 1.0, (T, N, 2 * H))
    y, hy = ref.forward(params, x, state_mask=mask, lengths=[4, 2, 3])
    y_b, hy_b = ref.forward(params, x.transpose(1, 0, 2), batch_major=True,
                            state_mask=mask.transpose(1, 0, 2), lengths=[4, 2, 3])
    np.testing.assert_allclose(y_b, y.transpose(1, 0, 2), **TIGHT)
    np.testing.assert_allclose(hy_b, hy, **TIGHT)
    # a mask without a time axis broadcasts over time; all-ones equals no mask
    per_feature = rng.uniform(0.0, 1.0, (N, 2 * H))
    y1, _ = ref.forward(params, x, state_mask=per_feature)
    y2, _ = ref.forward(params, x, state_mask=np.broadcast_to(per_feature, (T, N, 2 * H)).copy())
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_allclose(ref.forward(params, x, state_mask=1.0)[0],
                               ref.forward(params, x)[0], **TIGHT)
    assert not np.allclose(y, ref.forward(params, x, lengths=[4, 2, 3])[0])


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_skip_input_mode_equals_identity_weights(direction):
    T, N, H = 4, 3, 3
    skip = Network.random(Topology(H, H, 2, direction, "skip"), np.float64, seed=9)
    D = skip.topology.num_directions
    eye3 = np.concatenate([np.eye(H)] * 3)                          # [3H, H]: W_r = W_z = W_n = I
    layers = [LayerParams(eye3 if i < D else lp.W, lp.R, lp.b_W, lp.b_R)
              for i, lp in enumerate(skip)]
    lin = Network(Topology(H, H, 2, direction, "linear"), layers)
    x = _rng(9).standard_normal((T, N, H))
    y_s, hy_s = ref.forward(skip, x, lengths=[4, 1, 3])
    y_l, hy_l = ref.forward(lin, x, lengths=[4, 1, 3])
    np.testing.assert_allclose(y_s, y_l, **TIGHT)
    np.testing.assert_allclose(hy_s, hy_l, **TIGHT)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_projected_input_mode_equals_linear(direction):
    T, N, I, H = 5, 2, 3, 2
    lin = Network.random(Topology(I, H, 2, direction), np.float64, seed=12)
    D = lin.topology.num_directions
    proj_layers = [LayerParams(np.zeros((3 * H, 0)) if i < D else lp.W, lp.R, lp.b_W, lp.b_R)
                   for i, lp in enumerate(lin)]
    proj = Network(Topology(D * 3 * H, H, 2, direction, "projected"), proj_layers)
    rng = _rng(12)
    x = rng.standard_normal((T, N, I))
    h0 = rng.standard_normal((2 * D, N, H))
    # [fwd r,z,n | bwd r,z,n] per step, batch-major input
    x_proj = np.concatenate([x @ lin[0, d].W.T for d in range(D)], axis=-1)
    cell = Cell(reset_after=False, g="softsign")
    y_p, hy_p = ref.forward(proj.with_cell(cell), x_proj.transpose(1, 0, 2), h0, batch_major=True,
                            lengths=[3, 5])
    y_l, hy_l = ref.forward(lin.with_cell(cell), x, h0, lengths=[3, 5])
    np.testing.assert_allclose(y_p, y_l.transpose(1, 0, 2), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(hy_p, hy_l, rtol=1e-12, atol=1e-12)


def test_zero_length_rows():
    T, N, I, H = 4, 3, 2, 3
    params = Network.random(Topology(I, H, 2, "bidirectional"), np.float64, seed=13)
    rng = _rng(13)
    x = rng.standard_normal((T, N, I))
    h0 = rng.standard_normal((4, N, H))
    y, hy = ref.forward(params, x, h0, lengths=[0, 3, 0])
    assert np.all(y[:, [0, 2]] == 0)
    np.testing.assert_array_equal(hy[:, [0, 2]], h0[:, [0, 2]])
    y1, hy1 = ref.forward(params, x[:3, 1:2], h0[:, 1:2])           # row 1 alone, its 3 steps
    np.testing.assert_allclose(y[:3, 1:2], y1, **TIGHT)
    assert np.all(y[3, 1] == 0)
    np.testing.assert_allclose(hy[:, 1:2], hy1, **TIGHT)


@pytest.mark.parametrize("bad", [[5, 1], [-1, 2]])
def test_lengths_out_of_range_raise(bad):
    params = Network.random(Topology(2, 2), np.float64)
    with pytest.raises(ValueError, match="lengths"):
        ref.forward(params, np.zeros((4, 2, 2)), lengths=bad)


# --- 4. inter-layer dropout masks ----------------------------------------------------------------

def test_all_ones_dropout_masks_equal_no_masks():
    T, N, I, H, L = 4, 3, 2, 3, 3
    params = Network.random(Topology(I, H, L, "bidirectional"), np.float64, seed=14)
    x = _rng(14).standard_normal((T, N, I))
    ones = [np.ones((T, N, 2 * H)) for _ in range(L - 1)]
    y0, hy0 = ref.forward(params, x, lengths=[4, 2, 3])
    y1, hy1 = ref.forward(params, x, lengths=[4, 2, 3], dropout_masks=ones)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(hy0, hy1)


@pytest.mark.parametrize("batch_major", [False, True])
def test_dropout_mask_feeds_layer_two_through_hand_chained_layers(batch_major):
    T, N, I, H, p = 5, 3, 3, 4, 0.5
    topo = Topology(I, H, 2, "bidirectional")
    params = Network.random(topo, np.float64, seed=15)
    rng = _rng(15)
    x = rng.standard_normal((T, N, I))
    h0 = rng.standard_normal((4, N, H))
    mask = (rng.uniform(size=(T, N, 2 * H)) > p) / (1 - p)        # time-major, scaled
    mask[:, :, 1] = 0                                              # a whole feature dropped
    lengths = [5, 3, 2]
    xin = x.transpose(1, 0, 2) if batch_major else x
    y, hy = ref.forward(params, xin, h0, lengths=lengths, batch_major=batch_major,
                        dropout_masks=[mask])
    if batch_major:
        y = y.transpose(1, 0, 2)

    layer0 = Network(Topology(I, H, 1, "bidirectional"), [params[0, 0], params[0, 1]])
    layer1 = Network(Topology(2 * H, H, 1, "bidirectional"), [params[1, 0], params[1, 1]])
    y0, hy0 = ref.forward(layer0, x, h0[:2], lengths=lengths)
    y1, hy1 = ref.forward(layer1, y0 * mask, h0[2:], lengths=lengths)
    np.testing.assert_allclose(y, y1, **TIGHT)                     # last output: not masked
    np.testing.assert_allclose(hy, np.concatenate([hy0, hy1]), **TIGHT)   # states: not masked
    # and the mask mattered
    y_nomask, _ = ref.forward(params, xin, h0, lengths=lengths, batch_major=batch_major)
    assert not np.allclose(y_nomask, y.transpose(1, 0, 2) if batch_major else y)
    # layer 1 sees zeros in feature 1: changing layer 0's output there changes nothing
    y0_changed = y0.copy()
    y0_changed[:, :, 1] += 10.0
    np.testing.assert_array_equal(ref.forward(layer1, y0_changed * mask, h0[2:],
                                              lengths=lengths)[0], y1)
