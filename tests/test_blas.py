"""The row-major BLAS shim (``cgru._kernels.blas.gemm_rm``) against NumPy, over its whole flag matrix.

``gemm_rm(trans_a, trans_b, alpha, A, B, beta, C)`` computes ``C = alpha·op(A)·op(B) + beta·C``
on row-major arrays.  Checked for float32/float64 × trans_a × trans_b × alpha, beta ∈
{0, 1, other} × shapes that reach every branch of ``_blas.gemm`` (m = 1 goes through ?gemv,
n = 1, k = 1, k = 0 which must give ``beta·C``) × contiguous or row-strided operands (views
such as ``big[:, 2:7]`` with a unit inner stride and a row stride larger than the row).

``beta = 0`` follows the BLAS convention: C is not read, so a NaN-poisoned C must come out
finite — the engine relies on this for its uninitialised (``np.empty``) buffers.
"""
import numpy as np
import pytest

_blas = pytest.importorskip("cgru._kernels.blas")
gemm_rm = _blas.gemm_rm

DTYPES = [np.float32, np.float64]
# (alpha, beta): every pair of {0, 1, other}
SCALARS = [(a, b) for a in (0.0, 1.0, -0.75) for b in (0.0, 1.0, 1.5)]
# (m, n, k): the general case, each dimension = 1 (m = 1 is the ?gemv branch), k = 0,
# and all-ones.
SHAPES = [(4, 5, 3), (1, 5, 3), (4, 1, 3), (4, 5, 1), (1, 1, 3), (1, 5, 1), (1, 1, 1),
          (4, 5, 0), (1, 5, 0), (7, 6, 9)]
SHAPE_IDS = [f"m{m}n{n}k{k}" for m, n, k in SHAPES]
PAD = 3  # extra columns on each side of a row-strided view


def _operand(rng, shape, dtype, strided):
    """A ``shape`` array of ``dtype``: contiguous, or a view ``big[:, PAD:PAD+cols]`` of a
    wider array (row stride > row length, unit inner stride).  Returns ``(view, big)``."""
    rows, cols = shape
    if not strided:
        a = rng.standard_normal(shape).astype(dtype)
        return a, a
    big = rng.standard_normal((rows, cols + 2 * PAD)).astype(dtype)
    view = big[:, PAD:PAD + cols]
    if rows > 0 and cols > 0:
        assert view.strides[1] == np.dtype(dtype).itemsize
        if rows > 1:
            assert view.strides[0] > cols * np.dtype(dtype).itemsize
    return view, big


def _expected(ta, tb, alpha, A, B, beta, C0):
    """The product in float64 (exact enough to judge float32 too)."""
    opA = (A.T if ta else A).astype(np.float64)
    opB = (B.T if tb else B).astype(np.float64)
    out = alpha * (opA @ opB)
    if beta != 0:  # beta = 0: C is not read (BLAS convention)
        out = out + beta * C0.astype(np.float64)
    return out


