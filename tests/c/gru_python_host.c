/*
 * gru_python_host.c — a program that embeds Python itself (links libpython, starts the
 * interpreter with the python of cgru's environment as its program name; libcgru joins it)
 * and finalises it, or forks, while other threads are inside cgru calls.
 *
 *   finalize       WORKERS threads (default 2) call cgru_rnn_forward back to back, each
 *                  checking every result bitwise against the main thread's.  The first call
 *                  to reach cgru.capi.rnn_forward is held there (the host wraps that function)
 *                  until Py_FinalizeEx runs the atexit callbacks (the host's, registered after
 *                  libcgru's, runs first and releases it), so at least that call is in flight
 *                  while the interpreter is being finalised.  Once the held call is inside and
 *                  every other worker has made MIN_CALLS calls, the main thread runs
 *                  Py_FinalizeEx.  Every worker must get its calls back: each one SUCCESS with
 *                  the reference result until the first CGRU_STATUS_RUNTIME_UNAVAILABLE (then it
 *                  stops).  A worker that CPython ended inside a call is reported.  Then a call
 *                  from the main thread must return CGRU_STATUS_RUNTIME_UNAVAILABLE.
 *   fork-with-gil  the main thread holds the GIL (as after Py_Initialize); a worker thread
 *                  enters a cgru call (it waits for the GIL inside); the main thread forks
 *                  FORKS times (default 3).  Each child (the main thread holds the GIL there
 *                  too) runs the forward, which must give the reference result, and finalises
 *                  its interpreter (which must not wait for the parent's worker).  Then the
 *                  main thread releases the GIL and the worker's call must give the reference.
 *
 * Prints "python_host <mode>: OK (...)" and exits 0 on success; else says why and exits 1.
 *
 *   cc -std=c99 -pthread gru_python_host.c -o gru_python_host \
 *      $(python -m cgru --cflags --libs) $(python3-config --embed --cflags --ldflags)
 *   ./gru_python_host /path/venv/bin/python finalize|fork-with-gil [COUNT] [TIMEOUT s]
 */
#define _POSIX_C_SOURCE 200809L
#include <Python.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cgru.h"
#include "common.h"

enum { T = 8, N = 32, I = 8, H = 32 };
enum { X_N = T * N * I, Y_N = T * N * H, H_N = N * H };
enum { MAX_WORKERS = 8, MIN_CALLS = 3 };

static cgru_rnn_desc_t desc;
static size_t weight_bytes;
static float *weights;
static float x[X_N], want_y[Y_N], want_hy[H_N];
static int timeout_seconds = 60;

static cgru_status_t forward(float *y, float *hy)
{
    return cgru_rnn_forward(&desc, CGRU_FWD_MODE_INFERENCE, CGRU_LAYOUT_TIME_MAJOR, T, N, NULL,
                            x, y, NULL, hy, weight_bytes, weights, 0, NULL, 0, NULL);
}

static int is_reference(const float *y, const float *hy)
{
    return memcmp(y, want_y, sizeof want_y) == 0 && memcmp(hy, want_hy, sizeof want_hy) == 0;
}

static int start_python(const char *program)
{
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.parse_argv = 0;
    PyStatus status = PyConfig_SetBytesString(&config, &config.program_name, program);
    if (!PyStatus_Exception(status))
        status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        fprintf(stderr, "cannot start Python: %s\n", status.err_msg ? status.err_msg : "?");
        return 0;
    }
    return 1;
}

/* The descriptor, weights and x, and the reference forward (libcgru joins the interpreter:
 * the main thread holds the GIL, libcgru takes it recursively). */
static void set_up_problem(void)
{
    uint64_t rng = 41;
    CHECK(cgru_rnn_desc_init(&desc));
    desc.input_size = I;
    desc.hidden_size = H;
    CHECK(cgru_get_weight_space_size(&desc, &weight_bytes));
    weights = xmalloc(weight_bytes);
    fill_random(weights, weight_bytes / sizeof(float), CGRU_DATA_FLOAT, &rng, 0.4);
    fill_random(x, X_N, CGRU_DATA_FLOAT, &rng, 1.0);
    CHECK(forward(want_y, want_hy));
}

/* ---- finalize ------------------------------------------------------------------------- */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int finalising;            /* set by the main thread just before Py_FinalizeEx */

