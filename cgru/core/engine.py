"""Forward and backward of a recurrent stack: the orchestration over layers and directions.

Public API (re-exported by ``cgru``)::

    forward(net, x, h0=None, *, c0=None, lengths=None, batch_major=False, state_mask=None,
            training=False, dropout=0.0, seed=0, num_threads=None)
        -> Forward(y, hy, reserve)          (.cy: the LSTM's final cell states)
    backward(net, x, reserve, dy=None, dhy=None, *, dcy=None, state_mask=None,
             batch_major=False, dparams=None, accumulate=False, num_threads=None)
        -> Gradients(dx, dh0, dparams)      (.dc0: the LSTM's initial cell-state gradient)

``net`` is a ``cgru.Network`` (its cell — GRU, LSTM or vanilla RNN —, topology and weights).
Shapes (S: the state width, the projection size P of an LSTM with one, else H): ``x``
``[T, N, I]`` (``[N, T, I]`` with ``batch_major``); ``y`` ``[T, N, D·S]`` (or ``[N, T, D·S]``);
``h0``/``hy`` ``[L·D, N, S]`` and the LSTM's ``c0``/``cy`` ``[L·D, N, H]``, at index
``l·D + d`` in both layouts.

A call follows the data: **check** every argument once (``calls``: the checked call value,
which also takes the kept copies of the weights), **plan** the work split and the buffers
(``plan``), then **run** (``run_forward`` / ``run_backward``, which trust the call) layer by
layer and, within a layer, in blocks of time (``plan.time_block``): per block the input
projection of its steps as one GEMM per direction, the time loops of all directions as
(direction, batch chunk) work items (the kernels of the cell's kind, bound through its kind
object: ``kinds``), and in the backward, after a block's loops, its weight gradients (added to
the previous blocks') and its rows of ``dX`` as GEMMs and the bias gradients as column
sums.  A
training forward saves what the backward needs in the reserve (``reserve``).  Nothing here
knows a cell kind by name.
"""
import functools
import weakref
from collections import defaultdict, namedtuple

import numpy as np

from cgru.core import dropout as dropout_mod, kinds, plan, reserve as reserve_mod, validate, \
    weights
from cgru.core.backend import BACKEND
from cgru.core.calls import BackwardCall, ForwardCall
from cgru.core.network import Network
from cgru._kernels.loops import array_key
from cgru._kernels.threads import resolve_num_threads

__all__ = ["Forward", "Gradients", "forward", "backward", "run_forward", "run_backward",
           "forward_workspace", "backward_workspace", "workspace_nbytes", "reserve_nbytes",
           "dropout_masks"]

reserve_nbytes = reserve_mod.reserve_nbytes
dropout_masks = dropout_mod.dropout_masks


class Forward(namedtuple("Forward", "y hy reserve")):
    """Result of ``forward``: output ``y``, final states ``hy`` ``[L·D, N, S]``, and the
    ``reserve`` (``None`` unless ``training``); ``cy`` (an attribute, not unpacked) holds an
    LSTM's final cell states ``[L·D, N, H]`` (``None`` for the other kinds)."""

    def __new__(cls, y, hy, reserve, cy=None):
        self = tuple.__new__(cls, (y, hy, reserve))
        self.cy = cy
        return self

    def __getnewargs__(self):
        return (*self, self.cy)


class Gradients(namedtuple("Gradients", "dx dh0 dparams")):
    """Result of ``backward``: ``dx`` (shaped like ``x``; None with ``need_dx=False``),
    ``dh0`` ``[L·D, N, S]`` and ``dparams`` (a ``Network`` of gradients; None with
    ``need_dparams=False``); ``dc0`` (an attribute, not unpacked) holds an LSTM's initial
    cell-state gradient ``[L·D, N, H]`` (``None`` for the other kinds)."""

    def __new__(cls, dx, dh0, dparams, dc0=None):
        self = super().__new__(cls, dx, dh0, dparams)
        self.dc0 = dc0
        return self

    def __getnewargs__(self):
        return (*self, self.dc0)


# --- forward -------------------------------------------------------------------------------
def input_projection(topo, G, layer, d, frozen, X, out, nt):
    """(gx, ldgx) of direction d: ``gx = X·Wᵀ`` [rows, G·H] for the rows of ``X`` given (all
    ``T·N``, or a block of time) — or x itself in skip / projected mode (skip: every gate
    block is x; projected: x holds each direction's G blocks).  The
    product runs on the kernels' packed GEMM, whose rows do not depend on which rows share a
    call: ``cgru.Stream``'s steps compute exactly these bits."""
    H = topo.hidden_size
    if layer == 0 and topo.input_mode == "projected":
        return X[:, d * G * H:], topo.input_size
    if layer == 0 and topo.input_mode == "skip":
        for k in range(G):
            out[:, k * H:(k + 1) * H] = X
        return out, G * H
    # gx[T·N, G·H] = X[T·N, in] · W[G·H, in]ᵀ   (Wᵀ packed once per kept copy of W)
    BACKEND.gemm_packed(X, frozen.packed(layer * topo.num_directions + d, "W", True), out,
                        nt=nt)
    return out, G * H


