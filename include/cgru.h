/*
 * cgru.h — the C ABI of cgru: exact CPU forward and backward of cuDNN's recurrent cells
 * (GRU, LSTM with recurrent projection, vanilla RNN with tanh or relu) with cuDNN's semantics.
 *
 * Shaped after cuDNN v8's RNN API and zstd: a plain descriptor, size queries for every buffer
 * the caller allocates, an accessor into the packed weights, forward (inference or training),
 * backward data, backward weights (add or set), status codes and a thread-local message.
 *
 *   Build and link:   cc prog.c $(python -m cgru --cflags --libs)
 *
 * RUNTIME.  cgru's kernels take their BLAS from SciPy, so libcgru runs on the embedded Python
 * runtime of the environment where cgru is installed.  The first call that needs it starts that
 * interpreter inside the process (found from where libcgru lives, else from the Python that
 * built it) and imports cgru; nothing has to be set up and the program needs no Python code.
 * Loaded into a process that already runs Python (a ctypes/cffi caller, an extension module),
 * libcgru joins that interpreter instead (it takes the GIL for each call).  Two environment
 * variables override the discovery: CGRU_PYTHON (path of the python executable of the
 * environment to run, e.g. /path/venv/bin/python) and CGRU_LIBPYTHON (path of its
 * libpython3.X.so).  When the runtime cannot be started every call that needs it returns
 * CGRU_STATUS_RUNTIME_UNAVAILABLE and cgru_get_last_error_message() says why (a failed start
 * is not retried).  The functions that need no runtime: cgru_get_version,
 * cgru_get_error_string, cgru_get_last_error_message, cgru_rnn_desc_init.
 *   Py_Finalize.  An interpreter started by libcgru stays up until the process exits.  An
 * interpreter libcgru joined is the host's, which may finalise it (Py_Finalize) at any time,
 * also while other threads are inside cgru calls: the calls in flight complete and return
 * their statuses before Py_Finalize goes on, and every call made once finalisation has begun
 * returns CGRU_STATUS_RUNTIME_UNAVAILABLE — for the rest of the process, even after the host
 * initialises Python again (NumPy, which cgru needs, cannot be loaded twice in one process).
 * (libcgru learns of the finalisation through a callback its first call registers with the
 * interpreter's atexit module; a Py_Finalize racing the process's very first cgru call is not
 * covered.)
 *   fork().  A child may call cgru whether the parent used it or not, also when other threads
 * of the parent were inside cgru calls at the fork: libcgru does around a C fork() what
 * Python's os.fork does (takes the GIL before, re-initialises the interpreter in the child),
 * and leaves forks Python performs itself (os.fork, multiprocessing) to Python.  One exception: in a child forked while another thread of the
 * parent was making the process's first cgru call (while it was starting the runtime), every
 * call returns CGRU_STATUS_RUNTIME_UNAVAILABLE saying so.  (With a glibc older than 2.36, a
 * fork may deadlock when another thread holds the GIL and loads a library that registers fork
 * handlers, e.g. imports a BLAS-backed Python module.)
 *
 * THE CELLS (desc->cell_mode; cuDNN's cudnnRNNMode_t; matrices [H, width] applied as W·x):
 *   CGRU_GRU (the default; gates r, z, n):
 *     r  = sigmoid(W_r·x + b_Wr + R_r·h + b_Rr)
 *     z  = sigmoid(W_z·x + b_Wz + R_z·h + b_Rz)
 *     n  = tanh(W_n·x + b_Wn + r ⊙ (R_n·h + b_Rn))      reset_after = 1 (cuDNN, the default)
 *     n  = tanh(W_n·x + R_n·(r ⊙ h) + b_Wn + b_Rn)      reset_after = 0 (ONNX's default)
 *     h' = (1 − z) ⊙ n + z ⊙ h
 *   CGRU_LSTM (gates i, f, g, o; CUDNN_LSTM = PyTorch nn.LSTM):
 *     i = sigmoid(W_i·x + b_Wi + R_i·h + b_Ri)         likewise f and o
 *     g = tanh(W_g·x + b_Wg + R_g·h + b_Rg)
 *     c' = f ⊙ c + i ⊙ g,   h' = o ⊙ tanh(c')
 *     with desc->proj_size = P > 0 (cuDNN's recurrent projection): h' = W_p·(o ⊙ tanh(c')),
 *     W_p [P, H]; h is P wide (the recurrent matrices are [H, P]), c stays H wide.
 *   CGRU_RNN_TANH / CGRU_RNN_RELU:   h' = act(W·x + b_W + R·h + b_R)
 *
 * CONVENTIONS.
 *  - Every function returns a cgru_status_t, except the three getters of version and messages.
 *    Results go through out-parameters, which are written only on CGRU_STATUS_SUCCESS.
 *  - All sizes are in bytes (size_t), as in cuDNN v8.
 *  - Every buffer is allocated by the caller, in host memory, aligned to its element type
 *    (malloc is enough; the reserve space to 8 bytes), and not overlapping any other buffer of
 *    the same call: a buffer the call writes (an out or in/out argument) that overlaps any
 *    other buffer of the call is refused with CGRU_STATUS_BAD_PARAM naming both (buffers the
 *    call only reads may overlap each other).  "Floats" below means elements of
 *    desc->data_type (float or double).  cgru keeps no pointer to caller memory after a call
 *    returns.
 *  - Dimensions: T = max_seq_length, N = batch_size, I = desc->input_size,
 *    H = desc->hidden_size, L = desc->num_layers, D = 2 for CGRU_BIDIRECTIONAL else 1,
 *    G = the cell's gate count (GRU 3, LSTM 4, RNN 1), S = the state width (desc->proj_size
 *    when it is not 0, else H).
 *    Limits (cgru's kernels use 32-bit BLAS ints): T·N ≤ 2^31−1, G·H ≤ 2^31−1, L·D ≤ 2^31−1,
 *    and every buffer below 2^62 bytes.  The size queries refuse exactly what the compute
 *    calls refuse (CGRU_STATUS_BAD_PARAM for a dimension, CGRU_STATUS_NOT_SUPPORTED for a
 *    size), so a size they return can be used.
 *  - Tensors, row-major (last index fastest):
 *        x  [T, N, I]      (CGRU_LAYOUT_TIME_MAJOR)  or  [N, T, I]      (CGRU_LAYOUT_BATCH_MAJOR)
 *        y  [T, N, D·S]    (CGRU_LAYOUT_TIME_MAJOR)  or  [N, T, D·S]    (CGRU_LAYOUT_BATCH_MAJOR)
 *        hx, hy, dhy, dhx  [L·D, N, S] in both layouts, index l·D + d.
 *        cx, cy, dcy, dcx  [L·D, N, H] (CGRU_LSTM only: NULL for the other cells).
 *    Bidirectional outputs are [forward S | backward S] per step, the backward half aligned to
 *    the original time index.  dx is shaped like x, dy like y.
 *  - Sequence lengths (seq_lengths, int32 [N], any order; NULL means every length is T): the
 *    forward direction runs t = 0 … len−1, the reverse one len−1 … 0; outputs at t ≥ len are 0;
 *    hy (cy) is the state after the last processed step (hx, cx for len = 0).  0 ≤ len ≤ T.
 *  - Bad arguments never crash the program: the call returns CGRU_STATUS_BAD_PARAM (a NULL
 *    where none is allowed, a value out of range, an unknown enum value, a reserve space from a
 *    different call), CGRU_STATUS_BUFFER_TOO_SMALL (a size argument below what the size query
 *    returns) or CGRU_STATUS_NOT_SUPPORTED, and the thread's last error message names the
 *    argument, what was expected and what was given.  (Pointers that are not NULL but do not
 *    point to buffers of the documented sizes cannot be detected.)
 *
 * THREAD SAFETY.  Every function may be called from any number of threads at once, on shared
 * read-only inputs (descriptor, weight space, x, …) and distinct output buffers; results do not
 * depend on how many threads call or on the thread count used inside (desc->num_threads).  The
 * calls share one Python interpreter: the bookkeeping runs under its GIL, the kernels run
 * without it (in parallel).  A reserve space belongs to one forward/backward sequence at a time.
 *
 * WEIGHT SPACE (the same layout as cgru.tf's opaque params = cgru.Network.flat()).  A stack
 * has L·D pseudo-layers, index l·D + d.  Each has 2·G matrices in cuDNN's linLayerID order,
 * the G input ones [H, width] (width = I for layer 0, D·S above), then the G recurrent ones
 * [H, S]; an LSTM with a projection has one more, W_p [P, H] (linLayerID 8, as in cuDNN):
 *     CGRU_GRU   0 W_r  1 W_z  2 W_n      3 R_r  4 R_z  5 R_n
 *     CGRU_LSTM  0 W_i  1 W_f  2 W_g  3 W_o      4 R_i  5 R_f  6 R_g  7 R_o     (8 W_p)
 *     CGRU_RNN_* 0 W    1 R
 * and one bias [H] per linLayerID 0…2G−1 (the projection has none).  The space holds every
 * matrix of pseudo-layer 0 (in linLayerID order, each row-major), then those of pseudo-layer
 * 1, …, then every bias in the same order.  With CGRU_SKIP_INPUT the layer-0 input matrices are
 * the identity and are not stored (their biases are).  Use cgru_get_weight_params to find each
 * piece.
 *
 * TRAINING.  cgru_rnn_forward in CGRU_FWD_MODE_TRAINING fills the reserve space; then
 * cgru_rnn_backward_data (first, as in cuDNN v8) computes dx and dhx (dcx) and also every weight
 * gradient, which it stores in the reserve space; then cgru_rnn_backward_weights adds those
 * gradients to dweight_space (CGRU_WGRAD_MODE_ADD) or writes them there (CGRU_WGRAD_MODE_SET).
 * The reserve space holds, besides cgru's saved gates and states, a copy of x, so the backward
 * calls take neither x nor hx (cx) nor y.  Do not modify the reserve space between the calls; every
 * call of one sequence must get the same descriptor (desc->num_threads may differ: it does not
 * change any result), layout, T, N, seq_lengths and weights.  The reserve space records what
 * its forward was given: a backward call with a different descriptor, layout, T, N or
 * seq_lengths returns CGRU_STATUS_BAD_PARAM naming what differs.
 */
