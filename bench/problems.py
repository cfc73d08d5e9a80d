"""What the bench runs: cell kinds, configurations, run modes, the problem data, the work.

A configuration (``Config``) names its cell kind and its shape.  The work of one
layer-direction over ``T`` steps, batch ``N``, input width ``I`` and hidden size ``H``, with
``G`` gate blocks (docs/speed.md §1)::

    forward   2·T·N·G·H·(I + H)    one input projection + T recurrent products
    backward  2 × the forward      T recurrent data products, then dX, dW and dR
    training  3 × the forward      (fb: forward + backward)

A stack adds this up over layers and directions with ``I = D·H`` above the first layer.  An
LSTM with a projection of size ``P`` (``S = P``, the width of ``h``) does per step
``[N, P]·[P, 4H]`` recurrent products and a projection ``[N, H]·[H, P]``, and the layers
above read ``D·P`` inputs::

    forward   2·T·N·(4H·(in + P) + P·H)
"""
from dataclasses import dataclass, field

import numpy as np

import cgru

# --- cell kinds ------------------------------------------------------------------------------
# name -> gate blocks G (make_cell builds cgru's cell).  Every size and flop count below is written
# in terms of G; each peer says per kind whether it can run it (bench/systems.py).
CELL_KINDS = {
    "gru": 3,
    "lstm": 4,
    "rnn_tanh": 1,
    "rnn_relu": 1,
}


def make_cell(kind):
    """cgru's cell value of ``kind`` (cuDNN's variant of each)."""
    from cgru.core import cells
    if kind == "gru":
        return cells.GRUCell()
    if kind == "lstm" and hasattr(cells, "LSTMCell"):
        return cells.LSTMCell()
    if kind in ("rnn_tanh", "rnn_relu") and hasattr(cells, "RNNCell"):
        return cells.RNNCell(kind[4:])
    raise ValueError(f"cell kind {kind!r}: this cgru has no such cell")


# --- configurations ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """One benchmark problem: cell kind, T steps, batch N, input I, hidden H, L layers."""
    name: str
    T: int
    N: int
    I: int
    H: int
    L: int = 1
    bidirectional: bool = False
    cell: str = "gru"
    P: int = 0                    # an LSTM's projection size (0: none)
    streaming: bool = field(default=False, compare=False)   # report per-call µs

    def __post_init__(self):
        if self.cell not in CELL_KINDS:
            raise ValueError(f"config {self.name}: unknown cell kind {self.cell!r} "
                             f"(expected one of {', '.join(CELL_KINDS)})")
        if self.P and (self.cell != "lstm" or not 0 < self.P <= self.H):
            raise ValueError(f"config {self.name}: a projection (P={self.P}) needs an LSTM "
                             f"with 0 < P ≤ H={self.H}, got cell kind {self.cell!r}")

    @property
    def G(self):
        """Gate blocks of the cell kind."""
        return CELL_KINDS[self.cell]

    @property
    def D(self):
        return 2 if self.bidirectional else 1

    @property
    def S(self):
        """Width of ``h``: the projection size when there is one, else ``H``."""
        return self.P or self.H

    @property
    def topology(self):
        return cgru.Topology(self.I, self.H, self.L,
                             "bidirectional" if self.bidirectional else "forward",
                             proj_size=self.P)

    def layer_width(self, layer):
        """Input width of layer ``layer``'s input projection."""
        return self.I if layer == 0 else self.D * self.S

    def describe(self):
        bi = " bi" if self.bidirectional else ""
        kind = "" if self.cell == "gru" else f" {self.cell}"
        proj = f" P={self.P}" if self.P else ""
        return f"T={self.T} N={self.N} I={self.I} H={self.H} L={self.L}{bi}{kind}{proj}"

    def flops_fwd(self):
        """GEMM flops of the forward: ``2·T·N·(G·H·(in + S) + P·H)`` per layer-direction
        (``S = H`` and no projection term without a projection)."""
        G, H, S, P = self.G, self.H, self.S, self.P
        return sum(self.D * 2 * self.T * self.N * (G * H * (self.layer_width(l) + S) + P * H)
                   for l in range(self.L))

    def flops(self, kind):
        """GEMM flops of a ``"fwd"`` (inference forward) or an ``"fb"`` (training: forward +
        backward, exactly 3× the forward: the backward's recurrent data products and its
        dX, dW and dR GEMMs are twice the forward's)."""
        return self.flops_fwd() * (1 if kind == "fwd" else 3)


