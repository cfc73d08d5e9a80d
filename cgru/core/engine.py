"""Forward and backward of a GRU stack: layers, directions, lengths, dropout, the reserve.

Public API (re-exported by ``cgru``)::

    forward(params, x, h0=None, *, cell=Cell(), lengths=None, batch_major=False,
            state_mask=None, training=False, dropout=0.0, seed=0, num_threads=None)
        -> Forward(y, hy, reserve)
    backward(params, x, reserve, dy=None, dhy=None, *, cell=Cell(), state_mask=None,
             batch_major=False, dparams=None, accumulate=False, num_threads=None)
        -> Gradients(dx, dh0, dparams)
    reserve_nbytes(topology, T, N, *, cell=Cell(), dtype=np.float32) -> int
    dropout_masks(topology, T, N, *, dropout, seed=0, dtype=np.float32) -> list of L−1 arrays

Shapes: ``x`` ``[T, N, I]`` (``[N, T, I]`` with ``batch_major``); ``y`` ``[T, N, D·H]`` (or
``[N, T, D·H]``); ``h0``/``hy`` ``[L·D, N, H]`` at index ``l·D + d`` in both layouts.

Per layer the engine does (kernel equations in ``_kernels.pyx``): the input projection of all
steps as one GEMM per direction; the time loops of all directions as
(direction, batch chunk) work items on cgru's thread pool, whose per-step products use cgru's packed-weight GEMM;
and in the backward, after the loops, ``dW``, ``dR`` and ``dX`` as whole-sequence GEMMs and
the bias gradients as column sums.  Every whole-sequence GEMM runs as fixed blocks of
single-threaded BLAS on cgru's pool threads (``_gemm``).

The reserve (training only) is one ``uint8`` array carved by ``_reserve_layout`` — the same
function sizes it — into (each region 64-byte aligned)::

    header   int64[16]       magic, version, T, N, dtype, fingerprint of (topology, cell, T, N),
                             dropout, seed, seed2
    lengths  int64[N]
    per layer-direction i = l·D + d:
      gates_i  [T, N, 3H]    r, z, n
      states_i [T+1, N, H]   h0 and the state after every step (see _kernels.pyx)
      hn_i     [T, N, H]     h·R_nᵀ + b_Rn              (reset_after only)
      pre_i    [T, N, 3H]    pre-activations           (cells other than sigmoid/tanh/no clip)
    per layer l ≥ 1:
      xin_l    [T, N, D·H]   that layer's input (the previous output after dropout)

so ``reserve_nbytes = 128 + 8N + Σ sizes`` rounded up to 64 bytes per region; it is 0 (no
reserve) for inference.
"""
from collections import namedtuple
import hashlib
import math
import threading

import numpy as np

from cgru import _blas, _kernels
from cgru._threads import blas_single_threaded, resolve_num_threads
from cgru.cell import Cell
from cgru.params import Params, Topology, _positive_int, as_dtype

Forward = namedtuple("Forward", "y hy reserve")
Forward.__doc__ = """Result of ``forward``: output ``y``, final states ``hy`` ``[L·D, N, H]``,
and the ``reserve`` (``None`` unless ``training``)."""
Gradients = namedtuple("Gradients", "dx dh0 dparams")
Gradients.__doc__ = """Result of ``backward``: ``dx`` (shaped like ``x``), ``dh0``
``[L·D, N, H]`` and ``dparams`` (a ``Params`` of gradients)."""

_MAGIC = 0x63677275  # "cgru"
_VERSION = 1
_HEADER = 16  # int64 slots
_ALIGN = 64
_INT_MAX = 2 ** 31 - 1
# Batch chunks of the time loop: a function of N only, so that results do not depend on the
# thread count.  Two chunks from N = 16 (so two threads have work), more only while each keeps
# at least 16 rows (fewer rows per call make the per-step GEMM stream R once per 8 rows).
_MAX_CHUNKS = 4


def _empty(shape, dtype):
    """Every buffer the engine returns or fills (outputs, reserve, workspaces) comes from here,
    so that tests can poison them (e.g. with NaN) and see that each element is written."""
    return np.empty(shape, dtype)


