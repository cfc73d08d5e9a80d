"""Padding is never read into a gradient every sequence shares.

Steps ``t ≥ len[b]`` are padding: whatever ``x``, the state mask or (for ``len = 0``) ``h0``
hold there — NaN, Inf, garbage — must not reach ``y``, ``hy``, ``dx`` of the other sequences,
nor the weight gradients (``dW = dgxᵀ·X`` and ``dR = dghᵀ·H`` multiply padded rows by exact
zeros, and 0·NaN is NaN).  Each case compares a run whose padding is poisoned with a run whose
padding holds ordinary numbers: every result must be equal (and finite).
"""
import numpy as np
import pytest

import cgru
from cgru import Cell, Network, Topology

T, N, I, H = 6, 3, 4, 5
LENGTHS = np.array([6, 3, 0])          # a full, a padded and an empty sequence
PAD = np.arange(T)[:, None] >= LENGTHS[None, :]     # [T, N]

CELLS = {
    "default": Cell(),
    "reset_before": Cell(reset_after=False),
    "general": Cell(reset_after=False, flip_z=True, f_z="hard_sigmoid", g="softsign", clip=3.0),
}
TOPOS = {
    "forward": Topology(I, H),
    "reverse": Topology(I, H, 1, "reverse"),
    "bidir_2layers": Topology(I, H, 2, "bidirectional"),
}


def _case(topo, cell, dtype, masked, seed=0):
    rng = np.random.default_rng(seed)
    net = Network.random(topo, dtype, seed=1, cell=cell)
    x = rng.standard_normal((T, N, I)).astype(dtype)
    h0 = rng.standard_normal((topo.num_layer_directions, N, H)).astype(dtype)
    mask = rng.uniform(0.5, 1.5, (T, N, topo.output_size)).astype(dtype) if masked else None
    dy = rng.standard_normal((T, N, topo.output_size)).astype(dtype)
    dhy = rng.standard_normal(h0.shape).astype(dtype)
    return net, x, h0, mask, dy, dhy


def _poison(x, h0, mask, value):
    x, h0 = x.copy(), h0.copy()
    x[PAD] = value
    h0[:, LENGTHS == 0] = value                      # an empty sequence's h0 is never used
    if mask is not None:
        mask = mask.copy()
        mask[PAD] = value
    return x, h0, mask


def _run(net, x, h0, mask, dy, dhy, dropout):
    f = cgru.forward(net, x, h0, lengths=LENGTHS, state_mask=mask, training=True,
                     dropout=dropout, seed=3)
    g = cgru.backward(net, x, f.reserve, dy, dhy, state_mask=mask)
    return f, g


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 1e30], ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["", "mask"])
@pytest.mark.parametrize("topo", list(TOPOS))
@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_poisoned_padding_changes_nothing(dtype, cell, topo, masked, value):
    net, x, h0, mask, dy, dhy = _case(TOPOS[topo], CELLS[cell], dtype, masked)
    dropout = 0.3 if TOPOS[topo].num_layers > 1 else 0.0
    f0, g0 = _run(net, x, h0, mask, dy, dhy, dropout)
    f1, g1 = _run(net, *_poison(x, h0, mask, value), dy, dhy, dropout)
    active = ~PAD
    np.testing.assert_array_equal(f1.y, f0.y)
    # hy of the empty sequence is its (poisoned) h0, by definition; the others are untouched
    np.testing.assert_array_equal(f1.hy[:, LENGTHS > 0], f0.hy[:, LENGTHS > 0])
    np.testing.assert_array_equal(g1.dx[active], g0.dx[active])
    np.testing.assert_array_equal(g1.dx[PAD], 0)
    np.testing.assert_array_equal(g1.dh0, g0.dh0)
    for a, b in zip(g1.dparams, g0.dparams):
        for name in ("W", "R", "b_W", "b_R"):
            u, v = getattr(a, name), getattr(b, name)
            assert np.isfinite(u).all(), f"{name}: padding leaked into the weight gradient"
            np.testing.assert_array_equal(u, v, err_msg=name)


def test_tf_backprop_v3_ignores_poisoned_padding():
    from cgru import tf
    L, D = 1, 1
    rng = np.random.default_rng(4)
    params = rng.standard_normal(tf.params_size(L, H, I, rnn_mode="gru")).astype(np.float32) * 0.3
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    h0 = np.zeros((L * D, N, H), np.float32)
    lens = LENGTHS.astype(np.int32)

    def run(x):
        out = tf.cudnn_rnn_v3(x, h0, None, params, lens, rnn_mode="gru", is_training=True)
        grads = tf.cudnn_rnn_backprop_v3(x, h0, None, params, lens, out.output, out.output_h,
                                         None, np.ones_like(out.output),
                                         np.ones_like(out.output_h), None, out.reserve_space,
                                         out.host_reserved, rnn_mode="gru")
        return grads
    want = run(x)
    bad = x.copy()
    bad[PAD] = np.nan
    got = run(bad)
    assert np.isfinite(got.params_backprop).all()
    np.testing.assert_array_equal(got.params_backprop, want.params_backprop)
    np.testing.assert_array_equal(got.input_backprop[~PAD], want.input_backprop[~PAD])
