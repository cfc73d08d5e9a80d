"""How the bench times (docs/speed.md §5): warm-up, interleaved short blocks with pauses until
the thread pools are quiet, medians and min–max; the machine-noise and other-load checks; the
peak GEMM rate behind the FLOP limit.

A system (``bench.systems.System``) offers ``warmup(seconds, max_calls, single_s)`` and
``block(k, untimed)``, both returning the seconds of each timed call, and ``pids``: the other
processes doing its work (a pinned JAX worker), whose CPU use the pauses and the other-load
figure take into account.
"""
import ctypes
import math
import os
import time

import numpy as np

# --- CPU time of this process and of the bench's own workers -----------------------------------
_OWN_PIDS = set()        # worker processes of this run (their CPU is not "other load")


def register_pid(pid):
    _OWN_PIDS.add(pid)


def unregister_pid(pid):
    _OWN_PIDS.discard(pid)


def _cpu_clock_of(pid):
    """A ``time.clock_gettime`` clock id measuring ``pid``'s CPU time (ns resolution), or
    ``None`` where ``clock_getcpuclockid`` is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        cid = ctypes.c_int()
        if libc.clock_getcpuclockid(ctypes.c_int(pid), ctypes.byref(cid)) != 0:
            return None
        time.clock_gettime(cid.value)
        return cid.value
    except (OSError, AttributeError):
        return None


_CLOCKS = {}


def process_cpu_s(pid):
    """CPU seconds ``pid`` has used (``None`` once it has gone)."""
    if pid == os.getpid():
        return time.process_time()
    cid = _CLOCKS.get(pid)
    if cid is None:
        cid = _CLOCKS[pid] = _cpu_clock_of(pid)
    if cid is not None:
        try:
            return time.clock_gettime(cid)
        except OSError:
            _CLOCKS.pop(pid, None)
            return None
    try:                                          # fallback: clock ticks of /proc/<pid>/stat
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def own_cpu_s(pids=None):
    """CPU seconds of this process plus ``pids`` (default: every registered worker)."""
    total = time.process_time()
    for pid in (_OWN_PIDS if pids is None else pids):
        v = process_cpu_s(pid)
        total += v or 0.0
    return total


# --- pauses -------------------------------------------------------------------------------------
def settle(min_s, max_s=0.5, slice_s=0.01, pids=()):
    """The pause before a block: sleep ``min_s``, then until this process and ``pids`` use
    under 20 % of a core during a ``slice_s`` slice, at most ``max_s`` in all.

    After a 2-thread call OpenBLAS's worker keeps a core busy for ~0.1 s and onnxruntime's for
    ~0.05 s; a fixed short pause would let them slow down the next system."""
    time.sleep(min_s)
    t_end = time.perf_counter() + max_s - min_s
    while time.perf_counter() < t_end:
        c0, t0 = own_cpu_s(pids), time.perf_counter()
        time.sleep(slice_s)
        if own_cpu_s(pids) - c0 < 0.2 * (time.perf_counter() - t0):
            return


def time_call(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --- interleaved blocks ---------------------------------------------------------------------
def plan_blocks(est_s, mode, rounds):
    """``(k, untimed, blocks)`` for a system whose call takes ``est_s``: ``k`` timed calls per
    block (about ``mode.block_s`` of work, 1 to 25), an untimed call first unless a call takes
    over ``mode.untimed_s``, and ``mode.min_blocks`` to ``rounds`` blocks within
    ``mode.budget_s`` (a single block when one call takes over ``mode.slow_s``: a slow peer,
    or a thread pool starved by another process)."""
    k = int(min(25, max(1, round(mode.block_s / max(est_s, 1e-9)))))
    untimed = bool(est_s < mode.untimed_s)
    per_block = (k + untimed) * est_s + mode.pause_s
    least = mode.min_blocks if est_s <= mode.slow_s else 1
    blocks = int(min(rounds, max(least, mode.budget_s // max(per_block, 1e-9))))
    return k, untimed, max(1, min(blocks, rounds))


def measure(systems, mode, rounds=None, progress=None):
    """Warm up every system, then run interleaved blocks; ``{key: [seconds, ...]}``.

    The validation call was the cold call; each system warms up for ``mode.warmup_s`` (1 to 10
    calls; one when a call takes over ``mode.untimed_s``).  Then rounds: in each, every system runs one block — a pause (``settle``), one
    untimed call, ``k`` timed calls — and the order of the systems rotates every round."""
    rounds = mode.rounds if rounds is None else rounds
    watch = tuple(sorted({p for s in systems for p in s.pids}))
    plan = {}
    for s in systems:
        settle(mode.pause_s, pids=watch)
        times = s.warmup(mode.warmup_s, 10, mode.untimed_s)
        est = float(np.median(times[len(times) // 2:]))
        plan[s.key] = plan_blocks(est, mode, rounds)
    samples = {s.key: [] for s in systems}
    max_rounds = max((b for _, _, b in plan.values()), default=0)
    for rnd in range(max_rounds):
        shift = rnd % len(systems)
        for s in systems[shift:] + systems[:shift]:
            k, untimed, blocks = plan[s.key]
            if rnd >= blocks:
                continue
            if progress:
                progress(f"{s.key} round {rnd + 1}/{blocks}")
            settle(mode.pause_s, pids=watch)
            samples[s.key] += s.block(k, untimed)
    return samples


def stats(samples_s):
    """Median and min–max (ms) and every sample of a list of seconds."""
    ms = np.asarray(samples_s, np.float64) * 1e3
    return dict(median_ms=float(np.median(ms)), min_ms=float(ms.min()), max_ms=float(ms.max()),
                n=int(ms.size), samples_ms=[round(float(v), 5) for v in ms])


# --- other load and machine noise ----------------------------------------------------------
def _machine_busy_s():
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``), or ``None``."""
    try:
        with open("/proc/stat") as fh:
            f = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (f[0] + f[1] + f[2] + sum(f[5:8])) / os.sysconf("SC_CLK_TCK")  # user nice sys irq..


