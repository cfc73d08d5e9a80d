"""Lossless weight conversion between cgru's canonical parameters and every system's tensors.

The canonical model is ``(cgru.Params, cgru.Cell)``: per layer-direction ``l·D + d`` the
matrices ``W [3H, in]``, ``R [3H, H]`` and six bias vectors ``b_W``, ``b_R`` ``[3H]``, gates
``r, z, n``, plus the cell variant.  Every system maps to and from it (``to_X`` / ``from_X``);
any pair converts through it.

Gate orders and orientation per system::

    PyTorch, cuDNN/TF, Arraymancer   r, z, n   [3H, in], x·Wᵀ
    ONNX, Keras, oneDNN              z, r, n   ONNX [3H, in]; Keras kernel [in, 3H], x·K;
                                               oneDNN ldigo [L, D, in, 3, H]
    MPSGraph                         z, r, o   (r, z, o with reset_gate_first) [3H, in]

Rules (SPEC §1 and §4.5):

* A target that cannot compute the source's function is refused with a ``ValueError`` that
  says why: the other candidate form (reset after vs before the recurrent product),
  activations, ``clip`` or ``flip_z`` the target lacks, a direction or input mode it lacks,
  non-zero biases for a bias-less target.
* Fewer-bias targets get the sums ``b_Wr + b_Rr`` and ``b_Wz + b_Rz`` (exact: only the sums are
  observable); for the reset-before cell also ``b_Wn + b_Rn``.  For the reset-after cell
  ``b_Wn`` and ``b_Rn`` are never merged (``b_Rn`` sits inside the reset product): every
  fewer-bias target that computes the reset-after cell keeps them apart (MPSGraph
  ``secondary_bias``, oneDNN LBR's fourth bias gate), and the single-candidate-bias targets
  (Keras ``reset_after=False``, oneDNN vanilla GRU, MPSGraph ``resetAfter=NO``) compute the
  reset-before cell, so a reset-after source is refused there for its candidate form.
* Fewer-bias sources map in with the sums on the input side and zeros on the recurrent side.
* ``input_mode="skip"`` (cuDNN) converts to systems without it as explicit identity input
  matrices (the same function); ``"projected"`` (MPSGraph without input weights) converts only
  to MPSGraph.

Round trips are exact: ``from_X(to_X(p))`` returns ``p``'s arrays bit for bit, except that a
fewer-bias target returns the summed biases (as ``b_W``, with ``b_R = 0``) — which compute the
same function — and that skip mode comes back as identity input matrices; and
``to_X(from_X(w)) == w`` bit for bit for every system.
All arrays are returned as fresh NumPy copies of the source dtype (float32 or float64).
"""
import re

import numpy as np

from cgru.cell import Activation, Cell
from cgru._checks import float_array
from cgru.params import LayerParams, Params, Topology

__all__ = [
    "to_torch", "from_torch", "to_keras", "from_keras", "keras_config",
    "to_tf_canonical", "from_tf_canonical", "to_tf_opaque", "from_tf_opaque",
    "to_onnx", "from_onnx", "to_mps", "from_mps", "to_arraymancer", "from_arraymancer",
    "to_onednn", "from_onednn",
]

_RZN_TO_ZRN = (1, 0, 2)      # canonical r, z, n → z, r, n (the permutation is an involution)


