"""The ONNX ``GRU`` operator (opset 7/14/22) on the CPU: ``gru`` and ``run``.

One ONNX node is one layer, one core call (two when the directions' activations differ).
Validated in ONNX's words, its ``W``/``R``/``B`` tensors and attributes map onto a
``cgru.Network`` through ``cgru.systems.onnx`` (its docstring has the table: gates ONNX
``z, r, h`` → canonical ``r, z, n``; ``linear_before_reset`` → the cell's ``reset_after``;
``activations`` → ``f_r = f_z = f``, ``g``; ``clip``; ``direction``).

``sequence_lens`` follows onnxruntime's CPU kernel (the ONNX specification is silent): outputs
at ``t ≥ len`` are 0, the reverse direction starts at ``len − 1``, ``Y_h`` is the state after
the last processed step, and ``Y_h = 0`` for a sequence of length 0.  Attribute values may be
``str`` or ``bytes`` (``onnx.helper.get_attribute_value`` gives bytes).
"""
import numbers
import os

import numpy as np

from cgru.core import engine, validate
from cgru.core.network import Network, Topology
from cgru.systems import _rules, onnx as onnx_system
from cgru.systems.onnx import ACTIVATIONS as ONNX_ACTIVATIONS

__all__ = ["gru", "run", "ONNX_ACTIVATIONS"]


def _float_array(a, what, dtype=None):
    return validate.float_array(a, what, dtype, like="(the dtype of X)")


def gru(X, W, R, B=None, sequence_lens=None, initial_h=None, *, hidden_size=None,
        direction="forward", linear_before_reset=0, activations=None, activation_alpha=None,
        activation_beta=None, clip=None, layout=0):
    """The ONNX ``GRU`` operator: ``(Y, Y_h)``.

    Inputs (ONNX names and shapes; float32 or float64, one dtype)::

        X              [T, N, I]  ([N, T, I] with layout=1)
        W              [D, 3H, I]   gates z, r, h
        R              [D, 3H, H]
        B              [D, 6H] = [Wb_zrh, Rb_zrh]          (None: zeros)
        sequence_lens  [N] int, values in [0, T]           (None: all T)
        initial_h      [D, N, H]  ([N, D, H] with layout=1) (None: zeros)

    Attributes: ``hidden_size`` (checked against ``R`` when given), ``direction``
    ("forward", "reverse", "bidirectional"; ``D = 2`` for the last), ``linear_before_reset``
    (0: reset before the recurrent product, ONNX's default; 1: after it, as cuDNN/PyTorch),
    ``activations`` (``2·D`` names ``f, g`` per direction from Relu, Tanh, Sigmoid, Affine,
    LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus — any case;
    default Sigmoid, Tanh), ``activation_alpha`` / ``activation_beta`` (consumed in activation
    order, only by activations that take an alpha / a beta; a missing value takes the ONNX
    operator's default: Affine 1, 0; LeakyRelu 0.01; ThresholdedRelu 1; ScaledTanh 1, 1;
    HardSigmoid 0.2, 0.5; Elu 1.  Note: onnxruntime uses 0 instead for Affine,
    ThresholdedRelu and ScaledTanh, so pass them explicitly for portable models), ``clip``
    (clamps every complete pre-activation, biases included, to ``[−clip, clip]``), ``layout``.

    Returns ``Y`` ``[T, D, N, H]`` (``[N, T, D, H]`` with layout=1) and ``Y_h`` ``[D, N, H]``
    (``[N, D, H]``).  ``sequence_lens`` follows onnxruntime: ``Y`` is 0 at ``t ≥ len``, the
    reverse direction starts at ``len − 1``, and ``Y_h`` is 0 for ``len = 0``.
    """
    X = _float_array(X, "X")
    dtype = X.dtype
    _rules.option(layout, "layout", (0, 1))
    direction = _rules.option(direction, "direction", onnx_system.DIRECTIONS)
    D = 2 if direction == "bidirectional" else 1
    x_layout = "[N, T, I]" if layout else "[T, N, I]"
    if X.ndim != 3:
        raise ValueError(f"X: expected a 3-D array {x_layout}, got shape {list(X.shape)}")
    N, T = (X.shape[0], X.shape[1]) if layout else (X.shape[1], X.shape[0])
    I = X.shape[2]
    validate.input_sizes("X", X.shape, T, N, x_layout)
    R = _float_array(R, "R", dtype)
    if R.ndim != 3:
        raise ValueError(f"R: expected a 3-D array [D, 3H, H], got shape {list(R.shape)}")
    H = R.shape[2]
    if hidden_size is not None:
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, numbers.Integral) \
                or hidden_size <= 0:
            raise ValueError(f"hidden_size: expected a positive int, got {hidden_size!r}")
        if hidden_size != H:
            raise ValueError(f"hidden_size: {hidden_size} disagrees with R's last axis "
                             f"(R shape {list(R.shape)})")
    if H == 0:
        raise ValueError(f"R: expected H ≥ 1, got shape {list(R.shape)}")
    validate.named_shape(R, "R", (D, 3 * H, H), ("D", "3H", "H"))
    W = _float_array(W, "W", dtype)
    validate.named_shape(W, "W", (D, 3 * H, I), ("D", "3H", "I"))
    if B is not None:
        B = _float_array(B, "B", dtype)
        validate.named_shape(B, "B", (D, 6 * H), ("D", "6H"))
    if initial_h is not None:
        initial_h = _float_array(initial_h, "initial_h", dtype)
        if layout:
            validate.named_shape(initial_h, "initial_h", (N, D, H), ("N", "D", "H"))
            initial_h = initial_h.transpose(1, 0, 2)
        else:
            validate.named_shape(initial_h, "initial_h", (D, N, H), ("D", "N", "H"))
    lengths = None if sequence_lens is None else \
        validate.lengths(sequence_lens, T, N, "sequence_lens", "T")
    cells = onnx_system.activations_to_cells(activations, activation_alpha, activation_beta,
                                             clip, linear_before_reset, D)
    layers = onnx_system.layer_params(W, R, B, D)

    # One core call when both directions share the cell; else one call per direction.
    if D == 1 or cells[0] == cells[1]:
        runs = [(direction, layers, cells[0], slice(0, D))]
    else:
        runs = [("forward", layers[:1], cells[0], slice(0, 1)),
                ("reverse", layers[1:], cells[1], slice(1, 2))]
    Y = np.empty((N, T, D, H) if layout else (T, D, N, H), dtype)
    Y_h = np.empty((D, N, H), dtype)
    for run_direction, run_layers, cell, ds in runs:
        net = Network(Topology(I, H, 1, run_direction), run_layers, cell)
        h0 = None if initial_h is None else np.ascontiguousarray(initial_h[ds])
        y, hy, _ = engine.forward(net, X, h0, lengths=lengths, batch_major=bool(layout))
        nd = ds.stop - ds.start
        if layout:   # y [N, T, nd·H] → Y[:, :, ds] [N, T, nd, H]
            Y[:, :, ds] = y.reshape(N, T, nd, H)
        else:        # y [T, N, nd·H] → Y[:, ds] [T, nd, N, H]
            Y[:, ds] = y.reshape(T, N, nd, H).transpose(0, 2, 1, 3)
        Y_h[ds] = hy
    if lengths is not None:
        Y_h[:, lengths == 0] = 0      # onnxruntime: Y_h = 0 for an empty sequence
    if layout:
        Y_h = np.ascontiguousarray(Y_h.transpose(1, 0, 2))
    return Y, Y_h


