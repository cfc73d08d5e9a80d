"""The plan of a call: how its work is split, and every buffer it needs, sized and allocated once.

* **Work split** (a function of the shapes only, never of the thread count, so results never
  depend on it): the time loop's batch chunks (``n_chunks``), when a loop is worth a second
  thread (``loop_threads``), and the whole-sequence GEMMs as blocks of single-threaded BLAS
  on the pool (``gemm``).
* **Buffers**: ``Workspace`` sizes a call's temporaries (input projections, gate gradients,
  intermediate layers) and allocates them as one block, carved into views — as oneDNN's
  ``set_offsets`` and llm.c's ``fill_in_*`` do.  Outputs (``y``, ``hy``, ``dx``, ``dh0``,
  the reserve) are allocated on their own: they outlive the call.

Every buffer cgru allocates comes from ``empty`` (the tests poison it with NaN to see that
every element is written).  The workspace blocks and the reserves come from ``recycled``: a
small pool that hands a block out again once nothing refers to it any more (its views are
gone, the caller dropped the reserve), so that a training loop does not fault fresh pages in
on every step.  The pool never holds more than ``POOL_BYTES``; ``release_memory()`` empties it.

The recurrent weights packed for the time loop's GEMMs come from ``packed``: a cache keyed by
the weights' contents (their digest), so that repeated calls with unchanged weights do not
pack them again, and changed weights are never served a stale pack.
"""
import collections
import math
import os
import sys
import threading

import numpy as np

from cgru._kernels import blas
from cgru._kernels.loops import digest, pack_rhs

# Batch chunks of the time loop: a function of N only.  Two chunks from N = 16 (so two threads
# have work), more only while each keeps at least 16 rows (fewer rows per call make the
# per-step GEMM stream R once per 8 rows).
_MAX_CHUNKS = 4
# Below this many multiply-adds per time loop, waking a second thread costs more than it saves
# (and much more on a busy machine).  Only the thread count changes, never the results.
_MIN_PARALLEL_WORK = 1 << 21
# Whole-sequence GEMMs are split into at most _MAX_GEMM_BLOCKS blocks (of C's rows, or of the
# inner dimension for the weight gradients Aᵀ·B; at least _MIN_GEMM_ROWS rows each), one
# single-threaded BLAS call per block on the pool: BLAS's own threads stay asleep and cannot
# fight the time loops' threads for the cores.
_MAX_GEMM_BLOCKS = 4
_MIN_GEMM_ROWS = 128
_ALIGN = 64


def empty(shape, dtype):
    """The one allocation function of cgru's buffers (outputs, reserve, workspaces)."""
    return np.empty(shape, dtype)


POOL_BYTES = 512 << 20
_reuse = True                # False: every block fresh from ``empty`` (the tests' poisoning)
_pool = []                   # uint8 blocks, least recently used first
_pool_lock = threading.Lock()


def recycled(nbytes):
    """A uint8 block of ``nbytes``: a pooled one that nothing else refers to, else a new one
    (kept in the pool, the least recently used blocks leaving it beyond ``POOL_BYTES``)."""
    if not _reuse:
        return empty(nbytes, np.uint8)
    with _pool_lock:
        for i in range(len(_pool)):
            # 2 references: the pool's and getrefcount's argument — no view, no caller
            if _pool[i].size == nbytes and sys.getrefcount(_pool[i]) == 2:
                block = _pool.pop(i)
                if not block.flags.writeable:   # a caller made its reserve read-only
                    try:
                        block.flags.writeable = True
                    except ValueError:
                        break                   # left out of the pool; a fresh block below
                _pool.append(block)
                return block
    block = empty(nbytes, np.uint8)
    if nbytes <= POOL_BYTES // 4:
        with _pool_lock:
            _pool.append(block)
            total = sum(b.size for b in _pool)
            while total > POOL_BYTES:
                total -= _pool.pop(0).size
    return block


PACK_BYTES = 64 << 20
_packs = collections.OrderedDict()   # (digest, forward, dtype, shape) -> packed, LRU first
_packs_lock = threading.Lock()


