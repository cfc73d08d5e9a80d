"""Reserves rebuilt from another system's saved training state, for MPSGraph's gradient ops.

MPSGraph's GRU, LSTM and singleGateRNN training forward returns a ``zState`` (and the LSTM its
cell states) that is smaller than cgru's reserve; its gradient ops are given that state, not
cgru's reserve.  These functions rebuild the reserve the same forward would have written,
without re-running its time loop: the states from the outputs and the saved values, the rest
as whole-sequence GEMMs (the cell kind's ``rebuild_from_gates`` / ``rebuild_from_saved``).
One layer, full-length sequences, time-major.
"""
import numpy as np

from cgru.core import kinds, reserve as reserve_mod, validate, weights
from cgru.core.backend import BACKEND
from cgru.core.calls import check_h, check_network, check_state_mask, check_x, open_reserve

__all__ = ["reserve_gates", "reserve_from_gates", "reserve_from_saved"]


def reserve_gates(reserve, net, x, *, cell=None):
    """The activated gates a training forward saved: a list of ``L·D`` arrays ``[T, N, G·H]``
    (index ``l·D + d``; zeros on inactive steps), copied out of ``reserve``.  Pass the
    forward's ``net`` and time-major ``x``."""
    topo, dtype = check_network(net)
    cell = net.resolve_cell(cell)
    T, N = check_x(x, topo, dtype, False, cell.gates)
    opened = open_reserve(reserve, net, cell, T, N, False)
    return [v["gates"].copy() for v in opened.lds]


def _new_reserve(net, cell, x, T, N, h0, c0, mask, frozen):
    layout = reserve_mod.Layout(net.topology, cell, T, N, net.dtype)
    rv, (_, _, lds, _) = reserve_mod.create(
        layout, lengths=np.full(N, T, np.int64), dropout=0.0, seed=0, seed2=0,
        batch_major=False, x=reserve_mod.data_mac(b"x", x),
        weights=reserve_mod.weights_mac(frozen), h0=reserve_mod.data_mac(b"h0", h0, c0),
        state_mask=reserve_mod.data_mac(b"state_mask", mask))
    return rv, lds


def reserve_from_gates(net, x, gates, y, h0=None, *, cell=None, state_mask=None):
    """Rebuild the reserve of a training forward from its saved gates and its outputs.

    ``gates`` is a list of ``D`` arrays ``[T, N, 3H]`` holding each direction's activated r, z,
    n; ``y`` ``[T, N, D·H]`` the forward's output; ``h0`` ``[D, N, H]`` (``None``: zeros).
    The recurrent candidate term ``h·R_nᵀ + b_Rn`` is recomputed as one GEMM over all steps.
    Cells with clip, or activations other than sigmoid, tanh, identity, relu and
    hard_sigmoid, are refused (their derivative needs the pre-activation itself).

    Returns the reserve to pass to ``backward`` with the same ``net``, ``x`` and
    ``state_mask``.
    """
    topo, dtype = check_network(net)
    cell = net.resolve_cell(cell)
    kind = kinds.of(cell)
    if not kind.rebuilds_from_gates:
        raise ValueError(f"cell: reserve_from_gates rebuilds GRU reserves, got a {cell.kind} "
                         f"cell (reserve_from_saved rebuilds the others)")
    if topo.num_layers != 1:
        raise ValueError(f"net: reserve_from_gates needs one layer, got "
                         f"num_layers={topo.num_layers}")
    refusal = kind.rebuild_refusal(cell)
    if refusal is not None:
        raise ValueError(f"{refusal[0]}: reserve_from_gates {refusal[1]}")
    T, N = check_x(x, topo, dtype, False, cell.gates)
    H, D, G = topo.hidden_size, topo.num_directions, cell.gates
    if not isinstance(gates, (list, tuple)) or len(gates) != D:
        raise ValueError(f"gates: expected a list of D={D} arrays [T, N, {G}H], got "
                         f"{type(gates).__name__} of length "
                         f"{len(gates) if hasattr(gates, '__len__') else '?'}")
    for d, g in enumerate(gates):
        validate.array(g, f"gates[{d}]", dtype, (T, N, G * H))
    validate.array(y, "y", dtype, (T, N, D * H))
    h0 = check_h(h0, "h0", topo, dtype, N)
    if h0 is None:
        h0 = np.zeros((D, N, H), dtype)
    mask = check_state_mask(state_mask, topo, dtype, T, N, False)
    frozen = weights.freeze(net, fingerprinted=True)
    rv, lds = _new_reserve(net, cell, x, T, N, h0, None, mask, frozen)
    for d in range(D):
        kind.rebuild_from_gates(BACKEND, lds[d], frozen.net[d], cell, topo, d, gates[d], y, h0[d], mask)
    return rv