# --- helpers ---------------------------------------------------------------------------------
def _np(a, what, dtype=None):
    """``a`` as a NumPy float array (torch tensors accepted), dtype-checked."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):          # a torch tensor
        a = a.detach().cpu().numpy()
    return float_array(a, what, dtype, like="like the other weights")


def _dim(a, what, axis, layout):
    """``a.shape[axis]`` of an array that must be ``layout`` (``ValueError`` when ``a`` has too
    few axes to read it)."""
    if a.ndim < (-axis if axis < 0 else axis + 1):
        raise ValueError(f"{what}: expected shape {layout}, got {list(a.shape)}")
    return a.shape[axis]


def _flag(value, what):
    """A bool argument: ``True``/``False`` (or NumPy's), never read by truthiness."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what}: expected a bool, got {value!r}")
    return bool(value)


def _name(value, what, table, note=""):
    """``table[value]`` for a name argument (``TypeError`` for a non-str, ``ValueError`` for an
    unknown name, with ``note`` appended)."""
    if not isinstance(value, str):
        raise TypeError(f"{what}: expected a name (str), got {value!r}")
    if value not in table:
        raise ValueError(f"{what}: expected one of {sorted(table)}, got {value!r}{note}")
    return table[value]


def _array_list(value, what):
    """A list (or tuple) of arrays as a list; ``TypeError`` naming ``what`` otherwise."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what}: expected a list of arrays, got {type(value).__name__}")
    return list(value)


def _tensor_dict(node, what, required, optional):
    """A dict of named tensors with every ``required`` key and no key beyond ``optional``."""
    if not isinstance(node, dict):
        raise TypeError(f"{what}: expected a dict of arrays, got {type(node).__name__}")
    extra = set(node) - set(required) - set(optional)
    if extra:
        raise ValueError(f"{what}: unexpected keys {sorted(extra, key=repr)}; expected "
                         f"{list(required) + list(optional)}")
    missing = [k for k in required if k not in node]
    if missing:
        raise ValueError(f"{what}: missing {missing} (required: {list(required)})")
    return node


def _shape(a, what, shape):
    if a.shape != tuple(shape):
        raise ValueError(f"{what}: expected shape {list(shape)}, got {list(a.shape)}")
    return a


def _gates(a, H, order, axis=0):
    """Reorder gate blocks of ``H`` along ``axis``: result block ``k`` = input block
    ``order[k]``."""
    idx = np.concatenate([np.arange(g * H, (g + 1) * H) for g in order])
    return np.ascontiguousarray(np.take(a, idx, axis=axis))


def _check_params(params):
    if not isinstance(params, Params):
        raise TypeError(f"params: expected a cgru.Params, got {type(params).__name__}")
    return params.topology


def _as_cell(cell):
    if cell is None:
        return Cell()
    if not isinstance(cell, Cell):
        raise TypeError(f"cell: expected a cgru.Cell or None, got {type(cell).__name__}")
    return cell


def _require(cell, target, *, reset_after=None, activations=None, shared_gate_act=False,
             clip=False, flip_z=False):
    """Refuse a cell the target cannot compute (``ValueError`` with the reason).

    ``reset_after``: the forms the target has (``(True,)``, ``(False,)`` or both);
    ``activations``: a predicate ``Activation -> bool`` for what the target can name (None:
    sigmoid gates and tanh candidate only); ``shared_gate_act``: the target has one
    activation for both gates; ``clip``/``flip_z``: whether the target has them.
    """
    cell = _as_cell(cell)
    forms = (True, False) if reset_after is None else reset_after
    if cell.reset_after not in forms:
        have = "reset-after" if cell.reset_after else "reset-before"
        raise ValueError(
            f"{target} cannot express this cell: it computes only the "
            f"{'reset-after' if forms == (True,) else 'reset-before'} GRU "
            f"({'r ⊙ (h·R_nᵀ + b_Rn)' if forms == (True,) else '(r ⊙ h)·R_nᵀ'}), and the source "
            f"is {have} — a different function, not a weight layout")
    if cell.flip_z and not flip_z:
        raise ValueError(f"{target} cannot express flip_z=True (h' = z·n + (1 − z)·h): it has "
                         f"only h' = (1 − z)·n + z·h")
    if cell.clip is not None and not clip:
        raise ValueError(f"{target} has no clip; the source clamps pre-activations to "
                         f"±{cell.clip}")
    if activations is None:
        ok = (cell.f_r.name, cell.f_z.name, cell.g.name) == ("sigmoid", "sigmoid", "tanh")
        if not ok:
            raise ValueError(f"{target} has fixed activations (sigmoid gates, tanh candidate); "
                             f"the source uses f_r={cell.f_r.name}, f_z={cell.f_z.name}, "
                             f"g={cell.g.name}")
    else:
        for name in ("f_r", "f_z", "g"):
            act = getattr(cell, name)
            if not activations(act):
                raise ValueError(f"{target} has no activation equal to the source's {name} = "
                                 f"{act.name}(alpha={act.alpha}, beta={act.beta})")
    if shared_gate_act and cell.f_r != cell.f_z:
        raise ValueError(f"{target} has one activation for both gates; the source uses "
                         f"f_r={cell.f_r} and f_z={cell.f_z}")
    return cell


def _forms(value, what):
    """The candidate forms a caller allows: ``None`` → both, else exactly the one given."""
    if value is None:
        return None
    if not isinstance(value, (bool, np.bool_, int, np.integer)) or value not in (0, 1):
        raise ValueError(f"{what}: expected None, True/1 or False/0, got {value!r}")
    return (bool(value),)


def _require_topology(topo, target, directions=("forward", "reverse", "bidirectional"),
                      why=""):
    if topo.direction not in directions:
        raise ValueError(f"{target} cannot express direction={topo.direction!r}{why}")
    if topo.input_mode == "projected":
        raise ValueError(f"{target} cannot express input_mode='projected' (the input already "
                         f"holds the gate pre-activations); only MPSGraph without input "
                         f"weights can")


def _input_matrix(params, i):
    """``W`` of layer-direction ``i``; identity blocks for the skip mode's layer 0."""
    lp = params[i]
    topo = params.topology
    if i < topo.num_directions and topo.input_mode == "skip":
        eye = np.eye(topo.hidden_size, dtype=params.dtype)
        return np.concatenate([eye, eye, eye])
    return lp.W


def _merged_biases(lp, cell, H):
    """``(b_rz_sum [2H], b_n [H], b_Rn [H] or None)`` for a target with summed gate biases.

    Reset-before: ``b_n = b_Wn + b_Rn`` (both outside the reset product; exact).  Reset-after:
    ``b_Wn`` and ``b_Rn`` stay apart (``b_Rn`` sits inside ``r ⊙ (h·R_nᵀ + b_Rn)``, so their
    sum would be a different function); every reset-after target here has a slot for it.
    """
    b_rz = lp.b_W[:2 * H] + lp.b_R[:2 * H]
    if cell.reset_after:
        return b_rz, lp.b_W[2 * H:].copy(), lp.b_R[2 * H:].copy()
    return b_rz, lp.b_W[2 * H:] + lp.b_R[2 * H:], None


def _no_biases(params, target):
    for i, lp in enumerate(params):
        if np.any(lp.b_W) or np.any(lp.b_R):
            raise ValueError(f"{target} has no biases, but layer-direction {i} has non-zero "
                             f"biases")


def _direction_from(D, reverse=False):
    return "bidirectional" if D == 2 else ("reverse" if reverse else "forward")


# --- PyTorch ---------------------------------------------------------------------------------
_TORCH_KEY = re.compile(r"^(weight_ih|weight_hh|bias_ih|bias_hh)_l(\d+)(_reverse)?$")


def to_torch(params, cell=None, *, bias=True):
    """A ``torch.nn.GRU`` ``state_dict`` as NumPy arrays.

    Keys ``weight_ih_l{k}[_reverse]`` ``[3H, in]``, ``weight_hh_l{k}[_reverse]`` ``[3H, H]``,
    ``bias_ih_…``, ``bias_hh_…`` ``[3H]`` (gates r, z, n); ``bias=False`` omits the biases
    (refused when any is non-zero).  PyTorch computes the default cell only, forward or
    bidirectional.  Load with ``module.load_state_dict({k: torch.from_numpy(v) …})``.
    """
    topo = _check_params(params)
    bias = _flag(bias, "bias")
    _require(cell, "PyTorch nn.GRU", reset_after=(True,))
    _require_topology(topo, "PyTorch nn.GRU", ("forward", "bidirectional"),
                      " (it has forward and bidirectional only)")
    if not bias:
        _no_biases(params, "PyTorch nn.GRU(bias=False)")
    D = topo.num_directions
    out = {}
    for i, lp in enumerate(params):
        sfx = f"_l{i // D}" + ("_reverse" if i % D else "")
        out["weight_ih" + sfx] = _input_matrix(params, i).copy()
        out["weight_hh" + sfx] = lp.R.copy()
        if bias:
            out["bias_ih" + sfx] = lp.b_W.copy()
            out["bias_hh" + sfx] = lp.b_R.copy()
    return out


def from_torch(state_dict):
    """``(Params, Cell)`` from a ``torch.nn.GRU`` ``state_dict`` (NumPy arrays or tensors).

    The number of layers, directions and the presence of biases are read from the keys.
    """
    if not hasattr(state_dict, "items"):
        raise TypeError(f"state_dict: expected a mapping, got {type(state_dict).__name__}")
    found = {}
    for key, value in state_dict.items():
        m = _TORCH_KEY.match(key) if isinstance(key, str) else None
        if not m:
            raise ValueError(f"state_dict: unexpected key {key!r} (expected weight_ih_l{{k}}, "
                             f"weight_hh_l{{k}}, bias_ih_l{{k}}, bias_hh_l{{k}}, optionally with "
                             f"_reverse)")
        found[(m.group(1), int(m.group(2)), 1 if m.group(3) else 0)] = (key, value)
    if not found:
        raise ValueError("state_dict: empty")
    L = 1 + max(k[1] for k in found)
    D = 2 if any(k[2] for k in found) else 1
    has_bias = any(k[0].startswith("bias") for k in found)
    for name in ("weight_ih", "weight_hh"):
        if (name, 0, 0) not in found:
            raise ValueError(f"state_dict: missing '{name}_l0'")
    first = _np(found[("weight_hh", 0, 0)][1], "state_dict['weight_hh_l0']")
    dtype = first.dtype
    H = _dim(first, "state_dict['weight_hh_l0']", -1, "[3H, H]")
    I = _dim(_np(found[("weight_ih", 0, 0)][1], "state_dict['weight_ih_l0']", dtype),
             "state_dict['weight_ih_l0']", -1, "[3H, I]")
    topo = Topology(I, H, L, _direction_from(D))
    layers = []
    for i in range(L * D):
        l, d = divmod(i, D)
        arrays = {}
        for name, slot in (("weight_ih", "W"), ("weight_hh", "R"), ("bias_ih", "b_W"),
                           ("bias_hh", "b_R")):
            key = f"{name}_l{l}" + ("_reverse" if d else "")
            if (name, l, d) not in found:
                if name.startswith("bias") and not has_bias:
                    arrays[slot] = np.zeros(3 * H, dtype)
                    continue
                raise ValueError(f"state_dict: missing {key!r}")
            a = _np(found.pop((name, l, d))[1], f"state_dict[{key!r}]", dtype)
            arrays[slot] = _shape(a, f"state_dict[{key!r}]", topo.shapes(i)[slot]).copy()
        layers.append(LayerParams(**arrays))
    if found:
        raise ValueError(f"state_dict: keys beyond L={L}, D={D}: {[v[0] for v in found.values()]}")
    return Params(topo, layers), Cell()


# --- Keras -----------------------------------------------------------------------------------
# Keras activation names with exactly cgru's function (Keras' hard_sigmoid differs between
# Keras 2 (0.2x + 0.5) and Keras 3 (x/6 + 0.5), so it is not mapped).
_KERAS_ACTS = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu", "linear": "identity",
               "softsign": "softsign", "softplus": "softplus", "elu": "elu"}
