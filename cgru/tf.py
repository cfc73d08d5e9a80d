"""TensorFlow's ``CudnnRNN`` op family on the CPU: ``rnn_mode="gru"`` with cuDNN's semantics.

TensorFlow registers ``CudnnRNN*`` kernels for GPUs only.  This module is the missing CPU
kernel set for GRUs: the same inputs, attributes and outputs (as NumPy arrays), mapped onto
cgru's engine (``cgru.forward`` / ``cgru.backward``)::

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
``is_training``, ``time_major`` (V3).  TF's ``T`` is the dtype of the arrays (float32 or
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

Opaque ``params`` layout (cgru's, the same as the C ABI weight space, ``cgru.Params.flat``):
every matrix of pseudo-layer 0 (= ``l·D + d``) in linLayerID order 0…5, each ``[H, width]``
row-major, then those of pseudo-layer 1, …; then every bias in the same order.  That is::

    params = concat(w.ravel() for w in weights) ++ concat(biases)

For one unidirectional layer this is exactly the flat vector Keras builds for ``CudnnRNNV3``
(per-gate transposed kernels with the z/r blocks swapped into r, z, n order, six weights then
six biases), so such buffers move between TF/cuDNN and cgru unchanged.  cuDNN itself declares
its buffer opaque: for other configurations move parameters between a real cuDNN and cgru
through the canonical lists (``tf.raw_ops.CudnnRNNParamsToCanonical`` on the GPU side).

``reserve_space`` (training only) is a 1-D ``uint8`` array: a 64-byte header
``int64[8]`` = (magic, version, flags (time_major, bidirectional, skip input), dropout as
float64 bits, seed, seed2, a CRC-32 of the call's ``input``, ``input_h``, ``params`` and
sequence lengths, the size of the rest), followed by the engine's reserve (``cgru.engine``
docstring: gate values and states of every step, each layer's input).  The backprop ops check
it against their own arguments and raise ``ValueError`` for an inference (empty) reserve, a
reserve of another call (different inputs, params, lengths, shapes, layout or attributes —
``seed``/``seed2`` count only with dropout) or a damaged one — they never read garbage.

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
import zlib

import numpy as np

from cgru._checks import input_sizes
from cgru.convert import _flag
from cgru.engine import backward, forward
from cgru.params import LayerParams, Params, Topology, as_dtype

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

_RNN_MODES = ("rnn_relu", "rnn_tanh", "lstm", "gru")
_INPUT_MODES = ("linear_input", "skip_input", "auto_select")
_DIRECTIONS = {"unidirectional": "forward", "bidirectional": "bidirectional"}
_WEIGHT_NAMES = ("W_r", "W_z", "W_n", "R_r", "R_z", "R_n")
_BIAS_NAMES = ("b_Wr", "b_Wz", "b_Wn", "b_Rr", "b_Rz", "b_Rn")

_RESERVE_MAGIC = 0x0166745F75726763  # "cgru_tf" + 0x01
_RESERVE_VERSION = 1
_HEADER_BYTES = 64  # int64[8]; keeps the engine's reserve 64-byte aligned
_FLAG_TIME_MAJOR, _FLAG_BIDIRECTIONAL, _FLAG_SKIP = 1, 2, 4


# --- attributes ----------------------------------------------------------------------------
_Attrs = namedtuple("_Attrs", "input_mode direction dropout seed seed2")


def _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj=0):
    """Validated op attributes (TF's names; messages after TF's ``Invalid RNN …``)."""
    if not isinstance(rnn_mode, str) or rnn_mode not in _RNN_MODES:
        raise ValueError(f"Invalid RNN mode: {rnn_mode!r} (rnn_mode: expected one of "
                         f"{', '.join(_RNN_MODES)})")
    if rnn_mode != "gru":
        raise NotImplementedError(f"rnn_mode={rnn_mode!r} is not implemented by cgru.tf; only "
                                  f"rnn_mode='gru' (cuDNN's GRU) is")
    if not isinstance(input_mode, str) or input_mode not in _INPUT_MODES:
        raise ValueError(f"Invalid RNN input mode: {input_mode!r} (input_mode: expected one of "
                         f"{', '.join(_INPUT_MODES)})")
    if not isinstance(direction, str) or direction not in _DIRECTIONS:
        raise ValueError(f"Invalid RNN direction mode: {direction!r} (direction: expected one "
                         f"of {', '.join(_DIRECTIONS)})")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float, np.integer,
                                                             np.floating)):
        raise TypeError(f"dropout: expected a float in [0, 1), got {dropout!r}")
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout: expected a float in [0, 1), got {dropout!r}")
    for name, v in (("seed", seed), ("seed2", seed2)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name}: expected an int, got {v!r}")
        if not -2 ** 63 <= int(v) < 2 ** 63:
            raise ValueError(f"{name}: expected a 64-bit int, got {v}")
    if isinstance(num_proj, bool) or not isinstance(num_proj, (int, np.integer)):
        raise TypeError(f"num_proj: expected an int, got {num_proj!r}")
    if num_proj != 0:
        raise ValueError(f"num_proj: expected 0 for rnn_mode='gru' (projection is LSTM-only), "
                         f"got {num_proj}")
    return _Attrs(input_mode, direction, float(dropout), int(seed), int(seed2))


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
    """The engine's ``Topology``; resolves ``auto_select`` as TF's ``ToRNNInputMode``."""
    L = _size_arg(num_layers, "num_layers")
    H = _size_arg(num_units, "num_units")
    I = _size_arg(input_size, "input_size")
    mode = attrs.input_mode
    if mode == "auto_select":
        mode = "skip_input" if I == H else "linear_input"
    if mode == "skip_input" and I != H:
        raise ValueError(f"input_mode='skip_input' needs input_size == num_units (cuDNN's "
                         f"CUDNN_SKIP_INPUT adds the input to the gates unprojected), got "
                         f"input_size={I}, num_units={H}")
    return Topology(input_size=I, hidden_size=H, num_layers=L,
                    direction=_DIRECTIONS[attrs.direction],
                    input_mode="skip" if mode == "skip_input" else "linear")


def _describe(topo):
    mode = "skip_input" if topo.input_mode == "skip" else "linear_input"
    direction = "bidirectional" if topo.num_directions == 2 else "unidirectional"
    return (f"num_layers={topo.num_layers}, num_units={topo.hidden_size}, "
            f"input_size={topo.input_size}, input_mode={mode!r}, direction={direction!r}")


def _tf_shape(shape):
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


# --- params size and the canonical lists ---------------------------------------------------
def params_size(num_layers, num_units, input_size, *, dtype=np.float32, rnn_mode="gru",
                input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
                seed2=0, num_proj=0):
    """Number of elements of the opaque ``params`` buffer (TF ``CudnnRNNParamsSize``).

    Per pseudo-layer ``l·D + d``: ``3H·width + 3H·H + 6H`` with ``width`` the layer's input
    width (0 for layer 0 in skip-input mode).  ``dtype`` (TF's ``T``) must be float32 or
    float64 and does not change the count.
    """
    as_dtype(dtype, "dtype")
    attrs = _attrs(rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj)
    return _topology(num_layers, num_units, input_size, attrs).flat_size()


def _params_from_flat(topo, params, dtype=None):
    """``cgru.Params`` from the opaque buffer, with TF-like size/dtype errors."""
    if not isinstance(params, np.ndarray):
        raise TypeError(f"params: expected a 1-D numpy array, got {type(params).__name__}")
    if dtype is None:
        as_dtype(params.dtype, "params.dtype")
    elif params.dtype != dtype:
        raise TypeError(f"params: expected dtype {dtype} (the dtype of input), got "
                        f"{params.dtype}")
    n = topo.flat_size()
    if params.ndim != 1 or params.size != n:
        raise ValueError(f"Invalid params size: expected a 1-D array of {n} elements "
                         f"(params_size for {_describe(topo)}), got shape "
                         f"{_tf_shape(params.shape)}")
    return Params.from_flat(topo, params)


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
    p = _params_from_flat(topo, params)
    H = topo.hidden_size
    weights, biases = [], []
    for lp in p:  # pseudo-layer l·D + d
        for M in (lp.W, lp.R):
            weights += [M[k * H:(k + 1) * H] for k in range(3)]
        for b in (lp.b_W, lp.b_R):
            biases += [b[k * H:(k + 1) * H] for k in range(3)]
    return CudnnRNNCanonical(weights, biases)


def _canonical_array(a, what, shape, dtype):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what}: expected a numpy array, got {type(a).__name__}")
    if dtype is None:
        dtype = as_dtype(a.dtype, f"{what}.dtype")
    elif a.dtype != dtype:
        raise TypeError(f"{what}: expected dtype {dtype} (the dtype of weights[0]), got "
                        f"{a.dtype}")
    if a.shape != shape:
        raise ValueError(f"{what}: Params size mismatch: expected shape {_tf_shape(shape)}, got "
                         f"{_tf_shape(a.shape)}")
    return dtype


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
    H, D = topo.hidden_size, topo.num_directions
    dtype = None
    layers = []
    for i in range(topo.num_layer_directions):
        width = topo.shapes(i)["W"][1]
        for k in range(6):
            j = i * 6 + k
            where = f"(layer {i // D}, direction {i % D}, linLayerID {k})"
            dtype = _canonical_array(weights[j], f"weights[{j}] {_WEIGHT_NAMES[k]} {where}",
                                     (H, width if k < 3 else H), dtype)
            dtype = _canonical_array(biases[j], f"biases[{j}] {_BIAS_NAMES[k]} {where}",
                                     (H,), dtype)
        w, b = weights[i * 6:i * 6 + 6], biases[i * 6:i * 6 + 6]
        layers.append(LayerParams(W=np.concatenate(w[:3]), R=np.concatenate(w[3:]),
                                  b_W=np.concatenate(b[:3]), b_R=np.concatenate(b[3:])))
    return Params(topo, layers).flat()


# --- shared checks of the forward and backprop ops -----------------------------------------
_Call = namedtuple("_Call", "topo dtype T N params h0 lengths")


def _fingerprint(call, input, input_h, params):
    """CRC-32 of the dtype, shape and bytes of the call's arrays (and lengths), chained."""
    lengths = np.full(call.N, call.T, np.int64) if call.lengths is None else call.lengths
    crc = 0
    for a in (input, input_h, params, lengths):
        a = np.ascontiguousarray(a)
        crc = zlib.crc32(repr((a.dtype.str, a.shape)).encode(), crc)
        crc = zlib.crc32(memoryview(a.reshape(-1)).cast("B"), crc)
    return crc


def _check_lengths(sequence_lengths, T, N):
    if sequence_lengths is None:
        return None
    arr = np.asarray(sequence_lengths)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"sequence_lengths: expected an integer array [N={N}], got dtype "
                        f"{arr.dtype}")
    if arr.shape != (N,):
        raise ValueError(f"sequence_lengths: expected shape [{N}] (one length per batch "
                         f"entry), got {_tf_shape(arr.shape)}")
    bad = np.flatnonzero((arr < 0) | (arr > T))      # before the cast: uint64 may not fit
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"sequence_lengths: expected values in [0, max_seq_length={T}], got "
                         f"sequence_lengths[{b}] = {arr[b]}")
    return arr.astype(np.int64)


