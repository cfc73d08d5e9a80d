"""PyTorch ``torch.nn.GRU`` / ``nn.LSTM`` / ``nn.RNN``: their ``state_dict`` keys, gate orders
and bias rules.

The three modules compute cuDNN's cells (``nn.GRU``: reset after the recurrent product,
sigmoid gates, tanh candidate, ``h' = (1 − z)·n + z·h``; ``nn.LSTM``: sigmoid gates, tanh cell
input and output, optionally the recurrent projection of ``proj_size``; ``nn.RNN``: tanh or
relu, its ``nonlinearity``), forward or bidirectional, gates in cgru's canonical order in every
packed tensor (GRU ``r, z, n``; LSTM ``i, f, g, o``; RNN one block), matrices ``[G·H, in]``
applied as ``x·Wᵀ`` — cgru's canonical layout itself::

    weight_ih_l{l}[_reverse]  [G·H, in] = W      weight_hh_l{l}[_reverse]  [G·H, S] = R
    bias_ih_l{l}[_reverse]    [G·H]     = b_W    bias_hh_l{l}[_reverse]    [G·H]    = b_R
    weight_hr_l{l}[_reverse]  [P, H]    = W_p    (nn.LSTM with proj_size = P only)

``G = 3`` (GRU), 4 (LSTM), 1 (RNN); ``S`` = ``P`` with a projection, else ``H``; ``in`` the
layer's input width (``D·S`` above layer 0).  ``bias=False`` modules have no bias keys.
"""
import re

import numpy as np

from cgru.core import validate
from cgru.core.cells import GRUCell, LSTMCell, RNNCell
from cgru.core.network import LayerParams, Network, Topology
from cgru.systems import _rules

__all__ = ["to_torch", "from_torch", "MODES", "module_name"]

# mode -> (the module, its gate count)
MODES = {"gru": ("nn.GRU", 3), "lstm": ("nn.LSTM", 4), "rnn_tanh": ("nn.RNN", 1),
         "rnn_relu": ("nn.RNN", 1)}
_BY_GATES = {3: "gru", 4: "lstm", 1: "rnn"}
_MODULES = {"gru": "nn.GRU", "lstm": "nn.LSTM", "rnn": "nn.RNN"}
_KEY = re.compile(r"^(weight_ih|weight_hh|weight_hr|bias_ih|bias_hh)_l(\d+)(_reverse)?$")
_SLOTS = (("weight_ih", "W"), ("weight_hh", "R"), ("bias_ih", "b_W"), ("bias_hh", "b_R"))
_NONLINEARITIES = ("tanh", "relu")


def _suffix(l, d):
    return f"_l{l}" + ("_reverse" if d else "")


def module_name(cell):
    """The torch module computing ``cell``'s kind: ``"nn.GRU"``, ``"nn.LSTM"``, ``"nn.RNN"``."""
    return _MODULES[cell.kind]


def _require(cell):
    target = "PyTorch " + module_name(cell)
    if cell.kind == "gru":
        _rules.require(cell, target, reset_after=(True,))
    elif cell.kind == "lstm":
        _rules.require_lstm(cell, target)
    else:
        _rules.require_rnn(cell, target, lambda a: a.name in _NONLINEARITIES)
    return target


def to_torch(net, cell=None, *, bias=True):
    """A ``torch.nn.GRU`` / ``nn.LSTM`` / ``nn.RNN`` ``state_dict`` (the module of the
    network's cell) as NumPy arrays (copies).

    Keys ``weight_ih_l{k}[_reverse]`` ``[G·H, in]``, ``weight_hh_l{k}[_reverse]`` ``[G·H, S]``,
    ``bias_ih_…``, ``bias_hh_…`` ``[G·H]`` (canonical gate order), and for an LSTM with a
    projection ``weight_hr_…`` ``[P, H]`` (``nn.LSTM(proj_size=P)``); ``bias=False`` omits the
    biases (refused when any is non-zero).  PyTorch computes cuDNN's cells only (an RNN's
    ``nonlinearity`` is its activation, tanh or relu), forward or bidirectional.  Load with
    ``module.load_state_dict({k: torch.from_numpy(v) …})``.
    """
    topo, cell = _rules.network_and_cell(net, cell)
    bias = validate.flag(bias, "bias")
    target = _require(cell)
    _rules.require_topology(topo, target, ("forward", "bidirectional"),
                            " (it has forward and bidirectional only)")
    if not bias:
        _rules.no_biases(net, f"{target}(bias=False)")
    D = topo.num_directions
    out = {}
    for i, lp in enumerate(net):
        sfx = _suffix(*divmod(i, D))
        out["weight_ih" + sfx] = _rules.input_matrix(net, i).copy()
        out["weight_hh" + sfx] = lp.R.copy()
        if bias:
            out["bias_ih" + sfx] = lp.b_W.copy()
            out["bias_hh" + sfx] = lp.b_R.copy()
        if lp.W_p is not None:
            out["weight_hr" + sfx] = lp.W_p.copy()
    return out


