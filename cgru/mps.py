"""Apple MPSGraph's ``GRU`` and ``GRUGradients`` on the CPU: ``GRUDescriptor``, ``gru``,
``gru_gradients``.

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
(``cgru.core.engine.reserve_from_gates``) without re-running the forward time loop.
"""
from dataclasses import dataclass

import numpy as np

from cgru.core import engine, validate
from cgru.systems import _rules, mps as mps_system
from cgru.systems.mps import ACTIVATIONS as MPS_ACTIVATIONS, FLAGS

__all__ = ["GRUDescriptor", "gru", "gru_gradients", "MPS_ACTIVATIONS"]

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
        self.state_mask = None
        if mask is not None:
            validate.plain_array(mask, "mask")
            if mask.dtype != dtype and mask.dtype != np.bool_:
                raise TypeError(f"mask: expected dtype {dtype} (the dtype of source) or bool, "
                                f"got {mask.dtype}")
            try:
                np.broadcast_to(mask, (T, N, D * H))            # a view: checks only
            except ValueError:
                raise ValueError(f"mask: expected a shape broadcastable to the output shape "
                                 f"[T={T}, N={N}, {'2H' if D == 2 else 'H'}={D * H}], got "
                                 f"{list(mask.shape)}") from None
            # the core broadcasts it (after its own size checks); only a bool mask is cast
            self.state_mask = mask.astype(dtype, copy=False)

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
    gates = engine.reserve_gates(fwd.reserve, plan.net, plan.x)
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
    reserve = engine.reserve_from_gates(plan.net, plan.x, gates,
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
