"""TensorFlow's ``CudnnRNN`` op family on the CPU: ``rnn_mode="gru"`` with cuDNN's semantics.

TensorFlow registers ``CudnnRNN*`` kernels for GPUs only.  This module is the missing CPU
kernel set for GRUs: the same inputs, attributes and outputs (as NumPy arrays), mapped onto
cgru's engine (``cgru.core.engine``; weights through ``cgru.systems.tf``)::

    params_size(num_layers, num_units, input_size, *, dtype, ...)          -> int
    params_to_canonical(num_layers, num_units, input_size, params, *, ...) -> (weights, biases)
    canonical_to_params(num_layers, num_units, input_size, weights, biases, *, ...) -> params
    cudnn_rnn(input, input_h, input_c, params, *, ..., is_training)
        -> (output, output_h, output_c, reserve_space)
    cudnn_rnn_v3(input, input_h, input_c, params, sequence_lengths, *, ..., time_major)
        -> (output, output_h, output_c, reserve_space, host_reserved)
    cudnn_rnn_backprop(input, input_h, input_c, params, output, output_h, output_c,
                       output_backprop, output_h_backprop, output_c_backprop, reserve_space)
        -> (input_backprop, input_h_backprop, input_c_backprop, params_backprop)
    cudnn_rnn_backprop_v3(input, input_h, input_c, params, sequence_lengths, output, output_h,
                          output_c, output_backprop, output_h_backprop, output_c_backprop,
                          reserve_space, host_reserved)  -> (same four)

Attributes (keyword-only, TF's names and defaults except ``rnn_mode``): ``rnn_mode``
("gru"; "lstm", "rnn_relu", "rnn_tanh" raise ``NotImplementedError``), ``input_mode``
("linear_input", "skip_input", "auto_select" — skip when ``input_size == num_units``, else
linear, as TF's ``ToRNNInputMode``), ``direction`` ("unidirectional", "bidirectional"),
``dropout``, ``seed``, ``seed2``, ``num_proj`` (must be 0: projection is LSTM-only),
``is_training``, ``time_major`` (V3).  String attributes may be ``str`` or ``bytes`` (TF's
``op.get_attr`` gives bytes).  TF's ``T`` is the dtype of the arrays (float32 or
float64); the sizes of V1/V3 calls come from the shapes, as in TF (``input_size`` = last axis
of ``input``, ``num_units`` = last axis of ``input_h``, ``num_layers`` = its layer axis / D).
The forward and backprop ops also take ``num_threads`` (cgru's, not a TF attribute: threads for
cgru's pool, ``None`` = all usable cores; results are identical for every value).

The cell (cuDNN ``CUDNN_GRU``), gates r (reset), z (update), n (candidate)::

    r  = σ(W_r·x + b_Wr + R_r·h + b_Rr)
    z  = σ(W_z·x + b_Wz + R_z·h + b_Rz)
    n  = tanh(W_n·x + b_Wn + r ⊙ (R_n·h + b_Rn))
    h' = (1 − z) ⊙ n + z ⊙ h

Shapes: V1 (and V3 ``time_major=True``) ``input [T, N, I]``, ``input_h``/``output_h``
``[L·D, N, H]``, ``output [T, N, D·H]``; V3 ``time_major=False`` ``input [N, T, I]``,
``output [N, T, D·H]``, ``input_h``/``output_h`` ``[N, L·D, H]`` (as TF documents).  State
index ``l·D + d``; bidirectional outputs are ``[forward H | backward H]`` per step, the backward
half aligned to the original time.  ``sequence_lengths`` (V3, ints ``[N]`` in ``[0, T]``, any
order): outputs at ``t ≥ len`` are 0, the reverse direction starts at ``len − 1``, ``output_h``
is the state after the last processed step (``input_h`` for ``len = 0``).

Canonical lists (``params_to_canonical`` / ``canonical_to_params``): ``6·L·D`` weights and as
many biases, index ``i = (l·D + d)·6 + k`` with ``k`` cuDNN's linLayerID::

    k = 0 W_r   1 W_z   2 W_n      (input matrices,     [H, width], applied as W·x)
    k = 3 R_r   4 R_z   5 R_n      (recurrent matrices, [H, H])
    biases: b_Wr b_Wz b_Wn b_Rr b_Rz b_Rn in the same slots, each [H]

``width`` is ``input_size`` for layer 0 (both directions) and ``D·H`` above.  With
``skip_input`` (or ``auto_select`` resolving to it) the layer-0 input matrices are the identity
and are not stored: their slots in the weights list hold ``[H, 0]`` arrays (and
``canonical_to_params`` expects ``[H, 0]`` there); their biases still exist and apply.

Opaque ``params`` layout (cgru's, the same as the C ABI weight space, ``cgru.Network.flat``):
every matrix of pseudo-layer 0 (= ``l·D + d``) in linLayerID order 0…5, each ``[H, width]``
row-major, then those of pseudo-layer 1, …; then every bias in the same order.  That is::

    params = concat(w.ravel() for w in weights) ++ concat(biases)

For one unidirectional layer this is exactly the flat vector Keras builds for ``CudnnRNNV3``
(per-gate transposed kernels with the z/r blocks swapped into r, z, n order, six weights then
six biases), so such buffers move between TF/cuDNN and cgru unchanged.  cuDNN itself declares
its buffer opaque: for other configurations move parameters between a real cuDNN and cgru
through the canonical lists (``tf.raw_ops.CudnnRNNParamsToCanonical`` on the GPU side).

``reserve_space`` (training only) is the core's reserve itself (``cgru.core.reserve``): a 1-D
``uint8`` array holding a header (the model's and the call's digests — ``input``, ``params``,
``input_h`` —, the layout, dropout and seeds) and the sequence lengths, gate values and states
of every step, each layer's input.  The backprop ops check it against their own arguments and
raise ``ValueError`` for an inference (empty) reserve, a reserve of another call (different
inputs, params, lengths, shapes, layout or attributes — ``seed``/``seed2`` count only with
dropout) or a damaged one — they never read garbage.

Deviations from TensorFlow (all deliberate):

* ``rnn_mode`` defaults to "gru" (TF: "lstm"); only "gru" is implemented.
* ``seed = seed2 = 0`` is an ordinary fixed seed: results are always reproducible.  Dropout
  masks are ``cgru.dropout_masks`` (NumPy PCG64 seeded by ``(seed, seed2, layer)``); cuDNN's
  RNG stream cannot be reproduced on a CPU, so dropout results differ from a GPU's.
* ``reserve_space`` is ``uint8`` (TF: an opaque tensor of dtype ``T``); ``output_c`` and
  ``input_c_backprop`` are empty arrays, ``host_reserved`` an empty ``int8`` array (TF: dummy
  scalars); ``input_c`` and ``host_reserved`` are accepted and ignored, as TF does for GRU.
* ``params_size`` returns a Python int (TF: an int32/int64 tensor ``[1]``).
* ``time_major=False`` states are transposed ``[N, L·D, H]`` ↔ ``[L·D, N, H]`` as TF documents;
  TF's GPU kernel hands the same memory to cuDNN's ``[L·D, N, H]`` state descriptor without a
  transpose (the two readings coincide for ``L·D = 1``, the only case Keras uses).
* Backprop: ``output`` and ``output_h`` are only shape-checked (cgru's reserve holds what the
  backward needs); ``output_backprop`` / ``output_h_backprop`` may be ``None`` (zeros).
  ``params_backprop`` is this call's gradient (overwrite, as TF's op).
* ``sequence_lengths`` of ``cudnn_rnn_v3`` may be ``None`` (every sequence has length ``T``).
* float16 / bfloat16 are not supported (``TypeError``).
"""
from collections import namedtuple

