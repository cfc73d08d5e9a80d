"""The runner of repeated inference calls (``engine.ForwardPlan``, the kernels' ``Runner``).

From the second inference call of a shape on, ``cgru.forward`` and ``cgru.Stream.step`` run on
a runner made for that plan: each layer's loop arguments, a workspace of its own and the input
projections' splits, made once.  Every test here compares its results bit for bit with the
general path's (the shape's first call, or a call the runner does not serve), with the outputs
and every workspace starting as NaN (``nan_blocks``) so that an element the runner leaves
unwritten fails, and counts the runner's runs so that a test cannot pass on the general path
alone.  Nothing here times anything.
"""
import signal
import threading

import numpy as np
import pytest

import cgru
from cgru import GRUCell, LSTMCell, Network, RNNCell, Stream, Topology
from cgru._kernels import loops
from cgru._kernels.threads import resolve_num_threads
from cgru.core import plan, weights

CELLS = {"gru": (GRUCell(), 0), "gru_rb": (GRUCell(reset_after=False, g="softsign"), 0),
         "lstm": (LSTMCell(), 0), "lstm_proj": (LSTMCell(), 4),
         "lstm_peep": (LSTMCell(peepholes=True), 0), "rnn_relu": (RNNCell("relu"), 0)}
STACKS = {"1": (1, "forward"), "2bi": (2, "bidirectional"), "3rev": (3, "reverse")}
# (T, N): a step, a short chunk, and two blocks of time (plan.time_block) of a small batch
SHAPES = [(1, 1), (7, 3), (300, 5)]


@pytest.fixture
def nan_blocks(monkeypatch):
    """Every output and every workspace block NaN-filled (0xFF bytes) when made, the pool on —
    unlike the ``poison`` fixture, which turns the pool off and with it the runner."""
    from conftest import _poisoned_empty
    monkeypatch.setattr(plan, "empty", _poisoned_empty)
    monkeypatch.setattr(plan, "recycled",
                        lambda nbytes, exact=False: np.full(nbytes, 0xFF, np.uint8))


def _net(kind, stack, dtype):
    cell, proj = CELLS[kind]
    L, direction = STACKS[stack]
    return Network.random(Topology(5, 6, L, direction, proj_size=proj), dtype, seed=1, cell=cell)


def _states(net, N, rng):
    topo, dtype = net.topology, net.dtype
    h0 = rng.standard_normal((topo.num_layer_directions, N, topo.state_size)).astype(dtype)
    c0 = rng.standard_normal((topo.num_layer_directions, N, topo.hidden_size)).astype(dtype) \
        if net.cell.has_cell_state else None
    return h0, c0


def _runs(net):
    """Runs of every runner the network's weights keep."""
    return sum(p._runner.runs for p in weights.freeze(net)._plans.values()
               if getattr(p, "_runner", None) is not None)


def _plan(net, T, N, nt, h0, c0):
    """The plan of an inference call of ``net`` of these shapes and states."""
    frozen = weights.freeze(net)
    return frozen._plans[("forward plan", frozen.cell_key(net.cell), T, N, nt, False,
                          h0 is None, c0 is None)]


def _same(got, want):
    for a, b in zip(got, want):
        if b is None:
            assert a is None
            continue
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b)


def _general(fn, *args, **kwargs):
    """``fn(...)`` the general way: with the pool off no call takes a runner."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan, "_reuse", False)
        return fn(*args, **kwargs)


@pytest.mark.usefixtures("nan_blocks")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("kind", list(CELLS))
def test_a_repeated_inference_runs_on_its_runner_with_the_general_paths_bits(kind, stack,
                                                                            dtype):
    """Every cell kind, stacks of one to three layers in each direction, a step, a chunk and
    two blocks of time, one and two threads, given and zero initial states, both layouts,
    sealed or not: the first call of a shape runs the general way, the next ones on the
    runner, with the general path's bits."""
    rng = np.random.default_rng(2)
    for sealed in (False, True):
        net = _net(kind, stack, dtype)
        net = net.sealed() if sealed else net
        for T, N in SHAPES:
            x = rng.standard_normal((T, N, 5)).astype(dtype)
            h0, c0 = _states(net, N, rng)
            for nt in (1, 2):
                states = [(None, None), (h0, None)]
                if c0 is not None:
                    states += [(h0, c0), (None, c0)]
                for h, c in states:
                    for batch_major in (False, True):       # one plan: the runs go on
                        xin = np.ascontiguousarray(x.transpose(1, 0, 2)) if batch_major else x
                        args = dict(c0=c, num_threads=nt, batch_major=batch_major)
                        want = _general(cgru.forward, net, xin, h, **args)
                        runs = _runs(net)
                        for _ in range(2):
                            _same(cgru.forward(net, xin, h, **args), want)
                        if _plan(net, T, N, nt, h, c).runnable:
                            assert _runs(net) == runs + (2 if batch_major else 1)
                        else:       # a workspace larger than a step's: the general path
                            assert _runs(net) == runs
                            assert (T, N) == SHAPES[-1]
        assert _runs(net) >= 8 * len(SHAPES)


