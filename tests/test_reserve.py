"""The reserve (cgru.core.reserve): sized in closed form, carved by the same layout, bound to
its call.

A backward given the reserve of another call — other ``x``, other weights, other state mask,
``batch_major`` flipped with ``T = N`` (same sizes, other layout) — used to compute wrong
gradients without a word (dx off by 0.59, dW by 3.3).  The reserve now records keyed MACs of
the forward's ``x``, weights, ``h0`` and state mask, and the backward refuses any mismatch;
and a MAC of its own header and lengths, so that a reserve whose dropout, seeds, lengths or
layout were changed afterwards (accepted before, giving other gradients) is refused too.
"""
import subprocess
import sys

import numpy as np
import pytest

import cgru
from cgru import Cell, Network, Topology
from cgru.core import reserve as rv

T, N, I, H = 4, 4, 3, 5          # T = N: a flipped layout has the same sizes


def _case(batch_major=False, mask=False):
    rng = np.random.default_rng(0)
    net = Network.random(Topology(I, H, 2, "bidirectional"), np.float64, seed=1)
    x = rng.standard_normal((T, N, I))
    m = rng.uniform(0.5, 1.5, (T, N, 2 * H)) if mask else None
    f = cgru.forward(net, x, training=True, batch_major=batch_major, state_mask=m)
    return net, x, m, f


def test_backward_of_its_own_forward_works():
    net, x, _, f = _case()
    cgru.backward(net, x, f.reserve, np.ones_like(f.y))


@pytest.mark.parametrize("what", ["x", "one element of x", "weights", "one weight"])
def test_another_x_or_other_weights_are_refused(what):
    net, x, _, f = _case()
    if what == "x":
        x = x + 1
    elif what == "one element of x":
        x = x.copy()
        x[2, 1, 0] = np.nextafter(x[2, 1, 0], 10)
    elif what == "weights":
        net = net.map(lambda a: a * 0.5)
    else:
        net[1].R[3, 2] += 1e-12                     # in place: the user's array changed
    name = "x" if "x" in what else "params"
    with pytest.raises(ValueError, match=f"reserve: written by a forward with a different {name}"):
        cgru.backward(net, x, f.reserve, np.ones_like(f.y))


def test_batch_major_flipped_with_T_equal_N_is_refused():
    net, x, _, f = _case(batch_major=False)
    with pytest.raises(ValueError, match="reserve:.*batch_major=False.*batch_major=True"):
        cgru.backward(net, x, f.reserve, np.ones_like(f.y), batch_major=True)


def test_another_state_mask_is_refused():
    net, x, m, f = _case(mask=True)
    with pytest.raises(ValueError, match="different state_mask"):
        cgru.backward(net, x, f.reserve, state_mask=m * 2)
    with pytest.raises(ValueError, match="different state_mask"):
        cgru.backward(net, x, f.reserve)                      # the mask left out


def test_same_values_in_another_memory_layout_are_accepted():
    """The digests are of the values: a Fortran-ordered copy of x is the same x."""
    net, x, _, f = _case()
    g1 = cgru.backward(net, x, f.reserve, np.ones_like(f.y))
    g2 = cgru.backward(net, np.asfortranarray(x), f.reserve, np.ones_like(f.y))
    np.testing.assert_array_equal(g1.dx, g2.dx)


def test_fingerprint_sees_every_byte_and_only_the_bytes():
    from cgru._kernels.loops import fingerprint
    a = np.arange(300, dtype=np.float64)               # 2,400 bytes: two blocks and a tail
    base = fingerprint(a)
    assert len(base) == 16 and fingerprint(a.copy()) == base
    assert fingerprint(a.reshape(20, 15)) == base       # bytes only; the MAC adds the shape
    for i in range(a.nbytes):                           # every byte position, every bit
        b = a.copy()
        b.view(np.uint8)[i] ^= 1 << (i % 8)
        assert fingerprint(b) != base, i
    assert fingerprint(a[:-1]) != base and fingerprint(np.append(a, 0.0)) != base
    assert fingerprint(a[::2]) == fingerprint(np.ascontiguousarray(a[::2]))


