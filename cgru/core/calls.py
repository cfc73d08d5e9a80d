"""A call, checked once: the value ``forward`` and ``backward`` compute from.

``ForwardCall.check(...)`` and ``BackwardCall.check(...)`` validate every argument of a core
call (in the core's words: ``x``, ``h0``, ``state_mask``, …), take the call's kept copies of the
weights (``weights.freeze``), make ``x`` time-major, and, for the backward, open and check the
reserve.  Below that, nothing is checked, copied or fingerprinted again: ``engine.run_forward``
and ``engine.run_backward`` trust the value.  A frontend that has validated its own arguments
in its own system's words builds the value once the same way (``check`` with its arrays, or
``BackwardCall.check(..., h0=…, lengths=…)`` when its backward receives them again, as TF's
backprop ops do) and runs it — one check, one copy of the weights and one MAC of each array
per call.
"""
import warnings

import numpy as np

from cgru.core import kinds, reserve as reserve_mod, validate, weights
from cgru.core.network import Network
from cgru._kernels.threads import resolve_num_threads

__all__ = ["ForwardCall", "BackwardCall", "check_network", "check_x", "check_h",
           "check_state_mask", "time_major"]


# --- the checks ----------------------------------------------------------------------------
def check_network(net, what="net"):
    """``(topology, dtype)`` of a ``cgru.Network``."""
    if not isinstance(net, Network):
        raise TypeError(f"{what}: expected a cgru.Network, got {type(net).__name__}")
    return net.topology, net.dtype


def check_x(x, topo, dtype, batch_major, gates=3, what="x"):
    """``(T, N)`` of the input ``x`` (checked: type, dtype, 3-D, features, sizes)."""
    layout = "[N, T, I]" if batch_major else "[T, N, I]"
    validate.plain_array(x, what, layout)
    if x.dtype != dtype:
        raise TypeError(f"{what}: expected dtype {dtype} (the dtype of the network), got "
                        f"{x.dtype}")
    if x.ndim != 3:
        raise ValueError(f"{what}: expected a 3-D array {layout}, got shape {list(x.shape)}")
    if x.shape[2] != topo.input_size:
        raise ValueError(f"{what}: expected {topo.input_size} features (input_size) in the last "
                         f"axis of {layout}, got shape {list(x.shape)}")
    N, T = (x.shape[0], x.shape[1]) if batch_major else (x.shape[1], x.shape[0])
    if T == 0 or N == 0:
        raise ValueError(f"{what}: expected T ≥ 1 and N ≥ 1, got shape {list(x.shape)} {layout}")
    validate.call_sizes(topo, gates, T, N, what)
    return T, N


def check_h(h, what, topo, dtype, N, width=None):
    """A state ``[L·D, N, width]`` (``width``: the state width S by default; the LSTM's cell
    state has H), C-contiguous, or None."""
    if h is None:
        return None
    LD = topo.num_layer_directions
    W = topo.state_size if width is None else width
    validate.array(h, what, dtype, like="(the dtype of the network)")
    label = "H" if W == topo.hidden_size else "P"
    if h.shape != (LD, N, W):
        raise ValueError(f"{what}: expected shape [L·D={LD}, N={N}, {label}={W}], got "
                         f"{list(h.shape)}")
    return np.ascontiguousarray(h)


def check_c(c, what, net, dtype, N):
    """The LSTM's cell state ``[L·D, N, H]``; refused for kinds without one."""
    if c is None:
        return None
    if not kinds.of(net.cell).has_cell_state:
        raise ValueError(f"{what}: only LSTM cells have a cell state; this network's cell is "
                         f"a {net.cell.kind} cell")
    return check_h(c, what, net.topology, dtype, N, net.topology.hidden_size)


def time_major(a, batch_major):
    """``a`` ``[T, N, ·]`` C-contiguous (a copy only when it is not already)."""
    return np.ascontiguousarray(a.transpose(1, 0, 2) if batch_major else a)


