"""The speed benchmark: cgru against PyTorch, onnxruntime, a NumPy GRU and the GEMM-only bound.

Run as ``python -m cgru bench [--quick | --full] [--threads 1,2] [--json PATH] [--plot PATH]``
or ``python bench/run.py ...``.  The method is ``PERF.md``'s:

* every system gets the same weights and inputs, and its output is **validated against cgru**
  before it is timed; a failed validation is printed loudly, the system is not timed for
  that configuration, and the exit code is 1;
* every system runs with the same thread count: ``num_threads`` for cgru,
  ``torch.set_num_threads``, onnxruntime ``intra_op_num_threads`` (``inter_op`` 1), and
  threadpoolctl for every BLAS and OpenMP library for the whole section;
* warm-up, then interleaved short blocks — a pause until the previous system's thread pools
  stop spinning, one untimed call, a few timed calls — rotating the order of the systems
  each round; medians and min–max of the timed calls.

Systems (``fb`` = forward + backward to input, ``h0`` and all weights):

``cgru_fwd``   ``cgru.forward(training=False)``
``cgru_fb``    training ``cgru.forward`` + ``cgru.backward`` with ``dy`` and ``dhy``
``torch_fwd``  ``torch.nn.GRU`` under ``no_grad``
``torch_fb``   ``torch.nn.GRU`` forward + ``autograd.grad`` to ``x``, ``h0`` and all weights
``ort_fwd``    onnxruntime: ONNX ``GRU`` nodes (``linear_before_reset=1``), float32 only
``numpy_fb``   a straightforward GRU written in NumPy (float32 only)
``bound_fwd``  the GEMM-only bound of the forward, ``bound_fb`` of forward + backward

The GEMM-only bound does exactly the GEMMs of PERF.md ("The work") through
``cgru._blas.gemm_rm`` (SciPy's BLAS, like cgru; ``m = 1`` goes to ``?gemv``) on preallocated
arrays, and nothing else.  Each ``gemm_rm`` call also costs a Python call (~2 µs), which the
engine does not pay: it is measured in the same section (1×1 calls) and subtracted,
``bound = raw − calls × overhead``; both figures are in the JSON.

The OpenBLAS variables ``OPENBLAS_CORETYPE``/``OPENBLAS_L2_SIZE`` slow SciPy's OpenBLAS but not
PyTorch or onnxruntime.  They must be unset before the process starts, so the bench only
reports them and prints the command to use:
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m cgru bench``.
"""
import argparse
import datetime
import json
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

import cgru
from cgru import _blas
from cgru.params import Params, Topology

OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
RECOMMENDED = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m cgru bench"
ENV_VARS = OPENBLAS_VARS + ("OPENBLAS_NUM_THREADS", "OPENBLAS_VERBOSE", "OMP_NUM_THREADS",
                            "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS")
TOL = {"float32": 2e-4, "float64": 1e-9}   # max|a − b| / max|b| against cgru


# --- configurations ------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """One benchmark problem: T steps, batch N, input I, hidden H, L layers."""
    name: str
    T: int
    N: int
    I: int
    H: int
    L: int = 1
    bidirectional: bool = False

    @property
    def topology(self):
        return Topology(self.I, self.H, self.L,
                        "bidirectional" if self.bidirectional else "forward")

    @property
    def D(self):
        return 2 if self.bidirectional else 1

    def describe(self):
        bi = " bi" if self.bidirectional else ""
        return f"T={self.T} N={self.N} I={self.I} H={self.H} L={self.L}{bi}"

    def flops_fwd(self):
        """GEMM flops of the forward: 2·T·N·3H·(in + H) per layer-direction (PERF.md)."""
        total = 0
        for layer in range(self.L):
            width = self.I if layer == 0 else self.D * self.H
            total += self.D * 2 * self.T * self.N * 3 * self.H * (width + self.H)
        return total


CONFIGS = {c.name: c for c in [
    Config("A", 100, 1, 256, 256),
    Config("B", 100, 32, 256, 256),
    Config("C", 50, 64, 512, 512),
    Config("D", 200, 16, 128, 128),
    Config("E", 35, 20, 1024, 1024),
    Config("F", 100, 32, 256, 256, 2, True),
    Config("T32-H256", 32, 1, 256, 256),
    Config("T32-H512", 32, 1, 512, 512),
    Config("T128-H256", 128, 1, 256, 256),
    Config("T128-H512", 128, 1, 512, 512),
    Config("DS", 50, 32, 1760, 1760),
]}
# Configs with an onnxruntime target (PERF.md: "forward inference within 1.2× … on B–F").
ORT_TARGET = ("B", "C", "D", "E", "F")


@dataclass(frozen=True)
class Mode:
    """How much to run: configs, dtypes, rounds of blocks, time per block and per system."""
    name: str
    configs: tuple
    dtypes: tuple
    rounds: int
    block_s: float      # aim for this much timed work per block
    budget_s: float     # at most this much time per system per section (≥ 3 rounds)
    pause_s: float


_MAIN = ("A", "B", "C", "D", "E", "F", "T32-H256", "T32-H512", "T128-H256", "T128-H512")
MODES = {
    "quick": Mode("quick", ("A", "B", "D", "F", "T32-H256"), ("float32",), 3, 0.04, 0.6,
                  0.03),
    "default": Mode("default", _MAIN, ("float32", "float64"), 5, 0.06, 1.2, 0.03),
    "full": Mode("full", _MAIN + ("DS",), ("float32", "float64"), 7, 0.1, 3.0, 0.05),
}


def parse_config(spec):
    """A config by name (``A``…``F``, ``T32-H256``…, ``DS``) or ``TxNxIxHxL`` with an optional
    ``b`` suffix for bidirectional, e.g. ``5x3x4x6x2b``."""
    if spec in CONFIGS:
        return CONFIGS[spec]
    body, bi = (spec[:-1], True) if spec.endswith("b") else (spec, False)
    parts = body.split("x")
    if len(parts) == 5 and all(p.isdigit() and int(p) > 0 for p in parts):
        T, N, I, H, L = map(int, parts)
        return Config(spec, T, N, I, H, L, bi)
    raise ValueError(f"config: expected one of {', '.join(CONFIGS)} or TxNxIxHxL[b] "
                     f"(e.g. 5x3x4x6x2b), got {spec!r}")


