"""Keras ``GRU`` / ``Bidirectional(GRU)``: its ``get_weights()`` lists, gate order, activation
names and bias rules.

Per direction ``[kernel [in, 3H], recurrent_kernel [H, 3H], bias]``, columns in gate order
``z, r, h`` (applied as ``x·K``: the transposed canonical blocks, z and r swapped).  ``bias`` is
``(2, 3H)`` (rows input / recurrent) with ``reset_after=True`` (Keras' default, the cuDNN cell)
and one ``(3H,)`` vector with ``reset_after=False`` (the reset-before cell: the sums
``b_W + b_R``); ``use_bias=False`` layers have no bias array.  Keras has one activation for both
gates (``recurrent_activation``) and one for the candidate (``activation``).
"""
import numpy as np

from cgru.core import validate
from cgru.core.cells import GRUCell
from cgru.core.network import LayerParams, Network, Topology
from cgru.systems import _rules
from cgru.systems._rules import RZN_TO_ZRN

__all__ = ["keras_config", "to_keras", "from_keras", "ACTIVATIONS"]

# Keras activation names with exactly cgru's function (Keras' hard_sigmoid differs between
# Keras 2 (0.2x + 0.5) and Keras 3 (x/6 + 0.5), so it is not mapped).
ACTIVATIONS = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu", "linear": "identity",
               "softsign": "softsign", "softplus": "softplus", "elu": "elu"}
_NAMES = {v: k for k, v in ACTIVATIONS.items()}
_NOTE = " (the other Keras activations have no exact cgru equivalent)"


def _act_ok(act):
    return act.name in _NAMES and (act.name != "elu" or act.alpha == 1.0)


def keras_config(cell=None, *, reset_after=None):
    """The Keras ``GRU`` arguments of a cell (or of a network's cell): ``activation``,
    ``recurrent_activation``, ``reset_after`` (refused when Keras cannot express the cell, or
    when ``reset_after`` is given and differs from the cell's form)."""
    target, forms = _rules.demanded("Keras GRU", reset_after, "reset_after",
                                    lambda ra: f"reset_after={ra}")
    cell = _rules.require(_rules.as_cell(cell), target, reset_after=forms, activations=_act_ok,
                          shared_gate_act=True)
    return {"activation": _NAMES[cell.g.name], "recurrent_activation": _NAMES[cell.f_z.name],
            "reset_after": cell.reset_after}


def to_keras(net, cell=None, *, use_bias=True, reset_after=None):
    """Keras ``get_weights()`` lists, one per layer: ``[kernel, recurrent_kernel, bias]``
    (``GRU``), or forward then backward weights (``Bidirectional(GRU)``).

    ``kernel [in, 3H]``, ``recurrent_kernel [H, 3H]`` (columns z, r, h), ``bias`` ``(2, 3H)``
    rows input/recurrent for ``reset_after=True``, ``(3H,)`` (the sums) for
    ``reset_after=False``; ``use_bias=False`` omits it (refused when a bias is non-zero).
    ``keras_config(net)`` gives the matching layer arguments; ``reset_after`` (None: the
    cell's) demands one form.  Keras' ``go_backwards`` returns outputs in reversed time, so
    direction "reverse" is refused.
    """
    topo, cell = _rules.network_and_cell(net, cell)
    use_bias = validate.flag(use_bias, "use_bias")
    keras_config(cell, reset_after=reset_after)
    _rules.require_topology(topo, "Keras", ("forward", "bidirectional"),
                            " (go_backwards returns outputs in processing order, not aligned "
                            "to the original time)")
    if not use_bias:
        _rules.no_biases(net, "Keras GRU(use_bias=False)")
    H, D = topo.hidden_size, topo.num_directions
    layers = []
    for l in range(topo.num_layers):
        weights = []
        for i in range(l * D, (l + 1) * D):
            lp = net[i]
            weights.append(_rules.permute_gates(_rules.input_matrix(net, i), H, RZN_TO_ZRN).T
                           .copy())
            weights.append(_rules.permute_gates(lp.R, H, RZN_TO_ZRN).T.copy())
            if use_bias:
                bW = _rules.permute_gates(lp.b_W, H, RZN_TO_ZRN)
                bR = _rules.permute_gates(lp.b_R, H, RZN_TO_ZRN)
                weights.append(np.stack([bW, bR]) if cell.reset_after else bW + bR)
        layers.append(weights)
    return layers


