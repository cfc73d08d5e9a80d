"""The Python half of cgru's C ABI (``include/cgru.h``): libcgru's entry points call these.

libcgru (``cgru/capi/*.c``) runs on the embedded Python runtime of the environment where cgru
is installed.  Each of its entry points checks the descriptor pointer, then calls the function
of the same name here with every C argument as a Python number (pointers as integer addresses,
0 for NULL; the descriptor as the tuple ``_model`` unpacks).  These functions validate the
arguments, wrap the caller's buffers as NumPy arrays without copying, and run the engine on
the checked call (``engine.run_forward`` / ``run_backward``), which writes every result
straight into the caller's buffers — ``y``, ``hy``, ``cy``, ``dx``, ``dhx``, ``dcx`` and the
engine's reserve inside the reserve space — and carves its temporaries from ``work_space``.
They never raise: they return ``(status, message, *values)`` with the header's status codes;
the message becomes the calling C thread's ``cgru_get_last_error_message()``.

The C ABI reserve space (training), carved by ``_plan`` (regions 64-byte aligned)::

    header   int64[32]   0 magic, 1 version, 2 state (1: forward done, 2: backward_data done),
                         3 zero, 4…7 region offsets (engine, x, dw, total),
                         8…23 the forward's arguments the backward calls must repeat
                         (``_RECORDED``: the descriptor but desc->num_threads, layout, T, N and
                         a MAC of seq_lengths), so that a mismatch is named;
                         30 the MAC of dw (once backward_data has written it), 31 the MAC of
                         slots 0…30 — a header changed after the call that wrote it (its state,
                         say, or dw) is refused (the engine's reserve binds the rest)
    engine   uint8[E]    the engine's reserve (E = cgru.reserve_nbytes), written in place by
                         the forward (slot 0 is cleared first: a forward that fails leaves the
                         space refused)
    x        [T·N·I]     a copy of the forward's x, as given (either layout)
    dw       [weights]   the weight gradients backward_data computed (weight-space layout)

``cgru_rnn_backward_data`` runs the whole engine backward (x from the copy, the weight gradients
into ``dw``); ``cgru_rnn_backward_weights`` adds ``dw`` to the dweight space or copies it there.

The workspace (cuDNN's contract): the size query reports the bytes of the engine's workspace
for the largest call of the sequence (``engine.workspace_nbytes``: the forward and, in training,
the backward), and a forward or backward_data with that many bytes carves all its temporaries
— input projections, gate gradients, the time loops' scratch, the products' partial sums —
from the caller's block (at any address).  ``work_space`` NULL or ``work_space_size`` 0
(what callers of ABI 0.1, whose query reported 0, pass) still works: the engine then takes its
temporaries from its own pool.

The cell mode (``desc->cell_mode``: cuDNN's GRU, LSTM — with ``desc->proj_size`` —, RNN_TANH,
RNN_RELU) picks the network's cell; the LSTM's cell states travel in cx/cy/dcy/dcx.

Bounds.  The size queries and the compute calls apply the same ones (``_model``, ``_bounds``):
T·N and G·H within the kernels' 32-bit BLAS ints, L·D pseudo-layers within int32 (the C ABI's
indices), every buffer below 2^62 bytes.  Sizes and offsets are closed forms (no loop over the
layers), so a query on any descriptor answers at once.
"""
import collections
from collections import namedtuple
import ctypes
import functools
import math
import os
import struct
import threading

import numpy as np

from cgru.core.cells import GRUCell, LSTMCell, RNNCell
from cgru.core.calls import BackwardCall, ForwardCall
from cgru.core.engine import (reserve_nbytes, repeat, run_backward, run_forward,
                              workspace_nbytes)
from cgru.core.network import LayerParams, Network, Topology
from cgru.core import reserve as _reserve
from cgru._kernels.threads import MAX_THREADS

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
# cgru_cell_mode_t: cuDNN's cudnnRNNMode_t numbers
_CELL_MODES = {0: "rnn_relu", 1: "rnn_tanh", 2: "lstm", 3: "gru"}
_CELL_MODE_NAMES = ("CGRU_RNN_RELU (0), CGRU_RNN_TANH (1), CGRU_LSTM (2) or CGRU_GRU (3)")

_MAGIC = 0x49424143_75726763  # "cgruCABI"
_VERSION = 4                  # 4: slots 30, 31 seal dw and the header (keyed MACs)
_ALIGN = 64
_HEADER_SLOTS = 32
_HEADER_BYTES = 8 * _HEADER_SLOTS
_RECORD_SLOT = 8
_STATE_FORWARD = 1
_STATE_BACKWARD_DATA = 2
_DW_MAC_SLOT, _SEAL_SLOT = 30, 31
_MAX_BYTES = 2 ** 62
_INT_MAX = 2 ** 31 - 1        # the kernels' BLAS ints, the C ABI's int32 indices


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


