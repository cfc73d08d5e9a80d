"""oneDNN's RNN primitive for GRUs: plain ``ldigo``/``ldgo`` tensors, gate order, cell kinds,
direction names and bias rules.

Gates ``u (= z), r, o``; ``weights_layer [L, D, I, 3, H]`` and ``weights_iter [L, D, H, 3, H]``
hold each gate block transposed (``ldigo[l, d, i, g, o] = W_g[o, i]``); ``bias [L, D, G, H]``.
The reset-before cell is oneDNN's vanilla GRU (``G = 3``, the summed biases); the reset-after
cell is LBR GRU (``G = 4``: the ``z``/``r`` sums, ``b_Wn``, then ``b_Rn`` inside the reset
product).  One ``weights_layer`` tensor holds every layer, so ``L > 1`` needs ``I == D·H``.
"""
import numpy as np

from cgru.core.cells import GRUCell
from cgru.core.network import LayerParams, Network, Topology
from cgru.systems import _rules
from cgru.systems._rules import RZN_TO_ZRN

__all__ = ["to_onednn", "from_onednn", "DIRECTIONS", "CELL_KINDS"]

# oneDNN direction name -> cgru's (``bidirectional_sum`` adds the directions' outputs, which
# cgru does not compute).
DIRECTIONS = {"unidirectional_left2right": "forward", "left2right": "forward",
              "unidirectional_right2left": "reverse", "right2left": "reverse",
              "bidirectional_concat": "bidirectional",
              "forward": "forward", "reverse": "reverse", "bidirectional": "bidirectional"}
_TO_DIRECTION = {"forward": "unidirectional_left2right", "reverse": "unidirectional_right2left",
                 "bidirectional": "bidirectional_concat"}
# cell kind -> the candidate form it computes (reset_after)
CELL_KINDS = {"vanilla_gru": False, "lbr_gru": True}


def _ldigo(M, H, width):
    """Canonical ``[3H, width]`` → oneDNN ``[width, 3, H]`` (gates u, r, o)."""
    return _rules.permute_gates(M, H, RZN_TO_ZRN).reshape(3, H, width).transpose(2, 0, 1)


def _canonical(a, H, width):
    """oneDNN ``[width, 3, H]`` → canonical ``[3H, width]``."""
    return _rules.permute_gates(a.transpose(1, 2, 0).reshape(3 * H, width), H, RZN_TO_ZRN)


def to_onednn(net, cell=None, *, cell_kind=None):
    """oneDNN RNN tensors (plain ``ldigo``/``ldgo`` formats) for ``gru`` or ``lbr_gru``.

    ``{"weights_layer": [L, D, I, 3, H], "weights_iter": [L, D, H, 3, H], "bias": [L, D, G, H],
    "cell_kind": "vanilla_gru" | "lbr_gru", "direction": "unidirectional_left2right" |
    "unidirectional_right2left" | "bidirectional_concat"}``, gates ``u (= z), r, o``
    (module docstring).  Convert a stack with ``input_size != D·H`` layer by layer.
    ``cell_kind`` (None: from the cell; ``str`` or ``bytes``) demands one of the two.
    """
    topo, cell = _rules.network_and_cell(net, cell)
    if cell_kind is not None:
        cell_kind = _rules.option(cell_kind, "cell_kind", tuple(CELL_KINDS),
                                  " (or None: from the cell)")
    _rules.require(cell, "oneDNN " + (cell_kind or "GRU"),
                   reset_after=None if cell_kind is None else (CELL_KINDS[cell_kind],))
    _rules.require_topology(topo, "oneDNN GRU")
    H, D, L = topo.hidden_size, topo.num_directions, topo.num_layers
    I = topo.input_size if topo.input_mode == "linear" else H
    if L > 1 and I != D * H:
        raise ValueError(f"oneDNN keeps all layers in one weights_layer [L, D, I, 3, H], so "
                         f"L > 1 needs input_size == D·H = {D * H}, got {I}; convert the layers "
                         f"one at a time")
    G = 4 if cell.reset_after else 3
    wl = np.empty((L, D, I, 3, H), net.dtype)
    wi = np.empty((L, D, H, 3, H), net.dtype)
    bias = np.empty((L, D, G, H), net.dtype)
    for i, lp in enumerate(net):
        l, d = divmod(i, D)
        wl[l, d] = _ldigo(_rules.input_matrix(net, i), H, I)
        wi[l, d] = _ldigo(lp.R, H, H)
        b_rz, b_n, b_Rn = _rules.merged_biases(lp, cell, H)
        bias[l, d, :3] = _rules.permute_gates(np.concatenate([b_rz, b_n]), H,
                                              RZN_TO_ZRN).reshape(3, H)
        if cell.reset_after:
            bias[l, d, 3] = b_Rn
    return {"weights_layer": wl, "weights_iter": wi, "bias": bias,
            "cell_kind": "lbr_gru" if cell.reset_after else "vanilla_gru",
            "direction": _TO_DIRECTION[topo.direction]}


def from_onednn(weights_layer, weights_iter, bias, *, direction="unidirectional_left2right"):
    """A ``cgru.Network`` from oneDNN ``ldigo``/``ldgo`` tensors; the cell is LBR GRU
    (reset-after) when ``bias`` has 4 gates, vanilla GRU (reset-before) with 3.
    ``direction`` (``str`` or ``bytes``): ``bidirectional_sum`` is refused (cgru concatenates
    the directions)."""
    name = _rules.option(direction, "direction", tuple(DIRECTIONS),
                         " (bidirectional_sum adds the directions' outputs, which cgru does "
                         "not compute)")
    cgru_dir = DIRECTIONS[name]
    wl = _rules.weight(weights_layer, "weights_layer")
    dtype = wl.dtype
    if wl.ndim != 5 or wl.shape[3] != 3:
        raise ValueError(f"weights_layer: expected ldigo [L, D, I, 3, H], got {list(wl.shape)}")
    L, D, I, _, H = wl.shape
    want_D = 2 if cgru_dir == "bidirectional" else 1
    if D != want_D:
        raise ValueError(f"weights_layer: direction {name!r} needs D = {want_D}, got shape "
                         f"{list(wl.shape)}")
    wi = _rules.shaped(_rules.weight(weights_iter, "weights_iter", dtype), "weights_iter",
                       (L, D, H, 3, H))
    b = _rules.weight(bias, "bias", dtype)
    if b.ndim != 4 or b.shape[2] not in (3, 4):
        raise ValueError(f"bias: expected ldgo [L, D, 3 or 4, H], got {list(b.shape)}")
    _rules.shaped(b, "bias", (L, D, b.shape[2], H))
    reset_after = b.shape[2] == 4
    if L > 1 and I != D * H:
        raise ValueError(f"weights_layer: L > 1 needs I == D·H = {D * H}, got I = {I}")
    layers = []
    for l in range(L):
        for d in range(D):
            b_W, b_R = _rules.separate_biases(
                _rules.permute_gates(b[l, d, :3].reshape(3 * H), H, RZN_TO_ZRN),
                b[l, d, 3] if reset_after else None, H, dtype)
            layers.append(LayerParams(W=_canonical(wl[l, d], H, I),
                                      R=_canonical(wi[l, d], H, H), b_W=b_W, b_R=b_R))
    return Network(Topology(I, H, L, cgru_dir), layers, GRUCell(reset_after=reset_after))