def _check_call(input, input_h, params, sequence_lengths, attrs, time_major):
    """Validate the forward inputs (TF's ``ExtractForwardInput``) and map them to the engine."""
    layout = "[T, N, I]" if time_major else "[N, T, I]"
    if not isinstance(input, np.ndarray):
        raise TypeError(f"input: expected a numpy array {layout}, got {type(input).__name__}")
    dtype = as_dtype(input.dtype, "input.dtype")
    if input.ndim != 3:
        raise ValueError(f"RNN input must be a 3-D array {layout}, got shape "
                         f"{_tf_shape(input.shape)}")
    T, N = input.shape[:2] if time_major else input.shape[1::-1]
    input_sizes("input", input.shape, T, N, layout,
                       ("max_seq_length", "batch_size", "input_size"))
    h_layout = "[L·D, N, H]" if time_major else "[N, L·D, H]"
    if not isinstance(input_h, np.ndarray):
        raise TypeError(f"input_h: expected a numpy array {h_layout}, got "
                        f"{type(input_h).__name__}")
    if input_h.dtype != dtype:
        raise TypeError(f"input_h: expected dtype {dtype} (the dtype of input), got "
                        f"{input_h.dtype}")
    if input_h.ndim != 3:
        raise ValueError(f"RNN input_h must be a 3-D array {h_layout}, got shape "
                         f"{_tf_shape(input_h.shape)}")
    D = 2 if attrs.direction == "bidirectional" else 1
    L = input_h.shape[0 if time_major else 1] // D
    H = input_h.shape[2]
    want = (L * D, N, H) if time_major else (N, L * D, H)
    if L == 0 or H == 0 or input_h.shape != want:
        raise ValueError(f"Invalid input_h shape: {_tf_shape(input_h.shape)} {_tf_shape(want)} "
                         f"(input_h: expected {h_layout} with N={N} from input, L·D a positive "
                         f"multiple of D={D} ({attrs.direction}) and H ≥ 1)")
    topo = _topology(L, H, input.shape[2], attrs)
    p = _params_from_flat(topo, params, dtype)
    lengths = _check_lengths(sequence_lengths, T, N)
    h0 = input_h if time_major else input_h.transpose(1, 0, 2)
    return _Call(topo, dtype, T, N, p, h0, lengths)


