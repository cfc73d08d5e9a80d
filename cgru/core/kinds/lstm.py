"""The LSTM: cuDNN's ``CUDNN_LSTM`` (= PyTorch's ``nn.LSTM``, with its recurrent projection),
ONNX's (peepholes "ifo", coupled gates) and MPSGraph's (peepholes "ifgo").

One step, row-vector form (gates i, f, g, o; ``W``/``R`` ``[4H, in]``/``[4H, S]``; S = P with
a projection ``W_p`` ``[P, H]``, else H; ``c(·)`` ONNX's clip; ``m`` the state mask; peepholes
zero without ``cell.peepholes``: "ifo" ``P = [P_i, P_f, P_o]``, "ifgo" ``[P_i, P_f, P_g, P_o]``)::

    a = x_proj + b_W + h_m·Rᵀ + b_R
    i = f_i(c(a_i + P_i ⊙ c)),  f = f_f(c(a_f + P_f ⊙ c))  (input_forget: f = 1 − i)
    g = g(c(a_g))                              ("ifgo": g = g(c(a_g + P_g ⊙ c)))
    c' = f ⊙ c + i ⊙ g;   o = f_o(c(a_o + P_o ⊙ c'))   ("ifgo": P_o ⊙ c);   h' = o ⊙ h(c')
    (projection: h' = (o ⊙ h(c'))·W_pᵀ)

Saved per layer-direction: the activated gates ``[T, N, 4H]``, the states ``[T+1, N, S]``, the
cell states ``[T+1, N, H]``, ``o ⊙ h(c')`` ``[T, N, H]`` before a projection, the
pre-activations off the fast path.  The kernels add ``b = b_W + b_R``; the projection is a
second packed matrix; the backward keeps the projection's input gradient ``dhp`` for
``dW_p``, and the peephole gradients are column sums after each block of time's loops.
"""
import numpy as np

from cgru.core.activations import act_and_grad, activate, activate_grad, clamp
from cgru.core.kinds.base import Kind, input_projection, put_slots, slots_before

__all__ = ["KIND", "step", "step_backward", "peepholes"]


def peepholes(cell, lp, H, dtype):
    """``(p_i, p_f, p_g, p_o, p_o_new)``: the peephole weights on ``c`` of each gate and the
    output gate's on ``c'`` (zeros where the cell's peephole form has none)."""
    z = np.zeros(H, dtype)
    if cell.peepholes == "ifgo":
        return lp.P[:H], lp.P[H:2 * H], lp.P[2 * H:3 * H], lp.P[3 * H:], z
    if cell.peepholes:
        return lp.P[:H], lp.P[H:2 * H], z, z, lp.P[2 * H:]
    return z, z, z, z, z


def step(cell, x_proj, h, c, lp, mask=None):
    """One LSTM step for a batch: ``(h' [N, S], c' [N, H])`` (``lp``: the layer-direction's
    weights; ``W_p`` its projection or ``None``)."""
    H = c.shape[-1]
    h_m = h if mask is None else h * mask
    a = x_proj + lp.b_W + h_m @ lp.R.T + lp.b_R                             # [N, 4H]
    p_i, p_f, p_g, p_o, p_on = peepholes(cell, lp, H, a.dtype)
    i = activate(cell.f_i, clamp(cell, a[:, :H] + p_i * c))
    f = activate(cell.f_f, clamp(cell, a[:, H:2 * H] + p_f * c))
    if cell.input_forget:
        f = c.dtype.type(1) - i
    g = activate(cell.g, clamp(cell, a[:, 2 * H:3 * H] + p_g * c))
    c_new = f * c + i * g
    o = activate(cell.f_o, clamp(cell, a[:, 3 * H:] + p_o * c + p_on * c_new))
    hf = o * activate(cell.h, c_new)                                        # [N, H]
    return (hf if lp.W_p is None else hf @ lp.W_p.T), c_new


