/* cgru's thread pool: run n independent work items on up to k threads, the caller among them.
 *
 *   int cgru_parallel_for(int n_items, int n_threads, cgru_item_fn fn, void *ctx,
 *                         cgru_poll_fn poll, void *poll_ctx);
 *
 * runs fn(ctx, i) once for every i in [0, n_items) and returns when all have returned.  The
 * calling thread always takes part; up to n_threads − 1 pool workers join it.  Items are handed
 * out in increasing order to whichever thread asks next, so *which* thread runs an item varies
 * from call to call: every caller writes items that are independent of each other (disjoint
 * outputs, per-item scratch), which is what makes results independent of the thread count.
 * While the caller waits for the workers' last items it calls poll(poll_ctx) about every
 * CGRU_POLL_WAIT_NS (cgru runs Python's signal handlers there, so Ctrl-C is seen).
 *
 * Why not OpenMP: libgomp's thread pool does not survive fork() — a forked child that enters a
 * parallel region after the parent used one hangs forever (multiprocessing, process pools and
 * DataLoader workers all fork).  This pool registers pthread_atfork handlers: the child starts
 * with no workers and creates fresh ones on its first parallel call.  Several callers (Python
 * threads, C threads) may run parallel loops at once: each call is a job on a list, and an idle
 * worker joins the oldest job that still wants help; a call for which no worker is free simply
 * runs its items itself.
 *
 * Workers are created on demand (never more than CGRU_POOL_MAX) and then sleep on a condition
 * variable between jobs; they never spin between jobs, so an idle cgru costs nothing to other
 * libraries (inside a job, a thread team's helpers spin between the steps of its loop:
 * team.h).
 */
#ifndef CGRU_POOL_H
#define CGRU_POOL_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

#define CGRU_POOL_MAX 256
#define CGRU_POLL_WAIT_NS 10000000L   /* 10 ms */

typedef void (*cgru_item_fn)(void *ctx, int item);
typedef void (*cgru_poll_fn)(void *ctx);

typedef struct cgru_job {
    cgru_item_fn fn;
    void *ctx;
    int n_items;
    atomic_int next;            /* the next item to hand out */
    int wanted;                 /* workers that may still join */
    int active;                 /* workers inside this job (under the pool lock) */
    pthread_cond_t idle;        /* signalled when active drops to 0 */
    struct cgru_job *prev, *nxt;  /* the list of jobs that want workers */
} cgru_job;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work;        /* a job was posted */
    cgru_job *head, *tail;      /* jobs that want workers, oldest first */
    int n_workers;              /* workers alive in this process */
    int n_idle;                 /* workers waiting for work */
    int atfork_registered;
} cgru_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, NULL, 0, 0, 0};

static _Thread_local int cgru_pool_worker_flag;  /* 1 on pool workers, 0 on callers */

/* True on a pool worker thread (false on the thread that called cgru). */
static inline int cgru_pool_is_worker(void) { return cgru_pool_worker_flag; }

static void cgru_pool_unlink(cgru_job *job)
{
    if (job->prev) job->prev->nxt = job->nxt; else if (cgru_pool.head == job) cgru_pool.head = job->nxt;
    if (job->nxt) job->nxt->prev = job->prev; else if (cgru_pool.tail == job) cgru_pool.tail = job->prev;
    job->prev = job->nxt = NULL;
}

static void cgru_run_items(cgru_job *job)
{
    for (;;) {
        int i = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (i >= job->n_items)
            return;
        job->fn(job->ctx, i);
    }
}

static void *cgru_pool_worker(void *arg)
{
    (void)arg;
    cgru_pool_worker_flag = 1;
    pthread_mutex_lock(&cgru_pool.lock);
    for (;;) {
        while (cgru_pool.head == NULL) {
            cgru_pool.n_idle++;
            pthread_cond_wait(&cgru_pool.work, &cgru_pool.lock);
            cgru_pool.n_idle--;
        }
        cgru_job *job = cgru_pool.head;
        job->active++;
        if (--job->wanted == 0)
            cgru_pool_unlink(job);
        pthread_mutex_unlock(&cgru_pool.lock);
        cgru_run_items(job);
        pthread_mutex_lock(&cgru_pool.lock);
        if (--job->active == 0)
            pthread_cond_signal(&job->idle);
    }
    return NULL;
}

