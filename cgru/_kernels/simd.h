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
 * Each hot function is compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2+FMA) and the
 * baseline.  The GEMM picks its version by an explicit switch on cgru_isa() (asked once,
 * at import; NAME_at takes the level, so that a test can force each one the machine runs);
 * the activations are target_clones, picked by the loader.
 */
#ifndef CGRU_SIMD_H
#define CGRU_SIMD_H

#include <stddef.h>
#include <string.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(CGRU_NO_CLONES)
#define CGRU_X86 1
#define CGRU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CGRU_X86 0
#define CGRU_CLONES
#endif
#define CGRU_INLINE static inline __attribute__((always_inline))
#define CGRU_UNROLL _Pragma("GCC unroll 16")   /* loops over registers: constant indices */

typedef float cgru_vf __attribute__((vector_size(64)));   /* 16 floats */
typedef double cgru_vd __attribute__((vector_size(64)));  /* 8 doubles */
typedef int32_t cgru_vi __attribute__((vector_size(64))); /* 16 int32 */
typedef int64_t cgru_vl __attribute__((vector_size(64))); /* 8 int64 */

#define CGRU_NR_F 32   /* packed panel width, float: two vectors */
#define CGRU_NR_D 16   /* packed panel width, double: two vectors */
#define CGRU_L2_ROWS_BYTES (192 << 10)   /* rows of A per block of a long product (see _body) */
#define CGRU_L2_B_BYTES (1 << 20)        /* ... when packed B is at most this large */

CGRU_INLINE cgru_vf cgru_loadf(const float *p) { cgru_vf v; memcpy(&v, p, sizeof v); return v; }
CGRU_INLINE cgru_vd cgru_loadd(const double *p) { cgru_vd v; memcpy(&v, p, sizeof v); return v; }

/* ---- packing ------------------------------------------------------------------------------
 * op(B) is [k, n]: B stored [k, n] (trans = 0) or [n, k] (trans = 1), row stride ldb.
 * Packed: panel p (columns p·NR … p·NR+NR−1) is k rows of NR values, zero beyond n.          */
static inline size_t cgru_packed_size(int n, int k, int nr) {
    return (size_t)((n + nr - 1) / nr) * (size_t)nr * (size_t)k;
}

#define CGRU_DEFINE_PACK(NAME, T, NR)                                                          \
static inline void NAME(int trans, int n, int k, const T *B, int ldb, T *Bp) {                 \
    int panels = (n + NR - 1) / NR;                                                            \
    for (int p = 0; p < panels; p++) {                                                         \
        T *dst = Bp + (size_t)p * NR * k;                                                      \
        int j0 = p * NR, w = n - j0 < NR ? n - j0 : NR;                                        \
        if (w < NR) memset(dst, 0, (size_t)NR * k * sizeof(T));                                \
        if (!trans) {         /* rows of op(B) are rows of B: copy w contiguous values */      \
            for (int kk = 0; kk < k; kk++)                                                     \
                memcpy(dst + (size_t)kk * NR, B + (size_t)kk * ldb + j0, (size_t)w * sizeof(T)); \
        } else {              /* column c of the panel is row j0 + c of B: gather the w rows,  \
                                 writing the panel in order (the w source lines stay in L1) */ \
            const T *src = B + (size_t)j0 * ldb;                                               \
            for (int kk = 0; kk < k; kk++)                                                     \
                for (int c = 0; c < w; c++) dst[(size_t)kk * NR + c] = src[(size_t)c * ldb + kk]; \
        }                                                                                      \
    }                                                                                          \
}
CGRU_DEFINE_PACK(cgru_pack_f32, float, CGRU_NR_F)
CGRU_DEFINE_PACK(cgru_pack_f64, double, CGRU_NR_D)

/* ---- micro-kernel: C[mr, nr] (+)= A[mr, k] · Bp[k, PW·NR] over PW adjacent panels ----------
 * 2·PW accumulator vectors per row; the k loop broadcasts A[r, kk] and multiply-adds. Every
 * C element is acc += a·b over kk in increasing order in every instantiation, so the bits do
 * not depend on mr, PW or which rows share a call.                                            */
