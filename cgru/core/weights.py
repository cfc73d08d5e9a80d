"""The weights a call computes with: kept copies proven equal to the caller's arrays, and what
cgru derives from them (the recurrent matrices packed for the time loop's GEMM), across calls.

A call begins with ``freeze(net)``.  For every weight array of the network it looks up the copy
kept for that array (found by the array's address, shape, strides and dtype) and compares the
bytes: equal, the kept copy serves — with its packs and its fingerprint, made from exactly those
bytes —; different (or none kept), a new copy is taken and kept in its place.  The call then
reads only the copies, never the caller's arrays again.  So:

* **A kept value is used only when proven to belong to the weights in use**: by comparing every
  byte, never by a hash alone.  A pack is made from the copy it is kept with, so a pack and the
  bytes it stands for can never disagree.
* **A concurrent update** of the weights in place (an optimizer thread, a checkpoint reload)
  during a call gives that call the weights as they were read at its start — each array old or
  new, or, for the array being written at that very moment, partly old and partly new, as any
  reader of memory that another thread is writing sees it — and never touches a later call:
  what is kept is a copy of what was read, checked again on every use.
* **What is made from the copies** — the call's ``Frozen`` (its network over the copies), the
  kernels' fixed arguments, the plans, the weights' MAC — is a function of the copies alone:
  a ``Frozen`` hangs on its copies (``Kept.frozen``), and a call whose every array was just
  proven to be one of those very copies takes it as it is.  It leaves with the first of its
  copies to leave the cache.
* **Cost.** A hit costs one comparison of each weight array (memory-bound, two reads); a miss
  (weights that changed, as in every training step) one copy, and the packs again.  Insertion
  and lookup are O(1); the cache holds at most ``CACHE_BYTES`` (copies and packs counted),
  least recently used entries leaving first, and one entry per array: a training loop that
  updates its weights in place replaces its entries, so its memory and step cost stay flat
  however long it runs.  An entry also leaves when the object that owns the array's memory (the
  array itself, or the base of a view: a torch parameter behind ``p.numpy()``, say) is freed,
  so arrays made for one call leave nothing behind; memory whose owner cannot be watched (no
  weak references) is copied for the call and not kept.  ``release_memory()`` empties it.

**Sealed weights** (``Network.sealed()``) are proven by identity: their memory is a ``Sealed``
``bytes`` object that no array can write, so the array itself serves as the call's copy, with
no comparison and no copy (a C-contiguous, aligned view; other views are copied as usual);
its ``Kept`` (and so its packs) hangs on that memory object and is freed with it, outside the
cache and its bound.  A network whose every array is sealed keeps its ``Frozen`` too, so its
next call skips even the lookups (proof: the same layer tuple, each array's same address,
shape, strides and dtype).

``cgru.Stream`` keeps the ``Frozen`` network of its last ``refresh`` (its snapshot).
"""
import collections
import functools
import os
import threading
import weakref

import numpy as np

from cgru.core.network import LayerParams, Sealed, memory_owner as _owner
from cgru.core.reserve import describe
from cgru._kernels.loops import array_key, copy_fingerprint, pack_rhs, same_bytes

__all__ = ["freeze", "Frozen", "Kept", "OneCall", "release", "CACHE_BYTES"]

CACHE_BYTES = 256 << 20
_reuse = True                 # False: nothing is kept between calls (the tests' poisoning)
_cache = collections.OrderedDict()   # key -> Kept, least recently used first
_cached_bytes = 0
_lock = threading.RLock()     # re-entrant: an owner's finalisation may drop an entry anywhere
_plans_lock = threading.Lock()   # every Frozen's plans (one lock, so that a fork can renew it)
_frozen_sealed = weakref.WeakKeyDictionary()   # a sealed network -> (layers, arrays, keys, Frozen)


class Kept:
    """A read-only copy of one weight array and what cgru derived from exactly its bytes."""

    __slots__ = ("array", "nbytes", "cached", "watch", "frozen", "_derived", "_fingerprint")

    def __init__(self, array):
        self.array = array
        self.nbytes = array.nbytes
        self.cached = False
        self.watch = None             # a weak reference to the owner of the source's memory
        self.frozen = None            # (topology, cell, cell given, kept, Frozen): see _memo
        self._derived = {}
        self._fingerprint = None

    def derived(self, name, make):
        """``make(self.array)`` (an array), made once per copy and kept with it, read-only
        (``name`` says which derived value)."""
        value = self._derived.get(name)
        if value is not None:
            return value
        value = make(self.array)
        value.flags.writeable = False
        with _lock:
            first = self._derived.setdefault(name, value)
            if first is value:
                _grow(self, value.nbytes)
        return first

    @classmethod
    def of_copy(cls, a, fingerprinted):
        """The ``Kept`` of a new copy of ``a``; ``fingerprinted``: with its fingerprint, taken
        in the same pass as the copy (a training call needs it)."""
        copy, fp = _copy(a, fingerprinted)
        kept = cls(copy)
        if fp is not None:
            kept._fingerprint = describe(copy, fp)
        return kept

    @property
    def fingerprint(self):
        """The copy's dtype, shape and keyed fingerprint (``reserve.describe``'s bytes)."""
        if self._fingerprint is None:
            self._fingerprint = describe(self.array)
        return self._fingerprint