# --- problem data --------------------------------------------------------------------------
class Problem:
    """Weights, inputs and output gradients shared by every system of one section."""

    def __init__(self, config, dtype, seed=0):
        self.config = config
        self.dtype = np.dtype(dtype)
        c = config
        rng = np.random.default_rng(seed)
        self.params = Params.random(c.topology, self.dtype, seed=seed)
        LD = c.L * c.D

        def u(*shape, s=1.0):
            return rng.uniform(-s, s, shape).astype(self.dtype)

        self.x = u(c.T, c.N, c.I)
        self.h0 = u(LD, c.N, c.H, s=0.5)
        self.dy = u(c.T, c.N, c.D * c.H)
        self.dhy = u(LD, c.N, c.H)


# --- validation ----------------------------------------------------------------------------
def rel_err(a, b):
    """``max|a − b| / max|b|`` in float64 (``inf`` when the shapes differ or ``a`` has NaN)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        return math.inf
    if a.size == 0:
        return 0.0
    diff = np.max(np.abs(a - b))
    if not np.isfinite(diff):
        return math.inf
    return float(diff / max(np.max(np.abs(b)), 1e-30))


def compare(outputs, reference, tol):
    """``(ok, worst name, worst error)`` of ``outputs`` against ``reference`` (same keys)."""
    worst, worst_name = 0.0, None
    for name, ref in reference.items():
        if name not in outputs:
            continue
        e = rel_err(outputs[name], ref)
        if worst_name is None or e > worst:
            worst, worst_name = e, name
    return worst <= tol, worst_name, worst


def cgru_reference(problem, num_threads):
    """cgru's forward (inference) and forward + backward outputs, as ``{name: array}``."""
    fwd = _cgru_fwd_outputs(_CgruFwd(problem, num_threads).call())
    fb = _cgru_fb_outputs(_CgruFb(problem, num_threads).call(), problem.config)
    return fwd, fb


def _grad_names(config):
    """Names of the weight gradients in cgru's order: dW[i], dR[i], db_W[i], db_R[i] per i."""
    return [f"d{name}[{i}]" for i in range(config.L * config.D)
            for name in ("W", "R", "b_W", "b_R")]


# --- the systems ---------------------------------------------------------------------------
class System:
    """A timed callable.  ``call()`` does the work; ``outputs()`` runs it once and returns
    ``{name: ndarray}`` to validate (``None``: validated by its own ``check()``)."""
    key = ""
    kind = ""           # "fwd" or "fb"
    label = ""

    def call(self):
        raise NotImplementedError

    def outputs(self):
        raise NotImplementedError


def _cgru_fwd_outputs(res):
    return {"y": res.y, "hy": res.hy}


def _cgru_fb_outputs(res, config):
    (f, g) = res
    out = {"y": f.y, "hy": f.hy, "dx": g.dx, "dh0": g.dh0}
    for i, lp in enumerate(g.dparams):
        for name, a in lp.arrays().items():
            out[f"d{name}[{i}]"] = a
    return out


class _CgruFwd(System):
    key, kind, label = "cgru_fwd", "fwd", "cgru forward"

    def __init__(self, p, n):
        self.p, self.n = p, n

    def call(self):
        p = self.p
        return cgru.forward(p.params, p.x, p.h0, training=False, num_threads=self.n)

    def outputs(self):
        return _cgru_fwd_outputs(self.call())


class _CgruFb(System):
    key, kind, label = "cgru_fb", "fb", "cgru forward+backward"

    def __init__(self, p, n):
        self.p, self.n = p, n

    def call(self):
        p = self.p
        f = cgru.forward(p.params, p.x, p.h0, training=True, num_threads=self.n)
        g = cgru.backward(p.params, p.x, f.reserve, p.dy, p.dhy, num_threads=self.n)
        return f, g

    def outputs(self):
        return _cgru_fb_outputs(self.call(), self.p.config)


# PyTorch -----------------------------------------------------------------------------------
def _torch_gru(torch, problem):
    c = problem.config
    dt = torch.float64 if problem.dtype == np.float64 else torch.float32
    gru = torch.nn.GRU(c.I, c.H, num_layers=c.L, bidirectional=c.bidirectional, dtype=dt)
    weights = []
    with torch.no_grad():
        for i, lp in enumerate(problem.params):
            sfx = f"_l{i // c.D}" + ("_reverse" if i % c.D else "")
            for ours, theirs in (("W", "weight_ih"), ("R", "weight_hh"), ("b_W", "bias_ih"),
                                 ("b_R", "bias_hh")):
                w = getattr(gru, theirs + sfx)
                w.copy_(torch.from_numpy(getattr(lp, ours)))
                weights.append(w)
    return gru, weights


class _TorchFwd(System):
    key, kind, label = "torch_fwd", "fwd", "PyTorch nn.GRU forward (no_grad)"

    def __init__(self, torch, p):
        self.torch = torch
        self.gru, _ = _torch_gru(torch, p)
        self.x = torch.from_numpy(p.x)
        self.h0 = torch.from_numpy(p.h0)

    def call(self):
        with self.torch.no_grad():
            return self.gru(self.x, self.h0)

    def outputs(self):
        y, hy = self.call()
        return {"y": y.numpy(), "hy": hy.numpy()}


class _TorchFb(System):
    key, kind, label = "torch_fb", "fb", "PyTorch nn.GRU forward+backward"

    def __init__(self, torch, p):
        self.torch = torch
        self.config = p.config
        self.gru, self.weights = _torch_gru(torch, p)
        self.x = torch.from_numpy(p.x.copy()).requires_grad_(True)
        self.h0 = torch.from_numpy(p.h0.copy()).requires_grad_(True)
        self.dy = torch.from_numpy(p.dy)
        self.dhy = torch.from_numpy(p.dhy)

    def call(self):
        y, hy = self.gru(self.x, self.h0)
        grads = self.torch.autograd.grad((y, hy), [self.x, self.h0] + self.weights,
                                         (self.dy, self.dhy))
        return y, hy, grads

    def outputs(self):
        y, hy, grads = self.call()
        out = {"y": y.detach().numpy(), "hy": hy.detach().numpy(),
               "dx": grads[0].numpy(), "dh0": grads[1].numpy()}
        for name, g in zip(_grad_names(self.config), grads[2:]):
            out[name] = g.numpy()
        return out