#define CGRU_DEFINE_MICRO(NAME, T, VT, NR, LOAD)                                               \
CGRU_INLINE void NAME(const int ta, const int mr, const int pw, int ncols, int k, const T *A,  \
                      int lda, const T *Bp, int beta1, T *C, int ldc) {                        \
    enum { V = NR / 2 };                                                                       \
    VT acc[8][4];                                                                              \
    size_t ps = (size_t)NR * k;                                                                \
    CGRU_UNROLL for (int r = 0; r < mr; r++)                                                   \
        CGRU_UNROLL for (int q = 0; q < 2 * pw; q++) acc[r][q] = (VT){0};                      \
    for (int kk = 0; kk < k; kk++) {                                                           \
        VT b[4];                                                                               \
        CGRU_UNROLL for (int q = 0; q < 2 * pw; q++)                                           \
            b[q] = LOAD(Bp + (q / 2) * ps + (size_t)kk * NR + (q % 2) * V);                    \
        CGRU_UNROLL for (int r = 0; r < mr; r++) {                                             \
            T a = ta ? A[(size_t)kk * lda + r] : A[(size_t)r * lda + kk];                      \
            CGRU_UNROLL for (int q = 0; q < 2 * pw; q++) acc[r][q] += a * b[q];                \
        }                                                                                      \
    }                                                                                          \
    /* whole vectors (C + sum, when beta1, is the same add as element by element), with every \
     * index a constant once unrolled, so that the sums stay in registers                  */  \
    if (ncols >= pw * NR) {                                                                    \
        CGRU_UNROLL for (int r = 0; r < mr; r++)                                               \
            CGRU_UNROLL for (int q = 0; q < 2 * pw; q++) {                                     \
                T *c = C + (size_t)r * ldc + (q / 2) * NR + (q % 2) * V;                       \
                VT v = acc[r][q];                                                              \
                if (beta1) v += LOAD(c);                                                       \
                memcpy(c, &v, sizeof(VT));                                                     \
            }                                                                                  \
        return;                                                                                \
    }                                                                                          \
    /* the last panel's columns: through memory */                                             \
    T part[8][4][V];                                                                           \
    CGRU_UNROLL for (int r = 0; r < mr; r++)                                                   \
        CGRU_UNROLL for (int q = 0; q < 2 * pw; q++) memcpy(part[r][q], &acc[r][q], sizeof(VT)); \
    for (int r = 0; r < mr; r++) {                                                             \
        T *c = C + (size_t)r * ldc;                                                            \
        for (int q = 0; q < 2 * pw; q++) {                                                     \
            int j0 = (q / 2) * NR + (q % 2) * V;                                               \
            int w = ncols - j0 < V ? ncols - j0 : V;                                           \
            for (int j = 0; j < w; j++)                                                        \
                c[j0 + j] = beta1 ? c[j0 + j] + part[r][q][j] : part[r][q][j];                 \
        }                                                                                      \
    }                                                                                          \
}
CGRU_DEFINE_MICRO(cgru_micro_f32, float, cgru_vf, CGRU_NR_F, cgru_loadf)
CGRU_DEFINE_MICRO(cgru_micro_f64, double, cgru_vd, CGRU_NR_D, cgru_loadd)

/* ---- C[m, n] = A[m, k] · op(B) (+ C when beta1), op(B) packed in Bp ------------------------
 * Column panel outermost, so one panel (k·NR values) stays in L1 while every row block of A
 * passes over it; B is streamed once per call. Rows go MR at a time (MR accumulator rows of
 * two vectors each: 8 on AVX-512's 32 registers, 3 on AVX2's 16, 2 otherwise); fewer than
 * four rows take two panels at once, so that enough independent sums hide the FMA latency,
 * and so do 6 rows at a time on AVX-512 when rows are short (A read half as often). */
