"""The kept copies of the weights (cgru.core.weights): exact by construction.

The packed recurrent weights used to be cached under a 63-bit hash of the weights' contents:
a weight update racing a call stored the pack of the new matrix under the digest of the old
one (every later call on the old weights was wrong, by 0.28, until ``release_memory()``), a
crafted sign change kept the digest, and every training step inserted new packs while summing
the sizes of all of them (5–40× slower steps after 12,000 steps).  Now every call compares the
weights' bytes with a kept copy, computes from the copy only, and an array has one entry.
"""
import gc
import threading
import weakref

import numpy as np
import pytest

import cgru
from cgru.core import plan, reference, reserve, weights
from cgru._kernels import loops

CELLS = [cgru.GRUCell(), cgru.GRUCell(reset_after=False), cgru.LSTMCell(),
         cgru.LSTMCell(peepholes="ifo"), cgru.RNNCell("relu")]


@pytest.fixture(autouse=True)
def empty_cache():
    cgru.release_memory()
    yield
    cgru.release_memory()


def _all_bits(f, g):
    return [f.y, f.hy, g.dx, g.dh0] + [a for lp in g.dparams for a in lp.arrays().values()]


def _step(net, x, dy):
    f = cgru.forward(net, x, training=True)
    return _all_bits(f, cgru.backward(net, x, f.reserve, dy))


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b))


def _count_packs(monkeypatch):
    calls = []
    real = weights.pack_rhs

    def counting(B, forward):
        calls.append((B.shape, bool(forward)))
        return real(B, forward)
    monkeypatch.setattr(weights, "pack_rhs", counting)
    return calls


@pytest.mark.parametrize("cell", CELLS, ids=repr)
def test_unchanged_weights_are_packed_once(monkeypatch, cell):
    calls = _count_packs(monkeypatch)
    net = cgru.Network.random(cgru.Topology(4, 6, 2, "bidirectional"), np.float64, seed=1,
                              cell=cell)
    x = np.random.default_rng(2).standard_normal((5, 3, 4))
    first = cgru.forward(net, x, training=True)
    n_forward = len(calls)
    cgru.backward(net, x, first.reserve, np.ones_like(first.y))
    n = len(calls)
    assert n_forward >= 4 and n - n_forward >= 4    # forward, backward packs, 4 layer-directions
    copy = net.copy()                       # other arrays, the same bytes: entries of its own
    for _ in range(3):
        f = cgru.forward(net, x, training=True)
        cgru.backward(net, x, f.reserve, np.ones_like(f.y))
        cgru.forward(net, x)
        cgru.forward(copy, x)
    assert len(calls) == n + n_forward      # every later call found its packs (the copy's
    cgru.release_memory()                   # own forward packs aside)
    cgru.forward(net, x)
    assert len(calls) > n + n_forward       # emptied: packed again


@pytest.mark.parametrize("cell", CELLS, ids=repr)
def test_weights_changed_in_place_are_never_served_a_stale_pack(cell):
    """An in-place update (an optimizer step) is seen by the very next call, forward and
    backward, with no call to make."""
    peep = getattr(cell, "peepholes", None)
    kw = dict(proj_size=3) if cell.kind == "lstm" and not peep else {}
    net = cgru.Network.random(cgru.Topology(4, 6, 1, **kw), np.float64, seed=3, cell=cell)
    x = np.random.default_rng(4).standard_normal((5, 3, 4))
    dy = np.random.default_rng(5).standard_normal(cgru.forward(net, x).y.shape)
    before = cgru.forward(net, x).y
    names = ["R", "W", "b_R"] + (["W_p"] if kw else []) + (["P"] if peep else [])
    for name in names:
        a = getattr(net[0], name)
        a.reshape(-1)[1] += 0.25                      # in place: same array object
        a.reshape(-1)[-1] -= 0.25                     # (a GRU's r/z and n blocks both)
        got = _step(net, x, dy)
        fresh = net.copy()
        cgru.release_memory()
        want = _step(fresh, x, dy)
        assert not np.array_equal(got[0], before), name
        assert _same(got, want), name
        before = got[0]


