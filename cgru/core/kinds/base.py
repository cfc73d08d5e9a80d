"""The protocol of a cell kind (``cgru.core.kinds``), with what most kinds share.

Sizes: ``T`` steps, ``N`` batch, ``H`` hidden, ``S`` state width (an LSTM's projection size,
else ``H``), ``G`` gate blocks; rows of every ``[T·N, ·]`` buffer are ``t·N + b``.

A kind object is stateless: every method takes the cell value (the variant) it computes.
The module imports nothing compiled (the NumPy reference uses the kinds' steps where the
extensions are not built): the methods that bind the kernels or run GEMMs are given them —
``kernels`` (the kind's compiled module, ``backend.kernels(kind)``) and ``backend``
(``cgru.core.backend``: its ``gemm``).
"""
import numpy as np

__all__ = ["Kind", "input_projection", "put_slots", "slots_before"]


def input_projection(topology, G, layer, d, lp, layer_in):
    """Step 1 of every kind, in NumPy, for all time steps: ``[T, N, G·H]`` pre-activations
    without bias (``x·Wᵀ``; skip: ``x`` in every gate block; projected: ``x``'s own blocks)."""
    H = topology.hidden_size
    if layer > 0 or topology.input_mode == "linear":
        return layer_in @ lp.W.T                          # [T, N, in]·[in, G·H]
    if topology.input_mode == "skip":                     # every input matrix is I
        return np.concatenate([layer_in] * G, axis=-1)
    # "projected": x holds each direction's G pre-activation blocks, forward first
    return layer_in[..., d * G * H:(d + 1) * G * H]


def put_slots(slots, first, after, reverse):
    """Fill a reserve's ``[T+1, N, ·]`` state slots: forward, slot 0 = the initial value and
    slot t+1 = after step t; reversed, slot T = the initial value and slot t = after step t."""
    T = slots.shape[0] - 1
    if reverse:
        slots[:T], slots[T] = after, first
    else:
        slots[0], slots[1:] = first, after


def slots_before(slots, reverse):
    """The slots holding the value before every step, in time order ``[T, N, ·]``."""
    T = slots.shape[0] - 1
    return slots[1:] if reverse else slots[:T]


