"""cgru's threads are the compiler's OpenMP runtime's: visible to threadpoolctl, limited by it,
shared fairly between concurrent calls, and quiet once a call has returned.

1. ``threadpoolctl.threadpool_info()`` lists the OpenMP library cgru's kernels run on, and
   ``threadpool_limits(1)`` makes cgru's default-width calls single-threaded (no team is made)
   with bitwise the same results.
2. Eight Python threads calling at once, each asking for two threads, never have more threads
   inside cgru than the callers plus the spare cores (shown by a rendezvous inside the time
   loops and the kernels' busy counter, not by timing).
3. After a call returns, the process burns no CPU: the CPU time (not wall time) an idle
   process uses while it sleeps, measured in a fresh process, is a small fraction of the
   sleep — an OpenMP runtime left spinning (``OMP_WAIT_POLICY=active``) uses all of it.
"""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import cgru
from cgru._kernels import loops, threads
from conftest import find_libomp, preload as _preload

threadpoolctl = pytest.importorskip("threadpoolctl")

pytestmark = pytest.mark.skipif(not threads.openmp_enabled(),
                                reason="cgru was built without OpenMP (serial)")


def _cores():
    return len(os.sched_getaffinity(0))


def _one_loop_problem(seed=1):
    """A layer with one time loop (one direction, batch 1) wide enough for a thread team."""
    net = cgru.Network.random(cgru.Topology(8, 256), np.float32, seed=seed)
    x = np.random.default_rng(seed).standard_normal((12, 1, 8)).astype(np.float32)
    return net, x


def _teams():
    return threads._counters()["teams"]


# --- threadpoolctl ----------------------------------------------------------------------------
def test_threadpool_info_lists_cgrus_openmp_runtime():
    path = threads.parallel_info()["path"]
    assert path, threads.parallel_info()
    openmp = [lib for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "openmp"]
    assert any(os.path.samefile(lib["filepath"], path) for lib in openmp), (path, openmp)


@pytest.mark.skipif(_cores() < 2, reason="needs two usable cores for a team")
def test_threadpool_limits_one_makes_cgru_single_threaded_with_the_same_bits():
    net, x = _one_loop_problem()
    # the calling thread's OpenMP count is process state other code may have set (a library
    # sharing the runtime, torch.set_num_threads): set it to the cores for the wide call
    with threadpoolctl.threadpool_limits(_cores(), user_api="openmp"):
        before = _teams()
        wide = cgru.forward(net, x)                  # default width: a team
        assert _teams() > before, "the default-width call made no team: the test proves nothing"
    with threadpoolctl.threadpool_limits(1):
        assert threads.resolve_num_threads(None) == 1
        before = _teams()
        limited = cgru.forward(net, x)
        assert _teams() == before, "a team ran under threadpool_limits(1)"
    np.testing.assert_array_equal(limited.y, wide.y)
    np.testing.assert_array_equal(limited.hy, wide.hy)


