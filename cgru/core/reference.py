"""The slow, obviously correct NumPy reference of a recurrent stack: forward and backward.

Everything the fast engine computes is written out here once, for clarity, with loops over
layers, directions and time steps; the fast path is tested against it (and it against PyTorch
and finite differences).  Pure NumPy: it imports nothing compiled (only the cell and network
definitions), so it loads where the extensions are not built.  It computes in the dtype of
``params`` (float32 or float64): ``x``, ``h0``, ``c0``, ``state_mask`` and ``dropout_masks``
are converted to it.  ``forward`` gives ``(y, hy)`` (``(y, hy, cy)`` for an LSTM);
``backward`` the gradients of ``Σ y·dy + Σ hy·dhy (+ Σ cy·dcy)`` with respect to ``x``,
``h0`` (``c0``) and every weight, by the chain rule through the same steps (each
``*_step_backward`` undoes its ``*_step``).

One step of layer-direction ``(l, d)``, row-vector form, ``W``/``R`` stored ``[G·H, in]``/
``[G·H, S]`` and applied as ``x·Wᵀ``; ``c(·)`` clamps to ``[−clip, clip]`` (identity when
``cell.clip is None``); ``m`` is the state mask (1 when absent); ``x_proj = x·Wᵀ`` (skip: x
in every gate block; projected: ``x[..., d·G·H:(d+1)·G·H]``); ``h_m = h ⊙ m``.

GRU (gates r, z, n)::

    r = f_r(c(x_proj_r + b_Wr + h_m·R_rᵀ + b_Rr)),  z = f_z(c(x_proj_z + b_Wz + h_m·R_zᵀ + b_Rz))
    reset_after=True :  n = g(c(x_proj_n + b_Wn + r ⊙ (h_m·R_nᵀ + b_Rn)))
    reset_after=False:  n = g(c(x_proj_n + (r ⊙ h_m)·R_nᵀ + b_Wn + b_Rn))
    flip_z=False: h' = (1 − z) ⊙ n + z ⊙ h     flip_z=True: h' = z ⊙ n + (1 − z) ⊙ h   (unmasked h)

LSTM (gates i, f, g, o; S = P with a projection W_p [P, H], else H; peepholes zero without
``cell.peepholes``: "ifo" P = [P_i, P_f, P_o], "ifgo" P = [P_i, P_f, P_g, P_o])::

    a = x_proj + b_W + h_m·Rᵀ + b_R
    i = f_i(c(a_i + P_i ⊙ c)),  f = f_f(c(a_f + P_f ⊙ c))  (input_forget: f = 1 − i)
    g = g(c(a_g))                              ("ifgo": g = g(c(a_g + P_g ⊙ c)))
    c' = f ⊙ c + i ⊙ g;   o = f_o(c(a_o + P_o ⊙ c'))   ("ifgo": P_o ⊙ c);   h' = o ⊙ h(c')
    (projection: h' = (o ⊙ h(c'))·W_pᵀ)

Vanilla RNN::

    h' = act(c(x_proj + b_W + h_m·Rᵀ + b_R))

Sequences: ``x`` is ``[T, N, I]`` (``[N, T, I]`` with ``batch_major``); ``y`` is
``[T, N, D·S]`` (``[N, T, D·S]``) with per step ``[forward | backward]``; ``h0``/``hy`` are
``[L·D, N, S]`` (``c0``/``cy`` ``[L·D, N, H]``) at index ``l·D + d`` in both layouts.
Direction ``d`` runs reversed when ``topology.reversed_direction(d)`` (``d = 1`` of
"bidirectional", or the single direction of "reverse").  Row ``b`` with length ``len[b]``: a
forward direction processes ``t = 0 … len−1``, a reversed one ``t = len−1 … 0``; step ``t``
writes ``y[t]`` (original time index); ``y[t] = 0`` for ``t ≥ len``; ``hy`` (``cy``) is the
state after the last processed step (``h0``, ``c0`` when ``len = 0``).  Layer ``l ≥ 1`` reads
layer ``l−1``'s whole output ``[T, N, D·S]``, times ``dropout_masks[l−1]`` when given
(inverted dropout, scaling already in the mask).
"""
import numpy as np