def from_keras(layers, *, reset_after=True, bidirectional=False, activation="tanh",
               recurrent_activation="sigmoid"):
    """A ``cgru.Network`` (with Keras' cell) from Keras ``get_weights()`` lists, one per
    stacked layer (each 2 or 3 arrays per direction; 2 means ``use_bias=False``).  Errors about
    the backward direction's arrays of a ``Bidirectional`` layer say ``(backward)``.
    Activation names may be ``str`` or ``bytes``."""
    if not isinstance(layers, (list, tuple)) or not layers:
        raise TypeError("layers: expected a non-empty list of get_weights() lists")
    g = validate.name(activation, "activation", ACTIVATIONS, _NOTE)
    f = validate.name(recurrent_activation, "recurrent_activation", ACTIVATIONS, _NOTE)
    reset_after = validate.flag(reset_after, "reset_after")
    D = 2 if validate.flag(bidirectional, "bidirectional") else 1
    cell = GRUCell(reset_after=reset_after, f_r=f, f_z=f, g=g)
    out, dtype, I, H = [], None, None, None
    for l, weights in enumerate(layers):
        weights = _rules.array_list(weights, f"layers[{l}]")
        if len(weights) not in (2 * D, 3 * D):
            raise ValueError(f"layers[{l}]: expected {2 * D} or {3 * D} arrays "
                             f"({'Bidirectional' if D == 2 else 'GRU'}), got {len(weights)}")
        per = len(weights) // D
        for d in range(D):
            w = weights[d * per:(d + 1) * per]
            what = {s: f"layers[{l}] {s}" + (" (backward)" if d else "")
                    for s in ("kernel", "recurrent_kernel", "bias")}
            K = _rules.weight(w[0], what["kernel"], dtype)
            if H is None:                           # the sizes come from the first kernel
                if K.ndim != 2 or K.shape[1] % 3 or 0 in K.shape:
                    raise ValueError(f"{what['kernel']}: expected shape [in, 3H] with in ≥ 1 "
                                     f"and H ≥ 1, got {list(K.shape)}")
                dtype, I, H = K.dtype, K.shape[0], K.shape[1] // 3
            _rules.shaped(K, what["kernel"], (I if l == 0 else D * H, 3 * H))
            RK = _rules.shaped(_rules.weight(w[1], what["recurrent_kernel"], dtype),
                               what["recurrent_kernel"], (H, 3 * H))
            W = _rules.permute_gates(K.T, H, RZN_TO_ZRN)
            R = _rules.permute_gates(RK.T, H, RZN_TO_ZRN)
            if per == 2:
                bW, bR = np.zeros(3 * H, dtype), np.zeros(3 * H, dtype)
            elif reset_after:
                b = _rules.shaped(_rules.weight(w[2], what["bias"], dtype), what["bias"],
                                  (2, 3 * H))
                bW = _rules.permute_gates(b[0], H, RZN_TO_ZRN)
                bR = _rules.permute_gates(b[1], H, RZN_TO_ZRN)
            else:
                b = _rules.shaped(_rules.weight(w[2], what["bias"], dtype), what["bias"],
                                  (3 * H,))
                bW, bR = _rules.separate_biases(_rules.permute_gates(b, H, RZN_TO_ZRN), None,
                                                H, dtype)
            out.append(LayerParams(W=W, R=R, b_W=bW, b_R=bR))
    topo = Topology(I, H, len(layers), _rules.direction_from(D))
    return Network(topo, out, cell)
