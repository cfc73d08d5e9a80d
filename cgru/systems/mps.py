"""Apple MPSGraph ``GRU``, ``LSTM`` and ``singleGateRNN``: their tensors, gate orders,
activation names, descriptor options and bias rules.

GRU:
One op is one layer.  Gate order ``[z, r, o]`` (``[r, z, o]`` with ``reset_gate_first``) in
``input_weight [D·3H, in]``, ``recurrent_weight [3H, H]`` / ``[2, 3H, H]``, ``bias [D·3H]``
and a projected source; matrices ``[out, in]`` applied as ``x·Wᵀ``; every tensor packed
forward direction first.  ``bias`` is added outside the reset product for all three gates:
``z``/``r`` get ``b_W + b_R``; ``o`` gets ``b_Wn`` (``reset_after``, with
``secondary_bias [D·H] = b_Rn`` inside the product) or ``b_Wn + b_Rn``.  Without
``input_weight`` the source holds the gate pre-activations (cgru's ``"projected"`` input mode,
which holds them in canonical order: the source must be reordered — see ``source_to_canonical``
— and a converted model needs ``reset_gate_first=True``).

Descriptor options → cell: ``reset_after``, ``flip_z`` (``False``: ``h' = z⊙h + (1−z)⊙o``, the
operation's documentation), ``update_gate_activation`` → ``f_z``, ``reset_gate_activation`` →
``f_r``, ``output_gate_activation`` → ``g``, from ``ACTIVATIONS`` (``"none"`` is the identity;
``hard_sigmoid`` is ``clip(0.2·x + 0.5, 0, 1)``); ``reverse`` / ``bidirectional`` → direction.

LSTM (``lstm_network``, ``from_mps_lstm``, ``to_mps_lstm``): gate order ``[i, f, z, o]``
(``[i, z, f, o]`` with ``forget_gate_last``, the order Apple's comment writes) → canonical
``i, f, g, o``; ``input_weight [D·4H, in]``, ``recurrent_weight [4H, H]`` / ``[2, 4H, H]``,
``bias [D·4H]`` (→ ``b_W``, ``b_R = 0``), ``peephole [4H]`` / ``[2, 4H]`` added as
``p ⊙ c[t−1]`` to every gate: ``LSTMCell(peepholes="ifgo")``, ``LayerParams.P =
[P_i, P_f, P_g, P_o]`` (a network with ONNX-form peepholes, whose output gate reads ``c[t]``,
converts to MPSGraph only with a zero output-gate block).  Activations: ``input_gate_activation`` → ``f_i``,
``forget_gate_activation`` → ``f_f``, ``cell_gate_activation`` → ``g``,
``output_gate_activation`` → ``f_o``, ``activation`` → ``h``.

Single-gate RNN (``rnn_network``, ``from_mps_rnn``, ``to_mps_rnn``): ``input_weight [D·H, in]``,
``recurrent_weight [H, H]`` / ``[2, H, H]``, ``bias [D·H]`` (→ ``b_W``), ``activation`` (default
``relu``) → ``RNNCell(activation)``.  Without ``input_weight`` the source holds the ``D·H``
pre-activations (cgru's projected mode; no reordering for one gate).
"""
import numpy as np

from cgru.core import validate
from cgru.core.cells import Activation, GRUCell, LSTMCell, RNNCell
from cgru.core.network import LayerParams, Network, Topology
from cgru.systems import _rules

__all__ = ["to_mps", "from_mps", "ACTIVATIONS", "FLAGS", "gate_order", "cell_from_descriptor",
           "network", "source_to_canonical", "canonical_to_source", "gradient_tensors",
           # LSTM and single-gate RNN
           "to_mps_lstm", "from_mps_lstm", "to_mps_rnn", "from_mps_rnn", "LSTM_FLAGS",
           "RNN_FLAGS", "LSTM_ACTIVATION_FIELDS", "lstm_gate_order", "lstm_cell_from_descriptor",
           "rnn_cell_from_descriptor", "lstm_network", "rnn_network", "gates_to_canonical",
           "gates_from_canonical", "op_gradient_tensors"]

