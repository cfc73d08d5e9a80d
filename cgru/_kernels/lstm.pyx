"""Time loops of one LSTM layer (all its directions), forward and backward, with cuDNN's
recurrent projection.

Equations (gates in canonical order i, f, g, o — cuDNN's linLayerIDs 0–3 and PyTorch's; row-
vector form, per step t, one direction; S = P with a projection, else H)::

    1. gx = x_t·Wᵀ                            [N, 4H]  (all steps at once, before the loop)
    2. gh = (h ⊙ m)·Rᵀ                        [N, 4H]  (R [4H, S])
    3. a = gx + gh + b      (b = b_W + b_R, summed in the engine)
       peepholes "ifo": a_i += P_i ⊙ c,  a_f += P_f ⊙ c          (P [3H] = P_i, P_f, P_o)
       peepholes "ifgo": a_k += P_k ⊙ c for k = i, f, g, o       (P [4H] = P_i, P_f, P_g, P_o)
       i = f_i(clip(a_i)), f = f_f(clip(a_f)) (input_forget: f = 1 − i), g = g(clip(a_g))
    4. c' = f ⊙ c + i ⊙ g
       peepholes "ifo": a_o += P_o ⊙ c';   o = f_o(clip(a_o))
    5. hf = o ⊙ h(c')                         [N, H]   (h = tanh for cuDNN)
    6. h' = hf·W_pᵀ (projection, W_p [P, H]) or h' = hf;  y_t = h'
    Rows with t ≥ len[b] are inactive: h' = h, c' = c, y_t = 0.

Saved in the reserve by the training forward (per direction; T·N rows, time t row t·N + b)::

    ws_gates   [T, N, 4H]   i, f, g, o after activation           (0 on inactive rows)
    ws_pre     [T, N, 4H]   pre-activations a before clip          (general cells only)
    ws_states  [T+1, N, S]  h: slot 0 = h0, slot t+1 = state after time t (forward);
                            slot T = h0, slot t = state after time t (reversed direction)
    ws_cstates [T+1, N, H]  c, the same slots
    ws_hf      [T, N, H]    o ⊙ h(c') before the projection        (projection only)

Backward (steps in reverse processing order; "bwd of k" undoes forward step k)::

    dh += dy_t
    bwd of 6: dhp_t = dh (kept for dW_p);  dhf = dh·W_p   (projection; else dhf = dh)
    bwd of 5: do = dhf ⊙ h(c');  dc += dhf ⊙ o ⊙ h'(c');  da_o = do ⊙ f_o'(…)
              peepholes "ifo": dc += da_o ⊙ P_o
    bwd of 4: di = dc ⊙ g,  dg = dc ⊙ i,  df = dc ⊙ c,  dc_prev = dc ⊙ f
              input_forget: di −= df, and the forget gate's own pre-activation gets nothing
    bwd of 3: da = (di, df, dg) ⊙ activations' (⊙ clip'), da_o  → dgx  [N, 4H]
              peepholes: dc_prev += da_i ⊙ P_i + da_f ⊙ P_f ("ifgo": + da_g ⊙ P_g + da_o ⊙ P_o)
    bwd of 2: dh_prev = m ⊙ (da·R)            (the state enters only through the gates)
    After the loop (engine): dW = daᵀ·X, dR = daᵀ·(h ⊙ m), db_W = db_R = Σ da,
    dW_p = dhpᵀ·hf, dX = da·W, dP = Σ (da_i ⊙ c, da_f ⊙ c, da_o ⊙ c') ("ifgo": Σ da ⊙ c).

This file holds the kind's own part: the fused gate math of one step (fwd_step, bwd_step);
the time loop around it is driver.pxi's, the same for every kind.

Parallelism: the work items (direction, batch chunk) run on an OpenMP team; each item
runs the whole time loop for its rows, or, when a layer has one item, shares its per-step
products with the spare threads (team.h).  Results are bitwise identical for every thread
count.
"""
from cython cimport floating
from libc.string cimport memcpy, memset

import numpy as np
cimport numpy as cnp

from cgru._kernels.loops cimport *

cnp.import_array()


