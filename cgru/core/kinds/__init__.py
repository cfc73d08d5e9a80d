"""The cell kinds as the rest of cgru sees them: one object per kind, one protocol.

A cell value (``cgru.GRUCell``, ``LSTMCell``, ``RNNCell``: ``cgru.core.cells``) says which
function one step computes; its *kind* object (``of(cell)``) says how cgru computes it.  The
engine, the reserve, ``Stream``, the rebuilding of reserves and the NumPy reference iterate
over the protocol (``base.Kind``) and never ask which kind they hold:

==========================  ===================================================================
``gates``, ``states``       gate blocks of every matrix; states a step carries (h, or h and c)
``saved_regions``           what a training forward saves per layer-direction (the reserve)
``kernels``                 its compiled time loops (imported on first use)
``fixed``, ``packs``        the kernels' fixed arguments (bias sums…), packed recurrent weights
                            (made once per call's weights: ``weights.Frozen.direction_args``)
``forward_direction``       a layer-direction's forward, bound for the kernels
``backward_buffers``,       the backward's per-direction buffers, and a layer-direction's
``backward_direction``      backward bound for the kernels
``weight_gradients``        its weight gradients after a block of time's loops, as GEMMs
``step``, ``step_backward`` its NumPy reference step and the step's exact backward
``rebuild``                 its reserve rebuilt from another system's saved training state
==========================  ===================================================================

A new cell kind is one cell class (``cells.py``), one module here, one kernel file
(``cgru/_kernels/<kind>.pyx``), and its tests — see the README's layout section.
"""
from cgru.core.cells import GRUCell, LSTMCell, RNNCell, is_cell
from cgru.core.kinds import gru, lstm, rnn

__all__ = ["of", "KINDS"]

KINDS = {GRUCell: gru.KIND, LSTMCell: lstm.KIND, RNNCell: rnn.KIND}


def of(cell):
    """The kind object of a cell value."""
    kind = KINDS.get(type(cell))
    if kind is None:
        if is_cell(cell):                                   # a subclass of a cell kind
            for cls, k in KINDS.items():
                if isinstance(cell, cls):
                    return k
        raise TypeError(f"cell: expected a cgru cell (GRUCell, LSTMCell or RNNCell), got "
                        f"{type(cell).__name__}")
    return kind
