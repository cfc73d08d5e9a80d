"""The reserve: what a training forward saves for its backward, in one ``uint8`` buffer.

One mechanism for every caller: the core's ``forward``/``backward``, ``cgru.tf`` (its
``reserve_space`` *is* this buffer), the C ABI (which keeps it inside its reserve space) and
``cgru.mps`` (which rebuilds it from MPSGraph's ``zState``: ``cgru.core.rebuild``).

``create`` makes one (the forward), ``read`` checks one and returns its views (the backward).

Layout (every region 64-byte aligned), sized and carved by ``Layout`` — the same object::

    header   int64[16]     see below
    lengths  int64[N]      the sequence lengths
    per layer-direction i = l·D + d, the cell's saved tensors (time-major, row t·N + b;
    S = the state width, P with an LSTM projection, else H):
        GRU:   gates   [T, N, 3H]    r, z, n after activation          (0 on padded steps)
               states  [T+1, N, H]   h0 and the state after every step (see the kernels)
               hn      [T, N, H]     h·R_nᵀ + b_Rn                     (reset-after only)
        LSTM:  gates   [T, N, 4H]    i, f, g, o after activation
               states  [T+1, N, S]   h, slots as for the GRU
               cstates [T+1, N, H]   c, the same slots
               hf      [T, N, H]     o ⊙ h(c') before the projection   (projection only)
        RNN:   states  [T+1, N, H]   (the activated values are the states)
        every kind: pre [T, N, G·H]  pre-activations (cells off the kernels' fast path: other
                                     activations, or clip)
    per layer l ≥ 1:
        xin_l  [T, N, D·S]   that layer's input (the layer below's output after dropout)

so ``nbytes = 128 + ⌈8N⌉ + L·D·Σ⌈region⌉ + (L − 1)·⌈T·N·D·S·itemsize⌉`` (``⌈·⌉``: rounded up
to 64 bytes), computed in closed form.  Inference saves nothing (no reserve).

Header (``int64[16]``)::

    0 magic   1 version   2 T   3 N   4 itemsize
    5 digest of the model: topology, cell, T, N, dtype, layout (time- or batch-major)
    6 dropout probability (float64 bits)   7 seed   8 seed2
    9 MAC of x    10 MAC of the weights    11 MAC of h0 (and c0)    12 MAC of the state mask
    13 flags (bit 0: batch-major)   14 MAC of slots 0–13 and the lengths   15 zero

**Binding.**  The backward recomputes the MACs of what it is given and refuses a reserve written
by a forward with a different model, layout, ``x``, weights or state mask (``ValueError`` naming
which); frontends that receive ``h0`` again (TF's backprop ops) check it too.  Slot 14 covers
every other header field and the lengths, so a reserve whose dropout, seeds, lengths, layout or
recorded MACs were changed after the forward is refused as a whole.  A MAC is a keyed BLAKE2b
(8 bytes) of the arrays' dtypes, shapes and keyed fingerprints (``hash.h``: a universal hash
whose collision probability is bounded for every pair of inputs); both keys are drawn at random
once per process, so nobody who chooses the inputs can steer a collision, and a reserve is
valid only in the process that made it and its forked children.  One pass over each array,
memory-bound; the weights' fingerprints are taken once per kept copy (``weights``).
"""
import functools
import hashlib
import math
import os
import struct

import numpy as np

from cgru.core import kinds, plan, validate
from cgru._kernels.loops import address, fingerprint

MAGIC = 0x63677275  # "cgru"
VERSION = 4         # 4: keyed MACs, and a MAC of the header itself
HEADER = 16  # int64 slots
ALIGN = 64
_FLAG_BATCH_MAJOR = 1
_SLOTS = {"x": 9, "params": 10, "h0": 11, "state_mask": 12}
_SEAL = 14
# The MAC key: random, once per process (a forked child inherits it).
_KEY = os.urandom(32)
_KEYED = hashlib.blake2b(key=_KEY, digest_size=8, person=b"cgru-reserve")   # copied per MAC


