"""Thread safety: the kernels release the GIL, concurrent calls do not disturb each other.

1. Several Python threads calling ``forward`` + ``backward`` at once on different data and
   options (dtypes, cells, masks, lengths, dropout, layers, thread counts) get bitwise the
   results of the same calls made one after the other.
2. Results do not depend on the calling thread: large calls (T·N ≥ 1024, where a
   multi-threaded BLAS would split the GEMMs) from 8 threads at once equal the main thread's
   bitwise, whatever BLAS thread count the process set; BLAS runs at one thread inside them.
3. The time loops run without the GIL, and two threads' calls run their loops at the same
   time: shown by rendezvous inside the loops (the kernels' test probe), not by timing.
4. The BLAS thread count cgru sets is process-global state: overlapping calls must leave it
   as they found it.
"""
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import cgru
from cgru import Cell, Network, Topology
from cgru.core import engine

threadpool_limits = pytest.importorskip("threadpoolctl").threadpool_limits


def _configs():
    """Small problems covering the kernel paths, each with its own data."""
    return [
        dict(topo=Topology(5, 4, 2, "bidirectional"), dtype=np.float64, cell=Cell(),
             lengths=[6, 2, 0, 5], mask=False, dropout=0.3, nt=1),
        dict(topo=Topology(3, 5, 1, "reverse"), dtype=np.float32,
             cell=Cell(reset_after=False, flip_z=True, g="softsign", clip=2.0),
             lengths=None, mask=True, dropout=0.0, nt=2),
        dict(topo=Topology(4, 4, 3, "forward", "skip"), dtype=np.float32,
             cell=Cell(), lengths=[1, 6, 3, 6], mask=False, dropout=0.5, nt=1),
        dict(topo=Topology(18, 3, 1, "bidirectional", "projected"), dtype=np.float64,
             cell=Cell(f_z="hard_sigmoid", g="relu"), lengths=None, mask=True, dropout=0.0,
             nt=2),
    ]


def _problem(cfg, seed, T=6, N=4):
    topo, dt = cfg["topo"], cfg["dtype"]
    rng = np.random.default_rng(seed)
    params = Network.random(topo, dt, seed=seed, cell=cfg["cell"])
    x = rng.standard_normal((T, N, topo.input_size)).astype(dt)
    h0 = rng.standard_normal((topo.num_layer_directions, N, topo.hidden_size)).astype(dt)
    mask = rng.uniform(0.2, 1.2, (T, N, topo.output_size)).astype(dt) if cfg["mask"] else None
    dy = rng.standard_normal((T, N, topo.output_size)).astype(dt)
    dhy = rng.standard_normal(h0.shape).astype(dt)
    lengths = None if cfg["lengths"] is None else np.array(cfg["lengths"])
    return params, x, h0, mask, dy, dhy, lengths


def _run(cfg, prob):
    params, x, h0, mask, dy, dhy, lengths = prob
    f = cgru.forward(params, x, h0, lengths=lengths, state_mask=mask,
                     training=True, dropout=cfg["dropout"], seed=(7, 8), num_threads=cfg["nt"])
    g = cgru.backward(params, x, f.reserve, dy, dhy, state_mask=mask,
                      num_threads=cfg["nt"])
    return [f.y, f.hy, f.reserve, g.dx, g.dh0, g.dparams.flat()]


def test_concurrent_calls_equal_serial_calls_bitwise():
    cfgs = _configs()
    jobs = [(cfg, _problem(cfg, seed=10 * k + r)) for k, cfg in enumerate(cfgs) for r in range(3)]
    want = [_run(cfg, prob) for cfg, prob in jobs]
    got = [None] * len(jobs)
    errors = []
    n_threads = 4
    barrier = threading.Barrier(n_threads)

    def worker(w):
        try:
            barrier.wait()
            for _ in range(3):                      # every job, three times, interleaved
                for j in range(w, len(jobs), n_threads):
                    out = _run(*jobs[j])
                    if got[j] is not None:
                        for a, b in zip(out, got[j]):
                            np.testing.assert_array_equal(a, b)
                    got[j] = out
        except Exception as e:                      # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for j, (g, w) in enumerate(zip(got, want)):
        for a, b in zip(g, w):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b, err_msg=f"job {j}")


# --- results do not depend on the calling thread -----------------------------------------------
def _big_problem(seed, dtype=np.float32):
    """T·N = 40·64 = 2560 rows, wide enough that a multi-threaded BLAS would split every
    whole-sequence GEMM (and change its last bits) if cgru did not hold it at one thread."""
    topo = Topology(16, 32, 2, "bidirectional")
    rng = np.random.default_rng(seed)
    params = Network.random(topo, dtype, seed=seed)
    x = rng.standard_normal((40, 64, 16)).astype(dtype)
    dy = rng.standard_normal((40, 64, topo.output_size)).astype(dtype)
    return params, x, dy