_CGRU_TO_KERAS = {v: k for k, v in _KERAS_ACTS.items()}


def _keras_act_ok(act):
    return act.name in _CGRU_TO_KERAS and (act.name != "elu" or act.alpha == 1.0)


def keras_config(cell=None, *, reset_after=None):
    """The Keras ``GRU`` arguments of a cell: ``activation``, ``recurrent_activation``,
    ``reset_after`` (refused when Keras cannot express the cell, or when ``reset_after`` is
    given and differs from the cell's form)."""
    target = "Keras GRU" if reset_after is None else f"Keras GRU(reset_after={bool(reset_after)})"
    cell = _require(cell, target, reset_after=_forms(reset_after, "reset_after"),
                    activations=_keras_act_ok, shared_gate_act=True)
    return {"activation": _CGRU_TO_KERAS[cell.g.name],
            "recurrent_activation": _CGRU_TO_KERAS[cell.f_z.name],
            "reset_after": cell.reset_after}


def to_keras(params, cell=None, *, use_bias=True, reset_after=None):
    """Keras ``get_weights()`` lists, one per layer: ``[kernel, recurrent_kernel, bias]``
    (``GRU``), or forward then backward weights (``Bidirectional(GRU)``).

    ``kernel [in, 3H]``, ``recurrent_kernel [H, 3H]`` (columns z, r, h), ``bias`` ``(2, 3H)``
    rows input/recurrent for ``reset_after=True``, ``(3H,)`` (the sums) for
    ``reset_after=False``; ``use_bias=False`` omits it (refused when a bias is non-zero).
    ``keras_config(cell)`` gives the matching layer arguments; ``reset_after`` (None: the
    cell's) demands one form.  Keras' ``go_backwards`` returns outputs in reversed time, so
    direction "reverse" is refused.
    """
    topo = _check_params(params)
    use_bias = _flag(use_bias, "use_bias")
    cell = _as_cell(cell)
    keras_config(cell, reset_after=reset_after)
    _require_topology(topo, "Keras", ("forward", "bidirectional"),
                      " (go_backwards returns outputs in processing order, not aligned to the "
                      "original time)")
    if not use_bias:
        _no_biases(params, "Keras GRU(use_bias=False)")
    H, D = topo.hidden_size, topo.num_directions
    layers = []
    for l in range(topo.num_layers):
        weights = []
        for d in range(D):
            i = l * D + d
            lp = params[i]
            weights.append(_gates(_input_matrix(params, i), H, _RZN_TO_ZRN).T.copy())
            weights.append(_gates(lp.R, H, _RZN_TO_ZRN).T.copy())
            if use_bias:
                bW, bR = _gates(lp.b_W, H, _RZN_TO_ZRN), _gates(lp.b_R, H, _RZN_TO_ZRN)
                weights.append(np.stack([bW, bR]) if cell.reset_after else bW + bR)
        layers.append(weights)
    return layers


