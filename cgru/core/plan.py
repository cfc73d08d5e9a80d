"""The plan of a call: how its work is split, and every buffer it needs, sized and allocated once.

* **Work split** (where it could change a result, a function of the shapes only, never of the
  thread count, so results never depend on it): the time loop's batch chunks (``n_chunks``;
  one per thread or direction, ``loop_chunks``: a row's bits do not depend on its chunk),
  when a loop is worth a second thread (``loop_threads``), and the whole-sequence GEMMs as
  blocks on the pool: of single-threaded BLAS (``gemm``, the weight gradients) or of the
  kernels' packed GEMM (``gemm_packed``, the input projections and input gradients).
* **Buffers**: ``Workspace`` sizes a call's temporaries (input projections, gate gradients,
  intermediate layers) and allocates them as one block, carved into views — as oneDNN's
  ``set_offsets`` and llm.c's ``fill_in_*`` do.  Outputs (``y``, ``hy``, ``dx``, ``dh0``,
  the reserve) are allocated on their own: they outlive the call.

Every buffer cgru allocates comes from ``empty`` (the tests poison it with NaN to see that
every element is written).  The workspace blocks and the reserves come from ``recycled``: a
small pool that hands a block out again once nothing refers to it any more (the views of a
workspace are gone, the caller dropped the reserve), so that a training loop does not fault
fresh pages in on every step.  A new block is made at about the size asked for (steps of a
thirty-second between powers of two: at most a thirty-second of it unused, so a training
step's peak memory is not a size class's rounding away from its buffers), and an idle block
serves any later request it holds with at most a quarter to spare — the smallest such
block — so that calls of varying sizes (dynamic padding) share them.  A block handed out is a
NumPy array over memory the pool owns; every view of it keeps that array alive, and when the
last one goes, a ``weakref.finalize`` puts the memory back (no reference counting by hand).
The pool keeps at most ``POOL_BYTES`` of idle blocks (the least recently returned leave
first); ``cgru.release_memory()`` empties it, and the cache of the weights' kept copies
(``weights``) too.
"""
import bisect
import collections
import functools
import math
import os
import threading
import weakref

import numpy as np

from cgru._kernels import blas
from cgru._kernels.loops import address, pack_rhs, packed_size
from cgru._kernels.threads import blas_single_threaded

# Batch chunks of the time loop: a function of N only.  Two chunks from N = 16 (so two threads
# have work), more only while each keeps at least 16 rows (fewer rows per call make the
# per-step GEMM stream R once per 8 rows).
_MAX_CHUNKS = 4
# Below this many multiply-adds per time loop, waking a second thread costs more than it saves
# (and much more on a busy machine).  Only the thread count changes, never the results.
_MIN_PARALLEL_WORK = 1 << 21
# Whole-sequence GEMMs are split into at most _MAX_GEMM_BLOCKS blocks (of C's rows, or of the
# inner dimension for the weight gradients Aᵀ·B — of C's rows again where that is too short to
# split; at least _MIN_GEMM_ROWS rows each), one
# single-threaded BLAS call per block on the pool: BLAS's own threads stay asleep and cannot
# fight the time loops' threads for the cores.
_MAX_GEMM_BLOCKS = 4
_MIN_GEMM_ROWS = 128
# A packed product with too few rows for two blocks (a batch-1 sequence's input projection)
# is split into blocks of columns instead, from this many multiply-adds (below it, waking a
# second thread costs about what it saves).
_MIN_COLUMN_SPLIT_WORK = 1 << 20
_ALIGN = 64


def empty(shape, dtype):
    """The one allocation function of cgru's buffers (outputs, reserve, workspaces).  From
    ``POOLED_OUTPUT_BYTES`` on, an array over a block of the pool (``recycled``): a training
    loop's outputs (its weight gradients, say) freed and made again every step would otherwise
    make the C library give their memory back to the system and fault it in again, page by
    page, in the next step (an LSTM's float64 gradients at H = 256, batch 1: about 500 page
    faults a step, half of its time)."""
    dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    if _reuse:
        nbytes = dt.itemsize * (shape if type(shape) is int else math.prod(shape))
        if POOLED_OUTPUT_BYTES <= nbytes <= POOL_BYTES:
            return recycled(nbytes, exact=True).view(dt).reshape(shape)
    return np.empty(shape, dt)


