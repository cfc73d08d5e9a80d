/* The C half of threads.pyx: cgru's parallel regions on the compiler's OpenMP runtime.
 *
 *   void cgru_region(int n_threads, cgru_member_fn fn, void *ctx, double work_ns);
 *       fn(ctx, tid, size) on every thread of a team of `size` threads (tid 0 is the caller);
 *       work_ns: about how long the work would take the caller alone (0: unknown), which
 *       decides whether a cold team is worth waking (below);
 *   void cgru_parallel_for(int n_items, int n_threads, cgru_item_fn fn, void *ctx,
 *                          cgru_poll_fn poll, void *poll_ctx, double work_ns);
 *       fn(ctx, i) once for every i in [0, n_items), the items handed out in increasing order
 *       to whichever team thread asks next; the caller runs poll(poll_ctx) about every
 *       CGRU_POLL_WAIT_NS while it waits for the others' last items (poll may be NULL).
 *
 * Which thread runs which item varies, so callers write items that are independent (disjoint
 * outputs, per-item scratch): results never depend on the thread count.
 *
 * Built without OpenMP (_OPENMP undefined) every region is the caller alone.
 *
 * The thread budget.  Several threads (Python or C) may call cgru at once.  A call's team
 * takes only the cores that no other cgru call is using: cgru_busy counts the threads inside
 * cgru's regions — every caller, serial or not, and its team's other threads — and a caller
 * gets at most cgru_cores − (the others' threads) threads, itself included (always itself).
 * Eight calling threads on two cores then run eight threads, not sixteen.  The team size
 * changes only who computes what, never a result.  Nested regions are never made: a call
 * from inside an OpenMP region (cgru's own or the host's) runs serially.
 *
 * Other processes.  A team waits at the end of its region for its slowest thread, and a
 * thread that shares its core with a busy process is held up a scheduler time slice at a
 * time: on 2 cores with 2 busy processes, a 2-thread training step took twice as long as a
 * 1-thread one, and a 0.3 ms batch-1 forward up to 16 ms.  So every team watches for that:
 * a member that starts more than CGRU_LATE_NS after the region began, and later than a
 * quarter of the region's time, while more threads are runnable on the machine than it has
 * cores (/proc/loadavg), marks the team held up (a long region still gains from a member that
 * missed its start; a helper waking from sleep on an idle virtual CPU can be as late, which
 * the runnable count tells apart; being preempted during a region happens on a quiet machine
 * too — kernel threads — and is not counted) when the team before it looked held up too.
 * The next teams, for CGRU_BACKOFF_NS, are then
 * at most half as large (on 2 cores: one thread); a team held up again right after doubles
 * the time (up to CGRU_BACKOFF_MAX_NS), one that runs clean resets it.  This is opt-in:
 * CGRU_TEAMS_BACKOFF=1 in the environment (read at import) turns it on.  Off, every team has
 * the size its call asks for: in the bench, with other processes' thread pools spinning
 * between blocks, the backoff fired where teams still paid (batch-1 rows 20-40 % slower).
 *
 * Cold teams.  Between teams a runtime's threads spin for a while (below), then sleep, and
 * waking a sleeping one takes as long as its CPU takes to resume: microseconds on a bare
 * machine, milliseconds on a virtual machine whose host has descheduled the idle virtual CPU.
 * On the project's 2-core virtual machine an empty 2-thread region after 20 ms without one
 * took 2-8 ms, its helper starting 3.5 ms late on average (after 10 ms: 85 µs). A region ends
 * at a barrier, so a call shorter than that waits for the helper: a 32-step batch-1 forward
 * made every 20 ms took 10-16 ms at 2 threads against 0.8 ms at one.  Every team therefore
 * measures how late its helpers start; a team is cold when no team ended within CGRU_WARM_NS
 * before it, and cgru_cold_late_ns follows cold teams' lateness (a moving average: each cold
 * team moves it a quarter of the way to its own).  A cold region whose work_ns is below
 * that estimate runs on its caller alone, since the team would end later than the caller
 * alone; work items are claimed dynamically, so a longer one gains from the helper once it
 * arrives (the first team of a pool, whose threads the runtime starts then, is not measured).
 * Cold regions run alone in a row (calls in a loop, none long enough alone) add up their work:
 * once it is CGRU_BURST_WAKES wake-ups the team is woken, and the calls after it find it warm.
 * So that the estimate follows the machine, one skipped region in cgru_cold_probe
 * still gets its team: every 16th, doubling while those stay slow, up to every 1024th.  Warm
 * teams (calls in a row, the regions of one call) are never skipped.  CGRU_COLD_TEAMS=0 in
 * the environment (read at import) turns the rule off.  Like every team size, this changes
 * no result.
 *
 * fork().  GNU libgomp keeps a pool of threads for every thread that started a team; a fork
 * copies the forking thread with its pool's bookkeeping but none of the pool's threads, so a
 * child whose forking thread had started a team waits forever for them in its next team.
 * cgru's fork handlers (registered when threads.pyx is imported, before any cgru call):
 *   - before the fork, under libgomp: omp_pause_resource_all(omp_pause_soft) on the forking
 *     thread, which ends that thread's pool (the parent makes a fresh one on its next team)
 *     — the child then starts with none and runs its teams at full width;
 *   - when that is not possible (the fork happens inside an OpenMP region, the runtime lacks
 *     the OpenMP 5.0 call, or the runtime is an unknown one), the child handler marks the
 *     child serial: every region runs on the caller alone, without entering the runtime
 *     (a 1-thread region never needs the pool, so results are the same bits);
 *   - LLVM's libomp (and Intel's) re-initialise themselves in a forked child: nothing to do;
 *   - in the child, the budget restarts at zero (the parent's other threads are not there).
 * multiprocessing's "spawn" and "forkserver" start methods start fresh runtimes anyway.
 *
 * Spinning.  OpenMP threads wait for the next team by spinning for a while, then sleeping.
 * libgomp's default without OMP_WAIT_POLICY is a short spin (GOMP_SPINCOUNT 300,000 pause
 * iterations: GCC estimates 3 ms; about 0.3 ms on the project's machine); cgru leaves
 * libgomp's settings alone (docs/decisions.md says why).  LLVM's libomp spins for
 * KMP_BLOCKTIME, 200 ms by default: unless KMP_BLOCKTIME or OMP_WAIT_POLICY is set, a thread
 * about to start cgru's first team sets its blocktime to CGRU_LLVM_BLOCKTIME_MS
 * (kmp_set_blocktime, the thread's own setting).
 */