def from_keras(layers, *, reset_after=True, bidirectional=False, activation="tanh",
               recurrent_activation="sigmoid"):
    """``(Params, Cell)`` from Keras ``get_weights()`` lists, one per stacked layer (each 2 or
    3 arrays per direction; 2 means ``use_bias=False``).  Errors about the backward direction's
    arrays of a ``Bidirectional`` layer say ``(backward)``."""
    if not isinstance(layers, (list, tuple)) or not layers:
        raise TypeError("layers: expected a non-empty list of get_weights() lists")
    note = " (the other Keras activations have no exact cgru equivalent)"
    g = _name(activation, "activation", _KERAS_ACTS, note)
    f = _name(recurrent_activation, "recurrent_activation", _KERAS_ACTS, note)
    reset_after = _flag(reset_after, "reset_after")
    D = 2 if _flag(bidirectional, "bidirectional") else 1
    cell = Cell(reset_after=reset_after, f_r=f, f_z=f, g=g)
    out, dtype, I, H = [], None, None, None
    for l, weights in enumerate(layers):
        weights = _array_list(weights, f"layers[{l}]")
        if len(weights) not in (2 * D, 3 * D):
            raise ValueError(f"layers[{l}]: expected {2 * D} or {3 * D} arrays "
                             f"({'Bidirectional' if D == 2 else 'GRU'}), got {len(weights)}")
        per = len(weights) // D
        for d in range(D):
            w = weights[d * per:(d + 1) * per]
            what = {s: f"layers[{l}] {s}" + (" (backward)" if d else "")
                    for s in ("kernel", "recurrent_kernel", "bias")}
            K = _np(w[0], what["kernel"], dtype)
            if H is None:                           # the sizes come from the first kernel
                if K.ndim != 2 or K.shape[1] % 3 or 0 in K.shape:
                    raise ValueError(f"{what['kernel']}: expected shape [in, 3H] with in ≥ 1 "
                                     f"and H ≥ 1, got {list(K.shape)}")
                dtype, I, H = K.dtype, K.shape[0], K.shape[1] // 3
            _shape(K, what["kernel"], (I if l == 0 else D * H, 3 * H))
            RK = _shape(_np(w[1], what["recurrent_kernel"], dtype), what["recurrent_kernel"],
                        (H, 3 * H))
            W = _gates(K.T, H, _RZN_TO_ZRN)
            R = _gates(RK.T, H, _RZN_TO_ZRN)
            if per == 2:
                bW = bR = np.zeros(3 * H, dtype)
            elif reset_after:
                b = _shape(_np(w[2], what["bias"], dtype), what["bias"], (2, 3 * H))
                bW, bR = _gates(b[0], H, _RZN_TO_ZRN), _gates(b[1], H, _RZN_TO_ZRN)
            else:
                b = _shape(_np(w[2], what["bias"], dtype), what["bias"], (3 * H,))
                bW, bR = _gates(b, H, _RZN_TO_ZRN), np.zeros(3 * H, dtype)
            out.append(LayerParams(W=W, R=R, b_W=bW, b_R=bR))
    topo = Topology(I, H, len(layers), _direction_from(D))
    return Params(topo, out), cell


# --- TensorFlow CudnnRNN: canonical lists and opaque params ----------------------------------
def to_tf_canonical(params, cell=None):
    """``(weights, biases)``: TF ``CudnnRNNParamsToCanonical`` lists.

    Index ``(l·D + d)·6 + k`` with ``k`` the cuDNN linLayerID (0 W_r, 1 W_z, 2 W_n, 3 R_r,
    4 R_z, 5 R_n); weights ``[H, width]`` (``[H, 0]`` for layer 0's input matrices in skip
    mode), biases ``[H]``.
    """
    topo = _check_params(params)
    _require(cell, "TF CudnnRNN (cuDNN)", reset_after=(True,))
    _require_topology(topo, "TF CudnnRNN (cuDNN)", ("forward", "bidirectional"),
                      " (cuDNN has unidirectional forward and bidirectional only)")
    H = topo.hidden_size
    weights, biases = [], []
    for lp in params:
        for M in (lp.W, lp.R):
            weights += [M[g * H:(g + 1) * H].copy() for g in range(3)]
        for b in (lp.b_W, lp.b_R):
            biases += [b[g * H:(g + 1) * H].copy() for g in range(3)]
    return weights, biases


def from_tf_canonical(weights, biases, *, direction="forward", input_mode="linear"):
    """``(Params, Cell)`` from TF canonical lists (see ``to_tf_canonical``); the number of
    layers, sizes and dtype are read from the lists."""
    if not isinstance(direction, str) or direction not in ("forward", "bidirectional"):
        raise ValueError(f"direction: TF CudnnRNN has 'forward' (unidirectional) and "
                         f"'bidirectional', got {direction!r}")
    weights, biases = _array_list(weights, "weights"), _array_list(biases, "biases")
    D = 2 if direction == "bidirectional" else 1
    if len(weights) == 0 or len(weights) % (6 * D) or len(biases) != len(weights):
        raise ValueError(f"weights/biases: expected two lists of 6·L·D entries (D={D}), got "
                         f"{len(weights)} weights and {len(biases)} biases")
    dtype = _np(weights[3], "weights[3]").dtype
    H = _dim(weights[3], "weights[3]", 0, "[H, H]")
    I = _dim(_np(weights[0], "weights[0]", dtype), "weights[0]", 1, "[H, I]")
    if input_mode == "skip":
        I = H
    topo = Topology(I, H, len(weights) // (6 * D), direction, input_mode)
    layers = []
    for i in range(topo.num_layer_directions):
        width = topo.shapes(i)["W"][1]
        mats = []
        for k in range(6):
            a = _np(weights[6 * i + k], f"weights[{6 * i + k}]", dtype)
            mats.append(_shape(a, f"weights[{6 * i + k}]", (H, width if k < 3 else H)))
        bs = [_shape(_np(biases[6 * i + k], f"biases[{6 * i + k}]", dtype),
                     f"biases[{6 * i + k}]", (H,)) for k in range(6)]
        layers.append(LayerParams(W=np.concatenate(mats[:3]), R=np.concatenate(mats[3:]),
                                  b_W=np.concatenate(bs[:3]), b_R=np.concatenate(bs[3:])))
    return Params(topo, layers), Cell()


def to_tf_opaque(params, cell=None):
    """TF's opaque ``params`` vector (cgru's layout, ``Params.flat()``; SPEC §4.1)."""
    topo = _check_params(params)
    _require(cell, "TF CudnnRNN (cuDNN)", reset_after=(True,))
    _require_topology(topo, "TF CudnnRNN (cuDNN)", ("forward", "bidirectional"),
                      " (cuDNN has unidirectional forward and bidirectional only)")
    return params.flat()


def from_tf_opaque(flat, topology):
    """``(Params, Cell)`` from TF's opaque ``params`` and the topology it was sized for."""
    if not isinstance(topology, Topology):
        raise TypeError(f"topology: expected a cgru.Topology, got {type(topology).__name__}")
    _require_topology(topology, "TF CudnnRNN (cuDNN)", ("forward", "bidirectional"))
    return Params.from_flat(topology, _np(flat, "flat")), Cell()


# --- ONNX ------------------------------------------------------------------------------------
_ONNX_NAMES = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "affine": "Affine",
               "leaky_relu": "LeakyRelu", "thresholded_relu": "ThresholdedRelu",
               "scaled_tanh": "ScaledTanh", "hard_sigmoid": "HardSigmoid", "elu": "Elu",
               "softsign": "Softsign", "softplus": "Softplus", "identity": "Affine"}
