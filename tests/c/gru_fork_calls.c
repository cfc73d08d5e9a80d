/*
 * gru_fork_calls.c — fork() while another thread of the program is inside a cgru call, or is
 * making the process's first cgru call (setting libcgru's runtime up), or before any call.
 * Every child must finish (a child that hangs is killed after TIMEOUT seconds and reported).
 *
 *   busy [FORKS]   a thread makes the first call (the set-up) and computes the reference, then
 *                  a worker thread calls cgru_rnn_forward back to back (desc->num_threads = 0,
 *                  a problem whose work is split over threads) while the main thread forks
 *                  FORKS times (default 20), each time once the worker has entered a new call;
 *                  every child runs the same forward and must get bitwise the parent's y and hy,
 *                  the worker's results too.
 *   churn [FORKS]  like busy, but every call is made by a thread of its own that makes that one
 *                  call and ends (threads that come and go, as in a host's pool that grows and
 *                  shrinks): two spawner threads start such threads back to back (three small
 *                  calls to a forward) while the main thread forks FORKS times (default 20),
 *                  each time once a new thread has entered its call.  A fork must not catch
 *                  one of them while Python registers or removes its thread state (the child
 *                  would wait in CPython's re-initialisation forever).  Then the interpreter
 *                  must hold no thread state of the threads that ended (each is deleted as its
 *                  thread ends).
 *   churn-python   churn, each fork made the way Python's os.fork makes it (the GIL, then
 *                  PyOS_BeforeFork; PyOS_AfterFork_Child or _Parent after), as a Python process
 *                  whose other threads call cgru would fork.
 *   setup          a worker thread makes the process's first call; the main thread forks while
 *                  that call is setting the runtime up: the child's call must return
 *                  CGRU_STATUS_RUNTIME_UNAVAILABLE naming the fork (not hang).  The program holds
 *                  the set-up at one point through a pipe: $CGRU_TEST_SETUP_GATE is set to
 *                  "READY_FD,RELEASE_FD" for the embedded Python, whose sitecustomize (written by
 *                  the test) writes a byte to READY_FD at that point and waits for one on
 *                  RELEASE_FD.  Then, after the set-up, a second child must compute bitwise the
 *                  worker's result.
 *   fresh          fork before any cgru call: the child starts its own runtime, the parent too;
 *                  both results must be bitwise equal.
 *
 * Prints "fork_calls <mode>: OK (...)" and exits 0 on success; on failure says why, exits 1.
 *
 *   cc -Wall -Wextra -Werror -std=c99 -pthread gru_fork_calls.c -o gru_fork_calls \
 *      $(python -m cgru --cflags --libs)
 *   ./gru_fork_calls busy|churn|churn-python|setup|fresh [FORKS] [TIMEOUT seconds, default 60]
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
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

enum { T = 16, N = 64, I = 16, H = 64, L = 2 };
enum { X_N = T * N * I, Y_N = T * N * H, H_N = L * N * H };

/* child exit codes */
enum { CHILD_OK = 0, CHILD_CALL_FAILED = 3, CHILD_DIFFERS = 4, CHILD_NOT_REFUSED = 5 };

static cgru_rnn_desc_t desc;
static size_t weight_bytes;
static float *weights;
static float x[X_N], hx[H_N];
static float want_y[Y_N], want_hy[H_N];   /* the reference result */
static int timeout_seconds = 60;
static int fork_as_python;   /* fork() inside Python's own fork protocol (churn-python) */

/* ---- the problem ---------------------------------------------------------------------- */
static void describe(void)
{
    CHECK(cgru_rnn_desc_init(&desc));
    desc.input_size = I;
    desc.hidden_size = H;
    desc.num_layers = L;
    desc.num_threads = 0;                             /* every usable core */
}

/* The weights, x and hx from a fixed seed (needs the weight space size). */
static void fill_inputs(void)
{
    uint64_t rng = 29;
    weights = xmalloc(weight_bytes);
    fill_random(weights, weight_bytes / sizeof(float), CGRU_DATA_FLOAT, &rng, 0.3);
    fill_random(x, X_N, CGRU_DATA_FLOAT, &rng, 1.0);
    fill_random(hx, H_N, CGRU_DATA_FLOAT, &rng, 1.0);
}

