"""What several systems' weight mappings share: the refusal rules, the gate-block permutation,
skip mode's identity input matrices, the bias-merging rules, and the checks every converter
applies to the tensors and options it reads.

Refusal rule: a target that cannot compute the source's function is refused with a
``ValueError`` saying why (``require`` for GRU cells, ``require_lstm``, ``require_rnn``,
``require_kind``, ``require_topology``, ``no_projection``, ``no_biases``): a cell kind the target
lacks, the other GRU candidate form (reset after vs before the recurrent product), activations,
``clip`` or ``flip_z`` the target lacks, a direction, input mode or LSTM projection it lacks,
non-zero biases for a bias-less target.

Bias rules (``merged_biases``, ``separate_biases``): fewer-bias targets get the sums
``b_Wr + b_Rr`` and ``b_Wz + b_Rz`` (exact: only the sums are observable); for the reset-before
cell also ``b_Wn + b_Rn``.  For the reset-after cell ``b_Wn`` and ``b_Rn`` are never merged
(``b_Rn`` sits inside the reset product).  LSTM and vanilla RNN biases all sit outside any
product, so a one-bias target gets ``b_W + b_R`` for every gate.  Fewer-bias sources map in
with the sums on the input side and zeros on the recurrent side (``b_Rn`` kept where the
source has it).

Names follow one scheme: ``T, N, I, H, L, D``, ``P`` (an LSTM's projection), ``G`` (gate
blocks); canonical gate order ``r, z, n`` (GRU), ``i, f, g, o`` (LSTM), one block (RNN).
"""
import numbers

import numpy as np

from cgru.core import validate
from cgru.core.cells import GRUCell, is_cell
from cgru.core.network import DIRECTIONS, Network

# Canonical r, z, n → z, r, n (ONNX, Keras, oneDNN, MPSGraph's default).  The permutation swaps
# the first two blocks, so it is its own inverse.
RZN_TO_ZRN = (1, 0, 2)
_DEFAULT_CELL = GRUCell()
# How messages name each cell kind.
KIND_NAMES = {"gru": "a GRU (cgru.GRUCell)", "lstm": "an LSTM (cgru.LSTMCell)",
              "rnn": "a vanilla RNN (cgru.RNNCell)"}
_PLURALS = {"gru": "GRUs", "lstm": "LSTMs", "rnn": "vanilla RNNs"}


# --- tensors and options a converter reads ---------------------------------------------------
def numpy_of(a):
    """A torch tensor as a NumPy array (anything else as it is)."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):
        return a.detach().cpu().numpy()
    return a


def weight(a, what, dtype=None, like="like the other weights"):
    """``a`` (a NumPy array or a torch tensor) as a float NumPy array, dtype-checked."""
    return validate.float_array(numpy_of(a), what, dtype, like=like)


def dim(a, what, axis, layout):
    """``a.shape[axis]`` of an array that must be ``layout`` (``ValueError`` when ``a`` has too
    few axes to read it)."""
    if a.ndim < (-axis if axis < 0 else axis + 1):
        raise ValueError(f"{what}: expected shape {layout}, got {list(a.shape)}")
    return a.shape[axis]


def shaped(a, what, shape):
    """``a`` when its shape is ``shape``, else a ``ValueError`` quoting both."""
    if a.shape != tuple(shape):
        raise ValueError(f"{what}: expected shape {validate.shape_text(shape)}, got "
                         f"{list(a.shape)}")
    return a


def array_list(value, what):
    """A list (or tuple) of arrays as a list; ``TypeError`` naming ``what`` otherwise."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what}: expected a list of arrays, got {type(value).__name__}")
    return list(value)


def node_list(layers, what):
    """One dict of tensors per stacked op/node (a single dict allowed) as a non-empty list."""
    if isinstance(layers, dict):
        return [layers]
    if not isinstance(layers, (list, tuple)) or not layers:
        raise TypeError(f"layers: expected a dict or a non-empty list of {what} dicts")
    return list(layers)


def tensor_dict(node, what, required, optional):
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


def option(value, what, choices, note=""):
    """``value`` when it is one of ``choices`` and of their kind — a name (``str`` or ``bytes``,
    returned decoded) or an int that is not a bool; anything else, another type included, is a
    ``ValueError`` naming ``what`` (an attribute's value is refused, never compared
    elementwise: a NumPy array does not pass)."""
    if isinstance(choices[0], str):
        decoded = validate.text(value)
        ok = isinstance(decoded, str) and decoded in choices
    else:
        decoded = value
        ok = not isinstance(value, bool) and isinstance(value, numbers.Integral) \
            and value in choices
    if not ok:
        raise ValueError(f"{what}: expected one of {', '.join(map(repr, choices))}, got "
                         f"{value!r}{note}")
    return decoded


# --- the network and its cell ----------------------------------------------------------------
def topology_of(net):
    """The topology of ``net``, a ``cgru.Network`` (``TypeError`` otherwise)."""
    if not isinstance(net, Network):
        raise TypeError(f"params: expected a cgru.Network, got "
                        f"{type(net).__name__}")
    return net.topology