def forward(net, x, h0=None, *, c0=None, cell=None, lengths=None, batch_major=False,
            state_mask=None, training=False, dropout=0.0, seed=0, num_threads=None):
    """Run a recurrent stack over a batch of sequences.

    Args (S: the state width — the projection size P of an LSTM with one, else H):
        net: the ``cgru.Network`` (its cell, and its topology: L, D, H, input size, input
            mode and projection).
        x: ``[T, N, I]``, or ``[N, T, I]`` with ``batch_major``; dtype of the network.
        h0: ``[L·D, N, S]`` initial states (``None``: zeros).
        c0: ``[L·D, N, H]`` initial cell states of an LSTM (``None``: zeros).
        cell: deprecated — the network carries its cell; a different one is an error.
        lengths: ``[N]`` integer sequence lengths in ``[0, T]``, any order (``None``: all T).
            The forward direction runs ``t = 0…len−1``, the reversed one ``len−1…0``;
            outputs at ``t ≥ len`` are 0; ``hy`` (and ``cy``) is the state after the last
            processed step (``h0``, ``c0`` for ``len = 0``).
        state_mask: broadcastable to the output shape; ``h ⊙ m`` enters every recurrent
            product (MPSGraph's mask), the output-time-``t`` slice at the step producing ``t``.
        training: keep the reserve for ``backward`` (and apply ``dropout``).
        dropout: inter-layer inverted dropout probability (training only), ``[0, 1)``.
        seed: int or ``(seed, seed2)`` for the dropout masks (see ``dropout_masks``).
        num_threads: threads of cgru's pool (``None``: all usable cores, at most
            ``OMP_NUM_THREADS``).  Results are bitwise identical for every value.

    Returns:
        ``Forward(y, hy, reserve)``, ``.cy`` for an LSTM; ``y`` ``[T, N, D·S]``
        (``[N, T, D·S]`` with ``batch_major``), ``hy`` ``[L·D, N, S]``, ``reserve`` a uint8
        array or ``None``.
    """
    if training is False and cell is None and lengths is None and state_mask is None and \
            batch_major is False and type(dropout) is float and dropout == 0.0 and \
            type(seed) is int and seed == 0:
        done = repeat(net, x, h0, c0, num_threads)
        if done is not None:
            return done
    return run_forward(ForwardCall.check(
        net, x, h0, c0=c0, cell=cell, lengths=lengths, batch_major=batch_major,
        state_mask=state_mask, training=training, dropout=dropout, seed=seed,
        num_threads=num_threads))


# --- repeated inference calls ----------------------------------------------------------------
# An inference of one shape runs, from its second call on, as one call into its plan's runner.
# What the general path still does around that call — the checks, the proof of the weights,
# the plan's lookup — is a function of the network's layers, cell and topology, the weights
# (their memory: ``array_key``; and their bytes), the call's shapes and the thread count alone,
# so ``repeat`` compares just those against the ones of the last such call (``_Repeat``) and
# goes straight to the runner: the runner the general path would take, so the same bits.
#
# The weights are proven as ``weights.freeze`` proves them: a sealed network's by identity (the
# same immutable layers over arrays whose memory keys are unchanged; the entry holds its runner,
# as the network's ``Frozen`` lives as long as it does), any other's by comparing their bytes
# with the kept copies of the ``Frozen`` that made the runner — held weakly, with the runner
# found through its plans, so that an entry never keeps copies the weights' cache let go.
# Anything else — another shape, a view, a dtype, rebound layers, changed bytes, a busy runner,
# the pool off — takes the general path, which checks and words every error.
_REPEATS = weakref.WeakKeyDictionary()   # a network -> {(x shape, h0?, c0?): _Repeat}
_REPEAT_SHAPES = 8                        # the shapes kept per network (the most recent)


class _Repeat:
    """What one general-path inference proved and planned: the network's layers, cell and
    topology (objects), its weight arrays and their ``array_key``s, the dtype, the shapes of
    ``h0`` / ``c0`` (None: not given), the thread count, the outputs' shapes; a sealed
    network's runner, or a weak reference to the ``Frozen`` of another's, its plan's key and
    the weights' cache keys."""

    __slots__ = ("layers", "cell", "topology", "arrays", "keys", "dtype", "h0", "c0", "nt",
                 "outputs", "runner", "frozen", "plan_key", "cache_keys")

    def find_runner(self):
        """The runner of a call this entry proves (its weights' proof made), or None."""
        if self.runner is not None:
            return self.runner
        frozen = self.frozen()
        if frozen is None:
            return None
        fp = frozen._plans.get(self.plan_key)
        runner = None if fp is None else fp._runner
        if runner is None or not weights.still_kept(self.arrays, self.cache_keys, frozen,
                                                    self.nt):
            return None
        return runner


def repeat(net, x, h0=None, c0=None, num_threads=None, out=None):
    """``Forward`` of a repeated common inference of ``net`` (no ``cell``, lengths, mask,
    batch-major layout or training: see ``_Repeat``), or None for the general path.  For
    frontends that make such calls too (``cgru.torch``'s inference; the C ABI's, which passes
    its caller's buffers as ``out``: see ``run_recorded``)."""
    if type(net) is not Network or type(x) is not np.ndarray:
        return None                     # (anything else: the general path words it)
    shapes = _REPEATS.get(net)
    if shapes is None or not (plan._reuse and weights._reuse):
        return None
    r = shapes.get((x.shape, h0 is None, c0 is None))
    if r is None or net.layers is not r.layers or net.cell is not r.cell or \
            net.topology is not r.topology or x.dtype != r.dtype or not x.flags.c_contiguous:
        return None
    if not (as_recorded(h0, r.h0, r.dtype) and as_recorded(c0, r.c0, r.dtype)) or \
            tuple(map(array_key, r.arrays)) != r.keys or resolve_num_threads(num_threads) != r.nt:
        return None
    runner = r.find_runner()
    done = None if runner is None else run_recorded(
        runner, r.outputs, x.reshape(x.shape[0] * x.shape[1], x.shape[2]), h0, c0, out)
    return None if done is None else Forward(done[0], done[1], None, done[2])


def _fits(a, shape, dtype):
    """``a`` is None, or a writable C-contiguous array of ``shape`` and ``dtype``."""
    return a is None or (type(a) is np.ndarray and shape is not None and a.shape == shape and
                         a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable)


def as_recorded(a, shape, dtype):
    """``a`` is what a recorded state of ``shape`` (None: not given) was: None, or a plain
    C-contiguous array of ``shape`` and ``dtype`` (``repeat``'s, ``Stream.step``'s)."""
    if shape is None:
        return a is None
    return type(a) is np.ndarray and a.shape == shape and a.dtype == dtype and \
        a.flags.c_contiguous