#ifndef CGRU_H
#define CGRU_H

#include <stddef.h>
#include <stdint.h>

/* ---- visibility ------------------------------------------------------------------------- */
#if defined(_WIN32) || defined(__CYGWIN__)
#  if defined(CGRU_BUILDING_LIBRARY)
#    define CGRU_API __declspec(dllexport)
#  else
#    define CGRU_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define CGRU_API __attribute__((visibility("default")))
#else
#  define CGRU_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version ---------------------------------------------------------------------------- */
#define CGRU_VERSION_MAJOR 0
#define CGRU_VERSION_MINOR 2
#define CGRU_VERSION_PATCH 0
/* MAJOR·10000 + MINOR·100 + PATCH; compare with cgru_get_version() to detect header/library
 * skew.  A library runs programs built against the headers of its major version and of every
 * minor version up to its own (0.2 runs programs built against 0.1's header). */
#define CGRU_VERSION (CGRU_VERSION_MAJOR * 10000 + CGRU_VERSION_MINOR * 100 + CGRU_VERSION_PATCH)

/* CGRU_VERSION of the loaded library.  Needs no runtime. */
CGRU_API int cgru_get_version(void);

/* ---- status ----------------------------------------------------------------------------- */
/* Values are pinned: they never change meaning. */
typedef enum cgru_status {
    CGRU_STATUS_SUCCESS = 0,
    CGRU_STATUS_BAD_PARAM = 1,           /* NULL not allowed, value out of range, unknown enum
                                            value, reserve space of a different call */
    CGRU_STATUS_NOT_SUPPORTED = 2,       /* valid, but not implemented (e.g. CGRU_DATA_HALF) */
    CGRU_STATUS_ALLOC_FAILED = 3,        /* out of memory */
    CGRU_STATUS_INTERNAL_ERROR = 4,      /* a bug in cgru: please report the message */
    CGRU_STATUS_RUNTIME_UNAVAILABLE = 5, /* the Python runtime or the cgru package could not be
                                            started or imported (see the message) */
    CGRU_STATUS_BUFFER_TOO_SMALL = 6     /* a size argument below what the size query returns */
} cgru_status_t;

