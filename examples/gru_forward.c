/* A GRU forward from C:  cc gru_forward.c $(python -m cgru --cflags --libs) && ./a.out */
#include <stdio.h>
#include <stdlib.h>
#include "cgru.h"

#define CHECK(call) do { cgru_status_t s = (call); if (s != CGRU_STATUS_SUCCESS) { \
    fprintf(stderr, "%s: %s\n", cgru_get_error_string(s), cgru_get_last_error_message()); \
    return 1; } } while (0)

int main(void) {
    enum { T = 4, N = 2, I = 3, H = 5 };
    cgru_rnn_desc_t desc;
    CHECK(cgru_rnn_desc_init(&desc));     /* float, 1 layer, unidirectional, cuDNN's cell */
    desc.input_size = I;
    desc.hidden_size = H;
    size_t weight_bytes, work_bytes;
    CHECK(cgru_get_weight_space_size(&desc, &weight_bytes));
    CHECK(cgru_get_temp_space_sizes(&desc, CGRU_FWD_MODE_INFERENCE, T, N, &work_bytes, NULL));
    float *w = malloc(weight_bytes), *work = malloc(work_bytes + 1);
    float x[T * N * I], y[T * N * H], hy[N * H];
    for (size_t i = 0; i < weight_bytes / sizeof(float); i++) w[i] = 0.1f * (float)(i % 7) - 0.3f;
    for (int i = 0; i < T * N * I; i++) x[i] = 0.05f * (float)i;
    const int32_t lengths[N] = {4, 2};    /* per sequence; NULL means all T */
    CHECK(cgru_rnn_forward(&desc, CGRU_FWD_MODE_INFERENCE, CGRU_LAYOUT_TIME_MAJOR, T, N, lengths,
                           x, y, NULL, hy, weight_bytes, w, work_bytes, work, 0, NULL));
    for (int i = 0; i < N * H; i++) printf("%.7f%c", hy[i], i % H == H - 1 ? '\n' : ' ');
    free(w); free(work);
    return 0;
}