def _keys(state_dict):
    """``{(name, l, d): (key, value)}`` of a ``state_dict`` (unknown keys refused)."""
    if not hasattr(state_dict, "items"):
        raise TypeError(f"state_dict: expected a mapping, got {type(state_dict).__name__}")
    found = {}
    for key, value in state_dict.items():
        m = _KEY.match(key) if isinstance(key, str) else None
        if not m:
            raise ValueError(f"state_dict: unexpected key {key!r} (expected weight_ih_l{{k}}, "
                             f"weight_hh_l{{k}}, bias_ih_l{{k}}, bias_hh_l{{k}}, weight_hr_l{{k}} "
                             f"(nn.LSTM with proj_size), optionally with _reverse)")
        found[(m.group(1), int(m.group(2)), 1 if m.group(3) else 0)] = (key, value)
    if not found:
        raise ValueError("state_dict: empty")
    for name in ("weight_ih", "weight_hh"):
        if (name, 0, 0) not in found:
            raise ValueError(f"state_dict: missing '{name}_l0'")
    return found


def _cell(mode, nonlinearity, G, R_shape, projection):
    """The cell of a state_dict whose ``weight_hh_l0`` is ``[G·H, S]`` (``G`` as read from
    the shapes, 0 when they fit no module), confirmed by ``mode`` / ``nonlinearity``."""
    what = "state_dict['weight_hh_l0']"
    if mode is not None:
        mode = _rules.option(mode, "mode", tuple(MODES))
    if nonlinearity is not None:
        nonlinearity = _rules.option(nonlinearity, "nonlinearity", _NONLINEARITIES,
                                     " (nn.RNN's nonlinearity)")
    kind = _BY_GATES.get(G)
    if kind is None:
        raise ValueError(f"{what}: expected [G·H, H] with G = 3 (nn.GRU), 4 (nn.LSTM) or 1 "
                         f"(nn.RNN), or [4H, P] with weight_hr_l0 (nn.LSTM with proj_size), "
                         f"got {list(R_shape)}")
    found = "an nn.LSTM with a projection (weight_hr_l0)" if projection else \
        f"{_MODULES[kind]}'s (G = {G})"
    if mode is not None and not mode.startswith(kind):
        module, g = MODES[mode]
        raise ValueError(f"mode={mode!r} ({module}, weight_hh [{g}H, H]) contradicts the "
                         f"state_dict: {what} {list(R_shape)} is {found}")
    if kind != "rnn":
        if nonlinearity is not None:
            raise ValueError(f"nonlinearity: is nn.RNN's option; the state_dict is {found}")
        return GRUCell() if kind == "gru" else LSTMCell()
    by_mode = None if mode is None else mode[4:]
    if by_mode is not None and nonlinearity is not None and by_mode != nonlinearity:
        raise ValueError(f"nonlinearity={nonlinearity!r} contradicts mode={mode!r}")
    if by_mode is None and nonlinearity is None:
        raise ValueError("nonlinearity: an nn.RNN state_dict does not record whether the RNN is "
                         "tanh or relu; pass nonlinearity='tanh' or 'relu' (or "
                         "mode='rnn_tanh' / 'rnn_relu'), or the module itself "
                         "(cgru.convert.from_torch(rnn))")
    return RNNCell(by_mode or nonlinearity)


