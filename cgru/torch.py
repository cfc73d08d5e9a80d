"""PyTorch modules computed by cgru: drop-in ``GRU``, ``LSTM`` and ``RNN``, and ``swap``.

``cgru.torch.GRU``, ``LSTM`` and ``RNN`` *are* ``torch.nn.GRU``, ``LSTM`` and ``RNN``
(subclasses): the same constructor arguments, parameters, initialisation, ``state_dict``,
``repr``, ``flatten_parameters``, ``_flat_weights``, pickling and ``.to()``; only ``forward``
is cgru's (CPU, float32/float64), with torch's semantics and return values — ``batch_first``,
unbatched 2-D input, ``PackedSequence`` input (sorted or not), ``hx`` (the LSTM's
``(h_0, c_0)``), inter-layer dropout in training mode.  ``isinstance(m, torch.nn.GRU)`` still
holds, so code that inspects modules treats them as what they compute.  ``swap(model)`` turns
every ``nn.GRU`` / ``nn.LSTM`` / ``nn.RNN`` of a model into its cgru module, in place.

Mapping (layer ``l``, direction ``d``: 0 forward, 1 ``_reverse``; gates in the same order in
both systems — GRU r, z, n; LSTM i, f, g, o; ``S`` = ``proj_size`` or ``H``)::

    torch parameter               shape        cgru (layer-direction l·D + d)
    weight_ih_l{l}[_reverse]      [G·H, in]    W
    weight_hh_l{l}[_reverse]      [G·H, S]     R
    bias_ih_l{l}[_reverse]        [G·H]        b_W      (bias=False: zeros, no gradient)
    bias_hh_l{l}[_reverse]        [G·H]        b_R      (bias=False: zeros, no gradient)
    weight_hr_l{l}[_reverse]      [P, H]       W_p      (LSTM with proj_size = P)

    nn.GRU -> cgru.GRUCell()   nn.LSTM -> cgru.LSTMCell()   nn.RNN -> cgru.RNNCell(nonlinearity)

Memory (what is shared, what is copied):

* weights: NumPy views of the parameters (``p.detach().numpy()``), zero-copy, every call;
* ``input`` and ``hx``: NumPy views; cgru makes a time-major contiguous copy of ``input``
  itself when it is ``batch_first`` or not contiguous; a ``PackedSequence`` is scattered
  into a zero-padded ``[T, N, I]`` tensor (one copy) and the output gathered back (one copy);
* outputs, ``dx``, ``dh_0`` (``dc_0``): cgru's arrays wrapped by ``torch.from_numpy``,
  zero-copy (with ``batch_first`` cgru transposes ``y`` and ``dx`` into a new array);
* weight gradients: written by ``cgru.backward`` into fresh ``torch.empty_like`` tensors
  through NumPy views (``dparams``); the core stages them in its own buffer and copies them
  in when the backward has succeeded.

Autograd: a training forward (grad enabled and any input or parameter requiring grad) runs
``cgru.forward(training=True)`` inside a ``torch.autograd.Function`` that keeps cgru's reserve
for its backward, ``cgru.backward``; otherwise (``no_grad``, ``inference_mode``, nothing
requiring grad) it runs ``training=False`` and keeps nothing — unless dropout is active
(module in training mode, ``num_layers > 1``, ``dropout > 0``), which needs cgru's training
forward.  The dropout masks are cgru's (``cgru.dropout_masks``), seeded by two int64 drawn
from torch's default generator, so ``torch.manual_seed`` makes runs reproducible; they differ
from torch's own masks.  Double backward is not supported: a backward with
``create_graph=True`` through a cgru module (a gradient penalty, a Hessian-vector product,
``torch.func.grad``) raises ``RuntimeError`` saying so — it never returns a gradient that
silently leaves the second-order terms out.

Errors name the argument: ``TypeError`` for a wrong type or dtype (float16, bfloat16,
integers, an input whose dtype differs from the weights'), ``ValueError`` for a tensor on
another device than the CPU, a wrong shape or rank, or ``dropout=1`` in training.  torch
raises ``RuntimeError`` for some of these; cgru never computes a wrong answer silently.

``module.num_threads`` (an attribute, not a constructor argument): threads of cgru's pool,
``None`` (default) for cgru's rule — all usable cores, at most ``OMP_NUM_THREADS``.  Results
do not depend on it.
"""
try:
    import torch
