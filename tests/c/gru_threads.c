/*
 * gru_threads.c — 4 threads call cgru at once (the very first calls included, so they also
 * race to start the runtime), each a forward + backward data + backward weights on its own
 * inputs with a shared descriptor and weight space, then each makes a failing call and checks
 * that its thread-local error message is its own.  Then the same work runs serially and every
 * result must be bitwise identical.  Prints "threads: OK" and exits 0 on success.
 *
 * The shapes are arguments (default: T=6 N=9 I=5 H=8 L=2, bidirectional, desc->num_threads 0),
 * so the same program also runs shapes large enough that every call splits its work over
 * threads inside (cgru's own and the BLAS's) while the 4 callers run at once.
 *
 *   cc -Wall -Wextra -Werror -std=c99 -pthread gru_threads.c -o gru_threads \
 *      $(python -m cgru --cflags --libs)
 *   ./gru_threads [T N I H L [num_threads]]
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgru.h"
#include "common.h"

enum { THREADS = 4, ROUNDS = 2, D = 2 };

static int T = 6, N = 9, I = 5, H = 8, L = 2;
static size_t x_n, y_n, h_n;                        /* elements of x, y and the states */
static cgru_rnn_desc_t desc;
static size_t weight_bytes;
static double *weights;
static pthread_barrier_t barrier;

typedef struct job {
    int index;
    int32_t *lengths;
    double *x, *hx, *dy, *dhy;                       /* inputs */
    double *y, *hy, *dx, *dhx;                       /* results */
    double *dw;                                      /* weight gradients */
    char message[256];                               /* own error message, or "" */
    int failed;
} job_t;

static int run(job_t *job)
{
    size_t work_bytes, reserve_bytes;
    cgru_status_t st = cgru_get_temp_space_sizes(&desc, CGRU_FWD_MODE_TRAINING, T, N,
                                                 &work_bytes, &reserve_bytes);
    if (st != CGRU_STATUS_SUCCESS)
        return st;
    void *work = xmalloc(work_bytes), *reserve = xmalloc(reserve_bytes);
    st = cgru_rnn_forward(&desc, CGRU_FWD_MODE_TRAINING, CGRU_LAYOUT_TIME_MAJOR, T, N,
                          job->lengths, job->x, job->y, job->hx, job->hy, weight_bytes, weights,
                          work_bytes, work, reserve_bytes, reserve);
    if (st == CGRU_STATUS_SUCCESS)
        st = cgru_rnn_backward_data(&desc, CGRU_LAYOUT_TIME_MAJOR, T, N, job->lengths, job->dy,
                                    job->dx, job->dhy, job->dhx, weight_bytes, weights,
                                    work_bytes, work, reserve_bytes, reserve);
    if (st == CGRU_STATUS_SUCCESS)
        st = cgru_rnn_backward_weights(&desc, CGRU_WGRAD_MODE_SET, CGRU_LAYOUT_TIME_MAJOR, T, N,
                                       job->lengths, weight_bytes, job->dw, work_bytes, work,
                                       reserve_bytes, reserve);
    free(work);
    free(reserve);
    return st;
}

static void *thread_main(void *arg)
{
    job_t *job = arg;
    pthread_barrier_wait(&barrier);                  /* start together */
    for (int round = 0; round < ROUNDS && !job->failed; round++) {
        cgru_status_t st = run(job);
        if (st != CGRU_STATUS_SUCCESS) {
            fprintf(stderr, "thread %d: %s: %s\n", job->index, cgru_get_error_string(st),
                    cgru_get_last_error_message());
            job->failed = 1;
        }
    }
    /* a failing call of this thread's own kind, then wait until every thread made one */
    size_t bytes;
    cgru_rnn_desc_t bad = desc;
    bad.hidden_size = -100 - job->index;
    cgru_get_weight_space_size(&bad, &bytes);
    pthread_barrier_wait(&barrier);
    snprintf(job->message, sizeof job->message, "%s", cgru_get_last_error_message());
    return NULL;
}

static double *new_doubles(size_t n)
{
    return xmalloc(n * sizeof(double));
}

static void make_job(job_t *job, int index)
{
    uint64_t rng = 1000 + (uint64_t)index;
    memset(job, 0, sizeof *job);
    job->index = index;
    job->lengths = xmalloc((size_t)N * sizeof(int32_t));
    for (int b = 0; b < N; b++)
        job->lengths[b] = (int32_t)((b * 5 + index) % (T + 1));
    job->x = new_doubles(x_n);
    job->hx = new_doubles(h_n);
    job->dy = new_doubles(y_n);
    job->dhy = new_doubles(h_n);
    fill_random(job->x, x_n, CGRU_DATA_DOUBLE, &rng, 1.0);
    fill_random(job->hx, h_n, CGRU_DATA_DOUBLE, &rng, 1.0);
    fill_random(job->dy, y_n, CGRU_DATA_DOUBLE, &rng, 1.0);
    fill_random(job->dhy, h_n, CGRU_DATA_DOUBLE, &rng, 1.0);
    job->y = new_doubles(y_n);
    job->hy = new_doubles(h_n);
    job->dx = new_doubles(x_n);
    job->dhx = new_doubles(h_n);
    job->dw = xmalloc(weight_bytes);
}

