"""The network: one value holding a stack's cell, its sizes and its weights.

A stack of ``L`` layers and ``D`` directions has ``L·D`` *layer-directions* ("pseudo-layers"
in cuDNN's words), indexed ``l·D + d``.  Each holds, with ``G = cell.gates`` gate blocks in
the cell's canonical order (GRU: r, z, n; LSTM: i, f, g, o; vanilla RNN: one block) and
``S`` the state width (the projection size ``P`` of an LSTM with one, else ``H``)::

    W    [G·H, in]   input weights   (in = input_size for l = 0, D·S above; 0 when the layer-0
                                       input projection is absent: input_mode skip / projected)
    R    [G·H, S]    recurrent weights
    b_W  [G·H]       input biases
    b_R  [G·H]       recurrent biases
    W_p  [P, H]      the LSTM's recurrent projection (only with proj_size = P > 0)
    P    [3H] or [4H] an LSTM's peephole weights, gates as LSTMCell(peepholes="ifo" | "ifgo") names them

Opaque layout (TF ``CudnnRNN`` ``params``, the C ABI weight space): all matrices of
layer-direction 0 in cuDNN linLayerID order (the G input matrices ``[H, in]``, the G recurrent
ones ``[H, S]``, each row-major — GRU: 0 W_r, 1 W_z, 2 W_n, 3 R_r, 4 R_z, 5 R_n; LSTM: 0–3
W_i W_f W_g W_o, 4–7 R_i … R_o; RNN: 0 W, 1 R — then the projection), then those of
layer-direction 1, …; then all biases in the same order (the projection has none); then, for
an LSTM with peepholes (which cuDNN does not have), every layer-direction's ``P``.  Layer-0
input matrices are not stored in skip / projected mode.

``Network`` keeps the arrays it is given (no copies): change them in place and the next call
computes with the new values; a gradient ``Network`` that ``backward`` fills is written in
place too.  Arrays of any memory layout are accepted.  ``net.sealed()`` is the same network in
memory nothing can write (``Sealed``), which cgru recognises without reading its bytes.
"""
import functools
from dataclasses import dataclass
import math
import warnings

import numpy as np

from cgru.core import kinds, validate
from cgru.core.cells import GRUCell, hash_once, is_cell

__all__ = ["Topology", "LayerParams", "Network", "Sealed", "DIRECTIONS", "INPUT_MODES", "DTYPES",
           "as_dtype"]

DIRECTIONS = ("forward", "reverse", "bidirectional")
INPUT_MODES = ("linear", "skip", "projected")
DTYPES = validate.DTYPES
as_dtype = validate.as_dtype


