"""Every argument check of cgru, once, in the caller's vocabulary.

The core and every frontend (``cgru.tf``, ``cgru.mps``, ``cgru.onnx``, ``cgru.arraymancer``,
the converters, the C ABI) validate through these functions before anything proportional to
the problem is allocated or computed.  Each takes the name the caller's system uses for the
argument (``what``: ``"x"``, ``"input"``, ``"X"``, ``"source"``, …) so that a message starts
with the caller's own word and says what was expected and what was given.  ``TypeError`` for a
wrong type or dtype, ``ValueError`` for a wrong shape, size, value or option.

The limits (``call_sizes``, ``nbytes_limit``): every matrix dimension and ``T·N`` fit the
kernels' 32-bit BLAS integers (``INT_MAX``); no buffer is larger than ``MAX_BYTES``.  The size
queries apply the same limits as the calls, in closed form.
"""
import functools
import math
import numbers

import numpy as np

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
INT_MAX = 2 ** 31 - 1
MAX_BYTES = 2 ** 62


# --- scalars -------------------------------------------------------------------------------
def positive_int(value, what, allow_zero=False):
    """``value`` as an int ≥ 1 (≥ 0 with ``allow_zero``); bools and floats are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what}: expected an int, got {type(value).__name__} ({value!r})")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{what}: expected a {'non-negative' if allow_zero else 'positive'} "
                         f"int, got {value}")
    return int(value)


def flag(value, what):
    """A bool argument: ``True``/``False`` (or NumPy's), never read by truthiness."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what}: expected a bool, got {value!r}")
    return bool(value)


def name(value, what, table, note=""):
    """``table[value]`` for a name argument, ``str`` or ``bytes`` (ONNX attributes and TF's
    ``op.get_attr`` give bytes): ``TypeError`` for anything else, ``ValueError`` for an unknown
    name (with ``note`` appended)."""
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            raise ValueError(f"{what}: expected one of {sorted(table)}, got {value!r}") from None
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected a name (str), got {value!r}")
    if value not in table:
        raise ValueError(f"{what}: expected one of {sorted(table)}, got {value!r}{note}")
    return table[value]


def text(value):
    """``value`` decoded when it is ``bytes`` (ONNX / TF attribute values), else as it is."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value
    return value


def dropout_and_seed(dropout, seed):
    """``(p, seed, seed2)`` from a dropout probability in ``[0, 1)`` and an int or a
    ``(seed, seed2)`` pair of 64-bit ints."""
    if type(dropout) is float and 0.0 <= dropout < 1.0 and type(seed) is int \
            and -2 ** 63 <= seed < 2 ** 63:
        return dropout, seed, 0                     # the common case, at once
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float, np.integer,
                                                             np.floating)):
        raise TypeError(f"dropout: expected a float in [0, 1), got {dropout!r}")
    if not (0.0 <= float(dropout) < 1.0):
        raise ValueError(f"dropout: expected a float in [0, 1), got {dropout!r}")
    if isinstance(seed, tuple):
        if len(seed) != 2:
            raise ValueError(f"seed: expected an int or a (seed, seed2) pair, got {seed!r}")
        s1, s2 = seed
    else:
        s1, s2 = seed, 0
    for label, s in (("seed", s1), ("seed2", s2)):
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"{label}: expected an int, got {s!r}")
        if not (-2 ** 63 <= int(s) < 2 ** 63):
            raise ValueError(f"{label}: expected a 64-bit int, got {s}")
    return float(dropout), int(s1), int(s2)


# --- arrays --------------------------------------------------------------------------------
def as_dtype(dtype, what="dtype"):
    """float32 or float64 as a NumPy dtype; anything else is a ``TypeError``."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{what}: expected float32 or float64, got {dtype!r}") from None
    if dt not in DTYPES:
        raise TypeError(f"{what}: expected float32 or float64, got {dt}")
    return dt


def plain_array(a, what, layout=""):
    """``a`` if it is a plain NumPy array: not another type, and not a masked array (whose
    mask cgru would silently ignore)."""
    if type(a) is np.ndarray:
        return a
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what}: expected a numpy array{' ' + layout if layout else ''}, got "
                        f"{type(a).__name__}")
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(f"{what}: expected a plain numpy array, got a masked array (cgru "
                        f"would ignore its mask; pass np.ma.filled(...) or the data you mean)")
    return a