def run_recorded(runner, outputs, X, h0, c0, out=None):
    """``(y, hy, cy)`` of ``runner`` on ``X`` ``[T·N, I]`` from ``h0``/``c0``, into new arrays
    of the plan's ``outputs`` (``ForwardPlan.outputs``), or None when another call holds it.
    ``out``: ``(y, hy, cy)`` to write instead, each a writable C-contiguous array of its shape
    and dtype or None (a new one) — or None when one is not, as the general path then words
    it."""
    hy_shape, cy_shape, y_shape, dtype = outputs
    y = hy = cy = None
    if out is not None:
        y, hy, cy = out
        if not (_fits(y, y_shape, dtype) and _fits(hy, hy_shape, dtype) and
                _fits(cy, cy_shape, dtype)):
            return None
    if hy is None:
        hy = BACKEND.empty(hy_shape, dtype)
    if cy is None and cy_shape is not None:
        cy = BACKEND.empty(cy_shape, dtype)
    if y is None:
        y = BACKEND.empty(y_shape, dtype)
    if not runner.run(X, h0, c0, y, hy, cy):
        return None
    return y, hy, cy


def _remember(call, fp, plan_key, runner):
    """Keep what ``repeat`` needs for the next call like ``call`` — a common inference that
    ran on ``runner`` (its plan ``fp``, kept by ``call.frozen`` under ``plan_key``) — unless
    it is kept already."""
    net = call.net
    if type(net) is not Network or call.cell is not net.cell or call.batch_major or \
            type(call.x) is not np.ndarray or not weights._reuse:
        return
    memo = weights.sealed_memo(net)
    sealed = memo is not None and memo[3] is call.frozen
    key = (call.x.shape, call.h0 is None, call.c0 is None)
    shapes = _REPEATS.get(net)
    if shapes is None:
        shapes = _REPEATS.setdefault(net, {})
    found = shapes.get(key)
    if found is not None and found.layers is net.layers and found.nt == call.num_threads and \
            (found.runner is runner if sealed else
             found.runner is None and found.frozen() is call.frozen):
        return
    r = _Repeat()
    r.layers, r.cell, r.topology, r.dtype = net.layers, net.cell, net.topology, net.dtype
    if sealed:
        r.arrays, r.keys = memo[1], memo[2]
        r.runner, r.frozen, r.plan_key, r.cache_keys = runner, None, None, None
    else:
        r.arrays = tuple(a for lp in net.layers for a in lp.arrays().values())
        r.keys = tuple(map(array_key, r.arrays))
        r.runner, r.frozen, r.plan_key = None, weakref.ref(call.frozen), plan_key
        r.cache_keys = weights.cache_keys(r.arrays)
    r.h0 = None if call.h0 is None else call.h0.shape
    r.c0 = None if call.c0 is None else call.c0.shape
    r.nt, r.outputs = call.num_threads, fp.outputs
    shapes.pop(key, None)
    shapes[key] = r
    for stale in list(shapes)[:-_REPEAT_SHAPES]:      # (each step atomic: threads may race)
        shapes.pop(stale, None)


def forward_workspace(kind, cell, topo, dtype, T, N, training, zero_h0=True, zero_c0=True):
    """The workspace of a forward (``plan.Workspace``, not yet allocated): the input
    projections, the zero initial states a call without ``h0`` / ``c0`` uses, the inner
    layers' outputs of an inference and the time loops' scratch.  One shared layout per
    distinct arguments (``plan.shared_layout``)."""
    return plan.shared_layout(_forward_layout, kind, cell, topo, np.dtype(dtype), int(T), int(N),
                              plan.time_block(T, N, plan.wgrad_size(topo, cell.gates)),
                              bool(training), bool(zero_h0), bool(zero_c0))


def _forward_layout(kind, cell, topo, dtype, T, N, Tb, training, zero_h0, zero_c0):
    H, D, L, S = topo.hidden_size, topo.num_directions, topo.num_layers, topo.state_size
    G, DS = cell.gates, topo.output_size
    ws = BACKEND.workspace(dtype)
    for d in range(D):
        ws.add(f"gx{d}", (Tb * N, G * H))            # input projections, a block of time
    if zero_h0:
        ws.add("h0", (L * D, N, S))
    if kind.has_cell_state and zero_c0:
        ws.add("c0", (L * D, N, H))
    if not training:
        # the inner layers' outputs: layer l writes out{l % 2} while it reads the one of layer
        # l − 1, so three layers and more take turns with two, two layers use one
        for i in sorted({layer % 2 for layer in range(min(L - 1, 2))}):
            ws.add(f"out{i}", (T, N, DS))
    ws.add("scratch", (_scratch_size(kind, True, N, H, S, D),))
    return ws


def _scratch_size(kind, forward, N, H, S, D):
    """Elements of the time loops' scratch for a batch of ``N`` in ``n_chunks`` chunks or in
    one (``plan.loop_chunks``: the layout serves every thread count)."""
    kernels = BACKEND.kernels(kind)
    return max(kernels.scratch_size(forward, N, H, S, chunks, D)
               for chunks in {plan.n_chunks(N, H), 1})