from cgru.core import kinds
from cgru.core.activations import activate, activate_grad
from cgru.core.cells import GRUCell, is_cell
from cgru.core.kinds import gru as _gru, lstm as _lstm, rnn as _rnn
from cgru.core.kinds.base import input_projection as _input_projection
from cgru.core.network import LayerParams, Network

__all__ = ["activate", "activate_grad", "cell_step", "gru_step", "lstm_step", "rnn_step",
           "step_backward", "forward", "backward"]

# One step of each kind, and its exact backward, live with the kind (``cgru.core.kinds``); the
# names below are theirs.
gru_step, lstm_step, rnn_step = _gru.step, _lstm.step, _rnn.step
cell_step = gru_step        # the GRU step (its name since cgru's first release)
step_backward = _gru.step_backward


def _step(cell, x_proj, state, lp, mask):
    """The kind's step on ``state`` = ``(h,)`` or ``(h, c)``; returns the new state tuple."""
    return kinds.of(cell).step(cell, x_proj, state, lp, mask)


def _step_backward(cell, x_proj, state, lp, mask, dstate):
    """Undo ``_step``: ``(dx_proj, dstate_prev tuple, {name: gradient})``."""
    return kinds.of(cell).step_backward(cell, x_proj, state, lp, mask, dstate)



# --- 1. one layer-direction over a sequence ---------------------------------------------------

def _steps(lengths, T, reverse):
    """``[(k, rows, t)]``: processing step k, its active rows and each one's time index."""
    out = []
    for k in range(T):
        rows = np.nonzero(lengths > k)[0]                                   # active rows
        if rows.size:
            t = lengths[rows] - 1 - k if reverse else np.full(rows.size, k)
            out.append((k, rows, t))
    return out


def _run_direction(cell, x_proj, state0, lp, lengths, reverse, mask):
    """One layer-direction over the sequence.

    ``x_proj`` ``[T, N, G·H]``, ``state0`` ``(h0 [N, S],)`` or ``(h0, c0 [N, H])``, ``lengths``
    int ``[N]``, ``mask`` ``None`` or ``[T, N, S]`` (original time).  Returns ``(y [T, N, S],
    final state tuple)``.  Step ``k`` of row ``b`` (active while ``k < len[b]``) reads and
    writes time ``t = k`` (forward) or ``t = len[b] − 1 − k`` (reverse).
    """
    T = x_proj.shape[0]
    state = [s.copy() for s in state0]
    y = np.zeros((T,) + state[0].shape, dtype=x_proj.dtype)                 # [T, N, S]
    for k, rows, t in _steps(lengths, T, reverse):
        m = None if mask is None else mask[t, rows]
        new = _step(cell, x_proj[t, rows], [s[rows] for s in state], lp, m)
        for s, v in zip(state, new):
            s[rows] = v
        y[t, rows] = state[0][rows]
    return y, state


# --- 2. the stack -----------------------------------------------------------------------------

def _check_shape(a, shape, what):
    if a.shape != tuple(shape):
        raise ValueError(f"{what}: expected shape {tuple(shape)}, got {a.shape}")


def _cell_of(params, cell):
    """The cell to compute: ``cell`` when given (it must agree with a network that carries
    one), else the network's."""
    if not isinstance(params, Network):
        raise TypeError(f"params: expected a cgru.Network, got {type(params).__name__}")
    if cell is None:
        return params.cell
    if not is_cell(cell):
        raise TypeError(f"cell: expected a cgru.Cell (or another cgru cell kind), got "
                        f"{type(cell).__name__}")
    if params._cell_given and cell != params.cell:
        raise ValueError(f"cell: {cell} contradicts the network's own cell {params.cell}")
    return cell