def check_state_mask(state_mask, topo, dtype, T, N, batch_major):
    """The state mask broadcast to time-major ``[T, N, D·H]`` (C-contiguous), or None."""
    if state_mask is None:
        return None
    shape = (N, T, topo.output_size) if batch_major else (T, N, topo.output_size)
    m = validate.broadcast_mask(state_mask, "state_mask", dtype, shape)
    return time_major(m, batch_major)


def check_dparams(dparams, net, accumulate):
    if dparams is None:
        if accumulate:
            raise ValueError("dparams: accumulate=True needs the network to add the gradients "
                             "to")
        return None
    if not isinstance(dparams, Network):
        raise TypeError(f"dparams: expected a cgru.Network or None, got "
                        f"{type(dparams).__name__}")
    if dparams.topology != net.topology:
        raise ValueError(f"dparams: expected topology {net.topology}, got {dparams.topology}")
    if dparams.cell.gates != net.cell.gates:
        raise ValueError(f"dparams: expected the weights of a {net.cell.kind} cell, got "
                         f"{dparams.cell.kind}'s")
    if dparams.dtype != net.dtype:
        raise TypeError(f"dparams: expected dtype {net.dtype} (the dtype of the network), got "
                        f"{dparams.dtype}")
    for i, lp in enumerate(dparams):
        for name, a in lp.arrays().items():
            if not a.flags.writeable:
                raise ValueError(f"dparams[{i}].{name}: is read-only; backward writes into it")
    return dparams


def warn_dropout_unused(p, stacklevel):
    """Inter-layer dropout on one layer does nothing: say so, as PyTorch does."""
    warnings.warn(f"cgru.forward: dropout={p} has no effect on a 1-layer network (dropout "
                  f"applies between layers, to every layer's output but the last)",
                  UserWarning, stacklevel=stacklevel)


# --- the call values -----------------------------------------------------------------------
class ForwardCall:
    """A checked forward: ``net`` (the caller's network), ``cell`` and ``kind`` (what it
    computes), ``frozen`` (the kept copies of its weights, ``weights.Frozen``), ``x``
    time-major ``[T, N, I]`` C-contiguous, ``T``, ``N``, ``h0``/``c0`` (C-contiguous, or
    None: zeros), ``lengths`` int64 ``[N]``, ``mask`` time-major or None, ``dropout`` (0
    unless training), ``seed``, ``seed2``, ``training``, ``batch_major`` (of the caller's
    ``x`` and ``y``), ``num_threads`` (resolved)."""

    __slots__ = ("net", "cell", "kind", "frozen", "x", "T", "N", "h0", "c0", "lengths", "mask",
                 "dropout", "seed", "seed2", "training", "batch_major", "num_threads")

    @classmethod
    def check(cls, net, x, h0=None, *, c0=None, cell=None, lengths=None, batch_major=False,
              state_mask=None, training=False, dropout=0.0, seed=0, num_threads=None,
              stacklevel=4):
        """Every argument checked (in the core's words), then ``of``."""
        if cell is None and lengths is None and state_mask is None and \
                batch_major is False and (training is False or training is True) and \
                type(dropout) is float and dropout == 0.0 and type(seed) is int and seed == 0:
            # the common call (x, h0 and an LSTM's c0 only, C-contiguous and as the network
            # wants them), checked at once; anything else — an error included — goes the
            # whole way
            call = cls._check_common_call(net, x, h0, c0, training, num_threads)
            if call is not None:
                return call
        topo, dtype, cell, batch_major, T, N, mask = _check_common(
            net, x, cell, state_mask, batch_major, stacklevel + 1)
        training = validate.flag(training, "training")
        h0 = check_h(h0, "h0", topo, dtype, N)
        c0 = check_c(c0, "c0", net, dtype, N)
        lengths = validate.lengths(lengths, T, N)
        p, s1, s2 = validate.dropout_and_seed(dropout, seed)
        if training and p > 0 and topo.num_layers == 1:
            warn_dropout_unused(p, stacklevel)
        return cls.of(net, cell, time_major(x, batch_major), h0, c0, lengths, mask,
                      p if training else 0.0, s1, s2, training, batch_major,
                      resolve_num_threads(num_threads))

    @classmethod
    def _check_common_call(cls, net, x, h0, c0, training, num_threads):
        """The call of ``check``'s common case, or None when anything about ``net``, ``x``,
        ``h0`` or ``c0`` is not plainly right (``check``'s whole way then decides, and words
        the error): the same checks, the same value."""
        T, N = _plain_x(net, x)
        if not T:
            return None
        topo = net.topology
        if not _plain(h0, net.dtype, (topo.num_layer_directions, N, topo.state_size)) or \
                not _plain_c(net, c0, N):
            return None
        return cls.of(net, net.cell, x, h0, c0, validate.full_lengths(T, N), None, 0.0, 0, 0,
                      training, False, resolve_num_threads(num_threads))

    @classmethod
    def of(cls, net, cell, x, h0, c0, lengths, mask, dropout, seed, seed2, training,
           batch_major, num_threads):
        """The call of arguments the caller has checked (a frontend, in its own words; ``x``
        time-major C-contiguous, ``lengths`` int64 ``[N]`` or None for all ``T``): takes the
        kept copies of the weights, nothing else."""
        validate.cell_for_dtype(cell, net.dtype)
        self = cls()
        self.net, self.cell, self.kind = net, cell, kinds.of(cell)
        self.x, self.T, self.N = x, x.shape[0], x.shape[1]
        if lengths is None:
            lengths = validate.full_lengths(self.T, self.N)
        self.h0, self.c0, self.lengths, self.mask = h0, c0, lengths, mask
        self.dropout, self.seed, self.seed2 = dropout, seed, seed2
        self.training, self.batch_major, self.num_threads = training, batch_major, num_threads
        self.frozen = weights.freeze(net, num_threads, fingerprinted=training)
        return self