class ForwardPlan:
    """A forward's plan for one shape: the loops' batch chunks and threads, the workspace
    layout, the steps per block of time, the shapes of the outputs — and, for an inference of
    one layer-stack whose workspace is step-sized, a ``Runner`` from the shape's second call
    on.  An inference's plan is made once and kept by the call's ``Frozen`` (the ``PLANS``
    most recent shapes); a training forward's, which never has a runner, once per model and
    shapes (``plan.shape_plan``).

    **The runner** (the kernels' ``Runner``) holds everything such a call would otherwise
    build again in Python: every layer's loop arguments over the packs and bias sums of this
    ``Frozen`` (a function of its kept copies alone, which nothing writes), a workspace of its
    own, the input projections' splits.  A call then costs its checks, its outputs and one
    call into the kernels; the result is the general path's, bit for bit (the same kernels,
    arguments and splits; tested).  It serves one call at a time: a call that finds it busy (a
    second thread, a fork taken while it ran) runs the general way.  Calls with a workspace of
    their own, a state mask, sequence lengths, training, or a skip / projected input take the
    general path; so does every call while the pool is off (``plan._reuse``: the tests'
    poisoning)."""

    __slots__ = ("kind", "cell", "T", "N", "nt", "chunks", "threads", "space", "Tb",
                 "runnable", "outputs", "_uses", "_runner")

    def __init__(self, kind, cell, topo, dtype, T, N, nt, training, zero_h0, zero_c0):
        H, D, G = topo.hidden_size, topo.num_directions, cell.gates
        self.kind, self.cell, self.T, self.N, self.nt = kind, cell, T, N, nt
        self.threads = plan.loop_threads(nt, T, N, H, D, G)
        self.chunks = plan.loop_chunks(N, H, self.threads, D)
        self.space = forward_workspace(kind, cell, topo, dtype, T, N, training, zero_h0,
                                       zero_c0)
        self.Tb = plan.time_block(T, N, plan.wgrad_size(topo, G))
        self.runnable = not training and topo.input_mode == "linear" and \
            self.space.block_bytes <= plan.SPARE_BLOCK_BYTES
        # (shape of hy, of cy or None, of y (time-major), dtype): the call's outputs
        LD = topo.num_layer_directions
        self.outputs = ((LD, N, topo.state_size),
                        (LD, N, H) if kind.has_cell_state else None,
                        (T, N, topo.output_size), np.dtype(dtype))
        self._uses = 0
        self._runner = None

    def runner(self, frozen):
        """The runner of this plan's calls (``frozen``: the weights of the ``Frozen`` that keeps
        the plan), made at the second call; None before, and while the pool is off."""
        if not plan._reuse:
            return None
        if self._runner is None:
            self._uses += 1
            if self._uses < 2:
                return None
            self._runner = make_runner(self, frozen)
        return self._runner


def make_runner(fp, frozen):
    """The kernels' ``Runner`` of the inference plan ``fp`` over the weights ``frozen``."""
    kind, cell, T, N, nt, Tb = fp.kind, fp.cell, fp.T, fp.N, fp.nt, fp.Tb
    net = frozen.net
    topo, dtype = net.topology, net.dtype
    H, D, L, S, G = (topo.hidden_size, topo.num_directions, topo.num_layers, topo.state_size,
                     cell.gates)
    kernels = BACKEND.kernels(kind)
    buf = fp.space.allocate()           # the runner's own
    layers = []
    for layer in range(L):
        width = topo.input_size if layer == 0 else topo.output_size
        dirs, packs = [], []
        for d in range(D):
            i = layer * D + d
            common = dict(reverse=topo.reversed_direction(d), gx=buf[f"gx{d}"], ldgx=G * H,
                          h0=None, hy=None, states=None, pre=None, row0=0,
                          **frozen.direction_args(kind, cell, i, True))
            dirs.append(kind.forward_direction(kernels, common, cell, {}, None, None))
            packs.append(frozen.packed(i, "W", True))
        splits = []
        for s0 in range(0, T, Tb):
            splits.append(plan.packed_splits((min(T, s0 + Tb) - s0) * N, G * H, width, nt))
        out = None if layer == L - 1 else buf[f"out{layer % 2}"]
        layers.append((dirs, packs, width, out, splits))
    return kernels.Runner(dtype, T, N, H, S, G, Tb, fp.chunks, fp.threads, nt, cell,
                          validate.full_lengths(T, N), layers, buf["scratch"], buf)


def initial_states(buf, h0, c0):
    """``(h0, c0)``: the ones given, else the zeros of the workspace ``buf`` (room that
    ``forward_workspace`` made for them; ``c0`` stays ``None`` for a kind without one)."""
    if h0 is None:
        h0 = buf["h0"]
        h0[...] = 0
    if c0 is None and "c0" in buf:
        c0 = buf["c0"]
        c0[...] = 0
    return h0, c0


