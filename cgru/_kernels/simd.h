/* cgru's own small kernels, in C with GCC/Clang vector extensions:
 *
 *   1. A GEMM with a pre-packed right-hand side, C[m, n] (+)= A[m, k] · op(B), for the
 *      per-step recurrent products of the time loop and for the whole-sequence input
 *      projections and input gradients (blas.pyx's gemm_packed_blocks runs it in row blocks);
 *      with A read transposed (ta: A given [k, m]), for the weight gradients dgᵀ·X.
 *      OpenBLAS re-packs B (the weights) on every call, which costs more than the product
 *      itself when m (the batch rows of one step) is small; here the weights are packed once
 *      per kept copy and reused by every step and call. Every C element is a sum over k in
 *      increasing order, whatever m, the row blocking or the thread: results do not depend on
 *      how the rows are split, so a stream's one-step products equal a whole sequence's.
 *   2. Vectorised sigmoid and tanh, float32 and float64, for the fused gate loops (gates.h
 *      and the kinds' own loops).
 *
 * Each hot function is compiled three times, for x86-64-v4 (AVX-512), x86-64-v3 (AVX2+FMA)
 * and the baseline (SSE2), each version written on vectors of its level's register width, and
 * picked by an explicit switch on cgru_isa() (asked once; NAME_at takes the level, so that a
 * test can force each one the machine runs).
 *
 * Compiled once: the files of src/ define CGRU_IMPL_<part> and include this header (or
 * gates.h), which then defines that part's functions; everywhere else the header only declares
 * them (and the small inline wrappers), and setup.py links the objects into each module that
 * calls them. Every level's code of every kernel compiled into each of five modules made a
 * build four times slower, and twenty times under the sanitizers.
 */
#ifndef CGRU_SIMD_H
#define CGRU_SIMD_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CGRU_X86 1
#else
#define CGRU_X86 0
#endif
#define CGRU_INLINE static inline __attribute__((always_inline))
#define CGRU_LEVEL static __attribute__((noinline))   /* one level's version: its own function */
#define CGRU_UNROLL _Pragma("GCC unroll 16")   /* loops over registers: constant indices */
#define CGRU_API __attribute__((visibility("hidden")))   /* compiled once, linked into modules */

/* Vectors of each level's register width: 64 bytes for AVX-512, 32 for AVX2, 16 for the
 * baseline (SSE2). Each level's code is written on its own width: GCC splits a vector wider
 * than the machine's registers into pieces, which keeps arrays of them (the GEMM's sums) in
 * memory rather than in registers — AVX2 code on 64-byte vectors ran 30 times slower. */
typedef float cgru_vf __attribute__((vector_size(64)));    /* AVX-512: 16 floats */
typedef double cgru_vd __attribute__((vector_size(64)));   /*          8 doubles */
typedef int32_t cgru_vi __attribute__((vector_size(64)));
typedef int64_t cgru_vl __attribute__((vector_size(64)));
typedef float cgru_vf8 __attribute__((vector_size(32)));   /* AVX2:    8 floats */
typedef double cgru_vd4 __attribute__((vector_size(32)));  /*          4 doubles */
typedef int32_t cgru_vi8 __attribute__((vector_size(32)));
typedef int64_t cgru_vl4 __attribute__((vector_size(32)));
typedef float cgru_vf4 __attribute__((vector_size(16)));   /* SSE2:    4 floats */
typedef double cgru_vd2 __attribute__((vector_size(16)));  /*          2 doubles */
typedef int32_t cgru_vi4 __attribute__((vector_size(16)));
typedef int64_t cgru_vl2 __attribute__((vector_size(16)));

#define CGRU_NR_F 32   /* packed panel width, float: 2 AVX-512 vectors, 4 AVX2 ones, 8 SSE2 */
#define CGRU_NR_D 16   /* packed panel width, double: likewise */
#define CGRU_L2_ROWS_BYTES (192 << 10)   /* rows of A per block of a long product (see _body) */
#define CGRU_L2_B_BYTES (1 << 20)        /* ... when packed B is at most this large */
#define CGRU_SHORT_K 8                   /* k up to this: the short-k kernel (_short) */
#define CGRU_GEMM_NO_SHORT 2             /* a flag of _t_at's ta: the micro-kernels at every k */
/* When packed B is CGRU_PF_MIN_BYTES or more (a step's recurrent weights at H = 1024: 12 MiB
 * in float32, read from memory on every step), the first micro-kernel call over each of its
 * panels (its first rows block, the panel's first vectors; a whole block of rows or more)
 * prefetches the panel's whole rows CGRU_PF_K ahead; every other call is the plain kernel
 * (the prefetching one is a separate instantiation, its own peeled call). On a Zen 2 core (L2
 * 512 KiB, memory read at about 12 GB/s) the engine's per-step products of 20×3072×1024 went
 * from about 48 to about 55 GFLOP/s. Prefetching in every call, or testing a flag in the
 * kernel's loop, cost the common shapes (B of 1 MiB or less, which the hardware prefetchers
 * keep up with) about 10 %; this way they run the same code as without it.               */
#define CGRU_PF_K 64
#define CGRU_PF_MIN_BYTES (8u << 20)

#define CGRU_DEFINE_LOAD(NAME, T, VT)                                                          \
CGRU_INLINE VT NAME(const T *p) { VT v; memcpy(&v, p, sizeof v); return v; }
CGRU_DEFINE_LOAD(cgru_loadf, float, cgru_vf)
CGRU_DEFINE_LOAD(cgru_loadd, double, cgru_vd)
CGRU_DEFINE_LOAD(cgru_loadf8, float, cgru_vf8)
CGRU_DEFINE_LOAD(cgru_loadd4, double, cgru_vd4)
CGRU_DEFINE_LOAD(cgru_loadf4, float, cgru_vf4)
CGRU_DEFINE_LOAD(cgru_loadd2, double, cgru_vd2)

/* ---- packing ------------------------------------------------------------------------------
 * op(B) is [k, n]: B stored [k, n] (trans = 0) or [n, k] (trans = 1), row stride ldb.
 * Packed: panel p (columns p·NR … p·NR+NR−1) is k rows of NR values, zero beyond n. The
 * layout is the same for every level (a pack made once serves whichever code runs).          */
static inline size_t cgru_packed_size(int n, int k, int nr) {
    return (size_t)((n + nr - 1) / nr) * (size_t)nr * (size_t)k;
}

/* A whole panel of a transposed B (its NR rows from src, k values each, row stride ldb) in
 * tiles: 8 × 8 floats or 4 × 4 doubles loaded a row of the tile a vector, transposed in
 * registers and stored a row of the panel a vector; the k left over value by value. Packing
 * the transposed weights (the forward's Wᵀ and Rᵀ, packed anew whenever the weights change:
 * every step of a training loop) one value at a time took 84 µs for 768 × 256 floats, more
 * than twice a copy of them. A pack is a copy: its bytes do not depend on how it is made. */
