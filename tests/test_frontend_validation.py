"""Bad input to every frontend gets a clear error; good input in odd forms still works.

The discipline of ``test_validation.py`` (the core API), applied to ``cgru.tf``, ``cgru.mps``,
``cgru.onnx``, ``cgru.arraymancer`` and ``cgru.convert`` (the C ABI has its own tests):

1. Every array argument of every frontend function gets each class of bad array — not an
   array, integer / bool / complex / object / float16 dtypes, the other float dtype, one axis
   too many or too few, each axis one too long, and zero-size T, N, H — and the call raises
   ``TypeError`` / ``ValueError`` whose message names that argument *first* (or the argument
   the size was inferred from, as tabulated in ``Call.axes``) and quotes the actual dtype or
   shape.
2. Non-contiguous, Fortran-ordered and negative-stride views and read-only arrays give
   bitwise the same results as contiguous copies; no input is ever modified (hashed before
   and after); NaN/Inf data propagate to the affected sequence only and never crash.
3. Sequence lengths (negative, > T, wrong length, float, NaN, 2-D, str, bool, huge unsigned),
   TF reserve spaces (empty, truncated, padded, retyped, foreign), unknown option strings,
   non-bool flags and out-of-range dropout are refused with the option's name.
"""
from dataclasses import dataclass, field
import hashlib
import re

import numpy as np
import pytest

from cgru import Cell, LSTMCell, Network, Topology
from cgru import arraymancer as am
from cgru import convert, mps, tf
from cgru import onnx as connx

# Sizes differ from each other so that a message quoting a shape is unambiguous.
T, N, I, H = 5, 2, 7, 3
LENGTHS = np.array([5, 3])


# --- the registry of calls --------------------------------------------------------------------
@dataclass
class Call:
    """One frontend call with valid arguments.

    ``make(dtype)`` returns ``(args, ctx)``: ``args`` the call's array arguments by name (the
    names the error messages must use, e.g. ``"state_dict['weight_ih_l0']"``), ``ctx`` anything
    else the call needs; ``run(args, ctx)`` calls the function and returns its result.
    ``defining``: the argument whose dtype sets the call's dtype (the others must match it).
    ``ints``: integer arguments (sequence lengths). ``axes[name][k]``: the argument the error
    must name when axis ``k`` of ``name`` grows by one (``None``: still valid — a free size).
    ``add_axis`` / ``drop_axis`` / ``scalar``: the same for ``a[None]`` / ``a[0]`` / a 0-d
    array (default: the argument itself).  An ``axes`` entry ``(name, False)`` names the
    argument without requiring the message to quote its shape (it explains the rule instead).
    ``labels``: names the messages use for arguments whose key in ``args`` differs.
    """
    make: object
    run: object
    defining: str = None
    ints: tuple = ()
    axes: dict = field(default_factory=dict)
    add_axis: dict = field(default_factory=dict)
    drop_axis: dict = field(default_factory=dict)
    scalar: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    valid_dtypes: dict = field(default_factory=dict)   # name -> dtypes also accepted

    def label(self, name):
        return self.labels.get(name, name)


def _rng(seed=0):
    return np.random.default_rng(seed)


def _u(rng, shape, dtype):
    return rng.uniform(-1, 1, shape).astype(dtype)


# TF: two bidirectional layers, time-major (V1) and batch-major with lengths (V3).
_TF_ATTRS = dict(rnn_mode="gru", direction="bidirectional")
_TF_L, _TF_D = 2, 2


def _tf_args(dtype, time_major=True, seed=0):
    rng = _rng(seed)
    n = tf.params_size(_TF_L, H, I, dtype=dtype, **_TF_ATTRS)
    LD = _TF_L * _TF_D
    return {"input": _u(rng, (T, N, I) if time_major else (N, T, I), dtype),
            "input_h": _u(rng, (LD, N, H) if time_major else (N, LD, H), dtype),
            "params": _u(rng, (n,), dtype)}


def _tf_make_v1(dtype):
    return _tf_args(dtype), None


def _tf_run_v1(a, ctx):
    return tf.cudnn_rnn(a["input"], a["input_h"], None, a["params"], **_TF_ATTRS)


def _tf_make_v3(dtype):
    a = _tf_args(dtype, time_major=False)
    a["sequence_lengths"] = LENGTHS.copy()
    return a, None


def _tf_run_v3(a, ctx):
    return tf.cudnn_rnn_v3(a["input"], a["input_h"], None, a["params"], a["sequence_lengths"],
                           time_major=False, **_TF_ATTRS)


def _tf_make_bp(dtype, v3=False):
    a, _ = _tf_make_v3(dtype) if v3 else _tf_make_v1(dtype)
    f = _tf_run_v3(a, None) if v3 else _tf_run_v1(a, None)
    rng = _rng(1)
    a.update(output=f.output, output_h=f.output_h,
             output_backprop=_u(rng, f.output.shape, dtype),
             output_h_backprop=_u(rng, f.output_h.shape, dtype),
             reserve_space=f.reserve_space)
    return a, None


def _tf_run_bp(a, ctx):
    return tf.cudnn_rnn_backprop(a["input"], a["input_h"], None, a["params"], a["output"],
                                 a["output_h"], None, a["output_backprop"],
                                 a["output_h_backprop"], None, a["reserve_space"], **_TF_ATTRS)


def _tf_run_bp3(a, ctx):
    return tf.cudnn_rnn_backprop_v3(a["input"], a["input_h"], None, a["params"],
                                    a["sequence_lengths"], a["output"], a["output_h"], None,
                                    a["output_backprop"], a["output_h_backprop"], None,
                                    a["reserve_space"], time_major=False, **_TF_ATTRS)


# TF LSTM with a projection (num_proj = P = 2 < H): batch-major V3 with lengths; input_h is
# [N, L·D, P], input_c [N, L·D, H].
_TF_LSTM_ATTRS = dict(rnn_mode="lstm", direction="bidirectional", num_proj=2, time_major=False)


def _tf_make_lstm(dtype):
    rng = _rng(4)
    n = tf.params_size(_TF_L, H, I, dtype=dtype, rnn_mode="lstm", direction="bidirectional",
                       num_proj=2)
    LD = _TF_L * _TF_D
    return {"input": _u(rng, (N, T, I), dtype), "input_h": _u(rng, (N, LD, 2), dtype),
            "input_c": _u(rng, (N, LD, H), dtype), "params": _u(rng, (n,), dtype),
            "sequence_lengths": LENGTHS.copy()}, None


def _tf_run_lstm(a, ctx):
    return tf.cudnn_rnn_v3(a["input"], a["input_h"], a["input_c"], a["params"],
                           a["sequence_lengths"], **_TF_LSTM_ATTRS)


def _tf_make_lstm_bp(dtype):
    a, _ = _tf_make_lstm(dtype)
    f = _tf_run_lstm(a, None)
    rng = _rng(5)
    a.update(output=f.output, output_h=f.output_h, output_c=f.output_c,
             output_backprop=_u(rng, f.output.shape, dtype),
             output_h_backprop=_u(rng, f.output_h.shape, dtype),
             output_c_backprop=_u(rng, f.output_c.shape, dtype), reserve_space=f.reserve_space)
    return a, None


def _tf_run_lstm_bp(a, ctx):
    return tf.cudnn_rnn_backprop_v3(
        a["input"], a["input_h"], a["input_c"], a["params"], a["sequence_lengths"], a["output"],
        a["output_h"], a["output_c"], a["output_backprop"], a["output_h_backprop"],
        a["output_c_backprop"], a["reserve_space"], **_TF_LSTM_ATTRS)


def _tf_make_canon(dtype):
    n = tf.params_size(1, H, I, rnn_mode="gru")
    w, b = tf.params_to_canonical(1, H, I, _u(_rng(2), (n,), dtype), rnn_mode="gru")
    a = {f"weights[{j}]": x.copy() for j, x in enumerate(w)}
    a.update({f"biases[{j}]": x.copy() for j, x in enumerate(b)})
    return a, None