static cgru_status_t forward(float *y, float *hy)
{
    return cgru_rnn_forward(&desc, CGRU_FWD_MODE_INFERENCE, CGRU_LAYOUT_TIME_MAJOR, T, N, NULL,
                            x, y, hx, hy, weight_bytes, weights, 0, NULL, 0, NULL);
}

static int is_reference(const float *y, const float *hy)
{
    return memcmp(y, want_y, sizeof want_y) == 0 && memcmp(hy, want_hy, sizeof want_hy) == 0;
}

/* ---- children ------------------------------------------------------------------------- */
/* The child's forward must succeed and give the reference result. */
static void child_computes(void)
{
    static float y[Y_N], hy[H_N];
    cgru_status_t st = forward(y, hy);
    if (st != CGRU_STATUS_SUCCESS) {
        fprintf(stderr, "child: cgru_rnn_forward: %s: %s\n", cgru_get_error_string(st),
                cgru_get_last_error_message());
        _exit(CHILD_CALL_FAILED);
    }
    _exit(is_reference(y, hy) ? CHILD_OK : CHILD_DIFFERS);
}

/* The child of a fork during the set-up: every call is refused, naming the fork. */
static void child_is_refused(void)
{
    size_t bytes = 0;
    cgru_status_t st = cgru_get_weight_space_size(&desc, &bytes);
    const char *message = cgru_get_last_error_message();
    if (st != CGRU_STATUS_RUNTIME_UNAVAILABLE || strstr(message, "forked") == NULL) {
        fprintf(stderr, "child: cgru_get_weight_space_size: %s: %s\n",
                cgru_get_error_string(st), message);
        _exit(CHILD_NOT_REFUSED);
    }
    _exit(CHILD_OK);
}

/* A function of the Python C API libcgru loaded (exits if it is not there). */
static void *python_function(const char *name)
{
    void *self = dlopen(NULL, RTLD_NOW);
    void *f = self ? dlsym(self, name) : NULL;
    if (f == NULL) {
        fprintf(stderr, "%s: not found in the process\n", name);
        exit(1);
    }
    return f;
}

/* fork(), or with fork_as_python fork() wrapped as os.fork wraps it. */
static pid_t fork_maybe_as_python(void)
{
    if (!fork_as_python)
        return fork();
    int (*ensure)(void);
    void (*release)(int), (*before)(void), (*parent)(void), (*child)(void);
    *(void **)&ensure = python_function("PyGILState_Ensure");
    *(void **)&release = python_function("PyGILState_Release");
    *(void **)&before = python_function("PyOS_BeforeFork");
    *(void **)&parent = python_function("PyOS_AfterFork_Parent");
    *(void **)&child = python_function("PyOS_AfterFork_Child");
    int gil = ensure();
    before();
    pid_t pid = fork();
    if (pid == 0)
        child();
    else
        parent();
    release(gil);
    return pid;
}

/* fork(); the child runs body (which does not return) under an alarm that ends it even if the
 * parent is gone. */
static pid_t fork_child(void (*body)(void))
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork_maybe_as_python();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        alarm((unsigned)timeout_seconds + 10);
        body();
    }
    return pid;
}

/* Wait for the child at most timeout_seconds (polling waitpid); 1 when it exited with code 0,
 * else 0 with the reason printed. */
static int child_succeeded(pid_t pid, const char *what)
{
    const struct timespec tick = {0, 10 * 1000 * 1000};   /* 10 ms */
    int status = 0;
    for (long waited_ms = 0;; waited_ms += 10) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            break;
        if (r < 0) {
            perror("waitpid");
            return 0;
        }
        if (waited_ms > 1000L * timeout_seconds) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            printf("FAILED: %s: the child did not finish within %d s (hung after fork)\n", what,
                   timeout_seconds);
            return 0;
        }
        nanosleep(&tick, NULL);
    }
    if (WIFSIGNALED(status)) {
        printf("FAILED: %s: the child was killed by signal %d\n", what, WTERMSIG(status));
        return 0;
    }
    int code = WEXITSTATUS(status);
    if (code != CHILD_OK)
        printf("FAILED: %s: the child %s\n", what,
               code == CHILD_DIFFERS ? "computed a different y or hy than the parent"
               : code == CHILD_NOT_REFUSED ? "was not refused with RUNTIME_UNAVAILABLE"
                                           : "could not run the forward (see its message)");
    return code == CHILD_OK;
}