#ifndef CGRU_PARALLEL_H
#define CGRU_PARALLEL_H

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define CGRU_POLL_WAIT_NS 10000000L    /* 10 ms between the waiting caller's polls */
#define CGRU_WAIT_SPIN_NS 50000L       /* the waiting caller spins this long, then sleeps */
#define CGRU_LLVM_BLOCKTIME_MS 1
#define CGRU_LATE_NS 1000000LL           /* a member starting this late was held up */
#define CGRU_BACKOFF_NS 50000000LL       /* smaller teams for this long after a held-up one, */
#define CGRU_BACKOFF_MAX_NS 1600000000LL /*   doubling while it happens again, up to this */
#define CGRU_WARM_NS 200000LL            /* a team this soon after the last one is warm */
#define CGRU_COLD_PROBE_MIN 16           /* one cold region in this many gets its team, */
#define CGRU_COLD_PROBE_MAX 1024         /*   doubling while they stay slow, up to this */
#define CGRU_BURST_WAKES 8               /* cold regions in a row worth this many wake-ups */

typedef void (*cgru_item_fn)(void *ctx, int item);
typedef void (*cgru_poll_fn)(void *ctx);
typedef void (*cgru_member_fn)(void *ctx, int tid, int size);

/* ---- the runtime ---------------------------------------------------------------------- */
enum { CGRU_RT_NONE = 0, CGRU_RT_GNU = 1, CGRU_RT_LLVM = 2, CGRU_RT_OTHER = 3 };
static int cgru_rt = CGRU_RT_NONE;
static char cgru_rt_path[4096];
typedef int (*cgru_pause_fn)(int kind);
typedef void (*cgru_blocktime_fn)(int ms);
static cgru_pause_fn cgru_rt_pause;          /* omp_pause_resource_all, or NULL */
static cgru_blocktime_fn cgru_rt_blocktime;  /* kmp_set_blocktime (LLVM), or NULL */