def _tf_run_canon(a, ctx):
    return tf.canonical_to_params(1, H, I, [a[f"weights[{j}]"] for j in range(6)],
                                  [a[f"biases[{j}]"] for j in range(6)], rnn_mode="gru")


_TF_TM = {"input": (None, "input_h", "params"), "input_h": ("input_h", "input_h", "params"),
          "params": ("params",)}
_TF_BM = {"input": ("input_h", None, "params"), "input_h": ("input_h", "input_h", "params"),
          "params": ("params",)}
_TF_OUT = {k: (k,) * 3 for k in ("output", "output_h", "output_backprop", "output_h_backprop")}
# input_h's last axis must be num_proj; input_c's is H (num_units): a wider one needs a bigger
# params buffer
_TF_LSTM_AXES = {**_TF_BM, "input_h": ("input_h",) * 3,
                 "input_c": ("input_c", "input_c", "params")}

# MPSGraph: one bidirectional reset-after op with every optional input.
_MPS_DESC = dict(bidirectional=True, reset_after=True, training=True)


def _mps_make(dtype):
    rng = _rng(3)
    return {"source": _u(rng, (T, N, I), dtype),
            "recurrent_weight": _u(rng, (2, 3 * H, H), dtype),
            "input_weight": _u(rng, (6 * H, I), dtype), "bias": _u(rng, (6 * H,), dtype),
            "init_state": _u(rng, (N, 2 * H), dtype),
            "mask": rng.uniform(0.5, 1.5, (T, N, 2 * H)).astype(dtype),
            "secondary_bias": _u(rng, (2 * H,), dtype)}, None


def _mps_run(a, ctx):
    return mps.gru(descriptor=mps.GRUDescriptor(**_MPS_DESC), **a)


def _mps_make_grad(dtype):
    a, _ = _mps_make(dtype)
    out, z = _mps_run(a, None)
    rng = _rng(4)
    a.update(source_gradient=_u(rng, out.shape, dtype), z_state=z, output_fwd=out,
             state_gradient=_u(rng, (N, 2 * H), dtype))
    return a, None


def _mps_run_grad(a, ctx):
    rest = {k: v for k, v in a.items() if k not in ("source", "recurrent_weight",
                                                    "source_gradient", "z_state", "output_fwd")}
    return mps.gru_gradients(a["source"], a["recurrent_weight"], a["source_gradient"],
                             a["z_state"], a["output_fwd"],
                             descriptor=mps.GRUDescriptor(**_MPS_DESC), **rest)


_MPS_AXES = {"source": ("mask", "init_state", "input_weight"),
             "recurrent_weight": ("recurrent_weight",) * 3,
             "input_weight": ("input_weight",) * 2, "bias": ("bias",),
             "init_state": ("init_state",) * 2, "mask": ("mask",) * 3,
             "secondary_bias": ("secondary_bias",)}
_MPS_GRAD_AXES = {k: (k,) * 3 for k in ("source_gradient", "z_state", "output_fwd")}

# ONNX: one bidirectional node, linear_before_reset=1, with lengths and initial_h.
_ONNX_ATTRS = dict(direction="bidirectional", linear_before_reset=1)


def _onnx_make(dtype):
    rng = _rng(5)
    return {"X": _u(rng, (T, N, I), dtype), "W": _u(rng, (2, 3 * H, I), dtype),
            "R": _u(rng, (2, 3 * H, H), dtype), "B": _u(rng, (2, 6 * H), dtype),
            "sequence_lens": LENGTHS.copy(), "initial_h": _u(rng, (2, N, H), dtype)}, None


def _onnx_run(a, ctx):
    return connx.gru(a["X"], a["W"], a["R"], a["B"], a["sequence_lens"], a["initial_h"],
                     **_ONNX_ATTRS)


# Arraymancer: two layers.
def _am_make(dtype):
    rng = _rng(6)
    L = 2
    return {"input": _u(rng, (T, N, I), dtype), "hidden0": _u(rng, (L, N, H), dtype),
            "W3s0": _u(rng, (3 * H, I), dtype), "W3sN": _u(rng, (L - 1, 3 * H, H), dtype),
            "U3s": _u(rng, (L, 3 * H, H), dtype), "bW3s": _u(rng, (L, 1, 3 * H), dtype),
            "bU3s": _u(rng, (L, 1, 3 * H), dtype)}, None


_AM_ORDER = ("input", "hidden0", "W3s0", "W3sN", "U3s", "bW3s", "bU3s")


def _am_run(a, ctx):
    return am.gru(*(a[k] for k in _AM_ORDER))


def _am_run_fwd(a, ctx):
    y, hy, cache = am.gru_forward(*(a[k] for k in _AM_ORDER))
    return y, hy, cache.reserve


def _am_make_bwd(dtype):
    a, _ = _am_make(dtype)
    _, _, cache = am.gru_forward(*(a[k] for k in _AM_ORDER))
    rng = _rng(7)
    return {"d_output": _u(rng, (T, N, H), dtype), "d_hiddenN": _u(rng, (2, N, H), dtype)}, cache


def _am_run_bwd(a, ctx):
    return am.gru_backward(a["d_output"], a["d_hiddenN"], ctx)


_AM_AXES = {"input": (None, "hidden0", "input"), "hidden0": ("hidden0",) * 3,
            "W3s0": ("W3s0", "input"), "W3sN": ("W3sN",) * 3, "U3s": ("W3sN", "U3s", "U3s"),
            "bW3s": ("bW3s",) * 3, "bU3s": ("bU3s",) * 3}


# Converters: one bidirectional layer (oneDNN: two stacked, I = D·H).
def _canonical(dtype, topo=Topology(I, H, 1, "bidirectional"), seed=8):
    return Network.random(topo, dtype, seed=seed)


def _conv_make_torch(dtype):
    sd = convert.to_torch(_canonical(dtype))
    return {f"state_dict['{k}']": v for k, v in sd.items()}, None


def _conv_run_torch(a, ctx):
    return convert.from_torch({k[len("state_dict['"):-2]: v for k, v in a.items()})


_KERAS_SLOTS = ("kernel", "recurrent_kernel", "bias")


def _conv_make_torch_lstm(dtype):
    net = Network.random(Topology(I, H, 1, "bidirectional", proj_size=2), dtype, seed=9,
                        cell=LSTMCell())
    return {f"state_dict['{k}']": v for k, v in convert.to_torch(net).items()}, None


def _torch_lstm_axes():
    axes = _torch_axes(("weight_hr",))
    # the kind and H are read from weight_hh_l0 [4H, P] with weight_hr_l0 [P, H], P from
    # weight_hr_l0: a wider weight_hr_l0 makes weight_hh_l0 disagree
    axes["state_dict['weight_hr_l0']"] = ("state_dict['weight_hh_l0']",) * 2
    return axes


def _conv_make_keras(dtype):
    (ws,) = convert.to_keras(_canonical(dtype))
    return {f"{d} {s}": w for (d, s), w in zip(
        [(d, s) for d in ("forward", "backward") for s in _KERAS_SLOTS], ws)}, None


def _conv_run_keras(a, ctx):
    return convert.from_keras([[a[f"{d} {s}"] for d in ("forward", "backward")
                                for s in _KERAS_SLOTS]], bidirectional=True)


def _conv_make_tfc(dtype):
    w, b = convert.to_tf_canonical(_canonical(dtype))
    a = {f"weights[{j}]": x for j, x in enumerate(w)}
    a.update({f"biases[{j}]": x for j, x in enumerate(b)})
    return a, None


def _conv_run_tfc(a, ctx):
    return convert.from_tf_canonical([a[f"weights[{j}]"] for j in range(12)],
                                     [a[f"biases[{j}]"] for j in range(12)],
                                     direction="bidirectional")


def _conv_make_opaque(dtype):
    return {"flat": _canonical(dtype).flat()}, None


def _conv_run_opaque(a, ctx):
    return convert.from_tf_opaque(a["flat"], Topology(I, H, 1, "bidirectional"))


