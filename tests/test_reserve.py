"""The reserve (cgru.core.reserve): sized in closed form, carved by the same layout, bound to
its call.

A backward given the reserve of another call — other ``x``, other weights, other state mask,
``batch_major`` flipped with ``T = N`` (same sizes, other layout) — used to compute wrong
gradients without a word (dx off by 0.59, dW by 3.3).  The reserve now records digests of the
forward's ``x``, weights, ``h0`` and state mask, and the backward refuses any mismatch.
"""
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


def test_digest_sees_dtype_shape_and_every_byte():
    from cgru._kernels.loops import digest
    a = np.arange(24, dtype=np.float64)
    base = digest(a)
    assert digest(a.copy()) == base
    assert digest(a.reshape(4, 6)) != base
    assert digest(a.astype(np.float32)) != digest(a.astype(np.float32).view(np.int32))
    for i in range(24):                              # every element, every byte position
        b = a.copy()
        b.view(np.uint8)[8 * i + (i % 8)] ^= 1
        assert digest(b) != base, i
    assert digest(a[::2]) == digest(np.ascontiguousarray(a[::2]))


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