import numpy as np

from cgru.core import engine, reserve as reserve_mod, validate
from cgru.core.cells import GRUCell
from cgru.core.network import Network, Topology
from cgru.systems import _rules, tf as tf_system
from cgru.systems.tf import tf_shape

__all__ = ["params_size", "params_to_canonical", "canonical_to_params", "cudnn_rnn",
           "cudnn_rnn_v3", "cudnn_rnn_backprop", "cudnn_rnn_backprop_v3",
           "CudnnRNN", "CudnnRNNV3", "CudnnRNNBackprop", "CudnnRNNCanonical"]

CudnnRNN = namedtuple("CudnnRNN", "output output_h output_c reserve_space")
CudnnRNN.__doc__ = "Outputs of ``cudnn_rnn`` (TF ``CudnnRNN``)."
CudnnRNNV3 = namedtuple("CudnnRNNV3", "output output_h output_c reserve_space host_reserved")
CudnnRNNV3.__doc__ = "Outputs of ``cudnn_rnn_v3`` (TF ``CudnnRNNV3``)."
CudnnRNNBackprop = namedtuple("CudnnRNNBackprop",
                              "input_backprop input_h_backprop input_c_backprop params_backprop")
CudnnRNNBackprop.__doc__ = "Outputs of ``cudnn_rnn_backprop`` / ``cudnn_rnn_backprop_v3``."
CudnnRNNCanonical = namedtuple("CudnnRNNCanonical", "weights biases")
CudnnRNNCanonical.__doc__ = "Outputs of ``params_to_canonical`` (two lists of ``6·L·D`` arrays)."

