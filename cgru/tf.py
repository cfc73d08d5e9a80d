"""TensorFlow's ``CudnnRNN`` op family on the CPU: every cuDNN mode with cuDNN's semantics.

TensorFlow registers ``CudnnRNN*`` kernels for GPUs only.  This module is the missing CPU
kernel set: the same inputs, attributes and outputs (as NumPy arrays), mapped onto cgru's
engine (``cgru.core.engine``; weights through ``cgru.systems.tf``)::

    params_size(num_layers, num_units, input_size, *, dtype, ..., num_proj)   -> int
    params_to_canonical(num_layers, num_units, input_size, params, *, num_params, ...)
    params_to_canonical_v2(num_layers, num_units, input_size, params, *, num_params_weights,
                           num_params_biases, ..., num_proj)                 -> (weights, biases)
    canonical_to_params(num_layers, num_units, input_size, weights, biases, *, ...)
    canonical_to_params_v2(num_layers, num_units, input_size, weights, biases, *, ...,
                           num_proj)                                          -> params
    cudnn_rnn(input, input_h, input_c, params, *, ..., is_training)
        -> (output, output_h, output_c, reserve_space)
    cudnn_rnn_v2(input, input_h, input_c, params, *, ..., is_training)
        -> (output, output_h, output_c, reserve_space, host_reserved)
    cudnn_rnn_v3(input, input_h, input_c, params, sequence_lengths, *, ..., num_proj,
                 is_training, time_major)     -> (same five)
    cudnn_rnn_backprop(input, input_h, input_c, params, output, output_h, output_c,
                       output_backprop, output_h_backprop, output_c_backprop, reserve_space)
        -> (input_backprop, input_h_backprop, input_c_backprop, params_backprop)
    cudnn_rnn_backprop_v2(… the same …, reserve_space, host_reserved)        -> (same four)
    cudnn_rnn_backprop_v3(input, input_h, input_c, params, sequence_lengths, output, output_h,
                          output_c, output_backprop, output_h_backprop, output_c_backprop,
                          reserve_space, host_reserved, *, ..., num_proj, time_major)

Attributes (keyword-only, TF's names and defaults): ``rnn_mode`` ("lstm" — TF's default —,
"gru", "rnn_tanh", "rnn_relu"), ``input_mode`` ("linear_input", "skip_input", "auto_select" —
skip when ``input_size == num_units``, else linear, as TF's ``ToRNNInputMode``), ``direction``
("unidirectional", "bidirectional"), ``dropout``, ``seed``, ``seed2``, ``num_proj``
(``params_size``, the V2 params ops and V3, as in TF — V1/V2 forward ops have none: an LSTM
there has no projection; an LSTM's recurrent projection size, ``0 < num_proj ≤ num_units``;
0: none; the other modes need 0), ``is_training``, ``time_major`` (V3).  String attributes may be ``str`` or
``bytes`` (TF's ``op.get_attr`` gives bytes).  TF's ``T`` is the dtype of the arrays (float32
or float64); the sizes of the forward and backprop calls come from the shapes, as in TF
(``input_size`` = last axis of ``input``; ``num_layers`` = the layer axis of ``input_h`` / D;
``num_units`` = last axis of ``input_h``, or of ``input_c`` for an LSTM with a projection,
whose ``input_h`` is ``num_proj`` wide).  The forward and backprop ops also take
``num_threads`` (cgru's, not a TF attribute: threads for cgru's pool, ``None`` = all usable
cores; results are identical for every value).

The cells (cuDNN's modes; ``W·x`` with ``W`` ``[H, width]``, ``σ`` the logistic function)::

    gru       r  = σ(W_r·x + b_Wr + R_r·h + b_Rr)
              z  = σ(W_z·x + b_Wz + R_z·h + b_Rz)
              n  = tanh(W_n·x + b_Wn + r ⊙ (R_n·h + b_Rn))
              h' = (1 − z) ⊙ n + z ⊙ h
    lstm      i  = σ(W_i·x + b_Wi + R_i·h + b_Ri)          f, o likewise (σ)
              g  = tanh(W_g·x + b_Wg + R_g·h + b_Rg)
              c' = f ⊙ c + i ⊙ g
              h' = o ⊙ tanh(c')             with num_proj = P:  h' = W_p·(o ⊙ tanh(c'))
    rnn_tanh  h' = tanh(W·x + b_W + R·h + b_R)
    rnn_relu  h' = max(0, W·x + b_W + R·h + b_R)

Shapes (``H`` = num_units, ``S`` = the state width: ``num_proj`` for an LSTM with a projection,
else ``H``): V1, V2 and V3 ``time_major=True``: ``input [T, N, I]``, ``input_h``/``output_h``
``[L·D, N, S]``, the LSTM's ``input_c``/``output_c`` ``[L·D, N, H]``, ``output [T, N, D·S]``;
V3 ``time_major=False``: ``input [N, T, I]``, ``output [N, T, D·S]``, ``input_h``/``output_h``
``[N, L·D, S]``, ``input_c``/``output_c`` ``[N, L·D, H]`` (as TF documents).  The backprop
outputs are shaped like ``input``, ``input_h``, ``input_c`` and ``params``.  State index
``l·D + d``; bidirectional outputs are ``[forward S | backward S]`` per step, the backward half
aligned to the original time.  ``sequence_lengths`` (V3, ints ``[N]`` in ``[0, T]``, any order):
outputs at ``t ≥ len`` are 0, the reverse direction starts at ``len − 1``, ``output_h`` (and
``output_c``) is the state after the last processed step (``input_h``, ``input_c`` for
``len = 0``).  For the modes without a cell state ``input_c`` is accepted and ignored, and
``output_c`` / ``input_c_backprop`` are empty arrays (as TF does).

Canonical lists (``params_to_canonical[_v2]`` / ``canonical_to_params[_v2]``), per pseudo-layer
``l·D + d``: ``K`` weights (``K = 2G``: the ``G`` input matrices ``[H, width]`` then the ``G``
recurrent ones ``[H, S]``, in cuDNN's linLayerID order; an LSTM with ``num_proj`` adds its
projection ``W_p [num_proj, H]`` last, ``K = 9``, as TF's ``CudnnRNNParamsToCanonicalV2``) and
``2G`` biases ``[H]`` (none for the projection).  Index ``i = (l·D + d)·K + k``
(weights), ``(l·D + d)·2G + k`` (biases)::

    gru       k = 0 W_r  1 W_z  2 W_n  3 R_r  4 R_z  5 R_n                       G = 3
    lstm      k = 0 W_i  1 W_f  2 W_g  3 W_o  4 R_i  5 R_f  6 R_g  7 R_o  (8 W_p)   G = 4
    rnn_*     k = 0 W    1 R                                                       G = 1
    biases:   b_W per gate, then b_R per gate, in the same linLayerID slots

TF's ``num_params`` (V1) is the count of each list without a projection (``2G·L·D``);
``num_params_weights`` / ``num_params_biases`` (V2) are ``K·L·D`` / ``2G·L·D``.  ``width`` is
``input_size`` for layer 0 (both directions) and ``D·S`` above.  With ``skip_input`` (or
``auto_select`` resolving to it) the layer-0 input matrices are the identity and are not
stored: their slots in the weights list hold ``[H, 0]`` arrays (and ``canonical_to_params``
expects ``[H, 0]`` there); their biases still exist and apply.

Opaque ``params`` layout (cgru's, the same as the C ABI weight space, ``cgru.Network.flat``):
every matrix of pseudo-layer 0 (= ``l·D + d``) in linLayerID order, each row-major, then its
projection, then those of pseudo-layer 1, …; then every bias in the same order.  That is::

    params = concat(w.ravel() for w in weights) ++ concat(biases)

For one unidirectional GRU layer this is exactly the flat vector Keras builds for
``CudnnRNNV3`` (per-gate transposed kernels with the z/r blocks swapped into r, z, n order, six
weights then six biases), and for one unidirectional LSTM layer too (per-gate transposed
kernels in i, f, c, o order; Keras puts its one bias on the recurrent side, zeros on the input
side), so such buffers move between TF/cuDNN and cgru unchanged.  cuDNN itself declares its
buffer opaque: for other configurations move parameters between a real cuDNN and cgru through
the canonical lists (``tf.raw_ops.CudnnRNNParamsToCanonicalV2`` on the GPU side).

``reserve_space`` (training only) is the core's reserve itself (``cgru.core.reserve``): a 1-D
``uint8`` array holding a header (the model's and the call's digests — ``input``, ``params``,
``input_h`` and ``input_c`` —, the layout, dropout and seeds) and the sequence lengths, gate
values and states of every step, each layer's input.  The backprop ops check it against their
own arguments and raise ``ValueError`` for an inference (empty) reserve, a reserve of another
call (different inputs, params, lengths, shapes, mode, layout or attributes — ``seed``/
``seed2`` count only with dropout) or a damaged one — they never read garbage.

Deviations from TensorFlow (all deliberate):

* ``seed = seed2 = 0`` is an ordinary fixed seed: results are always reproducible.  Dropout
  masks are ``cgru.dropout_masks`` (NumPy PCG64 seeded by ``(seed, seed2, layer)``); cuDNN's
  RNG stream cannot be reproduced on a CPU, so dropout results differ from a GPU's.
* ``reserve_space`` is ``uint8`` (TF: an opaque tensor of dtype ``T``); for the modes without
  a cell state ``output_c`` and ``input_c_backprop`` are empty arrays, ``host_reserved`` is an
  empty ``int8`` array (TF: dummy scalars); ``host_reserved`` is accepted and ignored.
* ``params_size`` returns a Python int (TF: an int32/int64 tensor ``[1]``).
* ``time_major=False`` states are transposed ``[N, L·D, ·]`` ↔ ``[L·D, N, ·]`` as TF documents;
  TF's GPU kernel hands the same memory to cuDNN's ``[L·D, N, ·]`` state descriptor without a
  transpose (the two readings coincide for ``L·D = 1``, the only case Keras uses).
* ``auto_select`` compares ``input_size`` with ``num_units`` (the cell width ``H``) in every
  op.  TF's params ops do the same, but its forward / backprop kernels compare it with the
  last axis of ``input_h`` — ``num_proj`` with a projection — so TF itself can disagree with its
  own ``params_size`` there.
* Backprop: ``output``, ``output_h`` and ``output_c`` are only shape-checked (cgru's reserve
  holds what the backward needs); ``output_backprop`` / ``output_h_backprop`` /
  ``output_c_backprop`` may be ``None`` (zeros).  ``params_backprop`` is this call's gradient
  (overwrite, as TF's op).
* ``sequence_lengths`` of ``cudnn_rnn_v3`` may be ``None`` (every sequence has length ``T``).
* ``num_params`` / ``num_params_weights`` / ``num_params_biases`` may be ``None`` (not
  checked); ``params_to_canonical`` (V1) also takes V2's attributes, as cgru 0.2 did.
* float16 / bfloat16 are not supported (``TypeError``).
"""
from collections import namedtuple