# onnxruntime -------------------------------------------------------------------------------
def _onnx_model(problem):
    """An ONNX graph of the stack: one ``GRU`` node per layer (gates reordered from cgru's
    r, z, n to ONNX's z, r, h; ``linear_before_reset=1``), Transpose + Reshape between layers.
    Inputs ``X`` ``[T, N, I]`` and ``h0_l`` ``[D, N, H]``; outputs ``Y`` ``[T, D, N, H]`` of the
    last layer and ``Y_h`` ``[L·D, N, H]``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = problem.config
    H, D = c.H, c.D
    elem = TensorProto.DOUBLE if problem.dtype == np.float64 else TensorProto.FLOAT
    zrn = np.r_[H:2 * H, 0:H, 2 * H:3 * H]            # canonical rows r, z, n -> z, r, n
    direction = "bidirectional" if c.bidirectional else "forward"
    nodes, inits = [], []
    inputs = [helper.make_tensor_value_info("X", elem, ["T", "N", c.I])]
    cur, hys = "X", []
    for layer in range(c.L):
        lps = [problem.params[layer, d] for d in range(D)]
        W = np.stack([lp.W[zrn] for lp in lps])                            # [D, 3H, in]
        R = np.stack([lp.R[zrn] for lp in lps])                            # [D, 3H, H]
        B = np.stack([np.concatenate([lp.b_W[zrn], lp.b_R[zrn]]) for lp in lps])  # [D, 6H]
        for name, arr in ((f"W{layer}", W), (f"R{layer}", R), (f"B{layer}", B)):
            inits.append(numpy_helper.from_array(arr, name))
        inputs.append(helper.make_tensor_value_info(f"h0_{layer}", elem, [D, "N", H]))
        y_name = "Y" if layer == c.L - 1 else f"Y{layer}"
        h_name = "Y_h" if c.L == 1 else f"Y_h{layer}"
        nodes.append(helper.make_node(
            "GRU", [cur, f"W{layer}", f"R{layer}", f"B{layer}", "", f"h0_{layer}"],
            [y_name, h_name], hidden_size=H, direction=direction, linear_before_reset=1))
        hys.append(h_name)
        if layer < c.L - 1:
            # [T, D, N, H] -> [T, N, D, H] -> [T, N, D·H]
            nodes.append(helper.make_node("Transpose", [y_name], [f"Yt{layer}"],
                                          perm=[0, 2, 1, 3]))
            nodes.append(helper.make_node("Reshape", [f"Yt{layer}", "flat_shape"],
                                          [f"X{layer + 1}"]))
            cur = f"X{layer + 1}"
    if c.L > 1:
        inits.append(numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flat_shape"))
        nodes.append(helper.make_node("Concat", hys, ["Y_h"], axis=0))
    outputs = [helper.make_tensor_value_info("Y", elem, ["T", D, "N", H]),
               helper.make_tensor_value_info("Y_h", elem, [c.L * D, "N", H])]
    graph = helper.make_graph(nodes, "cgru_bench_gru", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class _OrtFwd(System):
    key, kind, label = "ort_fwd", "fwd", "onnxruntime GRU forward"

    def __init__(self, ort, p, n):
        c = p.config
        so = ort.SessionOptions()
        so.intra_op_num_threads = n
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.sess = ort.InferenceSession(_onnx_model(p).SerializeToString(), so,
                                         providers=["CPUExecutionProvider"])
        self.feed = {"X": p.x}
        for layer in range(c.L):
            self.feed[f"h0_{layer}"] = np.ascontiguousarray(p.h0[layer * c.D:(layer + 1) * c.D])
        self.config = c

    def call(self):
        return self.sess.run(None, self.feed)

    def outputs(self):
        Y, Yh = self.call()
        c = self.config
        return {"y": Y.transpose(0, 2, 1, 3).reshape(c.T, c.N, c.D * c.H), "hy": Yh}


# NumPy by hand -----------------------------------------------------------------------------
def _sigmoid(a):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-a))


class _NumpyFb(System):
    """A straightforward NumPy GRU (the cuDNN/PyTorch cell): per layer-direction one input
    GEMM, then per step one GEMM and the gate math; backward per step, then whole-sequence
    GEMMs for the weight and input gradients."""
    key, kind, label = "numpy_fb", "fb", "NumPy-by-hand forward+backward"

    def __init__(self, p):
        self.p = p

    def _fwd_dir(self, X, lp, h0, reverse):
        T, N, H = self.p.config.T, self.p.config.N, self.p.config.H
        # gx[T·N, 3H] = X[T·N, in] · Wᵀ  (+ b_W, + b_R of r and z)
        gx = X @ lp.W.T
        gx += lp.b_W
        gx[:, :2 * H] += lp.b_R[:2 * H]
        gx = gx.reshape(T, N, 3 * H)
        gates = np.empty((T, N, 3 * H), X.dtype)       # r, z, n
        hn = np.empty((T, N, H), X.dtype)              # h·R_nᵀ + b_Rn
        hs = np.empty((T + 1, N, H), X.dtype)          # hs[k]: state before processing step k
        y = np.empty((T, N, H), X.dtype)
        hs[0] = h0
        order = range(T - 1, -1, -1) if reverse else range(T)
        for k, t in enumerate(order):
            h = hs[k]
            # gh[N, 3H] = h · Rᵀ
            gh = h @ lp.R.T
            rz = _sigmoid(gx[t, :, :2 * H] + gh[:, :2 * H])
            hn[t] = gh[:, 2 * H:] + lp.b_R[2 * H:]
            n = np.tanh(gx[t, :, 2 * H:] + rz[:, :H] * hn[t])
            z = rz[:, H:]
            hs[k + 1] = n + z * (h - n)
            y[t] = hs[k + 1]
            gates[t, :, :2 * H] = rz
            gates[t, :, 2 * H:] = n
        return y, (gates, hn, hs, list(order))

    def _bwd_dir(self, X, lp, cache, dy, dhy):
        T, N, H = self.p.config.T, self.p.config.N, self.p.config.H
        gates, hn, hs, order = cache
        dgx = np.empty((T, N, 3 * H), X.dtype)
        dgh = np.empty((T, N, 3 * H), X.dtype)
        h_prev = np.empty((T, N, H), X.dtype)          # the state entering time t
        dh = dhy.copy()
        for k in range(T - 1, -1, -1):
            t = order[k]
            dh = dh + dy[t]
            r, z, n = gates[t, :, :H], gates[t, :, H:2 * H], gates[t, :, 2 * H:]
            h = hs[k]
            h_prev[t] = h
            dan = dh * (1 - z) * (1 - n * n)
            daz = dh * (h - n) * z * (1 - z)
            dar = dan * hn[t] * r * (1 - r)
            dgx[t, :, :H], dgx[t, :, H:2 * H], dgx[t, :, 2 * H:] = dar, daz, dan
            dgh[t, :, :2 * H] = dgx[t, :, :2 * H]
            dgh[t, :, 2 * H:] = dan * r
            # dh_prev[N, H] = dh ⊙ z + dgh_t[N, 3H] · R[3H, H]
            dh = dh * z + dgh[t] @ lp.R
        dgx = dgx.reshape(T * N, 3 * H)
        dgh = dgh.reshape(T * N, 3 * H)
        # dW[3H, in] = dgxᵀ · X;  dR[3H, H] = dghᵀ · h_prev;  dX[T·N, in] = dgx · W
        grads = {"W": dgx.T @ X, "R": dgh.T @ h_prev.reshape(T * N, H),
                 "b_W": dgx.sum(axis=0), "b_R": dgh.sum(axis=0)}
        return dgx @ lp.W, dh, grads

    def call(self):
        p, c = self.p, self.p.config
        T, N, H, D = c.T, c.N, c.H, c.D
        X = p.x.reshape(T * N, c.I)
        inputs, caches, hy = [], [], np.empty_like(p.h0)
        for layer in range(c.L):
            out = np.empty((T, N, D * H), p.dtype)
            for d in range(D):
                i = layer * D + d
                y, cache = self._fwd_dir(X, p.params[i], p.h0[i], reverse=d == 1)
                out[:, :, d * H:(d + 1) * H] = y
                hy[i] = cache[2][T]
                caches.append(cache)
            inputs.append(X)
            X = out.reshape(T * N, D * H)
        y_out = out
        d_out = p.dy
        dh0 = np.empty_like(p.h0)
        grads = [None] * (c.L * D)
        for layer in reversed(range(c.L)):
            X = inputs[layer]
            dX = 0
            for d in range(D):
                i = layer * D + d
                dXd, dh0[i], grads[i] = self._bwd_dir(X, p.params[i], caches[i],
                                                      d_out[:, :, d * H:(d + 1) * H], p.dhy[i])
                dX = dX + dXd
            d_out = dX.reshape(T, N, X.shape[1])
        return y_out, hy, d_out, dh0, grads

    def outputs(self):
        y, hy, dx, dh0, grads = self.call()
        out = {"y": y, "hy": hy, "dx": dx, "dh0": dh0}
        for i, g in enumerate(grads):
            for name, a in g.items():
                out[f"d{name}[{i}]"] = a
        return out


# GEMM-only bound ---------------------------------------------------------------------------
class _Bound:
    """Exactly the GEMMs of PERF.md ("The work") on preallocated arrays, nothing else.

    Per layer-direction, forward: ``gx = X·Wᵀ`` ``[T·N, in]·[in, 3H]`` and T recurrent
    ``h_t·Rᵀ`` ``[N, H]·[H, 3H]``; backward: T recurrent data GEMMs ``dg_t·R``
    ``[N, 3H]·[3H, H]``, then ``dR = dgᵀ·H_prev``, ``dW = dgᵀ·X`` and ``dX (+)= dg·W``.
    Layer inputs are ``[T·N, D·H]`` above layer 0.  Values are random (no GRU math)."""

    def __init__(self, problem):
        c = problem.config
        dt = problem.dtype
        rng = np.random.default_rng(1)
        self.gemm = _blas.gemm_rm["double" if dt == np.float64 else "float"]
        T, N, H, D = c.T, c.N, c.H, c.D
        self.c = c
        self.layers = []
        for layer in range(c.L):
            width = c.I if layer == 0 else D * H
            X = rng.uniform(-1, 1, (T * N, width)).astype(dt)
            dirs = []
            for d in range(D):
                lp = problem.params[layer, d]
                states = rng.uniform(-1, 1, ((T + 1) * N, H)).astype(dt)
                dg = rng.uniform(-1, 1, (T * N, 3 * H)).astype(dt)
                dirs.append(dict(
                    W=lp.W, R=lp.R, gx=np.empty((T * N, 3 * H), dt),
                    h=[states[t * N:(t + 1) * N] for t in range(T)],
                    h_prev=states[:T * N], gh=np.empty((N, 3 * H), dt),
                    dg=dg, dg_t=[dg[t * N:(t + 1) * N] for t in range(T)],
                    dh=np.empty((N, H), dt), dW=np.empty((3 * H, width), dt),
                    dR=np.empty((3 * H, H), dt)))
            self.layers.append(dict(X=X, dX=np.empty((T * N, width), dt), dirs=dirs))

    def calls(self, kind):
        """Number of ``gemm_rm`` calls of one ``fwd`` or ``fb``."""
        c = self.c
        fwd = c.L * c.D * (1 + c.T)
        return fwd if kind == "fwd" else fwd + c.L * c.D * (c.T + 3)

    def fwd(self):
        gemm = self.gemm
        for lay in self.layers:
            for a in lay["dirs"]:
                # gx[T·N, 3H] = X[T·N, in] · W[3H, in]ᵀ
                gemm(False, True, 1.0, lay["X"], a["W"], 0.0, a["gx"])
                R, gh = a["R"], a["gh"]
                for h in a["h"]:
                    # gh[N, 3H] = h_t[N, H] · R[3H, H]ᵀ
                    gemm(False, True, 1.0, h, R, 0.0, gh)

    def fb(self):
        self.fwd()
        gemm = self.gemm
        for lay in reversed(self.layers):
            for d, a in enumerate(lay["dirs"]):
                R, dh = a["R"], a["dh"]
                for dg_t in reversed(a["dg_t"]):
                    # dh[N, H] = dg_t[N, 3H] · R[3H, H]
                    gemm(False, False, 1.0, dg_t, R, 0.0, dh)
                # dR[3H, H] = dgᵀ · H_prev[T·N, H]
                gemm(True, False, 1.0, a["dg"], a["h_prev"], 0.0, a["dR"])
                # dW[3H, in] = dgᵀ · X[T·N, in]
                gemm(True, False, 1.0, a["dg"], lay["X"], 0.0, a["dW"])
                # dX[T·N, in] (+)= dg[T·N, 3H] · W[3H, in]
                gemm(False, False, 1.0, a["dg"], a["W"], 0.0 if d == 0 else 1.0, lay["dX"])

    def check(self):
        """Worst relative error of the bound's GEMM results against NumPy (float64)."""
        self.fb()
        a0 = self.layers[0]["dirs"][0]
        X = self.layers[0]["X"].astype(np.float64)
        dg = a0["dg"].astype(np.float64)
        R = a0["R"].astype(np.float64)
        last = a0["h"][-1].astype(np.float64)
        return max(rel_err(a0["gx"], X @ a0["W"].astype(np.float64).T),
                   rel_err(a0["gh"], last @ R.T),
                   rel_err(a0["dh"], a0["dg_t"][0].astype(np.float64) @ R),
                   rel_err(a0["dW"], dg.T @ X),
                   rel_err(a0["dR"], dg.T @ a0["h_prev"].astype(np.float64)))