_MODELS = {}         # descriptor (with dropout's exact value) -> _Model, of the latest calls
_MODELS_KEPT = 64


def _model(desc):
    """The descriptor tuple (see capi.c DESC_FORMAT) as topology, dtype, cell and options —
    made once per descriptor value (compared whole, the dropout by its exact value: 0.0 and
    −0.0 are two), as the same descriptor comes with every call of a host."""
    key = (desc, repr(desc[8]))
    m = _MODELS.get(key)
    if m is None:
        m = _make_model(desc)
        if len(_MODELS) >= _MODELS_KEPT:
            _MODELS.clear()
        _MODELS[key] = m
    return m


def _make_model(desc):
    (data_type, input_size, hidden_size, num_layers, direction, input_mode, reset_after,
     num_threads, dropout, seed, seed2, cell_mode, proj_size) = desc
    if data_type == _DATA_HALF:
        raise _Fail(NOT_SUPPORTED, "desc->data_type: CGRU_DATA_HALF is not supported; use "
                                   "CGRU_DATA_FLOAT or CGRU_DATA_DOUBLE")
    dtype = _enum(data_type, _DTYPES, "desc->data_type",
                  "CGRU_DATA_FLOAT (0) or CGRU_DATA_DOUBLE (1)")
    mode = _enum(cell_mode, _CELL_MODES, "desc->cell_mode", _CELL_MODE_NAMES)
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
    if proj_size != 0 and mode != "lstm":
        raise _Fail(BAD_PARAM, f"desc->proj_size: a recurrent projection exists for "
                               f"CGRU_LSTM only, got proj_size={proj_size} with cell_mode "
                               f"{cell_mode}")
    if not 0 <= proj_size <= hidden_size:
        raise _Fail(BAD_PARAM, f"desc->proj_size: expected 0 (none) or 1…hidden_size="
                               f"{hidden_size}, got {proj_size}")
    if not 0 <= num_threads <= MAX_THREADS:
        raise _Fail(BAD_PARAM, f"desc->num_threads: expected 0 (all usable cores) or "
                               f"1…{MAX_THREADS}, got {num_threads}")
    if not (math.isfinite(dropout) and 0.0 <= dropout < 1.0):
        raise _Fail(BAD_PARAM, f"desc->dropout: expected a probability in [0, 1), got {dropout}")
    cell = (GRUCell(reset_after=bool(reset_after)) if mode == "gru" else
            LSTMCell() if mode == "lstm" else RNNCell(mode[4:]))
    G = cell.gates
    if G * hidden_size > _INT_MAX:
        raise _Fail(BAD_PARAM, f"desc->hidden_size: {G}H = {G * hidden_size} exceeds the 32-bit "
                               f"BLAS limit {_INT_MAX} of cgru's kernels; expected hidden_size "
                               f"≤ {_INT_MAX // G}, got {hidden_size}")
    D = 2 if direction == "bidirectional" else 1
    if num_layers * D > _INT_MAX:
        raise _Fail(BAD_PARAM, f"desc->num_layers: L·D = {num_layers * D} pseudo-layers exceeds "
                               f"{_INT_MAX} (pseudo-layer indices are int32); expected "
                               f"num_layers ≤ {_INT_MAX // D} with D = {D}, got {num_layers}")
    topo = Topology(input_size, hidden_size, num_layers, direction, input_mode,
                    proj_size=proj_size)
    return _Model(desc, topo, dtype, cell, dropout, seed, seed2, num_threads or None)


def _dims(T, N):
    if T < 1:
        raise _Fail(BAD_PARAM, f"max_seq_length: expected T ≥ 1, got {T}")
    if N < 1:
        raise _Fail(BAD_PARAM, f"batch_size: expected N ≥ 1, got {N}")
    if T * N > _INT_MAX:
        raise _Fail(BAD_PARAM, f"max_seq_length, batch_size: T·N = {T}·{N} = {T * N} exceeds "
                               f"the 32-bit BLAS limit {_INT_MAX} of cgru's kernels; expected "
                               f"max_seq_length·batch_size ≤ {_INT_MAX}")
    return T, N


