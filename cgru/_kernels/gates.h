/* The fused gate math of one row of one step, for the cells whose activations are the
 * defaults (sigmoid gates, tanh candidate; an RNN's tanh or relu): the elementwise part of
 * each kind's step, between the per-step GEMMs (gru.pyx, lstm.pyx, rnn.pyx hold the
 * equations; the other cells' rows stay in Cython, one scalar at a time).
 *
 * Written once on a vector type and its lane count, a row in chunks of one vector;
 * a short last chunk is loaded into a zeroed vector and stored back in part, so that every
 * element of a row goes through the same instructions wherever it sits. Each kernel is
 * compiled for x86-64-v4 (AVX-512, 64-byte vectors), x86-64-v3 (AVX2+FMA, 32-byte) and the
 * baseline (SSE2, 16-byte), picked like the GEMM (NAME_at takes the level; NAME asks
 * cgru_isa()). float32 rows are computed in float32 throughout.
 *
 * Pointers may alias only where a kernel's comment says so; each chunk is read before it is
 * written. A kernel in two passes writes its first pass's outputs for the whole row before the
 * second pass reads them back.
 */
#ifndef CGRU_GATES_H
#define CGRU_GATES_H

#include "simd.h"

/* ---- partial vector load/store: w ≤ lanes elements at p ---------------------------------- */
#define CGRU_DEFINE_PARTIAL(SUF, T, VT, V)                                                     \
CGRU_INLINE VT cgru_ld_##SUF(const T *p, int w) {                                              \
    VT v = (VT){0};                                                                            \
    if (__builtin_expect(w >= V, 1)) memcpy(&v, p, sizeof v);     /* one vector load */        \
    else memcpy(&v, p, (size_t)w * sizeof(T));                                                 \
    return v;                                                                                  \
}                                                                                              \
CGRU_INLINE void cgru_st_##SUF(T *p, VT v, int w) {                                            \
    if (__builtin_expect(w >= V, 1)) memcpy(p, &v, sizeof v);                                  \
    else memcpy(p, &v, (size_t)w * sizeof(T));                                                 \
}
CGRU_DEFINE_PARTIAL(f32, float, cgru_vf, 16)
CGRU_DEFINE_PARTIAL(f64, double, cgru_vd, 8)
CGRU_DEFINE_PARTIAL(f32x8, float, cgru_vf8, 8)
CGRU_DEFINE_PARTIAL(f64x4, double, cgru_vd4, 4)
CGRU_DEFINE_PARTIAL(f32x4, float, cgru_vf4, 4)
CGRU_DEFINE_PARTIAL(f64x2, double, cgru_vd2, 2)

/* ---- lanes where x > 0: v there, else 0 (a NaN x gives 0) ---------------------------------- */
#define CGRU_DEFINE_WHERE_POS(SUF, VT, VI)                                                     \
CGRU_INLINE VT cgru_where_pos_##SUF(VT x, VT v) { return (VT)((VI)v & (x > 0)); }
CGRU_DEFINE_WHERE_POS(f32, cgru_vf, cgru_vi)
CGRU_DEFINE_WHERE_POS(f64, cgru_vd, cgru_vl)
CGRU_DEFINE_WHERE_POS(f32x8, cgru_vf8, cgru_vi8)
CGRU_DEFINE_WHERE_POS(f64x4, cgru_vd4, cgru_vl4)
CGRU_DEFINE_WHERE_POS(f32x4, cgru_vf4, cgru_vi4)
CGRU_DEFINE_WHERE_POS(f64x2, cgru_vd2, cgru_vl2)

/* ---- the kernels' bodies, one row; V lanes, LD/ST partial, SIG/TANH the vector activations */