static int cgru_cores = 1;           /* the budget: the process's usable cores */
static int cgru_busy;                /* threads inside cgru's regions now           (atomic) */
static int cgru_busy_peak;           /* the most cgru_busy has been (tests)        (atomic) */
static int cgru_teams;               /* regions run with more than one thread (tests) (atomic) */
static int cgru_serial;              /* 1: every region runs on its caller alone  (a forked
                                        child whose runtime could not be made safe) */
static int cgru_fork_unsafe;         /* the fork under way could not be made safe */
static int cgru_fork_pause_enabled = 1;  /* 0 (tests): act as if the pause had failed */
static int cgru_pauses;              /* successful pauses before a fork (tests)     (atomic) */
static int cgru_teams_always = 1;    /* 1: no backoff (unless CGRU_TEAMS_BACKOFF)    (atomic) */
static int cgru_held_ups;            /* teams held up so far (tests)                (atomic) */
static int cgru_force_held_up;       /* tests: count the next team as held up       (atomic) */
static long long cgru_backoff_until; /* teams are capped at cgru_backoff_cap until  (atomic) */
static long long cgru_backoff_len = CGRU_BACKOFF_NS;   /* the next backoff's length (atomic) */
static int cgru_backoff_cap;         /*                                              (atomic) */
static int cgru_strikes;             /* teams in a row that looked held up           (atomic) */
static long long cgru_team_end_ns;   /* when the last team ended                     (atomic) */
static long long cgru_cold_late_ns;  /* how late cold teams' helpers start            (atomic) */
static int cgru_cold_skipped;        /* cold regions run alone since the last cold team (atomic) */
static int cgru_cold_probe = CGRU_COLD_PROBE_MIN;   /* skipped regions per cold team (atomic) */
static int cgru_cold_rule = 1;       /* 0 (tests): cold teams are never skipped      (atomic) */
static int cgru_cold_alone;          /* cold regions run alone so far (tests)        (atomic) */
static long long cgru_alone_end_ns;  /* when the last cold region run alone ended    (atomic) */
static long long cgru_burst_ns;      /* the work of the cold regions run alone in a row, each
                                        within CGRU_WARM_NS of the last              (atomic) */
static int cgru_pool_new = 1;        /* the runtime starts its threads at the next team: not a
                                        wake-up, not measured                        (atomic) */
static _Thread_local int cgru_worker;        /* 1 on a team's threads other than the caller */
static _Thread_local int cgru_blocktime_set;

static inline int cgru_is_worker(void) { return cgru_worker; }

static int cgru_omp_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int cgru_in_omp_region(void)
{
#ifdef _OPENMP
    return omp_in_parallel();
#else
    return 0;
#endif
}

/* fork handlers (see the header comment) */
static void cgru_fork_prepare(void)
{
    cgru_fork_unsafe = 0;
    if (cgru_rt == CGRU_RT_NONE || cgru_rt == CGRU_RT_LLVM)
        return;
    if (cgru_rt == CGRU_RT_GNU && cgru_rt_pause != NULL && cgru_fork_pause_enabled
            && cgru_rt_pause(1 /* omp_pause_soft */) == 0) {
        __atomic_add_fetch(&cgru_pauses, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&cgru_pool_new, 1, __ATOMIC_RELAXED);
        return;
    }
    cgru_fork_unsafe = 1;
}

static void cgru_fork_parent(void) { cgru_fork_unsafe = 0; }

