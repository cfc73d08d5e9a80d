"""oneDNN's RNN primitive: plain ``ldigo``/``ldgo``/``ldio`` tensors, gate orders, cell kinds,
activation and direction names, and bias rules (``doc/primitives/rnn.md``).

``weights_layer [L, D, I, G, H]`` and ``weights_iter [L, D, S, G, H]`` hold each gate block
transposed (``ldigo[l, d, i, g, o] = W_g[o, i]``); ``bias [L, D, G_b, H]`` (``ldgo``)::

    vanilla_gru   G = 3, gates u (= z), r, o; the reset-before GRU; G_b = 3: the summed biases
    lbr_gru       G = 3, the reset-after GRU; G_b = 4: the z / r sums, b_Wn, then b_Rn (inside
                  the reset product)
    vanilla_lstm  G = 4, gates i, f, c̃, o (= canonical i, f, g, o); G_b = 4: b_W + b_R;
                  with a projection (LSTMP) weights_projection [L, D, H, P] (``ldio``:
                  [l, d, i, o] = W_p[o, i]) and S = P, else S = H
    vanilla_rnn   G = 1; G_b = 1: b_W + b_R; activation eltwise_relu, eltwise_tanh or
                  eltwise_logistic (ReLU, Tanh, Sigmoid)

oneDNN's activations are fixed otherwise (sigmoid gates, tanh), with no clip.  One
``weights_layer`` tensor holds every layer, so ``L > 1`` needs ``I == D·S``.
"""
import numpy as np

from cgru.core.cells import GRUCell, LSTMCell, RNNCell
from cgru.core.network import LayerParams, Network, Topology
from cgru.systems import _rules
from cgru.systems._rules import RZN_TO_ZRN

__all__ = ["to_onednn", "from_onednn", "DIRECTIONS", "CELL_KINDS", "ACTIVATIONS"]

# oneDNN direction name -> cgru's (``bidirectional_sum`` adds the directions' outputs, which
# cgru does not compute).
DIRECTIONS = {"unidirectional_left2right": "forward", "left2right": "forward",
              "unidirectional_right2left": "reverse", "right2left": "reverse",
              "bidirectional_concat": "bidirectional",
              "forward": "forward", "reverse": "reverse", "bidirectional": "bidirectional"}
_TO_DIRECTION = {"forward": "unidirectional_left2right", "reverse": "unidirectional_right2left",
                 "bidirectional": "bidirectional_concat"}
# cell kind -> (cgru kind, gate count G, bias gate count, reset_after of a GRU)
CELL_KINDS = {"vanilla_gru": ("gru", 3, 3, False), "lbr_gru": ("gru", 3, 4, True),
              "vanilla_lstm": ("lstm", 4, 4, None), "vanilla_rnn": ("rnn", 1, 1, None)}
# vanilla_rnn's activation (oneDNN algorithm kind) -> cgru activation name
ACTIVATIONS = {"eltwise_relu": "relu", "eltwise_tanh": "tanh", "eltwise_logistic": "sigmoid"}
_ACTIVATION_NAMES = {v: k for k, v in ACTIVATIONS.items()}
_ORDER = {"gru": RZN_TO_ZRN, "lstm": (0, 1, 2, 3), "rnn": (0,)}    # canonical → oneDNN gates


def _ldigo(M, H, width, kind):
    """Canonical ``[G·H, width]`` → oneDNN ``[width, G, H]`` (oneDNN's gate order)."""
    order = _ORDER[kind]
    return _rules.permute_gates(M, H, order).reshape(len(order), H, width).transpose(2, 0, 1)


def _canonical(a, H, width, kind):
    """oneDNN ``[width, G, H]`` → canonical ``[G·H, width]``."""
    order = _ORDER[kind]
    return _rules.permute_gates(a.transpose(1, 2, 0).reshape(len(order) * H, width), H,
                                _rules.inverse(order))


def _cell_kind_of(cell, cell_kind):
    """oneDNN's cell kind for ``cell`` (refused where oneDNN cannot compute it); ``cell_kind``
    (None: from the cell) demands one."""
    if cell_kind is not None:
        cell_kind = _rules.option(cell_kind, "cell_kind", tuple(CELL_KINDS),
                                  " (or None: from the cell)")
        kind, _, _, reset_after = CELL_KINDS[cell_kind]
        _rules.require_kind(cell, f"oneDNN {cell_kind}", (kind,))
    if cell.kind == "gru":
        _rules.require(cell, "oneDNN " + (cell_kind or "GRU"),
                       reset_after=None if cell_kind is None else (reset_after,))
        return "lbr_gru" if cell.reset_after else "vanilla_gru"
    if cell.kind == "lstm":
        _rules.require_lstm(cell, "oneDNN vanilla_lstm")
        return "vanilla_lstm"
    _rules.require_rnn(cell, "oneDNN vanilla_rnn", lambda a: a.name in _ACTIVATION_NAMES)
    return "vanilla_rnn"