/* ---- busy: forks while a worker is inside calls ---------------------------------------- */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static long calls_entered;        /* by the worker, before each call */
static int stop_worker, worker_failed;

/* A worker is about to make a new call: count it (waking the forking thread), unless told to
 * stop; 0 when it must stop. */
static int enter_new_call(void)
{
    pthread_mutex_lock(&lock);
    int stop = stop_worker;
    if (!stop)
        calls_entered++;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    return !stop;
}

static void *busy_worker(void *unused)
{
    static float y[Y_N], hy[H_N];
    (void)unused;
    for (;;) {
        if (!enter_new_call())
            return NULL;
        cgru_status_t st = forward(y, hy);
        if (st != CGRU_STATUS_SUCCESS || !is_reference(y, hy)) {
            fprintf(stderr, "worker: %s: %s\n", cgru_get_error_string(st),
                    st == CGRU_STATUS_SUCCESS ? "a different result"
                                              : cgru_get_last_error_message());
            pthread_mutex_lock(&lock);
            worker_failed = 1;
            pthread_mutex_unlock(&lock);
        }
    }
}

/* Block until the worker has entered a call after the calls_entered value `after`. */
static long wait_for_new_call(long after)
{
    pthread_mutex_lock(&lock);
    while (calls_entered <= after)
        pthread_cond_wait(&changed, &lock);
    long now = calls_entered;
    pthread_mutex_unlock(&lock);
    return now;
}

/* Fork `forks` times, each once a new call has been entered (stopping at the first child that
 * fails), then tell the workers to stop; 1 when every child succeeded. */
static int fork_during_calls(int forks, const char *what)
{
    int ok = 1;
    long seen = 0;
    for (int k = 0; k < forks && ok; k++) {
        seen = wait_for_new_call(seen);
        ok = child_succeeded(fork_child(child_computes), what);
    }
    pthread_mutex_lock(&lock);
    stop_worker = 1;
    pthread_mutex_unlock(&lock);
    return ok;
}

/* The set-up and the reference, on a thread of their own (so that the forking thread is not
 * the one that started the interpreter). */
static void *reference_maker(void *unused)
{
    (void)unused;
    CHECK(cgru_get_weight_space_size(&desc, &weight_bytes));
    fill_inputs();
    CHECK(forward(want_y, want_hy));
    return NULL;
}

static int run_busy(int forks)
{
    pthread_t worker;
    describe();
    if (pthread_create(&worker, NULL, reference_maker, NULL) != 0 ||
        pthread_join(worker, NULL) != 0 ||
        pthread_create(&worker, NULL, busy_worker, NULL) != 0) {
        perror("pthread_create");
        return 1;
    }
    int ok = fork_during_calls(forks, "a fork during another thread's call");
    pthread_join(worker, NULL);
    static float y[Y_N], hy[H_N];
    CHECK(forward(y, hy));
    if (ok && (worker_failed || !is_reference(y, hy))) {
        printf("FAILED: the parent's calls around the forks gave a different result\n");
        ok = 0;
    }
    if (ok)
        printf("fork_calls busy: OK (%d children forked during the worker's calls computed "
               "bitwise the parent's result; the worker made %ld calls)\n", forks, calls_entered);
    return ok ? 0 : 1;
}