def _up(nbytes):
    return -(-nbytes // _ALIGN) * _ALIGN


def _checked_size(nbytes, what, buffer):
    """``nbytes`` of ``buffer`` (its description), or NOT_SUPPORTED naming ``what``, the
    arguments it follows from, when it reaches 2^62 bytes."""
    if nbytes >= _MAX_BYTES:
        raise _Fail(NOT_SUPPORTED, f"{what}: {buffer} would take {nbytes} bytes; expected less "
                                   f"than 2^62 bytes (what cgru supports)")
    return nbytes


def _bounds(m, T, N):
    """(T, N) after every bound a call on a T×N batch needs: T, N ≥ 1, T·N within 32 bits, and
    x, y and the states below 2^62 bytes.  The size queries apply exactly these (and the
    descriptor's, in ``_model``), so they refuse what the compute calls would."""
    T, N = _dims(T, N)
    topo, item = m.topo, m.dtype.itemsize
    widest = max(T * topo.input_size, T * topo.output_size, topo.num_layer_directions *
                 topo.hidden_size)
    if N * widest * item < _MAX_BYTES:          # (the usual case: no message to word)
        return T, N
    S = "desc->proj_size" if topo.proj_size else "desc->hidden_size"
    _checked_size(T * N * topo.input_size * item, "max_seq_length, batch_size, desc->input_size",
                  f"x [T·N·I = {T}·{N}·{topo.input_size}]")
    _checked_size(T * N * topo.output_size * item,
                  f"max_seq_length, batch_size, {S}, desc->direction",
                  f"y [T·N·D·S = {T}·{N}·{topo.output_size}]")
    _checked_size(topo.num_layer_directions * N * topo.hidden_size * item,
                  "batch_size, desc->num_layers, desc->direction, desc->hidden_size",
                  f"hx, hy, cx, cy [L·D·N·H = {topo.num_layer_directions}·{N}·"
                  f"{topo.hidden_size}]")
    return T, N


def _layer0_width(topo):
    """Width of layer 0's input matrices: I, or 0 with CGRU_SKIP_INPUT (not stored)."""
    return 0 if topo.input_mode == "skip" else topo.input_size


def _matrix_elements(topo, G, count):
    """Elements of the matrices of the first ``count`` pseudo-layers (include/cgru.h WEIGHT
    SPACE): the G input matrices [H, width], the G recurrent ones [H, S] and the projection
    [P, H] each, width = I (0 with skip input) for the D pseudo-layers of layer 0, D·S above.
    A closed form: no loop over the layers."""
    H, D, S, P = topo.hidden_size, topo.num_directions, topo.state_size, topo.proj_size
    first = min(count, D)
    per = G * H * S + P * H
    return first * (G * H * _layer0_width(topo) + per) + (count - first) * (G * H * D * S + per)


def _weight_elements(m):
    """Elements of the weight space: every matrix, then 2·G·H biases per pseudo-layer."""
    topo, G = m.topo, m.cell.gates
    LD = topo.num_layer_directions
    return _matrix_elements(topo, G, LD) + 2 * G * topo.hidden_size * LD


@functools.lru_cache(maxsize=_MODELS_KEPT)
def _weight_bytes(m):
    (_, input_size, hidden_size, num_layers, direction, *_, proj_size) = m.desc
    return _checked_size(_weight_elements(m) * m.dtype.itemsize,
                         f"desc (input_size {input_size}, hidden_size {hidden_size}, num_layers "
                         f"{num_layers}, direction {direction}, proj_size {proj_size})",
                         "its weight space")


_RESERVE_ARGUMENTS = "max_seq_length, batch_size, desc"


def _engine_reserve_bytes(m, T, N):
    """The engine's reserve (``cgru.reserve_nbytes``, a closed form).  Its refusal (after
    ``_model`` and ``_bounds``, only of a size) is NOT_SUPPORTED naming the C arguments."""
    try:
        return reserve_nbytes(m.topo, T, N, cell=m.cell, dtype=m.dtype)
    except ValueError as e:
        raise _Fail(NOT_SUPPORTED, f"{_RESERVE_ARGUMENTS}: the training reserve space is too "
                                   f"large for cgru ({e}); expected less than 2^62 bytes")


_Plan = namedtuple("_Plan", "engine engine_bytes x x_bytes dw dw_bytes total")


@functools.lru_cache(maxsize=_MODELS_KEPT)
def _plan(m, T, N):
    """Byte offsets and sizes of the C ABI reserve space (module docstring), once per model
    and shape (a sequence's three calls, and the next sequence's, ask for the same)."""
    engine_bytes = _engine_reserve_bytes(m, T, N)
    x_bytes = T * N * m.topo.input_size * m.dtype.itemsize
    dw_bytes = _weight_bytes(m)
    engine = _HEADER_BYTES
    x = engine + _up(engine_bytes)
    dw = x + _up(x_bytes)
    total = _checked_size(dw + _up(dw_bytes), _RESERVE_ARGUMENTS, "the training reserve space")
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
    a = _bytes_at(addr, math.prod(shape) * dtype.itemsize).view(dtype).reshape(shape)
    if not writable:
        a.flags.writeable = False
    return a


def _check_space(size, addr, need, what, size_name, query):
    """Check a caller-sized buffer (weight, reserve space): not NULL, big enough, aligned."""
    if addr == 0:
        raise _Fail(BAD_PARAM, f"{what}: NULL; expected a buffer of {need} bytes ({query})")
    if size < need:
        raise _Fail(BUFFER_TOO_SMALL, f"{size_name}: {size} bytes is too small; {what} needs "
                                      f"{need} bytes ({query})")
    if addr % 8:
        raise _Fail(BAD_PARAM, f"{what}: address {addr:#x} is not aligned to 8 bytes")


def _space(size, addr, need, what, size_name, query):
    """A caller-sized buffer (weight, reserve space) as uint8, after ``_check_space``."""
    _check_space(size, addr, need, what, size_name, query)
    return _bytes_at(addr, need)


# (address, bytes) -> (ctypes view, {model: Network over it}), newest last: the weight spaces
# (read-only) and, apart, so that a host's many reserve spaces never push a weight space out,
# the weight gradients' regions of reserve spaces (writable)
_WEIGHT_SPACES = collections.OrderedDict()
_GRADIENT_SPACES = collections.OrderedDict()
_WEIGHT_SPACES_KEPT = 8
_weight_spaces_lock = threading.Lock()


def _fresh_weight_spaces():
    """In a forked child: a new lock and no views kept (another thread of the parent may have
    held the lock at the fork, and would never release it here)."""
    global _weight_spaces_lock, _WEIGHT_SPACES, _GRADIENT_SPACES
    _weight_spaces_lock = threading.Lock()
    _WEIGHT_SPACES = collections.OrderedDict()
    _GRADIENT_SPACES = collections.OrderedDict()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_weight_spaces)


