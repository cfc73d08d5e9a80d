"""The cell kinds and their variants: one frozen description of which function a cell computes.

A cell value says what one step of a recurrent layer computes: its kind (``kind``), how many
gate blocks its weight matrices hold (``gates``: every ``W`` is ``[gates·H, in]``, every ``R``
``[gates·H, H]``), whether it carries a cell state besides ``h`` (``has_cell_state``), and the
kind's variant options.  ``GRUCell`` (also ``Cell``) is the GRU, ``LSTMCell`` the LSTM,
``RNNCell`` the vanilla RNN.

GRU: gates in canonical order r (reset), z (update), n (candidate); ``x·Wᵀ`` with ``W`` stored
``[H, in]``::

    r = f_r(clip(x·W_rᵀ + b_Wr + h·R_rᵀ + b_Rr))
    z = f_z(clip(x·W_zᵀ + b_Wz + h·R_zᵀ + b_Rz))
    reset_after=True :  n = g(clip(x·W_nᵀ + b_Wn + r ⊙ (h·R_nᵀ + b_Rn)))
    reset_after=False:  n = g(clip(x·W_nᵀ + (r ⊙ h)·R_nᵀ + b_Wn + b_Rn))
    flip_z=False:       h' = (1 − z) ⊙ n + z ⊙ h
    flip_z=True :       h' = z ⊙ n + (1 − z) ⊙ h

``clip`` (ONNX) clamps every complete pre-activation to ``[−clip, clip]``; ``None`` means no
clamp.  With a state mask ``m`` every ``h`` that enters a recurrent product is ``h ⊙ m``.
"""
from dataclasses import dataclass, field
import math
from typing import ClassVar

__all__ = ["Activation", "ACTIVATION_NAMES", "Cell", "GRUCell", "LSTMCell", "RNNCell",
           "CELL_KINDS", "is_cell"]

# name -> (kernel code, default alpha, default beta).  The alpha/beta defaults are those of
# the matching ONNX operators; hard_sigmoid's are MPSGraph's / Keras' (0.2, 0.5).
_KINDS = {
    "sigmoid": (0, 0.0, 0.0),
    "tanh": (1, 0.0, 0.0),
    "relu": (2, 0.0, 0.0),
    "identity": (3, 0.0, 0.0),
    "hard_sigmoid": (4, 0.2, 0.5),
    "affine": (5, 1.0, 0.0),
    "leaky_relu": (6, 0.01, 0.0),
    "thresholded_relu": (7, 1.0, 0.0),
    "scaled_tanh": (8, 1.0, 1.0),
    "elu": (9, 1.0, 0.0),
    "softsign": (10, 0.0, 0.0),
    "softplus": (11, 0.0, 0.0),
}
_ALIASES = {
    "none": "identity", "linear": "identity",
    "hardsigmoid": "hard_sigmoid", "leakyrelu": "leaky_relu",
    "thresholdedrelu": "thresholded_relu", "scaledtanh": "scaled_tanh",
}
ACTIVATION_NAMES = tuple(_KINDS)


def hash_once(cls):
    """A frozen dataclass whose hash (its fields' hash, as the dataclass makes it) is computed
    once per value and kept: the values of ``Topology`` and the cells key the engine's plan
    caches several times a call, and hashing a cell's fields (its activations') took about a
    microsecond each time.  The kept hash is not pickled or copied (string hashes differ from
    process to process): a copy computes its own."""
    fields_hash = cls.__hash__

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:
            h = fields_hash(self)
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    cls.__hash__, cls.__getstate__ = __hash__, __getstate__
    return cls


def _canonical_name(name):
    if not isinstance(name, str):
        raise TypeError(f"activation: expected a name (str), got {type(name).__name__}")
    key = name.strip().lower()
    key = _ALIASES.get(key.replace("_", ""), _ALIASES.get(key, key))
    if key not in _KINDS:
        raise ValueError(f"activation: unknown name {name!r}; expected one of "
                         f"{', '.join(ACTIVATION_NAMES)} (or 'none')")
    return key


