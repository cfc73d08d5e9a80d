"""Every system the bench times, and their validation against cgru (docs/speed.md §4, §5.1).

``fwd`` is an inference forward, ``fb`` a training forward plus the backward to ``x``, ``h0``
(an LSTM's ``c0``) and every weight given ``dy`` and ``dhy`` (``dcy``).

===================  =================================================================
``cgru_fwd``         ``cgru.forward(training=False)`` on the network sealed once
                     (``Network.sealed()``: fixed weights, as the inference engines hold theirs)
``cgru_fb``          ``cgru.forward(training=True)`` + ``cgru.backward(dy, dhy)``
``cgru_stream_fwd``  ``cgru.Stream(net).step(x, state)`` (streaming configs: S1, S32)
``cgru_torch_fb``    ``cgru.torch.GRU`` / ``LSTM`` / ``RNN`` forward + ``autograd.grad``
``bound_fwd``        the GEMM-only bound of the forward (``bound_fb``: of the training step)
``torch_fwd``        PyTorch ``nn.GRU`` / ``nn.LSTM`` / ``nn.RNN`` under ``no_grad``
``torch_fb``         the same + ``torch.autograd.grad`` to x, h0 (c0) and every weight
``ort_fwd``          onnxruntime, ONNX ``GRU`` (``linear_before_reset=1``) / ``LSTM`` /
                     ``RNN`` nodes, float32
``openvino_fwd``     OpenVINO ``GRUSequence`` / ``LSTMSequence`` / ``RNNSequence``, compiled
                     with f32 inference precision, float32
``jax_fb``           JAX: ``jit(value_and_grad)`` of a ``lax.scan`` stack, in a worker
                     process pinned to the section's number of cores (bench/workers.py)
``numpy_fb``         NumPy by hand: ``cgru.core.reference`` (a matmul-per-step stack of any
                     cell kind), float32
===================  =================================================================

Each system is a class built as ``cls(problem, n)`` (``n``: the section's thread count), which
imports its package itself; ``call()`` does the timed work, ``outputs()`` runs it once and
returns ``{name: array}`` (``y``, ``hy``, ``dx``, ``dh0``, ``dW[i]``, ``dR[i]``, ``db_W[i]``,
``db_R[i]``; an LSTM's ``cy``, ``dc0`` and, with a projection, ``dW_p[i]``) to compare with
cgru's.  ``cls.supports(config)`` says whether the class can run a config: its cell kind is
in ``kinds``, a projection needs ``projection``, ``streaming_only`` systems run the streaming
configs only.  ``dtypes`` are the dtypes it computes, ``timed_dtypes`` those a run times.
The cell-specific code of each peer is one builder per kind, in one table per peer
(``_TORCH_CLASSES``, ``_ONNX_OPS``, ``_OPENVINO_LAYERS``, ``_JAX_DIRECTIONS``).
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
ALL_KINDS = tuple(CELL_KINDS)


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


def fwd_outputs(y, hy, cy=None):
    """The fwd dict (``cy``: an LSTM's final cell states)."""
    out = {"y": np.asarray(y), "hy": np.asarray(hy)}
    if cy is not None:
        out["cy"] = np.asarray(cy)
    return out


def fb_outputs(y, hy, dx, dh0, weight_grads, cy=None, dc0=None):
    """The fb dict; ``weight_grads`` is one ``{"W", "R", "b_W", "b_R"[, "W_p"]}`` per
    layer-direction; ``cy`` and ``dc0``: an LSTM's."""
    out = fwd_outputs(y, hy, cy)
    out.update(dx=np.asarray(dx), dh0=np.asarray(dh0))
    if dc0 is not None:
        out["dc0"] = np.asarray(dc0)
    for i, g in enumerate(weight_grads):
        for name, a in g.items():
            out[f"d{name}[{i}]"] = np.asarray(a)
    return out


# --- the system interface ---------------------------------------------------------------------
class System:
    """A timed job of one section.  Subclasses set ``key``, ``kind`` (``"fwd"``/``"fb"``),
    ``label``, ``peer`` (the package it needs, ``None`` for cgru's own), ``kinds``,
    ``projection``, ``streaming_only`` and ``dtypes``, and define ``call`` and ``outputs``."""
    key = ""
    kind = ""
    label = ""
    peer = None
    kinds = ("gru",)
    projection = False           # runs an LSTM with a projection
    streaming_only = False       # runs only the streaming configs (S1, S32)
    dtypes = BOTH
    timed_dtypes = None          # None: the same as dtypes
    pids = ()                    # other processes doing the work (bench.timing)

    @classmethod
    def supports(cls, config):
        """Whether this system can run ``config`` (its cell kind, projection, streaming)."""
        return (config.cell in cls.kinds and (cls.projection or not config.P)
                and (config.streaming or not cls.streaming_only))

    @classmethod
    def unsupported(cls, config):
        """Why this system does not run ``config`` (the note of a section), or ``None``."""
        if config.cell not in cls.kinds:
            return f"{cls.key}: no {config.cell} model in bench/systems.py; skipped"
        if config.P and not cls.projection:
            return f"{cls.key}: no LSTM projection (proj_size) in this peer; skipped"
        return None            # streaming_only on a non-streaming config: not a note

    def call(self):
        raise NotImplementedError

    def outputs(self):
        """``{name: array}`` to compare with cgru; ``None``: the system checks itself
        (``check()`` returns its error)."""
        raise NotImplementedError

    def warmup(self, seconds, max_calls, single_s=0.25):
        """Seconds of each warm-up call: until ``seconds`` have passed or ``max_calls`` were
        made, and at least two calls unless the first took over ``single_s`` (the first call
        of a section can be far slower than the rest and would spoil the plan of the
        blocks)."""
        t0, times = time.perf_counter(), []
        while (len(times) < 2 and (not times or times[0] < single_s)) or \
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
    """Inference on fixed weights: the network sealed once (``Network.sealed()``), so a call
    proves its weights by identity — as onnxruntime and OpenVINO, the peers of this row, hold
    theirs compiled into the session."""
    key, kind, label = "cgru_fwd", "fwd", "cgru forward"
    kinds, projection = ALL_KINDS, True

    def __init__(self, p, n):
        self.p, self.n = p, n
        self.net = p.net.sealed()

    def call(self):
        p = self.p
        return cgru.forward(self.net, p.x, p.h0, training=False, num_threads=self.n,
                            **p.forward_kwargs())

    def outputs(self):
        r = self.call()
        return fwd_outputs(r.y, r.hy, getattr(r, "cy", None))


class CgruFb(System):
    key, kind, label = "cgru_fb", "fb", "cgru forward+backward"
    kinds, projection = ALL_KINDS, True

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
        return fb_outputs(f.y, f.hy, g.dx, g.dh0, [lp.arrays() for lp in g.dparams],
                          cy=getattr(f, "cy", None), dc0=getattr(g, "dc0", None))


class CgruStreamFwd(System):
    """``cgru.Stream(net, num_threads=n).step(x, state)``: the explicit API for repeated
    small calls (the weights packed once, when the stream is made).  S1 steps ``x[0]``
    ``[N, I]``; S32 feeds its 32-step chunk ``[T, N, I]``; the state is ``h0`` (an LSTM's
    ``(h0, c0)``).  A stream runs forward in time: streaming configs only."""
    key, kind, label = "cgru_stream_fwd", "fwd", "cgru.Stream step"
    kinds, projection, streaming_only = ALL_KINDS, True, True

    def __init__(self, p, n):
        self.p = p
        self.stream = cgru.Stream(p.net, num_threads=n)
        self.x = p.x[0] if p.config.T == 1 else p.x
        self.state = p.h0 if p.c0 is None else (p.h0, p.c0)

    def call(self):
        return self.stream.step(self.x, self.state)

    def outputs(self):
        y, state = self.call()
        c = self.p.config
        hy, cy = state if isinstance(state, tuple) else (state, None)
        return fwd_outputs(np.asarray(y).reshape(c.T, c.N, c.S), hy, cy)


# --- the GEMM-only bound -----------------------------------------------------------------------
class Bound:
    """Exactly the GEMMs of docs/speed.md §1 on preallocated arrays, nothing else, for any
    number of gate blocks ``G`` (the config's cell kind) and an LSTM's projection.

    Per layer-direction, forward: ``gx = X·Wᵀ`` ``[T·N, in]·[in, G·H]`` and ``T`` recurrent
    ``h_t·Rᵀ`` ``[N, S]·[S, G·H]``; backward: ``T`` recurrent data products ``dg_t·R``
    ``[N, G·H]·[G·H, S]``, then ``dR = dgᵀ·H_prev``, ``dW = dgᵀ·X`` and ``dX (+)= dg·W``.  With
    a projection ``W_p`` ``[P, H]`` (``S = P``) each forward step adds ``h_t = m_t·W_pᵀ``
    ``[N, H]·[H, P]``, each backward step ``dm_t = dh_t·W_p`` ``[N, P]·[P, H]``, and the
    backward ``dW_p = dhᵀ·M`` ``[P, T·N]·[T·N, H]``.  Through ``cgru._kernels.blas.gemm_rm``
    (SciPy's BLAS like cgru; a single-row product goes to ``?gemv`` as in cgru), with the
    section's BLAS thread count.  The values are random (no cell math)."""

    def __init__(self, problem):
        from cgru._kernels import blas
        c = problem.config
        dt = problem.dtype
        rng = np.random.default_rng(1)
        self.gemm = blas.gemm_rm["double" if dt == np.float64 else "float"]
        T, N, H, S, D, GH = c.T, c.N, c.H, c.S, c.D, c.G * c.H
        self.c = c
        self.layers = []
        for layer in range(c.L):
            width = c.layer_width(layer)
            X = rng.uniform(-1, 1, (T * N, width)).astype(dt)
            dirs = []
            for d in range(D):
                lp = problem.net[layer, d]
                states = rng.uniform(-1, 1, ((T + 1) * N, S)).astype(dt)
                dg = rng.uniform(-1, 1, (T * N, GH)).astype(dt)
                a = dict(
                    W=lp.W, R=lp.R, gx=np.empty((T * N, GH), dt),
                    h=[states[t * N:(t + 1) * N] for t in range(T)],
                    h_prev=states[:T * N], gh=np.empty((N, GH), dt),
                    dg=dg, dg_t=[dg[t * N:(t + 1) * N] for t in range(T)],
                    dh=np.empty((N, S), dt), dW=np.empty((GH, width), dt),
                    dR=np.empty((GH, S), dt))
                if c.P:
                    M = rng.uniform(-1, 1, (T * N, H)).astype(dt)
                    dhp = rng.uniform(-1, 1, (T * N, S)).astype(dt)
                    a.update(W_p=lp.W_p, M=M, m=[M[t * N:(t + 1) * N] for t in range(T)],
                             hp=np.empty((N, S), dt), dhp=dhp,
                             dhp_t=[dhp[t * N:(t + 1) * N] for t in range(T)],
                             dm=np.empty((N, H), dt), dWp=np.empty((S, H), dt))
                dirs.append(a)
            self.layers.append(dict(X=X, dX=np.empty((T * N, width), dt), dirs=dirs))

    def calls(self, kind):
        """Number of ``gemm_rm`` calls of one ``fwd`` or ``fb``."""
        c = self.c
        proj = 1 if c.P else 0
        fwd = c.L * c.D * (1 + c.T * (1 + proj))
        return fwd if kind == "fwd" else fwd + c.L * c.D * (c.T * (1 + proj) + 3 + proj)

    def fwd(self):
        gemm = self.gemm
        for lay in self.layers:
            for a in lay["dirs"]:
                gemm(False, True, 1.0, lay["X"], a["W"], 0.0, a["gx"])     # X·Wᵀ
                R, gh = a["R"], a["gh"]
                if "W_p" in a:
                    Wp, hp = a["W_p"], a["hp"]
                    for h, m in zip(a["h"], a["m"]):
                        gemm(False, True, 1.0, h, R, 0.0, gh)              # h_t·Rᵀ
                        gemm(False, True, 1.0, m, Wp, 0.0, hp)             # m_t·W_pᵀ
                else:
                    for h in a["h"]:
                        gemm(False, True, 1.0, h, R, 0.0, gh)              # h_t·Rᵀ

    def fb(self):
        self.fwd()
        gemm = self.gemm
        for lay in reversed(self.layers):
            for d, a in enumerate(lay["dirs"]):
                R, dh = a["R"], a["dh"]
                if "W_p" in a:
                    Wp, dm = a["W_p"], a["dm"]
                    for dg_t, dhp_t in zip(reversed(a["dg_t"]), reversed(a["dhp_t"])):
                        gemm(False, False, 1.0, dhp_t, Wp, 0.0, dm)       # dh_t·W_p
                        gemm(False, False, 1.0, dg_t, R, 0.0, dh)          # dg_t·R
                    gemm(True, False, 1.0, a["dhp"], a["M"], 0.0, a["dWp"])  # dhᵀ·M
                else:
                    for dg_t in reversed(a["dg_t"]):
                        gemm(False, False, 1.0, dg_t, R, 0.0, dh)          # dg_t·R
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
        errs = [rel_err(a0["gx"], X @ a0["W"].astype(np.float64).T),
                rel_err(a0["gh"], a0["h"][-1].astype(np.float64) @ R.T),
                rel_err(a0["dh"], a0["dg_t"][0].astype(np.float64) @ R),
                rel_err(a0["dW"], dg.T @ X),
                rel_err(a0["dR"], dg.T @ a0["h_prev"].astype(np.float64))]
        if "W_p" in a0:
            Wp = a0["W_p"].astype(np.float64)
            errs += [rel_err(a0["hp"], a0["m"][-1].astype(np.float64) @ Wp.T),
                     rel_err(a0["dm"], a0["dhp_t"][0].astype(np.float64) @ Wp),
                     rel_err(a0["dWp"], a0["dhp"].astype(np.float64).T
                             @ a0["M"].astype(np.float64))]
        return max(errs)


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
    """``cgru.core.reference``: the stack written out in NumPy, one batched matmul per gate
    block and step, for every cell kind (an LSTM's projection included).  The timed call is
    ``reference.backward``, which runs the forward itself (the gradients need it);
    ``outputs`` adds ``reference.forward``'s ``y`` and ``hy`` (``cy``)."""
    key, kind, label = "numpy_fb", "fb", "NumPy by hand (cgru.core.reference) fwd+bwd"
    kinds, projection = ALL_KINDS, True
    timed_dtypes = F32        # docs/speed.md §4; it computes float64 too (validated in tests)

    def __init__(self, p, n):
        from cgru.core import reference
        self.ref, self.p = reference, p
        self.lstm = p.c0 is not None

    def call(self):
        p = self.p
        if self.lstm:
            return self.ref.backward(p.net, p.x, p.dy, p.dhy, p.h0, c0=p.c0, dcy=p.dcy)
        return self.ref.backward(p.net, p.x, p.dy, p.dhy, p.h0)

    def outputs(self):
        p = self.p
        if self.lstm:
            y, hy, cy = self.ref.forward(p.net, p.x, p.h0, c0=p.c0)
            dx, dh0, dc0, dparams = self.call()
        else:
            (y, hy), cy = self.ref.forward(p.net, p.x, p.h0), None
            (dx, dh0, dparams), dc0 = self.call(), None
        return fb_outputs(y, hy, dx, dh0, [lp.arrays() for lp in dparams], cy=cy, dc0=dc0)


# --- PyTorch -----------------------------------------------------------------------------------
# cell kind -> (class name in torch.nn and cgru.torch, extra constructor keywords)
_TORCH_CLASSES = {
    "gru": ("GRU", lambda c: {}),
    "lstm": ("LSTM", lambda c: {"proj_size": c.P}),
    "rnn_tanh": ("RNN", lambda c: {"nonlinearity": "tanh"}),
    "rnn_relu": ("RNN", lambda c: {"nonlinearity": "relu"}),
}
# cgru slot -> torch parameter prefix, in the order of torch's parameters per direction
_TORCH_SLOTS = (("W", "weight_ih"), ("R", "weight_hh"), ("b_W", "bias_ih"),
                ("b_R", "bias_hh"), ("W_p", "weight_hr"))


def _torch_module(torch, problem, namespace=None):
    """``(module, weights, slots)``: a ``torch.nn.GRU`` / ``LSTM`` / ``RNN`` (or the class of
    the same name in ``namespace``, e.g. ``cgru.torch``) holding the problem's weights; its
    parameters in cgru's order (W, R, b_W, b_R[, W_p] per layer-direction) and, for each,
    ``(layer-direction, cgru slot)``.  Gates are in the same order in both (GRU r, z, n; LSTM
    i, f, g, o)."""
    import warnings
    # torch says once that a projection keeps an LSTM off oneDNN (docs/speed.md §4)
    warnings.filterwarnings("ignore", "LSTM with projections is not supported with oneDNN")
    c = problem.config
    dt = torch.float64 if problem.dtype == np.float64 else torch.float32
    name, extra = _TORCH_CLASSES[c.cell]
    cls = getattr(namespace or torch.nn, name)
    module = cls(c.I, c.H, num_layers=c.L, bidirectional=c.bidirectional, dtype=dt,
                 **extra(c))
    weights, slots = [], []
    with torch.no_grad():
        for i, lp in enumerate(problem.net):
            sfx = f"_l{i // c.D}" + ("_reverse" if i % c.D else "")
            for ours, theirs in _TORCH_SLOTS:
                if getattr(lp, ours) is None:
                    continue
                w = getattr(module, theirs + sfx)
                w.copy_(torch.from_numpy(getattr(lp, ours)))
                weights.append(w)
                slots.append((i, ours))
    return module, weights, slots


def _weight_grads(grads, slots, n_ld):
    """Per layer-direction ``{slot: array}`` of gradients listed in ``slots`` order."""
    out = [{} for _ in range(n_ld)]
    for g, (i, slot) in zip(grads, slots):
        out[i][slot] = g.numpy()
    return out


class TorchFwd(System):
    key, kind, label, peer = "torch_fwd", "fwd", "PyTorch nn.GRU/LSTM/RNN forward (no_grad)", \
        "torch"
    kinds, projection = tuple(_TORCH_CLASSES), True

    def __init__(self, p, n):
        import torch
        torch.set_num_threads(n)
        self.torch = torch
        self.module, _, _ = _torch_module(torch, p)
        self.x = torch.from_numpy(p.x)
        h0 = torch.from_numpy(p.h0)
        self.hx = h0 if p.c0 is None else (h0, torch.from_numpy(p.c0))

    def call(self):
        with self.torch.no_grad():
            return self.module(self.x, self.hx)

    def outputs(self):
        y, state = self.call()
        hy, cy = state if isinstance(state, tuple) else (state, None)
        return fwd_outputs(y.numpy(), hy.numpy(), None if cy is None else cy.numpy())


class TorchFb(System):
    """A training step: the module's forward and ``torch.autograd.grad`` of ``(y, hy[, cy])``
    with ``(dy, dhy[, dcy])`` to ``x``, ``h0`` (``c0``) and every weight."""
    key, kind, label, peer = "torch_fb", "fb", "PyTorch nn.GRU/LSTM/RNN forward+backward", \
        "torch"
    kinds, projection = tuple(_TORCH_CLASSES), True
    namespace = None            # torch.nn

    def __init__(self, p, n):
        import torch
        torch.set_num_threads(n)
        self.torch = torch
        self.module, self.weights, self.slots = _torch_module(torch, p, self._namespace(n))
        self.n_ld = len(p.net)
        self.x = torch.from_numpy(p.x.copy()).requires_grad_(True)
        self.states = [torch.from_numpy(p.h0.copy()).requires_grad_(True)]
        self.grads_out = [torch.from_numpy(p.dy), torch.from_numpy(p.dhy)]
        if p.c0 is not None:
            self.states.append(torch.from_numpy(p.c0.copy()).requires_grad_(True))
            self.grads_out.append(torch.from_numpy(p.dcy))
        self.inputs = [self.x] + self.states + self.weights

    def _namespace(self, n):
        return None

    def call(self):
        y, state = self.module(self.x, tuple(self.states) if len(self.states) == 2
                               else self.states[0])
        outs = (y,) + (state if isinstance(state, tuple) else (state,))
        grads = self.torch.autograd.grad(outs, self.inputs, self.grads_out)
        return outs, grads

    def outputs(self):
        outs, grads = self.call()
        S = len(self.states)
        cy, dc0 = (outs[2].detach().numpy(), grads[2].numpy()) if S == 2 else (None, None)
        return fb_outputs(outs[0].detach().numpy(), outs[1].detach().numpy(),
                          grads[0].numpy(), grads[1].numpy(),
                          _weight_grads(grads[1 + S:], self.slots, self.n_ld), cy=cy, dc0=dc0)


class CgruTorchFb(TorchFb):
    """cgru's drop-in PyTorch modules (``cgru.torch.GRU`` / ``LSTM`` / ``RNN``) through the
    same training step as ``torch_fb``: what a user gets by swapping the module.  Torch and
    the module (``module.num_threads``) both use ``n`` threads."""
    key, label = "cgru_torch_fb", "cgru.torch.GRU/LSTM/RNN forward+backward"

    def _namespace(self, n):
        import cgru.torch
        return cgru.torch

    def __init__(self, p, n):
        super().__init__(p, n)
        self.module.num_threads = n


# --- ONNX (onnxruntime) -------------------------------------------------------------------------
# cell kind -> ONNX operator; the weights and attributes come from cgru.convert.to_onnx
_ONNX_OPS = {"gru": "GRU", "lstm": "LSTM", "rnn_tanh": "RNN", "rnn_relu": "RNN"}


def onnx_layers(problem):
    """``(layers, attributes)`` of ``cgru.convert.to_onnx(net)``: per layer ONNX's ``W``
    ``[D, G·H, in]``, ``R`` ``[D, G·H, H]`` and ``B = [Wb, Rb]`` ``[D, 2G·H]``, gates in ONNX's
    order (GRU z, r, h; LSTM i, o, f, c), and the node attributes (``hidden_size``,
    ``direction``, GRU ``linear_before_reset=1``, RNN ``activations``)."""
    from cgru.convert import to_onnx
    return to_onnx(problem.net)


def _onnx_model(problem):
    """An ONNX graph of the stack: one ``GRU`` / ``LSTM`` / ``RNN`` node per layer,
    Transpose + Reshape between layers.  Inputs ``X`` ``[T, N, I]``, ``h0_l`` ``[D, N, H]``
    (an LSTM's ``c0_l`` too); outputs ``Y`` ``[T, D, N, H]`` of the last layer, ``Y_h``
    ``[L·D, N, H]`` (and ``Y_c``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = problem.config
    H, D, op = c.H, c.D, _ONNX_OPS[c.cell]
    lstm = op == "LSTM"
    elem = TensorProto.DOUBLE if problem.dtype == np.float64 else TensorProto.FLOAT
    layers, attrs = onnx_layers(problem)
    nodes, inits = [], []
    inputs = [helper.make_tensor_value_info("X", elem, ["T", "N", c.I])]
    cur, finals = "X", {"Y_h": [], "Y_c": []}
    for layer, w in enumerate(layers):
        for name in ("W", "R", "B"):
            inits.append(numpy_helper.from_array(np.ascontiguousarray(w[name]),
                                                 f"{name}{layer}"))
        states = ["h0"] + (["c0"] if lstm else [])
        for s in states:
            inputs.append(helper.make_tensor_value_info(f"{s}_{layer}", elem, [D, "N", H]))
        y_name = "Y" if layer == c.L - 1 else f"Y{layer}"
        outs = [y_name] + [k if c.L == 1 else f"{k}{layer}" for k in finals][:len(states)]
        for k, o in zip(finals, outs[1:]):
            finals[k].append(o)
        node_in = [cur, f"W{layer}", f"R{layer}", f"B{layer}", "", f"h0_{layer}"]
        if lstm:
            node_in.append(f"c0_{layer}")
        nodes.append(helper.make_node(op, node_in, outs, **attrs))
        if layer < c.L - 1:   # [T, D, N, H] -> [T, N, D, H] -> [T, N, D·H]
            nodes.append(helper.make_node("Transpose", [y_name], [f"Yt{layer}"],
                                          perm=[0, 2, 1, 3]))
            nodes.append(helper.make_node("Reshape", [f"Yt{layer}", "flat_shape"],
                                          [f"X{layer + 1}"]))
            cur = f"X{layer + 1}"
    if c.L > 1:
        inits.append(numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flat_shape"))
        for k, parts in finals.items():
            if parts:
                nodes.append(helper.make_node("Concat", parts, [k], axis=0))
    outputs = [helper.make_tensor_value_info("Y", elem, ["T", D, "N", H])]
    outputs += [helper.make_tensor_value_info(k, elem, [c.L * D, "N", H])
                for k, parts in finals.items() if parts]
    graph = helper.make_graph(nodes, f"cgru_bench_{op.lower()}", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class OrtFwd(System):
    """onnxruntime's CPU execution provider, ``intra_op_num_threads = n``, sequential."""
    key, kind, label, peer = "ort_fwd", "fwd", "onnxruntime GRU/LSTM/RNN forward", \
        "onnxruntime"
    kinds = tuple(_ONNX_OPS)          # ONNX has no LSTM projection
    dtypes = F32          # onnxruntime's CPU GRU, LSTM and RNN kernels have no double

    def __init__(self, p, n):
        import onnxruntime as ort
        c = p.config
        so = ort.SessionOptions()
        so.intra_op_num_threads = n
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.sess = ort.InferenceSession(_onnx_model(p).SerializeToString(), so,
                                         providers=["CPUExecutionProvider"])
        self.feed = {"X": p.x}
        for layer in range(c.L):
            rows = slice(layer * c.D, (layer + 1) * c.D)
            self.feed[f"h0_{layer}"] = np.ascontiguousarray(p.h0[rows])
            if p.c0 is not None:
                self.feed[f"c0_{layer}"] = np.ascontiguousarray(p.c0[rows])
        self.config = c

    def call(self):
        return self.sess.run(None, self.feed)

    def outputs(self):
        Y, Yh, *Yc = self.call()
        c = self.config
        return fwd_outputs(Y.transpose(0, 2, 1, 3).reshape(c.T, c.N, c.D * c.H), Yh,
                           Yc[0] if Yc else None)


# --- OpenVINO ----------------------------------------------------------------------------------
def _gate_blocks(a, H, order):
    """Row blocks of ``H`` of ``a`` (axis 0) in ``order`` (canonical gate indices)."""
    return np.concatenate([a[g * H:(g + 1) * H] for g in order], axis=0)


def _ov_gru(ops, cur, states, lengths, lps, c, direction):
    """``GRUSequence`` with ``linear_before_reset``: gates z, r, h as ONNX (canonical r, z, n
    → 1, 0, 2); ``B`` ``[D, 4H]`` = ``[Wb_z + Rb_z, Wb_r + Rb_r, Wb_h, Rb_h]``."""
    H, zrh = c.H, (1, 0, 2)
    W = np.stack([_gate_blocks(lp.W, H, zrh) for lp in lps])
    R = np.stack([_gate_blocks(lp.R, H, zrh) for lp in lps])
    bW = np.stack([_gate_blocks(lp.b_W, H, zrh) for lp in lps])
    bR = np.stack([_gate_blocks(lp.b_R, H, zrh) for lp in lps])
    B = np.concatenate([bW[:, :2 * H] + bR[:, :2 * H], bW[:, 2 * H:], bR[:, 2 * H:]], axis=1)
    return ops.gru_sequence(cur, states[0], lengths, ops.constant(W), ops.constant(R),
                            ops.constant(B), H, direction, linear_before_reset=True)


def _ov_lstm(ops, cur, states, lengths, lps, c, direction):
    """``LSTMSequence``: gates f, i, c, o (canonical i, f, g, o → 1, 0, 2, 3); one bias
    ``B`` ``[D, 4H]`` = ``b_W + b_R``."""
    H, fico = c.H, (1, 0, 2, 3)
    W = np.stack([_gate_blocks(lp.W, H, fico) for lp in lps])
    R = np.stack([_gate_blocks(lp.R, H, fico) for lp in lps])
    B = np.stack([_gate_blocks(lp.b_W + lp.b_R, H, fico) for lp in lps])
    return ops.lstm_sequence(cur, states[0], states[1], lengths, ops.constant(W),
                             ops.constant(R), ops.constant(B), H, direction)


def _ov_rnn(ops, cur, states, lengths, lps, c, direction):
    """``RNNSequence`` with the cell's activation; one bias ``B`` ``[D, H]`` = ``b_W + b_R``."""
    W = np.stack([lp.W for lp in lps])
    R = np.stack([lp.R for lp in lps])
    B = np.stack([lp.b_W + lp.b_R for lp in lps])
    return ops.rnn_sequence(cur, states[0], lengths, ops.constant(W), ops.constant(R),
                            ops.constant(B), c.H, direction, activations=[c.cell[4:]])


# cell kind -> the builder of one layer's sequence node
_OPENVINO_LAYERS = {"gru": _ov_gru, "lstm": _ov_lstm, "rnn_tanh": _ov_rnn, "rnn_relu": _ov_rnn}


def _openvino_model(ov, problem):
    """An OpenVINO model of the stack: one ``GRUSequence`` / ``LSTMSequence`` /
    ``RNNSequence`` per layer.  Inputs ``X`` ``[N, T, I]`` (batch-major, the sequence ops'
    layout), then per layer ``h0_l`` ``[N, D, H]`` (an LSTM's ``c0_l`` too); outputs ``Y``
    ``[N, D, T, H]`` of the last layer, ``Ho`` ``[N, L·D, H]`` (and ``Co``)."""
    import openvino.opset13 as ops
    c = problem.config
    H, D, T, N = c.H, c.D, c.T, c.N
    et = ov.Type.f64 if problem.dtype == np.float64 else ov.Type.f32
    direction = "bidirectional" if c.bidirectional else "forward"
    n_states = 2 if problem.c0 is not None else 1
    X = ops.parameter([N, T, c.I], et, name="X")
    params, cur, finals = [X], X, [[] for _ in range(n_states)]
    lengths = ops.constant(np.full(N, T, np.int32))
    for layer in range(c.L):
        states = [ops.parameter([N, D, H], et, name=f"{s}_{layer}")
                  for s in ("h0", "c0")[:n_states]]
        params += states
        lps = [problem.net[layer, d] for d in range(D)]
        seq = _OPENVINO_LAYERS[c.cell](ops, cur, states, lengths, lps, c, direction)
        y = seq.output(0)                                     # [N, D, T, H]
        for s in range(n_states):
            finals[s].append(seq.output(1 + s))               # [N, D, H]
        if layer < c.L - 1:
            yt = ops.transpose(y, ops.constant(np.array([0, 2, 1, 3], np.int64)))
            cur = ops.reshape(yt, ops.constant(np.array([N, T, D * H], np.int64)), False)
    outs = [y] + [f[0] if c.L == 1 else ops.concat(f, axis=1).output(0) for f in finals]
    return ov.Model(outs, params, f"cgru_bench_{c.cell}")


class OpenVinoFwd(System):
    """OpenVINO's CPU plugin with ``INFERENCE_PRECISION_HINT = f32`` (its default on AVX-512
    machines is bf16: ~2× faster, error ~3e-3 — not the same function) and
    ``INFERENCE_NUM_THREADS = n``, one stream, latency hint, threads not pinned."""
    key, kind, label, peer = "openvino_fwd", "fwd", \
        "OpenVINO GRU/LSTM/RNNSequence forward (f32)", "openvino"
    kinds = tuple(_OPENVINO_LAYERS)   # LSTMSequence has no projection
    dtypes = F32          # the CPU plugin computes in f32 at best
    CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 1,
              "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False}

    def __init__(self, p, n):
        import openvino as ov
        c = p.config
        model = _openvino_model(ov, p)
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
            rows = slice(layer * c.D, (layer + 1) * c.D)
            for s in (p.h0, p.c0):
                if s is not None:
                    self.feed.append(np.ascontiguousarray(s[rows].transpose(1, 0, 2)))
        self.config = c

    def call(self):
        return self.request.infer(self.feed)

    def outputs(self):
        if not self.precision_ok:
            raise RuntimeError(f"OpenVINO compiled with inference precision {self.precision}, "
                               f"not f32")
        res = self.call()
        c = self.config
        Y, Ho = np.asarray(res[0]), np.asarray(res[1])
        Co = np.asarray(res[2]).transpose(1, 0, 2) if len(res) > 2 else None
        return fwd_outputs(Y.transpose(2, 0, 1, 3).reshape(c.T, c.N, c.D * c.H),
                           Ho.transpose(1, 0, 2), Co)


# --- JAX ---------------------------------------------------------------------------------------
def _jax_gru(jax, w, H, P):
    """cuDNN's GRU: ``(gx bias, step)`` with the carry ``(h,)``."""
    jnp = jax.numpy
    b = jnp.concatenate([w["b_W"][:2 * H] + w["b_R"][:2 * H], w["b_W"][2 * H:]])
    R, bRn = w["R"], w["b_R"][2 * H:]

    def step(carry, g):
        (h,) = carry
        gh = h @ R.T                                          # [N, 3H]
        rz = jax.nn.sigmoid(g[:, :2 * H] + gh[:, :2 * H])
        r, z = rz[:, :H], rz[:, H:]
        n = jnp.tanh(g[:, 2 * H:] + r * (gh[:, 2 * H:] + bRn))
        h = n + z * (h - n)                                   # (1 − z)·n + z·h
        return (h,), h
    return b, step


def _jax_lstm(jax, w, H, P):
    """cuDNN's LSTM (gates i, f, g, o; with a projection ``h = (o·tanh c)·W_pᵀ``): carry
    ``(h, c)``."""
    jnp = jax.numpy
    R, Wp = w["R"], w.get("W_p")

    def step(carry, g):
        h, c = carry
        a = g + h @ R.T                                       # [N, 4H]
        i, f, o = (jax.nn.sigmoid(a[:, k * H:(k + 1) * H]) for k in (0, 1, 3))
        c = f * c + i * jnp.tanh(a[:, 2 * H:3 * H])
        h = o * jnp.tanh(c)
        if Wp is not None:
            h = h @ Wp.T
        return (h, c), h
    return w["b_W"] + w["b_R"], step


def _jax_rnn(act):
    def build(jax, w, H, P):
        """The vanilla RNN ``h = act(x·Wᵀ + h·Rᵀ + b_W + b_R)``: carry ``(h,)``."""
        f = jax.numpy.tanh if act == "tanh" else jax.nn.relu
        R = w["R"]

        def step(carry, g):
            h = f(g + carry[0] @ R.T)
            return (h,), h
        return w["b_W"] + w["b_R"], step
    return build


# cell kind -> (jax, weights, H, P) -> (bias of the input projection, step(carry, gx_t))
_JAX_DIRECTIONS = {"gru": _jax_gru, "lstm": _jax_lstm, "rnn_tanh": _jax_rnn("tanh"),
                   "rnn_relu": _jax_rnn("relu")}


def _jax_stack(jax, config):
    """``(y, finals) = stack(weights, x, states)``: the stack as ``lax.scan`` loops (one per
    layer-direction; the reverse direction scans with ``reverse=True``); ``states`` is
    ``(h0,)`` or an LSTM's ``(h0, c0)``, ``finals`` likewise (``[L·D, N, ·]`` each)."""
    jnp, lax = jax.numpy, jax.lax
    H, P, D, L = config.H, config.P, config.D, config.L
    cell = _JAX_DIRECTIONS[config.cell]

    def direction(w, xs, state0, reverse):
        b, step = cell(jax, w, H, P)
        gx = xs @ w["W"].T + b                                # [T, N, G·H]: all steps
        final, ys = lax.scan(step, state0, gx, reverse=reverse)
        return ys, final

    def stack(weights, x, states):
        inp, finals = x, [[] for _ in states]
        for layer in range(L):
            outs = []
            for d in range(D):
                i = layer * D + d
                y, final = direction(weights[i], inp, tuple(s[i] for s in states), d == 1)
                outs.append(y)
                for k, f in enumerate(final):
                    finals[k].append(f)
            inp = outs[0] if D == 1 else jnp.concatenate(outs, axis=-1)
        return inp, tuple(jnp.stack(f) for f in finals)

    return stack


JAX_CACHE_ENV = "CGRU_BENCH_JAX_CACHE"     # a directory for JAX's compilation cache


class JaxFb(System):
    """``jax.jit(jax.value_and_grad(loss, argnums=(weights, x, states), has_aux=True))`` with
    ``loss = Σ y·dy + Σ hy·dhy (+ Σ cy·dcy)`` (so its gradients are the fb's); float64 in x64
    mode.  JAX ignores thread limits: this class runs in a worker process pinned to ``n``
    cores (``bench.workers``); built in-process it uses every core it is allowed."""
    key, kind, label, peer = "jax_fb", "fb", "JAX jit(lax.scan) value_and_grad", "jax"
    kinds, projection = tuple(_JAX_DIRECTIONS), True
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
        stack = _jax_stack(jax, p.config)

        def loss(weights, x, states, dy, dstates):
            y, finals = stack(weights, x, states)
            total = jnp.vdot(y, dy)
            for f, df in zip(finals, dstates):
                total = total + jnp.vdot(f, df)
            return total, (y, finals)

        self.jax = jax
        self.fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
        weights = [{k: jnp.asarray(v) for k, v in lp.arrays().items()} for lp in p.net]
        lstm = p.c0 is not None
        states = (jnp.asarray(p.h0),) + ((jnp.asarray(p.c0),) if lstm else ())
        dstates = (jnp.asarray(p.dhy),) + ((jnp.asarray(p.dcy),) if lstm else ())
        self.args = (weights, jnp.asarray(p.x), states, jnp.asarray(p.dy), dstates)

    def call(self):
        return self.jax.block_until_ready(self.fn(*self.args))

    def outputs(self):
        (_, (y, finals)), (dw, dx, dstates) = self.call()
        lstm = len(finals) == 2
        return fb_outputs(y, finals[0], dx, dstates[0],
                          [{k: np.asarray(v) for k, v in g.items()} for g in dw],
                          cy=finals[1] if lstm else None, dc0=dstates[1] if lstm else None)


# --- the systems of a section -------------------------------------------------------------------
PEER_SYSTEMS = [CgruStreamFwd, TorchFwd, TorchFb, CgruTorchFb, OrtFwd, OpenVinoFwd, JaxFb,
                NumpyFb]
PEERS = {  # package -> modules that must import (checked in the process that runs the peer)
    "torch": ("torch",), "onnxruntime": ("onnx", "onnxruntime"), "openvino": ("openvino",),
    "jax": ("jax",),
}
BY_KEY = {s.key: s for s in [CgruFwd, CgruFb] + PEER_SYSTEMS}
# system key -> the name ``--skip`` leaves it out by (besides its key)
GROUPS = {"cgru_stream_fwd": "stream", "torch_fwd": "torch", "torch_fb": "torch",
          "cgru_torch_fb": "cgru_torch", "ort_fwd": "onnxruntime",
          "openvino_fwd": "openvino", "jax_fb": "jax", "numpy_fb": "numpy"}


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
    to leave out (``GROUPS``: ``torch``, ``cgru_torch``, ``stream``, ``numpy``, … and
    ``bound``); ``notes``: a list that receives why a peer is left out of this section."""
    dt, config = problem.dtype.name, problem.config
    systems = [CgruFwd(problem, n), CgruFb(problem, n)]
    for cls in PEER_SYSTEMS:
        if cls.key in skip or GROUPS.get(cls.key) in skip or \
                (cls.peer and cls.peer not in peers):
            continue
        if not cls.supports(config):
            why = cls.unsupported(config)
            if why and notes is not None:
                notes.append(why)
            continue
        dtypes = cls.dtypes if all_dtypes else (cls.timed_dtypes or cls.dtypes)
        if dt not in dtypes:
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
