"""Forward and backward of a recurrent stack: the orchestration over layers and directions.

Public API (re-exported by ``cgru``)::

    forward(net, x, h0=None, *, c0=None, lengths=None, batch_major=False, state_mask=None,
            training=False, dropout=0.0, seed=0, num_threads=None)
        -> Forward(y, hy, reserve)          (.cy: the LSTM's final cell states)
    backward(net, x, reserve, dy=None, dhy=None, *, dcy=None, state_mask=None,
             batch_major=False, dparams=None, accumulate=False, num_threads=None)
        -> Gradients(dx, dh0, dparams)      (.dc0: the LSTM's initial cell-state gradient)
    reserve_nbytes(net_or_topology, T, N, *, cell=None, dtype=np.float32) -> int
    dropout_masks(topology, T, N, *, dropout, seed=0, dtype=np.float32) -> list of L−1 arrays

``net`` is a ``cgru.Network`` (its cell — GRU, LSTM or vanilla RNN —, topology and weights);
the old ``cell=`` keyword still works for one release (``Network.resolve_cell``).  Shapes (S:
the state width, the projection size P of an LSTM with one, else H): ``x`` ``[T, N, I]``
(``[N, T, I]`` with ``batch_major``); ``y`` ``[T, N, D·S]`` (or ``[N, T, D·S]``);
``h0``/``hy`` ``[L·D, N, S]`` and the LSTM's ``c0``/``cy`` ``[L·D, N, H]``, at index
``l·D + d`` in both layouts.

A call follows the data: **validate** every argument (``validate``), **plan** the work split
and the buffers (``plan``), then **run** layer by layer: per layer the input projection of all
steps as one GEMM per direction, the time loops of all directions as (direction, batch chunk)
work items on cgru's thread pool (the kernels of the cell's kind: ``_KERNELS``), and in the
backward, after the loops, ``dW``, ``dR`` (and the LSTM's ``dW_p``) and ``dX`` as
whole-sequence GEMMs and the bias gradients as column sums.  A training forward saves what
the backward needs in the reserve (``reserve``).
"""
from collections import namedtuple

import numpy as np

from cgru.core import plan, reserve as reserve_mod, validate, weights
from cgru.core.network import Network, Topology
from cgru._kernels import gru as _gru_kernels, lstm as _lstm_kernels, rnn as _rnn_kernels
from cgru._kernels.threads import resolve_num_threads

__all__ = ["Forward", "Gradients", "forward", "backward", "reserve_nbytes", "dropout_masks",
           "reserve_gates", "reserve_from_gates", "reserve_from_saved"]


class Forward(namedtuple("Forward", "y hy reserve")):
    """Result of ``forward``: output ``y``, final states ``hy`` ``[L·D, N, S]``, and the
    ``reserve`` (``None`` unless ``training``); ``cy`` (an attribute, not unpacked) holds an
    LSTM's final cell states ``[L·D, N, H]`` (``None`` for the other kinds)."""

    def __new__(cls, y, hy, reserve, cy=None):
        self = super().__new__(cls, y, hy, reserve)
        self.cy = cy
        return self

    def __getnewargs__(self):
        return (*self, self.cy)


class Gradients(namedtuple("Gradients", "dx dh0 dparams")):
    """Result of ``backward``: ``dx`` (shaped like ``x``), ``dh0`` ``[L·D, N, S]`` and
    ``dparams`` (a ``Network`` of gradients); ``dc0`` (an attribute, not unpacked) holds an
    LSTM's initial cell-state gradient ``[L·D, N, H]`` (``None`` for the other kinds)."""

    def __new__(cls, dx, dh0, dparams, dc0=None):
        self = super().__new__(cls, dx, dh0, dparams)
        self.dc0 = dc0
        return self

    def __getnewargs__(self):
        return (*self, self.dc0)


# The time-loop kernels of each cell kind.
_KERNELS = {"gru": _gru_kernels, "lstm": _lstm_kernels, "rnn": _rnn_kernels}


# --- validation of a call ------------------------------------------------------------------
def _check_network(net, what="params"):
    if not isinstance(net, Network):
        raise TypeError(f"{what}: expected a cgru.Network (cgru.Params), got "
                        f"{type(net).__name__}")
    return net.topology, net.dtype


def _check_x(x, topo, dtype, batch_major, gates=3, what="x"):
    """``(T, N)`` of the input ``x`` (checked: type, dtype, 3-D, features, sizes)."""
    layout = "[N, T, I]" if batch_major else "[T, N, I]"
    validate.plain_array(x, what, layout)
    if x.dtype != dtype:
        raise TypeError(f"{what}: expected dtype {dtype} (the dtype of params), got {x.dtype}")
    if x.ndim != 3:
        raise ValueError(f"{what}: expected a 3-D array {layout}, got shape {list(x.shape)}")
    if x.shape[2] != topo.input_size:
        raise ValueError(f"{what}: expected {topo.input_size} features (input_size) in the last "
                         f"axis of {layout}, got shape {list(x.shape)}")
    N, T = (x.shape[0], x.shape[1]) if batch_major else (x.shape[1], x.shape[0])
    if T == 0 or N == 0:
        raise ValueError(f"{what}: expected T ≥ 1 and N ≥ 1, got shape {list(x.shape)} {layout}")
    validate.call_sizes(topo, gates, T, N, what)
    return T, N