typedef struct worker {
    pthread_t thread;
    long calls, in_flight_at_finalise;   /* calls begun before Py_FinalizeEx, ended after */
    cgru_status_t last;
    int returned;                        /* the thread left its loop (was not ended inside) */
    int wrong;                           /* a result differed, or an unexpected status */
    float y[Y_N], hy[H_N];
} worker_t;

static void *finalize_worker(void *arg)
{
    worker_t *w = arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        int began_before = !finalising;
        pthread_mutex_unlock(&lock);
        cgru_status_t st = forward(w->y, w->hy);
        pthread_mutex_lock(&lock);
        w->last = st;
        if (st == CGRU_STATUS_SUCCESS) {
            w->calls++;
            w->wrong |= !is_reference(w->y, w->hy);
            w->in_flight_at_finalise += began_before && finalising;
        } else if (st != CGRU_STATUS_RUNTIME_UNAVAILABLE ||
                   strstr(cgru_get_last_error_message(), "Py_Finalize") == NULL) {
            fprintf(stderr, "worker: %s: %s\n", cgru_get_error_string(st),
                    cgru_get_last_error_message());
            w->wrong = 1;
        }
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&lock);
        if (st != CGRU_STATUS_SUCCESS)
            break;
    }
    pthread_mutex_lock(&lock);
    w->returned = 1;
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* Successful calls of all workers (lock held). */
static long total_calls(const worker_t *workers, int n)
{
    long calls = 0;
    for (int k = 0; k < n; k++)
        calls += workers[k].calls;
    return calls;
}

/* Wrap cgru.capi.rnn_forward (libcgru looks it up on each call): the first call through it
 * writes a byte on inside_fd, then waits until an atexit callback registered now (after
 * libcgru's, so it runs before it) says the finalisation has begun. */
static int hold_first_forward(int inside_fd)
{
    char code[1024];
    snprintf(code, sizeof code,
             "import atexit, os, threading\n"
             "import cgru.capi as capi\n"
             "finalising, held = threading.Event(), threading.Lock()\n"
             "forward = capi.rnn_forward\n"
             "def held_forward(*args):\n"
             "    if held.acquire(blocking=False):\n"
             "        os.write(%d, b'i')\n"
             "        finalising.wait()\n"
             "    return forward(*args)\n"
             "capi.rnn_forward = held_forward\n"
             "atexit.register(finalising.set)\n", inside_fd);
    return PyRun_SimpleString(code) == 0;
}

static int run_finalize(int n_workers)
{
    static worker_t workers[MAX_WORKERS];
    int inside[2];
    set_up_problem();
    if (pipe(inside) != 0 || !hold_first_forward(inside[1])) {
        printf("FAILED: cannot set the held call up\n");
        return 1;
    }
    PyThreadState *main_state = PyEval_SaveThread();  /* let the workers take the GIL */
    for (int k = 0; k < n_workers; k++)
        if (pthread_create(&workers[k].thread, NULL, finalize_worker, &workers[k]) != 0) {
            perror("pthread_create");
            return 1;
        }
    char byte;
    if (read(inside[0], &byte, 1) != 1) {                  /* the held call is inside */
        perror("read");
        return 1;
    }
    pthread_mutex_lock(&lock);
    while (total_calls(workers, n_workers) < MIN_CALLS * (n_workers - 1))  /* the others */
        pthread_cond_wait(&changed, &lock);
    finalising = 1;
    pthread_mutex_unlock(&lock);
    PyEval_RestoreThread(main_state);
    int finalize_status = Py_FinalizeEx();
    for (int k = 0; k < n_workers; k++)
        pthread_join(workers[k].thread, NULL);

    int ok = 1;
    long in_flight = 0;
    for (int k = 0; k < n_workers; k++) {
        worker_t *w = &workers[k];
        in_flight += w->in_flight_at_finalise;
        if (!w->returned) {
            printf("FAILED: worker %d was ended inside a cgru call (it never returned)\n", k);
            ok = 0;
        } else if (w->wrong || w->last != CGRU_STATUS_RUNTIME_UNAVAILABLE) {
            printf("FAILED: worker %d: a wrong result or status (last %s)\n", k,
                   cgru_get_error_string(w->last));
            ok = 0;
        }
    }
    cgru_status_t after = forward(want_y, want_hy);
    if (after != CGRU_STATUS_RUNTIME_UNAVAILABLE) {
        printf("FAILED: a call after Py_FinalizeEx returned %s\n", cgru_get_error_string(after));
        ok = 0;
    }
    if (finalize_status != 0)
        printf("note: Py_FinalizeEx returned %d\n", finalize_status);
    if (ok && in_flight < 1) {
        printf("FAILED: the held call did not complete with SUCCESS after Py_FinalizeEx "
               "began\n");
        ok = 0;
    }
    if (ok)
        printf("python_host finalize: OK (%d workers got every call back; %ld calls were in "
               "flight when Py_FinalizeEx began)\n", n_workers, in_flight);
    return ok ? 0 : 1;
}

