"""How cgru uses threads: OpenMP teams, the thread-count rule, fork, and BLAS held at one thread.

* **OpenMP** (``parallel.h``): the time loops' work items, the thread teams that share one
  loop's per-step products (``team.h``) and the whole-sequence GEMM blocks all run as OpenMP
  parallel regions of the compiler's runtime (GNU libgomp with GCC, LLVM's libomp with clang),
  the calling thread as the team's first thread; a build without OpenMP runs them serially
  (``parallel_enabled()`` is then False).  The runtime is the process's shared one, so
  ``threadpoolctl`` lists it and ``threadpool_limits`` limits it.  Results never depend on how
  many threads run: the work split is a function of the shapes only.
* **The thread count** of a call: ``resolve_num_threads``; and while several threads call
  cgru at once, each call's team takes only the cores the others leave (``parallel.h``).
* **fork()**: libgomp's thread pools do not survive a fork; cgru's fork handlers end the forking
  thread's pool first, so a child runs at full width — or, where that is not possible, mark
  the child serial (``parallel_info()["serial"]``).  See ``parallel.h``.
* **BLAS at one thread**: cgru's whole-sequence GEMMs run as blocks of single-threaded BLAS
  calls on the team's threads, so that BLAS's own threads neither fight the team for the cores
  nor split a product differently from one call to the next (which changes the last bits).
  ``blas_single_threaded()`` holds the BLAS that ``scipy.linalg.cython_blas`` calls at one
  thread while any of cgru's GEMM blocks run (not during the time loops, which use cgru's own
  GEMM), from whichever thread, and then restores the count it found — or leaves a count
  another thread set meanwhile.  SciPy's OpenBLAS (a pthreads build) has only a process-wide
  thread count (its ``openblas_set_num_threads_local`` sets the same global), so while cgru's
  GEMM blocks run, other threads' BLAS calls run single-threaded too; cgru sets it through the
  library's own ``openblas_set_num_threads``.  For other BLAS libraries it asks threadpoolctl
  (best effort: see ``blas_control()``).  The binding is made when this module is imported,
  so a process's first cgru call does no lazy set-up that a fork could interrupt.
"""
import os
import threading

from scipy.linalg import cython_blas as _cython_blas
from cpython.pycapsule cimport PyCapsule_GetName, PyCapsule_GetPointer

cdef extern from "parallel.h" nogil:
    ctypedef void (*cgru_item_fn)(void *ctx, int item)
    ctypedef void (*cgru_poll_fn)(void *ctx)
    ctypedef void (*cgru_member_fn)(void *ctx, int tid, int size)
    void cgru_parallel_for(int n_items, int n_threads, cgru_item_fn fn, void *ctx,
                           cgru_poll_fn poll, void *poll_ctx, double work_ns)
    void cgru_region(int n_threads, cgru_member_fn fn, void *ctx, double work_ns)
    int cgru_is_worker()
    int cgru_parallel_init(int cores)
    int cgru_omp_max_threads()
    int CGRU_RT_NONE, CGRU_RT_GNU, CGRU_RT_LLVM
    int cgru_rt
    char cgru_rt_path[4096]
    int cgru_cores
    int cgru_busy
    int cgru_busy_peak
    int cgru_teams
    int cgru_serial
    int cgru_pauses
    int cgru_fork_pause_enabled
    int cgru_teams_always
    int cgru_held_ups
    int cgru_force_held_up
    long long cgru_backoff_until
    long long cgru_backoff_len
    long long CGRU_BACKOFF_NS
    long long cgru_mono_ns()
    int cgru_cold_rule
    int cgru_cold_alone
    int cgru_cold_probe
    int cgru_cold_skipped
    int CGRU_COLD_PROBE_MIN
    long long cgru_cold_late_ns
    long long cgru_team_end_ns
    long long cgru_alone_end_ns
    void cgru_cold_measured(long long late, double work_ns)