def _big_call(prob, nt=None):
    params, x, dy = prob
    f = cgru.forward(params, x, training=True, num_threads=nt)
    g = cgru.backward(params, x, f.reserve, dy, num_threads=nt)
    return [f.y, f.hy, g.dx, g.dh0, g.dparams.flat()]


@pytest.mark.parametrize("blas_threads", [None, 2, 8])
def test_results_do_not_depend_on_the_calling_thread(blas_threads):
    """The same large call from the main thread and from 8 Python threads at once gives
    bitwise the same results, whatever BLAS thread count the process has set (threadpoolctl's
    own limit applies only in the thread that set it; cgru holds BLAS at one thread itself)."""
    probs = [_big_problem(s) for s in range(2)]
    with threadpool_limits(limits=blas_threads, user_api="blas") if blas_threads else \
            _nothing():
        want = [_big_call(p) for p in probs]
        got, errors = {}, []

        def worker(k):
            try:
                got[k] = _big_call(probs[k % 2])
            except Exception as e:                  # reported in the main thread
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    for k, out in got.items():
        for a, b in zip(out, want[k % 2]):
            np.testing.assert_array_equal(a, b, err_msg=f"thread {k}")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_blas_is_single_threaded_inside_cgrus_blas_products_from_any_thread(monkeypatch):
    """Inside the products cgru runs on BLAS (``plan.gemm``'s BLAS route: what is not a weight
    gradient, as a reserve rebuilt from another system's gates), called from a thread that is
    not threadpoolctl's "controlling" thread, the BLAS runs at one thread (observed from
    inside each); and a call's forward and backward run no BLAS at all."""
    from cgru._kernels import blas as kblas, threads as kthreads
    from cgru.core import plan
    if kthreads.blas_control()[0] != "openblas":
        pytest.skip("cgru holds this BLAS through threadpoolctl (best effort)")
    seen = []
    real = kblas.gemm_blocks

    def spy(*args, **kw):
        seen.append(kthreads.blas_control()[2])
        return real(*args, **kw)
    monkeypatch.setattr(kblas, "gemm_blocks", spy)
    prob = _big_problem(0)
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((4096, 64)), rng.standard_normal((48, 4096))

    def products():
        for _ in range(2):
            plan.gemm(True, True, A, B, np.empty((64, 48)), nt=2)         # Aᵀ·Bᵀ, k split
            plan.gemm(False, True, A, B[:, :64], np.empty((4096, 48)), nt=2)
    with threadpool_limits(limits=2, user_api="blas"):
        t = threading.Thread(target=_big_call, args=(prob,))
        t.start()
        t.join()
        assert seen == []                     # the engine's GEMMs are cgru's own
        t = threading.Thread(target=products)
        t.start()
        t.join()
    assert len(seen) == 4 and set(seen) == {1}, seen


def test_blas_keeps_the_process_count_during_the_time_loops(rendezvous):
    """Outside cgru's GEMM blocks — during a time loop — other threads' BLAS keeps the count the
    process chose (it used to be held at one thread for the whole call)."""
    from cgru._kernels import threads as kthreads
    if kthreads.blas_control()[0] != "openblas":
        pytest.skip("cgru holds this BLAS through threadpoolctl (best effort)")
    params, x, _ = _big_problem(3)
    seen = []
    rendezvous.set_probe(5, action=2, needed=2, timeout=30.0)

    def other_thread():
        while rendezvous.probe_state()["arrived"] < 1:   # the loop is inside step 5
            time.sleep(0.001)
        seen.append(kthreads.blas_control()[2])
        rendezvous.probe_arrive()
    with threadpool_limits(limits=2, user_api="blas"):
        t = threading.Thread(target=other_thread, daemon=True)
        t.start()
        cgru.forward(params, x, num_threads=1)
        t.join(30)
    assert not rendezvous.probe_state()["timed_out"]
    assert seen == [2]


def test_a_count_set_by_another_thread_during_a_gemm_stands():
    """A BLAS thread count another thread sets while cgru's GEMM blocks run is not overwritten
    when they end (cgru restores its saved count only if the count is still its own 1)."""
    from cgru._kernels import threads as _threads
    if _threads.blas_control()[0] != "openblas":
        pytest.skip("cgru holds this BLAS through threadpoolctl (best effort)")
    with threadpool_limits(limits=2, user_api="blas"):
        window = _threads.blas_single_threaded()
        window.__enter__()
        assert _threads.blas_control()[2] == 1
        with threadpool_limits(limits=3, user_api="blas"):     # "another thread" sets 3
            window.__exit__(None, None, None)
            assert _threads.blas_control()[2] == 3


