/*
 * gru_bad_args.c — every class of bad argument, one call each, on an otherwise valid problem.
 * Prints one line per case: "name<TAB>status<TAB>message"; tests/test_capi.py checks each
 * status against the header's documentation and that the message says something.  Positive
 * controls (names ending in _ok) must succeed.  Also prints every status's error string.
 *
 *   ./gru_bad_args
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgru.h"
#include "common.h"

enum { T = 4, N = 3, I = 3, H = 4, L = 2, D = 2 };

static void report(const char *name, cgru_status_t status)
{
    printf("%s\t%s\t%s\n", name, cgru_get_error_string(status), cgru_get_last_error_message());
}

static cgru_rnn_desc_t good;   /* the valid descriptor every case starts from */

static cgru_status_t weight_size_with(cgru_rnn_desc_t desc)
{
    size_t n;
    return cgru_get_weight_space_size(&desc, &n);
}

int main(void)
{
    size_t wbytes, work_bytes, rbytes;
    const int32_t lengths[N] = {4, 1, 3};
    const int32_t other_lengths[N] = {4, 2, 3};
    const int32_t too_long[N] = {4, 5, 3};
    const int32_t negative[N] = {4, -1, 3};

    CHECK(cgru_rnn_desc_init(&good));
    good.input_size = I;
    good.hidden_size = H;
    good.num_layers = L;
    good.direction = CGRU_BIDIRECTIONAL;
    CHECK(cgru_get_weight_space_size(&good, &wbytes));
    CHECK(cgru_get_temp_space_sizes(&good, CGRU_FWD_MODE_TRAINING, T, N, &work_bytes, &rbytes));

    size_t x_n = (size_t)T * N * I, y_n = (size_t)T * N * D * H, h_n = (size_t)L * D * N * H;
    float *w = xmalloc(wbytes), *dw = xmalloc(wbytes), *x = xmalloc(x_n * sizeof(float) + 8);
    float *y = xmalloc(y_n * sizeof(float)), *dx = xmalloc(x_n * sizeof(float));
    float *dy = xmalloc(y_n * sizeof(float)), *hy = xmalloc(h_n * sizeof(float));
    void *work = xmalloc(work_bytes), *reserve = xmalloc(rbytes), *blank = xmalloc(rbytes);
    uint64_t rng = 7;
    fill_random(w, wbytes / sizeof(float), CGRU_DATA_FLOAT, &rng, 0.5);
    fill_random(x, x_n, CGRU_DATA_FLOAT, &rng, 1.0);
    fill_random(dy, y_n, CGRU_DATA_FLOAT, &rng, 1.0);
    memset(blank, 0, rbytes);
    cgru_rnn_desc_t d;
    void *m_addr, *b_addr;

    /* --- the descriptor ------------------------------------------------------------------- */
    report("desc_init_null", cgru_rnn_desc_init(NULL));
    report("desc_null", cgru_get_weight_space_size(NULL, &wbytes));
    d = good; d.struct_size = 0;            report("desc_not_initialised", weight_size_with(d));
    report("size_out_null", cgru_get_weight_space_size(&good, NULL));
    d = good; d.data_type = 7;              report("data_type_unknown", weight_size_with(d));
    d = good; d.data_type = CGRU_DATA_HALF; report("data_type_half", weight_size_with(d));
    d = good; d.hidden_size = 0;            report("hidden_size_zero", weight_size_with(d));
    d = good; d.input_size = -3;            report("input_size_negative", weight_size_with(d));
    d = good; d.num_layers = 0;             report("num_layers_zero", weight_size_with(d));
    d = good; d.direction = 3;              report("direction_unknown", weight_size_with(d));
    d = good; d.input_mode = 2;             report("input_mode_unknown", weight_size_with(d));
    d = good; d.input_mode = CGRU_SKIP_INPUT; report("skip_input_size_mismatch",
                                                     weight_size_with(d));
    d = good; d.reset_after = 2;            report("reset_after_not_bool", weight_size_with(d));
    d = good; d.num_threads = -1;           report("num_threads_negative", weight_size_with(d));
    d = good; d.dropout = 1.0;              report("dropout_one", weight_size_with(d));
    d = good; d.dropout = -0.5;             report("dropout_negative", weight_size_with(d));
    d = good; d.dropout = nan("");          report("dropout_nan", weight_size_with(d));

    /* --- size queries and the weight accessor ---------------------------------------------- */
    report("temp_fwd_mode_unknown",
           cgru_get_temp_space_sizes(&good, (cgru_fwd_mode_t)5, T, N, &work_bytes, &rbytes));
    report("temp_seq_length_zero",
           cgru_get_temp_space_sizes(&good, CGRU_FWD_MODE_TRAINING, 0, N, NULL, &rbytes));
    report("temp_batch_negative",
           cgru_get_temp_space_sizes(&good, CGRU_FWD_MODE_TRAINING, T, -2, NULL, &rbytes));
    report("temp_outputs_null_ok",
           cgru_get_temp_space_sizes(&good, CGRU_FWD_MODE_TRAINING, T, N, NULL, NULL));
    report("params_pseudo_layer_too_big",
           cgru_get_weight_params(&good, L * D, wbytes, w, 0, &m_addr, NULL, &b_addr, NULL));
    report("params_pseudo_layer_negative",
           cgru_get_weight_params(&good, -1, wbytes, w, 0, &m_addr, NULL, &b_addr, NULL));
    report("params_lin_layer_id_6",
           cgru_get_weight_params(&good, 0, wbytes, w, 6, &m_addr, NULL, &b_addr, NULL));
    report("params_weight_space_null",
           cgru_get_weight_params(&good, 0, wbytes, NULL, 0, &m_addr, NULL, &b_addr, NULL));
    report("params_weight_space_too_small",
           cgru_get_weight_params(&good, 0, wbytes - 1, w, 0, &m_addr, NULL, &b_addr, NULL));
    report("params_outputs_null_ok",
           cgru_get_weight_params(&good, 0, wbytes, w, 0, NULL, NULL, NULL, NULL));

    /* --- forward -------------------------------------------------------------------------- */
#define FWD(mode, layout, t, lens, xp, yp, wsize, wp, rsize, rp)                                \
    cgru_rnn_forward(&good, mode, layout, t, N, lens, xp, yp, NULL, hy, wsize, wp, work_bytes, \
                     work, rsize, rp)
    const cgru_fwd_mode_t TR = CGRU_FWD_MODE_TRAINING;
    const cgru_layout_t TM = CGRU_LAYOUT_TIME_MAJOR;
    report("fwd_desc_null", cgru_rnn_forward(NULL, TR, TM, T, N, lengths, x, y, NULL, hy,
                                             wbytes, w, work_bytes, work, rbytes, reserve));
    report("fwd_x_null", FWD(TR, TM, T, lengths, NULL, y, wbytes, w, rbytes, reserve));
    report("fwd_y_null", FWD(TR, TM, T, lengths, x, NULL, wbytes, w, rbytes, reserve));
    report("fwd_weight_space_null", FWD(TR, TM, T, lengths, x, y, wbytes, NULL, rbytes, reserve));
    report("fwd_weight_space_too_small",
           FWD(TR, TM, T, lengths, x, y, wbytes - 1, w, rbytes, reserve));
    report("fwd_reserve_null", FWD(TR, TM, T, lengths, x, y, wbytes, w, rbytes, NULL));
    report("fwd_reserve_too_small", FWD(TR, TM, T, lengths, x, y, wbytes, w, rbytes - 1, reserve));
    report("fwd_mode_unknown",
           FWD((cgru_fwd_mode_t)2, TM, T, lengths, x, y, wbytes, w, rbytes, reserve));
    report("fwd_layout_unknown",
           FWD(TR, (cgru_layout_t)9, T, lengths, x, y, wbytes, w, rbytes, reserve));
    report("fwd_seq_length_zero", FWD(TR, TM, 0, NULL, x, y, wbytes, w, rbytes, reserve));
    report("fwd_length_above_T", FWD(TR, TM, T, too_long, x, y, wbytes, w, rbytes, reserve));
    report("fwd_length_negative", FWD(TR, TM, T, negative, x, y, wbytes, w, rbytes, reserve));
    report("fwd_x_misaligned", FWD(TR, TM, T, lengths, (const void *)((char *)x + 1), y, wbytes,
                                   w, rbytes, reserve));
    report("fwd_inference_reserve_null_ok",
           FWD(CGRU_FWD_MODE_INFERENCE, TM, T, lengths, x, y, wbytes, w, 0, NULL));
    report("fwd_training_ok", FWD(TR, TM, T, lengths, x, y, wbytes, w, rbytes, reserve));

    /* --- backward ------------------------------------------------------------------------- */
#define BWD(layout, lens, dxp, wp, rsize, rp)                                                   \
    cgru_rnn_backward_data(&good, layout, T, N, lens, dy, dxp, NULL, NULL, wbytes, wp,          \
                           work_bytes, work, rsize, rp)
#define BWW(mode, dwsize, dwp, rp)                                                             \
    cgru_rnn_backward_weights(&good, mode, TM, T, N, lengths, dwsize, dwp, work_bytes, work,   \
                              rbytes, rp)
    report("bww_before_backward_data", BWW(CGRU_WGRAD_MODE_SET, wbytes, dw, reserve));
    report("bwd_dx_null", BWD(TM, lengths, NULL, w, rbytes, reserve));
    report("bwd_weight_space_null", BWD(TM, lengths, dx, NULL, rbytes, reserve));
    report("bwd_reserve_null", BWD(TM, lengths, dx, w, rbytes, NULL));
    report("bwd_reserve_too_small", BWD(TM, lengths, dx, w, rbytes - 1, reserve));
    report("bwd_reserve_never_written", BWD(TM, lengths, dx, w, rbytes, blank));
    report("bwd_other_lengths", BWD(TM, other_lengths, dx, w, rbytes, reserve));
    report("bwd_other_layout", BWD(CGRU_LAYOUT_BATCH_MAJOR, lengths, dx, w, rbytes, reserve));
    report("bwd_ok", BWD(TM, lengths, dx, w, rbytes, reserve));
    report("bww_mode_unknown", BWW((cgru_wgrad_mode_t)4, wbytes, dw, reserve));
    report("bww_dweight_space_null", BWW(CGRU_WGRAD_MODE_SET, wbytes, NULL, reserve));
    report("bww_dweight_space_too_small", BWW(CGRU_WGRAD_MODE_SET, wbytes - 1, dw, reserve));
    report("bww_reserve_null", BWW(CGRU_WGRAD_MODE_SET, wbytes, dw, NULL));
    report("bww_ok", BWW(CGRU_WGRAD_MODE_SET, wbytes, dw, reserve));

    /* --- error strings ---------------------------------------------------------------------- */
    for (int s = 0; s <= 7; s++)
        printf("error_string_%d\t%s\n", s, cgru_get_error_string((cgru_status_t)s));

    free(w); free(dw); free(x); free(y); free(dx); free(dy); free(hy); free(work);
    free(reserve); free(blank);
    return 0;
}