def _plain_x(net, x):
    """``(T, N)`` of a common call's ``x`` — a plain, C-contiguous ``[T, N, I]`` array of the
    network's dtype and input size, ``T, N ≥ 1``, on a plain ``Network`` (its sizes within the
    kernels' ints: refused here as the whole way refuses them) —, else ``(0, 0)``."""
    if type(net) is not Network or type(x) is not np.ndarray:
        return 0, 0
    if x.dtype != net.dtype or x.ndim != 3 or x.shape[2] != net.topology.input_size or \
            not x.flags.c_contiguous:
        return 0, 0
    T, N = x.shape[0], x.shape[1]
    if not (T and N):
        return 0, 0
    validate.call_sizes(net.topology, net.cell.gates, T, N, "x")
    return T, N


def _plain(a, dtype, shape):
    """True when ``a`` is None or a plain, C-contiguous array of ``dtype`` and ``shape``."""
    return a is None or (type(a) is np.ndarray and a.dtype == dtype and a.shape == shape and
                         a.flags.c_contiguous)


def _plain_c(net, c, N):
    """True when ``c`` is None, or a plain cell state ``[L·D, N, H]`` (``_plain``) of a
    network whose cell has one."""
    topo = net.topology
    return c is None or (kinds.of(net.cell).has_cell_state and
                         _plain(c, net.dtype, (topo.num_layer_directions, N, topo.hidden_size)))


def _check_common(net, x, cell, state_mask, batch_major, stacklevel):
    """What a forward and a backward check alike: ``(topology, dtype, cell, batch_major, T,
    N, mask)``."""
    topo, dtype = check_network(net)
    cell = net.resolve_cell(cell, stacklevel)
    batch_major = validate.flag(batch_major, "batch_major")
    T, N = check_x(x, topo, dtype, batch_major, cell.gates)
    mask = check_state_mask(state_mask, topo, dtype, T, N, batch_major)
    return topo, dtype, cell, batch_major, T, N, mask


