"""Forked children: a child process of a parent that has used cgru's threads works.

Fork is how ``multiprocessing`` (Linux default before Python 3.14), ``ProcessPoolExecutor``,
PyTorch's DataLoader workers, joblib and Dask start workers.  GNU libgomp's thread pool does
not survive a fork: a child whose forking thread had started an OpenMP team waits forever in
its next team.  cgru's fork handlers end the forking thread's pool before the fork (the child
then runs teams at full width) or, where that cannot be done, make the child run serially
(cgru/_kernels/parallel.h); LLVM's libomp re-initialises itself in a child.  Every scenario
runs twice where LLVM's libomp is installed: on the runtime cgru was built with, and with libomp
preloaded (LD_PRELOAD), which then serves the kernels' OpenMP calls (libomp implements libgomp's
entry points) — the way Intel and LLVM document swapping the runtime of a GCC-built program.

Each scenario runs in a separate Python process under a timeout, so that a regression fails
(with the scenario's output) instead of hanging the test run.  The child's results must be
bitwise the parent's; each scenario also says whether the child ran teams.
"""
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import PACKAGE_DIR, find_libomp, preload as _preload

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

TIMEOUT = 120     # seconds: only a hang gets anywhere near this

PRELUDE = textwrap.dedent("""
    import os, sys
    import numpy as np
    import cgru
    from cgru._kernels import threads

    def problem():
        topo = cgru.Topology(16, 64, 2, "bidirectional")
        net = cgru.Network.random(topo, np.float32, seed=1)
        x = np.random.default_rng(2).standard_normal((50, 32, 16)).astype(np.float32)
        return net, x

    def call(num_threads=2):
        net, x = problem()
        f = cgru.forward(net, x, training=True, num_threads=num_threads)
        g = cgru.backward(net, x, f.reserve, np.ones_like(f.y), num_threads=num_threads)
        return [f.y, f.hy, g.dx, g.dparams.flat()]

    def same(a, b):
        return all(np.array_equal(u, v) for u, v in zip(a, b))

    def teams():
        return threads._counters()["teams"]

    want = call()                           # the parent uses 2 threads: a live thread pool
    assert teams() >= 1, threads._counters()
    info = threads.parallel_info()
    # the runtimes whose children run teams (see parallel.h); others run serially
    CHILD_TEAMS = info["runtime"] in ("libgomp", "libomp")
""")


LIBOMP = find_libomp()
RUNTIMES = ["built", pytest.param("libomp", marks=pytest.mark.skipif(
    LIBOMP is None, reason="LLVM's libomp is not installed (Debian: libomp-dev)"))]


@pytest.fixture(params=RUNTIMES)
def run(request):
    """``run(body)``: the scenario on the runtime cgru was built with, or under libomp."""
    if request.param == "built":
        return _run
    env = dict(os.environ, LD_PRELOAD=_preload(LIBOMP))
    check = 'assert info["runtime"] == "libomp", info\n'
    return lambda body: _run(check + textwrap.dedent(body), env)


def _run(body, env=None):
    """Run PRELUDE + body in a fresh interpreter; it must print OK and exit 0 in time."""
    code = PRELUDE + textwrap.dedent(body)
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=TIMEOUT, cwd=PACKAGE_DIR, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the scenario hung (killed after {TIMEOUT} s); output so far:\n"
                    f"{e.stdout}\n{e.stderr}")
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), \
        f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"


def test_os_fork_child_computes_the_parents_bits(run):
    """A fork from the main thread, then one from a Python thread that has run teams (its own
    OpenMP pool) while the main thread has one too: each child, whose only thread is the
    forking one, computes the parent's bits, with teams where the runtime allows; the parent's
    threads go on with their teams."""
    run("""
        pid = os.fork()
        if pid == 0:
            before = teams()
            got = call()                           # teams again, on a fresh thread pool
            ran_teams = teams() > before
            ok = same(got, want) and ran_teams == CHILD_TEAMS and \
                threads.parallel_info()["serial"] == (not CHILD_TEAMS)
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        before = teams()
        assert same(call(), want)                  # the parent's teams still work
        assert teams() > before

        import threading
        codes = []

        def fork_here():
            call()                                 # this thread's own pool
            pid = os.fork()
            if pid == 0:
                before = teams()
                ok = same(call(), want) and (teams() > before) == CHILD_TEAMS
                os._exit(0 if ok else 3)
            codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
            codes.append(0 if same(call(), want) else 4)
        t = threading.Thread(target=fork_here)
        t.start()
        t.join()
        assert codes == [0, 0], codes
        assert same(call(), want)
        print("OK")
    """)


