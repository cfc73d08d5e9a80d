# The Python entry points of one cell kind's time loops, shared word for word by gru.pyx,
# lstm.pyx and rnn.pyx (each includes this file after defining its CellSpec, Layer, make_cell
# and make_layer, and including driver.pxi, which defines forward_item and backward_item):
# the per-item trampolines (threads.parallel_for) for float32 and float64, and forward_layer /
# backward_layer.

cdef void forward_item_f(void *ctx, int item) noexcept nogil:
    cdef Job *J = <Job *>ctx
    if forward_item(<const float *>NULL, <Layer *>J.layer, <const CellSpec *>J.cell, item,
                    J.training) != 0:
        set_flag(&J.failed)


cdef void forward_item_d(void *ctx, int item) noexcept nogil:
    cdef Job *J = <Job *>ctx
    if forward_item(<const double *>NULL, <Layer *>J.layer, <const CellSpec *>J.cell, item,
                    J.training) != 0:
        set_flag(&J.failed)


cdef void backward_item_f(void *ctx, int item) noexcept nogil:
    cdef Job *J = <Job *>ctx
    if backward_item(<const float *>NULL, <Layer *>J.layer, <const CellSpec *>J.cell,
                     item) != 0:
        set_flag(&J.failed)


cdef void backward_item_d(void *ctx, int item) noexcept nogil:
    cdef Job *J = <Job *>ctx
    if backward_item(<const double *>NULL, <Layer *>J.layer, <const CellSpec *>J.cell,
                     item) != 0:
        set_flag(&J.failed)


def forward_layer(dtype, int T, int N, int H, int S, int n_chunks, int num_threads, cell,
                  lengths, mask, y, list dirs, bint training):
    """Run the forward time loops of one layer (all its directions) of this module's cell
    kind: ``S`` the state width (an LSTM's projection size, else ``H``), ``dirs`` one
    ``Direction`` per direction, ``y`` the layer's output, written in place."""
    cdef CellSpec C = make_cell(cell)
    cdef int abort = 0
    cdef list errors = []
    cdef Layer L = make_layer(&C, T, N, H, S, n_chunks, lengths, mask, y, None, dirs, &abort,
                              errors)
    cdef Job J
    J.layer, J.cell, J.loop, J.training, J.failed = &L, &C, &L.loop, training, 0
    run_job(forward_item_f if np.dtype(dtype) == np.float32 else forward_item_d, &J,
            num_threads, errors, "forward")


def backward_layer(dtype, int T, int N, int H, int S, int n_chunks, int num_threads, cell,
                   lengths, mask, dy, list dirs):
    """Run the backward time loops of one layer (see ``forward_layer``); ``dy`` the gradient
    of the layer's output."""
    cdef CellSpec C = make_cell(cell)
    cdef int abort = 0
    cdef list errors = []
    cdef Layer L = make_layer(&C, T, N, H, S, n_chunks, lengths, mask, None, dy, dirs, &abort,
                              errors)
    cdef Job J
    J.layer, J.cell, J.loop, J.training, J.failed = &L, &C, &L.loop, False, 0
    run_job(backward_item_f if np.dtype(dtype) == np.float32 else backward_item_d, &J,
            num_threads, errors, "backward")


cgru_isa()  # decide the ISA once, at import, before any thread can ask
