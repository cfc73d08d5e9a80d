"""Keras ``GRU`` / ``LSTM`` / ``SimpleRNN`` (and ``Bidirectional``): their ``get_weights()``
lists, gate orders, activation names and bias rules.

Per direction ``[kernel [in, G·H], recurrent_kernel [H, G·H], bias]``, applied as ``x·K`` (the
transposed canonical blocks)::

    GRU        G = 3, columns z, r, h (canonical r, z, n with z and r swapped); bias (2, 3H)
               (rows input / recurrent) with reset_after=True (Keras' default, the cuDNN cell),
               one (3H,) vector — the sums b_W + b_R — with reset_after=False (reset-before)
    LSTM       G = 4, columns i, f, c, o (= canonical i, f, g, o); one bias (4H,)
    SimpleRNN  G = 1; one bias (H,)

A one-vector bias is the sums ``b_W + b_R`` going out (exact: only the sums are observable)
and maps in as ``b_W`` with ``b_R = 0``.  ``use_bias=False`` layers have no bias array.
Activations: ``recurrent_activation`` is the one activation of a GRU's two gates and of an
LSTM's i, f and o gates; ``activation`` the candidate's (GRU), the cell input's and the
output's (LSTM: Keras applies it to both), or the state's (SimpleRNN, which has no
``recurrent_activation``).  Keras has no clip and no LSTM projection.
"""
import numpy as np

from cgru.core import validate
from cgru.core.cells import GRUCell, LSTMCell, RNNCell
from cgru.core.network import LayerParams, Network, Topology
from cgru.systems import _rules
from cgru.systems._rules import RZN_TO_ZRN

__all__ = ["keras_config", "to_keras", "from_keras", "ACTIVATIONS", "LAYERS"]

# Keras activation names with exactly cgru's function (Keras' hard_sigmoid differs between
# Keras 2 (0.2x + 0.5) and Keras 3 (x/6 + 0.5), so it is not mapped).
ACTIVATIONS = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu", "linear": "identity",
               "softsign": "softsign", "softplus": "softplus", "elu": "elu"}
_NAMES = {v: k for k, v in ACTIVATIONS.items()}
_NOTE = " (the other Keras activations have no exact cgru equivalent)"
# Keras layer -> (cgru cell kind, gate count, canonical → Keras gate order)
LAYERS = {"GRU": ("gru", 3, RZN_TO_ZRN), "LSTM": ("lstm", 4, (0, 1, 2, 3)),
          "SimpleRNN": ("rnn", 1, (0,))}
_BY_KIND = {kind: name for name, (kind, _, _) in LAYERS.items()}
_BY_GATES = {G: name for name, (_, G, _) in LAYERS.items()}


def _act_ok(act):
    return act.name in _NAMES and (act.name != "elu" or act.alpha == 1.0)


def _gru_only(value, what, layer):
    if value is not None:
        raise ValueError(f"{what}: is a Keras GRU option; a Keras {layer} has none")


def keras_config(cell=None, *, reset_after=None):
    """The Keras layer arguments of a cell (or of a network's cell): ``activation``,
    ``recurrent_activation`` (GRU, LSTM) and ``reset_after`` (GRU) — for ``GRU``, ``LSTM``
    (``cgru.LSTMCell``) or ``SimpleRNN`` (``cgru.RNNCell``).  Refused when Keras cannot express
    the cell, or when ``reset_after`` is given and differs from a GRU cell's form."""
    cell = _rules.as_cell(cell)
    layer = _BY_KIND[cell.kind]
    if cell.kind == "lstm":
        _gru_only(reset_after, "reset_after", layer)
        _rules.require_lstm(cell, "Keras LSTM", activations=_act_ok, shared_gate_act=True,
                            shared_cell_act=True)
        return {"activation": _NAMES[cell.g.name], "recurrent_activation": _NAMES[cell.f_i.name]}
    if cell.kind == "rnn":
        _gru_only(reset_after, "reset_after", layer)
        _rules.require_rnn(cell, "Keras SimpleRNN", _act_ok)
        return {"activation": _NAMES[cell.activation.name]}
    target, forms = _rules.demanded("Keras GRU", reset_after, "reset_after",
                                    lambda ra: f"reset_after={ra}")
    _rules.require(cell, target, reset_after=forms, activations=_act_ok, shared_gate_act=True)
    return {"activation": _NAMES[cell.g.name], "recurrent_activation": _NAMES[cell.f_z.name],
            "reset_after": cell.reset_after}