def test_children_and_grandchildren_of_forks_run_teams(run):
    """A child that ran teams forks again: the grandchild too computes the parent's bits (with
    teams where the runtime allows), three generations deep."""
    run("""
        def generation(depth):
            before = teams()
            if not same(call(), want) or (teams() > before) != CHILD_TEAMS:
                return 3
            if depth == 0:
                return 0
            pid = os.fork()
            if pid == 0:
                os._exit(generation(depth - 1))
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

        pid = os.fork()
        if pid == 0:
            os._exit(generation(2))
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        print("OK")
    """)


def test_a_child_whose_runtime_could_not_be_paused_runs_serially(run):
    """Where the forking thread's OpenMP pool cannot be ended before the fork (a fork inside
    an OpenMP region, a runtime without omp_pause_resource_all; forced here), the child marks
    itself serial: it never enters the runtime's stale pool, computes the parent's bits on one
    thread, and so do its own children.  The parent keeps its teams."""
    run("""
        if info["runtime"] != "libgomp":
            print("the pause is libgomp's: nothing to test, OK")
            sys.exit(0)
        threads._fork_pause(False)
        pid = os.fork()
        if pid == 0:
            before = teams()
            ok = same(call(), want) and teams() == before and threads.parallel_info()["serial"]
            ok = ok and not cgru.parallel_enabled() and cgru.openmp_enabled()
            pid2 = os.fork()                      # its child: serial as well
            if pid2 == 0:
                os._exit(0 if same(call(), want) and teams() == before else 4)
            ok = ok and os.waitstatus_to_exitcode(os.waitpid(pid2, 0)[1]) == 0
            os._exit(0 if ok else 3)
        threads._fork_pause(True)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        before = teams()
        assert same(call(), want) and teams() > before and cgru.parallel_enabled()
        print("OK")
    """)


def test_multiprocessing_fork_pool(run):
    run("""
        import multiprocessing as mp

        def work(nt):
            return call(nt)

        with mp.get_context("fork").Pool(2) as pool:
            results = pool.map(work, [2, 1, 2, None])
        assert all(same(r, want) for r in results)
        print("OK")
    """)


def test_process_pool_executor_with_fork(run):
    run("""
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        def work(nt):
            return call(nt)

        with ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as ex:
            results = list(ex.map(work, [2, 2, 1, None]))
        assert all(same(r, want) for r in results)
        print("OK")
    """)


def test_fork_while_another_thread_is_inside_a_call(run):
    """A thread of the parent is inside a parallel cgru call when another thread forks: the
    child (which has only the forking thread) still works."""
    run("""
        import threading
        stop = threading.Event()

        def busy():
            while not stop.is_set():
                call()
        t = threading.Thread(target=busy)
        t.start()
        pids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                os._exit(0 if same(call(), want) else 3)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
        stop.set()
        t.join()
        assert codes == [0, 0, 0], codes
        print("OK")
    """)


def test_a_child_forked_while_a_runner_is_busy_runs_the_general_way(run):
    """A thread of the parent is inside a call on the runner of repeated inference calls (held
    there by the test probe) when the main thread forks: in the child, where that call does not
    exist, the runner stays held, so the child's calls of that shape run the general way with
    the parent's bits (none waits for it); the parent's runner goes on once the call ends, and
    a child forked while it is free runs on its copy."""
    run("""
        import threading
        from cgru._kernels import loops
        from cgru.core import weights
        net = cgru.Network.random(cgru.Topology(16, 64), np.float32, seed=1).sealed()
        x = np.random.default_rng(3).standard_normal((8, 2, 16)).astype(np.float32)
        first = cgru.forward(net, x)[:2]               # the general way; the runner comes next
        assert same(cgru.forward(net, x)[:2], first)
        runner, = [p._runner for p in weights.freeze(net)._plans.values() if p._runner]
        runs = runner.runs
        loops.set_probe(3, action=2, needed=2, timeout=60.0)
        t = threading.Thread(target=cgru.forward, args=(net, x))
        t.start()
        while loops.probe_state()["arrived"] < 1:
            pass                                       # the thread waits inside the runner
        pid = os.fork()
        if pid == 0:
            loops.set_probe(-1)
            ok = runner.busy and same(cgru.forward(net, x)[:2], first) and runner.runs == runs
            os._exit(0 if ok else 3)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        loops.probe_arrive()
        t.join()
        loops.set_probe(-1)
        assert code == 0, code
        assert runner.runs == runs + 1 and not runner.busy
        pid = os.fork()
        if pid == 0:
            ok = same(cgru.forward(net, x)[:2], first) and runner.runs == runs + 2
            os._exit(0 if ok else 3)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        assert same(cgru.forward(net, x)[:2], first) and runner.runs == runs + 2
        print("OK")
    """)


