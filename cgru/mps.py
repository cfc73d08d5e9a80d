"""Apple MPSGraph's recurrent ops on the CPU: ``GRU`` / ``GRUGradients`` (``GRUDescriptor``,
``gru``, ``gru_gradients``), ``LSTM`` / ``LSTMGradients`` (``LSTMDescriptor``, ``lstm``,
``lstm_gradients``) and ``singleGateRNN`` / ``singleGateRNNGradients``
(``SingleGateRNNDescriptor``, ``single_gate_rnn``, ``single_gate_rnn_gradients``).

GRU
---
One call is one MPSGraph op: one layer, time-major ``[T, N, ·]``, no sequence lengths.  Gate
order ``[z, r, o]`` (``[r, z, o]`` with ``reset_gate_first``) in ``input_weight``,
``recurrent_weight``, ``bias`` and a projected ``source``; matrices ``[out, in]`` applied as
``x·Wᵀ``.  With ``m`` the mask (ones when absent), per step and direction::

    z  = f_z((h ⊙ m)·R_zᵀ + x·W_zᵀ + b_z)
    r  = f_r((h ⊙ m)·R_rᵀ + x·W_rᵀ + b_r)
    reset_after=False:  c = (h ⊙ r ⊙ m)·R_oᵀ
    reset_after=True :  c = ((h ⊙ m)·R_oᵀ + secondary_bias) ⊙ r
    o  = f_o(c + x·W_oᵀ + b_o)
    flip_z=False:  h' = z ⊙ h + (1 − z) ⊙ o
    flip_z=True :  h' = (1 − z) ⊙ h + z ⊙ o

``bias`` is added outside the reset product for all three gates; ``secondary_bias`` is the
recurrent candidate bias inside it (reset_after only).  Without ``input_weight`` the source
holds ``x·Wᵀ`` itself (the three pre-activations of each direction).

Decisions where Apple's documentation contradicts itself:

* ``flip_z`` follows the *operation's* documentation (the ``GRUWithSourceTensor:`` comment):
  ``flip_z=False`` → ``h' = z⊙h + (1−z)⊙o`` (every other system's blend), ``flip_z=True`` →
  ``h' = (1−z)⊙h + z⊙o``.  The ``flipZ`` *property* comment states the opposite pairing.
* ``hard_sigmoid`` is ``clip(0.2·x + 0.5, 0, 1)`` (Apple documents no slope/offset).

Mapping onto the core (``cgru.core.engine``): the weights go through ``cgru.systems.mps``
(gate order → canonical r, z, n; ``bias`` → ``b_W``, ``b_R = 0`` except
``b_Rn = secondary_bias``), the descriptor becomes the network's ``cgru.Cell(reset_after,
flip_z, f_r, f_z, g)``, ``reverse``/``bidirectional`` a ``Topology`` direction (``reverse`` is
ignored with ``bidirectional``, as documented), the mask the core's ``state_mask``
(``mask[t]`` is applied at the step that produces ``output[t]``, in original time, for either
direction), and a missing ``input_weight`` the ``"projected"`` input mode (the source reordered
to r, z, n).  Gradients come back through ``cgru.systems.mps`` too.

``z_state`` (the training state; Apple leaves its content open): ``[T, N, 3H]``
(``[T, N, 6H]`` bidirectional, forward direction first) holding each direction's *activated*
gates in cgru's canonical order ``[r, z, n]`` (not the descriptor's order), ``z_state[t]``
being the gates of the step that produces ``output[t]`` (original time, for either direction).
With ``output_fwd`` it is all ``gru_gradients`` needs: the core's reserve is rebuilt from it
(``cgru.core.rebuild.reserve_from_gates``) without re-running the forward time loop.

LSTM
----
Gate order ``[i, f, z, o]`` (``z``: the cell gate; ``[i, z, f, o]`` with ``forget_gate_last``)
in ``input_weight [D·4H, I]``, ``recurrent_weight [4H, H]`` / ``[2, 4H, H]``, ``bias [D·4H]``,
``peephole [4H]`` / ``[2, 4H]`` and a projected ``source [T, N, D·4H]``.  Per step and
direction (Apple's comment on ``LSTMWithSourceTensor:``)::

    [i, f, z, o] = f_gate((h ⊙ m)·Rᵀ + x·Wᵀ + b + p ⊙ c)      (each gate its own f_gate)
    c' = f ⊙ c + i ⊙ z
    h' = o ⊙ g(c')                                            (g: descriptor.activation)

Mapping: ``cgru.LSTMCell(f_i, f_f, f_o, g=cell_gate_activation, h=activation)`` in canonical
order ``i, f, g, o``; ``bias`` → ``b_W``, ``b_R = 0``; the peephole →
``LSTMCell(peepholes="ifgo")`` with ``LayerParams.P = [P_i, P_f, P_g, P_o]``.  Outputs:
``[output]``, ``[output, cell]`` (``produce_cell``), ``[output, cell, z_state]``
(``training``); ``z_state`` holds the activated
gates ``[i, f, z, o]`` per direction (canonical = Apple's default order, whatever
``forget_gate_last``), ``cell`` the cell state after every step, both aligned like ``output``.

Single-gate RNN
---------------
``z = x·Wᵀ + (h ⊙ m)·Rᵀ + b``, ``h' = activation(z)`` (default ``relu``), mapped onto
``cgru.RNNCell(activation)``; ``z_state`` is ``z`` itself (Apple documents it as the second
output), recomputed from the output with whole-sequence GEMMs.

Decisions for these two (Apple's text is self-contradictory or beyond the core):

* ``forget_gate_last`` is ``[i, z, f, o]``, the order the property's comment writes (its name
  would suggest ``[i, z, o, f]``).
* With ``training`` the LSTM returns three tensors, the cell second, whatever
  ``produce_cell``: the gradient op's comments name ``zState`` "the third output" and
  ``cellOutputFwd`` "the second output … with training or produceCell" (the ``training``
  property's comment says "secondary or third").
* The peephole is ``[4H]`` / ``[2, 4H]`` (the forward op's comment; the gradient op's says
  ``[8H]``, refused with a hint), added as ``p ⊙ c[t−1]`` to all four gates, the output gate
  included (Apple's formula: ONNX's output gate reads the new cell state instead).
* The gradient ops, as MPSGraph's, differentiate the forward their training state records:
  the core's reserve is rebuilt from ``z_state`` (and the LSTM's ``cell_output_fwd``) with
  whole-sequence GEMMs (``cgru.core.rebuild.reserve_from_saved``), without re-running the
  time loop.
"""
from dataclasses import dataclass

