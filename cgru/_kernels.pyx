"""Time loops and fused gate kernels of one GRU layer (all its directions), forward and backward.

Equations (gates in canonical order r, z, n; row-vector form, per step t, one direction)::

    1. gx = x_t·Wᵀ                      (all steps at once, before the loop: engine.py)
    2. gh = (h ⊙ m)·Rᵀ                  (reset-after: all 3 gates; reset-before: r, z only)
    3. r = f_r(clip(gx_r + gh_r + b_r)),  z = f_z(clip(gx_z + gh_z + b_z))
           b_r = b_Wr + b_Rr, b_z = b_Wz + b_Rz                       (summed in engine.py)
    4. reset-after:  hn = gh_n + b_Rn,  n = g(clip(gx_n + b_Wn + r ⊙ hn))
       reset-before: gh_n = (r ⊙ h ⊙ m)·R_nᵀ,  n = g(clip(gx_n + gh_n + b_Wn + b_Rn))
    5. h' = n + z ⊙ (h − n)   (flip_z: h' = h + z ⊙ (n − h));  y_t = h'
    Rows with t ≥ len[b] are inactive: h' = h, y_t = 0.

Saved in the reserve by the training forward (per direction; T·N rows, time t row t·N + b)::

    ws_gates   [T, N, 3H]   r, z, n after activation   (0 on inactive rows)
    ws_pre     [T, N, 3H]   pre-activations before clip (general cells only)
    ws_hn      [T, N, H]    hn = gh_n + b_Rn            (reset-after only)
    ws_states  [T+1, N, H]  slot 0 = h0, slot t+1 = state after time t (forward);
                            slot T = h0, slot t = state after time t (reversed direction)

Backward (steps in reverse processing order; "bwd of k" undoes forward step k)::

    bwd of 5: dh += dy_t;  dn = dh ⊙ (1 − z), dz = dh ⊙ (h − n), dh_prev = dh ⊙ z
              (flip_z: dn = dh ⊙ z, dz = dh ⊙ (n − h), dh_prev = dh ⊙ (1 − z))
    bwd of 4: dpn = dn ⊙ g'(…);  reset-after: dgx_n = dpn, dgh_n = dpn ⊙ r, dr = dpn ⊙ hn
              reset-before: dgx_n = dgh_n = dpn, drh = dpn·R_n, dr = drh ⊙ h ⊙ m,
                            dh_prev += drh ⊙ r ⊙ m
    bwd of 3: dgx_r = dgh_r = dr ⊙ f_r'(…),  dgx_z = dgh_z = dz ⊙ f_z'(…)
    bwd of 2: dh_prev += m ⊙ (dgh·R)          (reset-before: r, z columns only)
    After the loop (engine.py): dW = dgxᵀ·X, dR = dghᵀ·(h ⊙ m) (reset-before n rows:
    dgh_nᵀ·(r ⊙ h ⊙ m), which the backward writes into ws_rhm), db_W = Σ dgx, db_R = Σ dgh,
    dX = dgx·W.

Parallelism: the work items (direction, batch chunk) run on cgru's thread pool (_threads);
each item runs the whole time loop for its rows.  The chunking depends on N only, so
results are bitwise identical for every thread count.
"""
from cython cimport floating
from libc.math cimport exp, expf, tanh, tanhf, log1p, log1pf, fabs
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset

import threading

import numpy as np
cimport numpy as cnp

from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport PyObject
from cgru._threads cimport is_worker, item_fn, parallel_for, wtime

cnp.import_array()

# The calling thread runs Python's signal handlers this often while a
# time loop runs, so that Ctrl-C stops a long layer; the other threads see the abort flag.
cdef double POLL_SECONDS = 0.05

cdef extern from "_simd.h" nogil:
    size_t cgru_packed_size(int n, int k, int nr)
    void cgru_pack_f32(int trans, int n, int k, const float *B, int ldb, float *Bp)
    void cgru_pack_f64(int trans, int n, int k, const double *B, int ldb, double *Bp)
    void cgru_gemm_packed_f32(int m, int n, int k, const float *A, int lda, const float *Bp,
                              int beta1, float *C, int ldc)
    void cgru_gemm_packed_f64(int m, int n, int k, const double *A, int lda, const double *Bp,
                              int beta1, double *C, int ldc)
    void cgru_sigmoid_f32(int n, const float *x, float *y)
    void cgru_tanh_f32(int n, const float *x, float *y)
    int CGRU_NR_F
    int CGRU_NR_D
    int cgru_isa()

# --- activations -----------------------------------------------------------------------------


cdef struct Act:
    int code
    double alpha
    double beta


cdef struct CellSpec:
    bint reset_after
    bint flip_z
    bint fast
    bint has_clip
    double clip
    Act f_r
    Act f_z
    Act g


cdef inline floating sigmoid(floating x) noexcept nogil:
    if floating is float:
        return 1.0 / (1.0 + expf(-x))
    else:
        return 1.0 / (1.0 + exp(-x))


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
    cdef floating v
    cdef int code = f.code
    if code == 0:
        return sigmoid(x)
    elif code == 1:
        return tanh_(x)
    elif code == 2:
        return x if x > 0 else 0
    elif code == 3:
        return x
    elif code == 4:
        v = a * x + b
        return 0 if v < 0 else (1 if v > 1 else v)
    elif code == 5:
        return a * x + b
    elif code == 6:
        return x if x >= 0 else a * x
    elif code == 7:
        return x if x > a else 0
    elif code == 8:
        return a * tanh_(b * x)
    elif code == 9:
        return x if x >= 0 else a * (exp_(x) - 1)
    elif code == 10:
        return x / (1 + fabs(x))
    else:  # 11 softplus, stable: max(x, 0) + log1p(exp(-|x|))
        if floating is float:
            return (x if x > 0 else 0) + log1pf(expf(-fabs(x)))
        else:
            return (x if x > 0 else 0) + log1p(exp(-fabs(x)))


