/*
 * gru_fork.c — cgru after fork(): the parent runs a forward with desc->num_threads = 0 on a
 * problem big enough that the work is split over threads (T·N = 2048, H = 64: cgru's own
 * threads and the BLAS's have started when it returns), then forks; the child runs the same
 * forward again and must produce bitwise the same y and hy (exit 0), the parent waits for it
 * at most TIMEOUT seconds (polling waitpid) and kills it if it hangs.  Then the parent runs the
 * forward once more (it must still work after the fork).  Prints "fork: OK" and exits 0 on
 * success; on failure says why (child hung, crashed, failed, or differs) and exits 1.
 *
 *   cc -Wall -Wextra -Werror -std=c99 gru_fork.c -o gru_fork $(python -m cgru --cflags --libs)
 *   ./gru_fork [TIMEOUT seconds, default 60]
 */
#define _POSIX_C_SOURCE 200809L
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

enum { T = 32, N = 64, I = 32, H = 64, L = 2, D = 1 };
enum { X_N = T * N * I, Y_N = T * N * D * H, H_N = L * D * N * H };

static cgru_rnn_desc_t desc;
static size_t weight_bytes;
static float *weights;
static float x[X_N], hx[H_N];

static cgru_status_t forward(float *y, float *hy)
{
    return cgru_rnn_forward(&desc, CGRU_FWD_MODE_INFERENCE, CGRU_LAYOUT_TIME_MAJOR, T, N, NULL,
                            x, y, hx, hy, weight_bytes, weights, 0, NULL, 0, NULL);
}

static int same(const float *y, const float *hy, const float *want_y, const float *want_hy)
{
    return memcmp(y, want_y, sizeof(float) * Y_N) == 0 &&
           memcmp(hy, want_hy, sizeof(float) * H_N) == 0;
}

/* The child: the same forward, compared with the parent's result.  Exit codes: 0 equal,
 * 3 the call failed, 4 the results differ. */
static void child(const float *want_y, const float *want_hy)
{
    static float y[Y_N], hy[H_N];
    cgru_status_t st = forward(y, hy);
    if (st != CGRU_STATUS_SUCCESS) {
        fprintf(stderr, "child: cgru_rnn_forward: %s: %s\n", cgru_get_error_string(st),
                cgru_get_last_error_message());
        _exit(3);
    }
    _exit(same(y, hy, want_y, want_hy) ? 0 : 4);
}

/* waitpid with a deadline: 1 with *status set when the child ended, 0 when it did not. */
static int wait_for(pid_t pid, int *status, int timeout_seconds)
{
    const struct timespec tick = {0, 10 * 1000 * 1000};   /* 10 ms */
    for (long waited_ms = 0; waited_ms <= 1000L * timeout_seconds; waited_ms += 10) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid)
            return 1;
        if (r < 0) {
            perror("waitpid");
            return 0;
        }
        nanosleep(&tick, NULL);
    }
    return 0;
}

int main(int argc, char **argv)
{
    static float y[Y_N], hy[H_N], y_again[Y_N], hy_again[H_N];
    int timeout_seconds = argc > 1 ? atoi(argv[1]) : 60;

    CHECK(cgru_rnn_desc_init(&desc));
    desc.input_size = I;
    desc.hidden_size = H;
    desc.num_layers = L;
    desc.num_threads = 0;                             /* every usable core */
    CHECK(cgru_get_weight_space_size(&desc, &weight_bytes));
    weights = xmalloc(weight_bytes);
    uint64_t rng = 17;
    fill_random(weights, weight_bytes / sizeof(float), CGRU_DATA_FLOAT, &rng, 0.3);
    fill_random(x, X_N, CGRU_DATA_FLOAT, &rng, 1.0);
    fill_random(hx, H_N, CGRU_DATA_FLOAT, &rng, 1.0);
    CHECK(forward(y, hy));

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        alarm((unsigned)timeout_seconds + 10);        /* ends it even if the parent is gone */
        child(y, hy);                                 /* does not return */
    }

    int status = 0;
    if (!wait_for(pid, &status, timeout_seconds)) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        printf("fork: FAILED: the child's cgru_rnn_forward did not return within %d s (hung "
               "after fork)\n", timeout_seconds);
        return 1;
    }
    if (WIFSIGNALED(status)) {
        printf("fork: FAILED: the child was killed by signal %d\n", WTERMSIG(status));
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("fork: FAILED: the child %s\n", WEXITSTATUS(status) == 4
                   ? "computed a different y or hy than the parent"
                   : "could not run the forward (see its message)");
        return 1;
    }
    CHECK(forward(y_again, hy_again));
    if (!same(y_again, hy_again, y, hy)) {
        printf("fork: FAILED: the parent's forward after the fork differs from before it\n");
        return 1;
    }
    free(weights);
    printf("fork: OK (the child's forward after fork() is bitwise the parent's)\n");
    return 0;
}
