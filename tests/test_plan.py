"""cgru.core.plan: the work split and the buffers of a call, and the pool of recycled blocks.

The pool hands a workspace block or a reserve out again only when nothing refers to it any
more: a reserve the caller still holds is never overwritten by the next call.
"""
import numpy as np
import pytest

import cgru
from cgru.core import plan


@pytest.fixture(autouse=True)
def fresh_pool():
    cgru.release_memory()
    yield
    cgru.release_memory()


def _net_and_x():
    net = cgru.Network.random(cgru.Topology(4, 6, 2), np.float64, seed=1, cell=cgru.GRUCell())
    x = np.random.default_rng(2).standard_normal((5, 3, 4))
    return net, x


def test_a_released_reserve_is_reused_and_a_held_one_never(monkeypatch):
    net, x = _net_and_x()
    f1 = cgru.forward(net, x, training=True)
    held = f1.reserve
    addr = held.ctypes.data
    snapshot = held.copy()
    f2 = cgru.forward(net, x * 2, training=True)           # f1's reserve is still held
    assert f2.reserve.ctypes.data != addr
    np.testing.assert_array_equal(held, snapshot)          # untouched
    f2_reserve = f2.reserve.ctypes.data
    del f1, held
    fresh = _counting_fresh_blocks(monkeypatch)
    f3 = cgru.forward(net, x, training=True)               # now free: handed out again
    # (the reserve or the workspace: the pool picks among the idle blocks of a size class)
    assert fresh == [] and f3.reserve.ctypes.data != f2_reserve
    np.testing.assert_array_equal(f3.reserve, snapshot)    # and written as by a fresh call
    g = cgru.backward(net, x, f3.reserve, np.ones_like(f3.y))
    assert np.isfinite(g.dx).all()


def test_a_view_keeps_a_reserve_from_reuse():
    net, x = _net_and_x()
    f = cgru.forward(net, x, training=True)
    view = f.reserve[16:]
    addr = f.reserve.ctypes.data
    del f
    f2 = cgru.forward(net, x, training=True)
    assert f2.reserve.ctypes.data != addr
    assert view.base is not None


def test_a_reserve_made_read_only_is_writable_again_when_reused(monkeypatch):
    # its block goes back to the pool, and the next call of the shape takes it (as its reserve
    # or as its workspace: the pool picks among the idle blocks of a size class) writable
    net, x = _net_and_x()
    f = cgru.forward(net, x, training=True)
    f.reserve.flags.writeable = False
    want = f.reserve.copy()
    del f
    fresh = _counting_fresh_blocks(monkeypatch)
    f2 = cgru.forward(net, x, training=True)
    assert fresh == [] and f2.reserve.flags.writeable
    np.testing.assert_array_equal(f2.reserve, want)


def test_the_pool_is_bounded_and_can_be_emptied(monkeypatch):
    monkeypatch.setattr(plan, "POOL_BYTES", 1 << 20)
    blocks = [plan.recycled(200_000) for _ in range(8)]       # all held: all new
    assert len({b.ctypes.data for b in blocks}) == 8
    assert plan.pool_state() == (0, 0)                        # nothing idle while held
    del blocks                                                # 8 × 200,704-byte blocks idle
    n, nbytes = plan.pool_state()
    assert plan.size_class(200_000) == 200_704
    assert nbytes <= 1 << 20 and n == 5                       # the oldest left beyond the bound
    plan.recycled(1_200_000)                                   # above POOL_BYTES: unpooled
    assert plan.pool_state() == (n, nbytes)
    cgru.release_memory()
    assert plan.pool_state() == (0, 0)