cdef inline floating activate_grad(const Act *f, floating x, floating y) noexcept nogil:
    """d activation / d x at pre-activation x with value y."""
    cdef floating a = <floating>f.alpha
    cdef floating b = <floating>f.beta
    cdef floating v
    cdef int code = f.code
    if code == 0:
        return y * (1 - y)
    elif code == 1:
        return 1 - y * y
    elif code == 2:
        return 1 if x > 0 else 0
    elif code == 3:
        return 1
    elif code == 4:
        v = a * x + b
        return a if (v > 0 and v < 1) else 0
    elif code == 5:
        return a
    elif code == 6:
        return 1 if x >= 0 else a
    elif code == 7:
        return 1 if x > a else 0
    elif code == 8:
        v = tanh_(b * x)
        return a * b * (1 - v * v)
    elif code == 9:
        return 1 if x >= 0 else a * exp_(x)
    elif code == 10:
        v = 1 + fabs(x)
        return 1 / (v * v)
    else:
        return sigmoid(x)


cdef inline floating clip_grad(floating x, bint has_clip, floating c) noexcept nogil:
    if has_clip and (x > c or x < -c):
        return 0
    return 1


# --- the arguments of one layer --------------------------------------------------------------
cdef struct Dir:
    # per direction; every pointer is to the dtype's elements, rows as documented
    bint reverse
    const void *gx           # [T·N, 3H], row stride ldgx       (IN)
    Py_ssize_t ldgx
    const void *Rp           # forward: R_rzn (reset-after) or R_rz, packed for h·Rᵀ (IN)
    const void *Rp_n         # forward, reset-before: R_n packed for (r⊙h⊙m)·R_nᵀ      (IN)
    const void *Rb           # backward: R [3H, H] (reset-after) or R_rz [2H, H], packed (IN)
    const void *Rb_n         # backward, reset-before: R_n [H, H], packed              (IN)
    const void *b_rzn        # [3H] b_r, b_z, b_n (see step 3/4) (IN)
    const void *b_hn         # [H]  b_Rn (reset-after)           (IN)
    const void *h0           # [N, H]                           (IN)
    void *hy                 # [N, H]                           (OUT)
    void *gates              # [T·N, 3H] or NULL (inference)    (OUT)
    void *pre                # [T·N, 3H] or NULL                (OUT)
    void *hn                 # [T·N, H] or NULL                 (OUT)
    void *states             # [(T+1)·N, H] or NULL             (OUT)
    # backward
    const void *dhy          # [N, H] or NULL                   (IN)
    void *dh0                # [N, H]                           (OUT)
    void *dgx                # [T·N, 3H]                        (OUT)
    void *dgh                # [T·N, 3H] (reset-after)          (OUT)
    void *rhm                # [T·N, H]  (reset-before: r⊙h⊙m)  (OUT)
    void *hm                 # [T·N, H]  h⊙m (mask) or h (padding), 0 when inactive (OUT)


cdef struct Layer:
    int *abort                 # set when a signal handler raised: every work item stops
    bint poll                  # the caller polls for signals (calls from the main thread only)
    PyObject *errors           # list receiving the exception a signal handler raised
    int T
    int N
    int H
    int D
    int n_chunks
    const long long *lengths   # [N]
    const void *mask           # [T, N, D·H] or NULL
    void *y                    # [T, N, D·H] forward output      (OUT)
    const void *dy             # [T, N, D·H] or NULL             (IN, backward)
    Dir dirs[2]


cdef extern from *:
    """
    #include <signal.h>
    static inline int cgru_load(const int *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
    static inline void cgru_store(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
    static inline int cgru_add(int *p, int v) { return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL); }
    """
    int cgru_load(const int *p) noexcept nogil
    void cgru_store(int *p, int v) noexcept nogil
    int cgru_add(int *p, int v) noexcept nogil
    int raise_signal "raise"(int sig) noexcept nogil
    int SIGINT


cdef void check_signals(const Layer *L) noexcept nogil:
    """Run Python's signal handlers (the caller's thread, main-thread calls only); an exception
    they raise (KeyboardInterrupt) is kept for the caller and stops every work item."""
    with gil:
        try:
            PyErr_CheckSignals()
        except BaseException as e:
            (<list>L.errors).append(e)
            cgru_store(L.abort, 1)


cdef void poll_while_waiting(void *ctx) noexcept nogil:
    # the pool calls this on the caller's thread while it waits for the workers
    cdef const Layer *L = <const Layer *>ctx
    if L.poll and not cgru_load(L.abort):
        check_signals(L)


cdef bint stop_requested(const Layer *L, double *next_poll) noexcept nogil:
    """True when the loop must stop.  On the caller's thread of a main-thread call, every
    POLL_SECONDS (or at once after a test probe fired), run Python's signal handlers."""
    cdef double now
    if cgru_load(L.abort):
        return True
    if L.poll and not is_worker():
        now = wtime()
        if now >= next_poll[0] or cgru_load(&probe.poll_now):
            next_poll[0] = now + POLL_SECONDS
            cgru_store(&probe.poll_now, 0)
            check_signals(L)
            return cgru_load(L.abort) != 0
    return False


