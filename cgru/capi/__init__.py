"""The Python half of cgru's C ABI (``include/cgru.h``): libcgru's entry points call these.

libcgru (``cgru/capi/*.c``) runs on the embedded Python runtime of the environment where cgru
is installed.  Each of its entry points checks the descriptor pointer, then calls the function
of the same name here with every C argument as a Python number (pointers as integer addresses,
0 for NULL; the descriptor as the tuple ``_model`` unpacks).  These functions validate the
arguments, wrap the caller's buffers as NumPy arrays without copying, run ``cgru.forward`` /
``cgru.backward`` and copy the results into the caller's output buffers.  They never raise:
they return ``(status, message, *values)`` with the header's status codes; the message becomes
the calling C thread's ``cgru_get_last_error_message()``.

The C ABI reserve space (training), carved by ``_plan`` (regions 64-byte aligned)::

    header   int64[8]    magic, version, state (1: forward done, 2: backward_data done),
                         fingerprint of (descriptor, layout, T, N, seq_lengths), region offsets
    engine   uint8[E]    the engine's reserve (E = cgru.reserve_nbytes)
    x        [T·N·I]     a copy of the forward's x, as given (either layout)
    dw       [weights]   the weight gradients backward_data computed (weight-space layout)

``cgru_rnn_backward_data`` runs the whole engine backward (x from the copy, the weight gradients
into ``dw``); ``cgru_rnn_backward_weights`` adds ``dw`` to the dweight space or copies it there.
The workspace is not used (size 0): the engine allocates its temporaries itself.
"""
from collections import namedtuple
import ctypes
import functools
import hashlib
import math

import numpy as np

from cgru.core.cells import Cell
from cgru.core.engine import backward, forward, reserve_nbytes
from cgru.core.network import LayerParams, Params, Topology

# cgru_status_t (include/cgru.h)
SUCCESS = 0
BAD_PARAM = 1
NOT_SUPPORTED = 2
ALLOC_FAILED = 3
INTERNAL_ERROR = 4
RUNTIME_UNAVAILABLE = 5
BUFFER_TOO_SMALL = 6

_DTYPES = {0: np.dtype(np.float32), 1: np.dtype(np.float64)}
_DATA_HALF = 2
_DIRECTIONS = {0: "forward", 1: "bidirectional", 2: "reverse"}
_INPUT_MODES = {0: "linear", 1: "skip"}
_FWD_MODES = {0: False, 1: True}            # CGRU_FWD_MODE_INFERENCE / _TRAINING -> training
_LAYOUTS = {0: False, 1: True}              # CGRU_LAYOUT_TIME_MAJOR / _BATCH_MAJOR -> batch_major
_WGRAD_MODES = {0: "add", 1: "set"}

_MAGIC = 0x49424143_75726763  # "cgruCABI"
_VERSION = 1
_ALIGN = 64
_HEADER_BYTES = 64
_STATE_FORWARD = 1
_STATE_BACKWARD_DATA = 2
_MAX_BYTES = 2 ** 62


class _Fail(Exception):
    """A documented failure: its status and message go back to the C caller."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def _entry(fn):
    """Turn ``fn``'s result or exception into ``(status, message, *values)``."""
    @functools.wraps(fn)
    def wrapper(*args):
        try:
            values = fn(*args)
        except _Fail as e:
            return (e.status, e.message)
        except NotImplementedError as e:
            return (NOT_SUPPORTED, str(e))
        except MemoryError as e:
            return (ALLOC_FAILED, f"out of memory ({e})" if str(e) else "out of memory")
        except ValueError as e:
            return (BAD_PARAM, str(e))
        except Exception as e:  # a bug in cgru: say where
            return (INTERNAL_ERROR, f"{type(e).__name__}: {e} (in cgru.capi.{fn.__name__}; "
                                    f"please report)")
        return (SUCCESS, "") + tuple(int(v) for v in values)
    return wrapper


# --- the descriptor ------------------------------------------------------------------------
_Model = namedtuple("_Model", "desc topo dtype cell dropout seed seed2 num_threads")


def _enum(value, table, what, names):
    if value not in table:
        raise _Fail(BAD_PARAM, f"{what}: unknown value {value}; expected {names}")
    return table[value]


