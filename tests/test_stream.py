"""cgru.Stream: a network stepped through time, a few steps per call, state in and out.

Compared with ``cgru.forward`` on the whole sequence, bit for bit (every kind, several layers,
one step or chunks per call, shapes whose products ``forward`` splits into blocks and row
blocks, other thread counts), the snapshot semantics (``refresh``), and bad input.  Nothing here times
anything: the per-call overhead is the benchmark's business.

Every test runs with the ``poison`` fixture: the outputs and the workspace of both the stream and
``cgru.forward`` start as NaN, so an element either leaves unwritten fails a comparison (the
results are checked finite too, so that both leaving the same element cannot pass).
"""
import numpy as np
import pytest

import cgru
from cgru import GRUCell, LSTMCell, Network, RNNCell, Stream, Topology

pytestmark = pytest.mark.usefixtures("poison")

CELLS = {"gru": GRUCell(), "gru_rb": GRUCell(reset_after=False, g="softsign"),
         "lstm": LSTMCell(), "lstm_peep": LSTMCell(peepholes=True),
         "lstm_peep_ifgo": LSTMCell(peepholes="ifgo"),
         "rnn_relu": RNNCell("relu")}


def _problem(kind, dtype, L=2, proj=0, N=3, T=7):
    topo = Topology(5, 6, L, proj_size=proj)
    net = Network.random(topo, dtype, seed=1, cell=CELLS[kind])
    rng = np.random.default_rng(2)
    x = rng.standard_normal((T, N, 5)).astype(dtype)
    h0 = rng.standard_normal((L, N, topo.state_size)).astype(dtype)
    c0 = rng.standard_normal((L, N, 6)).astype(dtype) if net.cell.has_cell_state else None
    return net, x, h0, c0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("chunk", [1, 3, 7])
@pytest.mark.parametrize("kind,proj", [("gru", 0), ("gru_rb", 0), ("lstm", 0), ("lstm", 4),
                                       ("lstm_peep", 0), ("rnn_relu", 0)])