def test_new_blocks_are_at_most_a_thirty_second_larger():
    for n in list(range(1, 20_000, 97)) + [2 ** k + j for k in range(12, 40) for j in (-1, 0, 1)]:
        c = plan.size_class(n)
        assert n <= c <= max(plan._MIN_CLASS, n + n // 32 + 1), n
        assert plan.size_class(c) == c                        # a class is its own class
    assert plan.size_class(33 << 20) == 33 << 20 and plan.size_class((33 << 20) + 1) == 34 << 20


def test_an_idle_block_serves_a_request_it_holds_with_at_most_a_quarter_to_spare(monkeypatch):
    """The smallest idle block that holds a request serves it when at most a quarter larger;
    else a new block of about the size asked for is made (not one a size class larger: a
    training step's peak memory counts every byte of its blocks)."""
    fresh = _counting_fresh_blocks(monkeypatch)
    big, mid = plan.recycled(400_000), plan.recycled(300_000)
    assert fresh == [plan.size_class(400_000), plan.size_class(300_000)]
    where = {"big": big.ctypes.data, "mid": mid.ctypes.data}
    del big, mid
    a = plan.recycled(290_000)                     # both hold it: the smaller one
    assert a.ctypes.data == where["mid"] and len(fresh) == 2
    b = plan.recycled(200_000)                     # the big one idle, but twice the size
    assert b.ctypes.data != where["big"] and fresh[2:] == [plan.size_class(200_000)]
    c = plan.recycled(330_000)                     # a fifth less than the big one
    assert c.ctypes.data == where["big"] and len(fresh) == 3
    d = plan.recycled(300_000, exact=True)         # an output: whole pages, only that size
    assert fresh[3:] == [-(-300_000 // 4096) * 4096]
    del a, b, c, d


def _counting_fresh_blocks(monkeypatch):
    """The sizes of the fresh blocks the pool makes from now on."""
    fresh = []
    real = plan._fresh_block

    def counting(nbytes):
        fresh.append(nbytes)
        return real(nbytes)
    monkeypatch.setattr(plan, "_fresh_block", counting)
    return fresh


def test_large_outputs_come_from_the_pool_and_go_back(monkeypatch):
    """Outputs from ``POOLED_OUTPUT_BYTES`` on are pooled blocks of their size (whole pages), so
    a training loop's gradients, freed and made again every step, reuse the same memory instead
    of having the C library return it to the system and fault it in again; the results are
    those of fresh arrays, bit for bit."""
    net, x = _net_and_x()
    dy = np.random.default_rng(4).standard_normal(cgru.forward(net, x).y.shape)

    def step():
        f = cgru.forward(net, x, training=True)
        g = cgru.backward(net, x, f.reserve, dy)
        return [f.y, f.hy, g.dx, g.dh0] + [a for lp in g.dparams for a in lp.arrays().values()]
    monkeypatch.setattr(plan, "_reuse", False)
    want = step()
    monkeypatch.setattr(plan, "_reuse", True)
    monkeypatch.setattr(plan, "POOLED_OUTPUT_BYTES", 64)
    got = step()
    big = [a for a in got if a.nbytes >= 64]
    assert big and all(a.base is not None for a in big)         # over pooled blocks
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    addresses = sorted(a.ctypes.data for a in big)
    del got, big
    fresh = _counting_fresh_blocks(monkeypatch)
    again = step()
    assert fresh == []                                          # every block reused
    assert sorted(a.ctypes.data for a in again if a.nbytes >= 64) == addresses
    assert all(np.array_equal(a, b) for a, b in zip(again, want))
    assert plan.recycled(5000, exact=True).base.obj.size == 8192  # whole pages, no size class


def test_blocks_of_nearby_sizes_are_shared(monkeypatch):
    """Dynamic padding: training steps whose T varies every step reuse the pool's blocks
    instead of faulting in new ones.  Counts the fresh blocks made (the pool used to reuse a
    block only for exactly the same size, and kept up to 512 MiB of blocks it never reused)."""
    fresh = _counting_fresh_blocks(monkeypatch)
    net = cgru.Network.random(cgru.Topology(8, 16, 2), np.float32, seed=1)
    rng = np.random.default_rng(3)
    for step in range(300):
        T = int(rng.integers(10, 200))
        x = rng.standard_normal((T, 4, 8)).astype(np.float32)
        f = cgru.forward(net, x, training=True)
        cgru.backward(net, x, f.reserve, np.ones_like(f.y))
        del f
    n, nbytes = plan.pool_state()
    assert nbytes <= plan.POOL_BYTES
    # 300 steps over 190 distinct T: a few blocks per size class (T spans ~4.3 octaves)
    assert len(fresh) <= 90, len(fresh)


def test_the_pool_does_not_count_references():
    """A block is idle once the array handed out and all its views are gone — known from the
    array's own finalisation, not from ``sys.getrefcount`` (unsafe without a GIL)."""
    import inspect
    assert "getrefcount" not in inspect.getsource(plan)
    block = plan.recycled(10_000)
    view = block[100:200].view(np.int32)
    del block
    assert plan.pool_state() == (0, 0)                        # the view holds it
    del view
    assert plan.pool_state()[0] == 1


def test_blocks_of_time_are_long_for_small_layers_and_for_large_weight_gradients():
    def wgrad(H, G=3):
        return plan.wgrad_size(cgru.Topology(H, H), G)
    assert wgrad(256) < plan._LARGE_WGRAD <= wgrad(512)
    assert plan.time_block(100, 32, wgrad(256)) == 15            # 480 rows
    assert plan.time_block(100, 32, wgrad(512)) == 25            # 800 rows: large gradients
    assert plan.time_block(200, 16, wgrad(128)) == 40            # 640 rows: 2^26 multiply-adds
    assert plan.time_block(100, 32, wgrad(8)) == plan.time_block(100, 32) == 25
    assert plan.time_block(7, 1, wgrad(512)) == 7
    assert plan.wgrad_size(cgru.Topology(8, 16, 2, "bidirectional"), 4) == 64 * (32 + 16)


def test_n_chunks_and_loop_threads_depend_on_shapes_only():
    assert [plan.n_chunks(n) for n in (1, 15, 16, 32, 48, 64, 1000)] == [1, 1, 2, 2, 3, 4, 4]
    assert [plan.n_chunks(n, 1024) for n in (20, 47, 48)] == [1, 1, 3]
    # one chunk per thread or direction (a row's bits do not depend on its chunk: test_engine's
    # test_thread_count_does_not_change_results runs one and two chunks)
    assert [plan.loop_chunks(n, 256, 1) for n in (1, 32, 1000)] == [1, 1, 1]
    assert [plan.loop_chunks(n, 256, 2) for n in (1, 32, 1000)] == [1, 2, 4]
    assert [plan.loop_chunks(n, 256, 2, 2) for n in (1, 32, 1000)] == [1, 1, 1]  # a thread each
    assert plan.loop_threads(2, 1, 1, 8, 1, 3) == 1           # too small for a second thread
    assert plan.loop_threads(2, 100, 32, 256, 1, 3) == 2




# --- one workspace per call ------------------------------------------------------------------
_CALL_CASES = [
    # (cell, topology, T, N, lengths, state_mask): several batch chunks, padding, a mask, two
    # layers both ways, a projection, several blocks of time (plan.time_block); blocks of
    # ≥ 1024 rows (N = 700: 2 steps) so that the weight-gradient products split their k
    (cgru.GRUCell(), cgru.Topology(5, 8, 2, direction="bidirectional"), 5, 700, "padded", False),
    (cgru.LSTMCell(), cgru.Topology(5, 8, 1, proj_size=3), 4, 700, None, True),
    (cgru.RNNCell(), cgru.Topology(5, 8, 2), 5, 700, "padded", False),
]


@pytest.mark.parametrize("cell,topo,T,N,lengths,masked", _CALL_CASES,
                         ids=["gru", "lstm", "rnn"])
def test_a_call_allocates_one_workspace_and_nothing_below_it(monkeypatch, cell, topo, T, N,
                                                               lengths, masked):
    """Every temporary of a forward or backward — the kernels' scratch and the weight
    gradients' packs included — is a view of one workspace block per call:
    ``Workspace.allocate`` runs once, and every weight-gradient product is handed its pack
    (it would allocate one otherwise)."""
    rng = np.random.default_rng(3)
    net = cgru.Network.random(topo, np.float64, seed=2, cell=cell)
    x = rng.standard_normal((T, N, topo.input_size))
    lens = rng.integers(0, T + 1, N) if lengths else None
    mask = (rng.random((T, N, topo.output_size)) > 0.3).astype(np.float64) if masked else None
    allocations, packs = [], []
    real_allocate, real_pack = plan.Workspace.allocate, plan.pack_rhs

    def allocate(self, block=None):
        allocations.append(self.nbytes)
        return real_allocate(self, block)

    def pack_rhs(B, trans, out=None, num_threads=1):
        packs.append(out is not None)
        return real_pack(B, trans, out, num_threads)

    monkeypatch.setattr(plan.Workspace, "allocate", allocate)
    monkeypatch.setattr(plan, "pack_rhs", pack_rhs)
    f = cgru.forward(net, x, lengths=lens, state_mask=mask, training=True)
    assert len(allocations) == 1
    g = cgru.backward(net, x, f.reserve, rng.standard_normal(f.y.shape), state_mask=mask)
    assert len(allocations) == 2
    assert packs, "no weight-gradient product ran"
    assert all(packs)
    assert np.isfinite(g.dx).all()


def test_a_workspace_is_carved_from_a_block_at_any_address():
    """``allocate(block)``: the views start 64-byte aligned whatever the block's address, lie
    inside it, and a block smaller than ``block_bytes`` is refused."""
    ws = plan.Workspace(np.float32).add("a", (3, 5)).add("b", (7,))
    raw = np.zeros(ws.block_bytes + 64, np.uint8)
    for shift in range(0, 64, 9):
        block = raw[shift:shift + ws.block_bytes]
        views = ws.allocate(block)
        for name, shape in (("a", (3, 5)), ("b", (7,))):
            v = views[name]
            assert v.shape == shape and v.dtype == np.float32
            assert v.ctypes.data % 64 == 0
            assert block.ctypes.data <= v.ctypes.data
            assert v.ctypes.data + v.nbytes <= block.ctypes.data + block.size
    with pytest.raises(ValueError, match="workspace: .* too small"):
        ws.allocate(raw[:ws.block_bytes - 1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_partial_sums_in_a_given_buffer_are_bitwise_the_allocated_ones(dtype):
    """``gemm``'s BLAS route (``Aᵀ·Bᵀ``: not a weight gradient) with a given ``partial`` gives
    bitwise the product it gives with partial sums of its own; a buffer smaller than
    ``gemm_partial_size`` is refused."""
    rng = np.random.default_rng(0)
    k, m, n = 4096, 24, 10
    A, B = rng.standard_normal((k, m)).astype(dtype), rng.standard_normal((n, k)).astype(dtype)
    own, given = np.empty((m, n), dtype), np.empty((m, n), dtype)
    plan.gemm(True, True, A, B, own, nt=2)
    size = plan.gemm_partial_size(k, m * n)
    assert size >= m * n                    # k = 4096 splits: there are partial sums
    plan.gemm(True, True, A, B, given, nt=2, partial=np.full(size, np.nan, dtype))
    assert own.tobytes() == given.tobytes()
    np.testing.assert_allclose(own, A.T.astype(np.float64) @ B.T.astype(np.float64),
                               rtol=1e-4 if dtype == np.float32 else 1e-12, atol=1e-3)
    with pytest.raises(ValueError, match="partial has"):
        plan.gemm(True, True, A, B, given, nt=2, partial=np.empty(size - 1, dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_weight_gradients_run_on_the_packed_gemm_with_its_pack_in_a_given_buffer(dtype, beta):
    """A weight gradient ``C (+)= Aᵀ·B`` runs on the kernels' packed GEMM with A read
    transposed: against BLAS (the oracle), bitwise the same at 1 and 2 threads and with the
    pack in a given buffer (written, never allocated) or its own; a buffer too small is
    refused."""
    from cgru._kernels import blas
    rng = np.random.default_rng(1)
    k, m, n = 1000, 300, 77
    bigA = rng.standard_normal((k, m + 9)).astype(dtype)
    A, B = bigA[:, 4:4 + m], rng.standard_normal((k, n)).astype(dtype)     # A strided
    C0 = rng.standard_normal((m, n)).astype(dtype)
    oracle = C0.copy()
    blas.gemm_rm(True, False, 1.0, A, B, beta, oracle)
    results = []
    for nt, pack in ((1, None), (2, None), (2, np.full(plan.gemm_pack_size(k, n, dtype) + 5,
                                                       np.nan, dtype))):
        C = C0.copy()
        plan.gemm(True, False, A, B, C, beta, nt, pack=pack)
        results.append(C)
        if pack is not None:
            assert not np.isnan(pack[:-5]).any() and np.isnan(pack[-5:]).all()
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(results[0], oracle, rtol=tol, atol=tol * np.sqrt(k))
    assert all(r.tobytes() == results[0].tobytes() for r in results)
    with pytest.raises(ValueError, match="at least"):
        plan.gemm(True, False, A, B, C0.copy(), beta, 1,
                  pack=np.empty(plan.gemm_pack_size(k, n, dtype) - 1, dtype))


@pytest.mark.parametrize("cell", [cgru.GRUCell(), cgru.LSTMCell(), cgru.RNNCell()],
                         ids=["gru", "lstm", "rnn"])
@pytest.mark.parametrize("training", [False, True])
def test_the_time_loops_refuse_scratch_smaller_than_they_need(monkeypatch, cell, training):
    """``forward_layer`` / ``backward_layer`` check the scratch they are given against their
    own need before running (they would write past it): a workspace sized one element short
    is refused with a ValueError, not overrun (two threads, two batch chunks: the layout holds
    the larger of one chunk's and two chunks' scratch)."""
    from cgru.core import kinds
    from cgru.core.backend import BACKEND
    kernels = BACKEND.kernels(kinds.of(cell))
    need = kernels.scratch_size(True, 40, 8, 8, 2, 2)
    assert need > 0 and need % 64 == 0
    assert need == 2 * kernels.scratch_size(True, 40, 8, 8, 2, 1)
    net = cgru.Network.random(cgru.Topology(3, 8, 1), np.float64, seed=1, cell=cell)
    x = np.random.default_rng(0).standard_normal((4, 40, 3))
    monkeypatch.setattr(plan, "_MIN_PARALLEL_WORK", 0)
    assert plan.loop_chunks(40, 8, plan.loop_threads(2, 4, 40, 8, 1, cell.gates)) == 2
    assert kernels.scratch_size(training is False, 40, 8, 8, 1, 1) <= \
        kernels.scratch_size(training is False, 40, 8, 8, 2, 1)
    f = cgru.forward(net, x, training=True, num_threads=2)
    real = kernels.scratch_size
    monkeypatch.setattr(kernels, "scratch_size", lambda forward, *a: real(forward, *a) - 1)
    cgru.release_memory()     # the layouts made with the real size go (fresh_pool: after, too)
    with pytest.raises(ValueError, match="scratch: .* too small; the (forward|backward) loops"):
        if training:
            cgru.backward(net, x, f.reserve, np.ones_like(f.y), num_threads=2)
        else:
            cgru.forward(net, x, num_threads=2)


# --- the plan cache: a repeated call's layout and workspace ---------------------------------
def _counting_allocations(monkeypatch):
    made = []
    real = plan.Workspace.allocate

    def allocate(self, block=None):
        made.append(self.nbytes)
        return real(self, block)
    monkeypatch.setattr(plan.Workspace, "allocate", allocate)
    return made


def _small_problem(cell=None):
    net = cgru.Network.random(cgru.Topology(16, 32, 2), np.float32, seed=4,
                              cell=cell or cgru.GRUCell())
    x = np.random.default_rng(5).standard_normal((3, 2, 16)).astype(np.float32)
    return net, x


@pytest.mark.parametrize("cell", [cgru.GRUCell(), cgru.LSTMCell(), cgru.RNNCell()],
                         ids=["gru", "lstm", "rnn"])
def test_a_repeated_call_borrows_the_workspace_of_the_last(monkeypatch, cell):
    """A call of a shape seen before allocates no workspace: its layout (a function of the
    model and shapes) is made once and lends the last call's allocation — an inference
    forward, a stream's step, and a training forward and its backward whose step's block is
    this small — and the results are bitwise those of a fresh workspace.  (A larger training
    step carves both from one block of the pool: the next test.)"""
    net, x = _small_problem(cell)
    stream = cgru.Stream(net)
    first = cgru.forward(net, x, training=True)
    g_first = cgru.backward(net, x, first.reserve, np.ones_like(first.y))
    i_first = cgru.forward(net, x).y
    s_first = stream.step(x)[0]
    made = _counting_allocations(monkeypatch)
    for _ in range(3):
        f = cgru.forward(net, x, training=True)
        g = cgru.backward(net, x, f.reserve, np.ones_like(f.y))
        inference = cgru.forward(net, x).y
        y = stream.step(x)[0]
        np.testing.assert_array_equal(f.y, first.y)
        np.testing.assert_array_equal(g.dx, g_first.dx)
        np.testing.assert_array_equal(g.dparams.flat(), g_first.dparams.flat())
        np.testing.assert_array_equal(inference, i_first)
        np.testing.assert_array_equal(y, s_first)
    assert made == []
    cgru.release_memory()                         # the idle allocations go with the pool's
    assert plan.pool_state() == (0, 0)
    T, N = x.shape[:2]
    cgru.forward(net, x, lengths=np.full(N, T))   # (lengths: the general path, not a runner)
    assert len(made) == 1


def test_poisoned_calls_never_borrow(monkeypatch, poison):
    """While the tests poison every buffer, each call gets a fresh (poisoned) workspace, never
    one a previous call wrote: an element a kernel forgot to write stays NaN and shows."""
    net, x = _small_problem()
    monkeypatch.setattr(plan, "_reuse", True)
    cgru.forward(net, x)                          # leaves an idle allocation behind
    monkeypatch.setattr(plan, "_reuse", False)
    made = _counting_allocations(monkeypatch)
    for _ in range(3):
        cgru.forward(net, x)
    assert len(made) == 3


def test_concurrent_calls_never_share_a_workspace(monkeypatch):
    """Calls of one shape from several threads at once — inference forwards (which borrow
    their layout's last allocation), and training forwards with their backwards (small: lent
    the step's block) — each hold an allocation no other call holds (recorded at every borrow
    and give-back), and every result is bitwise the serial one.

    Every inference here takes the general path, so that each one borrows: the plan's runner,
    which serves one call at a time, would take whichever call found it free — how many is up
    to the threads' timing (on a loaded machine, all of them: then nothing borrowed, and the
    test proved nothing). test_runner checks that a busy runner leaves its call to the
    general path."""
    import threading
    from cgru.core import engine
    monkeypatch.setattr(engine.ForwardPlan, "runner", lambda self, frozen: None)
    net, _ = _small_problem()
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((3, 2, 16)).astype(np.float32) for _ in range(8)]

    def results(x):
        f = cgru.forward(net, x, training=True, num_threads=1)
        g = cgru.backward(net, x, f.reserve, np.ones_like(f.y), num_threads=1)
        return [cgru.forward(net, x, num_threads=1).y, f.y, g.dx, g.dparams.flat()]
    want = [results(x) for x in xs]
    borrowed, lent_names = [], []
    held, overlaps, lock = set(), [], threading.Lock()
    real_borrow, real_give_back = plan.Workspace.borrow, plan.Workspace.give_back

    def borrow(self):
        views = real_borrow(self)
        with lock:
            borrowed.append(tuple(views))
            key = next(iter(views.values())).ctypes.data
            if key in held:
                overlaps.append(key)
            held.add(key)
        return views

    def give_back(self, views):
        with lock:
            held.discard(next(iter(views.values())).ctypes.data)
        real_give_back(self, views)
    monkeypatch.setattr(plan.Workspace, "borrow", borrow)
    monkeypatch.setattr(plan.Workspace, "give_back", give_back)
    real_lend, real_return = plan.BlockLender.borrow, plan.BlockLender.give_back

    def lend(self, layout):
        lent, views = real_lend(self, layout)
        with lock:
            lent_names.append(tuple(views))
            key = ("lent", lent[0].ctypes.data)
            if key in held:
                overlaps.append(key)
            held.add(key)
        return lent, views

    def give_back_lent(self, lent):
        with lock:
            held.discard(("lent", lent[0].ctypes.data))
        real_return(self, lent)
    monkeypatch.setattr(plan.BlockLender, "borrow", lend)
    monkeypatch.setattr(plan.BlockLender, "give_back", give_back_lent)
    start, bad = threading.Barrier(4), []

    def work(k):
        start.wait()
        for i in range(100):
            j = (i + k) % len(xs)
            if not all(np.array_equal(a, b) for a, b in zip(results(xs[j]), want[j])):
                bad.append((k, i))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == [] and bad == []
    # every inference borrowed (the inner layer's output among its views), the training
    # forward's and the backward's blocks were lent
    assert len(borrowed) == 4 * 100 and all("out0" in names for names in borrowed)
    assert any("gx0" in names for names in lent_names)
    assert any("dgx0" in names for names in lent_names)


@pytest.mark.parametrize("cell", [cgru.GRUCell(), cgru.LSTMCell()], ids=["gru", "lstm"])
def test_weight_gradients_are_split_over_rows(monkeypatch, cell):
    """A weight-gradient product is split over the rows of C (each over all of T·N), so that
    both cores share it however short the sequence: the split happens, the result is bitwise
    the same at 1 and 2 threads, and it agrees with the NumPy reference."""
    from cgru._kernels import blas
    from cgru.core import reference
    topo = cgru.Topology(24, 96, 2, "bidirectional")
    net = cgru.Network.random(topo, np.float64, seed=7, cell=cell)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((20, 12, 24))
    dy = rng.standard_normal((20, 12, topo.output_size))
    splits, real = [], blas.gemm_packed_blocks

    def spy(A, Bp, C, beta1, n_blocks, nt, trans_a=False, col_blocks=1):
        if trans_a:
            splits.append(min(n_blocks, C.shape[0]))
        return real(A, Bp, C, beta1, n_blocks, nt, trans_a, col_blocks)
    monkeypatch.setattr(blas, "gemm_packed_blocks", spy)
    grads = []
    for nt in (1, 2):
        f = cgru.forward(net, x, training=True, num_threads=nt)
        grads.append(cgru.backward(net, x, f.reserve, dy, num_threads=nt).dparams.flat())
    assert splits and max(splits) >= 2, splits
    np.testing.assert_array_equal(grads[0], grads[1])
    want = reference.backward(net, x, dy)[-1].flat()
    np.testing.assert_allclose(grads[0], want, rtol=1e-10, atol=1e-10)


def _training_steps_splits(monkeypatch, net, x, dy):
    """A training step at 1 and at 2 threads, with the packed products' splits seen:
    ``(splits, runs)`` — splits ``(threads, trans_a, row blocks, column blocks)`` per product
    (row blocks at most C's rows), runs ``(y, dx, flat weight gradients)`` per thread count."""
    from cgru._kernels import blas
    splits, real = [], blas.gemm_packed_blocks

    def spy(A, Bp, C, beta1, n_blocks, nt, trans_a=False, col_blocks=1):
        splits.append((nt, bool(trans_a), min(n_blocks, C.shape[0]), col_blocks))
        return real(A, Bp, C, beta1, n_blocks, nt, trans_a, col_blocks)
    monkeypatch.setattr(blas, "gemm_packed_blocks", spy)
    runs = []
    for nt in (1, 2):
        f = cgru.forward(net, x, training=True, num_threads=nt)
        g = cgru.backward(net, x, f.reserve, dy, num_threads=nt)
        runs.append((f.y, g.dx, g.dparams.flat()))
    return splits, runs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_batch_one_sequence_shares_its_products_by_columns(monkeypatch, dtype):
    """A batch-1 sequence has too few rows of T·N to split its input projection and input
    gradient by rows, so at two threads they are split into blocks of columns (both cores share
    them): the split happens, and the results are bitwise the same at 1 and 2 threads and
    agree with the NumPy reference."""
    from cgru.core import reference
    topo = cgru.Topology(96, 128, 1)
    net = cgru.Network.random(topo, dtype, seed=3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 1, 96)).astype(dtype)
    dy = rng.standard_normal((40, 1, 128)).astype(dtype)
    splits, runs = _training_steps_splits(monkeypatch, net, x, dy)
    assert (2, False, 1, 4) in splits, splits
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    want = reference.backward(net, x, dy)
    tol = 1e-10 if dtype == np.float64 else 1e-3
    np.testing.assert_allclose(runs[0][1], want[0], rtol=tol, atol=tol)
    np.testing.assert_allclose(runs[0][2], want[-1].flat(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_weight_gradient_copies_its_rows_of_a_once_per_thread(monkeypatch, dtype):
    """A weight gradient with few rows of C (``[G·H, in]``, H = 128) over a time block: each
    of its blocks copies all of its rows of A (simd.h), so one thread runs it as one block and
    two threads as at most one block each — while the other products still split by columns
    at two threads. The bits are the same at 1 and 2 threads and agree with the reference."""
    from cgru.core import reference
    topo = cgru.Topology(128, 128, 1)
    net = cgru.Network.random(topo, dtype, seed=5, cell=cgru.RNNCell())
    rng = np.random.default_rng(6)
    x = rng.standard_normal((80, 16, 128)).astype(dtype)
    dy = rng.standard_normal((80, 16, 128)).astype(dtype)
    seen, runs = _training_steps_splits(monkeypatch, net, x, dy)
    wgrad = {nt: {r * c for t, ta, r, c in seen if t == nt and ta} for nt in (1, 2)}
    assert wgrad[1] == {1}, seen
    assert wgrad[2] and max(wgrad[2]) <= 2, seen
    assert any(t == 2 and not ta and r * c > 2 for t, ta, r, c in seen), seen
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    want = reference.backward(net, x, dy)
    tol = 1e-10 if dtype == np.float64 else 1e-3
    np.testing.assert_allclose(runs[0][2], want[-1].flat(), rtol=tol, atol=tol)


@pytest.mark.parametrize("small", [False, True], ids=["pooled", "lent"])
@pytest.mark.parametrize("cell,masked", [(cgru.GRUCell(), False), (cgru.LSTMCell(), True),
                                          (cgru.RNNCell(), False)], ids=["gru", "lstm", "rnn"])
def test_a_training_step_holds_one_workspace_block(monkeypatch, cell, masked, small):
    """A training forward takes its workspace from a block the backward's fits in too, so
    when the forward returns it the backward gets that same block: a training step makes two
    blocks in a fresh process — the reserve and one workspace — not the forward's workspace
    idle beside the backward's (the step's peak memory).  A small step's block (at most
    ``SPARE_BLOCK_BYTES``) is lent in turn to its forward and its backward
    (``plan.block_lender``), each one's views carved once: the same two blocks, and a next
    step makes none (nor carves any views)."""
    fresh = _counting_fresh_blocks(monkeypatch)
    T, N, H, L = (3, 2, 8, 1) if small else (40, 8, 64, 2)
    topo = cgru.Topology(16, H, L, "bidirectional")
    net = cgru.Network.random(topo, np.float32, seed=9, cell=cell)
    rng = np.random.default_rng(10)
    x = rng.standard_normal((T, N, 16)).astype(np.float32)
    mask = rng.uniform(0.5, 1.5, (T, N, topo.output_size)).astype(np.float32) \
        if masked else None

    dy = np.ones((T, N, topo.output_size), np.float32)

    def step():
        f = cgru.forward(net, x, training=True, state_mask=mask)
        return cgru.backward(net, x, f.reserve, dy, state_mask=mask)
    g = step()
    assert len(fresh) == 2, fresh
    from cgru.core import engine, kinds
    block = engine._training_block_bytes(kinds.of(cell), cell, topo, np.dtype(np.float32), T,
                                         N, masked)
    assert (block <= plan.SPARE_BLOCK_BYTES) == small and plan.size_class(block) in fresh
    if small:
        made = _counting_allocations(monkeypatch)
        np.testing.assert_array_equal(step().dx, g.dx)
        assert len(fresh) == 2 and made == []
    from cgru.core import reference
    want = reference.backward(net, x, dy, state_mask=mask)
    np.testing.assert_allclose(g.dx, want[0], rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("L", [1, 2, 3, 4])
def test_inner_layers_hold_only_the_whole_sequence_buffers_they_use(L):
    """A layer's input gradient (backward) and an inner layer's output (inference forward) are
    whole sequences, written by one layer while the next reads the other's: two layers need one
    such buffer, three and more two, taking turns.  Every call of each depth still computes
    what the reference does (and the poisoned-buffer tests run these depths too)."""
    from cgru.core import engine, kinds, reference
    T, N, I, H = 7, 3, 4, 5
    topo = cgru.Topology(I, H, L, "bidirectional")
    cell = cgru.GRUCell()
    kind = kinds.of(cell)
    bwd = engine.backward_workspace(kind, cell, topo, np.float64, T, N)._shapes
    fwd = engine.forward_workspace(kind, cell, topo, np.float64, T, N, False)._shapes
    want = {1: set(), 2: {1}, 3: {0, 1}, 4: {0, 1}}[L]
    assert {n for n in bwd if n.startswith("dX")} == {f"dX{i}" for i in want}
    assert {n for n in fwd if n.startswith("out")} == {f"out{i ^ 1}" for i in want}
    net = cgru.Network.random(topo, np.float64, seed=L)
    rng = np.random.default_rng(L)
    x = rng.standard_normal((T, N, I))
    dy = rng.standard_normal((T, N, topo.output_size))
    f = cgru.forward(net, x, training=True)
    np.testing.assert_allclose(cgru.forward(net, x).y, f.y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(f.y, reference.forward(net, x)[0], rtol=1e-10, atol=1e-10)
    g = cgru.backward(net, x, f.reserve, dy)
    np.testing.assert_allclose(g.dx, reference.backward(net, x, dy)[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("flip_z", [False, True])
def test_a_reset_after_gru_keeps_apart_only_the_n_columns_of_its_recurrent_gradient(flip_z):
    """The recurrent side's gate gradient of a reset-after GRU differs from the input side's in
    its n columns only (``r ⊙ da_n`` against ``da_n``): the backward keeps those apart,
    ``[rows, H]`` per direction, and takes the r and z columns from the input side's buffer —
    in the per-step product (both its forms: with a state mask and without), in ``dR`` and in
    ``db_R``.  The gradients agree with the NumPy reference and are bitwise the same at 1 and
    2 threads."""
    from cgru.core import engine, kinds, reference
    T, N, I, H = 9, 5, 4, 7
    topo = cgru.Topology(I, H, 2, "bidirectional")
    cell = cgru.GRUCell(flip_z=flip_z)
    layout = engine.backward_workspace(kinds.of(cell), cell, topo, np.float64, T, N)._shapes
    RB = plan.time_block(T, N) * N
    assert layout["dgh0"][1] == layout["dgh1"][1] == (RB, H)
    assert layout["dgx0"][1] == (RB, 3 * H)
    net = cgru.Network.random(topo, np.float64, seed=5, cell=cell)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((T, N, I))
    dy = rng.standard_normal((T, N, topo.output_size))
    lengths = np.array([9, 4, 0, 7, 9])
    for mask in (None, rng.uniform(0.5, 1.5, (T, N, topo.output_size))):
        grads = []
        for nt in (1, 2):
            f = cgru.forward(net, x, lengths=lengths, state_mask=mask, training=True,
                             num_threads=nt)
            g = cgru.backward(net, x, f.reserve, dy, state_mask=mask, num_threads=nt)
            grads.append(np.concatenate([g.dx.ravel(), g.dh0.ravel(), g.dparams.flat()]))
        np.testing.assert_array_equal(grads[0], grads[1])
        want = reference.backward(net, x, dy, lengths=lengths, state_mask=mask)
        np.testing.assert_allclose(grads[0], np.concatenate(
            [want[0].ravel(), want[1].ravel(), want[-1].flat()]), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_t_takes_a_left_operand_in_blocks_of_columns(dtype):
    """``plan.gemm_t``: ``C (+)= Aᵀ·B`` with ``A`` given as blocks of columns (strided views
    included) equals BLAS on the whole ``A``, for ``beta`` 0 and 1 (the packed path) and any
    other ``beta`` (block by block through ``gemm``); blocks that do not cover C are an
    error."""
    rng = np.random.default_rng(3)
    k, n = 37, 11
    whole = rng.standard_normal((k, 3 * 13)).astype(dtype)
    n_part = rng.standard_normal((k, 5)).astype(dtype)
    B = rng.standard_normal((k, n)).astype(dtype)
    A = np.concatenate([whole[:, :26], n_part], axis=1)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    for beta in (0.0, 1.0, 0.5):
        C0 = rng.standard_normal((31, n)).astype(dtype)
        C = C0.copy()
        plan.gemm_t((whole[:, :26], n_part), B, C, beta)
        np.testing.assert_allclose(C, A.T.astype(np.float64) @ B + beta * C0, **tol)
    C = np.full((32, n), 7, dtype)
    with pytest.raises(ValueError, match="31 columns in all, C 32 rows"):
        plan.gemm_t((whole[:, :26], n_part), B, C)
    assert (C == 7).all()                             # refused before anything is written


# --- blocks of time -----------------------------------------------------------------------------
_BLOCK_CASES = {
    # (cell, topology kwargs, T, N, padded, masked)
    "gru_bi_L2_padded_masked": (cgru.GRUCell(), dict(num_layers=2, direction="bidirectional"),
                                13, 3, True, True),
    "gru_reset_before_reverse": (cgru.GRUCell(reset_after=False), dict(direction="reverse"),
                                 11, 4, True, False),
    "lstm_proj_peepholes_bi": (cgru.LSTMCell(peepholes=True),
                               dict(direction="bidirectional", proj_size=3), 12, 3, True, True),
    "lstm_ifgo_L2": (cgru.LSTMCell(peepholes="ifgo"), dict(num_layers=2), 9, 5, False, False),
    "rnn_relu_skip_bi": (cgru.RNNCell(activation="relu"),
                         dict(direction="bidirectional", input_mode="skip"), 10, 3, True, False),
    "gru_projected_bi": (cgru.GRUCell(), dict(direction="bidirectional",
                                              input_mode="projected"), 8, 4, False, True),
}


@pytest.mark.parametrize("case", sorted(_BLOCK_CASES))
def test_forward_and_backward_in_blocks_of_time(monkeypatch, case):
    """Both run in blocks of time (``plan.time_block``): the forward's input projection and
    the backward's gate gradients held a block at a time, the carries passed from block to
    block, the backward's weight gradients added up block by block.  Forced to blocks of one
    to a few steps: the forward (training and inference: outputs, states, reserve) is bitwise
    that of one block; every gradient agrees with the NumPy reference (float64) and with one
    block, and is bitwise the same at 1 and 2 threads."""
    from cgru.core import reference
    cell, kw, T, N, padded, masked = _BLOCK_CASES[case]
    H = 6
    I = H * (1 if kw.get("input_mode") != "projected" else cell.gates *
             (2 if kw.get("direction") == "bidirectional" else 1)) if kw.get("input_mode") \
        else 5
    topo = cgru.Topology(I, H, **kw)
    net = cgru.Network.random(topo, np.float64, seed=11, cell=cell)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((T, N, I))
    S, LD = topo.state_size, topo.num_layer_directions
    h0 = rng.standard_normal((LD, N, S))
    c0 = rng.standard_normal((LD, N, H)) if cell.kind == "lstm" else None
    lengths = rng.integers(0, T + 1, N) if padded else None
    mask = rng.uniform(0.5, 1.5, (T, N, topo.output_size)) if masked else None
    dy = rng.standard_normal((T, N, topo.output_size))
    dhy = rng.standard_normal((LD, N, S))
    dcy = rng.standard_normal((LD, N, H)) if c0 is not None else None

    def forwards(nt):
        f = cgru.forward(net, x, h0, c0=c0, lengths=lengths, state_mask=mask, training=True,
                         num_threads=nt)
        i = cgru.forward(net, x, h0, c0=c0, lengths=lengths, state_mask=mask, num_threads=nt)
        return f, [f.y, f.hy, f.reserve, i.y, i.hy] + ([f.cy, i.cy] if c0 is not None else [])

    def run(nt):
        f, _ = forwards(nt)
        g = cgru.backward(net, x, f.reserve, dy, dhy, dcy=dcy, state_mask=mask,
                          num_threads=nt)
        return [g.dx, g.dh0, g.dparams.flat()] + ([g.dc0] if c0 is not None else [])
    whole, whole_fwd = run(1), forwards(1)[1]
    for rows in (N, 2 * N + 1):                   # blocks of 1 and of 2 steps (N rows each)
        monkeypatch.setattr(plan, "_BLOCK_ROWS", rows)
        monkeypatch.setattr(plan, "_MAX_BLOCK_ROWS", rows)
        cgru.release_memory()                     # the layouts of the other block size go
        assert plan.time_block(T, N, plan.wgrad_size(topo, cell.gates)) == \
            plan.time_block(T, N) < T
        for a, w in zip(forwards(2)[1], whole_fwd):
            np.testing.assert_array_equal(a, w)
        one, two = run(1), run(2)
        for a, b, w in zip(one, two, whole):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-12)
    want = reference.backward(net, x, dy, dhy, h0, c0=c0, dcy=dcy, lengths=lengths,
                              state_mask=mask)
    ref = [want[0], want[1], want[-1].flat()] + ([want[2]] if c0 is not None else [])
    for a, w in zip(one, ref):
        np.testing.assert_allclose(a, w, rtol=1e-9, atol=1e-9)


def test_a_sealed_network_keeps_its_weights_proof_and_plans_only_for_what_they_belong_to():
    """A sealed network keeps its ``Frozen`` (the call's weights, their packs, bias sums and
    forward plans) from call to call: the next call of the same network takes it as it is.
    What it keeps belongs to exactly what it was made for: a network built without a cell runs
    the cell each call names (the deprecated ``cell=``), and a call of another cell or another
    shape gets its own fixed arguments and plan — every result bitwise that of an unsealed copy
    of the network, in any order of calls."""
    import warnings
    from cgru.core import reference, weights
    topo = cgru.Topology(5, 8, 2, direction="bidirectional")
    plain = cgru.Network.random(topo, np.float64, seed=3)          # built without a cell
    sealed = plain.sealed()
    assert weights.freeze(sealed) is weights.freeze(sealed)
    # unsealed: proven by its bytes every call, then the Frozen of those copies taken again
    assert weights.freeze(plain) is weights.freeze(plain)
    rng = np.random.default_rng(4)
    xs = {(T, N): rng.standard_normal((T, N, 5)) for T, N in ((3, 2), (1, 1), (4, 3))}
    cells = [cgru.GRUCell(), cgru.GRUCell(reset_after=False),
             cgru.GRUCell(flip_z=True, reset_after=False), None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for cell in cells * 2:                       # every cell and shape twice, interleaved
            for (T, N), x in xs.items():
                for training in (False, True):
                    got = cgru.forward(sealed, x, cell=cell, training=training)
                    want = cgru.forward(plain.copy(), x, cell=cell, training=training)
                    np.testing.assert_array_equal(got.y, want.y)
                    np.testing.assert_array_equal(got.hy, want.hy)
                    if training:
                        dy = np.cos(got.y)
                        g = cgru.backward(sealed, x, got.reserve, dy, cell=cell)
                        h = cgru.backward(plain, x, want.reserve, dy, cell=cell)
                        np.testing.assert_array_equal(g.dx, h.dx)
                        np.testing.assert_array_equal(g.dparams.flat(), h.dparams.flat())
    # the plans kept are bounded, whatever the number of shapes a network sees
    for T in range(1, 3 * weights.Frozen.PLANS):
        cgru.forward(sealed, rng.standard_normal((T, 1, 5)))
    assert len(weights.freeze(sealed)._plans) == weights.Frozen.PLANS
    ref = reference.forward(plain.with_cell(cells[1]), xs[3, 2])
    np.testing.assert_allclose(cgru.forward(sealed.with_cell(cells[1]), xs[3, 2]).y, ref[0],
                               rtol=1e-12, atol=1e-12)


def test_a_lent_block_keeps_the_views_of_a_few_layouts_only():
    """A lent block keeps each layout's views once carved, for at most four layouts (more
    shapes of the same size carve theirs again), and always hands a layout its own views."""
    lender = plan.BlockLender(8192)
    layouts = [plan.Workspace(np.float32).add("a", (k + 1, 3)).add("b", (5,)).shared()
               for k in range(6)]
    for _ in range(2):
        for ws in layouts:
            lent, views = lender.borrow(ws)
            assert views["a"].shape == ws._shapes["a"][1] and len(lent[1]) <= 4
            assert lent[1][ws] is views
            lender.give_back(lent)
    plan.release_spares()


def test_a_training_loop_makes_its_plans_once_whatever_its_weights(monkeypatch):
    """A training step's forward and backward plans are functions of the model and shapes:
    a loop that changes its weights every step (a new ``Frozen`` each time) makes them at its
    first step and finds them at every later one — and an inference of those weights keeps
    its own plan (its runner computes with them)."""
    from cgru.core import engine
    made = []
    for cls in (engine.ForwardPlan, engine.BackwardPlan):
        monkeypatch.setattr(cls, "__init__", lambda self, *a, _init=cls.__init__:
                            made.append(type(self).__name__) or _init(self, *a))
    net, x = _net_and_x()
    arrays = [a for lp in net.layers for a in lp.arrays().values()]
    for step in range(4):
        f = cgru.forward(net, x, training=True)
        g = cgru.backward(net, x, f.reserve, dy=np.ones_like(f.y))
        for a, d in zip(arrays, [d for lp in g.dparams.layers for d in lp.arrays().values()]):
            a -= 0.01 * d                                   # new weights: a new Frozen
        if step == 0:
            assert sorted(made) == ["BackwardPlan", "ForwardPlan"]
    assert sorted(made) == ["BackwardPlan", "ForwardPlan"]
    cgru.forward(net, x)
    assert sorted(made) == ["BackwardPlan", "ForwardPlan", "ForwardPlan"]


@pytest.mark.parametrize("cell", [cgru.GRUCell(), cgru.LSTMCell(), cgru.RNNCell("tanh")],
                         ids=["gru", "lstm", "rnn_tanh"])
def test_a_training_steps_peak_memory_is_near_its_reserve_inputs_and_outputs(cell):
    """The first training step in a fresh pool, at the benchmark's shape B (T = 100, N = 32,
    H = 256, float32), allocates at most a fifth more than its reserve, its inputs and its
    outputs — counted by tracemalloc to the byte, every block cgru allocates being NumPy's:
    the kept copy of the weights and the backward's packs, one workspace block of a block of
    time shared by the forward and the backward (``time_block``), new pooled blocks within a
    thirty-second of their size, and the forward's packs gone with the forward
    (``ONE_CALL_PACK_ROWS``). (The inputs were held before: they are counted, not traced.)"""
    import tracemalloc
    T, N, H = 100, 32, 256
    topo = cgru.Topology(H, H)
    net = cgru.Network.random(topo, np.float32, seed=3, cell=cell)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((T, N, H)).astype(np.float32)
    dy = rng.standard_normal((T, N, H)).astype(np.float32)
    weights = sum(a.nbytes for lp in net for a in lp.arrays().values())
    inputs = x.nbytes + dy.nbytes + weights + 2 * topo.num_layer_directions * N * H * 4 * (
        2 if cell.gates == 4 else 1)                       # h0 and dhy (c0 and dcy)
    tracemalloc.start()
    try:
        f = cgru.forward(net, x, training=True)
        g = cgru.backward(net, x, f.reserve, dy)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    reserve = cgru.reserve_nbytes(net, T, N)
    minimum = reserve + 2 * inputs                          # the outputs: as large as the inputs
    assert (inputs + peak) / minimum <= 1.2, (inputs + peak) / minimum
    assert g.dx.shape == x.shape


def _counting_packs(monkeypatch):
    """The packs of the weights made from now on, as (forward, rows)."""
    from cgru.core import weights
    made = []
    real = weights._pack

    def counting(a, forward, rows):
        made.append((bool(forward), rows))
        return real(a, forward, rows)
    monkeypatch.setattr(weights, "_pack", counting)
    return made


@pytest.mark.parametrize("cell", [cgru.GRUCell(), cgru.GRUCell(reset_after=False),
                                  cgru.LSTMCell(), cgru.RNNCell("relu")],
                         ids=["gru", "gru_before", "lstm", "rnn_relu"])
def test_a_long_training_forward_keeps_none_of_its_packs(monkeypatch, cell):
    """A training forward over ``ONE_CALL_PACK_ROWS`` rows of T·N or more packs its weights
    for itself: none of its packs stays with the kept copies (so the backward after it holds
    only its own), a next step packs them again, and the results are those of a forward whose
    packs are kept, bit for bit. One that is shorter keeps them: a next step makes none.
    Packs its weights already keep (an inference made them) serve it as they are."""
    from cgru.core import weights
    topo = cgru.Topology(8, 16, 2, "bidirectional")
    net = cgru.Network.random(topo, np.float32, seed=5, cell=cell)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 32, 8)).astype(np.float32)          # 2,048 rows
    dy = rng.standard_normal((64, 32, topo.output_size)).astype(np.float32)
    assert 64 * 32 == plan.ONE_CALL_PACK_ROWS

    def step(x, dy):
        f = cgru.forward(net, x, training=True)
        g = cgru.backward(net, x, f.reserve, dy)
        return [f.y, f.hy, f.reserve, g.dx, g.dh0] + \
            [a for lp in g.dparams for a in lp.arrays().values()]

    def kept_packs():
        return sorted((k, bool(key[1])) for i, layer in enumerate(weights.freeze(net).kept)
                      for k, kept in layer.items() for key in kept._derived
                      if key[0] == "pack")

    made = _counting_packs(monkeypatch)
    long = step(x, dy)
    forward_made = [m for m in made if m[0]]
    assert forward_made and all(not forward for _, forward in kept_packs())
    made.clear()
    assert all(np.array_equal(a, b) for a, b in zip(step(x, dy), long))
    assert [m for m in made if m[0]] == forward_made and not [m for m in made if not m[0]]
    # the same step with its packs kept: the same bits
    cgru.release_memory()
    monkeypatch.setattr(plan, "ONE_CALL_PACK_ROWS", 1 << 40)
    assert all(np.array_equal(a, b) for a, b in zip(step(x, dy), long))
    assert {forward for _, forward in kept_packs()} == {True, False}
    # shorter (1,984 rows): its packs stay; the next step makes none
    monkeypatch.setattr(plan, "ONE_CALL_PACK_ROWS", 64 * 32)
    cgru.release_memory()
    step(x[:62], dy[:62])
    made.clear()
    step(x[:62], dy[:62])
    assert made == []
    # kept packs serve a long forward: after an inference, it makes none
    cgru.release_memory()
    cgru.forward(net, x)
    made.clear()
    assert all(np.array_equal(a, b) for a, b in zip(step(x, dy), long))
    assert [m for m in made if m[0]] == []
