"""rebuild.reserve_from_gates (and reserve_from_saved): a reserve rebuilt from gates and outputs gives the same backward."""
import numpy as np
import pytest

import cgru
from cgru.core import calls, rebuild
from cgru.core.cells import Cell
from cgru.core.network import Network, Topology

CELLS = {
    "default": Cell(),
    "reset_before_flip": Cell(reset_after=False, flip_z=True),
    "mps_kinds": Cell(f_r=("hard_sigmoid", 0.3, 0.45), f_z=("relu",), g="identity"),
    "mps_kinds_rb": Cell(reset_after=False, f_r="tanh", f_z="hard_sigmoid", g="relu"),
}


def _saved_gates(reserve, params, x):
    return rebuild.reserve_gates(reserve, params, x)


def test_reserve_gates_are_the_reference_gates():
    # r, z, n of a one-step forward from h0 = 0, written out by hand
    topo = Topology(3, 2)
    params = Network.random(topo, np.float64, seed=5)
    x = np.random.default_rng(5).standard_normal((1, 2, 3))
    f = cgru.forward(params, x, training=True)
    lp = params[0]
    gx = x[0] @ lp.W.T + lp.b_W
    sig = lambda v: 1 / (1 + np.exp(-v))
    r, z = sig(gx[:, :2] + lp.b_R[:2]), sig(gx[:, 2:4] + lp.b_R[2:4])
    n = np.tanh(gx[:, 4:] + r * lp.b_R[4:])
    got = rebuild.reserve_gates(f.reserve, params, x)
    np.testing.assert_allclose(got[0][0], np.concatenate([r, z, n], axis=1), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("cell", list(CELLS.values()), ids=list(CELLS))
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("scale", [None, 4.0], ids=["small", "saturating"])
def test_rebuilt_reserve_gives_the_same_gradients(dtype, direction, cell, masked, scale):
    T, N, I, H = 5, 3, 4, 6
    topo = Topology(I, H, 1, direction)
    D = topo.num_directions
    params = Network.random(topo, dtype, seed=2, scale=scale, cell=cell)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((T, N, I)).astype(dtype)
    h0 = rng.standard_normal((D, N, H)).astype(dtype)
    mask = (rng.random((T, N, D * H)) > 0.3).astype(dtype) if masked else None
    f = cgru.forward(params, x, h0, state_mask=mask, training=True)
    if scale and cell.f_r.name == "hard_sigmoid":   # the saturated case really occurs
        r = _saved_gates(f.reserve, params, x)[0][:, :, :H]
        assert (r == 0).any() or (r == 1).any()
    rebuilt = rebuild.reserve_from_gates(params, x, _saved_gates(f.reserve, params, x), f.y,
                                        h0, state_mask=mask)
    dy = rng.standard_normal(f.y.shape).astype(dtype)
    dhy = rng.standard_normal(f.hy.shape).astype(dtype)
    want = cgru.backward(params, x, f.reserve, dy, dhy, state_mask=mask)
    got = cgru.backward(params, x, rebuilt, dy, dhy, state_mask=mask)
    # float32: the rebuilt h·R_nᵀ comes from a different GEMM than the loop's, so the saturating
    # case (values up to ~1e29) differs by a few float32 roundings
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.dx, want.dx, **tol)
    np.testing.assert_allclose(got.dh0, want.dh0, **tol)
    for a, b in zip(got.dparams, want.dparams):
        for name in ("W", "R", "b_W", "b_R"):
            np.testing.assert_allclose(getattr(a, name), getattr(b, name), **tol)


def test_refuses_what_it_cannot_rebuild():
    topo = Topology(3, 4)
    params = Network.random(topo, np.float64)
    x = np.zeros((2, 1, 3))
    gates, y = [np.zeros((2, 1, 12))], np.zeros((2, 1, 4))
    with pytest.raises(ValueError, match="clip"):
        rebuild.reserve_from_gates(params.with_cell(Cell(clip=1.0)), x, gates, y)
    with pytest.raises(ValueError, match="cell.g.*softsign"):
        rebuild.reserve_from_gates(params.with_cell(Cell(g="softsign")), x, gates, y)
    with pytest.raises(ValueError, match="num_layers=2"):
        rebuild.reserve_from_gates(Network.random(Topology(3, 4, 2), np.float64), x, gates, y)
    with pytest.raises(ValueError, match=r"gates\[0\].*\[2, 1, 12\]"):
        rebuild.reserve_from_gates(params, x, [np.zeros((2, 1, 11))], y)
    with pytest.raises(ValueError, match="gates: expected a list of D=1"):
        rebuild.reserve_from_gates(params, x, gates * 2, y)


# --- LSTM and vanilla RNN: reserve_from_saved --------------------------------------------------
from cgru.core import reference                                   # noqa: E402
from cgru.core.cells import LSTMCell, RNNCell                     # noqa: E402
from cgru.core.network import Network                             # noqa: E402