except ImportError as exc:                                   # pragma: no cover
    raise ImportError("cgru.torch needs PyTorch (torch >= 2.1): pip install torch, or "
                      "pip install 'cgru[torch]'") from exc

import weakref

import numpy as np
from torch import nn
from torch.nn.utils.rnn import PackedSequence

import cgru

__all__ = ["GRU", "LSTM", "RNN", "swap"]

# (cgru slot, torch parameter prefix), in the order of torch's _flat_weights per direction
_SLOTS = (("W", "weight_ih"), ("R", "weight_hh"), ("b_W", "bias_ih"), ("b_R", "bias_hh"),
          ("W_p", "weight_hr"))
_FLOATS = (torch.float32, torch.float64)
_NUMPY_DTYPES = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}


# --- checks --------------------------------------------------------------------------------
def _check_tensor(t, what, dtype=None, like="the dtype of the module's weights"):
    """``t`` is a strided CPU tensor of float32/float64 (of ``dtype`` when given)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{what}: cgru.torch computes on the CPU, got a tensor on {t.device} "
                         f"(move the module and its inputs to the CPU, or use torch.nn's own "
                         f"module on that device)")
    if t.layout != torch.strided:
        raise TypeError(f"{what}: expected a dense (strided) tensor, got layout {t.layout}")
    if dtype is None:
        if t.dtype not in _FLOATS:
            raise TypeError(f"{what}: expected dtype torch.float32 or torch.float64, got "
                            f"{t.dtype} (cgru computes in float32 and float64 only)")
    elif t.dtype != dtype:
        raise TypeError(f"{what}: expected dtype {dtype} ({like}), got {t.dtype}")
    return t


def _check_weights(module):
    """The dtype of the module's weights: every one a CPU float32/float64 tensor, one dtype."""
    dtype = None
    for name, w in zip(module._flat_weights_names, module._flat_weights):
        if w is None:
            raise TypeError(f"{name}: expected a parameter tensor, got None")
        _check_tensor(w, name, dtype, like=f"the dtype of {module._flat_weights_names[0]}")
        dtype = w.dtype
    return dtype


def _check_shape(t, what, shape, names):
    if tuple(t.shape) != tuple(shape):
        want = ", ".join(f"{n}={s}" for n, s in zip(names, shape))
        raise ValueError(f"{what}: expected shape [{want}], got {list(t.shape)}")


def _numpy(t):
    return None if t is None else t.detach().numpy()


_WEIGHT_VIEWS = {}      # id(parameter) -> (weak reference to it, its NumPy view)


def _weight_numpy(t):
    """A NumPy view of a weight tensor, the same view object on every call while the tensor's
    storage, shape and strides stay put — so that cgru's kept copy of the weights (found by the
    owner of their memory) is found again; the view is dropped with the tensor."""
    entry = _WEIGHT_VIEWS.get(id(t))
    if entry is not None and entry[0]() is t:
        view = entry[1]
        if (view.ctypes.data == t.data_ptr() and view.shape == tuple(t.shape)
                and view.strides == tuple(s * t.element_size() for s in t.stride())
                and view.dtype == _NUMPY_DTYPES.get(t.dtype)):
            return view
    view = t.detach().numpy()
    key = id(t)
    _WEIGHT_VIEWS[key] = (weakref.ref(t, lambda _, k=key: _WEIGHT_VIEWS.pop(k, None)), view)
    return view


def _tensor(a):
    return None if a is None else torch.from_numpy(a)


def _draw_seed():
    """Two int64 from torch's default generator: cgru's dropout seed pair."""
    s = torch.randint(-2 ** 63, 2 ** 63 - 1, (2,), dtype=torch.int64)
    return int(s[0]), int(s[1])