cdef struct CellSpec:
    bint fast            # sigmoid gates, tanh cell input and output, no clip, plain gates
    bint coupled         # input_forget: f = 1 − i
    bint peep_all        # peepholes "ifgo": all four gates see c (P [4H]); else "ifo" (P [3H])
    bint has_clip
    double clip
    Act f_i
    Act f_f
    Act f_o
    Act g
    Act h


# --- the arguments of one layer --------------------------------------------------------------
cdef struct Dir:
    # per direction; every pointer is to the dtype's elements, rows as documented
    States st                # h0 [N, S], c0 [N, H], hy, cy, states, cstates, dhy, dcy, dh0,
                             # dc0, hm (loops.pxd); dG = dgx, Rb = R [4H, S] packed for da·R
    const void *gx           # [T·N, 4H], row stride ldgx       (IN)
    Py_ssize_t ldgx
    const void *Rp           # R [4H, S] packed for h·Rᵀ          (IN, forward)
    const void *Wpp          # W_p [P, H] packed for hf·W_pᵀ      (IN, forward, projection)
    const void *Wpb          # W_p [P, H] packed for dh·W_p       (IN, backward, projection)
    const void *b            # [4H] b_W + b_R                    (IN)
    const void *P            # [3H] ("ifo") or [4H] ("ifgo") peepholes, or NULL        (IN)
    void *gates              # [T·N, 4H] or NULL (inference)     (OUT)
    void *pre                # [T·N, 4H] or NULL                 (OUT)
    void *hf                 # [T·N, H] or NULL (projection)     (OUT)
    # backward
    void *dgx                # [T·N, 4H]                         (OUT)
    void *dhp                # [T·N, P]  dh before the projection, 0 when inactive (OUT)


cdef struct Layer:
    Loop loop                  # what every kind's loop shares (loops.pxd); S = P or H
    bint proj
    Dir dirs[2]


# --- forward -------------------------------------------------------------------------------
cdef inline void gates_and_cell(const CellSpec *C, int H, const floating *gxr,
                                const floating *ghr, const floating *b, const floating *P,
                                const floating *cp, floating *g4, floating *pre4, floating *cn,
                                floating *hf) noexcept nogil:
    """Steps 3–5 for one row: gates into g4 [4H] (pre-activations into pre4 when not NULL),
    c' into cn [H], hf into hf [H]; P the peepholes or NULL."""
    cdef int j
    cdef floating clipv = <floating>C.clip
    cdef floating a
    cdef floating one = 1          # (a literal 1 would make Cython compute in double)
    cdef bint has_clip = C.has_clip
    if C.fast:
        lstm_fwd_row(H, gxr, ghr, b, cp, g4, cn, hf)      # in one pass (gates.h)
        return
    for j in range(4 * H):
        g4[j] = gxr[j] + ghr[j] + b[j]
    for j in range(H):
        if P != NULL:
            g4[j] += P[j] * cp[j]
            g4[H + j] += P[H + j] * cp[j]
            if C.peep_all:
                g4[2 * H + j] += P[2 * H + j] * cp[j]
                g4[3 * H + j] += P[3 * H + j] * cp[j]
        if pre4 != NULL:
            pre4[j], pre4[H + j], pre4[2 * H + j] = g4[j], g4[H + j], g4[2 * H + j]
        g4[j] = activate(&C.f_i, clamp(g4[j], has_clip, clipv))
        if C.coupled:
            g4[H + j] = one - g4[j]
        else:
            g4[H + j] = activate(&C.f_f, clamp(g4[H + j], has_clip, clipv))
        g4[2 * H + j] = activate(&C.g, clamp(g4[2 * H + j], has_clip, clipv))
        cn[j] = g4[H + j] * cp[j] + g4[j] * g4[2 * H + j]
        a = g4[3 * H + j]
        if P != NULL and not C.peep_all:
            a = a + P[2 * H + j] * cn[j]
        if pre4 != NULL:
            pre4[3 * H + j] = a
        g4[3 * H + j] = activate(&C.f_o, clamp(a, has_clip, clipv))
        hf[j] = g4[3 * H + j] * activate(&C.h, cn[j])