def to_keras(net, cell=None, *, use_bias=True, reset_after=None):
    """Keras ``get_weights()`` lists, one per layer: ``[kernel, recurrent_kernel, bias]``
    (``GRU``, ``LSTM`` or ``SimpleRNN``, the network's cell's kind), or forward then backward
    weights (``Bidirectional``).

    ``kernel [in, G·H]``, ``recurrent_kernel [H, G·H]`` (columns in Keras' gate order),
    ``bias`` as the module docstring says; ``use_bias=False`` omits it (refused when a bias is
    non-zero).  ``keras_config(net)`` gives the matching layer arguments; ``reset_after``
    (GRU; None: the cell's) demands one form.  Keras' ``go_backwards`` returns outputs in
    reversed time, so direction "reverse" is refused; so is an LSTM projection.
    """
    topo, cell = _rules.network_and_cell(net, cell)
    use_bias = validate.flag(use_bias, "use_bias")
    keras_config(cell, reset_after=reset_after)
    layer = _BY_KIND[cell.kind]
    _rules.require_topology(topo, "Keras", ("forward", "bidirectional"),
                            " (go_backwards returns outputs in processing order, not aligned "
                            "to the original time)")
    _rules.no_projection(topo, "Keras LSTM")
    if not use_bias:
        _rules.no_biases(net, f"Keras {layer}(use_bias=False)")
    H, D, order = topo.hidden_size, topo.num_directions, LAYERS[layer][2]
    keras = lambda a: _rules.permute_gates(a, H, order)       # noqa: E731
    two_biases = cell.kind == "gru" and cell.reset_after
    layers = []
    for l in range(topo.num_layers):
        weights = []
        for i in range(l * D, (l + 1) * D):
            lp = net[i]
            weights.append(keras(_rules.input_matrix(net, i)).T.copy())
            weights.append(keras(lp.R).T.copy())
            if use_bias:
                bW, bR = keras(lp.b_W), keras(lp.b_R)
                weights.append(np.stack([bW, bR]) if two_biases else bW + bR)
        layers.append(weights)
    return layers


def _layer_of(layer, G, RK, what):
    """The Keras layer of weights whose recurrent kernel is ``RK [H, G·H]`` (``G`` 0 when it
    fits none), confirmed by the ``layer`` argument."""
    found = _BY_GATES.get(G)
    if found is None:
        raise ValueError(f"{what}: expected shape [H, G·H] with H ≥ 1 and G = 3 (GRU), 4 "
                         f"(LSTM) or 1 (SimpleRNN), got {list(RK.shape)}")
    if layer is not None and layer != found:
        raise ValueError(f"layer={layer!r} contradicts the weights: {what} {list(RK.shape)} is "
                         f"a Keras {found}'s (G = {G})")
    return found


def _cell(layer, reset_after, activation, recurrent_activation):
    g = validate.name(activation, "activation", ACTIVATIONS, _NOTE)
    if layer == "SimpleRNN":
        _gru_only(reset_after, "reset_after", layer)
        if recurrent_activation is not None:
            raise ValueError("recurrent_activation: a Keras SimpleRNN has none (its one "
                             "activation is `activation`)")
        return RNNCell(g)
    f = validate.name("sigmoid" if recurrent_activation is None else recurrent_activation,
                      "recurrent_activation", ACTIVATIONS, _NOTE)
    if layer == "LSTM":
        _gru_only(reset_after, "reset_after", layer)
        return LSTMCell(f_i=f, f_f=f, f_o=f, g=g, h=g)
    reset_after = True if reset_after is None else validate.flag(reset_after, "reset_after")
    return GRUCell(reset_after=reset_after, f_r=f, f_z=f, g=g)


