"""Inter-layer dropout: the masks a training forward applies (and its backward again).

Inverted dropout on each layer's output before it feeds the next layer (never on the last
layer's output, nor on states), drawn from NumPy's PCG64 seeded by ``(seed, seed2, layer)``, so
the same arguments give the same masks on every machine and thread count.
"""
import numpy as np

from cgru.core import validate
from cgru.core.network import Network, Topology

__all__ = ["dropout_masks"]


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