def _conv_make_onnx(dtype):
    (layer,), attrs = convert.to_onnx(_canonical(dtype))
    return {f"layers[0]['{k}']": v for k, v in layer.items()}, attrs


def _conv_run_onnx(a, ctx):
    return convert.from_onnx([{k[len("layers[0]['"):-2]: v for k, v in a.items()}], **ctx)


def _conv_make_mps(dtype):
    (layer,), desc = convert.to_mps(_canonical(dtype).with_cell(Cell(reset_after=True)))
    return {f"layers[0]['{k}']": v for k, v in layer.items()}, desc


def _conv_run_mps(a, ctx):
    return convert.from_mps([{k[len("layers[0]['"):-2]: v for k, v in a.items()}], **ctx)


def _conv_make_am(dtype):
    return convert.to_arraymancer(_canonical(dtype, Topology(I, H, 2))), None


def _conv_run_am(a, ctx):
    return convert.from_arraymancer(**a)


def _conv_make_onednn(dtype):
    o = convert.to_onednn(_canonical(dtype, Topology(2 * H, H, 2, "bidirectional")))
    return {k: o[k] for k in ("weights_layer", "weights_iter", "bias")}, o["direction"]


def _conv_run_onednn(a, ctx):
    return convert.from_onednn(a["weights_layer"], a["weights_iter"], a["bias"], direction=ctx)


def _keras_axes():
    axes = {f"{d} {s}": (f"{d} {s}",) * 2 for d in ("forward", "backward") for s in _KERAS_SLOTS}
    # the input width is read from the forward kernel; the backward one must then disagree
    axes["forward kernel"] = ("backward kernel", "forward kernel")
    return axes


def _torch_axes(extra=()):
    axes = {}
    for sfx in ("", "_reverse"):
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh") + extra:
            key = f"state_dict['{name}_l0{sfx}']"
            axes[key] = (key,) * (1 if name.startswith("bias") else 2)
    axes["state_dict['weight_ih_l0']"] = ("state_dict['weight_ih_l0']",
                                          "state_dict['weight_ih_l0_reverse']")
    # the module kind (G) and H are read from weight_hh_l0 [G·H, H]: a wider one fits none
    axes["state_dict['weight_hh_l0']"] = ("state_dict['weight_hh_l0']",) * 2
    return axes


def _tfc_axes():
    axes = {**{f"weights[{j}]": (f"weights[{j}]",) * 2 for j in range(12)},
            **{f"biases[{j}]": (f"biases[{j}]",) for j in range(12)}}
    axes["weights[0]"] = ("weights[0]", "weights[1]")     # input width read from weights[0]
    axes["weights[3]"] = ("weights[0]", "weights[3]")     # H read from weights[3].shape[0]
    return axes


CALLS = {
    "tf.cudnn_rnn": Call(_tf_make_v1, _tf_run_v1, "input", axes=_TF_TM),
    "tf.cudnn_rnn_v3": Call(_tf_make_v3, _tf_run_v3, "input", ints=("sequence_lengths",),
                            axes=_TF_BM),
    "tf.cudnn_rnn_backprop": Call(
        _tf_make_bp, _tf_run_bp, "input",
        axes={**_TF_TM, "input": ("output", "input_h", "params"), **_TF_OUT}),
    "tf.cudnn_rnn_backprop_v3": Call(
        lambda dt: _tf_make_bp(dt, v3=True), _tf_run_bp3, "input", ints=("sequence_lengths",),
        axes={**_TF_BM, "input": ("input_h", "output", "params"), **_TF_OUT}),
    "tf.cudnn_rnn_v3[lstm]": Call(_tf_make_lstm, _tf_run_lstm, "input",
                                  ints=("sequence_lengths",), axes=_TF_LSTM_AXES),
    "tf.cudnn_rnn_backprop_v3[lstm]": Call(
        _tf_make_lstm_bp, _tf_run_lstm_bp, "input", ints=("sequence_lengths",),
        axes={**_TF_LSTM_AXES, "input": ("input_h", "output", "params"),
              **{k: (k,) * 3 for k in ("output", "output_h", "output_c", "output_backprop",
                                       "output_h_backprop", "output_c_backprop")}}),
    "tf.params_to_canonical": Call(
        lambda dt: ({"params": _tf_args(dt)["params"]}, None),
        lambda a, c: tf.params_to_canonical(_TF_L, H, I, a["params"], **_TF_ATTRS), "params",
        axes={"params": ("params",)}),
    "tf.canonical_to_params": Call(
        _tf_make_canon, _tf_run_canon, "weights[0]",
        axes={**{f"weights[{j}]": (f"weights[{j}]",) * 2 for j in range(6)},
              **{f"biases[{j}]": (f"biases[{j}]",) for j in range(6)}}),
    "mps.gru": Call(_mps_make, _mps_run, "source", axes=_MPS_AXES, drop_axis={"mask": None},
                    scalar={"mask": None},
                    valid_dtypes={"mask": (np.bool_,)}),
    "mps.gru_gradients": Call(
        _mps_make_grad, _mps_run_grad, "source",
        axes={**_MPS_AXES, **_MPS_GRAD_AXES, "state_gradient": ("state_gradient",) * 2},
        drop_axis={"mask": None}, scalar={"mask": None}, valid_dtypes={"mask": (np.bool_,)}),
    "onnx.gru": Call(_onnx_make, _onnx_run, "X", ints=("sequence_lens",),
                     axes={"X": (None, "initial_h", "W"), "W": ("W",) * 3, "R": ("R",) * 3,
                           "B": ("B",) * 2, "initial_h": ("initial_h",) * 3}),
    "arraymancer.gru": Call(_am_make, _am_run, "W3s0", axes=_AM_AXES),
    "arraymancer.gru_forward": Call(_am_make, _am_run_fwd, "W3s0", axes=_AM_AXES),
    "arraymancer.gru_backward": Call(_am_make_bwd, _am_run_bwd,
                                     axes={"d_output": ("d_output",) * 3,
                                           "d_hiddenN": ("d_hiddenN",) * 3}),
    "convert.from_torch": Call(_conv_make_torch, _conv_run_torch, "state_dict['weight_hh_l0']",
                               axes=_torch_axes()),
    "convert.from_torch[lstm]": Call(_conv_make_torch_lstm, _conv_run_torch,
                                     "state_dict['weight_hh_l0']", axes=_torch_lstm_axes()),
    "convert.from_keras": Call(_conv_make_keras, _conv_run_keras, "forward kernel",
                               axes=_keras_axes(),
                               labels={f"{d} {s}": f"layers[0] {s}"
                                       for d in ("forward", "backward") for s in _KERAS_SLOTS}),
    "convert.from_tf_canonical": Call(_conv_make_tfc, _conv_run_tfc, "weights[3]",
                                      axes=_tfc_axes(), add_axis={"weights[3]": "weights[0]"}),
    "convert.from_tf_opaque": Call(_conv_make_opaque, _conv_run_opaque, "flat",
                                   axes={"flat": ("flat",)}),
    "convert.from_onnx": Call(
        _conv_make_onnx, _conv_run_onnx, "layers[0]['R']",
        axes={"layers[0]['W']": ("layers[0]['W']", "layers[0]['W']", None),
              "layers[0]['R']": ("layers[0]['R']", "layers[0]['R']", "layers[0]['R']"),
              "layers[0]['B']": ("layers[0]['B']",) * 2}),
    "convert.from_mps": Call(
        _conv_make_mps, _conv_run_mps, "layers[0]['recurrent_weight']",
        axes={"layers[0]['input_weight']": ("layers[0]['input_weight']", None),
              "layers[0]['recurrent_weight']": ("layers[0]['recurrent_weight']",) * 3,
              "layers[0]['bias']": ("layers[0]['bias']",),
              "layers[0]['secondary_bias']": ("layers[0]['secondary_bias']",)}),
    "convert.from_arraymancer": Call(
        _conv_make_am, _conv_run_am, "w3s0",
        axes={"w3s0": ("w3s0", None), "w3sN": ("w3sN",) * 3, "u3s": ("w3sN", "u3s", "u3s"),
              "bW3s": ("bW3s",) * 3, "bU3s": ("bU3s",) * 3}),
    "convert.from_onednn": Call(
        _conv_make_onednn, _conv_run_onednn, "weights_layer",
        # weights_layer's gate axis G says the cell kind (3 → 4 reads as an LSTM's, whose
        # weights_iter then disagrees)
        axes={"weights_layer": ("weights_iter", "weights_layer", ("weights_layer", False),
                                "weights_iter", "weights_iter"),
              "weights_iter": ("weights_iter",) * 5, "bias": ("bias",) * 4}),
}

