"""ONNX ``GRU``, ``LSTM`` and ``RNN``: their ``W``/``R``/``B`` tensors, gate orders, activation
names and attributes.

One ONNX node is one layer; the operator is the cell's kind (``OP_TYPES``).  Its names map onto
the canonical parameters like this (``[A; B]`` stacks row blocks of ``H``)::

    GRU   (gates ONNX z, r, h → canonical r, z, n)
    W [D, 3H, I]  = [W_z; W_r; W_h] per direction      → W   = [W_r; W_z; W_n]
    R [D, 3H, H]  = [R_z; R_r; R_h]                     → R   = [R_r; R_z; R_n]
    B [D, 6H]     = [Wb_z, Wb_r, Wb_h, Rb_z, Rb_r, Rb_h] → b_W = [Wb_r, Wb_z, Wb_h],
                                                          b_R = [Rb_r, Rb_z, Rb_h]
    linear_before_reset = 0 / 1                         → GRUCell(reset_after=False / True)
    activations [f, g] (per direction)                  → GRUCell(f_r=f, f_z=f, g=g)

    LSTM  (gates ONNX i, o, f, c → canonical i, f, g, o)
    W [D, 4H, I]  = [W_i; W_o; W_f; W_c]                → W   = [W_i; W_f; W_c; W_o]
    R [D, 4H, H], B [D, 8H] = [Wb_iofc, Rb_iofc]        → R, b_W, b_R likewise
    P [D, 3H]     = [P_i, P_o, P_f] peepholes           → LSTMCell(peepholes=True),
                                                          LayerParams.P = [P_i, P_f, P_o]
                                                          (absent or all zeros: no peepholes,
                                                          the same function)
    activations [f, g, h] (per direction)               → LSTMCell(f_i=f_f=f_o=f, g=g, h=h)
    input_forget = 0 / 1                                → LSTMCell(input_forget=False / True)
                                                          (1: f = 1 − i, as onnxruntime)

    RNN
    W [D, H, I], R [D, H, H], B [D, 2H] = [Wb, Rb]      → W, R, b_W, b_R
    activations [f] (per direction)                     → RNNCell(f)  (two names for one
                                                          direction: the first, as
                                                          onnxruntime; the spec's default
                                                          is Tanh, Tanh)

    every operator: clip → the cell's clip; direction forward / reverse / bidirectional →
    Topology(direction=...); hidden_size → H; layout does not change the weights.

ONNX has no LSTM projection (refused).  With peepholes the gates see the cell state:
``a_i += P_i ⊙ c``, ``a_f += P_f ⊙ c``, ``a_o += P_o ⊙ c'`` (the new state), inside the clip;
with ``input_forget=1`` the forget gate's weights and ``P_f`` are not used.  Attribute values
may be ``str`` or ``bytes`` (``onnx.helper.get_attribute_value`` gives bytes).
"""
import dataclasses
import numbers

import numpy as np

from cgru.core import validate
from cgru.core.cells import Activation, GRUCell, LSTMCell, RNNCell
from cgru.core.network import DIRECTIONS, LayerParams, Network, Topology
from cgru.systems import _rules
from cgru.systems._rules import RZN_TO_ZRN

__all__ = ["ACTIVATIONS", "DIRECTIONS", "OP_TYPES", "PEEPHOLE_ORDER", "activations_to_cells",
           "cells_of", "layer_params", "attributes", "to_onnx", "from_onnx"]

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
# op_type -> (cell kind, gate count, canonical → ONNX gate order, default activations per
# direction)
OP_TYPES = {"GRU": ("gru", 3, RZN_TO_ZRN, ("Sigmoid", "Tanh")),
            "LSTM": ("lstm", 4, (0, 3, 1, 2), ("Sigmoid", "Tanh", "Tanh")),
            "RNN": ("rnn", 1, (0,), ("Tanh",))}
