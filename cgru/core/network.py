"""Canonical GRU parameters, their shapes, and cgru's opaque (flat) layout.

A stack of ``L`` layers and ``D`` directions has ``L·D`` *layer-directions* ("pseudo-layers"
in cuDNN's words), indexed ``l·D + d``.  Each holds, gates in canonical order r, z, n::

    W    [3H, in]   input weights   (in = input_size for l = 0, D·H above; 0 when the layer-0
                                      input projection is absent: input_mode skip / projected)
    R    [3H, H]    recurrent weights
    b_W  [3H]       input biases
    b_R  [3H]       recurrent biases

Opaque layout (TF ``CudnnRNN`` ``params``, the C ABI weight space): all matrices of
layer-direction 0 in cuDNN linLayerID order (0 W_r, 1 W_z, 2 W_n, 3 R_r, 4 R_z, 5 R_n, each
``[H, width]`` row-major), then those of layer-direction 1, …; then all biases in the same
order.  Layer-0 input matrices are not stored in skip / projected mode.
"""
from dataclasses import dataclass

import numpy as np

DIRECTIONS = ("forward", "reverse", "bidirectional")
INPUT_MODES = ("linear", "skip", "projected")
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _positive_int(value, what, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what}: expected an int, got {type(value).__name__} ({value!r})")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{what}: expected a {'non-negative' if allow_zero else 'positive'} "
                         f"int, got {value}")
    return int(value)


