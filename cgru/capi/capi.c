/*
 * capi.c — the entry points of include/cgru.h.
 *
 * Thin by design: each function checks only what it dereferences itself (the descriptor, the
 * out-parameters it writes), passes every other argument to cgru/capi.py (pointers as integers,
 * 0 for NULL), which validates them, wraps the buffers as NumPy arrays and runs the engine, and
 * copies the values it returns into the out-parameters.  Status strings live here too; the
 * thread-local last error message in messages.c.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cgru.h"
#include "messages.h"
#include "runtime.h"

CGRU_API const char *cgru_get_error_string(cgru_status_t status)
{
    switch (status) {
    case CGRU_STATUS_SUCCESS: return "CGRU_STATUS_SUCCESS";
    case CGRU_STATUS_BAD_PARAM: return "CGRU_STATUS_BAD_PARAM";
    case CGRU_STATUS_NOT_SUPPORTED: return "CGRU_STATUS_NOT_SUPPORTED";
    case CGRU_STATUS_ALLOC_FAILED: return "CGRU_STATUS_ALLOC_FAILED";
    case CGRU_STATUS_INTERNAL_ERROR: return "CGRU_STATUS_INTERNAL_ERROR";
    case CGRU_STATUS_RUNTIME_UNAVAILABLE: return "CGRU_STATUS_RUNTIME_UNAVAILABLE";
    case CGRU_STATUS_BUFFER_TOO_SMALL: return "CGRU_STATUS_BUFFER_TOO_SMALL";
    }
    return "CGRU_STATUS_UNKNOWN";
}

CGRU_API int cgru_get_version(void)
{
    return CGRU_VERSION;
}

/* ---- the descriptor ------------------------------------------------------------------------ */
/* The size of cgru 0.1's descriptor: everything before cell_mode. */
#define DESC_V1_SIZE offsetof(cgru_rnn_desc_t, cell_mode)

CGRU_API cgru_status_t cgru_rnn_desc_init_size(cgru_rnn_desc_t *desc, size_t struct_size)
{
    if (desc == NULL)
        return cgru__fail(CGRU_STATUS_BAD_PARAM, "desc: NULL; expected a cgru_rnn_desc_t to fill");
    if (struct_size != sizeof(cgru_rnn_desc_t) && struct_size != DESC_V1_SIZE)
        return cgru__fail(CGRU_STATUS_BAD_PARAM,
                          "struct_size: %llu; expected sizeof(cgru_rnn_desc_t) = %llu (or %llu, "
                          "cgru 0.1's descriptor)", (unsigned long long)struct_size,
                          (unsigned long long)sizeof(cgru_rnn_desc_t),
                          (unsigned long long)DESC_V1_SIZE);
    desc->struct_size = struct_size;
    desc->data_type = CGRU_DATA_FLOAT;
    desc->input_size = 0;
    desc->hidden_size = 0;
    desc->num_layers = 1;
    desc->direction = CGRU_UNIDIRECTIONAL;
    desc->input_mode = CGRU_LINEAR_INPUT;
    desc->reset_after = 1;
    desc->num_threads = 0;
    desc->dropout = 0.0;
    desc->seed = 0;
    desc->seed2 = 0;
    if (struct_size >= sizeof(cgru_rnn_desc_t)) {   /* fields since 0.2 */
        desc->cell_mode = CGRU_GRU;
        desc->proj_size = 0;
    }
    cgru__clear_message();
    return CGRU_STATUS_SUCCESS;
}

/* cgru 0.1's entry point (the header's macro of the same name calls _size): writes only the
 * 0.1 fields, the size of the struct such programs allocated. */
CGRU_API cgru_status_t (cgru_rnn_desc_init)(cgru_rnn_desc_t *desc)
{
    return cgru_rnn_desc_init_size(desc, DESC_V1_SIZE);
}

/* The descriptor travels as a tuple: (data_type, input_size, hidden_size, num_layers, direction,
 * input_mode, reset_after, num_threads, dropout, seed, seed2, cell_mode, proj_size) — see
 * cgru/capi/__init__.py _model().  A descriptor of cgru 0.1's size (no cell_mode, proj_size)
 * is a GRU without projection. */
#define DESC_FORMAT "(iiiiiiiidLLii)"
#define DESC_IS_V2(d) ((d)->struct_size >= sizeof(cgru_rnn_desc_t))
#define DESC_ARGS(d)                                                                           \
    (int)(d)->data_type, (int)(d)->input_size, (int)(d)->hidden_size, (int)(d)->num_layers,    \
        (int)(d)->direction, (int)(d)->input_mode, (int)(d)->reset_after,                      \
        (int)(d)->num_threads, (d)->dropout, (long long)(d)->seed, (long long)(d)->seed2,      \
        DESC_IS_V2(d) ? (int)(d)->cell_mode : (int)CGRU_GRU,                                   \
        DESC_IS_V2(d) ? (int)(d)->proj_size : 0

