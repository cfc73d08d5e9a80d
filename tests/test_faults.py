"""Faults survived: an exception in the middle of a call, and a KeyboardInterrupt.

The guarantee tested here (the strong exception guarantee): when ``forward`` or ``backward``
raises — an error from a kernel, a ``MemoryError``, a ``KeyboardInterrupt`` — every buffer the
caller owns is exactly as it was before the call: the inputs, the reserve, and ``dparams``
(whose accumulated gradients must neither be half-added nor half-overwritten: a training
loop that catches the exception and carries on must not double-count a layer), and the
process state the engine touches (the BLAS thread count) is restored.  A later call then
gives bitwise the results of an undisturbed one.  Faults are injected deterministically at
the second layer of a multi-layer call by wrapping the GRU kind's kernels (or the per-layer
gradient step); the real-signal tests raise SIGINT from inside a time loop at a chosen step
(the kernels' test probe) and count steps and kernel calls — nothing here depends on the
machine's speed.

A ``KeyboardInterrupt`` arriving while a time loop runs (in C, without the GIL) is noticed by
the loop itself: the calling thread runs Python's signal handlers every 50 ms and stops every
work item.  ``test_interrupt_between_kernel_calls`` shows that the next kernel call never
starts, ``test_interrupt_inside_one_long_time_loop`` that a loop stops right after the step.
"""
import hashlib
import signal
import threading

import numpy as np
import pytest

import cgru
from cgru import Cell, Network, Topology
from cgru.core import engine, plan
from cgru.core.backend import BACKEND
from cgru.core.kinds.gru import KIND as GRU_KIND

threadpoolctl = pytest.importorskip("threadpoolctl")

T, N, I, H = 5, 3, 4, 3
TOPO = Topology(I, H, 3, "bidirectional")          # three layers: faults hit layer 2 of 3


class Boom(RuntimeError):
    """The injected kernel error."""


def _digest(a):
    return hashlib.sha256(np.ascontiguousarray(a)).hexdigest()


def _problem(cell=Cell(), mask=False):
    rng = np.random.default_rng(3)
    params = Network.random(TOPO, np.float64, seed=4, cell=cell)
    x = rng.standard_normal((T, N, I))
    h0 = rng.standard_normal((TOPO.num_layer_directions, N, H))
    dy = rng.standard_normal((T, N, TOPO.output_size))
    dhy = rng.standard_normal(h0.shape)
    m = rng.uniform(0.5, 1.5, (T, N, TOPO.output_size)) if mask else None
    kw = dict(state_mask=m)
    fkw = dict(kw, lengths=np.array([5, 2, 0]), training=True, dropout=0.25, seed=(1, 2))
    return params, x, h0, dy, dhy, fkw, kw


class _Faulty:
    """Stands in for the GRU kind's kernels: the ``n``-th call of ``name`` raises ``exc``."""

    def __init__(self, real, name, n, exc):
        self.real, self.name, self.n, self.exc, self.calls = real, name, n, exc, 0

    def __getattr__(self, attr):
        fn = getattr(self.real, attr)
        if attr != self.name:
            return fn

        def wrapped(*args, **kw):
            self.calls += 1
            if self.calls == self.n:
                raise self.exc("injected fault")
            return fn(*args, **kw)
        return wrapped


def _blas_counts():
    return [lib.get_num_threads() for lib in
            threadpoolctl.ThreadpoolController().select(user_api="blas").lib_controllers]


@pytest.fixture
def blas_three():
    """BLAS at three threads during the test, so that a call with ``num_threads=1`` must
    change it and put it back."""
    with threadpoolctl.threadpool_limits(limits=3, user_api="blas"):
        yield _blas_counts()


