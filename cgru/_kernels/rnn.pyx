"""Time loops of one vanilla RNN layer (cuDNN's CUDNN_RNN_TANH / CUDNN_RNN_RELU, ONNX's RNN),
forward and backward.

Equations (row-vector form, per step t, one direction)::

    1. gx = x_t·Wᵀ                     [N, H]  (all steps at once, before the loop)
    2. gh = (h ⊙ m)·Rᵀ                 [N, H]
    3. a = gx + gh + b,  h' = act(clip(a))     (b = b_W + b_R, summed in the engine);  y_t = h'
    Rows with t ≥ len[b] are inactive: h' = h, y_t = 0.

Saved in the reserve by the training forward (per direction; T·N rows, time t row t·N + b)::

    ws_states  [T+1, N, H]  slot 0 = h0, slot t+1 = state after time t (forward);
                            slot T = h0, slot t = state after time t (reversed direction)
    ws_pre     [T, N, H]    a before clip (cells other than tanh / relu without clip)

Backward (steps in reverse processing order)::

    dh += dy_t;  da = dh ⊙ act'(…) (⊙ clip') → dgx;  dh_prev = m ⊙ (da·R)
    After the loop (engine): dW = daᵀ·X, dR = daᵀ·(h ⊙ m), db_W = db_R = Σ da, dX = da·W.

This file holds the kind's own part: the fused gate math of one step (fwd_step, bwd_step);
the time loop around it is driver.pxi's, the same for every kind.

Parallelism as for the other kinds: (direction, batch chunk) work items on an OpenMP team, or
one item whose per-step products a thread team shares (team.h).
"""
from cython cimport floating
from libc.string cimport memcpy, memset

import numpy as np
cimport numpy as cnp

from cgru._kernels.loops cimport *

cnp.import_array()


cdef struct CellSpec:
    int fast             # 1: tanh, 2: relu (no clip: the derivative comes from h'); 0: general
    bint has_clip
    double clip
    Act act


cdef struct Dir:
    States st                # h0, hy, states, dhy, dh0, hm (loops.pxd); dG = dgx
    const void *gx           # [T·N, H], row stride ldgx        (IN)
    Py_ssize_t ldgx
    const void *Rp           # R [H, H] packed for h·Rᵀ          (IN, forward)
    const void *b            # [H] b_W + b_R                    (IN)
    void *pre                # [T·N, H] or NULL                 (OUT)
    void *dgx                # [T·N, H]                         (OUT)


cdef struct Layer:
    Loop loop
    Dir dirs[2]


# --- one step (the time loops: driver.pxi) ---------------------------------------------------
cdef inline size_t fwd_work(const Layer *L, int rows) noexcept nogil:
    return <size_t>rows * L.loop.H                  # gh [rows, H]


cdef inline void fwd_step(const Layer *L, const CellSpec *C, const Dir *P, int d, int t,
                          int b0, int rows, const floating *h_src, const floating *h_prev,
                          floating *h_next, const floating *c_prev, floating *c_next,
                          floating *work, bint training) noexcept nogil:
    cdef const Loop *Lp = &L.loop
    cdef int H = Lp.H, i, j
    cdef Py_ssize_t row
    cdef const floating *bias = <const floating *>P.b
    cdef floating *ws_pre = <floating *>P.pre
    cdef floating *gh = work
    cdef floating clipv = <floating>C.clip
    cdef const floating *gxr
    cdef floating *hn
    # 2. gh = (h ⊙ m)·Rᵀ
    loop_gemm(Lp, rows, H, H, h_src, H, <const floating *>P.Rp, False, gh, H)
    for i in range(rows):
        if t >= Lp.lengths[b0 + i]:
            continue
        row = <Py_ssize_t>t * Lp.N + b0 + i
        gxr = <const floating *>P.gx + (row - P.st.row0) * P.ldgx   # gx's rows (loops.pxd)
        hn = h_next + i * H
        # 3. h' = act(clip(gx + gh + b))
        if C.fast:
            rnn_fwd_row(H, gxr, gh + i * H, bias, hn, C.fast == 2)   # tanh or relu (gates.h)
            continue
        for j in range(H):
            hn[j] = gxr[j] + gh[i * H + j] + bias[j]
        if training:
            memcpy(ws_pre + row * H, hn, H * sizeof(floating))
        for j in range(H):
            hn[j] = activate(&C.act, clamp(hn[j], C.has_clip, clipv))


cdef inline size_t bwd_work(const Layer *L, int rows) noexcept nogil:
    return 0