_CELL = GRUCell()                   # cuDNN's CUDNN_GRU
_INFERENCE_RESERVE = ("reserve_space: empty — it comes from a forward with is_training=False, "
                      "which saves nothing; run the forward with is_training=True to backprop")
_OTHER_CALL = ("reserve_space: does not come from a forward call with these input, input_h, "
               "params and sequence_lengths (their contents or shapes differ from the "
               "forward's)")


# --- attributes ----------------------------------------------------------------------------
_Attrs = namedtuple("_Attrs", "input_mode direction dropout seed seed2")


def _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj=0):
    """Validated op attributes (TF's names, ``str`` or ``bytes``; TF's ``Invalid RNN …``)."""
    rnn_mode = _rules.option(rnn_mode, "rnn_mode", tf_system.RNN_MODES, " (Invalid RNN mode)")
    if rnn_mode != "gru":
        raise NotImplementedError(f"rnn_mode={rnn_mode!r} is not implemented by cgru.tf; only "
                                  f"rnn_mode='gru' (cuDNN's GRU) is")
    input_mode = _rules.option(input_mode, "input_mode", tuple(tf_system.INPUT_MODES),
                               " (Invalid RNN input mode)")
    direction = _rules.option(direction, "direction", tuple(tf_system.DIRECTIONS),
                              " (Invalid RNN direction mode)")
    p, s1, s2 = validate.dropout_and_seed(dropout, (seed, seed2))
    if isinstance(num_proj, bool) or not isinstance(num_proj, (int, np.integer)):
        raise TypeError(f"num_proj: expected an int, got {num_proj!r}")
    if num_proj != 0:
        raise ValueError(f"num_proj: expected 0 for rnn_mode='gru' (projection is LSTM-only), "
                         f"got {num_proj}")
    return _Attrs(input_mode, direction, p, s1, s2)


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
    mode = tf_system.input_mode_of(attrs.input_mode, I, H)
    if mode == "skip" and I != H:
        raise ValueError(f"input_mode='skip_input' needs input_size == num_units (cuDNN's "
                         f"CUDNN_SKIP_INPUT adds the input to the gates unprojected), got "
                         f"input_size={I}, num_units={H}")
    return Topology(input_size=I, hidden_size=H, num_layers=L,
                    direction=tf_system.DIRECTIONS[attrs.direction], input_mode=mode)


def _describe(topo):
    mode = "skip_input" if topo.input_mode == "skip" else "linear_input"
    direction = "bidirectional" if topo.num_directions == 2 else "unidirectional"
    return (f"num_layers={topo.num_layers}, num_units={topo.hidden_size}, "
            f"input_size={topo.input_size}, input_mode={mode!r}, direction={direction!r}")


# --- params size and the canonical lists ---------------------------------------------------
def params_size(num_layers, num_units, input_size, *, dtype=np.float32, rnn_mode="gru",
                input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
                seed2=0, num_proj=0):
    """Number of elements of the opaque ``params`` buffer (TF ``CudnnRNNParamsSize``).

    Per pseudo-layer ``l·D + d``: ``3H·width + 3H·H + 6H`` with ``width`` the layer's input
    width (0 for layer 0 in skip-input mode).  ``dtype`` (TF's ``T``) must be float32 or
    float64 and does not change the count.  Refused (``ValueError``) when the buffer would
    exceed what cgru supports (2^62 bytes), as the calls would be.
    """
    dt = validate.as_dtype(dtype, "dtype")
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    n = _topology(num_layers, num_units, input_size, attrs).flat_size()
    validate.nbytes_limit(n * dt.itemsize, "params_size")
    return n