_ONNX_TAKES = {"Affine": (True, True), "LeakyRelu": (True, False),
               "ThresholdedRelu": (True, False), "ScaledTanh": (True, True),
               "HardSigmoid": (True, True), "Elu": (True, False)}


def _onnx_attributes(cell, topo):
    names, alphas, betas = [], [], []
    for act in (cell.f_z, cell.g) * topo.num_directions:
        name = _ONNX_NAMES[act.name]
        alpha, beta = (1.0, 0.0) if act.name == "identity" else (act.alpha, act.beta)
        takes_a, takes_b = _ONNX_TAKES.get(name, (False, False))
        names.append(name)
        if takes_a:
            alphas.append(alpha)
        if takes_b:
            betas.append(beta)
    attrs = {"hidden_size": topo.hidden_size, "direction": topo.direction,
             "linear_before_reset": int(cell.reset_after)}
    if names != ["Sigmoid", "Tanh"] * topo.num_directions:
        attrs["activations"] = names
        if alphas:
            attrs["activation_alpha"] = alphas        # always explicit: ONNX and onnxruntime
        if betas:                                     # disagree on some defaults
            attrs["activation_beta"] = betas
    if cell.clip is not None:
        attrs["clip"] = cell.clip
    return attrs


def to_onnx(params, cell=None, *, linear_before_reset=None):
    """``(layers, attributes)`` for one ONNX ``GRU`` node per layer.

    ``layers[l]`` = ``{"W": [D, 3H, in], "R": [D, 3H, H], "B": [D, 6H]}`` (gates z, r, h;
    ``B = [Wb, Rb]``); ``attributes`` (the same for every node) holds ``hidden_size``,
    ``direction``, ``linear_before_reset`` and, when not the defaults, ``activations`` with
    explicit ``activation_alpha``/``activation_beta``, and ``clip``.  The identity maps to
    ``Affine(1, 0)``.  Layer ``l ≥ 1`` reads the previous ``Y [T, D, N, H]`` transposed to
    ``[T, N, D·H]``.  Use as ``cgru.onnx.gru(X, **layers[0], **attributes)``.
    ``linear_before_reset`` (None: the cell's form) demands one form.
    """
    topo = _check_params(params)
    target = "ONNX GRU" if linear_before_reset is None else \
        f"ONNX GRU(linear_before_reset={int(bool(linear_before_reset))})"
    cell = _require(cell, target, reset_after=_forms(linear_before_reset, "linear_before_reset"),
                    activations=lambda a: a.name in _ONNX_NAMES,
                    shared_gate_act=True, clip=True)
    _require_topology(topo, "ONNX GRU")
    H, D = topo.hidden_size, topo.num_directions
    layers = []
    for l in range(topo.num_layers):
        idx = range(l * D, (l + 1) * D)
        layers.append({
            "W": np.stack([_gates(_input_matrix(params, i), H, _RZN_TO_ZRN) for i in idx]),
            "R": np.stack([_gates(params[i].R, H, _RZN_TO_ZRN) for i in idx]),
            "B": np.stack([np.concatenate([_gates(params[i].b_W, H, _RZN_TO_ZRN),
                                           _gates(params[i].b_R, H, _RZN_TO_ZRN)])
                           for i in idx])})
    return layers, _onnx_attributes(cell, topo)


def from_onnx(layers, *, hidden_size=None, direction="forward", linear_before_reset=0,
              activations=None, activation_alpha=None, activation_beta=None, clip=None,
              layout=0):
    """``(Params, Cell)`` from ONNX ``GRU`` nodes: ``layers`` is one ``{"W", "R", "B"}``
    dict per node (``B`` optional) — or a single dict — all with the same attributes.

    The two directions of a bidirectional node must use the same activations (cgru's cell is
    one per stack; ``cgru.onnx.gru`` runs such a node directly).  ``layout`` (0 or 1) does not
    affect the weights.
    """
    from cgru.onnx import _DIRECTIONS, activations_to_cells, check_attribute, params_from_onnx
    if isinstance(layers, dict):
        layers = [layers]
    if not isinstance(layers, (list, tuple)) or not layers:
        raise TypeError("layers: expected a dict or a non-empty list of {'W', 'R', 'B'} dicts")
    check_attribute(direction, "direction", _DIRECTIONS)
    check_attribute(layout, "layout", (0, 1))
    if hidden_size is not None and (isinstance(hidden_size, bool)
                                    or not isinstance(hidden_size, (int, np.integer))):
        raise TypeError(f"hidden_size: expected None or an int, got {hidden_size!r}")
    D = 2 if direction == "bidirectional" else 1
    cells = activations_to_cells(activations, activation_alpha, activation_beta, clip,
                                 linear_before_reset, D)
    if cells[0] != cells[-1]:
        raise ValueError("activations: the two directions use different activations, which "
                         "one cgru.Cell cannot express; run the node with cgru.onnx.gru")
    cell = cells[0]
    if cell.g == Activation("affine", 1.0, 0.0):         # to_onnx writes the identity so
        cell = Cell(reset_after=cell.reset_after, f_r=cell.f_r, f_z=cell.f_z,
                    g="identity", clip=cell.clip)
    if cell.f_z == Activation("affine", 1.0, 0.0):
        cell = Cell(reset_after=cell.reset_after, f_r="identity", f_z="identity", g=cell.g,
                    clip=cell.clip)
    out, dtype, I, H = [], None, None, None
    for l, node in enumerate(layers):
        what = f"layers[{l}]"
        node = _tensor_dict(node, what, ("W", "R"), ("B",))
        R = _np(node["R"], f"{what}['R']", dtype)
        if H is None:                           # the sizes come from the first node
            if R.ndim != 3 or R.shape[-1] == 0:
                raise ValueError(f"{what}['R']: expected [D, 3H, H] with H ≥ 1, got "
                                 f"{list(R.shape)}")
            dtype, H = R.dtype, R.shape[-1]
            if hidden_size is not None and hidden_size != H:
                raise ValueError(f"hidden_size: {hidden_size} disagrees with {what}['R'] "
                                 f"{list(R.shape)}")
        W = _np(node["W"], f"{what}['W']", dtype)
        if I is None:
            I = _dim(W, f"{what}['W']", -1, "[D, 3H, I]")
        _shape(R, f"{what}['R']", (D, 3 * H, H))
        _shape(W, f"{what}['W']", (D, 3 * H, I if l == 0 else D * H))
        B = node.get("B")
        if B is not None:
            B = _shape(_np(B, f"{what}['B']", dtype), f"{what}['B']", (D, 6 * H))
        out += params_from_onnx(W, R, B, D)
    topo = Topology(I, H, len(layers), direction)
    return Params(topo, out), cell


