/* A GEMM team: spare threads of an OpenMP team share one time loop's per-step products.
 *
 * cgru's time loops run as work items (direction, batch chunk). When a layer has fewer items
 * than threads — one direction and a small batch, the streaming and latency shapes — the other
 * threads would idle while one thread runs every step. Instead the layer runs as one OpenMP
 * team (threads.pyx: region): its first thread, the caller, runs the loop; the others help.
 * At every step the loop's thread publishes its recurrent product C[m, n] (+)= A[m, k]·op(B)
 * (op(B) packed in panels, simd.h), the team splits it into blocks of whole column panels, and
 * every member — the loop's thread included — claims blocks until none is left; the loop's
 * thread then waits for the blocks the others claimed and goes on with the gate math.
 *
 * Results are bitwise those of one cgru_gemm_packed call: every C element is the same sum over
 * k in the same order whichever block (and thread) computes it (simd.h). Nobody ever waits for
 * a block that nobody holds: the loop's thread claims what the helpers have not, so a team
 * whose helpers are late (a loaded machine) or absent (a team of one) computes everything on
 * the loop's thread. The claims are one 64-bit word — (step, next block, blocks of the step) —
 * taken by compare-and-swap, so a helper that is late for one step can never take a block of
 * the next, nor read a product that is being replaced.
 *
 * Between steps a helper spins (with a pause) for at most CGRU_TEAM_SPIN_NS — long enough to
 * catch the next step while the loop's thread does the gate math of a step — and then sleeps
 * on the team's condition variable until the next step or the end; the loop's thread wakes
 * sleeping helpers when it publishes. So helpers burn no CPU when the loop's thread is held
 * up (preempted on a loaded machine, waiting for the GIL to poll for signals), and none at all
 * once cgru_team_quit has ended the loop.
 */
#ifndef CGRU_TEAM_H
#define CGRU_TEAM_H

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include "simd.h"

#define CGRU_TEAM_SPIN_NS 200000L      /* a helper spins this long for a step, then sleeps */

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
    int sleepers;         /* helpers asleep on `wake` (or about to be)             (atomic) */
    pthread_mutex_t lock;
    pthread_cond_t wake;  /* a step was published, or the loop ended */
} cgru_team;

static inline cgru_team *cgru_team_new(void)
{
    cgru_team *t = (cgru_team *)calloc(1, sizeof(cgru_team));
    if (t == NULL)
        return NULL;
    if (pthread_mutex_init(&t->lock, NULL) != 0) {
        free(t);
        return NULL;
    }
    if (pthread_cond_init(&t->wake, NULL) != 0) {
        pthread_mutex_destroy(&t->lock);
        free(t);
        return NULL;
    }
    return t;
}

static inline void cgru_team_free(cgru_team *t)
{
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static inline double cgru_team_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The loop's thread, after publishing a step or the end: wake the helpers that sleep.  (A
 * helper counts itself in `sleepers` and checks the step again under the lock before it
 * sleeps; this thread published before it reads `sleepers`: one of the two sees the other.) */
static inline void cgru_team_wake(cgru_team *t)
{
    if (__atomic_load_n(&t->sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&t->lock);
        pthread_cond_broadcast(&t->wake);
        pthread_mutex_unlock(&t->lock);
    }
}

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
    __atomic_store_n(&t->step, step, __ATOMIC_SEQ_CST);
    cgru_team_wake(t);
    cgru_team_work(t, step);
    int spins = 0;
    while (__atomic_load_n(&t->done, __ATOMIC_ACQUIRE) < t->n_blocks)
        cgru_team_pause(&spins);
}

/* A helper with nothing to do: until a step other than `seen` is published or the loop
 * ends, spin for at most CGRU_TEAM_SPIN_NS, then sleep. */
static inline void cgru_team_idle(cgru_team *t, int seen)
{
    double until = cgru_team_clock() + 1e-9 * CGRU_TEAM_SPIN_NS;
    for (int spins = 0;; spins++) {
        if (__atomic_load_n(&t->step, __ATOMIC_ACQUIRE) != seen
                || __atomic_load_n(&t->quit, __ATOMIC_ACQUIRE))
            return;
        if ((spins & 63) == 63 && cgru_team_clock() > until)
            break;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    pthread_mutex_lock(&t->lock);
    __atomic_add_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&t->step, __ATOMIC_SEQ_CST) == seen
           && !__atomic_load_n(&t->quit, __ATOMIC_SEQ_CST))
        pthread_cond_wait(&t->wake, &t->lock);
    __atomic_sub_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&t->lock);
}

/* A helper: share every published step's blocks until the loop ends. */
static inline void cgru_team_help(cgru_team *t)
{
    int seen = 0;
    for (;;) {
        int step = __atomic_load_n(&t->step, __ATOMIC_ACQUIRE);
        if (step != seen) {
            seen = step;
            cgru_team_work(t, step);
            continue;
        }
        if (__atomic_load_n(&t->quit, __ATOMIC_ACQUIRE))
            return;
        cgru_team_idle(t, seen);
    }
}

static inline void cgru_team_quit(cgru_team *t)
{
    __atomic_store_n(&t->quit, 1, __ATOMIC_SEQ_CST);
    cgru_team_wake(t);
}

#endif /* CGRU_TEAM_H */
