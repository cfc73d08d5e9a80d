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

from cgru.core.cells import Activation, GRUCell, is_cell
from cgru.core.network import LayerParams, Network

__all__ = ["activate", "activate_grad", "cell_step", "gru_step", "lstm_step", "rnn_step",
           "step_backward", "forward", "backward"]


# --- 1. activations ---------------------------------------------------------------------------

def _sigmoid(x):
    # 1/(1+e^-x) for x >= 0 and e^x/(1+e^x) for x < 0: no overflow either way.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def activate(act: Activation, x: np.ndarray) -> np.ndarray:
    """``act`` applied elementwise to ``x``, in ``x``'s dtype (see ``cell.Activation``)."""
    if not isinstance(act, Activation):
        raise TypeError(f"act: expected a cgru.cell.Activation, got {type(act).__name__}")
    x = np.asarray(x)
    one = x.dtype.type(1)
    zero = x.dtype.type(0)
    alpha = x.dtype.type(act.alpha)
    beta = x.dtype.type(act.beta)
    name = act.name
    if name == "sigmoid":
        y = _sigmoid(x)
    elif name == "tanh":
        y = np.tanh(x)
    elif name == "relu":
        y = np.maximum(x, zero)
    elif name == "identity":
        y = x.copy()
    elif name == "hard_sigmoid":
        y = np.clip(alpha * x + beta, zero, one)
    elif name == "affine":
        y = alpha * x + beta
    elif name == "leaky_relu":
        y = np.where(x >= 0, x, alpha * x)
    elif name == "thresholded_relu":
        y = np.where(x > alpha, x, zero)
    elif name == "scaled_tanh":
        y = alpha * np.tanh(beta * x)
    elif name == "elu":
        # exp(x) − 1 only where x < 0 (min(x, 0) keeps exp from overflowing elsewhere)
        y = np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, zero)))
    elif name == "softsign":
        y = x / (one + np.abs(x))
    elif name == "softplus":
        y = np.logaddexp(zero, x)                       # log(1 + eˣ), stable for large |x|
    else:                                               # pragma: no cover - Activation validates
        raise ValueError(f"activation: unknown kind {name!r}")
    return np.asarray(y, dtype=x.dtype)


# --- 2. one step ---------------------------------------------------------------------------

def _clamp(cell, a):
    """The ONNX clip: every complete pre-activation into [−clip, clip] (no-op without clip)."""
    if cell.clip is None:
        return a
    c = a.dtype.type(cell.clip)
    return np.clip(a, -c, c)


def gru_step(cell, x_proj, h, lp_R, b_W, b_R, mask=None):
    """One GRU step for a batch; returns ``h'`` ``[N, H]``.

    ``x_proj`` ``[N, 3H]``: the input pre-activations without bias (``x·Wᵀ`` or given);
    ``h`` ``[N, H]``: the previous state; ``lp_R`` ``[3H, H]``; ``b_W``, ``b_R`` ``[3H]``;
    ``mask`` ``None`` or ``[N, H]``: the state mask ``m`` (steps 2-6 of the module docstring).
    """
    H = h.shape[-1]
    xr, xz, xn = x_proj[:, :H], x_proj[:, H:2 * H], x_proj[:, 2 * H:]       # [N, H] each
    R_r, R_z, R_n = lp_R[:H], lp_R[H:2 * H], lp_R[2 * H:]                    # [H, H] each
    bWr, bWz, bWn = b_W[:H], b_W[H:2 * H], b_W[2 * H:]
    bRr, bRz, bRn = b_R[:H], b_R[H:2 * H], b_R[2 * H:]

    # 2. h as it enters every recurrent product
    h_m = h if mask is None else h * mask
    # 3. reset gate
    r = activate(cell.f_r, _clamp(cell, xr + bWr + h_m @ R_r.T + bRr))
    # 4. update gate
    z = activate(cell.f_z, _clamp(cell, xz + bWz + h_m @ R_z.T + bRz))
    # 5. candidate
    if cell.reset_after:
        n = activate(cell.g, _clamp(cell, xn + bWn + r * (h_m @ R_n.T + bRn)))
    else:
        n = activate(cell.g, _clamp(cell, xn + (r * h_m) @ R_n.T + bWn + bRn))
    # 6. blend with the unmasked h
    one = h.dtype.type(1)
    if cell.flip_z:
        return z * n + (one - z) * h
    return (one - z) * n + z * h