cdef inline size_t fwd_work(const Layer *L, int rows) noexcept nogil:
    # gh [rows, 4H] | g4 [rows, 4H] (inference gates) | hf [rows, H] | hp [rows, S] (the
    # projection's result)
    cdef size_t H = L.loop.H
    return <size_t>rows * (9 * H + L.loop.S)


cdef inline void fwd_step(const Layer *L, const CellSpec *C, const Dir *P, int d, int t,
                          int b0, int rows, const floating *h_src, const floating *h_prev,
                          floating *h_next, const floating *c_prev, floating *c_next,
                          floating *work, bint training) noexcept nogil:
    """Steps 2-6 of time t for the active rows (the time loop: driver.pxi)."""
    cdef const Loop *Lp = &L.loop
    cdef int N = Lp.N, H = Lp.H, S = Lp.S
    cdef const floating *gx = <const floating *>P.gx
    cdef floating *ws_gates = <floating *>P.gates
    cdef floating *ws_pre = <floating *>P.pre
    cdef floating *ws_hf = <floating *>P.hf
    cdef Py_ssize_t H4 = 4 * H, ldgx = P.ldgx, r0 = P.st.row0   # gx's first row (loops.pxd)
    cdef int i, b
    cdef Py_ssize_t row
    cdef floating *g4
    cdef floating *hfr
    cdef floating *gh = work
    cdef floating *g4s = gh + <size_t>rows * H4
    cdef floating *hfs = g4s + <size_t>rows * H4
    cdef floating *hps = hfs + <size_t>rows * H
    # 2. gh[rows, 4H] = h_src[rows, S] · R[4H, S]ᵀ
    loop_gemm(Lp, rows, 4 * H, S, h_src, S, <const floating *>P.Rp, False, gh, H4)
    # 3.–5. per row
    for i in range(rows):
        b = b0 + i
        row = <Py_ssize_t>t * N + b
        g4 = (ws_gates + row * H4) if training else (g4s + i * H4)
        hfr = (ws_hf + row * H) if (training and L.proj) else (hfs + i * H)
        if t >= Lp.lengths[b]:
            memset(hfr, 0, H * sizeof(floating))     # an operand row of the projection
            continue
        gates_and_cell(C, H, gx + (row - r0) * ldgx, gh + i * H4, <const floating *>P.b,
                       <const floating *>P.P, c_prev + i * H, g4,
                       (ws_pre + row * H4) if (training and ws_pre != NULL) else NULL,
                       c_next + i * H, hfr if L.proj else h_next + i * S)
    # 6. projection: h'[rows, P] = hf[rows, H] · W_p[P, H]ᵀ
    if L.proj:
        loop_gemm(Lp, rows, S, H, (ws_hf + (<size_t>t * N + b0) * H) if training else hfs,
                  H, <const floating *>P.Wpp, False, hps, S)
        for i in range(rows):
            if t < Lp.lengths[b0 + i]:
                memcpy(h_next + i * S, hps + i * S, S * sizeof(floating))


# --- backward ------------------------------------------------------------------------------
cdef inline void bwd_row(const CellSpec *C, int H, const floating *g4, const floating *pre4,
                         const floating *P, const floating *cp, const floating *cn,
                         const floating *dhf, floating *dc, floating *da) noexcept nogil:
    """bwd of 5, 4, 3 for one row: reads the gates g4 = [i, f, g, o], c (cp) and c' (cn),
    dhf, the peepholes P (or NULL); turns the carry dc into dc_prev; writes da [4H]."""
    cdef int j
    cdef floating ig, fg, gg, og, hc, dhc, dcj, di, df, clipv = <floating>C.clip
    cdef floating one = 1          # (a literal 1 would make Cython compute in double)
    cdef bint has_clip = C.has_clip
    if C.fast:
        lstm_bwd_row(H, g4, cp, cn, dhf, dc, da)          # in one pass (gates.h)
        return
    for j in range(H):
        ig = g4[j]
        fg = g4[H + j]
        gg = g4[2 * H + j]
        og = g4[3 * H + j]
        hc = activate(&C.h, cn[j])
        dhc = activate_grad(&C.h, cn[j], hc)
        # bwd of 5 (and of o's peephole onto c')
        da[3 * H + j] = dhf[j] * hc * activate_grad(&C.f_o, clamp(pre4[3 * H + j], has_clip,
                                                                  clipv), og) \
            * clip_grad(pre4[3 * H + j], has_clip, clipv)
        dcj = dc[j] + dhf[j] * og * dhc
        if P != NULL and not C.peep_all:
            dcj = dcj + da[3 * H + j] * P[2 * H + j]
        # bwd of 4
        di = dcj * gg
        df = dcj * cp[j]
        da[2 * H + j] = dcj * ig * activate_grad(&C.g, clamp(pre4[2 * H + j], has_clip, clipv),
                                                 gg) * clip_grad(pre4[2 * H + j], has_clip, clipv)
        if C.coupled:
            di = di - df                 # f = 1 − i
            da[H + j] = 0
        else:
            da[H + j] = df * activate_grad(&C.f_f, clamp(pre4[H + j], has_clip, clipv), fg) \
                * clip_grad(pre4[H + j], has_clip, clipv)
        da[j] = di * activate_grad(&C.f_i, clamp(pre4[j], has_clip, clipv), ig) \
            * clip_grad(pre4[j], has_clip, clipv)
        dc[j] = dcj * fg
        if P != NULL:
            dc[j] = dc[j] + da[j] * P[j] + da[H + j] * P[H + j]
            if C.peep_all:
                dc[j] = dc[j] + da[2 * H + j] * P[2 * H + j] + da[3 * H + j] * P[3 * H + j]