cdef extern from *:
    """
    #include <dlfcn.h>
    #include <pthread.h>
    #include <stdio.h>
    #include <time.h>

    static double cgru_wtime(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    }

    /* ---- BLAS thread count, process-wide, reference-counted ---------------------------------
     * cgru_blas_found: 1 when the library behind SciPy's cython_blas exports OpenBLAS's
     * set/get pair (with SciPy's "scipy_" symbol prefix or none, and an optional 64_ suffix).
     * The first cgru call in saves the count and sets 1; the last one out restores it.      */
    typedef void (*cgru_set_threads_fn)(int);
    typedef int (*cgru_get_threads_fn)(void);
    static cgru_set_threads_fn cgru_blas_set;
    static cgru_get_threads_fn cgru_blas_get;
    static int cgru_blas_parallel = -1;        /* openblas_get_parallel(): 0 none, 1 pthreads, 2 OpenMP */
    static char cgru_blas_path[4096];
    static pthread_mutex_t cgru_blas_lock = PTHREAD_MUTEX_INITIALIZER;
    static int cgru_blas_depth, cgru_blas_saved = -1, cgru_blas_child_restore = -1;

    static void *cgru_blas_symbol(void *h, const char *base) {
        static const char *prefixes[] = {"scipy_", ""};
        static const char *suffixes[] = {"", "64_"};
        char name[128];
        for (int p = 0; p < 2; p++)
            for (int s = 0; s < 2; s++) {
                snprintf(name, sizeof name, "%s%s%s", prefixes[p], base, suffixes[s]);
                void *f = dlsym(h, name);
                if (f != NULL) return f;
            }
        return NULL;
    }

    static void cgru_blas_child(void) {
        /* a fork inside another thread's cgru call: the child's count is the parent's 1 */
        pthread_mutex_init(&cgru_blas_lock, NULL);
        if (cgru_blas_depth > 0) cgru_blas_child_restore = cgru_blas_saved;
        cgru_blas_depth = 0;
    }

    /* Find the library behind `sgemm` (the pointer SciPy's capsule gives: a function of
     * cython_blas, whose dependencies dlsym searches too).  1 if it is OpenBLAS. */
    static int cgru_blas_bind(void *sgemm) {
        Dl_info info;
        if (sgemm == NULL || dladdr(sgemm, &info) == 0 || info.dli_fname == NULL) return 0;
        snprintf(cgru_blas_path, sizeof cgru_blas_path, "%s", info.dli_fname);
        void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
        if (h == NULL) return 0;
        cgru_set_threads_fn set = (cgru_set_threads_fn)cgru_blas_symbol(h, "openblas_set_num_threads");
        cgru_get_threads_fn get = (cgru_get_threads_fn)cgru_blas_symbol(h, "openblas_get_num_threads");
        cgru_get_threads_fn par = (cgru_get_threads_fn)cgru_blas_symbol(h, "openblas_get_parallel");
        if (set == NULL || get == NULL) return 0;
        if (dladdr((void *)set, &info) != 0 && info.dli_fname != NULL)   /* the BLAS itself */
            snprintf(cgru_blas_path, sizeof cgru_blas_path, "%s", info.dli_fname);
        cgru_blas_parallel = par ? par() : -1;
        if (cgru_blas_parallel == 2) return 0;   /* OpenMP-threaded OpenBLAS: per-thread ICVs */
        cgru_blas_set = set;
        cgru_blas_get = get;
        pthread_atfork(NULL, NULL, cgru_blas_child);
        return 1;
    }

    /* Entering a window of cgru's GEMM blocks: the first one in saves the count and sets 1.
     * A later one that finds a count other than 1 (another thread set it meanwhile) takes that
     * as the count to restore.  The last one out restores it, unless the count is no longer
     * the 1 cgru set (then another thread's later choice stands). */
    static void cgru_blas_enter(void) {
        if (cgru_blas_set == NULL) return;
        pthread_mutex_lock(&cgru_blas_lock);
        int now = cgru_blas_get();
        if (cgru_blas_depth++ == 0) {
            cgru_blas_saved = cgru_blas_child_restore >= 0 ? cgru_blas_child_restore : now;
            cgru_blas_child_restore = -1;
        } else if (now != 1) {
            cgru_blas_saved = now;
        }
        if (now != 1) cgru_blas_set(1);
        pthread_mutex_unlock(&cgru_blas_lock);
    }

    static void cgru_blas_exit(void) {
        if (cgru_blas_set == NULL) return;
        pthread_mutex_lock(&cgru_blas_lock);
        if (--cgru_blas_depth == 0 && cgru_blas_saved != 1 && cgru_blas_saved > 0
                && cgru_blas_get() == 1)
            cgru_blas_set(cgru_blas_saved);
        pthread_mutex_unlock(&cgru_blas_lock);
    }

    static int cgru_blas_threads_now(void) { return cgru_blas_get ? cgru_blas_get() : -1; }
    """
    double cgru_wtime() nogil
    int cgru_blas_bind(void *sgemm)
    void cgru_blas_enter() nogil
    void cgru_blas_exit() nogil
    int cgru_blas_threads_now() nogil
    int cgru_blas_parallel
    char cgru_blas_path[4096]