import numpy as np

from cgru.core import calls, engine, rebuild, validate
from cgru.systems import _rules, mps as mps_system
from cgru.systems.mps import (ACTIVATIONS as MPS_ACTIVATIONS, FLAGS, LSTM_ACTIVATION_FIELDS,
                              LSTM_FLAGS, RNN_FLAGS)

__all__ = ["GRUDescriptor", "gru", "gru_gradients", "LSTMDescriptor", "lstm", "lstm_gradients",
           "SingleGateRNNDescriptor", "single_gate_rnn", "single_gate_rnn_gradients",
           "MPS_ACTIVATIONS"]

_ACTS = ("update_gate_activation", "reset_gate_activation", "output_gate_activation")


@dataclass
class GRUDescriptor:
    """``MPSGraphGRUDescriptor``: the options of one GRU op, MPSGraph's defaults.

    ``reverse``: process time backwards (unidirectional; ignored with ``bidirectional``; the
    output stays aligned to the original time index).  ``bidirectional``: both directions,
    concatenated forward first on the channel axis.  ``training``: ``gru`` also returns
    ``z_state``.  ``reset_gate_first``: gate order ``[r, z, o]`` instead of ``[z, r, o]``.
    ``reset_after``: the reset gate multiplies ``(h ⊙ m)·R_oᵀ + secondary_bias`` instead of
    ``h`` before the product.  ``flip_z``: ``False`` → ``h' = z⊙h + (1−z)⊙o``, ``True`` →
    ``h' = (1−z)⊙h + z⊙o`` (the operation's documentation; Apple's property comment says the
    opposite).  Activations (``str`` or ``bytes``): ``"none"``, ``"relu"``, ``"tanh"``,
    ``"sigmoid"``, ``"hard_sigmoid"`` (``clip(0.2·x + 0.5, 0, 1)``).
    """
    reverse: bool = False
    bidirectional: bool = False
    training: bool = False
    reset_gate_first: bool = False
    reset_after: bool = False
    flip_z: bool = False
    update_gate_activation: str = "sigmoid"
    reset_gate_activation: str = "sigmoid"
    output_gate_activation: str = "tanh"

    def __post_init__(self):
        _check_descriptor(self)


def _check_descriptor(desc):
    """Validate a descriptor (also at every call: the dataclass is mutable, like Apple's)."""
    if not isinstance(desc, GRUDescriptor):
        raise TypeError(f"descriptor: expected a cgru.mps.GRUDescriptor, got "
                        f"{type(desc).__name__}")
    for name in FLAGS:
        validate.flag(getattr(desc, name), f"descriptor.{name}")
    for name in _ACTS:
        _rules.option(getattr(desc, name), f"descriptor.{name}", MPS_ACTIVATIONS)
    return desc


# --- validation ------------------------------------------------------------------------------
def _shaped(a, what, dtype, shape, names):
    """``a`` checked against ``dtype`` and ``shape``; ``names`` spell each axis (``"3H"``, …)."""
    validate.float_array(a, what, dtype, like="(the dtype of source)")
    return validate.named_shape(a, what, shape, names)


def _state_mask(mask, dtype, T, N, D, H):
    """MPSGraph's ``mask`` (float of the source dtype, or bool; broadcastable to the output
    ``[T, N, D·H]``) as the core's state mask, or ``None``.  The core broadcasts it (after its
    own size checks); only a bool mask is cast."""
    if mask is None:
        return None
    validate.plain_array(mask, "mask")
    if mask.dtype != dtype and mask.dtype != np.bool_:
        raise TypeError(f"mask: expected dtype {dtype} (the dtype of source) or bool, got "
                        f"{mask.dtype}")
    try:
        np.broadcast_to(mask, (T, N, D * H))            # a view: checks only
    except ValueError:
        raise ValueError(f"mask: expected a shape broadcastable to the output shape [T={T}, "
                         f"N={N}, {'2H' if D == 2 else 'H'}={D * H}], got "
                         f"{list(mask.shape)}") from None
    return mask.astype(dtype, copy=False)