# ONNX P = [P_i, P_o, P_f] ↔ canonical LayerParams.P = [P_i, P_f, P_o] (its own inverse)
PEEPHOLE_ORDER = (0, 2, 1)
_OP_OF_KIND = {kind: op for op, (kind, _, _, _) in OP_TYPES.items()}
# what each operator's activations are, in order, per direction
_ACT_ROLES = {"GRU": "f, g", "LSTM": "f, g, h", "RNN": "f"}


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


def _parse_activations(activations, activation_alpha, activation_beta, op_type, D):
    """The ``Activation`` list (``len(defaults)·D``, forward direction first) of an ONNX node's
    activation attributes (see ``activations_to_cells``)."""
    defaults = list(OP_TYPES[op_type][3])
    per = len(defaults)
    if activations is None:
        names = defaults * D
    else:
        if isinstance(activations, (str, bytes)) or not hasattr(activations, "__iter__"):
            raise TypeError(f"activations: expected a list of names, got {activations!r}")
        names = [validate.text(a) for a in activations]
        if op_type == "RNN" and D == 1 and len(names) == 2:
            # the specification's default lists two names (Tanh, Tanh) whatever the direction;
            # onnxruntime reads the first (and its alpha/beta) for a one-direction node
            return _parse_activations(names, activation_alpha, activation_beta, op_type, 2)[:1]
        if len(names) != per * D:
            raise ValueError(f"activations: expected {per * D} names ({_ACT_ROLES[op_type]} "
                             f"for each of the {D} direction(s) of an ONNX {op_type}), got "
                             f"{len(names)}: {names}")
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
    return [acts[d * per:(d + 1) * per] for d in range(D)]


def _clip(clip):
    if clip is not None:
        if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not clip > 0:
            raise ValueError(f"clip: expected None or a positive float, got {clip!r}")
        return float(clip)
    return None


def cells_of(op_type, activations, activation_alpha, activation_beta, clip, num_directions,
             *, linear_before_reset=0, input_forget=0, peepholes=False):
    """One cell per direction of an ONNX ``op_type`` node ("GRU", "LSTM", "RNN") from its
    attributes (``activations_to_cells`` for the rules of the activation lists).
    ``linear_before_reset`` (0/1) is the GRU's, ``input_forget`` (0/1: ``f = 1 − i``) and
    ``peepholes`` (the node has a non-zero ``P``) the LSTM's; each must be 0 / False for the
    other operators."""
    acts = _parse_activations(activations, activation_alpha, activation_beta, op_type,
                              num_directions)
    clip = _clip(clip)
    _rules.option(linear_before_reset, "linear_before_reset", (0, 1))
    _rules.option(input_forget, "input_forget", (0, 1))
    if op_type != "GRU" and linear_before_reset:
        raise ValueError(f"linear_before_reset: is an ONNX GRU attribute; an ONNX {op_type} "
                         f"has none (expected 0, got {linear_before_reset})")
    if input_forget and op_type != "LSTM":
        raise ValueError(f"input_forget: is an ONNX LSTM attribute; an ONNX {op_type} has none "
                         f"(expected 0, got {input_forget})")
    if peepholes and op_type != "LSTM":
        raise ValueError(f"P: peepholes are an ONNX LSTM input; an ONNX {op_type} has none")
    if op_type == "GRU":
        return [GRUCell(reset_after=bool(linear_before_reset), f_r=f, f_z=f, g=g, clip=clip)
                for f, g in acts]
    if op_type == "LSTM":
        return [LSTMCell(f_i=f, f_f=f, f_o=f, g=g, h=h, clip=clip, peepholes=bool(peepholes),
                         input_forget=bool(input_forget)) for f, g, h in acts]
    return [RNNCell(f, clip=clip) for (f,) in acts]


def activations_to_cells(activations, activation_alpha, activation_beta, clip,
                         linear_before_reset, num_directions):
    """One ``cgru.Cell`` per direction from the ONNX ``GRU`` activation attributes.

    ``activations`` holds ``2·D`` names (``f, g`` per direction, forward first), ``str`` or
    ``bytes``, matched case-insensitively; ``None`` means ``Sigmoid, Tanh``.  The alpha (beta)
    list is consumed in activation order, one value per activation that takes an alpha (beta);
    a missing value is the default of the matching ONNX operator (``Activation``'s defaults).
    """
    return cells_of("GRU", activations, activation_alpha, activation_beta, clip,
                    num_directions, linear_before_reset=linear_before_reset)


