"""The time loops' own kernels (cgru/_kernels/simd.h): packed GEMM and vector sigmoid/tanh."""
import os
import re

import numpy as np
import pytest

from cgru._kernels import loops as K

TOL = {np.float32: 2e-5, np.float64: 1e-12}
# every ISA level of the packed GEMM this machine can run (forced dispatch)
ISAS = {"AVX-512": [4, 3, 0], "AVX2+FMA": [3, 0], "baseline": [0]}[K.simd_isa()]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 64, 5), (1, 70, 33), (2, 128, 17), (3, 48, 8),
                                   (4, 16, 1), (7, 35, 12), (8, 64, 9), (9, 200, 31),
                                   (20, 3, 4), (17, 96, 64),
                                   # one row on AVX-512: four panels at a time, the last
                                   # group's last panel partial (float32 8 panels, float64 16)
                                   (1, 250, 40),
                                   # AVX2's half panels: 4 or 5 rows left after sixes, a
                                   # second half of under 16 columns, a panel of one half
                                   (5, 40, 9), (10, 50, 7), (11, 17, 3), (6, 48, 2),
                                   # long A in row blocks of L2 (rows of ≥ 1 KiB, B ≤ 1 MiB),
                                   # with a short last block
                                   (683, 45, 301), (1290, 33, 520)])
@pytest.mark.parametrize("beta1", [False, True])
@pytest.mark.parametrize("trans_a", [False, True])
def test_packed_gemm_matches_numpy(isa, dtype, trans, m, n, k, beta1, trans_a):
    # trans_a: A given as [k, m] (the weight gradients' dgᵀ·X)
    rng = np.random.default_rng(m * 1000 + n + k)
    A = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    B = rng.standard_normal((n, k) if trans else (k, n)).astype(dtype)
    C0 = rng.standard_normal((m, n)).astype(dtype)
    C = C0.copy() if beta1 else np.full((m, n), np.nan, dtype)
    K.gemm_packed_rm(A, K.pack_rhs(B, trans), n, C, beta1, isa=isa, trans_a=trans_a)
    opA, opB = (A.T if trans_a else A), (B.T if trans else B)
    want = opA.astype(np.float64) @ opB.astype(np.float64) + (C0 if beta1 else 0)
    np.testing.assert_allclose(C, want, rtol=TOL[dtype], atol=TOL[dtype] * k)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k,n", [(700, 100), (1300, 45), (2, 40_000), (3, 70_001), (5, 3)])