cell_step = gru_step        # the GRU step (its name since cgru's first release)


def _peepholes(cell, lp, H, dtype):
    """``(p_i, p_f, p_g, p_o, p_o_new)``: the peephole weights on ``c`` of each gate and the
    output gate's on ``c'`` (zeros where the cell's peephole form has none)."""
    z = np.zeros(H, dtype)
    if cell.peepholes == "ifgo":
        return lp.P[:H], lp.P[H:2 * H], lp.P[2 * H:3 * H], lp.P[3 * H:], z
    if cell.peepholes:
        return lp.P[:H], lp.P[H:2 * H], z, z, lp.P[2 * H:]
    return z, z, z, z, z


def lstm_step(cell, x_proj, h, c, lp, mask=None):
    """One LSTM step for a batch: ``(h' [N, S], c' [N, H])`` (``lp``: the layer-direction's
    weights; ``W_p`` its projection or ``None``)."""
    H = c.shape[-1]
    h_m = h if mask is None else h * mask
    a = x_proj + lp.b_W + h_m @ lp.R.T + lp.b_R                             # [N, 4H]
    p_i, p_f, p_g, p_o, p_on = _peepholes(cell, lp, H, a.dtype)
    i = activate(cell.f_i, _clamp(cell, a[:, :H] + p_i * c))
    f = activate(cell.f_f, _clamp(cell, a[:, H:2 * H] + p_f * c))
    if cell.input_forget:
        f = c.dtype.type(1) - i
    g = activate(cell.g, _clamp(cell, a[:, 2 * H:3 * H] + p_g * c))
    c_new = f * c + i * g
    o = activate(cell.f_o, _clamp(cell, a[:, 3 * H:] + p_o * c + p_on * c_new))
    hf = o * activate(cell.h, c_new)                                        # [N, H]
    return (hf if lp.W_p is None else hf @ lp.W_p.T), c_new


def rnn_step(cell, x_proj, h, lp, mask=None):
    """One vanilla-RNN step for a batch: ``h'`` ``[N, H]``."""
    h_m = h if mask is None else h * mask
    return activate(cell.activation, _clamp(cell, x_proj + lp.b_W + h_m @ lp.R.T + lp.b_R))


def _step(cell, x_proj, state, lp, mask):
    """The kind's step on ``state`` = ``(h,)`` or ``(h, c)``; returns the new state tuple."""
    if cell.kind == "gru":
        return (gru_step(cell, x_proj, state[0], lp.R, lp.b_W, lp.b_R, mask),)
    if cell.kind == "lstm":
        return lstm_step(cell, x_proj, state[0], state[1], lp, mask)
    return (rnn_step(cell, x_proj, state[0], lp, mask),)


# --- 3. one layer-direction over a sequence ---------------------------------------------------

def _input_projection(topology, G, layer, d, lp, layer_in):
    """Step 1 for all time steps: ``[T, N, G·H]`` pre-activations without bias."""
    H = topology.hidden_size
    if layer > 0 or topology.input_mode == "linear":
        return layer_in @ lp.W.T                          # [T, N, in]·[in, G·H]
    if topology.input_mode == "skip":                     # every input matrix is I
        return np.concatenate([layer_in] * G, axis=-1)
    # "projected": x holds each direction's G pre-activation blocks, forward first
    return layer_in[..., d * G * H:(d + 1) * G * H]


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


# --- 4. the stack -----------------------------------------------------------------------------

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


# --- 5. backward -----------------------------------------------------------------------------