def _check_h(h, what, topo, dtype, N, width=None):
    """A state ``[L·D, N, width]`` (``width``: the state width S by default; the LSTM's cell
    state has H), C-contiguous, or None."""
    if h is None:
        return None
    LD = topo.num_layer_directions
    W = topo.state_size if width is None else width
    validate.array(h, what, dtype)
    label = "H" if W == topo.hidden_size else "P"
    if h.shape != (LD, N, W):
        raise ValueError(f"{what}: expected shape [L·D={LD}, N={N}, {label}={W}], got "
                         f"{list(h.shape)}")
    return np.ascontiguousarray(h)


def _check_c(c, what, net, dtype, N):
    """The LSTM's cell state ``[L·D, N, H]``; refused for kinds without one."""
    if c is None:
        return None
    if not net.cell.has_cell_state:
        raise ValueError(f"{what}: only LSTM cells have a cell state; this network's cell is "
                         f"a {net.cell.kind} cell")
    return _check_h(c, what, net.topology, dtype, N, net.topology.hidden_size)


def _check_state_mask(state_mask, topo, dtype, T, N, batch_major):
    """The state mask broadcast to time-major ``[T, N, D·H]`` (C-contiguous), or None."""
    if state_mask is None:
        return None
    shape = (N, T, topo.output_size) if batch_major else (T, N, topo.output_size)
    m = validate.broadcast_mask(state_mask, "state_mask", dtype, shape)
    return _time_major(m, batch_major)


def _time_major(a, batch_major):
    return np.ascontiguousarray(a.transpose(1, 0, 2) if batch_major else a)


def _check_dparams(dparams, net, accumulate):
    if dparams is None:
        if accumulate:
            raise ValueError("dparams: accumulate=True needs the Params to add the gradients to")
        return None
    if not isinstance(dparams, Network):
        raise TypeError(f"dparams: expected a cgru.Network (cgru.Params) or None, got "
                        f"{type(dparams).__name__}")
    if dparams.topology != net.topology:
        raise ValueError(f"dparams: expected topology {net.topology}, got {dparams.topology}")
    if dparams.cell.gates != net.cell.gates:
        raise ValueError(f"dparams: expected the weights of a {net.cell.kind} cell, got "
                         f"{dparams.cell.kind}'s")
    if dparams.dtype != net.dtype:
        raise TypeError(f"dparams: expected dtype {net.dtype} (the dtype of params), got "
                        f"{dparams.dtype}")
    for i, lp in enumerate(dparams):
        for name, a in lp.arrays().items():
            if not a.flags.writeable:
                raise ValueError(f"dparams[{i}].{name}: is read-only; backward writes into it")
    return dparams


# --- dropout -------------------------------------------------------------------------------
def dropout_masks(topology, T, N, *, dropout, seed=0, dtype=np.float32):
    """The inter-layer dropout masks a training forward with these arguments uses.

    A list of ``L − 1`` arrays ``[T, N, D·H]`` (time-major): entry ``l`` multiplies layer
    ``l``'s output before it feeds layer ``l + 1``.  Values are 0 or ``1/(1 − dropout)``
    (inverted dropout).  Drawn from NumPy's PCG64 seeded by ``(seed, seed2, l)``: the same
    arguments give the same masks on every machine and thread count.
    """
    if isinstance(topology, Network):
        topology = topology.topology
    if not isinstance(topology, Topology):
        raise TypeError(f"topology: expected a cgru.Topology, got {type(topology).__name__}")
    T, N = validate.positive_int(T, "T"), validate.positive_int(N, "N")
    p, s1, s2 = validate.dropout_and_seed(dropout, seed)
    dt = validate.as_dtype(dtype)
    masks = []
    for layer in range(topology.num_layers - 1):
        if p == 0.0:
            masks.append(np.ones((T, N, topology.output_size), dt))
            continue
        ss = np.random.SeedSequence([s1 & (2 ** 64 - 1), s2 & (2 ** 64 - 1), layer])
        u = np.random.Generator(np.random.PCG64(ss)).random((T, N, topology.output_size))
        masks.append(np.where(u >= p, 1.0 / (1.0 - p), 0.0).astype(dt))
    return masks


# --- sizes ---------------------------------------------------------------------------------
def reserve_nbytes(topology, T, N, *, cell=None, dtype=np.float32):
    """Size in bytes of the reserve a training ``forward`` returns for these sizes.

    ``topology``: a ``cgru.Network`` (its cell and dtype are used unless given) or a
    ``cgru.Topology`` (then ``cell`` — default cuDNN's GRU cell — and ``dtype``).  Closed form;
    the same limits as the calls (``T·N`` and every GEMM dimension within 32-bit BLAS ints)."""
    if isinstance(topology, Network):
        net = topology
        cell = net.cell if cell is None else cell
        dtype = net.dtype
        topology = net.topology
    if not isinstance(topology, Topology):
        raise TypeError(f"topology: expected a cgru.Topology, got {type(topology).__name__}")
    from cgru.core.cells import GRUCell, is_cell
    if cell is None:
        cell = GRUCell()
    elif not is_cell(cell):
        raise TypeError(f"cell: expected a cgru.Cell (or another cgru cell kind), got "
                        f"{type(cell).__name__}")
    T, N = validate.positive_int(T, "T"), validate.positive_int(N, "N")
    validate.call_sizes(topology, cell.gates, T, N, "reserve_nbytes")
    nbytes = reserve_mod.Layout(topology, cell, T, N, validate.as_dtype(dtype)).nbytes
    return validate.nbytes_limit(nbytes, f"T={T}, N={N} (with {topology})", "the reserve")