def _grow(kept, nbytes):
    """Account ``nbytes`` more to ``kept`` (under ``_lock``), evicting beyond the bound."""
    global _cached_bytes
    kept.nbytes += nbytes
    if kept.cached:
        _cached_bytes += nbytes
        _evict()


def _evict():
    global _cached_bytes
    while _cached_bytes > CACHE_BYTES and _cache:
        _, old = _cache.popitem(last=False)
        _uncache(old)
        _cached_bytes -= old.nbytes


def _uncache(kept):
    """``kept`` leaves the cache (under ``_lock``): so does the ``Frozen`` made over it, which
    would otherwise hold it (and the other copies of its network) beyond the cache's bound,
    and so does its watch, whose callback refers back to it — a cycle that only the garbage
    collector would break, keeping every replaced copy and its packs alive until it runs (a
    training loop's weights, replaced every step, held tens of steps' copies)."""
    kept.cached = False
    kept.watch = None
    memo = kept.frozen
    if memo is not None:
        for ks in memo[3]:
            for k in ks.values():
                k.frozen = None


def _drop(key, kept, _ref=None):
    """The owner of ``kept``'s source memory is gone: its entry leaves (if still in place).
    At the interpreter's exit the owner may outlive this module's globals (torn down to
    ``None``): there is nothing left to keep then."""
    global _cached_bytes
    if _lock is None or _cache is None or _uncache is None:
        return
    with _lock:
        if _cache.get(key) is kept:
            del _cache[key]
            _uncache(kept)
            _cached_bytes -= kept.nbytes


def keep(a, num_threads=1, fingerprinted=False):
    """The ``Kept`` copy of array ``a``'s current bytes: the one kept for ``a`` when its bytes
    are still ``a``'s (compared on up to ``num_threads`` of cgru's threads), else a new copy
    (kept in its place when it fits; ``fingerprinted``: fingerprinted as it is copied)."""
    global _cached_bytes
    if not _reuse:
        return Kept.of_copy(a, fingerprinted)
    owner = _owner(a)
    if type(owner) is Sealed and a.flags.c_contiguous and a.flags.aligned:
        return _sealed(a, owner)
    key = (array_key(a), id(owner))
    with _lock:
        kept = _cache.get(key)
        if kept is not None:
            _cache.move_to_end(key)
    if kept is not None and same_bytes(a, kept.array, num_threads):
        return kept
    kept = Kept.of_copy(a, fingerprinted)
    if kept.nbytes > CACHE_BYTES // 8:
        return kept
    try:
        kept.watch = weakref.ref(owner, functools.partial(_drop, key, kept))
    except TypeError:                     # an owner without weak references: not kept
        return kept
    with _lock:
        old = _cache.pop(key, None)
        if old is not None:
            _uncache(old)
            _cached_bytes -= old.nbytes
        _cache[key] = kept
        kept.cached = True
        _cached_bytes += kept.nbytes
        _evict()
    return kept


def _sealed(a, memory):
    """The ``Kept`` of an array over ``Sealed`` memory: ``a`` itself (its bytes cannot change),
    one per view of that memory, kept on it."""
    key = array_key(a)
    found = memory.__dict__.get(key)
    if found is None:
        with _lock:
            found = memory.__dict__.setdefault(key, Kept(a))
    return found


def _copy(a, fingerprinted=False):
    """``(copy, fingerprint)``: a read-only C-contiguous copy of ``a`` and, ``fingerprinted``,
    the copy's fingerprint taken in the same pass (``copy_fingerprint``), else None."""
    if fingerprinted:
        copy, fp = copy_fingerprint(a)
    else:
        copy, fp = np.array(a, order="C", copy=True), None
    copy.flags.writeable = False
    return copy, fp


