# The time loops of one work item (direction d, batch rows [b0, b1)), forward and backward,
# written once for every cell kind.  gru.pyx, lstm.pyx and rnn.pyx include this file after
# defining
#
#   CellSpec, Layer (starting with a Loop ``loop``), Dir (starting with a States ``st``);
#   fwd_work(L, rows), bwd_work(L, rows): elements of the kind's own scratch per work item;
#   fwd_step(L, C, P, d, t, b0, rows, h_src, h_prev, h_next, c_prev, c_next, work, training):
#       step t for the active rows (t < lengths[b]) only: the recurrent products from h_src
#       (h_prev ⊙ m, or h_prev) and the gate math; writes h_next, c_next and the reserve's
#       saved rows;
#   bwd_step(L, C, P, d, t, b0, rows, hp, hn, cp, cn, dh, dc, tmp, work):
#       undoes step t for the active rows only: from the carries dh (dy_t added) and dc, writes
#       the gate gradients into the gradient operands (St.dG among them) and leaves in dh and
#       dc what flows to the previous step directly (0 when h enters only through R); tmp
#       [rows, S] is free scratch.
#
# The driver does the rest, the same for every kind:
#   - the state addressing: the reserve's slots in training (slot 0 = the initial state, slot
#     t+1 = the state after time t; reversed directions mirror it: slot T and slot t), a
#     ping-pong pair in inference; h0/c0 in, hy/cy out; dhy/dcy in, dh0/dc0 out;
#   - the masked state h ⊙ m entering the recurrent product (and h ⊙ m saved for dR);
#   - the inactive rows (t ≥ lengths[b]): the states pass through, y_t = 0, the reserve's saved
#     rows and the gradient operands' rows 0 (padding never reaches dW or dR), dy_t not added;
#   - y_t = h' for the active rows;
#   - the backward's recurrent product dh_prev += m ⊙ (dG·R), on the loop's team if it has one;
#   - the scratch: each work item's region of the call's workspace (``item_scratch`` elements
#     sized for the largest chunk), the driver's part first, then the kind's;
#   - signal polling and the test probes at every step (loop_step).


cdef inline size_t round_scratch(size_t n) noexcept nogil:
    # whole 64-element blocks: every item's region starts 64-byte aligned (in an aligned block)
    return (n + 63) & ~(<size_t>63)


cdef size_t item_scratch(const Layer *L, bint forward) noexcept nogil:
    """Elements of scratch one work item needs (the largest chunk's rows), in either dtype."""
    cdef const Loop *Lp = &L.loop
    cdef int rows = (Lp.N + Lp.n_chunks - 1) // Lp.n_chunks
    cdef size_t S = Lp.S, W = Lp.C
    if forward:
        # hm [rows, S] | h_a, h_b [rows, S] | c_a, c_b [rows, C] (inference ping-pong) | the kind's
        return round_scratch(<size_t>rows * (3 * S + 2 * W) + fwd_work(L, rows))
    # dh [rows, S] | dc [rows, C] (the carries) | tmp [rows, S] | the kind's
    return round_scratch(<size_t>rows * (2 * S + W) + bwd_work(L, rows))


