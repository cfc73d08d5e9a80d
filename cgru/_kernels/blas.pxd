# Row-major, fused-type BLAS over scipy.linalg.cython_blas.  Kernels call these, never
# sgemm/dgemm directly.  All matrices are row-major with leading dimensions in elements.
from cython cimport floating

# C[m, n] = alpha * op(A)[m, k] · op(B)[k, n] + beta * C
# op(A) = A ([m, k], lda >= k) or Aᵀ (A stored [k, m], lda >= m); likewise B.
# m == 1 goes to ?gemv (OpenBLAS is slow for single-row ?gemm).
cdef void gemm(bint trans_a, bint trans_b, int m, int n, int k, floating alpha,
               const floating *A, int lda, const floating *B, int ldb,
               floating beta, floating *C, int ldc) noexcept nogil