/* GRU, reset-after, one row of steps 3-5:
 *   r = σ(gx_r + gh_r + b_r), z = σ(gx_z + gh_z + b_z), hn = gh_n + b_Rn,
 *   n = tanh(gx_n + b_Wn + r ⊙ hn), h' = n + z ⊙ (h − n)  (flip: h' = h + z ⊙ (n − h)).
 * In: gx [3H], gh [3H], b [3H] (b_r, b_z, b_Wn), bhn [H], hp [H]. Out: g3 [3H] = r, z, n;
 * hn [H] (may be gh + 2H); hnew [H].
 * In two passes over the row (see CGRU_LSTM_FWD_BODY): r, z and hn, then n and h'.           */
#define CGRU_GRU_FWD_RA_BODY(T, VT, V, LD, ST, SIG, TANH, POS)                                 \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        VT r = SIG(LD(gx + j, w) + LD(gh + j, w) + LD(b + j, w));                              \
        VT z = SIG(LD(gx + H + j, w) + LD(gh + H + j, w) + LD(b + H + j, w));                  \
        VT hnv = LD(gh + 2 * H + j, w) + LD(bhn + j, w);                                       \
        ST(g3 + j, r, w); ST(g3 + H + j, z, w); ST(hn + j, hnv, w);                            \
    }                                                                                          \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        VT r = LD(g3 + j, w), z = LD(g3 + H + j, w), hnv = LD(hn + j, w);                      \
        VT n = TANH(LD(gx + 2 * H + j, w) + LD(b + 2 * H + j, w) + r * hnv);                   \
        VT h = LD(hp + j, w);                                                                  \
        VT hv = flip ? h + z * (n - h) : n + z * (h - n);                                      \
        ST(g3 + 2 * H + j, n, w); ST(hnew + j, hv, w);                                         \
    }

/* The start of a GRU backward row's chunk (both forms): loads r, z, n (g3), h (hp) and d = dh,
 * then bwd of 5 — dn and dz, and dh_prev's share through z stored over dh.                 */
#define CGRU_GRU_BWD5(VT, LD, ST)                                                              \
    VT r = LD(g3 + j, w), z = LD(g3 + H + j, w), n = LD(g3 + 2 * H + j, w);                    \
    VT h = LD(hp + j, w), d = LD(dh + j, w), one = (VT){0} + 1;                                \
    VT dn, dz;                                                                                 \
    if (flip) { dn = d * z; dz = d * (n - h); ST(dh + j, d * (one - z), w); }                  \
    else      { dn = d * (one - z); dz = d * (h - n); ST(dh + j, d * z, w); }

/* GRU, reset-after, one row of bwd of 5, 4, 3: reads g3 = r, z, n, hp [H], hn [H]; turns dh
 * [H] into dh_prev before the recurrent product; writes dgx [3H] and dgh_n [H]:
 *   dn = dh ⊙ (1 − z), dz = dh ⊙ (h − n), dh_prev = dh ⊙ z   (flip: dn = dh ⊙ z,
 *   dz = dh ⊙ (n − h), dh_prev = dh ⊙ (1 − z));  dpn = dn ⊙ (1 − n²), dpz = dz ⊙ z(1 − z),
 *   dpr = dpn ⊙ hn ⊙ r(1 − r);  dgx = dpr, dpz, dpn;  dgh_n = dpn ⊙ r (the recurrent side's
 *   r and z columns are dgx's own).                                                          */
#define CGRU_GRU_BWD_RA_BODY(T, VT, V, LD, ST, SIG, TANH, POS)                                 \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        CGRU_GRU_BWD5(VT, LD, ST);                                                             \
        VT dpn = dn * (one - n * n);                                                           \
        VT dpz = dz * z * (one - z);                                                           \
        VT dpr = dpn * LD(hn + j, w) * r * (one - r);                                          \
        ST(dgx + j, dpr, w); ST(dgx + H + j, dpz, w); ST(dgx + 2 * H + j, dpn, w);             \
        ST(dgh + j, dpn * r, w);                                                               \
    }

/* GRU, reset-before, one row of step 3 and the candidate product's operand:
 *   r = σ(gx_r + gh_r + b_r), z = σ(gx_z + gh_z + b_z), rh = r ⊙ h ⊙ m  (m NULL: no mask).
 * In: gx, gh, b [2H] (r, z), hp [H], m [H] or NULL. Out: g3 [2H] = r, z; rh [H].            */