@hash_once
@dataclass(frozen=True)
class Activation:
    """An activation function by name with its ``alpha``/``beta`` (``None`` → the default).

    ``hard_sigmoid``: ``clip(alpha·x + beta, 0, 1)``; ``affine``: ``alpha·x + beta``;
    ``leaky_relu``: ``x if x ≥ 0 else alpha·x``; ``thresholded_relu``: ``x if x > alpha else 0``;
    ``scaled_tanh``: ``alpha·tanh(beta·x)``; ``elu``: ``x if x ≥ 0 else alpha·(eˣ − 1)``;
    ``softsign``: ``x / (1 + |x|)``; ``softplus``: ``log(1 + eˣ)``.
    """
    name: str
    alpha: float = None
    beta: float = None

    def __post_init__(self):
        name = _canonical_name(self.name)
        _, da, db = _KINDS[name]
        alpha = da if self.alpha is None else self.alpha
        beta = db if self.beta is None else self.beta
        for label, v in (("alpha", alpha), ("beta", beta)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"activation {name!r}: {label} must be a finite number, got {v!r}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "alpha", float(alpha))
        object.__setattr__(self, "beta", float(beta))

    @property
    def code(self):
        """The integer the kernels dispatch on."""
        return _KINDS[self.name][0]


def _as_activation(value, what):
    if isinstance(value, Activation):
        return value
    if isinstance(value, str):
        return Activation(value)
    if isinstance(value, tuple) and 1 <= len(value) <= 3:
        return Activation(*value)
    raise TypeError(f"{what}: expected an activation name, an Activation or a "
                    f"(name, alpha, beta) tuple, got {value!r}")


def _check_clip(cell):
    if cell.clip is not None:
        c = cell.clip
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not (c > 0) or math.isnan(c):
            raise ValueError(f"{type(cell).__name__}.clip: expected None or a positive number, "
                             f"got {c!r}")
        object.__setattr__(cell, "clip", float(c))


@hash_once
@dataclass(frozen=True)
class GRUCell:
    """Which GRU: candidate form, interpolation direction, activations and clip.

    The default is the cuDNN / PyTorch / TF cell: reset after the recurrent product,
    ``h' = (1 − z)·n + z·h``, sigmoid gates, tanh candidate, no clip.
    Activations may be given as names, ``Activation`` objects or ``(name, alpha, beta)``.
    """
    kind: ClassVar[str] = "gru"
    gates: ClassVar[int] = 3
    has_cell_state: ClassVar[bool] = False

    reset_after: bool = True
    flip_z: bool = False
    f_r: Activation = field(default="sigmoid")
    f_z: Activation = field(default="sigmoid")
    g: Activation = field(default="tanh")
    clip: float = None

    def __post_init__(self):
        for name in ("reset_after", "flip_z"):
            v = getattr(self, name)
            if not isinstance(v, (bool, int)) or v not in (0, 1):
                raise TypeError(f"Cell.{name}: expected a bool, got {v!r}")
            object.__setattr__(self, name, bool(v))
        for name in ("f_r", "f_z", "g"):
            object.__setattr__(self, name, _as_activation(getattr(self, name), f"Cell.{name}"))
        _check_clip(self)

    @property
    def is_fast(self):
        """True for the sigmoid/sigmoid/tanh cell without clip: the kernels' fast path."""
        return (self.f_r.name == "sigmoid" and self.f_z.name == "sigmoid"
                and self.g.name == "tanh" and self.clip is None)


# LSTM peephole forms, named by the gates that have peephole weights (LSTMCell.peepholes)
PEEPHOLE_FORMS = ("ifo", "ifgo")


@hash_once
@dataclass(frozen=True)
class LSTMCell:
    """An LSTM cell: cuDNN's ``CUDNN_LSTM`` (= PyTorch's ``nn.LSTM``) by default.

    Gates in canonical order i (input), f (forget), g (cell input; cuDNN's "new memory"),
    o (output) — cuDNN's linLayerIDs 0–3 (input matrices) and 4–7 (recurrent), PyTorch's
    order; ``x·Wᵀ`` with ``W`` ``[4H, in]``::

        i = f_i(clip(x·W_iᵀ + b_Wi + h·R_iᵀ + b_Ri))      likewise f (f_f), o (f_o)
        g = g(clip(x·W_gᵀ + b_Wg + h·R_gᵀ + b_Rg))
        c' = f ⊙ c + i ⊙ g
        h' = o ⊙ h(c')                  (with a projection: h' = W_p·(o ⊙ h(c')), W_p [P, H])

    The defaults are cuDNN's: sigmoid gates, tanh for g and h, no clip.  ``clip`` (ONNX)
    clamps the four gate pre-activations (biases included) to ``[−clip, clip]``; the cell
    state is not clipped (as onnxruntime does).  Two ONNX / MPSGraph options:

    * ``peepholes``: the gates also see the cell state through per-unit weights
      (``LayerParams.P``), in one of two forms named by the gates that have them:

      - ``"ifo"`` (or ``True``; ONNX, Gers et al. 2002): ``P = [P_i, P_f, P_o]`` ``[3H]``,
        ``a_i += P_i ⊙ c``, ``a_f += P_f ⊙ c``, and ``a_o += P_o ⊙ c'`` (the new cell state);
      - ``"ifgo"`` (MPSGraph's LSTM): ``P = [P_i, P_f, P_g, P_o]`` ``[4H]``, every gate's
        pre-activation gains ``P_k ⊙ c`` (the previous cell state);
    * ``input_forget`` (ONNX's coupled input and forget gates): ``f = 1 − i`` (the forget
      gate's own weights are then not used).
    """
    kind: ClassVar[str] = "lstm"
    gates: ClassVar[int] = 4
    has_cell_state: ClassVar[bool] = True

    f_i: Activation = field(default="sigmoid")
    f_f: Activation = field(default="sigmoid")
    f_o: Activation = field(default="sigmoid")
    g: Activation = field(default="tanh")
    h: Activation = field(default="tanh")
    clip: float = None
    peepholes: object = False
    input_forget: bool = False

    def __post_init__(self):
        for name in ("f_i", "f_f", "f_o", "g", "h"):
            object.__setattr__(self, name, _as_activation(getattr(self, name),
                                                          f"LSTMCell.{name}"))
        p = self.peepholes
        if isinstance(p, bytes):
            p = p.decode()
        if isinstance(p, str):
            if p not in PEEPHOLE_FORMS:
                raise ValueError(f"LSTMCell.peepholes: expected False, True, 'ifo' or 'ifgo', "
                                 f"got {p!r}")
        elif isinstance(p, (bool, int)) and p in (0, 1):
            p = "ifo" if p else False
        else:
            raise TypeError(f"LSTMCell.peepholes: expected False, True, 'ifo' or 'ifgo', got "
                            f"{p!r}")
        object.__setattr__(self, "peepholes", p)
        v = self.input_forget
        if not isinstance(v, (bool, int)) or v not in (0, 1):
            raise TypeError(f"LSTMCell.input_forget: expected a bool, got {v!r}")
        object.__setattr__(self, "input_forget", bool(v))
        _check_clip(self)

    @property
    def peephole_gates(self):
        """How many gates have peephole weights: 0, 3 (``"ifo"``) or 4 (``"ifgo"``); ``P`` is
        ``[peephole_gates·H]``."""
        return len(self.peepholes) if self.peepholes else 0

    @property
    def is_fast(self):
        """True for cuDNN's cell (sigmoid gates, tanh, no clip, no peepholes, no coupled
        gates): the kernels' fast path."""
        return ((self.f_i.name, self.f_f.name, self.f_o.name, self.g.name, self.h.name)
                == ("sigmoid", "sigmoid", "sigmoid", "tanh", "tanh") and self.clip is None
                and not self.peepholes and not self.input_forget)


@hash_once
@dataclass(frozen=True)
class RNNCell:
    """A vanilla (Elman) RNN cell: cuDNN's ``CUDNN_RNN_TANH`` / ``CUDNN_RNN_RELU``, PyTorch's
    ``nn.RNN(nonlinearity=...)``, ONNX's ``RNN``::

        h' = activation(clip(x·Wᵀ + b_W + h·Rᵀ + b_R))      W [H, in] (linLayerID 0), R [H, H] (1)

    ``RNNCell("relu")`` is cuDNN's ``rnn_relu``; any of cgru's activations may be given (ONNX
    names them per direction), with ``clip`` as for the other kinds.
    """
    kind: ClassVar[str] = "rnn"
    gates: ClassVar[int] = 1
    has_cell_state: ClassVar[bool] = False

    activation: Activation = field(default="tanh")
    clip: float = None

    def __post_init__(self):
        object.__setattr__(self, "activation", _as_activation(self.activation,
                                                              "RNNCell.activation"))
        _check_clip(self)

    @property
    def is_fast(self):
        """True for tanh or relu without clip: the kernels' fast path."""
        return self.activation.name in ("tanh", "relu") and self.clip is None


Cell = GRUCell      # the name cgru has always used for the GRU cell
CELL_KINDS = (GRUCell, LSTMCell, RNNCell)


def is_cell(value):
    """True for a value of one of cgru's cell kinds."""
    return isinstance(value, CELL_KINDS)