@pytest.mark.usefixtures("nan_blocks")
@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("kind", list(CELLS))
def test_a_runner_computes_what_the_numpy_reference_computes(kind, stack):
    """Against an oracle of its own, not only the general path: every kind and stack, float64,
    plain and sealed, a runner's results (given states, and zeros) equal
    ``cgru.core.reference.forward``'s to 1e-12 — the runner reached through the general path
    (a shape's second call) and straight (its third: ``engine.repeat``) —, with two blocks of
    time where the workspace allows a runner (a GRU of one layer)."""
    from cgru.core import reference
    plain = _net(kind, stack, np.float64)
    for net in (plain, plain.sealed()):
        rng = np.random.default_rng(9)
        for T, N in SHAPES:
            x = rng.standard_normal((T, N, 5))
            h0, c0 = _states(net, N, rng)
            for h, c in ((h0, c0), (None, None)):
                cgru.forward(net, x, h, c0=c)               # the general path; then the runner
                runs = _runs(net)
                gots = [cgru.forward(net, x, h, c0=c) for _ in range(2)]
                if _plan(net, T, N, _nt(), h, c).runnable:
                    assert _runs(net) == runs + 2
                want = reference.forward(net, x, h, c0=c)
                for got in gots:
                    for a, b in zip((got.y, got.hy, got.cy), want):    # (y, hy[, cy])
                        assert np.isfinite(a).all()
                        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        assert _runs(net) >= 4 * len(SHAPES) - 4


def _nt():
    """The thread count a call without ``num_threads`` resolves to."""
    from cgru._kernels.threads import resolve_num_threads
    return resolve_num_threads(None)


@pytest.mark.usefixtures("nan_blocks")
@pytest.mark.parametrize("kind", ["gru", "lstm_proj", "rnn_relu"])
def test_a_runner_on_two_threads_computes_the_bits_of_one(monkeypatch, kind):
    """At two threads a runner's layers run as two work items (two batch chunks), or as one
    loop whose per-step products a thread team shares (one chunk): the bits of one thread and
    of the general path.  Counted: the runner's runs, and the teamed loops."""
    monkeypatch.setattr(plan, "_MIN_PARALLEL_WORK", 0)        # threads for the loops …
    old = loops.team_min_work(0)                              # … and a team wherever one fits
    try:
        cell, proj = CELLS[kind]
        net = Network.random(Topology(5, 24, 2, proj_size=proj), np.float64, seed=1, cell=cell)
        rng = np.random.default_rng(7)
        for N in (16, 3):                # two chunks: two work items | one chunk: a team
            x = rng.standard_normal((6, N, 5))
            h0, c0 = _states(net, N, rng)
            want = _general(cgru.forward, net, x, h0, c0=c0, num_threads=1)
            for nt in (1, 2):
                cgru.forward(net, x, h0, c0=c0, num_threads=nt)        # the plan's first call
                runs, teams = _runs(net), loops.team_jobs()
                for _ in range(2):
                    _same(cgru.forward(net, x, h0, c0=c0, num_threads=nt), want)
                assert _runs(net) == runs + 2
                teamed = loops.team_jobs() - teams
                assert teamed == (2 * 2 if nt == 2 and N == 3 else 0), (N, nt, teamed)
    finally:
        loops.team_min_work(old)