class BackwardCall:
    """A checked backward: ``net``, ``cell``, ``kind``, ``frozen``, ``x`` (time-major),
    ``T``, ``N``, ``mask``, ``batch_major``, ``num_threads`` as for the forward; ``opened``
    (the reserve, checked: ``reserve.Opened``), ``dy`` (time-major or None), ``dhy``, ``dcy``,
    ``dparams`` (the caller's, or None), ``accumulate``."""

    __slots__ = ("net", "cell", "kind", "frozen", "x", "T", "N", "mask", "batch_major",
                 "num_threads", "opened", "dy", "dhy", "dcy", "dparams", "accumulate", "need_dx",
                 "need_dparams", "dparams_in_place")

    @classmethod
    def check(cls, net, x, reserve, dy=None, dhy=None, *, dcy=None, cell=None, state_mask=None,
              batch_major=False, dparams=None, accumulate=False, num_threads=None,
              stacklevel=4, frozen=None, need_dx=True, need_dparams=True):
        """Every argument checked (in the core's words), then ``of`` (``frozen``: see there)."""
        if need_dx is not True:
            need_dx = validate.flag(need_dx, "need_dx")
        if need_dparams is not True:
            need_dparams = validate.flag(need_dparams, "need_dparams")
            if not need_dparams and dparams is not None:
                raise ValueError("dparams: given, but need_dparams=False asks for no weight "
                                 "gradients")
        if cell is None and state_mask is None and batch_major is False and \
                dparams is None and accumulate is False:
            # the common call (x, reserve, dy, dhy and an LSTM's dcy, each C-contiguous and as
            # the network wants them), checked at once; anything else — an error included —
            # goes the whole way
            call = cls._check_common_call(net, x, reserve, dy, dhy, dcy, num_threads, frozen,
                                          need_dx, need_dparams)
            if call is not None:
                return call
        topo, dtype, cell, batch_major, T, N, mask = _check_common(
            net, x, cell, state_mask, batch_major, stacklevel + 1)
        accumulate = validate.flag(accumulate, "accumulate")
        yshape = (N, T, topo.output_size) if batch_major else (T, N, topo.output_size)
        if dy is not None:
            validate.array(dy, "dy", dtype, yshape, like="(the dtype of the network)")
            dy = time_major(dy, batch_major)
        dhy = check_h(dhy, "dhy", topo, dtype, N)
        dcy = check_c(dcy, "dcy", net, dtype, N)
        dparams = check_dparams(dparams, net, accumulate)
        return cls.of(net, cell, time_major(x, batch_major), reserve, dy, dhy, dcy, mask,
                      batch_major, dparams, accumulate, resolve_num_threads(num_threads),
                      frozen=frozen, need_dx=need_dx, need_dparams=need_dparams)

    @classmethod
    def _check_common_call(cls, net, x, reserve, dy, dhy, dcy, num_threads, frozen, need_dx,
                           need_dparams):
        """The call of ``check``'s common case, or None when anything about ``net``, ``x``,
        ``dy``, ``dhy`` or ``dcy`` is not plainly right (``check``'s whole way then decides,
        and words the error): the same checks, the same value (the reserve is opened by ``of``
        alike)."""
        T, N = _plain_x(net, x)
        if not T:
            return None
        topo = net.topology
        if not _plain(dy, net.dtype, (T, N, topo.output_size)) or \
                not _plain(dhy, net.dtype, (topo.num_layer_directions, N, topo.state_size)) or \
                not _plain_c(net, dcy, N):
            return None
        return cls.of(net, net.cell, x, reserve, dy, dhy, dcy, None, False, None, False,
                      resolve_num_threads(num_threads), frozen=frozen, need_dx=need_dx,
                      need_dparams=need_dparams)

    @classmethod
    def of(cls, net, cell, x, reserve, dy, dhy, dcy, mask, batch_major, dparams, accumulate,
           num_threads, *, h0=None, c0=None, lengths=None, what="reserve",
           inference_hint=None, frozen=None, need_dx=True, need_dparams=True):
        """The call of arguments the caller has checked (``x``, ``dy`` time-major, ``dhy``,
        ``dcy`` C-contiguous): takes the kept copies of the weights and opens the reserve —
        checking that its forward had this call's ``x``, weights and mask (and ``h0``/``c0``,
        ``lengths``, when given: for frontends whose backward receives them again).  ``what``
        names the reserve in the caller's words, ``inference_hint`` says what to do with an
        inference forward's.

        ``frozen``: the ``weights.Frozen`` of the forward that wrote the reserve, for a caller
        that ran that forward and keeps its result for its backward (an autograd graph): the
        backward then computes with the very copies that forward read, whatever ``net``'s
        arrays hold by now, with nothing to compare (``net`` is then ``frozen.net``).
        ``need_dx``, ``need_dparams``: False leaves the input's or the weights' gradients out
        (``engine.backward``'s flags, checked by ``check``)."""
        if frozen is not None and frozen.net is not net:
            raise ValueError("frozen: the Frozen of another network than net")
        self = cls()
        self.net, self.cell, self.kind = net, cell, kinds.of(cell)
        self.x, self.T, self.N = x, x.shape[0], x.shape[1]
        self.dy, self.dhy, self.dcy, self.mask = dy, dhy, dcy, mask
        self.batch_major, self.dparams, self.accumulate = batch_major, dparams, accumulate
        self.num_threads = num_threads
        self.need_dx, self.need_dparams = need_dx, need_dparams
        # True (a frontend's choice, after ``check``): the weight gradients are computed straight
        # into ``dparams`` — no buffer of the engine's and no copy —, which a failing call then
        # leaves partly written (the C ABI's reserve space, refused until the call succeeds)
        self.dparams_in_place = False
        self.frozen = weights.freeze(net, num_threads, fingerprinted=True) if frozen is None \
            else frozen
        self.opened = _open(self, reserve, h0, c0, lengths, what, inference_hint)
        return self


