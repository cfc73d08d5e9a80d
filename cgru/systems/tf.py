"""cuDNN / TensorFlow ``CudnnRNN``: the canonical lists, the opaque ``params`` and TF's
attribute names.

cuDNN computes the default cell only (reset after the recurrent product, sigmoid/tanh,
``h' = (1 − z)·n + z·h``), unidirectional forward or bidirectional, with a linear or a skip
input.  Canonical lists (``CudnnRNNParamsToCanonical``): ``6·L·D`` weights and as many biases,
index ``i = (l·D + d)·6 + k`` with ``k`` cuDNN's linLayerID::

    k = 0 W_r   1 W_z   2 W_n      (input matrices,     [H, width], applied as W·x)
    k = 3 R_r   4 R_z   5 R_n      (recurrent matrices, [H, H])
    biases: b_Wr b_Wz b_Wn b_Rr b_Rz b_Rn in the same slots, each [H]

— the row blocks of cgru's canonical ``W``, ``R``, ``b_W``, ``b_R``, no permutation.  ``width``
is the layer's input width (``input_size`` for layer 0, ``D·H`` above); skip mode's layer-0
input matrices are the identity and appear as ``[H, 0]`` arrays.  The opaque ``params``
vector is cgru's own layout (``Network.flat``).

TF's attribute names: ``rnn_mode`` (``RNN_MODES``), ``input_mode`` (``INPUT_MODES``: skip when
``auto_select`` and ``input_size == num_units``, as TF's ``ToRNNInputMode``), ``direction``
(``DIRECTIONS``: TF's name → cgru's).
"""
import numpy as np

from cgru.core import validate
from cgru.core.cells import GRUCell
from cgru.core.network import LayerParams, Network, Topology
from cgru.systems import _rules

__all__ = ["to_tf_canonical", "from_tf_canonical", "to_tf_opaque", "from_tf_opaque",
           "canonical_lists", "network_from_canonical", "input_mode_of", "tf_shape",
           "RNN_MODES", "INPUT_MODES", "DIRECTIONS", "WEIGHT_NAMES", "BIAS_NAMES"]

TARGET = "TF CudnnRNN (cuDNN)"
RNN_MODES = ("rnn_relu", "rnn_tanh", "lstm", "gru")
INPUT_MODES = {"linear_input": "linear", "skip_input": "skip", "auto_select": None}
DIRECTIONS = {"unidirectional": "forward", "bidirectional": "bidirectional"}
WEIGHT_NAMES = ("W_r", "W_z", "W_n", "R_r", "R_z", "R_n")      # linLayerID 0…5
BIAS_NAMES = ("b_Wr", "b_Wz", "b_Wn", "b_Rr", "b_Rz", "b_Rn")
_CGRU_DIRECTIONS = tuple(DIRECTIONS.values())
_CGRU_INPUT_MODES = ("linear", "skip")


def tf_shape(shape):
    """A shape as TF's messages write it: ``[2,4]``."""
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


def input_mode_of(input_mode, input_size, num_units):
    """cgru's input mode for TF's ``input_mode`` (``auto_select`` resolved as TF's
    ``ToRNNInputMode``: skip when ``input_size == num_units``)."""
    mode = INPUT_MODES[input_mode]
    if mode is None:
        mode = "skip" if input_size == num_units else "linear"
    return mode


def _require(net, cell):
    topo, cell = _rules.network_and_cell(net, cell)
    _rules.require(cell, TARGET, reset_after=(True,))
    _rules.require_topology(topo, TARGET, _CGRU_DIRECTIONS,
                            " (cuDNN has unidirectional forward and bidirectional only)")
    return topo


def canonical_lists(net, copy=True):
    """``(weights, biases)`` of ``net`` (any cell of 3 gates; no refusals): the row blocks of
    every layer-direction in linLayerID order (copies, or views with ``copy=False``)."""
    H = net.topology.hidden_size
    take = np.copy if copy else (lambda a: a)
    weights, biases = [], []
    for lp in net:
        for M in (lp.W, lp.R):
            weights += [take(M[k * H:(k + 1) * H]) for k in range(3)]
        for b in (lp.b_W, lp.b_R):
            biases += [take(b[k * H:(k + 1) * H]) for k in range(3)]
    return weights, biases