def _weights(m, size, addr):
    """The weight space (``size`` bytes at ``addr``) as the read-only ``Network`` of model ``m``
    over it (no copy): ``_network_over`` after the space's checks."""
    need = _weight_bytes(m)
    _check_space(size, addr, need, "weight_space", "weight_space_size",
                 "cgru_get_weight_space_size")
    return _network_over(m, addr, need, False)


def _network_over(m, addr, need, writable):
    """The ``need`` bytes at ``addr`` as the ``Network`` of model ``m`` (read-only or
    ``writable``) over them, with no copy: the same ctypes view object for the same address
    and size on every call (the last few kept), so that the kept copies of the weights — found
    by the owner of their memory — are found again from call to call, and over it the same
    ``Network`` object for the same model, so that what the engine keeps for a network's
    repeated calls is found again too (a gradient space is wrapped once as well).  Neither
    proves anything: every call proves the bytes it computes with, as for any network.  A
    view never outlives the call's use of it: a later call at the same address reads that
    call's memory."""
    key = (addr, need)
    with _weight_spaces_lock:
        spaces = _GRADIENT_SPACES if writable else _WEIGHT_SPACES
        entry = spaces.get(key)
        if entry is None:
            entry = ((ctypes.c_char * need).from_address(addr), {})
            spaces[key] = entry
            while len(spaces) > _WEIGHT_SPACES_KEPT:
                spaces.popitem(last=False)
        else:
            spaces.move_to_end(key)
        view, networks = entry
        net = networks.get(m)
    if net is None:
        net = _params_view(m, np.frombuffer(view, np.uint8), writable)
        with _weight_spaces_lock:
            if len(networks) >= _WEIGHT_SPACES_KEPT:
                networks.clear()
            net = networks.setdefault(m, net)
    return net


def _refuse_overlaps(buffers):
    """BAD_PARAM when a buffer the call writes overlaps any other buffer of the call.

    ``buffers``: ``(name, address, bytes, written)`` per pointer argument, in argument order
    (address 0, an omitted optional buffer, is skipped).  Buffers the call only reads may
    overlap each other.  The message names the written buffer (the later one when both are
    written) and the other."""
    live = [b for b in buffers if b[1] != 0 and b[2] > 0]
    for i, a in enumerate(live):
        for b in live[i + 1:]:
            if not (a[3] or b[3]) or a[1] >= b[1] + b[2] or b[1] >= a[1] + a[2]:
                continue
            out, other = (b, a) if b[3] else (a, b)
            lo, hi = max(a[1], b[1]), min(a[1] + a[2], b[1] + b[2])
            raise _Fail(BAD_PARAM, f"{out[0]}: overlaps {other[0]} ({hi - lo} bytes in common, "
                                   f"[{lo:#x}, {hi:#x})); expected a buffer the call writes to "
                                   f"be apart from every other buffer of the call")


def _params_view(m, space, writable):
    """The ``Network`` whose arrays are views of a weight space (opaque layout, no copy).

    In the opaque layout the G gate matrices of one kind are adjacent, so ``W`` [G·H, in],
    ``R`` [G·H, S], the projection ``W_p`` [P, H], ``b_W`` [G·H] and ``b_R`` [G·H] of each
    pseudo-layer are contiguous blocks.
    """
    flat = space[:_weight_bytes(m)].view(m.dtype)
    flat.flags.writeable = writable
    return Network.from_flat(m.topo, flat, cell=m.cell, copy=False)


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


