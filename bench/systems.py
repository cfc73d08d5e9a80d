"""Every system the bench times, and their validation against cgru (docs/speed.md §4, §5.1).

``fwd`` is an inference forward, ``fb`` a training forward plus the backward to ``x``, ``h0``
and every weight given ``dy`` and ``dhy``.

==============  ======================================================================
``cgru_fwd``    ``cgru.forward(training=False)``
``cgru_fb``     ``cgru.forward(training=True)`` + ``cgru.backward(dy, dhy)``
``bound_fwd``   the GEMM-only bound of the forward (``bound_fb``: of the training step)
``torch_fwd``   PyTorch ``nn.GRU`` under ``no_grad`` (``torch_fb``: + ``autograd.grad``)
``ort_fwd``     onnxruntime, ONNX ``GRU`` nodes (``linear_before_reset=1``), float32
``openvino_fwd``  OpenVINO ``GRUSequence``, compiled with f32 inference precision, float32
``jax_fb``      JAX: ``jit(value_and_grad)`` of a ``lax.scan`` GRU, in a worker process
                pinned to the section's number of cores (bench/workers.py)
``numpy_fb``    NumPy by hand: ``cgru.core.reference`` (a matmul-per-step GRU), float32
==============  ======================================================================

Each system is a class built as ``cls(problem, n)`` (``n``: the section's thread count), which
imports its package itself; ``call()`` does the timed work, ``outputs()`` runs it once and
returns ``{name: array}`` (``y``, ``hy``, ``dx``, ``dh0``, ``dW[i]``, ``dR[i]``, ``db_W[i]``,
``db_R[i]``) to compare with cgru's.  A class lists the cell kinds it can run (``kinds``) and
the dtypes (``dtypes``; ``timed_dtypes``: those a run times).  The cell-specific code of each
peer is one builder per kind (``_torch_gru``, ``_onnx_gru_model``, ``_openvino_gru_model``,
``_jax_gru_stack``): another kind is another builder in the same table.
"""
import importlib.util
import math
import sys
import time

import numpy as np

import cgru
from bench import timing
from bench.problems import CELL_KINDS

TOL = {"float32": 2e-4, "float64": 1e-9}   # max|a − b| / max|b| against cgru
BOTH = ("float32", "float64")
F32 = ("float32",)


# --- validation --------------------------------------------------------------------------------
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
    """``(ok, worst name, worst error)`` of ``outputs`` against every array of ``reference``
    (a name missing from ``outputs`` fails)."""
    worst, worst_name = 0.0, None
    for name, ref in reference.items():
        e = rel_err(outputs[name], ref) if name in outputs else math.inf
        if worst_name is None or e > worst:
            worst, worst_name = e, name if name in outputs else f"missing {name}"
    return worst <= tol, worst_name, worst


def fwd_outputs(y, hy):
    return {"y": np.asarray(y), "hy": np.asarray(hy)}


def fb_outputs(y, hy, dx, dh0, weight_grads):
    """The fb dict; ``weight_grads`` is one ``{"W", "R", "b_W", "b_R"}`` per layer-direction."""
    out = {"y": np.asarray(y), "hy": np.asarray(hy), "dx": np.asarray(dx),
           "dh0": np.asarray(dh0)}
    for i, g in enumerate(weight_grads):
        for name, a in g.items():
            out[f"d{name}[{i}]"] = np.asarray(a)
    return out


