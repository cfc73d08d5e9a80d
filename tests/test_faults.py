"""Faults survived: an exception in the middle of a call, and a KeyboardInterrupt.

The guarantee tested here (the strong exception guarantee): when ``forward`` or ``backward``
raises — an error from a kernel, a ``MemoryError``, a ``KeyboardInterrupt`` — every buffer the
caller owns is exactly as it was before the call: the inputs, the reserve, and ``dparams``
(whose accumulated gradients must neither be half-added nor half-overwritten: a training
loop that catches the exception and carries on must not double-count a layer), and the
process state the engine touches (the BLAS thread count) is restored.  A later call then
gives bitwise the results of an undisturbed one.  Faults are injected deterministically at
the second layer of a multi-layer call by wrapping ``engine._kernels`` (or the per-layer
gradient step); the real-signal tests use ``signal.setitimer``.

A ``KeyboardInterrupt`` arriving while a time loop runs (in C, without the GIL) is noticed by
the loop itself: the calling thread runs Python's signal handlers every 50 ms and stops every
work item.  ``test_interrupt_between_kernel_calls`` bounds the latency between kernel calls,
``test_interrupt_inside_one_long_time_loop`` inside one.
"""
import hashlib
import signal
import threading
import time

import numpy as np
import pytest

import cgru
from cgru import Cell, Params, Topology, engine

threadpoolctl = pytest.importorskip("threadpoolctl")

T, N, I, H = 5, 3, 4, 3
TOPO = Topology(I, H, 3, "bidirectional")          # three layers: faults hit layer 2 of 3


class Boom(RuntimeError):
    """The injected kernel error."""


def _digest(a):
    return hashlib.sha256(np.ascontiguousarray(a)).hexdigest()


def _problem(cell=Cell(), mask=False):
    rng = np.random.default_rng(3)
    params = Params.random(TOPO, np.float64, seed=4)
    x = rng.standard_normal((T, N, I))
    h0 = rng.standard_normal((TOPO.num_layer_directions, N, H))
    dy = rng.standard_normal((T, N, TOPO.output_size))
    dhy = rng.standard_normal(h0.shape)
    m = rng.uniform(0.5, 1.5, (T, N, TOPO.output_size)) if mask else None
    kw = dict(cell=cell, state_mask=m)
    fkw = dict(kw, lengths=np.array([5, 2, 0]), training=True, dropout=0.25, seed=(1, 2))
    return params, x, h0, dy, dhy, fkw, kw


class _Faulty:
    """Stands in for ``engine._kernels``: the ``n``-th call of ``name`` raises ``exc``."""

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
    faulty = _Faulty(engine._kernels, "forward_layer", 2, exc)
    monkeypatch.setattr(engine, "_kernels", faulty)
    with pytest.raises(exc, match="injected fault"):
        cgru.forward(params, x, h0, **fkw, num_threads=1)
    assert faulty.calls == 2
    assert _blas_counts() == blas_three
    assert [_digest(a) for a in inputs] == before
    monkeypatch.setattr(engine, "_kernels", faulty.real)
    got = cgru.forward(params, x, h0, **fkw, num_threads=1)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def _backward_fault(monkeypatch, where, exc):
    """Make the second layer of a backward raise ``exc``: in its time loop
    (``_kernels.backward_layer``) or after it, in its weight-gradient step."""
    if where == "time_loop":
        faulty = _Faulty(engine._kernels, "backward_layer", 2, exc)
        monkeypatch.setattr(engine, "_kernels", faulty)
        return faulty
    real = engine._layer_gradients
    calls = []

    def wrapped(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise exc("injected fault")
        return real(*args, **kw)
    monkeypatch.setattr(engine, "_layer_gradients", wrapped)
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
    dparams = Params.random(TOPO, np.float64, seed=9)       # gradients accumulated so far
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
    dparams = Params.random(TOPO, np.float64, seed=9)
    held = dparams.flat().copy()
    for _ in range(2):
        cgru.backward(params, x, f.reserve, dy, dhy, **kw, dparams=dparams, accumulate=True)
    np.testing.assert_allclose(dparams.flat(), held + 2 * grad, rtol=1e-13, atol=1e-14)


# --- real signals -------------------------------------------------------------------------------
class _Timer:
    """Stands in for ``engine._kernels``: records every kernel call's duration."""

    def __init__(self, real):
        self.real, self.durations = real, []

    def __getattr__(self, attr):
        fn = getattr(self.real, attr)
        if attr not in ("forward_layer", "backward_layer"):
            return fn

        def timed(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.durations.append(time.perf_counter() - t0)
        return timed


def _interrupt_after(seconds, call):
    """Run ``call`` with SIGALRM → KeyboardInterrupt after ``seconds``: ``(interrupted,
    latency)`` — latency from the alarm to the moment control is back here."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")

    def handler(signum, frame):
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGALRM, handler)
    try:
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            call()
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        latency = time.perf_counter() - (t0 + seconds)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return interrupted, latency


def _long_problem(layers, T_long):
    """A problem whose every time loop takes ~0.2–0.5 s on one thread (H = 1024, N = 1)."""
    topo = Topology(16, 1024, layers)
    params = Params.random(topo, np.float32, seed=1)
    x = np.random.default_rng(2).standard_normal((T_long, 1, 16)).astype(np.float32)
    return params, x


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def test_interrupt_between_kernel_calls(monkeypatch, blas_three):
    """A KeyboardInterrupt during a two-layer forward returns control no later than the end
    of the kernel call it arrived in; afterwards everything works as before."""
    params, x = _long_problem(2, 300)
    small = Params.random(Topology(3, 2), np.float64, seed=5)
    xs = np.random.default_rng(6).standard_normal((4, 2, 3))
    want = cgru.forward(small, xs, training=True)
    timer = _Timer(engine._kernels)
    monkeypatch.setattr(engine, "_kernels", timer)
    cgru.forward(params, x, num_threads=1)                  # how long one time loop takes
    longest = max(timer.durations)
    assert longest > 0.05, "the problem is too small to interrupt"
    interrupted, latency = _interrupt_after(
        0.5 * longest, lambda: cgru.forward(params, x, num_threads=1))
    assert interrupted
    assert latency <= 1.5 * longest + 0.25, (latency, longest)
    assert _blas_counts() == blas_three
    got = cgru.forward(small, xs, training=True)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def test_interrupt_inside_one_long_time_loop(monkeypatch):
    params, x = _long_problem(1, 1500)
    timer = _Timer(engine._kernels)
    monkeypatch.setattr(engine, "_kernels", timer)
    interrupted, latency = _interrupt_after(0.05, lambda: cgru.forward(params, x,
                                                                       num_threads=1))
    assert interrupted
    # the loop polls every 50 ms; without polling this took 0.5-2 s (the whole loop)
    assert latency < 0.3, f"control came back {latency:.2f} s after the interrupt"
