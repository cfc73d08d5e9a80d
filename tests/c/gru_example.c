/*
 * gru_example.c — the whole C ABI on a 2-layer bidirectional GRU with variable lengths:
 * size queries, weights filled through cgru_get_weight_params, forward (inference and
 * training), backward data, backward weights (SET, then ADD).  Every input and result goes to
 * a file that tests/test_capi.py compares with cgru's Python API.
 *
 *   cc -Wall -Wextra -Werror -std=c99 gru_example.c -o gru_example \
 *      $(python -m cgru --cflags --libs)
 *   ./gru_example float|double time|batch results.bin
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgru.h"
#include "common.h"

enum { T = 5, N = 5, I = 3, H = 4, L = 2, D = 2 };

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s float|double time|batch results.bin\n", argv[0]);
        return 2;
    }
    int32_t data_type = strcmp(argv[1], "double") == 0 ? CGRU_DATA_DOUBLE : CGRU_DATA_FLOAT;
    cgru_layout_t layout = strcmp(argv[2], "batch") == 0 ? CGRU_LAYOUT_BATCH_MAJOR
                                                         : CGRU_LAYOUT_TIME_MAJOR;
    size_t item = data_type == CGRU_DATA_DOUBLE ? sizeof(double) : sizeof(float);
    const int32_t seq_lengths[N] = {5, 2, 0, 4, 1};   /* any order; 0 is allowed */

    /* a library runs programs built against headers of its major version and a minor
     * version up to its own */
    if (cgru_get_version() / 10000 != CGRU_VERSION_MAJOR || cgru_get_version() < CGRU_VERSION) {
        fprintf(stderr, "header version %d, library version %d\n", CGRU_VERSION,
                cgru_get_version());
        return 1;
    }

    /* 1. the descriptor */
    cgru_rnn_desc_t desc;
    CHECK(cgru_rnn_desc_init(&desc));
    desc.data_type = data_type;
    desc.input_size = I;
    desc.hidden_size = H;
    desc.num_layers = L;
    desc.direction = CGRU_BIDIRECTIONAL;

    /* 2. sizes (bytes) */
    size_t weight_bytes, work_inference, reserve_inference, work_training, reserve_training;
    CHECK(cgru_get_weight_space_size(&desc, &weight_bytes));
    CHECK(cgru_get_temp_space_sizes(&desc, CGRU_FWD_MODE_INFERENCE, T, N, &work_inference,
                                    &reserve_inference));
    CHECK(cgru_get_temp_space_sizes(&desc, CGRU_FWD_MODE_TRAINING, T, N, &work_training,
                                    &reserve_training));
    size_t x_n = (size_t)T * N * I, y_n = (size_t)T * N * D * H, h_n = (size_t)L * D * N * H;
    unsigned char *weights = xmalloc(weight_bytes), *dweights = xmalloc(weight_bytes);
    void *x = xmalloc(x_n * item), *y = xmalloc(y_n * item), *dx = xmalloc(x_n * item);
    void *dy = xmalloc(y_n * item), *y_inf = xmalloc(y_n * item);
    void *hx = xmalloc(h_n * item), *hy = xmalloc(h_n * item), *hy_inf = xmalloc(h_n * item);
    void *dhy = xmalloc(h_n * item), *dhx = xmalloc(h_n * item);
    void *work = xmalloc(work_training), *reserve = xmalloc(reserve_training);

    /* 3. weights: every matrix and bias through the accessor (the rest stays 0xFF = NaN) */
    uint64_t rng = 42;
    int64_t where[L * D * 6 * 5];  /* per (pseudo-layer, ID): m offset, rows, cols, b offset, len */
    memset(weights, 0xFF, weight_bytes);
    for (int32_t layer = 0; layer < L * D; layer++) {
        for (int32_t id = 0; id < 6; id++) {
            void *m, *b;
            int32_t m_dims[2], b_dim;
            CHECK(cgru_get_weight_params(&desc, layer, weight_bytes, weights, id, &m, m_dims,
                                         &b, &b_dim));
            if (m != NULL)
                fill_random(m, (size_t)m_dims[0] * m_dims[1], data_type, &rng, 0.5);
            fill_random(b, (size_t)b_dim, data_type, &rng, 0.5);
            int64_t *w = where + (layer * 6 + id) * 5;
            w[0] = m ? (int64_t)((unsigned char *)m - weights) : -1;
            w[1] = m_dims[0];
            w[2] = m_dims[1];
            w[3] = (int64_t)((unsigned char *)b - weights);
            w[4] = b_dim;
        }
    }

    /* 4. inputs and output gradients */
    fill_random(x, x_n, data_type, &rng, 1.0);
    fill_random(hx, h_n, data_type, &rng, 1.0);
    fill_random(dy, y_n, data_type, &rng, 1.0);
    fill_random(dhy, h_n, data_type, &rng, 1.0);

    /* 5. forward: inference (no reserve space), then training */
    CHECK(cgru_rnn_forward(&desc, CGRU_FWD_MODE_INFERENCE, layout, T, N, seq_lengths, x, y_inf,
                           hx, hy_inf, weight_bytes, weights, work_inference, work, 0, NULL));
    CHECK(cgru_rnn_forward(&desc, CGRU_FWD_MODE_TRAINING, layout, T, N, seq_lengths, x, y, hx,
                           hy, weight_bytes, weights, work_training, work, reserve_training,
                           reserve));

    /* 6. backward: data first (it also computes the weight gradients), then weights */
    CHECK(cgru_rnn_backward_data(&desc, layout, T, N, seq_lengths, dy, dx, dhy, dhx,
                                 weight_bytes, weights, work_training, work, reserve_training,
                                 reserve));
    CHECK(cgru_rnn_backward_weights(&desc, CGRU_WGRAD_MODE_SET, layout, T, N, seq_lengths,
                                    weight_bytes, dweights, work_training, work,
                                    reserve_training, reserve));
    FILE *f = fopen(argv[3], "wb");
    if (f == NULL) {
        perror(argv[3]);
        return 1;
    }
    dump_real(f, "dw", data_type, dweights, weight_bytes / item);
    CHECK(cgru_rnn_backward_weights(&desc, CGRU_WGRAD_MODE_ADD, layout, T, N, seq_lengths,
                                    weight_bytes, dweights, work_training, work,
                                    reserve_training, reserve));
    dump_real(f, "dw_twice", data_type, dweights, weight_bytes / item);

    /* 7. everything else */
    int64_t sizes[5] = {(int64_t)weight_bytes, (int64_t)work_inference,
                        (int64_t)reserve_inference, (int64_t)work_training,
                        (int64_t)reserve_training};
    dump(f, "sizes", 3, sizes, 5);
    dump(f, "where", 3, where, L * D * 6 * 5);
    dump(f, "seq_lengths", 2, seq_lengths, N);
    dump_real(f, "weights", data_type, weights, weight_bytes / item);
    dump_real(f, "x", data_type, x, x_n);
    dump_real(f, "hx", data_type, hx, h_n);
    dump_real(f, "dy", data_type, dy, y_n);
    dump_real(f, "dhy", data_type, dhy, h_n);
    dump_real(f, "y_inf", data_type, y_inf, y_n);
    dump_real(f, "hy_inf", data_type, hy_inf, h_n);
    dump_real(f, "y", data_type, y, y_n);
    dump_real(f, "hy", data_type, hy, h_n);
    dump_real(f, "dx", data_type, dx, x_n);
    dump_real(f, "dhx", data_type, dhx, h_n);
    fclose(f);

    printf("cgru %d: 2-layer bidirectional GRU, %s, %s-major, T=%d N=%d I=%d H=%d: weight space "
           "%lu bytes, training reserve %lu bytes; forward, backward data and backward weights "
           "OK\n", cgru_get_version(), argv[1], argv[2], T, N, I, H,
           (unsigned long)weight_bytes, (unsigned long)reserve_training);
    free(weights); free(dweights); free(x); free(y); free(dx); free(dy); free(y_inf);
    free(hx); free(hy); free(hy_inf); free(dhy); free(dhx); free(work); free(reserve);
    return 0;
}
