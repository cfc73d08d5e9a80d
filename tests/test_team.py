"""Thread teams (cgru/_kernels/team.h): when a layer has one time loop (one direction, a small
batch) the spare threads share its per-step products.  The results must be bitwise those of one
thread, for every cell kind and path through the loops (both GRU candidate forms, masks,
lengths with zeros, the LSTM projection and peepholes, reverse direction, backward), and a
Ctrl-C must stop a teamed loop as promptly as any other.  Each test checks that a team ran."""
import signal
import threading

import numpy as np
import pytest

import cgru
from cgru import GRUCell, LSTMCell, Network, RNNCell, Topology
from cgru._kernels import loops
from cgru.core import plan


@pytest.fixture
def teams(monkeypatch):
    """Every loop that can have a team gets one (whatever its size); yields the team count."""
    monkeypatch.setattr(plan, "_MIN_PARALLEL_WORK", 0)
    old = loops.team_min_work(0)
    yield loops.team_jobs
    loops.team_min_work(old)


CASES = {
    "gru": (GRUCell(), {}),
    "gru_reset_before_mask": (GRUCell(reset_after=False, g="softsign", clip=2.0),
                              {"mask": True}),
    "gru_flip_z_reverse": (GRUCell(flip_z=True), {"direction": "reverse"}),
    "lstm": (LSTMCell(), {}),
    "lstm_projection_peepholes": (LSTMCell(peepholes=True), {"proj": 5}),
    "lstm_ifgo_input_forget_mask": (LSTMCell(peepholes="ifgo", input_forget=True),
                                    {"mask": True, "direction": "reverse"}),
    "rnn_relu": (RNNCell("relu"), {}),
    "rnn_general_mask": (RNNCell(("leaky_relu", 0.1), clip=1.5), {"mask": True}),
}


def _problem(cell, dtype, N, direction="forward", proj=0, mask=False, L=2, T=9, H=40):
    topo = Topology(7, H, L, direction, proj_size=proj)
    net = Network.random(topo, dtype, seed=3, cell=cell)
    rng = np.random.default_rng(4)
    S, D = topo.state_size, topo.num_directions
    a = dict(x=rng.standard_normal((T, N, 7)).astype(dtype),
             h0=rng.standard_normal((L * D, N, S)).astype(dtype),
             lengths=np.array(([T, 0, T - 3, 1] * N)[:N]))
    if cell.kind == "lstm":
        a["c0"] = rng.standard_normal((L * D, N, H)).astype(dtype)
    if mask:
        a["state_mask"] = rng.uniform(0.5, 1.5, (T, N, D * S)).astype(dtype)
    return net, a


