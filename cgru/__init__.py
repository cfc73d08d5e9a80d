"""cgru — exact CPU GRU operators (cuDNN/TF, MPSGraph, ONNX, Arraymancer), forward and backward."""
from cgru.cell import Activation, Cell, ACTIVATION_NAMES
from cgru.params import LayerParams, Params, Topology
from cgru.engine import Forward, Gradients, backward, dropout_masks, forward, reserve_nbytes
from cgru._threads import openmp_enabled, parallel_enabled
from cgru._capi_info import get_include

__version__ = "0.1.0"

__all__ = ["Activation", "Cell", "ACTIVATION_NAMES", "LayerParams", "Params", "Topology",
           "Forward", "Gradients", "forward", "backward", "reserve_nbytes", "dropout_masks",
           "parallel_enabled", "openmp_enabled", "get_include", "__version__"]
