"""ONNX ``GRU``: its ``W``/``R``/``B`` tensors, gate order, activation names and attributes.

One ONNX node is one layer.  Its names map onto the canonical parameters like this (gates:
ONNX ``z, r, h`` → canonical ``r, z, n``)::

    W [D, 3H, I]  = [W_z; W_r; W_h] per direction      → W   = [W_r; W_z; W_n]
    R [D, 3H, H]  = [R_z; R_r; R_h]                     → R   = [R_r; R_z; R_n]
    B [D, 6H]     = [Wb_z, Wb_r, Wb_h, Rb_z, Rb_r, Rb_h] → b_W = [Wb_r, Wb_z, Wb_h],
                                                          b_R = [Rb_r, Rb_z, Rb_h]
    linear_before_reset = 0 / 1                         → Cell(reset_after=False / True)
    activations [f, g] (per direction)                  → Cell(f_r=f, f_z=f, g=g)
    clip                                                → Cell(clip=clip)
    direction forward / reverse / bidirectional         → Topology(direction=...)

Attribute values may be ``str`` or ``bytes`` (``onnx.helper.get_attribute_value`` gives bytes).
"""
import numbers

import numpy as np

from cgru.core import validate
from cgru.core.cells import Activation, GRUCell
from cgru.core.network import DIRECTIONS, LayerParams, Network, Topology
from cgru.systems import _rules
from cgru.systems._rules import RZN_TO_ZRN

__all__ = ["ACTIVATIONS", "DIRECTIONS", "activations_to_cells",
           "layer_params", "attributes", "to_onnx", "from_onnx"]

# ONNX activation name (lower case) -> (its spelling, cgru activation name, takes alpha,
# takes beta).
_TABLE = {
    "relu": ("Relu", "relu", False, False),
    "tanh": ("Tanh", "tanh", False, False),
    "sigmoid": ("Sigmoid", "sigmoid", False, False),
    "affine": ("Affine", "affine", True, True),
    "leakyrelu": ("LeakyRelu", "leaky_relu", True, False),
    "thresholdedrelu": ("ThresholdedRelu", "thresholded_relu", True, False),
    "scaledtanh": ("ScaledTanh", "scaled_tanh", True, True),
    "hardsigmoid": ("HardSigmoid", "hard_sigmoid", True, True),
    "elu": ("Elu", "elu", True, False),
    "softsign": ("Softsign", "softsign", False, False),
    "softplus": ("Softplus", "softplus", False, False),
}
# ONNX activation name (lower case) -> (cgru activation name, takes alpha, takes beta).
ACTIVATIONS = {k: v[1:] for k, v in _TABLE.items()}
# cgru activation name -> ONNX key; the identity is written as Affine(1, 0).
_FROM_CGRU = {v[1]: k for k, v in _TABLE.items()}
_FROM_CGRU["identity"] = "affine"
_IDENTITY = Activation("affine", 1.0, 0.0)
_DEFAULTS = ["Sigmoid", "Tanh"]