# --- MPSGraph --------------------------------------------------------------------------------
_MPS_ACTS = ("identity", "relu", "tanh", "sigmoid", "hard_sigmoid")
_MPS_NAMES = {"identity": "none", "relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid",
              "hard_sigmoid": "hard_sigmoid"}


def _mps_act_ok(act):
    return act.name in _MPS_ACTS and (act.name != "hard_sigmoid"
                                      or (act.alpha, act.beta) == (0.2, 0.5))


def _mps_order(reset_gate_first):
    """MPS gate order as canonical indices: (z, r, o) = (1, 0, 2), or (r, z, o)."""
    return (0, 1, 2) if reset_gate_first else (1, 0, 2)


def to_mps(params, cell=None, *, reset_gate_first=False, reset_after=None):
    """``(layers, descriptor)`` for one MPSGraph ``GRU`` op per layer.

    ``layers[l]`` = ``{"input_weight": [3H, in] / [6H, in] (None in projected mode),
    "recurrent_weight": [3H, H] / [2, 3H, H], "bias": [3H] / [6H],
    "secondary_bias": [H] / [2H] (reset_after only, else None)}``, gates ``[z, r, o]`` (or
    ``[r, z, o]`` with ``reset_gate_first``), forward direction first.  ``bias`` is added
    outside the reset product for all three gates: ``z``/``r`` get ``b_W + b_R``; ``o`` gets
    ``b_Wn`` (reset_after, with ``secondary_bias = b_Rn`` inside the product) or
    ``b_Wn + b_Rn``.  ``descriptor`` holds the ``GRUDescriptor`` arguments;
    ``reset_after`` (None: the cell's form) demands one form.
    """
    topo = _check_params(params)
    target = "MPSGraph GRU" if reset_after is None else \
        f"MPSGraph GRU(resetAfter={'YES' if reset_after else 'NO'})"
    cell = _require(cell, target, reset_after=_forms(reset_after, "reset_after"),
                    activations=_mps_act_ok, flip_z=True)
    H, D = topo.hidden_size, topo.num_directions
    reset_gate_first = _flag(reset_gate_first, "reset_gate_first")
    order = _mps_order(reset_gate_first)
    if topo.input_mode == "projected" and not reset_gate_first:
        raise ValueError("MPSGraph without input weights reads the source in its gate order "
                         "[z, r, o]; cgru's projected input holds [r, z, n] — use "
                         "reset_gate_first=True")
    layers = []
    for l in range(topo.num_layers):
        Ws, Rs, bs, b2s = [], [], [], []
        for d in range(D):
            i = l * D + d
            lp = params[i]
            b_rz, b_n, b_rn = _merged_biases(lp, cell, H)
            bias = np.concatenate([b_rz, b_n])
            Ws.append(_gates(_input_matrix(params, i), H, order))
            Rs.append(_gates(lp.R, H, order))
            bs.append(_gates(bias, H, order))
            b2s.append(b_rn)
        projected = l == 0 and topo.input_mode == "projected"
        layers.append({
            "input_weight": None if projected else np.concatenate(Ws),
            "recurrent_weight": Rs[0] if D == 1 else np.stack(Rs),
            "bias": np.concatenate(bs),
            "secondary_bias": np.concatenate(b2s) if cell.reset_after else None})
    descriptor = {"reverse": topo.direction == "reverse",
                  "bidirectional": D == 2, "reset_gate_first": reset_gate_first,
                  "reset_after": cell.reset_after, "flip_z": cell.flip_z,
                  "update_gate_activation": _MPS_NAMES[cell.f_z.name],
                  "reset_gate_activation": _MPS_NAMES[cell.f_r.name],
                  "output_gate_activation": _MPS_NAMES[cell.g.name]}
    return layers, descriptor