# What a training forward records in its reserve space (header slots 8…) and the backward
# calls must repeat, by the name messages give it.  Not desc->num_threads: results are the
# same for every thread count, so the calls of one sequence may use different ones.  (The
# binding to the data — the weights, and x, which the reserve space keeps a copy of — is the
# engine reserve's own: cgru.core.reserve.)
_RECORDED = ("desc->data_type", "desc->input_size", "desc->hidden_size", "desc->num_layers",
             "desc->direction", "desc->input_mode", "desc->reset_after", "desc->dropout",
             "desc->seed", "desc->seed2", "desc->cell_mode", "desc->proj_size", "layout",
             "max_seq_length", "batch_size", "seq_lengths")


def _record(m, batch_major, T, N, lengths):
    """The int64 values of ``_RECORDED`` for a call (dropout as its float64 bits, seq_lengths
    as their keyed MAC; desc->reset_after counts for GRUs only)."""
    (data_type, input_size, hidden_size, num_layers, direction, input_mode, reset_after,
     _num_threads, dropout, seed, seed2, cell_mode, proj_size) = m.desc
    dropout_bits = struct.unpack("<q", struct.pack("<d", dropout))[0]
    lengths_digest = 0 if lengths is None else _reserve.data_mac(b"seq_lengths", lengths)
    if m.cell.kind != "gru":
        reset_after = 0
    return [data_type, input_size, hidden_size, num_layers, direction, input_mode, reset_after,
            dropout_bits, seed, seed2, cell_mode, proj_size, int(bool(batch_major)), T, N,
            lengths_digest]


def _recorded_text(name, value):
    if name == "desc->dropout":
        return repr(struct.unpack("<d", struct.pack("<q", value))[0])
    return str(value)


# --- size queries --------------------------------------------------------------------------
@_entry
def weight_space_size(desc):
    return (_weight_bytes(_model(desc)),)


@_entry
def temp_space_sizes(desc, fwd_mode, T, N):
    m = _model(desc)
    training = _enum(fwd_mode, _FWD_MODES, "fwd_mode",
                     "CGRU_FWD_MODE_INFERENCE (0) or CGRU_FWD_MODE_TRAINING (1)")
    T, N = _bounds(m, T, N)
    _weight_bytes(m)           # refused by every compute call: refused here too
    return (_work_bytes(m, T, N, training), _plan(m, T, N).total if training else 0)


@_entry
def weight_params(desc, pseudo_layer, size, addr, lin_layer_id):
    m = _model(desc)
    topo, item, G = m.topo, m.dtype.itemsize, m.cell.gates
    LD = topo.num_layer_directions
    if not 0 <= pseudo_layer < LD:
        raise _Fail(BAD_PARAM, f"pseudo_layer: {pseudo_layer} is outside [0, L·D−1 = {LD - 1}]")
    last = 2 * G if topo.proj_size else 2 * G - 1
    if not 0 <= lin_layer_id <= last:
        ids = {"gru": "0…2 W_r W_z W_n, 3…5 R_r R_z R_n",
               "lstm": "0…3 W_i W_f W_g W_o, 4…7 R_i R_f R_g R_o" +
                       (", 8 the projection W_p" if topo.proj_size else ""),
               "rnn": "0 W, 1 R"}[m.cell.kind]
        raise _Fail(BAD_PARAM, f"lin_layer_id: {lin_layer_id} is outside [0, {last}] ({ids})")
    _check_space(size, addr, _weight_bytes(m), "weight_space", "weight_space_size",
                 "cgru_get_weight_space_size")
    H, D, S, P = topo.hidden_size, topo.num_directions, topo.state_size, topo.proj_size
    # matrices: pseudo-layers in order, each W [G·H, width], R [G·H, S], W_p [P, H]
    m_off = _matrix_elements(topo, G, pseudo_layer)
    width = _layer0_width(topo) if pseudo_layer < D else D * S
    if lin_layer_id == 2 * G:                           # the projection: no bias
        return (1, (m_off + G * H * (width + S)) * item, P, H, -1, 0)
    if lin_layer_id < G:
        m_off += lin_layer_id * H * width
        cols = width
    else:
        m_off += G * H * width + (lin_layer_id - G) * H * S
        cols = S
    b_off = _matrix_elements(topo, G, LD) + (pseudo_layer * 2 * G + lin_layer_id) * H
    stored = cols > 0
    return (stored, m_off * item, H, cols, b_off * item, H)


