"""Arraymancer's stacked GRU (``nn/layers/gru.nim``, ``nn_primitives/nnp_gru.nim``).

Arraymancer computes the cuDNN/PyTorch cell (reset after the recurrent product, sigmoid/tanh,
``h' = (1 − z)·n + z·h``), time-major, unidirectional, no sequence lengths, gates ``r, z, n``
in every packed tensor.  Its tensors map onto the canonical parameters one to one::

    w3s0  [3H, I]        = W of layer 0                  (Arraymancer's W3s0)
    w3sN  [L−1, 3H, H]   = W of layers 1 … L−1           (W3sN)
    u3s   [L, 3H, H]     = R of every layer              (U3s)
    bW3s  [L, 1, 3H]     = b_W of every layer            (bW3s)
    bU3s  [L, 1, 3H]     = b_R of every layer            (bU3s)

    input [T, N, I], hidden0 / hiddenN [L, N, H], output [T, N, H] (the last layer's states)

``gru_forward`` keeps the core's training reserve in its cache; ``gru_backward`` returns
fresh gradients (Arraymancer allocates new zero tensors, it does not accumulate).
"""
from dataclasses import dataclass

import numpy as np

from cgru.cell import Cell
from cgru._checks import float_array, input_sizes
from cgru.engine import backward, forward
from cgru.params import LayerParams, Params, Topology, as_dtype

__all__ = ["GRULayer", "GRUCache", "gru", "gru_forward", "gru_backward"]