#define CGRU_DEFINE_GEMM(NAME, MICRO, T, NR)                                                   \
CGRU_INLINE void NAME##_block(const int MR, const int TA, int m, int n, int k, const T *A, int lda, \
                              const T *Bp, int beta1, T *C, int ldc) {                         \
    int panels = (n + NR - 1) / NR, p = 0;                                                     \
    if (m < 4) {                                                                               \
        for (; p + 2 <= panels; p += 2) {                                                      \
            const T *bp = Bp + (size_t)p * NR * k;                                             \
            int ncols = n - p * NR;                                                            \
            if (m == 3) MICRO(TA, 3, 2, ncols, k, A, lda, bp, beta1, C + (size_t)p * NR, ldc); \
            else if (m == 2) MICRO(TA, 2, 2, ncols, k, A, lda, bp, beta1, C + (size_t)p * NR, ldc); \
            else if (m == 1) MICRO(TA, 1, 2, ncols, k, A, lda, bp, beta1, C + (size_t)p * NR, ldc); \
        }                                                                                      \
    } else if (MR == 8 && (size_t)k * sizeof(T) < 1024) {                                      \
        /* short rows on AVX-512: two panels at a time, 6 rows (24 sums), so that each row of  \
         * A is read half as often                                                         */  \
        for (; p + 2 <= panels; p += 2) {                                                      \
            const T *bp = Bp + (size_t)p * NR * k;                                             \
            int ncols = n - p * NR, i = 0;                                                     \
            T *cp = C + (size_t)p * NR;                                                        \
            for (; i + 6 <= m; i += 6)                                                         \
                MICRO(TA, 6, 2, ncols, k, A + (TA ? (size_t)i : (size_t)i * lda), lda, bp, beta1, cp + (size_t)i * ldc, ldc); \
            const T *a = A + (TA ? (size_t)i : (size_t)i * lda);                               \
            T *c = cp + (size_t)i * ldc;                                                       \
            switch (m - i) {                                                                   \
            case 5: MICRO(TA, 5, 2, ncols, k, a, lda, bp, beta1, c, ldc); break;               \
            case 4: MICRO(TA, 4, 2, ncols, k, a, lda, bp, beta1, c, ldc); break;               \
            case 3: MICRO(TA, 3, 2, ncols, k, a, lda, bp, beta1, c, ldc); break;               \
            case 2: MICRO(TA, 2, 2, ncols, k, a, lda, bp, beta1, c, ldc); break;               \
            case 1: MICRO(TA, 1, 2, ncols, k, a, lda, bp, beta1, c, ldc); break;               \
            default: break;                                                                    \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    for (; p < panels; p++) {                                                                  \
        const T *bp = Bp + (size_t)p * NR * k;                                                 \
        int ncols = n - p * NR < NR ? n - p * NR : NR;                                         \
        T *cp = C + (size_t)p * NR;                                                            \
        int i = 0;                                                                             \
        for (; i + MR <= m; i += MR)                                                           \
            MICRO(TA, MR, 1, ncols, k, A + (TA ? (size_t)i : (size_t)i * lda), lda, bp, beta1, cp + (size_t)i * ldc, ldc); \
        const T *a = A + (TA ? (size_t)i : (size_t)i * lda);                                   \
        T *c = cp + (size_t)i * ldc;                                                           \
        /* m − i < MR: the cases MR cannot reach are not compiled (MR is a constant)     */  \
        switch (m - i) {                                                                       \
        case 7: if (7 < MR) MICRO(TA, 7, 1, ncols, k, a, lda, bp, beta1, c, ldc); break;       \
        case 6: if (6 < MR) MICRO(TA, 6, 1, ncols, k, a, lda, bp, beta1, c, ldc); break;       \
        case 5: if (5 < MR) MICRO(TA, 5, 1, ncols, k, a, lda, bp, beta1, c, ldc); break;       \
        case 4: if (4 < MR) MICRO(TA, 4, 1, ncols, k, a, lda, bp, beta1, c, ldc); break;       \
        case 3: if (3 < MR) MICRO(TA, 3, 1, ncols, k, a, lda, bp, beta1, c, ldc); break;       \
        case 2: if (2 < MR) MICRO(TA, 2, 1, ncols, k, a, lda, bp, beta1, c, ldc); break;       \
        case 1: if (1 < MR) MICRO(TA, 1, 1, ncols, k, a, lda, bp, beta1, c, ldc); break;       \
        default: break;                                                                        \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
/* A long A (a whole sequence's rows) against a B that fits in L2 goes in row blocks of about  \
 * CGRU_L2_ROWS_BYTES, each passing over every panel of B, so that A is read from L2 rather    \
 * than from memory once per panel (rows under 1 KiB stream well enough, measured). A larger   \
 * B goes in column blocks of at most CGRU_L2_B_BYTES, each such a product of its own, so that \
 * A is read once per column block rather than once per panel. A row's bits do not depend on   \
 * its block: every element is one micro-kernel's sum over all of k.                       */  \
CGRU_INLINE void NAME##_rows(const int MR, const int TA, int m, int n, int k, const T *A,      \
                             int lda, const T *Bp, int beta1, T *C, int ldc) {                 \
    size_t row_bytes = (size_t)(k > 0 ? k : 1) * sizeof(T);                                    \
    int mc = (int)(CGRU_L2_ROWS_BYTES / row_bytes) / MR * MR;                                  \
    if (mc < 4 * MR) mc = 4 * MR;                                                              \
    if (m < 2 * mc || row_bytes < 1024) {                                                      \
        NAME##_block(MR, TA, m, n, k, A, lda, Bp, beta1, C, ldc);                              \
        return;                                                                                \
    }                                                                                          \
    for (int i = 0; i < m; i += mc)                                                            \
        NAME##_block(MR, TA, m - i < mc ? m - i : mc, n, k,                                    \
                     A + (TA ? (size_t)i : (size_t)i * lda), lda, Bp, beta1,                   \
                     C + (size_t)i * ldc, ldc);                                                \
}                                                                                              \
CGRU_INLINE void NAME##_body(const int MR, const int TA, int m, int n, int k, const T *A,      \
                             int lda, const T *Bp, int beta1, T *C, int ldc) {                 \
    size_t panel_bytes = (size_t)NR * (size_t)(k > 0 ? k : 1) * sizeof(T);                     \
    int panels = (n + NR - 1) / NR;                                                            \
    int per = (int)(CGRU_L2_B_BYTES / panel_bytes);                                            \
    if (per < 1) per = 1;                                                                      \
    for (int p0 = 0; p0 < panels; p0 += per) {                                                 \
        int cols = n - p0 * NR < per * NR ? n - p0 * NR : per * NR;                            \
        NAME##_rows(MR, TA, m, cols, k, A, lda, Bp + (size_t)p0 * NR * (size_t)k, beta1,       \
                    C + (size_t)p0 * NR, ldc);                                                 \
    }                                                                                          \
}                                                                                              \
/* ta = 1: A is given transposed, A[kk, r] at A[kk·lda + r] (k rows of m): C = Aᵀ·op(B),       \
 * the weight gradients' dgᵀ·X; the same sums in the same order as for ta = 0.             */  \
CGRU_TARGET_V4 static void NAME##_v4(int ta, int m, int n, int k, const T *A, int lda,         \
                                     const T *Bp, int beta1, T *C, int ldc) {                  \
    if (ta) NAME##_body(8, 1, m, n, k, A, lda, Bp, beta1, C, ldc);                             \
    else NAME##_body(8, 0, m, n, k, A, lda, Bp, beta1, C, ldc);                                \
}                                                                                              \
CGRU_TARGET_V3 static void NAME##_v3(int ta, int m, int n, int k, const T *A, int lda,         \
                                     const T *Bp, int beta1, T *C, int ldc) {                  \
    if (ta) NAME##_body(3, 1, m, n, k, A, lda, Bp, beta1, C, ldc);                             \
    else NAME##_body(3, 0, m, n, k, A, lda, Bp, beta1, C, ldc);                                \
}                                                                                              \
static void NAME##_base(int ta, int m, int n, int k, const T *A, int lda, const T *Bp,         \
                        int beta1, T *C, int ldc) {                                            \
    if (ta) NAME##_body(2, 1, m, n, k, A, lda, Bp, beta1, C, ldc);                             \
    else NAME##_body(2, 0, m, n, k, A, lda, Bp, beta1, C, ldc);                                \
}                                                                                              \
static void NAME##_t_at(int isa, int ta, int m, int n, int k, const T *A, int lda,             \
                        const T *Bp, int beta1, T *C, int ldc) {                               \
    switch (isa) {                                                                             \
    case 4: NAME##_v4(ta, m, n, k, A, lda, Bp, beta1, C, ldc); break;                          \
    case 3: NAME##_v3(ta, m, n, k, A, lda, Bp, beta1, C, ldc); break;                          \
    default: NAME##_base(ta, m, n, k, A, lda, Bp, beta1, C, ldc); break;                       \
    }                                                                                          \
}                                                                                              \
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
static int cgru_isa(void) {
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
#else
#define CGRU_TARGET_V4
#define CGRU_TARGET_V3
static int cgru_isa(void) { return 0; }
#endif

CGRU_DEFINE_GEMM(cgru_gemm_packed_f32, cgru_micro_f32, float, CGRU_NR_F)
CGRU_DEFINE_GEMM(cgru_gemm_packed_f64, cgru_micro_f64, double, CGRU_NR_D)

/* ---- float32 exp, sigmoid, tanh on 16 lanes ------------------------------------------------
 * exp: x clamped to [−104, 89] (beyond, the float result is 0 or inf anyway); x = n·ln2 + r
 * with |r| ≤ ln2/2 (ln2 split in two so n·ln2_hi is exact); e^r by its Taylor series to r⁷
 * (truncation < 6e-9 relative); 2ⁿ applied as 2^⌊n/2⌋·2^(n−⌊n/2⌋) so that results down to
 * the subnormals and up to inf come out right. About 2 ulp. NaN stays NaN.                     */
CGRU_INLINE cgru_vf cgru_vexpf(cgru_vf x) {
    const cgru_vf hi = (cgru_vf){0} + 89.0f, lo = (cgru_vf){0} + -104.0f;
    cgru_vi too_big = x > hi, too_small = x < lo;
    x = (cgru_vf)(((cgru_vi)x & ~too_big) | ((cgru_vi)hi & too_big));
    x = (cgru_vf)(((cgru_vi)x & ~too_small) | ((cgru_vi)lo & too_small));
    cgru_vf t = x * 1.44269504088896341f + 0.5f;
    cgru_vi n = __builtin_convertvector(t, cgru_vi);
    n -= (cgru_vi)(__builtin_convertvector(n, cgru_vf) > t) & 1;  /* floor */
    cgru_vf nf = __builtin_convertvector(n, cgru_vf);
    cgru_vf r = x - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    cgru_vf p = (cgru_vf){0} + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    cgru_vi n1 = n >> 1, n2 = n - n1;
    return p * (cgru_vf)((n1 + 127) << 23) * (cgru_vf)((n2 + 127) << 23);
}

/* sigmoid(x) = 1/(1 + e^−|x|) for x ≥ 0 and e^−|x|/(1 + e^−|x|) for x < 0: no overflow, and
 * accurate down to the subnormals.                                                              */
CGRU_INLINE cgru_vf cgru_vsigmoidf(cgru_vf x) {
    cgru_vi neg = x < 0.0f;
    cgru_vf a = (cgru_vf)((cgru_vi)x & 0x7fffffff);
    cgru_vf e = cgru_vexpf(-a);
    cgru_vf num = (cgru_vf)(((cgru_vi)e & neg) | ((cgru_vi)((cgru_vf){0} + 1.0f) & ~neg));
    return num / (1.0f + e);
}

/* tanh: |x| < 0.4 by its Taylor series to x¹³ (truncation < 5e-9 relative); above,
 * sign(x)·(1 − 2/(e^{2|x|} + 1)).                                                               */
CGRU_INLINE cgru_vf cgru_vtanhf(cgru_vf x) {
    cgru_vi sign = (cgru_vi)x & (int32_t)0x80000000;
    cgru_vf a = (cgru_vf)((cgru_vi)x & 0x7fffffff);
    cgru_vf big = 1.0f - 2.0f / (cgru_vexpf(2.0f * a) + 1.0f);
    cgru_vf z = x * x;
    /* Taylor: tanh x = x − x³/3 + 2x⁵/15 − 17x⁷/315 + 62x⁹/2835 − 1382x¹¹/155925
     *                  + 21844x¹³/6081075                                                      */
    cgru_vf q = (cgru_vf){0} + 21844.0f / 6081075.0f;
    q = q * z - 1382.0f / 155925.0f;
    q = q * z + 62.0f / 2835.0f;
    q = q * z - 17.0f / 315.0f;
    q = q * z + 2.0f / 15.0f;
    q = q * z - 1.0f / 3.0f;
    cgru_vf small = x + x * z * q;
    cgru_vi use_small = a < 0.4f;
    cgru_vf big_signed = (cgru_vf)((cgru_vi)big | sign);
    return (cgru_vf)(((cgru_vi)small & use_small) | ((cgru_vi)big_signed & ~use_small));
}

/* y[i] = sigmoid(x[i]) / tanh(x[i]) for i < n (x and y may be the same array). */
CGRU_CLONES static void cgru_sigmoid_f32(int n, const float *x, float *y) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        cgru_vf v = cgru_vsigmoidf(cgru_loadf(x + i));
        memcpy(y + i, &v, sizeof v);
    }
    if (i < n) {
        float buf[16] = {0};
        memcpy(buf, x + i, (size_t)(n - i) * sizeof(float));
        cgru_vf v = cgru_vsigmoidf(cgru_loadf(buf));
        memcpy(y + i, &v, (size_t)(n - i) * sizeof(float));
    }
}