class _Plan:
    """The validated inputs of one call, mapped onto the core (see the module docstring)."""

    def __init__(self, source, recurrent_weight, input_weight, bias, init_state, mask,
                 secondary_bias, descriptor):
        desc = _check_descriptor(descriptor)
        validate.plain_array(source, "source", "[T, N, I]")
        dtype = validate.float_array(source, "source").dtype
        if source.ndim != 3:
            raise ValueError(f"source: expected a 3-D array [T, N, I], got shape "
                             f"{list(source.shape)}")
        T, N, I = source.shape
        validate.input_sizes("source", source.shape, T, N, "[T, N, I]")
        D = 2 if desc.bidirectional else 1
        G = "6H" if D == 2 else "3H"
        validate.float_array(recurrent_weight, "recurrent_weight", dtype,
                             like="(the dtype of source)")
        H = recurrent_weight.shape[-1] if recurrent_weight.ndim else 0
        if D == 1:
            _shaped(recurrent_weight, "recurrent_weight", dtype, (3 * H, H), ("3H", "H"))
        else:
            _shaped(recurrent_weight, "recurrent_weight (bidirectional)", dtype,
                    (2, 3 * H, H), ("2", "3H", "H"))
        if H == 0:
            raise ValueError(f"recurrent_weight: expected H ≥ 1, got shape "
                             f"{list(recurrent_weight.shape)}")
        if input_weight is None:
            if I != D * 3 * H:
                raise ValueError(f"source: without input_weight the source holds the gate "
                                 f"pre-activations, expected shape [T={T}, N={N}, "
                                 f"{G}={D * 3 * H}], got {list(source.shape)}")
        else:
            _shaped(input_weight, "input_weight", dtype, (D * 3 * H, I), (G, "I"))
        if bias is not None:
            _shaped(bias, "bias", dtype, (D * 3 * H,), (G,))
        if init_state is not None:
            _shaped(init_state, "init_state", dtype, (N, D * H), ("N", "2H" if D == 2 else "H"))
        if secondary_bias is not None:
            if not desc.reset_after:
                raise ValueError("secondary_bias: given, but descriptor.reset_after is False; "
                                 "the secondary (recurrent candidate) bias exists only in the "
                                 "reset-after form")
            _shaped(secondary_bias, "secondary_bias", dtype, (D * H,),
                    ("2H" if D == 2 else "H",))
        self.state_mask = _state_mask(mask, dtype, T, N, D, H)

        self.desc, self.dtype = desc, dtype
        self.T, self.N, self.I, self.H, self.D = T, N, I, H, D
        self.projected = input_weight is None
        # The network of the op (its cell from the descriptor).  A projected source is
        # reordered into canonical order here, so either gate order maps to the projected mode.
        cell = mps_system.cell_from_descriptor(
            reset_after=desc.reset_after, flip_z=desc.flip_z,
            update_gate_activation=desc.update_gate_activation,
            reset_gate_activation=desc.reset_gate_activation,
            output_gate_activation=desc.output_gate_activation, what="descriptor.")
        layer = {"recurrent_weight": recurrent_weight, "input_weight": input_weight,
                 "bias": bias, "secondary_bias": secondary_bias}
        self.net = mps_system.network([layer], reverse=desc.reverse,
                                      bidirectional=desc.bidirectional,
                                      reset_gate_first=desc.reset_gate_first, cell=cell,
                                      canonical_source=True)
        self.x = mps_system.source_to_canonical(source, H, D, desc.reset_gate_first) \
            if self.projected else np.ascontiguousarray(source)
        # init_state [N, D·H] = [fwd | bwd]  →  h0 [D, N, H]
        self.h0 = None if init_state is None else \
            np.ascontiguousarray(init_state.reshape(N, D, H).transpose(1, 0, 2))

    def shape_names(self, what):
        """Axis names for error messages: ``"out"`` (output), ``"z"`` (z_state), ``"state"``."""
        return {"out": ("T", "N", "2H" if self.D == 2 else "H"),
                "z": ("T", "N", "6H" if self.D == 2 else "3H"),
                "state": ("N", "2H" if self.D == 2 else "H")}[what]


# --- forward ---------------------------------------------------------------------------------
def gru(source, recurrent_weight, input_weight=None, bias=None, init_state=None, mask=None,
        secondary_bias=None, *, descriptor):
    """MPSGraph ``GRUWithSourceTensor:recurrentWeight:inputWeight:bias:initState:mask:
    secondaryBias:descriptor:name:`` — one GRU layer.

    Args (D = 2 with ``descriptor.bidirectional``, else 1; all one float dtype):
        source: ``[T, N, I]``; ``[T, N, 3H]`` / ``[T, N, 6H]`` without ``input_weight`` (the
            gate pre-activations ``x·Wᵀ``, descriptor's gate order, forward direction first).
        recurrent_weight: ``[3H, H]``, or ``[2, 3H, H]`` bidirectional.
        input_weight: ``[3H, I]`` / ``[6H, I]`` (``None``: the source is already projected).
        bias: ``[3H]`` / ``[6H]``, added outside the reset product (``None``: zeros).
        init_state: ``[N, H]`` / ``[N, 2H]`` = ``[fwd | bwd]`` (``None``: zeros).
        mask: broadcastable to the output ``[T, N, D·H]`` (float of the source dtype, or
            bool); ``h ⊙ mask[t]`` enters the recurrent products of the step producing
            ``output[t]`` (original time, either direction); the blend uses the unmasked ``h``.
        secondary_bias: ``[H]`` / ``[2H]``, the recurrent candidate bias inside the reset
            product; only with ``descriptor.reset_after`` (otherwise a ``ValueError``).
        descriptor: a ``GRUDescriptor``.  Contradictions in Apple's documentation are decided
            as the operation's comment says: ``flip_z=False`` → ``h' = z⊙h + (1−z)⊙o``;
            ``hard_sigmoid`` is ``clip(0.2·x + 0.5, 0, 1)``.

    Returns:
        ``[output]``, or ``[output, z_state]`` with ``descriptor.training``.  ``output``
        ``[T, N, D·H]``: the state after every step, aligned to the original time index for
        a reverse direction too (its final state is ``output[0]``).  ``z_state``
        ``[T, N, 3H]`` / ``[T, N, 6H]``: each direction's activated gates in canonical order
        ``[r, z, n]``, ``z_state[t]`` those of the step producing ``output[t]``.
    """
    plan = _Plan(source, recurrent_weight, input_weight, bias, init_state, mask,
                 secondary_bias, descriptor)
    training = plan.desc.training
    fwd = engine.forward(plan.net, plan.x, plan.h0, state_mask=plan.state_mask,
                         training=training)
    if not training:
        return [fwd.y]
    gates = rebuild.reserve_gates(fwd.reserve, plan.net, plan.x)
    z_state = np.concatenate(gates, axis=-1)
    return [fwd.y, z_state]