def test_a_pack_shared_by_threads_is_the_pack(dtype, k, n):
    """A non-transposed B packed by several of cgru's threads (each a range of its rows: from
    256 KiB on) is the same bytes as one thread's pack, and both are the layout itself:
    panels of NR columns, row after row, zeros after the last column."""
    NR = K.packed_size(1, 1, dtype)                   # one panel of one row
    B = np.random.default_rng(k + n).standard_normal((k, n)).astype(dtype)
    panels = -(-n // NR)
    padded = np.zeros((k, panels * NR), dtype)
    padded[:, :n] = B
    want = padded.reshape(k, panels, NR).transpose(1, 0, 2).ravel()
    for nt in (1, 2, 3, 8):
        out = np.full(K.packed_size(n, k, dtype) + 5, np.nan, dtype)
        got = K.pack_rhs(B, False, out, num_threads=nt)
        assert got.size == want.size and got.tobytes() == want.tobytes(), nt
        assert np.isnan(out[want.size:]).all()        # nothing written past the pack


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_gemm_with_transposed_a_on_strided_views(isa, dtype):
    # A [k, m] as a column window of a wider array, C likewise; a B wider than L2 in
    # float64 (column blocks of B); the columns around C's window untouched
    rng = np.random.default_rng(6)
    k, m, n = 700, 130, 300
    bigA = rng.standard_normal((k, m + 11)).astype(dtype)
    bigC = np.full((m, n + 7), 7.0, dtype)
    A, C = bigA[:, 5:5 + m], bigC[:, 3:3 + n]
    B = rng.standard_normal((k, n)).astype(dtype)
    K.gemm_packed_rm(A, K.pack_rhs(B, False), n, C, False, isa=isa, trans_a=True)
    np.testing.assert_allclose(C, A.T.astype(np.float64) @ B.astype(np.float64),
                               rtol=TOL[dtype], atol=TOL[dtype] * k)
    assert (bigC[:, :3] == 7).all() and (bigC[:, 3 + n:] == 7).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_gemm_on_strided_views(isa, dtype):
    # A and C as column windows of wider arrays (row stride > row length), the columns
    # around C's window untouched
    rng = np.random.default_rng(5)
    bigA = rng.standard_normal((300, 330)).astype(dtype)
    bigC = np.full((300, 90), 7.0, dtype)
    A, C = bigA[:, 3:304], bigC[:, 5:82]
    B = rng.standard_normal((77, 301)).astype(dtype)
    K.gemm_packed_rm(A, K.pack_rhs(B, True), 77, C, False, isa=isa)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B.T.astype(np.float64),
                               rtol=TOL[dtype], atol=TOL[dtype] * 301)
    assert (bigC[:, :5] == 7).all() and (bigC[:, 82:] == 7).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_gemm_over_a_b_that_prefetches(isa, dtype):
    # packed B of 8 MiB or more (a step's recurrent weights at H = 1024): the first rows over
    # each panel run in a call of their own that also prefetches the panel (simd.h). Every
    # row's bits are those it gets computed alone or among other rows — with fewer rows than
    # the first call takes, or from a row that is not the first — and match float64.
    rng = np.random.default_rng(11)
    k = 1024
    n = (12 << 20) // (k * np.dtype(dtype).itemsize) - 5     # 12 MiB, a last partial panel
    B = rng.standard_normal((n, k)).astype(dtype)
    Bp = K.pack_rhs(B, True)
    assert Bp.nbytes >= 8 << 20
    m = 21
    A = rng.standard_normal((m, k)).astype(dtype)
    whole = np.full((m, n), np.nan, dtype)
    K.gemm_packed_rm(A, Bp, n, whole, False, isa=isa)
    np.testing.assert_allclose(whole, A.astype(np.float64) @ B.T.astype(np.float64),
                               rtol=TOL[dtype], atol=TOL[dtype] * k)
    for lo, hi in [(0, 1), (0, 3), (0, 4), (0, 5), (0, 6), (0, 7), (0, 8), (0, 9), (0, 13),
                   (2, 21), (5, 17), (20, 21)]:
        part = np.full((hi - lo, n), np.nan, dtype)
        K.gemm_packed_rm(A[lo:hi], Bp, n, part, False, isa=isa)
        assert np.array_equal(part, whole[lo:hi]), (lo, hi)
    # C + A·op(B) adds onto C as without the prefetching call
    C = rng.standard_normal((m, n)).astype(dtype)
    want = C + whole
    K.gemm_packed_rm(A, Bp, n, C, True, isa=isa)
    assert np.array_equal(C, want)


def test_packed_gemm_refuses_what_it_cannot_compute():
    A, C = np.ones((4, 6), np.float32), np.empty((4, 5), np.float32)
    Bp = K.pack_rhs(np.ones((5, 6), np.float32), True)
    with pytest.raises(ValueError, match="isa"):
        K.gemm_packed_rm(A, Bp, 5, C, False, isa=1)
    with pytest.raises(ValueError, match="Bp"):
        K.gemm_packed_rm(A, Bp[:-1].copy(), 5, C, False)
    with pytest.raises(ValueError, match="C: expected shape"):
        K.gemm_packed_rm(A, Bp, 5, np.empty((3, 5), np.float32), False)
    with pytest.raises(TypeError, match="dtype"):
        K.gemm_packed_rm(A.astype(np.float64), Bp, 5, C, False)
    with pytest.raises(ValueError, match="inner stride"):
        K.gemm_packed_rm(np.ones((4, 12), np.float32)[:, ::2], Bp, 5, C, False)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transposed_a_rows_do_not_depend_on_the_split(dtype):
    # a weight gradient's rows of C are bitwise the same computed alone or among others, on
    # one or two threads, in any number of blocks (blas.gemm_packed_blocks)
    from cgru._kernels import blas
    rng = np.random.default_rng(9)
    k, m, n = 300, 70, 45
    A = rng.standard_normal((k, m)).astype(dtype)
    Bp = K.pack_rhs(rng.standard_normal((k, n)).astype(dtype), False)
    whole = np.empty((m, n), dtype)
    K.gemm_packed_rm(A, Bp, n, whole, False, trans_a=True)
    for lo, hi in [(0, 1), (5, 8), (3, 5), (8, 70), (69, 70)]:
        part = np.empty((hi - lo, n), dtype)
        K.gemm_packed_rm(A[:, lo:hi], Bp, n, part, False, trans_a=True)
        assert np.array_equal(part, whole[lo:hi]), (lo, hi)
    for blocks, threads, cols in ((1, 1, 1), (2, 2, 1), (4, 2, 1), (3, 1, 1), (1, 2, 2),
                                  (2, 2, 3), (1, 1, 99)):
        C = np.full((m, n), np.nan, dtype)
        blas.gemm_packed_blocks(A, Bp, C, False, blocks, threads, True, cols)
        assert np.array_equal(C, whole), (blocks, threads, cols)