/* The status's name ("CGRU_STATUS_BAD_PARAM"); "CGRU_STATUS_UNKNOWN" for other values.  A
 * static string; needs no runtime. */
CGRU_API const char *cgru_get_error_string(cgru_status_t status);

/* The detail of the most recent call on the calling thread that returns a status: "" after a
 * success, else what was wrong ("x: NULL; expected a pointer to T·N·I floats").  Thread-local;
 * valid until the thread's next cgru call.  Never NULL. */
CGRU_API const char *cgru_get_last_error_message(void);

/* ---- enums (values pinned; the same numbers as cuDNN's where cuDNN has them) ------------ */
typedef enum cgru_data_type {
    CGRU_DATA_FLOAT = 0,
    CGRU_DATA_DOUBLE = 1,
    CGRU_DATA_HALF = 2                   /* not supported: CGRU_STATUS_NOT_SUPPORTED */
} cgru_data_type_t;

typedef enum cgru_direction_mode {
    CGRU_UNIDIRECTIONAL = 0,
    CGRU_BIDIRECTIONAL = 1,              /* D = 2: forward and reverse, outputs concatenated */
    CGRU_REVERSE = 2                     /* cgru's: one direction, from the end of the sequence */
} cgru_direction_mode_t;

typedef enum cgru_input_mode {
    CGRU_LINEAR_INPUT = 0,               /* layer 0 applies W to x */
    CGRU_SKIP_INPUT = 1                  /* layer 0 has W = identity (needs I = H), not stored */
} cgru_input_mode_t;