# --- the reserve space ---------------------------------------------------------------------
def _header(call, fingerprint, attrs, time_major, engine_nbytes):
    flags = ((_FLAG_TIME_MAJOR if time_major else 0)
             | (_FLAG_BIDIRECTIONAL if call.topo.num_directions == 2 else 0)
             | (_FLAG_SKIP if call.topo.input_mode == "skip" else 0))
    return np.array([_RESERVE_MAGIC, _RESERVE_VERSION, flags,
                     np.float64(attrs.dropout).view(np.int64), attrs.seed, attrs.seed2,
                     fingerprint, engine_nbytes], dtype=np.int64)


def _wrap_reserve(engine_reserve, call, fingerprint, attrs, time_major):
    """``reserve_space`` = 64-byte header + the engine's reserve (module docstring)."""
    out = np.empty(_HEADER_BYTES + engine_reserve.size, np.uint8)
    head = _header(call, fingerprint, attrs, time_major, engine_reserve.size)
    out[:_HEADER_BYTES] = head.view(np.uint8)
    out[_HEADER_BYTES:] = engine_reserve
    return out


def _unwrap_reserve(reserve_space, call, fingerprint, attrs, time_major):
    """The engine's reserve inside ``reserve_space``, after checking it belongs to this call."""
    if not isinstance(reserve_space, np.ndarray):
        raise TypeError(f"reserve_space: expected the uint8 array the training forward "
                        f"returned, got {type(reserve_space).__name__}")
    if reserve_space.dtype != np.uint8 or reserve_space.ndim != 1:
        raise TypeError(f"reserve_space: expected a 1-D uint8 array, got {reserve_space.dtype} "
                        f"with shape {_tf_shape(reserve_space.shape)}")
    if reserve_space.size == 0:
        raise ValueError("reserve_space: empty — it comes from a forward with "
                         "is_training=False, which saves nothing; run the forward with "
                         "is_training=True to backprop")
    if reserve_space.size < _HEADER_BYTES:
        raise ValueError(f"reserve_space: {reserve_space.size} bytes is too small for a cgru.tf "
                         f"reserve space (from a different call?)")
    head = np.frombuffer(reserve_space[:_HEADER_BYTES].tobytes(), np.int64)
    if head[0] != _RESERVE_MAGIC or head[1] != _RESERVE_VERSION:
        raise ValueError("reserve_space: not a cgru.tf reserve space (bad header); pass the "
                         "reserve_space of the matching training forward")
    if head[7] != reserve_space.size - _HEADER_BYTES:
        raise ValueError(f"reserve_space: expected {int(head[7]) + _HEADER_BYTES} bytes as its "
                         f"header says, got {reserve_space.size} (truncated or padded?)")
    want = _header(call, fingerprint, attrs, time_major, head[7])
    names = {2: "layout or model (time_major, direction, input_mode)", 3: "dropout"}
    if attrs.dropout > 0:                   # the seeds matter only with dropout
        names.update({4: "seed", 5: "seed2"})
    for slot, what in names.items():
        if head[slot] != want[slot]:
            raise ValueError(f"reserve_space: the forward ran with a different {what} than "
                             f"this backprop call")
    if head[6] != want[6]:
        raise ValueError("reserve_space: does not come from a forward call with these input, "
                         "input_h, params and sequence_lengths (their contents or shapes "
                         "differ from the forward's)")
    return reserve_space[_HEADER_BYTES:]