import numpy as np

from cgru.core import calls, engine, reserve as reserve_mod, validate
from cgru.core.network import Network, Topology
from cgru.systems import _rules, tf as tf_system
from cgru.systems.tf import tf_shape
from cgru._kernels.threads import resolve_num_threads

__all__ = ["params_size", "params_to_canonical", "params_to_canonical_v2",
           "canonical_to_params", "canonical_to_params_v2", "cudnn_rnn", "cudnn_rnn_v2",
           "cudnn_rnn_v3", "cudnn_rnn_backprop", "cudnn_rnn_backprop_v2",
           "cudnn_rnn_backprop_v3", "CudnnRNN", "CudnnRNNV2", "CudnnRNNV3",
           "CudnnRNNBackprop", "CudnnRNNCanonical"]

CudnnRNN = namedtuple("CudnnRNN", "output output_h output_c reserve_space")
CudnnRNN.__doc__ = "Outputs of ``cudnn_rnn`` (TF ``CudnnRNN``)."
CudnnRNNV2 = namedtuple("CudnnRNNV2", "output output_h output_c reserve_space host_reserved")
CudnnRNNV2.__doc__ = "Outputs of ``cudnn_rnn_v2`` (TF ``CudnnRNNV2``)."
CudnnRNNV3 = namedtuple("CudnnRNNV3", "output output_h output_c reserve_space host_reserved")
CudnnRNNV3.__doc__ = "Outputs of ``cudnn_rnn_v3`` (TF ``CudnnRNNV3``)."
CudnnRNNBackprop = namedtuple("CudnnRNNBackprop",
                              "input_backprop input_h_backprop input_c_backprop params_backprop")