def _prepare(params, cell, x, h0, c0, lengths, batch_major, state_mask, dropout_masks):
    """The call's arrays in the dtype of ``params``, time-major: ``(x, h0, c0, lengths,
    state_mask, dropout_masks)`` (``c0`` is ``None`` for kinds without a cell state)."""
    topo = params.topology
    L, D, H, S = topo.num_layers, topo.num_directions, topo.hidden_size, topo.state_size
    dtype = params.dtype

    x = np.asarray(x, dtype=dtype)
    if x.ndim != 3:
        raise ValueError(f"x: expected a 3-D array, got shape {x.shape}")
    if batch_major:
        x = x.transpose(1, 0, 2)                                            # [T, N, I]
    T, N, I = x.shape
    if I != topo.input_size:
        raise ValueError(f"x: expected {topo.input_size} features, got {I}")

    h0 = np.zeros((L * D, N, S), dtype=dtype) if h0 is None else np.asarray(h0, dtype=dtype)
    _check_shape(h0, (L * D, N, S), "h0")
    if cell.has_cell_state:
        c0 = np.zeros((L * D, N, H), dtype=dtype) if c0 is None else np.asarray(c0, dtype=dtype)
        _check_shape(c0, (L * D, N, H), "c0")
    elif c0 is not None:
        raise ValueError(f"c0: only LSTM cells have a cell state, got a {cell.kind} cell")

    if lengths is None:
        lengths = np.full(N, T, dtype=np.int64)
    else:
        lengths = np.asarray(lengths)
        if lengths.dtype.kind not in "iu":
            raise TypeError(f"lengths: expected integers, got dtype {lengths.dtype}")
        _check_shape(lengths, (N,), "lengths")
        if lengths.size and (lengths.min() < 0 or lengths.max() > T):
            raise ValueError(f"lengths: expected values in [0, T={T}], got {lengths.tolist()}")
        lengths = lengths.astype(np.int64)

    if state_mask is not None:
        out_shape = (N, T, D * S) if batch_major else (T, N, D * S)
        try:
            state_mask = np.broadcast_to(np.asarray(state_mask, dtype=dtype), out_shape)
        except ValueError:
            raise ValueError(f"state_mask: shape {np.shape(state_mask)} does not broadcast to "
                             f"the output shape {out_shape}") from None
        if batch_major:
            state_mask = state_mask.transpose(1, 0, 2)                      # [T, N, D·S]

    if dropout_masks is not None:
        dropout_masks = list(dropout_masks)
        if len(dropout_masks) != L - 1:
            raise ValueError(f"dropout_masks: expected {L - 1} masks (L−1), got "
                             f"{len(dropout_masks)}")
        dropout_masks = [np.asarray(m, dtype=dtype) for m in dropout_masks]
        for i, m in enumerate(dropout_masks):
            _check_shape(m, (T, N, D * S), f"dropout_masks[{i}]")
    return x, h0, c0, lengths, state_mask, dropout_masks


def _run_stack(cell, params, x, h0, c0, lengths, state_mask, dropout_masks, tape=None):
    """Forward over the layers; ``tape`` (a list) receives each layer's input."""
    topo = params.topology
    L, D, S = topo.num_layers, topo.num_directions, topo.state_size
    T, N, _ = x.shape
    hy = np.empty_like(h0)
    cy = None if c0 is None else np.empty_like(c0)
    layer_in = x                                                            # [T, N, I]
    for l in range(L):
        if l > 0 and dropout_masks is not None:
            layer_in = layer_in * dropout_masks[l - 1]                      # inverted dropout
        if tape is not None:
            tape.append(layer_in)
        out = np.zeros((T, N, D * S), dtype=params.dtype)                   # [T, N, D·S]
        for d in range(D):
            i = l * D + d
            lp = params[i]
            x_proj = _input_projection(topo, cell.gates, l, d, lp, layer_in)
            mask = None if state_mask is None else state_mask[:, :, d * S:(d + 1) * S]
            state0 = (h0[i],) if c0 is None else (h0[i], c0[i])
            y_d, final = _run_direction(cell, x_proj, state0, lp, lengths,
                                        topo.reversed_direction(d), mask)
            hy[i] = final[0]
            if cy is not None:
                cy[i] = final[1]
            out[:, :, d * S:(d + 1) * S] = y_d
        layer_in = out
    return layer_in, hy, cy