# --- helpers ----------------------------------------------------------------------------------
def _first_label(msg, labels):
    """The label among ``labels`` that occurs first in ``msg`` as a whole name."""
    best = None
    for lab in labels:
        m = re.search(r"(?<![A-Za-z0-9_])" + re.escape(lab) + r"(?![A-Za-z0-9_])", msg)
        if m and (best is None or m.start() < best[0]
                  or m.start() == best[0] and len(lab) > len(best[1])):
            best = (m.start(), lab)
    return None if best is None else best[1]


def _mentions_shape(msg, shape):
    """True when ``msg`` quotes ``shape`` as ``[a, b]``, ``[a,b]``, ``(a, b)`` or ``(a,)``."""
    flat = msg.replace(" ", "")
    body = ",".join(map(str, shape))
    return any(s in flat for s in (f"[{body}]", f"({body})", f"({body},)"))


def _check_raises(call, args, ctx, exc, blamed, *parts):
    """Run ``call`` and require ``exc`` naming ``blamed`` first among the call's arguments and
    containing every string in ``parts``."""
    c = CALLS[call]
    with pytest.raises(exc) as info:
        c.run(args, ctx)
    msg = str(info.value)
    labels = {c.label(k) for k in args} | {blamed}
    assert _first_label(msg, labels) == blamed, f"message should name {blamed!r}: {msg}"
    for p in parts:
        assert p in msg, f"message should contain {p!r}: {msg}"
    return msg