# MPSGraphRNNActivation: None = 0, Relu = 1, Tanh = 2, Sigmoid = 3, HardSigmoid = 4.
ACTIVATIONS = ("none", "relu", "tanh", "sigmoid", "hard_sigmoid")
# descriptor flags (``training`` does not change the function)
FLAGS = ("reverse", "bidirectional", "training", "reset_gate_first", "reset_after", "flip_z")
_NAMES = {"identity": "none", "relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid",
          "hard_sigmoid": "hard_sigmoid"}                  # cgru name -> MPSGraph name
_CELL_ACTIVATIONS = {v: Activation(k) for k, v in _NAMES.items()}
_PROJECTED_ORDER = ("input_weight=None: the source then holds gate pre-activations in order "
                    "[z, r, o]; cgru's projected mode needs [r, z, n] — only "
                    "reset_gate_first=True converts")


def _act_ok(act):
    return act.name in _NAMES and (act.name != "hard_sigmoid"
                                   or (act.alpha, act.beta) == (0.2, 0.5))


def gate_order(reset_gate_first):
    """MPSGraph's gate order as canonical indices: ``(z, r, o) = (1, 0, 2)``, or ``(r, z, o)``."""
    return (0, 1, 2) if reset_gate_first else (1, 0, 2)


def cell_from_descriptor(*, reset_after, flip_z, update_gate_activation, reset_gate_activation,
                         output_gate_activation, what=""):
    """The ``cgru.Cell`` of a descriptor's options (activation names ``str`` or ``bytes``,
    named ``what + field`` in messages)."""
    return GRUCell(reset_after=reset_after, flip_z=flip_z,
                   f_r=validate.name(reset_gate_activation, what + "reset_gate_activation",
                                     _CELL_ACTIVATIONS),
                   f_z=validate.name(update_gate_activation, what + "update_gate_activation",
                                     _CELL_ACTIVATIONS),
                   g=validate.name(output_gate_activation, what + "output_gate_activation",
                                   _CELL_ACTIVATIONS))


def _per_direction(a, H, D, order):
    """``[…, D·3H]`` with each direction's gate blocks reordered by ``order`` (last axis)."""
    return np.concatenate([_rules.permute_gates(a[..., d * 3 * H:(d + 1) * 3 * H], H, order,
                                                axis=-1) for d in range(D)], axis=-1)


def source_to_canonical(a, H, D, reset_gate_first):
    """A projected source ``[T, N, D·3H]`` in the descriptor's gate order → canonical
    ``r, z, n`` per direction (cgru's projected input)."""
    return _per_direction(a, H, D, _rules.inverse(gate_order(reset_gate_first)))


def canonical_to_source(a, H, D, reset_gate_first):
    """Inverse of ``source_to_canonical`` (for the source gradient)."""
    return _per_direction(a, H, D, gate_order(reset_gate_first))


def network(layers, *, reverse, bidirectional, reset_gate_first, cell, canonical_source=False):
    """A ``cgru.Network`` of ``cell`` from MPSGraph ops, one dict per stacked op (keys
    ``recurrent_weight`` and optionally ``input_weight``, ``bias``, ``secondary_bias``).

    ``canonical_source``: the caller reorders a projected source into canonical order itself
    (``source_to_canonical``), so ``input_weight=None`` is accepted in either gate order.  The
    summed gate biases go to ``b_W`` with ``b_R = 0``; ``secondary_bias`` becomes ``b_Rn``
    (ignored, as MPSGraph does, when the cell resets before the product)."""
    D = 2 if bidirectional else 1
    back = _rules.inverse(gate_order(reset_gate_first))
    out, dtype, topo_args = [], None, None
    for l, op in enumerate(layers):
        what = f"layers[{l}]"
        op = _rules.tensor_dict(op, what, ("recurrent_weight",),
                                ("input_weight", "bias", "secondary_bias"))
        RW = _rules.weight(op["recurrent_weight"], what + "['recurrent_weight']", dtype)
        if l == 0:                              # the sizes come from the first op
            dtype = RW.dtype
            H = _rules.dim(RW, what + "['recurrent_weight']", -1,
                           "[3H, H]" if D == 1 else "[2, 3H, H]")
        _rules.shaped(RW, what + "['recurrent_weight']", (3 * H, H) if D == 1 else (D, 3 * H, H))
        RW = RW.reshape(D, 3 * H, H)
        IW = op.get("input_weight")
        mode = "linear"
        if IW is None:
            if l > 0:
                raise ValueError(f"{what}['input_weight']: required for a stacked op (l ≥ 1)")
            if not (reset_gate_first or canonical_source):
                raise ValueError(_PROJECTED_ORDER)
            mode, width = "projected", D * 3 * H
        else:
            IW = _rules.weight(IW, what + "['input_weight']", dtype)
            width = _rules.dim(IW, what + "['input_weight']", -1, "[D·3H, I]") if l == 0 \
                else D * H
            _rules.shaped(IW, what + "['input_weight']", (D * 3 * H, width))
        if topo_args is None:
            topo_args = (width, H, mode)
        b = op.get("bias")
        b = np.zeros(D * 3 * H, dtype) if b is None else \
            _rules.shaped(_rules.weight(b, what + "['bias']", dtype), what + "['bias']",
                          (D * 3 * H,))
        b2 = op.get("secondary_bias")
        if b2 is not None:
            b2 = _rules.shaped(_rules.weight(b2, what + "['secondary_bias']", dtype),
                               what + "['secondary_bias']", (D * H,))
        if not cell.reset_after:
            b2 = None
        for d in range(D):
            W = np.zeros((3 * H, 0), dtype) if IW is None else \
                _rules.permute_gates(IW[d * 3 * H:(d + 1) * 3 * H], H, back)
            b_W, b_R = _rules.separate_biases(
                _rules.permute_gates(b[d * 3 * H:(d + 1) * 3 * H], H, back),
                None if b2 is None else b2[d * H:(d + 1) * H], H, dtype)
            out.append(LayerParams(W=W, R=_rules.permute_gates(RW[d], H, back), b_W=b_W,
                                   b_R=b_R))
    width, H, mode = topo_args
    topo = Topology(width, H, len(layers), _rules.direction_from(D, reverse), mode)
    return Network(topo, out, cell)