# --- test probes ---------------------------------------------------------------------------
# Deterministic hooks for the tests of signals, GIL release and concurrency (no test measures
# a duration): at processing step `step` of work item 0 of every time loop, item 0
#   action 1: raises SIGINT (as Ctrl-C would) and makes the caller poll at its next step;
#   action 2: arrives at a rendezvous and waits (at most `timeout` s) until `needed` parties
#             have arrived — other time loops' item 0 at the same step, or a Python thread
#             calling probe_arrive().
# `steps` counts the steps item 0 completed in the last loop.  Off (step −1) by default; the
# check is one comparison per step.
cdef struct Probe:
    int step
    int action
    int needed
    int arrived
    int timed_out
    int poll_now
    int steps
    double timeout

cdef Probe probe
probe.step = -1


cdef void fire_probe() noexcept nogil:
    cdef double until
    if probe.action == 1:
        raise_signal(SIGINT)
        cgru_store(&probe.poll_now, 1)
    elif probe.action == 2:
        cgru_add(&probe.arrived, 1)
        until = wtime() + probe.timeout
        while cgru_load(&probe.arrived) < probe.needed:
            if wtime() > until:
                cgru_store(&probe.timed_out, 1)
                break


def set_probe(int step=-1, int action=0, int needed=2, double timeout=60.0):
    """Arm the test probe (see above); ``step=-1`` disarms it.  Resets the counters."""
    probe.step, probe.action, probe.needed, probe.timeout = step, action, needed, timeout
    probe.arrived = probe.timed_out = probe.poll_now = probe.steps = 0


def probe_state():
    """``{"arrived", "timed_out", "steps"}`` of the test probe."""
    return {"arrived": cgru_load(&probe.arrived), "timed_out": bool(probe.timed_out),
            "steps": cgru_load(&probe.steps)}


def probe_arrive():
    """Arrive at the probe's rendezvous from Python (needs the GIL: proves the loop released it)."""
    cgru_add(&probe.arrived, 1)


cdef inline void *ptr(object a):
    return NULL if a is None else cnp.PyArray_DATA(<cnp.ndarray>a)


# --- forward -------------------------------------------------------------------------------
cdef inline void sigmoid_inplace(floating *v, int n) noexcept nogil:
    cdef int j
    if floating is float:
        cgru_sigmoid_f32(n, v, v)
    else:
        for j in range(n):
            v[j] = sigmoid(v[j])


cdef inline void tanh_inplace(floating *v, int n) noexcept nogil:
    cdef int j
    if floating is float:
        cgru_tanh_f32(n, v, v)
    else:
        for j in range(n):
            v[j] = tanh_(v[j])


cdef inline void gemm_packed(int m, int n, int k, const floating *A, int lda,
                             const floating *Bp, bint beta1, floating *C, int ldc) noexcept nogil:
    # C[m, n] (+)= A[m, k] · op(B), op(B) packed by pack_rhs
    if floating is float:
        cgru_gemm_packed_f32(m, n, k, A, lda, Bp, beta1, C, ldc)
    else:
        cgru_gemm_packed_f64(m, n, k, A, lda, Bp, beta1, C, ldc)


cdef inline void blend(floating *hnew, const floating *hp, const floating *z,
                       const floating *n, int H, bint flip) noexcept nogil:
    # 5. h' = n + z ⊙ (h − n)   (flip_z: h' = h + z ⊙ (n − h))
    cdef int j
    if flip:
        for j in range(H):
            hnew[j] = hp[j] + z[j] * (n[j] - hp[j])
    else:
        for j in range(H):
            hnew[j] = n[j] + z[j] * (hp[j] - n[j])


cdef void general_gates(const CellSpec *C, int H, const floating *gxr, const floating *ghr,
                        const floating *b_rzn, const floating *b_hn,
                        floating *g3, floating *hn, floating *pre3) noexcept nogil:
    """Steps 3-4 for a general cell, reset-after: gates into g3 [3H], hn [H], pre3 [3H]."""
    cdef floating clipv = <floating>C.clip
    cdef bint has_clip = C.has_clip
    cdef floating pr, pz, pn, r
    cdef int j
    for j in range(H):
        pr = gxr[j] + ghr[j] + b_rzn[j]
        pz = gxr[H + j] + ghr[H + j] + b_rzn[H + j]
        r = activate(&C.f_r, clamp(pr, has_clip, clipv))
        g3[j] = r
        g3[H + j] = activate(&C.f_z, clamp(pz, has_clip, clipv))
        hn[j] = ghr[2 * H + j] + b_hn[j]
        pn = gxr[2 * H + j] + b_rzn[2 * H + j] + r * hn[j]
        g3[2 * H + j] = activate(&C.g, clamp(pn, has_clip, clipv))
        if pre3 != NULL:
            pre3[j] = pr
            pre3[H + j] = pz
            pre3[2 * H + j] = pn