def forward(params, x, h0=None, *, c0=None, cell=None, lengths=None, batch_major=False,
            state_mask=None, dropout_masks=None):
    """The stack's forward: ``(y, hy)``, or ``(y, hy, cy)`` for an LSTM (module docstring).

    ``params``: a ``cgru.Network`` (``cell``: its cell by default); ``x`` ``[T, N, I]``
    (``[N, T, I]`` with ``batch_major``); ``h0`` ``None`` (zeros) or ``[L·D, N, S]``; ``c0``
    (LSTM) ``None`` (zeros) or ``[L·D, N, H]``; ``lengths`` ``None`` (all ``T``) or ints
    ``[N]`` in ``[0, T]``, any order; ``state_mask`` ``None`` or broadcastable to the output
    shape — ``[T, N, D·S]``, or ``[N, T, D·S]`` with ``batch_major`` — and the step of
    layer-direction ``(l, d)`` that produces output time ``t`` uses
    ``state_mask[t, :, d·S:(d+1)·S]`` (time-major coordinates) in every layer;
    ``dropout_masks`` ``None`` or a list of ``L−1`` arrays ``[T, N, D·S]`` (always time-major)
    that multiply layer ``l−1``'s output before layer ``l``.  Results in the dtype of
    ``params``; ``y`` ``[T, N, D·S]`` (``[N, T, D·S]`` with ``batch_major``).
    """
    cell = _cell_of(params, cell)
    x, h0, c0, lengths, state_mask, dropout_masks = _prepare(
        params, cell, x, h0, c0, lengths, batch_major, state_mask, dropout_masks)
    y, hy, cy = _run_stack(cell, params, x, h0, c0, lengths, state_mask, dropout_masks)
    y = np.ascontiguousarray(y.transpose(1, 0, 2) if batch_major else y)
    return (y, hy) if cy is None else (y, hy, cy)


# --- 3. backward -----------------------------------------------------------------------------
def _backward_direction(cell, x_proj, state0, lp, lengths, reverse, mask, dy, dstate_final):
    """Undo ``_run_direction``: ``dy`` ``[T, N, S]`` (output gradient, original time),
    ``dstate_final`` the gradients of the final state tuple.  Returns ``(dx_proj [T, N, G·H],
    dstate0 tuple, {name: gradient})``."""
    T = x_proj.shape[0]
    steps = _steps(lengths, T, reverse)
    # the state before every step
    state = [s.copy() for s in state0]
    before = {}
    for k, rows, t in steps:
        before[k] = [s.copy() for s in state]
        m = None if mask is None else mask[t, rows]
        new = _step(cell, x_proj[t, rows], [s[rows] for s in state], lp, m)
        for s, v in zip(state, new):
            s[rows] = v
    dx_proj = np.zeros_like(x_proj)
    grads = {name: np.zeros_like(a) for name, a in lp.arrays().items() if name != "W"}
    dstate = [d.copy() for d in dstate_final]
    for k, rows, t in reversed(steps):
        m = None if mask is None else mask[t, rows]
        dnew = [d[rows] for d in dstate]
        dnew[0] = dnew[0] + dy[t, rows]
        dxp, dprev, g = _step_backward(cell, x_proj[t, rows], [s[rows] for s in before[k]],
                                       lp, m, dnew)
        dx_proj[t, rows] = dxp
        for d, v in zip(dstate, dprev):
            d[rows] = v
        for name, v in g.items():
            grads[name] += v
    return dx_proj, dstate, grads


