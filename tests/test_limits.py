"""Limits: sizes beyond 32-bit BLAS integers are refused up front; memory does not grow.

1. The kernels and BLAS take ``int`` sizes.  A call whose ``T·N`` (rows of every GEMM), ``3H``
   or input width exceeds ``2³¹ − 1`` raises a ``ValueError`` that names the size and the
   limit — before allocating anything proportional to the problem (tracemalloc), so it never
   wraps around and never exhausts memory first.  Tested without huge memory: zero-stride
   ``np.broadcast_to`` views in the core; for the frontends and for a public-API huge input
   width, read-only ``MAP_NORESERVE`` mappings (contiguous arrays of zero pages that cost
   nothing until written) in a child process whose ``RLIMIT_DATA`` turns any accidental
   problem-sized allocation into a ``MemoryError`` instead of a swap storm.
2. 10,000 small forward + backward calls (and a few thousand through the frontends and
   through refused calls) leave the process's resident set size and the Python/NumPy heap
   (tracemalloc) where they were after warm-up.
"""
import json
import os
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest

import cgru
from cgru import Cell, Network, Topology
from cgru.core import calls, engine

INT_MAX = 2 ** 31 - 1
# T·N just above the limit: 32769 · 65536 = 2³¹ + 2¹⁶.
BIG_T, BIG_N = 32769, 65536


def _peak_bytes(fn):
    """``(exception, peak traced bytes)`` of calling ``fn`` (which must raise)."""
    tracemalloc.start()
    try:
        fn()
    except Exception as e:                                    # noqa: BLE001 - returned
        err = e
    else:
        err = None
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return err, peak


@pytest.mark.parametrize("batch_major", [False, True], ids=["time_major", "batch_major"])
@pytest.mark.parametrize("fn", ["forward", "backward"])
def test_rows_beyond_int32_are_refused_before_allocating(fn, batch_major):
    topo = Topology(2, 3)
    params = Network.random(topo, np.float32)
    shape = (BIG_N, BIG_T, 2) if batch_major else (BIG_T, BIG_N, 2)
    x = np.broadcast_to(np.zeros((1, 1, 2), np.float32), shape)      # no memory
    if fn == "forward":
        call = lambda: cgru.forward(params, x, training=True)
    else:
        call = lambda: cgru.backward(params, x, np.zeros(64, np.uint8))
    err, peak = _peak_bytes(call)
    assert isinstance(err, ValueError), err
    msg = str(err)
    assert msg.startswith("x:") and "T·N" in msg, msg
    assert str(BIG_T * BIG_N) in msg and str(INT_MAX) in msg, msg
    assert peak < 1 << 20, f"{peak} bytes traced before the refusal"


def test_rows_at_int32_max_pass_the_check():
    """The boundary itself is allowed (2³¹ − 1 is prime: T = 1, N = 2³¹ − 1)."""
    topo = Topology(2, 3)
    x = np.broadcast_to(np.zeros((1, 1, 2), np.float32), (1, INT_MAX, 2))
    assert calls.check_x(x, topo, np.dtype(np.float32), False) == (1, INT_MAX)


@pytest.mark.parametrize("what,topo,width", [
    ("3H", Topology(2, 2 ** 30), 2),                        # 3H = 3·2³⁰ > 2³¹ − 1
    ("input_size", Topology(2 ** 31, 1), 2 ** 31),
])
def test_widths_beyond_int32_are_refused(what, topo, width):
    """Parameters this wide cannot be allocated in a test, so the check itself is called
    (forward and backward both start with it; the child-process test below goes through
    the public API for the input width)."""
    x = np.broadcast_to(np.zeros((1, 1, 1), np.float32), (2, 2, width))
    with pytest.raises(ValueError, match=f"^x: {what} = \\d+ exceeds the 32-bit BLAS limit"):
        calls.check_x(x, topo, np.dtype(np.float32), False)