class _BoundSystem(System):
    def __init__(self, bound, kind):
        self.bound, self.kind = bound, kind
        self.key = f"bound_{kind}"
        self.label = f"GEMM-only bound ({kind})"
        self.call = bound.fwd if kind == "fwd" else bound.fb

    def outputs(self):
        return None


def call_overhead_s(dtype, repeats=2000, batches=5):
    """Seconds per ``gemm_rm`` call of Python overhead (1×1 problems; min over batches)."""
    gemm = _blas.gemm_rm["double" if np.dtype(dtype) == np.float64 else "float"]
    a = np.ones((1, 1), dtype)
    c = np.empty((1, 1), dtype)
    best = math.inf
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(repeats):
            gemm(False, False, 1.0, a, a, 0.0, c)
        best = min(best, (time.perf_counter() - t0) / repeats)
    return best


# --- peers ---------------------------------------------------------------------------------
def load_peers():
    """``({name: module}, [notes])`` for the optional peers that import."""
    peers, notes = {}, []
    try:
        import torch
        peers["torch"] = torch
    except Exception as exc:   # ImportError or a broken install
        notes.append(f"PyTorch not available ({exc.__class__.__name__}: {exc}); skipped")
    try:
        import onnx  # noqa: F401  (the model builder needs it)
        import onnxruntime
        peers["onnxruntime"] = onnxruntime
    except Exception as exc:
        notes.append(f"onnxruntime/onnx not available ({exc.__class__.__name__}: {exc}); "
                     "skipped")
    return peers, notes