cdef inline void bwd_step(const Layer *L, const CellSpec *C, const Dir *P, int d, int t,
                          int b0, int rows, const floating *hp, const floating *hn,
                          const floating *cp, const floating *cn, floating *dh, floating *dc,
                          floating *tmp, floating *work) noexcept nogil:
    # da = dh ⊙ act'(…) (⊙ clip') → dgx; h enters the previous step only through R
    cdef const Loop *Lp = &L.loop
    cdef int H = Lp.H, i, j
    cdef Py_ssize_t row
    cdef const floating *ws_pre = <const floating *>P.pre
    cdef floating clipv = <floating>C.clip
    cdef const floating *hr
    cdef floating *dar
    cdef floating v
    for i in range(rows):
        if t >= Lp.lengths[b0 + i]:
            continue
        row = <Py_ssize_t>t * Lp.N + b0 + i
        dar = <floating *>P.dgx + (row - P.st.row0) * H   # the operand's rows (driver.pxi)
        hr = hn + i * H
        if C.fast:
            rnn_bwd_row(H, hr, dh + i * H, dar, C.fast == 2)        # tanh or relu (gates.h)
            continue
        for j in range(H):
            v = dh[i * H + j]
            dar[j] = v * activate_grad(&C.act, clamp(ws_pre[row * H + j], C.has_clip, clipv),
                                       hr[j]) * clip_grad(ws_pre[row * H + j], C.has_clip, clipv)
            dh[i * H + j] = 0


include "driver.pxi"


# --- Python entry points -------------------------------------------------------------------
cdef CellSpec make_cell(object cell):
    cdef CellSpec C
    C.fast = 0
    if cell.clip is None and cell.activation.name == "tanh":
        C.fast = 1
    elif cell.clip is None and cell.activation.name == "relu":
        C.fast = 2
    C.has_clip = cell.clip is not None
    C.clip = cell.clip if cell.clip is not None else 0.0
    C.act.code, C.act.alpha, C.act.beta = (cell.activation.code, cell.activation.alpha,
                                          cell.activation.beta)
    return C


cdef class Direction:
    """One direction's arrays for a vanilla-RNN layer call (``None`` for what the call does not
    use); C-contiguous arrays of the call's dtype and of the ``Dir`` fields' sizes."""
    cdef readonly bint reverse
    cdef readonly Py_ssize_t ldgx, row0
    cdef readonly object gx, Rp, Rb, b, h0, hy, pre, states, dhy, dh0, dgx, hm

    def __init__(self, *, bint reverse, gx=None, Py_ssize_t ldgx=0, Rp=None, Rb=None, b=None,
                 h0=None, hy=None, pre=None, states=None, dhy=None, dh0=None, dgx=None,
                 hm=None, Py_ssize_t row0=0):
        for a in (gx, Rp, Rb, b, h0, hy, pre, states, dhy, dh0, dgx, hm):
            if a is not None and not isinstance(a, np.ndarray):
                raise TypeError(f"Direction: expected numpy arrays, got {type(a).__name__}")
        self.reverse, self.ldgx, self.row0 = reverse, ldgx, row0
        self.gx, self.Rp, self.Rb, self.b, self.h0, self.hy = gx, Rp, Rb, b, h0, hy
        self.pre, self.states, self.dhy, self.dh0, self.dgx, self.hm = pre, states, dhy, dh0, dgx, hm


cdef inline int cell_width(int H) noexcept nogil:
    # the width of the second state c (the driver's Loop.C)
    return 0                   # one state, h


cdef Layer make_layer(const CellSpec *C, int T, int N, int H, int S, int n_chunks,
                      object lengths, object mask, object y, object dy, list dirs, int *abort,
                      list errors):
    # (S, the state width, is H for this kind)
    cdef Layer L
    cdef Dir *P
    cdef Direction a
    memset(&L, 0, sizeof(Layer))
    L.loop = make_loop(T, N, H, H, cell_width(H), len(dirs), n_chunks, lengths, mask, y, dy, abort, errors,
                       1)
    for d in range(len(dirs)):
        a = <Direction?>dirs[d]
        P = &L.dirs[d]
        bind_states(&P.st, a.reverse, a.h0, a.hy, None, None, a.states, None, a.dhy, a.dh0,
                    None, None, a.hm)
        set_rows(&P.st.saved[0], a.pre, H)
        set_rows(&P.st.zeroed[0], a.dgx, H)
        P.st.dG, P.st.ldG, P.st.KG, P.st.Rb = ptr(a.dgx), H, H, ptr(a.Rb)
        P.gx, P.ldgx = ptr(a.gx), a.ldgx if a.ldgx else H
        P.Rp, P.b, P.pre, P.dgx = ptr(a.Rp), ptr(a.b), ptr(a.pre), ptr(a.dgx)
        P.st.row0 = a.row0
    return L


include "entry.pxi"