def from_keras(layers, *, reset_after=None, bidirectional=False, activation="tanh",
               recurrent_activation=None, layer=None):
    """A ``cgru.Network`` (with Keras' cell) from Keras ``get_weights()`` lists, one per
    stacked layer (each 2 or 3 arrays per direction; 2 means ``use_bias=False``).

    The layer is read from the first recurrent kernel ``[H, G·H]`` (G = 3 ``GRU``, 4 ``LSTM``,
    1 ``SimpleRNN``); ``layer`` ("GRU", "LSTM", "SimpleRNN") confirms it.  ``reset_after``
    (GRU only; ``None``: True, Keras' default), ``activation`` and ``recurrent_activation``
    (GRU, LSTM; ``None``: sigmoid) as the layer's arguments (``keras_config``), names ``str``
    or ``bytes``.  Errors about the backward direction's arrays of a ``Bidirectional`` layer
    say ``(backward)``."""
    if not isinstance(layers, (list, tuple)) or not layers:
        raise TypeError("layers: expected a non-empty list of get_weights() lists")
    if layer is not None:
        layer = _rules.option(layer, "layer", tuple(LAYERS))
    D = 2 if validate.flag(bidirectional, "bidirectional") else 1
    out, dtype, I, H, G, cell, order = [], None, None, None, None, None, None
    for l, weights in enumerate(layers):
        weights = _rules.array_list(weights, f"layers[{l}]")
        if len(weights) not in (2 * D, 3 * D):
            raise ValueError(f"layers[{l}]: expected {2 * D} or {3 * D} arrays "
                             f"({'Bidirectional' if D == 2 else 'one direction'}), got "
                             f"{len(weights)}")
        per = len(weights) // D
        for d in range(D):
            w = weights[d * per:(d + 1) * per]
            what = {s: f"layers[{l}] {s}" + (" (backward)" if d else "")
                    for s in ("kernel", "recurrent_kernel", "bias")}
            K = _rules.weight(w[0], what["kernel"], dtype)
            RK = _rules.weight(w[1], what["recurrent_kernel"], K.dtype)
            if H is None:                           # the sizes come from the first kernels
                if K.ndim != 2 or 0 in K.shape:
                    raise ValueError(f"{what['kernel']}: expected shape [in, G·H] with in ≥ 1 "
                                     f"and H ≥ 1, got {list(K.shape)}")
                ok = RK.ndim == 2 and RK.shape[0] and RK.shape[1] % RK.shape[0] == 0
                name = _layer_of(layer, RK.shape[1] // RK.shape[0] if ok else 0, RK,
                                 what["recurrent_kernel"])
                cell = _cell(name, reset_after, activation, recurrent_activation)
                dtype, I, H, G, order = K.dtype, K.shape[0], RK.shape[0], cell.gates, \
                    _rules.inverse(LAYERS[name][2])
            _rules.shaped(K, what["kernel"], (I if l == 0 else D * H, G * H))
            _rules.shaped(RK, what["recurrent_kernel"], (H, G * H))
            canonical = lambda a: _rules.permute_gates(a, H, order)     # noqa: E731
            W, R = canonical(K.T), canonical(RK.T)
            two_biases = cell.kind == "gru" and cell.reset_after
            if per == 2:
                bW, bR = np.zeros(G * H, dtype), np.zeros(G * H, dtype)
            elif two_biases:
                b = _rules.shaped(_rules.weight(w[2], what["bias"], dtype), what["bias"],
                                  (2, G * H))
                bW, bR = canonical(b[0]), canonical(b[1])
            else:
                b = _rules.shaped(_rules.weight(w[2], what["bias"], dtype), what["bias"],
                                  (G * H,))
                bW, bR = _rules.separate_biases(canonical(b), None, H, dtype)
            out.append(LayerParams(W=W, R=R, b_W=bW, b_R=bR))
    topo = Topology(I, H, len(layers), _rules.direction_from(D))
    return Network(topo, out, cell)
