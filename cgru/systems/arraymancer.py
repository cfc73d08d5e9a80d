"""Arraymancer's stacked GRU (``nn/layers/gru.nim``, ``nn_primitives/nnp_gru.nim``): its five
weight tensors and their two spellings.

Arraymancer computes cuDNN's cell (reset after the recurrent product, sigmoid/tanh,
``h' = (1 − z)·n + z·h``), unidirectional forward only, gates ``r, z, n`` in every packed
tensor, matrices applied as ``x·Wᵀ`` — so its tensors are the canonical parameters stacked::

    w3s0  [3H, I]        = W of layer 0
    w3sN  [L−1, 3H, H]   = W of layers 1 … L−1
    u3s   [L, 3H, H]     = R of every layer
    bW3s  [L, 1, 3H]     = b_W of every layer
    bU3s  [L, 1, 3H]     = b_R of every layer

The ``GRULayer`` fields are spelled ``FIELDS`` (``w3s0, w3sN, u3s, bW3s, bU3s``), the
arguments of its functions (``gru``, ``gru_forward``, ``gru_backward``) ``ARGUMENTS``
(``W3s0, W3sN, U3s, bW3s, bU3s``): one mapping, each spelling where Arraymancer uses it.
"""
import numpy as np

from cgru.core import validate
from cgru.core.cells import GRUCell
from cgru.core.network import LayerParams, Network, Topology
from cgru.systems import _rules

__all__ = ["to_arraymancer", "from_arraymancer", "FIELDS", "ARGUMENTS", "check_tensors",
           "network", "tensors"]

TARGET = "Arraymancer GRU"
FIELDS = ("w3s0", "w3sN", "u3s", "bW3s", "bU3s")
ARGUMENTS = ("W3s0", "W3sN", "U3s", "bW3s", "bU3s")


def check(a, what, dtype, shape, like):
    """``a`` as it is when it is a float array of ``dtype`` (``None``: either) and ``shape``
    (``None`` in ``shape``: any size)."""
    validate.float_array(a, what, dtype, like=like)
    return validate.array(a, what, a.dtype, shape, like)


def check_tensors(arrays, names):
    """``(dtype, I, H, L)`` of the five weight tensors ``arrays`` (in ``FIELDS`` order), checked
    and named ``names`` (``FIELDS`` or ``ARGUMENTS``); ``I`` may still be 0 (see ``network``)."""
    w0, wN, u, bW, bU = arrays
    like = f"(the dtype of {names[0]})"
    check(w0, names[0], None, (None, None), like)
    dtype = w0.dtype
    H3, I = w0.shape
    if H3 == 0 or H3 % 3:
        raise ValueError(f"{names[0]}: expected shape [3H, I] with H ≥ 1, got {list(w0.shape)}")
    H = H3 // 3
    check(u, names[2], dtype, (None, 3 * H, H), like)
    L = u.shape[0]
    if L == 0:
        raise ValueError(f"{names[2]}: expected at least one layer, got shape {list(u.shape)}")
    check(wN, names[1], dtype, (L - 1, 3 * H, H), like)
    check(bW, names[3], dtype, (L, 1, 3 * H), like)
    check(bU, names[4], dtype, (L, 1, 3 * H), like)
    return dtype, I, H, L


def network(arrays, names, copy=False):
    """A ``cgru.Network`` (cuDNN's cell) over the five checked weight tensors (views, or copies
    with ``copy``); an empty input width is refused under ``names[0]``."""
    _, I, H, L = check_tensors(arrays, names)
    if I == 0:
        raise ValueError(f"{names[0]}: expected shape [3H, I] with I ≥ 1, got "
                         f"{list(arrays[0].shape)}")
    w0, wN, u, bW, bU = arrays
    take = np.copy if copy else (lambda a: a)
    layers = [LayerParams(W=take(w0 if l == 0 else wN[l - 1]), R=take(u[l]), b_W=take(bW[l, 0]),
                          b_R=take(bU[l, 0])) for l in range(L)]
    return Network(Topology(I, H, L, "forward"), layers, GRUCell())


def tensors(net):
    """The five weight tensors of ``net`` (``FIELDS`` order; new arrays)."""
    topo = net.topology
    H, L = topo.hidden_size, topo.num_layers
    wN = np.empty((L - 1, 3 * H, H), net.dtype)
    for l in range(1, L):
        wN[l - 1] = net[l].W
    return (_rules.input_matrix(net, 0).copy(), wN, np.stack([lp.R for lp in net]),
            np.stack([lp.b_W for lp in net])[:, None, :],
            np.stack([lp.b_R for lp in net])[:, None, :])


def to_arraymancer(net, cell=None):
    """``{"w3s0": [3H, I], "w3sN": [L−1, 3H, H], "u3s": [L, 3H, H], "bW3s": [L, 1, 3H],
    "bU3s": [L, 1, 3H]}`` (gates r, z, n; the ``GRULayer`` fields).  Arraymancer computes the
    default cell, unidirectional forward only."""
    topo, cell = _rules.network_and_cell(net, cell)
    _rules.require(cell, TARGET, reset_after=(True,))
    _rules.require_topology(topo, TARGET, ("forward",),
                            " (Arraymancer's GRU is unidirectional forward only)")
    return dict(zip(FIELDS, tensors(net)))


def from_arraymancer(w3s0, w3sN, u3s, bW3s, bU3s):
    """A ``cgru.Network`` (cuDNN's cell) from Arraymancer's five tensors (see
    ``to_arraymancer``; NumPy arrays or torch tensors), copied."""
    arrays = [_rules.numpy_of(a) for a in (w3s0, w3sN, u3s, bW3s, bU3s)]
    return network(arrays, FIELDS, copy=True)
