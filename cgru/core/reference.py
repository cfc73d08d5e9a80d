"""The slow, obviously correct NumPy reference of a recurrent stack: forward and backward.

Everything the fast engine computes is written out here once, for clarity, with loops over
layers, directions and time steps; the fast path is tested against it (and it against PyTorch
and finite differences).  Pure NumPy: it imports nothing compiled (only the cell and network
definitions), so it loads where the extensions are not built.  It computes in the dtype of
``params`` (float32 or float64): ``x``, ``h0``, ``state_mask`` and ``dropout_masks`` are
converted to it.  ``forward`` gives ``(y, hy)``; ``backward`` the gradients of
``Σ y·dy + Σ hy·dhy`` with respect to ``x``, ``h0`` and every weight, by the chain rule
through the same steps (``step_backward`` undoes ``cell_step``).

Equations of one step, layer-direction ``(l, d)``, gates in canonical order r, z, n, ``W``/``R``
stored ``[3H, in]``/``[3H, H]`` and applied as ``x·Wᵀ``; ``c(·)`` clamps to ``[−clip, clip]``
(identity when ``cell.clip is None``); ``m`` is the state mask (1 when absent)::

    1. x_proj = x·Wᵀ                                  [N, 3H]  (input projection, no bias)
                (skip: [x, x, x];  projected: x[..., d·3H:(d+1)·3H])
    2. h_m    = h ⊙ m                                 [N, H]   (h as it enters recurrent products)
    3. r      = f_r(c(x_proj_r + b_Wr + h_m·R_rᵀ + b_Rr))
    4. z      = f_z(c(x_proj_z + b_Wz + h_m·R_zᵀ + b_Rz))
    5. reset_after=True :  n = g(c(x_proj_n + b_Wn + r ⊙ (h_m·R_nᵀ + b_Rn)))
       reset_after=False:  n = g(c(x_proj_n + (r ⊙ h_m)·R_nᵀ + b_Wn + b_Rn))
    6. flip_z=False:       h' = (1 − z) ⊙ n + z ⊙ h        (the blend uses the unmasked h)
       flip_z=True :       h' = z ⊙ n + (1 − z) ⊙ h

Sequences (SPEC §2): ``x`` is ``[T, N, I]`` (``[N, T, I]`` with ``batch_major``); ``y`` is
``[T, N, D·H]`` (``[N, T, D·H]``) with per step ``[forward H | backward H]``; ``h0``/``hy`` are
``[L·D, N, H]`` at index ``l·D + d`` in both layouts.  Direction ``d`` runs reversed when
``topology.reversed_direction(d)`` (``d = 1`` of "bidirectional", or the single direction of
"reverse").  Row ``b`` with length ``len[b]``: a forward direction processes ``t = 0 … len−1``,
a reversed one ``t = len−1 … 0``; step ``t`` writes ``y[t]`` (original time index); ``y[t] = 0``
for ``t ≥ len``; ``hy`` is the state after the last processed step (``h0`` when ``len = 0``).
Layer ``l ≥ 1`` reads layer ``l−1``'s whole output ``[T, N, D·H]``, times
``dropout_masks[l−1]`` when given (inverted dropout, scaling already in the mask).
"""
import numpy as np

from cgru.core.cells import Activation, Cell
from cgru.core.network import LayerParams, Network, Params

__all__ = ["activate", "activate_grad", "cell_step", "step_backward", "forward", "backward"]


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


# --- 2. one step -----------------------------------------------------------------------------

def _clamp(cell, a):
    """The ONNX clip: every complete pre-activation into [−clip, clip] (no-op without clip)."""
    if cell.clip is None:
        return a
    c = a.dtype.type(cell.clip)
    return np.clip(a, -c, c)


def cell_step(cell, x_proj, h, lp_R, b_W, b_R, mask=None):
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


# --- 3. one layer-direction over a sequence ---------------------------------------------------

