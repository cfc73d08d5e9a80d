"""Each GEMM of a training step timed alone, on the route cgru's engine gives it, at one thread:
its rate in GFLOP/s and as a fraction of the peak GEMM rate of the run — which products keep a
config from its FLOP limit.

The products of the first layer-direction of a config (docs/speed.md §1), in blocks of time as
the engine runs them (``plan.time_block``: the whole-sequence products take one block of
``Tb·N`` rows per call):

==========================  ==========================================  ======================
product                     shape (m, n, k)                             route
==========================  ==========================================  ======================
input projection x·Wᵀ       ``[Tb·N, G·H] = [Tb·N, I]·[I, G·H]``         kernels' packed GEMM
recurrent h·Rᵀ (a step)     ``[N, G·H] = [N, S]·[S, G·H]``               kernels' packed GEMM
recurrent dg·R (a step)     ``[N, S] = [N, G·H]·[G·H, S]``               kernels' packed GEMM
dW = dgᵀ·X                  ``[G·H, I] = [G·H, Tb·N]·[Tb·N, I]``         packed GEMM, dg read
                                                                        transposed, X packed
                                                                        (``plan.gemm``)
dR = dgᵀ·H                  ``[G·H, S] = [G·H, Tb·N]·[Tb·N, S]``         as dW
dX = dg·W                   ``[Tb·N, I] = [Tb·N, G·H]·[G·H, I]``         kernels' packed GEMM
==========================  ==========================================  ======================

With an LSTM's projection (``S = P``) also ``hf·W_pᵀ`` and ``dh·W_p`` per step and
``dW_p = dhᵀ·M``.  ``calls`` is how many of each a step makes (for the whole-sequence products,
in full blocks' worth of rows: ``T / Tb``); ``share`` each product's part of the step's GEMM
time at these rates.
"""
import time

import numpy as np

from cgru.core import plan
from cgru._kernels.loops import gemm_packed_rm, pack_rhs


def _time(fn, min_s=0.05, samples=5):
    """Median seconds of one ``fn()`` call: samples of as many calls as take ``min_s``."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, int(min_s / one))
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t0) / reps)
    return float(np.median(out))


def products(problem):
    """``[(name, (m, n, k), calls, fn)]``: the first layer-direction's products of one
    training step, each ``fn`` one call on its route at one thread."""
    c, dt = problem.config, problem.dtype
    rng = np.random.default_rng(2)
    T, N, H, S, GH = c.T, c.N, c.H, c.S, c.G * c.H
    width = c.layer_width(0)
    Tb = plan.time_block(T, N, plan.wgrad_size(problem.net.topology, c.G))
    rows, blocks = Tb * N, T / Tb       # blocks: full blocks' worth of rows (T·N in all)

    def u(*shape):
        return rng.uniform(-1, 1, shape).astype(dt)

    lp = problem.net[0, 0]
    W, R = np.ascontiguousarray(lp.W), np.ascontiguousarray(lp.R)
    X, dg, Hs = u(rows, width), u(rows, GH), u(rows, S)
    h, dgt = u(N, S), u(N, GH)
    gx, dX, gh, dh = (np.empty((rows, GH), dt), np.empty((rows, width), dt),
                      np.empty((N, GH), dt), np.empty((N, S), dt))
    dW, dR = np.empty((GH, width), dt), np.empty((GH, S), dt)
    pack = np.empty(plan.gemm_pack_size(rows, max(width, S, H), dt), dt)
    W_f, W_b, R_f, R_b = (pack_rhs(W, True), pack_rhs(W, False), pack_rhs(R, True),
                          pack_rhs(R, False))
    out = [
        ("input projection x·Wᵀ", (rows, GH, width), blocks,
         lambda: plan.gemm_packed(X, W_f, gx, nt=1)),
        ("recurrent h·Rᵀ (a step)", (N, GH, S), T,
         lambda: gemm_packed_rm(h, R_f, GH, gh, False)),
        ("recurrent dg·R (a step)", (N, S, GH), T,
         lambda: gemm_packed_rm(dgt, R_b, S, dh, False)),
        ("dW = dgᵀ·X", (GH, width, rows), blocks,
         lambda: plan.gemm(True, False, dg, X, dW, 0.0, 1, pack=pack)),
        ("dR = dgᵀ·H", (GH, S, rows), blocks,
         lambda: plan.gemm(True, False, dg, Hs, dR, 0.0, 1, pack=pack)),
        ("dX = dg·W", (rows, width, GH), blocks,
         lambda: plan.gemm_packed(dg, W_b, dX, nt=1)),
    ]
    if c.P:
        Wp = np.ascontiguousarray(lp.W_p)
        Wp_f, Wp_b = pack_rhs(Wp, True), pack_rhs(Wp, False)
        m, dhp, M, dhs = u(N, H), u(N, S), u(rows, H), u(rows, S)
        hp, dm, dWp = np.empty((N, S), dt), np.empty((N, H), dt), np.empty((S, H), dt)
        out[3:3] = [
            ("projection hf·W_pᵀ (a step)", (N, S, H), T,
             lambda: gemm_packed_rm(m, Wp_f, S, hp, False)),
            ("projection dh·W_p (a step)", (N, H, S), T,
             lambda: gemm_packed_rm(dhp, Wp_b, H, dm, False)),
            ("dW_p = dhᵀ·M", (S, H, rows), blocks,
             lambda: plan.gemm(True, False, dhs, M, dWp, 0.0, 1, pack=pack))]
    return out


def rates(problem, peak_gflops=None, min_s=0.05):
    """``[{name, m, n, k, calls, ms, gflops, of_peak, share}]`` of ``products(problem)``, timed
    at one thread; ``peak_gflops`` the run's 1-thread peak GEMM rate of the dtype (None: no
    ``of_peak``)."""
    from threadpoolctl import ThreadpoolController
    rows = []
    with ThreadpoolController().limit(limits=1):
        for name, (m, n, k), calls, fn in products(problem):
            s = _time(fn, min_s)
            gflops = 2.0 * m * n * k / s / 1e9
            rows.append(dict(name=name, m=m, n=n, k=k, calls=calls, ms=s * 1e3,
                             gflops=gflops,
                             of_peak=gflops / peak_gflops if peak_gflops else None))
    total = sum(r["ms"] * r["calls"] for r in rows)
    for r in rows:
        r["share"] = r["ms"] * r["calls"] / total if total else None
    return rows