cdef int forward_item(const floating *sample, const Layer *L, const CellSpec *C, int item,
                      bint training) noexcept nogil:
    """Whole time loop for one (direction, batch chunk) work item.  Returns 0, or -1 if out of
    memory."""
    cdef int T = L.T, N = L.N, H = L.H, D = L.D
    cdef int d = item // L.n_chunks, c = item % L.n_chunks
    cdef int b0 = <int>((<long long>c * N) // L.n_chunks)
    cdef int b1 = <int>((<long long>(c + 1) * N) // L.n_chunks)
    cdef int rows = b1 - b0
    cdef const Dir *P = &L.dirs[d]
    cdef const floating *gx = <const floating *>P.gx
    cdef const floating *Rp = <const floating *>P.Rp
    cdef const floating *Rp_n = <const floating *>P.Rp_n
    cdef const floating *b_rzn = <const floating *>P.b_rzn
    cdef const floating *b_hn = <const floating *>P.b_hn
    cdef const floating *mask = <const floating *>L.mask
    cdef floating *y = <floating *>L.y
    cdef floating *states = <floating *>P.states
    cdef floating *ws_gates = <floating *>P.gates
    cdef floating *ws_pre = <floating *>P.pre
    cdef floating *ws_hn = <floating *>P.hn
    cdef Py_ssize_t H3 = 3 * H, DH = D * H, ldgx = P.ldgx
    cdef floating clipv = <floating>C.clip
    cdef bint has_clip = C.has_clip, flip = C.flip_z, fast = C.fast
    cdef int s, t, i, j, b
    cdef Py_ssize_t row
    cdef const floating *gxr
    cdef const floating *mrow
    cdef const floating *hp
    cdef floating *hnew
    cdef floating *ghr
    cdef floating *g3
    cdef floating *hn
    cdef floating *pre3
    cdef floating pn
    if rows <= 0:
        return 0
    # scratch: gh [rows, 3H] | hm [rows, H] | g3 [rows, 3H] (inference gates) |
    #          h_a, h_b [rows, H] (inference: the state, ping-pong)
    cdef floating *scratch = <floating *>malloc((<size_t>rows) * 9 * H * sizeof(floating) + 64)
    if scratch == NULL:
        return -1
    cdef floating *gh = scratch
    cdef floating *hm = gh + <size_t>rows * H3
    cdef floating *g3s = hm + <size_t>rows * H
    cdef floating *h_a = g3s + <size_t>rows * H3
    cdef floating *h_b = h_a + <size_t>rows * H
    cdef floating *h_prev
    cdef floating *h_next
    cdef const floating *h_src

    # initial state
    if training:
        h_prev = states + (<size_t>(T if P.reverse else 0) * N + b0) * H
    else:
        h_prev = h_a
    memcpy(h_prev, <const floating *>P.h0 + <size_t>b0 * H, <size_t>rows * H * sizeof(floating))

    cdef double next_poll = wtime() + POLL_SECONDS
    for s in range(T):
        if stop_requested(L, &next_poll):
            break
        if item == 0:
            cgru_store(&probe.steps, s + 1)
            if s == probe.step:
                fire_probe()
        t = T - 1 - s if P.reverse else s
        if training:
            h_next = states + (<size_t>(t if P.reverse else t + 1) * N + b0) * H
        else:
            h_next = h_b if h_prev == h_a else h_a
        # 2. gh = (h ⊙ m)·Rᵀ
        h_src = h_prev
        if mask != NULL:
            for i in range(rows):
                mrow = mask + (<size_t>t * N + b0 + i) * DH + <size_t>d * H
                for j in range(H):
                    hm[i * H + j] = h_prev[i * H + j] * mrow[j]
            h_src = hm
        # gh[rows, 3H (reset-after) or 2H] = h_src[rows, H] · R[3H or 2H, H]ᵀ
        gemm_packed(rows, 3 * H if C.reset_after else 2 * H, H, h_src, H, Rp, False, gh, H3)
        if not C.reset_after:
            # reset-before, 3.: r, z; then hm = r ⊙ h ⊙ m for the candidate's product
            for i in range(rows):
                b = b0 + i
                row = <Py_ssize_t>t * N + b
                hp = h_prev + i * H
                g3 = (ws_gates + row * H3) if training else (g3s + i * H3)
                if t >= L.lengths[b]:
                    memset(hm + i * H, 0, H * sizeof(floating))
                    continue
                gxr = gx + row * ldgx
                ghr = gh + i * H3
                for j in range(2 * H):
                    g3[j] = gxr[j] + ghr[j] + b_rzn[j]
                if fast:
                    sigmoid_inplace(g3, 2 * H)
                else:
                    if training:
                        memcpy(ws_pre + row * H3, g3, 2 * H * sizeof(floating))
                    for j in range(H):
                        g3[j] = activate(&C.f_r, clamp(g3[j], has_clip, clipv))
                        g3[H + j] = activate(&C.f_z, clamp(g3[H + j], has_clip, clipv))
                mrow = mask + (<size_t>t * N + b) * DH + <size_t>d * H if mask != NULL else NULL
                if mrow != NULL:
                    for j in range(H):
                        hm[i * H + j] = g3[j] * hp[j] * mrow[j]
                else:
                    for j in range(H):
                        hm[i * H + j] = g3[j] * hp[j]
            # gh_n[rows, H] = hm[rows, H] · R_n[H, H]ᵀ
            gemm_packed(rows, H, H, hm, H, Rp_n, False, gh + 2 * H, H3)
        for i in range(rows):
            b = b0 + i
            row = <Py_ssize_t>t * N + b
            hp = h_prev + i * H
            hnew = h_next + i * H
            if t >= L.lengths[b]:
                # inactive: the state passes through, the output is 0
                memcpy(hnew, hp, H * sizeof(floating))
                memset(y + row * DH + d * H, 0, H * sizeof(floating))
                if training:
                    memset(ws_gates + row * H3, 0, H3 * sizeof(floating))
                    if ws_hn != NULL:
                        memset(ws_hn + row * H, 0, H * sizeof(floating))
                    if ws_pre != NULL:
                        memset(ws_pre + row * H3, 0, H3 * sizeof(floating))
                continue
            gxr = gx + row * ldgx
            ghr = gh + i * H3
            g3 = (ws_gates + row * H3) if training else (g3s + i * H3)
            if C.reset_after:
                hn = (ws_hn + row * H) if training else (ghr + 2 * H)
                if fast:
                    # 3. r, z
                    for j in range(2 * H):
                        g3[j] = gxr[j] + ghr[j] + b_rzn[j]
                    sigmoid_inplace(g3, 2 * H)
                    # 4. hn = gh_n + b_Rn, n = tanh(gx_n + b_Wn + r ⊙ hn)
                    for j in range(H):
                        hn[j] = ghr[2 * H + j] + b_hn[j]
                        g3[2 * H + j] = gxr[2 * H + j] + b_rzn[2 * H + j] + g3[j] * hn[j]
                    tanh_inplace(g3 + 2 * H, H)
                else:
                    pre3 = (ws_pre + row * H3) if training else NULL
                    general_gates(C, H, gxr, ghr, b_rzn, b_hn, g3, hn, pre3)
            else:
                # 4. n = g(gx_n + gh_n + b_Wn + b_Rn)
                for j in range(H):
                    g3[2 * H + j] = gxr[2 * H + j] + ghr[2 * H + j] + b_rzn[2 * H + j]
                if fast:
                    tanh_inplace(g3 + 2 * H, H)
                else:
                    for j in range(H):
                        pn = g3[2 * H + j]
                        if training:
                            ws_pre[row * H3 + 2 * H + j] = pn
                        g3[2 * H + j] = activate(&C.g, clamp(pn, has_clip, clipv))
            blend(hnew, hp, g3 + H, g3 + 2 * H, H, flip)
            memcpy(y + row * DH + d * H, hnew, H * sizeof(floating))
        h_prev = h_next
    memcpy(<floating *>P.hy + <size_t>b0 * H, h_prev, <size_t>rows * H * sizeof(floating))
    free(scratch)
    return 0


# --- backward ------------------------------------------------------------------------------
cdef inline void bwd_row_fast_ra(int H, const floating *g3, const floating *hp,
                                 const floating *hn, floating *dh, floating *dgx, floating *dgh,
                                 bint flip) noexcept nogil:
    """Steps bwd of 5, 4, 3 for one row of the sigmoid/tanh reset-after cell: reads the gates
    g3 = [r, z, n], h_prev, hn; turns dh into dh_prev (before the GEMM); writes dgx, dgh."""
    cdef int j
    cdef floating r, z, n, dhv, dn, dz, dpn, dpz, dpr
    if flip:
        for j in range(H):
            r = g3[j]
            z = g3[H + j]
            n = g3[2 * H + j]
            dhv = dh[j]
            dn = dhv * z
            dz = dhv * (n - hp[j])
            dh[j] = dhv * (1 - z)
            dpn = dn * (1 - n * n)
            dpz = dz * z * (1 - z)
            dpr = dpn * hn[j] * r * (1 - r)
            dgx[j] = dpr
            dgx[H + j] = dpz
            dgx[2 * H + j] = dpn
            dgh[j] = dpr
            dgh[H + j] = dpz
            dgh[2 * H + j] = dpn * r
    else:
        for j in range(H):
            r = g3[j]
            z = g3[H + j]
            n = g3[2 * H + j]
            dhv = dh[j]
            dn = dhv * (1 - z)
            dz = dhv * (hp[j] - n)
            dh[j] = dhv * z
            dpn = dn * (1 - n * n)
            dpz = dz * z * (1 - z)
            dpr = dpn * hn[j] * r * (1 - r)
            dgx[j] = dpr
            dgx[H + j] = dpz
            dgx[2 * H + j] = dpn
            dgh[j] = dpr
            dgh[H + j] = dpz
            dgh[2 * H + j] = dpn * r


cdef int backward_item(const floating *sample, const Layer *L, const CellSpec *C,
                       int item) noexcept nogil:
    """Backward time loop for one (direction, batch chunk) work item (see the module
    docstring).  Returns 0, or -1 if out of memory."""
    cdef int T = L.T, N = L.N, H = L.H, D = L.D
    cdef int d = item // L.n_chunks, c = item % L.n_chunks
    cdef int b0 = <int>((<long long>c * N) // L.n_chunks)
    cdef int b1 = <int>((<long long>(c + 1) * N) // L.n_chunks)
    cdef int rows = b1 - b0
    cdef const Dir *P = &L.dirs[d]
    cdef const floating *Rb = <const floating *>P.Rb
    cdef const floating *Rb_n = <const floating *>P.Rb_n
    cdef const floating *mask = <const floating *>L.mask
    cdef const floating *dy = <const floating *>L.dy
    cdef const floating *states = <const floating *>P.states
    cdef const floating *ws_gates = <const floating *>P.gates
    cdef const floating *ws_pre = <const floating *>P.pre
    cdef const floating *ws_hn = <const floating *>P.hn
    cdef floating *dgx = <floating *>P.dgx
    cdef floating *dgh = <floating *>P.dgh if C.reset_after else <floating *>P.dgx
    cdef floating *rhm = <floating *>P.rhm
    cdef floating *hm = <floating *>P.hm
    cdef Py_ssize_t H3 = 3 * H, DH = D * H
    cdef floating clipv = <floating>C.clip
    cdef bint has_clip = C.has_clip, flip = C.flip_z, fast = C.fast
    cdef int s, t, i, j, b
    cdef Py_ssize_t row
    cdef const floating *hp
    cdef const floating *g3
    cdef const floating *pre3
    cdef const floating *mrow
    cdef floating *dxr
    cdef floating *dhr
    cdef floating r, z, n, hv, dhv, dn, dz, dpn, dpr, dpz, dr, m
    if rows <= 0:
        return 0
    # scratch: dh [rows, H] (the carry) | tmp [rows, H] (GEMM result)
    cdef floating *scratch = <floating *>malloc((<size_t>rows) * 2 * H * sizeof(floating) + 64)
    if scratch == NULL:
        return -1
    cdef floating *dh = scratch
    cdef floating *tmp = dh + <size_t>rows * H
    if P.dhy != NULL:
        memcpy(dh, <const floating *>P.dhy + <size_t>b0 * H, <size_t>rows * H * sizeof(floating))
    else:
        memset(dh, 0, <size_t>rows * H * sizeof(floating))

    cdef double next_poll = wtime() + POLL_SECONDS
    for s in range(T):
        if stop_requested(L, &next_poll):
            break
        if item == 0:
            cgru_store(&probe.steps, s + 1)
            if s == probe.step:
                fire_probe()
        t = s if P.reverse else T - 1 - s
        # h_prev of time t: slot t (forward) or t+1 (reversed)
        hp = states + (<size_t>(t + 1 if P.reverse else t) * N + b0) * H
        for i in range(rows):
            b = b0 + i
            row = <Py_ssize_t>t * N + b
            dhr = dh + i * H
            dxr = dgx + row * H3
            mrow = mask + (<size_t>t * N + b) * DH + <size_t>d * H if mask != NULL else NULL
            if t >= L.lengths[b]:
                # inactive: the state passes through; no gate gradients, and zeros in every
                # operand row of the weight-gradient GEMMs (padding never reaches dW, dR)
                if hm != NULL:
                    memset(hm + row * H, 0, H * sizeof(floating))
                memset(dxr, 0, H3 * sizeof(floating))
                if C.reset_after:
                    memset(dgh + row * H3, 0, H3 * sizeof(floating))
                else:
                    memset(rhm + row * H, 0, H * sizeof(floating))
                continue
            if hm != NULL:
                # h_prev as it entered the recurrent product: h ⊙ m (or h), for dR
                if mrow != NULL:
                    for j in range(H):
                        hm[row * H + j] = hp[i * H + j] * mrow[j]
                else:
                    memcpy(hm + row * H, hp + i * H, H * sizeof(floating))
            if dy != NULL:
                for j in range(H):
                    dhr[j] += dy[row * DH + d * H + j]
            g3 = ws_gates + row * H3
            pre3 = ws_pre + row * H3 if ws_pre != NULL else NULL
            if fast and C.reset_after:
                # the common cell: branch-free, so that the compiler vectorises it
                bwd_row_fast_ra(H, g3, hp + i * H, ws_hn + row * H, dhr, dxr, dgh + row * H3, flip)
                continue
            for j in range(H):
                r = g3[j]
                z = g3[H + j]
                n = g3[2 * H + j]
                hv = hp[i * H + j]
                dhv = dhr[j]
                # bwd of 5
                if flip:
                    dn = dhv * z
                    dz = dhv * (n - hv)
                    dhr[j] = dhv * (1 - z)
                else:
                    dn = dhv * (1 - z)
                    dz = dhv * (hv - n)
                    dhr[j] = dhv * z
                # bwd of 4 (candidate), 3 (update gate)
                if fast:
                    dpn = dn * (1 - n * n)
                    dpz = dz * z * (1 - z)
                else:
                    dpn = dn * activate_grad(&C.g, clamp(pre3[2 * H + j], has_clip, clipv), n) \
                        * clip_grad(pre3[2 * H + j], has_clip, clipv)
                    dpz = dz * activate_grad(&C.f_z, clamp(pre3[H + j], has_clip, clipv), z) \
                        * clip_grad(pre3[H + j], has_clip, clipv)
                dxr[H + j] = dpz
                dxr[2 * H + j] = dpn
                if C.reset_after:
                    dr = dpn * ws_hn[row * H + j]
                    if fast:
                        dpr = dr * r * (1 - r)
                    else:
                        dpr = dr * activate_grad(&C.f_r, clamp(pre3[j], has_clip, clipv), r) \
                            * clip_grad(pre3[j], has_clip, clipv)
                    dxr[j] = dpr
                    dgh[row * H3 + j] = dpr
                    dgh[row * H3 + H + j] = dpz
                    dgh[row * H3 + 2 * H + j] = dpn * r
                else:
                    m = mrow[j] if mrow != NULL else 1
                    rhm[row * H + j] = r * hv * m
        if C.reset_after:
            # bwd of 2: dh_prev += m ⊙ (dgh[rows, 3H] · R[3H, H])
            if mask == NULL:
                gemm_packed(rows, H, 3 * H, dgh + (<size_t>t * N + b0) * H3, H3, Rb, True, dh, H)
            else:
                gemm_packed(rows, H, 3 * H, dgh + (<size_t>t * N + b0) * H3, H3, Rb, False,
                            tmp, H)
                for i in range(rows):
                    if t >= L.lengths[b0 + i]:
                        continue            # the mask of a padded step is never read
                    mrow = mask + (<size_t>t * N + b0 + i) * DH + <size_t>d * H
                    for j in range(H):
                        dh[i * H + j] += mrow[j] * tmp[i * H + j]
        else:
            # bwd of 4 (reset-before): drh[rows, H] = dgx_n[rows, H] · R_n[H, H]
            gemm_packed(rows, H, H, dgx + (<size_t>t * N + b0) * H3 + 2 * H, H3, Rb_n, False,
                        tmp, H)
            for i in range(rows):
                b = b0 + i
                if t >= L.lengths[b]:
                    continue
                row = <Py_ssize_t>t * N + b
                g3 = ws_gates + row * H3
                pre3 = ws_pre + row * H3 if ws_pre != NULL else NULL
                mrow = mask + (<size_t>t * N + b) * DH + <size_t>d * H if mask != NULL else NULL
                for j in range(H):
                    r = g3[j]
                    m = mrow[j] if mrow != NULL else 1
                    dr = tmp[i * H + j] * hp[i * H + j] * m
                    dh[i * H + j] += tmp[i * H + j] * r * m
                    if fast:
                        dpr = dr * r * (1 - r)
                    else:
                        dpr = dr * activate_grad(&C.f_r, clamp(pre3[j], has_clip, clipv), r) \
                            * clip_grad(pre3[j], has_clip, clipv)
                    dgx[row * H3 + j] = dpr
            # bwd of 2: dh_prev += m ⊙ (dgx_rz[rows, 2H] · R_rz[2H, H])
            if mask == NULL:
                gemm_packed(rows, H, 2 * H, dgx + (<size_t>t * N + b0) * H3, H3, Rb, True, dh, H)
            else:
                gemm_packed(rows, H, 2 * H, dgx + (<size_t>t * N + b0) * H3, H3, Rb, False,
                            tmp, H)
                for i in range(rows):
                    if t >= L.lengths[b0 + i]:
                        continue            # the mask of a padded step is never read
                    mrow = mask + (<size_t>t * N + b0 + i) * DH + <size_t>d * H
                    for j in range(H):
                        dh[i * H + j] += mrow[j] * tmp[i * H + j]
    memcpy(<floating *>P.dh0 + <size_t>b0 * H, dh, <size_t>rows * H * sizeof(floating))
    free(scratch)
    return 0


# --- Python entry points -------------------------------------------------------------------
cdef CellSpec make_cell(object cell):
    cdef CellSpec C
    C.reset_after = cell.reset_after
    C.flip_z = cell.flip_z
    C.fast = cell.is_fast
    C.has_clip = cell.clip is not None
    C.clip = cell.clip if cell.clip is not None else 0.0
    C.f_r.code = cell.f_r.code
    C.f_r.alpha = cell.f_r.alpha
    C.f_r.beta = cell.f_r.beta
    C.f_z.code = cell.f_z.code
    C.f_z.alpha = cell.f_z.alpha
    C.f_z.beta = cell.f_z.beta
    C.g.code = cell.g.code
    C.g.alpha = cell.g.alpha
    C.g.beta = cell.g.beta
    return C


cdef Layer make_layer(int T, int N, int H, int n_chunks, object lengths, object mask,
                      object y, object dy, list dirs, int *abort, list errors):
    cdef Layer L
    cdef Dir *P
    memset(&L, 0, sizeof(Layer))
    L.abort = abort
    L.errors = <PyObject *>errors
    L.poll = threading.current_thread() is threading.main_thread()
    L.T, L.N, L.H, L.D, L.n_chunks = T, N, H, len(dirs), n_chunks
    L.lengths = <const long long *>ptr(lengths)
    L.mask = ptr(mask)
    L.y = ptr(y)
    L.dy = ptr(dy)
    for d, a in enumerate(dirs):
        P = &L.dirs[d]
        P.reverse = a["reverse"]
        P.gx = ptr(a.get("gx"))
        P.ldgx = a.get("ldgx", 3 * H)
        P.Rp = ptr(a.get("Rp"))
        P.Rp_n = ptr(a.get("Rp_n"))
        P.Rb = ptr(a.get("Rb"))
        P.Rb_n = ptr(a.get("Rb_n"))
        P.b_rzn = ptr(a.get("b_rzn"))
        P.b_hn = ptr(a.get("b_hn"))
        P.h0 = ptr(a.get("h0"))
        P.hy = ptr(a.get("hy"))
        P.gates = ptr(a.get("gates"))
        P.pre = ptr(a.get("pre"))
        P.hn = ptr(a.get("hn"))
        P.states = ptr(a.get("states"))
        P.dhy = ptr(a.get("dhy"))
        P.dh0 = ptr(a.get("dh0"))
        P.dgx = ptr(a.get("dgx"))
        P.dgh = ptr(a.get("dgh"))
        P.rhm = ptr(a.get("rhm"))
        P.hm = ptr(a.get("hm"))
    return L


cdef struct LoopJob:
    Layer *L
    CellSpec *C
    bint training
    int failed              # set (atomically) when a work item ran out of memory


cdef void forward_item_f(void *ctx, int item) noexcept nogil:
    cdef LoopJob *J = <LoopJob *>ctx
    if forward_item(<const float *>NULL, J.L, J.C, item, J.training) != 0:
        cgru_store(&J.failed, 1)


cdef void forward_item_d(void *ctx, int item) noexcept nogil:
    cdef LoopJob *J = <LoopJob *>ctx
    if forward_item(<const double *>NULL, J.L, J.C, item, J.training) != 0:
        cgru_store(&J.failed, 1)


cdef void backward_item_f(void *ctx, int item) noexcept nogil:
    cdef LoopJob *J = <LoopJob *>ctx
    if backward_item(<const float *>NULL, J.L, J.C, item) != 0:
        cgru_store(&J.failed, 1)


cdef void backward_item_d(void *ctx, int item) noexcept nogil:
    cdef LoopJob *J = <LoopJob *>ctx
    if backward_item(<const double *>NULL, J.L, J.C, item) != 0:
        cgru_store(&J.failed, 1)


cdef run_items(item_fn fn, LoopJob *J, int num_threads, list errors, str what):
    """Every (direction, batch chunk) work item of one layer on the pool."""
    cdef int n_items = J.L.D * J.L.n_chunks
    with nogil:
        parallel_for(n_items, num_threads, fn, J, poll_while_waiting, J.L)
    if errors:
        raise errors[0]
    if J.failed:
        raise MemoryError(f"cgru: out of memory for the per-thread scratch of the {what} loop")


def forward_layer(dtype, int T, int N, int H, int n_chunks, int num_threads, cell,
                  lengths, mask, y, list dirs, bint training):
    """Run the forward time loops of one layer.  ``dirs`` holds one dict of arrays per
    direction (keys as in the ``Dir`` struct); every array is C-contiguous, of ``dtype``, and
    of the documented size — the engine checks, this function trusts."""
    cdef CellSpec C = make_cell(cell)
    cdef int abort = 0
    cdef list errors = []
    cdef Layer L = make_layer(T, N, H, n_chunks, lengths, mask, y, None, dirs, &abort, errors)
    cdef LoopJob J
    if T == 0 or N == 0:
        return
    J.L, J.C, J.training, J.failed = &L, &C, training, 0
    run_items(forward_item_f if np.dtype(dtype) == np.float32 else forward_item_d, &J,
              num_threads, errors, "forward")


def backward_layer(dtype, int T, int N, int H, int n_chunks, int num_threads, cell,
                   lengths, mask, dy, list dirs):
    """Run the backward time loops of one layer (see ``forward_layer``)."""
    cdef CellSpec C = make_cell(cell)
    cdef int abort = 0
    cdef list errors = []
    cdef Layer L = make_layer(T, N, H, n_chunks, lengths, mask, None, dy, dirs, &abort, errors)
    cdef LoopJob J
    if T == 0 or N == 0:
        return
    J.L, J.C, J.training, J.failed = &L, &C, False, 0
    run_items(backward_item_f if np.dtype(dtype) == np.float32 else backward_item_d, &J,
              num_threads, errors, "backward")


def pack_rhs(B, bint trans):
    """Pack ``op(B)`` (``[k, n]``; ``B`` is ``[k, n]``, or ``[n, k]`` when ``trans``) for the
    time loop's GEMMs.  ``B`` is a C-contiguous 2-D float32/float64 array."""
    cdef cnp.ndarray arr = B
    cdef int n = B.shape[0] if trans else B.shape[1]
    cdef int k = B.shape[1] if trans else B.shape[0]
    cdef int ldb = B.shape[1]
    cdef cnp.ndarray out
    if B.dtype == np.float32:
        out = np.empty(cgru_packed_size(n, k, CGRU_NR_F), np.float32)
        cgru_pack_f32(trans, n, k, <const float *>cnp.PyArray_DATA(arr), ldb,
                      <float *>cnp.PyArray_DATA(out))
    else:
        out = np.empty(cgru_packed_size(n, k, CGRU_NR_D), np.float64)
        cgru_pack_f64(trans, n, k, <const double *>cnp.PyArray_DATA(arr), ldb,
                      <double *>cnp.PyArray_DATA(out))
    return out


def gemm_packed_rm(A, Bp, int n, C, bint beta1):
    """``C[m, n] (+)= A[m, k] · op(B)`` with ``op(B)`` from ``pack_rhs`` (for tests)."""
    cdef cnp.ndarray a = A, bp = Bp, c = C
    cdef int m = A.shape[0], k = A.shape[1]
    if A.dtype == np.float32:
        cgru_gemm_packed_f32(m, n, k, <const float *>cnp.PyArray_DATA(a), k,
                             <const float *>cnp.PyArray_DATA(bp), beta1,
                             <float *>cnp.PyArray_DATA(c), n)
    else:
        cgru_gemm_packed_f64(m, n, k, <const double *>cnp.PyArray_DATA(a), k,
                             <const double *>cnp.PyArray_DATA(bp), beta1,
                             <double *>cnp.PyArray_DATA(c), n)


def vector_math_f32(name, x):
    """``sigmoid`` or ``tanh`` of a C-contiguous float32 array through the kernels' vector
    code (for tests)."""
    cdef cnp.ndarray a = np.ascontiguousarray(x, np.float32)
    cdef cnp.ndarray out = np.empty_like(a)
    if name == "sigmoid":
        cgru_sigmoid_f32(a.size, <const float *>cnp.PyArray_DATA(a), <float *>cnp.PyArray_DATA(out))
    elif name == "tanh":
        cgru_tanh_f32(a.size, <const float *>cnp.PyArray_DATA(a), <float *>cnp.PyArray_DATA(out))
    else:
        raise ValueError(f"name: expected 'sigmoid' or 'tanh', got {name!r}")
    return out


cgru_isa()  # decide the ISA once, at import, before any thread can ask


def simd_isa():
    """The vector code the time loops' GEMM runs: "AVX-512", "AVX2+FMA" or "baseline"."""
    return {4: "AVX-512", 3: "AVX2+FMA"}.get(cgru_isa(), "baseline")