# --- gradients -------------------------------------------------------------------------------
def gru_gradients(source, recurrent_weight, source_gradient, z_state, output_fwd, *,
                  state_gradient=None, input_weight=None, bias=None, init_state=None, mask=None,
                  secondary_bias=None, descriptor):
    """MPSGraph ``GRUGradientsWithSourceTensor:…`` — all three overloads through optional
    arguments.

    Pass the forward's inputs (same meaning and shapes as ``gru``), its ``output`` as
    ``output_fwd`` ``[T, N, D·H]`` and its ``z_state`` (from ``gru`` with
    ``descriptor.training``), the gradient of the loss with respect to the output as
    ``source_gradient`` ``[T, N, D·H]`` (``None``: zeros) and, optionally, with respect to the
    final state as ``state_gradient`` ``[N, D·H]`` = ``[fwd | bwd]`` — the backward half is
    the gradient of the reverse direction's final state, its state at original time 0
    (``None``: zeros).  The forward time loop is not re-run: the core's reserve is rebuilt
    from ``z_state`` and ``output_fwd``.  Same documented decisions as ``gru`` (``flip_z``,
    ``hard_sigmoid``).

    Returns the list of gradients in MPSGraph's order — source, recurrent_weight,
    input_weight, bias, init_state, secondary_bias — with an entry only for the inputs that
    were given (source and recurrent_weight always), each shaped like its input.  A projected
    source's gradient is in the descriptor's gate order, like the source.
    """
    plan = _Plan(source, recurrent_weight, input_weight, bias, init_state, mask,
                 secondary_bias, descriptor)
    T, N, H, D, dtype = plan.T, plan.N, plan.H, plan.D, plan.dtype
    out_shape, z_shape = (T, N, D * H), (T, N, D * 3 * H)
    _shaped(output_fwd, "output_fwd", dtype, out_shape, plan.shape_names("out"))
    _shaped(z_state, "z_state", dtype, z_shape, plan.shape_names("z"))
    if source_gradient is not None:
        _shaped(source_gradient, "source_gradient", dtype, out_shape, plan.shape_names("out"))
    dhy = None
    if state_gradient is not None:
        _shaped(state_gradient, "state_gradient", dtype, (N, D * H), plan.shape_names("state"))
        # state_gradient [N, D·H] = [fwd | bwd]  →  dhy [D, N, H]
        dhy = np.ascontiguousarray(state_gradient.reshape(N, D, H).transpose(1, 0, 2))

    gates = [np.ascontiguousarray(z_state[..., d * 3 * H:(d + 1) * 3 * H]) for d in range(D)]
    reserve = rebuild.reserve_from_gates(plan.net, plan.x, gates,
                                        np.ascontiguousarray(output_fwd), plan.h0,
                                        state_mask=plan.state_mask)
    dx, dh0, dparams = engine.backward(
        plan.net, plan.x, reserve,
        None if source_gradient is None else np.ascontiguousarray(source_gradient), dhy,
        state_mask=plan.state_mask)

    # Back to MPSGraph's tensors (the descriptor's gate order, MPSGraph's bias rules).
    grad = mps_system.gradient_tensors(dparams, plan.desc.reset_gate_first)
    out = [mps_system.canonical_to_source(dx, H, D, plan.desc.reset_gate_first)
           if plan.projected else dx, grad["recurrent_weight"]]
    if input_weight is not None:
        out.append(grad["input_weight"])
    if bias is not None:
        out.append(grad["bias"])
    if init_state is not None:
        # dh0 [D, N, H]  →  [N, D·H] = [fwd | bwd]
        out.append(np.ascontiguousarray(dh0.transpose(1, 0, 2)).reshape(N, D * H))
    if secondary_bias is not None:
        out.append(grad["secondary_bias"])
    return out


# === LSTM and single-gate RNN ===================================================================
_LSTM_ACTS = tuple(name for name, _ in LSTM_ACTIVATION_FIELDS)