# --- run(): one-node ONNX models ------------------------------------------------------------
_INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h")
_ATTRIBUTES = ("hidden_size", "direction", "linear_before_reset", "activations",
               "activation_alpha", "activation_beta", "clip", "layout")


def _import_onnx():
    try:
        import onnx
        import onnx.numpy_helper  # noqa: F401
    except ImportError as e:
        raise ImportError("cgru.onnx.run needs the 'onnx' package to read models (pip install "
                          "onnx); cgru.onnx.gru works without it") from e
    return onnx


def _load_model(onnx, model):
    """The ``ModelProto`` in a file or in serialized bytes (``ValueError`` when they do not
    parse as one)."""
    from google.protobuf.message import DecodeError      # onnx's own dependency
    try:
        if isinstance(model, bytes):
            return onnx.load_model_from_string(model)
        return onnx.load(os.fspath(model))
    except DecodeError as e:
        what = f"{len(model)} bytes" if isinstance(model, bytes) else f"file {os.fspath(model)!r}"
        raise ValueError(f"model: cannot parse {what} as an ONNX model ({e})") from None


def run(model, inputs):
    """Run a model whose graph is one ``GRU`` node: ``{output name: array}``.

    ``model``: a path to an ``.onnx`` file, its bytes, or an ``onnx.ModelProto``; ``inputs``: a
    dict from graph input name to array (initializers of the graph supply the rest).  Returns
    one entry per output the node names (``Y`` and/or ``Y_h``).  Needs the optional ``onnx``
    package (``cgru.onnx.gru`` does not).
    """
    onnx = _import_onnx()
    if isinstance(model, (str, os.PathLike, bytes)):
        model = _load_model(onnx, model)
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model: expected a path, serialized bytes or an onnx.ModelProto, got "
                        f"{type(model).__name__}")
    if not isinstance(inputs, dict):
        raise TypeError(f"inputs: expected a dict from input name to array, got "
                        f"{type(inputs).__name__}")
    graph = model.graph
    nodes = list(graph.node)
    if len(nodes) != 1 or nodes[0].op_type != "GRU" or nodes[0].domain not in ("", "ai.onnx"):
        found = [f"{n.domain + '.' if n.domain else ''}{n.op_type}" for n in nodes]
        raise ValueError(f"model: expected a graph of exactly one GRU node, got {found}")
    node = nodes[0]
    opset = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if opset and opset[0] < 7:
        raise ValueError(f"model: GRU-1/GRU-3 (opset {opset[0]} < 7) are not supported; "
                         f"re-export the model with opset ≥ 7")

    values = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    values.update(inputs)
    args = {}
    for slot, name in zip(_INPUT_NAMES, node.input):
        if name == "":
            continue
        if name not in values:
            raise ValueError(f"inputs: missing {name!r} (the GRU input {slot}); got "
                             f"{sorted(inputs)}")
        args[slot] = np.asarray(values[name])
    for slot in ("X", "W", "R"):
        if slot not in args:
            raise ValueError(f"model: the GRU node has no {slot} input")

    attrs = {}
    for a in node.attribute:
        if a.name not in _ATTRIBUTES:
            raise ValueError(f"model: unsupported GRU attribute {a.name!r}")
        attrs[a.name] = onnx.helper.get_attribute_value(a)      # str values come as bytes
    Y, Y_h = gru(args["X"], args["W"], args["R"], args.get("B"), args.get("sequence_lens"),
                 args.get("initial_h"), **attrs)
    out = {}
    for name, value in zip(node.output, (Y, Y_h)):
        if name:
            out[name] = value
    return out
