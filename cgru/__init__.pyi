"""Type stub of the package ``cgru``: the public names, with the signatures of the ones loaded
on first use (``forward``, ``backward``, …; see ``cgru/__init__.py``).  The shapes and
semantics are in each function's docstring (``cgru.core.engine``, ``cgru.core.stream``)."""
from typing import Any, NamedTuple, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from cgru.core.cells import (ACTIVATION_NAMES as ACTIVATION_NAMES, Activation as Activation,
                             Cell as Cell, GRUCell as GRUCell, LSTMCell as LSTMCell,
                             RNNCell as RNNCell)
from cgru.core.network import (LayerParams as LayerParams, Network as Network,
                               Topology as Topology)

Params = Network     # the old name: deprecated, a DeprecationWarning; removed in 0.4.0

__version__: str
__all__: list[str]

_Array = npt.NDArray[np.floating]
_Seed = Union[int, tuple[int, int]]
_AnyCell = Union[GRUCell, LSTMCell, RNNCell]


# ``reserve``, ``cy`` and ``dc0`` are ``None`` where the docstrings say (not training, not an
# LSTM); they are typed as the arrays they are where a program uses them, so that the usual
# ``backward(net, x, fwd.reserve, …)`` after a training forward needs no cast.
class Forward(NamedTuple):
    """``forward``'s result: ``y`` ``[T, N, D·S]``, ``hy`` ``[L·D, N, S]``, ``reserve`` (uint8;
    ``None`` unless training), ``cy`` ``[L·D, N, H]`` (``None`` but for an LSTM)."""
    y: _Array
    hy: _Array
    reserve: npt.NDArray[np.uint8]
    @property
    def cy(self) -> _Array: ...


class Gradients(NamedTuple):
    """``backward``'s result: ``dx`` (shaped like ``x``; ``None`` with ``need_dx=False``),
    ``dh0`` ``[L·D, N, S]``, ``dparams`` (a ``Network`` of weight gradients; ``None`` with
    ``need_dparams=False``), ``dc0`` ``[L·D, N, H]`` (``None`` but for an LSTM)."""
    dx: _Array
    dh0: _Array
    dparams: Network
    @property
    def dc0(self) -> _Array: ...


def forward(net: Network, x: npt.ArrayLike, h0: Optional[npt.ArrayLike] = None, *,
            c0: Optional[npt.ArrayLike] = None, cell: Optional[_AnyCell] = None,
            lengths: Optional[npt.ArrayLike] = None, batch_major: bool = False,
            state_mask: Optional[npt.ArrayLike] = None, training: bool = False,
            dropout: float = 0.0, seed: _Seed = 0,
            num_threads: Optional[int] = None) -> Forward: ...
def backward(net: Network, x: npt.ArrayLike, reserve: npt.NDArray[np.uint8],
             dy: Optional[npt.ArrayLike] = None, dhy: Optional[npt.ArrayLike] = None, *,
             dcy: Optional[npt.ArrayLike] = None, cell: Optional[_AnyCell] = None,
             state_mask: Optional[npt.ArrayLike] = None, batch_major: bool = False,
             dparams: Optional[Network] = None, accumulate: bool = False,
             need_dx: bool = True, need_dparams: bool = True,
             num_threads: Optional[int] = None) -> Gradients: ...
def reserve_nbytes(topology: Union[Topology, Network], T: int, N: int, *,
                   cell: Optional[_AnyCell] = None,
                   dtype: npt.DTypeLike = np.float32) -> int: ...
def dropout_masks(topology: Topology, T: int, N: int, *, dropout: float, seed: _Seed = 0,
                  dtype: npt.DTypeLike = np.float32) -> list[_Array]: ...
def release_memory() -> None: ...
def parallel_enabled() -> bool: ...
def openmp_enabled() -> bool: ...
def get_include() -> str: ...


class Stream:
    """A few steps per call on weights packed once (``cgru.core.stream``)."""
    def __init__(self, net: Network, *, num_threads: Optional[int] = None) -> None: ...
    def refresh(self) -> None: ...
    def step(self, x: npt.ArrayLike,
             state: Union[None, npt.ArrayLike, Sequence[npt.ArrayLike]] = None
             ) -> tuple[_Array, Any]: ...
