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

* weights: NumPy views of the parameters (``p.detach().numpy()``), zero-copy; a module's
  calls share one ``cgru.Network`` over them while the parameters are the same tensors at
  the same storage, shape, strides, dtype and version (so cgru finds again what it made for
  them: plans, packs), and cgru proves their bytes in every forward all the same;
* ``input`` and ``hx``: NumPy views; cgru makes a time-major contiguous copy of ``input``
  itself when it is ``batch_first`` or not contiguous; a ``PackedSequence`` is scattered
  into a zero-padded ``[T, N, I]`` tensor (one copy) and the output gathered back (one copy);
* outputs, ``dx``, ``dh_0`` (``dc_0``): cgru's arrays wrapped by ``torch.from_numpy``,
  zero-copy (with ``batch_first`` cgru transposes ``y`` and ``dx`` into a new array);
* weight gradients: the arrays cgru's backward returns, wrapped by ``torch.from_numpy``
  (zero-copy).

Autograd: a training forward (grad enabled and any input or parameter requiring grad) runs
``cgru.forward(training=True)`` inside a ``torch.autograd.Function`` that keeps cgru's reserve,
and the weights that forward computed with (cgru's copies of the bytes it read), for its
backward, ``cgru.backward`` on those very weights: it differentiates the function the forward
computed, whatever the parameters hold by then (torch refuses a backward after an in-place
change it sees; a write through ``.data``, which it does not see, changes nothing);
otherwise (``no_grad``, ``inference_mode``, nothing requiring grad) it runs
``training=False`` and keeps nothing — unless dropout is active
(module in training mode, ``num_layers > 1``, ``dropout > 0``), which needs cgru's training
forward.  The dropout masks are cgru's (``cgru.dropout_masks``), seeded by two int64 drawn
from torch's default generator, so ``torch.manual_seed`` makes runs reproducible; they differ
from torch's own masks.

``torch.func`` (``grad``, ``vmap``, ``jacrev``, ``vmap(grad(...))`` per-sample gradients) and
``gradcheck(check_batched_grad=True)`` work: the Function has a separate ``setup_context`` and
a ``vmap`` rule that runs cgru once per entry of the vmapped dimension.  ``jacfwd`` and
forward-mode AD do not (no forward-mode rule).  Double backward is not supported: a backward
with ``create_graph=True`` (which ``torch.func.grad`` always uses) returns the correct
first-order gradients as part of the graph, and differentiating them again (a gradient
penalty, a Hessian-vector product, ``grad(grad(f))``, ``gradgradcheck``) raises
``RuntimeError`` saying so — it never returns a second derivative that silently leaves cgru's
terms out.  ``torch.compile`` compiles a model around the cgru modules (their ``forward`` is a
graph break, run eagerly); ``torch.jit.script`` and ``torch.jit.trace`` are refused with a
``RuntimeError`` that names ``torch.compile`` (TorchScript cannot represent NumPy code; a
trace would record cgru's outputs as constants).  A batch of no sequences (``N = 0``) gives
empty outputs, as torch.

Errors name the argument: ``TypeError`` for a wrong type or an unsupported dtype (float16,
bfloat16, integers in a module of that dtype), ``ValueError`` for an input or state whose dtype
differs from the weights' (torch's type, and for the input torch's words), a tensor on
another device than the CPU, a wrong shape or rank, ``T = 0``, or ``dropout=1`` in training.
Where torch raises ``RuntimeError`` instead — a wrong ``input_size`` or ``hx`` shape,
``T = 0``, an ``hx`` of another dtype — cgru raises ``ValueError``; a float16 module, which
torch computes, is a ``TypeError``.  cgru never computes a wrong answer silently.

``module.num_threads`` (an attribute, not a constructor argument): threads of cgru's pool,
``None`` (default) for cgru's rule — all usable cores, at most ``OMP_NUM_THREADS``.  Results
do not depend on it.
"""
try:
    import torch
except ImportError as exc:                                   # pragma: no cover
    raise ImportError("cgru.torch needs PyTorch (torch >= 2.1): pip install torch, or "
                      "pip install 'cgru[torch]'") from exc

import functools
import warnings
import weakref

import numpy as np
from torch import nn
from torch.nn.utils.rnn import PackedSequence

import cgru
from cgru.core import calls, engine

__all__ = ["GRU", "LSTM", "RNN", "swap"]

# (cgru slot, torch parameter prefix), in the order of torch's _flat_weights per direction
_SLOTS = (("W", "weight_ih"), ("R", "weight_hh"), ("b_W", "bias_ih"), ("b_R", "bias_hh"),
          ("W_p", "weight_hr"))
_FLOATS = (torch.float32, torch.float64)
_NUMPY_DTYPES = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}


# --- checks --------------------------------------------------------------------------------
def _check_tensor(t, what, dtype=None, like="the dtype of the module's weights"):
    """``t`` is a strided CPU tensor of float32/float64, of ``dtype`` when given.

    An unsupported dtype is a ``TypeError``; a supported one that differs from ``dtype`` a
    ``ValueError`` — the type torch raises when the input's dtype is not the weights'."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise ValueError(f"{what}: cgru.torch computes on the CPU, got a tensor on {t.device} "
                         f"(move the module and its inputs to the CPU, or use torch.nn's own "
                         f"module on that device)")
    if t.layout != torch.strided:
        raise TypeError(f"{what}: expected a dense (strided) tensor, got layout {t.layout}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{what}: expected dtype {dtype} ({like}), got {t.dtype}")
    if t.dtype not in _FLOATS:
        raise TypeError(f"{what}: expected dtype torch.float32 or torch.float64, got "
                        f"{t.dtype} (cgru computes in float32 and float64 only)")
    return t


def _check_input_dtype(t, what, dtype):
    """The input's dtype is the weights' (checked first, as torch does): a ``ValueError`` in
    torch's words, which torch's own module tests match."""
    if isinstance(t, torch.Tensor) and t.dtype != dtype:
        raise ValueError(f"{what}: RNN input dtype ({t.dtype}) does not match weight dtype "
                         f"({dtype}). Convert input: input.to({dtype}), or convert model: "
                         f"model.to({t.dtype})")


def _check_weights(module):
    """The dtype of the module's weights: every one a CPU float32/float64 tensor, one dtype."""
    dtype, names = None, module._flat_weights_names
    for name, w in zip(names, module._flat_weights):
        if w is None:
            raise TypeError(f"{name}: expected a parameter tensor, got None")
        if dtype is None:
            _check_tensor(w, name)
            dtype = w.dtype
        elif not isinstance(w, torch.Tensor) or w.dtype != dtype or not w.is_cpu or \
                w.layout != torch.strided:
            _check_tensor(w, name, dtype, like=f"the dtype of {names[0]}")
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
    # the dict is bound to the callback: at the interpreter's exit the tensor may outlive
    # this module's globals
    forget = functools.partial(_WEIGHT_VIEWS.pop, key, None)
    _WEIGHT_VIEWS[key] = (weakref.ref(t, lambda _, forget=forget: forget()), view)
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
_CELLS = {"GRU": "gru", "LSTM": "lstm", "RNN_TANH": "rnn_tanh", "RNN_RELU": "rnn_relu"}


def _spec(module, batch_major):
    """``(sizes, cell)`` — what a call needs to know of ``module``, in plain values (the
    backward operator's arguments): ``[input_size, hidden_size, num_layers, bidirectional,
    proj_size, bias, batch_major, num_threads or -1]`` and ``"gru"``, ``"lstm"``,
    ``"rnn_tanh"`` or ``"rnn_relu"``."""
    threads = -1 if module.num_threads is None else int(module.num_threads)
    sizes = [module.input_size, module.hidden_size, module.num_layers,
             int(module.bidirectional), module.proj_size, int(module.bias), int(batch_major),
             threads]
    return sizes, _CELLS[module.mode]


def _weight_names(num_layers, bidirectional, proj_size, bias):
    """torch's ``_flat_weights_names`` of a module of these sizes."""
    names = []
    for layer in range(num_layers):
        for suffix in ("", "_reverse")[:1 + bool(bidirectional)]:
            kinds = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if bias else []) \
                + (["weight_hr"] if proj_size else [])
            names += [f"{k}_l{layer}{suffix}" for k in kinds]
    return names