@pytest.mark.skipif(_cores() < 2, reason="needs two usable cores for a team")
def test_under_llvm_libomp_threadpoolctl_sees_and_limits_cgru():
    """The same two promises with LLVM's libomp serving the kernels' OpenMP calls (preloaded,
    in a fresh process): threadpool_info lists it as the runtime cgru uses, and
    threadpool_limits(1) makes cgru single-threaded with the same bits."""
    LIBOMP = find_libomp()
    if LIBOMP is None:
        pytest.skip("LLVM's libomp is not installed (Debian: libomp-dev)")
    code = textwrap.dedent("""
        import os, numpy as np, threadpoolctl, cgru
        from cgru._kernels import threads
        info = threads.parallel_info()
        assert info["runtime"] == "libomp" and not info["serial"], info
        libs = [l for l in threadpoolctl.threadpool_info() if l["user_api"] == "openmp"]
        assert any(os.path.samefile(l["filepath"], info["path"]) for l in libs), libs
        net = cgru.Network.random(cgru.Topology(8, 256), np.float32, seed=1)
        x = np.random.default_rng(1).standard_normal((12, 1, 8)).astype(np.float32)
        teams = lambda: threads._counters()["teams"]
        with threadpoolctl.threadpool_limits(2, user_api="openmp"):
            before = teams()
            wide = cgru.forward(net, x)
            assert teams() > before, "no team at the default width"
        with threadpoolctl.threadpool_limits(1):
            before = teams()
            limited = cgru.forward(net, x)
            assert teams() == before, "a team ran under threadpool_limits(1)"
        assert np.array_equal(limited.y, wide.y) and np.array_equal(limited.hy, wide.hy)
        print("OK")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, LD_PRELOAD=_preload(LIBOMP)))
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stdout + res.stderr


# --- concurrent calls share the cores ----------------------------------------------------------
@pytest.mark.skipif(_cores() < 2, reason="needs two usable cores for a team")
def test_eight_concurrent_calls_do_not_oversubscribe_the_cores():
    """Eight threads each call with num_threads=2 and meet inside their time loops (step 3), so
    all eight calls are inside cgru at once: the threads in cgru's regions then number at most
    the eight callers plus the spare cores (each call's team takes only the cores the others
    leave), not the sixteen asked for.  Every call gets its one-thread bits."""
    callers = 8
    problems = [_one_loop_problem(seed) for seed in range(callers)]
    want = [cgru.forward(net, x, num_threads=1).y for net, x in problems]
    got, errors = [None] * callers, []
    threads._reset_busy_peak()
    loops.set_probe(3, action=2, needed=callers, timeout=30.0)

    def call(k):
        try:
            net, x = problems[k]
            got[k] = cgru.forward(net, x, num_threads=2).y
        except Exception as e:                    # reported in the main thread
            errors.append(e)
    try:
        workers = [threading.Thread(target=call, args=(k,)) for k in range(callers)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        state = loops.probe_state()
    finally:
        loops.set_probe(-1)
    assert not errors, errors
    assert not state["timed_out"] and state["arrived"] >= callers, state
    peak = threads._counters()["busy_peak"]
    assert callers <= peak <= callers + _cores() - 1, (peak, _cores())
    for k in range(callers):
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"caller {k}")


# --- no spinning after a call ------------------------------------------------------------------
IDLE_PROBE = textwrap.dedent("""
    import resource, time
    import numpy as np
    import cgru

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    one = cgru.Network.random(cgru.Topology(8, 256), np.float32, seed=1)   # a thread team
    many = cgru.Network.random(cgru.Topology(8, 32, 1, "bidirectional"), np.float32, seed=2)
    x1 = np.ones((20, 1, 8), np.float32)
    xn = np.ones((20, 64, 8), np.float32)                  # work items, GEMM blocks
    for _ in range(3):
        cgru.forward(one, x1, num_threads=2)
        f = cgru.forward(many, xn, num_threads=2, training=True)
        cgru.backward(many, xn, f.reserve, np.ones_like(f.y), num_threads=2)
    start = cpu()
    time.sleep(SLEEP)
    print(cpu() - start)
""")


def _idle_cpu_seconds(sleep, **env):
    """CPU seconds a fresh process uses while it sleeps ``sleep`` s after cgru's calls, with
    the runtime's wait settings left at their defaults unless ``env`` gives them."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
    code = IDLE_PROBE.replace("SLEEP", repr(sleep))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(base, **env))
    assert res.returncode == 0, res.stderr
    return float(res.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(_cores() < 2, reason="needs two usable cores for a team")
def test_no_cpu_is_used_while_idle_after_a_call():
    """CPU time of the whole process over a 0.5 s sleep after teamed, work-item and GEMM-block
    calls: under a tenth of the sleep.  One thread left spinning would use the whole sleep on
    a quiet machine (checked with OMP_WAIT_POLICY=active), and still far more than the bound
    on a loaded one."""
    sleep = 0.5
    used = _idle_cpu_seconds(sleep)
    assert used < sleep / 10, f"{used:.3f} s of CPU while idle for {sleep} s"


# --- a team's threads never enter Python ------------------------------------------------------
def _thread_state_id():
    """CPython's id of a new thread state (``PyThreadState_GetID``: the interpreter numbers
    every thread state it ever makes, 1, 2, 3, …): the id a thread started now gets."""
    import ctypes
    get_id = ctypes.pythonapi.PyThreadState_GetID
    get_id.restype, get_id.argtypes = ctypes.c_uint64, [ctypes.c_void_p]
    current = ctypes.pythonapi.PyThreadState_Get
    current.restype = ctypes.c_void_p
    out = []
    t = threading.Thread(target=lambda: out.append(get_id(current())))
    t.start()
    t.join()
    return out[0]


def _wide_calls():
    """A forward and backward of each cell kind, wide enough for teams in the time loops and
    in the whole-sequence products, whose sub-chunks poll for signals."""
    for cell in (cgru.GRUCell(), cgru.LSTMCell(), cgru.RNNCell()):
        net = cgru.Network.random(cgru.Topology(192, 256), np.float32, seed=2, cell=cell)
        x = np.random.default_rng(3).standard_normal((48, 32, 192)).astype(np.float32)
        f = cgru.forward(net, x, training=True, num_threads=2)
        cgru.backward(net, x, f.reserve, np.ones_like(f.y), num_threads=2)


@pytest.mark.skipif(_cores() < 2, reason="needs two usable cores for a team")
@pytest.mark.parametrize("caller", ["main", "thread"])
def test_a_calls_team_threads_never_make_python_thread_states(caller):
    """Only the calling thread of a call ever runs Python (the signal handlers, main-thread
    calls only).  A team thread that took the GIL would get a thread state made and deleted
    for it each time — under a lock of the interpreter taken without the GIL, which a fork()
    at that moment leaves locked in the child: CPython 3.11 then hangs in the child's
    re-initialisation.  Counted with CPython's own thread-state numbering: across the calls,
    the ids advance by the threads this test starts and no more."""
    _wide_calls()                                    # imports, first-call set-up
    before_teams = _teams()
    first = _thread_state_id()
    if caller == "main":
        _wide_calls()
        started = 1                                  # the probe thread of `first`
    else:
        t = threading.Thread(target=_wide_calls)
        t.start()
        t.join()
        started = 2                                  # … and the calling thread
    assert _teams() > before_teams, "no team ran: the test proves nothing"
    made = _thread_state_id() - first - started
    assert made == 0, f"{made} Python thread states were made for the calls' team threads"