def network_and_cell(net, cell):
    """``(topology, cell)`` of what ``to_X(net, cell)`` converts: the network's own cell
    (``Network.resolve_cell``: a contradicting ``cell`` is an error, the old explicit form a
    ``DeprecationWarning``)."""
    return topology_of(net), net.resolve_cell(cell)


def as_cell(cell):
    """A cell argument of a function that takes a cell, not a network: ``None`` → cuDNN's
    GRU cell; a ``Network`` → its cell; any cgru cell kind as it is."""
    if cell is None:
        return _DEFAULT_CELL
    if isinstance(cell, Network):
        return cell.cell
    if not is_cell(cell):
        raise TypeError(f"cell: expected a cgru.Cell (GRUCell, LSTMCell, RNNCell), a "
                        f"cgru.Network or None, got {type(cell).__name__}")
    return cell


# --- refusal rules ---------------------------------------------------------------------------
def require_kind(cell, target, kinds, hint=None):
    """``cell`` when its kind is one of ``kinds`` (what ``target`` has), else a ``ValueError``
    naming the kind (and ``hint``: where to go instead)."""
    if cell.kind not in kinds:
        have = " and ".join(_PLURALS[k] for k in kinds)
        raise ValueError(f"{target} has {have} only: the network's cell is "
                         f"{KIND_NAMES[cell.kind]}, which it cannot compute (not supported "
                         f"there){'; ' + hint if hint else ''}")
    return cell


def _no_clip(cell, target):
    if cell.clip is not None:
        raise ValueError(f"{target} has no clip; the source clamps pre-activations to "
                         f"±{cell.clip}")


def _describe(act):
    return f"{act.name}(alpha={act.alpha}, beta={act.beta})"


def _activations(cell, target, names, activations, fixed, fixed_text):
    """Refuse the cell's activations ``names`` the target cannot name: ``activations`` a
    predicate ``Activation -> bool``, or ``None`` for a target with the ``fixed`` ones only."""
    if activations is None:
        got = tuple(getattr(cell, n).name for n in names)
        if got != fixed:
            raise ValueError(f"{target} has fixed activations ({fixed_text}); the source uses "
                             + ", ".join(f"{n}={g}" for n, g in zip(names, got)))
        return
    for n in names:
        act = getattr(cell, n)
        if not activations(act):
            raise ValueError(f"{target} has no activation equal to the source's {n} = "
                             f"{_describe(act)}")


def require(cell, target, *, reset_after=None, activations=None, shared_gate_act=False,
            clip=False, flip_z=False):
    """``cell`` when ``target`` can compute it, else a ``ValueError`` with the reason.

    ``reset_after``: the forms the target has (``(True,)``, ``(False,)``; None: both);
    ``activations``: a predicate ``Activation -> bool`` for what the target can name (None:
    sigmoid gates and tanh candidate only); ``shared_gate_act``: the target has one
    activation for both gates; ``clip``/``flip_z``: whether the target has them.
    """
    require_kind(cell, target, ("gru",))
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
    if not clip:
        _no_clip(cell, target)
    _activations(cell, target, ("f_r", "f_z", "g"), activations,
                 ("sigmoid", "sigmoid", "tanh"), "sigmoid gates, tanh candidate")
    if shared_gate_act and cell.f_r != cell.f_z:
        raise ValueError(f"{target} has one activation for both gates; the source uses "
                         f"f_r={cell.f_r} and f_z={cell.f_z}")
    return cell


def require_lstm(cell, target, *, activations=None, shared_gate_act=False,
                 shared_cell_act=False, clip=False, peepholes=(), input_forget=False):
    """``cell`` (an LSTM) when ``target`` can compute it, else a ``ValueError`` with the reason.

    ``activations``: a predicate ``Activation -> bool`` for what the target can name (None:
    sigmoid gates, tanh for g and h only); ``shared_gate_act``: one activation for the i, f
    and o gates (ONNX ``f``, Keras ``recurrent_activation``); ``shared_cell_act``: one for g
    and h (Keras ``activation``); ``clip``: whether the target has it; ``peepholes``: the
    peephole forms it has (``"ifo"``, ``"ifgo"``); ``input_forget``: whether it has coupled
    input and forget gates."""
    require_kind(cell, target, ("lstm",))
    if not clip:
        _no_clip(cell, target)
    if cell.peepholes and cell.peepholes not in peepholes:
        raise ValueError(f"{target} has no peepholes in the source's form "
                         f"(peepholes={cell.peepholes!r}: the gates see the cell state)"
                         if not peepholes else
                         f"{target} has peepholes only in the form(s) {list(peepholes)}; the "
                         f"source's are {cell.peepholes!r}")
    if cell.input_forget and not input_forget:
        raise ValueError(f"{target} has no coupled input and forget gates (the source has "
                         f"input_forget=True: f = 1 − i)")
    _activations(cell, target, ("f_i", "f_f", "f_o", "g", "h"), activations,
                 ("sigmoid",) * 3 + ("tanh",) * 2, "sigmoid gates, tanh cell input and output")
    if shared_gate_act and not cell.f_i == cell.f_f == cell.f_o:
        raise ValueError(f"{target} has one activation for the i, f and o gates; the source "
                         f"uses f_i={cell.f_i}, f_f={cell.f_f}, f_o={cell.f_o}")
    if shared_cell_act and cell.g != cell.h:
        raise ValueError(f"{target} has one activation for the cell input and the output "
                         f"(g and h); the source uses g={cell.g}, h={cell.h}")
    return cell