def _up(nbytes):
    return -(-nbytes // ALIGN) * ALIGN


def saved_regions(cell, topology):
    """``[(name, shape as a function of (T, N))]`` a layer-direction of ``cell`` saves (the
    module docstring; its kind's ``saved_regions``)."""
    return kinds.of(cell).saved_regions(cell, topology)


class Layout:
    """Offsets and shapes of the reserve of one call (see the module docstring)."""

    def __init__(self, topology, cell, T, N, dtype):
        self.topology, self.cell, self.T, self.N = topology, cell, T, N
        self.dtype = np.dtype(dtype)
        item = self.dtype.itemsize
        D, L = topology.num_directions, topology.num_layers
        self.per_ld = []                      # [(name, shape, offset within the block)]
        pos = 0
        for name, shape_of in saved_regions(cell, topology):
            shape = shape_of(T, N)
            self.per_ld.append((name, shape, pos))
            pos += _up(math.prod(shape) * item)
        self.ld_bytes = pos
        self.xin_shape = (T, N, topology.output_size)
        self.xin_bytes = _up(math.prod(self.xin_shape) * item)
        self.lengths_offset = _up(HEADER * 8)
        self.ld_offset = self.lengths_offset + _up(8 * N)
        self.xin_offset = self.ld_offset + L * D * self.ld_bytes
        self.nbytes = self.xin_offset + (L - 1) * self.xin_bytes
        self._gaps = None             # made by the first zero_gaps (a size query makes none)
        self._regions = None          # made by the first carve
        self._digests = {}            # batch_major -> model_digest

    def carve(self, reserve):
        """Views of ``reserve`` (a 1-D uint8 array of ``nbytes``): ``(header, lengths, [per
        layer-direction {name: view}], {l: xin_l})``."""
        regions = self._regions
        if regions is None:
            regions = self._regions = self._find_regions()
        lds_at, xin_at = regions
        view, dt = np.ndarray, self.dtype
        header = view((HEADER,), np.int64, reserve, 0)
        lengths = view((self.N,), np.int64, reserve, self.lengths_offset)
        lds = [{name: view(shape, dt, reserve, off) for name, shape, off in ld} for ld in lds_at]
        xin = {layer: view(self.xin_shape, dt, reserve, off) for layer, off in xin_at}
        return header, lengths, lds, xin

    def digest(self, batch_major):
        """``model_digest`` of this layout's model and shapes with ``batch_major``."""
        d = self._digests.get(batch_major)
        if d is None:
            d = self._digests[bool(batch_major)] = model_digest(
                self.topology, self.cell, self.T, self.N, self.dtype, batch_major)
        return d

    def _find_regions(self):
        """``([per layer-direction [(name, shape, offset)]], [(l, offset of xin_l)])``."""
        lds = [[(name, shape, self.ld_offset + i * self.ld_bytes + off)
                for name, shape, off in self.per_ld]
               for i in range(self.topology.num_layer_directions)]
        xin = [(layer, self.xin_offset + (layer - 1) * self.xin_bytes)
               for layer in range(1, self.topology.num_layers)]
        return lds, xin

    def zero_gaps(self, reserve):
        """Zero the alignment padding between regions, so that equal calls give equal bytes."""
        gaps = self._gaps
        if gaps is None:
            gaps = self._gaps = self._find_gaps()
        for start, end in gaps:
            reserve[start:end] = 0

    def _find_gaps(self):
        """``[(start, end)]`` of the alignment padding between the regions."""
        item = self.dtype.itemsize
        spans = [(0, HEADER * 8), (self.lengths_offset, self.lengths_offset + 8 * self.N)]
        for i in range(self.topology.num_layer_directions):
            base = self.ld_offset + i * self.ld_bytes
            spans += [(base + off, base + off + math.prod(shape) * item)
                      for _, shape, off in self.per_ld]
        for layer in range(1, self.topology.num_layers):
            base = self.xin_offset + (layer - 1) * self.xin_bytes
            spans.append((base, base + math.prod(self.xin_shape) * item))
        ends = [end for _, end in spans]
        starts = [start for start, _ in spans[1:]] + [self.nbytes]
        return [(end, nxt) for end, nxt in zip(ends, starts) if nxt > end]


def reserve_nbytes(topology, T, N, *, cell=None, dtype=np.float32):
    """Size in bytes of the reserve a training ``forward`` returns for these sizes.

    ``topology``: a ``cgru.Network`` (its cell and dtype are used unless given) or a
    ``cgru.Topology`` (then ``cell`` — default cuDNN's GRU cell — and ``dtype``).  Closed form;
    the same limits as the calls (``T·N`` and every GEMM dimension within 32-bit BLAS ints)."""
    from cgru.core.network import Network, Topology
    if isinstance(topology, Network):
        net = topology
        cell = net.cell if cell is None else cell
        dtype = net.dtype
        topology = net.topology
    if not isinstance(topology, Topology):
        raise TypeError(f"topology: expected a cgru.Topology, got {type(topology).__name__}")
    from cgru.core.cells import GRUCell, is_cell
    if cell is None:
        cell = GRUCell()
    elif not is_cell(cell):
        raise TypeError(f"cell: expected a cgru.Cell (or another cgru cell kind), got "
                        f"{type(cell).__name__}")
    T, N = validate.positive_int(T, "T"), validate.positive_int(N, "N")
    validate.call_sizes(topology, cell.gates, T, N, "reserve_nbytes")
    nbytes = Layout(topology, cell, T, N, validate.as_dtype(dtype)).nbytes
    return validate.nbytes_limit(nbytes, f"T={T}, N={N} (with {topology})", "the reserve")


@functools.lru_cache(maxsize=256)
def layout_of(topology, cell, T, N, dtype):
    """The ``Layout`` of these values, made once for the calls of the same model and shapes
    (a layout is never changed once made)."""
    return Layout(topology, cell, T, N, dtype)


@functools.lru_cache(maxsize=256)
def model_digest(topology, cell, T, N, dtype, batch_major):
    key = repr((topology, cell, T, N, np.dtype(dtype).str, bool(batch_major))).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "little")