def run_forward(call, workspace=None, out=None):
    """The forward of a checked call (``calls.ForwardCall``); ``workspace``: the caller's
    block for the temporaries (a uint8 array of ``forward_workspace(…).block_bytes``), else
    one from the pool; ``out``: the caller's arrays the results are written into instead of
    new ones (``{"y", "hy", "cy", "reserve"}``, each optional, each of the result's shape and
    dtype — the reserve a uint8 array of ``reserve_nbytes`` —, apart from every input: the C
    ABI's buffers)."""
    given = out or {}
    cell, frozen, T, N, nt, training = (call.cell, call.frozen, call.T, call.N,
                                        call.num_threads, call.training)
    h0, c0 = call.h0, call.c0

    # --- plan: an inference's kept by the call's ``Frozen`` for the calls of the same shapes
    # (its runner computes with those weights); a training forward's, which has no runner,
    # shared by every network of the model and shapes, as a backward's is (a training loop
    # makes a new ``Frozen`` every step)
    shapes = (T, N, nt, training, h0 is None, c0 is None)
    args = (call.kind, cell, call.net.topology, frozen.net.dtype) + shapes
    plan_key = None if training else ("forward plan", frozen.cell_key(cell)) + shapes
    fp = plan.shape_plan(ForwardPlan, *args) if training else \
        frozen.plan(plan_key, lambda: ForwardPlan(*args))
    hy_shape, cy_shape, y_shape, dtype = fp.outputs
    hy = _output(given, "hy", hy_shape, dtype)
    cy = None if cy_shape is None else _output(given, "cy", cy_shape, dtype)
    # the last layer writes y time-major: into the caller's y unless it is batch-major
    y = _output(given if not call.batch_major else {}, "y", y_shape, dtype)
    # a repeated inference of a step-sized shape: its plan's runner, unless another call
    # holds it (``ForwardPlan``) — before the general path looks anything else up
    runner = fp.runner(frozen) if workspace is None and fp.runnable and call.mask is None \
        and call.lengths is validate.full_lengths(T, N) else None
    if runner is not None and runner.run(call.x.reshape(T * N, call.x.shape[2]), h0, c0, y,
                                         hy, cy):
        _remember(call, fp, plan_key, runner)
        if call.batch_major:
            y = _batch_major(y, given, "y")
        return Forward(y, hy, None, cy)

    kind, topo = call.kind, call.net.topology
    H, D, L, S = topo.hidden_size, topo.num_directions, topo.num_layers, topo.state_size
    G, DS = cell.gates, topo.output_size
    lstm = kind.has_cell_state
    kernels = BACKEND.kernels(kind)
    chunks, threads, space, Tb = fp.chunks, fp.threads, fp.space, fp.Tb
    X = call.x.reshape(T * N, topo.input_size)
    # the workspace: the caller's; a training step's one block (``_training_workspace``); an
    # inference's borrowed from the last call of this layout (``Workspace.borrow``)
    lent = None
    if workspace is not None:
        buf = space.allocate(workspace)
    elif training:
        buf, lent = _training_workspace(space, _training_block_bytes(
            kind, cell, topo, dtype, T, N,
            call.mask is not None or validate.padded(call.lengths, T)))
    else:
        buf = space.borrow()
    h0, c0 = initial_states(buf, h0, c0)
    rv, lds, xin = None, None, None
    if training:
        layout = reserve_mod.layout_of(topo, cell, T, N, dtype)
        rv, (_, _, lds, xin) = reserve_mod.create(
            layout, lengths=call.lengths, dropout=call.dropout, seed=call.seed,
            seed2=call.seed2, batch_major=call.batch_major, x=reserve_mod.data_mac(b"x", call.x),
            weights=reserve_mod.weights_mac(call.frozen), h0=reserve_mod.data_mac(b"h0", h0, c0),
            state_mask=reserve_mod.data_mac(b"state_mask", call.mask),
            block=given.get("reserve"))
    masks = dropout_mod.dropout_masks(topo, T, N, dropout=call.dropout,
                                      seed=(call.seed, call.seed2), dtype=dtype) \
        if call.dropout > 0 else None
    # a long training forward's packs go with it (``weights.OneCall``), so that the backward
    # after it does not hold them beside its own
    frozen = call.frozen.for_one_call() if training and T * N >= plan.ONE_CALL_PACK_ROWS \
        else call.frozen

    # --- run
    for layer in range(L):
        last = layer == L - 1
        if last:
            out = y
        elif training:
            out = xin[layer + 1]
        else:
            out = buf[f"out{layer % 2}"]
        # in blocks of Tb steps of each direction, in its own order: each block's input
        # projection (rows of gx that stay in cache), then its steps, from the carries h (and
        # c) that the previous block left in hy (cy); the bits are those of one block (the
        # projection's rows do not depend on which rows share a call)
        for s0 in range(0, T, Tb):
            s1 = min(T, s0 + Tb)
            rows = (s1 - s0) * N
            dirs = []
            for d in range(D):
                i = layer * D + d
                saved = lds[i] if training else {}
                rev = topo.reversed_direction(d)
                r0 = (T - s1 if rev else s0) * N
                gx, ldgx = input_projection(topo, G, layer, d, frozen, X[r0:r0 + rows],
                                            buf[f"gx{d}"][:rows], nt)
                common = dict(reverse=rev, gx=gx, ldgx=ldgx, h0=hy[i] if s0 else h0[i],
                              hy=hy[i], states=saved.get("states"), pre=saved.get("pre"),
                              row0=r0, **frozen.direction_args(kind, cell, i, True))
                dirs.append(kind.forward_direction(
                    kernels, common, cell, saved,
                    (cy[i] if s0 else c0[i]) if lstm else None, cy[i] if lstm else None))
            kernels.forward_layer(dtype, T, N, H, S, chunks, threads, cell, call.lengths,
                                  call.mask, out, dirs, training, buf["scratch"],
                                  steps=(s0, s1))
        if not last:
            if masks is not None:
                np.multiply(out, masks[layer], out=out)
            X = out.reshape(T * N, DS)
    # (a call that raised leaves its workspace to the pool)
    if lent is not None:
        lent[0].give_back(lent[1])
    elif workspace is None and not training:
        space.give_back(buf)
    if call.batch_major:
        y = _batch_major(y, given, "y")
    return Forward(y, hy, rv, cy)


def _output(out, name, shape, dtype):
    """The caller's ``out[name]`` (checked to be of ``shape`` and ``dtype``), else a new array."""
    a = out.get(name)
    if a is None:
        return BACKEND.empty(shape, dtype)
    if a.shape != tuple(shape) or a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"out[{name!r}]: expected a C-contiguous {list(shape)} {dtype} array, "
                         f"got {list(a.shape)} {a.dtype}")
    return a


def _batch_major(a, out, name):
    """``a`` [T, N, …] as [N, T, …]: into the caller's ``out[name]`` when given, else a new
    array."""
    b = _output(out, name, (a.shape[1], a.shape[0]) + a.shape[2:], a.dtype)
    np.copyto(b, a.transpose(1, 0, 2))
    return b


# --- backward ------------------------------------------------------------------------------
def _finite_padding(x, lengths):
    """``x`` [T, N, I] itself when its padded rows (t ≥ len[b]) are finite, else a copy with
    those rows zeroed: the weight gradient ``dW = dgxᵀ·X`` multiplies them by exact zeros, and
    0·NaN or 0·Inf would put NaN into a gradient every sequence shares."""
    pad = np.arange(x.shape[0])[:, None] >= lengths[None, :]     # [T, N]
    if np.isfinite(x[pad]).all():
        return x
    x = x.copy()
    x[pad] = 0
    return x