def test_what_a_mac_covers_names_the_dtype_and_the_shape():
    # describe's words for a (dtype, shape) are made once and kept: the same bytes under another
    # dtype, shape or byte order are described apart, and the dropout slot's bits round-trip
    a = np.arange(12, dtype=np.float64)
    words = {rv.describe(b) for b in (a, a.reshape(3, 4), a.reshape(4, 3), a.view(np.int64),
                                      a.view(">f8"), a.view("<f4"))}
    assert len(words) == 6
    assert rv.describe(a.reshape(3, 4)) == rv.describe(a.reshape(3, 4).copy())
    assert rv.describe(a).startswith(b"<f8(12,)")
    for p in (0.0, -0.0, 0.3, 1 / 3, np.nextafter(1.0, 0.0), np.float32(0.1)):
        bits = rv._float_bits(p)
        assert bits == int(np.float64(p).view(np.int64))
        assert np.float64(rv._bits_float(bits)).tobytes() == np.float64(p).tobytes()


def test_fingerprint_is_the_same_on_every_isa_path():
    from cgru._kernels.loops import fingerprint, simd_isa
    levels = {"AVX-512": [0, 3, 4], "AVX2+FMA": [0, 3], "baseline": [0]}[simd_isa()]
    rng = np.random.default_rng(3)
    for n in (0, 1, 7, 1023, 1024, 1025, 4096, 10_007):
        a = rng.integers(0, 256, n, dtype=np.uint8)
        assert len({fingerprint(a, isa=i) for i in levels}) == 1, n
    with pytest.raises(ValueError, match="isa"):
        fingerprint(a, isa=5)


def test_a_fingerprinted_copy_is_the_array_and_its_fingerprint_the_copys():
    """``copy_fingerprint`` (a training call's new weights: copied and fingerprinted in one
    pass) gives a new C-contiguous copy and ``fingerprint`` of it, on every ISA path, for
    sizes around its blocks, dtypes and views."""
    from cgru._kernels.loops import copy_fingerprint, fingerprint, simd_isa
    levels = {"AVX-512": [0, 3, 4], "AVX2+FMA": [0, 3], "baseline": [0]}[simd_isa()]
    rng = np.random.default_rng(4)
    for n in (0, 1, 7, 255, 256, 257, 1023, 1024, 1025, 4096, 10_007):
        for dtype in (np.uint8, np.float32, np.float64):
            a = (rng.standard_normal(n) * 100).astype(dtype)
            for isa in levels:
                copy, fp = copy_fingerprint(a, isa)
                assert type(copy) is np.ndarray and copy.dtype == a.dtype, (n, dtype, isa)
                assert copy.flags.c_contiguous and copy.ctypes.data != a.ctypes.data
                np.testing.assert_array_equal(copy, a)
                assert fp == fingerprint(a), (n, dtype, isa)
    m = rng.standard_normal((12, 40))
    for view in (m[:, ::3], m.T, m[2:9]):
        copy, fp = copy_fingerprint(view)
        np.testing.assert_array_equal(copy, view)
        assert copy.flags.c_contiguous and fp == fingerprint(np.ascontiguousarray(view))


def test_a_fingerprinted_copy_is_consistent_while_its_source_is_written():
    """The fingerprint is the copy's, whatever another thread writes to the source during the
    pass: a thread rewrites 256 bytes of it thousands of times per call (each time with the
    other of two patterns), so that many copies catch it mid-write — each copy's fingerprint
    must still be that of its own bytes (the vector code hashes the very register it stores;
    a reload of the source for the hash fails this)."""
    import threading
    from cgru._kernels.loops import copy_fingerprint, fingerprint
    src = np.arange(1 << 14, dtype=np.float32) + 1          # 64 KiB
    hot = src[64:128]
    pattern = np.tile(np.stack([hot.copy(), -hot]), (2000, 1))
    target = np.lib.stride_tricks.as_strided(hot, shape=pattern.shape, strides=(0, 4))
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            np.copyto(target, pattern)          # (NumPy lets the GIL go while it copies)
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    torn = 0
    try:
        for _ in range(20_000):
            copy, fp = copy_fingerprint(src)
            assert fp == fingerprint(copy)
            part = copy[64:128]
            torn += not (np.array_equal(part, pattern[0]) or np.array_equal(part, pattern[1]))
    finally:
        stop.set()
        t.join()
    if not torn:
        pytest.skip("no copy caught the writer mid-write (no concurrency on this run)")