def _cgru_cell(name):
    """The cgru cell of a ``_spec`` cell name."""
    if name == "gru":
        return cgru.GRUCell()
    if name == "lstm":
        return cgru.LSTMCell()
    return cgru.RNNCell(name[len("rnn_"):])


def _tensors_key(tensors):
    """What identifies ``tensors`` and where their contents lie (``None`` entries included),
    or None when one of them has no memory of its own (inside ``vmap``).  Not their version:
    what the memory holds is proven by its bytes in every call, so an optimizer's in-place
    step keeps the key (a new network of views every step was 75 µs of a 1 ms step).  While
    the ``_Model`` holds the network, its views hold the tensors' storage, so no other tensor
    can come to lie at the same address under a reused ``id``."""
    key = []
    for t in tensors:
        if t is None:
            key.append(None)
            continue
        try:
            key.append((id(t), t.data_ptr(), tuple(t.shape), t.stride(), t.dtype))
        except RuntimeError:
            return None
    return tuple(key)


class _Model:
    """What the calls of one module share while its sizes, cell and dtype stay: the network's
    topology and cell, the weight names, the NumPy dtype, and the ``cgru.Network`` over the
    weight tensors of its last call.  Calls that share them share what cgru derives from a
    network's weights (its plans and the kernels' fixed arguments, found by the topology and
    cell objects), instead of making them again every call."""

    __slots__ = ("key", "topology", "cell", "names", "dtype", "weight_slots", "_weights_network")

    def __init__(self, key):
        (I, H, L, bidirectional, P, bias), cell, dtype = key
        self.key = key
        self.topology = cgru.Topology(I, H, L, "bidirectional" if bidirectional else "forward",
                                      proj_size=P)
        self.cell = _cgru_cell(cell)
        self.names = _weight_names(L, bidirectional, P, bias)
        self.dtype = np.dtype("float64" if dtype == torch.float64 else "float32")
        self._weights_network = None    # (key of the weight tensors, their cgru.Network)
        D, by_name = self.topology.num_directions, {}
        for i in range(self.topology.num_layer_directions):
            suffix = f"_l{i // D}" + ("_reverse" if i % D else "")
            for slot in self.topology.shapes(i, self.cell.gates):
                by_name[dict(_SLOTS)[slot] + suffix] = (i, slot)
        self.weight_slots = tuple(by_name[n] for n in self.names)   # (layer-direction, slot)

    def network(self, tensors, fill):
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
                    arrays[slot] = fill(shapes[slot], self.dtype) if t is None else _weight_numpy(t)
            layers.append(cgru.LayerParams(**arrays))
        return cgru.Network(self.topology, layers, self.cell)

    def weights_network(self, weights):
        """``self.network(weights, np.zeros)``, built once for the calls on the same weight
        tensors: the last one built is used again while every weight tensor is the same tensor
        at the same storage, shape, strides and dtype.  It is a network of views, so it is
        only ever the way to the tensors' memory: what the memory holds is proven by cgru's
        byte comparison in every call (an optimizer's in-place step, a write through
        ``.data``: the comparison sees the new bytes)."""
        key = _tensors_key(weights)
        last = self._weights_network
        if key is not None and last is not None and last[0] == key:
            return last[1]
        net = self.network(weights, np.zeros)
        if key is not None:
            self._weights_network = (key, net)      # one assignment: a consistent pair
        return net