CGRU_CLONES static void cgru_tanh_f32(int n, const float *x, float *y) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        cgru_vf v = cgru_vtanhf(cgru_loadf(x + i));
        memcpy(y + i, &v, sizeof v);
    }
    if (i < n) {
        float buf[16] = {0};
        memcpy(buf, x + i, (size_t)(n - i) * sizeof(float));
        cgru_vf v = cgru_vtanhf(cgru_loadf(buf));
        memcpy(y + i, &v, (size_t)(n - i) * sizeof(float));
    }
}

/* ---- float64 exp, sigmoid, tanh on 8 lanes ------------------------------------------------
 * As for float32: x clamped to [−746, 710]; x = n·ln2 + r, |r| ≤ ln2/2, ln2 split in two so
 * n·ln2_hi is exact; e^r by its Taylor series to r¹³ (truncation < 5e-18 relative); 2ⁿ as
 * 2^⌊n/2⌋·2^(n−⌊n/2⌋), right down to the subnormals and up to inf.  About 2 ulp.              */
CGRU_INLINE cgru_vd cgru_vexpd(cgru_vd x) {
    const cgru_vd hi = (cgru_vd){0} + 710.0, lo = (cgru_vd){0} + -746.0;
    cgru_vl too_big = x > hi, too_small = x < lo;
    x = (cgru_vd)(((cgru_vl)x & ~too_big) | ((cgru_vl)hi & too_big));
    x = (cgru_vd)(((cgru_vl)x & ~too_small) | ((cgru_vl)lo & too_small));
    cgru_vd t = x * 1.4426950408889634074 + 0.5;
    cgru_vl n = __builtin_convertvector(t, cgru_vl);
    n -= (cgru_vl)(__builtin_convertvector(n, cgru_vd) > t) & 1;  /* floor */
    cgru_vd nf = __builtin_convertvector(n, cgru_vd);
    cgru_vd r = x - nf * 0.693147180369123816490;
    r = r - nf * 1.90821492927058770002e-10;
    cgru_vd p = (cgru_vd){0} + 1.0 / 6227020800.0;               /* 1/13! */
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    cgru_vl n1 = n >> 1, n2 = n - n1;
    return p * (cgru_vd)((n1 + 1023) << 52) * (cgru_vd)((n2 + 1023) << 52);
}