def activate_grad(act: Activation, x: np.ndarray) -> np.ndarray:
    """The derivative of ``act`` at ``x`` (elementwise; at a kink, the right-hand value the
    kernels use: relu'(0) = 0, leaky_relu'(0) = 1, elu'(0) = 1, hard_sigmoid' = α strictly
    inside (0, 1), thresholded_relu'(α) = 0)."""
    x = np.asarray(x)
    one, zero = x.dtype.type(1), x.dtype.type(0)
    alpha, beta = x.dtype.type(act.alpha), x.dtype.type(act.beta)
    name = act.name
    if name == "sigmoid":
        s = _sigmoid(x)
        g = s * (one - s)
    elif name == "tanh":
        g = one - np.tanh(x) ** 2
    elif name == "relu":
        g = np.where(x > 0, one, zero)
    elif name == "identity":
        g = np.ones_like(x)
    elif name == "hard_sigmoid":
        v = alpha * x + beta
        g = np.where((v > 0) & (v < 1), alpha, zero)
    elif name == "affine":
        g = np.full_like(x, alpha)
    elif name == "leaky_relu":
        g = np.where(x >= 0, one, alpha)
    elif name == "thresholded_relu":
        g = np.where(x > alpha, one, zero)
    elif name == "scaled_tanh":
        g = alpha * beta * (one - np.tanh(beta * x) ** 2)
    elif name == "elu":
        g = np.where(x >= 0, one, alpha * np.exp(np.minimum(x, zero)))
    elif name == "softsign":
        g = one / (one + np.abs(x)) ** 2
    elif name == "softplus":
        g = _sigmoid(x)
    else:                                               # pragma: no cover - Activation validates
        raise ValueError(f"activation: unknown kind {name!r}")
    return np.asarray(g, dtype=x.dtype)


def _act_and_grad(cell, act, a):
    """``(value, derivative)`` of ``act(clip(a))`` with respect to ``a``."""
    c = _clamp(cell, a)
    d = activate_grad(act, c)
    if cell.clip is not None:
        lim = a.dtype.type(cell.clip)
        d = np.where((a > lim) | (a < -lim), a.dtype.type(0), d)
    return activate(act, c), d


def gru_step_backward(cell, x_proj, h, lp_R, b_W, b_R, mask, dh_new):
    """Undo one ``cell_step``: given ``dh_new = ∂L/∂h'`` ``[N, H]``, return ``(dx_proj [N, 3H],
    dh [N, H], dR [3H, H], db_W [3H], db_R [3H])`` for the same inputs."""
    H = h.shape[-1]
    one = h.dtype.type(1)
    xr, xz, xn = x_proj[:, :H], x_proj[:, H:2 * H], x_proj[:, 2 * H:]
    R_r, R_z, R_n = lp_R[:H], lp_R[H:2 * H], lp_R[2 * H:]
    bWr, bWz, bWn = b_W[:H], b_W[H:2 * H], b_W[2 * H:]
    bRr, bRz, bRn = b_R[:H], b_R[H:2 * H], b_R[2 * H:]
    m = np.ones_like(h) if mask is None else mask
    h_m = h * m
    # the forward again, keeping pre-activations
    a_r = xr + bWr + h_m @ R_r.T + bRr
    a_z = xz + bWz + h_m @ R_z.T + bRz
    r, dr_da = _act_and_grad(cell, cell.f_r, a_r)
    z, dz_da = _act_and_grad(cell, cell.f_z, a_z)
    if cell.reset_after:
        hn = h_m @ R_n.T + bRn
        a_n = xn + bWn + r * hn
    else:
        rh = r * h_m
        a_n = xn + rh @ R_n.T + bWn + bRn
    n, dn_da = _act_and_grad(cell, cell.g, a_n)
    # bwd of the blend
    if cell.flip_z:
        dn, dz, dh = dh_new * z, dh_new * (n - h), dh_new * (one - z)
    else:
        dn, dz, dh = dh_new * (one - z), dh_new * (h - n), dh_new * z
    da_n = dn * dn_da
    dR = np.zeros_like(lp_R)
    db_W = np.zeros_like(b_W)
    db_R = np.zeros_like(b_R)
    dh_m = np.zeros_like(h)
    # bwd of the candidate
    if cell.reset_after:
        dr = da_n * hn
        dhn = da_n * r
        dR[2 * H:] = dhn.T @ h_m
        db_R[2 * H:] = dhn.sum(0)
        dh_m += dhn @ R_n
    else:
        drh = da_n @ R_n
        dR[2 * H:] = da_n.T @ rh
        db_R[2 * H:] = da_n.sum(0)
        dr = drh * h_m
        dh_m += drh * r
    db_W[2 * H:] = da_n.sum(0)
    # bwd of the gates
    da_r = dr * dr_da
    da_z = dz * dz_da
    dR[:H] = da_r.T @ h_m
    dR[H:2 * H] = da_z.T @ h_m
    db_W[:H] = db_R[:H] = da_r.sum(0)
    db_W[H:2 * H] = db_R[H:2 * H] = da_z.sum(0)
    dh_m += da_r @ R_r + da_z @ R_z
    dh = dh + dh_m * m
    dx_proj = np.concatenate([da_r, da_z, da_n], axis=1)
    return dx_proj, dh, dR, db_W, db_R