def from_mps(layers, *, reverse=False, bidirectional=False, reset_gate_first=False,
             reset_after=False, flip_z=False, update_gate_activation="sigmoid",
             reset_gate_activation="sigmoid", output_gate_activation="tanh", training=False):
    """A ``cgru.Network`` (with the descriptor's cell) from MPSGraph ``GRU`` ops, one dict per
    stacked op (keys as ``to_mps``; ``input_weight``, ``bias``, ``secondary_bias`` optional)
    and the descriptor's arguments (``training`` does not affect the function; activation
    names ``str`` or ``bytes``).  The summed gate biases go to ``b_W`` with ``b_R = 0`` (any
    split is the same function); ``secondary_bias`` becomes ``b_Rn``.  MPSGraph ignores
    ``secondary_bias`` when ``reset_after`` is False, and so does this function.
    hard_sigmoid is ``clip(0.2·x + 0.5, 0, 1)``.
    """
    layers = _rules.node_list(layers, "MPSGraph tensor")
    flags = {name: validate.flag(v, name) for name, v in zip(FLAGS, (
        reverse, bidirectional, training, reset_gate_first, reset_after, flip_z))}
    cell = cell_from_descriptor(reset_after=flags["reset_after"], flip_z=flags["flip_z"],
                                update_gate_activation=update_gate_activation,
                                reset_gate_activation=reset_gate_activation,
                                output_gate_activation=output_gate_activation)
    return network(layers, reverse=flags["reverse"], bidirectional=flags["bidirectional"],
                   reset_gate_first=flags["reset_gate_first"], cell=cell)


def _tensors(net, cell, reset_gate_first, canonical_source=False):
    """MPSGraph tensors of every layer of ``net`` (see ``to_mps``)."""
    topo = net.topology
    H, D = topo.hidden_size, topo.num_directions
    order = gate_order(reset_gate_first)
    if topo.input_mode == "projected" and not (reset_gate_first or canonical_source):
        raise ValueError("MPSGraph without input weights reads the source in its gate order "
                         "[z, r, o]; cgru's projected input holds [r, z, n] — use "
                         "reset_gate_first=True")
    layers = []
    for l in range(topo.num_layers):
        Ws, Rs, bs, b2s = [], [], [], []
        for i in range(l * D, (l + 1) * D):
            b_rz, b_n, b_Rn = _rules.merged_biases(net[i], cell, H)
            Ws.append(_rules.permute_gates(_rules.input_matrix(net, i), H, order))
            Rs.append(_rules.permute_gates(net[i].R, H, order))
            bs.append(_rules.permute_gates(np.concatenate([b_rz, b_n]), H, order))
            b2s.append(b_Rn)
        projected = l == 0 and topo.input_mode == "projected"
        layers.append({
            "input_weight": None if projected else np.concatenate(Ws),
            "recurrent_weight": Rs[0] if D == 1 else np.stack(Rs),
            "bias": np.concatenate(bs),
            "secondary_bias": np.concatenate(b2s) if cell.reset_after else None})
    return layers