def packed(B, forward, known_digest=None):
    """``pack_rhs(B, forward)``: the recurrent weights packed for the time loop's GEMMs, from a
    small cache when an array with the same contents was packed before (``B`` C-contiguous;
    ``known_digest``: ``digest(B)`` when the caller has it already, or a key that names
    ``B``'s contents as well, such as ``("rz", digest(R))`` for a block of rows of ``R``).

    The cache is keyed by the digest of ``B``'s contents, dtype and shape, never by the array
    object, so weights changed in place can never meet a stale pack.  It holds at most
    ``PACK_BYTES`` (the least recently used packs leave first); ``release_memory()`` empties
    it.  The packs it returns are read-only and shared between calls and threads."""
    if not _reuse:
        return pack_rhs(B, forward)
    key = (digest(B) if known_digest is None else known_digest, bool(forward), B.dtype.str,
           B.shape)
    with _packs_lock:
        hit = _packs.get(key)
        if hit is not None:
            _packs.move_to_end(key)
            return hit
    out = pack_rhs(B, forward)
    out.flags.writeable = False
    if out.nbytes <= PACK_BYTES // 4:
        with _packs_lock:
            _packs[key] = out
            total = sum(a.nbytes for a in _packs.values())
            while total > PACK_BYTES:
                total -= _packs.popitem(last=False)[1].nbytes
    return out


def _fresh_locks():
    """In a forked child: new locks (another thread of the parent may have held one at the
    fork, and would never release it here)."""
    global _pool_lock, _packs_lock
    _pool_lock, _packs_lock = threading.Lock(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks)


def release_memory():
    """Drop the pool's blocks and the cached packed weights (the memory returns to the
    allocator once nothing refers to them)."""
    with _pool_lock:
        _pool.clear()
    with _packs_lock:
        _packs.clear()


def n_chunks(N, H=0):
    """Batch chunks of every time loop for a batch of ``N`` and hidden size ``H``.  One chunk
    for small batches, and for a few dozen rows of a large layer: the packed GEMM runs faster
    on all the rows than on half of them, and a single loop shares its per-step products with
    the spare threads (a team) instead."""
    if N < 16 or (H >= 768 and N < 48):
        return 1
    return max(2, min(_MAX_CHUNKS, N // 16))


def loop_threads(nt, T, N, H, D, gates):
    """Threads for one layer's time loops: ``nt``, or 1 when the work is too small."""
    return nt if T * N * D * H * (gates * H + 16) >= _MIN_PARALLEL_WORK else 1


def gemm(ta, tb, A, B, C, beta=0.0, nt=1):
    """``C = op(A)·op(B) + beta·C`` for row-major 2-D arrays (views with unit inner stride), as
    blocks of single-threaded BLAS on up to ``nt`` pool threads."""
    split = A.shape[0] if ta else C.shape[0]   # the inner dimension k, or C's rows
    blocks = max(1, min(_MAX_GEMM_BLOCKS, split // (4 * _MIN_GEMM_ROWS if ta else _MIN_GEMM_ROWS)))
    blas.gemm_blocks(ta, tb, 1.0, A, B, beta, C, blocks, nt)


class Workspace:
    """A call's temporaries: ``add`` each buffer (name, shape), then ``allocate`` them all as
    one block of 64-byte aligned views."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self._shapes = {}
        self.nbytes = 0

    def add(self, name, shape):
        self._shapes[name] = (self.nbytes, tuple(shape))
        self.nbytes += -(-math.prod(shape) * self.dtype.itemsize // _ALIGN) * _ALIGN
        return self

    def allocate(self):
        """``{name: view}``; every element uninitialised (each buffer is fully written by the
        step that owns it)."""
        block = recycled(self.nbytes)
        item = self.dtype.itemsize
        return {name: block[off:off + math.prod(shape) * item].view(self.dtype).reshape(shape)
                for name, (off, shape) in self._shapes.items()}