# --- the system interface ---------------------------------------------------------------------
class System:
    """A timed job of one section.  Subclasses set ``key``, ``kind`` (``"fwd"``/``"fb"``),
    ``label``, ``peer`` (the package it needs, ``None`` for cgru's own), ``kinds`` and
    ``dtypes``, and define ``call`` and ``outputs``."""
    key = ""
    kind = ""
    label = ""
    peer = None
    kinds = ("gru",)
    dtypes = BOTH
    timed_dtypes = None          # None: the same as dtypes
    pids = ()                    # other processes doing the work (bench.timing)

    def call(self):
        raise NotImplementedError

    def outputs(self):
        """``{name: array}`` to compare with cgru; ``None``: the system checks itself
        (``check()`` returns its error)."""
        raise NotImplementedError

    def warmup(self, seconds, max_calls):
        """Seconds of each warm-up call: until ``seconds`` have passed or ``max_calls`` were
        made, and at least two calls unless the first took over 0.25 s (the first call of a
        section can be far slower than the rest and would spoil the plan of the blocks)."""
        t0, times = time.perf_counter(), []
        while (len(times) < 2 and (not times or times[0] < 0.25)) or \
                (time.perf_counter() - t0 < seconds and len(times) < max_calls):
            times.append(timing.time_call(self.call))
        return times

    def block(self, k, untimed):
        """One block: an untimed call (when ``untimed``), then ``k`` timed calls."""
        if untimed:
            self.call()
        return [timing.time_call(self.call) for _ in range(k)]

    def close(self):
        pass


# --- cgru --------------------------------------------------------------------------------------
class CgruFwd(System):
    key, kind, label = "cgru_fwd", "fwd", "cgru forward"
    kinds = tuple(CELL_KINDS)

    def __init__(self, p, n):
        self.p, self.n = p, n

    def call(self):
        p = self.p
        return cgru.forward(p.net, p.x, p.h0, training=False, num_threads=self.n,
                            **p.forward_kwargs())

    def outputs(self):
        r = self.call()
        return dict(fwd_outputs(r.y, r.hy), **_cell_state(cy=getattr(r, "cy", None)))


class CgruFb(System):
    key, kind, label = "cgru_fb", "fb", "cgru forward+backward"
    kinds = CgruFwd.kinds

    def __init__(self, p, n):
        self.p, self.n = p, n

    def call(self):
        p = self.p
        f = cgru.forward(p.net, p.x, p.h0, training=True, num_threads=self.n,
                         **p.forward_kwargs())
        g = cgru.backward(p.net, p.x, f.reserve, p.dy, p.dhy, num_threads=self.n,
                          **p.backward_kwargs())
        return f, g

    def outputs(self):
        f, g = self.call()
        return dict(fb_outputs(f.y, f.hy, g.dx, g.dh0, [lp.arrays() for lp in g.dparams]),
                    **_cell_state(cy=getattr(f, "cy", None), dc0=getattr(g, "dc0", None)))


def _cell_state(**arrays):
    """The LSTM's ``cy`` / ``dc0`` outputs when there are any."""
    return {k: np.asarray(v) for k, v in arrays.items() if v is not None}