def to_mps(net, cell=None, *, reset_gate_first=False, reset_after=None):
    """``(layers, descriptor)`` for one MPSGraph ``GRU`` op per layer.

    ``layers[l]`` = ``{"input_weight": [3H, in] / [6H, in] (None in projected mode),
    "recurrent_weight": [3H, H] / [2, 3H, H], "bias": [3H] / [6H],
    "secondary_bias": [H] / [2H] (reset_after only, else None)}``, gates ``[z, r, o]`` (or
    ``[r, z, o]`` with ``reset_gate_first``), forward direction first; biases as the module
    docstring says.  ``descriptor`` holds the ``GRUDescriptor`` arguments; ``reset_after``
    (None: the cell's form) demands one form.
    """
    topo, cell = _rules.network_and_cell(net, cell)
    _rules.require_kind(cell, "MPSGraph GRU", ("gru",),
                        hint="MPSGraph's LSTM and singleGateRNN operators: to_mps_lstm, "
                             "to_mps_rnn")
    target, forms = _rules.demanded("MPSGraph GRU", reset_after, "reset_after",
                                    lambda ra: f"resetAfter={'YES' if ra else 'NO'}")
    _rules.require(cell, target, reset_after=forms, activations=_act_ok, flip_z=True)
    reset_gate_first = validate.flag(reset_gate_first, "reset_gate_first")
    layers = _tensors(net, cell, reset_gate_first)
    descriptor = {"reverse": topo.direction == "reverse",
                  "bidirectional": topo.num_directions == 2,
                  "reset_gate_first": reset_gate_first,
                  "reset_after": cell.reset_after, "flip_z": cell.flip_z,
                  "update_gate_activation": _NAMES[cell.f_z.name],
                  "reset_gate_activation": _NAMES[cell.f_r.name],
                  "output_gate_activation": _NAMES[cell.g.name]}
    return layers, descriptor


def gradient_tensors(grads, reset_gate_first):
    """The gradients of one op's tensors (``to_mps`` keys, the descriptor's gate order) from
    the core's gradient network ``grads`` of the op's network.

    ``bias`` maps to ``b_W`` (``b_R = 0``), so ∂L/∂bias is ``db_W``; ``db_R`` equals ``db_W``
    for ``r``, ``z`` (and ``n``, reset-before) and is left out of the sum; with ``reset_after``
    ``db_Rn`` is ∂L/∂secondary_bias."""
    H = grads.topology.hidden_size
    cell = grads.cell
    layers = []
    for g in grads:
        _, b_R = _rules.separate_biases(g.b_W, g.b_R[2 * H:] if cell.reset_after else None, H,
                                        g.b_W.dtype)
        layers.append(LayerParams(g.W, g.R, g.b_W, b_R))
    (tensors,) = _tensors(Network(grads.topology, layers, cell), cell, reset_gate_first,
                          canonical_source=True)
    return tensors


# --- LSTM and single-gate RNN ------------------------------------------------------------------
# MPSGraphLSTMDescriptor / MPSGraphSingleGateRNNDescriptor flags (``training``,
# ``produce_cell`` do not change the function).
LSTM_FLAGS = ("reverse", "bidirectional", "produce_cell", "training", "forget_gate_last")
RNN_FLAGS = ("reverse", "bidirectional", "training")
# descriptor field -> LSTMCell field
LSTM_ACTIVATION_FIELDS = (("input_gate_activation", "f_i"), ("forget_gate_activation", "f_f"),
                          ("cell_gate_activation", "g"), ("output_gate_activation", "f_o"),
                          ("activation", "h"))
# MPSGraph's documented LSTM adds p ⊙ c[t−1] to all four gates: the core's
# LSTMCell(peepholes="ifgo"), P [4H] in canonical gate order i, f, g, o.