#define CGRU_GRU_FWD_RB_RZ_BODY(T, VT, V, LD, ST, SIG, TANH, POS)                              \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        VT r = SIG(LD(gx + j, w) + LD(gh + j, w) + LD(b + j, w));                              \
        VT z = SIG(LD(gx + H + j, w) + LD(gh + H + j, w) + LD(b + H + j, w));                  \
        VT rhv = r * LD(hp + j, w);                                                            \
        if (m) rhv = rhv * LD(m + j, w);                                                       \
        ST(g3 + j, r, w); ST(g3 + H + j, z, w); ST(rh + j, rhv, w);                            \
    }

/* GRU, reset-before, one row of steps 4-5 (after gh_n = rh·R_nᵀ):
 *   n = tanh(gx_n + gh_n + b_n), h' = n + z ⊙ (h − n)  (flip: h' = h + z ⊙ (n − h)).
 * In: gx_n, gh_n, b_n [H] (the n blocks), z [H], hp [H]. Out: n [H], hnew [H].              */
#define CGRU_GRU_FWD_RB_N_BODY(T, VT, V, LD, ST, SIG, TANH, POS)                               \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        VT nv = TANH(LD(gxn + j, w) + LD(ghn + j, w) + LD(bn + j, w));                         \
        VT zv = LD(z + j, w), h = LD(hp + j, w);                                               \
        ST(n + j, nv, w);                                                                      \
        ST(hnew + j, flip ? h + zv * (nv - h) : nv + zv * (h - nv), w);                        \
    }

/* GRU, reset-before, one row of bwd of 5 and 4 before the candidate's product: reads g3 =
 * r, z, n, hp, m (or NULL); turns dh into its part of dh_prev; writes dgx's z and n columns
 * (dpz, dpn: the candidate product's operand) and rhm = r ⊙ h ⊙ m (dR_n's operand).          */
#define CGRU_GRU_BWD_RB_BODY(T, VT, V, LD, ST, SIG, TANH, POS)                                 \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        CGRU_GRU_BWD5(VT, LD, ST);                                                             \
        ST(dgx + H + j, dz * z * (one - z), w);                                                \
        ST(dgx + 2 * H + j, dn * (one - n * n), w);                                            \
        VT rhv = r * h;                                                                        \
        if (m) rhv = rhv * LD(m + j, w);                                                       \
        ST(rhm + j, rhv, w);                                                                   \
    }

/* GRU, reset-before, one row of bwd of 4 after drh = dgx_n·R_n: reads r (g3), hp, m (or
 * NULL), drh; dh_prev += drh ⊙ r ⊙ m; dgx_r = (drh ⊙ h ⊙ m) ⊙ r(1 − r).                    */
#define CGRU_GRU_BWD_RB_R_BODY(T, VT, V, LD, ST, SIG, TANH, POS)                               \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        VT r = LD(g3 + j, w), h = LD(hp + j, w), d = LD(drh + j, w), one = (VT){0} + 1;        \
        VT dr = d * h, dhv = d * r;                                                            \
        if (m) { VT mv = LD(m + j, w); dr = dr * mv; dhv = dhv * mv; }                         \
        ST(dh + j, LD(dh + j, w) + dhv, w);                                                    \
        ST(dgx + j, dr * r * (one - r), w);                                                    \
    }

/* LSTM (no peepholes, no projection's part here), one row of steps 3-5:
 *   i, f, o = σ(gx + gh + b), g = tanh(gx_g + gh_g + b_g), c' = f ⊙ c + i ⊙ g,
 *   hf = o ⊙ tanh(c').  In: gx, gh, b [4H] (i, f, g, o), cp [H]. Out: g4 [4H], cn [H], hf [H].
 * In two passes over the row: the gates and c', then hf. Each activation is a chain of about
 * 80 cycles of latency; in one pass tanh(c') waited on the gates' chains in every chunk, and
 * the next chunk's were too far ahead for the core to start them. Split, each pass's chunks
 * are independent and short enough to overlap: 15 % faster on a Zen 2 core (the GRU's 13 %).
 * Every element goes through the same operations as in one pass (c' and o are stored and
 * read back exactly), so the bits are the same.                                            */