_MODELS = {}        # id(module) -> (weak reference to the module, the _Model of its last call)


def _model_of(module, sizes, cell, dtype):
    """The ``_Model`` of a call of ``module`` (``_spec``'s ``sizes`` and ``cell``, the weights'
    torch ``dtype``): its last call's while they are the same, else a new one, kept in its
    place.  It goes with the module."""
    key = (tuple(sizes[:6]), cell, dtype)
    entry = _MODELS.get(id(module))
    if entry is not None and entry[0]() is module and entry[1].key == key:
        return entry[1]
    model = _Model(key)
    forget = functools.partial(_MODELS.pop, id(module), None)
    _MODELS[id(module)] = (weakref.ref(module, lambda _, forget=forget: forget()), model)
    return model


class _Call:
    """What one forward computes besides its tensors: its module's ``_Model`` (topology, cell,
    weight names, dtype), the sequence lengths, the layout, dropout, seed and threads."""

    def __init__(self, sizes, cell, dtype, lengths=None, dropout=0.0, seed=(0, 0),
                 training=False, model=None):
        batch_major, threads = sizes[6], sizes[7]
        if model is None:
            model = _Model((tuple(sizes[:6]), cell, dtype))
        self.model = model
        self.topology, self.cell, self.names = model.topology, model.cell, model.names
        self.dtype = model.dtype
        self.sizes, self.cell_name = list(sizes), cell
        self.lengths, self.batch_major = lengths, bool(batch_major)
        self.dropout, self.seed = dropout, seed
        self.num_threads = None if threads < 0 else threads
        self.training = training        # cgru's training forward (a reserve, dropout)
        self.forwards = 0               # training forwards run (more than one: in a vmap loop)
        self.frozen = None              # the weights the first one computed with

    @property
    def lstm(self):
        return self.cell.has_cell_state

    def weights_network(self, weights):
        """The module's network over ``weights`` (``_Model.weights_network``)."""
        return self.model.weights_network(weights)

    def forward(self, x, h0, c0, weights):
        """``((y, hy[, cy]), reserve)``: cgru's forward, outputs as tensors (zero-copy).  A
        training forward keeps the weights it computed with (``weights.Frozen``: cgru's copies
        of the bytes it read) for its backward.  A repeated inference of the same shape goes
        straight to its runner (``engine.repeat``: the weights' bytes compared with the copies
        the runner computes from, every call)."""
        net, xn, h0n, c0n = self.weights_network(weights), _numpy(x), _numpy(h0), _numpy(c0)
        if not self.training and self.lengths is None and not self.batch_major:
            r = engine.repeat(net, xn, h0n, c0n, self.num_threads)
            if r is not None:
                return (_tensor(r.y), _tensor(r.hy)) + ((_tensor(r.cy),) if self.lstm else ()), \
                    None
        call = calls.ForwardCall.check(
            net, xn, h0n, c0=c0n,
            lengths=self.lengths, batch_major=self.batch_major, training=self.training,
            dropout=self.dropout, seed=self.seed if self.dropout else 0,   # (the common call)
            num_threads=self.num_threads)
        r = engine.run_forward(call)
        if self.training:
            self.forwards += 1
            self.frozen = call.frozen if self.forwards == 1 else None
        outs = (_tensor(r.y), _tensor(r.hy)) + ((_tensor(r.cy),) if self.lstm else ())
        return outs, r.reserve

    def backward(self, x, weights, reserve, dy, dhy, dcy, need_weights, need_dx=True):
        """``(dx, dh0, dc0, [dweight or None])``: cgru's backward; the weight gradients are
        the engine's own result arrays as tensors (zero-copy), ``None`` where
        ``need_weights`` says they are not needed (none needed: none computed); ``dx`` None
        when ``need_dx`` is false (``x`` needs no gradient: its product is not computed).

        It computes with the weights its forward computed with (kept by this call's one
        training forward): the gradient of the function that forward computed, whatever the
        parameters hold by now — torch refuses a backward after an in-place change it sees
        (the saved tensors' versions), and a write through ``.data``, which it does not see,
        changes nothing here.  A call that ran several forwards (a ``vmap`` loop) proves the
        weights by their bytes, as ``cgru.backward`` does."""
        frozen = self.frozen if self.forwards == 1 else None
        net = self.weights_network(weights) if frozen is None else frozen.net
        g = engine.run_backward(calls.BackwardCall.check(
            net, _numpy(x), _numpy(reserve), _numpy(dy), _numpy(dhy), dcy=_numpy(dcy),
            batch_major=self.batch_major, num_threads=self.num_threads, frozen=frozen,
            need_dx=need_dx, need_dparams=any(need_weights)))
        grads = [_tensor(getattr(g.dparams[i], slot)) if need else None
                 for (i, slot), need in zip(self.weight_slots(), need_weights)]
        return _tensor(g.dx), _tensor(g.dh0), _tensor(g.dc0), grads

    def weight_slots(self):
        """``(layer-direction, slot)`` of each weight, in ``self.names`` order."""
        return self.model.weight_slots

    def weight_shapes(self):
        """The shape of each weight, in ``self.names`` order."""
        return [tuple(self.topology.shapes(i, self.cell.gates)[slot])
                for i, slot in self.weight_slots()]


