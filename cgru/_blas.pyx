"""Row-major GEMM for float and double over SciPy's Fortran BLAS.

Fortran BLAS is column-major: a row-major ``[m, n]`` array is, to Fortran, the ``[n, m]``
matrix ``Cᵀ``.  So row-major ``C = op(A)·op(B)`` is computed as Fortran
``Cᵀ = op(B)ᵀ·op(A)ᵀ``: pass B first, then A, swap m and n, keep each operand's own flag.
"""
from cython cimport floating
from cython.parallel cimport prange
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


def gemm_blocks(bint trans_a, bint trans_b, double alpha, const floating[:, :] A,
                const floating[:, :] B, double beta, floating[:, :] C, int n_blocks,
                int num_threads):
    """``gemm_rm`` as ``n_blocks`` single-threaded BLAS calls spread over ``num_threads``
    OpenMP threads.

    Without ``trans_a`` the rows of C are split (each block re-packs only B, the weights).
    With ``trans_a`` — ``C[m, n] = Aᵀ·op(B)`` with a long inner dimension k, the weight
    gradients — k is split instead: block 0 accumulates into C, the others into scratch
    partial sums added to C afterwards in block order; so every operand is packed once.
    The split depends on ``n_blocks`` only (never on the thread count), so the result does not
    depend on ``num_threads``; and BLAS's own thread pool stays idle, so it cannot fight with
    the OpenMP threads of the time loops.  BLAS must be limited to one thread around this call
    (the engine does it).
    """
    cdef int m, n, k, lda, ldb, ldc
    m, n, k, lda, ldb, ldc = _operands("gemm_blocks", trans_a, trans_b, A, B, C,
                                       sizeof(floating))
    if m == 0 or n == 0:
        return
    cdef const floating *pa = &A[0, 0] if A.shape[0] * A.shape[1] > 0 else NULL
    cdef const floating *pb = &B[0, 0] if B.shape[0] * B.shape[1] > 0 else NULL
    cdef floating *pc = &C[0, 0]
    cdef int blk, i0, i1, i, j
    cdef floating[:, :, ::1] partial
    cdef floating *pp = NULL
    cdef floating zero = 0
    if trans_a:
        n_blocks = max(1, min(n_blocks, k))
    else:
        n_blocks = max(1, min(n_blocks, m))
    num_threads = max(1, min(num_threads, n_blocks))
    if not trans_a:
        for blk in prange(n_blocks, nogil=True, schedule="static", num_threads=num_threads):
            i0 = <int>((<long long>blk * m) // n_blocks)
            i1 = <int>((<long long>(blk + 1) * m) // n_blocks)
            # C[i0:i1] = op(A)[i0:i1] · op(B)  (A's rows i0:i1)
            gemm(False, trans_b, i1 - i0, n, k, <floating>alpha, pa + <Py_ssize_t>i0 * lda, lda,
                 pb, ldb, <floating>beta, pc + <Py_ssize_t>i0 * ldc, ldc)
        return
    if n_blocks > 1:
        partial = np.empty((n_blocks - 1, m, n), dtype=np.float32 if floating is float else np.float64)
        pp = &partial[0, 0, 0]
    for blk in prange(n_blocks, nogil=True, schedule="static", num_threads=num_threads):
        i0 = <int>((<long long>blk * k) // n_blocks)
        i1 = <int>((<long long>(blk + 1) * k) // n_blocks)
        # C (+)= A[i0:i1]ᵀ · op(B)[i0:i1]: block 0 into C, block b into partial[b−1]
        if blk == 0:
            gemm(True, trans_b, m, n, i1 - i0, <floating>alpha, pa, lda,
                 pb, ldb, <floating>beta, pc, ldc)
        else:
            gemm(True, trans_b, m, n, i1 - i0, <floating>alpha, pa + <Py_ssize_t>i0 * lda, lda,
                 pb + (i0 if trans_b else <Py_ssize_t>i0 * ldb), ldb, zero,
                 pp + <Py_ssize_t>(blk - 1) * m * n, n)
    if n_blocks > 1:
        # C += partial[0] + partial[1] + … in block order; rows in parallel
        for i in prange(m, nogil=True, schedule="static", num_threads=num_threads):
            for blk in range(n_blocks - 1):
                for j in range(n):
                    pc[<Py_ssize_t>i * ldc + j] += pp[(<Py_ssize_t>blk * m + i) * n + j]