# --- forward -------------------------------------------------------------------------------
def _gate_biases(lp, cell, H):
    """The biases as the kernels add them: GRU ``(b_rzn [3H], b_hn [H])`` (steps 3/4 of its
    kernel), the other kinds ``b_W + b_R``."""
    b = lp.b_W + lp.b_R
    if cell.kind != "gru":
        return b
    if cell.reset_after:
        b[2 * H:] = lp.b_W[2 * H:]
    return b, np.ascontiguousarray(lp.b_R[2 * H:])


def _packed(frozen, i, cell, H, forward):
    """Layer-direction ``i``'s recurrent weights packed for the time loop's GEMMs, from the
    call's kept copies (``weights``: made once per copy, never for other bytes).

    forward: ``gh = h·Rᵀ`` (GRU reset-before: ``h·R_rzᵀ`` and ``(r ⊙ h)·R_nᵀ``), and the LSTM
    projection ``hf·W_pᵀ``; backward: ``da·R`` (GRU reset-before: the r, z and n blocks
    apart) and ``dh·W_p``."""
    tag = "Rp" if forward else "Rb"
    if cell.kind == "gru" and not cell.reset_after:
        return {tag: frozen.packed(i, "R", forward, (0, 2 * H)),
                tag + "_n": frozen.packed(i, "R", forward, (2 * H, 3 * H))}
    out = {tag: frozen.packed(i, "R", forward)}
    if "W_p" in frozen.kept[i]:
        out["Wpp" if forward else "Wpb"] = frozen.packed(i, "W_p", forward)
    return out


def _contiguous(a):
    return None if a is None else np.ascontiguousarray(a)


def _input_projection(topo, G, layer, d, lp, X, out, nt):
    """(gx, ldgx) of direction d: ``gx = X·Wᵀ`` [T·N, G·H] — or x itself in skip / projected
    mode (skip: every gate block is x; projected: x holds each direction's G blocks)."""
    H = topo.hidden_size
    if layer == 0 and topo.input_mode == "projected":
        return X[:, d * G * H:], topo.input_size
    if layer == 0 and topo.input_mode == "skip":
        for k in range(G):
            out[:, k * H:(k + 1) * H] = X
        return out, G * H
    # gx[T·N, G·H] = X[T·N, in] · W[G·H, in]ᵀ
    plan.gemm(False, True, X, np.ascontiguousarray(lp.W), out, nt=nt)
    return out, G * H


def _forward_direction(kernels, cell, topo, frozen, i, d, gx, ldgx, h0, c0, hy, cy, saved):
    """The kernels' description of layer-direction ``i``'s forward (``d``: its direction;
    ``saved``: its reserve views, or ``{}`` in inference)."""
    H = topo.hidden_size
    lp = frozen.net[i]
    common = dict(reverse=topo.reversed_direction(d), gx=gx, ldgx=ldgx, h0=h0, hy=hy,
                  **_packed(frozen, i, cell, H, True), gates=saved.get("gates"),
                  states=saved.get("states"), pre=saved.get("pre"))
    if cell.kind == "gru":
        b_rzn, b_hn = _gate_biases(lp, cell, H)
        return kernels.Direction(b_rzn=b_rzn, b_hn=b_hn, hn=saved.get("hn"), **common)
    if cell.kind == "lstm":
        return kernels.Direction(b=_gate_biases(lp, cell, H), P=_contiguous(lp.P), c0=c0,
                                 cy=cy, cstates=saved.get("cstates"), hf=saved.get("hf"),
                                 **common)
    del common["gates"]
    return kernels.Direction(b=_gate_biases(lp, cell, H), **common)