def _named(*configs):
    return {c.name: c for c in configs}


CONFIGS = _named(
    Config("A", 100, 1, 256, 256),
    Config("B", 100, 32, 256, 256),
    Config("C", 50, 64, 512, 512),
    Config("D", 200, 16, 128, 128),
    Config("E", 35, 20, 1024, 1024),
    Config("F", 100, 32, 256, 256, 2, True),
    Config("S1", 1, 1, 256, 256, streaming=True),
    Config("S32", 32, 1, 256, 256, streaming=True),
    Config("T32-H512", 32, 1, 512, 512),
    Config("T128-H256", 128, 1, 256, 256),
    Config("T128-H512", 128, 1, 512, 512),
    Config("DS", 50, 32, 1760, 1760),
)
ALIASES = {"T32-H256": "S32"}


def parse_config(spec):
    """A config by name (``A``…``F``, ``S1``, ``S32`` = ``T32-H256``, ``T32-H512``,
    ``T128-H256``, ``T128-H512``, ``DS``) or ``TxNxIxHxL`` with an optional ``b`` suffix for a
    bidirectional stack (``5x3x4x6x2b``); either may carry a cell-kind prefix, ``lstm:B``
    (default ``gru``), and an LSTM a projection suffix ``-P<size>``: ``lstm:B-P128``."""
    if not isinstance(spec, str):
        raise ValueError(f"config: expected a string, got {spec!r}")
    kind, _, body = spec.rpartition(":")
    kind = kind or "gru"
    if kind not in CELL_KINDS:
        raise ValueError(f"config {spec!r}: unknown cell kind {kind!r} (expected one of "
                         f"{', '.join(CELL_KINDS)})")
    P = 0
    head, sep, tail = body.rpartition("-P")
    if sep and head and tail.isdigit():
        body, P = head, int(tail)
        if P < 1:
            raise ValueError(f"config {spec!r}: a projection size must be positive")
    name = ALIASES.get(body, body)
    if name in CONFIGS:
        c = CONFIGS[name]
        if kind == "gru" and not P:
            return c
        full = f"{kind}:{c.name}" + (f"-P{P}" if P else "")
        return Config(full, c.T, c.N, c.I, c.H, c.L, c.bidirectional, kind, P=P,
                      streaming=c.streaming)
    shape, bi = (body[:-1], True) if body.endswith("b") else (body, False)
    parts = shape.split("x")
    if len(parts) == 5 and all(p.isdigit() and int(p) > 0 for p in parts):
        T, N, I, H, L = map(int, parts)
        return Config(spec, T, N, I, H, L, bi, kind, P=P)
    raise ValueError(f"config: expected one of {', '.join(list(CONFIGS) + list(ALIASES))} or "
                     f"TxNxIxHxL[b] (e.g. 5x3x4x6x2b), optionally prefixed with a cell kind "
                     f"(lstm:B) and, for an LSTM, suffixed with a projection (lstm:B-P128), "
                     f"got {spec!r}")


# --- run modes ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mode:
    """How much to run: configs, dtypes, rounds of blocks, time per block and per system."""
    name: str
    configs: tuple
    dtypes: tuple
    rounds: int
    block_s: float      # aim for this much timed work per block
    budget_s: float     # at most this much time per system per section (>= 3 rounds)
    pause_s: float      # the shortest pause before a block
    warmup_s: float = 0.1
    min_blocks: int = 3   # blocks per system at least, for calls up to slow_s
    slow_s: float = 4.0   # a call slower than this gets a single block
    untimed_s: float = 0.25   # a call slower than this: no untimed call before a block, and
                              # a single warm-up call
    about: str = ""       # how long a run takes, as the help, README and docs/speed.md say