def _run(net, a, nt):
    f = cgru.forward(net, a["x"], a["h0"], c0=a.get("c0"), lengths=a["lengths"],
                     state_mask=a.get("state_mask"), training=True, num_threads=nt)
    rng = np.random.default_rng(5)
    dy = rng.standard_normal(f.y.shape).astype(net.dtype)
    dhy = rng.standard_normal(f.hy.shape).astype(net.dtype)
    dcy = None if f.cy is None else rng.standard_normal(f.cy.shape).astype(net.dtype)
    g = cgru.backward(net, a["x"], f.reserve, dy, dhy, dcy=dcy, state_mask=a.get("state_mask"),
                      num_threads=nt)
    inf = cgru.forward(net, a["x"], a["h0"], c0=a.get("c0"), lengths=a["lengths"],
                       state_mask=a.get("state_mask"), num_threads=nt)
    out = [f.y, f.hy, f.reserve, g.dx, g.dh0, g.dparams.flat(), inf.y, inf.hy]
    if f.cy is not None:
        out += [f.cy, g.dc0, inf.cy]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("N", [1, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_teams_give_the_bits_of_one_thread(teams, case, N, dtype):
    cell, kw = CASES[case]
    net, a = _problem(cell, dtype, N, **kw)
    want = _run(net, a, 1)
    before = teams()
    for nt in (2, 3, 4):
        got = _run(net, a, nt)
        for i, (u, v) in enumerate(zip(want, got)):
            assert np.array_equal(u, v), (nt, i)
    # every layer's forward (training and inference) and backward loop had a team
    assert teams() - before >= 3 * 3 * net.topology.num_layers


def test_no_team_below_the_size_rule_and_for_several_loops(monkeypatch):
    """The default rule: a small product, or a layer with several loops (two directions, two
    batch chunks), runs without a team; a large one-loop layer gets one."""
    monkeypatch.setattr(plan, "_MIN_PARALLEL_WORK", 0)
    rng = np.random.default_rng(0)
    small = Network.random(Topology(4, 8), np.float32)
    large = Network.random(Topology(4, 256), np.float32)
    bidi = Network.random(Topology(4, 256, 1, "bidirectional"), np.float32)
    for net, N, teamed in ((small, 1, False), (large, 1, True), (bidi, 1, False),
                           (large, 64, False)):
        before = loops.team_jobs()
        cgru.forward(net, rng.standard_normal((3, N, 4)).astype(np.float32), num_threads=2)
        assert (loops.team_jobs() > before) == teamed, (net.topology, N)


def test_a_stream_uses_the_team_and_keeps_its_bits(teams):
    net = Network.random(Topology(6, 48, 2), np.float32, cell=LSTMCell())
    x = np.random.default_rng(1).standard_normal((5, 1, 6)).astype(np.float32)
    want = cgru.Stream(net, num_threads=1).step(x)
    before = teams()
    got = cgru.Stream(net, num_threads=2).step(x)
    assert teams() > before
    np.testing.assert_array_equal(got[0], want[0])
    for u, v in zip(got[1], want[1]):
        np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("fn", ["forward", "backward"])
def test_ctrl_c_stops_a_teamed_loop_at_the_next_step(teams, fn):
    """The calling thread runs the teamed loop itself, so it sees a KeyboardInterrupt at the
    next step exactly as without a team; the helpers end with it."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread only")
    T = 400
    net = Network.random(Topology(8, 64), np.float32, seed=1)
    x = np.random.default_rng(2).standard_normal((T, 1, 8)).astype(np.float32)
    f = cgru.forward(net, x, training=True)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        loops.set_probe(T // 4, action=1)
        before = teams()
        with pytest.raises(KeyboardInterrupt):
            if fn == "forward":
                cgru.forward(net, x, num_threads=2)
            else:
                cgru.backward(net, x, f.reserve, np.ones_like(f.y), num_threads=2)
        assert teams() > before
        assert loops.probe_state()["steps"] == T // 4 + 1
    finally:
        loops.set_probe(-1)
        signal.signal(signal.SIGINT, old)
    again = cgru.forward(net, x, num_threads=2)           # the teams still work
    np.testing.assert_array_equal(again.y, cgru.forward(net, x, num_threads=1).y)


def test_concurrent_teamed_calls_from_threads(teams):
    """Several calling threads, each with a one-loop layer and spare threads: every call
    gets the result it gets alone (a helper serves one team at a time)."""
    nets = [Network.random(Topology(5, 64, 1), np.float32, seed=s, cell=c)
            for s, c in enumerate([GRUCell(), LSTMCell(), RNNCell("tanh")])]
    xs = [np.random.default_rng(s).standard_normal((30, 2, 5)).astype(np.float32)
          for s in range(3)]
    want = [cgru.forward(n, x, num_threads=1).y for n, x in zip(nets, xs)]
    errors, got = [], [None] * 3

    def work(i):
        try:
            for _ in range(20):
                got[i] = cgru.forward(nets[i], xs[i], num_threads=3).y
                assert np.array_equal(got[i], want[i])
        except BaseException as e:          # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a teamed call hung"
    assert not errors, errors


def test_a_large_layer_keeps_a_few_dozen_rows_in_one_teamed_loop():
    """H ≥ 768 and N < 48: one batch chunk (the packed GEMM is faster on all the rows) and a
    team across the threads, still bitwise one thread's result."""
    net = Network.random(Topology(16, 768), np.float32, seed=2)
    rng = np.random.default_rng(3)
    a = dict(x=rng.standard_normal((3, 20, 16)).astype(np.float32),
             h0=rng.standard_normal((1, 20, 768)).astype(np.float32),
             lengths=np.array([3, 1, 0, 2] * 5))
    assert plan.n_chunks(20, 768) == 1
    want = _run(net, a, 1)
    before = loops.team_jobs()
    got = _run(net, a, 2)
    assert loops.team_jobs() > before
    for i, (u, v) in enumerate(zip(want, got)):
        assert np.array_equal(u, v), i
