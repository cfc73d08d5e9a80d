"""engine.reserve_from_gates: a reserve rebuilt from gates and outputs gives the same backward."""
import numpy as np
import pytest

import cgru
from cgru.core import engine
from cgru.core.cells import Cell
from cgru.core.network import Params, Topology

CELLS = {
    "default": Cell(),
    "reset_before_flip": Cell(reset_after=False, flip_z=True),
    "mps_kinds": Cell(f_r=("hard_sigmoid", 0.3, 0.45), f_z=("relu",), g="identity"),
    "mps_kinds_rb": Cell(reset_after=False, f_r="tanh", f_z="hard_sigmoid", g="relu"),
}


def _saved_gates(reserve, params, x, cell):
    return engine.reserve_gates(reserve, params, x, cell=cell)


def test_reserve_gates_are_the_reference_gates():
    # r, z, n of a one-step forward from h0 = 0, written out by hand
    topo = Topology(3, 2)
    params = Params.random(topo, np.float64, seed=5)
    x = np.random.default_rng(5).standard_normal((1, 2, 3))
    f = cgru.forward(params, x, training=True)
    lp = params[0]
    gx = x[0] @ lp.W.T + lp.b_W
    sig = lambda v: 1 / (1 + np.exp(-v))
    r, z = sig(gx[:, :2] + lp.b_R[:2]), sig(gx[:, 2:4] + lp.b_R[2:4])
    n = np.tanh(gx[:, 4:] + r * lp.b_R[4:])
    got = engine.reserve_gates(f.reserve, params, x)
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
    params = Params.random(topo, dtype, seed=2, scale=scale)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((T, N, I)).astype(dtype)
    h0 = rng.standard_normal((D, N, H)).astype(dtype)
    mask = (rng.random((T, N, D * H)) > 0.3).astype(dtype) if masked else None
    f = cgru.forward(params, x, h0, cell=cell, state_mask=mask, training=True)
    if scale and cell.f_r.name == "hard_sigmoid":   # the saturated case really occurs
        r = _saved_gates(f.reserve, params, x, cell)[0][:, :, :H]
        assert (r == 0).any() or (r == 1).any()
    rebuilt = engine.reserve_from_gates(params, x, _saved_gates(f.reserve, params, x, cell), f.y,
                                        h0, cell=cell, state_mask=mask)
    dy = rng.standard_normal(f.y.shape).astype(dtype)
    dhy = rng.standard_normal(f.hy.shape).astype(dtype)
    want = cgru.backward(params, x, f.reserve, dy, dhy, cell=cell, state_mask=mask)
    got = cgru.backward(params, x, rebuilt, dy, dhy, cell=cell, state_mask=mask)
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
    params = Params.random(topo, np.float64)
    x = np.zeros((2, 1, 3))
    gates, y = [np.zeros((2, 1, 12))], np.zeros((2, 1, 4))
    with pytest.raises(ValueError, match="clip"):
        engine.reserve_from_gates(params, x, gates, y, cell=Cell(clip=1.0))
    with pytest.raises(ValueError, match="cell.g.*softsign"):
        engine.reserve_from_gates(params, x, gates, y, cell=Cell(g="softsign"))
    with pytest.raises(ValueError, match="num_layers=2"):
        engine.reserve_from_gates(Params.random(Topology(3, 4, 2), np.float64), x, gates, y)
    with pytest.raises(ValueError, match=r"gates\[0\].*\[2, 1, 12\]"):
        engine.reserve_from_gates(params, x, [np.zeros((2, 1, 11))], y)
    with pytest.raises(ValueError, match="gates: expected a list of D=1"):
        engine.reserve_from_gates(params, x, gates * 2, y)