def float_array(a, what, dtype=None, like="the other arrays"):
    """``a`` as it is, if it is a float32/float64 ndarray (of ``dtype``, when given, which
    the message calls ``like``); else ``TypeError`` naming ``what``."""
    plain_array(a, what)
    if dtype is None:
        if a.dtype not in DTYPES:
            raise TypeError(f"{what}: expected dtype float32 or float64, got {a.dtype}")
    elif a.dtype != dtype:
        raise TypeError(f"{what}: expected dtype {dtype} {like}, got {a.dtype}")
    return a


def shape_text(shape):
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def array(a, what, dtype, shape=None, like="(the network's dtype)"):
    """``a`` as an ndarray of ``dtype``; shape checked (``None`` in ``shape`` = any)."""
    plain_array(a, what)
    if a.dtype != dtype:
        raise TypeError(f"{what}: expected dtype {dtype} {like}, got {a.dtype}")
    if shape is not None:
        if a.ndim != len(shape) or any(s is not None and s != e for s, e in zip(shape, a.shape)):
            raise ValueError(f"{what}: expected shape {shape_text(shape)}, got "
                             f"{list(a.shape)}")
    return a


def named_shape(a, what, shape, names):
    """``a.shape == shape``, else a ``ValueError`` spelling each axis (``[D=2, 3H=12, …]``)."""
    if a.shape != tuple(shape):
        want = "[" + ", ".join(f"{n}={s}" for n, s in zip(names, shape)) + "]"
        raise ValueError(f"{what}: expected shape {want}, got {list(a.shape)}")
    return a


# --- sizes ---------------------------------------------------------------------------------
def input_sizes(what, shape, T, N, layout, names=("T", "N", "I")):
    """Refuse an input ``[T, N, I]`` (``shape`` in ``layout``) with an empty axis or a size
    beyond the kernels' 32-bit ints, under the caller's name ``what`` (and its ``names`` of T,
    N, I) — before anything as large as the problem is allocated or reordered."""
    I = shape[-1]
    if T == 0 or N == 0 or I == 0:
        raise ValueError(f"{what}: expected {names[0]} ≥ 1, {names[1]} ≥ 1 and {names[2]} ≥ 1 "
                         f"in {layout}, got shape {list(shape)}")
    for label, v in (("T·N", T * N), ("I", I)):
        if v > INT_MAX:
            raise ValueError(f"{what}: {label} = {v} exceeds the 32-bit BLAS limit {INT_MAX}")


def call_sizes(topo, gates, T, N, what):
    """Every GEMM dimension of a call on ``topo`` with ``T`` steps and ``N`` sequences within
    the kernels' 32-bit BLAS ints: ``T·N`` (rows), ``G·H``, the input width, ``D·H``.  The
    calls and the size queries (``reserve_nbytes``, the C ABI's) apply this same rule."""
    if max(T * N, gates * topo.hidden_size, topo.input_size, topo.output_size) <= INT_MAX:
        return                                  # every call but the refused ones, at once
    for label, v in (("T·N", T * N), (f"{gates}H", gates * topo.hidden_size),
                     ("input_size", topo.input_size), ("D·H", topo.output_size)):
        if v > INT_MAX:
            raise ValueError(f"{what}: {label} = {v} exceeds the 32-bit BLAS limit {INT_MAX}")


def nbytes_limit(nbytes, what, buffer="the buffer"):
    """``nbytes`` if it is at most ``MAX_BYTES``, else a ``ValueError`` naming ``what`` (the
    arguments that size it, with their values) and ``buffer`` (what would be that large)."""
    if nbytes > MAX_BYTES:
        raise ValueError(f"{what}: {buffer} would take {nbytes} bytes, more than cgru supports "
                         f"(2^62 bytes)")
    return nbytes


_CELLS_THAT_FIT = {}          # (cell, dtype) -> True: cells (frozen values) already checked
_LAST_FIT = (None, None)      # the last (cell, dtype) that passed, by identity