def _input_projection(topology, layer, d, lp, layer_in):
    """Step 1 for all time steps: ``[T, N, 3H]`` pre-activations without bias."""
    H = topology.hidden_size
    if layer > 0 or topology.input_mode == "linear":
        return layer_in @ lp.W.T                          # [T, N, in]·[in, 3H]
    if topology.input_mode == "skip":                     # W_r = W_z = W_n = I
        return np.concatenate([layer_in, layer_in, layer_in], axis=-1)
    # "projected": x holds [r, z, n] pre-activations per direction, forward first
    return layer_in[..., d * 3 * H:(d + 1) * 3 * H]


def _run_direction(cell, x_proj, h0, lp, lengths, reverse, mask):
    """One layer-direction over the sequence.

    ``x_proj`` ``[T, N, 3H]``, ``h0`` ``[N, H]``, ``lengths`` int ``[N]``, ``mask`` ``None`` or
    ``[T, N, H]`` (original time).  Returns ``(y [T, N, H], hy [N, H])``.  Step ``k`` of row
    ``b`` (active while ``k < len[b]``) reads and writes time ``t = k`` (forward) or
    ``t = len[b] − 1 − k`` (reverse).
    """
    T, N, _ = x_proj.shape
    y = np.zeros((T, N, h0.shape[-1]), dtype=x_proj.dtype)                  # [T, N, H]
    h = h0.copy()                                                           # [N, H]
    for k in range(T):
        rows = np.nonzero(lengths > k)[0]                                   # active rows
        if rows.size == 0:
            break
        t = lengths[rows] - 1 - k if reverse else np.full(rows.size, k)     # time per row
        m = None if mask is None else mask[t, rows]
        h[rows] = cell_step(cell, x_proj[t, rows], h[rows], lp.R, lp.b_W, lp.b_R, m)
        y[t, rows] = h[rows]
    return y, h


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
    if not isinstance(cell, Cell):
        raise TypeError(f"cell: expected a cgru.Cell, got {type(cell).__name__}")
    if params._cell_given and cell != params.cell:
        raise ValueError(f"cell: {cell} contradicts the network's own cell {params.cell}")
    return cell


def _prepare(params, x, h0, lengths, batch_major, state_mask, dropout_masks):
    """The call's arrays in the dtype of ``params``, time-major: ``(x, h0, lengths,
    state_mask, dropout_masks)``."""
    topo = params.topology
    L, D, H = topo.num_layers, topo.num_directions, topo.hidden_size
    dtype = params.dtype

    x = np.asarray(x, dtype=dtype)
    if x.ndim != 3:
        raise ValueError(f"x: expected a 3-D array, got shape {x.shape}")
    if batch_major:
        x = x.transpose(1, 0, 2)                                            # [T, N, I]
    T, N, I = x.shape
    if I != topo.input_size:
        raise ValueError(f"x: expected {topo.input_size} features, got {I}")

    if h0 is None:
        h0 = np.zeros((L * D, N, H), dtype=dtype)
    h0 = np.asarray(h0, dtype=dtype)
    _check_shape(h0, (L * D, N, H), "h0")

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
        out_shape = (N, T, D * H) if batch_major else (T, N, D * H)
        try:
            state_mask = np.broadcast_to(np.asarray(state_mask, dtype=dtype), out_shape)
        except ValueError:
            raise ValueError(f"state_mask: shape {np.shape(state_mask)} does not broadcast to "
                             f"the output shape {out_shape}") from None
        if batch_major:
            state_mask = state_mask.transpose(1, 0, 2)                      # [T, N, D·H]

    if dropout_masks is not None:
        dropout_masks = list(dropout_masks)
        if len(dropout_masks) != L - 1:
            raise ValueError(f"dropout_masks: expected {L - 1} masks (L−1), got "
                             f"{len(dropout_masks)}")
        dropout_masks = [np.asarray(m, dtype=dtype) for m in dropout_masks]
        for i, m in enumerate(dropout_masks):
            _check_shape(m, (T, N, D * H), f"dropout_masks[{i}]")
    return x, h0, lengths, state_mask, dropout_masks