def mac(label, *parts):
    """The keyed MAC (BLAKE2b, 8 bytes, as a signed int64) of ``label`` and ``parts`` (bytes)."""
    h = _KEYED.copy()
    h.update(label)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return int.from_bytes(h.digest(), "little", signed=True)


def describe(a, fp=None):
    """What a MAC covers of one array: its dtype, shape and keyed fingerprint (bytes; ``fp``:
    the fingerprint of ``a`` when the caller has taken it already)."""
    key = (a.dtype, a.shape)
    words = _WORDS.get(key)
    if words is None:       # (from the key itself: another thread may reshape ``a`` meanwhile)
        words = f"{key[0].str}{key[1]}".encode()
        if len(_WORDS) < _MAX_WORDS:
            _WORDS[key] = words
    return words + (fingerprint(a) if fp is None else fp)


_WORDS = {}             # (dtype, shape) -> describe's words for them, made once per pair
_MAX_WORDS = 4096


def data_mac(label, *arrays):
    """The MAC of the arrays given, in order (``None`` entries recorded as absent)."""
    if len(arrays) == 1:                    # (most calls: one array, or none)
        a = arrays[0]
        return _absent_mac(label, 1) if a is None else mac(label, describe(a))
    if all(a is None for a in arrays):
        return _absent_mac(label, len(arrays))
    return mac(label, *(b"-" if a is None else describe(a) for a in arrays))


@functools.lru_cache(maxsize=16)
def _absent_mac(label, n):
    return mac(label, *([b"-"] * n))