def _numpy_pack(opB, nr):
    """The packed layout of op(B) ``[k, n]``: panel p is op(B)'s columns p·nr … p·nr + nr − 1,
    k rows of nr values, zero beyond n; the panels one after the other."""
    k, n = opB.shape
    panels = -(-n // nr)
    out = np.zeros((panels, k, nr), opB.dtype)
    for p in range(panels):
        block = opB[:, p * nr:(p + 1) * nr]
        out[p, :, :block.shape[1]] = block
    return out.ravel()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packs_are_the_panel_layout(dtype):
    # pack_rhs packs op(B) in panels: op(B) = B row by row of B (the whole panels) or Bᵀ (whole
    # panels in tiles transposed in registers, simd.h), a last partial panel and the k left over
    # value by value — the layout's bytes exactly, for every panel and tile remainder
    rng = np.random.default_rng(17)
    nr = 32 if dtype == np.float32 else 16
    for n in (1, 7, 16, 31, 32, 33, 64, 65, 100, 768):
        for k in (1, 3, 4, 7, 8, 9, 17, 256, 259):
            B = rng.standard_normal((n, k)).astype(dtype)
            assert K.pack_rhs(B, True).tobytes() == _numpy_pack(B.T, nr).tobytes(), (n, k)
            Bt = np.ascontiguousarray(B.T)
            assert K.pack_rhs(Bt, False).tobytes() == _numpy_pack(Bt, nr).tobytes(), (n, k)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a", [False, True])
def test_short_k_rows_are_the_micro_kernels_bits(isa, dtype, trans_a):
    # An inner dimension of CGRU_SHORT_K or less (a weight gradient over one step of one
    # sequence: k = 1) runs row after row (simd.h's _short), not on the micro-kernels: the same
    # operations per element, so the same bytes — signed zeros, infinities and NaN included —
    # on every level, for C set and added to, on strided views, with a last partial panel
    rng = np.random.default_rng(13)
    for k in (1, 2, 3, 5, K.SHORT_K):
        for m, n in ((1, 1), (3, 7), (6, 33), (13, 64), (40, 70), (97, 257)):
            bigA = rng.standard_normal(((k, m + 3) if trans_a else (m, k + 3))).astype(dtype)
            A = bigA[:, 1:1 + m] if trans_a else bigA[:, 1:1 + k]
            A[0, 0] = -0.0                        # −0 · b: the sum from +0 keeps +0
            if m > 2 and k > 1:
                A.flat[2] = np.inf if trans_a else np.nan
            B = rng.standard_normal((k, n)).astype(dtype)
            B[0, -1] = 0.0
            Bp = K.pack_rhs(B, False)
            for beta1 in (False, True):
                bigC = rng.standard_normal((m, n + 5)).astype(dtype)
                short, micro = bigC.copy(), bigC.copy()
                K.gemm_packed_rm(A, Bp, n, short[:, 2:2 + n], beta1, isa=isa, trans_a=trans_a)
                K.gemm_packed_rm(A, Bp, n, micro[:, 2:2 + n], beta1, isa=isa, trans_a=trans_a,
                                 short_k=False)
                assert short.tobytes() == micro.tobytes(), (k, m, n, beta1)
                opA = A.T if trans_a else A
                with np.errstate(invalid="ignore"):         # (inf · 0 in the oracle: NaN)
                    want = opA.astype(np.float64) @ B.astype(np.float64) + \
                        (bigC[:, 2:2 + n] if beta1 else 0)
                    np.testing.assert_allclose(short[:, 2:2 + n], want, rtol=TOL[dtype],
                                               atol=TOL[dtype] * k)
                assert np.array_equal(short[:, :2], bigC[:, :2])    # around the window: as it was
                assert np.array_equal(short[:, 2 + n:], bigC[:, 2 + n:])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [210, 250])
def test_packed_gemm_rows_do_not_depend_on_the_batch_split(dtype, n):
    # Every row is bitwise the same whether computed alone, in a block of 3, or among 20 rows:
    # the property that makes cgru's results independent of the thread count. (A row alone
    # runs other panel groupings than the rows of a block: n = 250 puts a partial last panel
    # into AVX-512's one-row groups of four.)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((20, 67)).astype(dtype)
    B = rng.standard_normal((n, 67)).astype(dtype)
    Bp = K.pack_rhs(B, True)
    whole = np.empty((20, n), dtype)
    K.gemm_packed_rm(A, Bp, n, whole, False)
    for lo, hi in [(0, 1), (5, 8), (3, 5), (8, 20), (19, 20)]:
        part = np.empty((hi - lo, n), dtype)
        K.gemm_packed_rm(np.ascontiguousarray(A[lo:hi]), Bp, n, part, False)
        assert np.array_equal(part, whole[lo:hi]), (lo, hi)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("transB", [False, True])