def _run_stack(cell, params, x, h0, lengths, state_mask, dropout_masks, tape=None):
    """Forward over the layers; ``tape`` (a list) receives each layer's input."""
    topo = params.topology
    L, D, H = topo.num_layers, topo.num_directions, topo.hidden_size
    T, N, _ = x.shape
    hy = np.empty((L * D, N, H), dtype=params.dtype)
    layer_in = x                                                            # [T, N, I]
    for l in range(L):
        if l > 0 and dropout_masks is not None:
            layer_in = layer_in * dropout_masks[l - 1]                      # inverted dropout
        if tape is not None:
            tape.append(layer_in)
        out = np.zeros((T, N, D * H), dtype=params.dtype)                   # [T, N, D·H]
        for d in range(D):
            lp = params[l, d]
            x_proj = _input_projection(topo, l, d, lp, layer_in)            # [T, N, 3H]
            mask = None if state_mask is None else state_mask[:, :, d * H:(d + 1) * H]
            y_d, hy[l * D + d] = _run_direction(cell, x_proj, h0[l * D + d], lp, lengths,
                                                topo.reversed_direction(d), mask)
            out[:, :, d * H:(d + 1) * H] = y_d
        layer_in = out
    return layer_in, hy


def forward(params, x, h0=None, *, cell=None, lengths=None, batch_major=False,
            state_mask=None, dropout_masks=None):
    """The stack's forward: ``(y, hy)`` (see the module docstring).

    ``params``: a ``cgru.Network`` (``cell``: its cell by default); ``x`` ``[T, N, I]``
    (``[N, T, I]`` with ``batch_major``); ``h0`` ``None`` (zeros) or ``[L·D, N, H]``;
    ``lengths`` ``None`` (all ``T``) or ints ``[N]`` in ``[0, T]``, any order; ``state_mask``
    ``None`` or broadcastable to the output shape — ``[T, N, D·H]``, or ``[N, T, D·H]`` with
    ``batch_major`` — and the step of layer-direction ``(l, d)`` that produces output time
    ``t`` uses ``state_mask[t, :, d·H:(d+1)·H]`` (time-major coordinates) in every layer;
    ``dropout_masks`` ``None`` or a list of ``L−1`` arrays ``[T, N, D·H]`` (always time-major)
    that multiply layer ``l−1``'s output before layer ``l``.  Returns ``y`` ``[T, N, D·H]``
    (``[N, T, D·H]`` with ``batch_major``) and ``hy`` ``[L·D, N, H]``, in the dtype of
    ``params``.
    """
    cell = _cell_of(params, cell)
    x, h0, lengths, state_mask, dropout_masks = _prepare(params, x, h0, lengths, batch_major,
                                                         state_mask, dropout_masks)
    y, hy = _run_stack(cell, params, x, h0, lengths, state_mask, dropout_masks)
    y = y.transpose(1, 0, 2) if batch_major else y
    return np.ascontiguousarray(y), hy


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


def step_backward(cell, x_proj, h, lp_R, b_W, b_R, mask, dh_new):
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


def _backward_direction(cell, x_proj, h0, lp, lengths, reverse, mask, dy, dhy):
    """Undo ``_run_direction``: ``dy`` ``[T, N, H]`` (output gradient, original time), ``dhy``
    ``[N, H]``.  Returns ``(dx_proj [T, N, 3H], dh0 [N, H], dR, db_W, db_R)``."""
    T, N, _ = x_proj.shape
    H = h0.shape[-1]
    # the states before every step, per row (step k of row b reads h_before[k][b])
    h_before = []
    h = h0.copy()
    for k in range(T):
        h_before.append(h.copy())
        rows = np.nonzero(lengths > k)[0]
        if rows.size == 0:
            continue
        t = lengths[rows] - 1 - k if reverse else np.full(rows.size, k)
        m = None if mask is None else mask[t, rows]
        h[rows] = cell_step(cell, x_proj[t, rows], h[rows], lp.R, lp.b_W, lp.b_R, m)
    dx_proj = np.zeros_like(x_proj)
    dR = np.zeros_like(lp.R)
    db_W = np.zeros_like(lp.b_W)
    db_R = np.zeros_like(lp.b_R)
    dh = dhy.copy()
    for k in reversed(range(T)):
        rows = np.nonzero(lengths > k)[0]
        if rows.size == 0:
            continue
        t = lengths[rows] - 1 - k if reverse else np.full(rows.size, k)
        m = None if mask is None else mask[t, rows]
        dh_new = dh[rows] + dy[t, rows]
        dxp, dh_prev, dR_k, dbW_k, dbR_k = step_backward(
            cell, x_proj[t, rows], h_before[k][rows], lp.R, lp.b_W, lp.b_R, m, dh_new)
        dx_proj[t, rows] = dxp
        dh[rows] = dh_prev
        dR += dR_k
        db_W += dbW_k
        db_R += dbR_k
    return dx_proj, dh, dR, db_W, db_R