def _bias(lp, cell, H):
    """oneDNN's ``[G_b, H]`` bias of one layer-direction (oneDNN's gate order)."""
    if cell.kind != "gru":
        return _rules.permute_gates(lp.b_W + lp.b_R, H, _ORDER[cell.kind]).reshape(-1, H)
    b_rz, b_n, b_Rn = _rules.merged_biases(lp, cell, H)
    b = _rules.permute_gates(np.concatenate([b_rz, b_n]), H, RZN_TO_ZRN).reshape(3, H)
    return np.concatenate([b, b_Rn[None]]) if cell.reset_after else b


def to_onednn(net, cell=None, *, cell_kind=None):
    """oneDNN RNN tensors (plain ``ldigo``/``ldgo``/``ldio`` formats) for the network's cell.

    ``{"weights_layer": [L, D, I, G, H], "weights_iter": [L, D, S, G, H],
    "bias": [L, D, G_b, H], "cell_kind": "vanilla_gru" | "lbr_gru" | "vanilla_lstm" |
    "vanilla_rnn", "direction": "unidirectional_left2right" | "unidirectional_right2left" |
    "bidirectional_concat"}``, plus ``"weights_projection": [L, D, H, P]`` for an LSTM with a
    projection and ``"activation"`` (``ACTIVATIONS``) for a vanilla RNN (module docstring).
    ``from_onednn(**to_onednn(net))`` reads it back.  Convert a stack with
    ``input_size != D·S`` layer by layer.  ``cell_kind`` (None: from the cell; ``str`` or
    ``bytes``) demands one.
    """
    topo, cell = _rules.network_and_cell(net, cell)
    kind_name = _cell_kind_of(cell, cell_kind)
    _rules.require_topology(topo, f"oneDNN {kind_name}")
    H, D, L, S, P = (topo.hidden_size, topo.num_directions, topo.num_layers, topo.state_size,
                     topo.proj_size)
    G, Gb = CELL_KINDS[kind_name][1:3]
    I = topo.input_size if topo.input_mode == "linear" else H
    if L > 1 and I != D * S:
        raise ValueError(f"oneDNN keeps all layers in one weights_layer [L, D, I, {G}, H], so "
                         f"L > 1 needs input_size == D·{'P' if P else 'H'} = {D * S}, got {I}; "
                         f"convert the layers one at a time")
    wl = np.empty((L, D, I, G, H), net.dtype)
    wi = np.empty((L, D, S, G, H), net.dtype)
    bias = np.empty((L, D, Gb, H), net.dtype)
    wp = np.empty((L, D, H, P), net.dtype) if P else None
    for i, lp in enumerate(net):
        l, d = divmod(i, D)
        wl[l, d] = _ldigo(_rules.input_matrix(net, i), H, I, cell.kind)
        wi[l, d] = _ldigo(lp.R, H, S, cell.kind)
        bias[l, d] = _bias(lp, cell, H)
        if P:
            wp[l, d] = lp.W_p.T
    out = {"weights_layer": wl, "weights_iter": wi, "bias": bias, "cell_kind": kind_name,
           "direction": _TO_DIRECTION[topo.direction]}
    if P:
        out["weights_projection"] = wp
    if cell.kind == "rnn":
        out["activation"] = _ACTIVATION_NAMES[cell.activation.name]
    return out


def _kind_of(wl, b, cell_kind, activation, weights_projection):
    """oneDNN's cell kind of the tensors (``G`` from ``weights_layer``, a GRU's form from the
    bias gates), confirmed by ``cell_kind``; the options of the other kinds are refused."""
    G = wl.shape[3]
    kinds = [k for k, (_, g, gb, _) in CELL_KINDS.items() if g == G and gb == b.shape[2]]
    if cell_kind is not None:
        cell_kind = _rules.option(cell_kind, "cell_kind", tuple(CELL_KINDS),
                                  " (or None: from the tensors)")
        if cell_kind not in kinds:
            _, g, gb, _ = CELL_KINDS[cell_kind]
            raise ValueError(f"cell_kind={cell_kind!r} (weights_layer [L, D, I, {g}, H], bias "
                             f"[L, D, {gb}, H]) contradicts the tensors: weights_layer "
                             f"{list(wl.shape)}, bias {list(b.shape)}")
    if not kinds:
        raise ValueError(f"bias: expected ldgo [L, D, G_b, H] with G_b = "
                         f"{' or '.join(str(gb) for _, g, gb, _ in CELL_KINDS.values() if g == G)}"
                         f" for weights_layer's G = {G}, got {list(b.shape)}")
    kind = cell_kind or kinds[0]
    if kind != "vanilla_rnn" and activation is not None:
        raise ValueError(f"activation: is vanilla_rnn's option; the tensors are {kind}'s")
    if kind != "vanilla_lstm" and weights_projection is not None:
        raise ValueError(f"weights_projection: is vanilla_lstm's (LSTMP); the tensors are "
                         f"{kind}'s")
    return kind