CudnnRNNBackprop.__doc__ = "Outputs of the ``cudnn_rnn_backprop*`` ops."
CudnnRNNCanonical = namedtuple("CudnnRNNCanonical", "weights biases")
CudnnRNNCanonical.__doc__ = ("Outputs of ``params_to_canonical[_v2]`` (``K·L·D`` weights, "
                             "``2G·L·D`` biases).")

_INFERENCE_RESERVE = ("reserve_space: empty — it comes from a forward with is_training=False, "
                      "which saves nothing; run the forward with is_training=True to backprop")
_OTHER_CALL = ("reserve_space: does not come from a forward call with these input, input_h, "
               "input_c, params and sequence_lengths (their contents or shapes differ from the "
               "forward's)")


# --- attributes ----------------------------------------------------------------------------
_Attrs = namedtuple("_Attrs", "rnn_mode cell input_mode direction dropout seed seed2 num_proj")


def _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj=0):
    """Validated op attributes (TF's names, ``str`` or ``bytes``; TF's ``Invalid RNN …``)."""
    rnn_mode = _rules.option(rnn_mode, "rnn_mode", tf_system.RNN_MODES, " (Invalid RNN mode)")
    input_mode = _rules.option(input_mode, "input_mode", tuple(tf_system.INPUT_MODES),
                               " (Invalid RNN input mode)")
    direction = _rules.option(direction, "direction", tuple(tf_system.DIRECTIONS),
                              " (Invalid RNN direction mode)")
    p, s1, s2 = validate.dropout_and_seed(dropout, (seed, seed2))
    if isinstance(num_proj, bool) or not isinstance(num_proj, (int, np.integer)):
        raise TypeError(f"num_proj: expected an int, got {num_proj!r}")
    if num_proj < 0:
        raise ValueError(f"num_proj: expected 0 (no projection) or a positive int, got "
                         f"{num_proj}")
    if num_proj and rnn_mode != "lstm":
        raise ValueError(f"num_proj: expected 0 for rnn_mode={rnn_mode!r} (cuDNN's recurrent "
                         f"projection exists for rnn_mode='lstm' only), got {num_proj}")
    return _Attrs(rnn_mode, tf_system.cell_of_mode(rnn_mode), input_mode, direction, p, s1, s2,
                  int(num_proj))


