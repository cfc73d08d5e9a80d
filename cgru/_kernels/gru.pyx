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
    bwd of 2: dh_prev += m ⊙ (dgx_rz·R_rz + dgh_n·R_n)   (reset-before: r, z columns only)
    After the loop (engine.py): dW = dgxᵀ·X, dR = dghᵀ·(h ⊙ m) (reset-before n rows:
    dgh_nᵀ·(r ⊙ h ⊙ m), which the backward writes into ws_rhm), db_W = Σ dgx, db_R = Σ dgh,
    dX = dgx·W.
    The recurrent side's gradient dgh shares its r and z columns with dgx, so only its n
    columns are kept apart (reset-after: the buffer dgh [T·N, H] holds dgh_n).

This file holds the kind's own part: the fused gate math of one step (fwd_step, bwd_step);
the time loop around it is driver.pxi's, the same for every kind.

Parallelism: the work items (direction, batch chunk) run on an OpenMP team (threads.pyx);
each item runs the whole time loop for its rows.  A layer with one item (one direction, a
small batch) shares its per-step products with the spare threads instead (a team, team.h:
``loop_gemm``).  The chunking depends on N only and a product's bits not on who computes
which columns, so results are bitwise identical for every thread count.
"""
from cython cimport floating
from libc.string cimport memcpy, memset

import numpy as np
cimport numpy as cnp

from cgru._kernels.loops cimport *

cnp.import_array()

cdef struct CellSpec:
    bint reset_after
    bint flip_z
    bint fast
    bint has_clip
    double clip
    Act f_r
    Act f_z
    Act g


# --- the arguments of one layer --------------------------------------------------------------
cdef struct Dir:
    # per direction; every pointer is to the dtype's elements, rows as documented
    States st                # h0, hy, states, dhy, dh0, hm (loops.pxd); dG = dgx's r, z
                             # columns, Rb = R_rz packed; reset-after also dG2 = dgh_n,
                             # Rb2 = R_n packed
    const void *gx           # [T·N, 3H], row stride ldgx       (IN)
    Py_ssize_t ldgx
    const void *Rp           # forward: R_rzn (reset-after) or R_rz, packed for h·Rᵀ (IN)
    const void *Rp_n         # forward, reset-before: R_n packed for (r⊙h⊙m)·R_nᵀ      (IN)
    const void *Rb_n         # backward: R_n [H, H], packed                            (IN)
    const void *b_rzn        # [3H] b_r, b_z, b_n (see step 3/4) (IN)
    const void *b_hn         # [H]  b_Rn (reset-after)           (IN)
    void *gates              # [T·N, 3H] or NULL (inference)    (OUT)
    void *pre                # [T·N, 3H] or NULL                (OUT)
    void *hn                 # [T·N, H] or NULL                 (OUT)
    # backward
    void *dgx                # [T·N, 3H]                        (OUT)
    void *dgh                # [T·N, H]  (reset-after: dgh_n)   (OUT)
    void *rhm                # [T·N, H]  (reset-before: r⊙h⊙m)  (OUT)


cdef struct Layer:
    Loop loop                  # what every kind's loop shares (loops.pxd)
    Dir dirs[2]


# --- forward -------------------------------------------------------------------------------
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


cdef inline size_t fwd_work(const Layer *L, int rows) noexcept nogil:
    # gh [rows, 3H] | g3 [rows, 3H] (inference gates) | rh [rows, H] (reset-before: r ⊙ h ⊙ m)
    return <size_t>rows * 7 * L.loop.H


cdef inline void fwd_step(const Layer *L, const CellSpec *C, const Dir *P, int d, int t,
                          int b0, int rows, const floating *h_src, const floating *h_prev,
                          floating *h_next, const floating *c_prev, floating *c_next,
                          floating *work, bint training) noexcept nogil:
    """Steps 2-5 of time t for the active rows (the time loop: driver.pxi)."""
    cdef const Loop *Lp = &L.loop
    cdef int N = Lp.N, H = Lp.H
    cdef const floating *gx = <const floating *>P.gx
    cdef const floating *b_rzn = <const floating *>P.b_rzn
    cdef const floating *b_hn = <const floating *>P.b_hn
    cdef const floating *mask = <const floating *>Lp.mask
    cdef floating *ws_gates = <floating *>P.gates
    cdef floating *ws_pre = <floating *>P.pre
    cdef floating *ws_hn = <floating *>P.hn
    cdef Py_ssize_t H3 = 3 * H, ldgx = P.ldgx, r0 = P.st.row0   # gx's first row (loops.pxd)
    cdef floating clipv = <floating>C.clip
    cdef bint has_clip = C.has_clip, flip = C.flip_z, fast = C.fast
    cdef int i, j, b
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
    cdef floating *gh = work
    cdef floating *g3s = gh + <size_t>rows * H3
    cdef floating *rh = g3s + <size_t>rows * H3
    # gh[rows, 3H (reset-after) or 2H] = h_src[rows, H] · R[3H or 2H, H]ᵀ
    loop_gemm(Lp, rows, 3 * H if C.reset_after else 2 * H, H, h_src, H,
              <const floating *>P.Rp, False, gh, H3)
    if not C.reset_after:
        # reset-before, 3.: r, z; then rh = r ⊙ h ⊙ m for the candidate's product
        for i in range(rows):
            b = b0 + i
            row = <Py_ssize_t>t * N + b
            hp = h_prev + i * H
            g3 = (ws_gates + row * H3) if training else (g3s + i * H3)
            if t >= Lp.lengths[b]:
                memset(rh + i * H, 0, H * sizeof(floating))
                continue
            gxr = gx + (row - r0) * ldgx
            ghr = gh + i * H3
            mrow = mask_row(Lp, mask, t, b, d)
            if fast:
                # 3. and rh in one pass (gates.h)
                gru_fwd_rb_rz_row(H, gxr, ghr, b_rzn, hp, mrow, g3, rh + i * H)
                continue
            for j in range(2 * H):
                g3[j] = gxr[j] + ghr[j] + b_rzn[j]
            if training:
                memcpy(ws_pre + row * H3, g3, 2 * H * sizeof(floating))
            for j in range(H):
                g3[j] = activate(&C.f_r, clamp(g3[j], has_clip, clipv))
                g3[H + j] = activate(&C.f_z, clamp(g3[H + j], has_clip, clipv))
            if mrow != NULL:
                for j in range(H):
                    rh[i * H + j] = g3[j] * hp[j] * mrow[j]
            else:
                for j in range(H):
                    rh[i * H + j] = g3[j] * hp[j]
        # gh_n[rows, H] = rh[rows, H] · R_n[H, H]ᵀ
        loop_gemm(Lp, rows, H, H, rh, H, <const floating *>P.Rp_n, False, gh + 2 * H, H3)
    for i in range(rows):
        b = b0 + i
        if t >= Lp.lengths[b]:
            continue
        row = <Py_ssize_t>t * N + b
        hp = h_prev + i * H
        hnew = h_next + i * H
        gxr = gx + (row - r0) * ldgx
        ghr = gh + i * H3
        g3 = (ws_gates + row * H3) if training else (g3s + i * H3)
        if C.reset_after:
            hn = (ws_hn + row * H) if training else (ghr + 2 * H)
            if fast:
                # 3.-5. in one pass (gates.h)
                gru_fwd_ra_row(H, gxr, ghr, b_rzn, b_hn, hp, g3, hn, hnew, flip)
                continue
            else:
                pre3 = (ws_pre + row * H3) if training else NULL
                general_gates(C, H, gxr, ghr, b_rzn, b_hn, g3, hn, pre3)
        elif fast:
            # 4.-5. in one pass (gates.h)
            gru_fwd_rb_n_row(H, gxr + 2 * H, ghr + 2 * H, b_rzn + 2 * H, g3 + H, hp,
                             g3 + 2 * H, hnew, flip)
            continue
        else:
            # 4. n = g(gx_n + gh_n + b_Wn + b_Rn)
            for j in range(H):
                g3[2 * H + j] = gxr[2 * H + j] + ghr[2 * H + j] + b_rzn[2 * H + j]
            for j in range(H):
                pn = g3[2 * H + j]
                if training:
                    ws_pre[row * H3 + 2 * H + j] = pn
                g3[2 * H + j] = activate(&C.g, clamp(pn, has_clip, clipv))
        blend(hnew, hp, g3 + H, g3 + 2 * H, H, flip)


# --- backward ------------------------------------------------------------------------------
cdef inline size_t bwd_work(const Layer *L, int rows) noexcept nogil:
    return 0


cdef inline void bwd_step(const Layer *L, const CellSpec *C, const Dir *P, int d, int t,
                          int b0, int rows, const floating *hps, const floating *hns,
                          const floating *cp, const floating *cn, floating *dh, floating *dc,
                          floating *tmp, floating *work) noexcept nogil:
    """bwd of 5, 4, 3 of time t for the active rows, and reset-before's candidate product
    (the time loop and bwd of 2: driver.pxi)."""
    cdef const Loop *Lp = &L.loop
    cdef int N = Lp.N, H = Lp.H
    cdef floating one = 1          # (a literal 1 would make Cython compute in double)
    cdef const floating *mask = <const floating *>Lp.mask
    cdef const floating *ws_gates = <const floating *>P.gates
    cdef const floating *ws_pre = <const floating *>P.pre
    cdef const floating *ws_hn = <const floating *>P.hn
    cdef floating *dgx = <floating *>P.dgx
    cdef floating *dgh = <floating *>P.dgh       # dgh_n [rows, H] (reset-after)
    cdef floating *rhm = <floating *>P.rhm
    cdef Py_ssize_t H3 = 3 * H, r0 = P.st.row0       # the operands' first row (driver.pxi)
    cdef floating clipv = <floating>C.clip
    cdef bint has_clip = C.has_clip, flip = C.flip_z, fast = C.fast
    cdef int i, j, b
    cdef Py_ssize_t row
    cdef const floating *hp = hps
    cdef const floating *g3
    cdef const floating *pre3
    cdef const floating *mrow
    cdef floating *dxr
    cdef floating *dhr
    cdef floating r, z, n, hv, dhv, dn, dz, dpn, dpr, dpz, dr, m
    for i in range(rows):
        b = b0 + i
        if t >= Lp.lengths[b]:
            continue
        row = <Py_ssize_t>t * N + b
        dhr = dh + i * H
        dxr = dgx + (row - r0) * H3
        mrow = mask_row(Lp, mask, t, b, d)
        g3 = ws_gates + row * H3
        pre3 = ws_pre + row * H3 if ws_pre != NULL else NULL
        if fast and C.reset_after:
            # the common cell: one pass (gates.h)
            gru_bwd_ra_row(H, g3, hp + i * H, ws_hn + row * H, dhr, dxr, dgh + (row - r0) * H,
                           flip)
            continue
        if fast:
            # reset-before: bwd of 5 and the candidate's part of 4 in one pass (gates.h)
            gru_bwd_rb_row(H, g3, hp + i * H, mrow, dhr, dxr, rhm + (row - r0) * H, flip)
            continue
        # the other cells (general activations, clip), one scalar at a time
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
                dhr[j] = dhv * (one - z)
            else:
                dn = dhv * (one - z)
                dz = dhv * (hv - n)
                dhr[j] = dhv * z
            # bwd of 4 (candidate), 3 (update gate)
            dpn = dn * activate_grad(&C.g, clamp(pre3[2 * H + j], has_clip, clipv), n) \
                * clip_grad(pre3[2 * H + j], has_clip, clipv)
            dpz = dz * activate_grad(&C.f_z, clamp(pre3[H + j], has_clip, clipv), z) \
                * clip_grad(pre3[H + j], has_clip, clipv)
            dxr[H + j] = dpz
            dxr[2 * H + j] = dpn
            if C.reset_after:
                dr = dpn * ws_hn[row * H + j]
                dpr = dr * activate_grad(&C.f_r, clamp(pre3[j], has_clip, clipv), r) \
                    * clip_grad(pre3[j], has_clip, clipv)
                dxr[j] = dpr
                dgh[(row - r0) * H + j] = dpn * r
            else:
                m = mrow[j] if mrow != NULL else 1
                rhm[(row - r0) * H + j] = r * hv * m
    if not C.reset_after:
        # bwd of 4 (reset-before): drh[rows, H] = dgx_n[rows, H] · R_n[H, H]
        loop_gemm(Lp, rows, H, H, dgx + (<Py_ssize_t>t * N + b0 - r0) * H3 + 2 * H, H3,
                  <const floating *>P.Rb_n, False, tmp, H)
        for i in range(rows):
            b = b0 + i
            if t >= Lp.lengths[b]:
                continue
            row = <Py_ssize_t>t * N + b
            g3 = ws_gates + row * H3
            pre3 = ws_pre + row * H3 if ws_pre != NULL else NULL
            mrow = mask_row(Lp, mask, t, b, d)
            if fast:
                gru_bwd_rb_r_row(H, g3, hp + i * H, mrow, tmp + i * H, dh + i * H,
                                 dgx + (row - r0) * H3)      # one pass (gates.h)
                continue
            for j in range(H):
                r = g3[j]
                m = mrow[j] if mrow != NULL else 1
                dr = tmp[i * H + j] * hp[i * H + j] * m
                dh[i * H + j] += tmp[i * H + j] * r * m
                dpr = dr * activate_grad(&C.f_r, clamp(pre3[j], has_clip, clipv), r) \
                    * clip_grad(pre3[j], has_clip, clipv)
                dgx[(row - r0) * H3 + j] = dpr


include "driver.pxi"


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


cdef class Direction:
    """One direction's arrays for a layer call (the kernels' typed description of their
    work; ``None`` for what the call does not use).  Every array is C-contiguous, of the call's
    dtype, and of the size the field comment gives — the engine checks, the kernels trust."""
    cdef readonly bint reverse
    cdef readonly Py_ssize_t ldgx, row0
    cdef readonly object gx, Rp, Rp_n, Rb, Rb_n, b_rzn, b_hn, h0, hy
    cdef readonly object gates, pre, hn, states, dhy, dh0, dgx, dgh, rhm, hm

    def __init__(self, *, bint reverse, gx=None, Py_ssize_t ldgx=0, Rp=None, Rp_n=None,
                 Rb=None, Rb_n=None, b_rzn=None, b_hn=None, h0=None, hy=None, gates=None,
                 pre=None, hn=None, states=None, dhy=None, dh0=None, dgx=None, dgh=None,
                 rhm=None, hm=None, Py_ssize_t row0=0):
        for a in (gx, Rp, Rp_n, Rb, Rb_n, b_rzn, b_hn, h0, hy, gates, pre, hn, states, dhy, dh0,
                  dgx, dgh, rhm, hm):
            if a is not None and not isinstance(a, np.ndarray):
                raise TypeError(f"Direction: expected numpy arrays, got {type(a).__name__}")
        self.reverse, self.ldgx, self.row0 = reverse, ldgx, row0
        self.gx, self.Rp, self.Rp_n, self.Rb, self.Rb_n = gx, Rp, Rp_n, Rb, Rb_n
        self.b_rzn, self.b_hn, self.h0, self.hy = b_rzn, b_hn, h0, hy
        self.gates, self.pre, self.hn, self.states = gates, pre, hn, states
        self.dhy, self.dh0, self.dgx, self.dgh, self.rhm, self.hm = dhy, dh0, dgx, dgh, rhm, hm


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
    cdef bint reset_after = C.reset_after
    memset(&L, 0, sizeof(Layer))
    L.loop = make_loop(T, N, H, H, cell_width(H), len(dirs), n_chunks, lengths, mask, y, dy, abort, errors,
                       3)
    for d in range(len(dirs)):
        a = <Direction?>dirs[d]
        P = &L.dirs[d]
        bind_states(&P.st, a.reverse, a.h0, a.hy, None, None, a.states, None, a.dhy, a.dh0,
                    None, None, a.hm)
        set_rows(&P.st.saved[0], a.gates, 3 * H)
        set_rows(&P.st.saved[1], a.pre, 3 * H)
        set_rows(&P.st.saved[2], a.hn, H)
        set_rows(&P.st.zeroed[0], a.dgx, 3 * H)
        # the backward's recurrent product: dgx_rz·R_rz (+ dgh_n·R_n, reset-after)
        set_rows(&P.st.zeroed[1], a.dgh if reset_after else a.rhm, H)
        P.st.dG, P.st.ldG, P.st.KG, P.st.Rb = ptr(a.dgx), 3 * H, 2 * H, ptr(a.Rb)
        if reset_after:
            P.st.dG2, P.st.ldG2, P.st.KG2, P.st.Rb2 = ptr(a.dgh), H, H, ptr(a.Rb_n)
        P.gx, P.ldgx = ptr(a.gx), a.ldgx if a.ldgx else 3 * H
        P.Rp, P.Rp_n, P.Rb_n = ptr(a.Rp), ptr(a.Rp_n), ptr(a.Rb_n)
        P.b_rzn, P.b_hn = ptr(a.b_rzn), ptr(a.b_hn)
        P.gates, P.pre, P.hn = ptr(a.gates), ptr(a.pre), ptr(a.hn)
        P.dgx, P.dgh, P.rhm = ptr(a.dgx), ptr(a.dgh), ptr(a.rhm)
        P.st.row0 = a.row0
    return L


include "entry.pxi"
