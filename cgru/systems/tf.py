"""cuDNN / TensorFlow ``CudnnRNN``: the canonical lists, the opaque ``params`` and TF's
attribute names, for every cuDNN cell mode.

cuDNN's modes (TF's ``rnn_mode``) and the cells they compute (``cell_of_mode``)::

    gru       cgru.GRUCell()        reset after the recurrent product, sigmoid gates, tanh
    lstm      cgru.LSTMCell()       gates i, f, g, o: sigmoid gates, tanh cell input and output;
                                    optionally a recurrent projection W_p [P, H] (num_proj)
    rnn_tanh  cgru.RNNCell("tanh")
    rnn_relu  cgru.RNNCell("relu")

without clip, unidirectional forward or bidirectional, with a linear or a skip input.  With
``G`` gate blocks (3, 4, 1), the state width ``S`` (``P`` with a projection, else ``H``) and a
pseudo-layer ``l·D + d``'s input width ``width`` (``input_size`` for layer 0, ``D·S`` above, and
``0`` for layer 0 in skip mode), the canonical lists (``CudnnRNNParamsToCanonical[V2]``) hold
per pseudo-layer, in order::

    weights:  the G input matrices [H, width], the G recurrent ones [H, S] (linLayerID order,
              each applied as W·x), then the projection W_p [P, H] (LSTM with num_proj only)
    biases:   b_W then b_R per gate, [H] each, in the same linLayerID slots (none for W_p)

    gru       linLayerID 0 W_r  1 W_z  2 W_n  3 R_r  4 R_z  5 R_n
    lstm      linLayerID 0 W_i  1 W_f  2 W_g  3 W_o  4 R_i  5 R_f  6 R_g  7 R_o   (8 W_p)
    rnn_*     linLayerID 0 W    1 R

— the row blocks of cgru's canonical ``W``, ``R``, ``b_W``, ``b_R``, no permutation, and its
``W_p``.  Weight ``i = (l·D + d)·K + k`` (``K = 2G``, ``2G + 1`` with a projection), bias
``(l·D + d)·2G + k``.  Skip mode's layer-0 input matrices are the identity and appear as
``[H, 0]`` arrays.  The opaque ``params`` vector is cgru's own layout (``Network.flat``):
``concat(w.ravel() for w in weights) ++ concat(biases)``.

TF's attribute names: ``rnn_mode`` (``RNN_MODES``), ``input_mode`` (``INPUT_MODES``: skip when
``auto_select`` and ``input_size == num_units``, as TF's ``ToRNNInputMode``), ``direction``
(``DIRECTIONS``: TF's name → cgru's).
"""
import numpy as np

from cgru.core import validate
from cgru.core.cells import GRUCell, LSTMCell, RNNCell
from cgru.core.network import LayerParams, Network, Topology
from cgru.systems import _rules

__all__ = ["to_tf_canonical", "from_tf_canonical", "to_tf_opaque", "from_tf_opaque",
           "canonical_lists", "network_from_canonical", "cell_of_mode", "mode_of",
           "weight_names", "bias_names", "input_mode_of", "tf_shape",
           "RNN_MODES", "INPUT_MODES", "DIRECTIONS", "WEIGHT_NAMES", "BIAS_NAMES"]

TARGET = "TF CudnnRNN (cuDNN)"
RNN_MODES = ("rnn_relu", "rnn_tanh", "lstm", "gru")
INPUT_MODES = {"linear_input": "linear", "skip_input": "skip", "auto_select": None}
DIRECTIONS = {"unidirectional": "forward", "bidirectional": "bidirectional"}
# The gate letters of each mode, canonical order (= linLayerID order within W and within R).
_GATES = {"gru": "rzn", "lstm": "ifgo", "rnn_tanh": "", "rnn_relu": ""}
# The names of the weights and biases of one pseudo-layer, linLayerID order, per mode.
WEIGHT_NAMES = {m: tuple(f"{M}_{g}" for M in "WR" for g in gates) if gates else ("W", "R")
                for m, gates in _GATES.items()}
BIAS_NAMES = {m: tuple("b_" + n.replace("_", "") for n in names)
              for m, names in WEIGHT_NAMES.items()}
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