def from_mps(layers, *, reverse=False, bidirectional=False, reset_gate_first=False,
             reset_after=False, flip_z=False, update_gate_activation="sigmoid",
             reset_gate_activation="sigmoid", output_gate_activation="tanh", training=False):
    """``(Params, Cell)`` from MPSGraph ``GRU`` ops, one dict per stacked op (keys as
    ``to_mps``; ``input_weight``, ``bias``, ``secondary_bias`` optional) and the descriptor's
    arguments (``training`` does not affect the function).  The summed gate biases go to
    ``b_W`` with ``b_R = 0`` (any split is the same function); ``secondary_bias`` becomes
    ``b_Rn``.  MPSGraph ignores ``secondary_bias`` when ``reset_after`` is False, and so does
    this function.  hard_sigmoid is ``clip(0.2·x + 0.5, 0, 1)``.
    """
    if isinstance(layers, dict):
        layers = [layers]
    if not isinstance(layers, (list, tuple)) or not layers:
        raise TypeError("layers: expected a dict or a non-empty list of MPSGraph tensor dicts")
    flags = {name: _flag(v, name) for name, v in (
        ("reverse", reverse), ("bidirectional", bidirectional),
        ("reset_gate_first", reset_gate_first), ("reset_after", reset_after),
        ("flip_z", flip_z), ("training", training))}
    inv = {v: Activation(k) for k, v in _MPS_NAMES.items()}
    cell = Cell(reset_after=flags["reset_after"], flip_z=flags["flip_z"],
                f_r=_name(reset_gate_activation, "reset_gate_activation", inv),
                f_z=_name(update_gate_activation, "update_gate_activation", inv),
                g=_name(output_gate_activation, "output_gate_activation", inv))
    D = 2 if flags["bidirectional"] else 1
    order = _mps_order(flags["reset_gate_first"])
    out, dtype, topo_args = [], None, None
    for l, op in enumerate(layers):
        what = f"layers[{l}]"
        op = _tensor_dict(op, what, ("recurrent_weight",),
                          ("input_weight", "bias", "secondary_bias"))
        RW = _np(op["recurrent_weight"], what + "['recurrent_weight']", dtype)
        if l == 0:                              # the sizes come from the first op
            dtype = RW.dtype
            H = _dim(RW, what + "['recurrent_weight']", -1,
                     "[3H, H]" if D == 1 else "[2, 3H, H]")
        _shape(RW, what + "['recurrent_weight']", (3 * H, H) if D == 1 else (D, 3 * H, H))
        RW = RW.reshape(D, 3 * H, H)
        IW = op.get("input_weight")
        mode = "linear"
        if IW is None:
            if l > 0:
                raise ValueError(f"{what}['input_weight']: required for a stacked op (l ≥ 1)")
            if not flags["reset_gate_first"]:
                raise ValueError("input_weight=None: the source then holds gate "
                                 "pre-activations in order [z, r, o]; cgru's projected mode "
                                 "needs [r, z, n] — only reset_gate_first=True converts")
            mode, width = "projected", D * 3 * H
        else:
            IW = _np(IW, what + "['input_weight']", dtype)
            width = _dim(IW, what + "['input_weight']", -1, "[D·3H, I]") if l == 0 else D * H
            _shape(IW, what + "['input_weight']", (D * 3 * H, width))
        if topo_args is None:
            topo_args = (width, H, mode)
        b = op.get("bias")
        b = np.zeros(D * 3 * H, dtype) if b is None else \
            _shape(_np(b, what + "['bias']", dtype), what + "['bias']", (D * 3 * H,))
        b2 = op.get("secondary_bias")
        if b2 is not None:
            b2 = _shape(_np(b2, what + "['secondary_bias']", dtype), what + "['secondary_bias']",
                        (D * H,))
        for d in range(D):
            inv_order = np.argsort(order)
            W = np.zeros((3 * H, 0), dtype) if IW is None else \
                _gates(IW[d * 3 * H:(d + 1) * 3 * H], H, inv_order)
            b_R = np.zeros(3 * H, dtype)
            if flags["reset_after"] and b2 is not None:
                b_R[2 * H:] = b2[d * H:(d + 1) * H]
            out.append(LayerParams(W=W, R=_gates(RW[d], H, inv_order),
                                   b_W=_gates(b[d * 3 * H:(d + 1) * 3 * H], H, inv_order),
                                   b_R=b_R))
    width, H, mode = topo_args
    topo = Topology(width, H, len(layers), _direction_from(D, flags["reverse"]), mode)
    return Params(topo, out), cell


# --- Arraymancer -----------------------------------------------------------------------------
def to_arraymancer(params, cell=None):
    """``{"w3s0": [3H, I], "w3sN": [L−1, 3H, H], "u3s": [L, 3H, H], "bW3s": [L, 1, 3H],
    "bU3s": [L, 1, 3H]}`` (gates r, z, n).  Arraymancer computes the default cell,
    unidirectional forward only."""
    topo = _check_params(params)
    _require(cell, "Arraymancer GRU", reset_after=(True,))
    _require_topology(topo, "Arraymancer GRU", ("forward",),
                      " (Arraymancer's GRU is unidirectional forward only)")
    H, L = topo.hidden_size, topo.num_layers
    w3sN = np.empty((L - 1, 3 * H, H), params.dtype)
    for l in range(1, L):
        w3sN[l - 1] = params[l].W
    return {"w3s0": _input_matrix(params, 0).copy(), "w3sN": w3sN,
            "u3s": np.stack([lp.R for lp in params]),
            "bW3s": np.stack([lp.b_W for lp in params])[:, None, :],
            "bU3s": np.stack([lp.b_R for lp in params])[:, None, :]}


def from_arraymancer(w3s0, w3sN, u3s, bW3s, bU3s):
    """``(Params, Cell)`` from Arraymancer's five tensors (see ``to_arraymancer``)."""
    w3s0 = _np(w3s0, "w3s0")
    dtype = w3s0.dtype
    if w3s0.ndim != 2 or w3s0.shape[0] % 3 or w3s0.shape[0] == 0:
        raise ValueError(f"w3s0: expected shape [3H, I], got {list(w3s0.shape)}")
    H = w3s0.shape[0] // 3
    u3s = _np(u3s, "u3s", dtype)
    if u3s.ndim != 3 or u3s.shape[0] == 0:
        raise ValueError(f"u3s: expected shape [L, 3H, H], got {list(u3s.shape)}")
    L = u3s.shape[0]
    _shape(u3s, "u3s", (L, 3 * H, H))
    w3sN = _shape(_np(w3sN, "w3sN", dtype), "w3sN", (L - 1, 3 * H, H))
    bW3s = _shape(_np(bW3s, "bW3s", dtype), "bW3s", (L, 1, 3 * H))
    bU3s = _shape(_np(bU3s, "bU3s", dtype), "bU3s", (L, 1, 3 * H))
    layers = [LayerParams(W=(w3s0 if l == 0 else w3sN[l - 1]).copy(), R=u3s[l].copy(),
                          b_W=bW3s[l, 0].copy(), b_R=bU3s[l, 0].copy()) for l in range(L)]
    return Params(Topology(w3s0.shape[1], H, L, "forward"), layers), Cell()


# --- oneDNN ----------------------------------------------------------------------------------
_ONEDNN_DIRECTIONS = {"unidirectional_left2right": "forward", "left2right": "forward",
                      "unidirectional_right2left": "reverse", "right2left": "reverse",
                      "bidirectional_concat": "bidirectional",
                      "forward": "forward", "reverse": "reverse",
                      "bidirectional": "bidirectional"}
