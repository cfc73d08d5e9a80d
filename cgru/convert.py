"""Lossless weight conversion between cgru's network and every system's tensors.

The canonical model is a ``cgru.Network``: its cell (``GRUCell``, ``LSTMCell``, ``RNNCell``), its
topology, and per layer-direction ``l·D + d`` the matrices ``W [G·H, in]``, ``R [G·H, S]``, the
bias vectors ``b_W``, ``b_R`` ``[G·H]`` and an LSTM's projection ``W_p [P, H]``, gates in the
canonical order (GRU ``r, z, n``, ``G = 3``; LSTM ``i, f, g, o``, ``G = 4``; vanilla RNN one
block; ``S`` = ``P`` with a projection, else ``H``).  Every system maps to and from it
(``to_X`` / ``from_X``); any pair converts through it.  Every ``from_X`` returns a network that
carries the source's cell, so ``cgru.forward(from_X(...), x)`` computes the source's function;
every ``to_X(net)`` reads the cell from the network (an explicit ``cell=`` that contradicts it is
a ``ValueError``; on a network built without a cell the old explicit form still works, with a
``DeprecationWarning``).  Each system's mapping lives in ``cgru.systems.<system>``.

Which cells each system has, and its gate orders and orientation::

                  GRU          LSTM                 RNN                          layout
    PyTorch       r, z, n      i, f, g, o  + proj   tanh / relu                  [G·H, in], x·Wᵀ
    cuDNN/TF      r, z, n      i, f, g, o  + proj   tanh / relu (rnn_tanh/_relu) [H, in] blocks
    ONNX          z, r, h      i, o, f, c  no proj  any ONNX activation          [G·H, in]
    Keras         z, r, h      i, f, c, o  no proj  SimpleRNN, Keras activations kernel [in, G·H]
    oneDNN        u, r, o      i, f, c̃, o  + proj   relu / tanh / logistic       ldigo
    MPSGraph      z, r, o      i, f, z, o  no proj  singleGateRNN: relu, …       [G·H, in]
    Arraymancer   r, z, n      —                    —                            [G·H, in]

(MPSGraph: ``r, z, o`` with ``reset_gate_first``; its LSTM and single-gate RNN operators
convert with ``to_mps_lstm`` / ``from_mps_lstm`` and ``to_mps_rnn`` / ``from_mps_rnn``, the
GRU operator with ``to_mps`` / ``from_mps``.)  The kind is read from the tensors where they
say it (``from_torch``: ``weight_hh`` ``[G·H, H]``, ``weight_hr``; ``from_keras``: the
recurrent kernel ``[H, G·H]``; ``from_onednn``: the gate axis) and given where they do not
(``from_tf_canonical(rnn_mode=)``, ``from_tf_opaque(rnn_mode=)``, ``from_onnx(op_type=)``, "gru" /
"GRU" by default as before the other kinds existed); an option that contradicts the tensors is
refused.

Rules (``cgru.systems._rules``):

* A target that cannot compute the source's function is refused with a ``ValueError`` that
  says why: a cell kind it lacks (Arraymancer has GRUs only; ``to_mps`` is MPSGraph's GRU
  operator), the other GRU candidate form (reset after vs before the recurrent product),
  activations, ``clip`` or ``flip_z`` the target lacks, the LSTM projection (ONNX, Keras,
  MPSGraph), LSTM peepholes in a form the target lacks (ONNX has ``"ifo"``, MPSGraph
  ``"ifgo"``, the others none) and coupled input/forget gates (ONNX only), a direction or
  input mode it lacks, non-zero biases for a bias-less target.
* Fewer-bias targets get the sums ``b_Wr + b_Rr`` and ``b_Wz + b_Rz`` (exact: only the sums are
  observable); for the reset-before cell also ``b_Wn + b_Rn``.  For the reset-after cell
  ``b_Wn`` and ``b_Rn`` are never merged (``b_Rn`` sits inside the reset product): every
  fewer-bias target that computes the reset-after cell keeps them apart (MPSGraph
  ``secondary_bias``, oneDNN LBR's fourth bias gate), and the single-candidate-bias targets
  (Keras ``reset_after=False``, oneDNN vanilla GRU, MPSGraph ``resetAfter=NO``) compute the
  reset-before cell, so a reset-after source is refused there for its candidate form.  LSTM
  and RNN biases all sit outside any product: one-bias targets (Keras, oneDNN) get
  ``b_W + b_R``.
* Fewer-bias sources map in with the sums on the input side and zeros on the recurrent side.
* ``input_mode="skip"`` (cuDNN) converts to systems without it as explicit identity input
  matrices (the same function); ``"projected"`` (MPSGraph without input weights) converts only
  to MPSGraph.
* Option strings (directions, activation names, cell kinds, modes) may be ``str`` or ``bytes``.

The GRU conversion matrix (one forward layer, each system's default activations; E = exact,
bit for bit; S = exact with the bias sums; R = refused: the other candidate form)::

                 PT TF AM O1 O0 KA KB MA MB DL DG
    PyTorch      E  E  E  E  R  E  R  S  R  S  R      PT PyTorch, TF TF CudnnRNN,
    TF           E  E  E  E  R  E  R  S  R  S  R      AM Arraymancer,
    Arraymancer  E  E  E  E  R  E  R  S  R  S  R      O1/O0 ONNX linear_before_reset 1/0,
    ONNX lbr=1   E  E  E  E  R  E  R  S  R  S  R      KA/KB Keras reset_after True/False,
    ONNX lbr=0   R  R  R  R  E  R  S  R  S  R  S      MA/MB MPSGraph resetAfter YES/NO,
    Keras RA     E  E  E  E  R  E  R  S  R  S  R      DL/DG oneDNN lbr_gru / gru
    Keras RB     R  R  R  R  E  R  E  R  E  R  E
    MPS RA       E  E  E  E  R  E  R  E  R  E  R
    MPS RB       R  R  R  R  E  R  E  R  E  R  E
    oneDNN LBR   E  E  E  E  R  E  R  E  R  E  R
    oneDNN GRU   R  R  R  R  E  R  E  R  E  R  E

The LSTM and RNN matrices (one forward layer; Rk = the target lacks the kind, Rp = the
projection, Ra = the activation; a ``P`` source has a projection; MP = MPSGraph's GRU
operator, see ``to_mps_lstm`` / ``to_mps_rnn`` for its others)::

                 PT TF ON KE DN MP AM                     PT TF ON KE DN MP AM
    PyTorch      E  E  E  S  S  Rk Rk    RNN tanh/relu    E  E  E  S  S  Rk Rk  (PT, TF, ONNX)
    TF, ONNX     E  E  E  S  S  Rk Rk    RNN sigmoid      Ra Ra E  S  S  Rk Rk  (ONNX)
    Keras        E  E  E  E  E  Rk Rk    Keras relu       E  E  E  E  E  Rk Rk
    oneDNN       E  E  E  E  E  Rk Rk    Keras softsign   Ra Ra E  E  Ra Rk Rk
    PyTorch P    E  E  Rp Rp S  Rk Rk    oneDNN tanh      E  E  E  E  E  Rk Rk
    TF P         E  E  Rp Rp S  Rk Rk    oneDNN logistic  Ra Ra E  E  E  Rk Rk
    oneDNN P     E  E  Rp Rp E  Rk Rk

Round trips are exact: ``from_X(to_X(net))`` returns ``net``'s arrays bit for bit, except
that a fewer-bias target returns the summed biases (as ``b_W``, with ``b_R = 0``) — which
compute the same function — and that skip mode comes back as identity input matrices; and
``to_X(from_X(w)) == w`` bit for bit for every system.  All arrays are returned as fresh NumPy
copies of the source dtype (float32 or float64).
"""
from cgru.systems.arraymancer import from_arraymancer, to_arraymancer
from cgru.systems.keras import from_keras, keras_config, to_keras
from cgru.systems.mps import (from_mps, from_mps_lstm, from_mps_rnn, to_mps, to_mps_lstm,
                               to_mps_rnn)
from cgru.systems.onednn import from_onednn, to_onednn
from cgru.systems.onnx import from_onnx, to_onnx
from cgru.systems.tf import from_tf_canonical, from_tf_opaque, to_tf_canonical, to_tf_opaque
from cgru.systems.torch import from_torch, to_torch

__all__ = [
    "to_torch", "from_torch", "to_keras", "from_keras", "keras_config",
    "to_tf_canonical", "from_tf_canonical", "to_tf_opaque", "from_tf_opaque",
    "to_onnx", "from_onnx", "to_mps", "from_mps", "to_mps_lstm", "from_mps_lstm",
    "to_mps_rnn", "from_mps_rnn", "to_arraymancer", "from_arraymancer",
    "to_onednn", "from_onednn",
]