def test_torch_dataloader_workers():
    """DataLoader workers (forked) computing with cgru, and a cgru.torch module trained in
    the parent between epochs: every worker's results are the parent's bits."""
    pytest.importorskip("torch")
    _run("""
        import torch
        import cgru.torch

        class Features(torch.utils.data.Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                r = call(2 if i % 2 else None)
                return torch.tensor(float(same(r, want)))

        loader = torch.utils.data.DataLoader(Features(), batch_size=2, num_workers=2,
                                             multiprocessing_context="fork")
        rnn = cgru.torch.GRU(16, 8, batch_first=True)
        for epoch in range(2):
            flags = torch.cat(list(loader))
            assert bool(flags.all()), flags
            rnn(torch.randn(3, 5, 16))[0].sum().backward()     # the parent keeps computing
        print("OK")
    """)


def test_a_child_forked_while_a_buffer_lock_is_held_does_not_hang(run):
    """Another thread of the parent may hold the lock of cgru's buffer pool or of its kept
    weights at the moment of the fork; the child gets fresh locks."""
    run("""
        from cgru.core import plan, weights
        with plan._pool_lock, weights._lock:        # held across the fork, as by a thread
            pid = os.fork()
            if pid == 0:
                os._exit(0 if same(call(), want) else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("OK")
    """)


def test_a_child_forked_while_a_thread_is_inside_the_pools_update_runs(run):
    """A C host's fork may catch another thread between two of the buffer pool's updates (a
    block taken, its size still listed) or holding the lock of the networks' plans or of the
    C ABI's weight spaces: the child starts an empty pool and fresh locks and computes the
    parent's bits (such children failed with an IndexError, or waited forever)."""
    run("""
        from cgru.core import plan, weights
        import cgru.capi as capi
        net, x = problem()
        sealed = net.sealed()
        y = cgru.forward(sealed, x).y                # an inference's plan, kept by its Frozen
        call()
        with plan._pool_lock, weights._plans_lock, capi._weight_spaces_lock:
            assert plan._idle, "no idle block to leave half taken"
            for key in list(plan._idle):             # every idle block half taken, as a
                size, _ = plan._idle.pop(key)        # thread stopped inside _take_idle
                plan._idle_by_size[size].remove(key)  # leaves one
            pid = os.fork()
            if pid == 0:
                with capi._weight_spaces_lock:
                    pass
                ok = same(call(), want) and np.array_equal(cgru.forward(sealed, x).y, y)
                os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("OK")
    """)


def test_a_child_forked_while_a_thread_is_inside_the_caches_update_counts_it_whole(run):
    """A fork may catch another thread between two of the weight cache's updates: an entry in
    place but not yet marked cached and its bytes not yet counted.  The child counts what its
    cache holds (a count gone wrong would keep copies beyond the cache's bound, or evict
    them early, for the child's life)."""
    run("""
        from cgru.core import weights
        net, x = problem()
        y = cgru.forward(net, x).y                   # net's weights kept while net lives
        with weights._lock:
            entries, nbytes = weights.cached_entries()
            assert entries and nbytes > 0, (entries, nbytes)
            newest = next(reversed(weights._cache.values()))
            newest.cached = False                    # as keep() leaves it halfway
            weights._cached_bytes -= newest.nbytes
            pid = os.fork()
            if pid == 0:
                ok = weights.cached_entries() == (entries, nbytes) and newest.cached
                ok = ok and np.array_equal(cgru.forward(net, x).y, y) and same(call(), want)
                ok = ok and weights.cached_entries()[1] == sum(
                    k.nbytes for k in weights._cache.values())
                os._exit(0 if ok else 3)
            weights._cached_bytes += newest.nbytes
            newest.cached = True
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("OK")
    """)


def test_a_child_forked_while_another_thread_binds_blas_does_not_hang(run):
    """The first call's binding of BLAS (the threadpoolctl path does it lazily, under a lock)
    may be under way in another thread at the fork: the child gets a fresh lock and binds
    itself.  The lock is held across the fork here, as that thread would hold it."""
    run("""
        with threads._bind_lock:
            pid = os.fork()
            if pid == 0:
                threads._bound = None           # as if the parent had not bound yet
                os._exit(0 if same(call(), want) and threads.blas_control()[0] else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("OK")
    """)