def as_dtype(dtype, what="dtype"):
    """float32 or float64 as a NumPy dtype; anything else is a ``TypeError``."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{what}: expected float32 or float64, got {dtype!r}") from None
    if dt not in DTYPES:
        raise TypeError(f"{what}: expected float32 or float64, got {dt}")
    return dt


@dataclass(frozen=True)
class Topology:
    """The sizes of a GRU stack.

    ``input_size`` is the feature width of the input ``x`` in every mode: the layer-0 input
    width for ``input_mode="linear"``; it must equal ``hidden_size`` for ``"skip"`` (cuDNN
    ``CUDNN_SKIP_INPUT``: ``W_r = W_z = W_n = I``, input biases still apply); and it must equal
    ``D·3H`` for ``"projected"`` (MPSGraph without ``inputWeight``: ``x`` already holds each
    direction's three input pre-activations, ``[r, z, n]`` per direction, forward first).
    """
    input_size: int
    hidden_size: int
    num_layers: int = 1
    direction: str = "forward"
    input_mode: str = "linear"

    def __post_init__(self):
        _positive_int(self.input_size, "input_size")
        _positive_int(self.hidden_size, "hidden_size")
        _positive_int(self.num_layers, "num_layers")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction: expected one of {DIRECTIONS}, got {self.direction!r}")
        if self.input_mode not in INPUT_MODES:
            raise ValueError(f"input_mode: expected one of {INPUT_MODES}, got {self.input_mode!r}")
        H, D = self.hidden_size, self.num_directions
        if self.input_mode == "skip" and self.input_size != H:
            raise ValueError(f"input_mode='skip' needs input_size == hidden_size, got "
                             f"input_size={self.input_size}, hidden_size={H}")
        if self.input_mode == "projected" and self.input_size != D * 3 * H:
            raise ValueError(f"input_mode='projected' needs input_size == D·3H = {D * 3 * H} "
                             f"(D={D}, H={H}), got input_size={self.input_size}")

    @property
    def num_directions(self):
        return 2 if self.direction == "bidirectional" else 1

    @property
    def output_size(self):
        """Feature width of the output: D·H."""
        return self.num_directions * self.hidden_size

    def reversed_direction(self, d):
        """True when direction index ``d`` runs from the end of the sequence to its start."""
        return self.direction == "reverse" or d == 1

    def layer_input_size(self, layer):
        """Width of the input of layer ``layer``'s input matrices (0 when there are none)."""
        if layer == 0:
            return 0 if self.input_mode != "linear" else self.input_size
        return self.output_size

    def shapes(self, index):
        """``{name: shape}`` of layer-direction ``index = l·D + d``."""
        H = self.hidden_size
        width = self.layer_input_size(index // self.num_directions)
        return {"W": (3 * H, width), "R": (3 * H, H), "b_W": (3 * H,), "b_R": (3 * H,)}

    @property
    def num_layer_directions(self):
        return self.num_layers * self.num_directions

    def flat_size(self):
        """Number of elements in the opaque layout (TF ``params_size`` in elements)."""
        n = 0
        for i in range(self.num_layer_directions):
            s = self.shapes(i)
            n += s["W"][0] * s["W"][1] + s["R"][0] * s["R"][1] + 6 * self.hidden_size
        return n


@dataclass(frozen=True)
class LayerParams:
    """One layer-direction's weights, gates in order r, z, n (see the module docstring)."""
    W: np.ndarray
    R: np.ndarray
    b_W: np.ndarray
    b_R: np.ndarray

    def arrays(self):
        return {"W": self.W, "R": self.R, "b_W": self.b_W, "b_R": self.b_R}


class Params:
    """All canonical parameters of a GRU stack: ``params[l, d]`` or ``params[l·D + d]``.

    Build with ``Params(topology, [LayerParams, ...])``, ``Params.random``, ``Params.zeros`` or
    ``Params.from_flat``.  The arrays are validated (shapes, one dtype) and stored as given
    when already C-contiguous; cgru never writes into them.
    """

    def __init__(self, topology, layers):
        if not isinstance(topology, Topology):
            raise TypeError(f"topology: expected a cgru.Topology, got {type(topology).__name__}")
        layers = list(layers)
        n = topology.num_layer_directions
        if len(layers) != n:
            raise ValueError(f"params: expected {n} layer-directions (L={topology.num_layers} × "
                             f"D={topology.num_directions}), got {len(layers)}")
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
            out = {}
            for name, shape in topology.shapes(i).items():
                a = getattr(lp, name)
                what = f"params[{i}].{name}"
                if not isinstance(a, np.ndarray):
                    raise TypeError(f"{what}: expected a numpy array, got {type(a).__name__}")
                dt = as_dtype(a.dtype, what + ".dtype")
                if dtype is None:
                    dtype = dt
                elif dt != dtype:
                    raise TypeError(f"{what}: expected dtype {dtype} like params[0].W, got {dt}")
                if a.shape != shape:
                    raise ValueError(f"{what}: expected shape {shape}, got {a.shape}")
                out[name] = np.ascontiguousarray(a)
            checked.append(LayerParams(**out))
        self.topology = topology
        self.layers = tuple(checked)
        self.dtype = dtype

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
        return f"Params({self.topology}, dtype={self.dtype})"

    # --- constructors -------------------------------------------------------------------
    @classmethod
    def zeros(cls, topology, dtype=np.float32):
        dt = as_dtype(dtype)
        return cls(topology, [LayerParams(**{k: np.zeros(s, dt) for k, s in
                                             topology.shapes(i).items()})
                              for i in range(topology.num_layer_directions)])

    @classmethod
    def random(cls, topology, dtype=np.float32, seed=0, scale=None):
        """Uniform in ``[-scale, scale]``, ``scale = 1/sqrt(H)`` by default (PyTorch's init)."""
        dt = as_dtype(dtype)
        rng = np.random.default_rng(seed)
        s = 1.0 / np.sqrt(topology.hidden_size) if scale is None else float(scale)
        return cls(topology, [LayerParams(**{k: rng.uniform(-s, s, shp).astype(dt) for k, shp in
                                             topology.shapes(i).items()})
                              for i in range(topology.num_layer_directions)])

    def copy(self):
        return Params(self.topology, [LayerParams(**{k: v.copy() for k, v in lp.arrays().items()})
                                      for lp in self.layers])

    def map(self, fn):
        """A new Params with ``fn(array)`` applied to every array."""
        return Params(self.topology, [LayerParams(**{k: fn(v) for k, v in lp.arrays().items()})
                                      for lp in self.layers])

    def astype(self, dtype):
        dt = as_dtype(dtype)
        return self.map(lambda a: a.astype(dt))

    # --- opaque layout ------------------------------------------------------------------
    def _pieces(self):
        """Arrays in opaque order: all matrices (per layer-direction, linLayerID 0..5), then
        all biases in the same order."""
        H = self.topology.hidden_size
        mats, biases = [], []
        for lp in self.layers:
            for g in range(3):
                mats.append(lp.W[g * H:(g + 1) * H])
            for g in range(3):
                mats.append(lp.R[g * H:(g + 1) * H])
            for g in range(3):
                biases.append(lp.b_W[g * H:(g + 1) * H])
            for g in range(3):
                biases.append(lp.b_R[g * H:(g + 1) * H])
        return mats + biases

    def flat(self):
        """The opaque layout as one 1-D array (see the module docstring)."""
        return np.concatenate([p.ravel() for p in self._pieces()])

    @classmethod
    def from_flat(cls, topology, flat):
        """Inverse of ``flat()``: copies out of a 1-D array of ``topology.flat_size()``."""
        if not isinstance(topology, Topology):
            raise TypeError(f"topology: expected a cgru.Topology, got {type(topology).__name__}")
        if not isinstance(flat, np.ndarray):
            raise TypeError(f"flat: expected a numpy array, got {type(flat).__name__}")
        dt = as_dtype(flat.dtype, "flat.dtype")
        if flat.ndim != 1 or flat.size != topology.flat_size():
            raise ValueError(f"flat: expected a 1-D array of {topology.flat_size()} elements, "
                             f"got shape {flat.shape}")
        out = cls.zeros(topology, dt)
        pos = 0
        for piece in out._pieces():
            piece[...] = flat[pos:pos + piece.size].reshape(piece.shape)
            pos += piece.size
        return out