@pytest.mark.usefixtures("nan_blocks")
@pytest.mark.parametrize("kind", ["gru", "lstm_proj", "rnn_relu"])
def test_stream_steps_run_on_the_runner_with_the_whole_sequences_bits(kind):
    """A stream's steps of one shape after the first run on the runner (shared with
    ``cgru.forward`` of the same weights and shape), bit for bit the whole sequence's."""
    N = 4
    net = Network.random(Topology(5, 6, 3, proj_size=CELLS[kind][1]), np.float32, seed=1,
                         cell=CELLS[kind][0])
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, N, 5)).astype(np.float32)
    h0, c0 = _states(net, N, rng)
    want = _general(cgru.forward, net, x, h0, c0=c0)
    stream = Stream(net)
    state = (h0, c0) if c0 is not None else h0
    ys = []
    for t in range(9):
        y, state = stream.step(x[t], state)
        ys.append(y)
    runs = sum(p._runner.runs for p in stream._frozen._plans.values() if p._runner is not None)
    assert runs == 8                 # every step after the first
    np.testing.assert_array_equal(np.stack(ys), want.y)
    _same(state if c0 is not None else (state,),
          (want.hy, want.cy) if c0 is not None else (want.hy,))


@pytest.mark.usefixtures("nan_blocks")
def test_calls_the_runner_does_not_serve_run_the_general_way():
    """Sequence lengths (padded or not), a state mask, a caller's workspace, training and a
    skip input: never the runner, whatever ran before — each call's own bits."""
    net = _net("gru", "2bi", np.float64)
    rng = np.random.default_rng(4)
    T, N = 6, 3
    x = rng.standard_normal((T, N, 5))
    for _ in range(3):
        cgru.forward(net, x)                                 # the runner of this shape
    runs = _runs(net)
    lengths = np.array([6, 2, 4])
    mask = (rng.random((T, N, 12)) > 0.3).astype(np.float64)
    cases = [dict(lengths=lengths), dict(lengths=np.full(N, T)), dict(state_mask=mask)]
    for kw in cases:
        for _ in range(2):
            _same(cgru.forward(net, x, **kw), _general(cgru.forward, net, x, **kw))
    padded = cgru.forward(net, x, lengths=lengths)
    assert not padded.y[T - 1, 1].any()                     # past a sequence's end: zeros
    for _ in range(2):
        _same(cgru.forward(net, x, training=True)[:2], _general(cgru.forward, net, x)[:2])
    skip = Network.random(Topology(6, 6, 1, input_mode="skip"), np.float64, seed=1)
    xs = rng.standard_normal((T, N, 6))
    for _ in range(2):
        _same(cgru.forward(skip, xs)[:2], _general(cgru.forward, skip, xs)[:2])
    assert _runs(net) == runs
    assert _runs(skip) == 0


def test_a_busy_runner_leaves_the_call_to_the_general_path():
    """A call that finds the runner held by another thread's call does not wait for it: it
    runs the general way, with the same bits.  The test probe holds the first call inside the
    runner (a rendezvous at step 3 of its loop) until the second call's loop arrives there too:
    a second call that waited for the runner would never arrive, and the probe would time out."""
    net = Network.random(Topology(5, 6), np.float32, seed=1).sealed()
    x = np.random.default_rng(5).standard_normal((8, 2, 5)).astype(np.float32)
    want = cgru.forward(net, x)
    cgru.forward(net, x)                                    # the runner is made
    runs = _runs(net)
    got = {}
    loops.set_probe(3, action=2, needed=2, timeout=30.0)
    try:
        t = threading.Thread(target=lambda: got.setdefault("runner", cgru.forward(net, x)))
        t.start()
        while loops.probe_state()["arrived"] < 1 and t.is_alive():
            pass                                            # the thread waits in the runner
        got["general"] = cgru.forward(net, x)               # arrives: both go on
        t.join()
        state = loops.probe_state()
    finally:
        loops.set_probe(-1)
    assert not state["timed_out"] and state["arrived"] == 2
    assert _runs(net) == runs + 1
    for f in got.values():
        _same(f, want)


def test_an_interrupted_runner_is_free_for_the_next_call():
    """Ctrl-C during a run on the runner raises KeyboardInterrupt; the runner is free again
    and the next call runs on it with the usual bits."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    net = Network.random(Topology(5, 6), np.float64, seed=1)
    x = np.random.default_rng(6).standard_normal((40, 2, 5))
    want = cgru.forward(net, x)
    cgru.forward(net, x)
    runs = _runs(net)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        loops.set_probe(10, action=1)
        with pytest.raises(KeyboardInterrupt):
            cgru.forward(net, x)
        assert loops.probe_state()["steps"] == 11
    finally:
        loops.set_probe(-1)
        signal.signal(signal.SIGINT, old)
    _same(cgru.forward(net, x), want)
    assert _runs(net) == runs + 1


@pytest.mark.usefixtures("nan_blocks")
def test_released_memory_and_changed_weights_never_reach_a_runner():
    """``cgru.release_memory()`` between calls, and weights changed in place between calls
    of a plain network: each call computes with the weights it is given (the runner belongs
    to the ``Frozen`` of the bytes it was made from, which a changed network no longer finds),
    bit for bit the general path's."""
    net = _net("lstm", "2bi", np.float32)
    x = np.random.default_rng(8).standard_normal((5, 2, 5)).astype(np.float32)
    for step in range(4):
        for _ in range(3):
            _same(cgru.forward(net, x), _general(cgru.forward, net, x))
        assert _runs(net) == 2                 # this weights' own runner, from its 2nd call
        if step % 2:
            cgru.release_memory()
        net[0].W[0, 0] += 0.5                  # new bytes: a new Frozen, its own plans