/* pointers and sizes travel as unsigned long long ("K") */
#define PTR(p) ((unsigned long long)(uintptr_t)(p))
#define SIZE(n) ((unsigned long long)(n))

static cgru_status_t check_desc(const cgru_rnn_desc_t *desc)
{
    if (desc == NULL)
        return cgru__fail(CGRU_STATUS_BAD_PARAM,
                          "desc: NULL; expected a descriptor set up with cgru_rnn_desc_init");
    if (desc->struct_size != sizeof(cgru_rnn_desc_t) && desc->struct_size != DESC_V1_SIZE)
        return cgru__fail(CGRU_STATUS_BAD_PARAM,
                          "desc: struct_size is %llu, expected %llu (or %llu, cgru 0.1's "
                          "descriptor): initialise the descriptor with cgru_rnn_desc_init "
                          "before setting its fields",
                          (unsigned long long)desc->struct_size,
                          (unsigned long long)sizeof(cgru_rnn_desc_t),
                          (unsigned long long)DESC_V1_SIZE);
    return CGRU_STATUS_SUCCESS;
}

/* ---- size queries -------------------------------------------------------------------------- */
CGRU_API cgru_status_t cgru_get_weight_space_size(const cgru_rnn_desc_t *desc,
                                                  size_t *weight_space_size)
{
    long long v[1];
    cgru_status_t st = check_desc(desc);
    if (st != CGRU_STATUS_SUCCESS)
        return st;
    if (weight_space_size == NULL)
        return cgru__fail(CGRU_STATUS_BAD_PARAM,
                          "weight_space_size: NULL; expected a size_t to write the size to");
    st = cgru__py_call("weight_space_size", v, 1, "(" DESC_FORMAT ")", DESC_ARGS(desc));
    if (st == CGRU_STATUS_SUCCESS)
        *weight_space_size = (size_t)v[0];
    return st;
}

CGRU_API cgru_status_t cgru_get_temp_space_sizes(const cgru_rnn_desc_t *desc,
                                                 cgru_fwd_mode_t fwd_mode,
                                                 int32_t max_seq_length, int32_t batch_size,
                                                 size_t *work_space_size,
                                                 size_t *reserve_space_size)
{
    long long v[2];
    cgru_status_t st = check_desc(desc);
    if (st != CGRU_STATUS_SUCCESS)
        return st;
    st = cgru__py_call("temp_space_sizes", v, 2, "(" DESC_FORMAT "iii)", DESC_ARGS(desc),
                       (int)fwd_mode, (int)max_seq_length, (int)batch_size);
    if (st == CGRU_STATUS_SUCCESS) {
        if (work_space_size != NULL)
            *work_space_size = (size_t)v[0];
        if (reserve_space_size != NULL)
            *reserve_space_size = (size_t)v[1];
    }
    return st;
}

CGRU_API cgru_status_t cgru_get_weight_params(const cgru_rnn_desc_t *desc, int32_t pseudo_layer,
                                              size_t weight_space_size, const void *weight_space,
                                              int32_t lin_layer_id,
                                              void **m_addr, int32_t m_dims[2],
                                              void **b_addr, int32_t *b_dim)
{
    /* v = {matrix stored (0/1), matrix byte offset, rows, cols, bias byte offset, bias length} */
    long long v[6];
    cgru_status_t st = check_desc(desc);
    if (st != CGRU_STATUS_SUCCESS)
        return st;
    st = cgru__py_call("weight_params", v, 6, "(" DESC_FORMAT "iKKi)", DESC_ARGS(desc),
                       (int)pseudo_layer, SIZE(weight_space_size), PTR(weight_space),
                       (int)lin_layer_id);
    if (st != CGRU_STATUS_SUCCESS)
        return st;
    const char *base = (const char *)weight_space;
    if (m_addr != NULL)
        *m_addr = v[0] ? (void *)(uintptr_t)(base + v[1]) : NULL;
    if (m_dims != NULL) {
        m_dims[0] = (int32_t)v[2];
        m_dims[1] = (int32_t)v[3];
    }
    if (b_addr != NULL)
        *b_addr = v[4] < 0 ? NULL : (void *)(uintptr_t)(base + v[4]);   /* the projection: none */
    if (b_dim != NULL)
        *b_dim = (int32_t)v[5];
    return st;
}