def _no_storage(t):
    """``t`` is a tensor without memory of its own — inside the vmap of
    ``torch.autograd.gradcheck(check_batched_grad=True)``, a batch of upstream gradients."""
    if t is None or _wrapped(t):
        return False
    try:
        t.data_ptr()
    except RuntimeError:
        return True
    return False


@torch.library.custom_op("cgru::rnn_backward", mutates_args=())
def _backward_op(sizes: list[int], cell: str, need_weights: list[bool], reserve: torch.Tensor,
                 x: torch.Tensor, dy: torch.Tensor, dhy: torch.Tensor, dcy: torch.Tensor,
                 flat_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                      torch.Tensor]:
    """``(dx, dh0, dc0, flat weight gradients)``: cgru's backward as a torch operator of
    tensors only (an empty ``dy``/``dhy``/``dcy``: none; ``flat_weights``: every weight
    raveled, in torch's order; ``dc0`` empty but for an LSTM; a weight not needed gets zeros).

    Only for upstream gradients without memory of their own (``_no_storage``): torch's
    dispatcher then runs the operator once per entry of the batch, with ordinary tensors."""
    call = _Call(sizes, cell, x.dtype)
    shapes = call.weight_shapes()
    weights = [w.view(shape) for w, shape in
               zip(flat_weights.split([int(np.prod(s)) for s in shapes]), shapes)]
    given = [None if t.numel() == 0 else t for t in (dy, dhy, dcy)]
    dx, dh0, dc0, dweights = call.backward(x, weights, reserve, *given, need_weights)
    flat = torch.cat([torch.zeros_like(w).reshape(-1) if g is None else g.reshape(-1)
                      for w, g in zip(weights, dweights)])
    return dx, dh0, x.new_empty(0) if dc0 is None else dc0, flat