@dataclass
class LSTMDescriptor:
    """``MPSGraphLSTMDescriptor``: the options of one LSTM op, MPSGraph's defaults.

    ``reverse``, ``bidirectional``: as for ``GRUDescriptor`` (``reverse`` ignored with
    ``bidirectional``; outputs aligned to the original time index).  ``produce_cell``: ``lstm``
    also returns the cell state of every step.  ``training``: ``lstm`` returns
    ``[output, cell, z_state]`` (the cell is always produced with ``training``: the gradient
    op needs it as ``cell_output_fwd``).  ``forget_gate_last``: gate order ``[i, z, f, o]``
    instead of ``[i, f, z, o]`` — the order Apple's comment writes (the property's name
    suggests ``[i, z, o, f]``; cgru follows the written order).  Activations (``str`` or
    ``bytes``; ``"none"``, ``"relu"``, ``"tanh"``, ``"sigmoid"``, ``"hard_sigmoid"`` =
    ``clip(0.2·x + 0.5, 0, 1)``): ``input_gate_activation``, ``forget_gate_activation``,
    ``output_gate_activation`` (sigmoid), ``cell_gate_activation`` (tanh, the ``z`` gate) and
    ``activation`` (tanh, ``g`` in ``h = o ⊙ g(c)``).
    """
    reverse: bool = False
    bidirectional: bool = False
    produce_cell: bool = False
    training: bool = False
    forget_gate_last: bool = False
    input_gate_activation: str = "sigmoid"
    forget_gate_activation: str = "sigmoid"
    cell_gate_activation: str = "tanh"
    output_gate_activation: str = "sigmoid"
    activation: str = "tanh"

    def __post_init__(self):
        _check_op_descriptor(self, LSTMDescriptor, LSTM_FLAGS, _LSTM_ACTS)


@dataclass
class SingleGateRNNDescriptor:
    """``MPSGraphSingleGateRNNDescriptor``: ``reverse``, ``bidirectional`` (as for
    ``GRUDescriptor``), ``training`` (``single_gate_rnn`` also returns ``z_state``) and
    ``activation`` (default ``"relu"``, as Apple documents; names as for the GRU)."""
    reverse: bool = False
    bidirectional: bool = False
    training: bool = False
    activation: str = "relu"

    def __post_init__(self):
        _check_op_descriptor(self, SingleGateRNNDescriptor, RNN_FLAGS, ("activation",))


def _check_op_descriptor(desc, cls, flags, acts):
    """Validate an LSTM / RNN descriptor (at every call too: the dataclass is mutable)."""
    if not isinstance(desc, cls):
        raise TypeError(f"descriptor: expected a cgru.mps.{cls.__name__}, got "
                        f"{type(desc).__name__}")
    for name in flags:
        validate.flag(getattr(desc, name), f"descriptor.{name}")
    for name in acts:
        _rules.option(getattr(desc, name), f"descriptor.{name}", MPS_ACTIVATIONS)
    return desc


def _blocks(k):
    """The name of ``k`` blocks of ``H`` (``"H"``, ``"2H"``, ``"4H"``, ``"8H"``)."""
    return "H" if k == 1 else f"{k}H"


def _per_direction_state(a, N, D, H):
    """``[N, D·H]`` = ``[fwd | bwd]`` → the core's ``[D, N, H]`` (``None`` stays ``None``)."""
    return None if a is None else np.ascontiguousarray(a.reshape(N, D, H).transpose(1, 0, 2))


def _op_state(a, N, D, H):
    """The core's ``[D, N, H]`` → MPSGraph's ``[N, D·H]``."""
    return np.ascontiguousarray(a.transpose(1, 0, 2)).reshape(N, D * H)