def _flatten(obj):
    """Every array and scalar inside a result, in order (Params as their flat vector)."""
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, Network):                 # a cgru.Network: its weights, sizes and cell
        return [obj.flat(), repr(obj.topology), obj.cell]
    if isinstance(obj, dict):
        return [x for k in sorted(obj) for x in [k] + _flatten(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [x for o in obj for x in _flatten(o)]
    if isinstance(obj, am.GRUCache):
        return _flatten([obj.params, obj.input, obj.reserve])
    return [obj]


def _assert_same(got, want):
    g, w = _flatten(got), _flatten(want)
    assert len(g) == len(w)
    for a, b in zip(g, w):
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        else:
            assert a == b


def _digest(a):
    return (a.shape, a.dtype.str, a.strides, hashlib.sha256(np.ascontiguousarray(a)).hexdigest())


def _float_args(call, dtype=np.float64):
    c = CALLS[call]
    args, _ = c.make(dtype)
    return [k for k, v in args.items() if k not in c.ints and v.dtype.kind == "f"]


def _params_for(classes, with_defining=True):
    out = []
    for call in CALLS:
        for name in _float_args(call):
            for cls in classes:
                if not with_defining and name == CALLS[call].defining:
                    continue
                out.append(pytest.param(call, name, cls, id=f"{call}-{name}-{cls}"))
    return out


def test_every_registered_call_works():
    """Positive control: the unmodified calls of this file succeed in both dtypes."""
    for call, c in CALLS.items():
        for dtype in (np.float32, np.float64):
            args, ctx = c.make(dtype)
            assert _flatten(c.run(args, ctx)), call


# --- 1. array classes -------------------------------------------------------------------------
@pytest.mark.parametrize("call,name,cls", _params_for(("list",)))
def test_not_an_array(call, name, cls):
    c = CALLS[call]
    args, ctx = c.make(np.float64)
    args[name] = args[name].tolist()
    _check_raises(call, args, ctx, TypeError, c.label(name), "numpy array", "list")


BAD_DTYPES = [np.int64, np.int32, np.bool_, np.complex128, np.object_, np.float16]


@pytest.mark.parametrize("bad", BAD_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("call,name,cls", _params_for(("dtype",)))
def test_non_float_dtypes(call, name, cls, bad):
    c = CALLS[call]
    args, ctx = c.make(np.float64)
    args[name] = args[name].astype(bad)
    if bad in c.valid_dtypes.get(name, ()):
        c.run(args, ctx)
        return
    _check_raises(call, args, ctx, TypeError, c.label(name), np.dtype(bad).name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("call,name,cls", _params_for(("mixed",), with_defining=False))
def test_mixed_float_dtypes(call, name, cls, dtype):
    c = CALLS[call]
    other = np.float64 if dtype == np.float32 else np.float32
    args, ctx = c.make(dtype)
    args[name] = args[name].astype(other)
    _check_raises(call, args, ctx, TypeError, c.label(name), np.dtype(other).name,
                  np.dtype(dtype).name)


@pytest.mark.parametrize("call,name,cls", _params_for(("rank+", "rank-", "scalar")))
def test_wrong_rank(call, name, cls):
    """One axis too many (``a[None]``), one too few (``a[0]``) and a 0-d array."""
    c = CALLS[call]
    args, ctx = c.make(np.float64)
    a = args[name]
    args[name] = {"rank+": a[None], "rank-": a[0, ...], "scalar": a.reshape(-1)[0, ...]}[cls]
    blamed = c.add_axis.get(name, name) if cls == "rank+" else \
        c.drop_axis.get(name, name) if cls == "rank-" else c.scalar.get(name, name)
    if blamed is None:                      # still valid (a broadcastable mask)
        c.run(args, ctx)
        return
    msg = _check_raises(call, args, ctx, ValueError, c.label(blamed))
    if blamed == name:
        assert _mentions_shape(msg, args[name].shape), msg


def _axis_params():
    out = []
    for call, c in CALLS.items():
        args, _ = c.make(np.float64)
        for name in _float_args(call):
            for k in range(args[name].ndim):
                out.append(pytest.param(call, name, k, id=f"{call}-{name}-axis{k}"))
    return out


@pytest.mark.parametrize("call,name,axis", _axis_params())
def test_each_axis_one_too_long(call, name, axis):
    c = CALLS[call]
    args, ctx = c.make(np.float64)
    a = args[name]
    pad = [(0, 0)] * a.ndim
    pad[axis] = (0, 1)
    args[name] = np.pad(a, pad, constant_values=0.5)
    blamed, quotes = c.axes[name][axis], True
    if isinstance(blamed, tuple):
        blamed, quotes = blamed
    if blamed is None:                      # a free size (T, or a width read from it)
        c.run(args, ctx)
        return
    msg = _check_raises(call, args, ctx, ValueError, c.label(blamed))
    if blamed == name and quotes:
        assert _mentions_shape(msg, args[name].shape), msg


def test_axis_tables_cover_every_argument():
    for call, c in CALLS.items():
        args, _ = c.make(np.float64)
        for name in _float_args(call):
            assert len(c.axes[name]) == args[name].ndim, (call, name)


# zero-size T, N, I, H: (call, {argument: axis emptied, or a function of the argument},
# blamed argument)
def _zero(a, axis):
    return np.take(a, [], axis=axis)


ZERO_SIZES = [
    ("tf.cudnn_rnn", {"input": 0}, "input"),
    ("tf.cudnn_rnn", {"input": 1, "input_h": 1}, "input"),
    ("tf.cudnn_rnn", {"input": 2}, "input"),
    ("tf.cudnn_rnn", {"input_h": 2}, "input_h"),
    ("tf.cudnn_rnn", {"input_h": 0}, "input_h"),
    ("tf.cudnn_rnn_v3", {"input": 1}, "input"),
    ("tf.cudnn_rnn_v3", {"input": 0, "input_h": 0, "sequence_lengths": 0}, "input"),
    ("mps.gru", {"source": 0, "mask": 0}, "source"),
    ("mps.gru", {"source": 1, "init_state": 0, "mask": 1}, "source"),
    ("mps.gru", {"source": 2, "input_weight": 1}, "source"),
    ("mps.gru", {"recurrent_weight": 2}, "recurrent_weight"),
    ("onnx.gru", {"X": 0, "sequence_lens": lambda a: np.zeros_like(a)}, "X"),
    ("onnx.gru", {"X": 1, "initial_h": 1, "sequence_lens": 0}, "X"),
    ("onnx.gru", {"X": 2, "W": 2}, "X"),
    ("onnx.gru", {"R": 2}, "R"),
    ("arraymancer.gru", {"input": 0}, "input"),
    ("arraymancer.gru", {"input": 1, "hidden0": 1}, "input"),
    ("arraymancer.gru", {"input": 2, "W3s0": 1}, "input"),
    ("arraymancer.gru", {"W3s0": 0}, "W3s0"),
    ("arraymancer.gru", {"U3s": 0, "W3sN": 0, "bW3s": 0, "bU3s": 0, "hidden0": 0}, "U3s"),
    ("convert.from_keras", {"forward kernel": 1}, "forward kernel"),
    ("convert.from_arraymancer", {"w3s0": 0}, "w3s0"),
    ("convert.from_arraymancer", {"u3s": 0, "w3sN": 0, "bW3s": 0, "bU3s": 0}, "u3s"),
]


@pytest.mark.parametrize("k", [
    pytest.param(k, id=f"{c}-{'+'.join(z)}") for k, (c, z, _) in enumerate(ZERO_SIZES)])
def test_zero_sizes(k):
    call, zeros, blamed = ZERO_SIZES[k]
    c = CALLS[call]
    args, ctx = c.make(np.float64)
    for name, axis in zeros.items():
        args[name] = axis(args[name]) if callable(axis) else _zero(args[name], axis)
    msg = _check_raises(call, args, ctx, ValueError, c.label(blamed))
    if not callable(zeros.get(blamed, 0)):
        assert _mentions_shape(msg, args[blamed].shape) or "≥ 1" in msg, msg


# --- 2. odd but valid forms, inputs untouched, NaN/Inf --------------------------------------------
def _strided(a, how):
    """The values of ``a`` in a non-contiguous / negative-stride / Fortran view."""
    if how == "reversed":
        v = np.ascontiguousarray(a[(slice(None, None, -1),) * a.ndim])[
            (slice(None, None, -1),) * a.ndim]
    elif how == "fortran":
        v = np.asfortranarray(a)
    else:
        big = np.zeros(tuple(2 * s for s in a.shape), a.dtype)
        v = big[(slice(None, None, 2),) * a.ndim]
        v[...] = a
    np.testing.assert_array_equal(v, a)
    return v


@pytest.mark.parametrize("how", ["reversed", "fortran", "step2"])
@pytest.mark.parametrize("call", list(CALLS))
def test_views_give_the_same_results(call, how):
    c = CALLS[call]
    args, ctx = c.make(np.float64)
    want = c.run(args, ctx)
    views = {k: _strided(v, how) for k, v in args.items()}
    assert any(not v.flags.c_contiguous for v in views.values()) or how == "fortran"
    _assert_same(c.run(views, ctx), want)


@pytest.mark.parametrize("call", list(CALLS))
def test_read_only_inputs_work(call):
    c = CALLS[call]
    args, ctx = c.make(np.float32)
    want = c.run({k: v.copy() for k, v in args.items()}, ctx)
    for v in args.values():
        v.flags.writeable = False
    _assert_same(c.run(args, ctx), want)


@pytest.mark.parametrize("call", list(CALLS))
def test_inputs_are_never_modified(call):
    c = CALLS[call]
    args, ctx = c.make(np.float64)
    before = {k: _digest(v) for k, v in args.items()}
    ctx_before = [_digest(a) for a in _flatten(ctx) if isinstance(a, np.ndarray)]
    out = c.run(args, ctx)
    out_before = [_digest(a) for a in _flatten(out) if isinstance(a, np.ndarray)]
    c.run(args, ctx)                        # a second call leaves the first one's results alone
    assert {k: _digest(v) for k, v in args.items()} == before
    assert [_digest(a) for a in _flatten(ctx) if isinstance(a, np.ndarray)] == ctx_before
    assert [_digest(a) for a in _flatten(out) if isinstance(a, np.ndarray)] == out_before


# NaN/Inf: (call, argument, index of the poisoned element, batch axis of each output array
# (None: mixes the batch, e.g. weight gradients), the clean batch entry)
NAN_CASES = {
    "tf.cudnn_rnn": ("input", (2, 0, 1), [1, 1, None, None]),
    "tf.cudnn_rnn_v3": ("input", (0, 2, 1), [0, 0, None, None, None]),
    "tf.cudnn_rnn_backprop": ("output_backprop", (2, 0, 1), [1, 1, None, None]),
    "tf.cudnn_rnn_backprop_v3": ("output_backprop", (0, 2, 1), [0, 0, None, None]),
    "mps.gru": ("source", (2, 0, 1), [1, 1]),
    "mps.gru_gradients": ("source_gradient", (2, 0, 1), [1, None, None, None, 0, None]),
    "onnx.gru": ("X", (2, 0, 1), [2, 1]),
    "arraymancer.gru": ("input", (2, 0, 1), [1, 1]),
    "arraymancer.gru_backward": ("d_output", (2, 0, 1), [1, 1, None, None, None, None, None]),
}


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("call", list(NAN_CASES))
def test_nan_inf_propagate_to_their_sequence_only(call, bad):
    """One non-finite element in batch entry 0: every output of entry 1 is bitwise the clean
    result; with NaN, entry 0's outputs (and the batch-mixing weight gradients) hold NaN."""
    c = CALLS[call]
    name, idx, batch_axes = NAN_CASES[call]
    args, ctx = c.make(np.float64)
    clean = [a for a in _flatten(c.run(args, ctx)) if isinstance(a, np.ndarray)]
    args[name] = args[name].copy()
    args[name][idx] = bad
    got = [a for a in _flatten(c.run(args, ctx)) if isinstance(a, np.ndarray)]
    assert len(got) == len(clean) == len(batch_axes)
    for g, cl, ax in zip(got, clean, batch_axes):
        if ax is None or g.size == 0 or g.dtype == np.uint8:
            continue
        np.testing.assert_array_equal(np.take(g, [1], axis=ax), np.take(cl, [1], axis=ax))
        if np.isnan(bad):
            assert np.isnan(np.take(g, [0], axis=ax)).any()
    if np.isnan(bad):
        mixed = [g for g, ax in zip(got, batch_axes) if ax is None and g.dtype.kind == "f"
                 and g.size]
        assert all(np.isnan(g).any() for g in mixed[-1:])


def test_nan_in_weights_reaches_every_output():
    """NaN in one recurrent weight of the forward direction makes its outputs NaN from the
    second step on (the first step's other units do not read it), leaves the padding
    (t ≥ len) exactly 0 and the reverse direction untouched."""
    args, ctx = _onnx_make(np.float64)
    clean_Y, _ = _onnx_run(args, ctx)
    args["R"] = args["R"].copy()
    args["R"][0, 0, 0] = np.nan
    Y, Y_h = _onnx_run(args, ctx)                       # Y [T, D, N, H]
    active = np.arange(T)[:, None] < LENGTHS[None, :]  # [T, N]
    fwd = Y[:, 0]                                       # [T, N, H]
    assert np.isnan(fwd[1:][active[1:]]).all()          # every unit of every later step
    assert np.isnan(fwd[0][:, 0]).all()                 # the unit whose z row holds the NaN
    assert (fwd[~active] == 0).all()                    # padding stays exactly 0
    assert np.isnan(Y_h[0]).all()
    np.testing.assert_array_equal(Y[:, 1], clean_Y[:, 1])


# --- 3a. sequence lengths -------------------------------------------------------------------------
LEN_CALLS = {"tf.cudnn_rnn_v3": "sequence_lengths", "tf.cudnn_rnn_backprop_v3": "sequence_lengths",
             "onnx.gru": "sequence_lens"}
BAD_LENGTHS = [
    ("negative", np.array([-1, 3]), ValueError, ["-1"]),
    ("too_long", np.array([T + 1, 3]), ValueError, [str(T + 1), f"{T}"]),
    ("wrong_count", np.array([5, 3, 1]), ValueError, ["[3]"]),
    ("empty", np.array([], np.int64), ValueError, ["[0]"]),
    ("two_d", np.array([[5, 3]]), ValueError, ["[1", "2]"]),
    ("float", np.array([5.0, 3.0]), TypeError, ["float64"]),
    ("nan", np.array([np.nan, 3.0]), TypeError, ["float64"]),
    ("bool", np.array([True, False]), TypeError, ["bool"]),
    ("str", np.array(["5", "3"]), TypeError, ["<U1"]),
    ("object", np.array([5, 3], dtype=object), TypeError, ["object"]),
    ("huge_uint64", np.array([2 ** 64 - 1, 3], np.uint64), ValueError,
     ["18446744073709551615"]),
    ("huge_int64", np.array([2 ** 62, 3]), ValueError, [str(2 ** 62)]),
]
@pytest.mark.parametrize("call,case", [
    pytest.param(c, b[0], id=f"{c}-{b[0]}") for c in LEN_CALLS for b in BAD_LENGTHS])
def test_bad_sequence_lengths(call, case):
    _, bad, exc, parts = next(b for b in BAD_LENGTHS if b[0] == case)
    c = CALLS[call]
    args, ctx = c.make(np.float64)
    args[LEN_CALLS[call]] = bad
    msg = _check_raises(call, args, ctx, exc, LEN_CALLS[call])
    flat = msg.replace(" ", "")
    for p in parts:
        assert p.replace(" ", "") in flat, msg


@pytest.mark.parametrize("form", ["list", "int32", "uint8", "tuple"])
@pytest.mark.parametrize("call", list(LEN_CALLS))
def test_other_integer_length_forms_work(call, form):
    c = CALLS[call]
    args, ctx = c.make(np.float64)
    want = c.run(args, ctx)
    conv = {"list": list, "tuple": tuple, "int32": lambda a: a.astype(np.int32),
            "uint8": lambda a: a.astype(np.uint8)}[form]
    args[LEN_CALLS[call]] = conv(LENGTHS)
    _assert_same(c.run(args, ctx), want)


# --- 3b. TF reserve spaces ------------------------------------------------------------------------
def _misaligned(a):
    buf = np.empty(a.size + 1, np.uint8)
    v = buf[1:]
    v[...] = a
    return v


RESERVES = [
    ("truncated_by_one", lambda r: r[:-1], ValueError, ["truncated"]),
    ("padded_by_one", lambda r: np.concatenate([r, r[:1]]), ValueError, ["padded"]),
    ("header_only", lambda r: r[:64].copy(), ValueError, []),
    ("shorter_than_header", lambda r: r[:10].copy(), ValueError, ["too small"]),
    ("empty", lambda r: r[:0], ValueError, ["is_training=False"]),
    ("int8_view", lambda r: r.view(np.int8), TypeError, ["int8"]),
    ("float_view", lambda r: r.view(np.float64), TypeError, ["float64"]),
    ("two_d", lambda r: r.reshape(2, -1), TypeError, ["shape"]),
    ("list", lambda r: r.tolist(), TypeError, ["list"]),
    ("engine_reserve", lambda r: r[64:].copy(), ValueError, ["not a cgru.tf"]),
    ("zeroed_header", lambda r: np.concatenate([np.zeros(64, np.uint8), r[64:]]), ValueError,
     ["not a cgru.tf"]),
]


@pytest.mark.parametrize("call", ["tf.cudnn_rnn_backprop", "tf.cudnn_rnn_backprop_v3"])
@pytest.mark.parametrize("case", [r[0] for r in RESERVES])
def test_bad_reserve_space(call, case):
    _, damage, exc, parts = next(r for r in RESERVES if r[0] == case)
    c = CALLS[call]
    args, ctx = c.make(np.float64)
    args["reserve_space"] = damage(args["reserve_space"])
    _check_raises(call, args, ctx, exc, "reserve_space", *parts)


@pytest.mark.parametrize("how", ["read_only", "misaligned", "step1_view"])
def test_odd_but_valid_reserve_space_works(how):
    c = CALLS["tf.cudnn_rnn_backprop"]
    args, ctx = c.make(np.float64)
    want = c.run(args, ctx)
    r = args["reserve_space"].copy()
    if how == "read_only":
        r.flags.writeable = False
    elif how == "misaligned":
        r = _misaligned(r)
        assert r.ctypes.data % 8
    else:
        r = np.concatenate([np.zeros(8, np.uint8), r])[8:]
    args["reserve_space"] = r
    _assert_same(c.run(args, ctx), want)


def test_reserve_space_of_another_v3_call_with_other_lengths():
    c = CALLS["tf.cudnn_rnn_backprop_v3"]
    args, ctx = c.make(np.float64)
    args["sequence_lengths"] = np.array([4, 3])
    _check_raises("tf.cudnn_rnn_backprop_v3", args, ctx, ValueError, "reserve_space",
                  "sequence_lengths")


def test_arraymancer_cache_of_the_wrong_type():
    args, cache = _am_make_bwd(np.float64)
    for bad in (None, cache.reserve, (cache.params, cache.input, cache.reserve)):
        with pytest.raises(TypeError, match="^cache: expected the GRUCache"):
            am.gru_backward(args["d_output"], args["d_hiddenN"], bad)


# --- 3c. option strings, flags, dropout -----------------------------------------------------------
def _tf_op(op, fwd_attrs=None, **attrs):
    """Call TF op ``op`` with valid arrays and ``attrs`` (TF attribute names); a backprop op
    gets the reserve of a forward run with ``fwd_attrs`` (default: the valid ones)."""
    a = {**_TF_ATTRS, **attrs}
    if op == "params_size":
        return tf.params_size(_TF_L, H, I, **a)
    if op == "params_to_canonical":
        return tf.params_to_canonical(_TF_L, H, I, _tf_args(np.float64)["params"], **a)
    if op == "canonical_to_params":
        w, b = tf.params_to_canonical(_TF_L, H, I, _tf_args(np.float64)["params"], **_TF_ATTRS)
        return tf.canonical_to_params(_TF_L, H, I, w, b, **a)
    args, _ = _tf_make_v1(np.float64)
    if op == "cudnn_rnn":
        return tf.cudnn_rnn(args["input"], args["input_h"], None, args["params"], **a)
    if op == "cudnn_rnn_v3":
        return tf.cudnn_rnn_v3(args["input"], args["input_h"], None, args["params"], **a)
    f = tf.cudnn_rnn(args["input"], args["input_h"], None, args["params"],
                     **{**_TF_ATTRS, **(fwd_attrs or {})})
    if op == "cudnn_rnn_backprop":
        return tf.cudnn_rnn_backprop(args["input"], args["input_h"], None, args["params"],
                                     f.output, f.output_h, None, f.output, None, None,
                                     f.reserve_space, **a)
    return tf.cudnn_rnn_backprop_v3(args["input"], args["input_h"], None, args["params"], None,
                                    f.output, f.output_h, None, f.output, None, None,
                                    f.reserve_space, **a)


TF_OPS = ["params_size", "params_to_canonical", "canonical_to_params", "cudnn_rnn",
          "cudnn_rnn_v3", "cudnn_rnn_backprop", "cudnn_rnn_backprop_v3"]
BAD_TF_ATTRS = [
    ("rnn_mode", "GRU", ValueError), ("rnn_mode", " gru", ValueError),
    ("rnn_mode", b"GRU", ValueError), ("rnn_mode", None, ValueError),
    ("input_mode", b"linear", ValueError), ("direction", b"forward", ValueError),
    ("input_mode", "linear", ValueError), ("input_mode", "Linear_Input", ValueError),
    ("input_mode", 0, ValueError),
    ("direction", "forward", ValueError), ("direction", "BIDIRECTIONAL", ValueError),
    ("direction", ["bidirectional"], ValueError), ("direction", None, ValueError),
    ("dropout", -0.1, ValueError), ("dropout", 1.0, ValueError), ("dropout", 1.5, ValueError),
    ("dropout", float("nan"), ValueError), ("dropout", float("inf"), ValueError),
    ("dropout", "0.1", TypeError), ("dropout", True, TypeError), ("dropout", None, TypeError),
    ("dropout", [0.1], TypeError),
    ("seed", 2 ** 63, ValueError), ("seed2", -2 ** 63 - 1, ValueError),
    ("seed", "1", TypeError), ("seed2", 1.0, TypeError),
]


@pytest.mark.parametrize("attr,value,exc", BAD_TF_ATTRS,
                         ids=[f"{a}={v!r}" for a, v, _ in BAD_TF_ATTRS])
@pytest.mark.parametrize("op", TF_OPS)
def test_tf_bad_attributes_in_every_op(op, attr, value, exc):
    with pytest.raises(exc) as info:
        _tf_op(op, **{attr: value})
    assert re.search(rf"(?<![\w]){attr}(?![\w])", str(info.value)), str(info.value)


@pytest.mark.parametrize("op", TF_OPS)
def test_tf_string_attributes_may_be_bytes(op):
    """TF's ``op.get_attr`` returns bytes: every string attribute accepts them, same results."""
    as_str = dict(rnn_mode="gru", input_mode="linear_input", direction="bidirectional")
    as_bytes = {k: v.encode() for k, v in as_str.items()}
    _assert_same(_tf_op(op, fwd_attrs=as_bytes, **as_bytes), _tf_op(op, **as_str))


def test_tf_auto_select_as_bytes_resolves_as_str():
    assert tf.params_size(1, H, H, input_mode=b"auto_select", rnn_mode="gru") == \
        tf.params_size(1, H, H, input_mode="skip_input", rnn_mode="gru")


def test_onnx_string_attributes_may_be_bytes():
    """``onnx.helper.get_attribute_value`` returns bytes for direction and activations."""
    args, _ = _onnx_make(np.float64)
    attrs = dict(_ONNX_ATTRS, activations=["HardSigmoid", "Softsign"] * 2)
    as_bytes = dict(attrs, direction=attrs["direction"].encode(),
                    activations=[a.encode() for a in attrs["activations"]])
    call = lambda a: connx.gru(args["X"], args["W"], args["R"], args["B"],  # noqa: E731
                               args["sequence_lens"], args["initial_h"], **a)
    _assert_same(call(as_bytes), call(attrs))


def test_mps_descriptor_activations_may_be_bytes():
    args, _ = _mps_make(np.float64)
    names = dict(update_gate_activation="hard_sigmoid", reset_gate_activation="none",
                 output_gate_activation="relu")
    want = mps.gru(descriptor=mps.GRUDescriptor(**_MPS_DESC, **names), **args)
    got = mps.gru(descriptor=mps.GRUDescriptor(
        **_MPS_DESC, **{k: v.encode() for k, v in names.items()}), **args)
    _assert_same(got, want)


@pytest.mark.parametrize("op", ["cudnn_rnn", "cudnn_rnn_backprop"])
def test_tf_largest_dropout_below_one_works(op):
    attrs = dict(dropout=float(np.nextafter(1.0, 0.0)), seed=3, seed2=4)
    out = _tf_op(op, fwd_attrs=attrs, **attrs)
    assert np.isfinite(out[0]).all()


BAD_MPS_DESCRIPTORS = [
    ("update_gate_activation", "Sigmoid", ValueError),
    ("reset_gate_activation", "sigmoid ", ValueError),
    ("output_gate_activation", "linear", ValueError),
    ("output_gate_activation", None, ValueError),
    ("output_gate_activation", 3, ValueError),
    ("reverse", "yes", TypeError), ("bidirectional", 1, TypeError),
    ("training", None, TypeError), ("reset_gate_first", "False", TypeError),
    ("reset_after", np.array([True]), TypeError), ("flip_z", 0.0, TypeError),
]


@pytest.mark.parametrize("field_,value,exc", BAD_MPS_DESCRIPTORS,
                         ids=[f"{f}={v!r}" for f, v, _ in BAD_MPS_DESCRIPTORS])
def test_mps_bad_descriptor_fields(field_, value, exc):
    with pytest.raises(exc, match=f"descriptor.{field_}"):
        mps.GRUDescriptor(**{field_: value})
    desc = mps.GRUDescriptor(**_MPS_DESC)
    setattr(desc, field_, value)            # mutated after construction: checked per call
    args, _ = _mps_make(np.float64)
    with pytest.raises(exc, match=f"descriptor.{field_}"):
        mps.gru(descriptor=desc, **args)
    g, _ = _mps_make_grad(np.float64)
    with pytest.raises(exc, match=f"descriptor.{field_}"):
        mps.gru_gradients(g["source"], g["recurrent_weight"], g["source_gradient"],
                          g["z_state"], g["output_fwd"], input_weight=g["input_weight"],
                          descriptor=desc)


BAD_ONNX_ATTRS = [
    ("direction", "Forward", ValueError), ("direction", "backward", ValueError),
    ("direction", None, ValueError), ("direction", ["bidirectional"], ValueError),
    ("direction", np.array(["bidirectional"]), ValueError),
    ("linear_before_reset", 2, ValueError), ("linear_before_reset", "1", ValueError),
    ("linear_before_reset", 0.5, ValueError), ("linear_before_reset", None, ValueError),
    ("linear_before_reset", np.array([1]), ValueError),
    ("layout", 2, ValueError), ("layout", "0", ValueError), ("layout", 1.0, ValueError),
    ("layout", None, ValueError),
    ("activations", ["Sigmoid", "Gelu"] * 2, ValueError),
    ("activations", ["sigmoid", "tanh"], ValueError),            # 2 names, D = 2 needs 4
    ("activations", "Sigmoid", TypeError), ("activations", ["Sigmoid", None] * 2, TypeError),
    ("activation_alpha", [0.5], ValueError), ("activation_alpha", "0.5", TypeError),
    ("activation_alpha", [None], TypeError), ("activation_beta", [True], TypeError),
    ("clip", 0.0, ValueError), ("clip", -1.0, ValueError), ("clip", float("nan"), ValueError),
    ("clip", "1", ValueError), ("clip", True, ValueError),
    ("hidden_size", 4, ValueError), ("hidden_size", 3.0, ValueError),
    ("hidden_size", 0, ValueError), ("hidden_size", "3", ValueError),
]
@pytest.mark.parametrize("attr,value,exc", [
    pytest.param(a, v, e, id=f"{a}={v!r}") for a, v, e in BAD_ONNX_ATTRS])
def test_onnx_bad_attributes(attr, value, exc):
    args, _ = _onnx_make(np.float64)
    attrs = {**_ONNX_ATTRS, attr: value}
    with pytest.raises(exc) as info:
        connx.gru(args["X"], args["W"], args["R"], args["B"], args["sequence_lens"],
                  args["initial_h"], **attrs)
    assert attr.split("_")[0] in str(info.value) or attr in str(info.value), str(info.value)


def test_onnx_run_refuses_garbage_model_bytes():
    pytest.importorskip("onnx")
    args, _ = _onnx_make(np.float64)
    with pytest.raises((TypeError, ValueError), match="model"):
        connx.run(b"\x00garbage", {"X": args["X"]})


def test_onnx_run_refuses_inputs_that_are_not_a_dict():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    node = helper.make_node("GRU", ["X", "W", "R"], ["Y"], hidden_size=H)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        n, TensorProto.DOUBLE, None) for n in ("X", "W", "R")],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, None)])
    model = helper.make_model(graph)
    with pytest.raises(TypeError, match="^inputs:"):
        connx.run(model, [("X", np.zeros((T, N, I)))])


