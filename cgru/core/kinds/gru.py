"""The GRU: cuDNN's, PyTorch's, TF's and Keras's (reset after the recurrent product), ONNX's and
MPSGraph's (either candidate form, either interpolation).

One step, row-vector form (gates r, z, n; ``W``/``R`` ``[3H, in]``/``[3H, H]`` applied as
``x·Wᵀ``; ``c(·)`` ONNX's clip; ``m`` the state mask, ``h_m = h ⊙ m``)::

    r = f_r(c(x_proj_r + b_Wr + h_m·R_rᵀ + b_Rr)),  z = f_z(c(x_proj_z + b_Wz + h_m·R_zᵀ + b_Rz))
    reset_after=True :  n = g(c(x_proj_n + b_Wn + r ⊙ (h_m·R_nᵀ + b_Rn)))
    reset_after=False:  n = g(c(x_proj_n + (r ⊙ h_m)·R_nᵀ + b_Wn + b_Rn))
    flip_z=False: h' = (1 − z) ⊙ n + z ⊙ h     flip_z=True: h' = z ⊙ n + (1 − z) ⊙ h   (unmasked h)

Saved per layer-direction: the activated gates ``[T, N, 3H]``, the states ``[T+1, N, H]``,
``h·R_nᵀ + b_Rn`` ``[T, N, H]`` (reset-after), the pre-activations off the fast path.  The
kernels take ``b_rzn = b_W + b_R`` for r and z (reset-after: ``b_Wn`` for n) and ``b_hn =
b_Rn`` inside the reset product; reset-before packs the r/z and n blocks of ``R`` apart (the
candidate's product needs ``r ⊙ h`` first), and its backward keeps ``r ⊙ h ⊙ m`` for ``dR_n``;
reset-after keeps the n columns of the recurrent side's gradient apart (``dgh`` ``[T·N, H]``:
``dR_n``, ``db_Rn`` and the recurrent product see ``r ⊙ da_n`` where the input side sees
``da_n``; its r and z columns are the input side's), so both forms' backward packs ``R``'s
r/z and n blocks apart.
"""
import numpy as np

from cgru.core.activations import STAND_IN, act_and_grad, activate, clamp, stand_in_pre
from cgru.core.kinds.base import Kind, put_slots, slots_before

__all__ = ["KIND", "step", "step_backward"]


def step(cell, x_proj, h, lp_R, b_W, b_R, mask=None):
    """One GRU step for a batch; returns ``h'`` ``[N, H]``.

    ``x_proj`` ``[N, 3H]``: the input pre-activations without bias (``x·Wᵀ`` or given);
    ``h`` ``[N, H]``: the previous state; ``lp_R`` ``[3H, H]``; ``b_W``, ``b_R`` ``[3H]``;
    ``mask`` ``None`` or ``[N, H]``: the state mask ``m`` (steps 2-6 of the module docstring).
    """
    H = h.shape[-1]
    xr, xz, xn = x_proj[:, :H], x_proj[:, H:2 * H], x_proj[:, 2 * H:]       # [N, H] each
    R_r, R_z, R_n = lp_R[:H], lp_R[H:2 * H], lp_R[2 * H:]                    # [H, H] each
    bWr, bWz, bWn = b_W[:H], b_W[H:2 * H], b_W[2 * H:]
    bRr, bRz, bRn = b_R[:H], b_R[H:2 * H], b_R[2 * H:]

    # 2. h as it enters every recurrent product
    h_m = h if mask is None else h * mask
    # 3. reset gate
    r = activate(cell.f_r, clamp(cell, xr + bWr + h_m @ R_r.T + bRr))
    # 4. update gate
    z = activate(cell.f_z, clamp(cell, xz + bWz + h_m @ R_z.T + bRz))
    # 5. candidate
    if cell.reset_after:
        n = activate(cell.g, clamp(cell, xn + bWn + r * (h_m @ R_n.T + bRn)))
    else:
        n = activate(cell.g, clamp(cell, xn + (r * h_m) @ R_n.T + bWn + bRn))
    # 6. blend with the unmasked h
    one = h.dtype.type(1)
    if cell.flip_z:
        return z * n + (one - z) * h
    return (one - z) * n + z * h