def step_backward(cell, x_proj, h, c, lp, mask, dh_new, dc_new):
    """Undo one ``step``: given ``∂L/∂h'`` and ``∂L/∂c'``, return ``(dx_proj [N, 4H],
    dh [N, S], dc [N, H], {"R", "b_W", "b_R", "W_p"} gradients)``."""
    H = c.shape[-1]
    m = np.ones_like(h) if mask is None else mask
    h_m = h * m
    a = x_proj + lp.b_W + h_m @ lp.R.T + lp.b_R
    p_i, p_f, p_g, p_o, p_on = peepholes(cell, lp, H, a.dtype)
    i, di_da = act_and_grad(cell, cell.f_i, a[:, :H] + p_i * c)
    f, df_da = act_and_grad(cell, cell.f_f, a[:, H:2 * H] + p_f * c)
    if cell.input_forget:
        f, df_da = c.dtype.type(1) - i, np.zeros_like(df_da)
    g, dg_da = act_and_grad(cell, cell.g, a[:, 2 * H:3 * H] + p_g * c)
    c_new = f * c + i * g
    o, do_da = act_and_grad(cell, cell.f_o, a[:, 3 * H:] + p_o * c + p_on * c_new)
    hc = activate(cell.h, c_new)
    grads = {}
    if lp.W_p is not None:                  # bwd of the projection
        grads["W_p"] = dh_new.T @ (o * hc)
        dhf = dh_new @ lp.W_p
    else:
        dhf = dh_new
    da_o = dhf * hc * do_da
    dc = dc_new + dhf * o * activate_grad(cell.h, c_new) + da_o * p_on
    di, dg, df, dc_prev = dc * g, dc * i, dc * c, dc * f
    if cell.input_forget:                   # f = 1 − i
        di = di - df
    da_i, da_f, da_g = di * di_da, df * df_da, dg * dg_da
    dc_prev = dc_prev + da_i * p_i + da_f * p_f + da_g * p_g + da_o * p_o
    da = np.concatenate([da_i, da_f, da_g, da_o], axis=1)
    grads["R"] = da.T @ h_m
    grads["b_W"] = grads["b_R"] = da.sum(0)
    if cell.peepholes == "ifgo":
        grads["P"] = np.concatenate([(da_k * c).sum(0) for da_k in (da_i, da_f, da_g, da_o)])
    elif cell.peepholes:
        grads["P"] = np.concatenate([(da_i * c).sum(0), (da_f * c).sum(0),
                                     (da_o * c_new).sum(0)])
    dh = (da @ lp.R) * m
    return da, dh, dc_prev, grads


