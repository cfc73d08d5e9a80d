# What every cell kind's time loops share (cgru/_kernels/gru.pyx, lstm.pyx, rnn.pyx):
# the vector kernels of simd.h, the activations, the loop description, signal polling and the
# test probes.  Inline functions are compiled into each module that cimports them; the others
# live in loops.pyx (one copy, so that the probe is one).  The C kernels declared here are
# compiled once (src/*.c) and linked into each module (setup.py).
from cython cimport floating
from libc.math cimport exp, expf, tanh, tanhf, log1p, log1pf, fabs, fabsf
from cpython.ref cimport PyObject
from cgru._kernels.threads cimport item_fn

cdef extern from "simd.h" nogil:
    size_t cgru_packed_size(int n, int k, int nr)
    void cgru_pack_f32(int trans, int n, int k, const float *B, int ldb, float *Bp)
    void cgru_pack_f64(int trans, int n, int k, const double *B, int ldb, double *Bp)
    void cgru_pack_f32_rows(int n, int k, int k0, int k1, const float *B, int ldb, float *Bp)
    void cgru_pack_f64_rows(int n, int k, int k0, int k1, const double *B, int ldb, double *Bp)
    void cgru_gemm_packed_f32(int m, int n, int k, const float *A, int lda, const float *Bp,
                              int beta1, float *C, int ldc)
    void cgru_gemm_packed_f64(int m, int n, int k, const double *A, int lda, const double *Bp,
                              int beta1, double *C, int ldc)
    void cgru_gemm_packed_f32_ta(int m, int n, int k, const float *A, int lda,
                                 const float *Bp, int beta1, float *C, int ldc)
    void cgru_gemm_packed_f64_ta(int m, int n, int k, const double *A, int lda,
                                 const double *Bp, int beta1, double *C, int ldc)
    void cgru_gemm_packed_f32_t_at(int isa, int ta, int m, int n, int k, const float *A,
                                   int lda, const float *Bp, int beta1, float *C, int ldc)
    void cgru_gemm_packed_f64_t_at(int isa, int ta, int m, int n, int k, const double *A,
                                   int lda, const double *Bp, int beta1, double *C, int ldc)
    void cgru_gemm_packed_f32_at(int isa, int m, int n, int k, const float *A, int lda,
                                 const float *Bp, int beta1, float *C, int ldc)
    void cgru_gemm_packed_f64_at(int isa, int m, int n, int k, const double *A, int lda,
                                 const double *Bp, int beta1, double *C, int ldc)
    void cgru_sigmoid_f32(int n, const float *x, float *y)
    void cgru_tanh_f32(int n, const float *x, float *y)
    void cgru_sigmoid_f64(int n, const double *x, double *y)
    void cgru_tanh_f64(int n, const double *x, double *y)
    void cgru_sigmoid_f32_at(int isa, int n, const float *x, float *y)
    void cgru_tanh_f32_at(int isa, int n, const float *x, float *y)
    void cgru_sigmoid_f64_at(int isa, int n, const double *x, double *y)
    void cgru_tanh_f64_at(int isa, int n, const double *x, double *y)
    int CGRU_NR_F
    int CGRU_SHORT_K
    int CGRU_GEMM_NO_SHORT
    int CGRU_NR_D
    int cgru_isa()