def test_a_one_sign_change_is_seen_by_forward_and_refused_by_backward():
    """The sign of one weight flipped in place (a crafted model used to keep the old hash's
    digest, so the old pack was served and the old reserve accepted)."""
    net = cgru.Network.random(cgru.Topology(4, 8, 2), np.float64, seed=6)
    x = np.random.default_rng(7).standard_normal((6, 2, 4))
    f = cgru.forward(net, x, training=True)
    net[1].R[5, 3] = -net[1].R[5, 3]
    want = reference.forward(net, x)[0]
    np.testing.assert_allclose(cgru.forward(net, x).y, want, rtol=1e-12, atol=1e-13)
    assert not np.allclose(cgru.forward(net, x).y, f.y, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="different params"):
        cgru.backward(net, x, f.reserve, np.ones_like(f.y))


@pytest.mark.parametrize("num_threads", [1, 2, 3, 8, 9])
def test_a_shared_byte_comparison_sees_every_byte(num_threads):
    """``same_bytes`` on up to ``num_threads`` threads (pieces from 256 KiB on): equal bytes
    are equal, a change of one byte anywhere — each piece's first and last element, its lowest
    byte or only its sign, a signed zero, a NaN's payload — is seen, whatever the pieces."""
    from cgru._kernels.loops import same_bytes
    rng = np.random.default_rng(21)
    for n in (1, 1000, (1 << 15) + 3, 1 << 16, (1 << 17) + 7):     # float64: to 1 MiB
        a = rng.standard_normal(n)
        assert same_bytes(a, a.copy(), num_threads)
        assert same_bytes(a[::-1], a[::-1].copy(), num_threads)      # a of any layout
        pieces = min(num_threads, 8) if a.nbytes >= 1 << 18 else 1
        edges = {0, n - 1} | {min(n - 1, i * -(-n // pieces) + d) for i in range(pieces)
                              for d in (-1, 0)}
        for i in sorted(e for e in edges if e >= 0):
            for value in (a[i] * (1 + 2 ** -52), -a[i], np.nan):    # low byte, top byte
                b = a.copy()
                b[i] = value
                assert not same_bytes(a, b, num_threads), (n, i, value)
        b = np.full(n, np.nan)
        c = b.copy()
        c.view(np.uint64)[n // 2] ^= 1                                # another NaN payload
        assert same_bytes(b, b.copy(), num_threads) and not same_bytes(b, c, num_threads)
    b = np.zeros(4)
    assert not same_bytes(b, -b, num_threads)


def test_the_cache_proves_a_hit_by_the_bytes_alone(monkeypatch):
    """With every fingerprint made equal (a perfect collision of any hash), the kept copies
    still serve only the bytes they hold: the cache never consults a hash."""
    monkeypatch.setattr(reserve, "fingerprint", lambda a: b"\0" * 16)
    net = cgru.Network.random(cgru.Topology(4, 8, 1), np.float64, seed=8)
    x = np.random.default_rng(9).standard_normal((6, 2, 4))
    cgru.forward(net, x)
    net[0].R[1, 1] = -net[0].R[1, 1]
    np.testing.assert_allclose(cgru.forward(net, x).y, reference.forward(net, x)[0],
                               rtol=1e-12, atol=1e-13)


def _race(monkeypatch, which):
    """A weight update in place by another thread while a call's first layer runs (the test
    probe holds the time loop at step 2 until the update is done)."""
    topo = cgru.Topology(4, 8, 3)
    net = cgru.Network.random(topo, np.float64, seed=10)
    old = net.copy()
    x = np.random.default_rng(11).standard_normal((6, 3, 4))
    dy = np.random.default_rng(12).standard_normal((6, 3, 8))
    want_old = _step(old, x, dy)               # what a fresh process computes
    cgru.release_memory()
    f = cgru.forward(net, x, training=True) if which == "backward" else None

    def update():
        while loops.probe_state()["arrived"] < 1:
            threading.Event().wait(0.001)
        for lp in net:                         # every layer, the ones not reached yet too
            for a in lp.arrays().values():
                a *= 1.5
        loops.probe_arrive()
    loops.set_probe(step=2, action=2, needed=2, timeout=60)
    t = threading.Thread(target=update)
    t.start()
    try:
        if which == "forward":
            racing = cgru.forward(net, x, training=True)
            g = cgru.backward(old, x, racing.reserve, dy)   # the call used the old weights
            racing_bits = _all_bits(racing, g)
        else:
            g = cgru.backward(net, x, f.reserve, dy)
            racing_bits = _all_bits(f, g)
    finally:
        t.join()
        loops.set_probe()
    assert not loops.probe_state()["timed_out"]
    return net, old, x, dy, want_old, racing_bits


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_a_racing_update_never_poisons_a_later_call(monkeypatch, which):
    net, old, x, dy, want_old, racing = _race(monkeypatch, which)
    assert _same(racing, want_old)              # the call computed with its start's weights
    for lp, lo in zip(net, old):               # the weights back to the old contents
        for name, a in lp.arrays().items():
            a[...] = lo.arrays()[name]
    assert _same(_step(net, x, dy), want_old)  # race-free calls: a fresh process's bits


def test_a_long_training_loop_keeps_one_entry_per_array():
    """10,000 steps whose weights change in place every step: the cache holds one entry per
    weight array and the same bytes at the end as after the first step."""
    net = cgru.Network.random(cgru.Topology(2, 2, 2), np.float32, seed=13)
    x = np.ones((1, 1, 2), np.float32)
    dy = np.ones((1, 1, 2), np.float32)
    arrays = sum(len(lp.arrays()) for lp in net)
    seen = []
    for step in range(10_000):
        f = cgru.forward(net, x, training=True)
        g = cgru.backward(net, x, f.reserve, dy)
        for lp, dlp in zip(net, g.dparams):
            for name, a in lp.arrays().items():
                a -= np.float32(1e-4) * dlp.arrays()[name]
        if step in (0, 9_999):
            seen.append(weights.cached_entries())
    assert seen[0] == seen[1] and seen[0][0] == arrays


def test_unchanged_weights_reuse_the_setup_made_from_their_copies():
    """Calls whose every weight is proven (by its bytes) to be the copy the last call kept take
    that call's ``Frozen`` — its plans and the kernels' fixed arguments — as it is; a changed
    array, another cell over the same arrays or an emptied cache makes a new one."""
    net = cgru.Network.random(cgru.Topology(4, 6, 2), np.float64, seed=15)
    x = np.random.default_rng(16).standard_normal((5, 3, 4))
    first = weights.freeze(net)
    assert weights.freeze(net) is first
    alias = cgru.Network(net.topology, net.layers)                    # the same arrays
    assert weights.freeze(alias) is first
    # a topology and a cell made anew, of the same values (as a frontend makes them from an
    # op's attributes for every call): the same Frozen; another value: not
    remade = cgru.Network(cgru.Topology(4, 6, 2), net.layers)
    assert remade.topology is not net.topology
    assert weights.freeze(remade) is first
    flip_net = cgru.Network(net.topology, net.layers, cgru.GRUCell(flip_z=True))
    flipped = weights.freeze(flip_net)
    assert flipped is not first
    again = cgru.Network(cgru.Topology(4, 6, 2), net.layers, cgru.GRUCell(flip_z=True))
    assert weights.freeze(again) is flipped and again.cell is not flipped.net.cell
    y = cgru.forward(flip_net, x).y
    made = len(flipped._args)                   # the kernels' arguments, made once
    np.testing.assert_array_equal(cgru.forward(again, x).y, y)
    assert len(flipped._args) == made
    assert weights.freeze(cgru.Network(net.topology, net.layers, cgru.GRUCell())) is not flipped
    other = net.with_cell(cgru.GRUCell(reset_after=False))            # another cell
    assert weights.freeze(other) is not first
    np.testing.assert_allclose(cgru.forward(other, x).y, reference.forward(other, x)[0],
                               rtol=1e-12, atol=1e-13)
    net[1].b_R[0] += 0.5                                               # one array changed
    changed = weights.freeze(net)
    assert changed is not first and weights.freeze(net) is changed
    assert changed.kept[0]["W"] is first.kept[0]["W"]                  # the others kept
    np.testing.assert_allclose(cgru.forward(net, x).y, reference.forward(net, x)[0],
                               rtol=1e-12, atol=1e-13)
    cgru.release_memory()
    assert all(k.frozen is None for ks in changed.kept for k in ks.values())
    assert weights.freeze(net) is not changed


def test_an_evicted_copy_is_held_by_no_setup(monkeypatch):
    """A copy that leaves the cache leaves its ``Frozen`` too, so nothing holds the copies of a
    network beyond the cache's bound."""
    monkeypatch.setattr(weights, "CACHE_BYTES", 1 << 20)
    x = np.ones((3, 2, 16))
    nets = [cgru.Network.random(cgru.Topology(16, 64, 1), np.float64, seed=s) for s in range(12)]
    frozen = []
    for net in nets:
        cgru.forward(net, x)
        frozen.append(weights.freeze(net))
    evicted = [k for f in frozen for ks in f.kept for k in ks.values() if not k.cached]
    assert evicted and all(k.frozen is None for k in evicted)
    assert all(k.frozen is not None for ks in frozen[-1].kept for k in ks.values())


def test_the_cache_is_bounded_in_bytes(monkeypatch):
    monkeypatch.setattr(weights, "CACHE_BYTES", 1 << 20)
    x = np.ones((3, 2, 16))
    nets = [cgru.Network.random(cgru.Topology(16, 64, 1), np.float64, seed=s) for s in range(12)]
    for net in nets:                            # ~220 KiB of copies and packs each
        cgru.forward(net, x)
    n, nbytes = weights.cached_entries()
    assert 0 < nbytes <= 1 << 20 and n < 12 * 4
    frozen = weights.freeze(nets[0])
    assert all(not k.array.flags.writeable for layer in frozen.kept for k in layer.values())


def test_threads_sharing_the_cache_get_their_own_weights_bits():
    """Calls from several threads at once, each with its own weights (and two with equal
    weights in different arrays), give the bits of the same calls made one after the other."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal((7, 3, 4))
    nets = [cgru.Network.random(cgru.Topology(4, 6, 2), np.float64, seed=s % 3, cell=cell)
            for s, cell in enumerate([cgru.GRUCell(), cgru.LSTMCell(), cgru.RNNCell()] * 2)]
    dy = np.ones((7, 3, 6))
    want = [_step(net, x, dy) for net in nets]
    cgru.release_memory()
    got, errors = [None] * len(nets), []

    def worker(i):
        try:
            for _ in range(5):
                got[i] = _step(nets[i], x, dy)
        except Exception as exc:      # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(nets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(_same(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("cell", [cgru.GRUCell(), cgru.LSTMCell(peepholes="ifgo")], ids=repr)
def test_a_stream_is_a_snapshot_of_every_array(cell):
    """In-place changes after the stream was made — the GRU's recurrent candidate bias and an
    LSTM's peepholes included, which it used to keep as views — are not seen until
    ``refresh()``."""
    net = cgru.Network.random(cgru.Topology(4, 6, 2), np.float64, seed=15, cell=cell)
    x = np.random.default_rng(16).standard_normal((3, 2, 4))
    stream = cgru.Stream(net)
    want, _ = stream.step(x)
    for lp in net:
        for a in lp.arrays().values():
            a += 0.5
    got, _ = stream.step(x)
    np.testing.assert_array_equal(got, want)
    stream.refresh()
    np.testing.assert_allclose(stream.step(x)[0], cgru.forward(net, x).y, rtol=1e-12,
                               atol=1e-13)


# --- sealed networks: proven by identity ------------------------------------------------------

def _sealed_pair(cell, dtype=np.float64):
    topo = cgru.Topology(4, 6, 2, "bidirectional",
                         proj_size=3 if cell.kind == "lstm" and not cell.peepholes else 0)
    net = cgru.Network.random(topo, dtype, seed=1, cell=cell)
    return net, net.sealed()


@pytest.mark.parametrize("cell", CELLS, ids=repr)
def test_a_sealed_network_computes_the_same_bits(cell):
    net, sealed = _sealed_pair(cell)
    assert sealed.is_sealed and not net.is_sealed and sealed.sealed() is sealed
    assert sealed.cell == net.cell and sealed.topology == net.topology
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 3, 4))
    dy = rng.standard_normal((5, 3, 2 * net.topology.state_size))
    expected = _step(net, x, dy)
    assert _same(_step(sealed, x, dy), expected)
    assert _same(_step(sealed, x, dy), expected)      # the second call: from what it kept
    # the reserve covers the bytes, not the memory: either network's backward takes it
    f = cgru.forward(sealed, x, training=True)
    assert _same(_all_bits(f, cgru.backward(net, x, f.reserve, dy)), expected)


def test_sealed_weights_cannot_be_made_writeable():
    _, sealed = _sealed_pair(cgru.GRUCell())
    for lp in sealed.layers:
        for a in lp.arrays().values():
            for view in (a, a[1:], a.reshape(-1), a.T, a.view()):
                assert not view.flags.writeable
                with pytest.raises(ValueError, match="WRITEABLE"):
                    view.flags.writeable = True
                with pytest.raises(ValueError):
                    view[...] = 0


def test_a_sealed_call_neither_compares_nor_copies_nor_packs_again(monkeypatch):
    """The proof by identity: after the first call, a call on sealed weights reads no byte of
    them to prove them and packs nothing; an unsealed network compares every array."""
    packs = _count_packs(monkeypatch)
    proofs, copies = [], []
    real_same, real_copy = weights.same_bytes, weights._copy
    monkeypatch.setattr(weights, "same_bytes",
                        lambda a, b, nt=1: proofs.append(1) or real_same(a, b, nt))
    monkeypatch.setattr(weights, "_copy", lambda a, fingerprinted=False:
                        copies.append(1) or real_copy(a, fingerprinted))
    net, sealed = _sealed_pair(cgru.GRUCell())
    x = np.random.default_rng(2).standard_normal((5, 3, 4))
    arrays = sum(len(lp.arrays()) for lp in net.layers)
    cgru.forward(sealed, x)
    first = len(packs)
    assert first > 0 and not proofs and not copies
    for _ in range(3):
        cgru.forward(sealed, x, training=True)
    assert len(packs) == first and not proofs and not copies
    cgru.forward(net, x)
    cgru.forward(net, x)
    assert len(proofs) == arrays and len(copies) == arrays        # the control: it can fail


def test_what_a_sealed_network_derives_lives_with_it_outside_the_cache():
    import gc
    net, sealed = _sealed_pair(cgru.LSTMCell())
    x = np.random.default_rng(2).standard_normal((5, 3, 4))
    cgru.forward(sealed, x)
    assert weights.cached_entries() == (0, 0)
    memory = [cgru.core.network.memory_owner(sealed[0].R)]
    assert memory[0].__dict__, "the packs hang on the sealed memory"
    cgru.release_memory()                    # does not reach them: the next call is still free
    assert memory[0].__dict__
    del sealed, memory
    gc.collect()
    cgru.forward(net, x)
    assert weights.cached_entries()[0] == sum(len(lp.arrays()) for lp in net.layers)


def test_an_odd_view_of_sealed_memory_is_proven_by_its_bytes(monkeypatch):
    """A strided view of sealed memory is copied and compared as any array is (the kernels
    read C-contiguous copies); its results are those of the same values unsealed."""
    net, _ = _sealed_pair(cgru.RNNCell("tanh"))
    seal = cgru.core.network._seal
    strided = net.map(lambda a: seal(np.repeat(a[..., None], 2, axis=-1))[..., 0])
    assert strided.is_sealed and not strided[0].W.flags.c_contiguous
    x = np.random.default_rng(2).standard_normal((5, 3, 4))
    dy = np.random.default_rng(3).standard_normal((5, 3, 12))
    assert _same(_step(strided, x, dy), _step(net, x, dy))
    assert weights.cached_entries()[0] > 0


def test_a_stream_of_a_sealed_network_steps_as_forward():
    net = cgru.Network.random(cgru.Topology(4, 6, 2), np.float32, seed=1)
    sealed = net.sealed()
    x = np.random.default_rng(2).standard_normal((5, 3, 4)).astype(np.float32)
    stream = cgru.Stream(sealed)
    state, steps = None, []
    for t in range(5):
        y, state = stream.step(x[t], state)
        steps.append(y)
    assert np.allclose(np.stack(steps), cgru.forward(net, x).y, rtol=1e-5, atol=1e-6)


def test_a_training_call_fingerprints_new_weights_as_it_copies_them(monkeypatch):
    """A training forward's new copies come with their fingerprints (one pass each: no
    fingerprint of the copies after), the reserve's MAC is the one of separate fingerprints,
    and its backward takes it; an inference copies without fingerprinting."""
    passes = []                         # fingerprint passes over kept copies (read-only)
    real = reserve.fingerprint

    def counted(a):
        if not a.flags.writeable:
            passes.append(a.nbytes)
        return real(a)
    monkeypatch.setattr(reserve, "fingerprint", counted)
    net = cgru.Network.random(cgru.Topology(4, 6, 2), np.float64, seed=3)
    x = np.random.default_rng(5).standard_normal((5, 3, 4))
    f = cgru.forward(net, x, training=True)
    assert passes == []
    frozen = weights.freeze(net)
    mac = reserve.mac(b"weights", *[name.encode() + k.fingerprint for layer in frozen.kept
                                    for name, k in layer.items()])
    assert frozen.fingerprints() == [name.encode() + reserve.describe(k.array, real(k.array))
                                     for layer in frozen.kept for name, k in layer.items()]
    assert reserve.weights_mac(frozen) == mac
    g = cgru.backward(net, x, f.reserve, np.ones_like(f.y))
    assert passes == [] and np.isfinite(g.dx).all()
    net.layers[0].W[0, 0] += 1.0
    cgru.forward(net, x)                                     # new weights, an inference
    frozen = weights.freeze(net)
    assert passes == [] and frozen.kept[0]["W"]._fingerprint is None
    frozen.fingerprints()               # asked for: a pass of its own, for the one new copy
    assert passes == [net.layers[0].W.nbytes]


def _cyclic_garbage(step, steps=5):
    """The objects that ``steps`` calls of ``step`` leave for the cyclic garbage collector
    (found with it switched off, after a first call has filled the caches)."""
    step()
    gc.collect()
    gc.disable()
    try:
        for _ in range(steps):
            step()
        return gc.collect()
    finally:
        gc.enable()


@pytest.mark.parametrize("cell", [None, cgru.LSTMCell(), cgru.RNNCell()],
                         ids=["gru", "lstm", "rnn"])
def test_replaced_copies_are_freed_at_once(cell):
    """A copy whose weights changed leaves nothing in a reference cycle: its memory and its
    packs return as soon as the next call replaces it, not when the garbage collector next
    runs — a training loop on 768×256 weights held 90 MiB more at its peak while they waited.
    Every kind of call: training steps with an in-place update, inferences of changed weights,
    a stream's steps."""
    net = cgru.Network.random(cgru.Topology(8, 16, 2, direction="bidirectional"), np.float32,
                              seed=21, cell=cell)
    x = np.ones((3, 2, 8), np.float32)
    dy = np.ones((3, 2, 32), np.float32)

    def train():
        f = cgru.forward(net, x, training=True)
        g = cgru.backward(net, x, f.reserve, dy)
        for lp, dlp in zip(net, g.dparams):
            for name, a in lp.arrays().items():
                a -= np.float32(1e-3) * dlp.arrays()[name]

    def infer():
        cgru.forward(net, x)
        net[1].R[0, 0] += 1

    stream = cgru.Stream(cgru.Network.random(cgru.Topology(8, 16, 2), np.float32, seed=22,
                                             cell=cell))
    assert _cyclic_garbage(train) == 0
    assert _cyclic_garbage(infer) == 0
    assert _cyclic_garbage(lambda: stream.step(x[0])) == 0
    old = weights.freeze(net).kept[0]["W"]
    gone = weakref.ref(old.array)
    del old
    gc.disable()
    try:
        net[0].W[0, 0] += 1
        weights.freeze(net)
        assert gone() is None
    finally:
        gc.enable()