def _size_arg(value, name):
    """A positive int from an int or an integer scalar array (TF passes int32 scalars)."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int scalar, got {value!r}")
    if value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value}")
    return int(value)


def _topology(num_layers, num_units, input_size, attrs):
    """The core's ``Topology``; resolves ``auto_select`` as TF's ``ToRNNInputMode``."""
    L = _size_arg(num_layers, "num_layers")
    H = _size_arg(num_units, "num_units")
    I = _size_arg(input_size, "input_size")
    if attrs.num_proj > H:
        raise ValueError(f"num_proj: expected at most num_units={H} (cuDNN's rule: the "
                         f"projection narrows h), got {attrs.num_proj}")
    mode = tf_system.input_mode_of(attrs.input_mode, I, H)
    if mode == "skip" and I != H:
        raise ValueError(f"input_mode='skip_input' needs input_size == num_units (cuDNN's "
                         f"CUDNN_SKIP_INPUT adds the input to the gates unprojected), got "
                         f"input_size={I}, num_units={H}")
    return Topology(input_size=I, hidden_size=H, num_layers=L,
                    direction=tf_system.DIRECTIONS[attrs.direction], input_mode=mode,
                    proj_size=attrs.num_proj)


def _describe(topo, attrs):
    mode = "skip_input" if topo.input_mode == "skip" else "linear_input"
    direction = "bidirectional" if topo.num_directions == 2 else "unidirectional"
    proj = f", num_proj={topo.proj_size}" if topo.proj_size else ""
    return (f"rnn_mode={attrs.rnn_mode!r}, num_layers={topo.num_layers}, "
            f"num_units={topo.hidden_size}, input_size={topo.input_size}{proj}, "
            f"input_mode={mode!r}, direction={direction!r}")


# --- params size and the canonical lists ---------------------------------------------------
def params_size(num_layers, num_units, input_size, *, dtype=np.float32, rnn_mode="lstm",
                input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
                seed2=0, num_proj=0):
    """Number of elements of the opaque ``params`` buffer (TF ``CudnnRNNParamsSize``).

    Per pseudo-layer ``l·D + d``: ``G·H·width + G·H·S + P·H + 2G·H`` with ``G`` the mode's gate
    count, ``width`` the layer's input width (0 for layer 0 in skip-input mode), ``S`` the
    state width and ``P = num_proj``.  ``dtype`` (TF's ``T``) must be float32 or float64 and
    does not change the count.  Refused (``ValueError``) when the buffer would exceed what
    cgru supports (2^62 bytes), as the calls would be.
    """
    dt = validate.as_dtype(dtype, "dtype")
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    n = _topology(num_layers, num_units, input_size, attrs).flat_size(attrs.cell.gates)
    validate.nbytes_limit(n * dt.itemsize, f"num_layers={num_layers}, num_units={num_units}, "
                          f"input_size={input_size}", f"the params buffer ({n} {dt.name})")
    return n


def _network(topo, attrs, params, dtype=None, copy=True):
    """The ``cgru.Network`` of the opaque buffer — a copy, or (``copy=False``) views of it
    when it is C-contiguous — with TF-like size/dtype errors."""
    validate.plain_array(params, "params", "[params_size]")
    if dtype is None:
        validate.as_dtype(params.dtype, "params.dtype")
    elif params.dtype != dtype:
        raise TypeError(f"params: expected dtype {dtype} (the dtype of input), got "
                        f"{params.dtype}")
    n = topo.flat_size(attrs.cell.gates)
    if params.ndim != 1 or params.size != n:
        raise ValueError(f"Invalid params size: expected a 1-D array of {n} elements "
                         f"(params_size for {_describe(topo, attrs)}), got shape "
                         f"{tf_shape(params.shape)}")
    return Network.from_flat(topo, params, cell=attrs.cell,
                             copy=copy or not params.flags.c_contiguous)


def _counts(topo, attrs):
    """``(K, B, text)``: weights and biases per pseudo-layer, and how the messages say it."""
    G = attrs.cell.gates
    K = 2 * G + bool(topo.proj_size)
    proj = ", the projection last" if topo.proj_size else ""
    return K, 2 * G, (f"per layer and direction for rnn_mode={attrs.rnn_mode!r}{proj}; "
                      f"L={topo.num_layers}, D={topo.num_directions}")


def _check_num_params(topo, attrs, **given):
    """TF's ``num_params`` (V1: no projection), ``num_params_weights`` and
    ``num_params_biases`` (V2), each ``None`` (not checked) or the count of its list."""
    K, B, text = _counts(topo, attrs)
    LD = topo.num_layer_directions
    want = {"num_params": K * LD, "num_params_weights": K * LD, "num_params_biases": B * LD}
    for name, value in given.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name}: expected an int, got {value!r}")
        if name == "num_params" and topo.proj_size:
            raise ValueError(f"num_params: CudnnRNNParamsToCanonical (V1) has no projection; "
                             f"with num_proj={topo.proj_size} give num_params_weights={K * LD} "
                             f"and num_params_biases={B * LD} (params_to_canonical_v2)")
        if value != want[name]:
            per = B if name == "num_params_biases" else K
            raise ValueError(f"{name}: expected {want[name]} ({per} {text}), got {value}")


def _to_canonical(num_layers, num_units, input_size, params, attrs, **counts):
    topo = _topology(num_layers, num_units, input_size, attrs)
    _check_num_params(topo, attrs, **counts)
    net = _network(topo, attrs, params)        # a copy: the lists may be views of it
    return CudnnRNNCanonical(*tf_system.canonical_lists(net, copy=False))


def params_to_canonical(num_layers, num_units, input_size, params, *, num_params=None,
                        rnn_mode="lstm", input_mode="linear_input", direction="unidirectional",
                        dropout=0.0, seed=0, seed2=0, num_params_weights=None,
                        num_params_biases=None, num_proj=0):
    """Split the opaque ``params`` into the canonical lists (TF ``CudnnRNNParamsToCanonical``;
    ``num_params``, when given, must equal ``2G·L·D``).  Also takes V2's ``num_params_weights``,
    ``num_params_biases`` and ``num_proj`` (``params_to_canonical_v2``).

    Returns ``CudnnRNNCanonical(weights, biases)``: ``weights[i]`` ``[H, width]`` /
    ``[H, S]`` / ``[P, H]``, ``biases[i]`` ``[H]``, in the order of the module docstring, in
    the dtype of ``params``; skip-input layer-0 input matrices are ``[H, 0]`` arrays.  The
    arrays are copies.
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    return _to_canonical(num_layers, num_units, input_size, params, attrs,
                         num_params=num_params, num_params_weights=num_params_weights,
                         num_params_biases=num_params_biases)


def params_to_canonical_v2(num_layers, num_units, input_size, params, *,
                           num_params_weights=None, num_params_biases=None, rnn_mode="lstm",
                           input_mode="linear_input", direction="unidirectional", dropout=0.0,
                           seed=0, seed2=0, num_proj=0):
    """TF ``CudnnRNNParamsToCanonicalV2``: ``params_to_canonical`` with the projection.
    ``num_params_weights`` (``K·L·D``: 9 per pseudo-layer for an LSTM with ``num_proj``) and
    ``num_params_biases`` (``2G·L·D``), when given, must match."""
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    return _to_canonical(num_layers, num_units, input_size, params, attrs,
                         num_params_weights=num_params_weights,
                         num_params_biases=num_params_biases)


def _from_canonical(num_layers, num_units, input_size, weights, biases, attrs):
    topo = _topology(num_layers, num_units, input_size, attrs)
    K, B, text = _counts(topo, attrs)
    LD = topo.num_layer_directions
    for name, lst, per, count in (("weights", weights, K, "num_params_weights"),
                                  ("biases", biases, B, "num_params_biases")):
        if not isinstance(lst, (list, tuple)):
            raise TypeError(f"{name}: expected a list of {per * LD} numpy arrays, got "
                            f"{type(lst).__name__}")
        if len(lst) != per * LD:
            raise ValueError(f"{name}: expected {per * LD} arrays (TF's {count}: {per} {text}; "
                             f"index (l·D + d)·{per} + linLayerID), got {len(lst)}")
    return tf_system.network_from_canonical(topo, weights, biases, attrs.rnn_mode).flat()


def canonical_to_params(num_layers, num_units, input_size, weights, biases, *, rnn_mode="lstm",
                        input_mode="linear_input", direction="unidirectional", dropout=0.0,
                        seed=0, seed2=0, num_proj=0):
    """Pack the canonical lists into the opaque ``params`` (TF ``CudnnRNNCanonicalToParams``;
    ``num_proj`` as in ``canonical_to_params_v2``).

    ``weights``/``biases``: ``K·L·D`` and ``2G·L·D`` arrays in the order and shapes of
    ``params_to_canonical`` (``[H, 0]`` for skip-input layer-0 input matrices), one dtype.
    Returns a new 1-D array of ``params_size(...)`` elements in that dtype.
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    return _from_canonical(num_layers, num_units, input_size, weights, biases, attrs)


def canonical_to_params_v2(num_layers, num_units, input_size, weights, biases, *,
                           rnn_mode="lstm", input_mode="linear_input",
                           direction="unidirectional", dropout=0.0, seed=0, seed2=0,
                           num_proj=0):
    """TF ``CudnnRNNCanonicalToParamsV2``: ``canonical_to_params`` with the projection (TF's
    ``num_params_weights`` / ``num_params_biases`` are the lengths of the lists: 9 weights per
    pseudo-layer for an LSTM with ``num_proj``, the projection ``[num_proj, H]`` last)."""
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    return _from_canonical(num_layers, num_units, input_size, weights, biases, attrs)


# --- shared checks of the forward and backprop ops -----------------------------------------
_Call = namedtuple("_Call", "topo dtype T N net x h0 c0 lengths")


def _state_layout(time_major, width):
    return f"[L·D, N, {width}]" if time_major else f"[N, L·D, {width}]"


def _state(a, what, dtype, time_major, width):
    """A 3-D state array of ``dtype`` (``input_h`` / ``input_c``), TF's rank message."""
    validate.float_array(a, what, dtype, like="(the dtype of input)")
    if a.ndim != 3:
        raise ValueError(f"RNN {what} must be a 3-D array {_state_layout(time_major, width)}, "
                         f"got shape {tf_shape(a.shape)}")
    return a


def _check_input_c(input_c, input_h, attrs, dtype, time_major):
    """The LSTM's ``input_c`` (TF's ``ExtractForwardInput`` rules) and its width ``H``."""
    P = attrs.num_proj
    layout = _state_layout(time_major, "H")
    validate.plain_array(input_c, "input_c", layout + " (rnn_mode='lstm' needs the initial "
                                                      "cell state)")
    _state(input_c, "input_c", dtype, time_major, "H")
    if not P:
        if input_c.shape != input_h.shape:
            raise ValueError(f"Invalid input_c shape: {tf_shape(input_c.shape)} "
                             f"{tf_shape(input_h.shape)} (input_c: expected the shape of "
                             f"input_h, {layout} — TF: input_h and input_c must have the same "
                             f"shape w/o projection)")
        return input_c.shape[2]
    if input_c.shape[:2] != input_h.shape[:2] or input_c.shape[2] < P:
        want = tf_shape(input_h.shape[:2]) + f"+[H ≥ num_proj={P}]"
        raise ValueError(f"Invalid input_c shape: {tf_shape(input_c.shape)} {want} (input_c: "
                         f"expected {layout} with the first two axes of input_h and "
                         f"num_units H ≥ num_proj — TF: Invalid input_h and input_c w/ "
                         f"projection size)")
    return input_c.shape[2]


def _check_call(input, input_h, input_c, params, sequence_lengths, attrs, time_major):
    """Validate the forward inputs (TF's ``ExtractForwardInput``) and map them to the core."""
    layout = "[T, N, I]" if time_major else "[N, T, I]"
    validate.plain_array(input, "input", layout)
    dtype = validate.as_dtype(input.dtype, "input.dtype")
    if input.ndim != 3:
        raise ValueError(f"RNN input must be a 3-D array {layout}, got shape "
                         f"{tf_shape(input.shape)}")
    T, N = input.shape[:2] if time_major else input.shape[1::-1]
    validate.input_sizes("input", input.shape, T, N, layout,
                         ("max_seq_length", "batch_size", "input_size"))
    lstm = attrs.cell.has_cell_state
    S_name = "num_proj" if attrs.num_proj else "H"
    _state(input_h, "input_h", dtype, time_major, S_name)
    D = 2 if attrs.direction == "bidirectional" else 1
    L = input_h.shape[0 if time_major else 1] // D
    S = attrs.num_proj or input_h.shape[2]
    want = (L * D, N, S) if time_major else (N, L * D, S)
    if L == 0 or S == 0 or input_h.shape != want:
        proj = f" and S = num_proj={attrs.num_proj}" if attrs.num_proj else " and H ≥ 1"
        raise ValueError(f"Invalid input_h shape: {tf_shape(input_h.shape)} {tf_shape(want)} "
                         f"(input_h: expected {_state_layout(time_major, S_name)} with N={N} "
                         f"from input, L·D a positive multiple of D={D} ({attrs.direction})"
                         f"{proj})")
    H = _check_input_c(input_c, input_h, attrs, dtype, time_major) if lstm else S
    topo = _topology(L, H, input.shape[2], attrs)
    net = _network(topo, attrs, params, dtype, copy=False)   # views: the call keeps a copy
    lengths = validate.lengths(sequence_lengths, T, N, "sequence_lengths", "max_seq_length")
    h0 = _core_layout(input_h, time_major)
    c0 = _core_layout(input_c, time_major) if lstm else None
    return _Call(topo, dtype, T, N, net, calls.time_major(input, not time_major), h0, c0,
                 lengths)


def _core_layout(a, time_major):
    """An op's state as the core's ``[L·D, N, ·]``, C-contiguous (a copy only when needed)."""
    return np.ascontiguousarray(a if time_major else a.transpose(1, 0, 2))


def _tf_layout(a, time_major):
    """A core state ``[L·D, N, ·]`` in the op's layout (a new array for batch-major)."""
    return a if time_major else np.ascontiguousarray(a.transpose(1, 0, 2))


# --- forward ops ---------------------------------------------------------------------------
def _forward(input, input_h, input_c, params, sequence_lengths, attrs, is_training,
             time_major, num_threads):
    is_training = validate.flag(is_training, "is_training")
    call = _check_call(input, input_h, input_c, params, sequence_lengths, attrs, time_major)
    fwd = engine.run_forward(calls.ForwardCall.of(
        call.net, attrs.cell, call.x, call.h0, call.c0, call.lengths, None,
        attrs.dropout if is_training else 0.0, attrs.seed, attrs.seed2, is_training,
        not time_major, resolve_num_threads(num_threads)))
    output_c = np.empty(0, call.dtype) if fwd.cy is None else _tf_layout(fwd.cy, time_major)
    reserve = fwd.reserve if is_training else np.empty(0, np.uint8)
    return fwd.y, _tf_layout(fwd.hy, time_major), output_c, reserve


def cudnn_rnn(input, input_h, input_c, params, *, rnn_mode="lstm", input_mode="linear_input",
              direction="unidirectional", dropout=0.0, seed=0, seed2=0, is_training=True,
              num_threads=None):
    """TF ``CudnnRNN`` (V1, time-major).

    ``input [T, N, I]``, ``input_h [L·D, N, H]``, ``input_c`` ``[L·D, N, H]`` for
    ``rnn_mode="lstm"`` (ignored by the other modes), ``params`` the opaque buffer of
    ``params_size(L, H, I, ...)`` elements.  Returns ``CudnnRNN(output [T, N, D·H],
    output_h [L·D, N, H], output_c ([L·D, N, H]; empty without a cell state),
    reserve_space)``; ``reserve_space`` is empty unless ``is_training``.  Dropout (between
    layers) applies only when ``is_training``.
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2)
    return CudnnRNN(*_forward(input, input_h, input_c, params, None, attrs, is_training, True,
                              num_threads))


def cudnn_rnn_v2(input, input_h, input_c, params, *, rnn_mode="lstm",
                 input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
                 seed2=0, is_training=True, num_threads=None):
    """TF ``CudnnRNNV2``: ``cudnn_rnn`` plus the ``host_reserved`` output (an empty int8
    array; TF's V2 writes its algorithm choice there)."""
    out = cudnn_rnn(input, input_h, input_c, params, rnn_mode=rnn_mode, input_mode=input_mode,
                    direction=direction, dropout=dropout, seed=seed, seed2=seed2,
                    is_training=is_training, num_threads=num_threads)
    return CudnnRNNV2(*out, np.empty(0, np.int8))


def cudnn_rnn_v3(input, input_h, input_c, params, sequence_lengths=None, *, rnn_mode="lstm",
                 input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
                 seed2=0, num_proj=0, is_training=True, time_major=True, num_threads=None):
    """TF ``CudnnRNNV3``: ``cudnn_rnn_v2`` plus ``sequence_lengths`` (ints ``[N]`` in
    ``[0, T]``, any order; ``None`` = all ``T``), ``num_proj`` (an LSTM's projection: then
    ``input_h``/``output_h`` are ``num_proj`` wide, ``input_c``/``output_c`` ``num_units``
    wide, ``output`` ``D·num_proj``) and ``time_major`` (``False``: ``input [N, T, I]``,
    ``output [N, T, D·S]``, states ``[N, L·D, ·]``).  Returns ``CudnnRNNV3(output, output_h,
    output_c, reserve_space, host_reserved)``; ``host_reserved`` is an empty int8 array.
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    time_major = validate.flag(time_major, "time_major")
    out = _forward(input, input_h, input_c, params, sequence_lengths, attrs, is_training,
                   time_major, num_threads)
    return CudnnRNNV3(*out, np.empty(0, np.int8))


# --- the reserve space ---------------------------------------------------------------------
def _check_reserve(reserve_space, call, attrs, time_major):
    """Refuse a ``reserve_space`` whose header says it is not a training forward's of this
    call's shapes, layout and attributes (in TF's words; the core then checks the data)."""
    if not (isinstance(reserve_space, np.ndarray) and reserve_space.dtype == np.uint8
            and reserve_space.ndim == 1 and reserve_space.size):
        # not a byte vector, or empty: the core refuses it
        calls.open_reserve(reserve_space, call.net, attrs.cell, call.T, call.N, not time_major,
                           "reserve_space", _INFERENCE_RESERVE)
    if reserve_space.size < reserve_mod.HEADER * 8:
        raise ValueError(f"reserve_space: {reserve_space.size} bytes is too small for a cgru.tf "
                         f"reserve space (from a different call?)")
    if not reserve_mod.is_reserve(reserve_space):
        raise ValueError("reserve_space: not a cgru.tf reserve space (bad header); pass the "
                         "reserve_space of the matching training forward")
    nbytes = reserve_mod.Layout(call.topo, attrs.cell, call.T, call.N, call.dtype).nbytes
    if reserve_space.size != nbytes:
        raise ValueError(f"reserve_space: expected {nbytes} bytes for this call "
                         f"({_describe(call.topo, attrs)}, max_seq_length={call.T}, "
                         f"batch_size={call.N}, {call.dtype}), got {reserve_space.size} "
                         f"(truncated or padded, or from a different call?)")
    recorded = reserve_mod.read_header(reserve_space, "reserve_space")
    if recorded["batch_major"] == time_major:
        raise ValueError(f"reserve_space: the forward ran with a different layout (time_major="
                         f"{not recorded['batch_major']}) than this backprop call (time_major="
                         f"{time_major})")
    names = {"dropout": attrs.dropout}
    if attrs.dropout > 0:                   # the seeds matter only with dropout
        names.update(seed=attrs.seed, seed2=attrs.seed2)
    for name, value in names.items():
        if recorded[name] != value:
            raise ValueError(f"reserve_space: the forward ran with a different {name} than "
                             f"this backprop call ({recorded[name]} vs {value})")


# --- backprop ops --------------------------------------------------------------------------
def _check_like(a, what, dtype, shape, optional):
    if a is None and optional:
        return None
    validate.float_array(a, what, dtype, like="(the dtype of input)")
    if a.shape != shape:
        raise ValueError(f"Invalid {what} shape: {tf_shape(a.shape)} {tf_shape(shape)} "
                         f"({what}: expected {tf_shape(shape)})")
    return a


def _backprop(input, input_h, input_c, params, sequence_lengths, output, output_h, output_c,
              output_backprop, output_h_backprop, output_c_backprop, reserve_space, attrs,
              time_major, num_threads):
    call = _check_call(input, input_h, input_c, params, sequence_lengths, attrs, time_major)
    topo, T, N, dtype = call.topo, call.T, call.N, call.dtype
    LD, H, S, DS = (topo.num_layer_directions, topo.hidden_size, topo.state_size,
                    topo.output_size)
    y_shape = (T, N, DS) if time_major else (N, T, DS)
    h_shape = (LD, N, S) if time_major else (N, LD, S)
    c_shape = (LD, N, H) if time_major else (N, LD, H)
    _check_like(output, "output", dtype, y_shape, optional=True)
    _check_like(output_h, "output_h", dtype, h_shape, optional=True)
    dy = _check_like(output_backprop, "output_backprop", dtype, y_shape, optional=True)
    dhy = _check_like(output_h_backprop, "output_h_backprop", dtype, h_shape, optional=True)
    dcy = None
    if call.c0 is not None:
        _check_like(output_c, "output_c", dtype, c_shape, optional=True)
        dcy = _check_like(output_c_backprop, "output_c_backprop", dtype, c_shape,
                          optional=True)
    dhy = None if dhy is None else _core_layout(dhy, time_major)
    dcy = None if dcy is None else _core_layout(dcy, time_major)
    _check_reserve(reserve_space, call, attrs, time_major)
    nt = resolve_num_threads(num_threads)
    try:                        # the model, input, params, states or sequence_lengths differ
        bcall = calls.BackwardCall.of(
            call.net, attrs.cell, call.x, reserve_space,
            None if dy is None else calls.time_major(dy, not time_major), dhy, dcy, None,
            not time_major, None, False, nt, h0=call.h0, c0=call.c0, lengths=call.lengths,
            what="reserve_space", inference_hint=_INFERENCE_RESERVE)
    except ValueError as e:
        raise ValueError(_OTHER_CALL) from e
    g = engine.run_backward(bcall)
    dc0 = np.empty(0, dtype) if g.dc0 is None else _tf_layout(g.dc0, time_major)
    return CudnnRNNBackprop(g.dx, _tf_layout(g.dh0, time_major), dc0, g.dparams.flat())


def cudnn_rnn_backprop(input, input_h, input_c, params, output, output_h, output_c,
                       output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                       *, rnn_mode="lstm", input_mode="linear_input",
                       direction="unidirectional", dropout=0.0, seed=0, seed2=0,
                       num_threads=None):
    """TF ``CudnnRNNBackprop`` (V1): gradients of a training ``cudnn_rnn``.

    Pass the forward's inputs, its outputs, the gradients of the loss with respect to
    ``output``, ``output_h`` and (LSTM) ``output_c`` (``None``: zeros), its ``reserve_space``
    and the same attributes.  For the modes without a cell state ``input_c``, ``output_c`` and
    ``output_c_backprop`` are ignored.  Returns ``CudnnRNNBackprop(input_backprop,
    input_h_backprop, input_c_backprop (empty without a cell state), params_backprop)``,
    ``params_backprop`` in the opaque layout (this call's gradient).  Raises ``ValueError`` for
    an empty (inference) reserve or one from another call.
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2)
    return _backprop(input, input_h, input_c, params, None, output, output_h, output_c,
                     output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                     attrs, True, num_threads)


def cudnn_rnn_backprop_v2(input, input_h, input_c, params, output, output_h, output_c,
                          output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                          host_reserved=None, *, rnn_mode="lstm", input_mode="linear_input",
                          direction="unidirectional", dropout=0.0, seed=0, seed2=0,
                          num_threads=None):
    """TF ``CudnnRNNBackpropV2``: ``cudnn_rnn_backprop`` for a ``cudnn_rnn_v2`` forward, plus
    its ``host_reserved`` (ignored)."""
    return cudnn_rnn_backprop(input, input_h, input_c, params, output, output_h, output_c,
                              output_backprop, output_h_backprop, output_c_backprop,
                              reserve_space, rnn_mode=rnn_mode, input_mode=input_mode,
                              direction=direction, dropout=dropout, seed=seed, seed2=seed2,
                              num_threads=num_threads)


def cudnn_rnn_backprop_v3(input, input_h, input_c, params, sequence_lengths, output, output_h,
                          output_c, output_backprop, output_h_backprop, output_c_backprop,
                          reserve_space, host_reserved=None, *, rnn_mode="lstm",
                          input_mode="linear_input", direction="unidirectional", dropout=0.0,
                          seed=0, seed2=0, num_proj=0, time_major=True, num_threads=None):
    """TF ``CudnnRNNBackpropV3``: gradients of a training ``cudnn_rnn_v3``, shapes as there
    (``num_proj``, ``time_major``), ``sequence_lengths`` as given to the forward.
    ``host_reserved`` is ignored (as TF's V3 kernel does).  Otherwise as
    ``cudnn_rnn_backprop``.
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    time_major = validate.flag(time_major, "time_major")
    return _backprop(input, input_h, input_c, params, sequence_lengths, output, output_h,
                     output_c, output_backprop, output_h_backprop, output_c_backprop,
                     reserve_space, attrs, time_major, num_threads)


# --- the ops themselves in TensorFlow ------------------------------------------------------
def load_kernels():
    """Register CPU kernels for TensorFlow's own eleven ``CudnnRNN`` ops, computed by cgru
    (built on first use, cached; returns the library's path).  See ``cgru.tf_kernels`` and
    docs/tf_kernels.md.  Imported lazily: ``import cgru.tf`` never imports TensorFlow."""
    from cgru.tf_kernels import load_kernels as load
    return load()


__all__ += ["load_kernels"]