_TO_ONEDNN_DIRECTION = {"forward": "unidirectional_left2right",
                        "reverse": "unidirectional_right2left",
                        "bidirectional": "bidirectional_concat"}


def to_onednn(params, cell=None, *, cell_kind=None):
    """oneDNN RNN tensors (plain ``ldigo``/``ldgo`` formats) for ``gru`` or ``lbr_gru``.

    ``{"weights_layer": [L, D, I, 3, H], "weights_iter": [L, D, H, 3, H], "bias": [L, D, G, H],
    "cell_kind": "vanilla_gru" | "lbr_gru", "direction": "unidirectional_left2right" |
    "unidirectional_right2left" | "bidirectional_concat"}``, gates ``u (= z), r, o``.
    The reset-before cell is oneDNN's vanilla GRU (``G = 3``, biases summed); the reset-after
    cell is LBR GRU (``G = 4``: ``z``/``r`` sums, ``b_Wn``, then ``b_Rn`` inside the reset
    product).  One ``weights_layer`` tensor holds every layer, so ``L > 1`` needs
    ``I == D·H`` (oneDNN's own rule); convert a stack layer by layer otherwise.
    ``cell_kind`` (None: from the cell) demands one of the two.
    """
    topo = _check_params(params)
    kinds = {None: None, "vanilla_gru": (False,), "lbr_gru": (True,)}
    if not (cell_kind is None or isinstance(cell_kind, str)) or cell_kind not in kinds:
        raise ValueError(f"cell_kind: expected None, 'vanilla_gru' or 'lbr_gru', got "
                         f"{cell_kind!r}")
    cell = _require(cell, "oneDNN " + (cell_kind or "GRU"), reset_after=kinds[cell_kind])
    _require_topology(topo, "oneDNN GRU")
    H, D, L = topo.hidden_size, topo.num_directions, topo.num_layers
    I = topo.input_size if topo.input_mode == "linear" else H
    if L > 1 and I != D * H:
        raise ValueError(f"oneDNN keeps all layers in one weights_layer [L, D, I, 3, H], so "
                         f"L > 1 needs input_size == D·H = {D * H}, got {I}; convert the layers "
                         f"one at a time")
    G = 4 if cell.reset_after else 3
    wl = np.empty((L, D, I, 3, H), params.dtype)
    wi = np.empty((L, D, H, 3, H), params.dtype)
    bias = np.empty((L, D, G, H), params.dtype)
    for i, lp in enumerate(params):
        l, d = divmod(i, D)
        # ldigo[l, d, i, g, o] = W_g[o, i]: each gate block transposed
        wl[l, d] = _gates(_input_matrix(params, i), H, _RZN_TO_ZRN).reshape(3, H, I) \
            .transpose(2, 0, 1)
        wi[l, d] = _gates(lp.R, H, _RZN_TO_ZRN).reshape(3, H, H).transpose(2, 0, 1)
        b_rz, b_n, b_rn = _merged_biases(lp, cell, H)
        bias[l, d, :3] = _gates(np.concatenate([b_rz, b_n]), H, _RZN_TO_ZRN).reshape(3, H)
        if cell.reset_after:
            bias[l, d, 3] = b_rn
    return {"weights_layer": wl, "weights_iter": wi, "bias": bias,
            "cell_kind": "lbr_gru" if cell.reset_after else "vanilla_gru",
            "direction": _TO_ONEDNN_DIRECTION[topo.direction]}


def from_onednn(weights_layer, weights_iter, bias, *, direction="unidirectional_left2right"):
    """``(Params, Cell)`` from oneDNN ``ldigo``/``ldgo`` tensors; the cell is LBR GRU
    (reset-after) when ``bias`` has 4 gates, vanilla GRU (reset-before) with 3.
    ``bidirectional_sum`` is refused (cgru concatenates the directions)."""
    if not isinstance(direction, str) or direction not in _ONEDNN_DIRECTIONS:
        raise ValueError(f"direction: expected one of {sorted(_ONEDNN_DIRECTIONS)}, got "
                         f"{direction!r} (bidirectional_sum adds the directions' outputs, "
                         f"which cgru does not compute)")
    cgru_dir = _ONEDNN_DIRECTIONS[direction]
    wl = _np(weights_layer, "weights_layer")
    dtype = wl.dtype
    if wl.ndim != 5 or wl.shape[3] != 3:
        raise ValueError(f"weights_layer: expected ldigo [L, D, I, 3, H], got {list(wl.shape)}")
    L, D, I, _, H = wl.shape
    if D != (2 if cgru_dir == "bidirectional" else 1):
        raise ValueError(f"weights_layer: direction {direction!r} needs D = "
                         f"{2 if cgru_dir == 'bidirectional' else 1}, got shape {list(wl.shape)}")
    wi = _shape(_np(weights_iter, "weights_iter", dtype), "weights_iter", (L, D, H, 3, H))
    b = _np(bias, "bias", dtype)
    if b.ndim != 4 or b.shape[2] not in (3, 4):
        raise ValueError(f"bias: expected ldgo [L, D, 3 or 4, H], got {list(b.shape)}")
    _shape(b, "bias", (L, D, b.shape[2], H))
    reset_after = b.shape[2] == 4
    if L > 1 and I != D * H:
        raise ValueError(f"weights_layer: L > 1 needs I == D·H = {D * H}, got I = {I}")
    layers = []
    for l in range(L):
        for d in range(D):
            W = _gates(wl[l, d].transpose(1, 2, 0).reshape(3 * H, I), H, _RZN_TO_ZRN)
            R = _gates(wi[l, d].transpose(1, 2, 0).reshape(3 * H, H), H, _RZN_TO_ZRN)
            b_W = _gates(b[l, d, :3].reshape(3 * H), H, _RZN_TO_ZRN)
            b_R = np.zeros(3 * H, dtype)
            if reset_after:
                b_R[2 * H:] = b[l, d, 3]
            layers.append(LayerParams(W=W, R=R, b_W=b_W, b_R=b_R))
    return Params(Topology(I, H, L, cgru_dir), layers), Cell(reset_after=reset_after)
