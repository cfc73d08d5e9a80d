"""Step a network through time a few steps per call: ``cgru.Stream``.

For autoregressive decoding and online inference, where a call runs one step (or a short
chunk) and the state goes in and out::

    stream = cgru.Stream(net)                 # packs the weights once (a snapshot)
    h = None
    for x_t in frames:                        # x_t [N, I] (one step) or [T, N, I]
        y_t, h = stream.step(x_t, h)          # an LSTM: y_t, (h, c) = stream.step(x_t, (h, c))

A stream computes what ``cgru.forward`` computes on the concatenated steps, bit for bit, however
the sequence is cut into calls: the same input projection (the kernels' packed GEMM, whose
rows do not depend on which rows share a call) and the same time loops.  It does the per-call
work once, when it is made: the weights are packed, the biases are summed, and every check
that does not depend on ``x`` is done.  What a call still does: check ``x`` and the state, one
packed GEMM and one time loop per layer.

**Per-call cost.** What a step needs besides ``x`` and the state — the workspace's layout,
the loops' split, the lengths — depends only on ``(T, N)`` and on which states are given, so
the stream keeps it per such shape, for its few most recent shapes; the layout lends its
workspace to step after step (``plan.Workspace.shared``), so a step of a shape seen before
allocates only its outputs.

The stream is a **snapshot** of the network's weights: it computes with copies of every array
(``weights.freeze``), so changes made to the network's arrays afterwards are not seen until
``refresh()`` (or a new stream).  Streams run forward in time:
reverse and bidirectional networks need whole sequences (``cgru.forward``).  Inference only
(no reserve, no dropout), time-major, every sequence of the batch advancing together.
"""
import collections
import threading

import numpy as np

from cgru.core import engine, kinds, plan, validate, weights
from cgru.core.backend import BACKEND
from cgru.core.calls import check_h
from cgru.core.network import Network
from cgru._kernels.threads import resolve_num_threads

__all__ = ["Stream"]

# A stream keeps the step plans of this many recent (T, N, states given) shapes.
KEEP_SHAPES = 4


class _StepPlan:
    """What a step of one shape needs, made once: the workspace layout, the loops' batch
    chunks and threads, the (read-only) lengths, the steps per block of time."""

    __slots__ = ("layout", "chunks", "threads", "lengths", "block")

    def __init__(self, stream, T, N, zero_h0, zero_c0):
        net, topo = stream.net, stream.net.topology
        H, G = topo.hidden_size, net.cell.gates
        validate.call_sizes(topo, G, T, N, "x")      # a function of the shape only
        self.layout = engine.forward_workspace(stream._kind, net.cell, topo, net.dtype, T, N,
                                               False, zero_h0, zero_c0)
        self.chunks = plan.n_chunks(N, H)
        self.threads = plan.loop_threads(stream.num_threads, T, N, H, 1, G)
        self.lengths = np.full(N, T, np.int64)
        self.lengths.flags.writeable = False
        self.block = plan.time_block(T, N)


