"""Type stub of the compiled ``cgru._kernels.lstm`` (lstm.pyx): the lstm time loops of one
layer, all its directions (entry.pxi)."""
from typing import Any, Optional

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

@disjoint_base
class Direction:
    """One direction's arrays for the time loops (keyword arguments: see lstm.pyx)."""
    def __init__(self, reverse: bool, **arrays: Any) -> None: ...

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