/* ---- forward and backward ------------------------------------------------------------------ */
CGRU_API cgru_status_t cgru_rnn_forward_ex(const cgru_rnn_desc_t *desc,
                                           cgru_fwd_mode_t fwd_mode, cgru_layout_t layout,
                                           int32_t max_seq_length, int32_t batch_size,
                                           const int32_t *seq_lengths,
                                           const void *x, void *y, const void *hx, void *hy,
                                           const void *cx, void *cy,
                                           size_t weight_space_size, const void *weight_space,
                                           size_t work_space_size, void *work_space,
                                           size_t reserve_space_size, void *reserve_space)
{
    cgru_status_t st = check_desc(desc);
    if (st != CGRU_STATUS_SUCCESS)
        return st;
    return cgru__py_call("rnn_forward", NULL, 0, "(" DESC_FORMAT "iiiiKKKKKKKKKKKKK)",
                         DESC_ARGS(desc), (int)fwd_mode, (int)layout, (int)max_seq_length,
                         (int)batch_size, PTR(seq_lengths), PTR(x), PTR(y), PTR(hx), PTR(hy),
                         PTR(cx), PTR(cy), SIZE(weight_space_size), PTR(weight_space),
                         SIZE(work_space_size), PTR(work_space), SIZE(reserve_space_size),
                         PTR(reserve_space));
}

CGRU_API cgru_status_t cgru_rnn_forward(const cgru_rnn_desc_t *desc, cgru_fwd_mode_t fwd_mode,
                                        cgru_layout_t layout,
                                        int32_t max_seq_length, int32_t batch_size,
                                        const int32_t *seq_lengths,
                                        const void *x, void *y, const void *hx, void *hy,
                                        size_t weight_space_size, const void *weight_space,
                                        size_t work_space_size, void *work_space,
                                        size_t reserve_space_size, void *reserve_space)
{
    return cgru_rnn_forward_ex(desc, fwd_mode, layout, max_seq_length, batch_size, seq_lengths,
                               x, y, hx, hy, NULL, NULL, weight_space_size, weight_space,
                               work_space_size, work_space, reserve_space_size, reserve_space);
}

CGRU_API cgru_status_t cgru_rnn_backward_data_ex(const cgru_rnn_desc_t *desc,
                                                 cgru_layout_t layout,
                                                 int32_t max_seq_length, int32_t batch_size,
                                                 const int32_t *seq_lengths,
                                                 const void *dy, void *dx,
                                                 const void *dhy, void *dhx,
                                                 const void *dcy, void *dcx,
                                                 size_t weight_space_size,
                                                 const void *weight_space,
                                                 size_t work_space_size, void *work_space,
                                                 size_t reserve_space_size,
                                                 void *reserve_space)
{
    cgru_status_t st = check_desc(desc);
    if (st != CGRU_STATUS_SUCCESS)
        return st;
    return cgru__py_call("rnn_backward_data", NULL, 0, "(" DESC_FORMAT "iiiKKKKKKKKKKKKK)",
                         DESC_ARGS(desc), (int)layout, (int)max_seq_length, (int)batch_size,
                         PTR(seq_lengths), PTR(dy), PTR(dx), PTR(dhy), PTR(dhx), PTR(dcy),
                         PTR(dcx), SIZE(weight_space_size), PTR(weight_space),
                         SIZE(work_space_size), PTR(work_space), SIZE(reserve_space_size),
                         PTR(reserve_space));
}

CGRU_API cgru_status_t cgru_rnn_backward_data(const cgru_rnn_desc_t *desc, cgru_layout_t layout,
                                              int32_t max_seq_length, int32_t batch_size,
                                              const int32_t *seq_lengths,
                                              const void *dy, void *dx,
                                              const void *dhy, void *dhx,
                                              size_t weight_space_size, const void *weight_space,
                                              size_t work_space_size, void *work_space,
                                              size_t reserve_space_size, void *reserve_space)
{
    return cgru_rnn_backward_data_ex(desc, layout, max_seq_length, batch_size, seq_lengths, dy,
                                     dx, dhy, dhx, NULL, NULL, weight_space_size, weight_space,
                                     work_space_size, work_space, reserve_space_size,
                                     reserve_space);
}

CGRU_API cgru_status_t cgru_rnn_backward_weights(const cgru_rnn_desc_t *desc,
                                                 cgru_wgrad_mode_t wgrad_mode,
                                                 cgru_layout_t layout,
                                                 int32_t max_seq_length, int32_t batch_size,
                                                 const int32_t *seq_lengths,
                                                 size_t weight_space_size, void *dweight_space,
                                                 size_t work_space_size, void *work_space,
                                                 size_t reserve_space_size,
                                                 const void *reserve_space)
{
    cgru_status_t st = check_desc(desc);
    if (st != CGRU_STATUS_SUCCESS)
        return st;
    return cgru__py_call("rnn_backward_weights", NULL, 0, "(" DESC_FORMAT "iiiiKKKKKKK)",
                         DESC_ARGS(desc), (int)wgrad_mode, (int)layout, (int)max_seq_length,
                         (int)batch_size, PTR(seq_lengths), SIZE(weight_space_size),
                         PTR(dweight_space), SIZE(work_space_size), PTR(work_space),
                         SIZE(reserve_space_size), PTR(reserve_space));
}
