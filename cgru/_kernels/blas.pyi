"""Type stub of the compiled ``cgru._kernels.blas`` (blas.pyx): the row-major BLAS shim over
``scipy.linalg.cython_blas`` and the whole-sequence GEMMs."""
from typing import Optional, Tuple

import numpy as np
import numpy.typing as npt

_Float = npt.NDArray[np.floating]

def gemm_rm(trans_a: bool, trans_b: bool, alpha: float, A: _Float, B: _Float, beta: float,
            C: _Float) -> None: ...
def gemm_blocks(trans_a: bool, trans_b: bool, alpha: float, A: _Float, B: _Float, beta: float,
                C: _Float, n_blocks: int, num_threads: int,
                partial: Optional[_Float] = None, split_rows: bool = False) -> None: ...
def gemm_packed_blocks(A: _Float, Bp: _Float, C: _Float, beta1: bool, n_blocks: int,
                       num_threads: int, trans_a: bool = False,
                       col_blocks: int = 1) -> None: ...
def gemm_chunk_flops(value: Optional[float] = None,
                     min_rows: Optional[int] = None) -> Tuple[float, int]: ...
def gemm_probe(at: int = -1) -> None: ...
def gemm_probe_chunks() -> int: ...