def backward(net, x, reserve, dy=None, dhy=None, *, dcy=None, cell=None, state_mask=None,
             batch_major=False, dparams=None, accumulate=False, need_dx=True,
             need_dparams=True, num_threads=None):
    """Gradients of a training ``forward``.

    Pass the same ``net``, ``x``, ``state_mask`` and ``batch_major`` as the forward, its
    ``reserve``, and the gradients of the loss with respect to its outputs: ``dy`` (shaped like
    ``y``), ``dhy`` (``[L·D, N, S]``) and, for an LSTM, ``dcy`` (``[L·D, N, H]``); ``None``
    means zeros.  The sequence lengths, dropout probability and seeds are read from the
    reserve, which must be the one the forward of exactly these ``x``, weights and state mask
    returned (else ``ValueError``).

    Weight gradients are written into ``dparams`` when given (``accumulate=False``: overwrite,
    TF's semantics; ``accumulate=True``: add to what it holds, cuDNN's
    ``CUDNN_WGRAD_MODE_ADD``), in place, else into a new ``Network``.  ``need_dx=False``
    leaves out the gradient with respect to ``x`` (``dx`` is then ``None``) when ``x`` is
    data rather than something being trained: the first layer's input-gradient product, a
    sixth of a one-layer GRU's backward arithmetic, is not computed.  ``need_dparams=False``
    likewise leaves out the weight gradients (``dparams`` is then ``None``; not with a
    ``dparams`` given) for weights that are not being trained: a third of the backward's
    arithmetic.  Every other gradient is the same, bit for bit.

    Returns ``Gradients(dx, dh0, dparams)`` (``.dc0`` for an LSTM): ``dx`` shaped like ``x``,
    ``dh0`` ``[L·D, N, S]``.
    """
    return run_backward(BackwardCall.check(
        net, x, reserve, dy, dhy, dcy=dcy, cell=cell, state_mask=state_mask,
        batch_major=batch_major, dparams=dparams, accumulate=accumulate,
        num_threads=num_threads, need_dx=need_dx, need_dparams=need_dparams))


def backward_workspace(kind, cell, topo, dtype, T, N, need_hm=True):
    """The workspace of a backward (``plan.Workspace``, not yet allocated): the kind's buffers
    per direction (the gate gradients among them), h ⊙ m for dR (``need_hm``: a state mask or
    padded sequences), the inner layers' input gradients, the time loops' scratch and the
    pack of a weight-gradient product's right operand.  The gate gradients and their kin hold one
    block of time (``plan.time_block`` steps), not all ``T``.  Shared as
    ``forward_workspace``'s."""
    return plan.shared_layout(_backward_layout, kind, cell, topo, np.dtype(dtype), int(T), int(N),
                              plan.time_block(T, N, plan.wgrad_size(topo, cell.gates)),
                              bool(need_hm))


def _backward_layout(kind, cell, topo, dtype, T, N, Tb, need_hm):
    H, D, L, S = topo.hidden_size, topo.num_directions, topo.num_layers, topo.state_size
    RB = Tb * N                               # the gradient operands hold one block of time
    ws = BACKEND.workspace(dtype)
    for d in range(D):
        for name, shape in kind.backward_buffers(cell, topo, d, RB):
            ws.add(f"{name}{d}", shape)
        if need_hm:
            ws.add(f"hm{d}", (RB, S))
    # the input gradient of every layer above the first, a whole sequence (the layer below
    # needs it all): layer l writes dX{l % 2} while it reads the one of layer l + 1, so two
    # layers and more above the first take turns with two, one layer uses one
    for i in sorted({layer % 2 for layer in range(1, min(L, 3))}):      # (L may be huge)
        ws.add(f"dX{i}", (T * N, topo.output_size))
    ws.add("scratch", (_scratch_size(kind, False, N, H, S, D),))
    # the pack of a weight-gradient product's right operand: a block of the layer's input,
    # of h (h ⊙ m), or of an LSTM's hf ([RB, n] with n at most the widest of them)
    widest = max(topo.input_size, topo.output_size, topo.state_size, H)
    ws.add("wpack", (plan.gemm_pack_size(RB, widest, dtype),))
    return ws


def _training_workspace(space, block_bytes):
    """``(views, lent)``: the workspace of layout ``space`` for a training forward or backward,
    carved from the training step's one block of ``block_bytes`` (``_training_block_bytes``):
    a small one lent by ``plan.block_lender`` (the step's forward and backward take turns with
    it, their views carved once; ``lent`` = ``(lender, what it lent)`` for its ``give_back``),
    a larger one from the pool (``lent`` None: back in the pool when the views are gone)."""
    if block_bytes <= plan.SPARE_BLOCK_BYTES:
        lender = plan.block_lender(block_bytes)
        what, views = lender.borrow(space)
        return views, (lender, what)
    return space.allocate(plan.recycled(block_bytes)), None


@functools.lru_cache(maxsize=256)
def _training_block_bytes(kind, cell, topo, dtype, T, N, need_hm):
    """The size of the pool's block a training forward and its backward both take their
    workspaces from: back in the pool when the forward returns, the block is the one the
    backward gets, so a training step holds one workspace block at a time, not the forward's
    idle beside the backward's."""
    return max(forward_workspace(kind, cell, topo, dtype, T, N, True).block_bytes,
               backward_workspace(kind, cell, topo, dtype, T, N, need_hm).block_bytes)