class _OpPlan:
    """The validated inputs of one LSTM (``kind="lstm"``) or single-gate RNN (``"rnn"``) call,
    mapped onto the core (see ``lstm`` and ``single_gate_rnn``)."""

    def __init__(self, kind, descriptor, source, recurrent_weight, input_weight, bias,
                 init_state, mask, init_cell=None, peephole=None):
        lstm = kind == "lstm"
        desc = _check_op_descriptor(descriptor, LSTMDescriptor, LSTM_FLAGS, _LSTM_ACTS) if lstm \
            else _check_op_descriptor(descriptor, SingleGateRNNDescriptor, RNN_FLAGS,
                                      ("activation",))
        G = 4 if lstm else 1
        validate.plain_array(source, "source", "[T, N, I]")
        dtype = validate.float_array(source, "source").dtype
        if source.ndim != 3:
            raise ValueError(f"source: expected a 3-D array [T, N, I], got shape "
                             f"{list(source.shape)}")
        T, N, I = source.shape
        validate.input_sizes("source", source.shape, T, N, "[T, N, I]")
        D = 2 if desc.bidirectional else 1
        GH, DGH, DH = _blocks(G), _blocks(D * G), _blocks(D)
        validate.float_array(recurrent_weight, "recurrent_weight", dtype,
                             like="(the dtype of source)")
        H = recurrent_weight.shape[-1] if recurrent_weight.ndim else 0
        if D == 1:
            _shaped(recurrent_weight, "recurrent_weight", dtype, (G * H, H), (GH, "H"))
        else:
            _shaped(recurrent_weight, "recurrent_weight (bidirectional)", dtype,
                    (2, G * H, H), ("2", GH, "H"))
        if H == 0:
            raise ValueError(f"recurrent_weight: expected H ≥ 1, got shape "
                             f"{list(recurrent_weight.shape)}")
        if input_weight is None:
            if I != D * G * H:
                raise ValueError(f"source: without input_weight the source holds the gate "
                                 f"pre-activations, expected shape [T={T}, N={N}, "
                                 f"{DGH}={D * G * H}], got {list(source.shape)}")
        else:
            _shaped(input_weight, "input_weight", dtype, (D * G * H, I), (DGH, "I"))
        if bias is not None:
            _shaped(bias, "bias", dtype, (D * G * H,), (DGH,))
        if init_state is not None:
            _shaped(init_state, "init_state", dtype, (N, D * H), ("N", DH))
        if init_cell is not None:
            _shaped(init_cell, "init_cell", dtype, (N, D * H), ("N", DH))
        if peephole is not None:
            if D == 1:
                _shaped(peephole, "peephole", dtype, (4 * H,), ("4H",))
            elif peephole.shape == (8 * H,):
                raise ValueError(f"peephole (bidirectional): expected shape [2=2, 4H={4 * H}] "
                                 f"(the forward op's documented layout), got [8H={8 * H}] (the "
                                 f"layout Apple's gradient comment writes); reshape it to "
                                 f"[2, 4H]")
            else:
                _shaped(peephole, "peephole (bidirectional)", dtype, (2, 4 * H), ("2", "4H"))
        self.state_mask = _state_mask(mask, dtype, T, N, D, H)

        self.kind, self.desc, self.dtype = kind, desc, dtype
        self.T, self.N, self.I, self.H, self.D, self.G = T, N, I, H, D, G
        self.projected = input_weight is None
        self.source = source
        layer = {"recurrent_weight": recurrent_weight, "input_weight": input_weight,
                 "bias": bias}
        if lstm:
            self.order = mps_system.lstm_gate_order(desc.forget_gate_last)
            cell = mps_system.lstm_cell_from_descriptor(
                **{name: getattr(desc, name) for name in _LSTM_ACTS},
                peepholes=peephole is not None, what="descriptor.")
            layer["peephole"] = peephole
            self.net = mps_system.lstm_network(
                [layer], reverse=desc.reverse, bidirectional=desc.bidirectional,
                forget_gate_last=desc.forget_gate_last, cell=cell, canonical_source=True)
        else:
            self.order = (0,)
            cell = mps_system.rnn_cell_from_descriptor(activation=desc.activation,
                                                       what="descriptor.")
            self.net = mps_system.rnn_network([layer], reverse=desc.reverse,
                                              bidirectional=desc.bidirectional, cell=cell)
        # a projected source in canonical gate order (the core's projected input mode)
        self.x = mps_system.gates_to_canonical(source, H, D, self.order) if self.projected \
            else np.ascontiguousarray(source)
        self.h0 = _per_direction_state(init_state, N, D, H)
        self.c0 = _per_direction_state(init_cell, N, D, H)

    def names(self, what):
        """Axis names for messages: ``"out"`` (output, cell), ``"z"`` (z_state),
        ``"state"``."""
        D, G = self.D, self.G
        return {"out": ("T", "N", _blocks(D)), "z": ("T", "N", _blocks(D * G)),
                "state": ("N", _blocks(D))}[what]

    def forward(self, training):
        return engine.forward(self.net, self.x, self.h0, c0=self.c0,
                              state_mask=self.state_mask, training=training)

    def cell_states(self, reserve):
        """``(c after every step, c before every step)`` ``[T, N, D·H]`` (original time, every
        direction) from a training forward's reserve."""
        net = self.net
        opened = calls.open_reserve(reserve, net, net.cell, self.T, self.N, False)
        T, after, before = self.T, [], []
        for d in range(self.D):
            cs = opened.lds[d]["cstates"]       # [T+1, N, H]: c0 and c after every step
            if net.topology.reversed_direction(d):      # slot t = c[t], slot T = c0
                after.append(cs[:T])
                before.append(cs[1:])
            else:                                       # slot 0 = c0, slot t+1 = c[t]
                after.append(cs[1:])
                before.append(cs[:T])
        return np.concatenate(after, axis=-1), np.concatenate(before, axis=-1)

    def pre_activations(self, y):
        """The single-gate RNN's ``z[t] = x[t]·Wᵀ + (h[t−1] ⊙ m)·Rᵀ + b`` ``[T, N, D·H]`` from
        its output (whole-sequence GEMMs; no time loop)."""
        N, H, D = self.N, self.H, self.D
        h0 = np.zeros((D, N, H), self.dtype) if self.h0 is None else self.h0
        out = []
        for d in range(D):
            lp = self.net[d]
            yd = y[:, :, d * H:(d + 1) * H]
            if self.net.topology.reversed_direction(d):
                h_prev = np.concatenate([yd[1:], h0[d][None]])
            else:
                h_prev = np.concatenate([h0[d][None], yd[:-1]])
            if self.state_mask is not None:
                h_prev = h_prev * self.state_mask[..., d * H:(d + 1) * H]
            xp = self.x[..., d * H:(d + 1) * H] if self.projected else self.x @ lp.W.T
            out.append(xp + (h_prev @ lp.R.T) + (lp.b_W + lp.b_R))
        return np.concatenate(out, axis=-1)

    def check_gradient_inputs(self, source_gradient, z_state, state_gradient, others=()):
        """Shapes of the gradient op's extra inputs; ``(dy, dhy)`` for the core."""
        T, N, H, D, dtype = self.T, self.N, self.H, self.D, self.dtype
        out_shape = (T, N, D * H)
        _shaped(z_state, "z_state", dtype, (T, N, D * self.G * H), self.names("z"))
        for name, a in others:
            _shaped(a, name, dtype, out_shape, self.names("out"))
        if source_gradient is not None:
            _shaped(source_gradient, "source_gradient", dtype, out_shape, self.names("out"))
        if state_gradient is not None:
            _shaped(state_gradient, "state_gradient", dtype, (N, D * H), self.names("state"))
        return (None if source_gradient is None else np.ascontiguousarray(source_gradient),
                _per_direction_state(state_gradient, N, D, H))