# --- size queries: closed form, the same bounds as the calls --------------------------------------
_SIZE_CHILD = textwrap.dedent(r"""
    import json
    import numpy as np
    import cgru
    from cgru import tf
    out = {}
    def record(name, fn):
        try:
            out[name] = ["ok", str(fn())]
        except Exception as e:
            out[name] = [type(e).__name__, str(e)]
    record("params_size_2**70", lambda: tf.params_size(2 ** 70, 6, 5, rnn_mode="gru"))
    record("reserve_nbytes_1e6_layers", lambda: cgru.reserve_nbytes(
        cgru.Topology(4, 4, 10 ** 6, "bidirectional"), 5, 3))
    record("flat_size_int_max_layers", lambda: cgru.Topology(5, 6, 2 ** 31 - 1).flat_size())
    record("reserve_nbytes_rows", lambda: cgru.reserve_nbytes(cgru.Topology(2, 3), 32769, 65536))
    record("reserve_nbytes_3H", lambda: cgru.reserve_nbytes(cgru.Topology(2, 2 ** 30), 1, 1))
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def size_queries():
    """Every size query, in a child process with a timeout (a per-layer loop over 10⁶ or 2⁷⁰
    layers used to run for minutes or forever: that would fail here, not hang the suite)."""
    proc = subprocess.run([sys.executable, "-c", _SIZE_CHILD], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_size_queries_are_closed_form(size_queries):
    H, I, L = 4, 4, 10 ** 6
    kind, value = size_queries["reserve_nbytes_1e6_layers"]
    assert kind == "ok", value
    T, N, D = 5, 3, 2
    up = lambda n: -(-n // 64) * 64
    per_ld = up(T * N * 3 * H * 4) + up((T + 1) * N * H * 4) + up(T * N * H * 4)
    assert int(value) == up(128) + up(8 * N) + L * D * per_ld + (L - 1) * up(T * N * D * H * 4)
    kind, value = size_queries["flat_size_int_max_layers"]
    L, H, I = 2 ** 31 - 1, 6, 5
    assert kind == "ok" and int(value) == 3 * H * I + 3 * H * H * L + 3 * H * H * (L - 1) + 6 * H * L


def test_size_queries_apply_the_calls_bounds(size_queries):
    kind, msg = size_queries["params_size_2**70"]
    assert kind == "ValueError" and "2^62" in msg, (kind, msg)
    assert msg.startswith(f"num_layers={2 ** 70}, num_units=6, input_size=5: the params"), msg
    kind, msg = size_queries["reserve_nbytes_rows"]
    assert kind == "ValueError" and msg.startswith("reserve_nbytes: T·N") and str(INT_MAX) in msg
    kind, msg = size_queries["reserve_nbytes_3H"]
    assert kind == "ValueError" and msg.startswith("reserve_nbytes: 3H") and str(INT_MAX) in msg


_CHILD = textwrap.dedent(r"""
    import json, mmap, resource, sys, tracemalloc
    import numpy as np
    import cgru
    from cgru import Network, LayerParams, Topology, tf, mps, arraymancer as am
    from cgru import onnx as connx

    T, N = %(T)d, %(N)d

    def zeros(shape, dtype=np.float32):
        '''A read-only C-contiguous array of zero pages: no memory until written (never).'''
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        noreserve = getattr(mmap, "MAP_NORESERVE", 0x4000)   # Linux value; Python ≥ 3.13
        mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | noreserve,
                       prot=mmap.PROT_READ)
        return np.frombuffer(mm, dtype).reshape(shape)

    # Any allocation proportional to the problem (≥ 8 GiB) now fails with MemoryError.
    resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    f32 = np.float32
    small = lambda *s: np.zeros(s, f32)
    calls = {
        "tf.cudnn_rnn": lambda: tf.cudnn_rnn(zeros((T, N, 1)), small(1, N, 1), None,
                                             small(tf.params_size(1, 1, 1, rnn_mode="gru")),
                                             rnn_mode="gru", is_training=True),
        "tf.cudnn_rnn_v3": lambda: tf.cudnn_rnn_v3(zeros((N, T, 1)), small(N, 1, 1), None,
                                                   small(tf.params_size(1, 1, 1, rnn_mode="gru")),
                                                   rnn_mode="gru", time_major=False),
        "mps.gru": lambda: mps.gru(zeros((T, N, 1)), small(3, 1), small(3, 1),
                                   descriptor=mps.GRUDescriptor(training=True)),
        "mps.gru-projected": lambda: mps.gru(zeros((T, N, 3)), small(3, 1),
                                             descriptor=mps.GRUDescriptor()),
        "mps.gru-feature_mask": lambda: mps.gru(zeros((T, N, 1)), small(3, 1), small(3, 1),
                                                mask=small(1),
                                                descriptor=mps.GRUDescriptor()),
        "onnx.gru": lambda: connx.gru(zeros((T, N, 1)), small(1, 3, 1), small(1, 3, 1)),
        "arraymancer.gru": lambda: am.gru(zeros((T, N, 1)), small(1, N, 1), small(3, 1),
                                          small(0, 3, 1), small(1, 3, 1), small(1, 1, 3),
                                          small(1, 1, 3)),
        "arraymancer.gru_forward": lambda: am.gru_forward(
            zeros((T, N, 1)), small(1, N, 1), small(3, 1), small(0, 3, 1), small(1, 3, 1),
            small(1, 1, 3), small(1, 1, 3)),
        "cgru.forward-input_width": lambda: cgru.forward(
            Network(Topology(2 ** 31, 1), [LayerParams(zeros((3, 2 ** 31)), small(3, 1),
                                                      small(3), small(3))]),
            zeros((1, 1, 2 ** 31))),
    }
    for name, call in calls.items():
        tracemalloc.start()
        try:
            call()
            out = ("no error", "")
        except Exception as e:
            out = (type(e).__name__, str(e))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(json.dumps([name, out[0], out[1][:300], peak]), flush=True)