def _float_list(values, what):
    if values is None:
        return []
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{what}: expected a list of floats, got {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{what}: expected a list of floats, got element {v!r}")
        out.append(float(v))
    return out


def activations_to_cells(activations, activation_alpha, activation_beta, clip,
                         linear_before_reset, num_directions):
    """One ``cgru.Cell`` per direction from the ONNX activation attributes.

    ``activations`` holds ``2·D`` names (``f, g`` per direction, forward first), ``str`` or
    ``bytes``, matched case-insensitively; ``None`` means ``Sigmoid, Tanh``.  The alpha (beta)
    list is consumed in activation order, one value per activation that takes an alpha (beta);
    a missing value is the default of the matching ONNX operator (``Activation``'s defaults).
    """
    D = num_directions
    if activations is None:
        names = _DEFAULTS * D
    else:
        if isinstance(activations, (str, bytes)) or not hasattr(activations, "__iter__"):
            raise TypeError(f"activations: expected a list of names, got {activations!r}")
        names = [validate.text(a) for a in activations]
        if len(names) != 2 * D:
            raise ValueError(f"activations: expected {2 * D} names (f, g for each of the "
                             f"{D} direction(s)), got {len(names)}: {names}")
    alphas = _float_list(activation_alpha, "activation_alpha")
    betas = _float_list(activation_beta, "activation_beta")
    acts = []
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise TypeError(f"activations[{i}]: expected a name (str or bytes), got {name!r}")
        key = name.lower()
        if key not in ACTIVATIONS:
            raise ValueError(f"activations[{i}]: unknown ONNX activation {name!r}; expected one "
                             f"of {', '.join(v[0] for v in _TABLE.values())} (any case)")
        cgru_name, takes_alpha, takes_beta = ACTIVATIONS[key]
        alpha = alphas.pop(0) if takes_alpha and alphas else None
        beta = betas.pop(0) if takes_beta and betas else None
        acts.append(Activation(cgru_name, alpha, beta))
    if alphas or betas:
        raise ValueError(f"activation_alpha/activation_beta: {len(alphas)} alpha and "
                         f"{len(betas)} beta value(s) left over after the activations {names} "
                         f"took theirs")
    if clip is not None:
        if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not clip > 0:
            raise ValueError(f"clip: expected None or a positive float, got {clip!r}")
    _rules.option(linear_before_reset, "linear_before_reset", (0, 1))
    return [GRUCell(reset_after=bool(linear_before_reset), f_r=acts[2 * d], f_z=acts[2 * d],
                    g=acts[2 * d + 1], clip=None if clip is None else float(clip))
            for d in range(D)]


def layer_params(W, R, B, num_directions):
    """Canonical ``LayerParams`` per direction from one node's ``W``, ``R``, ``B`` (checked
    shapes; ``B`` may be None: zeros).  The arrays are new."""
    H = R.shape[-1]
    out = []
    for d in range(num_directions):
        b = np.zeros(6 * H, W.dtype) if B is None else B[d]
        out.append(LayerParams(W=_rules.permute_gates(W[d], H, RZN_TO_ZRN),
                               R=_rules.permute_gates(R[d], H, RZN_TO_ZRN),
                               b_W=_rules.permute_gates(b[:3 * H], H, RZN_TO_ZRN),
                               b_R=_rules.permute_gates(b[3 * H:], H, RZN_TO_ZRN)))
    return out


def attributes(cell, topo):
    """The node attributes of ``cell`` on ``topo``: ``hidden_size``, ``direction``,
    ``linear_before_reset`` and, when not the defaults, ``activations`` with explicit
    ``activation_alpha``/``activation_beta`` (ONNX and onnxruntime disagree on some
    defaults), and ``clip``."""
    names, alphas, betas = [], [], []
    for act in (cell.f_z, cell.g) * topo.num_directions:
        spelling, _, takes_alpha, takes_beta = _TABLE[_FROM_CGRU[act.name]]
        alpha, beta = (1.0, 0.0) if act.name == "identity" else (act.alpha, act.beta)
        names.append(spelling)
        if takes_alpha:
            alphas.append(alpha)
        if takes_beta:
            betas.append(beta)
    attrs = {"hidden_size": topo.hidden_size, "direction": topo.direction,
             "linear_before_reset": int(cell.reset_after)}
    if names != _DEFAULTS * topo.num_directions:
        attrs["activations"] = names
        if alphas:
            attrs["activation_alpha"] = alphas
        if betas:
            attrs["activation_beta"] = betas
    if cell.clip is not None:
        attrs["clip"] = cell.clip
    return attrs


def to_onnx(net, cell=None, *, linear_before_reset=None):
    """``(layers, attributes)`` for one ONNX ``GRU`` node per layer.

    ``layers[l]`` = ``{"W": [D, 3H, in], "R": [D, 3H, H], "B": [D, 6H]}`` (gates z, r, h;
    ``B = [Wb, Rb]``); ``attributes`` (the same for every node) as ``attributes``.  The
    identity maps to ``Affine(1, 0)``.  Layer ``l ≥ 1`` reads the previous ``Y [T, D, N, H]``
    transposed to ``[T, N, D·H]``.  Use as ``cgru.onnx.gru(X, **layers[0], **attributes)``.
    ``linear_before_reset`` (None: the cell's form) demands one form.
    """
    topo, cell = _rules.network_and_cell(net, cell)
    target, forms = _rules.demanded("ONNX GRU", linear_before_reset, "linear_before_reset",
                                    lambda ra: f"linear_before_reset={int(ra)}")
    _rules.require(cell, target, reset_after=forms, activations=lambda a: a.name in _FROM_CGRU,
                   shared_gate_act=True, clip=True)
    _rules.require_topology(topo, "ONNX GRU")
    H, D = topo.hidden_size, topo.num_directions
    layers = []
    for l in range(topo.num_layers):
        idx = range(l * D, (l + 1) * D)
        zrn = lambda a: _rules.permute_gates(a, H, RZN_TO_ZRN)       # noqa: E731
        layers.append({
            "W": np.stack([zrn(_rules.input_matrix(net, i)) for i in idx]),
            "R": np.stack([zrn(net[i].R) for i in idx]),
            "B": np.stack([np.concatenate([zrn(net[i].b_W), zrn(net[i].b_R)]) for i in idx])})
    return layers, attributes(cell, topo)


def _identity_for_affine(cell):
    """``to_onnx`` writes the identity as ``Affine(1, 0)``: read it back as the identity."""
    if cell.g == _IDENTITY:
        cell = GRUCell(reset_after=cell.reset_after, f_r=cell.f_r, f_z=cell.f_z, g="identity",
                       clip=cell.clip)
    if cell.f_z == _IDENTITY:
        cell = GRUCell(reset_after=cell.reset_after, f_r="identity", f_z="identity", g=cell.g,
                       clip=cell.clip)
    return cell


def from_onnx(layers, *, hidden_size=None, direction="forward", linear_before_reset=0,
              activations=None, activation_alpha=None, activation_beta=None, clip=None,
              layout=0):
    """A ``cgru.Network`` (with the nodes' cell) from ONNX ``GRU`` nodes: ``layers`` is one
    ``{"W", "R", "B"}`` dict per node (``B`` optional) — or a single dict — all with the same
    attributes (ONNX's defaults: ``linear_before_reset=0``, the reset-before cell).

    The two directions of a bidirectional node must use the same activations (a network has
    one cell; ``cgru.onnx.gru`` runs such a node directly).  ``layout`` (0 or 1) does not
    affect the weights.
    """
    layers = _rules.node_list(layers, "{'W', 'R', 'B'}")
    direction = _rules.option(direction, "direction", DIRECTIONS)
    _rules.option(layout, "layout", (0, 1))
    if hidden_size is not None and (isinstance(hidden_size, bool)
                                    or not isinstance(hidden_size, (int, np.integer))):
        raise TypeError(f"hidden_size: expected None or an int, got {hidden_size!r}")
    D = 2 if direction == "bidirectional" else 1
    cells = activations_to_cells(activations, activation_alpha, activation_beta, clip,
                                 linear_before_reset, D)
    if cells[0] != cells[-1]:
        raise ValueError("activations: the two directions use different activations, which "
                         "one cgru.Cell cannot express; run the node with cgru.onnx.gru")
    out, dtype, I, H = [], None, None, None
    for l, node in enumerate(layers):
        what = f"layers[{l}]"
        node = _rules.tensor_dict(node, what, ("W", "R"), ("B",))
        R = _rules.weight(node["R"], f"{what}['R']", dtype)
        if H is None:                           # the sizes come from the first node
            if R.ndim != 3 or R.shape[-1] == 0:
                raise ValueError(f"{what}['R']: expected [D, 3H, H] with H ≥ 1, got "
                                 f"{list(R.shape)}")
            dtype, H = R.dtype, R.shape[-1]
            if hidden_size is not None and hidden_size != H:
                raise ValueError(f"hidden_size: {hidden_size} disagrees with {what}['R'] "
                                 f"{list(R.shape)}")
        W = _rules.weight(node["W"], f"{what}['W']", dtype)
        if I is None:
            I = _rules.dim(W, f"{what}['W']", -1, "[D, 3H, I]")
        _rules.shaped(R, f"{what}['R']", (D, 3 * H, H))
        _rules.shaped(W, f"{what}['W']", (D, 3 * H, I if l == 0 else D * H))
        B = node.get("B")
        if B is not None:
            B = _rules.shaped(_rules.weight(B, f"{what}['B']", dtype), f"{what}['B']",
                              (D, 6 * H))
        out += layer_params(W, R, B, D)
    return Network(Topology(I, H, len(layers), direction), out, _identity_for_affine(cells[0]))
