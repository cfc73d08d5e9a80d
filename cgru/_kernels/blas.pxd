# Row-major, fused-type BLAS over scipy.linalg.cython_blas.  Kernels call these, never
# sgemm/dgemm directly.  All matrices are row-major with leading dimensions in elements.
from cython cimport floating

# C[m, n] = alpha * op(A)[m, k] · op(B)[k, n] + beta * C
# op(A) = A ([m, k], lda >= k) or Aᵀ (A stored [k, m], lda >= m); likewise B.
# m == 1 goes to ?gemv (OpenBLAS is slow for single-row ?gemm).
cdef void gemm(bint trans_a, bint trans_b, int m, int n, int k, floating alpha,
               const floating *A, int lda, const floating *B, int ldb,
               floating beta, floating *C, int ldc) noexcept nogil

# C[m, n] = A[m, k] · op(B), op(B) packed (loops.pack_rhs), as blas.gemm_packed_blocks runs it
# (blocks of C's rows and columns on up to num_threads threads; the same bits for any split):
# for a caller that checked its operands once (the kernels' Runner).  errors: an empty list.
cdef int packed_product(bint f32, const void *A, int lda, const void *Bp, void *C, int ldc,
                        int m, int n, int k, int n_blocks, int col_blocks, int num_threads,
                        list errors) except -1