cdef inline size_t bwd_work(const Layer *L, int rows) noexcept nogil:
    # dhf [rows, H]
    return <size_t>rows * L.loop.H


cdef inline void bwd_step(const Layer *L, const CellSpec *C, const Dir *P, int d, int t,
                          int b0, int rows, const floating *hp, const floating *hn,
                          const floating *cp, const floating *cn, floating *dh, floating *dc,
                          floating *tmpS, floating *work) noexcept nogil:
    """bwd of 6, 5, 4, 3 of time t for the active rows (the time loop and bwd of 2:
    driver.pxi)."""
    cdef const Loop *Lp = &L.loop
    cdef int N = Lp.N, H = Lp.H, S = Lp.S
    cdef const floating *ws_gates = <const floating *>P.gates
    cdef const floating *ws_pre = <const floating *>P.pre
    cdef floating *dgx = <floating *>P.dgx
    cdef floating *dhp = <floating *>P.dhp
    cdef Py_ssize_t H4 = 4 * H, r0 = P.st.row0       # the operands' first row (driver.pxi)
    cdef int i, b
    cdef Py_ssize_t row
    cdef const floating *dhfr
    cdef floating *dhf = work
    # bwd of 6
    if L.proj:
        for i in range(rows):
            if t < Lp.lengths[b0 + i]:
                memcpy(dhp + (<Py_ssize_t>t * N + b0 + i - r0) * S, dh + i * S,
                       S * sizeof(floating))
        # dhf[rows, H] = dh[rows, P] · W_p[P, H]
        loop_gemm(Lp, rows, H, S, dh, S, <const floating *>P.Wpb, False, dhf, H)
    for i in range(rows):
        b = b0 + i
        if t >= Lp.lengths[b]:
            continue
        row = <Py_ssize_t>t * N + b
        dhfr = (dhf + i * H) if L.proj else (dh + i * S)
        bwd_row(C, H, ws_gates + row * H4, (ws_pre + row * H4) if ws_pre != NULL else NULL,
                <const floating *>P.P, cp + i * H, cn + i * H, dhfr, dc + i * H,
                dgx + (row - r0) * H4)
        memset(dh + i * S, 0, S * sizeof(floating))   # h enters only through the gates


include "driver.pxi"


# --- Python entry points -------------------------------------------------------------------
cdef void set_act(Act *a, object act):
    a.code, a.alpha, a.beta = act.code, act.alpha, act.beta


cdef CellSpec make_cell(object cell):
    cdef CellSpec C
    C.fast = cell.is_fast
    C.coupled = cell.input_forget
    C.peep_all = cell.peepholes == "ifgo"
    C.has_clip = cell.clip is not None
    C.clip = cell.clip if cell.clip is not None else 0.0
    set_act(&C.f_i, cell.f_i)
    set_act(&C.f_f, cell.f_f)
    set_act(&C.f_o, cell.f_o)
    set_act(&C.g, cell.g)
    set_act(&C.h, cell.h)
    return C


