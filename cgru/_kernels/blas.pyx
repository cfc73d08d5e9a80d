"""Row-major GEMM for float and double over SciPy's Fortran BLAS.

Fortran BLAS is column-major: a row-major ``[m, n]`` array is, to Fortran, the ``[n, m]``
matrix ``Cᵀ``.  So row-major ``C = op(A)·op(B)`` is computed as Fortran
``Cᵀ = op(B)ᵀ·op(A)ᵀ``: pass B first, then A, swap m and n, keep each operand's own flag.
"""
from cython cimport floating
from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport PyObject
from cgru._kernels.threads cimport (is_worker, item_fn, parallel_for, pass_ns, poll_fn,
                                     product_ns, wtime)
import threading

import numpy as np
cimport numpy as cnp
from scipy.linalg.cython_blas cimport sgemm, dgemm, sgemv, dgemv

# the kernels' packed GEMM (simd.h), for the products whose weights come packed
from cgru._kernels.loops cimport (gemm_packed, gemm_packed_ta, cgru_packed_size, CGRU_NR_F,
                                  CGRU_NR_D)

cnp.import_array()

cdef extern from *:
    """
    #include <signal.h>
    static inline int cgru_gload(const int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void cgru_gstore(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline int cgru_gadd(int *p, int v) { return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL); }
    """
    int cgru_gload(const int *p) noexcept nogil
    void cgru_gstore(int *p, int v) noexcept nogil
    int cgru_gadd(int *p, int v) noexcept nogil
    int raise_signal "raise"(int sig) noexcept nogil
    int SIGINT


cdef void gemm(bint trans_a, bint trans_b, int m, int n, int k, floating alpha,
               const floating *A, int lda, const floating *B, int ldb,
               floating beta, floating *C, int ldc) noexcept nogil:
    cdef char ta = b't' if trans_a else b'n'
    cdef char tb = b't' if trans_b else b'n'
    cdef char tv
    cdef int inc_a, one = 1, rows, cols
    cdef Py_ssize_t i
    if m <= 0 or n <= 0:
        return
    if k <= 0:
        # BLAS leaves C untouched for k == 0 only when beta == 1; make it explicit.
        for i in range(m):
            scale_row(C + i * ldc, n, beta)
        return
    if m == 1:
        # c[1, n] = a[1, k] · op(B): Fortran sees B (row-major [k, n]) as the [n, k] matrix Bᵀ,
        # so c = Bᵀ_f · a  ("N"), and for B stored [n, k]  c = B_fᵀ · a  ("T").
        inc_a = lda if trans_a else 1
        if trans_b:
            tv = b't'
            rows = k
            cols = n
        else:
            tv = b'n'
            rows = n
            cols = k
        if floating is float:
            sgemv(&tv, &rows, &cols, &alpha, <float *>B, &ldb, <float *>A, &inc_a,
                  &beta, C, &one)
        else:
            dgemv(&tv, &rows, &cols, &alpha, <double *>B, &ldb, <double *>A, &inc_a,
                  &beta, C, &one)
        return
    if floating is float:
        sgemm(&tb, &ta, &n, &m, &k, &alpha, <float *>B, &ldb, <float *>A, &lda,
              &beta, C, &ldc)
    else:
        dgemm(&tb, &ta, &n, &m, &k, &alpha, <double *>B, &ldb, <double *>A, &lda,
              &beta, C, &ldc)


cdef inline void scale_row(floating *c, int n, floating beta) noexcept nogil:
    cdef int j
    if beta == 0:
        for j in range(n):
            c[j] = 0
    elif beta != 1:
        for j in range(n):
            c[j] = beta * c[j]