class Frozen:
    """The weights of one call: ``net`` (a ``Network`` of the kept copies, the caller's cell
    and topology) and ``kept[i][name]`` (the ``Kept`` of layer-direction ``i``'s array)."""

    __slots__ = ("net", "kept", "_args", "_plans", "__weakref__")

    PLANS = 16          # the forward plans kept, for the most recent shapes

    def __init__(self, net, kept):
        self.net = net
        self.kept = kept
        self._args = {}
        self._plans = collections.OrderedDict()     # under _plans_lock

    def direction_args(self, kind, cell, i, forward):
        """Layer-direction ``i``'s fixed arguments of the kernels (``Direction`` keywords) for
        a call of ``cell`` (its ``kind``), made once per ``Frozen`` and cell: forward, the
        packs of the recurrent weights and the kind's ``fixed`` (the bias sums…, read-only);
        backward, the packs.  They derive from the kept copies alone, which nothing writes, so
        they hold as long as this ``Frozen`` (a sealed network's serves call after call)."""
        return self.memo(("direction", self.cell_key(cell), i, bool(forward)),
                         lambda: self._direction_args(kind, cell, i, forward))

    def cell_key(self, cell):
        """``cell`` in a ``memo`` key: None for the network's own — the same object (the usual
        call, no hashing) or an equal value (a network made anew for the call, which found this
        ``Frozen`` by value) —, else the cell value (a network built without a cell runs any
        cell of its gate count)."""
        return None if _same(cell, self.net.cell) else cell

    def _direction_args(self, kind, cell, i, forward):
        H = self.net.topology.hidden_size
        found = dict(kind.packs(self, i, cell, H, forward))
        if forward:
            for name, a in kind.fixed(self.net[i], cell, H).items():
                if a is not None and a.flags.writeable:
                    a.flags.writeable = False
                found[name] = a
        return found

    def memo(self, key, make):
        """``make()``, made once per ``Frozen`` and ``key``: for what is a function of these
        weights (and of what ``key`` names) alone, and of few keys (layer-directions, cells)."""
        found = self._args.get(key)
        if found is None:
            found = self._args.setdefault(key, make())
        return found

    def plan(self, key, make):
        """As ``memo``, for keys that name shapes (a network may see many): the ``PLANS`` most
        recently used are kept."""
        with _plans_lock:
            found = self._plans.get(key)
            if found is not None:
                self._plans.move_to_end(key)
                return found
        found = make()
        with _plans_lock:
            self._plans[key] = found
            if len(self._plans) > self.PLANS:
                self._plans.popitem(last=False)
        return found

    def fingerprints(self):
        """Every array's fingerprint in order (layer-directions, then names): what the reserve's
        MAC of the weights covers."""
        return [name.encode() + k.fingerprint for layer in self.kept
                for name, k in layer.items()]

    def packed(self, i, name, forward, rows=None):
        """Layer-direction ``i``'s array ``name`` (rows ``rows = (r0, r1)`` of it, or all)
        packed for the time loop's GEMM (``pack_rhs``), once per kept copy."""
        return self.kept[i][name].derived(("pack", bool(forward), rows),
                                          functools.partial(_pack, forward=forward, rows=rows))

    def for_one_call(self):
        """These weights for one call whose packs are not to outlast it (``OneCall``)."""
        return OneCall(self)


def _pack(a, forward, rows):
    """Rows ``rows`` of ``a`` (all when None) packed for the kernels' GEMM."""
    block = a if rows is None else np.ascontiguousarray(a[rows[0]:rows[1]])
    return pack_rhs(block, forward)


class OneCall:
    """A ``Frozen`` as one call sees it when what it packs is to go with the call: the packs
    and kernel arguments its weights already keep serve; any other is made once for this call
    and held by it alone, not kept with the copies.  A long training forward runs on one, so
    that its packs are not held beside the backward's (the training step's peak memory), at
    the cost of packing again in the next step of fixed weights — about half a percent of a
    step of that length (``plan.ONE_CALL_PACK_ROWS``)."""

    __slots__ = ("net", "kept", "_frozen", "_made")

    def __init__(self, frozen):
        self.net, self.kept, self._frozen, self._made = frozen.net, frozen.kept, frozen, {}

    def packed(self, i, name, forward, rows=None):
        key = ("pack", bool(forward), rows)
        found = self.kept[i][name]._derived.get(key)
        if found is None:
            found = self._made.get((i, name) + key)
            if found is None:
                found = self._made[(i, name) + key] = _pack(self.kept[i][name].array,
                                                            forward, rows)
        return found

    def direction_args(self, kind, cell, i, forward):
        key = ("direction", self._frozen.cell_key(cell), i, bool(forward))
        found = self._frozen._args.get(key)
        if found is None:
            found = self._made.get(key)
            if found is None:
                found = self._made[key] = Frozen._direction_args(self, kind, cell, i, forward)
        return found


