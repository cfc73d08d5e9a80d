/*
 * gru_after_finalize.c — a program that embeds Python itself (links libpython, starts the
 * interpreter with the python of cgru's environment as its program name), makes a cgru call
 * (libcgru joins that interpreter), then finalises the interpreter and calls cgru again: the
 * second call must return CGRU_STATUS_RUNTIME_UNAVAILABLE, not crash.  Then the interpreter is
 * initialised again and cgru is called once more: that call must return
 * CGRU_STATUS_RUNTIME_UNAVAILABLE as well (NumPy cannot be loaded a second time in one process,
 * so libcgru never uses a second interpreter).  Prints one line per call:
 * "name<TAB>status<TAB>message"; exits 0.
 *
 *   cc -std=c99 gru_after_finalize.c -o gru_after_finalize $(python -m cgru --cflags --libs) \
 *      $(python3-config --embed --cflags --ldflags)
 *   ./gru_after_finalize /path/venv/bin/python
 */
#include <Python.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cgru.h"
#include "common.h"

enum { T = 3, N = 2, I = 3, H = 4 };

static cgru_rnn_desc_t desc;
static float x[T * N * I], y[T * N * H];
static float *weights;
static size_t weight_bytes;

static void report(const char *name, cgru_status_t status)
{
    printf("%s\t%s\t%s\n", name, cgru_get_error_string(status), cgru_get_last_error_message());
    fflush(stdout);
}

static cgru_status_t forward(void)
{
    return cgru_rnn_forward(&desc, CGRU_FWD_MODE_INFERENCE, CGRU_LAYOUT_TIME_MAJOR, T, N, NULL,
                            x, y, NULL, NULL, weight_bytes, weights, 0, NULL, 0, NULL);
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

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PYTHON (the python executable of cgru's environment)\n",
                argv[0]);
        return 2;
    }
    CHECK(cgru_rnn_desc_init(&desc));
    desc.input_size = I;
    desc.hidden_size = H;
    uint64_t rng = 3;
    fill_random(x, T * N * I, CGRU_DATA_FLOAT, &rng, 1.0);

    if (!start_python(argv[1]))
        return 1;
    /* the host holds the GIL here (as after any Py_Initialize); libcgru takes it recursively */
    report("weight_space_size", cgru_get_weight_space_size(&desc, &weight_bytes));
    weights = xmalloc(weight_bytes);
    fill_random(weights, weight_bytes / sizeof(float), CGRU_DATA_FLOAT, &rng, 0.5);
    report("forward_running", forward());

    if (Py_FinalizeEx() != 0)
        fprintf(stderr, "Py_FinalizeEx reported an error\n");
    report("forward_finalised", forward());
    report("weight_space_size_finalised", cgru_get_weight_space_size(&desc, &weight_bytes));

    if (!start_python(argv[1]))
        return 1;
    report("forward_reinitialised", forward());
    Py_FinalizeEx();
    free(weights);
    return 0;
}