# Converters: option strings and flags that must be refused (not read by truthiness).
def _conv_options():
    p = _canonical(np.float64)
    p1 = _canonical(np.float64, Topology(I, H, 1))
    onnx_layers, onnx_attrs = convert.to_onnx(p)
    mps_layers, mps_desc = convert.to_mps(p.with_cell(Cell(reset_after=True)))
    keras = convert.to_keras(p)
    o = convert.to_onednn(_canonical(np.float64, Topology(2 * H, H, 2, "bidirectional")))
    w, b = convert.to_tf_canonical(p)
    return [
        ("to_torch-params", lambda: convert.to_torch("p"), TypeError, "params"),
        ("to_torch-cell", lambda: convert.to_torch(p, "default"), TypeError, "cell"),
        ("to_torch-bias_str", lambda: convert.to_torch(p, bias="no"), TypeError, "bias"),
        ("to_keras-reset_after", lambda: convert.to_keras(p, reset_after="yes"), ValueError,
         "reset_after"),
        ("to_keras-use_bias_str", lambda: convert.to_keras(p, use_bias="no"), TypeError,
         "use_bias"),
        ("keras_config-cell", lambda: convert.keras_config("cell"), TypeError, "cell"),
        ("from_keras-activation", lambda: convert.from_keras(keras, bidirectional=True,
                                                             activation="Tanh"),
         ValueError, "activation"),
        ("from_keras-activation_list", lambda: convert.from_keras(
            keras, bidirectional=True, activation=["tanh"]), TypeError, "activation"),
        ("from_keras-bidirectional_str", lambda: convert.from_keras(keras, bidirectional="no"),
         TypeError, "bidirectional"),
        ("from_keras-reset_after_str", lambda: convert.from_keras(
            keras, bidirectional=True, reset_after="no"), TypeError, "reset_after"),
        ("from_keras-layer_not_a_list", lambda: convert.from_keras([5]), TypeError, "layers[0]"),
        ("from_keras-None", lambda: convert.from_keras(None), TypeError, "layers"),
        ("from_torch-not_a_mapping", lambda: convert.from_torch([1]), TypeError, "state_dict"),
        ("from_torch-int_key", lambda: convert.from_torch({0: np.zeros(3)}), ValueError,
         "state_dict"),
        ("from_torch-unknown_key", lambda: convert.from_torch({"weight_xx_l0": np.zeros(3)}),
         ValueError, "state_dict"),
        ("from_torch-empty", lambda: convert.from_torch({}), ValueError, "state_dict"),
        ("from_tf_canonical-direction", lambda: convert.from_tf_canonical(
            w, b, direction="unidirectional"), ValueError, "direction"),
        ("from_tf_canonical-input_mode", lambda: convert.from_tf_canonical(
            w, b, direction="bidirectional", input_mode="skip_input"), ValueError, "input_mode"),
        ("from_tf_canonical-None", lambda: convert.from_tf_canonical(None, None), TypeError,
         "weights"),
        ("from_tf_canonical-count", lambda: convert.from_tf_canonical(w[:-1], b[:-1]),
         ValueError, "weights"),
        ("from_tf_opaque-topology", lambda: convert.from_tf_opaque(p.flat(), "t"), TypeError,
         "topology"),
        ("to_onnx-linear_before_reset", lambda: convert.to_onnx(p, linear_before_reset=2),
         ValueError, "linear_before_reset"),
        ("from_onnx-direction", lambda: convert.from_onnx(onnx_layers, **{
            **onnx_attrs, "direction": "Bidirectional"}), ValueError, "direction"),
        ("from_onnx-layout", lambda: convert.from_onnx(onnx_layers, **{
            **onnx_attrs, "layout": 7}), ValueError, "layout"),
        ("from_onnx-hidden_size_str", lambda: convert.from_onnx(onnx_layers, **{
            **onnx_attrs, "hidden_size": "3"}), TypeError, "hidden_size"),
        ("from_onnx-missing_R", lambda: convert.from_onnx([{"W": onnx_layers[0]["W"]}],
                                                          **onnx_attrs),
         ValueError, "layers[0]"),
        ("from_onnx-node_not_a_dict", lambda: convert.from_onnx([5], **onnx_attrs), TypeError,
         "layers[0]"),
        ("to_mps-reset_gate_first_str", lambda: convert.to_mps(p, reset_gate_first="yes"),
         TypeError, "reset_gate_first"),
        ("to_mps-reset_after", lambda: convert.to_mps(p, reset_after=2), ValueError,
         "reset_after"),
        ("from_mps-activation", lambda: convert.from_mps(mps_layers, **{
            **mps_desc, "update_gate_activation": "Sigmoid"}), ValueError,
         "update_gate_activation"),
        ("from_mps-activation_list", lambda: convert.from_mps(mps_layers, **{
            **mps_desc, "update_gate_activation": ["sigmoid"]}), TypeError,
         "update_gate_activation"),
        ("from_mps-bidirectional_str", lambda: convert.from_mps(mps_layers, **{
            **mps_desc, "bidirectional": "no"}), TypeError, "bidirectional"),
        ("from_mps-flip_z_str", lambda: convert.from_mps(mps_layers, **{
            **mps_desc, "flip_z": "False"}), TypeError, "flip_z"),
        ("from_mps-missing_recurrent_weight", lambda: convert.from_mps(
            [{"bias": mps_layers[0]["bias"]}], **mps_desc), ValueError, "layers[0]"),
        ("from_mps-unexpected_key", lambda: convert.from_mps(
            [{**mps_layers[0], "weights": 1}], **mps_desc), ValueError, "layers[0]"),
        ("from_mps-node_not_a_dict", lambda: convert.from_mps([5], **mps_desc), TypeError,
         "layers[0]"),
        ("to_arraymancer-params", lambda: convert.to_arraymancer(None), TypeError, "params"),
        ("to_arraymancer-cell", lambda: convert.to_arraymancer(p1, cell=1), TypeError, "cell"),
        ("to_onednn-cell_kind", lambda: convert.to_onednn(p, cell_kind="gru"), ValueError,
         "cell_kind"),
        ("from_onednn-direction", lambda: convert.from_onednn(
            o["weights_layer"], o["weights_iter"], o["bias"], direction="bidirectional_sum"),
         ValueError, "direction"),
        ("from_onednn-direction_list", lambda: convert.from_onednn(
            o["weights_layer"], o["weights_iter"], o["bias"], direction=["x"]), ValueError,
         "direction"),
    ]