# --- the GEMM-only bound -----------------------------------------------------------------------
class Bound:
    """Exactly the GEMMs of docs/speed.md §1 on preallocated arrays, nothing else, for any
    number of gate blocks ``G`` (the config's cell kind).

    Per layer-direction, forward: ``gx = X·Wᵀ`` ``[T·N, in]·[in, G·H]`` and ``T`` recurrent
    ``h_t·Rᵀ`` ``[N, H]·[H, G·H]``; backward: ``T`` recurrent data products ``dg_t·R``
    ``[N, G·H]·[G·H, H]``, then ``dR = dgᵀ·H_prev``, ``dW = dgᵀ·X`` and ``dX (+)= dg·W``.  Through
    ``cgru._kernels.blas.gemm_rm`` (SciPy's BLAS like cgru; a single-row product goes to
    ``?gemv`` as in cgru), with the section's BLAS thread count.  The values are random (no
    cell math)."""

    def __init__(self, problem):
        from cgru._kernels import blas
        c = problem.config
        dt = problem.dtype
        rng = np.random.default_rng(1)
        self.gemm = blas.gemm_rm["double" if dt == np.float64 else "float"]
        T, N, H, D, GH = c.T, c.N, c.H, c.D, c.G * c.H
        self.c = c
        self.layers = []
        for layer in range(c.L):
            width = c.layer_width(layer)
            X = rng.uniform(-1, 1, (T * N, width)).astype(dt)
            dirs = []
            for d in range(D):
                lp = problem.net[layer, d]
                states = rng.uniform(-1, 1, ((T + 1) * N, H)).astype(dt)
                dg = rng.uniform(-1, 1, (T * N, GH)).astype(dt)
                dirs.append(dict(
                    W=lp.W, R=lp.R, gx=np.empty((T * N, GH), dt),
                    h=[states[t * N:(t + 1) * N] for t in range(T)],
                    h_prev=states[:T * N], gh=np.empty((N, GH), dt),
                    dg=dg, dg_t=[dg[t * N:(t + 1) * N] for t in range(T)],
                    dh=np.empty((N, H), dt), dW=np.empty((GH, width), dt),
                    dR=np.empty((GH, H), dt)))
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
                gemm(False, True, 1.0, lay["X"], a["W"], 0.0, a["gx"])     # X·Wᵀ
                R, gh = a["R"], a["gh"]
                for h in a["h"]:
                    gemm(False, True, 1.0, h, R, 0.0, gh)                  # h_t·Rᵀ

    def fb(self):
        self.fwd()
        gemm = self.gemm
        for lay in reversed(self.layers):
            for d, a in enumerate(lay["dirs"]):
                R, dh = a["R"], a["dh"]
                for dg_t in reversed(a["dg_t"]):
                    gemm(False, False, 1.0, dg_t, R, 0.0, dh)              # dg_t·R
                gemm(True, False, 1.0, a["dg"], a["h_prev"], 0.0, a["dR"])  # dgᵀ·H_prev
                gemm(True, False, 1.0, a["dg"], lay["X"], 0.0, a["dW"])     # dgᵀ·X
                gemm(False, False, 1.0, a["dg"], a["W"], 0.0 if d == 0 else 1.0, lay["dX"])

    def check(self):
        """Worst relative error of the bound's GEMM results against NumPy in float64."""
        self.fb()
        a0 = self.layers[0]["dirs"][0]
        X = self.layers[0]["X"].astype(np.float64)
        dg = a0["dg"].astype(np.float64)
        R = a0["R"].astype(np.float64)
        return max(rel_err(a0["gx"], X @ a0["W"].astype(np.float64).T),
                   rel_err(a0["gh"], a0["h"][-1].astype(np.float64) @ R.T),
                   rel_err(a0["dh"], a0["dg_t"][0].astype(np.float64) @ R),
                   rel_err(a0["dW"], dg.T @ X),
                   rel_err(a0["dR"], dg.T @ a0["h_prev"].astype(np.float64)))


class BoundSystem(System):
    kinds = CgruFwd.kinds

    def __init__(self, bound, kind):
        self.bound, self.kind = bound, kind
        self.key = f"bound_{kind}"
        self.label = f"GEMM-only bound ({kind})"
        self.call = bound.fwd if kind == "fwd" else bound.fb

    def outputs(self):
        return None

    def check(self):
        return self.bound.check()


def call_overhead_s(dtype, repeats=2000, batches=5):
    """Seconds of Python overhead per ``gemm_rm`` call (1×1 problems; min over batches): the
    bound pays it per call, the engine does not."""
    from cgru._kernels import blas
    gemm = blas.gemm_rm["double" if np.dtype(dtype) == np.float64 else "float"]
    a = np.ones((1, 1), dtype)
    c = np.empty((1, 1), dtype)
    best = math.inf
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(repeats):
            gemm(False, False, 1.0, a, a, 0.0, c)
        best = min(best, (time.perf_counter() - t0) / repeats)
    return best


# --- NumPy by hand: cgru's own reference ---------------------------------------------------------
class NumpyFb(System):
    """``cgru.core.reference``: the GRU written out in NumPy, one batched matmul per gate and
    step.  The timed call is ``reference.backward``, which runs the forward itself (the
    gradients need it); ``outputs`` adds ``reference.forward``'s ``y`` and ``hy``."""
    key, kind, label = "numpy_fb", "fb", "NumPy by hand (cgru.core.reference) fwd+bwd"
    kinds = ("gru",)          # the cell kinds cgru.core.reference computes
    timed_dtypes = F32        # docs/speed.md §4; it computes float64 too (validated in tests)

    def __init__(self, p, n):
        from cgru.core import reference
        self.ref, self.p = reference, p

    def call(self):
        p = self.p
        return self.ref.backward(p.net, p.x, p.dy, p.dhy, p.h0)

    def outputs(self):
        p = self.p
        y, hy = self.ref.forward(p.net, p.x, p.h0)
        dx, dh0, dparams = self.call()
        return fb_outputs(y, hy, dx, dh0, [lp.arrays() for lp in dparams])