step_backward = gru_step_backward


def lstm_step_backward(cell, x_proj, h, c, lp, mask, dh_new, dc_new):
    """Undo one ``lstm_step``: given ``∂L/∂h'`` and ``∂L/∂c'``, return ``(dx_proj [N, 4H],
    dh [N, S], dc [N, H], {"R", "b_W", "b_R", "W_p"} gradients)``."""
    H = c.shape[-1]
    m = np.ones_like(h) if mask is None else mask
    h_m = h * m
    a = x_proj + lp.b_W + h_m @ lp.R.T + lp.b_R
    p_i, p_f, p_g, p_o, p_on = _peepholes(cell, lp, H, a.dtype)
    i, di_da = _act_and_grad(cell, cell.f_i, a[:, :H] + p_i * c)
    f, df_da = _act_and_grad(cell, cell.f_f, a[:, H:2 * H] + p_f * c)
    if cell.input_forget:
        f, df_da = c.dtype.type(1) - i, np.zeros_like(df_da)
    g, dg_da = _act_and_grad(cell, cell.g, a[:, 2 * H:3 * H] + p_g * c)
    c_new = f * c + i * g
    o, do_da = _act_and_grad(cell, cell.f_o, a[:, 3 * H:] + p_o * c + p_on * c_new)
    hc = activate(cell.h, c_new)
    grads = {}
    if lp.W_p is not None:                  # bwd of the projection
        grads["W_p"] = dh_new.T @ (o * hc)
        dhf = dh_new @ lp.W_p
    else:
        dhf = dh_new
    da_o = dhf * hc * do_da
    dc = dc_new + dhf * o * activate_grad(cell.h, c_new) + da_o * p_on
    di, dg, df, dc_prev = dc * g, dc * i, dc * c, dc * f
    if cell.input_forget:                   # f = 1 − i
        di = di - df
    da_i, da_f, da_g = di * di_da, df * df_da, dg * dg_da
    dc_prev = dc_prev + da_i * p_i + da_f * p_f + da_g * p_g + da_o * p_o
    da = np.concatenate([da_i, da_f, da_g, da_o], axis=1)
    grads["R"] = da.T @ h_m
    grads["b_W"] = grads["b_R"] = da.sum(0)
    if cell.peepholes == "ifgo":
        grads["P"] = np.concatenate([(da_k * c).sum(0) for da_k in (da_i, da_f, da_g, da_o)])
    elif cell.peepholes:
        grads["P"] = np.concatenate([(da_i * c).sum(0), (da_f * c).sum(0),
                                     (da_o * c_new).sum(0)])
    dh = (da @ lp.R) * m
    return da, dh, dc_prev, grads


def rnn_step_backward(cell, x_proj, h, lp, mask, dh_new):
    """Undo one ``rnn_step``: ``(dx_proj [N, H], dh [N, H], {"R", "b_W", "b_R"})``."""
    m = np.ones_like(h) if mask is None else mask
    h_m = h * m
    _, d_act = _act_and_grad(cell, cell.activation, x_proj + lp.b_W + h_m @ lp.R.T + lp.b_R)
    da = dh_new * d_act
    return da, (da @ lp.R) * m, {"R": da.T @ h_m, "b_W": da.sum(0), "b_R": da.sum(0)}


def _step_backward(cell, x_proj, state, lp, mask, dstate):
    """Undo ``_step``: ``(dx_proj, dstate_prev tuple, {name: gradient})``."""
    if cell.kind == "gru":
        dxp, dh, dR, db_W, db_R = gru_step_backward(cell, x_proj, state[0], lp.R, lp.b_W,
                                                    lp.b_R, mask, dstate[0])
        return dxp, (dh,), {"R": dR, "b_W": db_W, "b_R": db_R}
    if cell.kind == "lstm":
        dxp, dh, dc, grads = lstm_step_backward(cell, x_proj, state[0], state[1], lp, mask,
                                                dstate[0], dstate[1])
        return dxp, (dh, dc), grads
    dxp, dh, grads = rnn_step_backward(cell, x_proj, state[0], lp, mask, dstate[0])
    return dxp, (dh,), grads


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