class LSTM(Kind):
    name = "lstm"
    kernel_module = "cgru._kernels.lstm"
    has_cell_state = True
    has_projection = True

    def saved_regions(self, cell, topology):
        H, S = topology.hidden_size, topology.state_size
        regions = [("gates", lambda T, N: (T, N, 4 * H)), ("states", lambda T, N: (T + 1, N, S)),
                   ("cstates", lambda T, N: (T + 1, N, H))]
        if topology.proj_size:
            regions.append(("hf", lambda T, N: (T, N, H)))
        return regions + self._pre(cell, topology)

    def packs(self, frozen, i, cell, H, forward):
        """``R`` and, with a projection, ``W_p`` (forward ``hf·W_pᵀ``, backward ``dh·W_p``)."""
        out = super().packs(frozen, i, cell, H, forward)
        if "W_p" in frozen.kept[i]:
            out["Wpp" if forward else "Wpb"] = frozen.packed(i, "W_p", forward)
        return out

    def fixed(self, lp, cell, H):
        """``b = b_W + b_R`` and the peepholes ``P`` (None without)."""
        return {"b": lp.b_W + lp.b_R, "P": lp.P}

    def forward_direction(self, kernels, common, cell, saved, c0, cy):
        return kernels.Direction(c0=c0, cy=cy, gates=saved.get("gates"),
                                 cstates=saved.get("cstates"), hf=saved.get("hf"), **common)

    def backward_buffers(self, cell, topology, d, TN):
        extra = [("dhp", (TN, topology.state_size))] if topology.proj_size else []
        return super().backward_buffers(cell, topology, d, TN) + extra

    def backward_direction(self, kernels, common, cell, lp, saved, ld, d, dcy, dc0):
        return kernels.Direction(gates=saved["gates"], cstates=saved["cstates"], P=lp.P,
                                      dcy=dcy, dc0=dc0, dhp=ld["dhp"][d], **common)

    def weight_gradients(self, backend, g, cell, topology, d, saved, ld, h_in, nt, active,
                         rows, beta):
        super().weight_gradients(backend, g, cell, topology, d, saved, ld, h_in, nt, active,
                                 rows, beta)
        H = topology.hidden_size
        r0, r1 = rows
        if g.W_p is not None:
            # dW_p[P, H] (+)= dhpᵀ · hf
            backend.gemm(True, False, ld["dhp"][d], saved["hf"].reshape(-1, H)[r0:r1], g.W_p,
                         beta=beta, nt=nt)
        if g.P is not None:
            # dP (+)= Σ_rows (da_i ⊙ c, da_f ⊙ c, da_o ⊙ c') ("ifgo": Σ_rows da ⊙ c), c the
            # state before the step
            cs = saved["cstates"].reshape(-1, H)              # the (T + 1)·N slots
            TN = saved["gates"].reshape(-1, 4 * H).shape[0]
            c_prev, c_new = (cs[-TN:], cs[:TN]) if topology.reversed_direction(d) else \
                (cs[:TN], cs[-TN:])
            c_prev, c_new = c_prev[r0:r1], c_new[r0:r1]
            if active is not None:         # padded rows may hold an empty sequence's c0
                c_prev, c_new = np.where(active, c_prev, 0), np.where(active, c_new, 0)
            da = ld["dgx"][d]
            parts = [np.einsum("rj,rj->j", da[:, k * H:(k + 1) * H], c_prev) for k in range(4)] \
                if cell.peepholes == "ifgo" else \
                [np.einsum("rj,rj->j", da[:, :H], c_prev),
                 np.einsum("rj,rj->j", da[:, H:2 * H], c_prev),
                 np.einsum("rj,rj->j", da[:, 3 * H:], c_new)]
            for k, part in enumerate(parts):
                if beta:
                    g.P[k * H:(k + 1) * H] += part
                else:
                    g.P[k * H:(k + 1) * H] = part

    # --- rebuilding from MPSGraph's saved gates and cell states
    saved_for_rebuild = {"gates": lambda H: 4 * H, "cells": lambda H: H}

    def rebuild_from_saved(self, backend, views, lp, cell, topology, d, x, saved, h0, c0,
                           mask):
        """The states from the saved activated gates ``[T, N, 4H]`` and cell states alone
        (``h = o ⊙ h(c)``); the pre-activations, off the fast path, recomputed exactly with
        whole-sequence GEMMs (``x·Wᵀ + b + (h ⊙ m)·Rᵀ`` and the peepholes) — no time loop."""
        T, N = x.shape[:2]
        H, G = topology.hidden_size, cell.gates
        rev = topology.reversed_direction(d)
        gates, c_after = saved["gates"][d], saved["cells"][d]
        views["gates"][...] = gates
        put_slots(views["cstates"], c0, c_after, rev)
        put_slots(views["states"], h0, gates[..., 3 * H:] * activate(cell.h, c_after), rev)
        if cell.is_fast:
            return
        h_in = slots_before(views["states"], rev)
        if mask is not None:
            h_in = h_in * mask[:, :, d * H:(d + 1) * H]
        # a[T·N, 4H] = x·Wᵀ + b_W + b_R + (h ⊙ m)·Rᵀ, then the peepholes (before the clip)
        a = views["pre"]
        a[...] = input_projection(topology, G, 0, d, lp, x)
        a += lp.b_W + lp.b_R
        backend.gemm(False, True, np.ascontiguousarray(h_in).reshape(T * N, H),
                     np.ascontiguousarray(lp.R), a.reshape(T * N, G * H), beta=1.0)
        if cell.peepholes:
            c_prev = slots_before(views["cstates"], rev)
            P = lp.P
            a[..., :H] += P[:H] * c_prev
            a[..., H:2 * H] += P[H:2 * H] * c_prev
            if cell.peepholes == "ifgo":
                a[..., 2 * H:3 * H] += P[2 * H:3 * H] * c_prev
                a[..., 3 * H:] += P[3 * H:] * c_prev
            else:
                a[..., 3 * H:] += P[2 * H:] * c_after

    # --- the reference
    def step(self, cell, x_proj, state, lp, mask):
        return step(cell, x_proj, state[0], state[1], lp, mask)

    def step_backward(self, cell, x_proj, state, lp, mask, dstate):
        dxp, dh, dc, grads = step_backward(cell, x_proj, state[0], state[1], lp, mask,
                                           dstate[0], dstate[1])
        return dxp, (dh, dc), grads


KIND = LSTM()