def build_systems(problem, n, peers):
    """The systems of one section (config, dtype, n threads), cgru first."""
    f32 = problem.dtype == np.float32
    systems = [_CgruFwd(problem, n), _CgruFb(problem, n)]
    if "torch" in peers:
        systems += [_TorchFwd(peers["torch"], problem), _TorchFb(peers["torch"], problem)]
    if "onnxruntime" in peers and f32:
        systems.append(_OrtFwd(peers["onnxruntime"], problem, n))
    if f32:
        systems.append(_NumpyFb(problem))
    bound = _Bound(problem)
    systems += [_BoundSystem(bound, "fwd"), _BoundSystem(bound, "fb")]
    return systems, bound


def validate(problem, systems, n):
    """Validate every system against cgru.  Returns ``{key: record}``; a record has ``ok``,
    ``worst`` (output name), ``err`` and ``tol``.  cgru's forward + backward is checked
    against cgru's inference forward (y, hy)."""
    tol = TOL[problem.dtype.name]
    try:
        ref_fwd, ref_fb = cgru_reference(problem, n)
    except Exception as exc:  # cgru itself fails: nothing can be validated
        why = f"cgru raised {exc.__class__.__name__}: {exc}"
        return {s.key: dict(ok=False, against="cgru", worst=why, err=math.inf, tol=tol)
                for s in systems}
    records = {}
    for s in systems:
        if s.key == "cgru_fwd":
            records[s.key] = dict(ok=True, against="itself (the reference)", worst=None,
                                  err=0.0, tol=tol)
            continue
        try:
            if isinstance(s, _BoundSystem):
                err = s.bound.check()
                ok, worst, against = err <= tol, "gemm results", "NumPy matmul"
            else:
                out = ref_fb if s.key == "cgru_fb" else s.outputs()
                ref = ref_fwd if s.kind == "fwd" or s.key == "cgru_fb" else ref_fb
                missing = sorted(set(ref) - set(out)) if s.key != "cgru_fb" else []
                ok, worst, err = compare(out, ref, tol)
                if missing:
                    ok, worst, err = False, f"missing {missing[0]}", math.inf
                against = "cgru forward" if ref is ref_fwd else "cgru forward+backward"
        except Exception as exc:  # a peer that crashes is a failed validation, not a crash
            ok, worst, err, against = False, f"{exc.__class__.__name__}: {exc}", math.inf, "cgru"
        records[s.key] = dict(ok=bool(ok), against=against, worst=worst, err=float(err), tol=tol)
    return records