#define CGRU_LSTM_FWD_BODY(T, VT, V, LD, ST, SIG, TANH, POS)                                   \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        VT i = SIG(LD(gx + j, w) + LD(gh + j, w) + LD(b + j, w));                              \
        VT f = SIG(LD(gx + H + j, w) + LD(gh + H + j, w) + LD(b + H + j, w));                  \
        VT g = TANH(LD(gx + 2 * H + j, w) + LD(gh + 2 * H + j, w) + LD(b + 2 * H + j, w));     \
        VT o = SIG(LD(gx + 3 * H + j, w) + LD(gh + 3 * H + j, w) + LD(b + 3 * H + j, w));      \
        VT c = f * LD(cp + j, w) + i * g;                                                      \
        ST(g4 + j, i, w); ST(g4 + H + j, f, w); ST(g4 + 2 * H + j, g, w);                      \
        ST(g4 + 3 * H + j, o, w); ST(cn + j, c, w);                                            \
    }                                                                                          \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        ST(hf + j, LD(g4 + 3 * H + j, w) * TANH(LD(cn + j, w)), w);                            \
    }

/* LSTM, one row of bwd of 5, 4, 3: reads g4 = i, f, g, o, cp, cn, dhf [H]; turns the carry dc
 * [H] into dc_prev; writes da [4H] (no other operand's memory):
 *   hc = tanh(c'), dc += dhf ⊙ o ⊙ (1 − hc²);  da_i = dc ⊙ g ⊙ i(1 − i),
 *   da_f = dc ⊙ c ⊙ f(1 − f), da_g = dc ⊙ i ⊙ (1 − g²), da_o = dhf ⊙ hc ⊙ o(1 − o);
 *   dc_prev = dc ⊙ f.
 * In two passes (see CGRU_LSTM_FWD_BODY): tanh(c') first, kept in da_o's place, then the rest
 * (22 % faster on a Zen 2 core).                                                            */
#define CGRU_LSTM_BWD_BODY(T, VT, V, LD, ST, SIG, TANH, POS)                                   \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        ST(da + 3 * H + j, TANH(LD(cn + j, w)), w);                                            \
    }                                                                                          \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        VT i = LD(g4 + j, w), f = LD(g4 + H + j, w), g = LD(g4 + 2 * H + j, w);                \
        VT o = LD(g4 + 3 * H + j, w), dhv = LD(dhf + j, w), one = (VT){0} + 1;                 \
        VT hc = LD(da + 3 * H + j, w);                                                         \
        VT dcj = LD(dc + j, w) + dhv * o * (one - hc * hc);                                    \
        ST(da + j, dcj * g * i * (one - i), w);                                                \
        ST(da + H + j, dcj * LD(cp + j, w) * f * (one - f), w);                                \
        ST(da + 2 * H + j, dcj * i * (one - g * g), w);                                        \
        ST(da + 3 * H + j, dhv * hc * o * (one - o), w);                                       \
        ST(dc + j, dcj * f, w);                                                                \
    }

/* RNN, one row of step 3: h' = act(gx + gh + b), act = tanh (relu = 0) or relu (1: x > 0 ? x
 * : 0, so NaN gives 0). In: gx, gh, b [H]. Out: hn [H].                                       */
#define CGRU_RNN_FWD_BODY(T, VT, V, LD, ST, SIG, TANH, POS)                                    \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        VT a = LD(gx + j, w) + LD(gh + j, w) + LD(b + j, w);                                   \
        if (relu) ST(hn + j, POS(a, a), w);                                                    \
        else ST(hn + j, TANH(a), w);                                                           \
    }

/* RNN, one row of its backward: da = dh ⊙ act'(h') (tanh: 1 − h'², relu: h' > 0), then the
 * carry dh [H] is cleared (h enters the previous step only through R). In: h [H].          */