/* ---- churn: forks while threads that each make one call come and go -------------------- */
static void *one_call(void *which)
{
    static float y[2][Y_N], hy[2][H_N];
    int k = (int)(intptr_t)which;   /* 0, 1: a forward into the spawner's y; 2: a small call */
    size_t bytes = 0;
    cgru_status_t st = k < 2 ? forward(y[k], hy[k]) : cgru_get_weight_space_size(&desc, &bytes);
    int bad = st != CGRU_STATUS_SUCCESS ||
              (k < 2 ? !is_reference(y[k], hy[k]) : bytes != weight_bytes);
    if (bad) {
        fprintf(stderr, "a thread's call: %s: %s\n", cgru_get_error_string(st),
                st == CGRU_STATUS_SUCCESS ? "a different result" : cgru_get_last_error_message());
        pthread_mutex_lock(&lock);
        worker_failed = 1;
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

/* Spawner `which` (0 or 1): a new thread for each call, three small calls to a forward. */
static void *spawner(void *which)
{
    for (long i = 0;; i++) {
        pthread_t t;
        void *call = (void *)(i % 4 ? 2 : (intptr_t)which);   /* 3 small calls, 1 forward */
        if (!enter_new_call() || pthread_create(&t, NULL, one_call, call) != 0 ||
            pthread_join(t, NULL) != 0)
            return NULL;
    }
}

/* The number of thread states of the process's (main) Python interpreter. */
static long python_thread_states(void)
{
    void *(*main_interpreter)(void), *(*head)(void *), *(*next)(void *);
    int (*ensure)(void);
    void (*release)(int);
    *(void **)&main_interpreter = python_function("PyInterpreterState_Main");
    *(void **)&head = python_function("PyInterpreterState_ThreadHead");
    *(void **)&next = python_function("PyThreadState_Next");
    *(void **)&ensure = python_function("PyGILState_Ensure");
    *(void **)&release = python_function("PyGILState_Release");
    int gil = ensure();
    long n = 0;
    for (void *t = head(main_interpreter()); t != NULL; t = next(t))
        n++;
    release(gil);
    return n;
}

static int run_churn(int forks)
{
    pthread_t spawners[2], maker;
    describe();
    if (pthread_create(&maker, NULL, reference_maker, NULL) != 0 ||
        pthread_join(maker, NULL) != 0 ||
        pthread_create(&spawners[0], NULL, spawner, (void *)0) != 0 ||
        pthread_create(&spawners[1], NULL, spawner, (void *)1) != 0) {
        perror("pthread_create");
        return 1;
    }
    size_t bytes;
    if (fork_as_python)   /* like a Python thread, this one keeps a thread state: cgru's */
        CHECK(cgru_get_weight_space_size(&desc, &bytes));
    int ok = fork_during_calls(forks, "a fork while threads came and went");
    pthread_join(spawners[0], NULL);
    pthread_join(spawners[1], NULL);
    if (ok && worker_failed) {
        printf("FAILED: a call of the parent's threads failed or gave a different result\n");
        ok = 0;
    }
    /* left: the thread state of the thread that started the interpreter, and this thread's */
    long states = python_thread_states();
    if (ok && states > 2) {
        printf("FAILED: the interpreter holds %ld thread states after %ld threads that made a "
               "call ended (expected at most 2: those of the set-up's thread and this one)\n",
               states, calls_entered);
        ok = 0;
    }
    if (ok)
        printf("fork_calls %s: OK (%d children forked while threads came and went computed "
               "bitwise the parent's result; %ld threads made a call, %ld thread states left)\n",
               fork_as_python ? "churn-python" : "churn", forks, calls_entered, states);
    return ok ? 0 : 1;
}

/* ---- setup: a fork while the first call sets the runtime up ---------------------------- */
static int ready_pipe[2], release_pipe[2];
static cgru_status_t worker_status = CGRU_STATUS_SUCCESS;

static void *first_call_worker(void *unused)
{
    (void)unused;
    cgru_status_t st = cgru_get_weight_space_size(&desc, &weight_bytes);   /* the set-up */
    if (st == CGRU_STATUS_SUCCESS) {
        fill_inputs();
        st = forward(want_y, want_hy);
    }
    if (st != CGRU_STATUS_SUCCESS)
        fprintf(stderr, "worker: %s: %s\n", cgru_get_error_string(st),
                cgru_get_last_error_message());
    worker_status = st;
    return NULL;
}

static int run_setup(void)
{
    char gate[64];
    pthread_t worker;
    describe();
    if (pipe(ready_pipe) != 0 || pipe(release_pipe) != 0) {
        perror("pipe");
        return 1;
    }
    snprintf(gate, sizeof gate, "%d,%d", ready_pipe[1], release_pipe[0]);
    setenv("CGRU_TEST_SETUP_GATE", gate, 1);
    if (pthread_create(&worker, NULL, first_call_worker, NULL) != 0) {
        perror("pthread_create");
        return 1;
    }
    char byte;
    if (read(ready_pipe[0], &byte, 1) != 1) {          /* the worker is inside the set-up */
        printf("FAILED: the set-up never reached the gate (is the test's sitecustomize on "
               "PYTHONPATH?)\n");
        return 1;
    }
    pid_t during = fork_child(child_is_refused);
    if (write(release_pipe[1], "g", 1) != 1) {         /* let the set-up go on */
        perror("write");
        return 1;
    }
    pthread_join(worker, NULL);
    int ok = child_succeeded(during, "a fork during the set-up");
    if (worker_status != CGRU_STATUS_SUCCESS) {
        printf("FAILED: the parent's first call failed after the fork during its set-up\n");
        return 1;
    }
    ok = child_succeeded(fork_child(child_computes), "a fork after the set-up") && ok;
    if (ok)
        printf("fork_calls setup: OK (the child of a fork during the set-up was refused; one "
               "forked after it computed bitwise the parent's result)\n");
    return ok ? 0 : 1;
}

/* ---- fresh: a fork before any call ------------------------------------------------------ */
static int result_pipe[2];

/* FNV-1a of n bytes, continuing from h */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
    return h;
}

static uint64_t digest_of(const float *y, const float *hy)
{
    return fnv1a(fnv1a(14695981039346656037ULL, y, sizeof(float) * Y_N), hy,
                 sizeof(float) * H_N);
}

/* The child makes the process's first call itself and sends the digest of its result. */
static void child_starts_its_own(void)
{
    static float y[Y_N], hy[H_N];
    if (cgru_get_weight_space_size(&desc, &weight_bytes) != CGRU_STATUS_SUCCESS)
        _exit(CHILD_CALL_FAILED);
    fill_inputs();
    if (forward(y, hy) != CGRU_STATUS_SUCCESS)
        _exit(CHILD_CALL_FAILED);
    uint64_t digest = digest_of(y, hy);
    _exit(write(result_pipe[1], &digest, sizeof digest) == sizeof digest ? CHILD_OK
                                                                         : CHILD_CALL_FAILED);
}

static int run_fresh(void)
{
    describe();
    if (pipe(result_pipe) != 0) {
        perror("pipe");
        return 1;
    }
    pid_t pid = fork_child(child_starts_its_own);
    CHECK(cgru_get_weight_space_size(&desc, &weight_bytes));
    fill_inputs();
    CHECK(forward(want_y, want_hy));
    if (!child_succeeded(pid, "a fork before any call"))
        return 1;
    uint64_t child_digest = 0;
    if (read(result_pipe[0], &child_digest, sizeof child_digest) != sizeof child_digest ||
        child_digest != digest_of(want_y, want_hy)) {
        printf("FAILED: a fork before any call: the child computed a different y or hy\n");
        return 1;
    }
    printf("fork_calls fresh: OK (a child forked before any call started its own runtime and "
           "computed bitwise the parent's result)\n");
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "busy";
    int forks = argc > 2 ? atoi(argv[2]) : 20;
    if (argc > 3)
        timeout_seconds = atoi(argv[3]);
    if (strcmp(mode, "busy") == 0)
        return run_busy(forks);
    if (strcmp(mode, "churn") == 0)
        return run_churn(forks);
    if (strcmp(mode, "churn-python") == 0) {
        fork_as_python = 1;
        return run_churn(forks);
    }
    if (strcmp(mode, "setup") == 0)
        return run_setup();
    if (strcmp(mode, "fresh") == 0)
        return run_fresh();
    fprintf(stderr, "usage: %s busy|churn|churn-python|setup|fresh [FORKS] [TIMEOUT]\n", argv[0]);
    return 2;
}