_MAIN = ("A", "B", "C", "D", "E", "F", "S1", "S32", "T32-H512", "T128-H256", "T128-H512")
_SHAPES = ("A", "B", "C", "D", "E", "F", "S1", "S32")           # docs/speed.md §3 and §7
_OTHER_KINDS = (tuple(f"lstm:{c}" for c in _SHAPES) + ("lstm:B-P128",)
                + tuple(f"rnn_tanh:{c}" for c in _SHAPES) + ("rnn_relu:B",))
MODES = {
    # every system and cell kind once (a stack, batch 1, a streaming call), float32; 4.6 min
    # measured on 2 cores with other work running
    "quick": Mode("quick", ("B", "F", "S1", "lstm:B", "lstm:S1", "rnn_tanh:D"), ("float32",),
                  rounds=2, block_s=0.02, budget_s=0.25, pause_s=0.01, warmup_s=0.04,
                  min_blocks=2, slow_s=0.3, untimed_s=0.03, about="about 5 min"),
    # every config of every kind, both dtypes, few repetitions of the slow calls
    "default": Mode("default", _MAIN + _OTHER_KINDS, ("float32", "float64"), rounds=3,
                    block_s=0.04, budget_s=0.4, pause_s=0.01, warmup_s=0.06, min_blocks=2,
                    slow_s=0.6, untimed_s=0.03, about="about 20 min"),
    "full": Mode("full", _MAIN + ("DS",) + _OTHER_KINDS + ("lstm:DS", "rnn_tanh:DS"),
                 ("float32", "float64"), rounds=7, block_s=0.1, budget_s=3.0, pause_s=0.05,
                 slow_s=15.0),
}


def mode_configs(mode):
    """The ``Config`` values of a mode's config names."""
    return [parse_config(name) for name in mode.configs]


# --- problem data ------------------------------------------------------------------------------
class Problem:
    """Network (weights and cell), inputs and output gradients shared by every system of one
    section.  Time-major: ``x`` ``[T, N, I]``, ``h0``/``dhy`` ``[L·D, N, S]``, ``dy``
    ``[T, N, D·S]`` (``S``: ``P`` with a projection, else ``H``); an LSTM's ``c0``/``dcy``
    ``[L·D, N, H]``.  Deterministic in ``seed``; picklable (sent to the bench's workers)."""

    def __init__(self, config, dtype, seed=0):
        self.config = config
        self.dtype = np.dtype(dtype)
        c = config
        rng = np.random.default_rng(seed)
        self.net = cgru.Network.random(c.topology, self.dtype, seed=seed, cell=make_cell(c.cell))
        LD = c.L * c.D

        def u(*shape, s=1.0):
            return rng.uniform(-s, s, shape).astype(self.dtype)

        self.x = u(c.T, c.N, c.I)
        self.h0 = u(LD, c.N, c.S, s=0.5)
        self.dy = u(c.T, c.N, c.D * c.S)
        self.dhy = u(LD, c.N, c.S)
        # a cell state (LSTM): c0 and the gradient of the final cell states, else None
        state = getattr(self.net.cell, "has_cell_state", False)
        self.c0 = u(LD, c.N, c.H, s=0.5) if state else None
        self.dcy = u(LD, c.N, c.H) if state else None

    def forward_kwargs(self):
        """Extra keywords of ``cgru.forward`` for this cell (``c0`` of an LSTM)."""
        return {} if self.c0 is None else {"c0": self.c0}

    def backward_kwargs(self):
        """Extra keywords of ``cgru.backward`` for this cell (``dcy`` of an LSTM)."""
        return {} if self.dcy is None else {"dcy": self.dcy}

    def _state_nbytes(self):
        return 0 if self.c0 is None else self.c0.nbytes + self.dcy.nbytes

    def input_nbytes(self):
        """Bytes of what the caller holds before a training step: x, h0 (c0), the weights, dy,
        dhy (dcy)."""
        weights = sum(a.nbytes for lp in self.net for a in lp.arrays().values())
        return (self.x.nbytes + self.h0.nbytes + weights + self.dy.nbytes + self.dhy.nbytes
                + self._state_nbytes())

    def output_nbytes(self):
        """Bytes of a training step's results: y, hy (cy), dx, dh0 (dc0) and the weight
        gradients (each the size of its counterpart among the inputs)."""
        return self.input_nbytes()