def step_backward(cell, x_proj, h, lp_R, b_W, b_R, mask, dh_new):
    """Undo one ``step``: given ``dh_new = ∂L/∂h'`` ``[N, H]``, return ``(dx_proj [N, 3H],
    dh [N, H], dR [3H, H], db_W [3H], db_R [3H])`` for the same inputs."""
    H = h.shape[-1]
    one = h.dtype.type(1)
    xr, xz, xn = x_proj[:, :H], x_proj[:, H:2 * H], x_proj[:, 2 * H:]
    R_r, R_z, R_n = lp_R[:H], lp_R[H:2 * H], lp_R[2 * H:]
    bWr, bWz, bWn = b_W[:H], b_W[H:2 * H], b_W[2 * H:]
    bRr, bRz, bRn = b_R[:H], b_R[H:2 * H], b_R[2 * H:]
    m = np.ones_like(h) if mask is None else mask
    h_m = h * m
    # the forward again, keeping pre-activations
    a_r = xr + bWr + h_m @ R_r.T + bRr
    a_z = xz + bWz + h_m @ R_z.T + bRz
    r, dr_da = act_and_grad(cell, cell.f_r, a_r)
    z, dz_da = act_and_grad(cell, cell.f_z, a_z)
    if cell.reset_after:
        hn = h_m @ R_n.T + bRn
        a_n = xn + bWn + r * hn
    else:
        rh = r * h_m
        a_n = xn + rh @ R_n.T + bWn + bRn
    n, dn_da = act_and_grad(cell, cell.g, a_n)
    # bwd of the blend
    if cell.flip_z:
        dn, dz, dh = dh_new * z, dh_new * (n - h), dh_new * (one - z)
    else:
        dn, dz, dh = dh_new * (one - z), dh_new * (h - n), dh_new * z
    da_n = dn * dn_da
    dR = np.zeros_like(lp_R)
    db_W = np.zeros_like(b_W)
    db_R = np.zeros_like(b_R)
    dh_m = np.zeros_like(h)
    # bwd of the candidate
    if cell.reset_after:
        dr = da_n * hn
        dhn = da_n * r
        dR[2 * H:] = dhn.T @ h_m
        db_R[2 * H:] = dhn.sum(0)
        dh_m += dhn @ R_n
    else:
        drh = da_n @ R_n
        dR[2 * H:] = da_n.T @ rh
        db_R[2 * H:] = da_n.sum(0)
        dr = drh * h_m
        dh_m += drh * r
    db_W[2 * H:] = da_n.sum(0)
    # bwd of the gates
    da_r = dr * dr_da
    da_z = dz * dz_da
    dR[:H] = da_r.T @ h_m
    dR[H:2 * H] = da_z.T @ h_m
    db_W[:H] = db_R[:H] = da_r.sum(0)
    db_W[H:2 * H] = db_R[H:2 * H] = da_z.sum(0)
    dh_m += da_r @ R_r + da_z @ R_z
    dh = dh + dh_m * m
    dx_proj = np.concatenate([da_r, da_z, da_n], axis=1)
    return dx_proj, dh, dR, db_W, db_R


