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

Parallelism as for the other kinds: (direction, batch chunk) work items on an OpenMP team, or
one item whose per-step products a thread team shares (team.h).
"""
from cython cimport floating
from libc.stdlib cimport malloc, free
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
    bint reverse
    const void *gx           # [T·N, H], row stride ldgx        (IN)
    Py_ssize_t ldgx
    const void *Rp           # R [H, H] packed for h·Rᵀ          (IN, forward)
    const void *Rb           # R [H, H] packed for da·R          (IN, backward)
    const void *b            # [H] b_W + b_R                    (IN)
    const void *h0           # [N, H]                           (IN)
    void *hy                 # [N, H]                           (OUT)
    void *pre                # [T·N, H] or NULL                 (OUT)
    void *states             # [(T+1)·N, H] or NULL             (OUT)
    const void *dhy          # [N, H] or NULL                   (IN)
    void *dh0                # [N, H]                           (OUT)
    void *dgx                # [T·N, H]                         (OUT)
    void *hm                 # [T·N, H]  h⊙m (mask) or h (padding), 0 when inactive (OUT)


cdef struct Layer:
    Loop loop
    Dir dirs[2]


cdef int forward_item(const floating *sample, const Layer *L, const CellSpec *C, int item,
                      bint training) noexcept nogil:
    cdef const Loop *Lp = &L.loop
    cdef int T = Lp.T, N = Lp.N, H = Lp.H, D = Lp.D
    cdef int d, b0, b1
    item_rows(Lp, item, &d, &b0, &b1)
    cdef int rows = b1 - b0
    cdef const Dir *P = &L.dirs[d]
    cdef const floating *gx = <const floating *>P.gx
    cdef const floating *Rp = <const floating *>P.Rp
    cdef const floating *bias = <const floating *>P.b
    cdef const floating *mask = <const floating *>Lp.mask
    cdef floating *y = <floating *>Lp.y
    cdef floating *states = <floating *>P.states
    cdef floating *ws_pre = <floating *>P.pre
    cdef Py_ssize_t DH = D * H, ldgx = P.ldgx
    cdef floating clipv = <floating>C.clip
    cdef int s, t, i, j, b
    cdef Py_ssize_t row
    cdef const floating *gxr
    cdef const floating *mrow
    cdef floating *hn
    if rows <= 0:
        return 0
    # scratch: gh [rows, H] | hm [rows, H] | h_a, h_b [rows, H] (inference ping-pong)
    cdef floating *scratch = <floating *>malloc((<size_t>rows) * 4 * H * sizeof(floating) + 64)
    if scratch == NULL:
        return -1
    cdef floating *gh = scratch
    cdef floating *hm = gh + <size_t>rows * H
    cdef floating *h_a = hm + <size_t>rows * H
    cdef floating *h_b = h_a + <size_t>rows * H
    cdef floating *h_prev
    cdef floating *h_next
    cdef const floating *h_src
    if training:
        h_prev = states + (<size_t>(T if P.reverse else 0) * N + b0) * H
    else:
        h_prev = h_a
    memcpy(h_prev, <const floating *>P.h0 + <size_t>b0 * H, <size_t>rows * H * sizeof(floating))

    cdef double next_poll = first_poll()
    for s in range(T):
        if loop_step(Lp, &next_poll, item, s):
            break
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
        loop_gemm(Lp, rows, H, H, h_src, H, Rp, False, gh, H)
        for i in range(rows):
            b = b0 + i
            row = <Py_ssize_t>t * N + b
            hn = h_next + i * H
            if t >= Lp.lengths[b]:
                memcpy(hn, h_prev + i * H, H * sizeof(floating))
                memset(y + row * DH + d * H, 0, H * sizeof(floating))
                if training and ws_pre != NULL:
                    memset(ws_pre + row * H, 0, H * sizeof(floating))
                continue
            gxr = gx + row * ldgx
            # 3. h' = act(clip(gx + gh + b))
            for j in range(H):
                hn[j] = gxr[j] + gh[i * H + j] + bias[j]
            if C.fast == 1:
                tanh_inplace(hn, H)
            elif C.fast == 2:
                for j in range(H):
                    hn[j] = hn[j] if hn[j] > 0 else 0
            else:
                if training:
                    memcpy(ws_pre + row * H, hn, H * sizeof(floating))
                for j in range(H):
                    hn[j] = activate(&C.act, clamp(hn[j], C.has_clip, clipv))
            memcpy(y + row * DH + d * H, hn, H * sizeof(floating))
        h_prev = h_next
    memcpy(<floating *>P.hy + <size_t>b0 * H, h_prev, <size_t>rows * H * sizeof(floating))
    free(scratch)
    return 0


cdef int backward_item(const floating *sample, const Layer *L, const CellSpec *C,
                       int item) noexcept nogil:
    cdef const Loop *Lp = &L.loop
    cdef int T = Lp.T, N = Lp.N, H = Lp.H, D = Lp.D
    cdef int d, b0, b1
    item_rows(Lp, item, &d, &b0, &b1)
    cdef int rows = b1 - b0
    cdef const Dir *P = &L.dirs[d]
    cdef const floating *Rb = <const floating *>P.Rb
    cdef const floating *mask = <const floating *>Lp.mask
    cdef const floating *dy = <const floating *>Lp.dy
    cdef const floating *states = <const floating *>P.states
    cdef const floating *ws_pre = <const floating *>P.pre
    cdef floating *dgx = <floating *>P.dgx
    cdef floating *hm = <floating *>P.hm
    cdef Py_ssize_t DH = D * H
    cdef floating clipv = <floating>C.clip
    cdef int s, t, i, j, b
    cdef Py_ssize_t row
    cdef const floating *hp
    cdef const floating *hn
    cdef const floating *mrow
    cdef floating *dar
    cdef floating v
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

    cdef double next_poll = first_poll()
    for s in range(T):
        if loop_step(Lp, &next_poll, item, s):
            break
        t = s if P.reverse else T - 1 - s
        hp = states + (<size_t>(t + 1 if P.reverse else t) * N + b0) * H    # h of time t−1
        hn = states + (<size_t>(t if P.reverse else t + 1) * N + b0) * H    # h' of time t
        for i in range(rows):
            b = b0 + i
            row = <Py_ssize_t>t * N + b
            dar = dgx + row * H
            if t >= Lp.lengths[b]:
                memset(dar, 0, H * sizeof(floating))
                if hm != NULL:
                    memset(hm + row * H, 0, H * sizeof(floating))
                continue
            mrow = mask + (<size_t>t * N + b) * DH + <size_t>d * H if mask != NULL else NULL
            if hm != NULL:
                if mrow != NULL:
                    for j in range(H):
                        hm[row * H + j] = hp[i * H + j] * mrow[j]
                else:
                    memcpy(hm + row * H, hp + i * H, H * sizeof(floating))
            for j in range(H):
                v = dh[i * H + j]
                if dy != NULL:
                    v = v + dy[row * DH + d * H + j]
                if C.fast == 1:
                    dar[j] = v * (1 - hn[i * H + j] * hn[i * H + j])
                elif C.fast == 2:
                    dar[j] = v if hn[i * H + j] > 0 else 0
                else:
                    dar[j] = v * activate_grad(&C.act, clamp(ws_pre[row * H + j], C.has_clip,
                                                             clipv), hn[i * H + j]) \
                        * clip_grad(ws_pre[row * H + j], C.has_clip, clipv)
                dh[i * H + j] = 0          # h enters the next state only through R
        # dh_prev = m ⊙ (da[rows, H] · R[H, H])
        if mask == NULL:
            loop_gemm(Lp, rows, H, H, dgx + (<size_t>t * N + b0) * H, H, Rb, True, dh, H)
        else:
            loop_gemm(Lp, rows, H, H, dgx + (<size_t>t * N + b0) * H, H, Rb, False, tmp, H)
            for i in range(rows):
                if t >= Lp.lengths[b0 + i]:
                    continue
                mrow = mask + (<size_t>t * N + b0 + i) * DH + <size_t>d * H
                for j in range(H):
                    dh[i * H + j] += mrow[j] * tmp[i * H + j]
    memcpy(<floating *>P.dh0 + <size_t>b0 * H, dh, <size_t>rows * H * sizeof(floating))
    free(scratch)
    return 0


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
    cdef readonly Py_ssize_t ldgx
    cdef readonly object gx, Rp, Rb, b, h0, hy, pre, states, dhy, dh0, dgx, hm

    def __init__(self, *, bint reverse, gx=None, Py_ssize_t ldgx=0, Rp=None, Rb=None, b=None,
                 h0=None, hy=None, pre=None, states=None, dhy=None, dh0=None, dgx=None,
                 hm=None):
        for a in (gx, Rp, Rb, b, h0, hy, pre, states, dhy, dh0, dgx, hm):
            if a is not None and not isinstance(a, np.ndarray):
                raise TypeError(f"Direction: expected numpy arrays, got {type(a).__name__}")
        self.reverse, self.ldgx = reverse, ldgx
        self.gx, self.Rp, self.Rb, self.b, self.h0, self.hy = gx, Rp, Rb, b, h0, hy
        self.pre, self.states, self.dhy, self.dh0, self.dgx, self.hm = pre, states, dhy, dh0, dgx, hm


cdef Layer make_layer(int T, int N, int H, int S, int n_chunks, object lengths,
                      object mask, object y, object dy, list dirs, int *abort,
                      list errors):
    # (S, the state width, is H for this kind)
    cdef Layer L
    cdef Dir *P
    cdef Direction a
    memset(&L, 0, sizeof(Layer))
    L.loop = make_loop(T, N, H, len(dirs), n_chunks, lengths, mask, y, dy, abort, errors,
                       1)
    for d in range(len(dirs)):
        a = <Direction?>dirs[d]
        P = &L.dirs[d]
        P.reverse = a.reverse
        P.gx, P.ldgx = ptr(a.gx), a.ldgx if a.ldgx else H
        P.Rp, P.Rb, P.b, P.h0, P.hy = ptr(a.Rp), ptr(a.Rb), ptr(a.b), ptr(a.h0), ptr(a.hy)
        P.pre, P.states, P.dhy, P.dh0 = ptr(a.pre), ptr(a.states), ptr(a.dhy), ptr(a.dh0)
        P.dgx, P.hm = ptr(a.dgx), ptr(a.hm)
    return L


include "entry.pxi"
