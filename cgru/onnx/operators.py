"""The ONNX ``GRU``, ``LSTM`` and ``RNN`` operators (opsets 7/14/22) on the CPU: ``gru``,
``lstm``, ``rnn`` — one node, checked in ONNX's words (``_check_node``, which ``cgru.onnx.run``
and ``recurrent_layers`` apply to a model's nodes too), mapped onto cgru networks through
``cgru.systems.onnx``.  The package docstring (``cgru.onnx``) says what they compute.
"""
from dataclasses import dataclass
import numbers

import numpy as np

from cgru.core import calls, engine, validate
from cgru.core.network import Network, Topology
from cgru.systems import _rules, onnx as onnx_system
from cgru.systems.onnx import ACTIVATIONS as ONNX_ACTIVATIONS
from cgru._kernels.threads import resolve_num_threads

__all__ = ["gru", "lstm", "rnn", "UnsupportedNodeError", "ONNX_ACTIVATIONS", "INPUTS",
           "OUTPUTS", "ATTRIBUTES", "OPERATORS"]

# op_type -> the node's input slots, in ONNX order
INPUTS = {"GRU": ("X", "W", "R", "B", "sequence_lens", "initial_h"),
          "LSTM": ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"),
          "RNN": ("X", "W", "R", "B", "sequence_lens", "initial_h")}
# op_type -> the node's outputs, in ONNX order
OUTPUTS = {"GRU": ("Y", "Y_h"), "LSTM": ("Y", "Y_h", "Y_c"), "RNN": ("Y", "Y_h")}
_COMMON = ("hidden_size", "direction", "activations", "activation_alpha", "activation_beta",
           "clip", "layout")
# op_type -> the attributes its node may carry (opsets 7 to 22)
ATTRIBUTES = {"GRU": _COMMON + ("linear_before_reset",), "LSTM": _COMMON + ("input_forget",),
              "RNN": _COMMON}


def _float_array(a, what, dtype=None):
    return validate.float_array(a, what, dtype, like="(the dtype of X)")


def _gates_text(k):
    return f"{k}H" if k > 1 else "H"


def _check_hidden_size(hidden_size, R):
    if hidden_size is not None:
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, numbers.Integral) \
                or hidden_size <= 0:
            raise ValueError(f"hidden_size: expected a positive int, got {hidden_size!r}")
        if hidden_size != R.shape[2]:
            raise ValueError(f"hidden_size: {hidden_size} disagrees with R's last axis "
                             f"(R shape {list(R.shape)})")


def _weights(op_type, W, R, B, P, D, hidden_size, dtype=None, I=None):
    """``(W, R, B, P, H, I)`` checked (``I``: the input width when known from ``X``)."""
    G = onnx_system.OP_TYPES[op_type][1]
    R = _float_array(R, "R", dtype)
    if R.ndim != 3:
        raise ValueError(f"R: expected a 3-D array [D, {_gates_text(G)}, H], got shape "
                         f"{list(R.shape)}")
    dtype = R.dtype
    H = R.shape[2]
    _check_hidden_size(hidden_size, R)
    if H == 0:
        raise ValueError(f"R: expected H ≥ 1, got shape {list(R.shape)}")
    validate.named_shape(R, "R", (D, G * H, H), ("D", _gates_text(G), "H"))
    W = _float_array(W, "W", dtype)
    if I is None:
        if W.ndim != 3 or W.shape[2] == 0:
            raise ValueError(f"W: expected a 3-D array [D, {_gates_text(G)}, I] with I ≥ 1, "
                             f"got shape {list(W.shape)}")
        I = W.shape[2]
    validate.named_shape(W, "W", (D, G * H, I), ("D", _gates_text(G), "I"))
    if B is not None:
        B = _float_array(B, "B", dtype)
        validate.named_shape(B, "B", (D, 2 * G * H), ("D", _gates_text(2 * G)))
    if P is not None:
        P = _float_array(P, "P", dtype)
        validate.named_shape(P, "P", (D, 3 * H), ("D", "3H"))
    return W, R, B, P, H, I