class OtherLoad:
    """How many cores *other* processes kept busy over an interval: the machine's busy time
    (``/proc/stat``) minus the CPU time of this process and of its registered workers, over the
    wall time.  ``None`` where ``/proc/stat`` does not exist.  With 2 cores, 2-thread figures
    taken while another process holds a core mean little."""

    def __init__(self):
        self.pids = tuple(_OWN_PIDS)
        self.start = self._sample()

    def _sample(self):
        busy = _machine_busy_s()
        if busy is None:
            return None
        return time.perf_counter(), busy, own_cpu_s(self.pids)

    def cores(self):
        end = self._sample()
        if self.start is None or end is None or end[0] - self.start[0] <= 0:
            return None
        wall = end[0] - self.start[0]
        other = (end[1] - self.start[1]) - (end[2] - self.start[2])
        return max(0.0, other / wall)


def other_load_now(seconds=0.5):
    """Cores other processes keep busy, sampled over ``seconds`` while this one sleeps."""
    probe = OtherLoad()
    time.sleep(seconds)
    return probe.cores()


def _probe_job(size):
    """A fixed single-threaded job: a ``size``² SGEMM through cgru's BLAS shim."""
    from cgru._kernels.blas import gemm_rm
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size)).astype(np.float32)
    c = np.empty_like(a)
    return lambda: gemm_rm(False, False, 1.0, a, a, 0.0, c)