#define CGRU_RNN_BWD_BODY(T, VT, V, LD, ST, SIG, TANH, POS)                                    \
    for (int j = 0; j < H; j += V) {                                                           \
        int w = H - j;                                                                         \
        VT h = LD(hn + j, w), d = LD(dh + j, w), one = (VT){0} + 1;                            \
        if (relu) ST(da + j, POS(h, d), w);                                                    \
        else ST(da + j, d * (one - h * h), w);                                                 \
        ST(dh + j, (VT){0}, w);                                                                \
    }

/* One kernel in three compiled versions and its dispatch: NAME_v4, NAME_v3, NAME_base, each
 * on its level's vector width (CGRU_OPS_<SUF>_<level>: T, VT, V, LD, ST, SIG, TANH, POS);
 * NAME_at(level, …) and NAME(…) (the machine's level).                                        */
#define CGRU_DEFINE_ROW_KERNEL(NAME, BODY, SUF, PARAMS, ARGS)                                  \
CGRU_TARGET_V4 CGRU_LEVEL void NAME##_v4 PARAMS { CGRU_APPLY(BODY, CGRU_OPS_##SUF##_v4) }      \
CGRU_TARGET_V3 CGRU_LEVEL void NAME##_v3 PARAMS { CGRU_APPLY(BODY, CGRU_OPS_##SUF##_v3) }      \
CGRU_LEVEL void NAME##_base PARAMS { CGRU_APPLY(BODY, CGRU_OPS_##SUF##_v0) }                   \
CGRU_API void NAME##_at(int isa, CGRU_UNPAREN PARAMS) {                                        \
    switch (isa) {                                                                             \
    case 4: NAME##_v4 ARGS; break;                                                             \
    case 3: NAME##_v3 ARGS; break;                                                             \
    default: NAME##_base ARGS; break;                                                          \
    }                                                                                          \
}                                                                                              \
static inline void NAME(CGRU_UNPAREN PARAMS) { NAME##_at(cgru_isa(), CGRU_UNPAREN ARGS); }
/* where the kernels are not compiled (see simd.h): the entry point and the call */
#define CGRU_DECLARE_ROW_KERNEL(NAME, BODY, SUF, PARAMS, ARGS)                                 \
CGRU_API void NAME##_at(int isa, CGRU_UNPAREN PARAMS);                                         \
static inline void NAME(CGRU_UNPAREN PARAMS) { NAME##_at(cgru_isa(), CGRU_UNPAREN ARGS); }
/* each level's operations: float and double on 64-, 32- and 16-byte vectors */
#define CGRU_OPS_f32_v4 float, cgru_vf, 16, cgru_ld_f32, cgru_st_f32, cgru_vsigmoidf, cgru_vtanhf, \
    cgru_where_pos_f32
#define CGRU_OPS_f32_v3 float, cgru_vf8, 8, cgru_ld_f32x8, cgru_st_f32x8, cgru_vsigmoidf8,     \
    cgru_vtanhf8, cgru_where_pos_f32x8
#define CGRU_OPS_f32_v0 float, cgru_vf4, 4, cgru_ld_f32x4, cgru_st_f32x4, cgru_vsigmoidf4,     \
    cgru_vtanhf4, cgru_where_pos_f32x4
#define CGRU_OPS_f64_v4 double, cgru_vd, 8, cgru_ld_f64, cgru_st_f64, cgru_vsigmoidd, cgru_vtanhd, \
    cgru_where_pos_f64
#define CGRU_OPS_f64_v3 double, cgru_vd4, 4, cgru_ld_f64x4, cgru_st_f64x4, cgru_vsigmoidd4,    \
    cgru_vtanhd4, cgru_where_pos_f64x4
#define CGRU_OPS_f64_v0 double, cgru_vd2, 2, cgru_ld_f64x2, cgru_st_f64x2, cgru_vsigmoidd2,    \
    cgru_vtanhd2, cgru_where_pos_f64x2

#define CGRU_DEFINE_GATES(SUF, T, ROW_KERNEL)                                                  \
ROW_KERNEL(cgru_gru_fwd_ra_##SUF, CGRU_GRU_FWD_RA_BODY, SUF,                                   \
    (int H, const T *gx, const T *gh, const T *b, const T *bhn, const T *hp, T *g3, T *hn,     \
     T *hnew, int flip),                                                                       \
    (H, gx, gh, b, bhn, hp, g3, hn, hnew, flip))                                               \
ROW_KERNEL(cgru_gru_bwd_ra_##SUF, CGRU_GRU_BWD_RA_BODY, SUF,                                   \
    (int H, const T *g3, const T *hp, const T *hn, T *dh, T *dgx, T *dgh, int flip),           \
    (H, g3, hp, hn, dh, dgx, dgh, flip))                                                       \
ROW_KERNEL(cgru_gru_fwd_rb_rz_##SUF, CGRU_GRU_FWD_RB_RZ_BODY, SUF,                             \
    (int H, const T *gx, const T *gh, const T *b, const T *hp, const T *m, T *g3, T *rh),      \
    (H, gx, gh, b, hp, m, g3, rh))                                                             \
ROW_KERNEL(cgru_gru_fwd_rb_n_##SUF, CGRU_GRU_FWD_RB_N_BODY, SUF,                               \
    (int H, const T *gxn, const T *ghn, const T *bn, const T *z, const T *hp, T *n, T *hnew,   \
     int flip),                                                                                \
    (H, gxn, ghn, bn, z, hp, n, hnew, flip))                                                   \
ROW_KERNEL(cgru_gru_bwd_rb_##SUF, CGRU_GRU_BWD_RB_BODY, SUF,                                   \
    (int H, const T *g3, const T *hp, const T *m, T *dh, T *dgx, T *rhm, int flip),            \
    (H, g3, hp, m, dh, dgx, rhm, flip))                                                        \
ROW_KERNEL(cgru_gru_bwd_rb_r_##SUF, CGRU_GRU_BWD_RB_R_BODY, SUF,                               \
    (int H, const T *g3, const T *hp, const T *m, const T *drh, T *dh, T *dgx),                \
    (H, g3, hp, m, drh, dh, dgx))                                                              \
ROW_KERNEL(cgru_lstm_fwd_##SUF, CGRU_LSTM_FWD_BODY, SUF,                                       \
    (int H, const T *gx, const T *gh, const T *b, const T *cp, T *g4, T *cn, T *hf),           \
    (H, gx, gh, b, cp, g4, cn, hf))                                                            \
ROW_KERNEL(cgru_lstm_bwd_##SUF, CGRU_LSTM_BWD_BODY, SUF,                                       \
    (int H, const T *g4, const T *cp, const T *cn, const T *dhf, T *dc, T *da),                \
    (H, g4, cp, cn, dhf, dc, da))                                                              \
ROW_KERNEL(cgru_rnn_fwd_##SUF, CGRU_RNN_FWD_BODY, SUF,                                         \
    (int H, const T *gx, const T *gh, const T *b, T *hn, int relu),                            \
    (H, gx, gh, b, hn, relu))                                                                  \
ROW_KERNEL(cgru_rnn_bwd_##SUF, CGRU_RNN_BWD_BODY, SUF,                                         \
    (int H, const T *hn, T *dh, T *da, int relu),                                              \
    (H, hn, dh, da, relu))

#ifdef CGRU_IMPL_GATES_F32
CGRU_DEFINE_GATES(f32, float, CGRU_DEFINE_ROW_KERNEL)
#else
CGRU_DEFINE_GATES(f32, float, CGRU_DECLARE_ROW_KERNEL)
#endif
#ifdef CGRU_IMPL_GATES_F64
CGRU_DEFINE_GATES(f64, double, CGRU_DEFINE_ROW_KERNEL)
#else
CGRU_DEFINE_GATES(f64, double, CGRU_DECLARE_ROW_KERNEL)
#endif

#endif