cdef extern from "gates.h" nogil:
    # the default cells' fused row math (gates.h documents each); NAME_at runs one ISA level
    void cgru_gru_fwd_ra_f32(int H, const float *gx, const float *gh, const float *b,
                             const float *bhn, const float *hp, float *g3, float *hn,
                             float *hnew, int flip)
    void cgru_gru_fwd_ra_f64(int H, const double *gx, const double *gh, const double *b,
                             const double *bhn, const double *hp, double *g3, double *hn,
                             double *hnew, int flip)
    void cgru_gru_bwd_ra_f32(int H, const float *g3, const float *hp, const float *hn,
                             float *dh, float *dgx, float *dgh, int flip)
    void cgru_gru_bwd_ra_f64(int H, const double *g3, const double *hp, const double *hn,
                             double *dh, double *dgx, double *dgh, int flip)
    void cgru_gru_fwd_rb_rz_f32(int H, const float *gx, const float *gh, const float *b,
                                const float *hp, const float *m, float *g3, float *rh)
    void cgru_gru_fwd_rb_rz_f64(int H, const double *gx, const double *gh, const double *b,
                                const double *hp, const double *m, double *g3, double *rh)
    void cgru_gru_fwd_rb_n_f32(int H, const float *gxn, const float *ghn, const float *bn,
                               const float *z, const float *hp, float *n, float *hnew, int flip)
    void cgru_gru_fwd_rb_n_f64(int H, const double *gxn, const double *ghn, const double *bn,
                               const double *z, const double *hp, double *n, double *hnew,
                               int flip)
    void cgru_gru_bwd_rb_f32(int H, const float *g3, const float *hp, const float *m,
                             float *dh, float *dgx, float *rhm, int flip)
    void cgru_gru_bwd_rb_f64(int H, const double *g3, const double *hp, const double *m,
                             double *dh, double *dgx, double *rhm, int flip)
    void cgru_gru_bwd_rb_r_f32(int H, const float *g3, const float *hp, const float *m,
                               const float *drh, float *dh, float *dgx)
    void cgru_gru_bwd_rb_r_f64(int H, const double *g3, const double *hp, const double *m,
                               const double *drh, double *dh, double *dgx)
    void cgru_lstm_fwd_f32(int H, const float *gx, const float *gh, const float *b,
                           const float *cp, float *g4, float *cn, float *hf)
    void cgru_lstm_fwd_f64(int H, const double *gx, const double *gh, const double *b,
                           const double *cp, double *g4, double *cn, double *hf)
    void cgru_lstm_bwd_f32(int H, const float *g4, const float *cp, const float *cn,
                           const float *dhf, float *dc, float *da)
    void cgru_lstm_bwd_f64(int H, const double *g4, const double *cp, const double *cn,
                           const double *dhf, double *dc, double *da)
    void cgru_rnn_fwd_f32(int H, const float *gx, const float *gh, const float *b, float *hn,
                          int relu)
    void cgru_rnn_fwd_f64(int H, const double *gx, const double *gh, const double *b,
                          double *hn, int relu)
    void cgru_rnn_bwd_f32(int H, const float *hn, float *dh, float *da, int relu)
    void cgru_rnn_bwd_f64(int H, const double *hn, double *dh, double *da, int relu)

cdef extern from "team.h" nogil:
    ctypedef struct cgru_team:
        pass
    cgru_team *cgru_team_new()
    void cgru_team_free(cgru_team *t)
    void cgru_team_gemm(cgru_team *t, int is_double, int m, int n, int k, const void *A,
                        int lda, const void *Bp, int beta1, void *C, int ldc)
    void cgru_team_help(cgru_team *t)
    void cgru_team_quit(cgru_team *t)



cdef struct Act:
    int code
    double alpha
    double beta


cdef struct Loop:
    # what every time loop of one layer shares; each kind's Layer struct starts with one
    int *abort                 # set when a signal handler raised: every work item stops
    bint poll                  # the caller polls for signals (calls from the main thread only)
    PyObject *errors           # list receiving the exception a signal handler raised
    int T
    int N
    int H
    int S                      # the width of the state h (an LSTM's projection size, else H)
    int C                      # the width of the second state c (an LSTM's H), or 0
    int D
    int n_chunks
    int s_begin                # the loops run steps s_begin … s_end − 1 of each direction, in
    int s_end                  #   its own processing order (a block of time; all T by default)
    const long long *lengths   # [N]
    const void *mask           # [T, N, D·H] or NULL
    void *y                    # [T, N, D·H] forward output      (OUT)
    const void *dy             # [T, N, D·H] or NULL             (IN, backward)
    cgru_team *team            # spare threads sharing the per-step products, or NULL
    bint use_team              # the caller allows a team (the products are big enough)
    double step_ns             # about how long a step of all the loops takes one thread
    void *scratch              # the work items' scratch, item k's at scratch + k·item_scratch
    size_t item_scratch        #   elements of the dtype per item (the call's workspace)


cdef struct Rows:
    # one [T·N, width] array of a direction, addressed by row t·N + b
    void *p
    int width