def _input_backward(topology, G, layer, d, lp, layer_in, dx_proj):
    """Undo ``_input_projection``: ``(dW, d layer_in)`` (``dW`` ``[G·H, in]``, empty when there
    is no input matrix)."""
    H = topology.hidden_size
    if layer > 0 or topology.input_mode == "linear":
        dW = np.einsum("tng,tni->gi", dx_proj, layer_in)
        return dW, dx_proj @ lp.W                                       # [T, N, in]
    if topology.input_mode == "skip":
        return np.zeros_like(lp.W), sum(dx_proj[..., k * H:(k + 1) * H] for k in range(G))
    d_in = np.zeros_like(layer_in)
    d_in[..., d * G * H:(d + 1) * G * H] = dx_proj
    return np.zeros_like(lp.W), d_in


def backward(params, x, dy=None, dhy=None, h0=None, *, c0=None, dcy=None, cell=None,
             lengths=None, batch_major=False, state_mask=None, dropout_masks=None):
    """The gradients of ``Σ y·dy + Σ hy·dhy (+ Σ cy·dcy)`` (``None``: zeros) for the stack
    ``forward`` computes with the same arguments: ``(dx, dh0, dparams)``, or ``(dx, dh0, dc0,
    dparams)`` for an LSTM; ``dx`` shaped like ``x``, ``dparams`` a ``Network`` of gradients."""
    cell = _cell_of(params, cell)
    x, h0, c0, lengths, state_mask, dropout_masks = _prepare(
        params, cell, x, h0, c0, lengths, batch_major, state_mask, dropout_masks)
    topo = params.topology
    L, D, S = topo.num_layers, topo.num_directions, topo.state_size
    T, N, _ = x.shape
    dtype = params.dtype
    inputs = []
    _run_stack(cell, params, x, h0, c0, lengths, state_mask, dropout_masks, tape=inputs)
    d_out = np.zeros((T, N, D * S), dtype)
    if dy is not None:
        dy = np.asarray(dy, dtype=dtype)
        d_out = d_out + (dy.transpose(1, 0, 2) if batch_major else dy)
    dhy = np.zeros_like(h0) if dhy is None else np.asarray(dhy, dtype=dtype)
    if c0 is not None:
        dcy = np.zeros_like(c0) if dcy is None else np.asarray(dcy, dtype=dtype)
    dh0 = np.empty_like(h0)
    dc0 = None if c0 is None else np.empty_like(c0)
    grads = [None] * (L * D)
    for l in reversed(range(L)):
        layer_in = inputs[l]
        d_in = np.zeros_like(layer_in)
        for d in range(D):
            i = l * D + d
            lp = params[i]
            x_proj = _input_projection(topo, cell.gates, l, d, lp, layer_in)
            mask = None if state_mask is None else state_mask[:, :, d * S:(d + 1) * S]
            state0 = (h0[i],) if c0 is None else (h0[i], c0[i])
            dfinal = (dhy[i],) if c0 is None else (dhy[i], dcy[i])
            dxp, dstate0, g = _backward_direction(
                cell, x_proj, state0, lp, lengths, topo.reversed_direction(d), mask,
                d_out[:, :, d * S:(d + 1) * S], dfinal)
            dh0[i] = dstate0[0]
            if dc0 is not None:
                dc0[i] = dstate0[1]
            dW, d_layer_in = _input_backward(topo, cell.gates, l, d, lp, layer_in, dxp)
            d_in += d_layer_in
            grads[i] = LayerParams(W=dW.astype(dtype), **g)
        if l > 0:
            d_out = d_in * dropout_masks[l - 1] if dropout_masks is not None else d_in
    dx = np.ascontiguousarray(d_in.transpose(1, 0, 2) if batch_major else d_in)
    dparams = Network(topo, grads, params.cell if params._cell_given else None)
    return (dx, dh0, dparams) if dc0 is None else (dx, dh0, dc0, dparams)