# --- LSTM ------------------------------------------------------------------------------------
def lstm(source, recurrent_weight, input_weight=None, bias=None, init_state=None,
         init_cell=None, mask=None, peephole=None, *, descriptor):
    """MPSGraph ``LSTMWithSourceTensor:recurrentWeight:inputWeight:bias:initState:initCell:
    mask:peephole:descriptor:name:`` — one LSTM layer (every overload, through the optional
    arguments).

    Per step and direction, gates in the descriptor's order (``[i, f, z, o]``, or
    ``[i, z, f, o]`` with ``forget_gate_last``), ``m`` the mask (ones when absent)::

        [i, f, z, o] = f_gate((h[t−1] ⊙ m)·Rᵀ + x[t]·Wᵀ + b + p ⊙ c[t−1])   (each gate its own)
        c[t] = f ⊙ c[t−1] + i ⊙ z
        h[t] = o ⊙ g(c[t])                  (g: descriptor.activation)

    Args (D = 2 with ``descriptor.bidirectional``, else 1; all one float dtype):
        source: ``[T, N, I]``; ``[T, N, 4H]`` / ``[T, N, 8H]`` without ``input_weight`` (the
            gate pre-activations ``x·Wᵀ``, descriptor's gate order, forward direction first).
        recurrent_weight: ``[4H, H]``, or ``[2, 4H, H]`` bidirectional.
        input_weight: ``[4H, I]`` / ``[8H, I]`` (``None``: the source is already projected).
        bias: ``[4H]`` / ``[8H]`` (``None``: zeros).
        init_state, init_cell: ``[N, H]`` / ``[N, 2H]`` = ``[fwd | bwd]`` (``None``: zeros).
        mask: broadcastable to the output ``[T, N, D·H]`` (float of the source dtype, or
            bool); ``h ⊙ mask[t]`` enters the recurrent product of the step producing
            ``output[t]`` (original time, either direction); the peephole term is not masked.
        peephole: ``[4H]`` / ``[2, 4H]``, one vector per gate in the descriptor's order, added
            as ``p ⊙ c[t−1]`` to every gate (Apple's formula).
        descriptor: an ``LSTMDescriptor``.

    Returns:
        ``[output]``; ``[output, cell]`` with ``descriptor.produce_cell``; ``[output, cell,
        z_state]`` with ``descriptor.training`` (whatever ``produce_cell``: the gradient op's
        ``cellOutputFwd`` is "the second output … with training or produceCell").
        ``output``, ``cell`` ``[T, N, D·H]``: ``h[t]`` and ``c[t]``, aligned to the original
        time index for a reverse direction too.  ``z_state`` ``[T, N, 4H]`` / ``[T, N, 8H]``:
        each direction's activated gates in cgru's canonical order ``[i, f, z, o]`` (Apple's
        default order, whatever ``forget_gate_last``), ``z_state[t]`` those of the step
        producing ``output[t]``.
    """
    plan = _OpPlan("lstm", descriptor, source, recurrent_weight, input_weight, bias,
                   init_state, mask, init_cell, peephole)
    desc = plan.desc
    if not (desc.training or desc.produce_cell):
        return [plan.forward(False).y]
    fwd = plan.forward(True)
    cell, _ = plan.cell_states(fwd.reserve)
    if not desc.training:
        return [fwd.y, cell]
    z_state = np.concatenate(rebuild.reserve_gates(fwd.reserve, plan.net, plan.x), axis=-1)
    return [fwd.y, cell, z_state]


def lstm_gradients(source, recurrent_weight, source_gradient, z_state, cell_output_fwd, *,
                   state_gradient=None, cell_gradient=None, input_weight=None, bias=None,
                   init_state=None, init_cell=None, mask=None, peephole=None, descriptor):
    """MPSGraph ``LSTMGradientsWithSourceTensor:…`` — every overload, through the optional
    arguments.

    Pass the forward's inputs (same meaning and shapes as ``lstm``), its ``z_state`` and its
    ``cell`` as ``cell_output_fwd`` ``[T, N, D·H]``, the gradient of the loss with respect to
    the output as ``source_gradient`` ``[T, N, D·H]`` (``None``: zeros) and, optionally, with
    respect to the final state and the final cell as ``state_gradient`` and ``cell_gradient``
    ``[N, D·H]`` = ``[fwd | bwd]`` (the backward halves belong to the reverse direction's
    final values, at original time 0; ``None``: zeros).

    As in MPSGraph, the gradients are those of the forward that ``z_state`` and
    ``cell_output_fwd`` record (``h = o ⊙ g(c)`` from them): cgru rebuilds its reserve from
    them (``cgru.core.rebuild.reserve_from_saved``) instead of re-running the forward.

    Returns the list of gradients in MPSGraph's order — source, recurrent_weight,
    input_weight, bias, peephole, init_state, init_cell — with an entry only for the inputs
    that were given (source and recurrent_weight always), each shaped like its input, in the
    descriptor's gate order.
    """
    plan = _OpPlan("lstm", descriptor, source, recurrent_weight, input_weight, bias,
                   init_state, init_cell=init_cell, mask=mask, peephole=peephole)
    N, H, D, order = plan.N, plan.H, plan.D, plan.order
    dy, dhy = plan.check_gradient_inputs(source_gradient, z_state, state_gradient,
                                         (("cell_output_fwd", cell_output_fwd),))
    dcy = None
    if cell_gradient is not None:
        _shaped(cell_gradient, "cell_gradient", plan.dtype, (N, D * H), plan.names("state"))
        dcy = _per_direction_state(cell_gradient, N, D, H)
    # the forward's reserve, rebuilt from its z_state and cells (no time loop)
    GH = 4 * H
    saved = {"gates": [np.ascontiguousarray(z_state[..., d * GH:(d + 1) * GH])
                       for d in range(D)],
             "cells": [np.ascontiguousarray(cell_output_fwd[..., d * H:(d + 1) * H])
                       for d in range(D)]}
    reserve = rebuild.reserve_from_saved(plan.net, plan.x, saved, h0=plan.h0, c0=plan.c0,
                                        state_mask=plan.state_mask)
    g = engine.backward(plan.net, plan.x, reserve, dy, dhy, dcy=dcy,
                        state_mask=plan.state_mask)
    grad = mps_system.op_gradient_tensors(g.dparams, order)
    d_source = mps_system.gates_from_canonical(g.dx, H, D, order) if plan.projected else g.dx
    d_input_weight, d_peephole = grad["input_weight"], grad["peephole"]

    out = [d_source, grad["recurrent_weight"]]
    if input_weight is not None:
        out.append(d_input_weight)
    if bias is not None:
        out.append(grad["bias"])
    if peephole is not None:
        out.append(d_peephole)
    if init_state is not None:
        out.append(_op_state(g.dh0, N, D, H))
    if init_cell is not None:
        out.append(_op_state(g.dc0, N, D, H))
    return out