# --- forward and backward ------------------------------------------------------------------
@functools.lru_cache(maxsize=_MODELS_KEPT)
def _work_bytes(m, T, N, training):
    """The workspace bytes of a sequence's calls (``cgru_get_temp_space_sizes``), once per
    model, shape and mode."""
    return workspace_nbytes(m.topo, m.cell, m.dtype, T, N, training)


def _workspace(m, T, N, training, size, addr):
    """The caller's workspace as uint8 (no copy), or ``None`` when ``work_space`` is NULL or
    ``work_space_size`` 0 (the engine then uses its own pool: callers of ABI 0.1, whose query
    returned 0, pass NULL with the size the query now returns)."""
    if size == 0 or addr == 0:
        return None
    need = _work_bytes(m, T, N, training)
    if size < need:
        raise _Fail(BUFFER_TOO_SMALL, f"work_space_size: {size} bytes is too small; work_space "
                                      f"needs {need} bytes (cgru_get_temp_space_sizes), or pass "
                                      f"0 to let cgru allocate it")
    return _bytes_at(addr, need)


def _common(desc, layout, T, N, seq_lengths):
    """What every compute call validates first: (model, batch_major, T, N, lengths)."""
    m = _model(desc)
    batch_major = _enum(layout, _LAYOUTS, "layout",
                        "CGRU_LAYOUT_TIME_MAJOR (0) or CGRU_LAYOUT_BATCH_MAJOR (1)")
    T, N = _bounds(m, T, N)
    return m, batch_major, T, N, _lengths(seq_lengths, T, N)


def _nbytes(a):
    return 0 if a is None else a.nbytes


def _seq_shapes(m, batch_major, T, N):
    """((names, shape) of x, of y, of the states h, of the cell states c)."""
    topo = m.topo
    I, DS = topo.input_size, topo.output_size
    LD, H, S = topo.num_layer_directions, topo.hidden_size, topo.state_size
    s_name = "P" if topo.proj_size else "H"
    if batch_major:
        xs, ys = (("N", "T", "I"), (N, T, I)), (("N", "T", f"D·{s_name}"), (N, T, DS))
    else:
        xs, ys = (("T", "N", "I"), (T, N, I)), (("T", "N", f"D·{s_name}"), (T, N, DS))
    return xs, ys, (("L·D", "N", s_name), (LD, N, S)), (("L·D", "N", "H"), (LD, N, H))


def _cell_states(m, addr, what, cs, writable):
    """cx / cy / dcy / dcx: the caller's optional buffer for an LSTM; NULL for the others."""
    if not m.cell.has_cell_state:
        if addr:
            raise _Fail(BAD_PARAM, f"{what}: expected NULL: only CGRU_LSTM has a cell state")
        return None
    return _array(addr, what, *cs, m.dtype, writable=writable, optional=True)


def _reserve_header(space):
    return space[:_HEADER_BYTES].view(np.int64)


def _seal(head):
    """The keyed MAC of header slots 0…30 (process-keyed, as the engine reserve's)."""
    return _reserve.mac(b"capi-reserve", head[:_SEAL_SLOT].tobytes())


def _dw_mac(space, plan, dtype):
    return _reserve.data_mac(b"capi-dw", space[plan.dw:plan.dw + plan.dw_bytes].view(dtype))


_RESERVE_QUERY = "cgru_get_temp_space_sizes with CGRU_FWD_MODE_TRAINING"


