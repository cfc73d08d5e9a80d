"""The command line: ``python -m cgru info | demo | bench``, ``--version``, ``--cflags``/``--libs``
(the C ABI) and ``--tf-kernels`` (TensorFlow's CudnnRNN CPU kernels).  ``python -m cgru -h``
and each command's ``-h`` print the help below, as plain text for a terminal."""
import argparse
import os
import platform
import sys
import time

import numpy as np

import cgru


def info():
    """Version, build, BLAS and threads."""
    from threadpoolctl import threadpool_info
    from cgru._kernels.loops import simd_isa
    from cgru._kernels.threads import blas_control, parallel_info, resolve_num_threads
    print(f"cgru {cgru.__version__}  (python {platform.python_version()}, numpy {np.__version__})")
    how, path, _ = blas_control()
    par = parallel_info()
    runtime = f"OpenMP ({par['runtime']}, fork-safe)" if par["openmp"] else \
        "serial (built without OpenMP)"
    print(f"threads: {runtime}, {resolve_num_threads(None)} used by default; "
          f"BLAS held at one thread inside cgru's GEMM blocks "
          f"{'directly (OpenBLAS)' if how == 'openblas' else 'through threadpoolctl (best effort)'}")
    print(f"time-loop kernels: {simd_isa()} (packed-weight GEMM, vectorised sigmoid/tanh)")
    import scipy.linalg.cython_blas  # noqa: F401  (load SciPy's BLAS so threadpoolctl sees it)
    for lib in threadpool_info():
        real = os.path.realpath(lib["filepath"])
        mark = "  <- cgru's BLAS" if path and real == os.path.realpath(path) else \
            "  <- cgru's threads" if par["path"] and real == os.path.realpath(par["path"]) else ""
        print(f"{lib['user_api']:>7}: {lib['internal_api']} {lib.get('version') or ''} "
              f"({lib.get('architecture') or '?'}), {lib['num_threads']} threads — "
              f"{lib['filepath']}{mark}")
    return 0


def demo():
    """Real recurrent stacks: every gradient against finite differences (a 2-layer
    bidirectional GRU, a cuDNN LSTM with a recurrent projection, a ReLU RNN), then a
    realistic GRU forward and backward, timed."""
    from cgru.core import gradcheck
    rng = np.random.default_rng(0)
    print("cgru demo: cuDNN's GRU, LSTM (with projection) and RNN, variable lengths\n")
    # 1. gradients against float64 central finite differences, on small problems
    T, N, I, H = 5, 3, 3, 4
    lengths = np.array([5, 2, 4])
    ok = True
    cases = [("2-layer bidirectional GRU", cgru.GRUCell(), dict(num_layers=2,
                                                                 direction="bidirectional")),
             ("2-layer LSTM, projection 3", cgru.LSTMCell(), dict(num_layers=2, proj_size=3)),
             ("reverse ReLU RNN", cgru.RNNCell("relu"), dict(direction="reverse"))]
    print(f"[1] float64 T={T} N={N} I={I} H={H} lengths={lengths.tolist()}: every gradient vs "
          f"central finite differences")
    for k, (label, cell, kw) in enumerate(cases):
        topo = cgru.Topology(I, H, **kw)
        net = cgru.Network.random(topo, np.float64, seed=1 + k, cell=cell)
        x = rng.standard_normal((T, N, I))
        h0 = rng.standard_normal((topo.num_layer_directions, N, topo.state_size))
        c0 = rng.standard_normal((topo.num_layer_directions, N, H)) \
            if cell.kind == "lstm" else None
        t0 = time.perf_counter()
        worst = gradcheck.backward_errors(net, x, h0, c0=c0, lengths=lengths)
        name = max(worst, key=worst.get)
        print(f"    {label:28s} {len(worst):2d} arrays, largest relative error "
              f"{worst[name]:.2e} ({name}), {time.perf_counter() - t0:.2f} s")
        ok &= worst[name] < 1e-7

    # 2. a realistic size in float32, timed
    T, N, I, H = 100, 32, 256, 256
    topo = cgru.Topology(I, H, num_layers=2, direction="bidirectional")
    net = cgru.Network.random(topo, np.float32, seed=2, cell=cgru.GRUCell())
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    lengths = rng.integers(1, T + 1, N)
    f = cgru.forward(net, x, lengths=lengths, training=True)  # warm-up
    t0 = time.perf_counter()
    f = cgru.forward(net, x, lengths=lengths, training=True)
    t1 = time.perf_counter()
    dy = rng.standard_normal(f.y.shape).astype(np.float32)
    g = cgru.backward(net, x, f.reserve, dy)
    t2 = time.perf_counter()
    pad = np.arange(T)[:, None] >= lengths[None, :]
    ok &= bool(np.all(f.y[pad] == 0)) and bool(np.isfinite(g.dx).all())
    from cgru._kernels.threads import resolve_num_threads
    print(f"\n[2] float32 2-layer bidirectional GRU, T={T} N={N} I={I} H={H}, lengths "
          f"{lengths.min()}…{lengths.max()}:")
    print(f"    x {list(x.shape)} -> y {list(f.y.shape)}, hy {list(f.hy.shape)}, reserve "
          f"{f.reserve.nbytes / 2**20:.1f} MiB")
    print(f"    dx {list(g.dx.shape)}, dh0 {list(g.dh0.shape)}, "
          f"{sum(a.size for lp in g.dparams for a in lp.arrays().values())} weight gradients")
    print(f"    forward (training) {1e3 * (t1 - t0):.1f} ms, backward {1e3 * (t2 - t1):.1f} ms, "
          f"{resolve_num_threads(None)} threads")
    print("\nOK" if ok else "\nFAILED")
    return 0 if ok else 1