def _model(desc):
    """The descriptor tuple (see capi.c DESC_FORMAT) as topology, dtype, cell and options."""
    (data_type, input_size, hidden_size, num_layers, direction, input_mode, reset_after,
     num_threads, dropout, seed, seed2) = desc
    if data_type == _DATA_HALF:
        raise _Fail(NOT_SUPPORTED, "desc->data_type: CGRU_DATA_HALF is not supported; use "
                                   "CGRU_DATA_FLOAT or CGRU_DATA_DOUBLE")
    dtype = _enum(data_type, _DTYPES, "desc->data_type",
                  "CGRU_DATA_FLOAT (0) or CGRU_DATA_DOUBLE (1)")
    for what, v in (("desc->input_size", input_size), ("desc->hidden_size", hidden_size),
                    ("desc->num_layers", num_layers)):
        if v < 1:
            raise _Fail(BAD_PARAM, f"{what}: expected ≥ 1, got {v}")
    direction = _enum(direction, _DIRECTIONS, "desc->direction",
                      "CGRU_UNIDIRECTIONAL (0), CGRU_BIDIRECTIONAL (1) or CGRU_REVERSE (2)")
    input_mode = _enum(input_mode, _INPUT_MODES, "desc->input_mode",
                       "CGRU_LINEAR_INPUT (0) or CGRU_SKIP_INPUT (1)")
    if input_mode == "skip" and input_size != hidden_size:
        raise _Fail(BAD_PARAM, f"desc->input_size: CGRU_SKIP_INPUT needs input_size == "
                               f"hidden_size, got input_size={input_size}, "
                               f"hidden_size={hidden_size}")
    if reset_after not in (0, 1):
        raise _Fail(BAD_PARAM, f"desc->reset_after: expected 0 or 1, got {reset_after}")
    if num_threads < 0:
        raise _Fail(BAD_PARAM, f"desc->num_threads: expected ≥ 0 (0: all usable cores), got "
                               f"{num_threads}")
    if not (math.isfinite(dropout) and 0.0 <= dropout < 1.0):
        raise _Fail(BAD_PARAM, f"desc->dropout: expected a probability in [0, 1), got {dropout}")
    topo = Topology(input_size, hidden_size, num_layers, direction, input_mode)
    return _Model(desc, topo, dtype, Cell(reset_after=bool(reset_after)), dropout, seed, seed2,
                  num_threads or None)


def _dims(T, N):
    if T < 1:
        raise _Fail(BAD_PARAM, f"max_seq_length: expected T ≥ 1, got {T}")
    if N < 1:
        raise _Fail(BAD_PARAM, f"batch_size: expected N ≥ 1, got {N}")
    return T, N


