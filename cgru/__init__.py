"""cgru — exact CPU recurrent operators (cuDNN/TF, MPSGraph, ONNX, Arraymancer), forward and backward.

The names that need the compiled kernels (``forward``, ``backward``, …) are loaded on first
use, so that the pure-Python parts (``cgru.core.reference``, the cells and networks) import
even where the extensions are not built.
"""
from cgru.core.cells import Activation, ACTIVATION_NAMES, Cell, GRUCell, LSTMCell, RNNCell
from cgru.core.network import LayerParams, Network, Topology

__version__ = "0.2.0"

_COMPILED = {
    "Forward": "cgru.core.engine", "Gradients": "cgru.core.engine",
    "forward": "cgru.core.engine", "backward": "cgru.core.engine",
    "reserve_nbytes": "cgru.core.engine", "dropout_masks": "cgru.core.engine",
    "Stream": "cgru.core.stream", "release_memory": "cgru.core.backend",
    "parallel_enabled": "cgru._kernels.threads", "openmp_enabled": "cgru._kernels.threads",
    "get_include": "cgru.capi.info",
}

__all__ = ["Activation", "ACTIVATION_NAMES", "Cell", "GRUCell", "LSTMCell", "RNNCell",
           "LayerParams", "Network", "Topology", *_COMPILED, "__version__"]


def __getattr__(name):
    if name == "Params":
        from cgru.core import network
        network.warn_params()
        return Network
    module = _COMPILED.get(name)
    if module is None:
        raise AttributeError(f"module 'cgru' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