def test_whole_sequence_packed_products_do_not_depend_on_the_split(dtype, transB):
    # blas.gemm_packed_blocks (the input projections and input gradients): against BLAS, and
    # bitwise one single-threaded call of the packed GEMM whatever the blocks, sub-chunks,
    # threads, row windows (strided A and C)
    from cgru._kernels import blas
    rng = np.random.default_rng(7)
    m, n, k = 1100, 75, 290
    bigA = rng.standard_normal((m, k + 5)).astype(dtype)
    A = bigA[:, 2:2 + k]
    B = rng.standard_normal((n, k) if transB else (k, n)).astype(dtype)
    Bp = K.pack_rhs(B, transB)
    C0 = rng.standard_normal((m, n)).astype(dtype)
    for beta1 in (False, True):
        want = C0.copy() if beta1 else np.full((m, n), np.nan, dtype)
        K.gemm_packed_rm(A, Bp, n, want, beta1)
        blas_c = C0.copy()
        blas.gemm_rm(False, transB, 1.0, A, B, 1.0 if beta1 else 0.0, blas_c)
        np.testing.assert_allclose(want, blas_c, rtol=TOL[dtype], atol=TOL[dtype] * k)
        old = blas.gemm_chunk_flops()
        try:
            # column blocks: whole panels each (a short sequence's products), as many as
            # there are panels at most
            for blocks, threads, chunk_rows, cols in ((1, 1, 512, 1), (3, 2, 40, 1),
                                                      (4, 1, 7, 1), (4, 2, 1, 1),
                                                      (1, 2, 512, 4), (2, 2, 40, 2),
                                                      (1, 1, 7, 3), (1, 2, 512, 99)):
                blas.gemm_chunk_flops(1.0, chunk_rows)
                bigC = np.full((m, n + 4), np.nan, dtype)
                C = bigC[:, 1:1 + n]
                if beta1:
                    C[...] = C0
                blas.gemm_packed_blocks(A, Bp, C, beta1, blocks, threads, False, cols)
                assert np.array_equal(C, want), (blocks, threads, chunk_rows, cols)
                assert np.isnan(bigC[:, 0]).all() and np.isnan(bigC[:, -3:]).all()
        finally:
            blas.gemm_chunk_flops(*old)


def test_whole_sequence_packed_products_edge_shapes_and_errors():
    from cgru._kernels import blas
    Bp0 = K.pack_rhs(np.ones((0, 3), np.float64), False)           # k = 0: C = 0 (or C)
    C = np.full((4, 3), np.nan)
    blas.gemm_packed_blocks(np.ones((4, 0)), Bp0, C, False, 2, 2)
    assert (C == 0).all()
    C[...] = 5
    blas.gemm_packed_blocks(np.ones((4, 0)), Bp0, C, True, 2, 2)
    assert (C == 5).all()
    blas.gemm_packed_blocks(np.ones((0, 3)), K.pack_rhs(np.ones((3, 3)), False),
                            np.ones((0, 3)), False, 2, 2)                # m = 0: nothing
    Bp = K.pack_rhs(np.ones((3, 3)), False)
    with pytest.raises(ValueError, match="rows"):
        blas.gemm_packed_blocks(np.ones((4, 3)), Bp, np.ones((5, 3)), False, 1, 1)
    with pytest.raises(ValueError, match="packed"):
        blas.gemm_packed_blocks(np.ones((4, 3)), Bp[1:].copy(), np.ones((4, 3)), False, 1, 1)
    with pytest.raises(ValueError, match="unit stride"):
        blas.gemm_packed_blocks(np.ones((4, 6))[:, ::2], Bp, np.ones((4, 3)), False, 1, 1)
    # the operands are checked as NumPy arrays (not through typed memoryviews): each refusal
    # names the operand, and nothing is written
    A, C = np.ones((4, 3)), np.full((4, 3), 7.0)
    for args, error, match in [
            ((A.tolist(), Bp, C), TypeError, "A must be a NumPy array"),
            ((A.astype(np.int64), Bp, C), TypeError, "A must be float32 or float64"),
            ((A.astype(A.dtype.newbyteorder()), Bp, C), TypeError, "A must be in the machine's"),
            ((A, Bp, C.astype(C.dtype.newbyteorder())), TypeError, "C must be in the machine's"),
            ((A, Bp.reshape(-1, 1), C), ValueError, "Bp must be 1-D"),
            ((A, Bp, C.ravel()), ValueError, "C must be 2-D"),
            ((A.astype(np.float32), Bp, C), TypeError, "one dtype"),
            ((A, Bp, C.astype(np.float32)), TypeError, "one dtype"),
            ((A, np.repeat(Bp, 2)[::2], C), ValueError, "Bp must be contiguous"),
            ((A, Bp, np.full((4, 3), 7.0)[::-1]), ValueError, "C must have a positive row"),
            ((A, Bp, np.broadcast_to(C, (4, 3))), ValueError, "C must be writable")]:
        with pytest.raises(error, match=match):
            blas.gemm_packed_blocks(*args, False, 1, 1)
        assert (C == 7).all()