def cell_for_dtype(cell, dtype, what="cell"):
    """Refuse activation parameters and a clip that overflow ``dtype`` (a float32 run of
    ``scaled_tanh(alpha=1e300)`` would compute inf·0 = NaN).  A cell that passed once is
    remembered (cells are frozen values: an equal cell passes alike), the last one by identity
    too (hashing a cell walks every field)."""
    global _LAST_FIT
    last = _LAST_FIT
    if last[0] is cell and last[1] is dtype:
        return
    try:
        key = (cell, np.dtype(dtype))
        if key in _CELLS_THAT_FIT:
            _LAST_FIT = (cell, dtype)
            return
    except TypeError:                     # not hashable: checked every time
        key = None
    _check_cell_for_dtype(cell, dtype, what)
    if key is not None:
        if len(_CELLS_THAT_FIT) < 256:
            _CELLS_THAT_FIT[key] = True
        _LAST_FIT = (cell, dtype)


def _check_cell_for_dtype(cell, dtype, what):
    limit = float(np.finfo(dtype).max)
    for label in ("f_r", "f_z", "g", "f", "h", "f_i", "f_f", "f_o", "activation"):
        act = getattr(cell, label, None)
        if act is None or not hasattr(act, "alpha"):
            continue
        for p in ("alpha", "beta"):
            v = getattr(act, p)
            if abs(v) > limit:
                raise ValueError(f"{what}.{label}: {p} = {v} does not fit {dtype} (the dtype of "
                                 f"params; at most {limit:.4g} in magnitude)")
    clip = getattr(cell, "clip", None)
    if clip is not None and clip > limit:
        raise ValueError(f"{what}.clip: {clip} does not fit {dtype} (the network's dtype)")


# --- sequences -----------------------------------------------------------------------------
@functools.lru_cache(maxsize=64)
def full_lengths(T, N):
    """The lengths of ``N`` sequences of ``T`` steps: int64 ``[N]``, read-only (one array per
    ``(T, N)`` shared by the calls of that shape)."""
    out = np.full(N, T, dtype=np.int64)
    out.flags.writeable = False
    return out


def length_range(lengths):
    """``(min, max)`` of int64 ``lengths`` ``[N]`` (N ≥ 1) as Python ints: for a batch of a few
    sequences through Python's own min and max (a NumPy reduction costs microseconds)."""
    if lengths.shape[0] <= 64:
        values = lengths.tolist()
        return min(values), max(values)
    return int(lengths.min()), int(lengths.max())


def padded(lengths, T):
    """True when a sequence is shorter than ``T`` (``lengths``: checked int64 ``[N]``); the
    lengths of a call without any, ``full_lengths``, are known at once."""
    if lengths is full_lengths(T, lengths.shape[0]) or not lengths.shape[0]:
        return False
    return bool(lengths.min() < T)


def lengths(value, T, N, what="lengths", T_name="T"):
    """Sequence lengths: ``None`` → all ``T`` (``full_lengths``, read-only); else integers
    ``[N]`` in ``[0, T]`` (any order) as int64."""
    if value is None:
        return full_lengths(T, N)
    if isinstance(value, np.ndarray):
        plain_array(value, what)
        arr = value
    else:
        try:
            arr = np.asarray(value)
        except Exception:
            raise TypeError(f"{what}: expected an integer array [N={N}], got "
                            f"{type(value).__name__}") from None
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what}: expected an integer array [N={N}], got dtype {arr.dtype}")
    if arr.shape != (N,):
        raise ValueError(f"{what}: expected shape [{N}] (one length per batch entry), got "
                         f"{list(arr.shape)}")
    bad = np.flatnonzero((arr < 0) | (arr > T))      # before any cast: uint64 may not fit
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"{what}: expected values in [0, {T_name}={T}], got {what}[{b}] = "
                         f"{arr[b]}")
    return arr.astype(np.int64)


def broadcast_mask(mask, what, dtype, shape, time_major_axes=None):
    """``mask`` broadcast (a view) to ``shape``; ``ValueError`` naming ``what`` when it does not
    broadcast, ``TypeError`` for another dtype."""
    plain_array(mask, what)
    if mask.dtype != dtype:
        raise TypeError(f"{what}: expected dtype {dtype} (the network's dtype), got "
                        f"{mask.dtype}")
    try:
        return np.broadcast_to(mask, shape)
    except ValueError:
        raise ValueError(f"{what}: expected a shape broadcastable to the output shape "
                         f"{list(shape)}, got {list(mask.shape)}") from None


def finite_float(value, what, positive=False):
    """A real number (not a bool), finite, and > 0 when ``positive``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{what}: expected a finite number, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{what}: expected a positive number, got {value!r}")
    return float(value)