typedef enum cgru_fwd_mode {
    CGRU_FWD_MODE_INFERENCE = 0,         /* saves nothing: reserve size 0 */
    CGRU_FWD_MODE_TRAINING = 1           /* fills the reserve space for the backward calls */
} cgru_fwd_mode_t;

typedef enum cgru_layout {
    CGRU_LAYOUT_TIME_MAJOR = 0,          /* x [T, N, I], y [T, N, D·H] (cuDNN SEQ_MAJOR) */
    CGRU_LAYOUT_BATCH_MAJOR = 1          /* x [N, T, I], y [N, T, D·H] */
} cgru_layout_t;

typedef enum cgru_cell_mode {           /* since 0.2; cuDNN's cudnnRNNMode_t numbers */
    CGRU_RNN_RELU = 0,                   /* h' = relu(W·x + b_W + R·h + b_R) */
    CGRU_RNN_TANH = 1,                   /* h' = tanh(W·x + b_W + R·h + b_R) */
    CGRU_LSTM = 2,                       /* gates i, f, g, o; optional projection */
    CGRU_GRU = 3                         /* gates r, z, n (desc->reset_after) */
} cgru_cell_mode_t;

typedef enum cgru_wgrad_mode {
    CGRU_WGRAD_MODE_ADD = 0,             /* dweight_space += weight gradients */
    CGRU_WGRAD_MODE_SET = 1              /* dweight_space  = weight gradients */
} cgru_wgrad_mode_t;

/* ---- the descriptor --------------------------------------------------------------------- */
/* A plain struct: initialise it with cgru_rnn_desc_init, then set the fields.  cgru only reads
 * it; one descriptor may be shared by any number of threads.  Versioned by struct_size: a
 * program compiled against cgru 0.1's header (which had no cell_mode and proj_size: a GRU)
 * keeps working with this library. */