def _tol(dtype, k):
    if dtype == np.float32:
        return dict(rtol=2e-6 * max(k, 1), atol=2e-6 * max(k, 1))
    return dict(rtol=1e-13 * max(k, 1), atol=1e-13 * max(k, 1))


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("tb", [False, True], ids=["B", "Bt"])
@pytest.mark.parametrize("ta", [False, True], ids=["A", "At"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_gemm_flag_matrix(dtype, ta, tb, shape, strided):
    m, n, k = shape
    rng = np.random.default_rng([m, n, k, ta, tb, strided, np.dtype(dtype).itemsize])
    for alpha, beta in SCALARS:
        A, _ = _operand(rng, (k, m) if ta else (m, k), dtype, strided)
        B, _ = _operand(rng, (n, k) if tb else (k, n), dtype, strided)
        C, bigC = _operand(rng, (m, n), dtype, strided)
        if beta == 0:
            C[...] = np.nan  # must not be read
        C0 = C.copy()
        bigC_before = bigC.copy()
        A_before, B_before = A.copy(), B.copy()

        gemm_rm(ta, tb, alpha, A, B, beta, C)

        want = _expected(ta, tb, alpha, A, B, beta, C0)
        assert C.dtype == dtype
        assert np.isfinite(C).all(), (alpha, beta)
        np.testing.assert_allclose(C, want, err_msg=f"alpha={alpha} beta={beta}",
                                   **_tol(dtype, k))
        # the operands are read only, and nothing of C's parent outside the view is written
        np.testing.assert_array_equal(A, A_before)
        np.testing.assert_array_equal(B, B_before)
        if strided:
            outside = np.ones(bigC.shape, bool)
            outside[:, PAD:PAD + n] = False
            np.testing.assert_array_equal(bigC[outside], bigC_before[outside])


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_k0_is_beta_times_c(dtype):
    """k = 0: op(A)·op(B) is the empty sum, so C = beta·C exactly (and 0 for beta = 0, even
    where C held NaN)."""
    rng = np.random.default_rng(1)
    A = np.zeros((3, 0), dtype)
    B = np.zeros((0, 4), dtype)
    for beta in (0.0, 1.0, -2.5):
        C = rng.standard_normal((3, 4)).astype(dtype)
        C0 = C.copy()
        if beta == 0:
            C[0, 0] = np.nan
        gemm_rm(False, False, 1.0, A, B, beta, C)
        np.testing.assert_array_equal(C, (np.asarray(beta, dtype) * C0) if beta else 0 * C0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_gemv_branch_with_transposed_strided_a(dtype):
    """m = 1 with trans_a: A is stored ``[k, 1]`` as a column of a wider array, so the ?gemv
    branch must step through A with its row stride."""
    rng = np.random.default_rng(2)
    big = rng.standard_normal((6, 9)).astype(dtype)
    A = big[:, 4:5]                                      # [k=6, m=1], row stride 9
    B = rng.standard_normal((6, 7)).astype(dtype)
    C = np.full((1, 7), np.nan, dtype)
    gemm_rm(True, False, 1.0, A, B, 0.0, C)
    np.testing.assert_allclose(C, A.T.astype(np.float64) @ B, **_tol(dtype, 6))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_zero_sized_outputs_are_a_no_op(dtype):
    """m = 0 or n = 0: nothing to compute, no error."""
    A = np.ones((0, 3), dtype)
    B = np.ones((3, 4), dtype)
    C = np.ones((0, 4), dtype)
    gemm_rm(False, False, 1.0, A, B, 0.0, C)
    A = np.ones((2, 3), dtype)
    B = np.ones((3, 0), dtype)
    C = np.ones((2, 0), dtype)
    gemm_rm(False, False, 1.0, A, B, 0.0, C)
    assert C.shape == (2, 0)


@pytest.mark.parametrize("ta,tb,a_shape,b_shape,c_shape", [
    (False, False, (3, 4), (5, 6), (3, 6)),   # inner dimensions 4 ≠ 5
    (True, False, (3, 4), (4, 6), (3, 6)),    # op(A) = Aᵀ is [4, 3]: k = 3 ≠ 4
    (False, True, (3, 4), (4, 6), (3, 6)),    # op(B) = Bᵀ is [6, 4]: k = 6 ≠ 4
    (False, False, (3, 4), (4, 6), (3, 5)),   # C has the wrong number of columns
    (False, False, (3, 4), (4, 6), (2, 6)),   # C has the wrong number of rows
    (True, True, (4, 3), (6, 4), (6, 3)),     # C transposed
])
def test_mismatched_shapes_raise(ta, tb, a_shape, b_shape, c_shape):
    A, B, C = np.ones(a_shape), np.ones(b_shape), np.zeros(c_shape)
    with pytest.raises(ValueError, match="shapes do not match"):
        gemm_rm(ta, tb, 1.0, A, B, 0.0, C)
    np.testing.assert_array_equal(C, 0)


@pytest.mark.parametrize("which", ["A", "B", "C"])
@pytest.mark.parametrize("odd", [np.float32, np.float64])
def test_mixed_dtypes_raise(which, odd):
    base = np.float64 if odd == np.float32 else np.float32
    arrs = {"A": np.ones((3, 4), base), "B": np.ones((4, 5), base), "C": np.zeros((3, 5), base)}
    arrs[which] = arrs[which].astype(odd)
    with pytest.raises((TypeError, ValueError)):
        gemm_rm(False, False, 1.0, arrs["A"], arrs["B"], 0.0, arrs["C"])


def test_non_float_dtypes_raise():
    with pytest.raises((TypeError, ValueError)):
        gemm_rm(False, False, 1.0, np.ones((3, 4), np.int64), np.ones((4, 5), np.int64), 0.0,
                np.zeros((3, 5), np.int64))


@pytest.mark.parametrize("which", ["A", "B", "C"])
def test_non_unit_inner_stride_raises(which):
    arrs = {"A": np.ones((3, 4)), "B": np.ones((4, 5)), "C": np.zeros((3, 5))}
    a = arrs[which]
    arrs[which] = np.zeros((a.shape[0], 2 * a.shape[1]))[:, ::2]
    arrs[which][...] = a
    with pytest.raises(ValueError, match=f"{which} must have unit stride"):
        gemm_rm(False, False, 1.0, arrs["A"], arrs["B"], 0.0, arrs["C"])


def test_read_only_c_raises_and_read_only_inputs_work():
    A, B = np.arange(12.0).reshape(3, 4), np.arange(20.0).reshape(4, 5)
    A.flags.writeable = False
    B.flags.writeable = False
    C = np.zeros((3, 5))
    gemm_rm(False, False, 1.0, A, B, 0.0, C)
    np.testing.assert_allclose(C, A @ B, rtol=1e-15)
    C.flags.writeable = False
    with pytest.raises((TypeError, ValueError)):
        gemm_rm(False, False, 1.0, A, B, 0.0, C)


# Row strides BLAS cannot express (negative, zero, or smaller than the row) are refused:
# passed on as lda = 1, xerbla would reject them and leave C unwritten.


@pytest.mark.parametrize("which", ["A", "B", "C"])
def test_negative_row_stride_is_handled_or_refused(which):
    rng = np.random.default_rng(3)
    arrs = {"A": rng.standard_normal((3, 4)), "B": rng.standard_normal((4, 5)),
            "C": np.zeros((3, 5))}
    arrs[which] = arrs[which][::-1].copy()[::-1]       # same values, row stride < 0
    assert arrs[which].strides[0] < 0
    want = arrs["A"] @ arrs["B"]
    try:
        gemm_rm(False, False, 1.0, arrs["A"], arrs["B"], 0.0, arrs["C"])
    except ValueError as e:
        assert which in str(e) and "stride" in str(e)
        return
    np.testing.assert_allclose(arrs["C"], want, rtol=1e-13)


def test_zero_row_stride_is_handled_or_refused():
    rng = np.random.default_rng(4)
    A = np.broadcast_to(rng.standard_normal(4), (3, 4))  # every row the same, row stride 0
    B = rng.standard_normal((4, 5))
    C = np.zeros((3, 5))
    try:
        gemm_rm(False, False, 1.0, A, B, 0.0, C)
    except ValueError as e:
        assert "A" in str(e) and "stride" in str(e)
        return
    np.testing.assert_allclose(C, A @ B, rtol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a,trans_b,split_rows",
                         [(False, False, False), (False, True, False), (True, False, False),
                          (True, True, False), (True, False, True), (True, True, True)],
                         ids=["NN", "NT", "TN", "TT", "TN-rows", "TT-rows"])
@pytest.mark.parametrize("blocks", [1, 3, 4, 50])
def test_gemm_blocks_does_not_depend_on_the_thread_count(dtype, trans_a, trans_b, split_rows,
                                                         blocks):
    # For a given block count the result is bitwise the same for any thread count, and equal
    # to one call up to rounding (OpenBLAS's edge tiles may round differently per block shape).
    # split_rows: a weight-gradient product split over C's rows instead of k, with sub-chunks
    # of k (forced short here) added up in order.
    from cgru._kernels import blas
    from cgru._kernels.blas import gemm_blocks
    rng = np.random.default_rng(blocks)
    m, n, k = 37, 29, 41
    A = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    B = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    C0 = rng.standard_normal((m, n)).astype(dtype)
    results = []
    old = blas.gemm_chunk_flops(1.0, 7) if split_rows else None     # k in sub-chunks of 7
    try:
        for threads in (1, 2, 3):
            got = np.full((m, n), np.nan, dtype) if threads == 3 else C0.copy()
            gemm_blocks(trans_a, trans_b, 0.5, A, B, 0.0 if threads == 3 else 1.0, got, blocks,
                        threads, None, split_rows)
            results.append(got - (0 if threads == 3 else C0))
    finally:
        if old is not None:
            blas.gemm_chunk_flops(*old)
    np.testing.assert_array_equal(results[0], results[1])
    want = 0.5 * (A.T if trans_a else A).astype(np.float64) @ (B.T if trans_b else B)
    for got in results:
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12,
                                   atol=1e-5 if dtype == np.float32 else 1e-12)