# --- timing --------------------------------------------------------------------------------
def _time_call(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def settle(min_s, max_s=0.5, slice_s=0.01):
    """The pause before a block: sleep ``min_s``, then until this process's idle thread pools
    stop spinning (under 20 % of a core used during a 10 ms slice), at most ``max_s``.

    Measured here: after a 2-thread call OpenBLAS's worker keeps a core busy for ~0.1 s,
    onnxruntime's for ~0.05 s; a fixed short pause would let them slow the next system."""
    time.sleep(min_s)
    t_end = time.perf_counter() + max_s - min_s
    while time.perf_counter() < t_end:
        c0, t0 = time.process_time(), time.perf_counter()
        time.sleep(slice_s)
        if time.process_time() - c0 < 0.2 * (time.perf_counter() - t0):
            return


def measure(systems, mode, rounds=None, progress=None):
    """Warm up, then interleaved blocks; ``{key: [seconds, ...]}`` of the timed calls.

    Each block: a pause (``settle``), one untimed call (skipped for calls over 0.25 s),
    ``k`` timed calls with ``k`` chosen so a block takes about ``mode.block_s``.  The order of
    the systems rotates every round.  A system gets at least 3 and at most ``rounds``
    blocks, fewer when its blocks would exceed ``mode.budget_s`` (one when a single call
    takes over 5 × ``mode.budget_s``, e.g. a thread pool starved by another process).
    """
    rounds = mode.rounds if rounds is None else rounds
    plan = {}
    for s in systems:
        # the validation was the cold call; warm up for 0.1 s (1 to 10 calls)
        settle(mode.pause_s)
        times = []
        t_start = time.perf_counter()
        while not times or (time.perf_counter() - t_start < 0.1 and len(times) < 10):
            times.append(_time_call(s.call))
        est = float(np.median(times[len(times) // 2:]))
        k = int(min(25, max(1, round(mode.block_s / max(est, 1e-9)))))
        untimed = est < 0.25
        per_block = (k + untimed) * est + mode.pause_s
        least = 3 if est <= 5 * mode.budget_s else 1  # one block for a pathologically slow call
        r = int(min(rounds, max(least, mode.budget_s // max(per_block, 1e-9))))
        plan[s.key] = (k, untimed, r)
    samples = {s.key: [] for s in systems}
    max_rounds = max((r for _, _, r in plan.values()), default=0)
    for rnd in range(max_rounds):
        shift = rnd % len(systems)
        for s in systems[shift:] + systems[:shift]:
            k, untimed, r = plan[s.key]
            if rnd >= r:
                continue
            if progress:
                progress(f"{s.key} round {rnd + 1}/{r}")
            settle(mode.pause_s)
            if untimed:
                s.call()
            for _ in range(k):
                samples[s.key].append(_time_call(s.call))
    return samples


def stats(samples_s):
    ms = np.asarray(samples_s) * 1e3
    return dict(median_ms=float(np.median(ms)), min_ms=float(ms.min()), max_ms=float(ms.max()),
                n=int(ms.size), samples_ms=[round(float(v), 4) for v in ms])


# --- a section: one config, dtype and thread count -----------------------------------------
RATIOS = {  # name: (numerator, denominator)
    "cgru_fb/bound": ("cgru_fb", "bound_fb"),
    "cgru_fwd/bound_fwd": ("cgru_fwd", "bound_fwd"),
    "torch_fb/cgru_fb": ("torch_fb", "cgru_fb"),
    "torch_fwd/cgru_fwd": ("torch_fwd", "cgru_fwd"),
    "ort_fwd/cgru_fwd": ("ort_fwd", "cgru_fwd"),
    "numpy_fb/cgru_fb": ("numpy_fb", "cgru_fb"),
}


def run_section(config, dtype, n, peers, mode, rounds=None, progress=None, seed=0):
    """Build, validate and time every system for one (config, dtype, threads)."""
    from threadpoolctl import ThreadpoolController

    load = OtherLoad()
    problem = Problem(config, dtype, seed)
    if "torch" in peers:
        peers["torch"].set_num_threads(n)
    with ThreadpoolController().limit(limits=n):
        systems, bound = build_systems(problem, n, peers)
        if progress:
            progress("validating")
        checks = validate(problem, systems, n)
        good = [s for s in systems if checks[s.key]["ok"]]
        overhead = call_overhead_s(problem.dtype)
        samples = measure(good, mode, rounds, progress)
    result = dict(config=config.name, shape=asdict(config), dtype=problem.dtype.name,
                  threads=n, gflop_fwd=config.flops_fwd() / 1e9,
                  reserve_bytes=cgru.reserve_nbytes(config.topology, config.T, config.N,
                                                    dtype=problem.dtype),
                  validation=checks, systems={}, other_load_cores=load.cores())
    for key, s in samples.items():
        result["systems"][key] = stats(s)
    overhead_ms = overhead * 1e3
    result["bound_call_overhead_us"] = overhead * 1e6
    for kind in ("fwd", "fb"):
        rec = result["systems"].get(f"bound_{kind}")
        if rec is not None:
            calls = bound.calls(kind)
            rec["gemm_calls"] = calls
            for key in ("median_ms", "min_ms", "max_ms"):
                raw = rec[key]
                rec["raw_" + key] = raw
                rec[key] = max(raw - calls * overhead_ms, 0.5 * raw)
    sys_ = result["systems"]
    result["ratios"] = {name: sys_[a]["median_ms"] / sys_[b]["median_ms"]
                        for name, (a, b) in RATIOS.items() if a in sys_ and b in sys_}
    return result


# --- targets (PERF.md) ---------------------------------------------------------------------
def targets(results):
    """Each PERF.md target per result: ``[{config, dtype, threads, target, value, limit, ok}]``."""
    out = []
    by_key = {(r["config"], r["dtype"], r["threads"]): r for r in results}
    for r in results:
        N = r["shape"]["N"]
        ratios = r["ratios"]

        def add(name, value, limit, ok):
            out.append(dict(config=r["config"], dtype=r["dtype"], threads=r["threads"],
                            target=name, value=value, limit=limit, ok=bool(ok)))

        fb = ratios.get("cgru_fb/bound")
        if fb is not None and (N >= 16 or N == 1):
            lim = 1.10 if N >= 16 else 1.3
            add("cgru fb / bound ≤", fb, lim, fb <= lim)
        tr = ratios.get("torch_fb/cgru_fb")
        if tr is not None:
            add("PyTorch fb / cgru fb ≥", tr, 2.0, tr >= 2.0)
        ort = ratios.get("ort_fwd/cgru_fwd")
        if ort is not None and r["config"] in ORT_TARGET:
            add("cgru fwd / onnxruntime fwd ≤", 1 / ort, 1.2, 1 / ort <= 1.2)
        one = by_key.get((r["config"], r["dtype"], 1))
        if r["threads"] == 2 and N >= 16 and one and "cgru_fb" in one["systems"] \
                and "cgru_fb" in r["systems"]:
            sp = one["systems"]["cgru_fb"]["median_ms"] / r["systems"]["cgru_fb"]["median_ms"]
            add("cgru fb speed-up 2T/1T ≥", sp, 1.7, sp >= 1.7)
    return out


# --- machine and environment ---------------------------------------------------------------
def _cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info():
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return dict(cpu=_cpu_model(), logical_cpus=os.cpu_count(), usable_cpus=usable,
                platform=platform.platform(), python=platform.python_version())


def library_versions(peers):
    import scipy
    import threadpoolctl
    v = dict(cgru=cgru.__version__, numpy=np.__version__, scipy=scipy.__version__,
             threadpoolctl=threadpoolctl.__version__, cgru_parallel=cgru.parallel_enabled())
    if "torch" in peers:
        v["torch"] = peers["torch"].__version__
    if "onnxruntime" in peers:
        import onnx
        v["onnxruntime"] = peers["onnxruntime"].__version__
        v["onnx"] = onnx.__version__
    try:
        import matplotlib
        v["matplotlib"] = matplotlib.__version__
    except ImportError:
        v["matplotlib"] = None
    return v


def environment():
    return {k: os.environ.get(k) for k in ENV_VARS}


class OtherLoad:
    """How many cores *other* processes kept busy while this one ran: the machine's busy
    time (``/proc/stat``) minus this process's CPU time, over the wall time.  ``None`` where
    ``/proc/stat`` does not exist.  Noise indicator: with 2 cores, 2-thread figures taken
    while another process holds a core are meaningless."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as fh:
                f = [int(v) for v in fh.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        busy = f[0] + f[1] + f[2] + sum(f[5:8])     # user nice system irq softirq steal
        t = os.times()
        return time.perf_counter(), busy / os.sysconf("SC_CLK_TCK"), t.user + t.system

    def cores(self):
        end = self._sample()
        if self.start is None or end is None or end[0] - self.start[0] <= 0:
            return None
        wall = end[0] - self.start[0]
        other = (end[1] - self.start[1]) - (end[2] - self.start[2])
        return max(0.0, other / wall)


def other_load_now(seconds=0.5):
    """Cores other processes keep busy, sampled over ``seconds`` while this one sleeps."""
    probe = OtherLoad()
    time.sleep(seconds)
    return probe.cores()


# --- output --------------------------------------------------------------------------------
def _fmt(v, spec="{:.2f}"):
    return "—" if v is None else spec.format(v)


def _ms(v):
    """Milliseconds with about 3 significant digits and no exponent."""
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


TABLE_HEAD = ("config", "dtype", "thr", "cgru fb ms (min–max)", "fb/bound",
              "PyTorch fb/cgru", "cgru fwd ms", "onnxrt fwd/cgru", "NumPy fb/cgru",
              "other load")


def table_rows(results):
    rows = []
    for r in results:
        s, q = r["systems"], r["ratios"]
        fb = s.get("cgru_fb")
        fwd = s.get("cgru_fwd")
        fb_txt = "—" if fb is None else \
            f"{_ms(fb['median_ms'])} ({_ms(fb['min_ms'])}–{_ms(fb['max_ms'])})"
        rows.append((r["config"], {"float32": "f32", "float64": "f64"}[r["dtype"]],
                     str(r["threads"]), fb_txt, _fmt(q.get("cgru_fb/bound")),
                     _fmt(q.get("torch_fb/cgru_fb")),
                     "—" if fwd is None else _ms(fwd["median_ms"]),
                     _fmt(q.get("ort_fwd/cgru_fwd")), _fmt(q.get("numpy_fb/cgru_fb")),
                     _fmt(r.get("other_load_cores"), "{:.1f}")))
    return rows


def format_table(results, markdown=False):
    rows = table_rows(results)
    if markdown:
        lines = ["| " + " | ".join(TABLE_HEAD) + " |", "|" + "---|" * len(TABLE_HEAD)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(TABLE_HEAD)]
    line = "  ".join(h.ljust(w) for h, w in zip(TABLE_HEAD, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in
                      enumerate(zip(r, widths))) for r in rows]
    return "\n".join(out)


def plot(results, path):
    """Bar chart of the ratios per config, one panel per thread count (float32 only)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    series = [("cgru_fb/bound", "cgru fb / GEMM-only bound (cgru's overhead)"),
              ("torch_fb/cgru_fb", "PyTorch fb / cgru fb"),
              ("ort_fwd/cgru_fwd", "onnxruntime fwd / cgru fwd"),
              ("numpy_fb/cgru_fb", "NumPy fb / cgru fb")]
    rs = [r for r in results if r["dtype"] == "float32"] or results
    threads = sorted({r["threads"] for r in rs})
    n_cfg = max(len([r for r in rs if r["threads"] == n]) for n in threads)
    fig, axes = plt.subplots(len(threads), 1, figsize=(max(7, 1.1 * n_cfg + 2),
                                                       0.8 + 3 * len(threads)), squeeze=False)
    for ax, n in zip(axes[:, 0], threads):
        sub = [r for r in rs if r["threads"] == n]
        x = np.arange(len(sub))
        w = 0.8 / len(series)
        for j, (key, label) in enumerate(series):
            vals = np.array([r["ratios"].get(key, np.nan) for r in sub])
            # bars grow from 1: up when the ratio is above 1, down when below
            ax.bar(x + (j - (len(series) - 1) / 2) * w, vals - 1, w, bottom=1, label=label)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(1.1, color="tab:blue", lw=0.8, ls=":",
                   label="target fb/bound ≤ 1.1 (N ≥ 16; 1.3 at N = 1)")
        ax.axhline(2.0, color="tab:orange", lw=0.8, ls=":", label="target PyTorch/cgru ≥ 2")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xticks(x)
        ax.set_xticklabels([r["config"] for r in sub])
        ax.set_ylabel("ratio of medians")
        ax.set_title(f"{rs[0]['dtype']}, {n} thread{'s' if n > 1 else ''}", fontsize=10)
        ax.grid(axis="y", which="major", alpha=0.3)
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)


class Progress:
    """One status line on stderr (rewritten in place on a terminal)."""

    def __init__(self, total, stream=None):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()
        self.head = ""

    def section(self, head):
        self.done += 1
        self.head = head
        self("start")

    def __call__(self, what):
        msg = (f"[{self.done}/{self.total}] {self.head}: {what} "
               f"({time.perf_counter() - self.t0:.0f} s)")
        if self.tty:
            self.stream.write("\r\033[K" + msg)
            self.stream.flush()
        elif what == "start":          # not a terminal: one line per section
            print(msg, file=self.stream, flush=True)

    def end(self):
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


# --- main ----------------------------------------------------------------------------------
def _parse_threads(text):
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        vals = []
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive ints like 1,2, got {text!r}")
    return sorted(set(vals))


def _parse_list(allowed):
    def parse(text):
        vals = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in vals if v not in allowed]
        if not vals or bad:
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(allowed)}, "
                                             f"got {text!r}")
        return vals
    return parse


def _parse_configs(text):
    try:
        return [parse_config(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def make_parser():
    p = argparse.ArgumentParser(
        prog="python -m cgru bench",
        description="Time cgru against PyTorch, onnxruntime, a NumPy GRU and the GEMM-only "
                    "bound (method: PERF.md).  Run it with the OpenBLAS variables unset: "
                    + RECOMMENDED)
    m = p.add_mutually_exclusive_group()
    m.add_argument("--quick", action="store_true",
                   help="float32, configs A, B, D, F, T32-H256, 3 rounds (< 2 min)")
    m.add_argument("--full", action="store_true",
                   help="adds the DeepSpeech-like config DS and more rounds")
    p.add_argument("--threads", type=_parse_threads, default=[1, 2],
                   help="thread counts, comma-separated (default 1,2)")
    p.add_argument("--configs", type=_parse_configs, default=None,
                   help="override the mode's configs: names (A…F, T32-H256, T32-H512, "
                        "T128-H256, T128-H512, DS) or TxNxIxHxL[b]")
    p.add_argument("--dtypes", type=_parse_list(("float32", "float64")), default=None,
                   help="override the mode's dtypes (float32,float64)")
    p.add_argument("--rounds", type=int, default=None, help="override the number of rounds")
    p.add_argument("--json", default=os.path.join("bench", "results", "bench.json"),
                   help="where to write every figure (default bench/results/bench.json)")
    p.add_argument("--plot", default=os.path.join("bench", "results", "bench.png"),
                   help="where to write the PNG plot (default bench/results/bench.png)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and inputs")
    p.add_argument("--markdown", action="store_true",
                   help="print the table as Markdown (for the README)")
    return p


def format_misses(tg, width=96):
    """The missed targets, one wrapped paragraph per target."""
    lines = []
    for name in dict.fromkeys(t["target"] for t in tg):
        rows = [t for t in tg if t["target"] == name]
        bad = [t for t in rows if not t["ok"]]
        if not bad:
            continue
        limits = sorted({t["limit"] for t in bad})
        head = f"  {name} {'/'.join(f'{v:g}' for v in limits)}: missed {len(bad)}/{len(rows)}:"
        items = [f"{t['config']} {t['dtype'][0]}{t['dtype'][-2:]} {t['threads']}T "
                 f"{t['value']:.2f}" for t in bad]
        line = head
        for it in items:
            if len(line) + len(it) + 2 > width:
                lines.append(line + ",")
                line = "    " + it
            else:
                line += (" " if line == head else ", ") + it
        lines.append(line)
    return "\n".join(lines)


def _env_note(env, argv=()):
    """The warning printed when the OpenBLAS variables are set (``None`` when they are not),
    with the command to rerun (``argv``: the bench's own arguments)."""
    set_vars = [k for k in OPENBLAS_VARS if env.get(k) is not None]
    if not set_vars:
        return None
    cmd = " ".join([RECOMMENDED, *map(shlex.quote, argv)])
    return ("NOTE: " + ", ".join(f"{k}={env[k]}" for k in set_vars) + " set: SciPy's OpenBLAS "
            "(cgru, the bound) runs slower kernels while PyTorch and onnxruntime do not.\n"
            "      For fair figures rerun with:  " + cmd)


def _write_json(path, doc):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, allow_nan=True)


def main(argv=None):
    """Entry point of ``python -m cgru bench``; returns the exit code (1: a validation
    failed, 130: interrupted)."""
    args = make_parser().parse_args(argv)
    mode = MODES["quick" if args.quick else "full" if args.full else "default"]
    configs = args.configs or [CONFIGS[n] for n in mode.configs]
    dtypes = args.dtypes or list(mode.dtypes)
    if args.rounds is not None and args.rounds < 1:
        print("--rounds: expected a positive int", file=sys.stderr)
        return 2
    env = environment()
    note = _env_note(env, sys.argv[1:] if argv is None else argv)
    if note:
        print(note, file=sys.stderr)
    peers, notes = load_peers()
    for n in notes:
        print("note:", n, file=sys.stderr)
    idle_check = other_load_now()
    if idle_check is not None and idle_check > 0.25:
        print(f"note: other processes keep {idle_check:.1f} cores busy; timings will be noisy "
              "(2-thread figures especially); see the 'other load' column", file=sys.stderr)
    machine = machine_info()
    if max(args.threads) > (machine["usable_cpus"] or 1):
        print(f"note: {max(args.threads)} threads requested, {machine['usable_cpus']} usable "
              "cores", file=sys.stderr)

    sections = [(c, dt, n) for c in configs for dt in dtypes for n in args.threads]
    progress = Progress(len(sections))
    results, failures, interrupted = [], [], False
    t0 = time.perf_counter()
    try:
        for c, dt, n in sections:
            progress.section(f"{c.name} {dt} {n}T")
            r = run_section(c, dt, n, peers, mode, args.rounds, progress, args.seed)
            for key, rec in r["validation"].items():
                if not rec["ok"]:
                    failures.append(dict(config=c.name, dtype=dt, threads=n, system=key, **rec))
                    progress.end()
                    print(f"\n!!! VALIDATION FAILED: {key} on {c.name} ({c.describe()}) {dt} "
                          f"{n}T: {rec['worst']} differs from {rec['against']} by "
                          f"{rec['err']:.3g} (tolerance {rec['tol']:g}); not timed\n",
                          file=sys.stderr, flush=True)
            results.append(r)
    except KeyboardInterrupt:
        interrupted = True
    progress.end()
    elapsed = time.perf_counter() - t0

    from threadpoolctl import threadpool_info
    tg = targets(results)
    doc = dict(
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        argv=list(sys.argv[1:] if argv is None else argv), mode=mode.name,
        elapsed_s=elapsed, interrupted=interrupted, machine=machine,
        other_load_cores_at_start=idle_check,
        versions=library_versions(peers), threadpool_info=threadpool_info(), environment=env,
        openblas_vars_set=[k for k in OPENBLAS_VARS if env.get(k) is not None],
        notes=notes, method=dict(mode=asdict(mode), rounds_override=args.rounds,
                                 tolerance=TOL, bound="raw gemm_rm time minus calls × "
                                 "measured per-call Python overhead; samples_ms are raw"),
        configs={c.name: asdict(c) for c in configs}, results=results, targets=tg,
        validation_failures=failures)
    _write_json(args.json, doc)

    print(f"cgru bench ({mode.name}, {elapsed:.0f} s) on {machine['cpu']}, "
          f"{machine['usable_cpus']} cores; median ms and ratios of medians "
          "(fb = forward+backward, ratio > 1 = cgru faster except fb/bound)")
    print(format_table(results, markdown=args.markdown))
    print("other load: cores kept busy by other processes during the row (0 = quiet machine)")
    missed = [t for t in tg if not t["ok"]]
    print(f"PERF.md targets met: {len(tg) - len(missed)}/{len(tg)}")
    if missed:
        print(format_misses(tg))
    for n in notes:
        print("note:", n)
    print(f"JSON: {args.json}")
    if not args.no_plot and results:
        try:
            plot(results, args.plot)
            print(f"plot: {args.plot}")
        except ImportError as exc:
            print(f"note: matplotlib not available ({exc}); no plot")
    if note:
        print(note)
    if failures:
        print(f"!!! {len(failures)} VALIDATION FAILURE(S): "
              + "; ".join(f"{f['system']} on {f['config']} {f['dtype']} {f['threads']}T"
                          for f in failures), file=sys.stderr)
        return 1
    return 130 if interrupted else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