def _network(topo, params, dtype=None):
    """The ``cgru.Network`` of the opaque buffer (a copy), with TF-like size/dtype errors."""
    validate.plain_array(params, "params", "[params_size]")
    if dtype is None:
        validate.as_dtype(params.dtype, "params.dtype")
    elif params.dtype != dtype:
        raise TypeError(f"params: expected dtype {dtype} (the dtype of input), got "
                        f"{params.dtype}")
    n = topo.flat_size()
    if params.ndim != 1 or params.size != n:
        raise ValueError(f"Invalid params size: expected a 1-D array of {n} elements "
                         f"(params_size for {_describe(topo)}), got shape "
                         f"{tf_shape(params.shape)}")
    return Network.from_flat(topo, params, cell=_CELL)


def _check_num_params(topo, **given):
    n = 6 * topo.num_layer_directions
    for name, value in given.items():
        if value is not None and value != n:
            raise ValueError(f"{name}: expected {n} (6 per layer and direction, L="
                             f"{topo.num_layers} × D={topo.num_directions} × 6), got {value}")


def params_to_canonical(num_layers, num_units, input_size, params, *, num_params=None,
                        num_params_weights=None, num_params_biases=None, rnn_mode="gru",
                        input_mode="linear_input", direction="unidirectional", dropout=0.0,
                        seed=0, seed2=0, num_proj=0):
    """Split the opaque ``params`` into the canonical lists (TF ``CudnnRNNParamsToCanonical``
    and ``…V2``; ``num_params*``, when given, must equal ``6·L·D``).

    Returns ``CudnnRNNCanonical(weights, biases)``: ``weights[i]`` ``[H, width]``,
    ``biases[i]`` ``[H]``, ``i = (l·D + d)·6 + linLayerID`` (module docstring), in the dtype of
    ``params``; skip-input layer-0 input matrices are ``[H, 0]`` arrays.  The arrays are copies.
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    topo = _topology(num_layers, num_units, input_size, attrs)
    _check_num_params(topo, num_params=num_params, num_params_weights=num_params_weights,
                      num_params_biases=num_params_biases)
    net = _network(topo, params)          # a copy: the lists may be views of it
    return CudnnRNNCanonical(*tf_system.canonical_lists(net, copy=False))


def canonical_to_params(num_layers, num_units, input_size, weights, biases, *, rnn_mode="gru",
                        input_mode="linear_input", direction="unidirectional", dropout=0.0,
                        seed=0, seed2=0, num_proj=0):
    """Pack the canonical lists into the opaque ``params`` (TF ``CudnnRNNCanonicalToParams``).

    ``weights``/``biases``: ``6·L·D`` arrays each in the order and shapes of
    ``params_to_canonical`` (``[H, 0]`` for skip-input layer-0 input matrices), one dtype.
    Returns a new 1-D array of ``params_size(...)`` elements in that dtype.
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    topo = _topology(num_layers, num_units, input_size, attrs)
    n = 6 * topo.num_layer_directions
    for name, lst in (("weights", weights), ("biases", biases)):
        if not isinstance(lst, (list, tuple)):
            raise TypeError(f"{name}: expected a list of {n} numpy arrays, got "
                            f"{type(lst).__name__}")
        if len(lst) != n:
            raise ValueError(f"{name}: expected {n} arrays (6 per layer and direction, index "
                             f"(l·D + d)·6 + linLayerID; L={topo.num_layers}, "
                             f"D={topo.num_directions}), got {len(lst)}")
    return tf_system.network_from_canonical(topo, weights, biases).flat()


# --- shared checks of the forward and backprop ops -----------------------------------------
_Call = namedtuple("_Call", "topo dtype T N net x h0 lengths")


def _check_call(input, input_h, params, sequence_lengths, attrs, time_major):
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
    h_layout = "[L·D, N, H]" if time_major else "[N, L·D, H]"
    validate.float_array(input_h, "input_h", dtype, like="(the dtype of input)")
    if input_h.ndim != 3:
        raise ValueError(f"RNN input_h must be a 3-D array {h_layout}, got shape "
                         f"{tf_shape(input_h.shape)}")
    D = 2 if attrs.direction == "bidirectional" else 1
    L = input_h.shape[0 if time_major else 1] // D
    H = input_h.shape[2]
    want = (L * D, N, H) if time_major else (N, L * D, H)
    if L == 0 or H == 0 or input_h.shape != want:
        raise ValueError(f"Invalid input_h shape: {tf_shape(input_h.shape)} {tf_shape(want)} "
                         f"(input_h: expected {h_layout} with N={N} from input, L·D a positive "
                         f"multiple of D={D} ({attrs.direction}) and H ≥ 1)")
    topo = _topology(L, H, input.shape[2], attrs)
    net = _network(topo, params, dtype)
    lengths = validate.lengths(sequence_lengths, T, N, "sequence_lengths", "max_seq_length")
    h0 = input_h if time_major else input_h.transpose(1, 0, 2)
    return _Call(topo, dtype, T, N, net, input, h0, lengths)