def workspace_nbytes(topo, cell, dtype, T, N, training):
    """Bytes of a block at any address that holds the workspace of every call of a sequence
    of ``T`` steps and ``N`` rows on a network of ``topo``, ``cell`` and ``dtype``: its forward
    (``training`` or not) and, in training, its backward, whatever their optional arguments —
    and a training size also holds an inference forward's (whose inner layers' outputs are
    temporaries; the backward's, held a block of time at a time, can be smaller)."""
    kind = kinds.of(cell)
    ws = [forward_workspace(kind, cell, topo, dtype, T, N, False)]
    if training:
        ws.append(forward_workspace(kind, cell, topo, dtype, T, N, True))
        ws.append(backward_workspace(kind, cell, topo, dtype, T, N))
    return max(w.block_bytes for w in ws)


def run_backward(call, workspace=None, out=None):
    """The backward of a checked call (``calls.BackwardCall``); ``workspace`` and ``out``
    (``{"dx", "dh0", "dc0"}``) as for ``run_forward``."""
    given = out or {}
    kind, cell, topo, net = call.kind, call.cell, call.net.topology, call.frozen.net
    dtype, T, N, nt, opened = net.dtype, call.T, call.N, call.num_threads, call.opened
    H, D, L, S = topo.hidden_size, topo.num_directions, topo.num_layers, topo.state_size
    DS = topo.output_size
    lstm = kind.has_cell_state
    lengths, mask, dhy, dcy = opened.lengths, call.mask, call.dhy, call.dcy
    kernels = BACKEND.kernels(kind)

    # --- plan
    padded = validate.padded(lengths, T)
    # [T·N, 1] active rows (t < len[b]), for the gradients the GEMMs do not give (peepholes)
    active = (np.arange(T)[:, None] < lengths[None, :]).reshape(T * N, 1) if padded else None
    x_tm = _finite_padding(call.x, lengths) if padded else call.x
    x_tm = x_tm.reshape(T * N, topo.input_size)
    # h_prev rows for dR, written by the backward loop with zeros at padded steps (the saved
    # states there may hold h0 of an empty sequence, NaN included)
    need_hm = mask is not None or padded
    bp = plan.shape_plan(BackwardPlan, kind, cell, topo, dtype, T, N, nt, need_hm)
    chunks, threads, space, Tb = bp.chunks, bp.threads, bp.space, bp.Tb
    # the caller's workspace, else the training step's one block (the forward's, handed on)
    lent = None
    if workspace is not None:
        buf = space.allocate(workspace)
    else:
        buf, lent = _training_workspace(space, bp.block_bytes)
    # the call's backend: the weight-gradient products' packs in the workspace
    backend = BACKEND.with_pack(buf["wpack"])
    # the backward's buffers by name, one per direction (None: the kind has none), each
    # holding one block of time
    ld = {name: [buf.get(key) for key in keys] for name, keys in bp.buffers}
    no_buffer = [None] * D
    dh0 = _output(given, "dh0", (L * D, N, S), dtype)
    dc0 = _output(given, "dc0", (L * D, N, H), dtype) if lstm else None
    # no input gradient asked for (``need_dx=False``): the first layer's dX products are left
    # out, nothing else changes (the layers above still need theirs)
    dx = _output(given if not call.batch_major else {}, "dx", (T, N, topo.input_size),
                 dtype).reshape(T * N, topo.input_size) if call.need_dx else None
    # Computed into a buffer of our own and handed over only when the call has succeeded, so
    # that a failing or interrupted call leaves the caller's dparams as they were.  Every
    # element is written (set by the first block of time, added by the others), so it starts
    # empty (poisoned under the tests: an element left unwritten shows as NaN).
    # (none at all with ``need_dparams=False``: the weight-gradient products are left out) —
    # unless the caller lets them be computed in its dparams (``dparams_in_place``).
    grads = None
    if call.need_dparams:
        grads = call.dparams if _in_place(call) else \
            Network._allocated(topo, dtype, plan.empty, cell)
    masks = dropout_mod.dropout_masks(topo, T, N, dropout=opened.dropout,
                                      seed=(opened.seed, opened.seed2), dtype=dtype) \
        if opened.dropout > 0 else None
    d_out = call.dy  # gradient of the current layer's output, [T, N, D·S] time-major or None

    # --- run: every layer in blocks of Tb steps of each direction, in its own order (the
    # forward direction from the last step, the reversed from the first); the carries dh
    # (and dc) go from block to block through dh0 (dc0), and each block's weight gradients
    # and input gradient are taken before the next block overwrites its gate gradients
    for layer in reversed(range(L)):
        X = x_tm if layer == 0 else opened.xin[layer].reshape(T * N, DS)
        dX = dx if layer == 0 else buf[f"dX{layer % 2}"]
        if dX is not None and (D > 1 or (layer == 0 and topo.input_mode == "skip")):
            dX[...] = 0             # every direction's blocks add their rows
        for s0 in range(0, T, Tb):
            s1 = min(T, s0 + Tb)
            rows = (s1 - s0) * N
            bl = defaultdict(lambda: no_buffer, {
                name: [None if v is None else v[:rows] for v in views]
                for name, views in ld.items()})
            dirs, spans = [], []
            for d in range(D):
                i = layer * D + d
                saved = opened.lds[i]
                rev = topo.reversed_direction(d)
                t0 = s0 if rev else T - s1
                spans.append((t0 * N, t0 * N + rows))
                carry_h = dh0[i] if s0 else None if dhy is None else dhy[i]
                carry_c = (dc0[i] if s0 else None if dcy is None else dcy[i]) if lstm else None
                common = dict(reverse=rev, pre=saved.get("pre"), states=saved["states"],
                              dhy=carry_h, dh0=dh0[i], dgx=bl["dgx"][d], hm=bl["hm"][d],
                              row0=t0 * N, **call.frozen.direction_args(kind, cell, i, False))
                dirs.append(kind.backward_direction(kernels, common, cell, net[i], saved, bl, d,
                                                    carry_c, dc0[i] if lstm else None))
            kernels.backward_layer(dtype, T, N, H, S, chunks, threads, cell, lengths, mask,
                                   d_out, dirs, buf["scratch"], steps=(s0, s1))
            _block_gradients(backend, topo, cell, kind, call.frozen, grads, layer, X, opened,
                             bl, spans, dX, nt, active, first=s0 == 0)
        if layer > 0:
            d_out = dX.reshape(T, N, DS)
            if masks is not None:
                d_out *= masks[layer - 1]
    if lent is not None:
        lent[0].give_back(lent[1])  # (a call that raised leaves its workspace to the pool)
    if dx is not None:
        dx = dx.reshape(T, N, topo.input_size)
        if call.batch_major:
            dx = _batch_major(dx, given, "dx")
    if call.dparams is not None and grads is not None and grads is not call.dparams:
        for mine, theirs in zip(grads, call.dparams):
            for name, a in mine.arrays().items():
                b = getattr(theirs, name)
                if call.accumulate:
                    b += a
                else:
                    b[...] = a
        grads = call.dparams
    return Gradients(dx, dh0, grads, dc0)