@hash_once
@dataclass(frozen=True)
class Topology:
    """The sizes of a stack.

    ``input_size`` is the feature width of the input ``x`` in every mode: the layer-0 input
    width for ``input_mode="linear"``; it must equal ``hidden_size`` for ``"skip"`` (cuDNN
    ``CUDNN_SKIP_INPUT``: every input matrix is the identity, input biases still apply); and it
    must equal ``D·G·H`` for ``"projected"`` (MPSGraph without ``inputWeight``: ``x`` already
    holds each direction's ``G`` input pre-activations, forward first; GRU: ``G = 3``).
    """
    input_size: int
    hidden_size: int
    num_layers: int = 1
    direction: str = "forward"
    input_mode: str = "linear"
    proj_size: int = 0

    def __post_init__(self):
        validate.positive_int(self.input_size, "input_size")
        validate.positive_int(self.hidden_size, "hidden_size")
        validate.positive_int(self.num_layers, "num_layers")
        validate.positive_int(self.proj_size, "proj_size", allow_zero=True)
        if self.proj_size > self.hidden_size:
            raise ValueError(f"proj_size: expected at most hidden_size={self.hidden_size} (cuDNN's "
                             f"rule), got {self.proj_size}")
        object.__setattr__(self, "proj_size", int(self.proj_size))
        if not isinstance(self.direction, str) or self.direction not in DIRECTIONS:
            raise ValueError(f"direction: expected one of {DIRECTIONS}, got {self.direction!r}")
        if not isinstance(self.input_mode, str) or self.input_mode not in INPUT_MODES:
            raise ValueError(f"input_mode: expected one of {INPUT_MODES}, got {self.input_mode!r}")
        for name in ("input_size", "hidden_size", "num_layers"):
            object.__setattr__(self, name, int(getattr(self, name)))
        H, D = self.hidden_size, self.num_directions
        if self.input_mode == "skip" and self.input_size != H:
            raise ValueError(f"input_mode='skip' needs input_size == hidden_size, got "
                             f"input_size={self.input_size}, hidden_size={H}")
        if self.input_mode == "projected" and self.input_size not in (D * H, 3 * D * H,
                                                                      4 * D * H):
            raise ValueError(f"input_mode='projected' needs input_size == D·G·H (D={D}, H={H}): "
                             f"{3 * D * H} for a GRU (G=3), {4 * D * H} for an LSTM (G=4), "
                             f"{D * H} for a vanilla RNN (G=1); got input_size="
                             f"{self.input_size}")

    @property
    def num_directions(self):
        return 2 if self.direction == "bidirectional" else 1

    @property
    def state_size(self):
        """Width of ``h`` (and of each direction's output): the projection size P when there
        is a projection (LSTM), else H."""
        return self.proj_size or self.hidden_size

    @property
    def output_size(self):
        """Feature width of the output: D·S (S = ``state_size``)."""
        return self.num_directions * self.state_size

    @property
    def num_layer_directions(self):
        return self.num_layers * self.num_directions

    def reversed_direction(self, d):
        """True when direction index ``d`` runs from the end of the sequence to its start."""
        return self.direction == "reverse" or d == 1

    def layer_input_size(self, layer):
        """Width of the input of layer ``layer``'s input matrices (0 when there are none)."""
        if layer == 0:
            return 0 if self.input_mode != "linear" else self.input_size
        return self.output_size

    def shapes(self, index, gates=3):
        """``{name: shape}`` of layer-direction ``index = l·D + d`` (``gates``: the cell's);
        with a projection also ``W_p`` ``[P, H]``."""
        GH = gates * self.hidden_size
        width = self.layer_input_size(index // self.num_directions)
        shapes = {"W": (GH, width), "R": (GH, self.state_size), "b_W": (GH,), "b_R": (GH,)}
        if self.proj_size:
            shapes["W_p"] = (self.proj_size, self.hidden_size)
        return shapes

    def flat_size(self, gates=3):
        """Number of elements in the opaque layout (TF ``params_size`` in elements), in closed
        form: per layer-direction ``G·H·width + G·H·S + P·H + 2·G·H``."""
        H, D, L, S, P = (self.hidden_size, self.num_directions, self.num_layers,
                         self.state_size, self.proj_size)
        GH = gates * H
        widths = self.layer_input_size(0) + (L - 1) * self.output_size      # summed over l
        return D * (GH * widths + L * (GH * S + P * H + 2 * GH))


@dataclass(frozen=True)
class LayerParams:
    """One layer-direction's weights, gates in the cell's order (see the module docstring);
    ``W_p`` ``[P, H]`` is the LSTM's recurrent projection (``None`` without one)."""
    W: np.ndarray
    R: np.ndarray
    b_W: np.ndarray
    b_R: np.ndarray
    W_p: np.ndarray = None
    P: np.ndarray = None

    def arrays(self):
        """``{name: array}`` of the weights this layer-direction has (``W_p``, ``P`` only when
        set)."""
        out = {"W": self.W, "R": self.R, "b_W": self.b_W, "b_R": self.b_R}
        for name in ("W_p", "P"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


_DEFAULT_CELL = GRUCell()


class Sealed(bytes):
    """The memory of one sealed weight array: a ``bytes`` object, which no array over it can
    write (NumPy refuses to make a view of read-only memory writeable).  Its ``__dict__`` holds
    what cgru derives from it (``cgru.core.weights``), so that lives exactly as long as it."""


def _seal(a):
    """A read-only array over a new ``Sealed`` copy of ``a``'s values (C order)."""
    c = np.ascontiguousarray(a)
    return np.frombuffer(Sealed(c.tobytes()), c.dtype).reshape(c.shape)


def memory_owner(a):
    """The object that owns the memory ``a`` views: ``a`` itself, or the end of its ``base``
    chain (an array owning its data, or another object: a torch tensor, a ``Sealed``, …)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


def _shapes(topology, cell, index):
    shapes = topology.shapes(index, cell.gates)
    k = getattr(cell, "peephole_gates", 0)
    if k:
        shapes["P"] = (k * topology.hidden_size,)
    return shapes


def _flat_size(topology, cell):
    k = getattr(cell, "peephole_gates", 0)
    return topology.flat_size(cell.gates) + k * topology.hidden_size * \
        topology.num_layer_directions


@functools.lru_cache(maxsize=64)
def _allocated_template(cls, topology, dtype, cell):
    """A checked network of this model (read-only zeros that take no memory), whose
    ``with_layers`` gives networks of new arrays of the same shapes and dtype without checking
    them again."""
    c = cell or _DEFAULT_CELL
    zero = np.zeros((), dtype)
    return cls(topology, [LayerParams(**{k: np.broadcast_to(zero, s) for k, s in
                                         _shapes(topology, c, i).items()})
                          for i in range(topology.num_layer_directions)], cell)


class Network:
    """A recurrent stack: its cell, its topology and its weights, ``net[l, d]`` or
    ``net[l·D + d]`` (a ``LayerParams``).

    ``Network(topology, layers, cell=None)``; or ``Network.random``, ``Network.zeros``,
    ``Network.from_flat``; every ``cgru.convert.from_*`` returns one.  ``cell`` is the cell the
    weights belong to (``cgru.GRUCell``, ``cgru.LSTMCell`` or ``cgru.RNNCell``; ``None``:
    cuDNN's GRU cell); its kind fixes the gate blocks of every matrix.  ``forward`` and
    ``backward`` compute with it, and a ``cell=`` argument that contradicts it is an error.
    The arrays are validated (shapes, one float dtype) and kept as given: no copies.
    ``cgru.Params`` is its old name (deprecated, removed in 0.4.0).
    """

    def __init__(self, topology, layers, cell=None):
        if not isinstance(topology, Topology):
            raise TypeError(f"topology: expected a cgru.Topology, got {type(topology).__name__}")
        if cell is not None and not is_cell(cell):
            raise TypeError(f"cell: expected a cgru.Cell (or another cgru cell kind) or None, "
                            f"got {type(cell).__name__}")
        layers = list(layers)
        n = topology.num_layer_directions
        if len(layers) != n:
            raise ValueError(f"params: expected {n} layer-directions (L={topology.num_layers} × "
                             f"D={topology.num_directions}), got {len(layers)}")
        self._cell_given = cell is not None
        self.cell = _DEFAULT_CELL if cell is None else cell
        if topology.proj_size and not kinds.of(self.cell).has_projection:
            raise ValueError(f"proj_size: a recurrent projection exists for LSTM cells only, got "
                             f"proj_size={topology.proj_size} with a {self.cell.kind} cell")
        if topology.input_mode == "projected" and \
                topology.input_size != topology.num_directions * self.cell.gates * \
                topology.hidden_size:
            raise ValueError(f"input_mode='projected' needs input_size == D·G·H = "
                             f"{topology.num_directions * self.cell.gates * topology.hidden_size}"
                             f" for a {self.cell.kind} cell, got {topology.input_size}")
        dtype = None
        checked = []
        for i, lp in enumerate(layers):
            if isinstance(lp, dict):
                try:
                    lp = LayerParams(**lp)
                except TypeError:
                    raise TypeError(f"params[{i}]: expected a LayerParams or a dict with keys W, R, "
                                    f"b_W, b_R, got keys {sorted(lp)}") from None
            if not isinstance(lp, LayerParams):
                raise TypeError(f"params[{i}]: expected a LayerParams, got {type(lp).__name__}")
            shapes = _shapes(topology, self.cell, i)
            if lp.W_p is not None and "W_p" not in shapes:
                raise ValueError(f"params[{i}].W_p: given, but the topology has no projection "
                                 f"(proj_size=0)")
            if lp.P is not None and "P" not in shapes:
                raise ValueError(f"params[{i}].P: given, but the cell has no peepholes "
                                 f"({self.cell})")
            for name, shape in shapes.items():
                a = getattr(lp, name)
                what = f"params[{i}].{name}"
                if a is None:
                    raise TypeError(f"{what}: expected a numpy array {list(shape)} "
                                    f"({'the projection' if name == 'W_p' else 'the peepholes'}"
                                    f" of this network), got None")
                validate.plain_array(a, what)
                dt = as_dtype(a.dtype, what + ".dtype")
                if dtype is None:
                    dtype = dt
                elif dt != dtype:
                    raise TypeError(f"{what}: expected dtype {dtype} like params[0].W, got {dt}")
                if a.shape != shape:
                    raise ValueError(f"{what}: expected shape {shape}, got {a.shape}")
            checked.append(lp)
        self.topology = topology
        self.layers = tuple(checked)
        self.dtype = dtype

    # --- the cell a call computes ---------------------------------------------------------
    def resolve_cell(self, cell, stacklevel=3):
        """The cell a call with ``cell=`` (``None``: not given) computes: the network's own.

        A network built without a cell accepts any ``cell`` (the old call form; deprecated); a
        network with a cell refuses a different one and warns about a redundant one.
        ``stacklevel`` points the warning at the caller's caller (the user's line)."""
        if cell is None:
            return self.cell
        if not is_cell(cell):
            raise TypeError(f"cell: expected a cgru.Cell (or another cgru cell kind), got "
                            f"{type(cell).__name__}")
        if not self._cell_given:
            warnings.warn("cell=: passing a cell along with a network is deprecated; build the "
                          "network with it (cgru.Network(topology, layers, cell=...), "
                          "Network.random(..., cell=...)) — cgru.convert.from_* already do. The "
                          "argument will be removed in cgru 0.4.0",
                          DeprecationWarning, stacklevel=stacklevel)
            if cell.gates != self.cell.gates:
                raise ValueError(f"cell: a {cell.kind} cell ({cell.gates} gates) cannot run "
                                 f"weights shaped for {self.cell.gates} gates")
            return cell
        if cell != self.cell:
            raise ValueError(f"cell: {cell} contradicts the network's own cell {self.cell}; "
                             f"the network carries its cell — drop the cell= argument (or "
                             f"build the network with the cell you mean)")
        warnings.warn("cell=: redundant, the network carries its cell; drop the argument "
                      "(it will be removed in cgru 0.4.0)",
                      DeprecationWarning, stacklevel=stacklevel)
        return cell

    def with_layers(self, layers):
        """A network of the same topology and cell holding ``layers`` (``LayerParams`` with
        arrays of this network's shapes and dtype — the caller guarantees it: no checks)."""
        out = object.__new__(Network)
        out.__dict__.update(self.__dict__)
        out.layers = tuple(layers)
        return out

    def with_cell(self, cell):
        """The same weights (the same arrays) as a network of ``cell``."""
        return Network(self.topology, self.layers, cell)

    # --- access ---------------------------------------------------------------------------
    def __getitem__(self, key):
        if isinstance(key, tuple):
            l, d = key
            if not (0 <= d < self.topology.num_directions and 0 <= l < self.topology.num_layers):
                raise IndexError(f"params[{l}, {d}]: out of range for L={self.topology.num_layers},"
                                 f" D={self.topology.num_directions}")
            key = l * self.topology.num_directions + d
        return self.layers[key]

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def __repr__(self):
        return f"Network({self.topology}, cell={self.cell}, dtype={self.dtype})"

    def shapes(self, index):
        """``{name: shape}`` of layer-direction ``index`` (with an LSTM's peepholes ``P``)."""
        return _shapes(self.topology, self.cell, index)

    def flat_size(self):
        """Number of elements of the opaque layout."""
        return _flat_size(self.topology, self.cell)

    # --- constructors ---------------------------------------------------------------------
    @classmethod
    def zeros(cls, topology, dtype=np.float32, *, cell=None):
        return cls._allocated(topology, dtype, np.zeros, cell)

    @classmethod
    def _allocated(cls, topology, dtype, allocate, cell=None):
        """A network whose every array is ``allocate(shape, dtype)`` (``np.zeros``; the
        backward's gradients: ``plan.empty``, every element of which it writes)."""
        dt = as_dtype(dtype)
        template = _allocated_template(cls, topology, dt, cell)    # checked once per model
        return template.with_layers([LayerParams(**{k: allocate(a.shape, dt) for k, a in
                                                    lp.arrays().items()})
                                     for lp in template.layers])

    @classmethod
    def random(cls, topology, dtype=np.float32, seed=0, scale=None, *, cell=None):
        """Uniform in ``[-scale, scale]``, ``scale = 1/sqrt(H)`` by default (PyTorch's init)."""
        dt = as_dtype(dtype)
        c = cell or _DEFAULT_CELL
        rng = np.random.default_rng(seed)
        s = 1.0 / np.sqrt(topology.hidden_size) if scale is None else float(scale)
        return cls(topology, [LayerParams(**{k: rng.uniform(-s, s, shp).astype(dt) for k, shp in
                                             _shapes(topology, c, i).items()})
                              for i in range(topology.num_layer_directions)], cell)

    def sealed(self):
        """This network (same topology and cell) with its weights copied once into memory that
        nothing can write: NumPy refuses to make the arrays, or any view of them, writeable.
        cgru then knows a call's weights are the ones it packed before by identity alone, and
        skips the byte comparison every other call makes (a memory-bound pass over all the
        weights: at small batches and short sequences, most of a call).  What cgru derives
        (the packed matrices) lives with the sealed arrays and is freed with them.  Returns
        ``self`` when already sealed.  Written only by what is undefined behaviour anyway:
        poking memory with ``ctypes``, or ``torch.from_numpy`` of a read-only array, which
        PyTorch warns about."""
        if self.is_sealed:
            return self
        return self.map(_seal)

    @property
    def is_sealed(self):
        """Whether every weight array is in ``Sealed`` memory (``sealed()``)."""
        return all(type(memory_owner(a)) is Sealed for lp in self.layers
                   for a in lp.arrays().values())

    def _like(self, layers):
        return Network(self.topology, layers, self.cell if self._cell_given else None)

    def copy(self):
        return self.map(np.copy)

    def map(self, fn):
        """A new network (same cell) with ``fn(array)`` applied to every array."""
        return self._like([LayerParams(**{k: fn(v) for k, v in lp.arrays().items()})
                           for lp in self.layers])

    def astype(self, dtype):
        dt = as_dtype(dtype)
        return self.map(lambda a: a.astype(dt))

    # --- opaque layout --------------------------------------------------------------------
    def _pieces(self):
        """Arrays in opaque order: all matrices (per layer-direction, in linLayerID order), then
        all biases in the same order."""
        H, G = self.topology.hidden_size, self.cell.gates
        mats, biases = [], []
        for lp in self.layers:
            for M in (lp.W, lp.R):
                mats += [M[g * H:(g + 1) * H] for g in range(G)]
            if lp.W_p is not None:
                mats.append(lp.W_p)                       # the projection comes last
            for b in (lp.b_W, lp.b_R):
                biases += [b[g * H:(g + 1) * H] for g in range(G)]
        peepholes = [lp.P for lp in self.layers if lp.P is not None]
        return mats + biases + peepholes

    def flat(self):
        """The opaque layout as one 1-D array (see the module docstring)."""
        return np.concatenate([p.ravel() for p in self._pieces()])

    @classmethod
    def from_flat(cls, topology, flat, *, cell=None, copy=True):
        """Inverse of ``flat()``: a network of a 1-D array of ``flat_size()`` elements — copied
        out of it, or with ``copy=False`` (``flat`` C-contiguous) made of views of it: in the
        opaque layout the gate matrices of one kind are adjacent, so every ``W``, ``R``,
        ``W_p``, ``b_W``, ``b_R`` and ``P`` of a layer-direction is one contiguous block."""
        if not isinstance(topology, Topology):
            raise TypeError(f"topology: expected a cgru.Topology, got {type(topology).__name__}")
        validate.plain_array(flat, "flat")
        dt = as_dtype(flat.dtype, "flat.dtype")
        c = cell or _DEFAULT_CELL
        n = _flat_size(topology, c)
        if flat.ndim != 1 or flat.size != n:
            raise ValueError(f"flat: expected a 1-D array of {n} elements, got shape "
                             f"{flat.shape}")
        if copy:
            out = cls.zeros(topology, dt, cell=cell)
            pos = 0
            for piece in out._pieces():
                piece[...] = flat[pos:pos + piece.size].reshape(piece.shape)
                pos += piece.size
            return out
        if not flat.flags.c_contiguous:
            raise ValueError("flat: copy=False needs a C-contiguous array")
        layers, pos = [], 0
        shapes = [_shapes(topology, c, i) for i in range(topology.num_layer_directions)]

        def take(shape):
            nonlocal pos
            size = math.prod(shape)
            view = flat[pos:pos + size].reshape(shape)
            pos += size
            return view
        for shp in shapes:                              # the matrices, layer by layer
            layers.append({name: take(shp[name]) for name in ("W", "R", "W_p") if name in shp})
        for arrays, shp in zip(layers, shapes):         # then the biases
            arrays["b_W"], arrays["b_R"] = take(shp["b_W"]), take(shp["b_R"])
        for arrays, shp in zip(layers, shapes):         # then the peepholes
            if "P" in shp:
                arrays["P"] = take(shp["P"])
        return cls(topology, [LayerParams(**a) for a in layers], cell)


def warn_params():
    """The warning of ``Params``, the old name of ``Network`` (deprecated in 0.2.0, removed in
    0.4.0), at the line that named it."""
    warnings.warn("cgru.Params is deprecated; use cgru.Network (the same class). "
                  "cgru.Params will be removed in cgru 0.4.0", DeprecationWarning, stacklevel=3)


def __getattr__(name):
    if name == "Params":
        warn_params()
        return Network
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