def forward(params, x, h0=None, *, c0=None, cell=None, lengths=None, batch_major=False,
            state_mask=None, training=False, dropout=0.0, seed=0, num_threads=None):
    """Run a recurrent stack over a batch of sequences.

    Args (S: the state width — the projection size P of an LSTM with one, else H):
        params: the ``cgru.Network`` (its cell, and its topology: L, D, H, input size, input
            mode and projection).
        x: ``[T, N, I]``, or ``[N, T, I]`` with ``batch_major``; dtype of params.
        h0: ``[L·D, N, S]`` initial states (``None``: zeros).
        c0: ``[L·D, N, H]`` initial cell states of an LSTM (``None``: zeros).
        cell: deprecated — the network carries its cell; a different one is an error.
        lengths: ``[N]`` integer sequence lengths in ``[0, T]``, any order (``None``: all T).
            The forward direction runs ``t = 0…len−1``, the reversed one ``len−1…0``;
            outputs at ``t ≥ len`` are 0; ``hy`` (and ``cy``) is the state after the last
            processed step (``h0``, ``c0`` for ``len = 0``).
        state_mask: broadcastable to the output shape; ``h ⊙ m`` enters every recurrent
            product (MPSGraph's mask), the output-time-``t`` slice at the step producing ``t``.
        training: keep the reserve for ``backward`` (and apply ``dropout``).
        dropout: inter-layer inverted dropout probability (training only), ``[0, 1)``.
        seed: int or ``(seed, seed2)`` for the dropout masks (see ``dropout_masks``).
        num_threads: threads of cgru's pool (``None``: all usable cores, at most
            ``OMP_NUM_THREADS``).  Results are bitwise identical for every value.

    Returns:
        ``Forward(y, hy, reserve)``, ``.cy`` for an LSTM; ``y`` ``[T, N, D·S]``
        (``[N, T, D·S]`` with ``batch_major``), ``hy`` ``[L·D, N, S]``, ``reserve`` a uint8
        array or ``None``.
    """
    # --- validate
    topo, dtype = _check_network(params)
    cell = params.resolve_cell(cell)
    batch_major = validate.flag(batch_major, "batch_major")
    training = validate.flag(training, "training")
    T, N = _check_x(x, topo, dtype, batch_major, cell.gates)
    validate.cell_for_dtype(cell, dtype)
    h0 = _check_h(h0, "h0", topo, dtype, N)
    c0 = _check_c(c0, "c0", params, dtype, N)
    lengths = validate.lengths(lengths, T, N)
    mask = _check_state_mask(state_mask, topo, dtype, T, N, batch_major)
    p, s1, s2 = validate.dropout_and_seed(dropout, seed)
    if not training:
        p = 0.0
    nt = resolve_num_threads(num_threads)
    kernels = _KERNELS[cell.kind]
    frozen = weights.freeze(params)      # the call reads the kept copies only
    net = frozen.net

    # --- plan
    H, D, L, S = topo.hidden_size, topo.num_directions, topo.num_layers, topo.state_size
    G, DS = cell.gates, topo.output_size
    lstm = cell.has_cell_state
    chunks = plan.n_chunks(N, H)
    threads = plan.loop_threads(nt, T, N, H, D, G)
    x_tm = _time_major(x, batch_major)                     # [T, N, I]
    X = x_tm.reshape(T * N, topo.input_size)
    ws = plan.Workspace(dtype)
    for d in range(D):
        ws.add(f"gx{d}", (T * N, G * H))                     # input projections
    if h0 is None:
        ws.add("h0", (L * D, N, S))
    if lstm and c0 is None:
        ws.add("c0", (L * D, N, H))
    if not training and L > 1:
        ws.add("out0", (T, N, DS)).add("out1", (T, N, DS))   # inner layers, ping-pong
    buf = ws.allocate()
    if h0 is None:
        h0 = buf["h0"]
        h0[...] = 0
    if lstm and c0 is None:
        c0 = buf["c0"]
        c0[...] = 0
    hy = plan.empty((L * D, N, S), dtype)
    cy = plan.empty((L * D, N, H), dtype) if lstm else None
    y = plan.empty((T, N, DS), dtype)
    rv, lds, xin = None, None, None
    if training:
        layout = reserve_mod.Layout(topo, cell, T, N, dtype)
        validate.nbytes_limit(layout.nbytes, f"x (T={T}, N={N}, with {topo})", "the reserve")
        rv, (_, _, lds, xin) = reserve_mod.create(
            layout, lengths=lengths, dropout=p, seed=s1, seed2=s2, batch_major=batch_major,
            x=reserve_mod.data_mac(b"x", x_tm), weights=reserve_mod.weights_mac(frozen),
            h0=reserve_mod.data_mac(b"h0", h0, c0),
            state_mask=reserve_mod.data_mac(b"state_mask", mask))
    masks = dropout_masks(topo, T, N, dropout=p, seed=(s1, s2), dtype=dtype) if p > 0 else None

    # --- run
    for layer in range(L):
        last = layer == L - 1
        if last:
            out = y
        elif training:
            out = xin[layer + 1]
        else:
            out = buf[f"out{layer % 2}"]
        dirs = []
        for d in range(D):
            i = layer * D + d
            gx, ldgx = _input_projection(topo, G, layer, d, net[i], X, buf[f"gx{d}"], nt)
            dirs.append(_forward_direction(
                kernels, cell, topo, frozen, i, d, gx, ldgx, h0[i],
                c0[i] if lstm else None, hy[i], cy[i] if lstm else None,
                lds[i] if training else {}))
        kernels.forward_layer(dtype, T, N, H, S, chunks, threads, cell, lengths, mask, out,
                              dirs, training)
        if not last:
            if masks is not None:
                np.multiply(out, masks[layer], out=out)
            X = out.reshape(T * N, DS)
    if batch_major:
        y = np.ascontiguousarray(y.transpose(1, 0, 2))
    return Forward(y, hy, rv, cy)


# --- backward ------------------------------------------------------------------------------
def _finite_padding(x, lengths):
    """``x`` [T, N, I] itself when its padded rows (t ≥ len[b]) are finite, else a copy with
    those rows zeroed: the weight gradient ``dW = dgxᵀ·X`` multiplies them by exact zeros, and
    0·NaN or 0·Inf would put NaN into a gradient every sequence shares."""
    pad = np.arange(x.shape[0])[:, None] >= lengths[None, :]     # [T, N]
    if np.isfinite(x[pad]).all():
        return x
    x = x.copy()
    x[pad] = 0
    return x