def freeze(net, num_threads=1, fingerprinted=False):
    """The ``Frozen`` weights of ``net`` for one call (see the module docstring);
    ``num_threads``: the call's, which share each byte comparison; ``fingerprinted``: the call
    makes or reads a reserve, whose MAC covers the copies' fingerprints — a new copy is
    fingerprinted as it is made (one pass over the array, not two)."""
    memo = _frozen_sealed.get(net) if _reuse else None
    if memo is not None and memo[0] is net.layers and \
            memo[2] == tuple(map(array_key, memo[1])):
        return memo[3]
    kept = [{name: keep(a, num_threads, fingerprinted) for name, a in lp.arrays().items()}
            for lp in net.layers]
    frozen = _memo(net, kept)
    if frozen is not None:
        return frozen
    frozen = Frozen(net.with_layers([LayerParams(**{name: k.array for name, k in ks.items()})
                                     for ks in kept]), kept)
    if _reuse:
        # hung on each copy while every one is in the cache, until one of them leaves it
        memo = (net.topology, net.cell, net._cell_given, kept, frozen)
        with _lock:
            if all(k.cached for ks in kept for k in ks.values()):
                for ks in kept:
                    for k in ks.values():
                        k.frozen = memo
    if _reuse and all(k.array is a for lp, ks in zip(net.layers, kept)
                      for a, k in zip(lp.arrays().values(), ks.values())):
        # every array serves as its own copy: sealed memory, which nothing writes. The same
        # layers (an immutable tuple of frozen LayerParams) over arrays of the same address,
        # shape, strides and dtype are then these weights, so the next call of this network
        # takes this Frozen as it is.
        # (The same layers hold the same array objects: ``arrays`` are those.)
        arrays = tuple(a for lp in net.layers for a in lp.arrays().values())
        _frozen_sealed[net] = (net.layers, arrays, tuple(map(array_key, arrays)), frozen)
    return frozen


def cache_keys(arrays):
    """The cache's keys of ``arrays`` (``keep``'s: their memory and its owner)."""
    return tuple((array_key(a), id(_owner(a))) for a in arrays)


def still_kept(arrays, keys, frozen, num_threads=1):
    """Whether ``arrays`` — a network's, in ``freeze``'s order — hold the bytes of ``frozen``'s
    kept copies now (compared as ``keep`` compares them, on up to ``num_threads`` threads): the
    proof ``freeze`` makes, for a caller that found ``frozen`` by the arrays' identity.  Their
    entries (``keys``: ``cache_keys``) become the cache's most recently used, as ``keep``
    makes them."""
    kept = [k for ks in frozen.kept for k in ks.values()]
    if len(kept) != len(arrays) or not _reuse:
        return False
    for a, k in zip(arrays, kept):
        if not same_bytes(a, k.array, num_threads):
            return False
    with _lock:
        for key in keys:
            if key in _cache:
                _cache.move_to_end(key)
    return True


def sealed_memo(net):
    """``(layers, arrays, their array_keys, Frozen)`` that ``freeze`` keeps for a sealed
    network (its last call's), or None."""
    return _frozen_sealed.get(net) if _reuse else None


def _memo(net, kept):
    """The ``Frozen`` made for the very copies ``kept`` (each ``Kept`` is an immutable copy,
    just proven equal to the caller's array), of a network of the same topology and cell: it
    is a function of these alone, so the call takes it as it is — with its packs, its plans
    and the kernels' fixed arguments — instead of making them again.  ``None`` when there is
    none.  The topology and the cell are immutable values, compared as such: a frontend that
    makes them anew for every call (from a TF op's attributes, an ONNX node's) finds the
    ``Frozen`` too."""
    first = next(iter(kept[0].values()), None) if kept else None
    memo = first.frozen if first is not None else None
    if memo is None or not _same(memo[0], net.topology) or not _same(memo[1], net.cell) or \
            memo[2] != net._cell_given or len(memo[3]) != len(kept):
        return None
    for ks, ms in zip(kept, memo[3]):
        if ks.keys() != ms.keys() or any(k is not ms[name] for name, k in ks.items()):
            return None
    return memo[4]


def _same(a, b):
    """``a`` and ``b`` are the same immutable value (a ``Topology``, a cell, or ``None``)."""
    return a is b or (type(a) is type(b) and a == b)


def release():
    """Drop every kept copy (the memory returns once no call or stream refers to it)."""
    global _cached_bytes
    with _lock:
        for kept in _cache.values():
            _uncache(kept)
        _cache.clear()
        _cached_bytes = 0


def cached_entries():
    """``(entries, bytes)`` the cache holds now (for tests)."""
    with _lock:
        return len(_cache), _cached_bytes


def _fresh_lock():
    """In a forked child: new locks (another thread of the parent may have held one at the
    fork, and would never release it here: the child's next call waited for it forever), and
    the cache's accounting made whole again — the fork may have caught that thread between
    two of its updates (an entry in place but not yet marked cached, its bytes not yet
    counted)."""
    global _lock, _plans_lock, _cached_bytes
    _lock = threading.RLock()
    _plans_lock = threading.Lock()
    for kept in _cache.values():
        kept.cached = True
    _cached_bytes = sum(kept.nbytes for kept in _cache.values())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock)
