"""``python -m cgru info | demo | bench``, and ``python -m cgru --cflags --libs`` (C ABI)."""
import argparse
import platform
import sys
import time

import numpy as np

import cgru


def info():
    """Version, build, BLAS and threads."""
    from threadpoolctl import threadpool_info
    from cgru._threads import blas_control, resolve_num_threads
    print(f"cgru {cgru.__version__}  (python {platform.python_version()}, numpy {np.__version__})")
    how, path, now = blas_control()
    print(f"threads: cgru's own pool (fork-safe); BLAS held at one thread inside cgru's calls "
          f"{'directly (OpenBLAS)' if how == 'openblas' else 'through threadpoolctl (best effort)'}")
    print(f"threads used by default: {resolve_num_threads(None)}")
    from cgru._kernels import simd_isa
    print(f"time-loop kernels: {simd_isa()} (packed-weight GEMM, vectorised sigmoid/tanh)")
    import scipy.linalg.cython_blas  # noqa: F401  (load SciPy's BLAS so threadpoolctl sees it)
    for lib in threadpool_info():
        print(f"{lib['user_api']:>7}: {lib['internal_api']} {lib.get('version') or ''} "
              f"({lib.get('architecture') or '?'}), {lib['num_threads']} threads — "
              f"{lib['filepath']}")
    return 0


def _fd_check(params, x, h0, lengths, eps=1e-6):
    """Largest relative error of every backward gradient vs central differences (float64)."""
    rng = np.random.default_rng(1)
    f = cgru.forward(params, x, h0, lengths=lengths, training=True)
    dy = rng.standard_normal(f.y.shape)
    dhy = rng.standard_normal(f.hy.shape)
    g = cgru.backward(params, x, f.reserve, dy, dhy)

    def loss():
        r = cgru.forward(params, x, h0, lengths=lengths)
        return float((r.y * dy).sum() + (r.hy * dhy).sum())

    def fd(arr):
        out = np.empty_like(arr)
        flat, gflat = arr.reshape(-1), out.reshape(-1)
        for k in range(flat.size):
            v = flat[k]
            flat[k] = v + eps
            lp = loss()
            flat[k] = v - eps
            lm = loss()
            flat[k] = v
            gflat[k] = (lp - lm) / (2 * eps)
        return out

    worst = {}
    pairs = [("dx", x, g.dx), ("dh0", h0, g.dh0)]
    for i, (lp, glp) in enumerate(zip(params, g.dparams)):
        for name in ("W", "R", "b_W", "b_R"):
            pairs.append((f"d{name}[{i}]", getattr(lp, name), getattr(glp, name)))
    for name, arr, grad in pairs:
        num = fd(arr)
        worst[name] = float(np.abs(grad - num).max() / max(np.abs(num).max(), 1e-30))
    return worst


def demo():
    """A real 2-layer bidirectional GRU: forward, backward, checks, timings."""
    rng = np.random.default_rng(0)
    print("cgru demo: 2-layer bidirectional GRU (cuDNN/PyTorch cell), variable lengths\n")
    # 1. gradients against float64 central finite differences, on a small problem
    T, N, I, H = 5, 3, 3, 4
    topo = cgru.Topology(I, H, num_layers=2, direction="bidirectional")
    params = cgru.Params.random(topo, np.float64, seed=1)
    x = rng.standard_normal((T, N, I))
    h0 = rng.standard_normal((topo.num_layer_directions, N, H))
    lengths = np.array([5, 2, 4])
    t0 = time.perf_counter()
    worst = _fd_check(params, x, h0, lengths)
    name = max(worst, key=worst.get)
    print(f"[1] float64 T={T} N={N} I={I} H={H} lengths={lengths.tolist()}: every gradient "
          f"vs central finite differences ({len(worst)} arrays, "
          f"{time.perf_counter() - t0:.2f} s)")
    print(f"    largest relative error {worst[name]:.2e} ({name})")
    ok = worst[name] < 1e-7

    # 2. a realistic size in float32, timed
    T, N, I, H = 100, 32, 256, 256
    topo = cgru.Topology(I, H, num_layers=2, direction="bidirectional")
    params = cgru.Params.random(topo, np.float32, seed=2)
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    lengths = rng.integers(1, T + 1, N)
    f = cgru.forward(params, x, lengths=lengths, training=True)  # warm-up
    t0 = time.perf_counter()
    f = cgru.forward(params, x, lengths=lengths, training=True)
    t1 = time.perf_counter()
    dy = rng.standard_normal(f.y.shape).astype(np.float32)
    g = cgru.backward(params, x, f.reserve, dy)
    t2 = time.perf_counter()
    pad = np.arange(T)[:, None] >= lengths[None, :]
    ok &= bool(np.all(f.y[pad] == 0)) and bool(np.isfinite(g.dx).all())
    print(f"\n[2] float32 T={T} N={N} I={I} H={H}, lengths {lengths.min()}…{lengths.max()}:")
    print(f"    x {list(x.shape)} -> y {list(f.y.shape)}, hy {list(f.hy.shape)}, reserve "
          f"{f.reserve.nbytes / 2**20:.1f} MiB")
    print(f"    dx {list(g.dx.shape)}, dh0 {list(g.dh0.shape)}, "
          f"{sum(a.size for lp in g.dparams for a in lp.arrays().values())} weight gradients")
    print(f"    forward (training) {1e3 * (t1 - t0):.1f} ms, backward {1e3 * (t2 - t1):.1f} ms, "
          f"{cgru._threads.resolve_num_threads(None)} threads")
    print("\nOK" if ok else "\nFAILED")
    return 0 if ok else 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the bench parses its own options (and its own --help)
        from cgru._bench import main as bench_main
        return bench_main(argv[1:])
    if argv and argv[0] in ("--cflags", "--libs"):
        from cgru._capi_info import main as flags_main
        return flags_main(argv)
    parser = argparse.ArgumentParser(prog="python -m cgru", description=__doc__)
    parser.add_argument("command", choices=["info", "demo", "bench"],
                        help="info: build, BLAS, threads; demo: the main job; bench: speed "
                             "(python -m cgru bench --help)")
    args = parser.parse_args(argv)
    return {"info": info, "demo": demo}[args.command]()


if __name__ == "__main__":
    sys.exit(main())