def _operands(fn, bint trans_a, bint trans_b, A, B, C, Py_ssize_t itemsize):
    """``(m, n, k, lda, ldb, ldc)`` of row-major ``C[m, n] = op(A)·op(B)``, after checking the
    shapes agree and every operand has unit inner stride and a row stride BLAS can express
    (``ValueError`` naming ``fn`` and the operand otherwise)."""
    m = A.shape[1] if trans_a else A.shape[0]
    k = A.shape[0] if trans_a else A.shape[1]
    kb = B.shape[1] if trans_b else B.shape[0]
    n = B.shape[0] if trans_b else B.shape[1]
    if kb != k or C.shape[0] != m or C.shape[1] != n:
        raise ValueError(f"{fn}: shapes do not match: op(A) [{m}, {k}], op(B) [{kb}, {n}], "
                         f"C [{C.shape[0]}, {C.shape[1]}]")
    return (m, n, k, _leading(fn, A, "A", itemsize), _leading(fn, B, "B", itemsize),
            _leading(fn, C, "C", itemsize))


def _leading(fn, arr, name, Py_ssize_t itemsize):
    """The leading dimension (row stride in elements) of the 2-D operand ``arr``, after
    checking it has unit inner stride and a row stride BLAS can express."""
    return _leading_of(fn, name, arr.shape[0], arr.shape[1], arr.strides[0], arr.strides[1],
                       itemsize)