class Kind:
    """One cell kind: the defaults here are those of a kind with one state ``h``, one packed
    recurrent matrix ``R`` and the biases summed (the vanilla RNN's); the other kinds override
    what differs."""

    name = None                 # "gru", "lstm", "rnn"
    kernel_module = None        # "cgru._kernels.<name>": its compiled time loops
    has_cell_state = False      # a second state c (the LSTM)
    has_projection = False      # a recurrent projection W_p is possible (the LSTM)

    # --- the reserve ---------------------------------------------------------------------
    def saved_regions(self, cell, topology):
        """``[(name, shape as a function of (T, N))]`` a training forward saves per
        layer-direction; ``pre`` (the pre-activations) is added for cells off the fast path."""
        H = topology.hidden_size
        regions = [("states", lambda T, N: (T + 1, N, H))]
        return regions + self._pre(cell, topology)

    @staticmethod
    def _pre(cell, topology):
        GH = cell.gates * topology.hidden_size
        return [] if cell.is_fast else [("pre", lambda T, N: (T, N, GH))]

    # --- the kernels' fixed arguments ----------------------------------------------------
    def fixed(self, lp, cell, H):
        """A layer-direction's fixed arguments of the kernels (``Direction`` keywords): the
        biases as the kernels add them, ``b = b_W + b_R``."""
        return {"b": lp.b_W + lp.b_R}

    def packs(self, frozen, i, cell, H, forward):
        """Layer-direction ``i``'s recurrent weights packed for the kernels' GEMM, from the
        call's kept copies (``weights.Frozen``): forward ``gh = h·Rᵀ`` (``Rp``), backward
        ``da·R`` (``Rb``)."""
        return {"Rp" if forward else "Rb": frozen.packed(i, "R", forward)}

    # --- binding a layer-direction for the kernels ---------------------------------------
    def forward_direction(self, kernels, common, cell, saved, c0, cy):
        """The kernels' ``Direction`` of one layer-direction's forward: ``common`` holds what
        every kind takes (reverse, gx, ldgx, h0, hy, states, pre) and its fixed arguments (its
        packs and ``fixed``: ``weights.Frozen.direction_args``), ``saved`` its reserve views
        (``{}`` in inference), ``c0``/``cy`` the cell states (LSTM)."""
        return kernels.Direction(**common)

    def backward_buffers(self, cell, topology, d, TN):
        """``[(name, shape)]`` of direction ``d``'s backward buffers (one of each name per
        direction): ``dgx`` ``[T·N, G·H]``,
        the gradient of the gate pre-activations (the input side and the recurrent side see
        the same, unless the kind adds a buffer for the columns where they differ)."""
        return [("dgx", (TN, cell.gates * topology.hidden_size))]

    def backward_direction(self, kernels, common, cell, lp, saved, ld, d, dcy, dc0):
        """The kernels' ``Direction`` of one layer-direction's backward (``common``: reverse,
        packs, pre, states, dhy, dh0, dgx, hm; ``ld``: the backward's buffers by name, one per
        direction)."""
        return kernels.Direction(**common)

    def recurrent_side(self, cell, ld, d):
        """The gradient of the recurrent pre-activations ``[rows, G·H]``: ``(k, own)``, its
        first ``k`` columns the input side's (``dgx``'s), the rest ``own`` (None when all of
        them are: the kinds but the reset-after GRU)."""
        return ld["dgx"][d].shape[1], None

    def recurrent_blocks(self, cell, ld, d):
        """``recurrent_side`` as blocks of columns, in order (views)."""
        k, own = self.recurrent_side(cell, ld, d)
        dgx = ld["dgx"][d]
        first = dgx if k == dgx.shape[1] else dgx[:, :k]
        return (first,) if own is None else (first, own)

    def weight_gradients(self, backend, g, cell, topology, d, saved, ld, h_in, nt, active,
                         rows, beta):
        """After a block of the loops: the layer-direction's recurrent weight gradient (and the
        kind's own) over the block's rows ``rows = (r0, r1)`` of ``T·N``, written into ``g``
        (its ``LayerParams`` of gradients; ``beta`` 0: set, by the first block, 1: added).
        ``ld``: the block's operands; ``h_in`` ``[r1 − r0, S]`` the state entering each of its
        steps (masked, zero on padded steps); ``active`` its rows' activity, or None."""
        # dR[G·H, S] (+)= dghᵀ · (h ⊙ m)
        backend.gemm_t(self.recurrent_blocks(cell, ld, d), h_in, g.R, beta=beta, nt=nt)

    # --- rebuilding a reserve from another system's saved training state ----------------
    saved_for_rebuild = None   # {name: width as a function of H} of what rebuild_from_saved
    #                            takes per direction (None: the kind rebuilds from gates)
    rebuilds_from_gates = False    # True: rebuild_from_gates (the GRU, from MPSGraph's zState)

    def rebuild_from_saved(self, backend, views, lp, cell, topology, d, x, saved, h0, c0,
                           mask):
        """Fill a fresh one-layer reserve's views of direction ``d`` from what a training
        forward saved elsewhere (MPSGraph), without a time loop."""
        raise NotImplementedError

    # --- the NumPy reference -------------------------------------------------------------
    def step(self, cell, x_proj, state, lp, mask):
        """One step of the reference: the new state tuple ``(h,)`` or ``(h, c)``."""
        raise NotImplementedError

    def step_backward(self, cell, x_proj, state, lp, mask, dstate):
        """Undo ``step`` exactly: ``(dx_proj, dstate_prev tuple, {name: weight gradient})``."""
        raise NotImplementedError