typedef struct cgru_rnn_desc {
    size_t struct_size;   /* sizeof(cgru_rnn_desc_t), set by cgru_rnn_desc_init; leave it */
    int32_t data_type;    /* cgru_data_type_t                        default CGRU_DATA_FLOAT */
    int32_t input_size;   /* I ≥ 1 (= H with CGRU_SKIP_INPUT)       default 0: must be set */
    int32_t hidden_size;  /* H ≥ 1                                   default 0: must be set */
    int32_t num_layers;   /* L ≥ 1                                   default 1 */
    int32_t direction;    /* cgru_direction_mode_t                   default CGRU_UNIDIRECTIONAL */
    int32_t input_mode;   /* cgru_input_mode_t                       default CGRU_LINEAR_INPUT */
    int32_t reset_after;  /* CGRU_GRU: 1 cuDNN's cell, 0 reset before R_n (ignored otherwise)
                                                                     default 1 */
    int32_t num_threads;  /* threads inside one call, 1…256, or 0: all usable cores (honours
                             OMP_NUM_THREADS); results are identical for every value.  default 0 */
    double dropout;       /* inter-layer dropout probability in [0, 1), applied in training to
                             each layer's output except the last one's    default 0 */
    int64_t seed;         /* the dropout masks are drawn from (seed, seed2): reproducible
                             (the same as cgru.forward(..., seed=(seed, seed2)))  default 0 */
    int64_t seed2;        /*                                             default 0 */
    /* since 0.2 */
    int32_t cell_mode;    /* cgru_cell_mode_t                        default CGRU_GRU */
    int32_t proj_size;    /* CGRU_LSTM's recurrent projection P in 1…H, 0: none   default 0 */
} cgru_rnn_desc_t;

/* Sets every field to the default above (cuDNN's defaults) and struct_size.
 *   desc         out, not NULL.
 *   struct_size  the size of *desc as the caller's program was compiled (the macro
 *                cgru_rnn_desc_init passes this header's sizeof(cgru_rnn_desc_t)), or cgru 0.1's.
 * Needs no runtime.  Returns CGRU_STATUS_BAD_PARAM for NULL or an unknown struct_size. */
CGRU_API cgru_status_t cgru_rnn_desc_init_size(cgru_rnn_desc_t *desc, size_t struct_size);

/* cgru 0.1's entry point, kept for programs compiled against its header: fills a 0.1
 * descriptor (a GRU).  Programs compiled against this header reach cgru_rnn_desc_init_size
 * through the macro below instead, so that both kinds of program work with this library. */
CGRU_API cgru_status_t (cgru_rnn_desc_init)(cgru_rnn_desc_t *desc);
#define cgru_rnn_desc_init(desc) cgru_rnn_desc_init_size((desc), sizeof(cgru_rnn_desc_t))

/* ---- size queries ----------------------------------------------------------------------- */
/* Bytes of the weight space (= the dweight space) of desc.
 *   desc               in, not NULL, initialised by cgru_rnn_desc_init.
 *   weight_space_size  out, not NULL. */
CGRU_API cgru_status_t cgru_get_weight_space_size(const cgru_rnn_desc_t *desc,
                                                  size_t *weight_space_size);

/* Bytes of the workspace and of the reserve space of a forward in fwd_mode (and of the backward
 * calls that follow a training forward) for T = max_seq_length ≥ 1, N = batch_size ≥ 1.  The
 * reserve size is 0 for CGRU_FWD_MODE_INFERENCE.  The workspace holds every temporary of the
 * largest call of the sequence (the forward and, in training, backward_data): the input
 * projections, gate gradients, the time loops' scratch; any address will do.  Passing
 * work_space NULL or work_space_size 0 instead (what callers of ABI 0.1, whose query returned
 * 0, pass) lets cgru take its temporaries from a pool of its own.
 *   desc                in, not NULL.
 *   work_space_size     out, may be NULL (not written).
 *   reserve_space_size  out, may be NULL (not written). */