SAVED_CELLS = {
    "lstm": LSTMCell(),
    "lstm_general_ifgo": LSTMCell(f_i="hard_sigmoid", g="softsign", clip=1.2, peepholes="ifgo"),
    "lstm_ifo_input_forget": LSTMCell(peepholes="ifo", input_forget=True, h="relu"),
    "rnn_tanh": RNNCell("tanh"),
    "rnn_general": RNNCell(("leaky_relu", 0.2), clip=1.0),
}


def _saved(net, x, h0, c0, mask, f):
    """What an outside system keeps: LSTM gates and cells after every step, RNN z."""
    opened = calls.open_reserve(f.reserve, net, net.cell, x.shape[0], x.shape[1], False)
    topo, T = net.topology, x.shape[0]
    if net.cell.kind == "lstm":
        cells = []
        for d, v in enumerate(opened.lds):
            cs = v["cstates"]
            cells.append((cs[:T] if topo.reversed_direction(d) else cs[1:]).copy())
        return {"gates": [v["gates"].copy() for v in opened.lds], "cells": cells}
    H = topo.hidden_size
    pre = []
    for d, lp in enumerate(net):          # z = x·Wᵀ + b + (h_prev ⊙ m)·Rᵀ, from the outputs
        y = f.y[:, :, d * H:(d + 1) * H]
        h_prev = (np.concatenate([y[1:], h0[d][None]]) if topo.reversed_direction(d)
                  else np.concatenate([h0[d][None], y[:-1]]))
        if mask is not None:
            h_prev = h_prev * mask[:, :, d * H:(d + 1) * H]
        xp = reference._input_projection(topo, 1, 0, d, lp, x)
        pre.append(xp + lp.b_W + lp.b_R + h_prev @ lp.R.T)
    return {"pre": pre}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("kind", list(SAVED_CELLS))
def test_reserve_from_saved_gives_the_backward_of_the_forward(kind, masked, direction, dtype):
    cell = SAVED_CELLS[kind]
    mode = "projected" if kind == "lstm" and direction == "reverse" else "linear"
    I = 4 * 5 * (2 if direction == "bidirectional" else 1) if mode == "projected" else 3
    topo = Topology(I, 5, 1, direction, mode)
    net = Network.random(topo, dtype, seed=7, scale=0.9, cell=cell)
    rng = np.random.default_rng(8)
    T, N, D = 6, 3, topo.num_directions
    x = rng.standard_normal((T, N, I)).astype(dtype)
    h0 = rng.standard_normal((D, N, 5)).astype(dtype)
    c0 = rng.standard_normal((D, N, 5)).astype(dtype) if cell.kind == "lstm" else None
    mask = rng.uniform(0.3, 1.2, (T, N, D * 5)).astype(dtype) if masked else None
    f = cgru.forward(net, x, h0, c0=c0, state_mask=mask, training=True)
    dy = rng.standard_normal(f.y.shape).astype(dtype)
    dhy = rng.standard_normal(f.hy.shape).astype(dtype)
    dcy = None if c0 is None else rng.standard_normal(f.cy.shape).astype(dtype)
    want = cgru.backward(net, x, f.reserve, dy, dhy, dcy=dcy, state_mask=mask)
    rv = rebuild.reserve_from_saved(net, x, _saved(net, x, h0, c0, mask, f), h0=h0, c0=c0,
                                   state_mask=mask)
    got = cgru.backward(net, x, rv, dy, dhy, dcy=dcy, state_mask=mask)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-5)
    for name in ("dx", "dh0", "dc0"):
        if getattr(want, name) is not None:
            np.testing.assert_allclose(getattr(got, name), getattr(want, name), **tol,
                                       err_msg=name)
    np.testing.assert_allclose(got.dparams.flat(), want.dparams.flat(), **tol)


def test_reserve_from_saved_refuses_what_it_cannot_rebuild():
    gru = Network.random(Topology(3, 2), np.float64)
    x = np.zeros((2, 1, 3))
    with pytest.raises(ValueError, match="reserve_from_gates"):
        rebuild.reserve_from_saved(gru, x, {})
    lstm = Network.random(Topology(3, 2, 2), np.float64, cell=LSTMCell())
    with pytest.raises(ValueError, match="one layer"):
        rebuild.reserve_from_saved(lstm, x, {})
    lstm = Network.random(Topology(3, 2), np.float64, cell=LSTMCell())
    with pytest.raises(ValueError, match=r"saved: expected a dict with \['cells', 'gates'\]"):
        rebuild.reserve_from_saved(lstm, x, {"gates": [np.zeros((2, 1, 8))]})
    with pytest.raises(ValueError, match=r"saved\['cells'\]\[0\]"):
        rebuild.reserve_from_saved(lstm, x, {"gates": [np.zeros((2, 1, 8))],
                                            "cells": [np.zeros((2, 1, 3))]})
