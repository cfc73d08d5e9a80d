"""Arraymancer's stacked GRU (``nn/layers/gru.nim``, ``nn_primitives/nnp_gru.nim``).

Arraymancer computes the cuDNN/PyTorch cell (reset after the recurrent product, sigmoid/tanh,
``h' = (1 − z)·n + z·h``), time-major, unidirectional, no sequence lengths, gates ``r, z, n``
in every packed tensor.  Its tensors map onto the canonical parameters one to one
(``cgru.systems.arraymancer``)::

    w3s0  [3H, I]        = W of layer 0                  (the functions' argument W3s0)
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

from cgru.core import engine, validate
from cgru.core.network import Network
from cgru.systems import arraymancer as am_system
from cgru.systems.arraymancer import ARGUMENTS, FIELDS

__all__ = ["GRULayer", "GRUCache", "gru", "gru_forward", "gru_backward"]


def _check(a, what, dtype, shape):
    return am_system.check(a, what, dtype, shape, like="(the dtype of W3s0)")


def _network(arrays, input=None, hidden0=None):
    """Validate Arraymancer's weight tensors (``ARGUMENTS`` order) and ``input``, ``hidden0``
    (when ``input`` is given: before the input width, so that an empty one is blamed on
    ``input``), and return the ``cgru.Network`` over them (views, no copies)."""
    dtype, I, H, L = am_system.check_tensors(arrays, ARGUMENTS)
    if input is not None:
        _check(input, "input", dtype, (None, None, I))
        T, N, _ = input.shape
        validate.input_sizes("input", input.shape, T, N, "[T, N, I]")
        _check(hidden0, "hidden0", dtype, (L, N, H))
    return am_system.network(arrays, ARGUMENTS)


@dataclass(frozen=True)
class GRUCache:
    """What ``gru_forward`` saves for ``gru_backward``: the canonical parameters, the input
    and the core's training reserve (cuDNN-style: gates, states, ``U_n·h + bU_n``)."""
    params: Network
    input: np.ndarray
    reserve: np.ndarray


def gru(input, hidden0, W3s0, W3sN, U3s, bW3s, bU3s):
    """Arraymancer's functional ``gru``: ``(output [T, N, H], hiddenN [L, N, H])``.

    ``input [T, N, I]``, ``hidden0 [L, N, H]``, the weights as in the module docstring; all
    arrays float32 or float64 of one dtype.
    """
    net = _network((W3s0, W3sN, U3s, bW3s, bU3s), input, hidden0)
    y, hy, _ = engine.forward(net, input, hidden0)
    return y, hy


def gru_forward(input, hidden0, W3s0, W3sN, U3s, bW3s, bU3s):
    """``gru`` that also returns the cache for ``gru_backward``: ``(output, hiddenN, cache)``."""
    net = _network((W3s0, W3sN, U3s, bW3s, bU3s), input, hidden0)
    y, hy, reserve = engine.forward(net, input, hidden0, training=True)
    return y, hy, GRUCache(net, input.copy(), reserve)


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
    dx, dh0, dp = engine.backward(p, cache.input, cache.reserve, d_output, d_hiddenN)
    return (dx, dh0) + am_system.tensors(dp)


class GRULayer:
    """Arraymancer's ``GRULayer``: the five weight tensors and ``forward``.

    Build with ``GRULayer.init(...)`` (Arraymancer's initialisers) or
    ``GRULayer(w3s0, w3sN, u3s, bW3s, bU3s)`` from existing tensors.
    """

    def __init__(self, w3s0, w3sN, u3s, bW3s, bU3s):
        am_system.network((w3s0, w3sN, u3s, bW3s, bU3s), FIELDS)   # validates them
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
        dt = validate.as_dtype(dtype)
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