# --- forward ops ---------------------------------------------------------------------------
def _forward(input, input_h, params, sequence_lengths, attrs, is_training, time_major,
             num_threads):
    is_training = validate.flag(is_training, "is_training")
    call = _check_call(input, input_h, params, sequence_lengths, attrs, time_major)
    fwd = engine.forward(call.net, input, call.h0, lengths=call.lengths,
                         batch_major=not time_major, training=is_training,
                         dropout=attrs.dropout, seed=(attrs.seed, attrs.seed2),
                         num_threads=num_threads)
    output_h = fwd.hy if time_major else np.ascontiguousarray(fwd.hy.transpose(1, 0, 2))
    reserve = fwd.reserve if is_training else np.empty(0, np.uint8)
    return fwd.y, output_h, np.empty(0, call.dtype), reserve


def cudnn_rnn(input, input_h, input_c, params, *, rnn_mode="gru", input_mode="linear_input",
              direction="unidirectional", dropout=0.0, seed=0, seed2=0, is_training=True,
              num_threads=None):
    """TF ``CudnnRNN`` (V1, time-major) for ``rnn_mode="gru"``.

    ``input [T, N, I]``, ``input_h [L·D, N, H]``, ``input_c`` ignored (GRU has no cell
    state), ``params`` the opaque buffer of ``params_size(L, H, I, ...)`` elements.  Returns
    ``CudnnRNN(output [T, N, D·H], output_h [L·D, N, H], output_c (empty), reserve_space)``;
    ``reserve_space`` is empty unless ``is_training``.  Dropout (between layers) applies only
    when ``is_training``.
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2)
    return CudnnRNN(*_forward(input, input_h, params, None, attrs, is_training, True,
                              num_threads))


def cudnn_rnn_v3(input, input_h, input_c, params, sequence_lengths=None, *, rnn_mode="gru",
                 input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
                 seed2=0, num_proj=0, is_training=True, time_major=True, num_threads=None):
    """TF ``CudnnRNNV3`` for ``rnn_mode="gru"``: ``cudnn_rnn`` plus ``sequence_lengths``
    (ints ``[N]`` in ``[0, T]``, any order; ``None`` = all ``T``) and ``time_major``
    (``False``: ``input [N, T, I]``, ``output [N, T, D·H]``, ``input_h``/``output_h``
    ``[N, L·D, H]``).  Returns ``CudnnRNNV3(output, output_h, output_c, reserve_space,
    host_reserved)``; ``host_reserved`` is an empty int8 array (TF's V3 writes a dummy).
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    time_major = validate.flag(time_major, "time_major")
    out = _forward(input, input_h, params, sequence_lengths, attrs, is_training, time_major,
                   num_threads)
    return CudnnRNNV3(*out, np.empty(0, np.int8))


# --- the reserve space ---------------------------------------------------------------------
def _check_reserve(reserve_space, call, attrs, time_major):
    """Refuse a ``reserve_space`` that is not the core reserve of a training forward with this
    call's ``input``, ``input_h``, ``params``, ``sequence_lengths`` and attributes."""
    def open_reserve(**data):
        return engine.open_reserve(reserve_space, call.net, call.x, cell=_CELL,
                                   batch_major=not time_major, what="reserve_space",
                                   inference_hint=_INFERENCE_RESERVE, **data)
    if not (isinstance(reserve_space, np.ndarray) and reserve_space.dtype == np.uint8
            and reserve_space.ndim == 1 and reserve_space.size):
        open_reserve(data=False)        # not a byte vector, or empty: the core refuses it
    if reserve_space.size < reserve_mod.HEADER * 8:
        raise ValueError(f"reserve_space: {reserve_space.size} bytes is too small for a cgru.tf "
                         f"reserve space (from a different call?)")
    if not reserve_mod.is_reserve(reserve_space):
        raise ValueError("reserve_space: not a cgru.tf reserve space (bad header); pass the "
                         "reserve_space of the matching training forward")
    nbytes = engine.reserve_nbytes(call.net, call.T, call.N)
    if reserve_space.size != nbytes:
        raise ValueError(f"reserve_space: expected {nbytes} bytes for this call "
                         f"({_describe(call.topo)}, max_seq_length={call.T}, "
                         f"batch_size={call.N}, {call.dtype}), got {reserve_space.size} "
                         f"(truncated or padded, or from a different call?)")
    recorded = reserve_mod.read_header(reserve_space)
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
    try:
        open_reserve(h0=call.h0, lengths=call.lengths)
    except ValueError as e:     # the model, input, params, input_h or sequence_lengths differ
        raise ValueError(_OTHER_CALL) from e


# --- backprop ops --------------------------------------------------------------------------
def _check_like(a, what, dtype, shape, optional):
    if a is None and optional:
        return None
    validate.float_array(a, what, dtype, like="(the dtype of input)")
    if a.shape != shape:
        raise ValueError(f"Invalid {what} shape: {tf_shape(a.shape)} {tf_shape(shape)} "
                         f"({what}: expected {tf_shape(shape)})")
    return a


def _backprop(input, input_h, params, sequence_lengths, output, output_h, output_backprop,
              output_h_backprop, reserve_space, attrs, time_major, num_threads):
    call = _check_call(input, input_h, params, sequence_lengths, attrs, time_major)
    topo, T, N, dtype = call.topo, call.T, call.N, call.dtype
    LD, H, DH = topo.num_layer_directions, topo.hidden_size, topo.output_size
    y_shape = (T, N, DH) if time_major else (N, T, DH)
    h_shape = (LD, N, H) if time_major else (N, LD, H)
    _check_like(output, "output", dtype, y_shape, optional=True)
    _check_like(output_h, "output_h", dtype, h_shape, optional=True)
    dy = _check_like(output_backprop, "output_backprop", dtype, y_shape, optional=True)
    dhy = _check_like(output_h_backprop, "output_h_backprop", dtype, h_shape, optional=True)
    if dhy is not None and not time_major:
        dhy = np.ascontiguousarray(dhy.transpose(1, 0, 2))
    _check_reserve(reserve_space, call, attrs, time_major)
    g = engine.backward(call.net, input, reserve_space, dy, dhy, batch_major=not time_major,
                        num_threads=num_threads)
    dh0 = g.dh0 if time_major else np.ascontiguousarray(g.dh0.transpose(1, 0, 2))
    return CudnnRNNBackprop(g.dx, dh0, np.empty(0, dtype), g.dparams.flat())


def cudnn_rnn_backprop(input, input_h, input_c, params, output, output_h, output_c,
                       output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                       *, rnn_mode="gru", input_mode="linear_input",
                       direction="unidirectional", dropout=0.0, seed=0, seed2=0,
                       num_threads=None):
    """TF ``CudnnRNNBackprop`` (V1) for ``rnn_mode="gru"``: gradients of a training
    ``cudnn_rnn``.

    Pass the forward's inputs, its outputs, the gradients of the loss with respect to
    ``output`` and ``output_h`` (``None``: zeros), its ``reserve_space`` and the same
    attributes.  ``input_c``, ``output_c`` and ``output_c_backprop`` are ignored.  Returns
    ``CudnnRNNBackprop(input_backprop, input_h_backprop, input_c_backprop (empty),
    params_backprop)``, ``params_backprop`` in the opaque layout (this call's gradient).
    Raises ``ValueError`` for an empty (inference) reserve or one from another call.
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2)
    return _backprop(input, input_h, params, None, output, output_h, output_backprop,
                     output_h_backprop, reserve_space, attrs, True, num_threads)


def cudnn_rnn_backprop_v3(input, input_h, input_c, params, sequence_lengths, output, output_h,
                          output_c, output_backprop, output_h_backprop, output_c_backprop,
                          reserve_space, host_reserved=None, *, rnn_mode="gru",
                          input_mode="linear_input", direction="unidirectional", dropout=0.0,
                          seed=0, seed2=0, num_proj=0, time_major=True, num_threads=None):
    """TF ``CudnnRNNBackpropV3`` for ``rnn_mode="gru"``: gradients of a training
    ``cudnn_rnn_v3``, shapes as there (``time_major``), ``sequence_lengths`` as given to the
    forward.  ``host_reserved`` is ignored (as TF's V3 kernel does).  Otherwise as
    ``cudnn_rnn_backprop``.
    """
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    time_major = validate.flag(time_major, "time_major")
    return _backprop(input, input_h, params, sequence_lengths, output, output_h,
                     output_backprop, output_h_backprop, reserve_space, attrs, time_major,
                     num_threads)