def _open_reserve(m, batch_major, T, N, lengths, size, addr, need_state, caller):
    """The reserve space of this sequence's training forward: ``(plan, space, header)``.

    Checked in this order, so that each mistake gets its own message: NULL, room for the
    header and alignment; magic, then version; then the forward's recorded arguments (a
    descriptor differing in anything but num_threads, another layout, T, N or seq_lengths:
    named, even when it changes the reserve's size); then the size; then the region offsets;
    then the state (backward_data done, for backward_weights)."""
    plan = _plan(m, T, N)
    if addr == 0:
        raise _Fail(BAD_PARAM, f"reserve_space: NULL; expected the reserve space of the "
                               f"training cgru_rnn_forward ({plan.total} bytes, "
                               f"{_RESERVE_QUERY})")
    if size < _HEADER_BYTES:
        raise _Fail(BUFFER_TOO_SMALL, f"reserve_space_size: {size} bytes is too small; "
                                      f"reserve_space needs {plan.total} bytes "
                                      f"({_RESERVE_QUERY})")
    if addr % 8:
        raise _Fail(BAD_PARAM, f"reserve_space: address {addr:#x} is not aligned to 8 bytes")
    head = _bytes_at(addr, _HEADER_BYTES).view(np.int64)
    if head[0] != _MAGIC:
        raise _Fail(BAD_PARAM, "reserve_space: not written by a training cgru_rnn_forward "
                               "(bad header); pass the reserve space of the training forward")
    if head[1] != _VERSION:
        raise _Fail(BAD_PARAM, f"reserve_space: written by a training forward of another cgru "
                               f"version (reserve format version {head[1]}, expected "
                               f"{_VERSION}); run the forward with this libcgru")
    if head[_SEAL_SLOT] != _seal(head):
        raise _Fail(BAD_PARAM, "reserve_space: its header does not verify: changed after the "
                               "call that wrote it, or written in another process (a reserve "
                               "space is valid in the process that made it and its forked "
                               "children); pass the reserve space of this sequence's forward")
    record = _record(m, batch_major, T, N, lengths)
    stored = [int(v) for v in head[_RECORD_SLOT:_RECORD_SLOT + len(record)]]
    if stored != record:
        differ = [f"{name} (the forward's {_recorded_text(name, a)}, this call's "
                  f"{_recorded_text(name, b)})" if name != "seq_lengths" else
                  "seq_lengths (other values)"
                  for name, a, b in zip(_RECORDED, stored, record) if a != b]
        raise _Fail(BAD_PARAM, f"reserve_space: written by a training forward with a different "
                               f"{' and '.join(differ)} than this {caller} call; pass the "
                               f"reserve space of this sequence's forward (every call of a "
                               f"sequence takes the same descriptor, layout, max_seq_length, "
                               f"batch_size and seq_lengths; desc->num_threads may differ)")
    if size < plan.total:
        raise _Fail(BUFFER_TOO_SMALL, f"reserve_space_size: {size} bytes is too small; "
                                      f"reserve_space needs {plan.total} bytes "
                                      f"({_RESERVE_QUERY})")
    if (list(head[4:8]) != [plan.engine, plan.x, plan.dw, plan.total]
            or head[2] not in (_STATE_FORWARD, _STATE_BACKWARD_DATA)):
        raise _Fail(BAD_PARAM, f"reserve_space: bad header (region offsets "
                               f"{[int(v) for v in head[4:8]]}, state {head[2]}; expected "
                               f"{[plan.engine, plan.x, plan.dw, plan.total]}, state 1 or 2): "
                               f"corrupt, or written by another cgru build; pass the reserve "
                               f"space of the training forward")
    if head[2] < need_state:
        raise _Fail(BAD_PARAM, "reserve_space: cgru_rnn_backward_data has not run on this "
                               "reserve space; call it before cgru_rnn_backward_weights (as "
                               "in cuDNN v8)")
    return plan, _bytes_at(addr, plan.total), head


@_entry
def rnn_forward(desc, fwd_mode, layout, T, N, seq_lengths, x, y, hx, hy, cx, cy, ws_size, ws,
                work_size, work, reserve_size, reserve):
    training = _enum(fwd_mode, _FWD_MODES, "fwd_mode",
                     "CGRU_FWD_MODE_INFERENCE (0) or CGRU_FWD_MODE_TRAINING (1)")
    m, batch_major, T, N, lengths = _common(desc, layout, T, N, seq_lengths)
    params = _weights(m, ws_size, ws)
    plan = _plan(m, T, N) if training else None
    space = None
    if training:
        space = _space(reserve_size, reserve, plan.total, "reserve_space", "reserve_space_size",
                       "cgru_get_temp_space_sizes with CGRU_FWD_MODE_TRAINING")
    xs, ys, hs, cs = _seq_shapes(m, batch_major, T, N)
    xa = _array(x, "x", *xs, m.dtype, writable=False)
    ya = _array(y, "y", *ys, m.dtype, writable=True)
    h0 = _array(hx, "hx", *hs, m.dtype, writable=False, optional=True)
    hya = _array(hy, "hy", *hs, m.dtype, writable=True, optional=True)
    c0 = _cell_states(m, cx, "cx", cs, False)
    cya = _cell_states(m, cy, "cy", cs, True)
    work_block = _workspace(m, T, N, training, work_size, work)
    _refuse_overlaps([("seq_lengths", seq_lengths, 4 * N, False), ("x", x, xa.nbytes, False),
                      ("y", y, ya.nbytes, True), ("hx", hx, _nbytes(h0), False),
                      ("hy", hy, _nbytes(hya), True), ("cx", cx, _nbytes(c0), False),
                      ("cy", cy, _nbytes(cya), True),
                      ("weight_space", ws, _weight_bytes(m), False),
                      ("work_space", work, _nbytes(work_block), True),
                      ("reserve_space", reserve, plan.total if training else 0, True)])
    if not training and lengths is None and not batch_major and \
            repeat(params, xa, h0, c0, m.num_threads, out=(ya, hya, cya)) is not None:
        return ()         # a repeated inference: as the engine's own repeated calls run
    call = ForwardCall.check(
        params, xa, h0, c0=c0, lengths=lengths, batch_major=batch_major, training=training,
        dropout=m.dropout, seed=(m.seed, m.seed2), num_threads=m.num_threads)
    if training:
        # the engine writes its reserve in place: until this call has succeeded the reserve
        # space is no sequence's (a failed call leaves it refused, not half of two forwards)
        _reserve_header(space)[0] = 0
    # the results straight into the caller's buffers (no copies)
    run_forward(call, work_block, {
        "y": ya, "hy": hya, "cy": cya,
        "reserve": space[plan.engine:plan.engine + plan.engine_bytes] if training else None})
    if training:
        head = _reserve_header(space)
        record = _record(m, batch_major, T, N, lengths)
        head[:] = 0
        head[:_RECORD_SLOT] = [_MAGIC, _VERSION, _STATE_FORWARD, 0, plan.engine, plan.x,
                               plan.dw, plan.total]
        head[_RECORD_SLOT:_RECORD_SLOT + len(record)] = record
        head[_SEAL_SLOT] = _seal(head)
        space[plan.x:plan.x + plan.x_bytes] = xa.reshape(-1).view(np.uint8)
    return ()