def _cell(kind, activation):
    if kind == "vanilla_lstm":
        return LSTMCell()
    if kind == "vanilla_rnn":
        if activation is None:
            raise ValueError(f"activation: a vanilla_rnn needs its activation, one of "
                             f"{', '.join(ACTIVATIONS)} (the tensors do not record it)")
        return RNNCell(ACTIVATIONS[_rules.option(activation, "activation", tuple(ACTIVATIONS))])
    return GRUCell(reset_after=CELL_KINDS[kind][3])


def from_onednn(weights_layer, weights_iter, bias, *, direction="unidirectional_left2right",
                cell_kind=None, activation=None, weights_projection=None):
    """A ``cgru.Network`` from oneDNN ``ldigo``/``ldgo`` tensors (``from_onednn(**to_onednn(
    net))`` works).  The kind is read from the gate axes: ``weights_layer``'s ``G`` = 4 →
    vanilla_lstm, 1 → vanilla_rnn, 3 → GRU, LBR GRU (reset-after) when ``bias`` has 4 gates,
    vanilla GRU (reset-before) with 3; ``cell_kind`` confirms it.  ``activation`` (a
    vanilla_rnn's, required: ``ACTIVATIONS``) and ``weights_projection`` (an LSTMP's
    ``[L, D, H, P]``; then ``weights_iter`` is ``[L, D, P, 4, H]``) belong to those kinds only.
    Names (``direction``, ``cell_kind``, ``activation``) may be ``str`` or ``bytes``;
    ``bidirectional_sum`` is refused (cgru concatenates the directions)."""
    name = _rules.option(direction, "direction", tuple(DIRECTIONS),
                         " (bidirectional_sum adds the directions' outputs, which cgru does "
                         "not compute)")
    cgru_dir = DIRECTIONS[name]
    wl = _rules.weight(weights_layer, "weights_layer")
    dtype = wl.dtype
    if wl.ndim != 5 or wl.shape[3] not in (1, 3, 4):
        raise ValueError(f"weights_layer: expected ldigo [L, D, I, G, H] with G = 3 (GRU), 4 "
                         f"(LSTM) or 1 (vanilla RNN), got {list(wl.shape)}")
    L, D, I, G, H = wl.shape
    want_D = 2 if cgru_dir == "bidirectional" else 1
    if D != want_D:
        raise ValueError(f"weights_layer: direction {name!r} needs D = {want_D}, got shape "
                         f"{list(wl.shape)}")
    b = _rules.weight(bias, "bias", dtype)
    if b.ndim != 4:
        raise ValueError(f"bias: expected ldgo [L, D, G_b, H], got {list(b.shape)}")
    kind = _kind_of(wl, b, cell_kind, activation, weights_projection)
    cell = _cell(kind, activation)
    P = 0
    if weights_projection is not None:
        wp = _rules.weight(weights_projection, "weights_projection", dtype)
        P = _rules.dim(wp, "weights_projection", -1, "ldio [L, D, H, P]")
        _rules.shaped(wp, "weights_projection", (L, D, H, P))
    S = P or H
    wi = _rules.shaped(_rules.weight(weights_iter, "weights_iter", dtype), "weights_iter",
                       (L, D, S, G, H))
    _rules.shaped(b, "bias", (L, D, b.shape[2], H))
    if L > 1 and I != D * S:
        raise ValueError(f"weights_layer: L > 1 needs I == D·{'P' if P else 'H'} = {D * S}, "
                         f"got I = {I}")
    reset_after = cell.kind == "gru" and cell.reset_after
    layers = []
    for l in range(L):
        for d in range(D):
            b_sum = _rules.permute_gates(b[l, d, :G].reshape(G * H), H,
                                         _rules.inverse(_ORDER[cell.kind]))
            b_W, b_R = _rules.separate_biases(b_sum, b[l, d, 3] if reset_after else None, H,
                                              dtype)
            layers.append(LayerParams(W=_canonical(wl[l, d], H, I, cell.kind),
                                      R=_canonical(wi[l, d], H, S, cell.kind), b_W=b_W, b_R=b_R,
                                      W_p=np.ascontiguousarray(wp[l, d].T) if P else None))
    return Network(Topology(I, H, L, cgru_dir, proj_size=P), layers, cell)