# --- GIL release and concurrency, by rendezvous ---------------------------------------------------
# The kernels' test probe (cgru._kernels.loops.set_probe(step, action=2, needed=k)) makes work
# item 0 of a time loop wait at a step until k parties have arrived there: other loops' item 0,
# or Python threads calling probe_arrive().  A party that cannot arrive makes the wait time out
# (a failure after a bounded time, never a hang) — no test here measures a duration.
@pytest.fixture
def rendezvous():
    from cgru._kernels import loops
    yield loops
    loops.set_probe(-1)


@pytest.mark.parametrize("fn", ["forward", "backward"])
def test_kernels_release_the_gil(rendezvous, fn):
    """While a time loop runs, a pure-Python thread can run: it arrives at the loop's
    rendezvous, which needs the GIL.  A loop holding the GIL would wait for it in vain."""
    params, x, dy = _big_problem(3)
    f = cgru.forward(params, x, training=True)
    rendezvous.set_probe(5, action=2, needed=2, timeout=30.0)

    def python_party():
        while rendezvous.probe_state()["arrived"] < 1:   # the loop is inside step 5
            time.sleep(0.001)
        rendezvous.probe_arrive()
    t = threading.Thread(target=python_party, daemon=True)
    t.start()
    if fn == "forward":
        cgru.forward(params, x, num_threads=1)
    else:
        cgru.backward(params, x, f.reserve, dy, num_threads=1)
    t.join(30)
    state = rendezvous.probe_state()
    assert not state["timed_out"], "the time loop waited for a Python thread that never ran"
    assert state["arrived"] >= 2


def test_two_calls_run_their_time_loops_at_the_same_time(rendezvous):
    """Two threads' calls are inside their time loops at once: each waits at step 5 for the
    other.  Calls serialised by the GIL or by a lock would time out."""
    probs = [_big_problem(3), _big_problem(4)]
    want = [_big_call(p, nt=1) for p in probs]
    rendezvous.set_probe(5, action=2, needed=2, timeout=30.0)
    got = [None, None]

    def call(k):
        params, x, _ = probs[k]
        got[k] = cgru.forward(params, x, num_threads=1).y
    threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = rendezvous.probe_state()
    assert not state["timed_out"], "one call's time loop ran alone: the calls were serialised"
    assert state["arrived"] >= 2
    for k in range(2):
        np.testing.assert_array_equal(got[k], want[k][0])


# --- process-global BLAS thread count -------------------------------------------------------
def test_overlapping_calls_restore_the_blas_thread_count():
    """The interleaving two threads produce when one call starts, a second starts, and the
    first one returns first: BLAS is at one thread while either is inside, and the count the
    process had is back afterwards."""
    from cgru._kernels import threads as _threads
    how, _, _ = _threads.blas_control()
    if how != "openblas":
        pytest.skip("cgru holds this BLAS through threadpoolctl (best effort)")
    with threadpool_limits(limits=3, user_api="blas"):
        before = _threads.blas_control()[2]
        a, b = _threads.blas_single_threaded(), _threads.blas_single_threaded()
        a.__enter__()
        inside_a = _threads.blas_control()[2]
        b.__enter__()
        a.__exit__(None, None, None)
        inside_b = _threads.blas_control()[2]
        b.__exit__(None, None, None)
        after = _threads.blas_control()[2]
    assert (before, inside_a, inside_b, after) == (3, 1, 1, 3)


def test_num_threads_beyond_the_usable_cores_is_capped():
    """A call asking for more threads than the process may use gets the usable cores (more
    would only take turns on them: team loops ran 2.5–6.5× slower), and no team is larger;
    ``None`` and negative counts are unchanged.  In a fresh process, so that the largest team
    is this call's doing."""
    code = textwrap.dedent("""
        import os, numpy as np, cgru
        from cgru._kernels import threads
        cores = len(os.sched_getaffinity(0))
        assert threads.resolve_num_threads(256) == cores
        assert threads.resolve_num_threads(cores) == cores
        assert threads.resolve_num_threads(1) == 1
        assert threads.resolve_num_threads(-1) == cores
        net = cgru.Network.random(cgru.Topology(16, 64), np.float32, seed=1)
        x = np.ones((50, 64, 16), np.float32)
        want = cgru.forward(net, x, num_threads=1).y
        got = cgru.forward(net, x, num_threads=256).y
        assert np.array_equal(got, want)
        assert threads._counters()["busy_peak"] <= cores, (threads._counters(), cores)
        print("OK")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "OK", res.stderr