def _exact(name, x):
    x = x.astype(np.float64)
    if name == "sigmoid":
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e))
    return np.tanh(x)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_vector_math_is_within_a_few_ulp(name, isa):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(5000) * s for s in (1e-6, 1e-2, 0.3, 1, 4, 30)]
                       + [np.linspace(-12, 12, 20001)]).astype(np.float32)
    got = K.vector_math_f32(name, x, isa).astype(np.float64)
    want = _exact(name, x)
    ulp = np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert ulp.max() <= 4, (x[ulp.argmax()], ulp.max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_vector_math_special_values(name, isa):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 89.0, -89.0, 100.0,
                  -100.0, 1e-40], np.float32)
    got = K.vector_math_f32(name, x, isa)
    assert np.isnan(got[0])
    want = _exact(name, np.nan_to_num(x[1:], posinf=1e30, neginf=-1e30))
    np.testing.assert_allclose(got[1:], want, rtol=3e-7, atol=1e-37)
    assert not np.isnan(got[1:]).any()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", [1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33])
def test_vector_math_tails(n, isa):
    x = np.linspace(-3, 3, n).astype(np.float32)
    np.testing.assert_allclose(K.vector_math_f32("tanh", x, isa), np.tanh(x), rtol=5e-7,
                               atol=1e-7)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_float64_vector_math_is_within_a_few_ulp(name, isa):
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal(5000) * s for s in (1e-9, 1e-3, 0.29, 0.31, 1, 4, 30)]
                       + [np.linspace(-40, 40, 40001)])
    got = K.vector_math(name, x, isa)
    want = _exact(name, x)
    ulp = np.abs(got - want) / np.spacing(np.abs(want))
    assert ulp.max() <= 4, (x[ulp.argmax()], ulp.max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 9, 17])
def test_float64_vector_math_special_values_and_tails(name, n, isa):
    x = np.resize(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e300, -1e300, 709.0, -709.0,
                            800.0, -800.0, 5e-324, 0.5]), n)
    got = K.vector_math(name, x, isa)
    assert np.array_equal(np.isnan(got), np.isnan(x))
    finite = ~np.isnan(x)
    want = _exact(name, np.nan_to_num(x[finite], posinf=1e300, neginf=-1e300))
    np.testing.assert_allclose(got[finite], want, rtol=1e-15, atol=1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_math_levels_with_fma_agree_bitwise(dtype):
    # every lane goes through the same operations at every vector width: AVX-512 and AVX2
    # (both with FMA) give the same bits; refused levels the machine lacks
    x = np.random.default_rng(3).standard_normal(1001).astype(dtype) * 5
    levels = [isa for isa in ISAS if isa >= 3]
    for name in ("sigmoid", "tanh"):
        results = [K.vector_math(name, x, isa) for isa in levels]
        assert all(np.array_equal(r, results[0]) for r in results), name
    with pytest.raises(ValueError, match="isa"):
        K.vector_math("tanh", x, 2)
    if K.simd_isa() != "AVX-512":
        with pytest.raises(ValueError, match="isa"):
            K.vector_math("tanh", x, 4)


_KERNEL_MODULES = ("gru", "lstm", "rnn", "loops")
_SOURCES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cgru",
                        "_kernels")


def _generated(module):
    """The Cython-generated C of ``module``: beside the compiled module (an editable build), or
    in this checkout's sources when it is newer than the .pyx (the in-tree build of a wheel
    installed from this checkout); else ``None``."""
    beside = os.path.join(os.path.dirname(K.__file__), f"{module}.c")
    if os.path.exists(beside):
        return beside
    c, pyx = (os.path.join(_SOURCES, f"{module}{ext}") for ext in (".c", ".pyx"))
    if os.path.exists(c) and os.path.exists(pyx) and os.path.getmtime(c) >= os.path.getmtime(pyx):
        return c
    return None


_GENERATED = {m: _generated(m) for m in _KERNEL_MODULES}


@pytest.mark.skipif(not all(_GENERATED.values()),
                    reason="the Cython-generated C is neither beside the modules nor in the "
                           "checkout (a build made elsewhere, e.g. .ci/debug)")