class GRU(Kind):
    name = "gru"
    kernel_module = "cgru._kernels.gru"

    def saved_regions(self, cell, topology):
        H = topology.hidden_size
        regions = [("gates", lambda T, N: (T, N, 3 * H)), ("states", lambda T, N: (T + 1, N, H))]
        if cell.reset_after:
            regions.append(("hn", lambda T, N: (T, N, H)))
        return regions + self._pre(cell, topology)

    def fixed(self, lp, cell, H):
        """``b_rzn`` ``[3H]`` (steps 3/4 of the kernel: ``b_W + b_R``; reset-after: ``b_Wn``
        for n) and ``b_hn = b_Rn`` ``[H]``."""
        b = lp.b_W + lp.b_R
        if cell.reset_after:
            b[2 * H:] = lp.b_W[2 * H:]
        return {"b_rzn": b, "b_hn": np.ascontiguousarray(lp.b_R[2 * H:])}

    def packs(self, frozen, i, cell, H, forward):
        """The r/z and the n blocks of ``R`` apart: reset-before's forward (``h·R_rzᵀ`` and
        ``(r ⊙ h)·R_nᵀ``) and both forms' backward (``da_rz·R_rz`` and ``da_n·R_n``, or
        reset-after's ``(r ⊙ da_n)·R_n``); reset-after's forward packs ``R`` whole."""
        if cell.reset_after and forward:
            return super().packs(frozen, i, cell, H, forward)
        tag = "Rp" if forward else "Rb"
        return {tag: frozen.packed(i, "R", forward, (0, 2 * H)),
                tag + "_n": frozen.packed(i, "R", forward, (2 * H, 3 * H))}

    def forward_direction(self, kernels, common, cell, saved, c0, cy):
        return kernels.Direction(hn=saved.get("hn"), gates=saved.get("gates"), **common)

    def backward_buffers(self, cell, topology, d, TN):
        H = topology.hidden_size
        extra = [("dgh", (TN, H))] if cell.reset_after else [("rhm", (TN, H))]
        return super().backward_buffers(cell, topology, d, TN) + extra

    def backward_direction(self, kernels, common, cell, lp, saved, ld, d, dcy, dc0):
        return kernels.Direction(gates=saved["gates"], hn=saved.get("hn"),
                                      dgh=ld["dgh"][d] if cell.reset_after else None,
                                      rhm=ld["rhm"][d] if not cell.reset_after else None,
                                      **common)

    def recurrent_side(self, cell, ld, d):
        if not cell.reset_after:
            return super().recurrent_side(cell, ld, d)
        return 2 * ld["dgh"][d].shape[1], ld["dgh"][d]

    def weight_gradients(self, backend, g, cell, topology, d, saved, ld, h_in, nt, active,
                         rows, beta):
        if cell.reset_after:
            return super().weight_gradients(backend, g, cell, topology, d, saved, ld, h_in, nt,
                                            active, rows, beta)
        H, dgx = topology.hidden_size, ld["dgx"][d]
        # dR_rz[2H, H] (+)= dgx_rzᵀ · (h ⊙ m);  dR_n[H, H] (+)= dgx_nᵀ · (r ⊙ h ⊙ m)
        backend.gemm(True, False, dgx[:, :2 * H], h_in, g.R[:2 * H], beta=beta, nt=nt)
        backend.gemm(True, False, dgx[:, 2 * H:], ld["rhm"][d], g.R[2 * H:], beta=beta, nt=nt)

    # --- rebuilding from MPSGraph's saved gates (its zState)
    rebuilds_from_gates = True

    def rebuild_refusal(self, cell):
        """``(what, why)`` a reserve of ``cell`` cannot be rebuilt from its gates, or None."""
        if cell.clip is not None:
            return "cell", "cannot rebuild clipped pre-activations"
        for name in ("f_r", "f_z", "g"):
            act = getattr(cell, name)
            if act.name not in STAND_IN:
                return (f"cell.{name}", f"cannot rebuild the derivative of {act.name!r}; "
                                        f"expected one of {sorted(STAND_IN)}")
        return None

    def rebuild_from_gates(self, backend, views, lp, cell, topology, d, gates, y, h0, mask):
        """Fill direction ``d``'s views of a fresh one-layer reserve from its activated gates
        ``[T, N, 3H]`` and the forward's output ``y`` ``[T, N, D·H]`` (full-length sequences,
        time-major): the states from ``y`` and ``h0``, the recurrent candidate term
        ``h·R_nᵀ + b_Rn`` as one GEMM over all steps, and stand-in pre-activations for the
        activations whose derivative needs one (``activations.STAND_IN``)."""
        T, N = y.shape[:2]
        H = topology.hidden_size
        rev = topology.reversed_direction(d)
        put_slots(views["states"], h0, y[:, :, d * H:(d + 1) * H], rev)
        views["gates"][...] = gates
        if cell.reset_after:
            h_in = slots_before(views["states"], rev)
            if mask is not None:
                h_in = h_in * mask[:, :, d * H:(d + 1) * H]
            hn = views["hn"].reshape(T * N, H)
            # hn[T·N, H] = (h ⊙ m)[T·N, H] · R_n[H, H]ᵀ + b_Rn
            backend.gemm(False, True, np.ascontiguousarray(h_in).reshape(T * N, H),
                      np.ascontiguousarray(lp.R[2 * H:]), hn)
            hn += lp.b_R[2 * H:]
        if not cell.is_fast:
            pre = views["pre"]
            for k, act in enumerate((cell.f_r, cell.f_z, cell.g)):
                pre[:, :, k * H:(k + 1) * H] = stand_in_pre(act, gates[:, :, k * H:(k + 1) * H])

    # --- the reference
    def step(self, cell, x_proj, state, lp, mask):
        return (step(cell, x_proj, state[0], lp.R, lp.b_W, lp.b_R, mask),)

    def step_backward(self, cell, x_proj, state, lp, mask, dstate):
        dxp, dh, dR, db_W, db_R = step_backward(cell, x_proj, state[0], lp.R, lp.b_W, lp.b_R,
                                                mask, dstate[0])
        return dxp, (dh,), {"R": dR, "b_W": db_W, "b_R": db_R}


KIND = GRU()