def bench(argv):
    """The benchmark lives in the repository's ``bench/`` package (not in the installed
    wheel): run it from a source checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isfile(os.path.join(root, "bench", "__main__.py")):
        print("python -m cgru bench: the benchmark is part of the source repository "
              "(bench/); run it from a checkout of cgru", file=sys.stderr)
        return 2
    if root not in sys.path:
        sys.path.insert(0, root)
    from bench.__main__ import main as bench_main
    return bench_main(argv)


def tf_kernels():
    """Print the path of the TensorFlow kernel library (``cgru.tf_kernels``), building it first
    if the cache does not hold it: for TF's C API (``TF_LoadLibrary``) or TF Serving."""
    from cgru.tf_kernels import BuildError, library_path
    try:
        print(library_path())
    except (BuildError, ImportError) as e:
        print(f"python -m cgru --tf-kernels: {e}", file=sys.stderr)
        return 1
    return 0


DESCRIPTION = """\
cgru: exact CPU recurrent operators (cuDNN's GRU, LSTM and RNN, as TensorFlow, PyTorch,
ONNX, MPSGraph and Arraymancer define them), forward and backward."""

EPILOG = """\
without a command:
  --cflags, --libs  the compiler and linker flags of the C ABI (libcgru, cgru.h), on one
                    line: cc host.c $(python -m cgru --cflags --libs)
  --tf-kernels      the path of TensorFlow's CudnnRNN CPU kernels (built first if needed),
                    for TF_LoadLibrary or TF Serving"""

COMMANDS = {   # name: (one line for the list of commands, the command's own description)
    "info": ("the version, the build, the BLAS and the threads in use",
             "Print cgru's version, its build (the SIMD kernels), the BLAS it calls and the "
             "thread counts."),
    "demo": ("every gradient against finite differences, then a GRU timed",
             "Check every gradient of a 2-layer bidirectional GRU, an LSTM with a recurrent "
             "projection and a ReLU RNN against float64 central finite differences, then time "
             "a realistic float32 GRU forward and backward.  Prints OK (exit 0) or FAILED "
             "(exit 1)."),
    "bench": ("time cgru against its peers (its own options: python -m cgru bench -h)", None),
}


def make_parser():
    """The parser of ``python -m cgru``.  ``bench`` (which parses its own options),
    ``--cflags``/``--libs`` and ``--tf-kernels`` are dispatched before it; it lists them."""
    parser = argparse.ArgumentParser(
        prog="python -m cgru", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="python -m cgru [-h] [--version] {info,demo,bench} ...\n"
              "       python -m cgru --cflags --libs | --tf-kernels")
    parser.add_argument("--version", action="version", version=f"cgru {cgru.__version__}")
    commands = parser.add_subparsers(dest="command", title="commands",
                                     metavar="{info,demo,bench}", required=True)
    for name, (line, text) in COMMANDS.items():
        commands.add_parser(name, prog=f"python -m cgru {name}", help=line, description=text,
                            add_help=text is not None)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the bench parses its own options (and its own --help)
        return bench(argv[1:])
    if argv and argv[0] in ("--cflags", "--libs"):
        from cgru.capi.info import main as flags_main
        return flags_main(argv)
    if argv == ["--tf-kernels"]:
        return tf_kernels()
    args = make_parser().parse_args(argv)
    return {"info": info, "demo": demo}[args.command]()


if __name__ == "__main__":
    sys.exit(main())
