/* A GEMM team: spare threads of the pool share one time loop's per-step products.
 *
 * cgru's time loops run as work items (direction, batch chunk). When a layer has fewer items
 * than threads — one direction and a small batch, the streaming and latency shapes — the other
 * threads would idle while one thread runs every step. Instead they join the job as helpers:
 * at every step the loop's thread publishes its recurrent product C[m, n] (+)= A[m, k]·op(B)
 * (op(B) packed in panels, simd.h), the team splits it into blocks of whole column panels, and
 * every member — the loop's thread included — claims blocks until none is left; the loop's
 * thread then waits for the blocks the others claimed and goes on with the gate math.
 *
 * Results are bitwise those of one cgru_gemm_packed call: every C element is the same sum over
 * k in the same order whichever block (and thread) computes it (simd.h). Nobody ever waits for
 * a block that nobody holds: the loop's thread claims what the helpers have not, so a team
 * whose helpers never arrive (a busy pool, a serial call) computes everything on the loop's
 * thread. The claims are one 64-bit word — (step, next block, blocks of the step) — taken by
 * compare-and-swap, so a helper that is late for one step can never take a block of the next,
 * nor read a product that is being replaced. Helpers spin (with a pause, then
 * sched_yield) only while the job runs; cgru_team_quit ends them.
 */
#ifndef CGRU_TEAM_H
#define CGRU_TEAM_H

#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include "simd.h"

typedef struct cgru_team {
    int64_t claim;        /* step << 32 | next block << 16 | blocks of the step     (atomic) */
    int step;             /* the step published last                                (atomic) */
    int done;             /* blocks of that step finished                           (atomic) */
    int quit;             /* the loop has ended                                     (atomic) */
    int n_blocks, panels_per_block, nr;     /* written by the loop's thread before a step */
    /* the product of the current step */
    int m, n, k, lda, ldc, beta1, is_double;
    const void *A, *Bp;
    void *C;
} cgru_team;

static inline cgru_team *cgru_team_new(void) { return (cgru_team *)calloc(1, sizeof(cgru_team)); }
static inline void cgru_team_free(cgru_team *t) { free(t); }

static inline void cgru_team_pause(int *spins)
{
    if (++*spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else {
        sched_yield();                /* a loaded machine: let the loop's thread run */
    }
}

static inline void cgru_team_block(const cgru_team *t, int b)
{
    int p0 = b * t->panels_per_block;
    int c0 = p0 * t->nr;
    int cols = t->n - c0;
    if (cols > t->panels_per_block * t->nr) cols = t->panels_per_block * t->nr;
    if (cols <= 0) return;
    size_t off = (size_t)p0 * (size_t)t->nr * (size_t)t->k;
    if (t->is_double)
        cgru_gemm_packed_f64(t->m, cols, t->k, (const double *)t->A, t->lda,
                             (const double *)t->Bp + off, t->beta1, (double *)t->C + c0, t->ldc);
    else
        cgru_gemm_packed_f32(t->m, cols, t->k, (const float *)t->A, t->lda,
                             (const float *)t->Bp + off, t->beta1, (float *)t->C + c0, t->ldc);
}

/* Claim and compute blocks of step `step` until none is left; returns how many were done. */
static inline int cgru_team_work(cgru_team *t, int step)
{
    int did = 0;
    int64_t c = __atomic_load_n(&t->claim, __ATOMIC_ACQUIRE);
    for (;;) {
        int next = (int)((c >> 16) & 0xffff), blocks = (int)(c & 0xffff);
        if ((int)(c >> 32) != step || next >= blocks)
            return did;
        if (__atomic_compare_exchange_n(&t->claim, &c, c + (1 << 16), 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            cgru_team_block(t, next);    /* the product cannot change before this block is done */
            __atomic_add_fetch(&t->done, 1, __ATOMIC_RELEASE);
            did++;
            c = __atomic_load_n(&t->claim, __ATOMIC_ACQUIRE);
        }
    }
}

/* The loop's thread: C[m, n] (+)= A[m, k]·op(B) with the team's help. */
static inline void cgru_team_gemm(cgru_team *t, int is_double, int m, int n, int k,
                                  const void *A, int lda, const void *Bp, int beta1, void *C,
                                  int ldc)
{
    int nr = is_double ? CGRU_NR_D : CGRU_NR_F;
    int panels = (n + nr - 1) / nr;
    /* a few blocks of whole panels, so that whoever is free takes the next one */
    int want = 4;
    int ppb = (panels + want - 1) / want;
    if (ppb < 1) ppb = 1;
    if ((panels + ppb - 1) / ppb > 0xffff) ppb = (panels + 0xfffe) / 0xffff;
    t->nr = nr;
    t->panels_per_block = ppb;
    t->n_blocks = (panels + ppb - 1) / ppb;
    t->m = m; t->n = n; t->k = k; t->lda = lda; t->ldc = ldc; t->beta1 = beta1;
    t->is_double = is_double;
    t->A = A; t->Bp = Bp; t->C = C;
    int step = t->step + 1;
    __atomic_store_n(&t->done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&t->claim, ((int64_t)step << 32) | t->n_blocks, __ATOMIC_RELEASE);
    __atomic_store_n(&t->step, step, __ATOMIC_RELEASE);
    cgru_team_work(t, step);
    int spins = 0;
    while (__atomic_load_n(&t->done, __ATOMIC_ACQUIRE) < t->n_blocks)
        cgru_team_pause(&spins);
}

/* A helper: share every published step's blocks until the loop ends. */
static inline void cgru_team_help(cgru_team *t)
{
    int seen = 0, spins = 0;
    for (;;) {
        int step = __atomic_load_n(&t->step, __ATOMIC_ACQUIRE);
        if (step != seen) {
            seen = step;
            cgru_team_work(t, step);
            spins = 0;
            continue;
        }
        if (__atomic_load_n(&t->quit, __ATOMIC_ACQUIRE))
            return;
        cgru_team_pause(&spins);
    }
}

static inline void cgru_team_quit(cgru_team *t) { __atomic_store_n(&t->quit, 1, __ATOMIC_RELEASE); }

#endif /* CGRU_TEAM_H */