EXCEPTIONS = [Boom, MemoryError, KeyboardInterrupt]
CELLS = {"default": (Cell(), False), "reset_before_mask": (Cell(reset_after=False), True)}


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("cell", list(CELLS))
def test_forward_fault_leaves_no_trace(monkeypatch, blas_three, exc, cell):
    params, x, h0, _, _, fkw, _ = _problem(*CELLS[cell])
    want = cgru.forward(params, x, h0, **fkw)
    inputs = [x, h0] + [a for lp in params for a in lp.arrays().values()]
    before = [_digest(a) for a in inputs]
    faulty = _Faulty(BACKEND.kernels(GRU_KIND), "forward_layer", 2, exc)
    monkeypatch.setitem(BACKEND._kernels, "gru", faulty)
    with pytest.raises(exc, match="injected fault"):
        cgru.forward(params, x, h0, **fkw, num_threads=1)
    assert faulty.calls == 2
    assert _blas_counts() == blas_three
    assert [_digest(a) for a in inputs] == before
    monkeypatch.setitem(BACKEND._kernels, "gru", faulty.real)
    got = cgru.forward(params, x, h0, **fkw, num_threads=1)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def _backward_fault(monkeypatch, where, exc):
    """Make a backward raise ``exc`` in its second time loop (``_kernels.backward_layer``: a
    block of time, or a layer) or in the weight-gradient step after it."""
    if where == "time_loop":
        faulty = _Faulty(BACKEND.kernels(GRU_KIND), "backward_layer", 2, exc)
        monkeypatch.setitem(BACKEND._kernels, "gru", faulty)
        return faulty
    real = engine._block_gradients
    calls = []

    def wrapped(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise exc("injected fault")
        return real(*args, **kw)
    monkeypatch.setattr(engine, "_block_gradients", wrapped)
    return calls


WHERE = ["time_loop", "weight_gradients"]


@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("cell", list(CELLS))
def test_backward_fault_leaves_inputs_reserve_and_blas_state_alone(monkeypatch, blas_three,
                                                                   exc, where, cell):
    params, x, h0, dy, dhy, fkw, kw = _problem(*CELLS[cell])
    f = cgru.forward(params, x, h0, **fkw)
    want = cgru.backward(params, x, f.reserve, dy, dhy, **kw)
    inputs = [x, dy, dhy, f.reserve] + [a for lp in params for a in lp.arrays().values()]
    before = [_digest(a) for a in inputs]
    _backward_fault(monkeypatch, where, exc)
    with pytest.raises(exc, match="injected fault"):
        cgru.backward(params, x, f.reserve, dy, dhy, **kw, num_threads=1)
    assert _blas_counts() == blas_three
    assert [_digest(a) for a in inputs] == before
    monkeypatch.undo()
    got = cgru.backward(params, x, f.reserve, dy, dhy, **kw, num_threads=1)
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got.dparams.flat(), want.dparams.flat())




