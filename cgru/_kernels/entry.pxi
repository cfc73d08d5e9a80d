# The Python entry points of one cell kind's time loops, shared word for word by gru.pyx,
# lstm.pyx and rnn.pyx (each includes this file after defining its CellSpec, Layer, make_cell,
# cell_width and make_layer, and including driver.pxi, which defines forward_item,
# backward_item and item_scratch): the per-item trampolines (threads.parallel_for) for float32
# and float64, scratch_size, and forward_layer / backward_layer.

cdef void forward_item_f(void *ctx, int item) noexcept nogil:
    cdef Job *J = <Job *>ctx
    forward_item(<const float *>NULL, <Layer *>J.layer, <const CellSpec *>J.cell, item,
                 J.training)


cdef void forward_item_d(void *ctx, int item) noexcept nogil:
    cdef Job *J = <Job *>ctx
    forward_item(<const double *>NULL, <Layer *>J.layer, <const CellSpec *>J.cell, item,
                 J.training)


cdef void backward_item_f(void *ctx, int item) noexcept nogil:
    cdef Job *J = <Job *>ctx
    backward_item(<const float *>NULL, <Layer *>J.layer, <const CellSpec *>J.cell, item)


cdef void backward_item_d(void *ctx, int item) noexcept nogil:
    cdef Job *J = <Job *>ctx
    backward_item(<const double *>NULL, <Layer *>J.layer, <const CellSpec *>J.cell, item)


def scratch_size(bint forward, int N, int H, int S, int n_chunks, int D):
    """Elements of the dtype one layer's time loops take as ``scratch`` (``forward_layer``,
    ``backward_layer``): one region per work item (``D·n_chunks`` of them), each sized for the
    largest chunk of the batch and a whole number of 64 elements."""
    cdef Layer L
    memset(&L, 0, sizeof(Layer))
    L.loop.N, L.loop.H, L.loop.S, L.loop.C, L.loop.D = N, H, S, cell_width(H), D
    L.loop.n_chunks = max(n_chunks, 1)
    return <Py_ssize_t>item_scratch(&L, forward) * D * L.loop.n_chunks


cdef bind_scratch(Layer *L, object scratch, dtype, bint forward):
    """Point the loops at ``scratch``: a C-contiguous 1-D array of the layer's dtype, at least
    ``scratch_size`` elements (every element is written before it is read)."""
    cdef Loop *Lp = &L.loop
    Lp.item_scratch = item_scratch(L, forward)
    cdef Py_ssize_t need = <Py_ssize_t>Lp.item_scratch * Lp.D * Lp.n_chunks
    if not isinstance(scratch, np.ndarray) or scratch.ndim != 1 or scratch.dtype != dtype \
            or not scratch.flags.c_contiguous or not scratch.flags.writeable:
        raise TypeError(f"scratch: expected a writable C-contiguous 1-D {np.dtype(dtype)} array, "
                        f"got {type(scratch).__name__} "
                        f"{getattr(scratch, 'dtype', '')} {getattr(scratch, 'shape', '')}")
    if scratch.shape[0] < need:
        raise ValueError(f"scratch: {scratch.shape[0]} elements is too small; the "
                         f"{'forward' if forward else 'backward'} loops need {need} "
                         f"(scratch_size)")
    Lp.scratch = ptr(scratch)


def forward_layer(dtype, int T, int N, int H, int S, int n_chunks, int num_threads, cell,
                  lengths, mask, y, list dirs, bint training, scratch, steps=None):
    """Run the forward time loops of one layer (all its directions) of this module's cell
    kind: ``S`` the state width (an LSTM's projection size, else ``H``), ``dirs`` one
    ``Direction`` per direction, ``y`` the layer's output, written in place; ``scratch`` the
    loops' scratch (``scratch_size(True, …)`` elements of the dtype, from the call's
    workspace: the loops allocate nothing).  ``steps = (s0, s1)``: only steps ``s0 … s1 − 1``
    of every direction, in its own order (a block of time: ``t = s`` forward, ``t = T−1−s``
    reversed), from the carries ``h0``/``c0`` to ``hy``/``cy`` (which may be the same
    arrays), each direction's ``gx`` holding its rows from ``row0`` on; ``None``: all ``T``."""
    cdef CellSpec C = make_cell(cell)
    cdef int abort = 0
    cdef list errors = []
    cdef Layer L = make_layer(&C, T, N, H, S, n_chunks, lengths, mask, y, None, dirs, &abort,
                              errors)
    bind_scratch(&L, scratch, dtype, True)
    if steps is not None:
        s0, s1 = steps
        if not 0 <= s0 <= s1 <= T:
            raise ValueError(f"steps: expected 0 ≤ s0 ≤ s1 ≤ T={T}, got {steps}")
        L.loop.s_begin, L.loop.s_end = s0, s1
    cdef Job J
    J.layer, J.cell, J.loop, J.training = &L, &C, &L.loop, training
    run_job(forward_item_f if np.dtype(dtype) == np.float32 else forward_item_d, &J,
            num_threads, errors)


def backward_layer(dtype, int T, int N, int H, int S, int n_chunks, int num_threads, cell,
                   lengths, mask, dy, list dirs, scratch, steps=None):
    """Run the backward time loops of one layer (see ``forward_layer``); ``dy`` the gradient
    of the layer's output, ``scratch`` ``scratch_size(False, …)`` elements of the dtype.
    ``steps = (s0, s1)``: only steps ``s0 … s1 − 1`` of every direction, in its own order (a
    block of time: ``t = T−1−s`` forward, ``t = s`` reversed), from the carries ``dhy``/``dcy``
    to ``dh0``/``dc0`` (which may be the same arrays), each direction's gradient operands
    holding its rows from ``row0`` on; ``None``: all ``T``."""
    cdef CellSpec C = make_cell(cell)
    cdef int abort = 0
    cdef list errors = []
    cdef Layer L = make_layer(&C, T, N, H, S, n_chunks, lengths, mask, None, dy, dirs, &abort,
                              errors)
    bind_scratch(&L, scratch, dtype, False)
    if steps is not None:
        s0, s1 = steps
        if not 0 <= s0 <= s1 <= T:
            raise ValueError(f"steps: expected 0 ≤ s0 ≤ s1 ≤ T={T}, got {steps}")
        L.loop.s_begin, L.loop.s_end = s0, s1
    cdef Job J
    J.layer, J.cell, J.loop, J.training = &L, &C, &L.loop, False
    run_job(backward_item_f if np.dtype(dtype) == np.float32 else backward_item_d, &J,
            num_threads, errors)


cgru_isa()  # decide the ISA once, at import, before any thread can ask