def _plan(op_type, W, R, B, P, D, direction, I, H, attrs):
    """``[(network, directions)]``: the core calls that compute one node — one network for
    both directions when they share the cell, else one per direction (``directions`` a
    slice of ``D``)."""
    peepholes = P is not None and bool(np.any(P))
    cells = onnx_system.cells_of(
        op_type, attrs.get("activations"), attrs.get("activation_alpha"),
        attrs.get("activation_beta"), attrs.get("clip"), D,
        linear_before_reset=attrs.get("linear_before_reset", 0),
        input_forget=attrs.get("input_forget", 0), peepholes=peepholes)
    layers = onnx_system.layer_params(W, R, B, D, op_type, P if peepholes else None)
    if D == 1 or cells[0] == cells[1]:
        return [(Network(Topology(I, H, 1, direction), layers, cells[0]), slice(0, D))]
    return [(Network(Topology(I, H, 1, "forward"), layers[:1], cells[0]), slice(0, 1)),
            (Network(Topology(I, H, 1, "reverse"), layers[1:], cells[1]), slice(1, 2))]


def _state(a, what, dtype, layout, D, N, H):
    """An ``initial_h``/``initial_c`` as ``[D, N, H]`` (a view); ``N`` None: any batch size
    (``X`` not known yet)."""
    if a is None:
        return None
    a = _float_array(a, what, dtype)
    if N is None:
        N = a.shape[1 - layout] if a.ndim == 3 else 1
    if layout:
        validate.named_shape(a, what, (N, D, H), ("N", "D", "H"))
        return a.transpose(1, 0, 2)
    return validate.named_shape(a, what, (D, N, H), ("D", "N", "H"))


def _static_lengths(sequence_lens, N):
    """``sequence_lens`` checked before ``X`` is known (``T`` unknown): an integer array
    ``[N]`` with no negative value, as int64 (its upper bound, ``T``, is checked at run
    time)."""
    validate.plain_array(sequence_lens, "sequence_lens")
    want = "[N]" if N is None else f"[N={N}]"
    if sequence_lens.dtype.kind not in "iu":
        raise TypeError(f"sequence_lens: expected an integer array {want}, got dtype "
                        f"{sequence_lens.dtype}")
    if sequence_lens.ndim != 1 or (N is not None and sequence_lens.shape != (N,)):
        raise ValueError(f"sequence_lens: expected shape {want} (one length per batch entry), "
                         f"got {list(sequence_lens.shape)}")
    bad = np.flatnonzero(sequence_lens < 0)
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"sequence_lens: expected values ≥ 0 (and ≤ T, the length of X), got "
                         f"sequence_lens[{b}] = {sequence_lens[b]}")
    return sequence_lens.astype(np.int64)


def _batch_size(X, layout, sequence_lens, initial_h, initial_c):
    """``N``: from ``X`` when given, else from the first of ``sequence_lens``, ``initial_h``,
    ``initial_c`` that fixes it (None when none does)."""
    if X is not None:
        return X.shape[0] if layout else X.shape[1]
    if sequence_lens is not None and np.ndim(sequence_lens) == 1:
        return np.shape(sequence_lens)[0]
    for s in (initial_h, initial_c):
        if isinstance(s, np.ndarray) and s.ndim == 3:
            return s.shape[1 - layout]
    return None


@dataclass(frozen=True, eq=False)
class _Checked:
    """One node's inputs and attributes after every check (``_check_node``): the weights,
    the states as ``[D, N, H]`` views, the lengths (int64, or None), the sizes (``T``, ``N``
    None when ``X`` is not known) and the core calls (``_plan``)."""
    layout: int
    D: int
    T: object
    N: object
    I: int
    H: int
    W: np.ndarray
    R: np.ndarray
    B: object
    P: object
    h0: object
    c0: object
    lengths: object
    runs: list