cdef struct States:
    # What the time-loop driver (driver.pxi) reads and writes of one direction; each kind's
    # Dir struct starts with one.  Pointers to the dtype's elements, NULL for what a call does
    # not use; S and C are the Loop's state widths.
    bint reverse
    const void *h0             # [N, S]                                        (IN)
    const void *c0             # [N, C]                                        (IN)
    void *hy                   # [N, S]                                        (OUT)
    void *cy                   # [N, C]                                        (OUT)
    void *states               # [(T+1)·N, S] the reserve's h slots (training) (OUT; IN bwd)
    void *cstates              # [(T+1)·N, C] the same for c
    Rows saved[3]              # forward, training: the reserve's rows per step (0 when inactive)
    const void *dhy            # [N, S]                                        (IN, backward)
    const void *dcy            # [N, C]                                        (IN)
    void *dh0                  # [N, S]                                        (OUT)
    void *dc0                  # [N, C]                                        (OUT)
    void *hm                   # [T·N, S] h ⊙ m (or h) for dR, 0 when inactive (OUT)
    Rows zeroed[3]             # backward: gradient operand rows, 0 when inactive (OUT)
    Py_ssize_t row0            # the input projection gx (forward) and the gradient operands
                               #   (backward: hm, zeroed, dG and the kind's) hold rows row0 … of
                               #   T·N only (a block of time): row t·N + b is at t·N + b − row0
    const void *dG             # the recurrent product dh_prev += m ⊙ (dG·R): dG [T·N, KG]
    Py_ssize_t ldG             #   rows of stride ldG (IN: the kind's step writes it)
    int KG
    const void *Rb             #   R [KG, S], packed for dG·R                  (IN)
    const void *dG2            # a second operand of it, or NULL: dh_prev += m ⊙ (dG·R +
    Py_ssize_t ldG2            #   dG2·R2), dG2 [T·N, KG2] of row stride ldG2 (a kind whose
    int KG2                    #   gradient is in two buffers: the GRU's r, z columns and
    const void *Rb2            #   its n ones), R2 [KG2, S] packed             (IN)


# --- activations -----------------------------------------------------------------------------
# Constants are typed `floating` (``one``): Cython writes a literal 1 mixed with a float as the
# double 1.0, which would compute float32 math in double, one scalar at a time.
cdef inline floating fabs_(floating x) noexcept nogil:
    if floating is float:
        return fabsf(x)
    else:
        return fabs(x)


cdef inline floating sigmoid(floating x) noexcept nogil:
    cdef floating one = 1
    if floating is float:
        return one / (one + expf(-x))
    else:
        return one / (one + exp(-x))


cdef inline floating tanh_(floating x) noexcept nogil:
    if floating is float:
        return tanhf(x)
    else:
        return tanh(x)


cdef inline floating exp_(floating x) noexcept nogil:
    if floating is float:
        return expf(x)
    else:
        return exp(x)


cdef inline floating clamp(floating x, bint has_clip, floating c) noexcept nogil:
    if has_clip:
        if x > c:
            return c
        if x < -c:
            return -c
    return x


cdef inline floating activate(const Act *f, floating x) noexcept nogil:
    cdef floating a = <floating>f.alpha
    cdef floating b = <floating>f.beta
    cdef floating v, zero = 0, one = 1
    cdef int code = f.code
    if code == 0:
        return sigmoid(x)
    elif code == 1:
        return tanh_(x)
    elif code == 2:
        return x if x > zero else zero
    elif code == 3:
        return x
    elif code == 4:
        v = a * x + b
        return zero if v < zero else (one if v > one else v)
    elif code == 5:
        return a * x + b
    elif code == 6:
        return x if x >= zero else a * x
    elif code == 7:
        return x if x > a else zero
    elif code == 8:
        return a * tanh_(b * x)
    elif code == 9:
        return x if x >= zero else a * (exp_(x) - one)
    elif code == 10:
        return x / (one + fabs_(x))
    else:  # 11 softplus, stable: max(x, 0) + log1p(exp(-|x|))
        if floating is float:
            return (x if x > zero else zero) + log1pf(expf(-fabs_(x)))
        else:
            return (x if x > zero else zero) + log1p(exp(-fabs_(x)))


cdef inline floating activate_grad(const Act *f, floating x, floating y) noexcept nogil:
    """d activation / d x at pre-activation x with value y."""
    cdef floating a = <floating>f.alpha
    cdef floating b = <floating>f.beta
    cdef floating v, zero = 0, one = 1
    cdef int code = f.code
    if code == 0:
        return y * (one - y)
    elif code == 1:
        return one - y * y
    elif code == 2:
        return one if x > zero else zero
    elif code == 3:
        return one
    elif code == 4:
        v = a * x + b
        return a if (v > zero and v < one) else zero
    elif code == 5:
        return a
    elif code == 6:
        return one if x >= zero else a
    elif code == 7:
        return one if x > a else zero
    elif code == 8:
        v = tanh_(b * x)
        return a * b * (one - v * v)
    elif code == 9:
        return one if x >= zero else a * exp_(x)
    elif code == 10:
        v = one + fabs_(x)
        return one / (v * v)
    else:
        return sigmoid(x)