def _direct_backward(call, need, reserve, x, dy, dhy, dcy, weights):
    """``(dx, dh0, dc0, dweights)``: ``cgru.backward`` on ordinary tensors (``need``: whether
    ``x``, then each weight, needs its gradient)."""
    return call.backward(x, weights, reserve, dy, dhy, dcy, need[1:], need_dx=need[0])


def _batched_backward(call, need, reserve, x, dy, dhy, dcy, weights):
    """``(dx, dh0, dc0, dweights)`` for a batch of upstream gradients (``_no_storage``;
    ``dx`` computed whether or not it is needed)."""
    need_weights = need[1:]
    empty = x.new_empty(0)
    flat = torch.cat([w.reshape(-1) for w in weights])
    dx, dh0, dc0, dflat = _backward_op(call.sizes, call.cell_name, list(need_weights), reserve,
                                       x, *(empty if t is None else t for t in (dy, dhy, dcy)),
                                       flat)
    parts = dflat.split([w.numel() for w in weights], dim=-1)
    dweights = [g.reshape(g.shape[:-1] + w.shape) if need else None
                for g, w, need in zip(parts, weights, need_weights)]
    return dx, dh0, dc0 if call.lstm else None, dweights


_NO_DOUBLE_BACKWARD = (
    "cgru.torch: double backward is not supported — this differentiates a gradient that "
    "cgru's backward computed (a gradient penalty, a Hessian-vector product, "
    "torch.func.grad of torch.func.grad, torch.autograd.gradgradcheck), and cgru's backward is "
    "not itself differentiable; use torch.nn's own module for second-order terms")


def _wrapped(t):
    """``t`` is a tensor of a ``torch.func`` transform (``grad``, ``vmap``, ``jacrev`` …)."""
    return t is not None and torch._C._functorch.is_functorch_wrapped_tensor(t)