# --- OpenMP regions ----------------------------------------------------------------------------
cdef void parallel_for(int n_items, int n_threads, item_fn fn, void *ctx, poll_fn poll,
                       void *poll_ctx, double work_ns) noexcept nogil:
    cgru_parallel_for(n_items, n_threads, <cgru_item_fn>fn, ctx, <cgru_poll_fn>poll, poll_ctx,
                      work_ns)


cdef void parallel_region(int n_threads, member_fn fn, void *ctx, double work_ns) noexcept nogil:
    cgru_region(n_threads, <cgru_member_fn>fn, ctx, work_ns)


# work_ns's rates: 64 float32 flops a ns is about half of a recent core's peak; an exact value
# does not matter, the estimate is set against a wake-up of microseconds or milliseconds
cdef double PRODUCT_NS_PER_MAC = 1.0 / 32      # float32 (float64: twice)
cdef double PASS_NS_PER_BYTE = 1.0 / 16        # 16 GB/s


cdef double product_ns(double macs, bint f64) noexcept nogil:
    return macs * (PRODUCT_NS_PER_MAC * 2 if f64 else PRODUCT_NS_PER_MAC)


cdef double pass_ns(double nbytes) noexcept nogil:
    return nbytes * PASS_NS_PER_BYTE


cdef bint is_worker() noexcept nogil:
    return cgru_is_worker() != 0


cdef double wtime() noexcept nogil:
    return cgru_wtime()


cdef extern from *:
    """
    #ifdef _OPENMP
    #define CGRU_BUILT_WITH_OPENMP 1
    #else
    #define CGRU_BUILT_WITH_OPENMP 0
    #endif
    """
    int CGRU_BUILT_WITH_OPENMP


def openmp_enabled():
    """True when cgru was built with OpenMP (the compiler's runtime runs its parallel
    regions); False for a serial build."""
    return bool(CGRU_BUILT_WITH_OPENMP)


def parallel_enabled():
    """True when cgru's calls can run on several threads in this process: built with OpenMP,
    and not a forked child that runs serially (see ``parallel_info``)."""
    return bool(CGRU_BUILT_WITH_OPENMP) and not cgru_serial


def _runtime_name():
    if cgru_rt == CGRU_RT_GNU:
        return "libgomp"
    if cgru_rt == CGRU_RT_LLVM:
        return "libomp"
    if cgru_rt == CGRU_RT_NONE:
        return None
    return "other"


def parallel_info():
    """How cgru's parallel regions run in this process, as a dict:

    ``openmp`` built with OpenMP; ``runtime`` ``"libgomp"`` (GNU), ``"libomp"`` (LLVM or
    Intel), ``"other"`` or None (serial build); ``path`` the runtime's library; ``serial``
    True in a forked child whose runtime could not be made safe for teams (every call then
    runs on its caller alone); ``max_threads`` the calling thread's OpenMP thread count
    (``OMP_NUM_THREADS``, ``omp_set_num_threads``, ``threadpool_limits``), which caps
    ``num_threads=None``; ``cores`` the budget of threads all concurrent calls share.
    """
    return {"openmp": bool(CGRU_BUILT_WITH_OPENMP), "runtime": _runtime_name(),
            "path": cgru_rt_path.decode(errors="replace"), "serial": bool(cgru_serial),
            "max_threads": cgru_omp_max_threads(), "cores": cgru_cores}


def _counters():
    """For tests: ``{"teams", "busy", "busy_peak", "pauses"}`` — regions run with more than
    one thread, threads inside cgru's regions now and at most so far, pauses of the runtime
    before a fork."""
    return {"teams": cgru_teams, "busy": cgru_busy, "busy_peak": cgru_busy_peak,
            "pauses": cgru_pauses}


def _backoff():
    """For tests: ``{"held_ups", "backing_off", "teams_always"}`` — teams held up by other
    processes so far, whether teams are capped now, whether that is turned off."""
    return {"held_ups": cgru_held_ups, "backing_off": cgru_mono_ns() < cgru_backoff_until,
            "teams_always": bool(cgru_teams_always)}