cdef Py_ssize_t _leading_of(fn, name, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t s0,
                            Py_ssize_t s1, Py_ssize_t itemsize) except -1:
    """``_leading`` of an operand of ``rows`` × ``cols`` elements with byte strides ``s0``,
    ``s1`` (the one rule, for memoryviews and NumPy arrays alike)."""
    if rows * cols > 0 and s1 != itemsize:
        raise ValueError(f"{fn}: {name} must have unit stride along its last axis")
    if rows > 1 and cols > 0 and (s0 % itemsize or s0 // itemsize < cols):
        raise ValueError(f"{fn}: {name} must have a positive row stride of at least its "
                         f"row length ({cols * itemsize} bytes), got {s0}")
    return max(1, s0 // itemsize if rows > 1 else cols)


def gemm_rm(bint trans_a, bint trans_b, double alpha, const floating[:, :] A,
            const floating[:, :] B, double beta, floating[:, :] C):
    """``C = alpha·op(A)·op(B) + beta·C`` on row-major 2-D arrays (for tests and tools).

    Each array may be a row-strided view (unit stride along its last axis).
    """
    cdef int m, n, k, lda, ldb, ldc
    m, n, k, lda, ldb, ldc = _operands("gemm_rm", trans_a, trans_b, A, B, C, sizeof(floating))
    cdef const floating *pa = &A[0, 0] if A.shape[0] * A.shape[1] > 0 else NULL
    cdef const floating *pb = &B[0, 0] if B.shape[0] * B.shape[1] > 0 else NULL
    if m == 0 or n == 0:
        return
    with nogil:
        gemm(trans_a, trans_b, m, n, k, <floating>alpha, pa, lda, pb, ldb, <floating>beta,
             &C[0, 0], ldc)


# --- whole-sequence GEMMs as blocks on an OpenMP team ---------------------------------------
# Each block runs as sub-chunks of about CHUNK_FLOPS flops (one BLAS call each), so that a
# signal handler (Ctrl-C) is run and stops the product within one sub-chunk: the calling thread
# runs Python's signal handlers between its sub-chunks (main-thread calls only) and while it
# waits, every POLL_SECONDS; an exception stops every block at its next sub-chunk.
#
# A sub-chunk is never shorter than MIN_CHUNK_ROWS rows of C (or steps of k), because each one
# costs again what one call costs once: OpenBLAS packs the whole right-hand operand — the
# weights, K×N — for every call, and a stretch of k reads and writes all of C.  That costs
# about as much as 25 rows of multiply-adds (about 1 ns per element against 2 flops per
# element and row at 50 GFLOP/s), so 512 rows keep it near 5 %.  With 64 (the old floor) an
# H=1024 layer's input projection packed its 12 MB of weights eleven times and ran 20 % slower.
# The price: a sub-chunk of a very wide layer takes longer (H=1024: about 3 GFLOP, 60 ms on
# one core), so Ctrl-C can take that long to stop it.
cdef double CHUNK_FLOPS = <double>(1 << 27)
cdef double POLL_SECONDS = 0.05
cdef int MIN_CHUNK_ROWS = 512

# Test probe: raise SIGINT before sub-chunk `at` (counted over the call), and count them.
cdef int _probe_at = -1
cdef int _probe_chunks = 0
cdef int _probe_poll_now = 0
cdef int _probe_fired = 0      # the probe raised SIGINT and no poll has seen it yet


def gemm_chunk_flops(value=None, min_rows=None):
    """The flops per sub-chunk of the whole-sequence GEMMs, and the fewest rows (or steps of
    k) a sub-chunk has (set them, for tests); returns the previous ``(flops, min_rows)``."""
    global CHUNK_FLOPS, MIN_CHUNK_ROWS
    old = (CHUNK_FLOPS, MIN_CHUNK_ROWS)
    if value is not None:
        CHUNK_FLOPS = float(value)
    if min_rows is not None:
        MIN_CHUNK_ROWS = max(1, int(min_rows))
    return old


def gemm_probe(int at=-1):
    """Arm (``at`` ≥ 0) or disarm (-1) the GEMM test probe: SIGINT is raised as the sub-chunk
    numbered ``at`` of the next products starts; resets the count."""
    global _probe_at, _probe_chunks, _probe_poll_now, _probe_fired
    _probe_at, _probe_chunks, _probe_poll_now, _probe_fired = at, 0, 0, 0


def gemm_probe_chunks():
    """How many sub-chunks started since the probe was armed."""
    return cgru_gload(&_probe_chunks)


cdef struct GemmJob:
    bint trans_a
    bint trans_b
    int m, n, k, lda, ldb, ldc, n_blocks, chunk
    int col_blocks          # packed: C split into n_blocks / col_blocks row blocks, each into
                            #   col_blocks blocks of whole panels of columns (else 1)
    double alpha, beta
    const void *A
    const void *B           # B, or op(B) packed (loops.pack_rhs) when `packed`
    bint packed
    bint split_rows         # trans_a: blocks of C's rows (each over all of k), not of k
    void *C
    void *partial           # [n_blocks − 1, m, n] partial sums of the k-split (trans_a)
    int abort               # set when a signal handler raised: every block stops
    bint poll               # a main-thread call: its thread runs the signal handlers
    double next_poll
    PyObject *errors        # list: what the signal handlers raised


cdef void gemm_poll(void *ctx) noexcept nogil:
    """On the calling thread of a main-thread call: run Python's signal handlers every
    POLL_SECONDS (at once after the probe fired); an exception is kept and stops the GEMM."""
    cdef GemmJob *J = <GemmJob *>ctx
    cdef double now
    if not J.poll or is_worker() or cgru_gload(&J.abort):
        return
    now = wtime()
    if now < J.next_poll and not cgru_gload(&_probe_poll_now):
        return
    J.next_poll = now + POLL_SECONDS
    cgru_gstore(&_probe_poll_now, 0)
    run_signal_handlers(J)


cdef void run_signal_handlers(GemmJob *J) noexcept with gil:
    """gemm_poll's Python half, in a function of its own: a nogil function that holds a
    Python object (the caught exception) takes the GIL at every exit, early returns
    included, so on a team thread without a Python thread state every poll would create and
    delete one — taking the interpreter's thread-list lock without the GIL, which a fork()
    at that moment leaves locked in the child (CPython 3.11 then deadlocks re-initialising
    the child's threads)."""
    try:
        PyErr_CheckSignals()
    except BaseException as e:
        (<list>J.errors).append(e)
        cgru_gstore(&J.abort, 1)
        cgru_gstore(&_probe_fired, 0)


cdef bint chunk_start(GemmJob *J) noexcept nogil:
    """Before a sub-chunk: False when the GEMM must stop."""
    cdef int c
    if cgru_gload(&J.abort):
        return False
    cdef double until
    if _probe_at >= 0:
        c = cgru_gadd(&_probe_chunks, 1) - 1
        if c == _probe_at:
            # as Ctrl-C would: the signal, then the poll that notices it
            cgru_gstore(&_probe_fired, 1)
            raise_signal(SIGINT)
            cgru_gstore(&_probe_poll_now, 1)
        if cgru_gload(&_probe_fired):
            # From the signal to the caller's poll that sees it, no sub-chunk starts, so that
            # where the product stops does not depend on scheduling (the signal handler may
            # take a while on another thread, the caller may wait for the GIL): the caller waits
            # (bounded) until the signal has been raised and then polls, the others until the
            # poll has stopped the GEMM.
            until = wtime() + 60.0
            if is_worker() or not J.poll:
                while not cgru_gload(&J.abort) and wtime() < until:
                    pass
            else:
                while not cgru_gload(&_probe_poll_now) and wtime() < until:
                    pass
    gemm_poll(J)
    return not cgru_gload(&J.abort)


cdef inline void gemm_block(const floating *sample, GemmJob *J, int blk) noexcept nogil:
    cdef const floating *pa = <const floating *>J.A
    cdef const floating *pb = <const floating *>J.B
    cdef floating *pc = <floating *>J.C
    cdef floating *pp = <floating *>J.partial
    cdef int i0, i1, s0, s1, nr, panels, rb, cb, n = J.n
    cdef floating beta
    if J.packed:
        # row block rb, column block cb: whole panels p0 … p1 − 1 of the pack
        nr = CGRU_NR_F if floating is float else CGRU_NR_D
        rb, cb = blk // J.col_blocks, blk % J.col_blocks
        panels = (J.n + nr - 1) // nr
        s0 = <int>((<long long>cb * panels) // J.col_blocks)
        s1 = <int>((<long long>(cb + 1) * panels) // J.col_blocks)
        n = min(J.n, s1 * nr) - s0 * nr
        pb += <Py_ssize_t>s0 * nr * J.k
        pc += s0 * nr
        blk = rb
    if J.packed or not J.trans_a:
        i0 = <int>((<long long>blk * J.m) // (J.n_blocks // J.col_blocks))
        i1 = <int>((<long long>(blk + 1) * J.m) // (J.n_blocks // J.col_blocks))
        s0 = i0
        while s0 < i1:
            s1 = min(i1, s0 + J.chunk)
            if not chunk_start(J):
                return
            # C[s0:s1] = op(A)[s0:s1] · op(B)  (A's rows s0:s1; trans_a: A's columns, each
            # row of C over all of k)
            if J.trans_a:
                gemm_packed_ta(s1 - s0, n, J.k, pa + s0, J.lda, pb, J.beta != 0,
                               pc + <Py_ssize_t>s0 * J.ldc, J.ldc)
            elif J.packed:
                gemm_packed(s1 - s0, n, J.k, pa + <Py_ssize_t>s0 * J.lda, J.lda, pb,
                            J.beta != 0, pc + <Py_ssize_t>s0 * J.ldc, J.ldc)
            else:
                gemm(False, J.trans_b, s1 - s0, J.n, J.k, <floating>J.alpha,
                     pa + <Py_ssize_t>s0 * J.lda, J.lda, pb, J.ldb, <floating>J.beta,
                     pc + <Py_ssize_t>s0 * J.ldc, J.ldc)
            s0 = s1
        return
    if J.split_rows:
        # C[i0:i1] (+)= A[:, i0:i1]ᵀ · op(B), as sub-chunks of k added up in order
        i0 = <int>((<long long>blk * J.m) // J.n_blocks)
        i1 = <int>((<long long>(blk + 1) * J.m) // J.n_blocks)
        beta = <floating>J.beta
        s0 = 0
        while s0 < J.k:
            s1 = min(J.k, s0 + J.chunk)
            if not chunk_start(J):
                return
            gemm(True, J.trans_b, i1 - i0, J.n, s1 - s0, <floating>J.alpha,
                 pa + <Py_ssize_t>s0 * J.lda + i0, J.lda,
                 pb + (s0 if J.trans_b else <Py_ssize_t>s0 * J.ldb), J.ldb, beta,
                 pc + <Py_ssize_t>i0 * J.ldc, J.ldc)
            beta = 1
            s0 = s1
        return
    i0 = <int>((<long long>blk * J.k) // J.n_blocks)
    i1 = <int>((<long long>(blk + 1) * J.k) // J.n_blocks)
    # C (+)= A[i0:i1]ᵀ · op(B)[i0:i1]: block 0 into C, block b into partial[b−1], each as
    # sub-chunks of the inner dimension added up in order
    if blk > 0:
        pc = pp + <Py_ssize_t>(blk - 1) * J.m * J.n
    beta = <floating>J.beta if blk == 0 else 0
    s0 = i0
    while s0 < i1:
        s1 = min(i1, s0 + J.chunk)
        if not chunk_start(J):
            return
        gemm(True, J.trans_b, J.m, J.n, s1 - s0, <floating>J.alpha,
             pa + <Py_ssize_t>s0 * J.lda, J.lda,
             pb + (s0 if J.trans_b else <Py_ssize_t>s0 * J.ldb), J.ldb, beta,
             pc, J.ldc if blk == 0 else J.n)
        beta = 1
        s0 = s1


cdef inline void sum_partials(const floating *sample, const GemmJob *J, int part) noexcept nogil:
    """C[rows of part] += partial[0] + partial[1] + … in block order."""
    cdef floating *pc = <floating *>J.C
    cdef const floating *pp = <const floating *>J.partial
    cdef int r0 = <int>((<long long>part * J.m) // J.n_blocks)
    cdef int r1 = <int>((<long long>(part + 1) * J.m) // J.n_blocks)
    cdef int i, j, blk
    for i in range(r0, r1):
        for blk in range(J.n_blocks - 1):
            for j in range(J.n):
                pc[<Py_ssize_t>i * J.ldc + j] += pp[(<Py_ssize_t>blk * J.m + i) * J.n + j]


cdef void gemm_item_f(void *ctx, int blk) noexcept nogil:
    gemm_block(<const float *>NULL, <GemmJob *>ctx, blk)


cdef void gemm_item_d(void *ctx, int blk) noexcept nogil:
    gemm_block(<const double *>NULL, <GemmJob *>ctx, blk)


cdef void sum_item_f(void *ctx, int part) noexcept nogil:
    sum_partials(<const float *>NULL, <const GemmJob *>ctx, part)


cdef void sum_item_d(void *ctx, int part) noexcept nogil:
    sum_partials(<const double *>NULL, <const GemmJob *>ctx, part)


def gemm_blocks(bint trans_a, bint trans_b, double alpha, const floating[:, :] A,
                const floating[:, :] B, double beta, floating[:, :] C, int n_blocks,
                int num_threads, floating[::1] partial=None, bint split_rows=False):
    """``gemm_rm`` as ``n_blocks`` blocks of single-threaded BLAS calls spread over
    a team of up to ``num_threads`` OpenMP threads (``threads.parallel_for``).

    Without ``trans_a`` the rows of C are split (each block re-packs only B, the weights).
    With ``trans_a`` — ``C[m, n] = Aᵀ·op(B)`` with a long inner dimension k, the weight
    gradients — k is split instead: block 0 accumulates into C, the others into scratch
    partial sums added to C afterwards in block order (``partial``: at least
    ``(n_blocks − 1)·m·n`` elements of the call's workspace; ``None``: allocated here); or,
    with ``split_rows`` (an inner dimension too short to split), C's rows, each block over
    all of k (``Aᵀ``'s rows are A's columns: no partial sums).  Each
    block runs as sub-chunks of at most
    about ``gemm_chunk_flops()`` flops (rows of C, or a stretch of k added up in order), and a
    main-thread call runs Python's signal handlers between them: Ctrl-C stops the product
    within a sub-chunk (``KeyboardInterrupt``, C left partly written).  The split depends on
    ``n_blocks`` and the shapes only (never on the thread count), so the result does not
    depend on ``num_threads``; BLAS's own thread pool stays idle, so it cannot fight with the
    team threads of the time loops.  BLAS must be held at one thread around this call
    (``cgru._kernels.threads.blas_single_threaded``; ``cgru.core.plan.gemm`` does it).
    """
    cdef GemmJob J
    J.m, J.n, J.k, J.lda, J.ldb, J.ldc = _operands("gemm_blocks", trans_a, trans_b, A, B, C,
                                                   sizeof(floating))
    if J.m == 0 or J.n == 0:
        return
    J.trans_a, J.trans_b, J.alpha, J.beta = trans_a, trans_b, alpha, beta
    J.A = &A[0, 0] if A.shape[0] * A.shape[1] > 0 else NULL
    J.B = &B[0, 0] if B.shape[0] * B.shape[1] > 0 else NULL
    J.packed = False
    J.col_blocks = 1
    J.split_rows = trans_a and split_rows
    J.C = &C[0, 0]
    J.partial = NULL
    J.n_blocks = max(1, min(n_blocks, J.k if trans_a and not J.split_rows else J.m))
    errors = []
    num_threads = start_job(&J, errors, num_threads)
    cdef Py_ssize_t need = (<Py_ssize_t>J.n_blocks - 1) * J.m * J.n
    if trans_a and not J.split_rows and J.n_blocks > 1:
        if partial is None:
            partial = np.empty(need, dtype=np.float32 if floating is float else np.float64)
        elif partial.shape[0] < need:
            raise ValueError(f"gemm_blocks: partial has {partial.shape[0]} elements; the "
                             f"{J.n_blocks} blocks of a [{J.m}, {J.n}] product need {need}")
        J.partial = &partial[0]
    cdef item_fn item = gemm_item_f if floating is float else gemm_item_d
    cdef item_fn summ = sum_item_f if floating is float else sum_item_d
    cdef double work = product_ns(<double>J.m * J.n * J.k, floating is double)
    cdef double sum_work = pass_ns(<double>J.n_blocks * J.m * J.n * sizeof(floating))
    with nogil:
        parallel_for(J.n_blocks, num_threads, item, &J, gemm_poll, &J, work)
        if J.partial != NULL and not cgru_gload(&J.abort):
            parallel_for(J.n_blocks, num_threads, summ, &J, NULL, NULL, sum_work)
    if errors:
        raise errors[0]


cdef int start_job(GemmJob *J, list errors, int num_threads):
    """The sub-chunk size, the polling state and the team size of a job whose operands and
    blocks are set."""
    cdef double per
    # sub-chunks: rows of C (each 2·n·k flops: the packed GEMM's, trans_a or not) or a stretch
    # of k (each step 2·m·n flops, of the block's m rows when split_rows)
    per = 2.0 * J.n * (J.m / J.n_blocks if J.split_rows
                       else J.m if (J.trans_a and not J.packed) else J.k)
    J.chunk = max(MIN_CHUNK_ROWS, <int>min(<double>(1 << 30), CHUNK_FLOPS / max(per, 1.0)))
    J.abort = 0
    J.poll = threading.current_thread() is threading.main_thread()
    J.next_poll = wtime() + POLL_SECONDS
    J.errors = <PyObject *>errors
    return max(1, min(num_threads, J.n_blocks))


def gemm_packed_blocks(A, Bp, C, bint beta1, int n_blocks, int num_threads,
                       bint trans_a=False, int col_blocks=1):
    """``C[m, n] = op(A)[m, k] · op(B)`` (``+ C`` with ``beta1``), ``op(B)`` packed by
    ``loops.pack_rhs`` (the caller's: a pack is made from the very array it stands for), as
    ``gemm_blocks`` runs a product without ``trans_a`` — blocks of C's rows on an OpenMP team,
    sub-chunks, signal polling — on the kernels' packed GEMM (``simd.h``) instead of BLAS: the
    weights are packed once, not once per call, and every element of C is one sum over k in
    increasing order, so the result does not depend on the blocks, the sub-chunks, the thread
    count or which rows share a call (a time loop's one step computes its rows bit for bit as
    a whole sequence does).  A and C: row-strided views with unit inner stride; with
    ``trans_a`` A is ``[k, m]`` (``C = Aᵀ·op(B)``: a weight gradient, split the same way, over
    C's rows, each over all of k).  ``col_blocks`` splits each block of rows further into that
    many blocks of whole panels of columns (a product with few rows, which row blocks alone
    would leave to one thread); that too leaves every element's sum as it is.

    A, Bp (1-D, contiguous) and C (writable) are NumPy arrays of one dtype, float32 or
    float64 in the machine's byte order, checked here with NumPy's C API: typed memoryviews
    of either dtype cost 2–3 µs a call to dispatch and acquire, more than the arithmetic of a
    one-row step's products."""
    cdef GemmJob J
    cdef int typenum = _float_type("gemm_packed_blocks", A, "A", 2)
    if _float_type("gemm_packed_blocks", Bp, "Bp", 1) != typenum or \
            _float_type("gemm_packed_blocks", C, "C", 2) != typenum:
        raise TypeError(f"gemm_packed_blocks: A, Bp and C must have one dtype, got {A.dtype}, "
                        f"{Bp.dtype} and {C.dtype}")
    cdef bint f32 = typenum == cnp.NPY_FLOAT32
    cdef int nr = CGRU_NR_F if f32 else CGRU_NR_D
    cdef Py_ssize_t itemsize = 4 if f32 else 8
    cdef cnp.ndarray a = A, bp = Bp, c = C
    if cnp.PyArray_DIM(bp, 0) > 1 and cnp.PyArray_STRIDE(bp, 0) != itemsize:
        raise ValueError("gemm_packed_blocks: Bp must be contiguous")
    if not cnp.PyArray_ISWRITEABLE(c):
        raise ValueError("gemm_packed_blocks: C must be writable")
    cdef Py_ssize_t a_rows = cnp.PyArray_DIM(a, 1) if trans_a else cnp.PyArray_DIM(a, 0)
    if a_rows != cnp.PyArray_DIM(c, 0):
        raise ValueError(f"gemm_packed_blocks: op(A) has {a_rows} rows, C "
                         f"{cnp.PyArray_DIM(c, 0)}")
    J.m, J.n = cnp.PyArray_DIM(c, 0), cnp.PyArray_DIM(c, 1)
    J.k = cnp.PyArray_DIM(a, 0) if trans_a else cnp.PyArray_DIM(a, 1)
    if <size_t>cnp.PyArray_DIM(bp, 0) != cgru_packed_size(J.n, J.k, nr):
        raise ValueError(f"gemm_packed_blocks: Bp has {cnp.PyArray_DIM(bp, 0)} elements; a "
                         f"packed [{J.k}, {J.n}] matrix has {cgru_packed_size(J.n, J.k, nr)}")
    J.lda = _leading_of("gemm_packed_blocks", "A", cnp.PyArray_DIM(a, 0), cnp.PyArray_DIM(a, 1),
                        cnp.PyArray_STRIDE(a, 0), cnp.PyArray_STRIDE(a, 1), itemsize)
    J.ldc = _leading_of("gemm_packed_blocks", "C", cnp.PyArray_DIM(c, 0), cnp.PyArray_DIM(c, 1),
                        cnp.PyArray_STRIDE(c, 0), cnp.PyArray_STRIDE(c, 1), itemsize)
    J.ldb = 0
    if J.m == 0 or J.n == 0:
        return
    if J.k == 0:                       # an empty sum
        if not beta1:
            C[:, :] = 0
        return
    run_packed(&J, f32, trans_a, beta1, cnp.PyArray_DATA(a), cnp.PyArray_DATA(bp),
               cnp.PyArray_DATA(c), n_blocks, col_blocks, num_threads, [])


cdef int _float_type(fn, arr, name, int ndim) except -1:
    """The NumPy type number of ``arr``: a float32 or float64 array of ``ndim`` dimensions."""
    if not isinstance(arr, cnp.ndarray):
        raise TypeError(f"{fn}: {name} must be a NumPy array, got {type(arr).__name__}")
    cdef int t = cnp.PyArray_TYPE(<cnp.ndarray>arr)
    if t != cnp.NPY_FLOAT32 and t != cnp.NPY_FLOAT64:
        raise TypeError(f"{fn}: {name} must be float32 or float64, got {arr.dtype}")
    if not cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>arr):
        raise TypeError(f"{fn}: {name} must be in the machine's byte order, got {arr.dtype}")
    if cnp.PyArray_NDIM(<cnp.ndarray>arr) != ndim:
        raise ValueError(f"{fn}: {name} must be {ndim}-D, got shape {list(arr.shape)}")
    return t


cdef int run_packed(GemmJob *J, bint f32, bint trans_a, bint beta1, const void *A,
                    const void *Bp, void *C, int n_blocks, int col_blocks, int num_threads,
                    list errors) except -1:
    """``gemm_packed_blocks``' product once its sizes and leading dimensions are in ``J``
    (``m``, ``n``, ``k`` ≥ 1) and its operands checked: the blocks, then the team."""
    cdef int nr = CGRU_NR_F if f32 else CGRU_NR_D
    J.trans_a, J.trans_b, J.alpha, J.beta = trans_a, False, 1.0, 1.0 if beta1 else 0.0
    J.A, J.B, J.C = A, Bp, C
    J.packed = True
    J.split_rows = False
    J.col_blocks = max(1, min(col_blocks, (J.n + nr - 1) // nr))
    J.partial = NULL
    J.n_blocks = max(1, min(n_blocks, J.m)) * J.col_blocks
    num_threads = start_job(J, errors, num_threads)
    cdef item_fn item = gemm_item_f if f32 else gemm_item_d
    cdef double work = product_ns(<double>J.m * J.n * J.k, not f32)
    with nogil:
        parallel_for(J.n_blocks, num_threads, item, J, gemm_poll, J, work)
    if errors:
        raise errors[0]
    return 0


cdef int packed_product(bint f32, const void *A, int lda, const void *Bp, void *C, int ldc,
                        int m, int n, int k, int n_blocks, int col_blocks, int num_threads,
                        list errors) except -1:
    """``C[m, n] = A[m, k] · op(B)`` over raw pointers (row-major, leading dimensions in
    elements, ``Bp`` packed by ``loops.pack_rhs`` for this ``[k, n]``), exactly as
    ``gemm_packed_blocks`` runs it without ``trans_a`` or ``beta1``: for a caller that checked
    its operands once and runs the product call after call (the kernels' ``Runner``).
    ``errors`` (empty) receives what a signal handler raised, which is raised."""
    cdef GemmJob J
    if m <= 0 or n <= 0 or k <= 0:
        raise ValueError(f"packed_product: expected m, n, k ≥ 1, got {m}, {n}, {k}")
    J.m, J.n, J.k, J.lda, J.ldb, J.ldc = m, n, k, lda, 0, ldc
    return run_packed(&J, f32, False, False, A, Bp, C, n_blocks, col_blocks, num_threads,
                      errors)