def layer_params(W, R, B, num_directions, op_type="GRU", P=None):
    """Canonical ``LayerParams`` per direction from one node's ``W``, ``R``, ``B`` and, for an
    LSTM with peepholes, ``P`` ``[D, 3H]`` (ONNX i, o, f → canonical i, f, o); checked shapes;
    ``B`` may be None: zeros; ``P`` None: no peepholes.  The arrays are new."""
    H = R.shape[-1]
    _, G, order, _ = OP_TYPES[op_type]
    back = _rules.inverse(order)
    canonical = lambda a: _rules.permute_gates(a, H, back)       # noqa: E731
    out = []
    for d in range(num_directions):
        b = np.zeros(2 * G * H, W.dtype) if B is None else B[d]
        peep = None if P is None else _rules.permute_gates(P[d], H, PEEPHOLE_ORDER)
        out.append(LayerParams(W=canonical(W[d]), R=canonical(R[d]),
                               b_W=canonical(b[:G * H]), b_R=canonical(b[G * H:]), P=peep))
    return out


def _roles(cell):
    """The cell's activations in the order of its operator's ``activations`` (one direction)."""
    if cell.kind == "gru":
        return cell.f_z, cell.g
    if cell.kind == "lstm":
        return cell.f_i, cell.g, cell.h
    return (cell.activation,)


def attributes(cell, topo):
    """The node attributes of ``cell`` on ``topo``: ``hidden_size``, ``direction``,
    ``linear_before_reset`` (GRU), ``input_forget=1`` (an LSTM with coupled gates) and, when
    not the defaults, ``activations`` with explicit ``activation_alpha``/``activation_beta``
    (ONNX and onnxruntime disagree on some defaults), and ``clip``."""
    op_type = _OP_OF_KIND[cell.kind]
    names, alphas, betas = [], [], []
    for act in _roles(cell) * topo.num_directions:
        spelling, _, takes_alpha, takes_beta = _TABLE[_FROM_CGRU[act.name]]
        alpha, beta = (1.0, 0.0) if act.name == "identity" else (act.alpha, act.beta)
        names.append(spelling)
        if takes_alpha:
            alphas.append(alpha)
        if takes_beta:
            betas.append(beta)
    attrs = {"hidden_size": topo.hidden_size, "direction": topo.direction}
    if cell.kind == "gru":
        attrs["linear_before_reset"] = int(cell.reset_after)
    if cell.kind == "lstm" and cell.input_forget:
        attrs["input_forget"] = 1
    if names != list(OP_TYPES[op_type][3]) * topo.num_directions:
        attrs["activations"] = names
        if alphas:
            attrs["activation_alpha"] = alphas
        if betas:
            attrs["activation_beta"] = betas
    if cell.clip is not None:
        attrs["clip"] = cell.clip
    return attrs


def _require(cell, topo, linear_before_reset):
    """The operator of ``cell``, refused where ONNX cannot express it."""
    named = lambda a: a.name in _FROM_CGRU                        # noqa: E731
    if cell.kind == "gru":
        target, forms = _rules.demanded("ONNX GRU", linear_before_reset, "linear_before_reset",
                                        lambda ra: f"linear_before_reset={int(ra)}")
        _rules.require(cell, target, reset_after=forms, activations=named,
                       shared_gate_act=True, clip=True)
        return "GRU"
    if linear_before_reset is not None:
        raise ValueError(f"linear_before_reset: is an ONNX GRU attribute; the network's cell "
                         f"is {_rules.KIND_NAMES[cell.kind]}")
    if cell.kind == "lstm":
        _rules.require_lstm(cell, "ONNX LSTM", activations=named, shared_gate_act=True,
                            clip=True, peepholes=("ifo",), input_forget=True)
        _rules.no_projection(topo, "ONNX LSTM")
        return "LSTM"
    _rules.require_rnn(cell, "ONNX RNN", named, clip=True)
    return "RNN"