def open_reserve(reserve, params, x, *, cell, batch_major=False, state_mask=None, h0=None,
                 c0=None, lengths=None, what="reserve", inference_hint=None, data=True,
                 frozen=None):
    """The checked reserve (``reserve.Opened``) of a training forward of this call (``cell``:
    the cell the call computes): the model and layout must be the forward's and, with
    ``data``, also ``x``, the weights and the state mask (and ``h0``, ``c0``, the sequence
    ``lengths`` when given: frontends whose backward receives them again).  ``what`` names the
    reserve in the caller's words; ``frozen``: the call's ``weights.freeze(params)`` when the
    caller has it."""
    topo, dtype = _check_network(params)
    T, N = _check_x(x, topo, dtype, batch_major, cell.gates)
    layout = reserve_mod.Layout(topo, cell, T, N, dtype)
    opened = reserve_mod.read(reserve, layout, batch_major=batch_major, what=what,
                              inference_hint=inference_hint)
    if not data:
        return opened
    opened.check("x", reserve_mod.data_mac(b"x", _time_major(x, batch_major)), "x")
    frozen = weights.freeze(params) if frozen is None else frozen
    opened.check("params", reserve_mod.weights_mac(frozen), "params (weights)")
    mask = _check_state_mask(state_mask, topo, dtype, T, N, batch_major)
    opened.check("state_mask", reserve_mod.data_mac(b"state_mask", mask), "state_mask")
    if lengths is not None and not np.array_equal(opened.lengths, lengths):
        raise ValueError(f"{what}: written by a forward with other sequence lengths than this "
                         f"backward's (the reserve belongs to one forward call)")
    if h0 is not None:
        h0 = _check_h(h0, "h0", topo, dtype, N)
        c0 = _check_h(c0, "c0", topo, dtype, N, topo.hidden_size)
        if cell.has_cell_state and c0 is None:
            c0 = np.zeros((topo.num_layer_directions, N, topo.hidden_size), dtype)
        opened.check("h0", reserve_mod.data_mac(b"h0", h0, c0), "initial state (h0, c0)")
    return opened


def backward(params, x, reserve, dy=None, dhy=None, *, dcy=None, cell=None, state_mask=None,
             batch_major=False, dparams=None, accumulate=False, num_threads=None):
    """Gradients of a training ``forward``.

    Pass the same ``params``, ``x``, ``state_mask`` and ``batch_major`` as the forward, its
    ``reserve``, and the gradients of the loss with respect to its outputs: ``dy`` (shaped like
    ``y``), ``dhy`` (``[L·D, N, S]``) and, for an LSTM, ``dcy`` (``[L·D, N, H]``); ``None``
    means zeros.  The sequence lengths, dropout probability and seeds are read from the
    reserve, which must be the one the forward of exactly these ``x``, weights and state mask
    returned (else ``ValueError``).

    Weight gradients are written into ``dparams`` when given (``accumulate=False``: overwrite,
    TF's semantics; ``accumulate=True``: add to what it holds, cuDNN's
    ``CUDNN_WGRAD_MODE_ADD``), in place, else into a new ``Network``.

    Returns ``Gradients(dx, dh0, dparams)`` (``.dc0`` for an LSTM): ``dx`` shaped like ``x``,
    ``dh0`` ``[L·D, N, S]``.
    """
    # --- validate
    topo, dtype = _check_network(params)
    cell = params.resolve_cell(cell)
    batch_major = validate.flag(batch_major, "batch_major")
    accumulate = validate.flag(accumulate, "accumulate")
    T, N = _check_x(x, topo, dtype, batch_major, cell.gates)
    frozen = weights.freeze(params)      # the call reads the kept copies only
    net = frozen.net
    opened = open_reserve(reserve, params, x, cell=cell, batch_major=batch_major,
                          state_mask=state_mask, frozen=frozen)
    H, D, L, S = topo.hidden_size, topo.num_directions, topo.num_layers, topo.state_size
    G, DS = cell.gates, topo.output_size
    lstm, gru = cell.has_cell_state, cell.kind == "gru"
    yshape = (N, T, DS) if batch_major else (T, N, DS)
    if dy is not None:
        validate.array(dy, "dy", dtype, yshape)
        dy = _time_major(dy, batch_major)
    dhy = _check_h(dhy, "dhy", topo, dtype, N)
    dcy = _check_c(dcy, "dcy", params, dtype, N)
    mask = _check_state_mask(state_mask, topo, dtype, T, N, batch_major)
    user_dparams = _check_dparams(dparams, params, accumulate)
    nt = resolve_num_threads(num_threads)
    kernels = _KERNELS[cell.kind]
    p = opened.dropout
    lengths = opened.lengths

    # --- plan
    chunks = plan.n_chunks(N, H)
    threads = plan.loop_threads(nt, T, N, H, D, G)
    padded = bool((lengths < T).any())
    # [T·N, 1] active rows (t < len[b]), for the gradients the GEMMs do not give (peepholes)
    active = (np.arange(T)[:, None] < lengths[None, :]).reshape(T * N, 1) if padded else None
    x_tm = _time_major(x, batch_major)
    if padded:
        x_tm = _finite_padding(x_tm, lengths)
    x_tm = x_tm.reshape(T * N, topo.input_size)
    # h_prev rows for dR, written by the backward loop with zeros at padded steps (the saved
    # states there may hold h0 of an empty sequence, NaN included)
    need_hm = mask is not None or padded
    ws = plan.Workspace(dtype)
    for d in range(D):
        ws.add(f"dgx{d}", (T * N, G * H))
        if gru and cell.reset_after:
            ws.add(f"dgh{d}", (T * N, G * H))
        elif gru:
            ws.add(f"rhm{d}", (T * N, H))
        if need_hm:
            ws.add(f"hm{d}", (T * N, S))
        if topo.proj_size:
            ws.add(f"dhp{d}", (T * N, S))
    if L > 1:
        ws.add("dX0", (T * N, DS)).add("dX1", (T * N, DS))          # inner layers, ping-pong
    buf = ws.allocate()
    ld = {name: [buf.get(f"{name}{d}") for d in range(D)] for name in
          ("dgx", "dgh", "rhm", "hm", "dhp")}
    if not (gru and cell.reset_after):
        ld["dgh"] = ld["dgx"]          # the input and the recurrent side see the same dgates
    dh0 = plan.empty((L * D, N, S), dtype)
    dc0 = plan.empty((L * D, N, H), dtype) if lstm else None
    dx = plan.empty((T * N, topo.input_size), dtype)
    # Computed into a buffer of our own and handed over only when the call has succeeded, so
    # that a failing or interrupted call leaves the caller's dparams as they were.
    grads = Network.zeros(topo, dtype, cell=cell)
    masks = dropout_masks(topo, T, N, dropout=p, seed=(opened.seed, opened.seed2),
                          dtype=dtype) if p > 0 else None
    d_out = dy  # gradient of the current layer's output, [T, N, D·S] time-major or None

    # --- run
    for layer in reversed(range(L)):
        X = x_tm if layer == 0 else opened.xin[layer].reshape(T * N, DS)
        dirs = [_backward_direction(kernels, cell, topo, frozen, layer * D + d, d,
                                    opened.lds[layer * D + d], ld, dhy, dcy, dh0, dc0)
                for d in range(D)]
        kernels.backward_layer(dtype, T, N, H, S, chunks, threads, cell, lengths, mask,
                               d_out, dirs)
        dX = dx if layer == 0 else buf[f"dX{layer % 2}"]
        _layer_gradients(topo, cell, net, grads, layer, X, opened, ld, dX, nt, active)
        if layer > 0:
            d_out = dX.reshape(T, N, DS)
            if masks is not None:
                d_out *= masks[layer - 1]
    dx = dx.reshape(T, N, topo.input_size)
    if batch_major:
        dx = np.ascontiguousarray(dx.transpose(1, 0, 2))
    if user_dparams is not None:
        for mine, theirs in zip(grads, user_dparams):
            for name, a in mine.arrays().items():
                b = getattr(theirs, name)
                if accumulate:
                    b += a
                else:
                    b[...] = a
        grads = user_dparams
    return Gradients(dx, dh0, grads, dc0)