@pytest.mark.parametrize("exc", EXCEPTIONS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("accumulate", [True, False], ids=["accumulate", "overwrite"])
def test_backward_fault_leaves_dparams_untouched(monkeypatch, exc, where, accumulate):
    params, x, h0, dy, dhy, fkw, kw = _problem()
    f = cgru.forward(params, x, h0, **fkw)
    grad = cgru.backward(params, x, f.reserve, dy, dhy, **kw).dparams
    dparams = Network.random(TOPO, np.float64, seed=9)       # gradients accumulated so far
    held = dparams.flat().copy()
    _backward_fault(monkeypatch, where, exc)
    with pytest.raises(exc, match="injected fault"):
        cgru.backward(params, x, f.reserve, dy, dhy, **kw, dparams=dparams,
                      accumulate=accumulate)
    np.testing.assert_array_equal(dparams.flat(), held)
    monkeypatch.undo()                                      # the training loop carries on
    cgru.backward(params, x, f.reserve, dy, dhy, **kw, dparams=dparams, accumulate=accumulate)
    np.testing.assert_allclose(dparams.flat(), held * accumulate + grad.flat(), rtol=1e-14,
                               atol=1e-15)


def test_backward_with_accumulate_adds_exactly_once_without_faults():
    """Positive control for the test above: with no fault, two accumulating calls add the
    gradient twice."""
    params, x, h0, dy, dhy, fkw, kw = _problem()
    f = cgru.forward(params, x, h0, **fkw)
    grad = cgru.backward(params, x, f.reserve, dy, dhy, **kw).dparams.flat()
    dparams = Network.random(TOPO, np.float64, seed=9)
    held = dparams.flat().copy()
    for _ in range(2):
        cgru.backward(params, x, f.reserve, dy, dhy, **kw, dparams=dparams, accumulate=True)
    np.testing.assert_allclose(dparams.flat(), held + 2 * grad, rtol=1e-13, atol=1e-14)


# --- real signals -------------------------------------------------------------------------------
# The kernels' test probe (cgru._kernels.loops.set_probe) raises a real SIGINT from inside the
# time loop at a given step, so these tests count steps and kernel calls instead of timing.
class _Counter:
    """Stands in for the GRU kind's kernels: counts the calls of each time-loop kernel."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __getattr__(self, attr):
        fn = getattr(self.real, attr)
        if attr not in ("forward_layer", "backward_layer"):
            return fn

        def counted(*args, **kw):
            self.calls.append(attr)
            return fn(*args, **kw)
        return counted


@pytest.fixture
def interrupt_at():
    """``interrupt_at(step)``: the next time loops raise SIGINT at processing step ``step``
    (work item 0); Python's default SIGINT handler (KeyboardInterrupt) is in place."""
    from cgru._kernels import loops
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield lambda step: loops.set_probe(step, action=1)
    loops.set_probe(-1)
    signal.signal(signal.SIGINT, old)


def _steps_done():
    from cgru._kernels import loops
    return loops.probe_state()["steps"]


T_LONG = 400


def _long_problem(layers, N=1, H=16):
    topo = Topology(8, H, layers)
    params = Network.random(topo, np.float32, seed=1)
    x = np.random.default_rng(2).standard_normal((T_LONG, N, 8)).astype(np.float32)
    return params, x


def test_interrupt_between_kernel_calls(monkeypatch, blas_three, interrupt_at):
    """A KeyboardInterrupt arriving in the first layer of a two-layer forward stops that
    layer's time loop at the next step and never starts the second layer; afterwards
    everything works as before."""
    params, x = _long_problem(2)
    small = Network.random(Topology(3, 2), np.float64, seed=5)
    xs = np.random.default_rng(6).standard_normal((4, 2, 3))
    want = cgru.forward(small, xs, training=True)
    counter = _Counter(BACKEND.kernels(GRU_KIND))
    monkeypatch.setitem(BACKEND._kernels, "gru", counter)
    interrupt_at(10)
    with pytest.raises(KeyboardInterrupt):
        cgru.forward(params, x, num_threads=1)
    assert counter.calls == ["forward_layer"]           # the second layer never ran
    assert _steps_done() == 11                          # stopped at the step after the signal
    assert _blas_counts() == blas_three
    got = cgru.forward(small, xs, training=True)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("fn", ["forward", "backward"])
def test_interrupt_inside_one_long_time_loop(monkeypatch, interrupt_at, fn, num_threads):
    """A KeyboardInterrupt in the middle of one layer's time loop stops it at exactly the next
    step, on one thread or two (the caller polls, every work item sees the abort), forward and
    backward."""
    params, x = _long_problem(1, N=32)                  # 2 batch chunks: 2 work items
    monkeypatch.setattr(plan, "_MIN_PARALLEL_WORK", 0)  # a second thread even for this size
    f = cgru.forward(params, x, training=True)
    interrupt_at(T_LONG // 4)
    with pytest.raises(KeyboardInterrupt):
        if fn == "forward":
            cgru.forward(params, x, num_threads=num_threads)
        else:
            cgru.backward(params, x, f.reserve, np.ones_like(f.y), num_threads=num_threads)
    from cgru._kernels import loops
    assert not loops.probe_state()["timed_out"]
    assert _steps_done() == T_LONG // 4 + 1              # stopped right after the signal


@pytest.fixture
def interrupt_gemm_at():
    """``interrupt_gemm_at(chunk)``: SIGINT is raised as the whole-sequence GEMMs' sub-chunk
    ``chunk`` (counted over the call) starts; sub-chunks of 2^16 flops and at least 64 rows
    (for tests)."""
    from cgru._kernels import blas
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    old_flops, old_rows = blas.gemm_chunk_flops(1 << 16, min_rows=64)
    yield blas.gemm_probe
    blas.gemm_probe(-1)
    blas.gemm_chunk_flops(old_flops, old_rows)
    signal.signal(signal.SIGINT, old)


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("fn", ["forward", "backward"])
def test_interrupt_inside_a_whole_sequence_gemm(interrupt_gemm_at, fn, num_threads):
    """Ctrl-C during a whole-sequence product (the input projection, dW, dX) stops it within a
    sub-chunk per thread: the GEMMs run as sub-chunks of bounded size, with the signal handlers
    run between them (a run used to go on 11.8 s after SIGINT).  Counts sub-chunks."""
    from cgru._kernels import blas
    topo = Topology(64, 32, 1)
    params = Network.random(topo, np.float32, seed=1)
    x = np.random.default_rng(2).standard_normal((256, 8, 64)).astype(np.float32)
    f = cgru.forward(params, x, training=True)
    run = (lambda: cgru.forward(params, x, num_threads=num_threads)) if fn == "forward" else \
        (lambda: cgru.backward(params, x, f.reserve, np.ones_like(f.y),
                               num_threads=num_threads))
    interrupt_gemm_at(10 ** 9)                   # counting only: how many sub-chunks a call has
    run()
    total = blas.gemm_probe_chunks()
    assert total >= 30, total
    interrupt_gemm_at(3)
    with pytest.raises(KeyboardInterrupt):
        run()
    assert blas.gemm_probe_chunks() <= 3 + 1 + num_threads   # the others stopped at once
    got = cgru.forward(params, x, training=True)         # and everything works afterwards
    np.testing.assert_array_equal(got.y, f.y)