@pytest.mark.parametrize("case", [k for k, *_ in _conv_options()])
def test_converter_options(case):
    _, fn, exc, name = next(c for c in _conv_options() if c[0] == case)
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    assert re.search(r"(?<![\w])" + re.escape(name) + r"(?![\w])", msg), msg


@pytest.mark.parametrize("value,exc", [(0, ValueError), (3.0, ValueError), ("3", ValueError),
                                       (None, ValueError), (-1, ValueError), (True, ValueError)])
@pytest.mark.parametrize("arg", ["num_input_features", "hidden_size", "layers"])
def test_arraymancer_init_bad_sizes(arg, value, exc):
    kw = dict(num_input_features=I, hidden_size=H, layers=2)
    kw[arg] = value
    with pytest.raises(exc, match=f"^{arg}:"):
        am.GRULayer.init(**kw)


def test_arraymancer_init_bad_seed():
    with pytest.raises(TypeError, match="seed"):
        am.GRULayer.init(I, H, 2, seed="a")


@pytest.mark.parametrize("dtype", [np.float16, np.int32, "bogus", complex])
def test_arraymancer_init_bad_dtype(dtype):
    with pytest.raises(TypeError, match="^dtype:"):
        am.GRULayer.init(I, H, 2, dtype=dtype)


@pytest.mark.parametrize("bad", [5, None], ids=["int", "None"])
def test_tf_canonical_lists_that_are_not_lists(bad):
    w, b = tf.params_to_canonical(1, H, I, np.zeros(tf.params_size(1, H, I, rnn_mode="gru")),
                                  rnn_mode="gru")
    with pytest.raises(TypeError, match="^weights"):
        tf.canonical_to_params(1, H, I, bad, b, rnn_mode="gru")