def _looped(function, info, in_dims, args):
    """The ``vmap`` rule of ``function`` (a ``torch.autograd.Function`` below): one ``apply``
    per entry of the vmapped dimension, outputs stacked along a new leading dimension.

    ``args`` are ``apply``'s arguments and ``in_dims`` their vmapped dimensions (``None``: not
    vmapped, or not a tensor: given whole to every call).  Outputs that are ``None`` stay
    ``None``."""
    results = []
    for i in range(info.batch_size):
        sliced = [a.select(d, i) if isinstance(a, torch.Tensor) and d is not None else a
                  for a, d in zip(args, in_dims)]
        results.append(function.apply(*sliced))
    outputs, dims = [], []
    for k, first in enumerate(results[0]):
        if first is None:
            outputs.append(None)
            dims.append(None)
        else:
            outputs.append(torch.stack([r[k] for r in results]))
            dims.append(0)
    return tuple(outputs), tuple(dims)


# torch's ``Function.apply`` binds the arguments to ``forward``'s signature before anything else
# (``inspect.signature``: about 20 µs a call, a tenth of a small training step), then, outside
# ``torch.func`` transforms, unwraps dead functorch wrappers and calls autograd's own apply.
# For these functions, all-positional without defaults, the binding is the identity, so
# ``_Function.apply`` does the rest directly, and inside a transform leaves it all to torch.
# Where this torch lacks either hook, torch's ``apply`` serves as it is.
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)
try:
    from torch._functorch.utils import unwrap_dead_wrappers as _unwrap_dead_wrappers
except ImportError:                                        # pragma: no cover
    _unwrap_dead_wrappers = None


class _Function(torch.autograd.Function):
    """A ``torch.autograd.Function`` whose ``apply`` outside ``torch.func`` transforms skips
    torch's binding of the arguments (see above); subclasses' ``forward`` take positional
    arguments only, without defaults."""

    @classmethod
    def apply(cls, *args):
        if _transforms_active is None or _unwrap_dead_wrappers is None or _transforms_active():
            return super().apply(*args)
        return super(torch.autograd.Function, cls).apply(*_unwrap_dead_wrappers(args))


class _Recurrent(_Function):
    """``apply(call, x, h0, c0, *weights) -> (y, hy[, cy], reserve)``: cgru's forward
    (``call.training``: its training forward, whose reserve — a uint8 tensor, not
    differentiable — the backward reads; otherwise the inference one and ``reserve`` None).
    ``h0``/``c0`` may be ``None`` (zeros).

    ``setup_context`` is separate from ``forward`` and ``vmap`` loops over the vmapped
    dimension, so that ``torch.func``'s transforms (``grad``, ``vmap``, ``jacrev``,
    ``jacfwd`` excepted: no forward-mode rule) and batched gradients run through it."""

    @staticmethod
    def forward(call, x, h0, c0, *weights):
        outs, reserve = call.forward(x, h0, c0, weights)
        return (*outs, _tensor(reserve))

    @staticmethod
    def setup_context(ctx, inputs, output):
        call, x, h0, c0, *weights = inputs
        reserve = output[-1]
        if reserve is not None:
            ctx.mark_non_differentiable(reserve)
        ctx.call = call
        ctx.save_for_backward(x, h0, c0, reserve, *weights)   # torch refuses the backward
        ctx.set_materialize_grads(False)   # if they change; unused outputs: None (cgru: 0)

    @staticmethod
    def backward(ctx, *grads):
        call = ctx.call
        dy, dhy = grads[0], grads[1]
        dcy = grads[2] if call.lstm else None
        x, h0, c0, reserve, *weights = ctx.saved_tensors
        if reserve is None:
            raise RuntimeError("cgru.torch: this forward ran without a reserve (inference), "
                               "so it has no backward")
        need = ctx.needs_input_grad          # (call, x, h0, c0, *weights)
        args = (call, (need[1],) + tuple(need[4:]), reserve, x, h0, c0, dy, dhy, dcy, *weights)
        if torch.is_grad_enabled() or (_transforms_active is None or _transforms_active()):
            dx, dh0, dc0, *dweights = _RecurrentGrad.apply(*args)
        else:       # a plain backward: no graph of the gradients for the Function to record
            dx, dh0, dc0, *dweights = _RecurrentGrad.forward(*args)
        return (None, dx if need[1] else None, dh0 if need[2] else None,
                dc0 if need[3] else None, *dweights)

    @staticmethod
    def vmap(info, in_dims, *args):
        return _looped(_Recurrent, info, in_dims, args)