def require_rnn(cell, target, activations, clip=False):
    """``cell`` (a vanilla RNN) when ``target`` can compute it: its activation passes the
    predicate ``activations`` and it has no clip unless the target has one."""
    require_kind(cell, target, ("rnn",))
    if not clip:
        _no_clip(cell, target)
    if not activations(cell.activation):
        raise ValueError(f"{target} has no activation equal to the source's "
                         f"{_describe(cell.activation)}")
    return cell


def no_projection(topo, target):
    """Refuse an LSTM projection for a target without one."""
    if topo.proj_size:
        raise ValueError(f"{target} has no LSTM recurrent projection; the source has "
                         f"proj_size={topo.proj_size} (h' = W_p·(o ⊙ h(c')))")


def forms(value, what):
    """The candidate forms a caller demands: ``None`` → either, else exactly the one given."""
    if value is None:
        return None
    if not isinstance(value, (bool, np.bool_, int, np.integer)) or value not in (0, 1):
        raise ValueError(f"{what}: expected None, True/1 or False/0, got {value!r}")
    return (bool(value),)


def demanded(target, value, what, spelling):
    """``(target name, forms)`` for a caller whose option ``what`` demands one candidate form
    (``None``: the cell's): the target named with the option as its system spells it
    (``spelling(reset_after)``), e.g. ``Keras GRU(reset_after=False)``."""
    f = forms(value, what)
    return (target if f is None else f"{target}({spelling(f[0])})"), f


def require_topology(topo, target, directions=DIRECTIONS, why=""):
    """Refuse a direction the target lacks and the projected input mode (MPSGraph's only)."""
    if topo.direction not in directions:
        raise ValueError(f"{target} cannot express direction={topo.direction!r}{why}")
    if topo.input_mode == "projected":
        raise ValueError(f"{target} cannot express input_mode='projected' (the input already "
                         f"holds the gate pre-activations); only MPSGraph without input "
                         f"weights can")


def no_biases(net, target):
    """Refuse non-zero biases for a bias-less target."""
    for i, lp in enumerate(net):
        if np.any(lp.b_W) or np.any(lp.b_R):
            raise ValueError(f"{target} has no biases, but layer-direction {i} has non-zero "
                             f"biases")


# --- gate blocks, identity input matrices, biases -------------------------------------------
def permute_gates(a, H, order, axis=0):
    """Gate blocks of ``H`` along ``axis`` reordered: result block ``k`` = input block
    ``order[k]`` (a new C-contiguous array)."""
    idx = np.concatenate([np.arange(g * H, (g + 1) * H) for g in order])
    return np.ascontiguousarray(np.take(a, idx, axis=axis))


def inverse(order):
    """The permutation that undoes ``order``."""
    return tuple(int(k) for k in np.argsort(order))


def input_matrix(net, i):
    """``W`` of layer-direction ``i``; skip mode's layer 0 has the identity in every gate block
    (cuDNN ``CUDNN_SKIP_INPUT``), written out for systems without that mode."""
    topo = net.topology
    if i < topo.num_directions and topo.input_mode == "skip":
        eye = np.eye(topo.hidden_size, dtype=net.dtype)
        return np.concatenate([eye] * net.cell.gates)
    return net[i].W


def merged_biases(lp, cell, H):
    """``(b_rz [2H], b_n [H], b_Rn [H] or None)`` for a target with summed gate biases.

    Reset-before: ``b_n = b_Wn + b_Rn`` (both outside the reset product; exact).  Reset-after:
    ``b_Wn`` and ``b_Rn`` stay apart (``b_Rn`` sits inside ``r ⊙ (h·R_nᵀ + b_Rn)``, so their
    sum would be a different function); every reset-after target here has a slot for it.
    """
    b_rz = lp.b_W[:2 * H] + lp.b_R[:2 * H]
    if cell.reset_after:
        return b_rz, lp.b_W[2 * H:].copy(), lp.b_R[2 * H:].copy()
    return b_rz, lp.b_W[2 * H:] + lp.b_R[2 * H:], None


def separate_biases(b_sum, b_Rn, H, dtype):
    """``(b_W, b_R)`` from a fewer-bias source: the sums ``[G·H]`` (canonical order) on the
    input side, zeros on the recurrent side except a GRU's ``b_Rn`` ``[H]`` when the source has
    it."""
    b_R = np.zeros(b_sum.shape, dtype)
    if b_Rn is not None:
        b_R[2 * H:] = b_Rn
    return np.ascontiguousarray(b_sum), b_R


def direction_from(D, reverse=False):
    """cgru's direction name for ``D`` directions (``reverse``: the one direction runs
    backwards)."""
    return "bidirectional" if D == 2 else ("reverse" if reverse else "forward")