# --- single-gate RNN -------------------------------------------------------------------------
def single_gate_rnn(source, recurrent_weight, input_weight=None, bias=None, init_state=None,
                    mask=None, *, descriptor):
    """MPSGraph ``singleGateRNNWithSourceTensor:recurrentWeight:inputWeight:bias:initState:
    mask:descriptor:name:`` — one vanilla RNN layer (every overload, through the optional
    arguments)::

        z[t] = x[t]·Wᵀ + (h[t−1] ⊙ m)·Rᵀ + b
        h[t] = activation(z[t])

    Args (D = 2 with ``descriptor.bidirectional``, else 1; all one float dtype):
        source: ``[T, N, I]``; ``[T, N, H]`` / ``[T, N, 2H]`` without ``input_weight`` (Apple:
            "assumes diagonal unit-matrix": the source is ``x·Wᵀ`` itself).
        recurrent_weight: ``[H, H]``, or ``[2, H, H]`` bidirectional.
        input_weight: ``[H, I]`` / ``[2H, I]``; bias: ``[H]`` / ``[2H]``.
        init_state: ``[N, H]`` / ``[N, 2H]`` = ``[fwd | bwd]``; mask: as for ``lstm``.
        descriptor: a ``SingleGateRNNDescriptor``.

    Returns ``[output]``, or ``[output, z_state]`` with ``descriptor.training``, both
    ``[T, N, D·H]`` and aligned to the original time index: ``output[t] = h[t]`` and
    ``z_state[t] = z[t]``, the pre-activation of the step producing ``output[t]`` (Apple's
    documented content of the second output).
    """
    plan = _OpPlan("rnn", descriptor, source, recurrent_weight, input_weight, bias,
                   init_state, mask)
    y = plan.forward(False).y
    if not plan.desc.training:
        return [y]
    return [y, plan.pre_activations(y)]


def single_gate_rnn_gradients(source, recurrent_weight, source_gradient, z_state, *,
                              state_gradient=None, input_weight=None, bias=None,
                              init_state=None, mask=None, descriptor):
    """MPSGraph ``singleGateRNNGradientsWithSourceTensor:…`` — every overload, through the
    optional arguments.

    Pass the forward's inputs (same meaning and shapes as ``single_gate_rnn``), its
    ``z_state``, the gradient of the loss with respect to the output as ``source_gradient``
    ``[T, N, D·H]`` (``None``: zeros) and, optionally, with respect to the final state as
    ``state_gradient`` ``[N, D·H]`` = ``[fwd | bwd]``.  As in MPSGraph, the gradients are those
    of the forward that ``z_state`` records (its states are ``activation(z)``): cgru rebuilds
    its reserve from it (``cgru.core.rebuild.reserve_from_saved``) instead of re-running the
    forward.

    Returns the gradients in MPSGraph's order — source, recurrent_weight, input_weight, bias,
    init_state — with an entry only for the inputs that were given, each shaped like its input.
    """
    plan = _OpPlan("rnn", descriptor, source, recurrent_weight, input_weight, bias,
                   init_state, mask)
    dy, dhy = plan.check_gradient_inputs(source_gradient, z_state, state_gradient)
    # the forward's reserve, rebuilt from its z_state (no time loop)
    H, D = plan.H, plan.D
    saved = {"pre": [np.ascontiguousarray(z_state[..., d * H:(d + 1) * H]) for d in range(D)]}
    reserve = rebuild.reserve_from_saved(plan.net, plan.x, saved, h0=plan.h0,
                                        state_mask=plan.state_mask)
    g = engine.backward(plan.net, plan.x, reserve, dy, dhy, state_mask=plan.state_mask)
    grad = mps_system.op_gradient_tensors(g.dparams, plan.order)
    out = [g.dx, grad["recurrent_weight"]]
    if input_weight is not None:
        out.append(grad["input_weight"])
    if bias is not None:
        out.append(grad["bias"])
    if init_state is not None:
        out.append(_op_state(g.dh0, plan.N, plan.D, plan.H))
    return out
