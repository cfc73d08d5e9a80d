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

**Per-call cost.** What a step needs besides ``x`` and the state — the workspace, the loops'
split, every layer's loop arguments — depends only on ``(T, N)`` and on which states are
given: it is the plan ``cgru.forward`` makes for an inference of that shape
(``engine.ForwardPlan``), kept with the stream's weights for their most recent shapes, and
from a shape's second step on its runner (the kernels' ``Runner``) runs the step in one call
into the kernels, on a workspace of its own.  A step then costs its checks, its outputs and
that call.

The stream is a **snapshot** of the network's weights: it computes with copies of every array
(``weights.freeze``), so changes made to the network's arrays afterwards are not seen until
``refresh()`` (or a new stream).  Streams run forward in time:
reverse and bidirectional networks need whole sequences (``cgru.forward``).  Inference only
(no reserve, no dropout), time-major, every sequence of the batch advancing together.
"""
import numpy as np

from cgru.core import engine, kinds, plan, validate, weights
from cgru.core.backend import BACKEND
from cgru.core.calls import check_h
from cgru.core.network import Network
from cgru._kernels.threads import resolve_num_threads

__all__ = ["Stream"]


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
        self.refresh()

    def refresh(self):
        """Take a new snapshot of the network's weights (after they changed in place)."""
        frozen = weights.freeze(self.net, self.num_threads)
        self._frozen = frozen
        self._repeats = {}          # (x's shape, state None?) -> _Repeat of this snapshot
        # per layer, the time loop's fixed arguments (its recurrent packs among them)
        self._layers = []
        for i in range(len(frozen.net.layers)):
            frozen.packed(i, "W", True)                        # gx = x·Wᵀ, packed now
            self._layers.append(dict(reverse=False,
                                     **frozen.direction_args(self._kind, self.net.cell, i,
                                                             True)))

    def step(self, x, state=None):
        if type(x) is np.ndarray:
            r = self._repeats.get((x.shape, state is None))
            if r is not None:
                done = r.step(self, x, state)
                if done is not None:
                    return done
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
        frozen = self._frozen
        step_plan = self._plan(frozen, T, N, h0 is None, c0 is None)
        hy = BACKEND.empty((L, N, S), dtype)
        cy = BACKEND.empty((L, N, H), dtype) if lstm else None
        y = BACKEND.empty((T, N, S), dtype)
        X = np.ascontiguousarray(x3).reshape(T * N, topo.input_size)
        runner = step_plan.runner(frozen) if step_plan.runnable else None
        if runner is not None and runner.run(X, h0, c0, y, hy, cy):
            _Repeat.remember(self, x, state, h0, c0, step_plan, runner)
            return (y[0] if one_step else y), ((hy, cy) if lstm else hy)
        # the general way (the step's first call, a busy runner, a large step): the
        # temporaries, one block, as an inference forward's — the input projection, the zero
        # states, the inner layers' outputs (ping-pong) and the loops' scratch
        lengths = validate.full_lengths(T, N)
        buf = step_plan.space.borrow()
        try:
            h0, c0 = engine.initial_states(buf, h0, c0)
            Tb = step_plan.Tb
            for layer, fixed in enumerate(self._layers):
                out = y if layer == L - 1 else buf[f"out{layer % 2}"]
                for s0 in range(0, T, Tb):          # in blocks of time, as cgru.forward
                    s1 = min(T, s0 + Tb)
                    rows = (s1 - s0) * N
                    gx = buf["gx0"][:rows]
                    engine.input_projection(topo, G, layer, 0, frozen,
                                            X[s0 * N:s0 * N + rows], gx, self.num_threads)
                    kw = dict(fixed, gx=gx, ldgx=G * H, h0=hy[layer] if s0 else h0[layer],
                              hy=hy[layer], row0=s0 * N)
                    if lstm:
                        kw.update(c0=cy[layer] if s0 else c0[layer], cy=cy[layer])
                    kernels.forward_layer(dtype, T, N, H, S, step_plan.chunks,
                                          step_plan.threads, net.cell, lengths, None,
                                          out, [kernels.Direction(**kw)], False,
                                          buf["scratch"], steps=(s0, s1))
                X = out.reshape(T * N, S)
        finally:
            step_plan.space.give_back(buf)
        return (y[0] if one_step else y), ((hy, cy) if lstm else hy)

    def _plan(self, frozen, T, N, zero_h0, zero_c0):
        """The plan of a step of this shape (``engine.ForwardPlan``, made at its first step and
        kept with the snapshot's other plans: a forward of the same weights and shape shares
        it)."""
        net = self.net
        return frozen.plan(
            ("forward plan", frozen.cell_key(net.cell), T, N, self.num_threads, False,
             zero_h0, zero_c0),
            lambda: _step_plan(self, T, N, zero_h0, zero_c0))


class _Repeat:
    """A step shape that ran on its runner, for the steps after it (``Stream.step``'s first
    lines): what the general path checked and looked up for it — the snapshot, the dtype, the
    shapes of the state given (None: not given), the outputs' shapes, the runner.  A step of
    the same ``x`` shape is then checked against these alone (a plain C-contiguous ``x`` and
    state of the recorded dtype and shapes) and goes straight to the runner: the general
    path's runner, so its bits.  Anything else takes the general path, which words every
    error."""

    __slots__ = ("frozen", "dtype", "lstm", "h", "c", "outputs", "rows", "runner")

    KEPT = 8            # the shapes kept per stream (the most recent)

    @classmethod
    def remember(cls, stream, x, state, h0, c0, step_plan, runner):
        if type(x) is not np.ndarray or not x.flags.c_contiguous:
            return
        key = (x.shape, state is None)
        found = stream._repeats.get(key)
        if found is not None and found.runner is runner and found.frozen is stream._frozen:
            return
        r = cls()
        r.frozen, r.dtype, r.lstm = stream._frozen, stream.net.dtype, stream._kind.has_cell_state
        r.h = None if h0 is None else h0.shape
        r.c = None if c0 is None else c0.shape
        r.outputs, r.runner = step_plan.outputs, runner
        r.rows = (x.shape[0] * x.shape[1], x.shape[2]) if x.ndim == 3 else x.shape
        repeats = stream._repeats
        repeats.pop(key, None)
        repeats[key] = r
        for stale in list(repeats)[:-cls.KEPT]:     # (each step atomic: threads may race)
            repeats.pop(stale, None)

    def step(self, stream, x, state):
        """``(y, state)`` of ``stream.step(x, state)``, or None for the general path."""
        if stream._frozen is not self.frozen or x.dtype != self.dtype or \
                not x.flags.c_contiguous or not plan._reuse:
            return None
        if state is None:
            h0 = c0 = None
        elif self.lstm:
            if type(state) is not tuple or len(state) != 2:
                return None
            h0, c0 = state
        else:
            h0, c0 = state, None
        if not (engine.as_recorded(h0, self.h, self.dtype) and
                engine.as_recorded(c0, self.c, self.dtype)):
            return None
        done = engine.run_recorded(self.runner, self.outputs, x.reshape(self.rows), h0, c0)
        if done is None:
            return None                 # another step holds the runner
        y, hy, cy = done
        return (y[0] if x.ndim == 2 else y), ((hy, cy) if self.lstm else hy)


def _step_plan(stream, T, N, zero_h0, zero_c0):
    net, topo = stream.net, stream.net.topology
    validate.call_sizes(topo, net.cell.gates, T, N, "x")      # a function of the shape only
    return engine.ForwardPlan(stream._kind, net.cell, topo, net.dtype, T, N, stream.num_threads,
                              False, zero_h0, zero_c0)
