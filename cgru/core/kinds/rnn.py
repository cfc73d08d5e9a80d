"""The vanilla (Elman) RNN: cuDNN's ``CUDNN_RNN_TANH`` / ``CUDNN_RNN_RELU``, ONNX's ``RNN``.

One step, row-vector form (``W`` ``[H, in]``, ``R`` ``[H, H]``, ``x_proj = x·Wᵀ``; ``c(·)``
ONNX's clip, ``m`` the state mask, ``h_m = h ⊙ m``)::

    h' = act(c(x_proj + b_W + h_m·Rᵀ + b_R))

Saved per layer-direction: the states (the activated values are the states), and the
pre-activations for cells off the kernels' fast path.
"""
import numpy as np

from cgru.core.activations import act_and_grad, activate, clamp
from cgru.core.kinds.base import Kind, put_slots

__all__ = ["KIND", "step", "step_backward"]


def step(cell, x_proj, h, lp, mask=None):
    """One vanilla-RNN step for a batch: ``h'`` ``[N, H]``."""
    h_m = h if mask is None else h * mask
    return activate(cell.activation, clamp(cell, x_proj + lp.b_W + h_m @ lp.R.T + lp.b_R))


def step_backward(cell, x_proj, h, lp, mask, dh_new):
    """Undo one ``step``: ``(dx_proj [N, H], dh [N, H], {"R", "b_W", "b_R"})``."""
    m = np.ones_like(h) if mask is None else mask
    h_m = h * m
    _, d_act = act_and_grad(cell, cell.activation, x_proj + lp.b_W + h_m @ lp.R.T + lp.b_R)
    da = dh_new * d_act
    return da, (da @ lp.R) * m, {"R": da.T @ h_m, "b_W": da.sum(0), "b_R": da.sum(0)}


class RNN(Kind):
    name = "rnn"
    kernel_module = "cgru._kernels.rnn"

    # --- rebuilding from MPSGraph's saved pre-activations
    saved_for_rebuild = {"pre": lambda H: H}

    def rebuild_from_saved(self, backend, views, lp, cell, topology, d, x, saved, h0, c0,
                           mask):
        """The states from the saved pre-activation ``z`` ``[T, N, H]`` alone,
        ``h = act(clip(z))``; the pre-activations are ``z`` itself."""
        z = saved["pre"][d]
        put_slots(views["states"], h0, activate(cell.activation, clamp(cell, z)),
                  topology.reversed_direction(d))
        if not cell.is_fast:
            views["pre"][...] = z

    # --- the reference
    def step(self, cell, x_proj, state, lp, mask):
        return (step(cell, x_proj, state[0], lp, mask),)

    def step_backward(self, cell, x_proj, state, lp, mask, dstate):
        dxp, dh, grads = step_backward(cell, x_proj, state[0], lp, mask, dstate[0])
        return dxp, (dh,), grads


KIND = RNN()