POOL_BYTES = 256 << 20
POOLED_OUTPUT_BYTES = 1 << 20
_MIN_CLASS = 4096
_reuse = True                # False: every block fresh from ``empty`` (the tests' poisoning)
_idle = collections.OrderedDict()       # id(raw) -> (size, raw), least recently freed first
_idle_by_size = collections.defaultdict(list)    # size -> [id(raw)], most recent last
_idle_sizes = []                        # the sizes with idle blocks, ascending
_idle_bytes = 0
_pool_lock = threading.RLock()


def size_class(nbytes):
    """The size of a new block that holds ``nbytes``: ``m·2^e`` with ``m`` in 32…63 (at least
    4 KiB), so at most a thirty-second larger."""
    if nbytes <= _MIN_CLASS:
        return _MIN_CLASS
    e = (nbytes - 1).bit_length() - 6            # 2^(e+5) < nbytes ≤ 2^(e+6)
    return -(-nbytes >> e) << e


def recycled(nbytes, exact=False):
    """A uint8 array of ``nbytes`` over an idle block of the pool that holds it with at most a
    quarter to spare (the smallest there is), else over a new block of its ``size_class``; the
    block returns to the pool when the array and every view of it are gone.  ``exact``: a
    block of ``nbytes`` rounded up to whole pages only, new or idle (an output the caller
    keeps: the next call of the same shapes asks for the same size)."""
    if not _reuse:
        return empty(nbytes, np.uint8)
    if exact:
        size = -(-max(nbytes, 1) // _MIN_CLASS) * _MIN_CLASS
        most = size
    else:
        size = size_class(nbytes)
        most = max(size, nbytes + nbytes // 4)
    # blocks up to the pool's bound are kept: a training loop's reserve is one (69 MiB for two
    # bidirectional layers at T·N = 3200, H = 256 in float32, 138 MiB in float64)
    if size > POOL_BYTES:
        return _fresh_block(nbytes)
    raw = None
    with _pool_lock:
        i = bisect.bisect_left(_idle_sizes, nbytes if not exact else size)
        if i < len(_idle_sizes) and _idle_sizes[i] <= most:
            size = _idle_sizes[i]
            raw = _take_idle(_idle_by_size[size][-1])
    if raw is None:
        raw = _fresh_block(size)
    block = np.frombuffer(memoryview(raw), np.uint8, nbytes)
    weakref.finalize(block, _give_back, raw, size).atexit = False
    return block


def _fresh_block(nbytes):
    """A new block for the pool (``empty`` takes its large arrays from the pool: not through
    it)."""
    return np.empty(nbytes, np.uint8)


def _take_idle(key):
    """Take idle block ``key`` out of the pool (under ``_pool_lock``): its memory."""
    global _idle_bytes
    size, raw = _idle.pop(key)
    ids = _idle_by_size[size]
    ids.remove(key)
    if not ids:
        del _idle_by_size[size]
        del _idle_sizes[bisect.bisect_left(_idle_sizes, size)]
    _idle_bytes -= size
    return raw


def _give_back(raw, size):
    """``raw`` is idle again (the finalizer of the array handed out over it).  At the
    interpreter's exit the array may outlive this module's globals (torn down to ``None``):
    the block then simply goes."""
    global _idle_bytes
    if (_pool_lock is None or _idle is None or _idle_by_size is None or _idle_sizes is None
            or _take_idle is None or bisect is None):
        return
    with _pool_lock:
        _idle[id(raw)] = (size, raw)
        ids = _idle_by_size[size]
        if not ids:
            bisect.insort(_idle_sizes, size)
        ids.append(id(raw))
        _idle_bytes += size
        while _idle_bytes > POOL_BYTES:
            _take_idle(next(iter(_idle)))


def pool_state():
    """``(idle blocks, idle bytes)`` of the pool now (for tests)."""
    with _pool_lock:
        return len(_idle), _idle_bytes


def _fresh_locks():
    """In a forked child: a new lock (another thread of the parent may have held it at the
    fork, and would never release it here), and an empty pool — that thread may have stopped
    between two of the pool's updates (a size listed with no block left: the child's next call
    failed with an IndexError); the blocks lent out come back to the new pool as before."""
    global _pool_lock, _idle, _idle_by_size, _idle_sizes, _idle_bytes
    _pool_lock = threading.RLock()
    _idle = collections.OrderedDict()
    _idle_by_size = collections.defaultdict(list)
    _idle_sizes = []
    _idle_bytes = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks)


def release_pool():
    """Drop the pool's idle blocks, the shared layouts and their idle allocations (the memory
    returns to the allocator)."""
    global _idle_bytes
    shared_layout.cache_clear()
    shape_plan.cache_clear()
    block_lender.cache_clear()
    release_spares()
    with _pool_lock:
        _idle.clear()
        _idle_by_size.clear()
        _idle_sizes.clear()
        _idle_bytes = 0


def n_chunks(N, H=0):
    """Batch chunks of every time loop for a batch of ``N`` and hidden size ``H``.  One chunk
    for small batches, and for a few dozen rows of a large layer: the packed GEMM runs faster
    on all the rows than on half of them, and a single loop shares its per-step products with
    the spare threads (a team) instead."""
    if N < 16 or (H >= 768 and N < 48):
        return 1
    return max(2, min(_MAX_CHUNKS, N // 16))


def loop_chunks(N, H, threads, D=1):
    """Batch chunks of each of the ``D`` directions of a time loop on ``threads`` threads:
    ``n_chunks``, or one when there are no more threads than directions — each chunk's
    per-step product reads all of R, so two chunks on one thread read it twice a step (1–3 %
    of a training step at N = 32…128, H = 256…512, on one thread or two directions on two).
    Every row is computed alike in any chunk, so the bits do not depend on it."""
    return n_chunks(N, H) if threads > D else 1


def loop_threads(nt, T, N, H, D, gates):
    """Threads for one layer's time loops: ``nt``, or 1 when the work is too small."""
    return nt if T * N * D * H * (gates * H + 16) >= _MIN_PARALLEL_WORK else 1


# The forward and the backward run in blocks of time of _BLOCK_ROWS to _MAX_BLOCK_ROWS rows of
# T·N: the forward's input projection and the backward's gate gradients (and their kin) are
# held a block at a time, instead of all T·N, each block's weight gradients taken before the
# next, so a training step's peak memory stays near its reserve, inputs and outputs.  A block
# costs about 60 µs of fixed work (its Python, its threads' wake-ups), so it is made long
# enough for _MIN_BLOCK_WORK multiply-adds of the forward's products (a small layer's blocks
# are longer); and a layer-direction whose weight gradients, which every block reads and adds
# to, have _LARGE_WGRAD elements or more (H = 512 and up) takes the longest blocks: there
# shorter ones cost 1–3 % of a step in those passes.
_BLOCK_ROWS = 512
_MAX_BLOCK_ROWS = 1024
_MIN_BLOCK_WORK = 1 << 26
_LARGE_WGRAD = 1 << 20

# A training forward of at least this many rows of T·N makes its weights' packs for itself
# only (``weights.OneCall``): packing them again in the next step of the same weights costs
# about half a percent of such a step, and its backward then holds its own packs alone.
ONE_CALL_PACK_ROWS = 2048


def wgrad_size(topo, gates):
    """Elements of the largest weight gradients of one layer-direction of ``topo`` (input and
    recurrent sides: ``gates·H × (input width + S)``): also the multiply-adds of its forward's
    products per row of T·N."""
    width = max(topo.input_size, topo.output_size if topo.num_layers > 1 else 0)
    return gates * topo.hidden_size * (width + topo.state_size)


def time_block(T, N, wgrad=0):
    """Steps per block of time of the forward and the backward of a network whose
    ``wgrad_size`` is ``wgrad``: a function of the shapes only (never of the thread count, so
    the results are not either), the blocks as even as whole steps allow."""
    if wgrad >= _LARGE_WGRAD:
        rows = _MAX_BLOCK_ROWS
    else:
        rows = min(_MAX_BLOCK_ROWS, max(_BLOCK_ROWS, -(-_MIN_BLOCK_WORK // max(wgrad, 1))))
    per = max(1, -(-rows // max(N, 1)))
    blocks = -(-T // per) if T else 1
    return max(1, -(-T // blocks))


def _gemm_blocks(ta, split):
    """Blocks of a whole-sequence product whose split dimension (C's rows, or the inner
    dimension k of ``Aᵀ·B``) is ``split``: 1, 2 or 4 (a power of two, so that two threads
    share them evenly)."""
    blocks = max(1, min(_MAX_GEMM_BLOCKS, split // (4 * _MIN_GEMM_ROWS if ta else
                                                     _MIN_GEMM_ROWS)))
    return 1 << (blocks.bit_length() - 1)


def _wgrad_split(k, m):
    """``(blocks, split_rows)`` of a weight-gradient product ``C[m, n] = Aᵀ·B`` with inner
    dimension ``k``: blocks of k when there are two or more; else (a short sequence: ``T·N``
    under ``8·_MIN_GEMM_ROWS``) blocks of C's rows, so that both cores share the product."""
    blocks = _gemm_blocks(True, k)
    if blocks >= 2:
        return blocks, False
    return _gemm_blocks(False, m), True


def gemm_pack_size(k, n, dtype):
    """Elements of the pack of a weight gradient's ``B`` ``[k, n]`` (``gemm``'s ``pack``)."""
    return packed_size(n, k, dtype)


def gemm_partial_size(k, c_size):
    """Elements of the partial sums a weight-gradient product ``C = Aᵀ·B`` with inner dimension
    ``k`` and ``c_size`` elements of C needs (``gemm``'s ``partial``)."""
    return (min(_gemm_blocks(True, k), max(k, 1)) - 1) * c_size


def gemm(ta, tb, A, B, C, beta=0.0, nt=1, partial=None, pack=None):
    """``C = op(A)·op(B) + beta·C`` for row-major 2-D arrays (views with unit inner stride).

    A weight gradient ``C (+)= Aᵀ·B`` (``ta``, not ``tb``, ``beta`` 0 or 1) runs on the
    kernels' packed GEMM with A read transposed (``blas.gemm_packed_blocks``): B packed into
    ``pack`` (1-D, at least ``gemm_pack_size`` elements, from the call's workspace; else a new
    array), blocks of C's rows on up to ``nt`` pool threads, every element of C one sum over
    all of k in order — bitwise the same for every thread count and split.

    Any other product: blocks of single-threaded BLAS on up to ``nt`` pool threads;
    ``partial`` (1-D, at least ``gemm_partial_size`` elements) holds the partial sums of a
    split inner dimension.  BLAS is held at one thread for the product only
    (``blas_single_threaded``), not for the rest of cgru's call."""
    if ta and not tb and beta in (0.0, 1.0) and C.shape[0] and C.shape[1]:
        gemm_t((A,), B, C, beta, nt, pack)
        return
    if ta:
        blocks, split_rows = _wgrad_split(A.shape[0], C.shape[0])
    else:
        blocks, split_rows = _gemm_blocks(False, C.shape[0]), False
    with blas_single_threaded():
        blas.gemm_blocks(ta, tb, 1.0, A, B, beta, C, blocks, nt, partial, split_rows)


def gemm_t(As, B, C, beta=0.0, nt=1, pack=None):
    """``C (+)= Aᵀ·B`` (``beta`` 0 or 1) where ``A`` ``[k, m]`` is given as its blocks of
    columns ``As`` (row-major views with unit inner stride, in order): C's rows in the same
    blocks, each ``Aᵢᵀ·B``, with ``B`` packed once (into ``pack``, as ``gemm`` does) for all of
    them — a weight gradient whose left operand lies in two buffers (the GRU's recurrent side).
    Each element of C is the same sum over all of k as ``gemm`` computes it."""
    if sum(A.shape[1] for A in As) != C.shape[0]:
        raise ValueError(f"gemm_t: the blocks of A have {sum(A.shape[1] for A in As)} "
                         f"columns in all, C {C.shape[0]} rows")
    if beta not in (0.0, 1.0) or not C.shape[1]:
        c0 = 0
        for A in As:
            gemm(True, False, A, B, C[c0:c0 + A.shape[1]], beta, nt, pack=pack)
            c0 += A.shape[1]
        return
    Bp = pack_rhs(np.ascontiguousarray(B), False, pack, nt)
    c0 = 0
    for A in As:
        Ci = C[c0:c0 + A.shape[1]]
        c0 += A.shape[1]
        if not Ci.shape[0]:
            continue
        rows = _gemm_blocks(False, Ci.shape[0])
        blas.gemm_packed_blocks(A, Bp, Ci, beta == 1.0, rows, nt, True,
                                _column_blocks(rows, Ci.shape[0], Ci.shape[1], A.shape[0], nt,
                                               True))


def _column_blocks(rows, m, n, k, nt, trans_a=False):
    """Blocks of columns per block of rows of a packed product ``[m, n]`` over k with
    ``rows`` row blocks, on up to ``nt`` threads: enough for _MAX_GEMM_BLOCKS blocks in all
    when there are fewer row blocks and the product is big enough to share — with ``trans_a``
    (a weight gradient) one per thread at most, since each block copies all of its rows of A
    (simd.h). One thread: 1, nothing to share (each block reads its rows of A again; a weight
    gradient at n = 128 spent a fifth of its time copying A four times). No element's sum
    depends on the blocks, so neither do the bits."""
    if nt <= 1 or rows >= _MAX_GEMM_BLOCKS or m * n * k < _MIN_COLUMN_SPLIT_WORK:
        return 1
    return min(_MAX_GEMM_BLOCKS // rows, nt) if trans_a else _MAX_GEMM_BLOCKS // rows


def gemm_packed(A, Bp, C, beta1=False, nt=1):
    """``C = A·op(B)`` (``+ C`` with ``beta1``) for row-major 2-D views, ``op(B)`` packed
    (``weights``' packs), as blocks of the kernels' packed GEMM on up to ``nt`` pool threads
    (``blas.gemm_packed_blocks``): the input projections and the input gradients.  Split into
    blocks of C's rows as ``gemm`` splits a product, and those into blocks of columns where
    there are fewer than _MAX_GEMM_BLOCKS; bitwise independent of the split anyway."""
    rows, cols = packed_splits(C.shape[0], C.shape[1], A.shape[1], nt)
    blas.gemm_packed_blocks(A, Bp, C, beta1, rows, nt, False, cols)


def packed_splits(m, n, k, nt):
    """``(row blocks, column blocks)`` of a packed product ``[m, n]`` over ``k`` on up to
    ``nt`` threads (``gemm_packed``'s; the kernels' ``Runner`` takes its input projections'
    from here too)."""
    rows = _gemm_blocks(False, m)
    return rows, _column_blocks(rows, m, n, k, nt)


class Workspace:
    """A call's temporaries: ``add`` each buffer (name, shape), then ``allocate`` them all as
    one block of 64-byte aligned views — the kernels' scratch and the partial sums of the
    products among them, so that nothing below the engine allocates."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self._shapes = {}
        self.nbytes = 0
        self._spare = None          # once ``shared``: idle allocations for the next calls

    def add(self, name, shape):
        if self._spare is not None:
            raise RuntimeError("workspace: a shared layout cannot change")
        self._shapes[name] = (self.nbytes, tuple(shape))
        self.nbytes += -(-math.prod(shape) * self.dtype.itemsize // _ALIGN) * _ALIGN
        return self

    @property
    def block_bytes(self):
        """Bytes of a block at any address that holds the workspace (``nbytes`` and room to
        align its start to 64 bytes): what the C ABI's size query reports."""
        return self.nbytes + _ALIGN if self.nbytes else 0

    def allocate(self, block=None):
        """``{name: view}``, carved from ``block`` (a writable uint8 array of at least
        ``block_bytes``, the caller's) or from a block of the pool; every element uninitialised
        (each buffer is fully written by the step that owns it)."""
        if block is None:
            block = recycled(self.block_bytes)
        elif block.size < self.block_bytes:
            raise ValueError(f"workspace: {block.size} bytes is too small; this call needs "
                             f"{self.block_bytes}")
        start = -address(block) % _ALIGN if block.size else 0
        item = self.dtype.itemsize
        return {name: block[start + off:start + off + math.prod(shape) * item]
                .view(self.dtype).reshape(shape)
                for name, (off, shape) in self._shapes.items()}

    # --- a layout shared by the calls of one shape (the engine's plan cache)
    def shared(self):
        """This layout, made unchangeable and able to lend its allocations to call after call
        (``borrow`` / ``give_back``): what a repeated call of one shape would otherwise make
        again — the pool's block and its views — is made once."""
        self._spare = []
        return self

    def borrow(self):
        """``allocate()``'s views, of an allocation no other call holds: an idle one of this
        layout when there is one, else new."""
        if self._spare and _reuse:
            with _pool_lock:
                if self._spare:
                    return _take_spare(self)
        return self.allocate()

    def give_back(self, views):
        """The call that borrowed ``views`` is done with them: kept for this layout's next call
        when small (``SPARE_BLOCK_BYTES``), within ``SPARE_BYTES`` for all layouts together (the
        least recently returned leave first: their blocks go back to the pool, where calls of
        other shapes can have them), else they go at once."""
        if self._spare is None or self.block_bytes > SPARE_BLOCK_BYTES or not _reuse:
            return
        _keep_spare(self, views)


class BlockLender:
    """Blocks of ``block_bytes`` (at most ``SPARE_BLOCK_BYTES``), each lent whole to one call at
    a time and carved for several layouts — a small training step's forward and backward — each
    layout's views carved once per block and kept with it.  A step then holds one block, its
    forward handing it to its backward as a larger step's do through the pool
    (``engine._training_block_bytes``), and neither carves its views again.  Idle blocks are
    kept as a shared layout's idle allocations are (``Workspace.give_back``)."""

    def __init__(self, block_bytes):
        self.block_bytes = block_bytes
        self._spare = []            # idle (block, {layout: views})

    def borrow(self, layout):
        """``(lent, views)``: a block no other call holds and ``layout``'s views over it (the
        layout's ``block_bytes`` at most this lender's); ``lent`` goes to ``give_back``."""
        lent = None
        if self._spare and _reuse:
            with _pool_lock:
                if self._spare:
                    lent = _take_spare(self)
        if lent is None:
            lent = (recycled(self.block_bytes), {})
        views = lent[1].get(layout)
        if views is None:
            if len(lent[1]) >= 4:       # layouts of other shapes of this size: carved anew
                lent[1].clear()
            views = lent[1][layout] = layout.allocate(lent[0])
        return lent, views

    def give_back(self, lent):
        """The call that borrowed ``lent`` is done with it."""
        if _reuse:
            _keep_spare(self, lent)


@functools.lru_cache(maxsize=64)
def block_lender(block_bytes):
    """The ``BlockLender`` of blocks of ``block_bytes`` (one per size, shared)."""
    return BlockLender(block_bytes)


@functools.lru_cache(maxsize=256)
def shape_plan(make, *args):
    """``make(*args)``: a plan that is a function of a call's model and shapes alone (immutable
    values), made once for every network of them — a training loop's weights, and with them its
    ``Frozen``, change every step; its shapes do not.  ``release_pool`` empties it."""
    return make(*args)


@functools.lru_cache(maxsize=128)
def shared_layout(make, *args):
    """The plan cache: ``make(*args)`` — a workspace layout, a pure function of the call's
    model and shapes, all of them immutable values — made once and shared (``Workspace.shared``:
    it lends its allocations to call after call).  The 128 most recently used are kept;
    ``release_pool`` empties it."""
    return make(*args).shared()


# Idle allocations of shared layouts: blocks of at most SPARE_BLOCK_BYTES (step-sized calls,
# where making the allocation is a visible part of a call's cost), SPARE_BYTES in all.
SPARE_BLOCK_BYTES = 256 << 10
SPARE_BYTES = 1 << 20
_spare_bytes = 0
_spare_order = collections.OrderedDict()     # id(layout) -> layout with idle allocations


def _take_spare(owner):
    """One idle allocation of ``owner`` (a shared layout or a ``BlockLender``; under
    ``_pool_lock``; it has one)."""
    global _spare_bytes
    views = owner._spare.pop()
    _spare_bytes -= owner.block_bytes
    if not owner._spare:
        del _spare_order[id(owner)]
    return views


def _keep_spare(owner, item):
    """Keep ``item``, an idle allocation of ``owner`` (a shared layout or a ``BlockLender``),
    for its next call: two at most per owner, ``SPARE_BYTES`` in all (the least recently
    returned leave first, their blocks back to the pool, where calls of other shapes can have
    them)."""
    global _spare_bytes
    with _pool_lock:
        if len(owner._spare) >= 2:
            return
        owner._spare.append(item)
        _spare_bytes += owner.block_bytes
        _spare_order[id(owner)] = owner
        _spare_order.move_to_end(id(owner))
        while _spare_bytes > SPARE_BYTES:
            _take_spare(next(iter(_spare_order.values())))


def release_spares():
    """Drop every shared layout's idle allocations (their blocks return to the pool)."""
    with _pool_lock:
        while _spare_order:
            _take_spare(next(iter(_spare_order.values())))