def _input_backward(topology, layer, d, lp, layer_in, dx_proj):
    """Undo ``_input_projection``: ``(dW, d layer_in)`` (``dW`` ``[3H, in]``, empty when there is
    no input matrix)."""
    H = topology.hidden_size
    if layer > 0 or topology.input_mode == "linear":
        dW = np.einsum("tng,tni->gi", dx_proj, layer_in)
        return dW, dx_proj @ lp.W                                       # [T, N, in]
    if topology.input_mode == "skip":
        return np.zeros_like(lp.W), dx_proj[..., :H] + dx_proj[..., H:2 * H] + dx_proj[..., 2 * H:]
    d_in = np.zeros_like(layer_in)
    d_in[..., d * 3 * H:(d + 1) * 3 * H] = dx_proj
    return np.zeros_like(lp.W), d_in


def backward(params, x, dy=None, dhy=None, h0=None, *, cell=None, lengths=None,
             batch_major=False, state_mask=None, dropout_masks=None):
    """The gradients of ``Σ y·dy + Σ hy·dhy`` (``None``: zeros) for the stack ``forward``
    computes with the same arguments: ``(dx, dh0, dparams)``, ``dx`` shaped like ``x``,
    ``dh0`` ``[L·D, N, H]``, ``dparams`` a ``Network`` of gradients."""
    cell = _cell_of(params, cell)
    x, h0, lengths, state_mask, dropout_masks = _prepare(params, x, h0, lengths, batch_major,
                                                         state_mask, dropout_masks)
    topo = params.topology
    L, D, H = topo.num_layers, topo.num_directions, topo.hidden_size
    T, N, _ = x.shape
    dtype = params.dtype
    inputs = []
    _run_stack(cell, params, x, h0, lengths, state_mask, dropout_masks, tape=inputs)
    d_out = np.zeros((T, N, D * H), dtype)
    if dy is not None:
        dy = np.asarray(dy, dtype=dtype)
        d_out = d_out + (dy.transpose(1, 0, 2) if batch_major else dy)
    dhy = np.zeros((L * D, N, H), dtype) if dhy is None else np.asarray(dhy, dtype=dtype)
    dh0 = np.empty((L * D, N, H), dtype)
    grads = [None] * (L * D)
    for l in reversed(range(L)):
        layer_in = inputs[l]
        d_in = np.zeros_like(layer_in)
        for d in range(D):
            i = l * D + d
            lp = params[i]
            x_proj = _input_projection(topo, l, d, lp, layer_in)
            mask = None if state_mask is None else state_mask[:, :, d * H:(d + 1) * H]
            dxp, dh0[i], dR, db_W, db_R = _backward_direction(
                cell, x_proj, h0[i], lp, lengths, topo.reversed_direction(d), mask,
                d_out[:, :, d * H:(d + 1) * H], dhy[i])
            dW, d_layer_in = _input_backward(topo, l, d, lp, layer_in, dxp)
            d_in += d_layer_in
            grads[i] = LayerParams(W=dW.astype(dtype), R=dR, b_W=db_W, b_R=db_R)
        if l > 0:
            d_out = d_in * dropout_masks[l - 1] if dropout_masks is not None else d_in
    dx = d_in.transpose(1, 0, 2) if batch_major else d_in
    return np.ascontiguousarray(dx), dh0, Network(topo, grads,
                                                  params.cell if params._cell_given else None)
