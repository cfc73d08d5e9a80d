"""Argument checks shared by the frontends (each names arguments in its own system's words)."""
import numpy as np

from cgru.engine import _INT_MAX
from cgru.params import DTYPES


def float_array(a, what, dtype=None, like="the other arrays"):
    """``a`` as it is, if it is a float32/float64 ndarray (of ``dtype``, when given, which
    the message calls ``like``); else ``TypeError`` naming ``what``."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what}: expected a numpy array, got {type(a).__name__}")
    if dtype is None:
        if a.dtype not in DTYPES:
            raise TypeError(f"{what}: expected dtype float32 or float64, got {a.dtype}")
    elif a.dtype != dtype:
        raise TypeError(f"{what}: expected dtype {dtype} {like}, got {a.dtype}")
    return a


def input_sizes(what, shape, T, N, layout, names=("T", "N", "I")):
    """Refuse a frontend's input ``[T, N, I]`` (``shape`` in ``layout``) with an empty axis or a
    size beyond the kernels' 32-bit ints, under the frontend's own name ``what`` (and its
    ``names`` of T, N, I) — before the frontend allocates or reorders anything as large as the
    problem (the engine checks the same under its name ``x``)."""
    I = shape[-1]
    if T == 0 or N == 0 or I == 0:
        raise ValueError(f"{what}: expected {names[0]} ≥ 1, {names[1]} ≥ 1 and {names[2]} ≥ 1 "
                         f"in {layout}, got shape {list(shape)}")
    for name, v in (("T·N", T * N), ("I", I)):
        if v > _INT_MAX:
            raise ValueError(f"{what}: {name} = {v} exceeds the 32-bit BLAS limit {_INT_MAX}")