# --- packed sequences ----------------------------------------------------------------------
def _unpack(data, batch_sizes):
    """A ``PackedSequence``'s ``data`` ``[Σlen, I]`` as zero-padded time-major ``[T, N, I]`` in
    its sorted batch order, the ``[T, N]`` mask of real steps and the lengths (NumPy int64).
    Packed rows are ordered by step, then batch entry, which is the row-major order of the
    mask: scattering into and gathering out of the mask is the whole conversion."""
    valid = torch.arange(int(batch_sizes[0]))[None, :] < batch_sizes[:, None]    # [T, N]
    x = data.new_zeros(valid.shape + (data.shape[-1],))
    x = x.index_put((valid,), data)
    return x, valid, valid.sum(0).numpy()


# --- one call ------------------------------------------------------------------------------
class _Call:
    """What one forward computes besides its tensors: the network's topology, cell and
    weight names, the sequence lengths, the layout, dropout, seed and threads."""

    def __init__(self, module, dtype, lengths, batch_major, dropout, seed):
        self.topology = cgru.Topology(module.input_size, module.hidden_size, module.num_layers,
                                      "bidirectional" if module.bidirectional else "forward",
                                      proj_size=module.proj_size)
        self.cell = module._cgru_cell()
        self.names = list(module._flat_weights_names)
        self.dtype = np.dtype("float64" if dtype == torch.float64 else "float32")
        self.lengths, self.batch_major = lengths, batch_major
        self.dropout, self.seed, self.num_threads = dropout, seed, module.num_threads

    @property
    def lstm(self):
        return self.cell.has_cell_state

    def network(self, tensors, fill, view=_weight_numpy):
        """A ``cgru.Network`` of NumPy views of ``tensors`` (in ``self.names`` order); a slot
        without a tensor (no bias, or ``None``) gets ``fill(shape, dtype)``."""
        by_name = dict(zip(self.names, tensors))
        D = self.topology.num_directions
        layers = []
        for i in range(self.topology.num_layer_directions):
            suffix = f"_l{i // D}" + ("_reverse" if i % D else "")
            shapes = self.topology.shapes(i, self.cell.gates)
            arrays = {}
            for slot, prefix in _SLOTS:
                if slot in shapes:
                    t = by_name.get(prefix + suffix)
                    arrays[slot] = fill(shapes[slot], self.dtype) if t is None else view(t)
            layers.append(cgru.LayerParams(**arrays))
        return cgru.Network(self.topology, layers, self.cell)

    def forward(self, x, h0, c0, weights, training):
        """``((y, hy[, cy]), reserve)``: cgru's forward, outputs as tensors (zero-copy)."""
        r = cgru.forward(self.network(weights, np.zeros), _numpy(x), _numpy(h0),
                         c0=_numpy(c0), lengths=self.lengths, batch_major=self.batch_major,
                         training=training, dropout=self.dropout, seed=self.seed,
                         num_threads=self.num_threads)
        outs = (_tensor(r.y), _tensor(r.hy)) + ((_tensor(r.cy),) if self.lstm else ())
        return outs, r.reserve

    def backward(self, x, weights, reserve, dy, dhy, dcy, need_weights):
        """``(dx, dh0, dc0, [dweight or None])``: cgru's backward; the gradients of the
        weights in ``need_weights`` are written into new tensors through NumPy views."""
        grads = [torch.empty_like(w) if need else None for w, need in zip(weights, need_weights)]
        dparams = self.network(grads, np.empty, _numpy) if any(need_weights) else None
        g = cgru.backward(self.network(weights, np.zeros), _numpy(x), reserve, _numpy(dy),
                          _numpy(dhy), dcy=_numpy(dcy), batch_major=self.batch_major,
                          dparams=dparams, num_threads=self.num_threads)
        return _tensor(g.dx), _tensor(g.dh0), _tensor(g.dc0), grads


_NO_DOUBLE_BACKWARD = (
    "cgru.torch: double backward is not supported — this backward runs with create_graph=True "
    "(a gradient penalty, a Hessian-vector product, torch.func.grad), and cgru's backward is "
    "not itself differentiable; use torch.nn's own module for second-order terms, or compute "
    "the gradient without create_graph=True")