class _CountedChecks:
    """``engine.ForwardCall`` with its ``check`` counted: the general path's first step, which
    a repeated call of a sealed network skips."""

    def __init__(self, real):
        self.real, self.checks = real, 0

    def check(self, *args, **kwargs):
        self.checks += 1
        return self.real.check(*args, **kwargs)


@pytest.fixture
def counted(monkeypatch):
    from cgru.core import engine
    counter = _CountedChecks(engine.ForwardCall)
    monkeypatch.setattr(engine, "ForwardCall", counter)
    return counter


@pytest.mark.usefixtures("nan_blocks")
@pytest.mark.parametrize("kind", ["gru", "lstm_proj", "rnn_relu"])
def test_a_repeated_call_of_a_sealed_network_goes_straight_to_its_runner(counted, kind):
    """From the third call of a shape on (the first plans it, the second makes the runner),
    a sealed network's common inference is checked against what the call before proved and
    runs on the runner without the general path's checks — with the general path's bits, for
    given and zero states and for each shape it has seen."""
    net = _net(kind, "2bi", np.float32).sealed()
    rng = np.random.default_rng(9)
    for T, N in [(1, 1), (7, 3)]:
        x = rng.standard_normal((T, N, 5)).astype(np.float32)
        h0, c0 = _states(net, N, rng)
        for h, c in [(None, None), (h0, c0)]:
            want = _general(cgru.forward, net, x, h, c0=c)
            for _ in range(2):
                cgru.forward(net, x, h, c0=c)
            checks, runs = counted.checks, _runs(net)
            for _ in range(3):
                _same(cgru.forward(net, x, h, c0=c), want)
            assert counted.checks == checks and _runs(net) == runs + 3
    x = rng.standard_normal((1, 1, 5)).astype(np.float32)      # the first shape again
    want = _general(cgru.forward, net, x)
    checks = counted.checks
    _same(cgru.forward(net, x), want)
    assert counted.checks == checks


@pytest.mark.usefixtures("nan_blocks")
def test_a_plain_networks_repeated_call_proves_its_weights_by_their_bytes(counted):
    """A plain network's repeated calls skip the general path too, and compare the weights'
    bytes with the copies the runner computes from on every call: weights changed in place
    between calls (one element, then back) are computed with, bit for bit the general path's,
    and the runner of the old bytes serves them again once they are back."""
    net = _net("gru", "2bi", np.float32)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 2, 5)).astype(np.float32)
    for _ in range(3):
        cgru.forward(net, x)
    want = _general(cgru.forward, net, x)
    checks, runs = counted.checks, _runs(net)
    for _ in range(3):
        _same(cgru.forward(net, x), want)
    assert counted.checks == checks and _runs(net) == runs + 3
    old = net[1].R[2, 3]
    net[1].R[2, 3] = old + 0.25                         # the reverse direction's R
    changed = _general(cgru.forward, net.copy(), x)     # (a copy: net's kept copies untouched)
    assert not np.array_equal(changed.y, want.y)
    checks = counted.checks
    _same(cgru.forward(net, x), changed)                # new bytes: the general path
    assert counted.checks == checks + 1
    net[1].R[2, 3] = old
    for _ in range(2):
        _same(cgru.forward(net, x), want)