class Stream:
    """``Stream(net, *, num_threads=None)``: ``net`` unidirectional (forward); see the module
    docstring.  ``step(x, state=None)`` returns ``(y, state)``: ``x`` ``[N, I]`` or
    ``[T, N, I]`` of the network's dtype, ``y`` shaped alike (``[N, S]`` / ``[T, N, S]``, the
    last layer's output), ``state`` ``h`` ``[L, N, S]`` — or ``(h, c)`` for an LSTM, ``c``
    ``[L, N, H]``; ``None`` means zeros."""

    def __init__(self, net, *, num_threads=None):
        if not isinstance(net, Network):
            raise TypeError(f"net: expected a cgru.Network, got {type(net).__name__}")
        topo = net.topology
        if topo.direction != "forward":
            raise ValueError(f"net: a Stream runs forward in time; a {topo.direction} network "
                             f"needs whole sequences (use cgru.forward)")
        if topo.input_mode != "linear":
            raise ValueError(f"net: input_mode={topo.input_mode!r} is not supported by Stream "
                             f"(use cgru.forward)")
        validate.cell_for_dtype(net.cell, net.dtype)
        self.net = net
        self.num_threads = resolve_num_threads(num_threads)
        self._kind = kinds.of(net.cell)
        self._kernels = BACKEND.kernels(self._kind)
        self._plans = collections.OrderedDict()     # (T, N, zero_h0, zero_c0) -> _StepPlan
        self._plans_lock = threading.Lock()
        self.refresh()

    def refresh(self):
        """Take a new snapshot of the network's weights (after they changed in place)."""
        frozen = weights.freeze(self.net)
        self._frozen = frozen
        # per layer, the time loop's fixed arguments (its recurrent packs among them)
        self._layers = []
        for i in range(len(frozen.net.layers)):
            frozen.packed(i, "W", True)                        # gx = x·Wᵀ, packed now
            self._layers.append(dict(reverse=False,
                                     **frozen.direction_args(self._kind, self.net.cell, i,
                                                             True)))

    def step(self, x, state=None):
        net, topo, dtype = self.net, self.net.topology, self.net.dtype
        lstm = self._kind.has_cell_state
        validate.plain_array(x, "x")
        if x.dtype != dtype:
            raise TypeError(f"x: expected dtype {dtype} (the dtype of the network), got "
                            f"{x.dtype}")
        one_step = x.ndim == 2
        if x.ndim not in (2, 3) or x.shape[-1] != topo.input_size:
            raise ValueError(f"x: expected [N, I={topo.input_size}] (one step) or "
                             f"[T, N, I={topo.input_size}], got shape {list(x.shape)}")
        x3 = x[None] if one_step else x
        T, N = x3.shape[0], x3.shape[1]
        if T == 0 or N == 0:
            raise ValueError(f"x: expected T ≥ 1 and N ≥ 1, got shape {list(x.shape)}")
        if lstm and state is not None and not (isinstance(state, tuple) and len(state) == 2):
            raise TypeError("state: expected None or the (h, c) pair of an LSTM")
        h0, c0 = state if lstm and state is not None else (state, None)
        h0 = check_h(h0, "state h" if lstm else "state", topo, dtype, N)
        c0 = check_h(c0, "state c", topo, dtype, N, topo.hidden_size) if lstm else None
        L, S, H, G = topo.num_layers, topo.state_size, topo.hidden_size, net.cell.gates
        kernels = self._kernels
        step_plan = self._plan(T, N, h0 is None, c0 is None)
        hy = BACKEND.empty((L, N, S), dtype)
        cy = BACKEND.empty((L, N, H), dtype) if lstm else None
        y = BACKEND.empty((T, N, S), dtype)
        X = np.ascontiguousarray(x3).reshape(T * N, topo.input_size)
        # the temporaries, one block, as an inference forward's: the input projection, the
        # zero states, the inner layers' outputs (ping-pong) and the loops' scratch
        buf = step_plan.layout.borrow()
        try:
            h0, c0 = engine.initial_states(buf, h0, c0)
            Tb = step_plan.block
            for layer, fixed in enumerate(self._layers):
                out = y if layer == L - 1 else buf[f"out{layer % 2}"]
                for s0 in range(0, T, Tb):          # in blocks of time, as cgru.forward
                    s1 = min(T, s0 + Tb)
                    rows = (s1 - s0) * N
                    gx = buf["gx0"][:rows]
                    engine.input_projection(topo, G, layer, 0, self._frozen,
                                            X[s0 * N:s0 * N + rows], gx, self.num_threads)
                    kw = dict(fixed, gx=gx, ldgx=G * H, h0=hy[layer] if s0 else h0[layer],
                              hy=hy[layer], row0=s0 * N)
                    if lstm:
                        kw.update(c0=cy[layer] if s0 else c0[layer], cy=cy[layer])
                    kernels.forward_layer(dtype, T, N, H, S, step_plan.chunks,
                                          step_plan.threads, net.cell, step_plan.lengths, None,
                                          out, [kernels.Direction(**kw)], False,
                                          buf["scratch"], steps=(s0, s1))
                X = out.reshape(T * N, S)
        finally:
            step_plan.layout.give_back(buf)
        return (y[0] if one_step else y), ((hy, cy) if lstm else hy)

    def _plan(self, T, N, zero_h0, zero_c0):
        """The ``_StepPlan`` of this shape (made on its first step; the stream keeps the
        ``KEEP_SHAPES`` most recently used)."""
        key = (T, N, zero_h0, zero_c0)
        with self._plans_lock:
            found = self._plans.get(key)
            if found is not None:
                self._plans.move_to_end(key)
                return found
        made = _StepPlan(self, T, N, zero_h0, zero_c0)
        with self._plans_lock:
            found = self._plans.setdefault(key, made)
            self._plans.move_to_end(key)
            while len(self._plans) > KEEP_SHAPES:
                self._plans.popitem(last=False)
        return found