# --- PyTorch -----------------------------------------------------------------------------------
def _torch_gru(torch, problem):
    """``torch.nn.GRU`` holding the problem's weights, and its parameters in cgru's order
    (W, R, b_W, b_R per layer-direction)."""
    c = problem.config
    dt = torch.float64 if problem.dtype == np.float64 else torch.float32
    gru = torch.nn.GRU(c.I, c.H, num_layers=c.L, bidirectional=c.bidirectional, dtype=dt)
    weights = []
    with torch.no_grad():
        for i, lp in enumerate(problem.net):
            sfx = f"_l{i // c.D}" + ("_reverse" if i % c.D else "")
            for ours, theirs in (("W", "weight_ih"), ("R", "weight_hh"), ("b_W", "bias_ih"),
                                 ("b_R", "bias_hh")):
                w = getattr(gru, theirs + sfx)
                w.copy_(torch.from_numpy(getattr(lp, ours)))
                weights.append(w)
    return gru, weights


_TORCH_MODULES = {"gru": _torch_gru}
_WEIGHT_NAMES = ("W", "R", "b_W", "b_R")


class TorchFwd(System):
    key, kind, label, peer = "torch_fwd", "fwd", "PyTorch nn.GRU forward (no_grad)", "torch"
    kinds = tuple(_TORCH_MODULES)

    def __init__(self, p, n):
        import torch
        torch.set_num_threads(n)
        self.torch = torch
        self.module, _ = _TORCH_MODULES[p.config.cell](torch, p)
        self.x = torch.from_numpy(p.x)
        self.h0 = torch.from_numpy(p.h0)

    def call(self):
        with self.torch.no_grad():
            return self.module(self.x, self.h0)

    def outputs(self):
        y, hy = self.call()
        return fwd_outputs(y.numpy(), hy.numpy())