cdef void forward_item(const floating *sample, const Layer *L, const CellSpec *C, int item,
                       bint training) noexcept nogil:
    """The whole forward time loop of one work item."""
    cdef const Loop *Lp = &L.loop
    cdef int T = Lp.T, N = Lp.N, S = Lp.S, W = Lp.C
    cdef int d, b0, b1
    item_rows(Lp, item, &d, &b0, &b1)
    cdef int rows = b1 - b0
    if rows <= 0:
        return
    cdef const Dir *P = &L.dirs[d]
    cdef const States *St = &P.st
    cdef const floating *mask = <const floating *>Lp.mask
    cdef floating *y = <floating *>Lp.y
    cdef floating *states = <floating *>St.states
    cdef floating *cstates = <floating *>St.cstates
    cdef Py_ssize_t DS = <Py_ssize_t>Lp.D * S
    cdef int s, t, i, j, k, b
    cdef Py_ssize_t row
    cdef const floating *mrow
    cdef floating *yr
    cdef floating *hm = <floating *>Lp.scratch + <size_t>item * Lp.item_scratch
    cdef floating *h_a = hm + <size_t>rows * S
    cdef floating *h_b = h_a + <size_t>rows * S
    cdef floating *c_a = h_b + <size_t>rows * S
    cdef floating *c_b = c_a + <size_t>rows * W
    cdef floating *work = c_b + <size_t>rows * W
    cdef floating *h_prev
    cdef floating *h_next
    cdef floating *c_prev = NULL
    cdef floating *c_next = NULL
    cdef const floating *h_src

    if training:
        # the state before the first step of the call: slot s_begin (forward) or T − s_begin
        k = T - Lp.s_begin if St.reverse else Lp.s_begin
        h_prev = states + (<size_t>k * N + b0) * S
        if W:
            c_prev = cstates + (<size_t>k * N + b0) * W
    else:
        h_prev, c_prev = h_a, c_a
    memcpy(h_prev, <const floating *>St.h0 + <size_t>b0 * S, <size_t>rows * S * sizeof(floating))
    if W:
        memcpy(c_prev, <const floating *>St.c0 + <size_t>b0 * W,
               <size_t>rows * W * sizeof(floating))

    cdef double next_poll = first_poll()
    for s in range(Lp.s_begin, Lp.s_end):
        if loop_step(Lp, &next_poll, item, s):
            break
        t = T - 1 - s if St.reverse else s
        if training:
            k = t if St.reverse else t + 1
            h_next = states + (<size_t>k * N + b0) * S
            if W:
                c_next = cstates + (<size_t>k * N + b0) * W
        else:
            h_next = h_b if h_prev == h_a else h_a
            c_next = c_b if c_prev == c_a else c_a
        h_src = h_prev
        if mask != NULL:
            for i in range(rows):
                mrow = mask_row(Lp, mask, t, b0 + i, d)
                for j in range(S):
                    hm[i * S + j] = h_prev[i * S + j] * mrow[j]
            h_src = hm
        fwd_step(L, C, P, d, t, b0, rows, h_src, h_prev, h_next, c_prev, c_next, work, training)
        for i in range(rows):
            b = b0 + i
            row = <Py_ssize_t>t * N + b
            yr = y + row * DS + <size_t>d * S
            if t < Lp.lengths[b]:
                memcpy(yr, h_next + i * S, S * sizeof(floating))
                continue
            # inactive: the states pass through, the output is 0
            memcpy(h_next + i * S, h_prev + i * S, S * sizeof(floating))
            if W:
                memcpy(c_next + i * W, c_prev + i * W, W * sizeof(floating))
            memset(yr, 0, S * sizeof(floating))
            if training:
                for k in range(3):
                    if St.saved[k].p != NULL:
                        memset(<floating *>St.saved[k].p + row * St.saved[k].width, 0,
                               St.saved[k].width * sizeof(floating))
        h_prev, c_prev = h_next, c_next
    memcpy(<floating *>St.hy + <size_t>b0 * S, h_prev, <size_t>rows * S * sizeof(floating))
    if W:
        memcpy(<floating *>St.cy + <size_t>b0 * W, c_prev, <size_t>rows * W * sizeof(floating))