def _n_chunks(N):
    if N < 16:
        return 1
    return max(2, min(_MAX_CHUNKS, N // 16))


# Below this many multiply-adds per time loop, waking a second thread costs more than it saves
# (and much more on a busy machine).  Only the thread count changes, never the results.
_MIN_PARALLEL_WORK = 1 << 21


def _loop_threads(nt, T, N, H, D):
    return nt if T * N * D * H * (3 * H + 16) >= _MIN_PARALLEL_WORK else 1


# Whole-sequence GEMMs are split into at most _MAX_GEMM_BLOCKS blocks (of C's rows, or of the
# inner dimension for the weight gradients Aᵀ·B; at least _MIN_GEMM_ROWS rows each), one
# single-threaded BLAS call per block on cgru's pool threads: BLAS's own pool stays asleep and
# cannot fight the time loops' threads for the cores.  The split is a function of the shape
# only, so results do not depend on the thread count.
_MAX_GEMM_BLOCKS = 4
_MIN_GEMM_ROWS = 128


def _gemm(ta, tb, A, B, C, beta=0.0, nt=1):
    """``C = op(A)·op(B) + beta·C`` for row-major 2-D arrays (views with unit inner stride)."""
    split = A.shape[0] if ta else C.shape[0]   # the inner dimension k, or C's rows
    blocks = max(1, min(_MAX_GEMM_BLOCKS, split // (4 * _MIN_GEMM_ROWS if ta else _MIN_GEMM_ROWS)))
    _blas.gemm_blocks(ta, tb, 1.0, A, B, beta, C, blocks, nt)


# --- validation ----------------------------------------------------------------------------
_DEFAULT_CELL = Cell()


def _as_cell(cell):
    if cell is None:
        return _DEFAULT_CELL
    if not isinstance(cell, Cell):
        raise TypeError(f"cell: expected a cgru.Cell, got {type(cell).__name__}")
    return cell


def _check_array(a, what, dtype, shape=None):
    """``a`` as an ndarray of ``dtype``; shape checked (``None`` in ``shape`` = any)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what}: expected a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise TypeError(f"{what}: expected dtype {dtype} (the dtype of params), got {a.dtype}")
    if shape is not None:
        if a.ndim != len(shape) or any(s is not None and s != e for s, e in zip(shape, a.shape)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{what}: expected shape {want}, got {list(a.shape)}")
    return a


def _check_params(params):
    if not isinstance(params, Params):
        raise TypeError(f"params: expected a cgru.Params, got {type(params).__name__}")
    return params.topology, params.dtype


def _check_x(x, topo, dtype, batch_major):
    layout = "[N, T, I]" if batch_major else "[T, N, I]"
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x: expected a numpy array {layout}, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"x: expected dtype {dtype} (the dtype of params), got {x.dtype}")
    if x.ndim != 3:
        raise ValueError(f"x: expected a 3-D array {layout}, got shape {list(x.shape)}")
    if x.shape[2] != topo.input_size:
        raise ValueError(f"x: expected {topo.input_size} features (input_size) in the last "
                         f"axis of {layout}, got shape {list(x.shape)}")
    N, T = (x.shape[0], x.shape[1]) if batch_major else (x.shape[1], x.shape[0])
    if T == 0 or N == 0:
        raise ValueError(f"x: expected T ≥ 1 and N ≥ 1, got shape {list(x.shape)} {layout}")
    H = topo.hidden_size
    for name, v in (("T·N", T * N), ("3H", 3 * H), ("input_size", topo.input_size),
                    ("D·H", topo.output_size)):
        if v > _INT_MAX:
            raise ValueError(f"x: {name} = {v} exceeds the 32-bit BLAS limit {_INT_MAX}")
    return T, N


def _time_major(a, batch_major):
    return np.ascontiguousarray(a.transpose(1, 0, 2) if batch_major else a)


def _check_lengths(lengths, T, N):
    if lengths is None:
        return np.full(N, T, dtype=np.int64)
    if isinstance(lengths, np.ndarray):
        arr = lengths
    else:
        try:
            arr = np.asarray(lengths)
        except Exception:
            raise TypeError(f"lengths: expected an integer array [N={N}], got "
                            f"{type(lengths).__name__}") from None
    if arr.dtype.kind not in "iu":
        raise TypeError(f"lengths: expected an integer array [N={N}], got dtype {arr.dtype}")
    if arr.shape != (N,):
        raise ValueError(f"lengths: expected shape [{N}] (one length per batch entry), got "
                         f"{list(arr.shape)}")
    bad = (arr < 0) | (arr > T)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise ValueError(f"lengths: expected values in [0, T={T}], got lengths[{b}] = {arr[b]}")
    return arr.astype(np.int64)


def _check_state_mask(state_mask, topo, dtype, T, N, batch_major):
    """The state mask broadcast to time-major ``[T, N, D·H]`` (C-contiguous), or None."""
    if state_mask is None:
        return None
    DH = topo.output_size
    shape = (N, T, DH) if batch_major else (T, N, DH)
    if not isinstance(state_mask, np.ndarray):
        raise TypeError(f"state_mask: expected a numpy array, got {type(state_mask).__name__}")
    if state_mask.dtype != dtype:
        raise TypeError(f"state_mask: expected dtype {dtype} (the dtype of params), got "
                        f"{state_mask.dtype}")
    try:
        m = np.broadcast_to(state_mask, shape)
    except ValueError:
        raise ValueError(f"state_mask: expected a shape broadcastable to the output shape "
                         f"{list(shape)}, got {list(state_mask.shape)}") from None
    return _time_major(m, batch_major)


def _check_h(h, what, topo, dtype, N):
    if h is None:
        return None
    LD, H = topo.num_layer_directions, topo.hidden_size
    _check_array(h, what, dtype)
    if h.shape != (LD, N, H):
        raise ValueError(f"{what}: expected shape [L·D={LD}, N={N}, H={H}], got {list(h.shape)}")
    return np.ascontiguousarray(h)


def _check_dropout(dropout, seed):
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float, np.floating)):
        raise TypeError(f"dropout: expected a float in [0, 1), got {dropout!r}")
    if not (0.0 <= float(dropout) < 1.0):
        raise ValueError(f"dropout: expected a float in [0, 1), got {dropout!r}")
    if isinstance(seed, tuple):
        if len(seed) != 2:
            raise ValueError(f"seed: expected an int or a (seed, seed2) pair, got {seed!r}")
        s1, s2 = seed
    else:
        s1, s2 = seed, 0
    for name, s in (("seed", s1), ("seed2", s2)):
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"{name}: expected an int, got {s!r}")
        if not (-2 ** 63 <= s < 2 ** 63):
            raise ValueError(f"{name}: expected a 64-bit int, got {s}")
    return float(dropout), int(s1), int(s2)


# --- dropout -------------------------------------------------------------------------------
def dropout_masks(topology, T, N, *, dropout, seed=0, dtype=np.float32):
    """The inter-layer dropout masks a training forward with these arguments uses.

    A list of ``L − 1`` arrays ``[T, N, D·H]`` (time-major): entry ``l`` multiplies layer
    ``l``'s output before it feeds layer ``l + 1``.  Values are 0 or ``1/(1 − dropout)``
    (inverted dropout).  Drawn from NumPy's PCG64 seeded by ``(seed, seed2, l)``: the same
    arguments give the same masks on every machine and thread count.
    """
    _check_topology(topology)
    T, N = _positive_int(T, "T"), _positive_int(N, "N")
    p, s1, s2 = _check_dropout(dropout, seed)
    dt = as_dtype(dtype)
    masks = []
    for layer in range(topology.num_layers - 1):
        if p == 0.0:
            masks.append(np.ones((T, N, topology.output_size), dt))
            continue
        ss = np.random.SeedSequence([s1 & (2 ** 64 - 1), s2 & (2 ** 64 - 1), layer])
        u = np.random.Generator(np.random.PCG64(ss)).random((T, N, topology.output_size))
        masks.append(np.where(u >= p, 1.0 / (1.0 - p), 0.0).astype(dt))
    return masks


# --- the reserve ---------------------------------------------------------------------------
def _fingerprint(topo, cell, T, N, dtype):
    key = repr((topo, cell, T, N, np.dtype(dtype).str)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "little")


def _reserve_layout(topo, T, N, cell, dtype):
    """``({name: (byte offset, shape)}, total bytes)`` of the reserve (module docstring)."""
    itemsize = np.dtype(dtype).itemsize
    H, D, L = topo.hidden_size, topo.num_directions, topo.num_layers
    regions = {}
    pos = 0

    def add(name, shape, size_of=itemsize):
        nonlocal pos
        regions[name] = (pos, shape)
        pos += -(-math.prod(shape) * size_of // _ALIGN) * _ALIGN

    add("header", (_HEADER,), 8)
    add("lengths", (N,), 8)
    for i in range(L * D):
        add(f"gates{i}", (T, N, 3 * H))
        add(f"states{i}", (T + 1, N, H))
        if cell.reset_after:
            add(f"hn{i}", (T, N, H))
        if not cell.is_fast:
            add(f"pre{i}", (T, N, 3 * H))
    for layer in range(1, L):
        add(f"xin{layer}", (T, N, D * H))
    return regions, pos


def reserve_nbytes(topology, T, N, *, cell=None, dtype=np.float32):
    """Size in bytes of the reserve a training ``forward`` returns for these sizes."""
    _check_topology(topology)
    T, N = _positive_int(T, "T"), _positive_int(N, "N")
    return _reserve_layout(topology, T, N, _as_cell(cell), as_dtype(dtype))[1]


def _check_topology(topology):
    if not isinstance(topology, Topology):
        raise TypeError(f"topology: expected a cgru.Topology, got {type(topology).__name__}")


def _zero_gaps(reserve, regions, dtype):
    """Zero the alignment padding between regions, so equal calls give equal reserve bytes."""
    ends = []
    for name, (off, shape) in regions.items():
        dt = np.int64 if name in ("header", "lengths") else dtype
        ends.append((off, off + math.prod(shape) * np.dtype(dt).itemsize))
    starts = [off for off, _ in ends[1:]] + [reserve.size]
    for (_, end), nxt in zip(ends, starts):
        reserve[end:nxt] = 0


def _carve(reserve, regions, dtype):
    views = {}
    for name, (off, shape) in regions.items():
        dt = np.int64 if name in ("header", "lengths") else dtype
        n = math.prod(shape) * np.dtype(dt).itemsize
        views[name] = reserve[off:off + n].view(dt).reshape(shape)
    return views


def _new_reserve(topo, T, N, cell, dtype, lengths, p, s1, s2):
    """A reserve with its header and lengths written; the rest for the forward to fill."""
    regions, nbytes = _reserve_layout(topo, T, N, cell, dtype)
    reserve = _empty(nbytes, np.uint8)
    _zero_gaps(reserve, regions, dtype)
    views = _carve(reserve, regions, dtype)
    head = views["header"]
    head[:] = 0
    head[:6] = [_MAGIC, _VERSION, T, N, dtype.itemsize, _fingerprint(topo, cell, T, N, dtype)]
    head[6] = np.float64(p).view(np.int64)
    head[7], head[8] = s1, s2
    views["lengths"][:] = lengths
    return reserve, views


# Activations whose derivative the backward can take from a stand-in pre-activation rebuilt
# from the activation's output (see reserve_from_gates): name -> out ↦ stand-in.
_STAND_IN_PRE = {
    "sigmoid": lambda act, out: out,                           # derivative uses out only
    "tanh": lambda act, out: out,
    "identity": lambda act, out: out,
    "relu": lambda act, out: out,                              # out > 0  ⇔  x > 0
    "hard_sigmoid": lambda act, out: _hard_sigmoid_stand_in(act, out),
}


def _hard_sigmoid_stand_in(act, out):
    """x with αx + β strictly inside (0, 1) exactly where ``out`` is, far outside elsewhere."""
    if act.alpha == 0:
        return np.zeros_like(out)
    inside = (out - act.beta) / act.alpha
    return np.where(out <= 0, (-1 - act.beta) / act.alpha,
                    np.where(out >= 1, (2 - act.beta) / act.alpha, inside)).astype(out.dtype)


def reserve_gates(reserve, params, x, *, cell=None):
    """The activated gates a training forward saved: a list of ``L·D`` arrays ``[T, N, 3H]``
    (r, z, n; index ``l·D + d``; zeros on inactive steps), copied out of ``reserve``.  Pass the
    forward's ``params``, time-major ``x`` and ``cell``."""
    topo, dtype = _check_params(params)
    cell = _as_cell(cell)
    T, N = _check_x(x, topo, dtype, False)
    views = _read_reserve(reserve, topo, cell, dtype, T, N)[0]
    return [views[f"gates{i}"].copy() for i in range(topo.num_layer_directions)]


def reserve_from_gates(params, x, gates, y, h0=None, *, cell=None, state_mask=None):
    """Rebuild the reserve of a training forward from its saved gates and its outputs.

    For frontends whose saved training state is smaller than cgru's reserve (MPSGraph's
    ``zState``): one layer, full-length sequences, time-major.  ``gates`` is a list of ``D``
    arrays ``[T, N, 3H]`` holding each direction's activated r, z, n; ``y`` ``[T, N, D·H]`` the
    forward's output; ``h0`` ``[D, N, H]`` (``None``: zeros).  The recurrent candidate term
    ``h·R_nᵀ + b_Rn`` is recomputed as one GEMM over all steps (no time loop).  Cells with
    clip, or activations other than sigmoid, tanh, identity, relu and hard_sigmoid, are
    refused (their derivative needs the pre-activation itself).

    Returns the reserve to pass to ``backward`` with the same ``params``, ``x``, ``cell`` and
    ``state_mask``.
    """
    topo, dtype = _check_params(params)
    cell = _as_cell(cell)
    if topo.num_layers != 1:
        raise ValueError(f"params: reserve_from_gates needs one layer, got "
                         f"num_layers={topo.num_layers}")
    if cell.clip is not None:
        raise ValueError("cell: reserve_from_gates cannot rebuild clipped pre-activations")
    for name in ("f_r", "f_z", "g"):
        act = getattr(cell, name)
        if act.name not in _STAND_IN_PRE:
            raise ValueError(f"cell.{name}: reserve_from_gates cannot rebuild the derivative of "
                             f"{act.name!r}; expected one of {sorted(_STAND_IN_PRE)}")
    T, N = _check_x(x, topo, dtype, False)
    H, D = topo.hidden_size, topo.num_directions
    if not isinstance(gates, (list, tuple)) or len(gates) != D:
        raise ValueError(f"gates: expected a list of D={D} arrays [T, N, 3H], got "
                         f"{type(gates).__name__} of length {len(gates) if hasattr(gates, '__len__') else '?'}")
    for d, g in enumerate(gates):
        _check_array(g, f"gates[{d}]", dtype, (T, N, 3 * H))
    _check_array(y, "y", dtype, (T, N, D * H))
    h0 = _check_h(h0, "h0", topo, dtype, N)
    if h0 is None:
        h0 = np.zeros((D, N, H), dtype)
    mask = _check_state_mask(state_mask, topo, dtype, T, N, False)
    reserve, views = _new_reserve(topo, T, N, cell, dtype, np.full(N, T, np.int64), 0.0, 0, 0)
    for d in range(D):
        states = views[f"states{d}"]
        rev = topo.reversed_direction(d)
        # forward: slot 0 = h0, slot t+1 = y[t];  reversed: slot T = h0, slot t = y[t]
        if rev:
            states[:T], states[T] = y[:, :, d * H:(d + 1) * H], h0[d]
        else:
            states[0], states[1:] = h0[d], y[:, :, d * H:(d + 1) * H]
        views[f"gates{d}"][...] = gates[d]
        if cell.reset_after:
            h_in = states[1:] if rev else states[:T]
            if mask is not None:
                h_in = h_in * mask[:, :, d * H:(d + 1) * H]
            hn = views[f"hn{d}"].reshape(T * N, H)
            # hn[T·N, H] = (h ⊙ m)[T·N, H] · R_n[H, H]ᵀ + b_Rn
            _gemm(False, True, np.ascontiguousarray(h_in).reshape(T * N, H),
                  params[d].R[2 * H:], hn)
            hn += params[d].b_R[2 * H:]
        if not cell.is_fast:
            pre = views[f"pre{d}"]
            for k, act in enumerate((cell.f_r, cell.f_z, cell.g)):
                pre[:, :, k * H:(k + 1) * H] = _STAND_IN_PRE[act.name](
                    act, gates[d][:, :, k * H:(k + 1) * H])
    return reserve


def _read_reserve(reserve, topo, cell, dtype, T, N):
    if not isinstance(reserve, np.ndarray):
        raise TypeError(f"reserve: expected the numpy array a training forward returned, got "
                        f"{type(reserve).__name__}")
    regions, nbytes = _reserve_layout(topo, T, N, cell, dtype)
    if reserve.dtype != np.uint8 or reserve.ndim != 1:
        raise TypeError(f"reserve: expected a 1-D uint8 array, got {reserve.dtype} with shape "
                        f"{list(reserve.shape)}")
    if reserve.size == 0:
        raise ValueError("reserve: empty; backward needs the reserve of a training forward "
                         "(training=True), an inference forward saves nothing")
    if reserve.size != nbytes:
        raise ValueError(f"reserve: expected {nbytes} bytes for this topology, cell, T={T}, "
                         f"N={N} and dtype {dtype}, got {reserve.size} (from a different call?)")
    if reserve.ctypes.data % 8 or not reserve.flags.c_contiguous:
        reserve = reserve.copy()  # a copy is C-contiguous and aligned
    views = _carve(reserve, regions, dtype)
    head = views["header"]
    if head[0] != _MAGIC or head[1] != _VERSION:
        raise ValueError("reserve: not a cgru reserve (bad header); pass the reserve of the "
                         "matching training forward")
    if head[5] != _fingerprint(topo, cell, T, N, dtype):
        raise ValueError("reserve: written by a forward with a different topology, cell, "
                         "sizes or dtype than this backward")
    lengths = views["lengths"]
    if ((lengths < 0) | (lengths > T)).any():
        raise ValueError("reserve: corrupt sequence lengths")
    p = float(np.int64(head[6]).view(np.float64))
    if not (0.0 <= p < 1.0):
        raise ValueError("reserve: corrupt header (dropout field); pass the reserve of the "
                         "matching training forward")
    return views, p, int(head[7]), int(head[8])


# --- forward -------------------------------------------------------------------------------
def _gate_biases(lp, cell, H):
    """``b_rzn`` [3H] and ``b_hn`` [H] as the kernels add them (step 3/4)."""
    b_rzn = lp.b_W + lp.b_R
    if cell.reset_after:
        b_rzn[2 * H:] = lp.b_W[2 * H:]
    return b_rzn, np.ascontiguousarray(lp.b_R[2 * H:])


def _packed_forward(R, cell, H):
    """R packed for the forward time loop: ``gh = h·Rᵀ`` (reset-after), or ``h·R_rzᵀ`` and
    ``(r ⊙ h)·R_nᵀ`` (reset-before)."""
    if cell.reset_after:
        return {"Rp": _kernels.pack_rhs(R, True)}
    return {"Rp": _kernels.pack_rhs(R[:2 * H], True), "Rp_n": _kernels.pack_rhs(R[2 * H:], True)}


def _packed_backward(R, cell, H):
    """R packed for the backward time loop: ``dh += dgh·R`` (reset-after), or ``dgh_rz·R_rz`` and
    ``dgh_n·R_n`` (reset-before)."""
    if cell.reset_after:
        return {"Rb": _kernels.pack_rhs(R, False)}
    return {"Rb": _kernels.pack_rhs(R[:2 * H], False),
            "Rb_n": _kernels.pack_rhs(R[2 * H:], False)}


def _input_projection(topo, layer, d, lp, X, out, nt):
    """(gx, ldgx) of direction d: ``gx = X·Wᵀ`` [T·N, 3H] — or x itself in skip/projected mode."""
    H = topo.hidden_size
    if layer == 0 and topo.input_mode == "projected":
        return X[:, d * 3 * H:], topo.input_size
    if layer == 0 and topo.input_mode == "skip":
        out[:, :H] = X
        out[:, H:2 * H] = X
        out[:, 2 * H:] = X
        return out, 3 * H
    # gx[T·N, 3H] = X[T·N, in] · W[3H, in]ᵀ
    _gemm(False, True, X, lp.W, out, nt=nt)
    return out, 3 * H


def forward(params, x, h0=None, *, cell=None, lengths=None, batch_major=False,
            state_mask=None, training=False, dropout=0.0, seed=0, num_threads=None):
    """Run a GRU stack over a batch of sequences.

    Args:
        params: ``cgru.Params`` (its topology gives L, D, H, input size and input mode).
        x: ``[T, N, I]``, or ``[N, T, I]`` with ``batch_major``; dtype of params.
        h0: ``[L·D, N, H]`` initial states (``None``: zeros).
        cell: the ``cgru.Cell`` variant (default: the cuDNN/PyTorch cell).
        lengths: ``[N]`` integer sequence lengths in ``[0, T]``, any order (``None``: all T).
            The forward direction runs ``t = 0…len−1``, the reversed one ``len−1…0``;
            outputs at ``t ≥ len`` are 0; ``hy`` is the state after the last processed step
            (``h0`` for ``len = 0``).
        state_mask: broadcastable to the output shape; ``h ⊙ m`` enters every recurrent
            product (MPSGraph's mask), the output-time-``t`` slice at the step producing ``t``.
        training: keep the reserve for ``backward`` (and apply ``dropout``).
        dropout: inter-layer inverted dropout probability (training only), ``[0, 1)``.
        seed: int or ``(seed, seed2)`` for the dropout masks (see ``dropout_masks``).
        num_threads: threads of cgru's pool (``None``: all usable cores, at most
            ``OMP_NUM_THREADS``).  Results are bitwise identical for every value.

    Returns:
        ``Forward(y, hy, reserve)``; ``y`` ``[T, N, D·H]`` (``[N, T, D·H]`` with
        ``batch_major``), ``hy`` ``[L·D, N, H]``, ``reserve`` a uint8 array or ``None``.
    """
    topo, dtype = _check_params(params)
    cell = _as_cell(cell)
    T, N = _check_x(x, topo, dtype, batch_major)
    h0 = _check_h(h0, "h0", topo, dtype, N)
    lengths = _check_lengths(lengths, T, N)
    mask = _check_state_mask(state_mask, topo, dtype, T, N, batch_major)
    p, s1, s2 = _check_dropout(dropout, seed)
    if not training:
        p = 0.0
    nt = resolve_num_threads(num_threads)
    chunks = _n_chunks(N)
    H, D, L = topo.hidden_size, topo.num_directions, topo.num_layers

    X = _time_major(x, batch_major).reshape(T * N, topo.input_size)
    if h0 is None:
        h0 = np.zeros((L * D, N, H), dtype)
    hy = _empty((L * D, N, H), dtype)
    y = _empty((T, N, D * H), dtype)
    views = None
    reserve = None
    if training:
        reserve, views = _new_reserve(topo, T, N, cell, dtype, lengths, p, s1, s2)
    masks = dropout_masks(topo, T, N, dropout=p, seed=(s1, s2), dtype=dtype) if p > 0 else None
    gx_buf = [_empty((T * N, 3 * H), dtype) for _ in range(D)]

    with blas_single_threaded():  # BLAS runs single-threaded inside cgru's own blocks
        for layer in range(L):
            last = layer == L - 1
            if last:
                out = y
            elif training:
                out = views[f"xin{layer + 1}"]
            else:
                out = _empty((T, N, D * H), dtype)
            dirs = []
            for d in range(D):
                i = layer * D + d
                lp = params[i]
                gx, ldgx = _input_projection(topo, layer, d, lp, X, gx_buf[d], nt)
                b_rzn, b_hn = _gate_biases(lp, cell, H)
                a = dict(reverse=topo.reversed_direction(d), gx=gx, ldgx=ldgx, b_rzn=b_rzn,
                         b_hn=b_hn, h0=h0[i], hy=hy[i], **_packed_forward(lp.R, cell, H))
                if training:
                    a.update(gates=views[f"gates{i}"], states=views[f"states{i}"],
                             hn=views.get(f"hn{i}"), pre=views.get(f"pre{i}"))
                dirs.append(a)
            _kernels.forward_layer(dtype, T, N, H, chunks, _loop_threads(nt, T, N, H, D), cell,
                                   lengths, mask, out, dirs, training)
            if not last:
                if masks is not None:
                    np.multiply(out, masks[layer], out=out)
                X = out.reshape(T * N, D * H)
    if batch_major:
        y = np.ascontiguousarray(y.transpose(1, 0, 2))
    return Forward(y, hy, reserve)


# --- backward ------------------------------------------------------------------------------
def _check_dparams(dparams, topo, dtype, accumulate):
    if dparams is None:
        if accumulate:
            raise ValueError("dparams: accumulate=True needs the Params to add the gradients to")
        return None, False
    if not isinstance(dparams, Params):
        raise TypeError(f"dparams: expected a cgru.Params or None, got {type(dparams).__name__}")
    if dparams.topology != topo:
        raise ValueError(f"dparams: expected topology {topo}, got {dparams.topology}")
    if dparams.dtype != dtype:
        raise TypeError(f"dparams: expected dtype {dtype} (the dtype of params), got "
                        f"{dparams.dtype}")
    for i, lp in enumerate(dparams):
        for name, a in lp.arrays().items():
            if not a.flags.writeable:
                raise ValueError(f"dparams[{i}].{name}: is read-only; backward writes into it")
    return dparams, bool(accumulate)


def backward(params, x, reserve, dy=None, dhy=None, *, cell=None, state_mask=None,
             batch_major=False, dparams=None, accumulate=False, num_threads=None):
    """Gradients of a training ``forward``.

    Pass the same ``params``, ``x``, ``cell``, ``state_mask`` and ``batch_major`` as the
    forward, its ``reserve``, and the gradients of the loss with respect to its outputs:
    ``dy`` (shaped like ``y``) and ``dhy`` (``[L·D, N, H]``); ``None`` means zeros.  The
    sequence lengths, dropout probability and seeds are read from the reserve.

    Weight gradients are written into ``dparams`` when given (``accumulate=False``: overwrite,
    TF's semantics; ``accumulate=True``: add to what it holds, cuDNN's
    ``CUDNN_WGRAD_MODE_ADD``), else into a new ``Params``.

    Returns ``Gradients(dx, dh0, dparams)``: ``dx`` shaped like ``x``, ``dh0`` ``[L·D, N, H]``.
    """
    topo, dtype = _check_params(params)
    cell = _as_cell(cell)
    T, N = _check_x(x, topo, dtype, batch_major)
    views, p, s1, s2 = _read_reserve(reserve, topo, cell, dtype, T, N)
    H, D, L = topo.hidden_size, topo.num_directions, topo.num_layers
    DH = D * H
    yshape = (N, T, DH) if batch_major else (T, N, DH)
    if dy is not None:
        _check_array(dy, "dy", dtype, yshape)
        dy = _time_major(dy, batch_major)
    dhy = _check_h(dhy, "dhy", topo, dtype, N)
    mask = _check_state_mask(state_mask, topo, dtype, T, N, batch_major)
    user_dparams, accumulate = _check_dparams(dparams, topo, dtype, accumulate)
    # Computed into a buffer of our own and handed over only when the call has succeeded, so
    # that a failing or interrupted call leaves the caller's dparams as they were.
    dparams = Params.zeros(topo, dtype)
    nt = resolve_num_threads(num_threads)
    chunks = _n_chunks(N)
    lengths = views["lengths"]
    masks = dropout_masks(topo, T, N, dropout=p, seed=(s1, s2), dtype=dtype) if p > 0 else None

    padded = bool((lengths < T).any())
    x_tm = _time_major(x, batch_major)
    if padded:
        x_tm = _finite_padding(x_tm, lengths)
    x_tm = x_tm.reshape(T * N, topo.input_size)
    dh0 = _empty((L * D, N, H), dtype)
    dgx = [_empty((T * N, 3 * H), dtype) for _ in range(D)]
    dgh = [_empty((T * N, 3 * H), dtype) for _ in range(D)] if cell.reset_after else dgx
    rhm = [_empty((T * N, H), dtype) for _ in range(D)] if not cell.reset_after else None
    # h_prev rows for dR, written by the backward loop with zeros at padded steps (the saved
    # states there may hold h0 of an empty sequence, NaN included)
    hm = [_empty((T * N, H), dtype) for _ in range(D)] if mask is not None or padded else None
    d_out = dy  # gradient of the current layer's output, [T, N, D·H] time-major or None

    with blas_single_threaded():  # BLAS runs single-threaded inside cgru's own blocks
        for layer in reversed(range(L)):
            X = x_tm if layer == 0 else views[f"xin{layer}"].reshape(T * N, DH)
            dirs = []
            for d in range(D):
                i = layer * D + d
                dirs.append(dict(
                    reverse=topo.reversed_direction(d), **_packed_backward(params[i].R, cell, H),
                    gates=views[f"gates{i}"],
                    pre=views.get(f"pre{i}"), hn=views.get(f"hn{i}"), states=views[f"states{i}"],
                    dhy=None if dhy is None else dhy[i], dh0=dh0[i], dgx=dgx[d],
                    dgh=dgh[d] if cell.reset_after else None,
                    rhm=None if rhm is None else rhm[d], hm=None if hm is None else hm[d]))
            _kernels.backward_layer(dtype, T, N, H, chunks, _loop_threads(nt, T, N, H, D), cell,
                                    lengths, mask, d_out, dirs)

            dX = _layer_gradients(topo, cell, params, dparams, layer, X, views, dgx, dgh, rhm, hm,
                                  nt)
            if layer > 0:
                d_out = dX.reshape(T, N, DH)
                if masks is not None:
                    d_out *= masks[layer - 1]
    dx = dX.reshape(T, N, topo.input_size)
    if batch_major:
        dx = np.ascontiguousarray(dx.transpose(1, 0, 2))
    if user_dparams is not None:
        for mine, theirs in zip(dparams, user_dparams):
            for name, a in mine.arrays().items():
                b = getattr(theirs, name)
                if accumulate:
                    b += a
                else:
                    b[...] = a
        dparams = user_dparams
    return Gradients(dx, dh0, dparams)


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


def _layer_gradients(topo, cell, params, dparams, layer, X, views, dgx, dgh, rhm, hm, nt):
    """After one layer's backward loops: its weight gradients (into ``dparams``) and the
    gradient of its input ``dX`` [T·N, in], all as whole-sequence GEMMs / column sums."""
    H, D = topo.hidden_size, topo.num_directions
    TN = X.shape[0]
    for d in range(D):
        i = layer * D + d
        g = dparams[i]
        states = views[f"states{i}"].reshape(-1, H)
        # h_prev of every step, in gate-row order: slots 0…T−1 (forward) or 1…T (reversed)
        h_in = hm[d] if hm is not None else states[-TN:] if topo.reversed_direction(d) \
            else states[:TN]
        # db_W = Σ_rows dgx,  db_R = Σ_rows dgh
        np.sum(dgx[d], axis=0, out=g.b_W)
        np.sum(dgh[d], axis=0, out=g.b_R)
        if cell.reset_after:
            # dR[3H, H] = dghᵀ · (h ⊙ m)
            _gemm(True, False, dgh[d], h_in, g.R, nt=nt)
        else:
            # dR_rz[2H, H] = dgx_rzᵀ · (h ⊙ m);  dR_n[H, H] = dgx_nᵀ · (r ⊙ h ⊙ m)
            _gemm(True, False, dgx[d][:, :2 * H], h_in, g.R[:2 * H], nt=nt)
            _gemm(True, False, dgx[d][:, 2 * H:], rhm[d], g.R[2 * H:], nt=nt)
        if g.W.shape[1]:
            # dW[3H, in] = dgxᵀ · X
            _gemm(True, False, dgx[d], X, g.W, nt=nt)
    dX = _empty((TN, X.shape[1]), X.dtype)
    if layer == 0 and topo.input_mode == "projected":
        for d in range(D):
            dX[:, d * 3 * H:(d + 1) * 3 * H] = dgx[d]
    elif layer == 0 and topo.input_mode == "skip":
        # W_r = W_z = W_n = I:  dX = Σ_d Σ_gates dgx
        dX[...] = 0
        for d in range(D):
            for k in range(3):
                dX += dgx[d][:, k * H:(k + 1) * H]
    else:
        for d in range(D):
            # dX[T·N, in] (+)= dgx_d[T·N, 3H] · W_d[3H, in]
            _gemm(False, False, dgx[d], params[layer * D + d].W, dX, 0.0 if d == 0 else 1.0, nt)
    return dX