def lstm_gate_order(forget_gate_last):
    """MPSGraph's LSTM gate order as canonical indices (canonical ``i, f, g, o``): the default
    ``[i, f, z, o]`` is ``(0, 1, 2, 3)``; ``forget_gate_last`` gives ``[i, z, f, o]`` =
    ``(0, 2, 1, 3)`` — the order Apple's ``forgetGateLast`` comment writes (the property's name
    suggests ``[i, z, o, f]``; cgru follows the written order).  Either is its own inverse."""
    return (0, 2, 1, 3) if forget_gate_last else (0, 1, 2, 3)


def lstm_cell_from_descriptor(*, input_gate_activation, forget_gate_activation,
                              cell_gate_activation, output_gate_activation, activation,
                              peepholes=False, what=""):
    """The ``cgru.LSTMCell`` of an ``MPSGraphLSTMDescriptor``'s activations (names ``str`` or
    ``bytes``, named ``what + field`` in messages); ``activation`` is the cell-output
    activation ``g()`` of ``h = o ⊙ g(c)`` (the cell's ``h``); ``peepholes`` (an op's
    ``peephole`` is given) gives MPSGraph's form, ``LSTMCell(peepholes="ifgo")``."""
    names = dict(input_gate_activation=input_gate_activation,
                 forget_gate_activation=forget_gate_activation,
                 cell_gate_activation=cell_gate_activation,
                 output_gate_activation=output_gate_activation, activation=activation)
    acts = {field: validate.name(names[mps_name], what + mps_name, _CELL_ACTIVATIONS)
            for mps_name, field in LSTM_ACTIVATION_FIELDS}
    return LSTMCell(**acts, peepholes="ifgo" if peepholes else False)


def rnn_cell_from_descriptor(*, activation, what=""):
    """The ``cgru.RNNCell`` of an ``MPSGraphSingleGateRNNDescriptor``'s ``activation``."""
    return RNNCell(validate.name(activation, what + "activation", _CELL_ACTIVATIONS))


def gates_to_canonical(a, H, D, order):
    """``[…, D·G·H]`` in MPSGraph's gate ``order`` (canonical indices, ``lstm_gate_order``)
    → canonical per direction (last axis)."""
    G = len(order)
    back = _rules.inverse(order)
    return np.concatenate([_rules.permute_gates(a[..., d * G * H:(d + 1) * G * H], H, back,
                                                axis=-1) for d in range(D)], axis=-1)


def gates_from_canonical(a, H, D, order):
    """Inverse of ``gates_to_canonical``."""
    G = len(order)
    return np.concatenate([_rules.permute_gates(a[..., d * G * H:(d + 1) * G * H], H, order,
                                                axis=-1) for d in range(D)], axis=-1)