def open_reserve(reserve, net, cell, T, N, batch_major, what="reserve", inference_hint=None):
    """The reserve's views (``reserve.Opened``) after checking that it is one, of this model
    and layout (not yet that its forward had this call's arrays: ``BackwardCall.check``)."""
    topo, dtype = net.topology, net.dtype
    layout = reserve_mod.layout_of(topo, cell, T, N, dtype)
    return reserve_mod.read(reserve, layout, batch_major=batch_major, what=what,
                            inference_hint=inference_hint)


def _open(call, reserve, h0, c0, lengths, what, inference_hint):
    """The reserve of this call's training forward: its model and layout, and the MACs of the
    call's ``x``, weights, state mask (and ``h0``/``c0``, ``lengths`` when given)."""
    net, topo, dtype, N = call.net, call.net.topology, call.net.dtype, call.N
    opened = open_reserve(reserve, net, call.cell, call.T, N, call.batch_major, what,
                          inference_hint)
    opened.check("x", reserve_mod.data_mac(b"x", call.x), "x")
    opened.check("params", reserve_mod.weights_mac(call.frozen), "params (weights)")
    opened.check("state_mask", reserve_mod.data_mac(b"state_mask", call.mask), "state_mask")
    if lengths is not None and not np.array_equal(opened.lengths, lengths):
        raise ValueError(f"{what}: written by a forward with other sequence lengths than this "
                         f"backward's (the reserve belongs to one forward call)")
    if h0 is not None:
        h0 = check_h(h0, "h0", topo, dtype, N)
        c0 = check_h(c0, "c0", topo, dtype, N, topo.hidden_size)
        if call.kind.has_cell_state and c0 is None:
            c0 = np.zeros((topo.num_layer_directions, N, topo.hidden_size), dtype)
        opened.check("h0", reserve_mod.data_mac(b"h0", h0, c0), "initial state (h0, c0)")
    return opened
