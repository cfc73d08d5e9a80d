"""The ONNX ``GRU``, ``LSTM`` and ``RNN`` operators (opsets 7/14/22) on the CPU, and whole
ONNX models: ``gru``, ``lstm``, ``rnn``, ``run``, ``recurrent_layers``.

One ONNX node is one layer, one core call (two when the directions' activations differ).
Validated in ONNX's words, its ``W``/``R``/``B`` (and an LSTM's ``P``) tensors and attributes
map onto a ``cgru.Network`` through ``cgru.systems.onnx`` (its docstring has the table: GRU
gates ONNX ``z, r, h`` → canonical ``r, z, n``, LSTM ``i, o, f, c`` → ``i, f, g, o``, peepholes
``P`` ``i, o, f`` → ``i, f, o``; ``linear_before_reset`` → the GRU cell's ``reset_after``;
``input_forget`` → ``LSTMCell(input_forget)``; ``activations``; ``clip``; ``direction``).

``sequence_lens`` follows onnxruntime's CPU kernels (the ONNX specification is silent): outputs
at ``t ≥ len`` are 0, the reverse direction starts at ``len − 1``, ``Y_h`` (and ``Y_c``) is the
state after the last processed step, and 0 for a sequence of length 0.  Attribute values may be
``str`` or ``bytes`` (``onnx.helper.get_attribute_value`` gives bytes).

``run`` executes a whole model: every GRU/LSTM/RNN node by cgru, every other node by the
``onnx`` package's reference evaluator (``onnx.reference.ReferenceEvaluator``).
``recurrent_layers`` lists a model's recurrent nodes with their weights as cgru networks.
Both treat the model as untrusted input: ``ValueError`` for anything wrong with it, external
data only from the model file's directory or the ``base_dir`` the caller names (docs/onnx.md).
Gradients: ``cgru.backward`` on those networks (or on ``cgru.convert.from_onnx``'s), with
``cgru.convert.to_onnx`` mapping the weight gradients back to ONNX's layout.
"""
from cgru.onnx.operators import (ATTRIBUTES, INPUTS, ONNX_ACTIVATIONS, OPERATORS, OUTPUTS,
                                 UnsupportedNodeError, gru, lstm, rnn)
from cgru.onnx.graph import RecurrentLayer, recurrent_layers, run

__all__ = ["gru", "lstm", "rnn", "run", "recurrent_layers", "RecurrentLayer",
           "UnsupportedNodeError", "ONNX_ACTIVATIONS"]