def _set_backoff(teams_always=None, held_up=False, reset=False):
    """For tests: ``teams_always`` turns the backoff off (True) or on (False); ``held_up``
    counts the next team as held up; ``reset`` ends a backoff (and that count).  Returns the previous
    ``teams_always``."""
    global cgru_teams_always, cgru_force_held_up, cgru_backoff_until, cgru_backoff_len
    old = bool(cgru_teams_always)
    if teams_always is not None:
        cgru_teams_always = bool(teams_always)
    if held_up:
        cgru_force_held_up = 1
    if reset:
        cgru_backoff_until = 0
        cgru_backoff_len = CGRU_BACKOFF_NS
        cgru_force_held_up = 0
    return old


def _cold(rule=None, late_ns=None, warm=None, probe=None, reset=False):
    """For tests: the cold-team rule (parallel.h).  ``rule`` turns it on (True) or off;
    ``late_ns`` sets the estimate of how late a cold team's helpers start; ``warm`` False makes
    the next region cold (as after a pause: no team, nor a region run alone, just before it),
    True warm (as if a team ended an hour from now: however late it starts); ``probe`` sets how
    many skipped regions make a probe; ``reset`` restarts the probe count (at 16).  Returns
    ``{"rule", "late_ns", "alone", "probe", "skipped"}`` as they were before."""
    global cgru_cold_rule, cgru_cold_late_ns, cgru_team_end_ns, cgru_cold_probe
    global cgru_cold_skipped, cgru_alone_end_ns
    old = {"rule": bool(cgru_cold_rule), "late_ns": cgru_cold_late_ns,
           "alone": cgru_cold_alone, "probe": cgru_cold_probe, "skipped": cgru_cold_skipped}
    if rule is not None:
        cgru_cold_rule = bool(rule)
    if late_ns is not None:
        cgru_cold_late_ns = late_ns
    if warm is not None:
        cgru_team_end_ns = cgru_mono_ns() + 3600 * 10 ** 9 if warm else 0
        cgru_alone_end_ns = 0
    if reset:
        cgru_cold_probe, cgru_cold_skipped = CGRU_COLD_PROBE_MIN, 0
    if probe is not None:
        cgru_cold_probe = probe
    return old


def _cold_measured(long long late_ns, double work_ns):
    """For tests: what a cold team that ran ``work_ns`` of work, its helpers ``late_ns`` late,
    does to the rule (parallel.h's ``cgru_cold_measured``: the estimate moves a quarter of the
    way; the probe count doubles while the helpers are later than the work, up to 1024, else
    returns to 16).  Returns ``_cold()``'s state after."""
    cgru_cold_measured(late_ns, work_ns)
    return _cold()


def _reset_busy_peak():
    """For tests: start counting ``busy_peak`` afresh."""
    global cgru_busy_peak
    cgru_busy_peak = 0


def _fork_pause(bint enabled):
    """For tests: False makes the next forks act as if the runtime could not be paused (the
    child then runs serially); returns the previous setting."""
    global cgru_fork_pause_enabled
    old = bool(cgru_fork_pause_enabled)
    cgru_fork_pause_enabled = enabled
    return old


# --- the thread-count rule -------------------------------------------------------------------
# A call never asks for more threads than this (a larger request is an error, not a hang of
# thread creation): far above any machine's core count.
MAX_THREADS = 256


cdef extern from *:
    """
    #ifdef __linux__
    #include <sched.h>
    /* the CPUs of the calling thread's affinity (what os.sched_getaffinity(0) counts, without
       building a set: every call resolves its thread count), or -1 when the set does not fit
       a cpu_set_t */
    static int cgru_affinity_cores(void) {
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
        return CPU_COUNT(&set);
    }
    #else
    static int cgru_affinity_cores(void) { return -1; }
    #endif
    """
    int cgru_affinity_cores() nogil