/* fork(): hold the lock across it, so the child's copy of the pool is consistent; the child
 * has none of the parent's workers (only the forking thread survives a fork) and starts empty. */
static void cgru_pool_prepare(void) { pthread_mutex_lock(&cgru_pool.lock); }
static void cgru_pool_parent(void) { pthread_mutex_unlock(&cgru_pool.lock); }
static void cgru_pool_child(void)
{
    pthread_mutex_init(&cgru_pool.lock, NULL);
    pthread_cond_init(&cgru_pool.work, NULL);
    cgru_pool.head = cgru_pool.tail = NULL;
    cgru_pool.n_workers = 0;
    cgru_pool.n_idle = 0;
}

/* Called with the lock held: start workers until there are `want` (a call wants at most
 * n_threads − 1; concurrent calls share them). */
static void cgru_pool_grow(int want)
{
    if (!cgru_pool.atfork_registered) {
        if (pthread_atfork(cgru_pool_prepare, cgru_pool_parent, cgru_pool_child) != 0)
            return;              /* no fork protection: run serially rather than risk a hang */
        cgru_pool.atfork_registered = 1;
    }
    if (want > CGRU_POOL_MAX)
        want = CGRU_POOL_MAX;
    while (cgru_pool.n_workers < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, cgru_pool_worker, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0)
            break;               /* fewer workers: the caller does more of the items itself */
        cgru_pool.n_workers++;
    }
}

static void cgru_deadline(struct timespec *ts, long ns)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += ns;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Returns 0 (every item ran). */
static int cgru_parallel_for(int n_items, int n_threads, cgru_item_fn fn, void *ctx,
                             cgru_poll_fn poll, void *poll_ctx)
{
    if (n_items <= 0)
        return 0;
    if (n_threads > n_items)
        n_threads = n_items;
    cgru_job job;
    job.fn = fn;
    job.ctx = ctx;
    job.n_items = n_items;
    atomic_init(&job.next, 0);
    job.active = 0;
    job.prev = job.nxt = NULL;
    if (n_threads <= 1 || cgru_pool_worker_flag) {   /* serial (and never nested) */
        cgru_run_items(&job);
        return 0;
    }
    pthread_cond_init(&job.idle, NULL);
    pthread_mutex_lock(&cgru_pool.lock);
    cgru_pool_grow(n_threads - 1);
    job.wanted = n_threads - 1;
    job.prev = cgru_pool.tail;
    if (cgru_pool.tail) cgru_pool.tail->nxt = &job; else cgru_pool.head = &job;
    cgru_pool.tail = &job;
    if (job.wanted == 1) pthread_cond_signal(&cgru_pool.work);
    else pthread_cond_broadcast(&cgru_pool.work);
    pthread_mutex_unlock(&cgru_pool.lock);

    cgru_run_items(&job);

    pthread_mutex_lock(&cgru_pool.lock);
    if (job.wanted > 0)                    /* no more joiners: every item is handed out */
        cgru_pool_unlink(&job);
    job.wanted = 0;
    while (job.active > 0) {
        if (poll == NULL) {
            pthread_cond_wait(&job.idle, &cgru_pool.lock);
            continue;
        }
        struct timespec ts;
        cgru_deadline(&ts, CGRU_POLL_WAIT_NS);
        int rc = pthread_cond_timedwait(&job.idle, &cgru_pool.lock, &ts);
        if (rc == ETIMEDOUT && job.active > 0) {
            pthread_mutex_unlock(&cgru_pool.lock);
            poll(poll_ctx);
            pthread_mutex_lock(&cgru_pool.lock);
        }
    }
    pthread_mutex_unlock(&cgru_pool.lock);
    pthread_cond_destroy(&job.idle);
    return 0;
}

/* Workers alive in this process (for tests of the fork behaviour). */
static int cgru_pool_size(void)
{
    pthread_mutex_lock(&cgru_pool.lock);
    int n = cgru_pool.n_workers;
    pthread_mutex_unlock(&cgru_pool.lock);
    return n;
}

#endif /* CGRU_POOL_H */