def _op_network(layers, *, kind, reverse, bidirectional, order, cell, canonical_source):
    """A ``cgru.Network`` of ``cell`` from MPSGraph LSTM (``kind="lstm"``) or single-gate RNN
    (``"rnn"``) ops, one dict per stacked op (see ``lstm_network``, ``rnn_network``)."""
    D = 2 if bidirectional else 1
    G = len(order)
    back = _rules.inverse(order)
    GH = f"{G}H" if G > 1 else "H"
    optional = ("input_weight", "bias", "peephole") if kind == "lstm" else ("input_weight", "bias")
    out, dtype, topo_args = [], None, None
    for l, op in enumerate(layers):
        what = f"layers[{l}]"
        op = _rules.tensor_dict(op, what, ("recurrent_weight",), optional)
        RW = _rules.weight(op["recurrent_weight"], what + "['recurrent_weight']", dtype)
        if l == 0:                              # the sizes come from the first op
            dtype = RW.dtype
            H = _rules.dim(RW, what + "['recurrent_weight']", -1,
                           f"[{GH}, H]" if D == 1 else f"[2, {GH}, H]")
        _rules.shaped(RW, what + "['recurrent_weight']", (G * H, H) if D == 1 else
                      (D, G * H, H))
        RW = RW.reshape(D, G * H, H)
        IW = op.get("input_weight")
        mode = "linear"
        if IW is None:
            if l > 0:
                raise ValueError(f"{what}['input_weight']: required for a stacked op (l ≥ 1)")
            if order != tuple(range(G)) and not canonical_source:
                raise ValueError("input_weight=None: the source then holds gate pre-activations "
                                 "in MPSGraph's order [i, z, f, o] (forget_gate_last); cgru's "
                                 "projected mode needs [i, f, g, o] — only "
                                 "forget_gate_last=False converts")
            mode, width = "projected", D * G * H
        else:
            IW = _rules.weight(IW, what + "['input_weight']", dtype)
            width = _rules.dim(IW, what + "['input_weight']", -1, f"[D·{GH}, I]") if l == 0 \
                else D * H
            _rules.shaped(IW, what + "['input_weight']", (D * G * H, width))
        if topo_args is None:
            topo_args = (width, H, mode)
        b = op.get("bias")
        b = np.zeros(D * G * H, dtype) if b is None else \
            _rules.shaped(_rules.weight(b, what + "['bias']", dtype), what + "['bias']",
                          (D * G * H,))
        p = op.get("peephole")
        if p is not None:
            if cell.peepholes != "ifgo":
                raise ValueError(f"{what}['peephole']: given, but the cell has no peepholes "
                                 f"in MPSGraph's form (LSTMCell(peepholes='ifgo'))")
            p = _rules.shaped(_rules.weight(p, what + "['peephole']", dtype),
                              what + "['peephole']", (4 * H,) if D == 1 else (D, 4 * H))
            p = p.reshape(D, 4 * H)
        for d in range(D):
            W = np.zeros((G * H, 0), dtype) if IW is None else \
                _rules.permute_gates(IW[d * G * H:(d + 1) * G * H], H, back)
            extra = {}
            if kind == "lstm" and cell.peepholes:
                extra["P"] = np.zeros(4 * H, dtype) if p is None else \
                    _rules.permute_gates(p[d], H, back)                 # canonical i, f, g, o
            out.append(LayerParams(
                W=W, R=_rules.permute_gates(RW[d], H, back),
                b_W=_rules.permute_gates(b[d * G * H:(d + 1) * G * H], H, back),
                b_R=np.zeros(G * H, dtype), **extra))
    width, H, mode = topo_args
    topo = Topology(width, H, len(layers), _rules.direction_from(D, reverse), mode)
    return Network(topo, out, cell)


def lstm_network(layers, *, reverse, bidirectional, forget_gate_last, cell,
                 canonical_source=False):
    """A ``cgru.Network`` of the ``LSTMCell`` ``cell`` from MPSGraph ``LSTM`` ops, one dict per
    stacked op: ``recurrent_weight`` ``[4H, H]`` / ``[2, 4H, H]`` and optionally
    ``input_weight`` ``[D·4H, in]`` (layer 0 only may lack it: the projected input mode),
    ``bias`` ``[D·4H]`` and ``peephole`` ``[4H]`` / ``[2, 4H]`` (with ``cell.peepholes``).

    Gates in MPSGraph's order (``lstm_gate_order``) are reordered to canonical ``i, f, g, o``;
    ``bias`` goes to ``b_W`` with ``b_R = 0`` (only the sum is observable); the peephole
    becomes ``P = [P_i, P_f, P_g, P_o]`` of ``LSTMCell(peepholes="ifgo")``.
    ``canonical_source``: the caller reorders a projected source itself (``gates_to_canonical``),
    so ``input_weight=None`` is accepted with ``forget_gate_last`` too."""
    return _op_network(layers, kind="lstm", reverse=reverse, bidirectional=bidirectional,
                       order=lstm_gate_order(forget_gate_last), cell=cell,
                       canonical_source=canonical_source)


def rnn_network(layers, *, reverse, bidirectional, cell):
    """A ``cgru.Network`` of the ``RNNCell`` ``cell`` from MPSGraph ``singleGateRNN`` ops, one
    dict per stacked op: ``recurrent_weight`` ``[H, H]`` / ``[2, H, H]``, optionally
    ``input_weight`` ``[D·H, in]`` (layer 0 only may lack it: the source then holds the
    ``D·H`` pre-activations) and ``bias`` ``[D·H]`` (→ ``b_W``, ``b_R = 0``)."""
    return _op_network(layers, kind="rnn", reverse=reverse, bidirectional=bidirectional,
                       order=(0,), cell=cell, canonical_source=True)