def _backward_direction(kernels, cell, topo, frozen, i, d, saved, ld, dhy, dcy, dh0, dc0):
    """The kernels' description of layer-direction ``i``'s backward (``d``: its direction)."""
    lp = frozen.net[i]
    common = dict(reverse=topo.reversed_direction(d), **_packed(frozen, i, cell,
                                                                 topo.hidden_size, False),
                  pre=saved.get("pre"), states=saved["states"],
                  dhy=None if dhy is None else dhy[i], dh0=dh0[i], dgx=ld["dgx"][d],
                  hm=ld["hm"][d])
    if cell.kind == "gru":
        return kernels.Direction(gates=saved["gates"], hn=saved.get("hn"),
                                 dgh=ld["dgh"][d] if cell.reset_after else None,
                                 rhm=ld["rhm"][d], **common)
    if cell.kind == "lstm":
        return kernels.Direction(gates=saved["gates"], cstates=saved["cstates"],
                                 P=_contiguous(lp.P), dcy=None if dcy is None else dcy[i],
                                 dc0=dc0[i], dhp=ld["dhp"][d], **common)
    return kernels.Direction(**common)


def _layer_gradients(topo, cell, params, grads, layer, X, opened, ld, dX, nt, active=None):
    """After one layer's backward loops: its weight gradients (into ``grads``) and the
    gradient of its input ``dX`` [T·N, in], all as whole-sequence GEMMs / column sums."""
    H, D, S, G = topo.hidden_size, topo.num_directions, topo.state_size, cell.gates
    TN = X.shape[0]
    dgx, dgh = ld["dgx"], ld["dgh"]
    for d in range(D):
        i = layer * D + d
        g = grads[i]
        saved = opened.lds[i]
        states = saved["states"].reshape(-1, S)
        # h_prev of every step, in gate-row order: slots 0…T−1 (forward) or 1…T (reversed)
        h_in = ld["hm"][d] if ld["hm"][d] is not None else states[-TN:] \
            if topo.reversed_direction(d) else states[:TN]
        # db_W = Σ_rows dgx,  db_R = Σ_rows dgh
        np.sum(dgx[d], axis=0, out=g.b_W)
        np.sum(dgh[d], axis=0, out=g.b_R)
        if cell.kind == "gru" and not cell.reset_after:
            # dR_rz[2H, H] = dgx_rzᵀ · (h ⊙ m);  dR_n[H, H] = dgx_nᵀ · (r ⊙ h ⊙ m)
            plan.gemm(True, False, dgx[d][:, :2 * H], h_in, g.R[:2 * H], nt=nt)
            plan.gemm(True, False, dgx[d][:, 2 * H:], ld["rhm"][d], g.R[2 * H:], nt=nt)
        else:
            # dR[G·H, S] = dghᵀ · (h ⊙ m)
            plan.gemm(True, False, dgh[d], h_in, g.R, nt=nt)
        if g.W.shape[1]:
            # dW[G·H, in] = dgxᵀ · X
            plan.gemm(True, False, dgx[d], X, g.W, nt=nt)
        if g.W_p is not None:
            # dW_p[P, H] = dhpᵀ · hf
            plan.gemm(True, False, ld["dhp"][d], saved["hf"].reshape(TN, H), g.W_p, nt=nt)
        if g.P is not None:
            # dP = Σ_rows (da_i ⊙ c, da_f ⊙ c, da_o ⊙ c') ("ifgo": Σ_rows da ⊙ c), c the
            # state before the step
            cs = saved["cstates"].reshape(-1, H)
            c_prev, c_new = (cs[-TN:], cs[:TN]) if topo.reversed_direction(d) else \
                (cs[:TN], cs[-TN:])
            if active is not None:         # padded rows may hold an empty sequence's c0
                c_prev, c_new = np.where(active, c_prev, 0), np.where(active, c_new, 0)
            da = dgx[d]
            if cell.peepholes == "ifgo":
                for k in range(4):
                    g.P[k * H:(k + 1) * H] = np.einsum("rj,rj->j", da[:, k * H:(k + 1) * H],
                                                       c_prev)
            else:
                g.P[:H] = np.einsum("rj,rj->j", da[:, :H], c_prev)
                g.P[H:2 * H] = np.einsum("rj,rj->j", da[:, H:2 * H], c_prev)
                g.P[2 * H:] = np.einsum("rj,rj->j", da[:, 3 * H:], c_new)
    if layer == 0 and topo.input_mode == "projected":
        for d in range(D):
            dX[:, d * G * H:(d + 1) * G * H] = dgx[d]
    elif layer == 0 and topo.input_mode == "skip":
        # every input matrix is the identity:  dX = Σ_d Σ_gates dgx
        dX[...] = 0
        for d in range(D):
            for k in range(G):
                dX += dgx[d][:, k * H:(k + 1) * H]
    else:
        for d in range(D):
            # dX[T·N, in] (+)= dgx_d[T·N, G·H] · W_d[G·H, in]
            plan.gemm(False, False, dgx[d], np.ascontiguousarray(params[layer * D + d].W), dX,
                      0.0 if d == 0 else 1.0, nt)