def weights_mac(frozen):
    """The MAC of a call's weights (``weights.Frozen``: the fingerprints of its kept copies),
    made once per ``Frozen`` (a function of those immutable copies alone)."""
    return frozen.memo(("weights mac",), lambda: mac(b"weights", *frozen.fingerprints()))


_HEAD_WORDS = struct.Struct(f"={_SEAL}q")     # the slots before the seal, as int64 bytes
_I64, _F64 = struct.Struct("=q"), struct.Struct("=d")


def _float_bits(value):
    """The bits of ``value`` as a float64, as a signed int64 (the header's dropout slot)."""
    return _I64.unpack(_F64.pack(value))[0]


def _bits_float(bits):
    """The float64 whose bits are the int64 ``bits`` (``_float_bits`` undone)."""
    return _F64.unpack(_I64.pack(bits))[0]


def _seal(header, lengths):
    """The MAC of a header's slots before the seal (Python ints) and the lengths."""
    return mac(b"header", _HEAD_WORDS.pack(*header[:_SEAL]),
               np.ascontiguousarray(lengths).tobytes())


def create(layout, *, lengths, dropout, seed, seed2, batch_major, x, weights, h0, state_mask,
           block=None):
    """A reserve with its header and lengths written (and sealed); the rest for the forward to
    fill.  ``x``, ``weights``, ``h0``, ``state_mask`` are MACs (``data_mac``,
    ``weights.Frozen.mac``).  ``block``: the caller's uint8 array of ``layout.nbytes`` to
    write it into (the C ABI's reserve space), else one from the pool."""
    if block is None:
        reserve = plan.recycled(layout.nbytes)
    elif block.dtype != np.uint8 or block.shape != (layout.nbytes,):
        raise ValueError(f"out['reserve']: expected a uint8 array of {layout.nbytes} bytes, got "
                         f"{block.dtype} {list(block.shape)}")
    else:
        reserve = block
    layout.zero_gaps(reserve)
    header, lens, lds, xin = layout.carve(reserve)
    words = [MAGIC, VERSION, layout.T, layout.N, layout.dtype.itemsize,
             layout.digest(batch_major), _float_bits(dropout), seed, seed2,
             x, weights, h0, state_mask, _FLAG_BATCH_MAJOR if batch_major else 0]
    lens[:] = lengths
    words += [_seal(words, lens)] + [0] * (HEADER - _SEAL - 1)
    header[:] = words
    return reserve, (header, lens, lds, xin)


def is_reserve(buf):
    """True when ``buf`` (a 1-D uint8 array) starts as every cgru reserve does (magic and this
    version), whatever its call."""
    if not (isinstance(buf, np.ndarray) and buf.dtype == np.uint8 and buf.ndim == 1
            and buf.size >= HEADER * 8):
        return False
    head = np.frombuffer(buf[:16].tobytes(), np.int64)
    return bool(head[0] == MAGIC and head[1] == VERSION)


class Opened:
    """A checked reserve: its views and what its header records."""

    def __init__(self, views, what="reserve"):
        self.what = what
        self.header, self.lengths, self.lds, self.xin = views
        header = self.header
        self.dropout = _bits_float(header[6])
        self.seed, self.seed2 = int(header[7]), int(header[8])
        self.batch_major = bool(header[13] & _FLAG_BATCH_MAJOR)

    def check(self, what, value_mac, words=None):
        """Refuse when ``what`` (``"x"``, ``"params"``, ``"h0"``, ``"state_mask"``) differs from
        the forward's (``value_mac``: its MAC); ``words`` names it in the caller's words."""
        if int(self.header[_SLOTS[what]]) != value_mac:
            raise ValueError(f"{self.what}: written by a forward with a different "
                             f"{words or what} than this backward's (the reserve belongs to "
                             f"one forward call)")


