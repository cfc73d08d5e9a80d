"""The activation functions of every cell kind, their derivatives and ONNX's clip, in NumPy.

Shared by the NumPy reference of each cell kind (``cgru.core.kinds``) and by the rebuilding of
a reserve from another system's saved training state (``cgru.core.rebuild``); the kernels have
their own vectorised versions (``cgru/_kernels``), tested against these.  Pure NumPy.
"""
import numpy as np

from cgru.core.cells import Activation

__all__ = ["activate", "activate_grad", "clamp", "act_and_grad", "stand_in_pre", "STAND_IN"]


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


def clamp(cell, a):
    """The ONNX clip: every complete pre-activation into [−clip, clip] (no-op without clip)."""
    if cell.clip is None:
        return a
    c = a.dtype.type(cell.clip)
    return np.clip(a, -c, c)


def act_and_grad(cell, act, a):
    """``(value, derivative)`` of ``act(clip(a))`` with respect to ``a``."""
    c = clamp(cell, a)
    d = activate_grad(act, c)
    if cell.clip is not None:
        lim = a.dtype.type(cell.clip)
        d = np.where((a > lim) | (a < -lim), a.dtype.type(0), d)
    return activate(act, c), d


# --- stand-in pre-activations ---------------------------------------------------------------
# Activations whose derivative can be taken from a stand-in pre-activation rebuilt from the
# activation's output alone (a reserve rebuilt from another system's saved gates):
# name -> out ↦ stand-in.
def _hard_sigmoid_stand_in(act, out):
    """x with αx + β strictly inside (0, 1) exactly where ``out`` is, far outside elsewhere."""
    if act.alpha == 0:
        return np.zeros_like(out)
    inside = (out - act.beta) / act.alpha
    return np.where(out <= 0, (-1 - act.beta) / act.alpha,
                    np.where(out >= 1, (2 - act.beta) / act.alpha, inside)).astype(out.dtype)


STAND_IN = {
    "sigmoid": lambda act, out: out,                           # derivative uses out only
    "tanh": lambda act, out: out,
    "identity": lambda act, out: out,
    "relu": lambda act, out: out,                              # out > 0  ⇔  x > 0
    "hard_sigmoid": _hard_sigmoid_stand_in,
}


def stand_in_pre(act, out):
    """A pre-activation with the same derivative as the one that gave ``out`` (``act.name`` in
    ``STAND_IN``)."""
    return STAND_IN[act.name](act, out)