def _check_node(op_type, X, W, R, B, sequence_lens, initial_h, initial_c, P, attrs):
    """Every check of one ONNX recurrent node, before any work — the single rule that both
    the operators (``gru``, ``lstm``, ``rnn``, so ``run``) and ``recurrent_layers`` apply.

    ``X`` may be None: the input is not known yet (``recurrent_layers`` on a model whose
    ``X`` comes at run time); then ``I`` comes from ``W``, ``N`` from whichever of
    ``sequence_lens``, ``initial_h``, ``initial_c`` is given, and ``sequence_lens`` is checked
    against ``T`` later, at run time (here: integers ``≥ 0``).  ``attrs`` holds the node's
    attributes by ONNX name (absent ones take the operator's defaults)."""
    layout = _rules.option(attrs.get("layout", 0), "layout", (0, 1))
    direction = _rules.option(attrs.get("direction", "forward"), "direction",
                              onnx_system.DIRECTIONS)
    D = 2 if direction == "bidirectional" else 1
    T = I = dtype = None
    if X is not None:
        X = _float_array(X, "X")
        dtype = X.dtype
        x_layout = "[N, T, I]" if layout else "[T, N, I]"
        if X.ndim != 3:
            raise ValueError(f"X: expected a 3-D array {x_layout}, got shape {list(X.shape)}")
        T, I = (X.shape[1] if layout else X.shape[0]), X.shape[2]
        validate.input_sizes("X", X.shape, T, _batch_size(X, layout, None, None, None),
                             x_layout)
    W, R, B, P, H, I = _weights(op_type, W, R, B, P, D, attrs.get("hidden_size"), dtype, I)
    N = _batch_size(X, layout, sequence_lens, initial_h, initial_c)
    h0 = _state(initial_h, "initial_h", R.dtype, layout, D, N, H)
    c0 = _state(initial_c, "initial_c", R.dtype, layout, D, N, H)
    if sequence_lens is None:
        lengths = None
    elif T is None:
        lengths = _static_lengths(sequence_lens, N)
    else:
        lengths = validate.lengths(sequence_lens, T, N, "sequence_lens", "T")
    runs = _plan(op_type, W, R, B, P, D, direction, I, H, attrs)
    return _Checked(layout, D, T, N, I, H, W, R, B, P, h0, c0, lengths, runs)


def _operator(op_type, X, W, R, B, sequence_lens, initial_h, initial_c, P, **attrs):
    """One ONNX recurrent node: ``(Y, Y_h)`` or, for an LSTM, ``(Y, Y_h, Y_c)``."""
    if X is None:
        raise TypeError("X: expected a numpy array [T, N, I], got None")
    node = _check_node(op_type, X, W, R, B, sequence_lens, initial_h, initial_c, P, attrs)
    layout, D, T, N, H, lengths = node.layout, node.D, node.T, node.N, node.H, node.lengths
    dtype = node.R.dtype
    lstm = op_type == "LSTM"
    Y = np.empty((N, T, D, H) if layout else (T, D, N, H), dtype)
    Y_h = np.empty((D, N, H), dtype)
    Y_c = np.empty((D, N, H), dtype) if lstm else None
    x = calls.time_major(X, bool(layout))          # checked in ONNX's words: one core call each
    nt = resolve_num_threads(None)
    for net, ds in node.runs:
        part = lambda s: None if s is None else np.ascontiguousarray(s[ds])    # noqa: E731
        f = engine.run_forward(calls.ForwardCall.of(
            net, net.cell, x, part(node.h0), part(node.c0), lengths, None, 0.0, 0, 0, False,
            bool(layout), nt))
        nd = ds.stop - ds.start
        if layout:   # y [N, T, nd·H] → Y[:, :, ds] [N, T, nd, H]
            Y[:, :, ds] = f.y.reshape(N, T, nd, H)
        else:        # y [T, N, nd·H] → Y[:, ds] [T, nd, N, H]
            Y[:, ds] = f.y.reshape(T, N, nd, H).transpose(0, 2, 1, 3)
        Y_h[ds] = f.hy
        if lstm:
            Y_c[ds] = f.cy
    states = [Y_h, Y_c] if lstm else [Y_h]
    if lengths is not None:
        for s in states:
            s[:, lengths == 0] = 0      # onnxruntime: Y_h = Y_c = 0 for an empty sequence
    if layout:
        states = [np.ascontiguousarray(s.transpose(1, 0, 2)) for s in states]
    return (Y, *states)


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
    return _operator("GRU", X, W, R, B, sequence_lens, initial_h, None, None,
                     hidden_size=hidden_size, direction=direction, layout=layout,
                     linear_before_reset=linear_before_reset, activations=activations,
                     activation_alpha=activation_alpha, activation_beta=activation_beta,
                     clip=clip)


def lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
         hidden_size=None, direction="forward", activations=None, activation_alpha=None,
         activation_beta=None, clip=None, input_forget=0, layout=0):
    """The ONNX ``LSTM`` operator: ``(Y, Y_h, Y_c)``.

    Inputs (ONNX names and shapes; float32 or float64, one dtype)::

        X              [T, N, I]  ([N, T, I] with layout=1)
        W              [D, 4H, I]   gates i, o, f, c
        R              [D, 4H, H]
        B              [D, 8H] = [Wb_iofc, Rb_iofc]        (None: zeros)
        sequence_lens  [N] int, values in [0, T]           (None: all T)
        initial_h      [D, N, H]  ([N, D, H] with layout=1) (None: zeros)
        initial_c      [D, N, H]  ([N, D, H] with layout=1) (None: zeros)
        P              [D, 3H] = [P_i, P_o, P_f] peepholes (None: none)

    With peepholes ``i = f(… + P_i ⊙ c)``, ``f = f(… + P_f ⊙ c)``, ``o = f(… + P_o ⊙ c')``
    (``c'`` the new cell state), inside the clip.  Attributes: ``hidden_size``,
    ``direction`` as for ``gru``; ``input_forget`` (1: coupled gates, the forget gate is
    ``1 − i`` and its weights and ``P_f`` are not used — onnxruntime's definition);
    ``activations`` (``3·D`` names ``f, g, h`` per direction: gates, cell input, cell output;
    default Sigmoid, Tanh, Tanh); ``activation_alpha``, ``activation_beta``, ``clip`` and
    ``layout`` as for ``gru``.

    Returns ``Y`` ``[T, D, N, H]`` (``[N, T, D, H]`` with layout=1), ``Y_h`` and ``Y_c``
    ``[D, N, H]`` (``[N, D, H]``); ``sequence_lens`` as for ``gru`` (``Y_h = Y_c = 0`` for
    ``len = 0``).  The cell state is not clipped (as in onnxruntime).
    """
    return _operator("LSTM", X, W, R, B, sequence_lens, initial_h, initial_c, P,
                     hidden_size=hidden_size, direction=direction, layout=layout,
                     input_forget=input_forget, activations=activations,
                     activation_alpha=activation_alpha, activation_beta=activation_beta,
                     clip=clip)


def rnn(X, W, R, B=None, sequence_lens=None, initial_h=None, *, hidden_size=None,
        direction="forward", activations=None, activation_alpha=None, activation_beta=None,
        clip=None, layout=0):
    """The ONNX ``RNN`` operator (``H_t = f(X_t·Wᵀ + H_{t−1}·Rᵀ + Wb + Rb)``): ``(Y, Y_h)``.

    Inputs (ONNX names and shapes; float32 or float64, one dtype)::

        X              [T, N, I]  ([N, T, I] with layout=1)
        W              [D, H, I]
        R              [D, H, H]
        B              [D, 2H] = [Wb, Rb]                  (None: zeros)
        sequence_lens  [N] int, values in [0, T]           (None: all T)
        initial_h      [D, N, H]  ([N, D, H] with layout=1) (None: zeros)

    Attributes as for ``gru``; ``activations`` holds ``f`` per direction (default Tanh).  The
    specification's default lists two names (Tanh, Tanh), so a one-direction node that gives
    two uses the first (and its alpha/beta), as onnxruntime does.  Returns ``Y``
    ``[T, D, N, H]`` and ``Y_h`` ``[D, N, H]`` (batch first with layout=1); ``sequence_lens``
    as for ``gru``.
    """
    return _operator("RNN", X, W, R, B, sequence_lens, initial_h, None, None,
                     hidden_size=hidden_size, direction=direction, layout=layout,
                     activations=activations, activation_alpha=activation_alpha,
                     activation_beta=activation_beta, clip=clip)


OPERATORS = {"GRU": gru, "LSTM": lstm, "RNN": rnn}


# --- whole models ---------------------------------------------------------------------------
class UnsupportedNodeError(NotImplementedError, ValueError):
    """``run``: a node the reference evaluator has no implementation for — a
    ``NotImplementedError`` (what it is) and a ``ValueError`` (what every model ``run``
    cannot take raises)."""