def from_torch(state_dict, *, mode=None, nonlinearity=None):
    """A ``cgru.Network`` (the module's cell) from a ``torch.nn.GRU`` / ``nn.LSTM`` /
    ``nn.RNN`` module itself or its ``state_dict`` (NumPy arrays or tensors).

    The kind is read from the shapes: ``weight_hr_l0`` present → ``nn.LSTM`` with a
    projection; else ``weight_hh_l0`` ``[G·H, H]`` gives ``G`` = 3 (GRU), 4 (LSTM), 1 (RNN).
    ``mode`` ("gru", "lstm", "rnn_tanh", "rnn_relu"; ``str`` or ``bytes``) confirms it; given a
    module, its own ``mode`` is used.  An ``nn.RNN``'s nonlinearity is not in its state_dict:
    pass the module, or ``nonlinearity`` ("tanh", "relu") or ``mode`` ("rnn_tanh",
    "rnn_relu") with a state_dict of an RNN, else ``ValueError`` (a relu RNN read as tanh would
    compute another function).  A contradiction is refused.  The number of layers, directions,
    the projection and the presence of biases are read from the keys."""
    if callable(getattr(state_dict, "state_dict", None)):      # the module itself
        module = state_dict
        own = getattr(module, "mode", None)
        if not isinstance(own, str) or own.lower() not in MODES:
            raise TypeError(f"state_dict: expected a torch.nn.GRU, nn.LSTM or nn.RNN module or "
                            f"a state_dict (a mapping), got {type(module).__name__}")
        if mode is not None and _rules.option(mode, "mode", tuple(MODES)) != own.lower():
            raise ValueError(f"mode={mode!r} contradicts the module's own mode "
                             f"{own.lower()!r}")
        mode, state_dict = own.lower(), module.state_dict()
    found = _keys(state_dict)
    L = 1 + max(k[1] for k in found)
    D = 2 if any(k[2] for k in found) else 1
    has_bias = any(k[0].startswith("bias") for k in found)
    first = _rules.weight(found[("weight_hh", 0, 0)][1], "state_dict['weight_hh_l0']")
    dtype = first.dtype
    S = _rules.dim(first, "state_dict['weight_hh_l0']", -1, "[G·H, H]")
    rows = _rules.dim(first, "state_dict['weight_hh_l0']", 0, "[G·H, H]")
    P, H = 0, S
    if ("weight_hr", 0, 0) in found:
        hr = _rules.weight(found[("weight_hr", 0, 0)][1], "state_dict['weight_hr_l0']", dtype)
        if hr.ndim != 2:
            raise ValueError(f"state_dict['weight_hr_l0']: expected shape [P, H], got "
                             f"{list(hr.shape)}")
        P, H = hr.shape
        G = 4 if rows == 4 * H and first.ndim == 2 else 0
    else:
        G = rows // S if S and first.ndim == 2 and rows % S == 0 else 0
        H = S
    cell = _cell(mode, nonlinearity, G, first.shape, bool(P))
    I = _rules.dim(_rules.weight(found[("weight_ih", 0, 0)][1], "state_dict['weight_ih_l0']",
                                 dtype), "state_dict['weight_ih_l0']", -1, "[G·H, I]")
    topo = Topology(I, H, L, _rules.direction_from(D), proj_size=P)
    slots = _SLOTS + ((("weight_hr", "W_p"),) if P else ())
    layers = []
    for i in range(L * D):
        l, d = divmod(i, D)
        shapes = topo.shapes(i, cell.gates)
        arrays = {}
        for name, slot in slots:
            key = name + _suffix(l, d)
            if (name, l, d) not in found:
                if name.startswith("bias") and not has_bias:
                    arrays[slot] = np.zeros(shapes[slot], dtype)
                    continue
                raise ValueError(f"state_dict: missing {key!r}")
            a = _rules.weight(found.pop((name, l, d))[1], f"state_dict[{key!r}]", dtype)
            arrays[slot] = _rules.shaped(a, f"state_dict[{key!r}]", shapes[slot]).copy()
        layers.append(LayerParams(**arrays))
    if found:
        raise ValueError(f"state_dict: keys beyond L={L}, D={D}"
                         f"{'' if P else ' (weight_hr: only with weight_hr_l0)'}: "
                         f"{[v[0] for v in found.values()]}")
    return Network(topo, layers, cell)