@pytest.mark.parametrize("module", _KERNEL_MODULES)
def test_float32_kernels_compute_in_float32(module):
    """The float32 specialisations of the time loops' Cython code do no double arithmetic:
    Cython writes a literal ``1`` next to a float as the double ``1.0`` (``1 - z`` became
    ``1.0 - z``), which turns float32 gate math into scalar double math.  The kernels use typed
    constants instead; this reads the generated C of every float32 function (``__pyx_fuse_0``)
    for a floating literal in arithmetic or a cast to double."""
    lines = open(_GENERATED[module], encoding="utf-8").read().split("\n")
    arithmetic = re.compile(r"[-+*/]\s*\(?\d+\.\d+\b|\b\d+\.\d+\s*[-+*/]|\(double\)")
    found, function = [], None
    for number, line in enumerate(lines, 1):
        if function is None:
            head = re.match(r"^static .*\b(__pyx_fuse_0\w*)\(.*\{$", line)
            function = head.group(1) if head else None
            continue
        if line.startswith("}"):
            function = None
            continue
        code = line.strip()
        if code.startswith(("*", "/*")):            # Cython's copy of the source line
            continue
        if arithmetic.search(code):
            found.append(f"{module}.c:{number} in {function}: {code}")
    assert not found, "double arithmetic in float32 kernels:\n" + "\n".join(found[:20])


# --- the fused gate rows (gates.h) -----------------------------------------------------------
def _sig(x):
    return _exact("sigmoid", x)


def _gru_bwd_of_5(dh, hp, z, n, flip):
    """``(dn, dz, dh_prev)`` of the GRU's blend ``h' = n + z ⊙ (h − n)`` (flip: ``h + z ⊙
    (n − h)``)."""
    if flip:
        return dh * z, dh * (n - hp), dh * (1 - z)
    return dh * (1 - z), dh * (hp - n), dh * z


def _gate_row_numpy(kernel, o, H, option):
    """What ``K.gate_row`` computes, in float64 from the operands ``o``."""
    o = {k: np.asarray(v, np.float64) for k, v in o.items() if v is not None}

    def part(a, q):
        return a[q * H:(q + 1) * H]

    if kernel == "gru_fwd_ra":
        pre = o["gx"] + o["gh"] + o["b"]
        r, z = _sig(part(pre, 0)), _sig(part(pre, 1))
        hn = part(o["gh"], 2) + o["bhn"]
        n = np.tanh(part(o["gx"], 2) + part(o["b"], 2) + r * hn)
        hp = o["hp"]
        h = hp + z * (n - hp) if option else n + z * (hp - n)
        return {"g3": np.concatenate([r, z, n]), "hn": hn, "hnew": h}
    if kernel == "gru_bwd_ra":
        r, z, n = (part(o["g3"], q) for q in range(3))
        dn, dz, dh_prev = _gru_bwd_of_5(o["dh"], o["hp"], z, n, option)
        dpn, dpz = dn * (1 - n * n), dz * z * (1 - z)
        dpr = dpn * o["hn"] * r * (1 - r)
        return {"dh": dh_prev, "dgx": np.concatenate([dpr, dpz, dpn]), "dgh": dpn * r}
    m = o.get("m")
    m = 1.0 if m is None else m
    if kernel == "gru_fwd_rb_rz":
        pre = o["gx"] + o["gh"] + o["b"]
        r, z = _sig(part(pre, 0)), _sig(part(pre, 1))
        return {"g3": np.concatenate([r, z]), "rh": r * o["hp"] * m}
    if kernel == "gru_fwd_rb_n":
        n = np.tanh(o["gxn"] + o["ghn"] + o["bn"])
        z, hp = o["z"], o["hp"]
        return {"n": n, "hnew": hp + z * (n - hp) if option else n + z * (hp - n)}
    if kernel == "gru_bwd_rb":
        r, z, n = (part(o["g3"], q) for q in range(3))
        hp = o["hp"]
        dn, dz, dh_prev = _gru_bwd_of_5(o["dh"], hp, z, n, option)
        dgx = o["dgx"].copy()                 # the r columns are the next kernel's
        dgx[H:2 * H], dgx[2 * H:] = dz * z * (1 - z), dn * (1 - n * n)
        return {"dh": dh_prev, "dgx": dgx, "rhm": r * hp * m}
    if kernel == "gru_bwd_rb_r":
        r = o["g3"]
        dr = o["drh"] * o["hp"] * m
        return {"dh": o["dh"] + o["drh"] * r * m, "dgx": dr * r * (1 - r)}
    if kernel == "lstm_fwd":
        pre = o["gx"] + o["gh"] + o["b"]
        i, f, g, og = _sig(part(pre, 0)), _sig(part(pre, 1)), np.tanh(part(pre, 2)), \
            _sig(part(pre, 3))
        c = f * o["cp"] + i * g
        return {"g4": np.concatenate([i, f, g, og]), "cn": c, "hf": og * np.tanh(c)}
    if kernel == "lstm_bwd":
        i, f, g, og = (part(o["g4"], q) for q in range(4))
        hc = np.tanh(o["cn"])
        dc = o["dc"] + o["dhf"] * og * (1 - hc * hc)
        return {"dc": dc * f, "da": np.concatenate([dc * g * i * (1 - i),
                                                    dc * o["cp"] * f * (1 - f),
                                                    dc * i * (1 - g * g),
                                                    o["dhf"] * hc * og * (1 - og)])}
    if kernel == "rnn_fwd":
        a = o["gx"] + o["gh"] + o["b"]
        return {"hn": np.where(a > 0, a, 0.0) if option else np.tanh(a)}
    assert kernel == "rnn_bwd"
    h = o["hn"]
    return {"dh": np.zeros(H), "da": np.where(h > 0, o["dh"], 0.0) if option
            else o["dh"] * (1 - h * h)}


