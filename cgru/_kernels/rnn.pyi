"""Type stub of the compiled ``cgru._kernels.rnn`` (rnn.pyx): the rnn time loops of one
layer, all its directions (entry.pxi)."""
from typing import Any, Optional

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

@disjoint_base
class Direction:
    """One direction's arrays for the time loops (keyword arguments: see rnn.pyx)."""
    def __init__(self, reverse: bool, **arrays: Any) -> None: ...

@disjoint_base
class Runner:
    """An inference forward of one shape over one set of weights, prepared once and run call
    after call (entry.pxi; the engine's ``ForwardPlan``)."""
    @property
    def busy(self) -> bool: ...
    @property
    def runs(self) -> int: ...
    def __init__(self, dtype: npt.DTypeLike, T: int, N: int, H: int, S: int, G: int, Tb: int,
                 n_chunks: int, threads: int, nt: int, cell: Any,
                 lengths: npt.NDArray[np.int64], layers: list[Any],
                 scratch: npt.NDArray[np.floating], keep: Any) -> None: ...
    def run(self, x: npt.NDArray[np.floating], h0: Optional[npt.NDArray[np.floating]],
            c0: Optional[npt.NDArray[np.floating]], y: npt.NDArray[np.floating],
            hy: npt.NDArray[np.floating], cy: Optional[npt.NDArray[np.floating]]) -> bool: ...

def scratch_size(forward: bool, N: int, H: int, S: int, n_chunks: int, D: int) -> int: ...
def forward_layer(dtype: npt.DTypeLike, T: int, N: int, H: int, S: int, n_chunks: int,
                  num_threads: int, cell: Any, lengths: npt.NDArray[np.int64],
                  mask: Optional[npt.NDArray[np.floating]], y: npt.NDArray[np.floating],
                  dirs: list[Direction], training: bool,
                  scratch: npt.NDArray[np.floating],
                  steps: Optional[tuple[int, int]] = None) -> None: ...
def backward_layer(dtype: npt.DTypeLike, T: int, N: int, H: int, S: int, n_chunks: int,
                   num_threads: int, cell: Any, lengths: npt.NDArray[np.int64],
                   mask: Optional[npt.NDArray[np.floating]], dy: npt.NDArray[np.floating],
                   dirs: list[Direction], scratch: npt.NDArray[np.floating],
                   steps: Optional[tuple[int, int]] = None) -> None: ...