@_entry
def rnn_backward_data(desc, layout, T, N, seq_lengths, dy, dx, dhy, dhx, dcy, dcx, ws_size, ws,
                      work_size, work, reserve_size, reserve):
    m, batch_major, T, N, lengths = _common(desc, layout, T, N, seq_lengths)
    params = _weights(m, ws_size, ws)
    plan, space, head = _open_reserve(m, batch_major, T, N, lengths, reserve_size, reserve,
                                      _STATE_FORWARD, "cgru_rnn_backward_data")
    xs, ys, hs, cs = _seq_shapes(m, batch_major, T, N)
    dya = _array(dy, "dy", *ys, m.dtype, writable=False, optional=True)
    dxa = _array(dx, "dx", *xs, m.dtype, writable=True)
    dhya = _array(dhy, "dhy", *hs, m.dtype, writable=False, optional=True)
    dhxa = _array(dhx, "dhx", *hs, m.dtype, writable=True, optional=True)
    dcya = _cell_states(m, dcy, "dcy", cs, False)
    dcxa = _cell_states(m, dcx, "dcx", cs, True)
    work_block = _workspace(m, T, N, True, work_size, work)
    _refuse_overlaps([("seq_lengths", seq_lengths, 4 * N, False),
                      ("dy", dy, _nbytes(dya), False), ("dx", dx, dxa.nbytes, True),
                      ("dhy", dhy, _nbytes(dhya), False), ("dhx", dhx, _nbytes(dhxa), True),
                      ("dcy", dcy, _nbytes(dcya), False), ("dcx", dcx, _nbytes(dcxa), True),
                      ("weight_space", ws, _weight_bytes(m), False),
                      ("work_space", work, _nbytes(work_block), True),
                      ("reserve_space", reserve, plan.total, True)])

    x_saved = space[plan.x:plan.x + plan.x_bytes].view(m.dtype).reshape(xs[1])
    engine_reserve = space[plan.engine:plan.engine + plan.engine_bytes]
    dparams = _network_over(m, reserve + plan.dw, plan.dw_bytes, True)
    head[2] = _STATE_FORWARD  # dw is being rewritten: not valid until this call succeeds
    head[_DW_MAC_SLOT] = 0
    head[_SEAL_SLOT] = _seal(head)
    call = BackwardCall.check(
        params, x_saved, engine_reserve, dya, dhya, dcy=dcya, batch_major=batch_major,
        dparams=dparams, accumulate=False, num_threads=m.num_threads)
    call.dparams_in_place = True   # the reserve's dw, refused (head[2]) until this call succeeds
    run_backward(call, work_block, {"dx": dxa, "dh0": dhxa, "dc0": dcxa})
    head[2] = _STATE_BACKWARD_DATA
    head[_DW_MAC_SLOT] = _dw_mac(space, plan, m.dtype)
    head[_SEAL_SLOT] = _seal(head)
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
    plan, space, head = _open_reserve(m, batch_major, T, N, lengths, reserve_size, reserve,
                                      _STATE_BACKWARD_DATA, "cgru_rnn_backward_weights")
    if head[_DW_MAC_SLOT] != _dw_mac(space, plan, m.dtype):
        raise _Fail(BAD_PARAM, "reserve_space: the weight gradients cgru_rnn_backward_data "
                               "left in it were changed since; run cgru_rnn_backward_data "
                               "again")
    _refuse_overlaps([("seq_lengths", seq_lengths, 4 * N, False),
                      ("dweight_space", dws, nbytes, True),
                      ("reserve_space", reserve, plan.total, False)])
    dw = space[plan.dw:plan.dw + plan.dw_bytes].view(m.dtype)
    if mode == "add":
        dw_out += dw
    else:
        dw_out[...] = dw
    return ()