# --- the reserve's gates (MPSGraph's zState) ------------------------------------------------
def reserve_gates(reserve, params, x, *, cell=None):
    """The activated gates a training forward saved: a list of ``L·D`` arrays ``[T, N, 3H]``
    (r, z, n; index ``l·D + d``; zeros on inactive steps), copied out of ``reserve``.  Pass the
    forward's ``params`` and time-major ``x``."""
    _check_network(params)
    cell = params.resolve_cell(cell)
    opened = open_reserve(reserve, params, x, cell=cell, data=False)
    return [v["gates"].copy() for v in opened.lds]


def reserve_from_gates(params, x, gates, y, h0=None, *, cell=None, state_mask=None):
    """Rebuild the reserve of a training forward from its saved gates and its outputs.

    For frontends whose saved training state is smaller than cgru's reserve (MPSGraph's
    ``zState``): one layer, full-length sequences, time-major.  ``gates`` is a list of ``D``
    arrays ``[T, N, 3H]`` holding each direction's activated r, z, n; ``y`` ``[T, N, D·H]`` the
    forward's output; ``h0`` ``[D, N, H]`` (``None``: zeros).  The recurrent candidate term
    ``h·R_nᵀ + b_Rn`` is recomputed as one GEMM over all steps (no time loop).  Cells with
    clip, or activations other than sigmoid, tanh, identity, relu and hard_sigmoid, are
    refused (their derivative needs the pre-activation itself).

    Returns the reserve to pass to ``backward`` with the same ``params``, ``x`` and
    ``state_mask``.
    """
    topo, dtype = _check_network(params)
    cell = params.resolve_cell(cell)
    if cell.kind != "gru":
        raise ValueError(f"cell: reserve_from_gates rebuilds GRU reserves, got a {cell.kind} "
                         f"cell")
    if topo.num_layers != 1:
        raise ValueError(f"params: reserve_from_gates needs one layer, got "
                         f"num_layers={topo.num_layers}")
    if cell.clip is not None:
        raise ValueError("cell: reserve_from_gates cannot rebuild clipped pre-activations")
    for name in ("f_r", "f_z", "g"):
        act = getattr(cell, name)
        if act.name not in reserve_mod._STAND_IN_PRE:
            raise ValueError(f"cell.{name}: reserve_from_gates cannot rebuild the derivative of "
                             f"{act.name!r}; expected one of "
                             f"{sorted(reserve_mod._STAND_IN_PRE)}")
    T, N = _check_x(x, topo, dtype, False, cell.gates)
    H, D = topo.hidden_size, topo.num_directions
    if not isinstance(gates, (list, tuple)) or len(gates) != D:
        raise ValueError(f"gates: expected a list of D={D} arrays [T, N, 3H], got "
                         f"{type(gates).__name__} of length "
                         f"{len(gates) if hasattr(gates, '__len__') else '?'}")
    for d, g in enumerate(gates):
        validate.array(g, f"gates[{d}]", dtype, (T, N, 3 * H))
    validate.array(y, "y", dtype, (T, N, D * H))
    h0 = _check_h(h0, "h0", topo, dtype, N)
    if h0 is None:
        h0 = np.zeros((D, N, H), dtype)
    mask = _check_state_mask(state_mask, topo, dtype, T, N, False)
    layout = reserve_mod.Layout(topo, cell, T, N, dtype)
    frozen = weights.freeze(params)
    rv, (_, _, lds, _) = reserve_mod.create(
        layout, lengths=np.full(N, T, np.int64), dropout=0.0, seed=0, seed2=0,
        batch_major=False, x=reserve_mod.data_mac(b"x", _time_major(x, False)),
        weights=reserve_mod.weights_mac(frozen), h0=reserve_mod.data_mac(b"h0", h0, None),
        state_mask=reserve_mod.data_mac(b"state_mask", mask))
    reserve_mod.fill_from_gates(lds, frozen.net, cell, gates, y, h0, mask)
    return rv