cdef inline floating clip_grad(floating x, bint has_clip, floating c) noexcept nogil:
    if has_clip and (x > c or x < -c):
        return 0
    return 1


# --- vector helpers --------------------------------------------------------------------------
cdef inline void sigmoid_inplace(floating *v, int n) noexcept nogil:
    if floating is float:
        cgru_sigmoid_f32(n, v, v)
    else:
        cgru_sigmoid_f64(n, v, v)


cdef inline void tanh_inplace(floating *v, int n) noexcept nogil:
    if floating is float:
        cgru_tanh_f32(n, v, v)
    else:
        cgru_tanh_f64(n, v, v)


# the default cells' fused row math (gates.h), one row of one step
cdef inline void gru_fwd_ra_row(int H, const floating *gx, const floating *gh,
                                const floating *b, const floating *bhn, const floating *hp,
                                floating *g3, floating *hn, floating *hnew,
                                bint flip) noexcept nogil:
    if floating is float:
        cgru_gru_fwd_ra_f32(H, gx, gh, b, bhn, hp, g3, hn, hnew, flip)
    else:
        cgru_gru_fwd_ra_f64(H, gx, gh, b, bhn, hp, g3, hn, hnew, flip)


cdef inline void gru_bwd_ra_row(int H, const floating *g3, const floating *hp,
                                const floating *hn, floating *dh, floating *dgx, floating *dgh,
                                bint flip) noexcept nogil:
    if floating is float:
        cgru_gru_bwd_ra_f32(H, g3, hp, hn, dh, dgx, dgh, flip)
    else:
        cgru_gru_bwd_ra_f64(H, g3, hp, hn, dh, dgx, dgh, flip)


cdef inline void gru_fwd_rb_rz_row(int H, const floating *gx, const floating *gh,
                                   const floating *b, const floating *hp, const floating *m,
                                   floating *g3, floating *rh) noexcept nogil:
    if floating is float:
        cgru_gru_fwd_rb_rz_f32(H, gx, gh, b, hp, m, g3, rh)
    else:
        cgru_gru_fwd_rb_rz_f64(H, gx, gh, b, hp, m, g3, rh)


cdef inline void gru_fwd_rb_n_row(int H, const floating *gxn, const floating *ghn,
                                  const floating *bn, const floating *z, const floating *hp,
                                  floating *n, floating *hnew, bint flip) noexcept nogil:
    if floating is float:
        cgru_gru_fwd_rb_n_f32(H, gxn, ghn, bn, z, hp, n, hnew, flip)
    else:
        cgru_gru_fwd_rb_n_f64(H, gxn, ghn, bn, z, hp, n, hnew, flip)


cdef inline void gru_bwd_rb_row(int H, const floating *g3, const floating *hp,
                                const floating *m, floating *dh, floating *dgx, floating *rhm,
                                bint flip) noexcept nogil:
    if floating is float:
        cgru_gru_bwd_rb_f32(H, g3, hp, m, dh, dgx, rhm, flip)
    else:
        cgru_gru_bwd_rb_f64(H, g3, hp, m, dh, dgx, rhm, flip)


cdef inline void gru_bwd_rb_r_row(int H, const floating *g3, const floating *hp,
                                  const floating *m, const floating *drh, floating *dh,
                                  floating *dgx) noexcept nogil:
    if floating is float:
        cgru_gru_bwd_rb_r_f32(H, g3, hp, m, drh, dh, dgx)
    else:
        cgru_gru_bwd_rb_r_f64(H, g3, hp, m, drh, dh, dgx)


cdef inline void lstm_fwd_row(int H, const floating *gx, const floating *gh, const floating *b,
                              const floating *cp, floating *g4, floating *cn,
                              floating *hf) noexcept nogil:
    if floating is float:
        cgru_lstm_fwd_f32(H, gx, gh, b, cp, g4, cn, hf)
    else:
        cgru_lstm_fwd_f64(H, gx, gh, b, cp, g4, cn, hf)