def _check(a, what, dtype, shape):
    float_array(a, what, dtype, like="(the dtype of W3s0)")
    if a.ndim != len(shape) or any(s is not None and s != e for s, e in zip(shape, a.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{what}: expected shape {want}, got {list(a.shape)}")
    return a


def _to_params(W3s0, W3sN, U3s, bW3s, bU3s, input=None, hidden0=None):
    """Validate Arraymancer's weight tensors (and ``input``, ``hidden0`` when ``input`` is
    given: before the topology, so that an empty input width is blamed on ``input``) and
    return canonical ``Params``."""
    _check(W3s0, "W3s0", None, (None, None))
    dtype = W3s0.dtype
    H3, I = W3s0.shape
    if H3 == 0 or H3 % 3:
        raise ValueError(f"W3s0: expected shape [3H, I] with H ≥ 1, got {list(W3s0.shape)}")
    H = H3 // 3
    _check(U3s, "U3s", dtype, (None, 3 * H, H))
    L = U3s.shape[0]
    if L == 0:
        raise ValueError(f"U3s: expected at least one layer, got shape {list(U3s.shape)}")
    _check(W3sN, "W3sN", dtype, (L - 1, 3 * H, H))
    _check(bW3s, "bW3s", dtype, (L, 1, 3 * H))
    _check(bU3s, "bU3s", dtype, (L, 1, 3 * H))
    if input is not None:
        _check_state(input, hidden0, dtype, I, H, L)
    elif I == 0:
        raise ValueError(f"W3s0: expected shape [3H, I] with I ≥ 1, got {list(W3s0.shape)}")
    layers = [LayerParams(W=W3s0 if l == 0 else W3sN[l - 1], R=U3s[l], b_W=bW3s[l, 0],
                          b_R=bU3s[l, 0]) for l in range(L)]
    return Params(Topology(I, H, L, "forward"), layers)


def _from_params(p):
    """Arraymancer's five weight tensors from canonical ``Params`` (copies)."""
    topo = p.topology
    H, L = topo.hidden_size, topo.num_layers
    w3sN = np.empty((L - 1, 3 * H, H), p.dtype)
    for l in range(1, L):
        w3sN[l - 1] = p[l].W
    return (p[0].W.copy(), w3sN, np.stack([lp.R for lp in p]),
            np.stack([lp.b_W for lp in p])[:, None, :], np.stack([lp.b_R for lp in p])[:, None, :])


def _check_state(input, hidden0, dtype, I, H, L):
    _check(input, "input", dtype, (None, None, I))
    T, N, _ = input.shape
    input_sizes("input", input.shape, T, N, "[T, N, I]")
    _check(hidden0, "hidden0", dtype, (L, N, H))


@dataclass(frozen=True)
class GRUCache:
    """What ``gru_forward`` saves for ``gru_backward``: the canonical parameters, the input
    and the core's training reserve (cuDNN-style: gates, states, ``U_n·h + bU_n``)."""
    params: Params
    input: np.ndarray
    reserve: np.ndarray


def gru(input, hidden0, W3s0, W3sN, U3s, bW3s, bU3s):
    """Arraymancer's functional ``gru``: ``(output [T, N, H], hiddenN [L, N, H])``.

    ``input [T, N, I]``, ``hidden0 [L, N, H]``, the weights as in the module docstring; all
    arrays float32 or float64 of one dtype.
    """
    params = _to_params(W3s0, W3sN, U3s, bW3s, bU3s, input, hidden0)
    y, hy, _ = forward(params, input, hidden0, cell=Cell())
    return y, hy


def gru_forward(input, hidden0, W3s0, W3sN, U3s, bW3s, bU3s):
    """``gru`` that also returns the cache for ``gru_backward``: ``(output, hiddenN, cache)``."""
    params = _to_params(W3s0, W3sN, U3s, bW3s, bU3s, input, hidden0)
    y, hy, reserve = forward(params, input, hidden0, cell=Cell(), training=True)
    return y, hy, GRUCache(params, input.copy(), reserve)


def gru_backward(d_output, d_hiddenN, cache):
    """Gradients of ``(input, hidden0, W3s0, W3sN, U3s, bW3s, bU3s)``, each shaped like it.

    ``d_output [T, N, H]`` and ``d_hiddenN [L, N, H]`` are the gradients of the loss with
    respect to ``gru_forward``'s outputs (``None`` means zeros); ``cache`` is its third result.
    """
    if not isinstance(cache, GRUCache):
        raise TypeError(f"cache: expected the GRUCache gru_forward returned, got "
                        f"{type(cache).__name__}")
    p = cache.params
    T, N, _ = cache.input.shape
    topo = p.topology
    if d_output is not None:
        _check(d_output, "d_output", p.dtype, (T, N, topo.hidden_size))
    if d_hiddenN is not None:
        _check(d_hiddenN, "d_hiddenN", p.dtype, (topo.num_layers, N, topo.hidden_size))
    dx, dh0, dp = backward(p, cache.input, cache.reserve, d_output, d_hiddenN, cell=Cell())
    return (dx, dh0) + _from_params(dp)


class GRULayer:
    """Arraymancer's ``GRULayer``: the five weight tensors and ``forward``.

    Build with ``GRULayer.init(...)`` (Arraymancer's initialisers) or
    ``GRULayer(w3s0, w3sN, u3s, bW3s, bU3s)`` from existing tensors.
    """

    def __init__(self, w3s0, w3sN, u3s, bW3s, bU3s):
        _to_params(w3s0, w3sN, u3s, bW3s, bU3s)          # validates shapes and dtypes
        self.w3s0, self.w3sN, self.u3s, self.bW3s, self.bU3s = w3s0, w3sN, u3s, bW3s, bU3s

    @classmethod
    def init(cls, num_input_features, hidden_size, layers, *, dtype=np.float32, seed=0):
        """A new layer initialised as Arraymancer's ``init(ctx, GRULayer, …)`` does.

        ``w3s0 [3H, I]`` and ``w3sN [L−1, 3H, H]`` Xavier-uniform, ``u3s [L, 3H, H]``
        LeCun-normal, biases zero.  Fans follow Arraymancer's ``compute_fans``: ``fan_out =
        shape[0]``, ``fan_in = shape[1]``, both times the product of the remaining dims (so
        for the 3-D tensors they are not the fans of one matrix — reproduced on purpose).
        Random numbers come from ``numpy.random.default_rng(seed)``, not Nim's generator.
        """
        for name, v in (("num_input_features", num_input_features),
                        ("hidden_size", hidden_size), ("layers", layers)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        dt = as_dtype(dtype)
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise TypeError(f"seed: expected a non-negative int or None, got {seed!r}")
            if seed < 0:
                raise ValueError(f"seed: expected a non-negative int or None, got {seed}")
        rng = np.random.default_rng(seed)
        H, I, L = int(hidden_size), int(num_input_features), int(layers)
        w3s0 = _xavier_uniform(rng, (3 * H, I), dt)
        w3sN = _xavier_uniform(rng, (L - 1, 3 * H, H), dt)
        u3s = _yann_normal(rng, (L, 3 * H, H), dt)
        zeros = np.zeros((L, 1, 3 * H), dt)
        return cls(w3s0, w3sN, u3s, zeros, zeros.copy())

    def forward(self, input, hidden0):
        """``(output [T, N, H], hiddenN [L, N, H])`` for ``input [T, N, I]``,
        ``hidden0 [L, N, H]``."""
        return gru(input, hidden0, self.w3s0, self.w3sN, self.u3s, self.bW3s, self.bU3s)

    def __repr__(self):
        L, H3, _ = self.u3s.shape
        return (f"GRULayer(num_input_features={self.w3s0.shape[1]}, hidden_size={H3 // 3}, "
                f"layers={L}, dtype={self.w3s0.dtype})")


def _fans(shape):
    """Arraymancer's ``compute_fans``: ``(fan_in, fan_out)``."""
    receptive = int(np.prod(shape[2:], dtype=np.int64)) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def _xavier_uniform(rng, shape, dtype):
    """U(−limit, limit), ``limit = √3 · √(2 / (fan_in + fan_out))``."""
    fan_in, fan_out = _fans(shape)
    if fan_in + fan_out == 0:
        return np.zeros(shape, dtype)
    limit = np.sqrt(3.0) * np.sqrt(2.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, shape).astype(dtype)


def _yann_normal(rng, shape, dtype):
    """N(0, std²), ``std = √(1 / fan_in)``."""
    fan_in, _ = _fans(shape)
    return rng.normal(0.0, np.sqrt(1.0 / fan_in), shape).astype(dtype)