cdef void backward_item(const floating *sample, const Layer *L, const CellSpec *C,
                        int item) noexcept nogil:
    """The whole backward time loop of one work item (steps in reverse processing order)."""
    cdef const Loop *Lp = &L.loop
    cdef int T = Lp.T, N = Lp.N, S = Lp.S, W = Lp.C
    cdef int d, b0, b1
    item_rows(Lp, item, &d, &b0, &b1)
    cdef int rows = b1 - b0
    if rows <= 0:
        return
    cdef const Dir *P = &L.dirs[d]
    cdef const States *St = &P.st
    cdef const floating *mask = <const floating *>Lp.mask
    cdef const floating *dy = <const floating *>Lp.dy
    cdef const floating *states = <const floating *>St.states
    cdef const floating *cstates = <const floating *>St.cstates
    cdef floating *hm = <floating *>St.hm
    cdef const floating *dG = <const floating *>St.dG
    cdef const floating *Rb = <const floating *>St.Rb
    cdef const floating *dG2 = <const floating *>St.dG2
    cdef const floating *Rb2 = <const floating *>St.Rb2
    cdef Py_ssize_t DS = <Py_ssize_t>Lp.D * S, ldG = St.ldG, ldG2 = St.ldG2
    cdef int s, t, i, j, k, b, k_prev, k_next
    cdef Py_ssize_t row
    cdef const floating *hp
    cdef const floating *hn
    cdef const floating *cp = NULL
    cdef const floating *cn = NULL
    cdef const floating *mrow
    cdef const floating *dyr
    cdef floating *dhr
    cdef floating *dh = <floating *>Lp.scratch + <size_t>item * Lp.item_scratch
    cdef floating *dc = dh + <size_t>rows * S
    cdef floating *tmp = dc + <size_t>rows * W
    cdef floating *work = tmp + <size_t>rows * S
    if St.dhy != NULL:
        memcpy(dh, <const floating *>St.dhy + <size_t>b0 * S, <size_t>rows * S * sizeof(floating))
    else:
        memset(dh, 0, <size_t>rows * S * sizeof(floating))
    if W and St.dcy != NULL:
        memcpy(dc, <const floating *>St.dcy + <size_t>b0 * W, <size_t>rows * W * sizeof(floating))
    elif W:
        memset(dc, 0, <size_t>rows * W * sizeof(floating))

    cdef Py_ssize_t r0 = St.row0
    cdef double next_poll = first_poll()
    for s in range(Lp.s_begin, Lp.s_end):
        if loop_step(Lp, &next_poll, item, s):
            break
        t = s if St.reverse else T - 1 - s
        # the state before time t (h_prev, c) and after it (h', c')
        if St.reverse:
            k_prev, k_next = t + 1, t
        else:
            k_prev, k_next = t, t + 1
        hp = states + (<size_t>k_prev * N + b0) * S
        hn = states + (<size_t>k_next * N + b0) * S
        if W:
            cp = cstates + (<size_t>k_prev * N + b0) * W
            cn = cstates + (<size_t>k_next * N + b0) * W
        for i in range(rows):
            b = b0 + i
            row = <Py_ssize_t>t * N + b
            if t >= Lp.lengths[b]:
                # inactive: the carries pass through; zeros in every operand row of the
                # weight-gradient GEMMs
                if hm != NULL:
                    memset(hm + (row - r0) * S, 0, S * sizeof(floating))
                for k in range(3):
                    if St.zeroed[k].p != NULL:
                        memset(<floating *>St.zeroed[k].p + (row - r0) * St.zeroed[k].width, 0,
                               St.zeroed[k].width * sizeof(floating))
                continue
            if hm != NULL:
                # h_prev as it entered the recurrent product: h ⊙ m (or h), for dR
                mrow = mask_row(Lp, mask, t, b, d)
                if mrow != NULL:
                    for j in range(S):
                        hm[(row - r0) * S + j] = hp[i * S + j] * mrow[j]
                else:
                    memcpy(hm + (row - r0) * S, hp + i * S, S * sizeof(floating))
            if dy != NULL:
                dhr = dh + i * S
                dyr = dy + row * DS + <size_t>d * S
                for j in range(S):
                    dhr[j] += dyr[j]
        bwd_step(L, C, P, d, t, b0, rows, hp, hn, cp, cn, dh, dc, tmp, work)
        # dh_prev += m ⊙ (dG[rows, KG] · R[KG, S]  (+ dG2[rows, KG2] · R2[KG2, S]))
        if mask == NULL:
            loop_gemm(Lp, rows, S, St.KG, dG + (<Py_ssize_t>t * N + b0 - r0) * ldG, ldG, Rb, True,
                      dh, S)
            if dG2 != NULL:
                loop_gemm(Lp, rows, S, St.KG2, dG2 + (<Py_ssize_t>t * N + b0 - r0) * ldG2, ldG2,
                          Rb2, True, dh, S)
        else:
            loop_gemm(Lp, rows, S, St.KG, dG + (<Py_ssize_t>t * N + b0 - r0) * ldG, ldG, Rb, False,
                      tmp, S)
            if dG2 != NULL:
                loop_gemm(Lp, rows, S, St.KG2, dG2 + (<Py_ssize_t>t * N + b0 - r0) * ldG2, ldG2,
                          Rb2, True, tmp, S)
            for i in range(rows):
                if t >= Lp.lengths[b0 + i]:
                    continue            # the mask of a padded step is never read
                mrow = mask_row(Lp, mask, t, b0 + i, d)
                for j in range(S):
                    dh[i * S + j] += mrow[j] * tmp[i * S + j]
    memcpy(<floating *>St.dh0 + <size_t>b0 * S, dh, <size_t>rows * S * sizeof(floating))
    if W:
        memcpy(<floating *>St.dc0 + <size_t>b0 * W, dc, <size_t>rows * W * sizeof(floating))


cdef void bind_states(States *St, bint reverse, h0, hy, c0, cy, states, cstates, dhy, dh0,
                      dcy, dc0, hm):
    """The driver's arrays of one direction (None: NULL); the kind adds saved, zeroed and the
    recurrent product's operands."""
    memset(St, 0, sizeof(States))
    St.reverse = reverse
    St.h0, St.hy, St.c0, St.cy = ptr(h0), ptr(hy), ptr(c0), ptr(cy)
    St.states, St.cstates = ptr(states), ptr(cstates)
    St.dhy, St.dh0, St.dcy, St.dc0, St.hm = ptr(dhy), ptr(dh0), ptr(dcy), ptr(dc0), ptr(hm)


cdef inline void set_rows(Rows *r, object a, int width):
    r.p, r.width = ptr(a), width