cdef inline void lstm_bwd_row(int H, const floating *g4, const floating *cp,
                              const floating *cn, const floating *dhf, floating *dc,
                              floating *da) noexcept nogil:
    if floating is float:
        cgru_lstm_bwd_f32(H, g4, cp, cn, dhf, dc, da)
    else:
        cgru_lstm_bwd_f64(H, g4, cp, cn, dhf, dc, da)


cdef inline void rnn_fwd_row(int H, const floating *gx, const floating *gh, const floating *b,
                             floating *hn, bint relu) noexcept nogil:
    if floating is float:
        cgru_rnn_fwd_f32(H, gx, gh, b, hn, relu)
    else:
        cgru_rnn_fwd_f64(H, gx, gh, b, hn, relu)


cdef inline void rnn_bwd_row(int H, const floating *hn, floating *dh, floating *da,
                             bint relu) noexcept nogil:
    if floating is float:
        cgru_rnn_bwd_f32(H, hn, dh, da, relu)
    else:
        cgru_rnn_bwd_f64(H, hn, dh, da, relu)


cdef inline void gemm_packed(int m, int n, int k, const floating *A, int lda,
                             const floating *Bp, bint beta1, floating *C, int ldc) noexcept nogil:
    # C[m, n] (+)= A[m, k] · op(B), op(B) packed by pack_rhs
    if floating is float:
        cgru_gemm_packed_f32(m, n, k, A, lda, Bp, beta1, C, ldc)
    else:
        cgru_gemm_packed_f64(m, n, k, A, lda, Bp, beta1, C, ldc)


cdef inline void gemm_packed_ta(int m, int n, int k, const floating *A, int lda,
                                const floating *Bp, bint beta1, floating *C,
                                int ldc) noexcept nogil:
    # C[m, n] (+)= Aᵀ · op(B), A given as [k, m] (row stride lda), op(B) packed by pack_rhs
    if floating is float:
        cgru_gemm_packed_f32_ta(m, n, k, A, lda, Bp, beta1, C, ldc)
    else:
        cgru_gemm_packed_f64_ta(m, n, k, A, lda, Bp, beta1, C, ldc)


cdef inline void loop_gemm(const Loop *L, int m, int n, int k, const floating *A, int lda,
                           const floating *Bp, bint beta1, floating *C, int ldc) noexcept nogil:
    # a time loop's per-step product: gemm_packed, shared with the loop's team if it has one
    # (bitwise the same result either way: team.h)
    if L.team != NULL:
        cgru_team_gemm(L.team, floating is double, m, n, k, A, lda, Bp, beta1, C, ldc)
    else:
        gemm_packed(m, n, k, A, lda, Bp, beta1, C, ldc)


# --- the loop (loops.pyx) --------------------------------------------------------------------
# The rows [b0, b1) and the direction d of work item `item` (direction-major, chunks of N).
cdef void item_rows(const Loop *L, int item, int *d, int *b0, int *b1) noexcept nogil
# Start of processing step s of work item `item`: True when the loop must stop (a signal
# handler raised, on any thread).  Polls signals on the caller's thread; fires the test probe.
cdef bint loop_step(const Loop *L, double *next_poll, int item, int s) noexcept nogil
# The first poll time of a loop.
cdef double first_poll() noexcept nogil
# For parallel_for: poll signals while the caller waits for the team's other threads.
cdef void poll_while_waiting(void *ctx) noexcept nogil
# A loop description for one layer call (arrays as given, NULL for None).
cdef Loop make_loop(int T, int N, int H, int S, int C, int D, int n_chunks, object lengths,
                    object mask, object y, object dy, int *abort, list errors, int gates)
# The mask row [S] of (time t, batch row b, direction d), or NULL without a mask.
cdef inline const floating *mask_row(const Loop *L, const floating *mask, int t, int b,
                                     int d) noexcept nogil:
    if mask == NULL:
        return NULL
    return mask + (<size_t>t * L.N + b) * L.D * L.S + <size_t>d * L.S
# The data pointer of an ndarray, or NULL for None.
cdef void *ptr(object a)


cdef struct Job:
    # one layer's time loops as work items of a team (direction-major, chunks of the batch)
    void *layer                # the cell kind's Layer struct (it starts with a Loop)
    const void *cell           # the cell kind's CellSpec
    Loop *loop                 # &layer.loop
    bint training

# Run fn(job, item) for every work item of J's layer on a team of up to num_threads threads
# (or its one loop with a thread team, team.h); raise the signal handler's exception
# afterwards.
cdef run_job(item_fn fn, Job *J, int num_threads, list errors)