CGRU_API cgru_status_t cgru_get_temp_space_sizes(const cgru_rnn_desc_t *desc,
                                                 cgru_fwd_mode_t fwd_mode,
                                                 int32_t max_seq_length, int32_t batch_size,
                                                 size_t *work_space_size,
                                                 size_t *reserve_space_size);

/* Where matrix and bias lin_layer_id (see WEIGHT SPACE) of pseudo-layer pseudo_layer
 * (0 … L·D−1, = l·D + d) live inside weight_space (or inside a dweight space: same layout).
 *   desc               in, not NULL.
 *   weight_space_size  bytes of weight_space, ≥ cgru_get_weight_space_size.
 *   weight_space       in, not NULL: the buffer the addresses point into.
 *   m_addr             out, may be NULL: address of the row-major matrix [m_dims[0], m_dims[1]];
 *                      NULL for the layer-0 input matrices with CGRU_SKIP_INPUT (not stored).
 *   m_dims             out, may be NULL: {H, width} ({H, 0} where m_addr is NULL; {P, H}
 *                      for the projection).
 *   b_addr             out, may be NULL: address of the bias [H] (NULL for the projection).
 *   b_dim              out, may be NULL: H (0 for the projection). */
CGRU_API cgru_status_t cgru_get_weight_params(const cgru_rnn_desc_t *desc, int32_t pseudo_layer,
                                              size_t weight_space_size, const void *weight_space,
                                              int32_t lin_layer_id,
                                              void **m_addr, int32_t m_dims[2],
                                              void **b_addr, int32_t *b_dim);

/* ---- forward ---------------------------------------------------------------------------- */
/* Runs the stack over a batch of sequences.
 *   desc                in, not NULL.
 *   fwd_mode            CGRU_FWD_MODE_INFERENCE or CGRU_FWD_MODE_TRAINING.
 *   layout              layout of x and y.
 *   max_seq_length      T ≥ 1.         batch_size  N ≥ 1.
 *   seq_lengths         in, int32 [N] in [0, T], may be NULL (every length is T).
 *   x                   in, not NULL: T·N·I floats.
 *   y                   out, not NULL: T·N·D·S floats (0 at t ≥ len).
 *   hx                  in, may be NULL (zeros): [L·D, N, S] floats.
 *   hy                  out, may be NULL (not written): [L·D, N, S] floats.
 *   cx                  in, may be NULL (zeros): [L·D, N, H] floats (CGRU_LSTM; else NULL).
 *   cy                  out, may be NULL (not written): [L·D, N, H] floats (CGRU_LSTM; else
 *                       NULL).
 *   weight_space_size   bytes of weight_space, ≥ cgru_get_weight_space_size.
 *   weight_space        in, not NULL.
 *   work_space_size     bytes of work_space, ≥ the query's work_space_size (for this fwd_mode).
 *   work_space          scratch (written, never read before), apart from every other buffer
 *                       of the call; NULL (or work_space_size 0): cgru allocates its
 *                       temporaries itself.
 *   reserve_space_size  bytes of reserve_space, ≥ the query's reserve_space_size (training).
 *   reserve_space       out (training), not NULL in training; not used (may be NULL) in
 *                       inference. */
CGRU_API cgru_status_t cgru_rnn_forward_ex(const cgru_rnn_desc_t *desc,
                                           cgru_fwd_mode_t fwd_mode, cgru_layout_t layout,
                                           int32_t max_seq_length, int32_t batch_size,
                                           const int32_t *seq_lengths,
                                           const void *x, void *y, const void *hx, void *hy,
                                           const void *cx, void *cy,
                                           size_t weight_space_size, const void *weight_space,
                                           size_t work_space_size, void *work_space,
                                           size_t reserve_space_size, void *reserve_space);