/* ---- fork-with-gil -------------------------------------------------------------------- */
static int worker_entering;           /* the worker is about to make its call */
static cgru_status_t worker_status = CGRU_STATUS_INTERNAL_ERROR;
static float worker_y[Y_N], worker_hy[H_N];

static void *waiting_worker(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&lock);
    worker_entering = 1;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    worker_status = forward(worker_y, worker_hy);  /* waits for the GIL inside */
    return NULL;
}

/* The child: the main thread holds the GIL here too. */
static void child_with_gil(void)
{
    static float y[Y_N], hy[H_N];
    cgru_status_t st = forward(y, hy);
    if (st != CGRU_STATUS_SUCCESS) {
        fprintf(stderr, "child: %s: %s\n", cgru_get_error_string(st),
                cgru_get_last_error_message());
        _exit(3);
    }
    if (!is_reference(y, hy))
        _exit(4);
    if (PyRun_SimpleString("import threading\n"
                           "assert threading.current_thread() is threading.main_thread()\n"))
        _exit(5);
    _exit(Py_FinalizeEx() == 0 ? 0 : 6);
}

static int wait_child(pid_t pid)
{
    const struct timespec tick = {0, 10 * 1000 * 1000};
    int status = 0;
    for (long waited_ms = 0; waitpid(pid, &status, WNOHANG) != pid; waited_ms += 10) {
        if (waited_ms > 1000L * timeout_seconds) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            printf("FAILED: the child did not finish within %d s (hung after fork)\n",
                   timeout_seconds);
            return 0;
        }
        nanosleep(&tick, NULL);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("FAILED: the child %s %d\n", WIFEXITED(status) ? "exited with" : "got signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        return 0;
    }
    return 1;
}

static int run_fork_with_gil(int forks)
{
    pthread_t worker;
    set_up_problem();                     /* the main thread holds the GIL from here on */
    if (pthread_create(&worker, NULL, waiting_worker, NULL) != 0) {
        perror("pthread_create");
        return 1;
    }
    pthread_mutex_lock(&lock);
    while (!worker_entering)
        pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
    int ok = 1;
    for (int k = 0; k < forks && ok; k++) {
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            alarm((unsigned)timeout_seconds + 10);
            child_with_gil();
        }
        ok = wait_child(pid);
    }
    PyThreadState *main_state = PyEval_SaveThread();
    pthread_join(worker, NULL);
    PyEval_RestoreThread(main_state);
    if (ok && (worker_status != CGRU_STATUS_SUCCESS || !is_reference(worker_y, worker_hy))) {
        printf("FAILED: the worker's call: %s\n", cgru_get_error_string(worker_status));
        ok = 0;
    }
    Py_FinalizeEx();
    if (ok)
        printf("python_host fork-with-gil: OK (%d children of a thread holding the GIL computed "
               "the reference and finalised)\n", forks);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s PYTHON finalize|fork-with-gil [COUNT] [TIMEOUT]\n", argv[0]);
        return 2;
    }
    if (argc > 4)
        timeout_seconds = atoi(argv[4]);
    if (!start_python(argv[1]))
        return 1;
    if (strcmp(argv[2], "finalize") == 0) {
        int n = argc > 3 ? atoi(argv[3]) : 2;
        return run_finalize(n < 1 ? 1 : n > MAX_WORKERS ? MAX_WORKERS : n);
    }
    if (strcmp(argv[2], "fork-with-gil") == 0)
        return run_fork_with_gil(argc > 3 ? atoi(argv[3]) : 3);
    fprintf(stderr, "unknown mode %s\n", argv[2]);
    return 2;
}
