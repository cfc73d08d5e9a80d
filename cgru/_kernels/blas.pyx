"""Row-major GEMM for float and double over SciPy's Fortran BLAS.

Fortran BLAS is column-major: a row-major ``[m, n]`` array is, to Fortran, the ``[n, m]``
matrix ``Cᵀ``.  So row-major ``C = op(A)·op(B)`` is computed as Fortran
``Cᵀ = op(B)ᵀ·op(A)ᵀ``: pass B first, then A, swap m and n, keep each operand's own flag.
"""
from cython cimport floating
from cgru._kernels.threads cimport item_fn, parallel_for
import numpy as np
from scipy.linalg.cython_blas cimport sgemm, dgemm, sgemv, dgemv


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
    lds = []
    for arr, name in ((A, "A"), (B, "B"), (C, "C")):
        rows, cols = arr.shape[0], arr.shape[1]
        if rows * cols > 0 and arr.strides[1] != itemsize:
            raise ValueError(f"{fn}: {name} must have unit stride along its last axis")
        if rows > 1 and cols > 0 and (arr.strides[0] % itemsize
                                      or arr.strides[0] // itemsize < cols):
            raise ValueError(f"{fn}: {name} must have a positive row stride of at least its "
                             f"row length ({cols * itemsize} bytes), got {arr.strides[0]}")
        lds.append(max(1, arr.strides[0] // itemsize if rows > 1 else cols))
    return m, n, k, lds[0], lds[1], lds[2]



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


# --- whole-sequence GEMMs as blocks on cgru's threads ---------------------------------------
cdef struct GemmJob:
    bint trans_a
    bint trans_b
    int m, n, k, lda, ldb, ldc, n_blocks
    double alpha, beta
    const void *A
    const void *B
    void *C
    void *partial           # [n_blocks − 1, m, n] partial sums of the k-split (trans_a)


cdef inline void gemm_block(const floating *sample, const GemmJob *J, int blk) noexcept nogil:
    cdef const floating *pa = <const floating *>J.A
    cdef const floating *pb = <const floating *>J.B
    cdef floating *pc = <floating *>J.C
    cdef floating *pp = <floating *>J.partial
    cdef int i0, i1
    if not J.trans_a:
        i0 = <int>((<long long>blk * J.m) // J.n_blocks)
        i1 = <int>((<long long>(blk + 1) * J.m) // J.n_blocks)
        # C[i0:i1] = op(A)[i0:i1] · op(B)  (A's rows i0:i1)
        gemm(False, J.trans_b, i1 - i0, J.n, J.k, <floating>J.alpha,
             pa + <Py_ssize_t>i0 * J.lda, J.lda, pb, J.ldb, <floating>J.beta,
             pc + <Py_ssize_t>i0 * J.ldc, J.ldc)
        return
    i0 = <int>((<long long>blk * J.k) // J.n_blocks)
    i1 = <int>((<long long>(blk + 1) * J.k) // J.n_blocks)
    # C (+)= A[i0:i1]ᵀ · op(B)[i0:i1]: block 0 into C, block b into partial[b−1]
    if blk == 0:
        gemm(True, J.trans_b, J.m, J.n, i1 - i0, <floating>J.alpha, pa, J.lda,
             pb, J.ldb, <floating>J.beta, pc, J.ldc)
    else:
        gemm(True, J.trans_b, J.m, J.n, i1 - i0, <floating>J.alpha,
             pa + <Py_ssize_t>i0 * J.lda, J.lda,
             pb + (i0 if J.trans_b else <Py_ssize_t>i0 * J.ldb), J.ldb, <floating>0,
             pp + <Py_ssize_t>(blk - 1) * J.m * J.n, J.n)


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
    gemm_block(<const float *>NULL, <const GemmJob *>ctx, blk)


cdef void gemm_item_d(void *ctx, int blk) noexcept nogil:
    gemm_block(<const double *>NULL, <const GemmJob *>ctx, blk)


cdef void sum_item_f(void *ctx, int part) noexcept nogil:
    sum_partials(<const float *>NULL, <const GemmJob *>ctx, part)


cdef void sum_item_d(void *ctx, int part) noexcept nogil:
    sum_partials(<const double *>NULL, <const GemmJob *>ctx, part)


def gemm_blocks(bint trans_a, bint trans_b, double alpha, const floating[:, :] A,
                const floating[:, :] B, double beta, floating[:, :] C, int n_blocks,
                int num_threads):
    """``gemm_rm`` as ``n_blocks`` single-threaded BLAS calls spread over ``num_threads``
    of cgru's pool threads.

    Without ``trans_a`` the rows of C are split (each block re-packs only B, the weights).
    With ``trans_a`` — ``C[m, n] = Aᵀ·op(B)`` with a long inner dimension k, the weight
    gradients — k is split instead: block 0 accumulates into C, the others into scratch
    partial sums added to C afterwards in block order; so every operand is packed once.
    The split depends on ``n_blocks`` only (never on the thread count), so the result does not
    depend on ``num_threads``; and BLAS's own thread pool stays idle, so it cannot fight with
    the pool threads of the time loops.  BLAS must be held at one thread around this call
    (``cgru._kernels.threads.blas_single_threaded``; the engine does it).
    """
    cdef GemmJob J
    J.m, J.n, J.k, J.lda, J.ldb, J.ldc = _operands("gemm_blocks", trans_a, trans_b, A, B, C,
                                                   sizeof(floating))
    if J.m == 0 or J.n == 0:
        return
    J.trans_a, J.trans_b, J.alpha, J.beta = trans_a, trans_b, alpha, beta
    J.A = &A[0, 0] if A.shape[0] * A.shape[1] > 0 else NULL
    J.B = &B[0, 0] if B.shape[0] * B.shape[1] > 0 else NULL
    J.C = &C[0, 0]
    J.partial = NULL
    J.n_blocks = max(1, min(n_blocks, J.k if trans_a else J.m))
    num_threads = max(1, min(num_threads, J.n_blocks))
    cdef floating[:, :, ::1] partial
    if trans_a and J.n_blocks > 1:
        partial = np.empty((J.n_blocks - 1, J.m, J.n),
                           dtype=np.float32 if floating is float else np.float64)
        J.partial = &partial[0, 0, 0]
    cdef item_fn item = gemm_item_f if floating is float else gemm_item_d
    cdef item_fn summ = sum_item_f if floating is float else sum_item_d
    with nogil:
        parallel_for(J.n_blocks, num_threads, item, &J, NULL, NULL)
        if J.partial != NULL:
            parallel_for(J.n_blocks, num_threads, summ, &J, NULL, NULL)