def reserve_from_saved(params, x, saved, *, h0=None, c0=None, state_mask=None):
    """Rebuild the reserve of an LSTM or vanilla-RNN training forward from what it saved
    elsewhere (MPSGraph's ``zState`` and cell output), without re-running its time loop.

    One layer (no projection), full-length sequences, time-major ``x``; ``saved`` holds per
    direction (lists of ``D`` arrays, original time order like the output):

    * LSTM: ``"gates"`` ``[T, N, 4H]`` the activated i, f, g, o of every step and ``"cells"``
      ``[T, N, H]`` the cell state after every step;
    * RNN: ``"pre"`` ``[T, N, H]`` the pre-activation ``x·Wᵀ + b_W + (h ⊙ m)·Rᵀ + b_R``.

    ``h0``, ``c0`` ``[D, N, H]`` (``None``: zeros).  Every activation, clip and peephole form
    is supported (pre-activations are recomputed exactly).  Returns the reserve to pass to
    ``backward`` with the same ``params``, ``x`` and ``state_mask``.
    """
    topo, dtype = _check_network(params)
    cell = params.resolve_cell(None)
    if cell.kind not in ("lstm", "rnn"):
        raise ValueError(f"params: reserve_from_saved rebuilds LSTM and RNN reserves (a GRU's: "
                         f"reserve_from_gates), got a {cell.kind} cell")
    if topo.num_layers != 1 or topo.proj_size:
        raise ValueError(f"params: reserve_from_saved needs one layer without a projection, got "
                         f"num_layers={topo.num_layers}, proj_size={topo.proj_size}")
    T, N = _check_x(x, topo, dtype, False, cell.gates)
    H, D = topo.hidden_size, topo.num_directions
    names = {"lstm": (("gates", 4 * H), ("cells", H)), "rnn": (("pre", H),)}[cell.kind]
    if not isinstance(saved, dict) or set(saved) != {n for n, _ in names}:
        raise ValueError(f"saved: expected a dict with {sorted(n for n, _ in names)}, got "
                         f"{sorted(saved) if isinstance(saved, dict) else type(saved).__name__}")
    for name, width in names:
        arrays = saved[name]
        if not isinstance(arrays, (list, tuple)) or len(arrays) != D:
            raise ValueError(f"saved[{name!r}]: expected a list of D={D} arrays [T, N, "
                             f"{width}], got {type(arrays).__name__}")
        for d, a in enumerate(arrays):
            validate.array(a, f"saved[{name!r}][{d}]", dtype, (T, N, width))
    h0 = _check_h(h0, "h0", topo, dtype, N)
    h0 = np.zeros((D, N, H), dtype) if h0 is None else h0
    if cell.kind == "lstm":
        c0 = _check_h(c0, "c0", topo, dtype, N, H)
        c0 = np.zeros((D, N, H), dtype) if c0 is None else c0
    elif c0 is not None:
        raise ValueError("c0: only an LSTM has a cell state")
    mask = _check_state_mask(state_mask, topo, dtype, T, N, False)
    x_tm = _time_major(x, False)
    layout = reserve_mod.Layout(topo, cell, T, N, dtype)
    frozen = weights.freeze(params)
    rv, (_, _, lds, _) = reserve_mod.create(
        layout, lengths=np.full(N, T, np.int64), dropout=0.0, seed=0, seed2=0,
        batch_major=False, x=reserve_mod.data_mac(b"x", x_tm),
        weights=reserve_mod.weights_mac(frozen),
        h0=reserve_mod.data_mac(b"h0", h0, c0 if cell.kind == "lstm" else None),
        state_mask=reserve_mod.data_mac(b"state_mask", mask))
    reserve_mod.fill_from_saved(lds, frozen.net, cell, x_tm, saved, h0,
                                c0 if cell.kind == "lstm" else None, mask)
    return rv