static void cgru_fork_child(void)
{
    if (cgru_fork_unsafe)
        cgru_serial = 1;
    cgru_fork_unsafe = 0;
    cgru_busy = 0;
    cgru_backoff_until = 0;            /* the child's teams start afresh */
    cgru_strikes = 0;
    cgru_backoff_len = CGRU_BACKOFF_NS;
    cgru_cold_skipped = 0;
    cgru_pool_new = 1;                 /* its first team starts the runtime's threads */
}

/* Once, at import (under the GIL, before any cgru call): which runtime, its optional entry
 * points, the fork handlers.  Returns 0, or -1 when the fork handlers could not be
 * registered (then every region runs serially: no fork can strand a team). */
static int cgru_parallel_init(int cores)
{
    cgru_cores = cores > 0 ? cores : 1;
    const char *backoff = getenv("CGRU_TEAMS_BACKOFF");
    cgru_teams_always = !(backoff != NULL && backoff[0] != '\0' && strcmp(backoff, "0") != 0);
    const char *cold = getenv("CGRU_COLD_TEAMS");
    cgru_cold_rule = !(cold != NULL && strcmp(cold, "0") == 0);
#ifdef _OPENMP
    Dl_info info;
    const char *name = "";
    cgru_rt = CGRU_RT_OTHER;
    if (dladdr((void *)&omp_get_max_threads, &info) != 0 && info.dli_fname != NULL) {
        snprintf(cgru_rt_path, sizeof cgru_rt_path, "%s", info.dli_fname);
        const char *slash = strrchr(info.dli_fname, '/');
        name = slash ? slash + 1 : info.dli_fname;
    }
    void *h = cgru_rt_path[0] ? dlopen(cgru_rt_path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (h == NULL)
        h = RTLD_DEFAULT;
    if (strstr(name, "gomp") != NULL)
        cgru_rt = CGRU_RT_GNU;
    else if (strstr(name, "libomp") != NULL || strstr(name, "iomp") != NULL
             || dlsym(h, "kmp_set_blocktime") != NULL)
        cgru_rt = CGRU_RT_LLVM;
    cgru_rt_pause = (cgru_pause_fn)dlsym(h, "omp_pause_resource_all");
    if (cgru_rt == CGRU_RT_LLVM && getenv("KMP_BLOCKTIME") == NULL
            && getenv("OMP_WAIT_POLICY") == NULL)
        cgru_rt_blocktime = (cgru_blocktime_fn)dlsym(h, "kmp_set_blocktime");
    if (pthread_atfork(cgru_fork_prepare, cgru_fork_parent, cgru_fork_child) != 0) {
        cgru_serial = 1;
        return -1;
    }
#endif
    return 0;
}

/* ---- held-up teams (see the header) -------------------------------------------------- */
static long long cgru_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* More threads are runnable on the machine now than it has cores (/proc/loadavg's running
 * count; 0 where it cannot be read): what tells a helper held up by other processes from one
 * that was asleep and took a while to wake (an idle virtual CPU can take milliseconds). */
static int cgru_machine_oversubscribed(void)
{
    /* the least of a few readings: a kernel thread's moment of work is not a busy process */
    for (int i = 0; i < 4; i++) {
        char buf[128];
        FILE *f = fopen("/proc/loadavg", "re");
        if (f == NULL)
            return 0;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        double a, b, c;
        int running = 0, total = 0;
        if (sscanf(buf, "%lf %lf %lf %d/%d", &a, &b, &c, &running, &total) != 5
                || running <= cgru_cores)
            return 0;
    }
    return 1;
}

/* At most this many threads for a team starting now. */
static int cgru_team_cap(int want)
{
    if (want <= 1 || __atomic_load_n(&cgru_teams_always, __ATOMIC_RELAXED))
        return want;
    if (cgru_mono_ns() < __atomic_load_n(&cgru_backoff_until, __ATOMIC_RELAXED)) {
        int cap = __atomic_load_n(&cgru_backoff_cap, __ATOMIC_RELAXED);
        return want < cap ? want : cap;
    }
    return want;
}

/* A team of `size` threads has ended; `late`: a member started late. */
static void cgru_team_ended(int size, int late)
{
    /* held up: late while the machine is oversubscribed, twice in a row (once happens on a
     * quiet machine too, a few times in a hundred calls made after a pause) */
    int held_up = 0;
    if (late && cgru_machine_oversubscribed())
        held_up = __atomic_add_fetch(&cgru_strikes, 1, __ATOMIC_RELAXED) >= 2;
    else
        __atomic_store_n(&cgru_strikes, 0, __ATOMIC_RELAXED);
    if (held_up)
        __atomic_store_n(&cgru_strikes, 0, __ATOMIC_RELAXED);
    if (__atomic_exchange_n(&cgru_force_held_up, 0, __ATOMIC_RELAXED))
        held_up = 1;
    if (!held_up) {
        if (cgru_mono_ns() >= __atomic_load_n(&cgru_backoff_until, __ATOMIC_RELAXED))
            __atomic_store_n(&cgru_backoff_len, CGRU_BACKOFF_NS, __ATOMIC_RELAXED);
        return;
    }
    __atomic_add_fetch(&cgru_held_ups, 1, __ATOMIC_RELAXED);
    long long len = __atomic_load_n(&cgru_backoff_len, __ATOMIC_RELAXED);
    int cap = size / 2 > 1 ? size / 2 : 1;
    __atomic_store_n(&cgru_backoff_cap, cap, __ATOMIC_RELAXED);
    __atomic_store_n(&cgru_backoff_until, cgru_mono_ns() + len, __ATOMIC_RELAXED);
    __atomic_store_n(&cgru_backoff_len, len * 2 < CGRU_BACKOFF_MAX_NS ? len * 2
                     : CGRU_BACKOFF_MAX_NS, __ATOMIC_RELAXED);
}

/* ---- cold teams (see the header) ------------------------------------------------------ */
/* True when a cold region of `work_ns`, starting at `start`, should run on its caller alone. */
static int cgru_cold_alone_now(double work_ns, long long start)
{
    if (!__atomic_load_n(&cgru_cold_rule, __ATOMIC_RELAXED) || work_ns <= 0.0)
        return 0;
    double est = (double)__atomic_load_n(&cgru_cold_late_ns, __ATOMIC_RELAXED);
    if (est <= work_ns)
        return 0;
    /* calls in a row (each too short to wake the helpers for) add up: once their work is
     * CGRU_BURST_WAKES wake-ups, the team is woken, and stays warm for the calls after it (a
     * second thread saves only part of the work, and the wake-up that pays for it is a delay
     * a caller sees: the loop must have lasted long enough to be worth it) */
    long long work = (long long)work_ns;
    long long burst = start - __atomic_load_n(&cgru_alone_end_ns, __ATOMIC_RELAXED) > CGRU_WARM_NS
                      ? work : __atomic_load_n(&cgru_burst_ns, __ATOMIC_RELAXED) + work;
    __atomic_store_n(&cgru_burst_ns, burst, __ATOMIC_RELAXED);
    if ((double)burst > CGRU_BURST_WAKES * est)
        return 0;
    if (__atomic_add_fetch(&cgru_cold_skipped, 1, __ATOMIC_RELAXED)
            >= __atomic_load_n(&cgru_cold_probe, __ATOMIC_RELAXED))
        return 0;                      /* this one measures again */
    __atomic_add_fetch(&cgru_cold_alone, 1, __ATOMIC_RELAXED);
    return 1;
}

/* A cold team of `work_ns` has run; its helpers started `late` ns after it began. */
static void cgru_cold_measured(long long late, double work_ns)
{
    long long est = __atomic_load_n(&cgru_cold_late_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&cgru_cold_late_ns, est + (late - est) / 4, __ATOMIC_RELAXED);
    int probe = __atomic_load_n(&cgru_cold_probe, __ATOMIC_RELAXED);
    if (work_ns > 0.0 && (double)late > work_ns)     /* slow again: measure less often */
        probe = 2 * probe < CGRU_COLD_PROBE_MAX ? 2 * probe : CGRU_COLD_PROBE_MAX;
    else
        probe = CGRU_COLD_PROBE_MIN;
    __atomic_store_n(&cgru_cold_probe, probe, __ATOMIC_RELAXED);
    __atomic_store_n(&cgru_cold_skipped, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&cgru_burst_ns, 0, __ATOMIC_RELAXED);
}

/* ---- the budget ----------------------------------------------------------------------- */
/* Threads for a caller that asks for `want` (≥ 1): itself, plus as many others as the budget
 * has room for, while teams back off at most the backoff's cap.  Counted in cgru_busy until
 * cgru_release. */
static int cgru_claim(int want)
{
    want = cgru_team_cap(want);
    int cur = __atomic_load_n(&cgru_busy, __ATOMIC_RELAXED);
    for (;;) {
        int extra = want - 1;
        int room = cgru_cores - cur - 1;
        if (extra > room) extra = room;
        if (extra < 0) extra = 0;
        if (__atomic_compare_exchange_n(&cgru_busy, &cur, cur + 1 + extra, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            int now = cur + 1 + extra;
            int peak = __atomic_load_n(&cgru_busy_peak, __ATOMIC_RELAXED);
            while (now > peak && !__atomic_compare_exchange_n(&cgru_busy_peak, &peak, now, 1,
                                                               __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                ;
            return 1 + extra;
        }
    }
}

static void cgru_release(int n) { __atomic_sub_fetch(&cgru_busy, n, __ATOMIC_ACQ_REL); }

/* ---- a region --------------------------------------------------------------------------- */
/* fn(ctx, tid, size) on a team of up to n_threads threads, the caller as tid 0 (its team
 * claimed from the budget).  A caller that is itself inside an OpenMP region, or in a serial
 * process, runs fn(ctx, 0, 1). */
static void cgru_region(int n_threads, cgru_member_fn fn, void *ctx, double work_ns)
{
    if (cgru_worker || cgru_in_omp_region()) {    /* never nested: no claim, no team */
        fn(ctx, 0, 1);
        return;
    }
    int want = n_threads > 1 && !cgru_serial ? n_threads : 1;
#ifdef _OPENMP
    long long start = want > 1 ? cgru_mono_ns() : 0;
    int cold = want > 1
        && start - __atomic_load_n(&cgru_team_end_ns, __ATOMIC_RELAXED) > CGRU_WARM_NS;
    if (cold && cgru_cold_alone_now(work_ns, start)) {   /* the caller alone: no other core
                                                             is claimed from the budget */
        int one = cgru_claim(1);
        fn(ctx, 0, 1);
        cgru_release(one);
        __atomic_store_n(&cgru_alone_end_ns, cgru_mono_ns(), __ATOMIC_RELAXED);
        return;
    }
#endif
    int n = cgru_claim(want);
#ifdef _OPENMP
    if (n > 1) {
        if (cgru_rt_blocktime != NULL && !cgru_blocktime_set) {
            cgru_rt_blocktime(CGRU_LLVM_BLOCKTIME_MS);
            cgru_blocktime_set = 1;
        }
        __atomic_add_fetch(&cgru_teams, 1, __ATOMIC_RELAXED);
        /* the latest member's start: the cold rule's and the backoff's measure */
        int watch = !__atomic_load_n(&cgru_teams_always, __ATOMIC_RELAXED);
        long long late = 0;
        #pragma omp parallel num_threads(n)
        {
            int tid = omp_get_thread_num();
            if (tid != 0) {
                cgru_worker = 1;
                long long l = cgru_mono_ns() - start, seen = 0;
                while (l > seen && !__atomic_compare_exchange_n(&late, &seen, l, 1,
                                                                 __ATOMIC_RELAXED,
                                                                 __ATOMIC_RELAXED))
                    ;
            }
            fn(ctx, tid, omp_get_num_threads());
            if (tid != 0)
                cgru_worker = 0;
        }
        cgru_release(n);
        long long end = cgru_mono_ns();
        __atomic_store_n(&cgru_team_end_ns, end, __ATOMIC_RELAXED);
        if (__atomic_exchange_n(&cgru_pool_new, 0, __ATOMIC_RELAXED))
            ;                          /* the runtime started its threads: not a wake-up */
        else if (cold)
            cgru_cold_measured(late, work_ns);
        /* held up: a member started late, and late enough to matter (a quarter of the
         * region: a long region still gains from a member that missed its start) */
        if (watch)
            cgru_team_ended(n, late > CGRU_LATE_NS && 4 * late > end - start);
        return;
    }
#endif
    fn(ctx, 0, 1);
    cgru_release(n);
}

/* ---- a parallel for ----------------------------------------------------------------------- */
typedef struct {
    cgru_item_fn fn;
    void *ctx;
    int n_items;
    int next;                   /* the next item to hand out                          (atomic) */
    int done;                   /* items finished                                     (atomic) */
    cgru_poll_fn poll;
    void *poll_ctx;
    pthread_mutex_t lock;       /* the caller sleeps on `finished` while the others end */
    pthread_cond_t finished;
} cgru_for;

static void cgru_deadline(struct timespec *ts, long ns)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += ns;
    while (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

static double cgru_now(void) { return 1e-9 * (double)cgru_mono_ns(); }

/* The caller, its own items done: wait for the others' last items, polling. */
static void cgru_for_wait(cgru_for *F)
{
    double spin_until = cgru_now() + 1e-9 * CGRU_WAIT_SPIN_NS;
    while (__atomic_load_n(&F->done, __ATOMIC_ACQUIRE) < F->n_items) {
        if (cgru_now() > spin_until)
            break;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    pthread_mutex_lock(&F->lock);
    while (__atomic_load_n(&F->done, __ATOMIC_ACQUIRE) < F->n_items) {
        struct timespec ts;
        cgru_deadline(&ts, CGRU_POLL_WAIT_NS);
        int rc = pthread_cond_timedwait(&F->finished, &F->lock, &ts);
        if (rc == ETIMEDOUT && __atomic_load_n(&F->done, __ATOMIC_ACQUIRE) < F->n_items) {
            pthread_mutex_unlock(&F->lock);
            F->poll(F->poll_ctx);
            pthread_mutex_lock(&F->lock);
        }
    }
    pthread_mutex_unlock(&F->lock);
}

static void cgru_for_member(void *ctx, int tid, int size)
{
    cgru_for *F = (cgru_for *)ctx;
    (void)size;
    for (;;) {
        int i = __atomic_fetch_add(&F->next, 1, __ATOMIC_RELAXED);
        if (i >= F->n_items)
            break;
        F->fn(F->ctx, i);
        if (__atomic_add_fetch(&F->done, 1, __ATOMIC_ACQ_REL) == F->n_items && tid != 0
                && F->poll != NULL) {
            pthread_mutex_lock(&F->lock);          /* the last item: wake the caller */
            pthread_cond_signal(&F->finished);
            pthread_mutex_unlock(&F->lock);
        }
    }
    if (tid == 0 && F->poll != NULL && size > 1)
        cgru_for_wait(F);
}

static void cgru_parallel_for(int n_items, int n_threads, cgru_item_fn fn, void *ctx,
                              cgru_poll_fn poll, void *poll_ctx, double work_ns)
{
    if (n_items <= 0)
        return;
    cgru_for F;
    F.fn = fn;
    F.ctx = ctx;
    F.n_items = n_items;
    F.next = 0;
    F.done = 0;
    F.poll = poll;
    F.poll_ctx = poll_ctx;
    pthread_mutex_init(&F.lock, NULL);
    pthread_cond_init(&F.finished, NULL);
    cgru_region(n_threads < n_items ? n_threads : n_items, cgru_for_member, &F, work_ns);
    pthread_cond_destroy(&F.finished);
    pthread_mutex_destroy(&F.lock);
}

#endif /* CGRU_PARALLEL_H */
