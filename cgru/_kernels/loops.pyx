"""The time loops' shared machinery: signal polling, the test probes, packing, fingerprints.

Every cell kind's kernels (``gru.pyx``, …) run their time loops as independent work items
(direction, batch chunk) on an OpenMP team (``threads.pyx``).  A loop calls ``loop_step`` at the start of
every step: it stops all items once a signal handler has raised (Ctrl-C), runs Python's signal
handlers on the caller's thread every ``POLL_SECONDS`` (main-thread calls only), and fires the
test probe.  Also here: packing of the recurrent weights for the kernels' GEMM, the vector
math entry points for tests, the vector ISA in use, ``fingerprint``, the keyed hash that binds a
reserve to its call, and ``same_bytes``, the comparison that proves a kept copy of the weights
equal to the caller's arrays.
"""
import os
import threading

import numpy as np
cimport numpy as cnp

from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport PyObject
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcmp, memcpy
from cgru._kernels.threads cimport (is_worker, item_fn, parallel_for, parallel_region,
                                     pass_ns, product_ns, wtime)

cnp.import_array()

# The calling thread runs Python's signal handlers this often while a time loop runs, so that
# Ctrl-C stops a long layer; the other threads see the abort flag.
cdef double POLL_SECONDS = 0.05
# The smallest per-step product (rows · gates · H · H multiply-adds) that one loop shares with
# spare threads (team.h); smaller ones cost less than the hand-over.
cdef long long TEAM_MIN_WORK = 1 << 17
cdef int _team_jobs = 0


def team_jobs():
    """How many time loops ran with a thread team of two or more so far (for tests)."""
    return cgru_load(&_team_jobs)


def team_min_work(value=None):
    """The per-step product size from which a loop gets a team (``value``: set it, for tests);
    returns the previous value."""
    global TEAM_MIN_WORK
    old = TEAM_MIN_WORK
    if value is not None:
        TEAM_MIN_WORK = value
    return old

cdef extern from "hash.h" nogil:
    ctypedef struct cgru_fp_key:
        uint32_t nh[260]
        uint64_t r[2]
    void cgru_fingerprint(const unsigned char *p, size_t n, const cgru_fp_key *key,
                          uint64_t out[2], int isa)
    void cgru_fingerprint_copy(const unsigned char *p, unsigned char *copy, size_t n,
                               const cgru_fp_key *key, uint64_t out[2], int isa)


cdef extern from *:
    """
    #include <signal.h>
    #include <string.h>
    static inline int cgru_load(const int *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
    static inline void cgru_store(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
    static inline int cgru_add(int *p, int v) { return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL); }
    """
    int cgru_load(const int *p) noexcept nogil
    void cgru_store(int *p, int v) noexcept nogil
    int cgru_add(int *p, int v) noexcept nogil
    int raise_signal "raise"(int sig) noexcept nogil
    int SIGINT


cdef void *ptr(object a):
    return NULL if a is None else cnp.PyArray_DATA(<cnp.ndarray>a)