CGRU_INLINE cgru_vd cgru_vsigmoidd(cgru_vd x) {
    cgru_vl neg = x < 0.0;
    cgru_vd a = (cgru_vd)((cgru_vl)x & 0x7fffffffffffffffLL);
    cgru_vd e = cgru_vexpd(-a);
    cgru_vd num = (cgru_vd)(((cgru_vl)e & neg) | ((cgru_vl)((cgru_vd){0} + 1.0) & ~neg));
    return num / (1.0 + e);
}

/* tanh: |x| < 0.3 by its Taylor series to x²⁵ (truncation < 1e-17 relative); above,
 * sign(x)·(1 − 2/(e^{2|x|} + 1)) (under 2 bits of cancellation near 0.3: a few ulp).        */
CGRU_INLINE cgru_vd cgru_vtanhd(cgru_vd x) {
    cgru_vl sign = (cgru_vl)x & (int64_t)0x8000000000000000ULL;
    cgru_vd a = (cgru_vd)((cgru_vl)x & 0x7fffffffffffffffLL);
    cgru_vd big = 1.0 - 2.0 / (cgru_vexpd(2.0 * a) + 1.0);
    cgru_vd z = x * x;
    /* tanh x = Σ 2^{2n}(2^{2n}−1)·B_{2n}·x^{2n−1}/(2n)!  (B: Bernoulli numbers) */
    cgru_vd q = (cgru_vd){0} + 1.5918905069328964e-05;
    q = q * z - 3.927832388331683e-05;
    q = q * z + 9.691537956929451e-05;
    q = q * z - 0.00023912911424355248;
    q = q * z + 0.000590027440945586;
    q = q * z - 0.0014558343870513183;
    q = q * z + 0.003592128036572481;
    q = q * z - 0.008863235529902197;
    q = q * z + 0.021869488536155203;
    q = q * z - 0.05396825396825397;
    q = q * z + 2.0 / 15.0;
    q = q * z - 1.0 / 3.0;
    cgru_vd small = x + x * z * q;
    cgru_vl use_small = a < 0.3;
    cgru_vd big_signed = (cgru_vd)((cgru_vl)big | sign);
    return (cgru_vd)(((cgru_vl)small & use_small) | ((cgru_vl)big_signed & ~use_small));
}

CGRU_CLONES static void cgru_sigmoid_f64(int n, const double *x, double *y) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        cgru_vd v = cgru_vsigmoidd(cgru_loadd(x + i));
        memcpy(y + i, &v, sizeof v);
    }
    if (i < n) {
        double buf[8] = {0};
        memcpy(buf, x + i, (size_t)(n - i) * sizeof(double));
        cgru_vd v = cgru_vsigmoidd(cgru_loadd(buf));
        memcpy(y + i, &v, (size_t)(n - i) * sizeof(double));
    }
}

CGRU_CLONES static void cgru_tanh_f64(int n, const double *x, double *y) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        cgru_vd v = cgru_vtanhd(cgru_loadd(x + i));
        memcpy(y + i, &v, sizeof v);
    }
    if (i < n) {
        double buf[8] = {0};
        memcpy(buf, x + i, (size_t)(n - i) * sizeof(double));
        cgru_vd v = cgru_vtanhd(cgru_loadd(buf));
        memcpy(y + i, &v, (size_t)(n - i) * sizeof(double));
    }
}

#endif