def noise_probe(calls=30, size=192):
    """Machine noise: the spread of a fixed single-threaded job (``_probe_job``, ~1 ms) timed
    ``calls`` times.  Returns ``{median_ms, spread}`` with ``spread = (p90 − p10) / median``;
    a quiet machine gives a few percent — and ``core_probe``'s ``per_core_ms`` and
    ``core_spread``."""
    from threadpoolctl import ThreadpoolController
    job = _probe_job(size)
    with ThreadpoolController().limit(limits=1):
        for _ in range(3):
            job()
        t = [time_call(job) for _ in range(calls)]
    med = float(np.median(t))
    p10, p90 = np.percentile(t, [10, 90])
    return dict(median_ms=med * 1e3, spread=float((p90 - p10) / med), calls=calls, size=size,
                **core_probe(max(5, calls // 3), size, job))


def core_probe(calls=5, size=192, job=None):
    """The same fixed job on each usable core in turn (this thread pinned to it with
    ``sched_setaffinity``, its affinity restored after): ``{per_core_ms, core_spread}`` —
    core → median ms, and the slowest median over the fastest minus 1 (both ``None`` with
    fewer than two usable cores).  A virtual machine's host may run one vCPU slower than the
    other for minutes at a time; a 2-thread loop then waits for the slower core at every step,
    which a probe on one core does not see.  A few ms; the bench runs it around every 2-thread
    row."""
    from threadpoolctl import ThreadpoolController
    job = job or _probe_job(size)
    with ThreadpoolController().limit(limits=1):
        per_core = _per_core_medians(job, calls)
        together = _together_medians(size, sorted(per_core), 2 * calls) if per_core else {}
    if not per_core:
        return dict(per_core_ms=None, core_spread=None, together_ms=None,
                    together_slowdown=None)
    return dict(per_core_ms={str(cpu): ms for cpu, ms in per_core.items()},
                core_spread=max(per_core.values()) / min(per_core.values()) - 1,
                together_ms={str(cpu): ms for cpu, ms in together.items()} or None,
                together_slowdown=max(together[c] / per_core[c] for c in together) - 1
                if together else None)


def _together_medians(size, cpus, calls):
    """``{cpu: median ms}`` of the probe job run on every core in ``cpus`` at once (one thread
    pinned to each, its own arrays; the job releases the GIL), or ``{}``.  Against the job
    alone on each core: whether two busy cores slow each other (hyperthreads of one physical
    core, a host that throttles a busy guest)."""
    import threading
    medians, failed = {}, []
    start = threading.Barrier(len(cpus))

    def run(cpu):
        try:
            os.sched_setaffinity(0, {cpu})        # this thread only (Linux)
            job = _probe_job(size)
            job()
            start.wait(timeout=10)
            medians[cpu] = float(np.median([time_call(job) for _ in range(calls)])) * 1e3
        except (OSError, threading.BrokenBarrierError) as exc:
            failed.append(exc)
            start.abort()

    threads = [threading.Thread(target=run, args=(cpu,), daemon=True) for cpu in cpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    if failed or len(medians) != len(cpus):
        return {}
    return medians


def sustained_gemm(threads, size=1024, calls=3, gemm="blas"):
    """GFLOP/s of a ``size``³ SGEMM on ``threads`` threads (``gemm``: "blas", cgru's BLAS shim
    with BLAS allowed ``threads``, or "cgru", its packed GEMM on ``threads`` pool threads: the
    GEMM of the run's peak), the median of ``calls`` after one untimed call: tens of ms of work
    on every core at once.  Some hosts give two busy vCPUs less than twice one for a minute at
    a time (an all-core frequency or power budget); a probe of a few ms does not see it, this
    does."""
    from threadpoolctl import ThreadpoolController
    from cgru._kernels.blas import gemm_rm
    from cgru._kernels.loops import pack_rhs
    from cgru.core import plan
    a = np.random.default_rng(1).standard_normal((size, size)).astype(np.float32)
    c = np.empty_like(a)
    ap = pack_rhs(a, False) if gemm == "cgru" else None

    def job():
        if ap is not None:
            plan.gemm_packed(a, ap, c, False, nt=threads)
        else:
            gemm_rm(False, False, 1.0, a, a, 0.0, c)

    with ThreadpoolController().limit(limits=threads):
        job()
        t = float(np.median([time_call(job) for _ in range(calls)]))
    return 2.0 * size ** 3 / t / 1e9


def _per_core_medians(job, calls):
    """``{cpu: median ms}`` of ``job`` run on each usable core (at least two), or ``{}``."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return {}
    if len(cpus) < 2:
        return {}
    medians = {}
    try:
        for cpu in cpus:
            os.sched_setaffinity(0, {cpu})
            job()
            medians[cpu] = float(np.median([time_call(job) for _ in range(calls)])) * 1e3
    except OSError:
        return {}
    finally:
        os.sched_setaffinity(0, cpus)
    return medians


# --- the peak GEMM rate (the FLOP limit) ------------------------------------------------------
def gemm_peak(dtype, threads, size=2048, calls=5):
    """The peak GEMM rate of the machine: a ``size``³ ``C = A·B`` through SciPy's BLAS
    (``cgru._kernels.blas.gemm_rm``: SGEMM for float32, DGEMM for float64, BLAS allowed
    ``threads`` threads) and through cgru's own packed GEMM (``plan.gemm_packed`` on
    ``threads`` pool threads, B packed once beforehand), whichever is faster: on a machine
    where the BLAS is the slower of the two, a FLOP limit from the BLAS alone would flatter
    every row.
    Each: one untimed call, then ``calls`` timed ones, the result checked against NumPy on a
    few rows before the timing counts.  Returns ``{gflops, best_gflops, samples_ms, ok, err,
    gemm, blas_gflops, cgru_gflops}``; ``gflops`` is from the median call of the faster GEMM
    (``gemm``: "blas" or "cgru")."""
    from threadpoolctl import ThreadpoolController
    from cgru._kernels.blas import gemm_rm
    from cgru._kernels.loops import pack_rhs
    from cgru.core import plan
    dt = np.dtype(dtype)
    rng = np.random.default_rng(7)
    a = rng.uniform(-1, 1, (size, size)).astype(dt)
    b = rng.uniform(-1, 1, (size, size)).astype(dt)
    c = np.empty((size, size), dt)
    bp = pack_rhs(b, False)
    rows = a[:4].astype(np.float64) @ b.astype(np.float64)
    tol = 1e-4 if dt == np.float32 else 1e-12
    jobs = {"blas": lambda: gemm_rm(False, False, 1.0, a, b, 0.0, c),
            "cgru": lambda: plan.gemm_packed(a, bp, c, False, nt=threads)}
    flops = 2.0 * size ** 3
    found = {}
    with ThreadpoolController().limit(limits=threads):
        for name, job in jobs.items():
            c[:4] = np.nan
            job()
            err = float(np.max(np.abs(c[:4] - rows)) / np.max(np.abs(rows)))
            ok = bool(err <= tol)      # NaN (unwritten) is not
            # warm-up: the first calls with 2 threads run up to 2× slower (waking a pool)
            t_end, warm = time.perf_counter() + 0.25, 0
            while warm < 2 or time.perf_counter() < t_end:
                job()
                warm += 1
            t = [time_call(job) for _ in range(calls)]
            med = float(np.median(t))
            found[name] = dict(gflops=flops / med / 1e9, best_gflops=flops / min(t) / 1e9,
                               samples_ms=[round(v * 1e3, 4) for v in t], ok=ok, err=err)
    good = [name for name in found if found[name]["ok"]] or ["blas"]
    best = max(good, key=lambda name: found[name]["gflops"])
    return dict(dtype=dt.name, threads=threads, size=size, flops=flops, gemm=best,
                blas_gflops=found["blas"]["gflops"], cgru_gflops=found["cgru"]["gflops"],
                ok=found["blas"]["ok"] and found["cgru"]["ok"],
                **{k: v for k, v in found[best].items() if k != "ok"})


def flop_limit_ms(flops, peak):
    """The FLOP limit of a job of ``flops``: its time at the measured ``peak`` rate (ms)."""
    if not peak or not peak.get("ok") or not math.isfinite(peak.get("gflops", math.nan)):
        return None
    return flops / (peak["gflops"] * 1e9) * 1e3