def _slot(a, what, shape, dtype, like):
    """One canonical array, checked in TF's words; returns the dtype (set by the first)."""
    a = _rules.numpy_of(a)
    if dtype is None:
        dtype = validate.as_dtype(validate.plain_array(a, what).dtype, f"{what}.dtype")
    validate.float_array(a, what, dtype, like=like)
    if a.shape != shape:
        raise ValueError(f"{what}: Params size mismatch: expected shape {tf_shape(shape)}, "
                         f"got {tf_shape(a.shape)}")
    return a, dtype


def network_from_canonical(topo, weights, biases, dtype=None, like=None):
    """A ``cgru.Network`` (cuDNN's cell) from canonical lists of ``6·L·D`` arrays each, in the
    order and shapes of the module docstring.  ``dtype``: the dtype every array must have
    (``None``: that of ``weights[0]``); ``like`` names where it comes from in messages.
    The arrays are copied."""
    H, D = topo.hidden_size, topo.num_directions
    like = like or "(the dtype of weights[0])"
    layers = []
    for i in range(topo.num_layer_directions):
        width = topo.shapes(i)["W"][1]
        w, b = [], []
        for k in range(6):
            j = i * 6 + k
            where = f"(layer {i // D}, direction {i % D}, linLayerID {k})"
            a, dtype = _slot(weights[j], f"weights[{j}] {WEIGHT_NAMES[k]} {where}",
                             (H, width if k < 3 else H), dtype, like)
            w.append(a)
            a, dtype = _slot(biases[j], f"biases[{j}] {BIAS_NAMES[k]} {where}", (H,), dtype,
                             like)
            b.append(a)
        layers.append(LayerParams(W=np.concatenate(w[:3]), R=np.concatenate(w[3:]),
                                  b_W=np.concatenate(b[:3]), b_R=np.concatenate(b[3:])))
    return Network(topo, layers, GRUCell())


def to_tf_canonical(net, cell=None):
    """``(weights, biases)``: TF ``CudnnRNNParamsToCanonical`` lists (module docstring), copies.
    Index ``(l·D + d)·6 + k`` with ``k`` the cuDNN linLayerID; weights ``[H, width]``
    (``[H, 0]`` for layer 0's input matrices in skip mode), biases ``[H]``."""
    _require(net, cell)
    return canonical_lists(net)


def from_tf_canonical(weights, biases, *, direction="forward", input_mode="linear"):
    """A ``cgru.Network`` (cuDNN's cell) from TF canonical lists (see ``to_tf_canonical``); the
    number of layers, sizes and dtype are read from the lists (``H`` and the dtype from
    ``weights[3]``, the input width from ``weights[0]``).  ``direction`` ("forward",
    "bidirectional") and ``input_mode`` ("linear", "skip") in cgru's words, ``str`` or
    ``bytes``."""
    direction = _rules.option(direction, "direction", _CGRU_DIRECTIONS,
                              " (TF CudnnRNN has 'forward' (unidirectional) and "
                              "'bidirectional')")
    input_mode = _rules.option(input_mode, "input_mode", _CGRU_INPUT_MODES)
    weights = _rules.array_list(weights, "weights")
    biases = _rules.array_list(biases, "biases")
    D = 2 if direction == "bidirectional" else 1
    if len(weights) == 0 or len(weights) % (6 * D) or len(biases) != len(weights):
        raise ValueError(f"weights/biases: expected two lists of 6·L·D entries (D={D}), got "
                         f"{len(weights)} weights and {len(biases)} biases")
    R_r = _rules.weight(weights[3], "weights[3]")
    H = _rules.dim(R_r, "weights[3]", 0, "[H, H]")
    I = H if input_mode == "skip" else \
        _rules.dim(_rules.weight(weights[0], "weights[0]", R_r.dtype), "weights[0]", 1, "[H, I]")
    topo = Topology(I, H, len(weights) // (6 * D), direction, input_mode)
    return network_from_canonical(topo, weights, biases, R_r.dtype, "(the dtype of weights[3])")


def to_tf_opaque(net, cell=None):
    """TF's opaque ``params`` vector: cgru's layout, ``Network.flat()`` (module docstring)."""
    _require(net, cell)
    return net.flat()


def from_tf_opaque(flat, topology):
    """A ``cgru.Network`` (cuDNN's cell) from TF's opaque ``params`` and the topology it was
    sized for."""
    if not isinstance(topology, Topology):
        raise TypeError(f"topology: expected a cgru.Topology, got {type(topology).__name__}")
    _rules.require_topology(topology, TARGET, _CGRU_DIRECTIONS)
    return Network.from_flat(topology, _rules.weight(flat, "flat"), cell=GRUCell())