""")

@pytest.fixture(scope="module")
def child_results():
    if not sys.platform.startswith("linux"):
        pytest.skip("needs Linux (MAP_NORESERVE, RLIMIT_DATA counting private mappings)")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _CHILD % dict(T=BIG_T, N=BIG_N)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: (kind, msg, peak) for name, kind, msg, peak in
            map(json.loads, proc.stdout.splitlines())}


# The argument each refusal names first: the frontend's own name for its input.
_HUGE_INPUT_NAMES = {"tf.cudnn_rnn": "input", "tf.cudnn_rnn_v3": "input", "mps.gru": "source",
                     "mps.gru-projected": "source", "mps.gru-feature_mask": "source",
                     "onnx.gru": "X", "arraymancer.gru": "input",
                     "arraymancer.gru_forward": "input", "cgru.forward-input_width": "x"}


@pytest.mark.parametrize("name", list(_HUGE_INPUT_NAMES))
def test_huge_inputs_are_refused_before_allocating(child_results, name):
    kind, msg, peak = child_results[name]
    assert kind == "ValueError", (kind, msg)
    assert msg.startswith(_HUGE_INPUT_NAMES[name] + ":"), msg
    assert "exceeds the 32-bit BLAS limit" in msg and str(INT_MAX) in msg, msg
    assert peak < 16 << 20, f"{peak} bytes traced before the refusal"


# --- memory growth --------------------------------------------------------------------------------
def _rss_bytes():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _small_calls():
    """Small forward + backward calls covering the kernel paths (and one refused call)."""
    rng = np.random.default_rng(0)
    topo1, topo2 = Topology(3, 4), Topology(3, 4, 2, "bidirectional")
    cell2 = Cell(reset_after=False, g="softsign", clip=2.0)
    p1 = Network.random(topo1, np.float32)
    p2 = Network.random(topo2, np.float64, cell=cell2)
    x1, x2 = rng.standard_normal((5, 3, 3)).astype(np.float32), rng.standard_normal((5, 3, 3))
    dy1, dy2 = rng.standard_normal((5, 3, 4)).astype(np.float32), rng.standard_normal((5, 3, 8))
    m2 = rng.uniform(0, 1, (5, 3, 8))
    lengths = np.array([5, 2, 0])
    dp1 = Network.zeros(topo1, np.float32)

    def simple():
        f = cgru.forward(p1, x1, training=True, num_threads=1)
        cgru.backward(p1, x1, f.reserve, dy1, dparams=dp1, accumulate=True, num_threads=1)

    def general():
        f = cgru.forward(p2, x2, lengths=lengths, state_mask=m2, training=True, dropout=0.3,
                         num_threads=1)
        cgru.backward(p2, x2, f.reserve, dy2, f.hy, state_mask=m2, num_threads=1)

    def refused():
        try:
            cgru.forward(p1, x1, lengths=np.array([9, 9, 9]))
        except ValueError:
            return
        raise AssertionError("not refused")

    return simple, general, refused


def _frontend_calls():
    from cgru import arraymancer as am
    from cgru import mps, tf
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 2, 3))
    params = rng.standard_normal(tf.params_size(1, 2, 3, rnn_mode="gru"))
    h = np.zeros((1, 2, 2))
    layer = am.GRULayer.init(3, 2, 2, dtype=np.float64)
    desc = mps.GRUDescriptor(training=True, reset_after=True)
    RW, IW = rng.standard_normal((6, 2)), rng.standard_normal((6, 3))

    def call():
        f = tf.cudnn_rnn(x, h, None, params, rnn_mode="gru")
        tf.cudnn_rnn_backprop(x, h, None, params, f.output, f.output_h, None, f.output, None,
                              None, f.reserve_space, rnn_mode="gru")
        y, hy, cache = am.gru_forward(x, np.zeros((2, 2, 2)), layer.w3s0, layer.w3sN,
                                      layer.u3s, layer.bW3s, layer.bU3s)
        am.gru_backward(y, hy, cache)
        out, z = mps.gru(x, RW, IW, descriptor=desc)
        mps.gru_gradients(x, RW, out, z, out, input_weight=IW, descriptor=desc)

    return call


def test_ten_thousand_calls_do_not_grow_the_resident_set():
    simple, general, refused = _small_calls()
    frontends = _frontend_calls()
    loop = lambda n: [(simple(), general() if i % 8 == 0 else None,
                       refused() if i % 16 == 0 else None,
                       frontends() if i % 50 == 0 else None) for i in range(n)]
    loop(1000)                                              # warm-up: caches, pools, arenas
    before = _rss_bytes()
    loop(9000)
    grown = _rss_bytes() - before
    # A per-call leak of 256 bytes would add 2.3 MB; the kernels' scratch alone is larger.
    assert grown < 2 << 20, f"RSS grew by {grown / 2 ** 20:.1f} MiB over 9000 calls"


def test_calls_do_not_grow_the_python_heap():
    """Three windows of 300 calls each, after 130 to warm up.  The heap may settle in any one
    window — allocator free lists and dict tables grow once, the weights kept for a new owner
    replace the ones of an owner that died, and where that lands depends on when the garbage
    collector runs — but a leak grows it in every window: a per-call leak of 64 bytes adds
    19 KiB to each.  So the quietest window must stay under 16 KiB and the whole run under
    256 KiB."""
    simple, general, refused = _small_calls()
    frontends = _frontend_calls()

    def loop(n):
        for i in range(n):
            simple(), general(), refused()
            if i % 10 == 0:
                frontends()

    loop(100)
    tracemalloc.start()
    try:
        loop(30)
        snaps = [tracemalloc.take_snapshot()]
        for _ in range(3):
            loop(300)
            snaps.append(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()

    def grown(a, b):
        stats = b.compare_to(a, "lineno")
        top = [str(s) for s in sorted(stats, key=lambda s: -s.size_diff)[:5]]
        return sum(s.size_diff for s in stats), top
    windows = [grown(a, b) for a, b in zip(snaps, snaps[1:])]
    quietest, top = min(windows, key=lambda w: w[0])
    assert quietest < 16 << 10, f"Python/NumPy heap grew in every window of 300 calls, by " \
                                f"{[w[0] for w in windows]} bytes; the quietest: {top}"
    total, top = grown(snaps[0], snaps[-1])
    assert total < 256 << 10, f"Python/NumPy heap grew by {total} bytes over 900 calls: {top}"