class _RecurrentGrad(_Function):
    """``apply(call, need, reserve, x, h0, c0, dy, dhy, dcy, *weights) -> (dx, dh0, dc0,
    *dweights)``: ``cgru.backward`` on the reserve of a ``_Recurrent`` forward (``dx`` and a
    weight gradient may be ``None`` where ``need`` — ``x``'s, then each weight's — says they
    are not needed).

    A function of its own so that a backward with ``create_graph=True`` (which
    ``torch.func.grad`` always uses) gets correct first-order gradients that are part of the
    graph — of every tensor the gradients depend on, the forward's inputs included — and
    differentiating them again raises instead of silently treating them as constants."""

    @staticmethod
    def forward(call, need, reserve, x, h0, c0, dy, dhy, dcy, *weights):
        run = _batched_backward if any(_no_storage(t) for t in (dy, dhy, dcy)) else \
            _direct_backward
        dx, dh0, dc0, dweights = run(call, need, reserve, x, dy, dhy, dcy, weights)
        return (dx, dh0, dc0, *dweights)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_NO_DOUBLE_BACKWARD)

    @staticmethod
    def vmap(info, in_dims, *args):
        return _looped(_RecurrentGrad, info, in_dims, args)


# --- the modules ---------------------------------------------------------------------------
_NOT_TORCHSCRIPT = (
    "cgru.torch.{0}: {1} — its forward calls cgru's compiled kernels through NumPy, which "
    "TorchScript cannot represent. Use torch.compile(model) instead (it runs cgru's forward as "
    "a call of its own), or keep torch.nn.{0} for TorchScript")


class _CgruForward:
    """``forward`` of torch's recurrent modules, computed by cgru (mixed into subclasses of
    ``nn.GRU``, ``nn.LSTM`` and ``nn.RNN``; it adds no state of its own, so that ``swap`` can
    turn a torch module into a cgru one by its class alone)."""

    num_threads = None          # cgru's pool threads (None: cgru's default)

    @torch.compiler.disable
    def forward(self, input, hx=None):
        """torch's ``forward``, computed by cgru.  ``torch.compile`` runs it as a call of its
        own (a graph break: the NumPy code inside is not traced), the rest of a model
        compiled around it."""
        if torch.jit.is_tracing():
            raise RuntimeError(_NOT_TORCHSCRIPT.format(type(self).__name__, "torch.jit.trace "
                               "would record cgru's outputs as constants"))
        update = getattr(self, "_update_flat_weights", None)    # torch ≥ 2.0: follow the
        if update is not None:                                  # weights functional_call
            update()                                            # puts in place
        dtype = _check_weights(self)
        if isinstance(input, PackedSequence):
            _check_input_dtype(input.data, "input.data", dtype)
            return self._forward_packed(input, hx, dtype)
        _check_input_dtype(input, "input", dtype)
        return self._forward_padded(input, hx, dtype)

    def __prepare_scriptable__(self):
        """``torch.jit.script`` asks this first (of every submodule): refuse, saying why."""
        raise RuntimeError(_NOT_TORCHSCRIPT.format(type(self).__name__, "torch.jit.script "
                           "cannot compile its forward"))

    def _forward_padded(self, input, hx, dtype):
        _check_tensor(input, "input", dtype)
        if input.dim() not in (2, 3):
            raise ValueError(f"input: expected a 3-D tensor {self._layout()} or an unbatched "
                             f"2-D one [T, I], got shape {list(input.shape)}")
        batched = input.dim() == 3
        batch_dim = 0 if self.batch_first else 1
        x = input if batched else input.unsqueeze(batch_dim)
        T, N = (x.shape[1], x.shape[0]) if self.batch_first else (x.shape[0], x.shape[1])
        if x.shape[-1] != self.input_size or T == 0:
            raise ValueError(f"input: expected shape {self._layout()} with I = input_size = "
                             f"{self.input_size} and T ≥ 1, got {list(input.shape)}")
        h0, c0 = self._initial_state(hx, N, batched, dtype)
        run = self._run if N else self._empty_batch
        y, hy, cy = run(x, h0, c0, None, self.batch_first, dtype)
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
        """``(y, hy, cy)`` (``cy`` None but for the LSTM), through autograd when needed (and
        always inside a ``torch.func`` transform)."""
        weights = list(self._flat_weights)
        tensors = [x, h0, c0, *weights]
        grad = torch.is_grad_enabled() and any(
            t is not None and (t.requires_grad or _wrapped(t)) for t in tensors)
        p = self._dropout()
        sizes, cell = _spec(self, batch_major)
        call = _Call(sizes, cell, dtype, lengths, p, _draw_seed() if p else (0, 0),
                     training=grad or p > 0, model=_model_of(self, sizes, cell, dtype))
        if grad or any(_wrapped(t) for t in tensors):
            outs = _Recurrent.apply(call, x, h0, c0, *weights)
        else:
            outs, _ = call.forward(x, h0, c0, weights)
        return outs[0], outs[1], outs[2] if call.lstm else None

    def _empty_batch(self, x, h0, c0, lengths, batch_major, dtype):
        """``(y, hy, cy)`` of a batch of no sequences (N = 0), as torch returns them: empty
        tensors of the output shapes, differentiable — the weights' gradients are zeros."""
        self._dropout()                         # the same refusal as a batch of sequences
        T = x.shape[1] if batch_major else x.shape[0]
        D = 2 if self.bidirectional else 1
        S = self.proj_size or self.hidden_size
        zero = sum(t.sum() for t in (x, h0, c0, *self._flat_weights) if t is not None) * 0
        y = x.new_zeros((0, T, D * S) if batch_major else (T, 0, D * S)) + zero
        hy = x.new_zeros((self.num_layers * D, 0, S)) + zero
        cy = x.new_zeros((self.num_layers * D, 0, self.hidden_size)) + zero
        return y, hy, cy if isinstance(self, nn.LSTM) else None