/* cgru_rnn_forward_ex without cx and cy (as in cgru 0.1): an LSTM starts from zero cell states
 * and does not report its final ones. */
CGRU_API cgru_status_t cgru_rnn_forward(const cgru_rnn_desc_t *desc, cgru_fwd_mode_t fwd_mode,
                                        cgru_layout_t layout,
                                        int32_t max_seq_length, int32_t batch_size,
                                        const int32_t *seq_lengths,
                                        const void *x, void *y, const void *hx, void *hy,
                                        size_t weight_space_size, const void *weight_space,
                                        size_t work_space_size, void *work_space,
                                        size_t reserve_space_size, void *reserve_space);

/* ---- backward --------------------------------------------------------------------------- */
/* Gradients with respect to x, hx (and cx) of the loss whose gradients with respect to y, hy
 * (and cy) are dy, dhy (and dcy); also computes every weight gradient and stores it in the
 * reserve space for cgru_rnn_backward_weights.  Call after a training forward, before
 * backward_weights.
 *   desc, layout, max_seq_length, batch_size, seq_lengths   as for the forward (the same).
 *   dy                  in, may be NULL (zeros): shaped like y.
 *   dx                  out, not NULL: shaped like x.
 *   dhy                 in, may be NULL (zeros): [L·D, N, S] floats.
 *   dhx                 out, may be NULL (not written): [L·D, N, S] floats.
 *   dcy                 in, may be NULL (zeros): [L·D, N, H] floats (CGRU_LSTM; else NULL).
 *   dcx                 out, may be NULL (not written): [L·D, N, H] floats (CGRU_LSTM; else
 *                       NULL).
 *   weight_space_size, weight_space   in, as for the forward (the same weights).
 *   work_space_size, work_space       as for the forward.
 *   reserve_space_size  bytes of reserve_space, ≥ the query's training reserve_space_size.
 *   reserve_space       in/out, not NULL: the training forward's reserve space. */
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
                                                 void *reserve_space);

/* cgru_rnn_backward_data_ex without dcy and dcx (as in cgru 0.1). */
CGRU_API cgru_status_t cgru_rnn_backward_data(const cgru_rnn_desc_t *desc, cgru_layout_t layout,
                                              int32_t max_seq_length, int32_t batch_size,
                                              const int32_t *seq_lengths,
                                              const void *dy, void *dx,
                                              const void *dhy, void *dhx,
                                              size_t weight_space_size, const void *weight_space,
                                              size_t work_space_size, void *work_space,
                                              size_t reserve_space_size, void *reserve_space);

/* Weight gradients of the preceding cgru_rnn_backward_data (read from the reserve space), added
 * to (CGRU_WGRAD_MODE_ADD) or written into (CGRU_WGRAD_MODE_SET) dweight_space, which has the
 * weight space's layout.  Returns CGRU_STATUS_BAD_PARAM when backward_data has not run on this
 * reserve space.  May be called again (it adds or writes the same gradients again).
 *   desc, layout, max_seq_length, batch_size, seq_lengths   as for the forward (the same).
 *   weight_space_size   bytes of dweight_space, ≥ cgru_get_weight_space_size.
 *   dweight_space       in/out (ADD) or out (SET), not NULL.
 *   work_space_size, work_space       not used (this call needs no temporaries).
 *   reserve_space_size  bytes of reserve_space, as for backward_data.
 *   reserve_space       in, not NULL: the reserve space backward_data wrote. */
CGRU_API cgru_status_t cgru_rnn_backward_weights(const cgru_rnn_desc_t *desc,
                                                 cgru_wgrad_mode_t wgrad_mode,
                                                 cgru_layout_t layout,
                                                 int32_t max_seq_length, int32_t batch_size,
                                                 const int32_t *seq_lengths,
                                                 size_t weight_space_size, void *dweight_space,
                                                 size_t work_space_size, void *work_space,
                                                 size_t reserve_space_size,
                                                 const void *reserve_space);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* CGRU_H */