static void free_job(job_t *job)
{
    double *arrays[] = {job->x, job->hx, job->dy, job->dhy, job->y, job->hy, job->dx, job->dhx,
                        job->dw};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        free(arrays[i]);
    free(job->lengths);
}

static int same(const char *what, int index, const void *a, const void *b, size_t nbytes)
{
    if (memcmp(a, b, nbytes) == 0)
        return 1;
    fprintf(stderr, "thread %d: %s differs from the serial run\n", index, what);
    return 0;
}

int main(int argc, char **argv)
{
    static job_t parallel[THREADS], serial[THREADS];
    pthread_t threads[THREADS];
    int num_threads = 0;

    if (argc != 1 && argc != 6 && argc != 7) {
        fprintf(stderr, "usage: %s [T N I H L [num_threads]]\n", argv[0]);
        return 2;
    }
    if (argc >= 6) {
        T = atoi(argv[1]);
        N = atoi(argv[2]);
        I = atoi(argv[3]);
        H = atoi(argv[4]);
        L = atoi(argv[5]);
        if (argc == 7)
            num_threads = atoi(argv[6]);
        if (T < 1 || N < 1 || I < 1 || H < 1 || L < 1 || num_threads < 0) {
            fprintf(stderr, "T, N, I, H, L: expected ≥ 1, num_threads ≥ 0\n");
            return 2;
        }
    }
    x_n = (size_t)T * N * I;
    y_n = (size_t)T * N * D * H;
    h_n = (size_t)L * D * N * H;

    CHECK(cgru_rnn_desc_init(&desc));                /* needs no runtime */
    desc.data_type = CGRU_DATA_DOUBLE;
    desc.input_size = I;
    desc.hidden_size = H;
    desc.num_layers = L;
    desc.direction = CGRU_BIDIRECTIONAL;
    desc.num_threads = num_threads;
    /* the weight space size by arithmetic, so that the threads make the first runtime calls:
     * per pseudo-layer 3H·width + 3H·H + 6H elements */
    weight_bytes = sizeof(double) *
                   ((size_t)D * (3 * (size_t)H * I + 3 * (size_t)H * H + 6 * (size_t)H) +
                    (size_t)(L - 1) * D * (3 * (size_t)H * D * H + 3 * (size_t)H * H +
                                           6 * (size_t)H));
    weights = xmalloc(weight_bytes);
    uint64_t rng = 99;
    fill_random(weights, weight_bytes / sizeof(double), CGRU_DATA_DOUBLE, &rng, 0.4);

    pthread_barrier_init(&barrier, NULL, THREADS);
    for (int k = 0; k < THREADS; k++) {
        make_job(&parallel[k], k);
        make_job(&serial[k], k);
        if (pthread_create(&threads[k], NULL, thread_main, &parallel[k]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    }
    for (int k = 0; k < THREADS; k++)
        pthread_join(threads[k], NULL);
    pthread_barrier_destroy(&barrier);

    size_t check_bytes;
    CHECK(cgru_get_weight_space_size(&desc, &check_bytes));
    if (check_bytes != weight_bytes) {
        fprintf(stderr, "weight space: %lu bytes by arithmetic, %lu by the query\n",
                (unsigned long)weight_bytes, (unsigned long)check_bytes);
        return 1;
    }
    int ok = 1;
    for (int k = 0; k < THREADS; k++) {
        char want[64];
        ok &= !parallel[k].failed;
        CHECK(run(&serial[k]));
        ok &= same("y", k, parallel[k].y, serial[k].y, y_n * sizeof(double));
        ok &= same("hy", k, parallel[k].hy, serial[k].hy, h_n * sizeof(double));
        ok &= same("dx", k, parallel[k].dx, serial[k].dx, x_n * sizeof(double));
        ok &= same("dhx", k, parallel[k].dhx, serial[k].dhx, h_n * sizeof(double));
        ok &= same("dw", k, parallel[k].dw, serial[k].dw, weight_bytes);
        snprintf(want, sizeof want, "got %d", -100 - k);
        if (strstr(parallel[k].message, want) == NULL) {
            fprintf(stderr, "thread %d: last error message is not its own: \"%s\"\n", k,
                    parallel[k].message);
            ok = 0;
        }
        if (k > 0 && memcmp(serial[k].y, serial[0].y, y_n * sizeof(double)) == 0) {
            fprintf(stderr, "threads 0 and %d computed the same y from different inputs\n", k);
            ok = 0;
        }
    }
    for (int k = 0; k < THREADS; k++) {
        free_job(&parallel[k]);
        free_job(&serial[k]);
    }
    free(weights);
    if (!ok)
        return 1;
    printf("threads: OK (%d threads × %d rounds, T=%d N=%d I=%d H=%d L=%d D=%d, num_threads=%d; "
           "results identical to the serial run)\n", THREADS, ROUNDS, T, N, I, H, L, D,
           num_threads);
    return 0;
}