def to_onnx(net, cell=None, *, linear_before_reset=None):
    """``(layers, attributes)`` for one ONNX node per layer, of the operator of the network's
    cell: ``GRU`` (``cgru.GRUCell``), ``LSTM`` (``cgru.LSTMCell``) or ``RNN``
    (``cgru.RNNCell``).

    ``layers[l]`` = ``{"W": [D, G·H, in], "R": [D, G·H, H], "B": [D, 2G·H]}`` (ONNX's gate
    order, module docstring; ``B = [Wb, Rb]``), plus ``"P": [D, 3H]`` (i, o, f) for an LSTM
    with peepholes; ``attributes`` (the same for every node) as ``attributes``.  The identity
    maps to ``Affine(1, 0)``.  Layer ``l ≥ 1`` reads the previous ``Y [T, D, N, H]``
    transposed to ``[T, N, D·H]``.  Use as ``onnx.helper.make_node(op_type, …,
    **attributes)``, ``cgru.onnx.gru(X, **layers[0], **attributes)`` (``lstm``, ``rnn``
    likewise), and read back with ``from_onnx(layers, op_type=…,
    **attributes)``.  ``linear_before_reset`` (GRU; None: the cell's form) demands one form.
    """
    topo, cell = _rules.network_and_cell(net, cell)
    op_type = _require(cell, topo, linear_before_reset)
    _rules.require_topology(topo, f"ONNX {op_type}")
    H, D, order = topo.hidden_size, topo.num_directions, OP_TYPES[op_type][2]
    onnx = lambda a: _rules.permute_gates(a, H, order)           # noqa: E731
    layers = []
    for l in range(topo.num_layers):
        idx = range(l * D, (l + 1) * D)
        layer = {
            "W": np.stack([onnx(_rules.input_matrix(net, i)) for i in idx]),
            "R": np.stack([onnx(net[i].R) for i in idx]),
            "B": np.stack([np.concatenate([onnx(net[i].b_W), onnx(net[i].b_R)]) for i in idx])}
        if getattr(cell, "peepholes", False):
            layer["P"] = np.stack([_rules.permute_gates(net[i].P, H, PEEPHOLE_ORDER)
                                   for i in idx])
        layers.append(layer)
    return layers, attributes(cell, topo)


def _identity_for_affine(cell):
    """``to_onnx`` writes the identity as ``Affine(1, 0)``: read it back as the identity."""
    changes = {f.name: Activation("identity") for f in dataclasses.fields(cell)
               if getattr(cell, f.name) == _IDENTITY}
    return dataclasses.replace(cell, **changes) if changes else cell


def _shaped_R(R, what, op_type, D, G, H):
    """``R`` ``[D, G·H, H]``, else a ``ValueError`` that names the operator whose ``R`` it
    is, when it is another's."""
    if R.shape == (D, G * H, H):
        return R
    other = [op for op, (_, g, _, _) in OP_TYPES.items()
             if op != op_type and R.shape == (D, g * H, H)]
    hint = f" — an ONNX {other[0]}'s R: pass op_type={other[0]!r}" if other else ""
    raise ValueError(f"{what}: expected shape {validate.shape_text((D, G * H, H))} for "
                     f"op_type={op_type!r}, got {list(R.shape)}{hint}")