# --- forward ops ---------------------------------------------------------------------------
def _forward(input, input_h, params, sequence_lengths, attrs, is_training, time_major,
             num_threads):
    is_training = _flag(is_training, "is_training")
    call = _check_call(input, input_h, params, sequence_lengths, attrs, time_major)
    fwd = forward(call.params, input, call.h0, lengths=call.lengths,
                  batch_major=not time_major, training=is_training, dropout=attrs.dropout,
                  seed=(attrs.seed, attrs.seed2), num_threads=num_threads)
    output_h = fwd.hy if time_major else np.ascontiguousarray(fwd.hy.transpose(1, 0, 2))
    if is_training:
        reserve = _wrap_reserve(fwd.reserve, call, _fingerprint(call, input, input_h, params),
                                attrs, time_major)
    else:
        reserve = np.empty(0, np.uint8)
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
    time_major = _flag(time_major, "time_major")
    out = _forward(input, input_h, params, sequence_lengths, attrs, is_training, time_major,
                   num_threads)
    return CudnnRNNV3(*out, np.empty(0, np.int8))


# --- backprop ops --------------------------------------------------------------------------
def _check_like(a, what, dtype, shape, optional):
    if a is None and optional:
        return None
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what}: expected a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise TypeError(f"{what}: expected dtype {dtype} (the dtype of input), got {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"Invalid {what} shape: {_tf_shape(a.shape)} {_tf_shape(shape)} "
                         f"({what}: expected {_tf_shape(shape)})")
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
    reserve = _unwrap_reserve(reserve_space, call, _fingerprint(call, input, input_h, params),
                              attrs, time_major)
    g = backward(call.params, input, reserve, dy, dhy, batch_major=not time_major,
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
    time_major = _flag(time_major, "time_major")
    return _backprop(input, input_h, params, sequence_lengths, output, output_h,
                     output_backprop, output_h_backprop, reserve_space, attrs, time_major,
                     num_threads)
