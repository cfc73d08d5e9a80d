"""Apple MPSGraph ``GRU``: its tensors, gate orders, activation names, descriptor options and
bias rules.

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
"""
import numpy as np

from cgru.core import validate
from cgru.core.cells import Activation, GRUCell
from cgru.core.network import LayerParams, Network, Topology
from cgru.systems import _rules

__all__ = ["to_mps", "from_mps", "ACTIVATIONS", "FLAGS", "gate_order", "cell_from_descriptor",
           "network", "source_to_canonical", "canonical_to_source", "gradient_tensors"]

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