def read(reserve, layout, *, batch_major, what="reserve", inference_hint=None):
    """The checked views (an ``Opened``) of a reserve a training forward with this layout wrote.

    Refuses (``TypeError``/``ValueError``) anything else: not a uint8 array, empty (an
    inference forward's), another size, a damaged header, another model or layout."""
    if not isinstance(reserve, np.ndarray) or isinstance(reserve, np.ma.MaskedArray):
        raise TypeError(f"{what}: expected the numpy array a training forward returned, got "
                        f"{type(reserve).__name__}")
    if reserve.dtype != np.uint8 or reserve.ndim != 1:
        raise TypeError(f"{what}: expected a 1-D uint8 array, got {reserve.dtype} with shape "
                        f"{list(reserve.shape)}")
    if reserve.size == 0:
        raise ValueError(inference_hint or
                         f"{what}: empty; backward needs the reserve of a training forward "
                         f"(training=True), an inference forward saves nothing")
    if reserve.size != layout.nbytes:
        raise ValueError(f"{what}: expected {layout.nbytes} bytes for this topology, cell, "
                         f"T={layout.T}, N={layout.N} and dtype {layout.dtype}, got "
                         f"{reserve.size} (from a different call?)")
    if address(reserve) % 8 or not reserve.flags.c_contiguous:
        reserve = reserve.copy()  # read-only use: a C-contiguous aligned copy
    views = layout.carve(reserve)
    # what is checked is what is used: a snapshot of the header (Python ints) and a copy of the
    # lengths, which a thread writing the reserve meanwhile cannot change after their checks
    head = views[0].tolist()
    lengths = views[1].copy()
    if head[0] != MAGIC or head[1] != VERSION:
        raise ValueError(f"{what}: not a cgru reserve (bad header); pass the reserve of the "
                         f"matching training forward")
    if head[_SEAL] != _seal(head, lengths):
        raise ValueError(_UNSEALED.format(what=what))
    if head[5] != layout.digest(batch_major):
        if bool(head[13] & _FLAG_BATCH_MAJOR) != bool(batch_major):
            raise ValueError(f"{what}: written by a forward with batch_major="
                             f"{bool(head[13] & _FLAG_BATCH_MAJOR)}, this backward has "
                             f"batch_major={bool(batch_major)}")
        raise ValueError(f"{what}: written by a forward with a different topology, cell, "
                         f"sizes or dtype than this backward")
    lo, hi = validate.length_range(lengths)
    if lo < 0 or hi > layout.T:
        raise ValueError(f"{what}: corrupt sequence lengths")
    if lo == layout.T:      # every sequence whole: the calls' shared array of such lengths
        lengths = validate.full_lengths(layout.T, layout.N)
    opened = Opened((head, lengths) + views[2:], what)
    if not (0.0 <= opened.dropout < 1.0):
        raise ValueError(f"{what}: corrupt header (dropout field); pass the reserve of the "
                         f"matching training forward")
    return opened


_UNSEALED = ("{what}: its header or sequence lengths do not verify: changed after the forward "
             "wrote them, or written by another process (a reserve is valid in the process "
             "that made it and its forked children); pass the reserve of the matching training "
             "forward")


def read_header(reserve, what="reserve"):
    """``{"dropout", "seed", "seed2", "batch_major", "T", "N"}`` of a reserve's header, for
    frontends that check their own attributes against the forward's (``reserve``: a 1-D uint8
    array that ``is_reserve``).  Refused (``ValueError``) when the header does not verify."""
    head = np.frombuffer(reserve[:HEADER * 8].tobytes(), np.int64).tolist()
    N = head[3]
    start = _up(HEADER * 8)
    if not 0 <= N <= (reserve.size - start) // 8:
        raise ValueError(_UNSEALED.format(what=what))
    lengths = np.frombuffer(reserve[start:start + 8 * N].tobytes(), np.int64)
    if head[_SEAL] != _seal(head, lengths):
        raise ValueError(_UNSEALED.format(what=what))
    return {"T": head[2], "N": head[3],
            "dropout": _bits_float(head[6]),
            "seed": head[7], "seed2": head[8],
            "batch_major": bool(head[13] & _FLAG_BATCH_MAJOR)}