def cell_of_mode(rnn_mode):
    """The cgru cell cuDNN's ``rnn_mode`` computes (``RNN_MODES``; ``str`` or ``bytes``)."""
    rnn_mode = _rules.option(rnn_mode, "rnn_mode", RNN_MODES, " (Invalid RNN mode)")
    if rnn_mode == "gru":
        return GRUCell()
    if rnn_mode == "lstm":
        return LSTMCell()
    return RNNCell(rnn_mode[4:])


def mode_of(cell, target=TARGET):
    """TF's ``rnn_mode`` of ``cell``, or a ``ValueError`` when cuDNN cannot compute it."""
    if cell.kind == "gru":
        _rules.require(cell, target, reset_after=(True,))
        return "gru"
    if cell.kind == "lstm":
        _rules.require_lstm(cell, target)
        return "lstm"
    _rules.require_rnn(cell, target, lambda a: a.name in ("tanh", "relu"))
    return "rnn_" + cell.activation.name


def weight_names(rnn_mode, projection=False):
    """The canonical weight names of one pseudo-layer (linLayerID order; ``W_p`` last)."""
    return WEIGHT_NAMES[rnn_mode] + (("W_p",) if projection else ())


def bias_names(rnn_mode):
    """The canonical bias names of one pseudo-layer (linLayerID order)."""
    return BIAS_NAMES[rnn_mode]


def _require(net, cell):
    topo, cell = _rules.network_and_cell(net, cell)
    mode_of(cell)
    _rules.require_topology(topo, TARGET, _CGRU_DIRECTIONS,
                            " (cuDNN has unidirectional forward and bidirectional only)")
    return topo


def canonical_lists(net, copy=True):
    """``(weights, biases)`` of ``net`` (any cell; no refusals): per layer-direction the row
    blocks of ``W`` and ``R`` in linLayerID order, then ``W_p``; the bias blocks of ``b_W`` and
    ``b_R`` (copies, or views with ``copy=False``)."""
    H, G = net.topology.hidden_size, net.cell.gates
    take = np.copy if copy else (lambda a: a)
    weights, biases = [], []
    for lp in net:
        for M in (lp.W, lp.R):
            weights += [take(M[k * H:(k + 1) * H]) for k in range(G)]
        if lp.W_p is not None:
            weights.append(take(lp.W_p))
        for b in (lp.b_W, lp.b_R):
            biases += [take(b[k * H:(k + 1) * H]) for k in range(G)]
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


def network_from_canonical(topo, weights, biases, rnn_mode="gru", dtype=None, like=None):
    """A ``cgru.Network`` (the cell of ``rnn_mode``) from canonical lists in the order and
    shapes of the module docstring (the caller has checked their lengths).  ``dtype``: the
    dtype every array must have (``None``: that of ``weights[0]``); ``like`` names where it
    comes from in messages.  The arrays are copied."""
    cell = cell_of_mode(rnn_mode)
    H, D, G, P = topo.hidden_size, topo.num_directions, cell.gates, topo.proj_size
    wnames, bnames = weight_names(rnn_mode, bool(P)), bias_names(rnn_mode)
    K = len(wnames)
    like = like or "(the dtype of weights[0])"
    layers = []
    for i in range(topo.num_layer_directions):
        shapes = topo.shapes(i, G)
        want = [(H, shapes["W"][1])] * G + [(H, topo.state_size)] * G + [(P, H)] * bool(P)
        where = f"layer {i // D}, direction {i % D}"
        w, b = [], []
        for k, shape in enumerate(want):
            j = i * K + k
            a, dtype = _slot(weights[j], f"weights[{j}] {wnames[k]} ({where}, linLayerID {k})",
                             shape, dtype, like)
            w.append(a)
        for k in range(2 * G):
            j = i * 2 * G + k
            a, dtype = _slot(biases[j], f"biases[{j}] {bnames[k]} ({where}, linLayerID {k})",
                             (H,), dtype, like)
            b.append(a)
        layers.append(LayerParams(W=np.concatenate(w[:G]), R=np.concatenate(w[G:2 * G]),
                                  b_W=np.concatenate(b[:G]), b_R=np.concatenate(b[G:]),
                                  W_p=w[2 * G].copy() if P else None))
    return Network(topo, layers, cell)