cdef Loop make_loop(int T, int N, int H, int S, int C, int D, int n_chunks, object lengths,
                    object mask, object y, object dy, int *abort, list errors, int gates):
    cdef Loop L
    L.team = NULL
    # a team pays when one step's product is big enough to split (a few µs); the choice
    # depends on the shapes only (and the result on nothing: team.h)
    L.use_team = (<long long>(N // max(n_chunks, 1))) * gates * H * H >= TEAM_MIN_WORK
    # about how long a step of the loops takes one thread (the threads' cold-team rule): its
    # products at half the rate of a whole-sequence product (small products, the gate math)
    a = y if y is not None else dy
    L.step_ns = 2 * product_ns(<double>N * D * gates * H * S,
                               a is not None and a.dtype.itemsize == 8)
    L.scratch, L.item_scratch = NULL, 0
    L.abort = abort
    L.errors = <PyObject *>errors
    L.poll = threading.current_thread() is threading.main_thread()
    L.T, L.N, L.H, L.S, L.C, L.D, L.n_chunks = T, N, H, S, C, D, n_chunks
    L.s_begin, L.s_end = 0, T
    L.lengths = <const long long *>ptr(lengths)
    L.mask = ptr(mask)
    L.y = ptr(y)
    L.dy = ptr(dy)
    return L


cdef struct TeamJob:
    item_fn fn                 # the kind's work item
    Job *job
    cgru_team *team


cdef void team_member(void *ctx, int tid, int size) noexcept nogil:
    # The team's first thread — the caller — runs the layer's one time loop (work item 0: it
    # polls for signals and fires the test probes, as without a team), then ends the team; the
    # others help until then.  A team of one runs the loop without a team.
    cdef TeamJob *TJ = <TeamJob *>ctx
    if tid == 0:
        if size == 1:
            TJ.job.loop.team = NULL
        else:
            cgru_add(&_team_jobs, 1)
        TJ.fn(TJ.job, 0)
        cgru_team_quit(TJ.team)
    else:
        cgru_team_help(TJ.team)


cdef run_job(item_fn fn, Job *J, int num_threads, list errors):
    cdef int n_items = J.loop.D * J.loop.n_chunks
    cdef TeamJob TJ
    cdef double work = J.loop.step_ns * (J.loop.s_end - J.loop.s_begin)
    if n_items == 1 and num_threads > 1 and J.loop.use_team and not is_worker():
        # one loop and spare threads: they share its per-step products (team.h)
        TJ.fn, TJ.job, TJ.team = fn, J, cgru_team_new()
        if TJ.team == NULL:
            raise MemoryError("cgru: out of memory for a thread team")
        J.loop.team = TJ.team
        try:
            with nogil:
                parallel_region(num_threads, team_member, &TJ, work)
        finally:
            J.loop.team = NULL
            cgru_team_free(TJ.team)
    else:
        with nogil:
            parallel_for(n_items, num_threads, fn, J, poll_while_waiting, J.loop, work)
    if errors:
        raise errors[0]


cdef void item_rows(const Loop *L, int item, int *d, int *b0, int *b1) noexcept nogil:
    cdef int c = item % L.n_chunks
    d[0] = item // L.n_chunks
    b0[0] = <int>((<long long>c * L.N) // L.n_chunks)
    b1[0] = <int>((<long long>(c + 1) * L.N) // L.n_chunks)


cdef void check_signals(const Loop *L) noexcept with gil:
    """Run Python's signal handlers (the caller's thread, main-thread calls only); an exception
    they raise (KeyboardInterrupt) is kept for the caller and stops every work item.  Only
    ever called on a thread that has a Python thread state (blas.run_signal_handlers says
    why a team thread must never take the GIL)."""
    try:
        PyErr_CheckSignals()
    except BaseException as e:
        (<list>L.errors).append(e)
        cgru_store(L.abort, 1)


cdef void poll_while_waiting(void *ctx) noexcept nogil:
    # parallel_for calls this on the caller's thread while it waits for the others
    cdef const Loop *L = <const Loop *>ctx
    if L.poll and not cgru_load(L.abort):
        check_signals(L)


cdef double first_poll() noexcept nogil:
    return wtime() + POLL_SECONDS


cdef bint loop_step(const Loop *L, double *next_poll, int item, int s) noexcept nogil:
    """True when the loop must stop before step ``s``.  On the caller's thread of a
    main-thread call, every POLL_SECONDS (or at once after a test probe fired), run Python's
    signal handlers.  Work item 0 counts its steps and fires the test probe."""
    cdef double now
    if cgru_load(L.abort):
        return True
    if L.poll and not is_worker():
        now = wtime()
        if now >= next_poll[0] or cgru_load(&probe.poll_now):
            next_poll[0] = now + POLL_SECONDS
            cgru_store(&probe.poll_now, 0)
            check_signals(L)
            if cgru_load(L.abort):
                return True
    if item == 0:
        cgru_store(&probe.steps, s + 1)
        if s == probe.step:
            fire_probe(L)
    return False


# --- test probes ---------------------------------------------------------------------------
# Deterministic hooks for the tests of signals, GIL release and concurrency (no test measures
# a duration): at processing step `step` of work item 0 of every time loop, item 0
#   action 1: raises SIGINT (as Ctrl-C would) and has the caller poll for it: at once when
#             item 0 runs on the caller's thread, else item 0 waits until the caller's next
#             poll has set the abort flag (so the loop stops right after this step);
#   action 2: arrives at a rendezvous and waits (at most `timeout` s) until `needed` parties
#             have arrived — other time loops' item 0 at the same step, or a Python thread
#             calling probe_arrive().
# `steps` counts the steps item 0 completed in the last loop.  Off (step −1) by default; the
# check is one comparison per step.
cdef struct Probe:
    int step
    int action
    int needed
    int arrived
    int timed_out
    int poll_now
    int steps
    double timeout

cdef Probe probe
probe.step = -1


cdef void fire_probe(const Loop *L) noexcept nogil:
    cdef double until
    if probe.action == 1:
        # as Ctrl-C would: the signal, then the poll that notices it — at once on the caller's
        # thread; on a worker, wait (bounded) until the caller has polled and set the abort
        # flag, so that the step at which the loop stops does not depend on scheduling
        raise_signal(SIGINT)
        if not is_worker():
            if L.poll:
                check_signals(L)
        else:
            cgru_store(&probe.poll_now, 1)
            until = wtime() + probe.timeout
            while not cgru_load(L.abort):
                if wtime() > until:
                    cgru_store(&probe.timed_out, 1)
                    break
    elif probe.action == 2:
        cgru_add(&probe.arrived, 1)
        until = wtime() + probe.timeout
        while cgru_load(&probe.arrived) < probe.needed:
            if wtime() > until:
                cgru_store(&probe.timed_out, 1)
                break


def set_probe(int step=-1, int action=0, int needed=2, double timeout=60.0):
    """Arm the test probe (see above); ``step=-1`` disarms it.  Resets the counters."""
    probe.step, probe.action, probe.needed, probe.timeout = step, action, needed, timeout
    probe.arrived = probe.timed_out = probe.poll_now = probe.steps = 0


def probe_state():
    """``{"arrived", "timed_out", "steps"}`` of the test probe."""
    return {"arrived": cgru_load(&probe.arrived), "timed_out": bool(probe.timed_out),
            "steps": cgru_load(&probe.steps)}


def probe_arrive():
    """Arrive at the probe's rendezvous from Python (needs the GIL: proves the loop released it)."""
    cgru_add(&probe.arrived, 1)


def packed_size(int n, int k, dtype):
    """Elements of ``op(B)`` ``[k, n]`` packed (``pack_rhs``) in ``dtype``."""
    return cgru_packed_size(n, k, CGRU_NR_F if np.dtype(dtype) == np.float32 else CGRU_NR_D)


cdef enum:
    _PACK_PIECES = 8                # at most this many pieces of a pack on the team
    _PACK_SHARED_BYTES = 1 << 18    # from this size on, two threads and more share one


cdef struct _Pack:
    const char *B
    char *Bp
    int n, k, ldb, piece, f64


cdef void _pack_piece(void *ctx, int item) noexcept nogil:
    cdef _Pack *J = <_Pack *>ctx
    cdef int k0 = item * J.piece
    cdef int k1 = min(k0 + J.piece, J.k)
    if k0 >= k1:
        return
    if J.f64:
        cgru_pack_f64_rows(J.n, J.k, k0, k1, <const double *>J.B, J.ldb, <double *>J.Bp)
    else:
        cgru_pack_f32_rows(J.n, J.k, k0, k1, <const float *>J.B, J.ldb, <float *>J.Bp)


def pack_rhs(B, bint trans, out=None, int num_threads=1):
    """Pack ``op(B)`` (``[k, n]``; ``B`` is ``[k, n]``, or ``[n, k]`` when ``trans``) for the
    time loop's GEMMs.  ``B`` is a C-contiguous 2-D float32/float64 array.  Returns a new array,
    or the first ``packed_size`` elements of ``out`` (a 1-D C-contiguous array of B's dtype:
    a call's workspace) written.  ``num_threads``: a non-transposed ``B`` of 256 KiB or more
    is packed by up to that many of cgru's threads, each a range of its rows (a weight
    gradient's right operand, packed in every call: alone on one thread it left the other
    waiting); the bytes are the same."""
    if not isinstance(B, np.ndarray) or B.ndim != 2 or not B.flags.c_contiguous \
            or B.dtype not in (np.float32, np.float64):
        raise ValueError("pack_rhs: B must be a C-contiguous 2-D float32 or float64 array")
    cdef cnp.ndarray arr = B
    cdef int n = B.shape[0] if trans else B.shape[1]
    cdef int k = B.shape[1] if trans else B.shape[0]
    cdef int ldb = B.shape[1]
    cdef size_t size = packed_size(n, k, B.dtype)
    cdef cnp.ndarray dst
    if out is None:
        dst = np.empty(size, B.dtype)
    else:
        if not isinstance(out, np.ndarray) or out.dtype != B.dtype or out.ndim != 1 \
                or not out.flags.c_contiguous or not out.flags.writeable \
                or <size_t>out.shape[0] < size:
            raise ValueError(f"pack_rhs: out must be a writable 1-D C-contiguous {B.dtype} "
                             f"array of at least {size} elements")
        dst = out[:size]
    cdef _Pack J
    cdef int pieces
    cdef double work
    if not trans and num_threads > 1 and k > 1 and arr.nbytes >= _PACK_SHARED_BYTES:
        pieces = min(num_threads, _PACK_PIECES, k)
        J.B, J.Bp = <const char *>cnp.PyArray_DATA(arr), <char *>cnp.PyArray_DATA(dst)
        J.n, J.k, J.ldb, J.f64 = n, k, ldb, B.dtype == np.float64
        J.piece = (k + pieces - 1) // pieces
        work = pass_ns(2.0 * arr.nbytes)
        with nogil:
            parallel_for(pieces, num_threads, _pack_piece, &J, NULL, NULL, work)
        return dst
    if B.dtype == np.float32:
        cgru_pack_f32(trans, n, k, <const float *>cnp.PyArray_DATA(arr), ldb,
                      <float *>cnp.PyArray_DATA(dst))
    else:
        cgru_pack_f64(trans, n, k, <const double *>cnp.PyArray_DATA(arr), ldb,
                      <double *>cnp.PyArray_DATA(dst))
    return dst


cdef int _level(isa) except -1:
    # the ISA level a test asks for (4 AVX-512, 3 AVX2+FMA, 0 portable), None: this machine's
    if isa is None:
        return cgru_isa()
    if isa not in (0, 3, 4) or isa > cgru_isa():
        raise ValueError(f"isa: expected 0, 3 or 4, at most {cgru_isa()} here, got {isa!r}")
    return isa


def gemm_packed_rm(A, Bp, int n, C, bint beta1, isa=None, bint trans_a=False,
                   bint short_k=True):
    """``C[m, n] (+)= op(A)[m, k] · op(B)`` with ``op(B)`` from ``pack_rhs`` (the kernels'
    GEMM, single-threaded; for tests and tools — the engine runs it through
    ``blas.gemm_packed_blocks``): A (``[k, m]`` with ``trans_a``) and C 2-D views of one float
    dtype with unit inner stride (any row stride).  ``isa``: run the code of that level (4
    AVX-512, 3 AVX2+FMA, 0 portable; at most ``cgru_isa()``).  ``short_k=False``: the
    micro-kernels even for an inner dimension of ``CGRU_SHORT_K`` or less (which the engine's
    calls run row after row), so that tests can compare the two."""
    cdef int level = _level(isa)
    cdef int ta = (1 if trans_a else 0) | (0 if short_k else CGRU_GEMM_NO_SHORT)
    if not (isinstance(A, np.ndarray) and isinstance(C, np.ndarray) and isinstance(Bp, np.ndarray)):
        raise TypeError("A, Bp, C: expected NumPy arrays")
    if A.dtype not in (np.float32, np.float64) or C.dtype != A.dtype or Bp.dtype != A.dtype:
        raise TypeError(f"A, Bp, C: expected one float dtype, got {A.dtype}, {Bp.dtype}, "
                        f"{C.dtype}")
    if A.ndim != 2 or C.ndim != 2 or Bp.ndim != 1 or not Bp.flags.c_contiguous:
        raise ValueError("A, C: expected 2-D arrays; Bp: the 1-D array of pack_rhs")
    cdef int m = A.shape[1] if trans_a else A.shape[0]
    cdef int k = A.shape[0] if trans_a else A.shape[1]
    cdef int item = A.itemsize
    cdef int nr = CGRU_NR_F if A.dtype == np.float32 else CGRU_NR_D
    if C.shape[0] != m or C.shape[1] != n or n < 0:
        raise ValueError(f"C: expected shape {[m, n]}, got {list(C.shape)}")
    if Bp.shape[0] != cgru_packed_size(n, k, nr):
        raise ValueError(f"Bp: expected the {cgru_packed_size(n, k, nr)} elements of a packed "
                         f"[{k}, {n}] matrix, got {Bp.shape[0]}")
    for name, arr in (("A", A), ("C", C)):
        if arr.shape[1] > 1 and arr.strides[1] != item or arr.strides[0] % item \
                or arr.strides[0] < 0:
            raise ValueError(f"{name}: expected unit inner stride and a positive row stride")
    if not C.flags.writeable:
        raise ValueError("C: expected a writable array")
    if m == 0 or n == 0:
        return
    cdef int lda = A.strides[0] // item if A.shape[0] > 1 else max(A.shape[1], 1)
    cdef int ldc = C.strides[0] // item if m > 1 else max(n, 1)
    cdef cnp.ndarray a = A, bp = Bp, c = C
    cdef bint f32 = A.dtype == np.float32
    cdef void *pa = cnp.PyArray_DATA(a)
    cdef void *pb = cnp.PyArray_DATA(bp)
    cdef void *pc = cnp.PyArray_DATA(c)
    with nogil:
        if f32:
            cgru_gemm_packed_f32_t_at(level, ta, m, n, k, <const float *>pa, lda,
                                      <const float *>pb, beta1, <float *>pc, ldc)
        else:
            cgru_gemm_packed_f64_t_at(level, ta, m, n, k, <const double *>pa, lda,
                                      <const double *>pb, beta1, <double *>pc, ldc)


def vector_math_f32(name, x, isa=None):
    """``sigmoid`` or ``tanh`` of a float32 array through the kernels' vector code (for
    tests)."""
    return vector_math(name, np.ascontiguousarray(x, np.float32), isa)


def vector_math(name, x, isa=None):
    """``sigmoid`` or ``tanh`` of a C-contiguous float32 or float64 array through the kernels'
    vector code (for tests).  ``isa``: run the code of that level (4 AVX-512, 3 AVX2+FMA, 0
    portable; at most ``cgru_isa()``)."""
    cdef int level = _level(isa)
    cdef cnp.ndarray a = np.ascontiguousarray(x)
    cdef cnp.ndarray out = np.empty_like(a)
    if name not in ("sigmoid", "tanh"):
        raise ValueError(f"name: expected 'sigmoid' or 'tanh', got {name!r}")
    if a.dtype == np.float32:
        (cgru_sigmoid_f32_at if name == "sigmoid" else cgru_tanh_f32_at)(
            level, a.size, <const float *>cnp.PyArray_DATA(a), <float *>cnp.PyArray_DATA(out))
    elif a.dtype == np.float64:
        (cgru_sigmoid_f64_at if name == "sigmoid" else cgru_tanh_f64_at)(
            level, a.size, <const double *>cnp.PyArray_DATA(a), <double *>cnp.PyArray_DATA(out))
    else:
        raise TypeError(f"x: expected float32 or float64, got {a.dtype}")
    return out


cdef extern from "gates.h" nogil:
    # each ISA level of the fused row kernels (tests: gate_row)
    void cgru_gru_fwd_ra_f32_at(int isa, int H, const float *gx, const float *gh,
                                const float *b, const float *bhn, const float *hp, float *g3,
                                float *hn, float *hnew, int flip)
    void cgru_gru_fwd_ra_f64_at(int isa, int H, const double *gx, const double *gh,
                                const double *b, const double *bhn, const double *hp,
                                double *g3, double *hn, double *hnew, int flip)
    void cgru_gru_bwd_ra_f32_at(int isa, int H, const float *g3, const float *hp,
                                const float *hn, float *dh, float *dgx, float *dgh, int flip)
    void cgru_gru_bwd_ra_f64_at(int isa, int H, const double *g3, const double *hp,
                                const double *hn, double *dh, double *dgx, double *dgh,
                                int flip)
    void cgru_gru_fwd_rb_rz_f32_at(int isa, int H, const float *gx, const float *gh,
                                   const float *b, const float *hp, const float *m, float *g3,
                                   float *rh)
    void cgru_gru_fwd_rb_rz_f64_at(int isa, int H, const double *gx, const double *gh,
                                   const double *b, const double *hp, const double *m,
                                   double *g3, double *rh)
    void cgru_gru_fwd_rb_n_f32_at(int isa, int H, const float *gxn, const float *ghn,
                                  const float *bn, const float *z, const float *hp, float *n,
                                  float *hnew, int flip)
    void cgru_gru_fwd_rb_n_f64_at(int isa, int H, const double *gxn, const double *ghn,
                                  const double *bn, const double *z, const double *hp,
                                  double *n, double *hnew, int flip)
    void cgru_gru_bwd_rb_f32_at(int isa, int H, const float *g3, const float *hp,
                                const float *m, float *dh, float *dgx, float *rhm, int flip)
    void cgru_gru_bwd_rb_f64_at(int isa, int H, const double *g3, const double *hp,
                                const double *m, double *dh, double *dgx, double *rhm,
                                int flip)
    void cgru_gru_bwd_rb_r_f32_at(int isa, int H, const float *g3, const float *hp,
                                  const float *m, const float *drh, float *dh, float *dgx)
    void cgru_gru_bwd_rb_r_f64_at(int isa, int H, const double *g3, const double *hp,
                                  const double *m, const double *drh, double *dh,
                                  double *dgx)
    void cgru_lstm_fwd_f32_at(int isa, int H, const float *gx, const float *gh, const float *b,
                              const float *cp, float *g4, float *cn, float *hf)
    void cgru_lstm_fwd_f64_at(int isa, int H, const double *gx, const double *gh,
                              const double *b, const double *cp, double *g4, double *cn,
                              double *hf)
    void cgru_lstm_bwd_f32_at(int isa, int H, const float *g4, const float *cp,
                              const float *cn, const float *dhf, float *dc, float *da)
    void cgru_lstm_bwd_f64_at(int isa, int H, const double *g4, const double *cp,
                              const double *cn, const double *dhf, double *dc, double *da)
    void cgru_rnn_fwd_f32_at(int isa, int H, const float *gx, const float *gh, const float *b,
                             float *hn, int relu)
    void cgru_rnn_fwd_f64_at(int isa, int H, const double *gx, const double *gh,
                             const double *b, double *hn, int relu)
    void cgru_rnn_bwd_f32_at(int isa, int H, const float *hn, float *dh, float *da, int relu)
    void cgru_rnn_bwd_f64_at(int isa, int H, const double *hn, double *dh, double *da,
                             int relu)


# kernel: (its operands in order, each (name, width in H, role)); role "in" is read, "mask"
# read or None (NULL: no mask), "inout" read and overwritten, "out" written
GATE_ROWS = {
    "gru_fwd_ra": (("gx", 3, "in"), ("gh", 3, "in"), ("b", 3, "in"), ("bhn", 1, "in"),
                   ("hp", 1, "in"), ("g3", 3, "out"), ("hn", 1, "out"), ("hnew", 1, "out")),
    "gru_bwd_ra": (("g3", 3, "in"), ("hp", 1, "in"), ("hn", 1, "in"), ("dh", 1, "inout"),
                   ("dgx", 3, "out"), ("dgh", 1, "out")),
    "gru_fwd_rb_rz": (("gx", 2, "in"), ("gh", 2, "in"), ("b", 2, "in"), ("hp", 1, "in"),
                      ("m", 1, "mask"), ("g3", 2, "out"), ("rh", 1, "out")),
    "gru_fwd_rb_n": (("gxn", 1, "in"), ("ghn", 1, "in"), ("bn", 1, "in"), ("z", 1, "in"),
                     ("hp", 1, "in"), ("n", 1, "out"), ("hnew", 1, "out")),
    "gru_bwd_rb": (("g3", 3, "in"), ("hp", 1, "in"), ("m", 1, "mask"), ("dh", 1, "inout"),
                   ("dgx", 3, "inout"), ("rhm", 1, "out")),
    "gru_bwd_rb_r": (("g3", 1, "in"), ("hp", 1, "in"), ("m", 1, "mask"), ("drh", 1, "in"),
                     ("dh", 1, "inout"), ("dgx", 1, "out")),
    "lstm_fwd": (("gx", 4, "in"), ("gh", 4, "in"), ("b", 4, "in"), ("cp", 1, "in"),
                 ("g4", 4, "out"), ("cn", 1, "out"), ("hf", 1, "out")),
    "lstm_bwd": (("g4", 4, "in"), ("cp", 1, "in"), ("cn", 1, "in"), ("dhf", 1, "in"),
                 ("dc", 1, "inout"), ("da", 4, "out")),
    "rnn_fwd": (("gx", 1, "in"), ("gh", 1, "in"), ("b", 1, "in"), ("hn", 1, "out")),
    "rnn_bwd": (("hn", 1, "in"), ("dh", 1, "inout"), ("da", 1, "out")),
}


cdef void _gate_row(int kernel, int isa, int H, int option, void **p, bint f32) noexcept nogil:
    # one row through kernel (GATE_ROWS' order) at ISA level isa; p: the operands in order
    if kernel == 0:
        if f32:
            cgru_gru_fwd_ra_f32_at(isa, H, <float *>p[0], <float *>p[1], <float *>p[2],
                                   <float *>p[3], <float *>p[4], <float *>p[5], <float *>p[6],
                                   <float *>p[7], option)
        else:
            cgru_gru_fwd_ra_f64_at(isa, H, <double *>p[0], <double *>p[1], <double *>p[2],
                                   <double *>p[3], <double *>p[4], <double *>p[5],
                                   <double *>p[6], <double *>p[7], option)
    elif kernel == 1:
        if f32:
            cgru_gru_bwd_ra_f32_at(isa, H, <float *>p[0], <float *>p[1], <float *>p[2],
                                   <float *>p[3], <float *>p[4], <float *>p[5], option)
        else:
            cgru_gru_bwd_ra_f64_at(isa, H, <double *>p[0], <double *>p[1], <double *>p[2],
                                   <double *>p[3], <double *>p[4], <double *>p[5], option)
    elif kernel == 2:
        if f32:
            cgru_gru_fwd_rb_rz_f32_at(isa, H, <float *>p[0], <float *>p[1], <float *>p[2],
                                      <float *>p[3], <float *>p[4], <float *>p[5],
                                      <float *>p[6])
        else:
            cgru_gru_fwd_rb_rz_f64_at(isa, H, <double *>p[0], <double *>p[1], <double *>p[2],
                                      <double *>p[3], <double *>p[4], <double *>p[5],
                                      <double *>p[6])
    elif kernel == 3:
        if f32:
            cgru_gru_fwd_rb_n_f32_at(isa, H, <float *>p[0], <float *>p[1], <float *>p[2],
                                     <float *>p[3], <float *>p[4], <float *>p[5],
                                     <float *>p[6], option)
        else:
            cgru_gru_fwd_rb_n_f64_at(isa, H, <double *>p[0], <double *>p[1], <double *>p[2],
                                     <double *>p[3], <double *>p[4], <double *>p[5],
                                     <double *>p[6], option)
    elif kernel == 4:
        if f32:
            cgru_gru_bwd_rb_f32_at(isa, H, <float *>p[0], <float *>p[1], <float *>p[2],
                                   <float *>p[3], <float *>p[4], <float *>p[5], option)
        else:
            cgru_gru_bwd_rb_f64_at(isa, H, <double *>p[0], <double *>p[1], <double *>p[2],
                                   <double *>p[3], <double *>p[4], <double *>p[5], option)
    elif kernel == 5:
        if f32:
            cgru_gru_bwd_rb_r_f32_at(isa, H, <float *>p[0], <float *>p[1], <float *>p[2],
                                     <float *>p[3], <float *>p[4], <float *>p[5])
        else:
            cgru_gru_bwd_rb_r_f64_at(isa, H, <double *>p[0], <double *>p[1], <double *>p[2],
                                     <double *>p[3], <double *>p[4], <double *>p[5])
    elif kernel == 6:
        if f32:
            cgru_lstm_fwd_f32_at(isa, H, <float *>p[0], <float *>p[1], <float *>p[2],
                                 <float *>p[3], <float *>p[4], <float *>p[5], <float *>p[6])
        else:
            cgru_lstm_fwd_f64_at(isa, H, <double *>p[0], <double *>p[1], <double *>p[2],
                                 <double *>p[3], <double *>p[4], <double *>p[5],
                                 <double *>p[6])
    elif kernel == 7:
        if f32:
            cgru_lstm_bwd_f32_at(isa, H, <float *>p[0], <float *>p[1], <float *>p[2],
                                 <float *>p[3], <float *>p[4], <float *>p[5])
        else:
            cgru_lstm_bwd_f64_at(isa, H, <double *>p[0], <double *>p[1], <double *>p[2],
                                 <double *>p[3], <double *>p[4], <double *>p[5])
    elif kernel == 8:
        if f32:
            cgru_rnn_fwd_f32_at(isa, H, <float *>p[0], <float *>p[1], <float *>p[2],
                                <float *>p[3], option)
        else:
            cgru_rnn_fwd_f64_at(isa, H, <double *>p[0], <double *>p[1], <double *>p[2],
                                <double *>p[3], option)
    else:
        if f32:
            cgru_rnn_bwd_f32_at(isa, H, <float *>p[0], <float *>p[1], <float *>p[2], option)
        else:
            cgru_rnn_bwd_f64_at(isa, H, <double *>p[0], <double *>p[1], <double *>p[2],
                                option)


def gate_row(kernel, operands, int option=0, isa=None):
    """One row through a fused gate kernel of ``gates.h`` (for tests): ``kernel`` a key of
    ``GATE_ROWS``, ``operands`` its "in", "mask" (or None) and "inout" operands by name (1-D
    arrays of one float dtype, each of its width times H), ``option`` the kernel's flag (GRU: flip_z, RNN: relu),
    ``isa`` the level to run (4 AVX-512, 3 AVX2+FMA, 0 portable; at most ``cgru_isa()``).
    Returns the "inout" and "out" operands as new arrays; the given ones are not modified."""
    cdef int level = _level(isa)
    if kernel not in GATE_ROWS:
        raise ValueError(f"kernel: expected one of {sorted(GATE_ROWS)}, got {kernel!r}")
    spec = GATE_ROWS[kernel]
    given = {name for name, _, role in spec if role != "out"}
    if set(operands) != given:
        raise ValueError(f"operands: expected {sorted(given)}, got {sorted(operands)}")
    first = operands[spec[0][0]]
    dtype = np.asarray(first).dtype
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"operands: expected float32 or float64, got {dtype}")
    cdef int H = np.asarray(first).size // spec[0][1]
    cdef void *p[8]
    arrays, results = [], {}
    for name, width, role in spec:
        if role == "out":
            a = np.full(width * H, np.nan, dtype)
        elif role == "mask" and operands[name] is None:
            a = None
        else:
            a = np.array(operands[name], dtype=dtype, copy=True, order="C")
            if a.ndim != 1 or a.dtype != dtype or a.size != width * H:
                raise ValueError(f"{name}: expected {width * H} elements of {dtype}, got "
                                 f"{a.size} of {a.dtype}")
        if role in ("inout", "out"):
            results[name] = a
        arrays.append(a)
    cdef cnp.ndarray arr
    for i, a in enumerate(arrays):
        if a is None:
            p[i] = NULL
        else:
            arr = a
            p[i] = cnp.PyArray_DATA(arr)
    cdef int code = list(GATE_ROWS).index(kernel)
    cdef bint f32 = dtype == np.float32
    with nogil:
        _gate_row(code, level, H, option, p, f32)
    return results


cgru_isa()  # decide the ISA once, at import, before any thread can ask


def simd_isa():
    """The vector code the time loops' GEMM runs: "AVX-512", "AVX2+FMA" or "baseline"."""
    return {4: "AVX-512", 3: "AVX2+FMA"}.get(cgru_isa(), "baseline")


SHORT_K = CGRU_SHORT_K      # products over an inner dimension this short run row after row


# --- fingerprints and byte comparison --------------------------------------------------------
# The fingerprint key: drawn once per process from the operating system's random source, never
# shown (a forked child inherits it, so a reserve made before a fork stays valid in the child).
cdef cgru_fp_key _fp_key


cdef void _draw_fp_key():
    cdef bytes words = os.urandom(4 * 260)
    cdef bytes points = os.urandom(16)
    cdef uint64_t p = (<uint64_t>1 << 61) - 1
    cdef uint64_t r[2]
    cdef int s
    memcpy(_fp_key.nh, <const char *>words, 4 * 260)
    memcpy(r, <const char *>points, 16)
    for s in range(2):
        _fp_key.r[s] = r[s] % p
        if _fp_key.r[s] == 0:
            _fp_key.r[s] = 1


_draw_fp_key()


def fingerprint(a, isa=None):
    """The keyed fingerprint (``hash.h``) of an array's bytes in C order: 16 bytes.  Equal bytes
    give equal fingerprints within a process (and its forked children); different bytes give
    equal ones with a probability bounded for every pair of inputs (below 2⁻⁴⁸ for 1 MiB) as
    long as the process's key is unknown to whoever chose them.  The dtype and shape are not
    part of it (the caller's MAC adds them).  ``isa`` (tests): run the code of that ISA level
    (4 AVX-512, 3 AVX2, 0 portable; at most ``cgru_isa()``) — all give the same result."""
    cdef cnp.ndarray c = np.ascontiguousarray(a)
    cdef const unsigned char *p = <const unsigned char *>cnp.PyArray_DATA(c)
    cdef size_t n = <size_t>c.nbytes
    cdef uint64_t out[2]
    cdef int level = _level(isa)
    with nogil:
        cgru_fingerprint(p, n, &_fp_key, out, level)
    return (<bytes>(<char *>out)[:16])


def copy_fingerprint(a, isa=None):
    """``(copy, fingerprint)``: a new C-contiguous copy of array ``a`` and ``fingerprint`` of
    the copy's bytes, taken in one pass (each KiB fingerprinted as it is copied).  The
    fingerprint is the copy's whatever another thread writes to ``a`` meanwhile.  ``a`` not
    C-contiguous: copied first, then fingerprinted."""
    cdef cnp.ndarray src = <cnp.ndarray?>a
    cdef cnp.ndarray copy
    if not src.flags.c_contiguous:
        copy = np.array(src, order="C", copy=True)
        return copy, fingerprint(copy, isa)
    copy = np.empty_like(src, order="C", subok=False)
    cdef const unsigned char *p = <const unsigned char *>cnp.PyArray_DATA(src)
    cdef unsigned char *q = <unsigned char *>cnp.PyArray_DATA(copy)
    cdef size_t n = <size_t>src.nbytes
    cdef uint64_t out[2]
    cdef int level = _level(isa)
    with nogil:
        cgru_fingerprint_copy(p, q, n, &_fp_key, out, level)
    return copy, (<bytes>(<char *>out)[:16])


def address(cnp.ndarray a):
    """The address of an array's first element (``a.ctypes.data`` without the ctypes object:
    a call's workspace and reserve are aligned by it)."""
    return <size_t>cnp.PyArray_DATA(a)


def array_key(cnp.ndarray a):
    """``(address, shape, strides, type number)`` of an array: what identifies the memory an
    array views (for a lookup only — a hit is proven by ``same_bytes``)."""
    return (<size_t>cnp.PyArray_DATA(a), (<object>a).shape, (<object>a).strides,
            cnp.PyArray_TYPE(a))


cdef enum:
    _COMPARE_PIECES = 8             # at most this many pieces of a comparison on the team
    _COMPARE_SHARED_BYTES = 1 << 18   # from this size on, two threads and more share one


cdef struct _Compare:
    const char *a
    const char *b
    size_t n, piece
    int differ[_COMPARE_PIECES]


cdef void _compare_piece(void *ctx, int item) noexcept nogil:
    cdef _Compare *J = <_Compare *>ctx
    cdef size_t lo = <size_t>item * J.piece
    cdef size_t hi = lo + J.piece
    if hi > J.n:
        hi = J.n
    J.differ[item] = lo < hi and memcmp(J.a + lo, J.b + lo, hi - lo) != 0


def same_bytes(a, b, int num_threads=1):
    """True when the two arrays hold the same bytes in C order (``b`` C-contiguous, of the same
    dtype and shape as ``a``; ``a`` of any memory layout).  No tolerance: -0.0 and 0.0 differ,
    a NaN equals the same NaN.  ``num_threads``: from 256 KiB on, the comparison is shared by up
    to that many of cgru's threads (a memory pass: two cores read it faster than one)."""
    if a.dtype != b.dtype or a.shape != b.shape or not b.flags.c_contiguous:
        return False
    cdef cnp.ndarray x = np.ascontiguousarray(a)
    cdef cnp.ndarray y = b
    cdef const void *px = cnp.PyArray_DATA(x)
    cdef const void *py = cnp.PyArray_DATA(y)
    cdef size_t n = <size_t>x.nbytes
    cdef int r = 0, i, pieces
    cdef _Compare J
    if num_threads > 1 and n >= _COMPARE_SHARED_BYTES:
        pieces = min(num_threads, _COMPARE_PIECES)
        J.a, J.b, J.n = <const char *>px, <const char *>py, n
        J.piece = (n + pieces - 1) // pieces
        with nogil:
            parallel_for(pieces, num_threads, _compare_piece, &J, NULL, NULL, pass_ns(2.0 * n))
        for i in range(pieces):
            r |= J.differ[i]
        return r == 0
    with nogil:
        r = memcmp(px, py, n) if n else 0
    return r == 0