#if CGRU_X86
#include <immintrin.h>
CGRU_API int cgru_isa(void);
__attribute__((target("avx"))) static inline void cgru_pack_tr_panel_f32(const float *src, int ldb,
                                                                  int k, float *dst) {
    enum { NR = CGRU_NR_F };
    int kk = 0;
    for (; kk + 8 <= k; kk += 8)
        for (int c = 0; c < NR; c += 8) {
            const float *s = src + (size_t)c * ldb + kk;
            __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ldb),
                   r2 = _mm256_loadu_ps(s + 2 * (size_t)ldb), r3 = _mm256_loadu_ps(s + 3 * (size_t)ldb),
                   r4 = _mm256_loadu_ps(s + 4 * (size_t)ldb), r5 = _mm256_loadu_ps(s + 5 * (size_t)ldb),
                   r6 = _mm256_loadu_ps(s + 6 * (size_t)ldb), r7 = _mm256_loadu_ps(s + 7 * (size_t)ldb);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                   t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
                   t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                   t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                   u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                   u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                   u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *d = dst + (size_t)kk * NR + c;
            _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(d + NR, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(d + 2 * NR, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(d + 3 * NR, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(d + 4 * NR, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(d + 5 * NR, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(d + 6 * NR, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(d + 7 * NR, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    for (; kk < k; kk++)
        for (int c = 0; c < NR; c++) dst[(size_t)kk * NR + c] = src[(size_t)c * ldb + kk];
}
__attribute__((target("avx"))) static inline void cgru_pack_tr_panel_f64(const double *src, int ldb,
                                                                  int k, double *dst) {
    enum { NR = CGRU_NR_D };
    int kk = 0;
    for (; kk + 4 <= k; kk += 4)
        for (int c = 0; c < NR; c += 4) {
            const double *s = src + (size_t)c * ldb + kk;
            __m256d r0 = _mm256_loadu_pd(s), r1 = _mm256_loadu_pd(s + ldb),
                    r2 = _mm256_loadu_pd(s + 2 * (size_t)ldb), r3 = _mm256_loadu_pd(s + 3 * (size_t)ldb);
            __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1),
                    t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
            double *d = dst + (size_t)kk * NR + c;
            _mm256_storeu_pd(d, _mm256_permute2f128_pd(t0, t2, 0x20));
            _mm256_storeu_pd(d + NR, _mm256_permute2f128_pd(t1, t3, 0x20));
            _mm256_storeu_pd(d + 2 * NR, _mm256_permute2f128_pd(t0, t2, 0x31));
            _mm256_storeu_pd(d + 3 * NR, _mm256_permute2f128_pd(t1, t3, 0x31));
        }
    for (; kk < k; kk++)
        for (int c = 0; c < NR; c++) dst[(size_t)kk * NR + c] = src[(size_t)c * ldb + kk];
}
#define CGRU_PACK_TR_PANEL(T, src, ldb, k, dst)                                                \
    (cgru_isa() >= 3 ? (sizeof(T) == 4 ? cgru_pack_tr_panel_f32((const float *)(src), ldb, k,  \
                                                               (float *)(dst))                 \
                                       : cgru_pack_tr_panel_f64((const double *)(src), ldb, k, \
                                                               (double *)(dst)), 1) : 0)
#else
#define CGRU_PACK_TR_PANEL(T, src, ldb, k, dst) 0
#endif

#define CGRU_DEFINE_PACK(NAME, T, NR)                                                          \
/* rows k0 ≤ kk < k1 of a non-transposed B (each row of the pack is a function of the same row \
 * of B alone: callers on several threads pack ranges of rows, with the same bytes)         */ \
static inline void NAME##_rows(int n, int k, int k0, int k1, const T *B, int ldb, T *Bp) {     \
    int whole = n / NR, w = n - whole * NR;                                                    \
    for (int kk = k0; kk < k1; kk++) {  /* the whole panels row by row of B: each read once,  \
                                          in order, into one run of NR values per panel      \
                                          (copies of a constant size: vector moves)       */ \
        for (int q = 0; q < whole; q++)                                                        \
            memcpy(Bp + (size_t)q * NR * k + (size_t)kk * NR, B + (size_t)kk * ldb + q * NR,   \
                   NR * sizeof(T));                                                            \
        if (w) {                        /* the last panel's w columns, zeros after them */    \
            T *dst = Bp + (size_t)whole * NR * k + (size_t)kk * NR;                            \
            memcpy(dst, B + (size_t)kk * ldb + whole * NR, (size_t)w * sizeof(T));             \
            memset(dst + w, 0, (size_t)(NR - w) * sizeof(T));                                  \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
static inline void NAME(int trans, int n, int k, const T *B, int ldb, T *Bp) {                 \
    if (!trans) {                                                                              \
        NAME##_rows(n, k, 0, k, B, ldb, Bp);                                                   \
        return;                                                                                \
    }                                                                                          \
    int panels = (n + NR - 1) / NR;                                                            \
    for (int p = 0; p < panels; p++) {                                                         \
        T *dst = Bp + (size_t)p * NR * k;                                                      \
        int j0 = p * NR, w = n - j0 < NR ? n - j0 : NR;                                        \
        if (w == NR && CGRU_PACK_TR_PANEL(T, B + (size_t)j0 * ldb, ldb, k, dst))               \
            continue;                       /* a whole panel of a transposed B, in tiles */    \
        if (w < NR) memset(dst, 0, (size_t)NR * k * sizeof(T));                                \
        /* column c of the panel is row j0 + c of B: gather the w rows, writing the panel in   \
         * order (the w source lines stay in L1) */                                            \
        const T *src = B + (size_t)j0 * ldb;                                                   \
        for (int kk = 0; kk < k; kk++)                                                         \
            for (int c = 0; c < w; c++) dst[(size_t)kk * NR + c] = src[(size_t)c * ldb + kk];  \
    }                                                                                          \
}
CGRU_DEFINE_PACK(cgru_pack_f32, float, CGRU_NR_F)
CGRU_DEFINE_PACK(cgru_pack_f64, double, CGRU_NR_D)

/* ---- micro-kernel: C[mr, nv·L] (+)= A[mr, k] · the nv vectors of columns at Bp -------------
 * (L lanes a vector, NR/L vectors a panel; Bp points at a vector of a panel, vector q of the
 * call is vector q mod NR/L of the q div NR/L-th panel from there). mr·nv accumulator
 * vectors; the k loop broadcasts A[r, kk] and multiply-adds. The caller points Bp at the
 * first vector (a half panel's, a quarter's) rather than passing its index, so that every
 * offset into B is a constant: with the index a variable, the AVX2 loop over k ran out of
 * registers and reloaded the offset from the stack at every k. Every C element is acc += a·b
 * over kk in increasing order in every instantiation, so the bits do not depend on mr, nv, the
 * level's vector width or which rows share a call. ncols: the columns of C from the first
 * vector that exist.                                                                         */
/* The micro-kernel's loop over k (PF: also prefetch the rows of the panels it reads from,
 * CGRU_PF_K ahead: all of each row, so that the calls after it on the same panel, which do
 * not prefetch, find it in cache) */
#define CGRU_MICRO_KLOOP(PF, T, VT, L, NR, LOAD)                                               \
    for (int kk = 0; kk < k; kk++) {                                                           \
        VT b[8];                                                                               \
        if (PF && kk + CGRU_PF_K < k) {                                                        \
            const char *f = (const char *)(Bp + (size_t)(kk + CGRU_PF_K) * NR);                \
            CGRU_UNROLL for (int p = 0; p <= (nv - 1) / VP; p++)                               \
                CGRU_UNROLL for (int o = 0; o < NR * (int)sizeof(T); o += 64)                  \
                    __builtin_prefetch(f + p * ps * sizeof(T) + o, 0, 3);                      \
        }                                                                                      \
        CGRU_UNROLL for (int q = 0; q < nv; q++)                                               \
            b[q] = LOAD(Bp + (q / VP) * ps + (size_t)kk * NR + (q % VP) * L);                  \
        CGRU_UNROLL for (int r = 0; r < mr; r++) {                                             \
            T a = ta ? A[(size_t)kk * lda + r] : A[(size_t)r * lda + kk];                      \
            CGRU_UNROLL for (int q = 0; q < nv; q++) acc[r][q] += a * b[q];                    \
        }                                                                                      \
    }
#define CGRU_DEFINE_MICRO(NAME, T, VT, L, NR, LOAD)                                            \
CGRU_INLINE void NAME(const int ta, const int mr, const int nv, int ncols, int k, const T *A,    \
                      int lda, const T *Bp, int beta1, T *C, int ldc, const int PF) {          \
    enum { VP = NR / L };                                                                      \
    VT acc[8][8];                                                                              \
    size_t ps = (size_t)NR * k;                                                                \
    CGRU_UNROLL for (int r = 0; r < mr; r++)                                                   \
        CGRU_UNROLL for (int q = 0; q < nv; q++) acc[r][q] = (VT){0};                          \
    /* PF is a constant at every call: the calls without prefetches have no test in the loop */ \
    CGRU_MICRO_KLOOP(PF, T, VT, L, NR, LOAD)                                                   \
    /* whole vectors (C + sum, when beta1, is the same add as element by element), with every  \
     * index a constant once unrolled, so that the sums stay in registers                  */  \
    if (ncols >= nv * L) {                                                                     \
        CGRU_UNROLL for (int r = 0; r < mr; r++)                                               \
            CGRU_UNROLL for (int q = 0; q < nv; q++) {                                         \
                T *c = C + (size_t)r * ldc + q * L;                                            \
                VT v = acc[r][q];                                                              \
                if (beta1) v += LOAD(c);                                                       \
                memcpy(c, &v, sizeof(VT));                                                     \
            }                                                                                  \
        return;                                                                                \
    }                                                                                          \
    /* the last panel's columns: through memory */                                             \
    T part[8][8][L];                                                                           \
    CGRU_UNROLL for (int r = 0; r < mr; r++)                                                   \
        CGRU_UNROLL for (int q = 0; q < nv; q++) memcpy(part[r][q], &acc[r][q], sizeof(VT));   \
    for (int r = 0; r < mr; r++) {                                                             \
        T *c = C + (size_t)r * ldc;                                                            \
        for (int q = 0; q < nv; q++) {                                                         \
            int w = ncols - q * L < L ? ncols - q * L : L;                                     \
            for (int j = 0; j < w; j++)                                                        \
                c[q * L + j] = beta1 ? c[q * L + j] + part[r][q][j] : part[r][q][j];           \
        }                                                                                      \
    }                                                                                          \
}
/* ---- C[m, n] (+)= A[m, k] · op(B) for a short k (at most CGRU_SHORT_K): row after row ------
 * A weight gradient over a few rows of T·N (one step of one sequence: k = 1) writes a large C
 * from almost no arithmetic, so C's traffic is its time: the micro-kernels' column strips down
 * all of C, a call per 6 rows × 16 columns, took twice as long as a memset of C (768 × 256).
 * Here each row of C is written whole, in order, from A's k values of that row and the panels
 * of B (k·NR values each, in L1). Every element is the micro-kernel's: a sum from 0 of
 * acc += a·b over kk in increasing order in the level's vector type, then + C when beta1 —
 * the same operations, so the same bits (a test compares the two on every level).          */
#define CGRU_DEFINE_SHORT_K(NAME, T, VT, L, NR, LOAD)                                          \
CGRU_INLINE void NAME(const int ta, int m, int n, int k, const T *A, int lda, const T *Bp,     \
                      int beta1, T *C, int ldc) {                                              \
    enum { VP = NR / L };                                                                      \
    size_t ps = (size_t)NR * k;                                                                \
    int panels = (n + NR - 1) / NR;                                                            \
    for (int i = 0; i < m; i++) {                                                              \
        T a[CGRU_SHORT_K];                                                                     \
        for (int kk = 0; kk < k; kk++)                                                         \
            a[kk] = ta ? A[(size_t)kk * lda + i] : A[(size_t)i * lda + kk];                    \
        T *c = C + (size_t)i * ldc;                                                            \
        for (int p = 0; p < panels; p++) {                                                     \
            const T *bp = Bp + (size_t)p * ps;                                                 \
            VT acc[VP];                                                                        \
            CGRU_UNROLL for (int q = 0; q < VP; q++) acc[q] = (VT){0};                         \
            for (int kk = 0; kk < k; kk++) {                                                   \
                T av = a[kk];                                                                  \
                CGRU_UNROLL for (int q = 0; q < VP; q++)                                       \
                    acc[q] += av * LOAD(bp + (size_t)kk * NR + q * L);                         \
            }                                                                                  \
            T *cp = c + p * NR;                                                                \
            int ncols = n - p * NR;                                                            \
            if (ncols >= NR) {                                                                 \
                CGRU_UNROLL for (int q = 0; q < VP; q++) {                                     \
                    VT v = acc[q];                                                             \
                    if (beta1) v += LOAD(cp + q * L);                                          \
                    memcpy(cp + q * L, &v, sizeof(VT));                                        \
                }                                                                              \
                continue;                                                                      \
            }                                                                                  \
            T part[VP][L];                                                                     \
            CGRU_UNROLL for (int q = 0; q < VP; q++) memcpy(part[q], &acc[q], sizeof(VT));     \
            for (int j = 0; j < ncols; j++)                                                    \
                cp[j] = beta1 ? cp[j] + part[j / L][j % L] : part[j / L][j % L];               \
        }                                                                                      \
    }                                                                                          \
}
CGRU_DEFINE_SHORT_K(cgru_micro16_f32_short, float, cgru_vf, 16, CGRU_NR_F, cgru_loadf)
CGRU_DEFINE_SHORT_K(cgru_micro8_f64_short, double, cgru_vd, 8, CGRU_NR_D, cgru_loadd)
CGRU_DEFINE_SHORT_K(cgru_micro8_f32_short, float, cgru_vf8, 8, CGRU_NR_F, cgru_loadf8)
CGRU_DEFINE_SHORT_K(cgru_micro4_f64_short, double, cgru_vd4, 4, CGRU_NR_D, cgru_loadd4)
CGRU_DEFINE_SHORT_K(cgru_micro4_f32_short, float, cgru_vf4, 4, CGRU_NR_F, cgru_loadf4)
CGRU_DEFINE_SHORT_K(cgru_micro2_f64_short, double, cgru_vd2, 2, CGRU_NR_D, cgru_loadd2)
CGRU_DEFINE_MICRO(cgru_micro16_f32, float, cgru_vf, 16, CGRU_NR_F, cgru_loadf)
CGRU_DEFINE_MICRO(cgru_micro8_f64, double, cgru_vd, 8, CGRU_NR_D, cgru_loadd)
CGRU_DEFINE_MICRO(cgru_micro8_f32, float, cgru_vf8, 8, CGRU_NR_F, cgru_loadf8)
CGRU_DEFINE_MICRO(cgru_micro4_f64, double, cgru_vd4, 4, CGRU_NR_D, cgru_loadd4)
CGRU_DEFINE_MICRO(cgru_micro4_f32, float, cgru_vf4, 4, CGRU_NR_F, cgru_loadf4)
CGRU_DEFINE_MICRO(cgru_micro2_f64, double, cgru_vd2, 2, CGRU_NR_D, cgru_loadd2)

/* ---- C[m, n] = A[m, k] · op(B) (+ C when beta1), op(B) packed in Bp ------------------------
 * Column panel outermost, so one panel (k·NR values) stays in L1 (or L2) while every row
 * block of A passes over it; B is streamed once per call. Each level keeps as many sums in
 * registers as it has room for (the rest of its 16 or 32 registers hold B and a broadcast A):
 *   AVX-512 (32 registers, a panel = 2 vectors): 8 rows × the panel; fewer than four rows
 *     take two panels at once, so that enough independent sums hide the FMA latency (one row
 *     four panels, while whole groups of four are left), and so do 6 rows at a time when
 *     rows are short (A read half as often);
 *   AVX2 (16 registers, a panel = 4 vectors): 6 rows × half a panel (12 sums, 2 of B, the
 *     broadcast); under 4 rows, or the last 1-3 rows, the whole panel at once (one row: two
 *     panels);
 *   SSE2 (16 registers, a panel = 8 vectors): 4 rows × a quarter panel.
 * MICRO(ta, mr, nv, ...) with constants wherever the level's code names them, so each call is
 * unrolled into registers. */
/* Inside the block functions: the micro-kernel on the rows from i of A and of C (at cp), on
 * the vectors of packed B from B; CGRU_RUN_ROWS while MR rows are left. A's rows from i:
 * TA 0, A row-major; TA 1, A given transposed ([k, m]); TA 2, A transposed and packed in
 * groups of G rows (the level's row block), group g a [k, G] array at A + g·G·k, lda = G (see
 * _rows). */
#define CGRU_A_ROWS(i)                                                                         \
    (TA == 2 ? A + (size_t)((i) / G) * G * k + (i) % G : TA ? A + (i) : A + (size_t)(i) * lda)
#define CGRU_RUN(MICRO, R, B, NV, ncols, cp)                                                   \
    MICRO(TA, R, NV, ncols, k, CGRU_A_ROWS(i), lda, B, beta1, (cp) + (size_t)i * ldc, ldc, 0)
#define CGRU_RUN_PF(MICRO, R, B, NV, ncols, cp)                                                \
    MICRO(TA, R, NV, ncols, k, CGRU_A_ROWS(i), lda, B, beta1, (cp) + (size_t)i * ldc, ldc, 1)
#define CGRU_RUN_ROWS(MICRO, MR, B, NV, ncols, cp)                                             \
    for (; i + MR <= m; i += MR) CGRU_RUN(MICRO, MR, B, NV, ncols, cp)

#define CGRU_DEFINE_GEMM(NAME, MICRO16, MICRO8, MICRO4, T, NR)                                 \
/* AVX-512: a panel is VP = 2 vectors */                                                       \
CGRU_INLINE void NAME##_block_v4(const int TA, int m, int n, int k, const T *A, int lda,       \
                                 const T *Bp, int beta1, T *C, int ldc, int pf) {              \
    enum { L = 64 / (int)sizeof(T), VP = NR / L, G = 8 };                                      \
    int panels = (n + NR - 1) / NR, p = 0;                                                     \
    if (m < 4 || (size_t)k * sizeof(T) < 1024) {                                               \
        /* one row (a step at batch 1, whose time is reading B): four panels at a time, four  \
         * streams of B in flight — a [1, 256]·[256, 768] float product went from 7.6 to 7.3  \
         * µs (Zen 4, B in L2). (Two rows so, measured faster alone, ran slower here.)     */  \
        if (m == 1)                                                                            \
            for (; p + 4 <= panels; p += 4) {                                                  \
                const T *bp = Bp + (size_t)p * NR * k;                                         \
                int i = 0;                                                                     \
                CGRU_RUN(MICRO16, 1, bp, 4 * VP, n - p * NR, C + (size_t)p * NR);              \
            }                                                                                  \
        /* two panels at a time: under 4 rows (enough sums to hide the FMA latency), and for   \
         * short rows, 6 rows (24 sums) so that each row of A is read half as often        */  \
        for (; p + 2 <= panels; p += 2) {                                                      \
            const T *bp = Bp + (size_t)p * NR * k;                                             \
            int ncols = n - p * NR, i = 0;                                                     \
            T *cp = C + (size_t)p * NR;                                                        \
            CGRU_RUN_ROWS(MICRO16, 6, bp, 2 * VP, ncols, cp);                                  \
            switch (m - i) {                                                                   \
            case 5: CGRU_RUN(MICRO16, 5, bp, 2 * VP, ncols, cp); break;                        \
            case 4: CGRU_RUN(MICRO16, 4, bp, 2 * VP, ncols, cp); break;                        \
            case 3: CGRU_RUN(MICRO16, 3, bp, 2 * VP, ncols, cp); break;                        \
            case 2: CGRU_RUN(MICRO16, 2, bp, 2 * VP, ncols, cp); break;                        \
            case 1: CGRU_RUN(MICRO16, 1, bp, 2 * VP, ncols, cp); break;                        \
            default: break;                                                                    \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    for (; p < panels; p++) {  /* one panel, 8 rows at a time */                               \
        const T *bp = Bp + (size_t)p * NR * k;                                                 \
        int ncols = n - p * NR < NR ? n - p * NR : NR, i = 0;                                  \
        T *cp = C + (size_t)p * NR;                                                            \
        if (pf && m >= 8) { CGRU_RUN_PF(MICRO16, 8, bp, VP, ncols, cp); i = 8; }               \
        CGRU_RUN_ROWS(MICRO16, 8, bp, VP, ncols, cp);                                          \
        switch (m - i) {                                                                       \
        case 7: CGRU_RUN(MICRO16, 7, bp, VP, ncols, cp); break;                                \
        case 6: CGRU_RUN(MICRO16, 6, bp, VP, ncols, cp); break;                                \
        case 5: CGRU_RUN(MICRO16, 5, bp, VP, ncols, cp); break;                                \
        case 4: CGRU_RUN(MICRO16, 4, bp, VP, ncols, cp); break;                                \
        case 3: CGRU_RUN(MICRO16, 3, bp, VP, ncols, cp); break;                                \
        case 2: CGRU_RUN(MICRO16, 2, bp, VP, ncols, cp); break;                                \
        case 1: CGRU_RUN(MICRO16, 1, bp, VP, ncols, cp); break;                                \
        default: break;                                                                        \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
/* AVX2: a panel is VP = 4 vectors */                                                          \
CGRU_INLINE void NAME##_block_v3(const int TA, int m, int n, int k, const T *A, int lda,       \
                                 const T *Bp, int beta1, T *C, int ldc, int pf) {              \
    enum { L = 32 / (int)sizeof(T), VP = NR / L, HALF = NR / 2, G = 6 };                       \
    int panels = (n + NR - 1) / NR, p = 0;                                                     \
    if (m == 1)                /* one row: two panels at once (8 sums) */                      \
        for (; p + 2 <= panels; p += 2) {                                                      \
            const T *bp = Bp + (size_t)p * NR * k;                                             \
            int i = 0;                                                                         \
            CGRU_RUN(MICRO8, 1, bp, 2 * VP, n - p * NR, C + (size_t)p * NR);                   \
        }                                                                                      \
    for (; p < panels; p++) {                                                                  \
        const T *bp = Bp + (size_t)p * NR * k;                                                 \
        int ncols = n - p * NR < NR ? n - p * NR : NR;                                         \
        T *cp = C + (size_t)p * NR;                                                            \
        /* from 4 rows: each half of the panel 6 rows at a time, then a last 4 or 5; a last    \
         * 1-3 rows (or all, under 4) take the whole panel                                 */  \
        int whole = m < 4 ? m : m % 6 < 4 ? m % 6 : 0;                                         \
        for (int h = 0; h < 2 && whole < m && h * HALF < ncols; h++) {                         \
            const T *bh = bp + (size_t)h * HALF;   /* the half panel's first vector */         \
            int cols = ncols - h * HALF, i = 0;                                                \
            if (pf && h == 0 && m >= 6) {                                                      \
                CGRU_RUN_PF(MICRO8, 6, bh, VP / 2, cols, cp + h * HALF); i = 6; }              \
            CGRU_RUN_ROWS(MICRO8, 6, bh, VP / 2, cols, cp + h * HALF);                         \
            if (m - i == 5) CGRU_RUN(MICRO8, 5, bh, VP / 2, cols, cp + h * HALF);              \
            else if (m - i == 4) CGRU_RUN(MICRO8, 4, bh, VP / 2, cols, cp + h * HALF);         \
        }                                                                                      \
        int i = m - whole;                                                                     \
        switch (whole) {                                                                       \
        case 3: CGRU_RUN(MICRO8, 3, bp, VP, ncols, cp); break;                                 \
        case 2: CGRU_RUN(MICRO8, 2, bp, VP, ncols, cp); break;                                 \
        case 1: CGRU_RUN(MICRO8, 1, bp, VP, ncols, cp); break;                                 \
        default: break;                                                                        \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
/* SSE2: a panel is VP = 8 vectors; each quarter of it 4 rows at a time, then one by one */    \
CGRU_INLINE void NAME##_block_base(const int TA, int m, int n, int k, const T *A, int lda,     \
                                   const T *Bp, int beta1, T *C, int ldc, int pf) {            \
    enum { L = 16 / (int)sizeof(T), VP = NR / L, Q = NR / 4, G = 4 };                          \
    int panels = (n + NR - 1) / NR;                                                            \
    for (int p = 0; p < panels; p++) {                                                         \
        const T *bp = Bp + (size_t)p * NR * k;                                                 \
        int ncols = n - p * NR < NR ? n - p * NR : NR;                                         \
        for (int qt = 0; qt < 4 && qt * Q < ncols; qt++) {                                     \
            const T *bq = bp + (size_t)qt * Q;     /* the quarter panel's first vector */      \
            int cols = ncols - qt * Q, i = 0;                                                  \
            T *cp = C + (size_t)p * NR + qt * Q;                                               \
            if (pf && qt == 0 && m >= 4) { CGRU_RUN_PF(MICRO4, 4, bq, VP / 4, cols, cp); i = 4; } \
            CGRU_RUN_ROWS(MICRO4, 4, bq, VP / 4, cols, cp);                                    \
            for (; i < m; i++) CGRU_RUN(MICRO4, 1, bq, VP / 4, cols, cp);                      \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
CGRU_INLINE void NAME##_block(const int ISA, const int TA, int m, int n, int k, const T *A,    \
                              int lda, const T *Bp, int beta1, T *C, int ldc, int pf) {        \
    if (ISA == 4) NAME##_block_v4(TA, m, n, k, A, lda, Bp, beta1, C, ldc, pf);                 \
    else if (ISA == 3) NAME##_block_v3(TA, m, n, k, A, lda, Bp, beta1, C, ldc, pf);            \
    else NAME##_block_base(TA, m, n, k, A, lda, Bp, beta1, C, ldc, pf);                        \
}                                                                                              \
/* A long A (a whole sequence's rows) against a B that fits in L2 goes in row blocks of about  \
 * CGRU_L2_ROWS_BYTES, each passing over every panel of B, so that A is read from L2 rather    \
 * than from memory once per panel (rows under 1 KiB stream well enough, measured). A larger   \
 * B goes in column blocks of at most CGRU_L2_B_BYTES, each such a product of its own, so that \
 * A is read once per column block rather than once per panel. A transposed A with rows of     \
 * 1 KiB or more (a weight gradient's dgᵀ over a time block) is copied, a row block at a time, \
 * into groups of the level's row block (TA 2): read in place, each k of a micro-kernel call   \
 * is a new cache line, twice the traffic of a row-major A (dW at 0.55 of the peak on AVX2).   \
 * A row's bits do not depend on its block or on the copy: every element is one               \
 * micro-kernel's sum over all of k.                                                       */  \
CGRU_INLINE void NAME##_rows(const int ISA, const int TA, int m, int n, int k, const T *A,     \
                             int lda, const T *Bp, int beta1, T *C, int ldc, int pf) {         \
    enum { MR = 24 };          /* a multiple of every level's row block (8, 6, 4) */           \
    const int G = ISA == 4 ? 8 : ISA == 3 ? 6 : 4;                                             \
    size_t row_bytes = (size_t)(k > 0 ? k : 1) * sizeof(T);                                    \
    int mc = (int)(CGRU_L2_ROWS_BYTES / row_bytes) / MR * MR;                                  \
    if (mc < 2 * MR) mc = 2 * MR;                                                              \
    int whole = m < 2 * mc || row_bytes < 1024;                                                \
    if (TA == 1 && row_bytes >= 1024 && m >= 2 * G) {                                          \
        int rows = whole ? m : mc;                                                             \
        T *pk = (T *)malloc(((size_t)rows + G) * (size_t)k * sizeof(T));                       \
        if (pk) {                                                                              \
            for (int i = 0; i < m; i += rows) {                                                \
                int r = m - i < rows ? m - i : rows;                                           \
                /* whole groups as copies of a constant G values (a vector move or two),    \
                 * not G one-value moves behind a test: this copy was a fifth of dW's time. \
                 * In tiles of kb rows of A (about 24 KiB of the r values read: in L1), each \
                 * group's kb rows in turn: the writes go to one group's rows in order. Row   \
                 * after row across all groups wrote every group at once, their rows G·k     \
                 * values apart (k = 640: five pages, one cache set), copied at a third of  \
                 * this speed: dW of T = 200, N = 16, H = 128 (m, n, k = 384, 128, 640)     \
                 * took 627 µs, now 582 (the same product with a row-major A: 553).        */ \
                int kb = (int)((24 << 10) / ((size_t)r * sizeof(T)));                          \
                kb = kb < 4 ? 4 : kb > 32 ? 32 : kb;                                           \
                for (int k0 = 0; k0 < k; k0 += kb) {                                           \
                    int k1 = k - k0 < kb ? k : k0 + kb;                                        \
                    for (int g = 0; g * G < r; g++) {                                          \
                        const T *src = A + i + g * G;                                          \
                        T *dst = pk + (size_t)g * G * k;                                       \
                        if (g * G + G <= r)                                                    \
                            for (int kk = k0; kk < k1; kk++)                                   \
                                memcpy(dst + (size_t)kk * G, src + (size_t)kk * lda,           \
                                       G * sizeof(T));                                         \
                        else                                                                   \
                            for (int kk = k0; kk < k1; kk++)                                   \
                                memcpy(dst + (size_t)kk * G, src + (size_t)kk * lda,           \
                                       (size_t)(r - g * G) * sizeof(T));                       \
                    }                                                                          \
                }                                                                              \
                NAME##_block(ISA, 2, r, n, k, pk, G, Bp, beta1, C + (size_t)i * ldc, ldc, pf); \
            }                                                                                  \
            free(pk);                                                                          \
            return;                                                                            \
        }                                                                                      \
    }                                                                                          \
    if (whole) {                                                                               \
        NAME##_block(ISA, TA, m, n, k, A, lda, Bp, beta1, C, ldc, pf);                         \
        return;                                                                                \
    }                                                                                          \
    for (int i = 0; i < m; i += mc)                                                            \
        NAME##_block(ISA, TA, m - i < mc ? m - i : mc, n, k,                                   \
                     A + (TA ? (size_t)i : (size_t)i * lda), lda, Bp, beta1,                   \
                     C + (size_t)i * ldc, ldc, pf);                                            \
}                                                                                              \
CGRU_INLINE void NAME##_body(const int ISA, const int TA, int m, int n, int k, const T *A,     \
                             int lda, const T *Bp, int beta1, T *C, int ldc, int sk) {         \
    if (k >= 1 && k <= sk) {   /* a short k: row after row (see _short) */                     \
        if (ISA == 4) MICRO16##_short(TA, m, n, k, A, lda, Bp, beta1, C, ldc);                 \
        else if (ISA == 3) MICRO8##_short(TA, m, n, k, A, lda, Bp, beta1, C, ldc);             \
        else MICRO4##_short(TA, m, n, k, A, lda, Bp, beta1, C, ldc);                           \
        return;                                                                                \
    }                                                                                          \
    size_t panel_bytes = (size_t)NR * (size_t)(k > 0 ? k : 1) * sizeof(T);                     \
    int panels = (n + NR - 1) / NR;                                                            \
    int per = (int)(CGRU_L2_B_BYTES / panel_bytes);                                            \
    if (per < 1) per = 1;                                                                      \
    int pf = (size_t)panels * panel_bytes >= CGRU_PF_MIN_BYTES;                                \
    for (int p0 = 0; p0 < panels; p0 += per) {                                                 \
        int cols = n - p0 * NR < per * NR ? n - p0 * NR : per * NR;                            \
        NAME##_rows(ISA, TA, m, cols, k, A, lda, Bp + (size_t)p0 * NR * (size_t)k, beta1,      \
                    C + (size_t)p0 * NR, ldc, pf);                                             \
    }                                                                                          \
}                                                                                              \
/* ta = 1: A is given transposed, A[kk, r] at A[kk·lda + r] (k rows of m): C = Aᵀ·op(B),       \
 * the weight gradients' dgᵀ·X; the same sums in the same order as for ta = 0. ta with        \
 * CGRU_GEMM_NO_SHORT: never the short-k kernel (the tests' comparison of the two).        */  \
CGRU_TARGET_V4 CGRU_LEVEL void NAME##_v4(int ta, int m, int n, int k, const T *A, int lda,     \
                                         const T *Bp, int beta1, T *C, int ldc) {              \
    int sk = ta & CGRU_GEMM_NO_SHORT ? 0 : CGRU_SHORT_K;                                        \
    if (ta & 1) NAME##_body(4, 1, m, n, k, A, lda, Bp, beta1, C, ldc, sk);                       \
    else NAME##_body(4, 0, m, n, k, A, lda, Bp, beta1, C, ldc, sk);                            \
}                                                                                              \
CGRU_TARGET_V3 CGRU_LEVEL void NAME##_v3(int ta, int m, int n, int k, const T *A, int lda,     \
                                         const T *Bp, int beta1, T *C, int ldc) {              \
    int sk = ta & CGRU_GEMM_NO_SHORT ? 0 : CGRU_SHORT_K;                                        \
    if (ta & 1) NAME##_body(3, 1, m, n, k, A, lda, Bp, beta1, C, ldc, sk);                       \
    else NAME##_body(3, 0, m, n, k, A, lda, Bp, beta1, C, ldc, sk);                            \
}                                                                                              \
CGRU_LEVEL void NAME##_base(int ta, int m, int n, int k, const T *A, int lda, const T *Bp,     \
                            int beta1, T *C, int ldc) {                                        \
    int sk = ta & CGRU_GEMM_NO_SHORT ? 0 : CGRU_SHORT_K;                                        \
    if (ta & 1) NAME##_body(0, 1, m, n, k, A, lda, Bp, beta1, C, ldc, sk);                       \
    else NAME##_body(0, 0, m, n, k, A, lda, Bp, beta1, C, ldc, sk);                            \
}                                                                                              \
CGRU_API void NAME##_t_at(int isa, int ta, int m, int n, int k, const T *A, int lda,          \
                          const T *Bp, int beta1, T *C, int ldc) {                             \
    switch (isa) {                                                                             \
    case 4: NAME##_v4(ta, m, n, k, A, lda, Bp, beta1, C, ldc); break;                          \
    case 3: NAME##_v3(ta, m, n, k, A, lda, Bp, beta1, C, ldc); break;                          \
    default: NAME##_base(ta, m, n, k, A, lda, Bp, beta1, C, ldc); break;                       \
    }                                                                                          \
}
/* where the GEMM is not compiled: its entry point */
#define CGRU_DECLARE_GEMM(NAME, T)                                                             \
CGRU_API void NAME##_t_at(int isa, int ta, int m, int n, int k, const T *A, int lda,          \
                          const T *Bp, int beta1, T *C, int ldc);
/* everywhere: the calls on one entry point (this machine's level unless given) */
#define CGRU_DEFINE_GEMM_CALLS(NAME, T)                                                        \
static inline void NAME##_at(int isa, int m, int n, int k, const T *A, int lda, const T *Bp,   \
                             int beta1, T *C, int ldc) {                                       \
    NAME##_t_at(isa, 0, m, n, k, A, lda, Bp, beta1, C, ldc);                                   \
}                                                                                              \
static inline void NAME(int m, int n, int k, const T *A, int lda, const T *Bp, int beta1, T *C, \
                        int ldc) {                                                             \
    NAME##_t_at(cgru_isa(), 0, m, n, k, A, lda, Bp, beta1, C, ldc);                            \
}                                                                                              \
static inline void NAME##_ta(int m, int n, int k, const T *A, int lda, const T *Bp, int beta1, \
                             T *C, int ldc) {                                                  \
    NAME##_t_at(cgru_isa(), 1, m, n, k, A, lda, Bp, beta1, C, ldc);                            \
}

/* The machine's vector ISA, asked once: 4 = AVX-512 (x86-64-v4), 3 = AVX2+FMA, 0 = baseline. */
#if CGRU_X86
#define CGRU_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#define CGRU_TARGET_V3 __attribute__((target("arch=x86-64-v3")))
#ifdef CGRU_IMPL_ISA
CGRU_API int cgru_isa(void) {
    static int isa = -1;
    if (isa < 0) {
        __builtin_cpu_init();
        int v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                 && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
        int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        isa = v4 ? 4 : v3 ? 3 : 0;
    }
    return isa;
}
#endif
#else
#define CGRU_TARGET_V4
#define CGRU_TARGET_V3
#ifdef CGRU_IMPL_ISA
CGRU_API int cgru_isa(void) { return 0; }
#endif
#endif
#ifndef CGRU_IMPL_ISA
CGRU_API int cgru_isa(void);
#endif

#ifdef CGRU_IMPL_GEMM_F32
CGRU_DEFINE_GEMM(cgru_gemm_packed_f32, cgru_micro16_f32, cgru_micro8_f32, cgru_micro4_f32, float,
                 CGRU_NR_F)
#else
CGRU_DECLARE_GEMM(cgru_gemm_packed_f32, float)
#endif
#ifdef CGRU_IMPL_GEMM_F64
CGRU_DEFINE_GEMM(cgru_gemm_packed_f64, cgru_micro8_f64, cgru_micro4_f64, cgru_micro2_f64, double,
                 CGRU_NR_D)
#else
CGRU_DECLARE_GEMM(cgru_gemm_packed_f64, double)
#endif
CGRU_DEFINE_GEMM_CALLS(cgru_gemm_packed_f32, float)
CGRU_DEFINE_GEMM_CALLS(cgru_gemm_packed_f64, double)

/* ---- float32 exp, sigmoid, tanh, one definition for every vector width ---------------------
 * VF a float vector, VI the int32 vector of the same lanes; SUF names the width ("" 16 lanes,
 * 8, 4). Every lane goes through the same operations whatever the width, so a value's result
 * does not depend on the level that computed it (FMA contraction aside: the baseline has none).
 *
 * exp: x clamped to [−104, 89] (beyond, the float result is 0 or inf anyway); x = n·ln2 + r
 * with |r| ≤ ln2/2 (n = x·log2e rounded to the nearest integer by adding 1.5·2²³, whose
 * float has no fraction bits left, and read from its low bits; ln2 split in two so n·ln2_hi
 * is exact); e^r by its Taylor series to r⁷
 * (truncation < 6e-9 relative); 2ⁿ applied as 2^⌊n/2⌋·2^(n−⌊n/2⌋) so that results down to
 * the subnormals and up to inf come out right. About 2 ulp. NaN stays NaN.
 *
 * sigmoid(x) = 1/(1 + e^−|x|) for x ≥ 0 and e^−|x|/(1 + e^−|x|) for x < 0: no overflow, and
 * accurate down to the subnormals.
 *
 * tanh: |x| < 0.4 by its Taylor series to x¹³ (truncation < 5e-9 relative); above,
 * sign(x)·(1 − 2/(e^{2|x|} + 1)).                                                              */
#define CGRU_DEFINE_VMATH_F32(SUF, VF, VI)                                                     \
CGRU_INLINE VF cgru_vexpf##SUF(VF x) {                                                         \
    const VF hi = (VF){0} + 89.0f, lo = (VF){0} + -104.0f;                                     \
    VI too_big = x > hi, too_small = x < lo;                                                   \
    x = (VF)(((VI)x & ~too_big) | ((VI)hi & too_big));                                         \
    x = (VF)(((VI)x & ~too_small) | ((VI)lo & too_small));                                     \
    VF t = x * 1.44269504088896341f + 12582912.0f;  /* n = round(x·log2e) */                   \
    VF nf = t - 12582912.0f;                                                                   \
    VI n = (VI)t - 0x4B400000;                                                                 \
    VF r = x - nf * 0.693359375f;                                                              \
    r = r - nf * -2.12194440e-4f;                                                              \
    VF p = (VF){0} + 1.0f / 5040.0f;                                                           \
    p = p * r + 1.0f / 720.0f;                                                                 \
    p = p * r + 1.0f / 120.0f;                                                                 \
    p = p * r + 1.0f / 24.0f;                                                                  \
    p = p * r + 1.0f / 6.0f;                                                                   \
    p = p * r + 0.5f;                                                                          \
    p = p * r + 1.0f;                                                                          \
    p = p * r + 1.0f;                                                                          \
    VI n1 = n >> 1, n2 = n - n1;                                                               \
    return p * (VF)((n1 + 127) << 23) * (VF)((n2 + 127) << 23);                                \
}                                                                                              \
CGRU_INLINE VF cgru_vsigmoidf##SUF(VF x) {                                                     \
    VI neg = x < 0.0f;                                                                         \
    VF a = (VF)((VI)x & 0x7fffffff);                                                           \
    VF e = cgru_vexpf##SUF(-a);                                                                \
    VF num = (VF)(((VI)e & neg) | ((VI)((VF){0} + 1.0f) & ~neg));                              \
    return num / (1.0f + e);                                                                   \
}                                                                                              \
CGRU_INLINE VF cgru_vtanhf##SUF(VF x) {                                                        \
    VI sign = (VI)x & (int32_t)0x80000000;                                                     \
    VF a = (VF)((VI)x & 0x7fffffff);                                                           \
    VF big = 1.0f - 2.0f / (cgru_vexpf##SUF(2.0f * a) + 1.0f);                                 \
    VF z = x * x;                                                                              \
    /* Taylor: tanh x = x − x³/3 + 2x⁵/15 − 17x⁷/315 + 62x⁹/2835 − 1382x¹¹/155925              \
     *                  + 21844x¹³/6081075                                                  */ \
    VF q = (VF){0} + 21844.0f / 6081075.0f;                                                    \
    q = q * z - 1382.0f / 155925.0f;                                                           \
    q = q * z + 62.0f / 2835.0f;                                                               \
    q = q * z - 17.0f / 315.0f;                                                                \
    q = q * z + 2.0f / 15.0f;                                                                  \
    q = q * z - 1.0f / 3.0f;                                                                   \
    VF small = x + x * z * q;                                                                  \
    VI use_small = a < 0.4f;                                                                   \
    VF big_signed = (VF)((VI)big | sign);                                                      \
    return (VF)(((VI)small & use_small) | ((VI)big_signed & ~use_small));                      \
}
CGRU_DEFINE_VMATH_F32(, cgru_vf, cgru_vi)
CGRU_DEFINE_VMATH_F32(8, cgru_vf8, cgru_vi8)
CGRU_DEFINE_VMATH_F32(4, cgru_vf4, cgru_vi4)

/* ---- float64 exp, sigmoid, tanh, likewise (SUF "" 8 lanes, 4, 2) -----------------------------
 * As for float32: x clamped to [−746, 710]; x = n·ln2 + r, |r| ≤ ln2/2, ln2 split in two so
 * n·ln2_hi is exact; e^r by its Taylor series to r¹³ (truncation < 5e-18 relative); 2ⁿ as
 * 2^⌊n/2⌋·2^(n−⌊n/2⌋), right down to the subnormals and up to inf.  About 2 ulp.
 * tanh: |x| < 0.3 by its Taylor series to x²⁵ (truncation < 1e-17 relative); above,
 * sign(x)·(1 − 2/(e^{2|x|} + 1)) (under 2 bits of cancellation near 0.3: a few ulp).         */
#define CGRU_DEFINE_VMATH_F64(SUF, VD, VL)                                                     \
CGRU_INLINE VD cgru_vexpd##SUF(VD x) {                                                         \
    const VD hi = (VD){0} + 710.0, lo = (VD){0} + -746.0;                                      \
    VL too_big = x > hi, too_small = x < lo;                                                   \
    x = (VD)(((VL)x & ~too_big) | ((VL)hi & too_big));                                         \
    x = (VD)(((VL)x & ~too_small) | ((VL)lo & too_small));                                     \
    VD t = x * 1.4426950408889634074 + 0.5;                                                    \
    VL n = __builtin_convertvector(t, VL);                                                     \
    n -= (VL)(__builtin_convertvector(n, VD) > t) & 1;  /* floor */                            \
    VD nf = __builtin_convertvector(n, VD);                                                    \
    VD r = x - nf * 0.693147180369123816490;                                                   \
    r = r - nf * 1.90821492927058770002e-10;                                                   \
    VD p = (VD){0} + 1.0 / 6227020800.0;               /* 1/13! */                             \
    p = p * r + 1.0 / 479001600.0;                                                             \
    p = p * r + 1.0 / 39916800.0;                                                              \
    p = p * r + 1.0 / 3628800.0;                                                               \
    p = p * r + 1.0 / 362880.0;                                                                \
    p = p * r + 1.0 / 40320.0;                                                                 \
    p = p * r + 1.0 / 5040.0;                                                                  \
    p = p * r + 1.0 / 720.0;                                                                   \
    p = p * r + 1.0 / 120.0;                                                                   \
    p = p * r + 1.0 / 24.0;                                                                    \
    p = p * r + 1.0 / 6.0;                                                                     \
    p = p * r + 0.5;                                                                           \
    p = p * r + 1.0;                                                                           \
    p = p * r + 1.0;                                                                           \
    VL n1 = n >> 1, n2 = n - n1;                                                               \
    return p * (VD)((n1 + 1023) << 52) * (VD)((n2 + 1023) << 52);                              \
}                                                                                              \
CGRU_INLINE VD cgru_vsigmoidd##SUF(VD x) {                                                     \
    VL neg = x < 0.0;                                                                          \
    VD a = (VD)((VL)x & 0x7fffffffffffffffLL);                                                 \
    VD e = cgru_vexpd##SUF(-a);                                                                \
    VD num = (VD)(((VL)e & neg) | ((VL)((VD){0} + 1.0) & ~neg));                               \
    return num / (1.0 + e);                                                                    \
}                                                                                              \
CGRU_INLINE VD cgru_vtanhd##SUF(VD x) {                                                        \
    VL sign = (VL)x & (int64_t)0x8000000000000000ULL;                                          \
    VD a = (VD)((VL)x & 0x7fffffffffffffffLL);                                                 \
    VD big = 1.0 - 2.0 / (cgru_vexpd##SUF(2.0 * a) + 1.0);                                     \
    VD z = x * x;                                                                              \
    /* tanh x = Σ 2^{2n}(2^{2n}−1)·B_{2n}·x^{2n−1}/(2n)!  (B: Bernoulli numbers) */            \
    VD q = (VD){0} + 1.5918905069328964e-05;                                                   \
    q = q * z - 3.927832388331683e-05;                                                         \
    q = q * z + 9.691537956929451e-05;                                                         \
    q = q * z - 0.00023912911424355248;                                                        \
    q = q * z + 0.000590027440945586;                                                          \
    q = q * z - 0.0014558343870513183;                                                         \
    q = q * z + 0.003592128036572481;                                                          \
    q = q * z - 0.008863235529902197;                                                          \
    q = q * z + 0.021869488536155203;                                                          \
    q = q * z - 0.05396825396825397;                                                           \
    q = q * z + 2.0 / 15.0;                                                                    \
    q = q * z - 1.0 / 3.0;                                                                     \
    VD small = x + x * z * q;                                                                  \
    VL use_small = a < 0.3;                                                                    \
    VD big_signed = (VD)((VL)big | sign);                                                      \
    return (VD)(((VL)small & use_small) | ((VL)big_signed & ~use_small));                      \
}
CGRU_DEFINE_VMATH_F64(, cgru_vd, cgru_vl)
CGRU_DEFINE_VMATH_F64(4, cgru_vd4, cgru_vl4)
CGRU_DEFINE_VMATH_F64(2, cgru_vd2, cgru_vl2)

/* ---- y[i] = sigmoid(x[i]) / tanh(x[i]) for i < n (x and y may be the same array) ------------
 * Three versions each, on their level's width, dispatched like the GEMM (NAME_at, NAME); a
 * short last chunk goes through a zeroed vector.                                              */
#define CGRU_DEFINE_VMAP_LEVEL(NAME, TARGET, T, VT, L, LOAD, FN)                               \
TARGET CGRU_LEVEL void NAME(int n, const T *x, T *y) {                                         \
    int i = 0;                                                                                 \
    for (; i + L <= n; i += L) {                                                               \
        VT v = FN(LOAD(x + i));                                                                \
        memcpy(y + i, &v, sizeof v);                                                           \
    }                                                                                          \
    if (i < n) {                                                                               \
        T buf[L] = {0};                                                                        \
        memcpy(buf, x + i, (size_t)(n - i) * sizeof(T));                                       \
        VT v = FN(LOAD(buf));                                                                  \
        memcpy(y + i, &v, (size_t)(n - i) * sizeof(T));                                        \
    }                                                                                          \
}
#define CGRU_DEFINE_VMAP(NAME, T, V4, V3, V0)                                                  \
CGRU_APPLY(CGRU_DEFINE_VMAP_LEVEL, NAME##_v4, CGRU_TARGET_V4, T, CGRU_UNPAREN V4)              \
CGRU_APPLY(CGRU_DEFINE_VMAP_LEVEL, NAME##_v3, CGRU_TARGET_V3, T, CGRU_UNPAREN V3)              \
CGRU_APPLY(CGRU_DEFINE_VMAP_LEVEL, NAME##_base, , T, CGRU_UNPAREN V0)                          \
CGRU_API void NAME##_at(int isa, int n, const T *x, T *y) {                                    \
    switch (isa) {                                                                             \
    case 4: NAME##_v4(n, x, y); break;                                                         \
    case 3: NAME##_v3(n, x, y); break;                                                         \
    default: NAME##_base(n, x, y); break;                                                      \
    }                                                                                          \
}
#define CGRU_DECLARE_VMAP(NAME, T)                                                             \
CGRU_API void NAME##_at(int isa, int n, const T *x, T *y);
#define CGRU_DEFINE_VMAP_CALL(NAME, T)                                                         \
static inline void NAME(int n, const T *x, T *y) { NAME##_at(cgru_isa(), n, x, y); }
#define CGRU_UNPAREN(...) __VA_ARGS__
#define CGRU_APPLY(M, ...) M(__VA_ARGS__)

#ifdef CGRU_IMPL_VMAP
CGRU_DEFINE_VMAP(cgru_sigmoid_f32, float, (cgru_vf, 16, cgru_loadf, cgru_vsigmoidf),
                 (cgru_vf8, 8, cgru_loadf8, cgru_vsigmoidf8),
                 (cgru_vf4, 4, cgru_loadf4, cgru_vsigmoidf4))
CGRU_DEFINE_VMAP(cgru_tanh_f32, float, (cgru_vf, 16, cgru_loadf, cgru_vtanhf),
                 (cgru_vf8, 8, cgru_loadf8, cgru_vtanhf8), (cgru_vf4, 4, cgru_loadf4, cgru_vtanhf4))
CGRU_DEFINE_VMAP(cgru_sigmoid_f64, double, (cgru_vd, 8, cgru_loadd, cgru_vsigmoidd),
                 (cgru_vd4, 4, cgru_loadd4, cgru_vsigmoidd4),
                 (cgru_vd2, 2, cgru_loadd2, cgru_vsigmoidd2))
CGRU_DEFINE_VMAP(cgru_tanh_f64, double, (cgru_vd, 8, cgru_loadd, cgru_vtanhd),
                 (cgru_vd4, 4, cgru_loadd4, cgru_vtanhd4), (cgru_vd2, 2, cgru_loadd2, cgru_vtanhd2))
#else
CGRU_DECLARE_VMAP(cgru_sigmoid_f32, float)
CGRU_DECLARE_VMAP(cgru_tanh_f32, float)
CGRU_DECLARE_VMAP(cgru_sigmoid_f64, double)
CGRU_DECLARE_VMAP(cgru_tanh_f64, double)
#endif
CGRU_DEFINE_VMAP_CALL(cgru_sigmoid_f32, float)
CGRU_DEFINE_VMAP_CALL(cgru_tanh_f32, float)
CGRU_DEFINE_VMAP_CALL(cgru_sigmoid_f64, double)
CGRU_DEFINE_VMAP_CALL(cgru_tanh_f64, double)

#endif
