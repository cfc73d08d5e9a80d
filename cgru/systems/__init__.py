"""The systems layer: each system's weights, names and rules, mapped to and from the network.

One module per system owns its gate order, orientation, bias rules and attribute names, and
maps its tensors to and from a ``cgru.Network`` (which carries the cell)::

    torch        PyTorch ``torch.nn.GRU`` / ``nn.LSTM`` (``proj_size``) / ``nn.RNN``
                 ``state_dict``
    keras        Keras ``GRU`` / ``LSTM`` / ``SimpleRNN`` (and ``Bidirectional``)
                 ``get_weights()`` and layer arguments
    tf           cuDNN / TF ``CudnnRNN`` canonical lists (every mode, the LSTM projection),
                 opaque ``params``, TF's attribute names
    onnx         ONNX ``GRU`` / ``LSTM`` / ``RNN`` nodes: ``W``/``R``/``B``, activations and
                 attributes
    mps          Apple MPSGraph ``GRU`` ops: tensors, gate orders and descriptor options
    arraymancer  Arraymancer's stacked GRU tensors (both of its spellings)
    onednn       oneDNN RNN ``ldigo``/``ldgo``/``ldio`` tensors (GRU, LBR GRU, LSTM with
                 projection, vanilla RNN), cell kinds, activations and directions
    _rules       what several systems share: refusal rules (cell kinds, forms, activations,
                 projection), gate-block permutation, skip mode's identity input matrices,
                 bias merging, the checks of tensors and options

The public converters are re-exported by ``cgru.convert``; the op frontends (``cgru.tf``,
``cgru.mps``, ``cgru.onnx``, ``cgru.arraymancer``) map their weights through these modules.
Nothing here imports a frontend.
"""