def _in_place(call):
    """The weight gradients go straight into the caller's ``dparams``: asked for
    (``dparams_in_place``), overwritten (not accumulated), and every array one the kernels
    write as they write their own (C-contiguous, aligned, writable)."""
    return call.dparams_in_place and call.dparams is not None and not call.accumulate and all(
        a.flags.c_contiguous and a.flags.aligned and a.flags.writeable
        for lp in call.dparams for a in lp.arrays().values())


class BackwardPlan:
    """A backward's plan for one shape (``plan.shape_plan``): the loops' batch chunks and
    threads, the workspace layout, its block's size in a training step, the steps per block
    of time and the names of the kind's buffers — a function of the model and the shapes alone,
    shared by every network of them (a training loop's weights change every step; its shapes
    do not)."""

    __slots__ = ("chunks", "threads", "space", "block_bytes", "Tb", "buffers")

    def __init__(self, kind, cell, topo, dtype, T, N, nt, need_hm):
        H, D = topo.hidden_size, topo.num_directions
        self.threads = plan.loop_threads(nt, T, N, H, D, cell.gates)
        self.chunks = plan.loop_chunks(N, H, self.threads, D)
        self.space = backward_workspace(kind, cell, topo, dtype, T, N, need_hm)
        self.block_bytes = _training_block_bytes(kind, cell, topo, dtype, T, N, need_hm)
        self.Tb = plan.time_block(T, N, plan.wgrad_size(topo, cell.gates))
        names = {name for d in range(D)
                 for name, _ in kind.backward_buffers(cell, topo, d, self.Tb * N)}
        # (name, its workspace keys per direction), "hm" among them
        self.buffers = tuple((name, tuple(f"{name}{d}" for d in range(D)))
                             for name in sorted(names | {"hm"}))


def _add_column_sums(out, a, first):
    """``out`` = (``first``) or += the sums of ``a``'s columns."""
    if first:
        np.add.reduce(a, axis=0, out=out)
    else:
        out += np.add.reduce(a, axis=0)


def _block_gradients(backend, topo, cell, kind, frozen, grads, layer, X, opened, bl, spans,
                     dX, nt, active=None, first=True):
    """After one block of a layer's backward loops: its weight gradients (added into
    ``grads``; set by the first block; None: not wanted) and its rows of the input gradient
    ``dX`` [T·N, in] (None: not wanted), as GEMMs and column sums over the block's rows.  ``bl``: the block's operands by name,
    one per direction; ``spans[d]``: the rows ``(r0, r1)`` of ``T·N`` direction ``d``'s block
    covers."""
    H, D, S, G = topo.hidden_size, topo.num_directions, topo.state_size, cell.gates
    TN = X.shape[0]
    beta = 0.0 if first else 1.0
    dgx = bl["dgx"]
    for d in range(D if grads is not None else 0):
        i = layer * D + d
        g = grads[i]
        r0, r1 = spans[d]
        saved = opened.lds[i]
        states = saved["states"].reshape(-1, S)
        # h_prev of every step, in gate-row order: slots 0…T−1 (forward) or 1…T (reversed)
        h_in = bl["hm"][d] if bl["hm"][d] is not None else states[-TN:][r0:r1] \
            if topo.reversed_direction(d) else states[:TN][r0:r1]
        # db_W = Σ_rows dgx,  db_R = Σ_rows dgh (the recurrent side's): the columns it shares
        # with dgx are db_W's, summed alike (block by block), the others its own
        k, own = kind.recurrent_side(cell, bl, d)
        _add_column_sums(g.b_W, dgx[d], first)
        g.b_R[:k] = g.b_W[:k]
        if own is not None:
            _add_column_sums(g.b_R[k:], own, first)
        kind.weight_gradients(backend, g, cell, topo, d, saved, bl, h_in, nt,
                              None if active is None else active[r0:r1], (r0, r1), beta)
        if g.W.shape[1]:
            # dW[G·H, in] (+)= dgxᵀ · X
            backend.gemm(True, False, dgx[d], X[r0:r1], g.W, beta=beta, nt=nt)
    for d in range(D if dX is not None else 0):
        r0, r1 = spans[d]
        if layer == 0 and topo.input_mode == "projected":
            dX[r0:r1, d * G * H:(d + 1) * G * H] = dgx[d]
        elif layer == 0 and topo.input_mode == "skip":
            # every input matrix is the identity:  dX = Σ_d Σ_gates dgx  (dX zeroed first)
            for k in range(G):
                dX[r0:r1] += dgx[d][:, k * H:(k + 1) * H]
        else:
            # dX[rows, in] (+)= dgx_d[rows, G·H] · W_d[G·H, in]   (W packed once per kept
            # copy; with two directions dX was zeroed and both add)
            backend.gemm_packed(dgx[d], frozen.packed(layer * D + d, "W", False), dX[r0:r1],
                                beta1=D > 1, nt=nt)