def _up(nbytes):
    return -(-nbytes // _ALIGN) * _ALIGN


def _checked_size(nbytes, what):
    if nbytes >= _MAX_BYTES:
        raise _Fail(NOT_SUPPORTED, f"{what}: {nbytes} bytes exceeds what cgru supports (2^62)")
    return nbytes


def _weight_bytes(m):
    return _checked_size(m.topo.flat_size() * m.dtype.itemsize, "the weight space")


_Plan = namedtuple("_Plan", "engine engine_bytes x x_bytes dw dw_bytes total")


def _plan(m, T, N):
    """Byte offsets and sizes of the C ABI reserve space (module docstring)."""
    engine_bytes = reserve_nbytes(m.topo, T, N, cell=m.cell, dtype=m.dtype)
    x_bytes = T * N * m.topo.input_size * m.dtype.itemsize
    dw_bytes = _weight_bytes(m)
    engine = _HEADER_BYTES
    x = engine + _up(engine_bytes)
    dw = x + _up(x_bytes)
    total = _checked_size(dw + _up(dw_bytes), "the reserve space")
    return _Plan(engine, engine_bytes, x, x_bytes, dw, dw_bytes, total)


# --- the caller's buffers ------------------------------------------------------------------
def _shape_text(names, shape):
    return "[" + ", ".join(f"{n}={s}" for n, s in zip(names, shape)) + "]"


def _bytes_at(addr, nbytes):
    """The caller's ``nbytes`` bytes at ``addr`` as a writable uint8 array (no copy)."""
    return np.frombuffer((ctypes.c_char * nbytes).from_address(addr), np.uint8)


def _array(addr, what, names, shape, dtype, *, writable, optional=False):
    """The caller's buffer as an array of ``shape`` (``None`` for an allowed NULL)."""
    if addr == 0:
        if optional:
            return None
        raise _Fail(BAD_PARAM, f"{what}: NULL; expected a pointer to "
                               f"{_shape_text(names, shape)} {dtype.name} values")
    if addr % dtype.itemsize:
        raise _Fail(BAD_PARAM, f"{what}: address {addr:#x} is not aligned to "
                               f"{dtype.itemsize} bytes ({dtype.name})")
    a = _bytes_at(addr, int(np.prod(shape)) * dtype.itemsize).view(dtype).reshape(shape)
    if not writable:
        a.flags.writeable = False
    return a


def _space(size, addr, need, what, size_name, query):
    """A caller-sized buffer (weight, reserve space) as uint8, after checking NULL and size."""
    if addr == 0:
        raise _Fail(BAD_PARAM, f"{what}: NULL; expected a buffer of {need} bytes ({query})")
    if size < need:
        raise _Fail(BUFFER_TOO_SMALL, f"{size_name}: {size} bytes is too small; {what} needs "
                                      f"{need} bytes ({query})")
    if addr % 8:
        raise _Fail(BAD_PARAM, f"{what}: address {addr:#x} is not aligned to 8 bytes")
    return _bytes_at(addr, need)


def _params_view(m, space, writable):
    """``Params`` whose arrays are views of a weight space (opaque layout, no copy).

    In the opaque layout the three gate matrices of one kind are adjacent, so ``W`` [3H, in],
    ``R`` [3H, H], ``b_W`` [3H] and ``b_R`` [3H] of each pseudo-layer are contiguous blocks.
    """
    topo = m.topo
    flat = space[:_weight_bytes(m)].view(m.dtype)
    flat.flags.writeable = writable
    H = topo.hidden_size
    layers, pos = [], 0
    for i in range(topo.num_layer_directions):
        rows, cols = topo.shapes(i)["W"]
        W = flat[pos:pos + rows * cols].reshape(rows, cols)
        pos += W.size
        R = flat[pos:pos + 3 * H * H].reshape(3 * H, H)
        pos += R.size
        layers.append([W, R])
    for i in range(topo.num_layer_directions):
        layers[i].append(flat[pos:pos + 3 * H])
        layers[i].append(flat[pos + 3 * H:pos + 6 * H])
        pos += 6 * H
    return Params(topo, [LayerParams(*lp) for lp in layers])


def _lengths(addr, T, N):
    """``seq_lengths`` (int32 [N]) as int64, or None for NULL (every length T)."""
    if addr == 0:
        return None
    if addr % 4:
        raise _Fail(BAD_PARAM, f"seq_lengths: address {addr:#x} is not aligned to 4 bytes")
    lengths = _bytes_at(addr, 4 * N).view(np.int32).astype(np.int64)
    bad = np.flatnonzero((lengths < 0) | (lengths > T))
    if bad.size:
        b = int(bad[0])
        raise _Fail(BAD_PARAM, f"seq_lengths[{b}]: {lengths[b]} is outside [0, "
                               f"max_seq_length={T}]")
    return lengths


def _fingerprint(m, batch_major, T, N, lengths):
    """63-bit digest of what a forward/backward sequence must share."""
    h = hashlib.blake2b(repr((m.desc, bool(batch_major), T, N)).encode(), digest_size=8)
    h.update(b"all" if lengths is None else lengths.tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


# --- size queries --------------------------------------------------------------------------
@_entry
def weight_space_size(desc):
    return (_weight_bytes(_model(desc)),)


@_entry
def temp_space_sizes(desc, fwd_mode, T, N):
    m = _model(desc)
    training = _enum(fwd_mode, _FWD_MODES, "fwd_mode",
                     "CGRU_FWD_MODE_INFERENCE (0) or CGRU_FWD_MODE_TRAINING (1)")
    T, N = _dims(T, N)
    return (0, _plan(m, T, N).total if training else 0)


@_entry
def weight_params(desc, pseudo_layer, size, addr, lin_layer_id):
    m = _model(desc)
    topo, item = m.topo, m.dtype.itemsize
    LD = topo.num_layer_directions
    if not 0 <= pseudo_layer < LD:
        raise _Fail(BAD_PARAM, f"pseudo_layer: {pseudo_layer} is outside [0, L·D−1 = {LD - 1}]")
    if not 0 <= lin_layer_id < 6:
        raise _Fail(BAD_PARAM, f"lin_layer_id: {lin_layer_id} is outside [0, 5] (0…2 W_r W_z "
                               f"W_n, 3…5 R_r R_z R_n)")
    _space(size, addr, _weight_bytes(m), "weight_space", "weight_space_size",
           "cgru_get_weight_space_size")
    H = topo.hidden_size
    # matrices: pseudo-layers in order, each W [3H, width] then R [3H, H]
    m_off = 0
    for i in range(pseudo_layer):
        m_off += 3 * H * (topo.shapes(i)["W"][1] + H)
    width = topo.shapes(pseudo_layer)["W"][1]
    if lin_layer_id < 3:
        m_off += lin_layer_id * H * width
        cols = width
    else:
        m_off += 3 * H * width + (lin_layer_id - 3) * H * H
        cols = H
    n_matrices = sum(3 * H * (topo.shapes(i)["W"][1] + H) for i in range(LD))
    b_off = n_matrices + (pseudo_layer * 6 + lin_layer_id) * H
    stored = cols > 0
    return (stored, m_off * item, H, cols, b_off * item, H)


# --- forward and backward ------------------------------------------------------------------
def _common(desc, layout, T, N, seq_lengths):
    """What every compute call validates first: (model, batch_major, T, N, lengths).

    (The workspace arguments are not checked: cgru needs none, its size query returns 0.)"""
    m = _model(desc)
    batch_major = _enum(layout, _LAYOUTS, "layout",
                        "CGRU_LAYOUT_TIME_MAJOR (0) or CGRU_LAYOUT_BATCH_MAJOR (1)")
    T, N = _dims(T, N)
    return m, batch_major, T, N, _lengths(seq_lengths, T, N)


def _seq_shapes(m, batch_major, T, N):
    """((names, shape) of x, of y, of the states)."""
    I, DH = m.topo.input_size, m.topo.output_size
    LD, H = m.topo.num_layer_directions, m.topo.hidden_size
    if batch_major:
        xs, ys = (("N", "T", "I"), (N, T, I)), (("N", "T", "D·H"), (N, T, DH))
    else:
        xs, ys = (("T", "N", "I"), (T, N, I)), (("T", "N", "D·H"), (T, N, DH))
    return xs, ys, (("L·D", "N", "H"), (LD, N, H))


def _reserve_header(space):
    return space[:_HEADER_BYTES].view(np.int64)


def _open_reserve(plan, space, fingerprint, need_state, caller):
    """Check a reserve space written by a matching training forward (and backward_data)."""
    head = _reserve_header(space)
    if (head[0] != _MAGIC or head[1] != _VERSION
            or head[2] not in (_STATE_FORWARD, _STATE_BACKWARD_DATA)
            or list(head[4:8]) != [plan.engine, plan.x, plan.dw, plan.total]):
        raise _Fail(BAD_PARAM, "reserve_space: not written by a training cgru_rnn_forward "
                               "(bad header); pass the reserve space of the training forward")
    if head[3] != fingerprint:
        raise _Fail(BAD_PARAM, f"reserve_space: written by a forward with a different "
                               f"descriptor, layout, max_seq_length, batch_size or seq_lengths "
                               f"than this {caller} call")
    if head[2] < need_state:
        raise _Fail(BAD_PARAM, "reserve_space: cgru_rnn_backward_data has not run on this "
                               "reserve space; call it before cgru_rnn_backward_weights (as "
                               "in cuDNN v8)")
    return head


@_entry
def rnn_forward(desc, fwd_mode, layout, T, N, seq_lengths, x, y, hx, hy, ws_size, ws,
                work_size, work, reserve_size, reserve):
    training = _enum(fwd_mode, _FWD_MODES, "fwd_mode",
                     "CGRU_FWD_MODE_INFERENCE (0) or CGRU_FWD_MODE_TRAINING (1)")
    m, batch_major, T, N, lengths = _common(desc, layout, T, N, seq_lengths)
    params = _params_view(m, _space(ws_size, ws, _weight_bytes(m), "weight_space",
                                    "weight_space_size", "cgru_get_weight_space_size"), False)
    plan = _plan(m, T, N) if training else None
    space = None
    if training:
        space = _space(reserve_size, reserve, plan.total, "reserve_space", "reserve_space_size",
                       "cgru_get_temp_space_sizes with CGRU_FWD_MODE_TRAINING")
    xs, ys, hs = _seq_shapes(m, batch_major, T, N)
    xa = _array(x, "x", *xs, m.dtype, writable=False)
    ya = _array(y, "y", *ys, m.dtype, writable=True)
    h0 = _array(hx, "hx", *hs, m.dtype, writable=False, optional=True)
    hya = _array(hy, "hy", *hs, m.dtype, writable=True, optional=True)

    f = forward(params, xa, h0, cell=m.cell, lengths=lengths, batch_major=batch_major,
                training=training, dropout=m.dropout, seed=(m.seed, m.seed2),
                num_threads=m.num_threads)
    ya[...] = f.y
    if hya is not None:
        hya[...] = f.hy
    if training:
        head = _reserve_header(space)
        head[:] = [_MAGIC, _VERSION, _STATE_FORWARD,
                   _fingerprint(m, batch_major, T, N, lengths), plan.engine, plan.x, plan.dw,
                   plan.total]
        space[plan.engine:plan.engine + plan.engine_bytes] = f.reserve
        space[plan.x:plan.x + plan.x_bytes] = xa.reshape(-1).view(np.uint8)
    return ()


@_entry
def rnn_backward_data(desc, layout, T, N, seq_lengths, dy, dx, dhy, dhx, ws_size, ws,
                      work_size, work, reserve_size, reserve):
    m, batch_major, T, N, lengths = _common(desc, layout, T, N, seq_lengths)
    params = _params_view(m, _space(ws_size, ws, _weight_bytes(m), "weight_space",
                                    "weight_space_size", "cgru_get_weight_space_size"), False)
    plan = _plan(m, T, N)
    space = _space(reserve_size, reserve, plan.total, "reserve_space", "reserve_space_size",
                   "cgru_get_temp_space_sizes with CGRU_FWD_MODE_TRAINING")
    head = _open_reserve(plan, space, _fingerprint(m, batch_major, T, N, lengths),
                         _STATE_FORWARD, "cgru_rnn_backward_data")
    xs, ys, hs = _seq_shapes(m, batch_major, T, N)
    dya = _array(dy, "dy", *ys, m.dtype, writable=False, optional=True)
    dxa = _array(dx, "dx", *xs, m.dtype, writable=True)
    dhya = _array(dhy, "dhy", *hs, m.dtype, writable=False, optional=True)
    dhxa = _array(dhx, "dhx", *hs, m.dtype, writable=True, optional=True)

    x_saved = space[plan.x:plan.x + plan.x_bytes].view(m.dtype).reshape(xs[1])
    engine_reserve = space[plan.engine:plan.engine + plan.engine_bytes]
    dparams = _params_view(m, space[plan.dw:plan.dw + plan.dw_bytes], True)
    head[2] = _STATE_FORWARD  # dw is being rewritten: not valid until this call succeeds
    g = backward(params, x_saved, engine_reserve, dya, dhya, cell=m.cell, batch_major=batch_major,
                 dparams=dparams, accumulate=False, num_threads=m.num_threads)
    dxa[...] = g.dx
    if dhxa is not None:
        dhxa[...] = g.dh0
    head[2] = _STATE_BACKWARD_DATA
    return ()


@_entry
def rnn_backward_weights(desc, wgrad_mode, layout, T, N, seq_lengths, dws_size, dws,
                         work_size, work, reserve_size, reserve):
    mode = _enum(wgrad_mode, _WGRAD_MODES, "wgrad_mode",
                 "CGRU_WGRAD_MODE_ADD (0) or CGRU_WGRAD_MODE_SET (1)")
    m, batch_major, T, N, lengths = _common(desc, layout, T, N, seq_lengths)
    nbytes = _weight_bytes(m)
    dw_out = _space(dws_size, dws, nbytes, "dweight_space", "weight_space_size",
                    "cgru_get_weight_space_size").view(m.dtype)
    plan = _plan(m, T, N)
    space = _space(reserve_size, reserve, plan.total, "reserve_space", "reserve_space_size",
                   "cgru_get_temp_space_sizes with CGRU_FWD_MODE_TRAINING")
    _open_reserve(plan, space, _fingerprint(m, batch_major, T, N, lengths),
                  _STATE_BACKWARD_DATA, "cgru_rnn_backward_weights")
    dw = space[plan.dw:plan.dw + plan.dw_bytes].view(m.dtype)
    if mode == "add":
        dw_out += dw
    else:
        dw_out[...] = dw
    return ()
