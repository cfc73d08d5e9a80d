"""cgru's deprecated API, each piece checked once, explicitly: it still works, and warns.

Everywhere else the tests use the current API, and pyproject.toml makes cgru's own warnings
errors (checked at the end of this file), so a test that slips back to a deprecated form, or
a new warning from cgru, fails the run."""
import importlib
import sys
import warnings

import numpy as np
import pytest

import cgru

MOVED = {"cgru.engine": "cgru.core.engine", "cgru.params": "cgru.core.network",
         "cgru.cell": "cgru.core.cells", "cgru.reference": "cgru.core.reference"}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_module_warns_and_gives_the_new_names(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated; use {MOVED[old]}"):
        module = importlib.import_module(old)
    new = importlib.import_module(MOVED[old])
    shared = [n for n in getattr(new, "__all__", ()) if hasattr(module, n)]
    assert shared and all(getattr(module, n) is getattr(new, n) for n in shared)


def _problem(cell_given):
    cell = cgru.Cell(reset_after=False)
    topo = cgru.Topology(3, 4, 2)
    net = cgru.Network.random(topo, np.float64, seed=1, cell=cell if cell_given else None)
    x = np.random.default_rng(2).standard_normal((5, 2, 3))
    return net, cell, x


def test_the_cell_keyword_with_a_cellless_network_warns_and_computes_that_cell():
    net, cell, x = _problem(cell_given=False)
    want = cgru.forward(net.with_cell(cell), x, training=True)
    with pytest.warns(DeprecationWarning, match="cell=: passing a cell along with a network"):
        got = cgru.forward(net, x, cell=cell, training=True)
    np.testing.assert_array_equal(got.y, want.y)
    dy = np.ones_like(want.y)
    with pytest.warns(DeprecationWarning, match="deprecated"):
        g = cgru.backward(net, x, got.reserve, dy, cell=cell)
    np.testing.assert_array_equal(g.dx, cgru.backward(net.with_cell(cell), x, want.reserve,
                                                      dy).dx)


def test_a_redundant_cell_keyword_warns():
    net, cell, x = _problem(cell_given=True)
    with pytest.warns(DeprecationWarning, match="cell=: redundant"):
        got = cgru.forward(net, x, cell=cell)
    np.testing.assert_array_equal(got.y, cgru.forward(net, x).y)


def test_params_is_the_old_name_of_network_and_warns():
    """``cgru.Params`` is the old name of ``cgru.Network`` (the same class); every way of
    naming it warns at the caller's line and says when it goes, and ``cgru``'s own names do
    not include it."""
    with pytest.warns(DeprecationWarning, match="removed in cgru 0.4.0") as seen:
        assert cgru.Params is cgru.Network
    assert seen[0].filename == __file__
    with pytest.warns(DeprecationWarning, match="cgru.Params is deprecated"):
        from cgru import Params
    assert Params is cgru.Network
    with pytest.warns(DeprecationWarning, match="cgru.Params is deprecated") as seen:
        from cgru.core.network import Params as P2
    assert P2 is cgru.Network and seen[0].filename == __file__
    assert "Params" not in cgru.__all__ and "Params" not in dir(cgru)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace = {}
        exec("from cgru import *", namespace)
        assert "Params" not in namespace and namespace["Network"] is cgru.Network


def test_cgru_warnings_fail_the_test_run():
    """The project's pytest configuration turns cgru's warnings into errors (and only those:
    a third-party warning stays a warning)."""
    for message, category in (("cell=: passing a cell along with a network is deprecated",
                               DeprecationWarning),
                              ("cgru.forward: something new", UserWarning),
                              ("cgru.engine is deprecated", DeprecationWarning)):
        with pytest.raises(category, match=message.split(":")[0]):
            warnings.warn(message, category)
    with pytest.warns(UserWarning, match="another library"):
        warnings.warn("another library's warning", UserWarning)