def from_onnx(layers, *, op_type="GRU", hidden_size=None, direction="forward",
              linear_before_reset=0, activations=None, activation_alpha=None,
              activation_beta=None, clip=None, layout=0, input_forget=0):
    """A ``cgru.Network`` (with the nodes' cell) from ONNX nodes of ``op_type`` ("GRU" — the
    default, as before the other operators —, "LSTM", "RNN"; ``str`` or ``bytes``):
    ``layers`` is one ``{"W", "R", "B"}`` dict per node (``B`` optional; an LSTM's ``P``
    optional) — or a single dict — all with the same attributes (ONNX's defaults:
    ``linear_before_reset=0``, the reset-before GRU; ``input_forget=0``).  A non-zero ``P`` in
    any node gives ``LSTMCell(peepholes=True)`` (every layer then has ``P``: zeros where a node
    has none); absent or all-zero ``P`` everywhere gives no peepholes (the same function, and
    the fast kernels).  ``input_forget=1`` gives ``LSTMCell(input_forget=True)``.

    The two directions of a bidirectional node must use the same activations (a network has
    one cell; ``cgru.onnx.gru`` / ``lstm`` / ``rnn`` run such a node directly, and
    ``cgru.onnx.recurrent_layers`` gives it as two networks).  ``layout`` (0 or 1) does not
    affect the weights.
    """
    op_type = _rules.option(op_type, "op_type", tuple(OP_TYPES))
    layers = _rules.node_list(layers, "{'W', 'R', 'B'}")
    direction = _rules.option(direction, "direction", DIRECTIONS)
    _rules.option(layout, "layout", (0, 1))
    if hidden_size is not None and (isinstance(hidden_size, bool)
                                    or not isinstance(hidden_size, (int, np.integer))):
        raise TypeError(f"hidden_size: expected None or an int, got {hidden_size!r}")
    D = 2 if direction == "bidirectional" else 1
    _, G, _, _ = OP_TYPES[op_type]
    cells = cells_of(op_type, activations, activation_alpha, activation_beta, clip, D,
                     linear_before_reset=linear_before_reset, input_forget=input_forget)
    if cells[0] != cells[-1]:
        raise ValueError("activations: the two directions use different activations, which "
                         "one cgru cell cannot express; run the node with cgru.onnx."
                         f"{op_type.lower()} (or see cgru.onnx.recurrent_layers)")
    optional = ("B", "P") if op_type == "LSTM" else ("B",)
    checked, dtype, I, H = [], None, None, None
    for l, node in enumerate(layers):
        what = f"layers[{l}]"
        node = _rules.tensor_dict(node, what, ("W", "R"), optional)
        R = _rules.weight(node["R"], f"{what}['R']", dtype)
        if H is None:                           # the sizes come from the first node
            if R.ndim != 3 or R.shape[-1] == 0:
                raise ValueError(f"{what}['R']: expected [D, {G if G > 1 else ''}H, H] with "
                                 f"H ≥ 1, got {list(R.shape)}")
            dtype, H = R.dtype, R.shape[-1]
            if hidden_size is not None and hidden_size != H:
                raise ValueError(f"hidden_size: {hidden_size} disagrees with {what}['R'] "
                                 f"{list(R.shape)}")
        W = _rules.weight(node["W"], f"{what}['W']", dtype)
        if I is None:
            I = _rules.dim(W, f"{what}['W']", -1, f"[D, {G}H, I]")
        _shaped_R(R, f"{what}['R']", op_type, D, G, H)
        _rules.shaped(W, f"{what}['W']", (D, G * H, I if l == 0 else D * H))
        B = node.get("B")
        if B is not None:
            B = _rules.shaped(_rules.weight(B, f"{what}['B']", dtype), f"{what}['B']",
                              (D, 2 * G * H))
        P = node.get("P")
        if P is not None:
            P = _rules.shaped(_rules.weight(P, f"{what}['P']", dtype), f"{what}['P']",
                              (D, 3 * H))
        checked.append((W, R, B, P))
    peepholes = any(P is not None and np.any(P) for _, _, _, P in checked)
    cell = _identity_for_affine(cells[0])
    if peepholes:
        cell = dataclasses.replace(cell, peepholes=True)
    out = []
    for W, R, B, P in checked:
        if peepholes and P is None:
            P = np.zeros((D, 3 * H), dtype)
        out += layer_params(W, R, B, D, op_type, P if peepholes else None)
    return Network(Topology(I, H, len(layers), direction), out, cell)
