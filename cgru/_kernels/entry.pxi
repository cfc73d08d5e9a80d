# The Python entry points of one cell kind's time loops, shared word for word by gru.pyx,
# lstm.pyx and rnn.pyx (each includes this file after defining its CellSpec, Layer, make_cell,
# cell_width and make_layer, and including driver.pxi, which defines forward_item,
# backward_item and item_scratch): the per-item trampolines (threads.parallel_for) for float32
# and float64, scratch_size, forward_layer / backward_layer, and the Runner of repeated
# inference calls.
from libc.stdlib cimport calloc, free
from cpython.pythread cimport PyThread_get_thread_ident
from cgru._kernels.blas cimport packed_product
import threading

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


cdef class Runner:
    """An inference forward of one shape over one set of weights, prepared once and run call
    after call (the engine's per-call path for repeated calls; ``engine.ForwardPlan`` says
    when): every layer's loop arguments (``make_layer``, with its directions' packs and
    bias sums), their workspace (the input projections' rows, the inner layers' outputs, the
    loops' scratch, the zero initial states — the runner's own), and the input projections'
    splits.  ``run`` then does what ``engine.run_forward`` does for such a call — each block
    of time's input projection on the kernels' packed GEMM, then the layer's time loops — with
    the same kernels, arguments and splits, so the same bits, without building any of it again.

    ``layers``: per layer ``(dirs, packs, width, out, splits)`` — its ``Direction``\ s (made
    without ``h0``/``hy``/``c0``/``cy``, which each call sets), each direction's packed ``W``
    (``width`` its input width), ``out`` the layer's output in the workspace (``None`` for the
    last, each call's ``y``), ``splits`` each block of time's ``(row blocks, column blocks)``;
    ``keep``: what the pointers point into.  One call at a time: ``run`` returns False at once
    when another holds the runner (its caller then runs the call the general way)."""
    cdef Layer *layers
    cdef int *splits
    cdef const void **packs
    cdef int *widths
    cdef CellSpec C
    cdef int n_layers, n_blocks, D, T, N, S, W, G, H, Tb, threads, nt
    cdef bint f32
    cdef Py_ssize_t item
    cdef int abort
    cdef list errors
    cdef readonly bint busy
    cdef readonly Py_ssize_t runs       # completed runs (the tests count them)
    cdef object keep

    def __cinit__(self):
        self.layers, self.splits, self.packs, self.widths = NULL, NULL, NULL, NULL

    def __dealloc__(self):
        free(self.layers)
        free(self.splits)
        free(self.packs)
        free(self.widths)

    def __init__(self, dtype, int T, int N, int H, int S, int G, int Tb, int n_chunks,
                 int threads, int nt, cell, lengths, list layers, scratch, keep):
        cdef int l, d, b
        cdef Direction a
        dtype = np.dtype(dtype)
        self.f32 = dtype == np.float32
        self.item = dtype.itemsize
        self.n_layers, self.D = len(layers), len(layers[0][0])
        self.T, self.N, self.H, self.S, self.W, self.G = T, N, H, S, cell_width(H), G
        self.Tb, self.threads, self.nt = Tb, threads, nt
        self.n_blocks = (T + Tb - 1) // Tb
        self.C = make_cell(cell)
        self.errors = []
        self.keep = (keep, lengths, layers, scratch)
        self.layers = <Layer *>calloc(self.n_layers, sizeof(Layer))
        self.splits = <int *>calloc(self.n_layers * self.n_blocks * 2, sizeof(int))
        self.packs = <const void **>calloc(self.n_layers * self.D, sizeof(void *))
        self.widths = <int *>calloc(self.n_layers, sizeof(int))
        if not (self.layers and self.splits and self.packs and self.widths):
            raise MemoryError("cgru: out of memory for a runner")
        for l, (dirs, packs, width, out, splits) in enumerate(layers):
            self.layers[l] = make_layer(&self.C, T, N, H, S, n_chunks, lengths, None, out,
                                        None, dirs, &self.abort, self.errors)
            bind_scratch(&self.layers[l], scratch, dtype, True)
            self.widths[l] = width
            for d in range(self.D):
                self.packs[l * self.D + d] = ptr(packs[d])
            for b in range(self.n_blocks):
                self.splits[2 * (l * self.n_blocks + b)] = splits[b][0]
                self.splits[2 * (l * self.n_blocks + b) + 1] = splits[b][1]

    def run(self, x, h0, c0, y, hy, cy):
        """The forward of ``x`` (``[T·N, I]``) from ``h0`` (``[L·D, N, S]``, or None: zeros)
        and ``c0`` (``[L·D, N, H]`` or None) into ``y`` ``[T, N, D·S]``, ``hy``, ``cy``: the
        engine's checked arrays, C-contiguous, of the runner's dtype and shapes.  False (and
        nothing done) when another call holds the runner."""
        if self.busy:
            return False
        self.busy = True
        try:
            self._run(<char *>ptr(x), <char *>ptr(h0), <char *>ptr(c0), ptr(y),
                      <char *>ptr(hy), <char *>ptr(cy))
        finally:
            self.busy = False
        self.runs += 1
        return True

    cdef _run(self, char *x, char *h0, char *c0, void *y, char *hy, char *cy):
        cdef int l, d, b, i, s0, s1, rows, width, GH = self.G * self.H
        cdef Py_ssize_t r0, item = self.item
        cdef Py_ssize_t hsize = <Py_ssize_t>self.N * self.S * item
        cdef Py_ssize_t csize = <Py_ssize_t>self.N * self.W * item
        cdef Layer *L
        cdef States *St
        cdef const char *X = x
        cdef Job J
        cdef bint poll = PyThread_get_thread_ident() == threading.main_thread().ident
        cdef item_fn fn = forward_item_f if self.f32 else forward_item_d
        del self.errors[:]
        self.abort = 0
        for l in range(self.n_layers):
            L = &self.layers[l]
            L.loop.poll = poll
            if l == self.n_layers - 1:
                L.loop.y = y
            width = self.widths[l]
            for b in range(self.n_blocks):
                s0 = b * self.Tb
                s1 = min(self.T, s0 + self.Tb)
                rows = (s1 - s0) * self.N
                for d in range(self.D):
                    i = l * self.D + d
                    St = &L.dirs[d].st
                    r0 = <Py_ssize_t>(self.T - s1 if St.reverse else s0) * self.N
                    packed_product(self.f32, X + r0 * width * item, width, self.packs[i],
                                   <void *>L.dirs[d].gx, GH, rows, GH, width,
                                   self.splits[2 * (l * self.n_blocks + b)],
                                   self.splits[2 * (l * self.n_blocks + b) + 1], self.nt,
                                   self.errors)
                    St.row0 = r0
                    St.hy = hy + i * hsize
                    St.cy = cy + i * csize if cy != NULL else NULL
                    if s0:
                        St.h0, St.c0 = St.hy, St.cy
                    else:
                        St.h0 = h0 + i * hsize if h0 != NULL else self._zeros(hsize, 0)
                        St.c0 = (c0 + i * csize if c0 != NULL else self._zeros(csize, 1)) \
                            if self.W else NULL
                L.loop.s_begin, L.loop.s_end = s0, s1
                J.layer, J.cell, J.loop, J.training = L, &self.C, &L.loop, False
                run_job(fn, &J, self.threads, self.errors)
            X = <const char *>L.loop.y

    cdef void *_zeros(self, Py_ssize_t nbytes, int which):
        # the workspace's zero initial state h0 (which 0) or c0 (1), zeroed for this call
        cdef void *p = ptr(self.keep[0]["h0" if which == 0 else "c0"])
        memset(p, 0, nbytes)
        return p


cgru_isa()  # decide the ISA once, at import, before any thread can ask
