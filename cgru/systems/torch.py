"""PyTorch ``torch.nn.GRU``: its ``state_dict`` keys, gate order and bias rules.

``torch.nn.GRU`` computes cuDNN's cell (reset after the recurrent product, sigmoid gates, tanh
candidate, ``h' = (1 − z)·n + z·h``), forward or bidirectional, gates ``r, z, n`` in every
packed tensor, matrices ``[3H, in]`` applied as ``x·Wᵀ`` — cgru's canonical layout itself::

    weight_ih_l{l}[_reverse]  [3H, in] = W      weight_hh_l{l}[_reverse]  [3H, H] = R
    bias_ih_l{l}[_reverse]    [3H]     = b_W    bias_hh_l{l}[_reverse]    [3H]    = b_R

``bias=False`` modules have no bias keys.
"""
import re

import numpy as np

from cgru.core import validate
from cgru.core.cells import GRUCell
from cgru.core.network import LayerParams, Network, Topology
from cgru.systems import _rules

__all__ = ["to_torch", "from_torch"]

TARGET = "PyTorch nn.GRU"
_KEY = re.compile(r"^(weight_ih|weight_hh|bias_ih|bias_hh)_l(\d+)(_reverse)?$")
_SLOTS = (("weight_ih", "W"), ("weight_hh", "R"), ("bias_ih", "b_W"), ("bias_hh", "b_R"))


def _suffix(l, d):
    return f"_l{l}" + ("_reverse" if d else "")


def to_torch(net, cell=None, *, bias=True):
    """A ``torch.nn.GRU`` ``state_dict`` as NumPy arrays (copies).

    Keys ``weight_ih_l{k}[_reverse]`` ``[3H, in]``, ``weight_hh_l{k}[_reverse]`` ``[3H, H]``,
    ``bias_ih_…``, ``bias_hh_…`` ``[3H]`` (gates r, z, n); ``bias=False`` omits the biases
    (refused when any is non-zero).  PyTorch computes the default cell only, forward or
    bidirectional.  Load with ``module.load_state_dict({k: torch.from_numpy(v) …})``.
    """
    topo, cell = _rules.network_and_cell(net, cell)
    bias = validate.flag(bias, "bias")
    _rules.require(cell, TARGET, reset_after=(True,))
    _rules.require_topology(topo, TARGET, ("forward", "bidirectional"),
                            " (it has forward and bidirectional only)")
    if not bias:
        _rules.no_biases(net, f"{TARGET}(bias=False)")
    D = topo.num_directions
    out = {}
    for i, lp in enumerate(net):
        sfx = _suffix(*divmod(i, D))
        out["weight_ih" + sfx] = _rules.input_matrix(net, i).copy()
        out["weight_hh" + sfx] = lp.R.copy()
        if bias:
            out["bias_ih" + sfx] = lp.b_W.copy()
            out["bias_hh" + sfx] = lp.b_R.copy()
    return out


def from_torch(state_dict):
    """A ``cgru.Network`` (cuDNN's cell) from a ``torch.nn.GRU`` ``state_dict`` (NumPy arrays
    or tensors).  The number of layers, directions and the presence of biases are read from
    the keys."""
    if not hasattr(state_dict, "items"):
        raise TypeError(f"state_dict: expected a mapping, got {type(state_dict).__name__}")
    found = {}
    for key, value in state_dict.items():
        m = _KEY.match(key) if isinstance(key, str) else None
        if not m:
            raise ValueError(f"state_dict: unexpected key {key!r} (expected weight_ih_l{{k}}, "
                             f"weight_hh_l{{k}}, bias_ih_l{{k}}, bias_hh_l{{k}}, optionally with "
                             f"_reverse)")
        found[(m.group(1), int(m.group(2)), 1 if m.group(3) else 0)] = (key, value)
    if not found:
        raise ValueError("state_dict: empty")
    L = 1 + max(k[1] for k in found)
    D = 2 if any(k[2] for k in found) else 1
    has_bias = any(k[0].startswith("bias") for k in found)
    for name in ("weight_ih", "weight_hh"):
        if (name, 0, 0) not in found:
            raise ValueError(f"state_dict: missing '{name}_l0'")
    first = _rules.weight(found[("weight_hh", 0, 0)][1], "state_dict['weight_hh_l0']")
    dtype = first.dtype
    H = _rules.dim(first, "state_dict['weight_hh_l0']", -1, "[3H, H]")
    I = _rules.dim(_rules.weight(found[("weight_ih", 0, 0)][1], "state_dict['weight_ih_l0']",
                                 dtype), "state_dict['weight_ih_l0']", -1, "[3H, I]")
    topo = Topology(I, H, L, _rules.direction_from(D))
    layers = []
    for i in range(L * D):
        l, d = divmod(i, D)
        arrays = {}
        for name, slot in _SLOTS:
            key = name + _suffix(l, d)
            if (name, l, d) not in found:
                if name.startswith("bias") and not has_bias:
                    arrays[slot] = np.zeros(3 * H, dtype)
                    continue
                raise ValueError(f"state_dict: missing {key!r}")
            a = _rules.weight(found.pop((name, l, d))[1], f"state_dict[{key!r}]", dtype)
            arrays[slot] = _rules.shaped(a, f"state_dict[{key!r}]",
                                         topo.shapes(i)[slot]).copy()
        layers.append(LayerParams(**arrays))
    if found:
        raise ValueError(f"state_dict: keys beyond L={L}, D={D}: {[v[0] for v in found.values()]}")
    return Network(topo, layers, GRUCell())