class GRU(_CgruForward, nn.GRU):
    """``torch.nn.GRU`` computed by cgru (CPU, float32/float64); see ``cgru.torch``."""



class LSTM(_CgruForward, nn.LSTM):
    """``torch.nn.LSTM`` (``proj_size`` included) computed by cgru; see ``cgru.torch``."""



class RNN(_CgruForward, nn.RNN):
    """``torch.nn.RNN`` (``nonlinearity`` tanh or relu) computed by cgru; see
    ``cgru.torch``."""



_REPLACEMENTS = {nn.GRU: GRU, nn.LSTM: LSTM, nn.RNN: RNN}


def swap(model):
    """Make every ``nn.GRU``, ``nn.LSTM`` and ``nn.RNN`` inside ``model`` (recursively, the
    model itself included) compute with cgru, in place; returns ``model``.

    Each such module keeps its identity and everything it holds — the same ``Parameter``
    objects (nothing is copied, so an optimizer built before keeps working), hooks, device,
    mode — and only its class becomes the cgru subclass (``cgru.torch.GRU`` …, still an
    ``nn.GRU``).  Subclasses of the torch modules (user-defined ones, or cgru's) are left as
    they are: their own ``forward`` may do more than torch's.  The checks (CPU, float32 or
    float64) happen when the module runs.  A model with nothing to swap and no cgru module
    (only ``nn.GRUCell``/``LSTMCell``/``RNNCell``, or subclasses) gets a ``UserWarning`` that
    says what it holds.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    swapped, on_cgru, left = 0, 0, set()
    for module in model.modules():
        replacement = _REPLACEMENTS.get(type(module))
        if replacement is not None:
            module.__class__ = replacement
            swapped += 1
        elif isinstance(module, _CgruForward):
            on_cgru += 1
        elif isinstance(module, (nn.RNNBase, nn.RNNCellBase)):
            left.add(type(module).__name__)
    if not swapped and not on_cgru:
        warnings.warn(_nothing_swapped(model, sorted(left)), UserWarning, stacklevel=2)
    return model


def _nothing_swapped(model, left):
    """What ``swap`` says of a model in which it found nothing to swap."""
    what = f"cgru.torch.swap: {type(model).__name__} has no torch.nn.GRU, LSTM or RNN to swap"
    if left:
        what += (f"; left as they are: {', '.join(left)} (cells — one time step — and "
                 f"subclasses with a forward of their own are not replaced)")
    return what + "; nothing changed"
