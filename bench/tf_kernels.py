"""TensorFlow's CudnnRNN CPU kernels (``cgru.tf.load_kernels``) against cgru.tf's NumPy
functions: the first build's time and the per-call overhead of going through TensorFlow.

    python -m bench.tf_kernels [--build] [--repeats N]

``--build`` first times a cold build of the kernel library in a scratch cache directory (what a
user's first ``load_kernels()`` costs).  Then, for a GRU and an LSTM at a few sizes (float32,
one layer, unidirectional, variable lengths), the median wall time of one call of
``tf.raw_ops.CudnnRNNV3`` (eager, inputs already tensors) and of ``cgru.tf.cudnn_rnn_v3`` on
the same arrays, for an inference forward and for a training step (forward + the Backprop
op), and their difference: the overhead per call (TF's eager dispatch, the C ABI's calls into
Python, the reserve's record — copies, seal, byte comparisons — and the backprop's copy).  The
numbers are this machine's; nothing here is a test.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):       # ``python bench/tf_kernels.py``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

SHAPES = [(1, 1, 16, 16), (10, 8, 64, 64), (50, 32, 256, 256)]   # T, N, I, H


def cold_build_seconds():
    """Seconds of a cold build (a fresh cache directory; the TensorFlow import excluded)."""
    import tensorflow  # noqa: F401
    from cgru import tf_kernels
    with tempfile.TemporaryDirectory() as cache:
        os.environ["CGRU_CACHE_DIR"] = cache
        try:
            t0 = time.perf_counter()
            tf_kernels.library_path()
            return time.perf_counter() - t0
        finally:
            del os.environ["CGRU_CACHE_DIR"]


def median_us(fn, repeats):
    fn()
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(samples)


def problem(mode, T, N, I, H, seed=0):
    import cgru.tf as ctf
    rng = np.random.default_rng(seed)
    params = (rng.standard_normal(ctf.params_size(1, H, I, rnn_mode=mode)) * 0.1).astype(np.float32)
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    h = np.zeros((1, N, H), np.float32)
    c = np.zeros((1, N, H), np.float32) if mode == "lstm" else np.zeros((), np.float32)
    lengths = rng.integers(1, T + 1, N).astype(np.int32)
    return x, h, c, params, lengths


def timings(mode, shape, repeats):
    """``(numpy fwd, tf fwd, numpy step, tf step)`` in µs for one mode and shape."""
    import tensorflow as tf
    import cgru.tf as ctf
    x, h, c, params, lengths = problem(mode, *shape)
    tx, th, tc, tp, tl = (tf.constant(a) for a in (x, h, c, params, lengths))
    c_np = c if mode == "lstm" else None

    def np_forward():
        ctf.cudnn_rnn_v3(x, h, c_np, params, lengths, rnn_mode=mode, is_training=False)

    def tf_forward():
        tf.raw_ops.CudnnRNNV3(input=tx, input_h=th, input_c=tc, params=tp, sequence_lengths=tl,
                              rnn_mode=mode, is_training=False)

    def np_step():
        f = ctf.cudnn_rnn_v3(x, h, c_np, params, lengths, rnn_mode=mode)
        ctf.cudnn_rnn_backprop_v3(x, h, c_np, params, lengths, f.output, f.output_h, f.output_c,
                                  f.output, f.output_h, f.output_c if c_np is not None else None,
                                  f.reserve_space, rnn_mode=mode)

    def tf_step():
        y, hy, cy, reserve, host = tf.raw_ops.CudnnRNNV3(
            input=tx, input_h=th, input_c=tc, params=tp, sequence_lengths=tl, rnn_mode=mode)
        tf.raw_ops.CudnnRNNBackpropV3(
            input=tx, input_h=th, input_c=tc, params=tp, sequence_lengths=tl, output=y,
            output_h=hy, output_c=cy, output_backprop=y, output_h_backprop=hy,
            output_c_backprop=cy, reserve_space=reserve, host_reserved=host, rnn_mode=mode)

    n = max(5, repeats // (1 + shape[0] * shape[1] * shape[3] // 4096))
    return [median_us(f, n) for f in (np_forward, tf_forward, np_step, tf_step)]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.tf_kernels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="store_true", help="time a cold build first")
    parser.add_argument("--repeats", type=int, default=200, help="calls per median (small)")
    args = parser.parse_args(argv)
    if args.build:
        print(f"cold build of the kernel library: {cold_build_seconds():.1f} s")
    import cgru.tf as ctf
    ctf.load_kernels()
    print(f"{'mode':5} {'T, N, I, H':>17} | {'cgru.tf fwd':>11} {'TF op fwd':>10} "
          f"{'overhead':>9} | {'cgru.tf step':>12} {'TF ops step':>11} {'overhead':>9}   (µs)")
    for mode in ("gru", "lstm"):
        for shape in SHAPES:
            nf, tf_, ns, ts = timings(mode, shape, args.repeats)
            print(f"{mode:5} {str(shape):>17} | {nf:11.0f} {tf_:10.0f} {tf_ - nf:+9.0f} | "
                  f"{ns:12.0f} {ts:11.0f} {ts - ns:+9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