def test_a_repeated_call_keeps_no_copy_the_weights_cache_let_go(counted):
    """What a plain network's repeated calls keep refers to its weights' copies weakly: once
    the cache lets them go (``cgru.release_memory()``), the next call takes the general path,
    and the copies are freed."""
    import gc
    import weakref
    net = _net("lstm", "1", np.float64)
    x = np.random.default_rng(13).standard_normal((2, 2, 5))
    for _ in range(3):
        cgru.forward(net, x)
    frozen = weakref.ref(weights.freeze(net))
    checks = counted.checks
    cgru.forward(net, x)
    assert counted.checks == checks
    cgru.release_memory()
    gc.collect()
    assert frozen() is None, "a repeated call's record kept the released copies alive"
    want = _general(cgru.forward, net, x)
    checks = counted.checks
    _same(cgru.forward(net, x), want)
    assert counted.checks == checks + 1


@pytest.mark.usefixtures("nan_blocks")
def test_whatever_a_repeated_call_changes_goes_the_general_way(counted, monkeypatch):
    """After a shape's calls went straight to the runner, every change the last call did not
    prove takes the general path — its checks, its errors in its words, its bits: a view that
    is not C-contiguous, a state of another dtype, a state given where none was, another
    thread count, other sealed weights bound to the network, the pool turned off."""
    net = _net("lstm", "1", np.float32).sealed()
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    h0, c0 = _states(net, 3, rng)

    def general_only(*args, **kwargs):
        checks = counted.checks
        got = cgru.forward(*args, **kwargs)
        assert counted.checks == checks + 1
        return got

    for _ in range(3):
        cgru.forward(net, x, h0, c0=c0, num_threads=1)
    strided = np.concatenate([x, x], axis=2)[:, :, :5]
    assert strided.shape == x.shape and not strided.flags.c_contiguous
    _same(general_only(net, strided, h0, c0=c0, num_threads=1),
          _general(cgru.forward, net, x, h0, c0=c0, num_threads=1))
    with pytest.raises((TypeError, ValueError), match="h0"):
        general_only(net, x, h0.astype(np.float64), c0=c0, num_threads=1)
    with pytest.raises(ValueError, match="c0"):
        general_only(net, x, h0, c0=c0[:, :2], num_threads=1)
    _same(general_only(net, x, None, c0=c0, num_threads=1),
          _general(cgru.forward, net, x, None, c0=c0, num_threads=1))
    if resolve_num_threads(2) != resolve_num_threads(1):     # (a machine of one core: 1)
        _same(general_only(net, x, h0, c0=c0, num_threads=2),
              _general(cgru.forward, net, x, h0, c0=c0, num_threads=1))
    other = _net("lstm", "1", np.float32)
    other = Network.random(other.topology, np.float32, seed=7, cell=other.cell).sealed()
    net.layers = other.layers                 # rebound: the other weights, proven anew
    _same(general_only(net, x, h0, c0=c0, num_threads=1),
          _general(cgru.forward, other, x, h0, c0=c0, num_threads=1))
    monkeypatch.setattr(plan, "_reuse", False)
    general_only(net, x, h0, c0=c0, num_threads=1)


@pytest.mark.usefixtures("nan_blocks")
def test_repeated_stream_steps_go_straight_to_the_runner(monkeypatch):
    """A stream's steps of a shape it ran on the runner skip its checks and its plan's lookup
    (counted), with the whole sequence's bits; a state of another kind, ``refresh()`` and a
    wrong state take the general path again, which words the error."""
    net = Network.random(Topology(5, 6, 2), np.float32, seed=1, cell=LSTMCell())
    rng = np.random.default_rng(11)
    x = rng.standard_normal((9, 4, 5)).astype(np.float32)
    h0, c0 = _states(net, 4, rng)
    want = _general(cgru.forward, net, x, h0, c0=c0)
    stream = Stream(net)
    plans = []
    real_plan = Stream._plan
    monkeypatch.setattr(Stream, "_plan", lambda self, *a: plans.append(a) or real_plan(self, *a))
    state, ys = (h0, c0), []
    for t in range(9):
        y, state = stream.step(x[t], state)
        ys.append(y)
    assert len(plans) == 2              # the first step plans, the second makes the runner
    np.testing.assert_array_equal(np.stack(ys), want.y)
    _same(state, (want.hy, want.cy))
    stream.step(x[0])                   # zero states: another plan, then straight on
    stream.step(x[0])
    stream.step(x[0])
    assert len(plans) == 4
    stream.refresh()                    # a new snapshot: planned (looked up) again
    stream.step(x[0], state)
    assert len(plans) == 5
    with pytest.raises(TypeError, match="state"):
        stream.step(x[0], [state[0], state[1]])
    with pytest.raises(TypeError, match="dtype"):
        stream.step(x[0].astype(np.float64), state)