class TorchFb(System):
    key, kind, label, peer = "torch_fb", "fb", "PyTorch nn.GRU forward+backward", "torch"
    kinds = tuple(_TORCH_MODULES)

    def __init__(self, p, n):
        import torch
        torch.set_num_threads(n)
        self.torch = torch
        self.module, self.weights = _TORCH_MODULES[p.config.cell](torch, p)
        self.x = torch.from_numpy(p.x.copy()).requires_grad_(True)
        self.h0 = torch.from_numpy(p.h0.copy()).requires_grad_(True)
        self.dy = torch.from_numpy(p.dy)
        self.dhy = torch.from_numpy(p.dhy)

    def call(self):
        y, hy = self.module(self.x, self.h0)
        grads = self.torch.autograd.grad((y, hy), [self.x, self.h0] + self.weights,
                                         (self.dy, self.dhy))
        return y, hy, grads

    def outputs(self):
        y, hy, grads = self.call()
        per_ld = [dict(zip(_WEIGHT_NAMES, (g.numpy() for g in grads[2 + 4 * i:6 + 4 * i])))
                  for i in range(len(grads[2:]) // 4)]
        return fb_outputs(y.detach().numpy(), hy.detach().numpy(), grads[0].numpy(),
                          grads[1].numpy(), per_ld)


# --- ONNX weights (onnxruntime and OpenVINO) -------------------------------------------------------
def onnx_gru_weights(problem, layer):
    """ONNX ``GRU`` weights of one layer from cgru's canonical ones: gates r, z, n reordered to
    ONNX's z, r, h; ``W`` ``[D, 3H, in]``, ``R`` ``[D, 3H, H]``, ``B = [Wb, Rb]`` ``[D, 6H]``.
    (Built here rather than through ``cgru.convert.to_onnx``, whose module is being
    refactored; it is the same mapping.)"""
    c = problem.config
    H = c.H
    zrn = np.r_[H:2 * H, 0:H, 2 * H:3 * H]
    lps = [problem.net[layer, d] for d in range(c.D)]
    W = np.stack([lp.W[zrn] for lp in lps])
    R = np.stack([lp.R[zrn] for lp in lps])
    B = np.stack([np.concatenate([lp.b_W[zrn], lp.b_R[zrn]]) for lp in lps])
    return W, R, B


def _onnx_gru_model(problem):
    """An ONNX graph of the stack: one ``GRU`` node per layer (``linear_before_reset=1``),
    Transpose + Reshape between layers.  Inputs ``X`` ``[T, N, I]`` and ``h0_l`` ``[D, N, H]``;
    outputs ``Y`` ``[T, D, N, H]`` of the last layer and ``Y_h`` ``[L·D, N, H]``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = problem.config
    H, D = c.H, c.D
    elem = TensorProto.DOUBLE if problem.dtype == np.float64 else TensorProto.FLOAT
    direction = "bidirectional" if c.bidirectional else "forward"
    nodes, inits = [], []
    inputs = [helper.make_tensor_value_info("X", elem, ["T", "N", c.I])]
    cur, hys = "X", []
    for layer in range(c.L):
        for name, arr in zip(("W", "R", "B"), onnx_gru_weights(problem, layer)):
            inits.append(numpy_helper.from_array(arr, f"{name}{layer}"))
        inputs.append(helper.make_tensor_value_info(f"h0_{layer}", elem, [D, "N", H]))
        y_name = "Y" if layer == c.L - 1 else f"Y{layer}"
        h_name = "Y_h" if c.L == 1 else f"Y_h{layer}"
        nodes.append(helper.make_node(
            "GRU", [cur, f"W{layer}", f"R{layer}", f"B{layer}", "", f"h0_{layer}"],
            [y_name, h_name], hidden_size=H, direction=direction, linear_before_reset=1))
        hys.append(h_name)
        if layer < c.L - 1:   # [T, D, N, H] -> [T, N, D, H] -> [T, N, D·H]
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


_ONNX_MODELS = {"gru": _onnx_gru_model}


class OrtFwd(System):
    """onnxruntime's CPU execution provider, ``intra_op_num_threads = n``, sequential."""
    key, kind, label, peer = "ort_fwd", "fwd", "onnxruntime GRU forward", "onnxruntime"
    kinds = tuple(_ONNX_MODELS)
    dtypes = F32          # onnxruntime's CPU GRU kernel has no double

    def __init__(self, p, n):
        import onnxruntime as ort
        c = p.config
        so = ort.SessionOptions()
        so.intra_op_num_threads = n
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.sess = ort.InferenceSession(_ONNX_MODELS[c.cell](p).SerializeToString(), so,
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
        return fwd_outputs(Y.transpose(0, 2, 1, 3).reshape(c.T, c.N, c.D * c.H), Yh)


# --- OpenVINO ----------------------------------------------------------------------------------
def _openvino_gru_model(ov, problem):
    """An OpenVINO model of the stack: one ``GRUSequence`` per layer (``linear_before_reset``,
    gates z, r, h as ONNX, ``B`` ``[D, 4H]`` = ``[Wb_z + Rb_z, Wb_r + Rb_r, Wb_h, Rb_h]``).
    Inputs ``X`` ``[N, T, I]`` (batch-major, GRUSequence's layout) and ``h0_l`` ``[N, D, H]``;
    outputs ``Y`` ``[N, D, T, H]`` of the last layer and ``Ho`` ``[N, L·D, H]``."""
    import openvino.opset13 as ops
    c = problem.config
    H, D, T, N = c.H, c.D, c.T, c.N
    et = ov.Type.f64 if problem.dtype == np.float64 else ov.Type.f32
    direction = "bidirectional" if c.bidirectional else "forward"
    X = ops.parameter([N, T, c.I], et, name="X")
    params, cur, hos = [X], X, []
    lengths = ops.constant(np.full(N, T, np.int32))
    for layer in range(c.L):
        W, R, B = onnx_gru_weights(problem, layer)
        Wb, Rb = B[:, :3 * H], B[:, 3 * H:]
        B4 = np.concatenate([Wb[:, :2 * H] + Rb[:, :2 * H], Wb[:, 2 * H:], Rb[:, 2 * H:]], axis=1)
        h0 = ops.parameter([N, D, H], et, name=f"h0_{layer}")
        params.append(h0)
        seq = ops.gru_sequence(cur, h0, lengths, ops.constant(W), ops.constant(R),
                               ops.constant(B4), H, direction, linear_before_reset=True)
        y, ho = seq.output(0), seq.output(1)                  # [N, D, T, H], [N, D, H]
        hos.append(ho)
        if layer < c.L - 1:
            yt = ops.transpose(y, ops.constant(np.array([0, 2, 1, 3], np.int64)))
            cur = ops.reshape(yt, ops.constant(np.array([N, T, D * H], np.int64)), False)
    ho_all = hos[0] if c.L == 1 else ops.concat(hos, axis=1).output(0)
    return ov.Model([y, ho_all], params, "cgru_bench_gru")


_OPENVINO_MODELS = {"gru": _openvino_gru_model}


class OpenVinoFwd(System):
    """OpenVINO's CPU plugin with ``INFERENCE_PRECISION_HINT = f32`` (its default on AVX-512
    machines is bf16: ~2× faster, error ~3e-3 — not the same function) and
    ``INFERENCE_NUM_THREADS = n``, one stream, latency hint, threads not pinned."""
    key, kind, label, peer = "openvino_fwd", "fwd", "OpenVINO GRUSequence forward (f32)", \
        "openvino"
    kinds = tuple(_OPENVINO_MODELS)
    dtypes = F32          # the CPU plugin computes in f32 at best
    CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 1,
              "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False}

    def __init__(self, p, n):
        import openvino as ov
        c = p.config
        model = _OPENVINO_MODELS[c.cell](ov, p)
        config = dict(self.CONFIG, INFERENCE_NUM_THREADS=n)
        self.compiled = ov.Core().compile_model(model, "CPU", config)
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        self.precision_ok = self.precision == ov.Type.f32
        self.threads = int(self.compiled.get_property("INFERENCE_NUM_THREADS"))
        self.info = dict(inference_precision=str(self.precision), threads=self.threads,
                         requested=config)
        self.request = self.compiled.create_infer_request()
        self.feed = [np.ascontiguousarray(p.x.transpose(1, 0, 2))]
        for layer in range(c.L):
            self.feed.append(np.ascontiguousarray(
                p.h0[layer * c.D:(layer + 1) * c.D].transpose(1, 0, 2)))
        self.config = c

    def call(self):
        return self.request.infer(self.feed)

    def outputs(self):
        if not self.precision_ok:
            raise RuntimeError(f"OpenVINO compiled with inference precision {self.precision}, "
                               f"not f32")
        res = self.call()
        Y, Ho = res[0], res[1]
        c = self.config
        return fwd_outputs(np.asarray(Y).transpose(2, 0, 1, 3).reshape(c.T, c.N, c.D * c.H),
                           np.asarray(Ho).transpose(1, 0, 2))


# --- JAX ---------------------------------------------------------------------------------------
def _jax_gru_stack(jax, config):
    """``(y, hy) = stack(weights, x, h0)``: the GRU stack as ``lax.scan`` loops (one per
    layer-direction; the reverse direction scans with ``reverse=True``), cuDNN's cell."""
    jnp, lax = jax.numpy, jax.lax
    H, D, L = config.H, config.D, config.L

    def direction(w, xs, h0, reverse):
        b = jnp.concatenate([w["b_W"][:2 * H] + w["b_R"][:2 * H], w["b_W"][2 * H:]])
        gx = xs @ w["W"].T + b                                    # [T, N, 3H]: all steps
        R, bRn = w["R"], w["b_R"][2 * H:]

        def step(h, g):
            gh = h @ R.T                                          # [N, 3H]
            rz = jax.nn.sigmoid(g[:, :2 * H] + gh[:, :2 * H])
            r, z = rz[:, :H], rz[:, H:]
            n = jnp.tanh(g[:, 2 * H:] + r * (gh[:, 2 * H:] + bRn))
            h = n + z * (h - n)                                   # (1 − z)·n + z·h
            return h, h

        hT, ys = lax.scan(step, h0, gx, reverse=reverse)
        return ys, hT

    def stack(weights, x, h0):
        inp, hys = x, []
        for layer in range(L):
            outs = []
            for d in range(D):
                i = layer * D + d
                y, hT = direction(weights[i], inp, h0[i], d == 1)
                outs.append(y)
                hys.append(hT)
            inp = outs[0] if D == 1 else jnp.concatenate(outs, axis=-1)
        return inp, jnp.stack(hys)

    return stack


_JAX_STACKS = {"gru": _jax_gru_stack}
JAX_CACHE_ENV = "CGRU_BENCH_JAX_CACHE"     # a directory for JAX's compilation cache


class JaxFb(System):
    """``jax.jit(jax.value_and_grad(loss, argnums=(weights, x, h0), has_aux=True))`` with
    ``loss = Σ y·dy + Σ hy·dhy`` (so its gradients are the fb's); float64 in x64 mode.  JAX
    ignores thread limits: this class runs in a worker process pinned to ``n`` cores
    (``bench.workers``); built in-process it uses every core it is allowed."""
    key, kind, label, peer = "jax_fb", "fb", "JAX jit(lax.scan) value_and_grad", "jax"
    kinds = tuple(_JAX_STACKS)
    remote = True

    def __init__(self, p, n):
        import os
        import jax
        jax.config.update("jax_enable_x64", True)
        cache = os.environ.get(JAX_CACHE_ENV)
        if cache:       # a run's workers share compiled code (saves ~1 s per section)
            jax.config.update("jax_compilation_cache_dir", cache)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        jnp = jax.numpy
        stack = _JAX_STACKS[p.config.cell](jax, p.config)

        def loss(weights, x, h0, dy, dhy):
            y, hy = stack(weights, x, h0)
            return jnp.vdot(y, dy) + jnp.vdot(hy, dhy), (y, hy)

        self.jax = jax
        self.fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
        weights = [{k: jnp.asarray(v) for k, v in lp.arrays().items()} for lp in p.net]
        self.args = (weights, jnp.asarray(p.x), jnp.asarray(p.h0), jnp.asarray(p.dy),
                     jnp.asarray(p.dhy))

    def call(self):
        return self.jax.block_until_ready(self.fn(*self.args))

    def outputs(self):
        (_, (y, hy)), (dw, dx, dh0) = self.call()
        return fb_outputs(y, hy, dx, dh0, [{k: np.asarray(v) for k, v in g.items()} for g in dw])


# --- the systems of a section -------------------------------------------------------------------
PEER_SYSTEMS = [TorchFwd, TorchFb, OrtFwd, OpenVinoFwd, JaxFb, NumpyFb]
PEERS = {  # package -> modules that must import (checked in the process that runs the peer)
    "torch": ("torch",), "onnxruntime": ("onnx", "onnxruntime"), "openvino": ("openvino",),
    "jax": ("jax",),
}
BY_KEY = {s.key: s for s in [CgruFwd, CgruFb] + PEER_SYSTEMS}


def _importable(name):
    """True when ``name`` can be imported (``sys.modules[name] = None`` hides it)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def load_peers(skip=()):
    """``({package: version or None}, [notes])`` of the optional peers present; ``skip``: names
    not to run (``torch``, ``onnxruntime``, ``openvino``, ``jax``).  JAX is only looked up
    here (it runs in its own pinned process); the others are imported."""
    peers, notes = {}, []
    for name, modules in PEERS.items():
        if name in skip:
            notes.append(f"{name} skipped (--skip)")
            continue
        try:
            if name == "jax":
                if not _importable("jax"):
                    raise ImportError("No module named 'jax'")
                peers[name] = None
                continue
            mods = [importlib.import_module(m) for m in modules]
            peers[name] = getattr(mods[-1], "__version__", None)
        except Exception as exc:   # ImportError or a broken install
            notes.append(f"{name} not available ({exc.__class__.__name__}: {exc}); its "
                         f"systems are skipped")
    return peers, notes


def build_systems(problem, n, peers, *, remote=None, all_dtypes=False, skip=(), notes=None):
    """The systems of one section (config, dtype, ``n`` threads), cgru first.

    ``peers``: from ``load_peers``; ``remote(cls, problem, n)`` builds a system that runs in a
    worker process (JAX; ``None``: JAX is not run); ``all_dtypes``: include every system that
    can compute the dtype, not only those a run times (the tests); ``skip``: keys or peer names
    to leave out (``numpy``, ``bound``); ``notes``: a list that receives why a peer is left
    out of this section."""
    dt, kind = problem.dtype.name, problem.config.cell
    systems = [CgruFwd(problem, n), CgruFb(problem, n)]
    for cls in PEER_SYSTEMS:
        group = cls.peer or cls.key.split("_")[0]
        if cls.key in skip or group in skip or (cls.peer and cls.peer not in peers):
            continue
        dtypes = cls.dtypes if all_dtypes else (cls.timed_dtypes or cls.dtypes)
        if dt not in dtypes:
            continue
        if kind not in cls.kinds:
            if notes is not None:
                notes.append(f"{cls.key}: no {kind} model in bench/systems.py; skipped")
            continue
        if getattr(cls, "remote", False) and remote is None:
            continue
        try:
            systems.append(remote(cls, problem, n) if getattr(cls, "remote", False)
                           else cls(problem, n))
        except Exception as exc:    # a peer that cannot be set up fails its validation
            systems.append(Failed(cls, exc))
    bound = None
    if "bound" not in skip:
        bound = Bound(problem)
        systems += [BoundSystem(bound, "fwd"), BoundSystem(bound, "fb")]
    return systems, bound


class Failed(System):
    """A system that could not be set up: it fails its validation, with the reason."""

    def __init__(self, cls, exc):
        self.key, self.kind, self.label = cls.key, cls.kind, cls.label
        self.why = f"{exc.__class__.__name__}: {exc}"

    def outputs(self):
        raise RuntimeError(f"could not be set up: {self.why}")


def cgru_reference(problem, n):
    """cgru's fwd and fb outputs for the section: what every other system is compared with."""
    return CgruFwd(problem, n).outputs(), CgruFb(problem, n).outputs()


def validate(problem, systems, n, reference=None):
    """Validate every system against cgru (``max|a − b| / max|b|`` within ``TOL``).  Returns
    ``{key: record}`` with ``ok``, ``against``, ``worst`` (the output name), ``err``, ``tol``.
    cgru's fb is checked against cgru's inference forward (``y``, ``hy``); the bound's GEMM
    results against NumPy.  A system that raises fails; it is never a crash of the bench."""
    tol = TOL[problem.dtype.name]
    try:
        ref_fwd, ref_fb = reference or cgru_reference(problem, n)
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
            out = ref_fb if s.key == "cgru_fb" else s.outputs()
            if out is None:
                err = s.check()
                ok, worst, against = err <= tol, "gemm results", "NumPy matmul (float64)"
            else:
                ref = ref_fwd if s.kind == "fwd" or s.key == "cgru_fb" else ref_fb
                ok, worst, err = compare(out, ref, tol)
                against = "cgru forward" if ref is ref_fwd else "cgru forward+backward"
        except Exception as exc:  # a peer that crashes fails its validation
            ok, worst, err, against = False, f"{exc.__class__.__name__}: {exc}", math.inf, "cgru"
        records[s.key] = dict(ok=bool(ok), against=against, worst=worst, err=float(err), tol=tol)
        info = getattr(s, "info", None)
        if isinstance(info, dict):
            records[s.key]["info"] = info
    return records