def test_the_key_is_drawn_per_process():
    """Nobody outside the process can compute its fingerprints: another process gets other
    values for the same bytes (so a collision cannot be crafted in advance)."""
    code = ("import numpy as np; from cgru._kernels.loops import fingerprint; "
            "print(fingerprint(np.arange(100.0)).hex())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, check=True).stdout.strip() for _ in range(2)}
    from cgru._kernels.loops import fingerprint
    outs.add(fingerprint(np.arange(100.0)).hex())
    assert len(outs) == 3


@pytest.mark.parametrize("field", ["dropout", "seed", "seed2", "T", "a recorded MAC",
                                   "flags", "one length", "the seal"])
def test_a_changed_header_field_is_refused(field):
    rng = np.random.default_rng(5)
    net = Network.random(Topology(I, H, 2), np.float64, seed=1)
    x = rng.standard_normal((T, N, I))
    f = cgru.forward(net, x, training=True, dropout=0.3, seed=(4, 5),
                     lengths=np.array([4, 2, 3, 1]))
    head = f.reserve[:128].view(np.int64)
    lengths = f.reserve[128:128 + 8 * N].view(np.int64)
    if field == "dropout":
        head[6] = np.float64(0.25).view(np.int64)
    elif field == "one length":
        lengths[1] = 3
    else:
        slot = {"seed": 7, "seed2": 8, "T": 2, "a recorded MAC": 11, "flags": 13,
                "the seal": 14}[field]
        head[slot] ^= 1
    with pytest.raises(ValueError, match="do not verify"):
        cgru.backward(net, x, f.reserve, np.ones_like(f.y))


def test_what_an_opened_reserve_checked_is_what_it_uses():
    """The header and the lengths are checked and used as one snapshot: a thread writing the
    reserve after ``read`` verified it (here, the test itself, between the check and the use)
    cannot change the lengths the loops run to, or the values the MACs are compared with."""
    rng = np.random.default_rng(6)
    net = Network.random(Topology(I, H, 1), np.float64, seed=1)
    x = rng.standard_normal((T, N, I))
    f = cgru.forward(net, x, training=True, lengths=np.array([4, 2, 3, 1]))
    layout = rv.layout_of(net.topology, net.cell, T, N, net.dtype)
    opened = rv.read(f.reserve, layout, batch_major=False)
    recorded = opened.header[rv._SLOTS["x"]]
    f.reserve[128:128 + 8 * N].view(np.int64)[:] = 10 ** 9      # lengths far beyond T
    f.reserve[:128].view(np.int64)[rv._SLOTS["x"]] ^= 1          # and another x's MAC
    assert opened.lengths.tolist() == [4, 2, 3, 1]
    assert not np.shares_memory(opened.lengths, f.reserve)
    assert opened.header[rv._SLOTS["x"]] == recorded
    opened.check("x", rv.data_mac(b"x", x))                      # the checked value holds


def test_layout_is_closed_form_and_matches_the_carved_regions():
    topo = Topology(7, 5, 3, "bidirectional")
    for cell in (Cell(), Cell(reset_after=False), Cell(g="relu")):
        layout = rv.Layout(topo, cell, 6, 4, np.float32)
        buf = np.zeros(layout.nbytes, np.uint8)
        header, lengths, lds, xin = layout.carve(buf)
        assert len(lds) == 6 and sorted(xin) == [1, 2]
        ends = [header.ctypes.data + header.nbytes, lengths.ctypes.data + lengths.nbytes]
        ends += [v.ctypes.data + v.nbytes for d in lds for v in d.values()]
        ends += [v.ctypes.data + v.nbytes for v in xin.values()]
        assert max(ends) <= buf.ctypes.data + buf.size
        assert cgru.reserve_nbytes(topo, 6, 4, cell=cell) == layout.nbytes
    # a million layers: answered at once (no per-layer loop)
    big = Topology(4, 4, 10 ** 6, "bidirectional")
    assert cgru.reserve_nbytes(big, 5, 3) == rv.Layout(big, Cell(), 5, 3, np.float32).nbytes