def from_mps_lstm(layers, *, reverse=False, bidirectional=False, forget_gate_last=False,
                  input_gate_activation="sigmoid", forget_gate_activation="sigmoid",
                  cell_gate_activation="tanh", output_gate_activation="sigmoid",
                  activation="tanh", produce_cell=False, training=False):
    """A ``cgru.Network`` (with its ``LSTMCell``) from MPSGraph ``LSTM`` ops (dicts as
    ``lstm_network``) and the ``MPSGraphLSTMDescriptor`` arguments (``produce_cell`` and
    ``training`` do not affect the function).  A ``peephole`` in any op gives a cell with
    MPSGraph's peepholes (``LSTMCell(peepholes="ifgo")``; ops without one get zeros)."""
    layers = _rules.node_list(layers, "MPSGraph tensor")
    flags = {name: validate.flag(v, name) for name, v in zip(LSTM_FLAGS, (
        reverse, bidirectional, produce_cell, training, forget_gate_last))}
    peepholes = any(isinstance(op, dict) and op.get("peephole") is not None for op in layers)
    cell = lstm_cell_from_descriptor(
        input_gate_activation=input_gate_activation,
        forget_gate_activation=forget_gate_activation,
        cell_gate_activation=cell_gate_activation,
        output_gate_activation=output_gate_activation, activation=activation,
        peepholes=peepholes)
    return lstm_network(layers, reverse=flags["reverse"], bidirectional=flags["bidirectional"],
                        forget_gate_last=flags["forget_gate_last"], cell=cell)


def from_mps_rnn(layers, *, reverse=False, bidirectional=False, activation="relu",
                 training=False):
    """A ``cgru.Network`` (with its ``RNNCell``) from MPSGraph ``singleGateRNN`` ops (dicts as
    ``rnn_network``) and the ``MPSGraphSingleGateRNNDescriptor`` arguments (default
    activation ``relu``, as Apple documents; ``training`` does not affect the function)."""
    layers = _rules.node_list(layers, "MPSGraph tensor")
    flags = {name: validate.flag(v, name) for name, v in zip(RNN_FLAGS, (
        reverse, bidirectional, training))}
    cell = rnn_cell_from_descriptor(activation=activation)
    return rnn_network(layers, reverse=flags["reverse"], bidirectional=flags["bidirectional"],
                       cell=cell)


def _op_tensors(net, order, gradients=False):
    """MPSGraph tensors of every layer of an LSTM / RNN ``net`` (gate ``order``): ``input_weight``
    (None in projected mode), ``recurrent_weight``, ``bias`` (``b_W + b_R``; for a gradient
    network ``db_W``, which equals ∂L/∂bias since ``bias`` maps to ``b_W``)."""
    topo = net.topology
    H, D = topo.hidden_size, topo.num_directions
    layers = []
    for l in range(topo.num_layers):
        Ws, Rs, bs = [], [], []
        for i in range(l * D, (l + 1) * D):
            lp = net[i]
            Ws.append(_rules.permute_gates(_rules.input_matrix(net, i), H, order))
            Rs.append(_rules.permute_gates(lp.R, H, order))
            bs.append(_rules.permute_gates(lp.b_W if gradients else lp.b_W + lp.b_R, H, order))
        projected = l == 0 and topo.input_mode == "projected"
        layers.append({"input_weight": None if projected else np.concatenate(Ws),
                       "recurrent_weight": Rs[0] if D == 1 else np.stack(Rs),
                       "bias": np.concatenate(bs)})
    return layers


def _require_op_cell(net, cell, kind, target):
    topo, cell = _rules.network_and_cell(net, cell)
    if cell.kind != kind:
        raise ValueError(f"{target}: expected a network of {kind} cells, got a {cell.kind} cell")
    if cell.clip is not None:
        raise ValueError(f"{target} has no clip; the source clamps pre-activations to "
                         f"±{cell.clip}")
    fields = ("f_i", "f_f", "g", "f_o", "h") if kind == "lstm" else ("activation",)
    for name in fields:
        act = getattr(cell, name)
        if not _act_ok(act):
            raise ValueError(f"{target} has no activation equal to the source's {name} = "
                             f"{act.name}(alpha={act.alpha}, beta={act.beta})")
    if kind == "lstm":
        if cell.input_forget:
            raise ValueError(f"{target} has no coupled input and forget gates "
                             f"(input_forget=True: f = 1 − i)")
        if topo.proj_size:
            raise ValueError(f"{target} has no recurrent projection (proj_size="
                             f"{topo.proj_size})")
    return topo, cell