def _usable_cores():
    cdef int n = cgru_affinity_cores()
    if n > 0:
        return n
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_num_threads(num_threads=None):
    """The thread count a call uses.

    ``None`` means every usable core (the process's CPU affinity), capped by the calling
    thread's OpenMP thread count (``omp_get_max_threads``: ``OMP_NUM_THREADS``, or what
    ``threadpoolctl.threadpool_limits`` / ``omp_set_num_threads`` set on this thread); a
    positive int asks for that many threads (at most ``MAX_THREADS``; like an OpenMP
    ``num_threads`` clause, it is not capped by those limits) and gets at most the usable cores
    (more would only take turns on them); a negative int ``-k`` means "all usable cores but
    k-1" (as in scikit-learn).  ``0`` is an error.  A build without OpenMP uses 1.  Concurrent
    calls share the cores (``parallel.h``).  The count changes only which threads do the work,
    never the results.
    """
    global cgru_cores
    if type(num_threads) is int and num_threads == 1:
        # one thread is one thread on any number of cores: no affinity lookup (a system call
        # on every call), and no team, so the budget the others share keeps its last reading
        return 1
    cores = _usable_cores()
    cgru_cores = cores
    if num_threads is None:
        n = min(cores, cgru_omp_max_threads())
    else:
        if isinstance(num_threads, bool) or not hasattr(num_threads, "__index__"):
            raise TypeError(f"num_threads: expected an int or None, got "
                            f"{type(num_threads).__name__} ({num_threads!r})")
        n = num_threads.__index__()
        if n == 0:
            raise ValueError("num_threads: expected a non-zero int or None, got 0")
        if n > MAX_THREADS or n < -MAX_THREADS:
            raise ValueError(f"num_threads: expected at most {MAX_THREADS} threads (or -k for "
                             f"all usable cores but k-1), got {n}")
        n = cores + 1 + n if n < 0 else min(n, cores)
    return max(1, n) if CGRU_BUILT_WITH_OPENMP else 1


# --- BLAS at one thread ----------------------------------------------------------------------
_bind_lock = threading.Lock()
_bound = None           # None: not yet looked up; then "openblas" or "threadpoolctl"
_tpc_libs = None        # threadpoolctl controllers (fallback)
_tpc_state = {"depth": 0, "saved": []}


def _bind():
    """How cgru holds its BLAS at one thread: ``"openblas"`` (found at import) or, for another
    BLAS, ``"threadpoolctl"`` (its controllers made on the first call)."""
    global _bound, _tpc_libs
    with _bind_lock:
        if _bound is not None:
            return _bound
        cap = _cython_blas.__pyx_capi__["sgemm"]
        if cgru_blas_bind(PyCapsule_GetPointer(cap, PyCapsule_GetName(cap))):
            _bound = "openblas"
        else:
            from threadpoolctl import ThreadpoolController
            _tpc_libs = ThreadpoolController().select(user_api="blas").lib_controllers
            _bound = "threadpoolctl"
        return _bound


def _bind_openblas():
    """At import: bind OpenBLAS when it is SciPy's BLAS (cheap: a few symbol lookups); another
    BLAS is bound on the first call (``_bind``)."""
    global _bound
    cap = _cython_blas.__pyx_capi__["sgemm"]
    if cgru_blas_bind(PyCapsule_GetPointer(cap, PyCapsule_GetName(cap))):
        _bound = "openblas"


def _fresh_bind_lock():
    """In a forked child: a new lock (a thread of the parent may have held it at the fork)."""
    global _bind_lock
    _bind_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_bind_lock)
_bind_openblas()
# the runtime, and its fork handlers: at import, before any call can start a team
if cgru_parallel_init(_usable_cores()) != 0:
    import warnings
    warnings.warn("cgru: could not register its fork handlers; cgru runs serially",
                  RuntimeWarning, stacklevel=2)


class blas_single_threaded:
    """Context manager: the BLAS cgru calls runs single-threaded inside (see module doc).

    Re-entrant and safe from any number of threads at once: the first one in sets one thread,
    the last one out restores the count it found."""

    __slots__ = ()

    def __enter__(self):
        if _bound is None:
            _bind()
        if _bound == "openblas":
            cgru_blas_enter()
        else:
            with _bind_lock:
                if _tpc_state["depth"] == 0:
                    saved = []
                    for lib in _tpc_libs:
                        old = lib.get_num_threads()
                        if old != 1:
                            lib.set_num_threads(1)
                            saved.append((lib, old))
                    _tpc_state["saved"] = saved
                _tpc_state["depth"] += 1
        return self

    def __exit__(self, *exc):
        if _bound == "openblas":
            cgru_blas_exit()
        else:
            with _bind_lock:
                _tpc_state["depth"] -= 1
                if _tpc_state["depth"] == 0:
                    for lib, old in _tpc_state["saved"]:
                        lib.set_num_threads(old)
                    _tpc_state["saved"] = []


def blas_control():
    """``(how, library path, current thread count)``: how cgru holds its BLAS at one thread —
    ``"openblas"`` (directly, exact from every thread) or ``"threadpoolctl"`` (best effort)."""
    how = _bind()
    path = cgru_blas_path.decode(errors="replace") if how == "openblas" else ""
    return how, path, cgru_blas_threads_now()