class _Recurrent(torch.autograd.Function):
    """``apply(call, x, h0, c0, *weights) -> (y, hy[, cy])``: cgru's training forward, and
    ``cgru.backward`` on its reserve.  ``h0``/``c0`` may be ``None`` (zeros)."""

    @staticmethod
    def forward(ctx, call, x, h0, c0, *weights):
        outs, reserve = call.forward(x, h0, c0, weights, training=True)
        ctx.call, ctx.reserve = call, reserve
        ctx.save_for_backward(x, *weights)       # torch refuses the backward if they change
        ctx.set_materialize_grads(False)         # unused outputs: None, which cgru reads as 0
        return outs

    @staticmethod
    def backward(ctx, dy, dhy, dcy=None):
        if torch.is_grad_enabled():
            raise RuntimeError(_NO_DOUBLE_BACKWARD)
        x, *weights = ctx.saved_tensors
        need = ctx.needs_input_grad              # (call, x, h0, c0, *weights)
        dx, dh0, dc0, dweights = ctx.call.backward(x, weights, ctx.reserve, dy, dhy, dcy,
                                                   need[4:])
        return (None, dx if need[1] else None, dh0 if need[2] else None,
                dc0 if need[3] else None, *dweights)


# --- the modules ---------------------------------------------------------------------------
class _CgruForward:
    """``forward`` of torch's recurrent modules, computed by cgru (mixed into subclasses of
    ``nn.GRU``, ``nn.LSTM`` and ``nn.RNN``; it adds no state of its own, so that ``swap`` can
    turn a torch module into a cgru one by its class alone)."""

    num_threads = None          # cgru's pool threads (None: cgru's default)

    def forward(self, input, hx=None):
        update = getattr(self, "_update_flat_weights", None)    # torch ≥ 2.0: follow the
        if update is not None:                                  # weights functional_call
            update()                                            # puts in place
        dtype = _check_weights(self)
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx, dtype)
        return self._forward_padded(input, hx, dtype)

    def _forward_padded(self, input, hx, dtype):
        _check_tensor(input, "input", dtype)
        if input.dim() not in (2, 3):
            raise ValueError(f"input: expected a 3-D tensor {self._layout()} or an unbatched "
                             f"2-D one [T, I], got shape {list(input.shape)}")
        batched = input.dim() == 3
        batch_dim = 0 if self.batch_first else 1
        x = input if batched else input.unsqueeze(batch_dim)
        T, N = (x.shape[1], x.shape[0]) if self.batch_first else (x.shape[0], x.shape[1])
        if x.shape[-1] != self.input_size or T == 0 or N == 0:
            raise ValueError(f"input: expected shape {self._layout()} with I = input_size = "
                             f"{self.input_size}, T ≥ 1 and N ≥ 1, got {list(input.shape)}")
        h0, c0 = self._initial_state(hx, N, batched, dtype)
        y, hy, cy = self._run(x, h0, c0, None, self.batch_first, dtype)
        if not batched:
            y, hy = y.squeeze(batch_dim), hy.squeeze(1)
            cy = None if cy is None else cy.squeeze(1)
        return y, self._final_state(hy, cy)

    def _forward_packed(self, input, hx, dtype):
        data, batch_sizes, sorted_indices, unsorted_indices = input
        _check_tensor(data, "input.data", dtype)
        if data.dim() != 2 or data.shape[-1] != self.input_size:
            raise ValueError(f"input.data: expected a packed 2-D tensor [Σlengths, I="
                             f"{self.input_size}], got shape {list(data.shape)}")
        x, valid, lengths = _unpack(data, batch_sizes)
        h0, c0 = self._initial_state(hx, x.shape[1], True, dtype)
        if sorted_indices is not None:          # hx is in the caller's order, as torch's
            h0 = None if h0 is None else h0.index_select(1, sorted_indices)
            c0 = None if c0 is None else c0.index_select(1, sorted_indices)
        y, hy, cy = self._run(x, h0, c0, lengths, False, dtype)
        if unsorted_indices is not None:
            hy = hy.index_select(1, unsorted_indices)
            cy = None if cy is None else cy.index_select(1, unsorted_indices)
        output = PackedSequence(y[valid], batch_sizes, sorted_indices, unsorted_indices)
        return output, self._final_state(hy, cy)

    def _layout(self):
        return "[N, T, I] (batch_first)" if self.batch_first else "[T, N, I]"

    # --- states
    def _initial_state(self, hx, N, batched, dtype):
        """``(h0, c0)`` ``[L·D, N, S]`` / ``[L·D, N, H]`` from ``hx`` (``None``: zeros)."""
        if hx is None:
            return None, None
        lstm = isinstance(self, nn.LSTM)
        if lstm:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"hx: expected a (h_0, c_0) tuple of tensors, got "
                                f"{type(hx).__name__}")
            parts = (("hx[0] (h_0)", hx[0], self.proj_size or self.hidden_size),
                     ("hx[1] (c_0)", hx[1], self.hidden_size))
        else:
            parts = (("hx", hx, self.hidden_size),)
        LD = self.num_layers * (2 if self.bidirectional else 1)
        out = []
        for what, h, width in parts:
            _check_tensor(h, what, dtype)
            if batched:
                _check_shape(h, what, (LD, N, width), ("L·D", "N", "H" if width ==
                                                         self.hidden_size else "proj_size"))
            else:
                _check_shape(h, what + " (unbatched input)", (LD, width),
                             ("L·D", "H" if width == self.hidden_size else "proj_size"))
                h = h.unsqueeze(1)
            out.append(h)
        return (out[0], out[1]) if lstm else (out[0], None)

    def _final_state(self, hy, cy):
        return (hy, cy) if isinstance(self, nn.LSTM) else hy

    # --- the computation
    def _dropout(self):
        """The inter-layer dropout of this call: torch's rule (training mode, > 1 layer)."""
        if not (self.training and self.num_layers > 1 and self.dropout > 0):
            return 0.0
        if self.dropout >= 1:
            raise ValueError(f"dropout: cgru supports dropout in [0, 1) in training mode, got "
                             f"{self.dropout}")
        return float(self.dropout)

    def _run(self, x, h0, c0, lengths, batch_major, dtype):
        """``(y, hy, cy)`` (``cy`` None but for the LSTM), through autograd when needed."""
        weights = list(self._flat_weights)
        p = self._dropout()
        call = _Call(self, dtype, lengths, batch_major, p, _draw_seed() if p else (0, 0))
        tensors = [x, h0, c0, *weights]
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
            outs = _Recurrent.apply(call, x, h0, c0, *weights)
        else:
            outs, _ = call.forward(x, h0, c0, weights, training=p > 0)
        return outs[0], outs[1], outs[2] if call.lstm else None


