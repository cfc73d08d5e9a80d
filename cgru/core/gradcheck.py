"""Central finite differences: the float64 oracle of every backward in cgru.

``central_differences(fn, arrays)`` perturbs each element of each array in place by ±eps (and
restores it exactly) and differences ``fn()``, which may return a number, a tuple of numbers
or an array (then the result is a Jacobian).  ``directional`` checks a gradient along one random
direction at the cost of two calls.  ``backward_errors`` is the whole check of one stack's
``backward`` (``python -m cgru demo`` prints it).  Pure NumPy; sums with ``math.fsum`` where a
loss is reduced.
"""
import math

import numpy as np

__all__ = ["central_differences", "directional", "loss", "backward_errors"]


def loss(y, hy, dy, dhy):
    """``Σ y·dy + Σ hy·dhy`` (``None`` terms are skipped), summed exactly (``math.fsum``)."""
    total = 0.0
    if dy is not None:
        total += math.fsum((np.asarray(y) * dy).ravel())
    if dhy is not None:
        total += math.fsum((np.asarray(hy) * dhy).ravel())
    return total


def central_differences(fn, arrays, eps=1e-6):
    """``[d fn / d a for a in arrays]`` by central differences.

    Each element is set to ``v + eps`` and ``v − eps`` in place (the arrays must be writable
    and own or view their memory) and put back bit for bit; the step used is the difference of
    the two values actually stored.  ``fn()`` returns a number → each result is shaped like its
    array; a tuple of k numbers → a tuple of k such results; an array of shape S → a Jacobian
    of shape ``a.shape + S``."""
    out = []
    structure = None            # fn()'s result, for the shape of an empty array's result
    for a in arrays:
        flat = a.reshape(-1)
        if a.size and not np.shares_memory(flat, a):
            raise ValueError("central_differences: an array must be contiguous enough to be "
                             "perturbed in place")
        cols = []
        for j in range(a.size):
            v = flat[j]
            flat[j] = v + eps
            up, plus = flat[j], fn()
            flat[j] = v - eps
            down, minus = flat[j], fn()
            flat[j] = v
            if isinstance(plus, tuple):
                cols.append(tuple((p - m) / (up - down) for p, m in zip(plus, minus)))
            else:
                cols.append((np.asarray(plus, np.float64) - minus) / (up - down))
        if not cols:
            if structure is None:
                structure = fn()
            cols_like = structure
        else:
            cols_like = cols[0]
        if isinstance(cols_like, tuple):
            out.append(tuple(np.array([c[k] for c in cols], np.float64).reshape(
                a.shape + np.shape(cols_like[k])) for k in range(len(cols_like))))
        else:
            out.append(np.array(cols, np.float64).reshape(a.shape + np.shape(cols_like)))
    return out


def directional(loss_at, grads, inputs, rng, eps=1e-6):
    """``(finite difference, predicted)`` of ``loss`` along a random direction ``v``:
    ``(loss_at(θ + εv) − loss_at(θ − εv)) / 2ε`` against ``⟨grads, v⟩``."""
    v = [rng.standard_normal(a.shape) for a in inputs]
    pred = math.fsum(math.fsum((g * d).ravel()) for g, d in zip(grads, v))
    plus = loss_at([a + eps * d for a, d in zip(inputs, v)])
    minus = loss_at([a - eps * d for a, d in zip(inputs, v)])
    return (plus - minus) / (2 * eps), pred


def backward_errors(net, x, h0, *, c0=None, lengths=None, seed=1, eps=1e-6):
    """``{name: largest relative error}`` of every gradient ``cgru.backward`` returns for a
    float64 ``net`` — ``dx``, ``dh0`` (an LSTM's ``dc0`` when ``c0`` is given) and each weight
    of each layer-direction — against central differences of
    ``Σ y·dy + Σ hy·dhy (+ Σ cy·dcy)`` with random ``dy``, ``dhy`` (``dcy``)."""
    from cgru.core import engine
    rng = np.random.default_rng(seed)
    f = engine.forward(net, x, h0, c0=c0, lengths=lengths, training=True)
    dy = rng.standard_normal(f.y.shape)
    dhy = rng.standard_normal(f.hy.shape)
    dcy = None if f.cy is None else rng.standard_normal(f.cy.shape)
    g = engine.backward(net, x, f.reserve, dy, dhy, dcy=dcy)

    def fn():
        r = engine.forward(net, x, h0, c0=c0, lengths=lengths, num_threads=1)
        return loss(r.y, r.hy, dy, dhy) + (0.0 if dcy is None else float(np.sum(r.cy * dcy)))

    pairs = [("dx", x, g.dx), ("dh0", h0, g.dh0)]
    if c0 is not None:
        pairs.append(("dc0", c0, g.dc0))
    for i, (lp, glp) in enumerate(zip(net, g.dparams)):
        for name, a in lp.arrays().items():
            pairs.append((f"d{name}[{i}]", a, getattr(glp, name)))
    numeric = central_differences(fn, [a for _, a, _ in pairs], eps)
    return {name: float(np.abs(grad - num).max() / max(np.abs(num).max(), 1e-30))
            for (name, _, grad), num in zip(pairs, numeric)}