def test_steps_equal_the_whole_sequence(kind, proj, chunk, dtype):
    net, x, h0, c0 = _problem(kind, dtype, proj=proj)
    want = cgru.forward(net, x, h0, c0=c0)
    stream = Stream(net)
    state = (h0, c0) if c0 is not None else h0
    ys = []
    for t in range(0, x.shape[0], chunk):
        xt = x[t] if chunk == 1 else x[t:t + chunk]
        y, state = stream.step(xt, state)
        assert y.shape == (xt.shape[:-1] + (net.topology.state_size,))
        ys.append(y[None] if chunk == 1 else y)
    np.testing.assert_array_equal(np.concatenate(ys), want.y)
    h = state[0] if c0 is not None else state
    np.testing.assert_array_equal(h, want.hy)
    if c0 is not None:
        np.testing.assert_array_equal(state[1], want.cy)
    assert all(np.isfinite(a).all() for a in (*ys, *(state if c0 is not None else (state,))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["gru", "lstm", "rnn_relu"])
def test_a_long_sequence_bitwise_in_any_cut(kind, dtype):
    """Rows enough that ``forward`` splits its input projection into blocks, row blocks and
    sub-chunks (T·N = 800 rows of 300 inputs), a batch the time loop splits into chunks, and
    other thread counts on either side: the stream's one-step products still give the same
    bits."""
    from cgru._kernels import blas
    topo = Topology(300, 40, 2)
    T, N = 40, 20
    net = Network.random(topo, dtype, seed=3, cell=CELLS[kind])
    rng = np.random.default_rng(4)
    x = rng.standard_normal((T, N, 300)).astype(dtype)
    old = blas.gemm_chunk_flops(1 << 20, 64)        # sub-chunks of 64 rows
    try:
        want = cgru.forward(net, x, num_threads=2)
    finally:
        blas.gemm_chunk_flops(*old)
    for cut, threads in ((1, 1), (13, 2), (T, 1)):
        stream, state, ys = Stream(net, num_threads=threads), None, []
        for t in range(0, T, cut):
            y, state = stream.step(x[t:t + cut], state)
            ys.append(y)
        np.testing.assert_array_equal(np.concatenate(ys), want.y, err_msg=f"cut {cut}")
        h = state[0] if net.cell.has_cell_state else state
        np.testing.assert_array_equal(h, want.hy)
        assert np.isfinite(want.y).all() and np.isfinite(h).all()


def test_state_none_means_zeros_and_results_are_reproducible():
    net, x, _, _ = _problem("gru", np.float32)
    s = Stream(net)
    a = s.step(x[0])
    b = s.step(x[0], np.zeros((2, 3, 6), np.float32))
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_the_stream_is_a_snapshot_until_refresh():
    net, x, h0, _ = _problem("gru", np.float64, L=1)
    s = Stream(net)
    before = s.step(x[0], h0)[0]
    net[0].R[...] *= 0.5                        # the weights change in place
    np.testing.assert_array_equal(s.step(x[0], h0)[0], before)      # the snapshot
    s.refresh()
    after = s.step(x[0], h0)[0]
    np.testing.assert_array_equal(after, cgru.forward(net, x[:1], h0).y[0])
    assert not np.allclose(after, before)


def test_bad_input():
    net, x, h0, _ = _problem("lstm", np.float32, L=1)
    s = Stream(net)
    with pytest.raises(TypeError, match="^x: expected dtype float32"):
        s.step(x[0].astype(np.float64))
    with pytest.raises(ValueError, match=r"^x: expected \[N, I=5\]"):
        s.step(x[0, :, :4])
    with pytest.raises(TypeError, match=r"^state: expected None or the \(h, c\) pair"):
        s.step(x[0], h0)
    with pytest.raises(ValueError, match=r"^state h: expected shape \[L·D=1, N=3, H=6\]"):
        s.step(x[0], (h0[:, :2], None))
    with pytest.raises(ValueError, match="^net: a Stream runs forward in time"):
        Stream(Network.random(Topology(5, 6, 1, "bidirectional"), np.float32))
    with pytest.raises(TypeError, match="^net: expected a cgru.Network"):
        Stream("gru")


@pytest.mark.parametrize("kind", ["gru", "lstm", "rnn"])
def test_steps_in_blocks_of_time_are_the_whole_sequences_bits(monkeypatch, kind):
    """A step of many time steps runs, as ``cgru.forward`` does, in blocks of time
    (``plan.time_block``), each block's input projection then its steps: forced to blocks of
    one and of three steps, a stream's steps (cut into 1, 5 and all 17 steps) give bitwise the
    outputs and states of one whole-sequence forward in one block."""
    from cgru.core import plan
    cell = {"gru": GRUCell(), "lstm": LSTMCell(), "rnn": RNNCell()}[kind]
    net = Network.random(Topology(5, 7, 2), np.float32, seed=4, cell=cell)
    x = np.random.default_rng(5).standard_normal((17, 3, 5)).astype(np.float32)
    want = cgru.forward(net, x)
    for rows in (3, 9):
        monkeypatch.setattr(plan, "_BLOCK_ROWS", rows)
        monkeypatch.setattr(plan, "_MAX_BLOCK_ROWS", rows)
        cgru.release_memory()
        assert plan.time_block(17, 3, plan.wgrad_size(net.topology, cell.gates)) == rows // 3
        for cut in (1, 5, 17):
            stream, state, ys = Stream(net), None, []
            for t in range(0, 17, cut):
                y, state = stream.step(x[t:t + cut], state)
                ys.append(y)
            np.testing.assert_array_equal(np.concatenate(ys), want.y)
            h = state[0] if kind == "lstm" else state
            np.testing.assert_array_equal(h, want.hy)
    cgru.release_memory()