def reserve_from_saved(net, x, saved, *, h0=None, c0=None, state_mask=None):
    """Rebuild the reserve of an LSTM or vanilla-RNN training forward from what it saved
    elsewhere (MPSGraph's ``zState`` and cell output), without re-running its time loop.

    One layer (no projection); ``saved`` holds per direction (lists of ``D`` arrays, original
    time order like the output):

    * LSTM: ``"gates"`` ``[T, N, 4H]`` the activated i, f, g, o of every step and ``"cells"``
      ``[T, N, H]`` the cell state after every step;
    * RNN: ``"pre"`` ``[T, N, H]`` the pre-activation ``x·Wᵀ + b_W + (h ⊙ m)·Rᵀ + b_R``.

    ``h0``, ``c0`` ``[D, N, H]`` (``None``: zeros).  Every activation, clip and peephole form
    is supported (pre-activations are recomputed exactly).  Returns the reserve to pass to
    ``backward`` with the same ``net``, ``x`` and ``state_mask``.
    """
    topo, dtype = check_network(net)
    cell = net.resolve_cell(None)
    kind = kinds.of(cell)
    if kind.saved_for_rebuild is None:
        raise ValueError(f"net: reserve_from_saved rebuilds LSTM and RNN reserves (a GRU's: "
                         f"reserve_from_gates), got a {cell.kind} cell")
    if topo.num_layers != 1 or topo.proj_size:
        raise ValueError(f"net: reserve_from_saved needs one layer without a projection, got "
                         f"num_layers={topo.num_layers}, proj_size={topo.proj_size}")
    T, N = check_x(x, topo, dtype, False, cell.gates)
    H, D = topo.hidden_size, topo.num_directions
    names = {name: width(H) for name, width in kind.saved_for_rebuild.items()}
    if not isinstance(saved, dict) or set(saved) != set(names):
        raise ValueError(f"saved: expected a dict with {sorted(names)}, got "
                         f"{sorted(saved) if isinstance(saved, dict) else type(saved).__name__}")
    for name, width in names.items():
        arrays = saved[name]
        if not isinstance(arrays, (list, tuple)) or len(arrays) != D:
            raise ValueError(f"saved[{name!r}]: expected a list of D={D} arrays [T, N, "
                             f"{width}], got {type(arrays).__name__}")
        for d, a in enumerate(arrays):
            validate.array(a, f"saved[{name!r}][{d}]", dtype, (T, N, width))
    h0 = check_h(h0, "h0", topo, dtype, N)
    h0 = np.zeros((D, N, H), dtype) if h0 is None else h0
    if kind.has_cell_state:
        c0 = check_h(c0, "c0", topo, dtype, N, H)
        c0 = np.zeros((D, N, H), dtype) if c0 is None else c0
    elif c0 is not None:
        raise ValueError("c0: only an LSTM has a cell state")
    mask = check_state_mask(state_mask, topo, dtype, T, N, False)
    frozen = weights.freeze(net, fingerprinted=True)
    rv, lds = _new_reserve(net, cell, x, T, N, h0, c0, mask, frozen)
    for d in range(D):
        kind.rebuild_from_saved(BACKEND, lds[d], frozen.net[d], cell, topo, d, x, saved, h0[d],
                                None if c0 is None else c0[d], mask)
    return rv