def _gate_operands(kernel, H, dtype, seed):
    """Random operands of ``kernel``: pre-activations spread wide enough to saturate, gates in
    their activation's range, a few exact zeros."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, width, role in K.GATE_ROWS[kernel]:
        if role == "out":
            continue
        if role == "mask":
            out[name] = None if seed % 2 else rng.uniform(0, 1.5, H).astype(dtype)
            continue
        if name in ("g3", "g4", "z"):   # sigmoid gates in (0, 1), the tanh candidate in (−1, 1)
            a = rng.uniform(0, 1, width * H)
            if width >= 3:
                a[2 * H:3 * H] = rng.uniform(-1, 1, H)  # n (GRU) or g (LSTM)
        elif kernel == "rnn_bwd" and name == "hn":
            a = rng.uniform(-1, 1, width * H)
        else:
            a = rng.standard_normal(width * H) * rng.choice([0.1, 1, 4, 40], width * H)
        a[rng.random(a.size) < 0.05] = 0.0
        out[name] = a.astype(dtype)
    return out


_GATE_CASES = [("gru_fwd_ra", 0), ("gru_fwd_ra", 1), ("gru_bwd_ra", 0), ("gru_bwd_ra", 1),
               ("gru_fwd_rb_rz", 0), ("gru_fwd_rb_n", 0), ("gru_fwd_rb_n", 1),
               ("gru_bwd_rb", 0), ("gru_bwd_rb", 1), ("gru_bwd_rb_r", 0),
               ("lstm_fwd", 0), ("lstm_bwd", 0), ("rnn_fwd", 0), ("rnn_fwd", 1), ("rnn_bwd", 0),
               ("rnn_bwd", 1)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel,option", _GATE_CASES)
@pytest.mark.parametrize("H", [1, 7, 16, 17, 40, 257])
def test_gate_rows_match_numpy(kernel, option, dtype, isa, H):
    ops = _gate_operands(kernel, H, dtype, seed=H)
    kept = {k: None if v is None else v.copy() for k, v in ops.items()}
    got = K.gate_row(kernel, ops, option, isa=isa)
    want = _gate_row_numpy(kernel, ops, H, option)
    assert set(got) == set(want)
    tol = {np.float32: 2e-6, np.float64: 1e-14}[dtype]
    for name in want:
        assert got[name].dtype == dtype
        np.testing.assert_allclose(got[name], want[name], rtol=tol * 10, atol=tol * 40,
                                   err_msg=name)
    assert all(ops[k] is None if kept[k] is None else np.array_equal(ops[k], kept[k])
               for k in ops)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel,option", _GATE_CASES)
def test_gate_rows_do_not_depend_on_an_elements_position(kernel, option, dtype, isa):
    # Every element goes through the same instructions wherever it sits in a row (in a full
    # vector or the short last one): bitwise the same as a row of that one element.
    H = 37
    widths = {name: width for name, width, _ in K.GATE_ROWS[kernel]}
    for seed in (3, 4):                        # without and with a mask, where there is one
        ops = _gate_operands(kernel, H, dtype, seed)
        whole = K.gate_row(kernel, ops, option, isa=isa)
        for j in range(H):
            one = {name: None if a is None else a.reshape(widths[name], H)[:, j].copy()
                   for name, a in ops.items()}
            alone = K.gate_row(kernel, one, option, isa=isa)
            for name, a in alone.items():
                assert np.array_equal(a, whole[name].reshape(widths[name], H)[:, j]), (name, j)


def test_gate_row_refuses_what_it_cannot_run():
    ops = _gate_operands("rnn_fwd", 4, np.float32, 0)
    with pytest.raises(ValueError, match="isa"):
        K.gate_row("rnn_fwd", ops, isa=2)
    with pytest.raises(ValueError, match="kernel"):
        K.gate_row("gru", ops)
    with pytest.raises(ValueError, match="operands"):
        K.gate_row("rnn_fwd", {"gx": ops["gx"]})
    with pytest.raises(ValueError, match="gh: expected 4 elements"):
        K.gate_row("rnn_fwd", dict(ops, gh=ops["gh"][:3]))


def _disassembly(module):
    """``{function: [instruction lines]}`` of a kernel module, by objdump."""
    import subprocess
    import shutil
    import importlib
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump")
    path = importlib.import_module(f"cgru._kernels.{module}").__file__
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", path], capture_output=True,
                          text=True, check=True).stdout
    functions, current = {}, None
    for line in text.split("\n"):
        head = re.match(r"^[0-9a-f]+ <([^>]+)>:$", line)
        if head:
            current = functions.setdefault(head.group(1), [])
        elif current is not None and "\t" in line:
            current.append(line)
    return functions


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 code only")
@pytest.mark.parametrize("module,kernels", [("gru", ("gru_fwd_ra", "gru_bwd_ra", "gru_fwd_rb_rz",
                                                     "gru_fwd_rb_n", "gru_bwd_rb",
                                                     "gru_bwd_rb_r")),
                                            ("lstm", ("lstm_fwd", "lstm_bwd")),
                                            ("rnn", ("rnn_fwd", "rnn_bwd"))])
def test_gate_rows_are_compiled_for_each_isa(module, kernels):
    """Reads the machine code the kind's module holds: each fused row kernel in its three
    versions, the AVX-512 one on 512-bit registers, the AVX2 one on 256-bit ones, and float32
    math in float32 (no conversion of a float to double anywhere in them)."""
    code = _disassembly(module)
    for kernel in kernels:
        for suffix in ("f32", "f64"):
            for level, register in (("v4", "%zmm"), ("v3", "%ymm"), ("base", "%xmm")):
                name = f"cgru_{kernel}_{suffix}_{level}"
                body = [f for f in code if f == name or f.startswith(name + ".")]
                assert body, f"{name} is not in {module}'s code"
                lines = [line for f in body for line in code[f]]
                assert any(register in line for line in lines), (name, register)
                if level == "base":
                    assert not any("%ymm" in line or "%zmm" in line for line in lines), name
                if suffix == "f32":
                    promoted = [line for line in lines if re.search(r"cvtss2sd|cvtps2pd", line)]
                    assert not promoted, (name, promoted[:3])
                if level != "v4":
                    assert not any("%zmm" in line for line in lines), name


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 code only")
def test_packed_gemm_keeps_its_sums_in_registers():
    """Reads the packed GEMM's machine code: the AVX2 and baseline versions, written on
    vectors of their own register width, never multiply-add onto a value on the stack (when
    they were written on 64-byte vectors, GCC kept the AVX2 sums in memory, 30 times slower),
    and the AVX-512 version hardly."""
    code = _disassembly("loops")
    for suffix in ("f32", "f64"):
        for level, width, ops, most in (("v4", "%zmm", r"vfmadd", 0.05),
                                        ("v3", "%ymm", r"vfmadd", 0.0),
                                        ("base", "%xmm", r"\b(mul|add)p[sd]\b", 0.0)):
            name = f"cgru_gemm_packed_{suffix}_{level}"
            lines = [line for f in code if f == name or f.startswith(name + ".")
                     for line in code[f]]
            arithmetic = [line for line in lines if re.search(ops, line) and width in line]
            on_stack = [line for line in arithmetic if "(%rsp)" in line]
            assert arithmetic, name
            assert len(on_stack) <= most * len(arithmetic), (name, on_stack[:3])
            if level != "v4":
                assert not any("%zmm" in line for line in lines), name


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 code only")
def test_packed_gemm_prefetches_in_each_level():
    """Reads the packed GEMM's machine code: each level's version holds the prefetches of its
    first call over a large B's panel (test_packed_gemm_over_a_b_that_prefetches runs the
    ones this machine can)."""
    code = _disassembly("loops")
    for suffix in ("f32", "f64"):
        for level in ("v4", "v3", "base"):
            name = f"cgru_gemm_packed_{suffix}_{level}"
            lines = [line for f in code if f == name or f.startswith(name + ".")
                     for line in code[f]]
            assert lines, name
            assert any(re.search(r"\tprefetcht0\b", line) for line in lines), name