class GRU(_CgruForward, nn.GRU):
    """``torch.nn.GRU`` computed by cgru (CPU, float32/float64); see ``cgru.torch``."""

    def _cgru_cell(self):
        return cgru.GRUCell()


class LSTM(_CgruForward, nn.LSTM):
    """``torch.nn.LSTM`` (``proj_size`` included) computed by cgru; see ``cgru.torch``."""

    def _cgru_cell(self):
        return cgru.LSTMCell()


class RNN(_CgruForward, nn.RNN):
    """``torch.nn.RNN`` (``nonlinearity`` tanh or relu) computed by cgru; see
    ``cgru.torch``."""

    def _cgru_cell(self):
        return cgru.RNNCell(self.nonlinearity)


_REPLACEMENTS = {nn.GRU: GRU, nn.LSTM: LSTM, nn.RNN: RNN}


def swap(model):
    """Make every ``nn.GRU``, ``nn.LSTM`` and ``nn.RNN`` inside ``model`` (recursively, the
    model itself included) compute with cgru, in place; returns ``model``.

    Each such module keeps its identity and everything it holds — the same ``Parameter``
    objects (nothing is copied, so an optimizer built before keeps working), hooks, device,
    mode — and only its class becomes the cgru subclass (``cgru.torch.GRU`` …, still an
    ``nn.GRU``).  Subclasses of the torch modules (user-defined ones, or cgru's) are left as
    they are: their own ``forward`` may do more than torch's.  The checks (CPU, float32 or
    float64) happen when the module runs.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    for module in model.modules():
        replacement = _REPLACEMENTS.get(type(module))
        if replacement is not None:
            module.__class__ = replacement
    return model