cdef class Direction:
    """One direction's arrays for an LSTM layer call (``None`` for what the call does not
    use).  Every array is C-contiguous, of the call's dtype, and of the size the ``Dir``
    field comment gives — the engine checks, the kernels trust."""
    cdef readonly bint reverse
    cdef readonly Py_ssize_t ldgx, row0
    cdef readonly object gx, Rp, Rb, Wpp, Wpb, b, P, h0, c0, hy, cy
    cdef readonly object gates, pre, states, cstates, hf
    cdef readonly object dhy, dcy, dh0, dc0, dgx, hm, dhp

    def __init__(self, *, bint reverse, gx=None, Py_ssize_t ldgx=0, Rp=None, Rb=None,
                 Wpp=None, Wpb=None, b=None, P=None, h0=None, c0=None, hy=None, cy=None,
                 gates=None,
                 pre=None, states=None, cstates=None, hf=None, dhy=None, dcy=None, dh0=None,
                 dc0=None, dgx=None, hm=None, dhp=None, Py_ssize_t row0=0):
        for a in (gx, Rp, Rb, Wpp, Wpb, b, P, h0, c0, hy, cy, gates, pre, states, cstates, hf,
                  dhy, dcy, dh0, dc0, dgx, hm, dhp):
            if a is not None and not isinstance(a, np.ndarray):
                raise TypeError(f"Direction: expected numpy arrays, got {type(a).__name__}")
        self.reverse, self.ldgx, self.row0 = reverse, ldgx, row0
        self.gx, self.Rp, self.Rb, self.Wpp, self.Wpb, self.b = gx, Rp, Rb, Wpp, Wpb, b
        self.P = P
        self.h0, self.c0, self.hy, self.cy = h0, c0, hy, cy
        self.gates, self.pre, self.states, self.cstates, self.hf = gates, pre, states, cstates, hf
        self.dhy, self.dcy, self.dh0, self.dc0 = dhy, dcy, dh0, dc0
        self.dgx, self.hm, self.dhp = dgx, hm, dhp


cdef inline int cell_width(int H) noexcept nogil:
    # the width of the second state c (the driver's Loop.C)
    return H                   # the cell state c beside h


cdef Layer make_layer(const CellSpec *C, int T, int N, int H, int S, int n_chunks,
                      object lengths, object mask, object y, object dy, list dirs, int *abort,
                      list errors):
    cdef Layer L
    cdef Dir *P
    cdef Direction a
    memset(&L, 0, sizeof(Layer))
    L.loop = make_loop(T, N, H, S, cell_width(H), len(dirs), n_chunks, lengths, mask, y, dy, abort, errors,
                       4)
    L.proj = (<Direction?>dirs[0]).Wpp is not None or (<Direction>dirs[0]).Wpb is not None
    for d in range(len(dirs)):
        a = <Direction?>dirs[d]
        P = &L.dirs[d]
        bind_states(&P.st, a.reverse, a.h0, a.hy, a.c0, a.cy, a.states, a.cstates, a.dhy, a.dh0,
                    a.dcy, a.dc0, a.hm)
        set_rows(&P.st.saved[0], a.gates, 4 * H)
        set_rows(&P.st.saved[1], a.pre, 4 * H)
        set_rows(&P.st.zeroed[0], a.dgx, 4 * H)
        set_rows(&P.st.zeroed[1], a.dhp, S)
        P.st.dG, P.st.ldG, P.st.KG, P.st.Rb = ptr(a.dgx), 4 * H, 4 * H, ptr(a.Rb)
        P.gx, P.ldgx = ptr(a.gx), a.ldgx if a.ldgx else 4 * H
        P.Rp, P.Wpp, P.Wpb, P.b = ptr(a.Rp), ptr(a.Wpp), ptr(a.Wpb), ptr(a.b)
        P.P = ptr(a.P)
        P.gates, P.pre, P.hf = ptr(a.gates), ptr(a.pre), ptr(a.hf)
        P.dgx, P.dhp = ptr(a.dgx), ptr(a.dhp)
        P.st.row0 = a.row0
    return L


include "entry.pxi"