def to_mps_lstm(net, *, forget_gate_last=False):
    """``(layers, descriptor)`` for one MPSGraph ``LSTM`` op per layer of an LSTM network.

    ``layers[l]`` = ``{"input_weight": [4H, in] / [8H, in] (None in projected mode),
    "recurrent_weight": [4H, H] / [2, 4H, H], "bias": [4H] / [8H] (b_W + b_R),
    "peephole": [4H] / [2, 4H] (cells with peepholes, else None)}``, gates ``[i, f, z, o]``
    (``[i, z, f, o]`` with ``forget_gate_last``), forward direction first.  ``descriptor``
    holds the ``LSTMDescriptor`` arguments.  Refused (``ValueError``): clip, coupled gates,
    a projection, activations MPSGraph lacks, ONNX-form peepholes (``"ifo"``) with a non-zero
    output-gate block (it reads the new cell state ``c[t]``, MPSGraph's every gate ``c[t−1]``),
    and a projected input with ``forget_gate_last``."""
    target = "MPSGraph LSTM"
    topo, cell = _require_op_cell(net, None, "lstm", target)
    forget_gate_last = validate.flag(forget_gate_last, "forget_gate_last")
    order = lstm_gate_order(forget_gate_last)
    if topo.input_mode == "projected" and forget_gate_last:
        raise ValueError("MPSGraph without input weights reads the source in its gate order "
                         "[i, z, f, o] (forget_gate_last); cgru's projected input holds "
                         "[i, f, g, o] — use forget_gate_last=False")
    layers = _op_tensors(net, order)
    H, D = topo.hidden_size, topo.num_directions
    for l, layer in enumerate(layers):
        peep = None
        if cell.peepholes:
            ps = []
            for i in range(l * D, (l + 1) * D):
                P = net[i].P
                if cell.peepholes == "ifgo":
                    canon = P                                               # i, f, g, o
                elif np.any(P[2 * H:] != 0):
                    raise ValueError(f"{target}: layer-direction {i} has a non-zero output-gate "
                                     f"peephole P_o on the new cell state c[t] (ONNX's form); "
                                     f"MPSGraph's output-gate peephole reads c[t−1]")
                else:                       # "ifo" with P_o = 0: the same function
                    canon = np.concatenate([P[:2 * H], np.zeros(2 * H, P.dtype)])
                ps.append(_rules.permute_gates(canon, H, order))
            peep = ps[0] if D == 1 else np.stack(ps)
        layer["peephole"] = peep
    descriptor = {"reverse": topo.direction == "reverse",
                  "bidirectional": topo.num_directions == 2,
                  "forget_gate_last": forget_gate_last,
                  **{mps_name: _NAMES[getattr(cell, field).name]
                     for mps_name, field in LSTM_ACTIVATION_FIELDS}}
    return layers, descriptor


def to_mps_rnn(net):
    """``(layers, descriptor)`` for one MPSGraph ``singleGateRNN`` op per layer of a vanilla
    RNN network: ``layers[l]`` = ``{"input_weight": [H, in] / [2H, in] (None in projected
    mode), "recurrent_weight": [H, H] / [2, H, H], "bias": [H] / [2H] (b_W + b_R)}``;
    ``descriptor`` holds the ``SingleGateRNNDescriptor`` arguments.  Refused (``ValueError``):
    clip and activations MPSGraph lacks."""
    topo, cell = _require_op_cell(net, None, "rnn", "MPSGraph singleGateRNN")
    descriptor = {"reverse": topo.direction == "reverse",
                  "bidirectional": topo.num_directions == 2,
                  "activation": _NAMES[cell.activation.name]}
    return _op_tensors(net, (0,)), descriptor


def op_gradient_tensors(grads, order):
    """The gradients of one LSTM / RNN op's ``input_weight`` (None in projected mode),
    ``recurrent_weight`` and ``bias`` (MPSGraph's gate ``order``) from the core's gradient
    network ``grads`` of the op's network (``bias`` maps to ``b_W``, so ∂L/∂bias = ``db_W``),
    and ``peephole`` (``None`` without peepholes) in MPSGraph's ``[4H]`` / ``[2, 4H]``."""
    (tensors,) = _op_tensors(grads, order, gradients=True)
    H, D = grads.topology.hidden_size, grads.topology.num_directions
    ps = [_rules.permute_gates(lp.P, H, order) for lp in grads.layers[:D] if lp.P is not None]
    tensors["peephole"] = (ps[0] if D == 1 else np.stack(ps)) if ps else None
    return tensors