def to_tf_canonical(net, cell=None):
    """``(weights, biases)``: TF ``CudnnRNNParamsToCanonical[V2]`` lists (module docstring),
    copies.  cuDNN's GRU, LSTM (with its projection ``W_p [P, H]`` last in each pseudo-layer's
    weights) and tanh / relu RNN; weights ``[H, width]`` (``[H, 0]`` for layer 0's input
    matrices in skip mode), biases ``[H]``."""
    _require(net, cell)
    return canonical_lists(net)


def from_tf_canonical(weights, biases, *, direction="forward", input_mode="linear",
                      rnn_mode="gru"):
    """A ``cgru.Network`` (the cuDNN cell of ``rnn_mode``) from TF canonical lists (see
    ``to_tf_canonical``).  The number of layers, the sizes, the projection (an LSTM with
    ``2G + 1`` weights per pseudo-layer) and the dtype are read from the lists (``H`` and the
    dtype from the first recurrent matrix, ``weights[G]``, the input width from ``weights[0]``,
    ``P`` from the projection ``weights[2G]``).  ``direction`` ("forward", "bidirectional") and
    ``input_mode`` ("linear", "skip") in cgru's words, ``rnn_mode`` in TF's ("gru" — the
    default, as before the other modes existed —, "lstm", "rnn_tanh", "rnn_relu"), each
    ``str`` or ``bytes``: the lists alone do not say which mode they are."""
    direction = _rules.option(direction, "direction", _CGRU_DIRECTIONS,
                              " (TF CudnnRNN has 'forward' (unidirectional) and "
                              "'bidirectional')")
    input_mode = _rules.option(input_mode, "input_mode", _CGRU_INPUT_MODES)
    rnn_mode = _rules.option(rnn_mode, "rnn_mode", RNN_MODES)
    cell = cell_of_mode(rnn_mode)
    weights = _rules.array_list(weights, "weights")
    biases = _rules.array_list(biases, "biases")
    D, G = (2 if direction == "bidirectional" else 1), cell.gates
    LD = len(biases) // (2 * G)
    proj = cell.kind == "lstm" and LD > 0 and len(weights) == (2 * G + 1) * LD
    if LD == 0 or len(biases) % (2 * G * D) or (len(weights) != 2 * G * LD and not proj):
        lstm = " (9·L·D weights with a projection)" if cell.kind == "lstm" else ""
        raise ValueError(f"weights/biases: expected two lists of {2 * G}·L·D entries{lstm} for "
                         f"rnn_mode={rnn_mode!r} (D={D}), got {len(weights)} weights and "
                         f"{len(biases)} biases")
    R0 = _rules.weight(weights[G], f"weights[{G}]")
    H = _rules.dim(R0, f"weights[{G}]", 0, "[H, S]")
    P = _rules.dim(_rules.weight(weights[2 * G], f"weights[{2 * G}]", R0.dtype),
                   f"weights[{2 * G}]", 0, "[P, H]") if proj else 0
    I = H if input_mode == "skip" else \
        _rules.dim(_rules.weight(weights[0], "weights[0]", R0.dtype), "weights[0]", 1, "[H, I]")
    topo = Topology(I, H, LD // D, direction, input_mode, proj_size=P)
    return network_from_canonical(topo, weights, biases, rnn_mode, R0.dtype,
                                  f"(the dtype of weights[{G}])")


def to_tf_opaque(net, cell=None):
    """TF's opaque ``params`` vector: cgru's layout, ``Network.flat()`` (module docstring)."""
    _require(net, cell)
    return net.flat()


def from_tf_opaque(flat, topology, *, rnn_mode="gru"):
    """A ``cgru.Network`` (the cuDNN cell of ``rnn_mode``, "gru" by default) from TF's opaque
    ``params`` and the topology it was sized for (its ``proj_size`` is the LSTM's
    ``num_proj``)."""
    if not isinstance(topology, Topology):
        raise TypeError(f"topology: expected a cgru.Topology, got {type(topology).__name__}")
    cell = cell_of_mode(rnn_mode)
    _rules.require_topology(topology, TARGET, _CGRU_DIRECTIONS)
    return Network.from_flat(topology, _rules.weight(flat, "flat"), cell=cell)
