"""Whole ONNX models for ``cgru.onnx``: ``run_model`` (cgru's recurrent nodes inside the
``onnx`` reference evaluator) and ``recurrent_layers`` (the recurrent nodes' weights, resolved
statically).  Private: the public names and their documentation are in ``cgru.onnx``.

How ``run_model`` splits a graph: ``onnx.reference.ReferenceEvaluator`` runs the model, with
``new_ops`` overriding the standard ``GRU``, ``LSTM`` and ``RNN`` (domain ``""``) by classes
that call ``cgru.onnx.gru`` / ``lstm`` / ``rnn``; the evaluator passes ``new_ops`` on to the
bodies of ``If``/``Loop``/``Scan``, and local functions are inlined first (the evaluator would
run a function's body without them).  Empty output names of a recurrent node are renamed in a
copy of the model: the evaluator stores every output by name, and an output called ``""``
would overwrite the value it hands to omitted optional inputs.
"""
import os

import numpy as np

from cgru import onnx as front

RECURRENT = tuple(front.INPUTS)
_DEFAULT_DOMAINS = ("", "ai.onnx")
# nodes whose outputs are not a function of their inputs: never folded statically
_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
           "Multinomial", "Bernoulli"}


def import_onnx(what="run"):
    try:
        import onnx
        import onnx.numpy_helper  # noqa: F401
    except ImportError as e:
        raise ImportError(f"cgru.onnx.{what} needs the 'onnx' package to read models (pip "
                          f"install onnx); cgru.onnx.gru, lstm and rnn work without it") from e
    return onnx


def load_model(onnx, model):
    """The ``ModelProto`` of a path, serialized bytes or a ``ModelProto`` (``ValueError`` when
    they do not parse as one, ``TypeError`` for anything else)."""
    from google.protobuf.message import DecodeError      # onnx's own dependency
    if isinstance(model, onnx.ModelProto):
        return model
    if not isinstance(model, (str, os.PathLike, bytes)):
        raise TypeError(f"model: expected a path, serialized bytes or an onnx.ModelProto, got "
                        f"{type(model).__name__}")
    try:
        if isinstance(model, bytes):
            return onnx.load_model_from_string(model)
        return onnx.load(os.fspath(model))
    except DecodeError as e:
        what = f"{len(model)} bytes" if isinstance(model, bytes) else f"file {os.fspath(model)!r}"
        raise ValueError(f"model: cannot parse {what} as an ONNX model ({e})") from None


def _is_recurrent(node):
    return node.op_type in RECURRENT and node.domain in _DEFAULT_DOMAINS


def _subgraphs(onnx, node):
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _walk(onnx, graph):
    """Every node of ``graph`` and of the graphs nested in its nodes' attributes."""
    for node in graph.node:
        yield node
        for g in _subgraphs(onnx, node):
            yield from _walk(onnx, g)


def _describe(node):
    return f"{node.op_type} node {node.name!r}" if node.name else f"an unnamed {node.op_type} node"


def _attributes(onnx, node):
    """The node's attributes, checked against its operator; names decoded to ``str``."""
    allowed = front.ATTRIBUTES[node.op_type]
    out = {}
    for a in node.attribute:
        if a.ref_attr_name:
            raise ValueError(f"model: {_describe(node)} takes its attribute {a.name!r} from an "
                             f"enclosing function ({a.ref_attr_name!r}); inline the function "
                             f"first")
        if a.name not in allowed:
            raise ValueError(f"model: unsupported {node.op_type} attribute {a.name!r} "
                             f"({_describe(node)}; expected one of {', '.join(allowed)})")
        value = onnx.helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list):
            value = [v.decode() if isinstance(v, bytes) else v for v in value]
        out[a.name] = value
    return out


def _default_opset(model):
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    return versions[0] if versions else None


def _check_recurrent(onnx, model, nodes):
    """Refuse recurrent nodes of opsets before 7 and unknown attributes, before any work."""
    opset = _default_opset(model)
    for node in nodes:
        if opset is not None and opset < 7:
            older = {"GRU": "GRU-1/GRU-3", "LSTM": "LSTM-1", "RNN": "RNN-1"}[node.op_type]
            raise ValueError(f"model: {older} (opset {opset} < 7) are not supported; re-export "
                             f"the model with opset ≥ 7")
        _attributes(onnx, node)


# --- run ----------------------------------------------------------------------------------
class NodeError(Exception):
    """An error of cgru inside a node, carried out of the reference evaluator."""

    def __init__(self, node, error):
        super().__init__(str(error))
        self.node, self.error = node, error


_OPS = []


def _cgru_ops():
    """``OpRun`` classes named ``GRU``, ``LSTM``, ``RNN`` (domain ``""``) that compute with
    cgru: the reference evaluator's ``new_ops`` (made once, on first use)."""
    if not _OPS:
        from onnx.reference.op_run import OpRun
        onnx = import_onnx()

        def _run(self, *inputs, **_schema_attributes):
            # The node's own attributes (absent ones stay absent: cgru's defaults are the
            # operators', and the schema's RNN default names two activations).
            node = self.onnx_node
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            slots = front.INPUTS[node.op_type]
            args = dict(zip(slots, inputs))
            try:
                out = front.OPERATORS[node.op_type](**args, **attrs)
            except (ValueError, TypeError) as e:
                raise NodeError(node, e) from e
            return tuple(out[:len(node.output)])

        for op_type in RECURRENT:
            _OPS.append(type(op_type, (OpRun,), {"op_domain": "", "_run": _run,
                                                 "__module__": __name__}))
    return _OPS


def _prepared(onnx, model):
    """A copy of ``model`` ready for the evaluator: local functions inlined, and recurrent
    nodes' empty output names replaced by fresh ones."""
    model_copy = onnx.ModelProto()
    model_copy.CopyFrom(model)
    if model_copy.functions:
        import onnx.inliner
        model_copy = onnx.inliner.inline_local_functions(model_copy)
    taken = {o for n in _walk(onnx, model_copy.graph) for o in n.output}
    k = 0
    for node in _walk(onnx, model_copy.graph):
        if _is_recurrent(node):
            for i, name in enumerate(node.output):
                if name == "":
                    while f"_cgru_unused_{k}" in taken:
                        k += 1
                    node.output[i] = f"_cgru_unused_{k}"
                    k += 1
    return model_copy


def _consumer(graph, name):
    """How a message names the first use of ``name`` in ``graph``."""
    for node in graph.node:
        for i, n in enumerate(node.input):
            if n == name:
                if _is_recurrent(node):
                    return f"the {node.op_type} input {front.INPUTS[node.op_type][i]} of " \
                           f"{_describe(node)}"
                return f"input {i} of {_describe(node)}"
    return "not used by any node"


def _feeds(onnx, graph, inputs):
    """``inputs`` checked against the graph's inputs: every one without an initializer given,
    no unknown name, declared element types and fixed dimensions respected.  An initializer
    may be given too (a graph input or not): the value given replaces the stored one, as the
    single-node ``run`` always allowed."""
    if not isinstance(inputs, dict):
        raise TypeError(f"inputs: expected a dict from input name to array, got "
                        f"{type(inputs).__name__}")
    declared = {i.name: i for i in graph.input}
    initialized = {t.name for t in graph.initializer} | \
        {t.values.name for t in graph.sparse_initializer}
    for name in declared:
        if name not in initialized and name not in inputs:
            raise ValueError(f"inputs: missing {name!r} ({_consumer(graph, name)}); got "
                             f"{sorted(inputs)}")
    stored = {t.name: t for t in graph.initializer}
    feeds = {}
    for name, value in inputs.items():
        if name not in declared and name not in stored:
            raise ValueError(f"inputs: {name!r} is not an input of the graph (nor one of its "
                             f"initializers); the graph's inputs are {list(declared)}")
        t = declared[name].type if name in declared else \
            onnx.helper.make_tensor_type_proto(stored[name].data_type, stored[name].dims)
        want = None
        if t.HasField("tensor_type") and t.tensor_type.elem_type:
            try:
                want = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type))
            except (KeyError, TypeError, ValueError):
                want = None
        if isinstance(value, np.ndarray):
            if want is not None and value.dtype != want:
                raise TypeError(f"inputs[{name!r}]: expected dtype {want} (the graph input's "
                                f"type), got {value.dtype}")
        else:
            value = np.asarray(value, dtype=want)
        if t.HasField("tensor_type") and t.tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None
                    for d in t.tensor_type.shape.dim]
            if value.ndim != len(dims) or any(d is not None and d != s
                                              for d, s in zip(dims, value.shape)):
                text = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
                raise ValueError(f"inputs[{name!r}]: expected shape {text} (the graph input's "
                                 f"declared shape), got {list(value.shape)}")
        feeds[name] = value
    return feeds


def run_model(model, inputs, outputs=None):
    onnx = import_onnx()
    model = load_model(onnx, model)
    graph = model.graph
    _check_recurrent(onnx, model, [n for n in _walk(onnx, graph) if _is_recurrent(n)]
                     + [n for f in model.functions for n in f.node if _is_recurrent(n)])
    feeds = _feeds(onnx, graph, inputs)
    if outputs is None:
        names = [o.name for o in graph.output]
    else:
        if isinstance(outputs, (str, bytes)) or not hasattr(outputs, "__iter__"):
            raise TypeError(f"outputs: expected None or a list of value names, got "
                            f"{outputs!r}")
        names = list(outputs)
        known = {o for n in graph.node for o in n.output if o} | set(feeds) | \
            {t.name for t in graph.initializer} | {i.name for i in graph.input}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"outputs: {unknown} are not values of the graph (its outputs "
                             f"are {[o.name for o in graph.output]})")
    from onnx.reference import ReferenceEvaluator
    try:
        evaluator = ReferenceEvaluator(_prepared(onnx, model), new_ops=_cgru_ops())
    except NotImplementedError as e:
        raise NotImplementedError(
            f"model: {e} — cgru.onnx.run computes the GRU, LSTM and RNN nodes itself and every "
            f"other node with onnx.reference.ReferenceEvaluator, which has no implementation "
            f"for this one") from e
    try:
        values = evaluator.run(names, feeds)
    except NodeError as e:
        error = e.error
        raise type(error)(f"{_describe(e.node)}: {error}") from error
    return dict(zip(names, values))


# --- recurrent_layers ----------------------------------------------------------------------
class _Unresolved(Exception):
    pass


class _Static:
    """The values of a graph that do not depend on its run-time inputs, computed on demand."""

    def __init__(self, onnx, model):
        self.onnx = onnx
        graph = model.graph
        self.opsets = {(o.domain or ""): o.version for o in model.opset_import}
        self.values = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
        self.inputs = {i.name for i in graph.input} - set(self.values)
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.failed = {}

    def get(self, name):
        """The value of ``name``; ``_Unresolved`` with the chain that makes it dynamic."""
        if name in self.values:
            return self.values[name]
        if name in self.failed:
            raise _Unresolved(self.failed[name])
        try:
            return self._compute(name)
        except _Unresolved as e:
            self.failed[name] = str(e)
            raise

    def _compute(self, name):
        if name in self.inputs:
            raise _Unresolved(f"graph input {name!r} (not an initializer: its value comes at "
                              f"run time)")
        node = self.producer.get(name)
        if node is None:
            raise _Unresolved(f"{name!r}, which no initializer, graph input or node provides")
        here = _describe(node)
        if node.op_type in _RANDOM:
            raise _Unresolved(f"{here} (random values)")
        if list(_subgraphs(self.onnx, node)):
            raise _Unresolved(f"{here} (control flow with a subgraph)")
        if _is_recurrent(node):
            raise _Unresolved(f"{here} (a recurrent node's output)")
        args = {}
        for i in node.input:
            if i:
                try:
                    args[i] = self.get(i)
                except _Unresolved as e:
                    raise _Unresolved(f"{here} ← {e}") from None
        h = self.onnx.helper
        graph = h.make_graph([node], "static", [h.make_empty_tensor_value_info(i) for i in args],
                             [h.make_empty_tensor_value_info(o) for o in node.output if o])
        from onnx.reference import ReferenceEvaluator
        try:
            outs = ReferenceEvaluator(graph, opsets=self.opsets).run(None, args)
        except Exception as e:          # noqa: BLE001 — the evaluator's errors vary by node
            raise _Unresolved(f"{here}, which the reference evaluator could not compute "
                              f"statically ({type(e).__name__}: {e})") from None
        for o, v in zip([o for o in node.output if o], outs):
            self.values[o] = np.asarray(v)
        return self.values[name]


def recurrent_layers(model):
    onnx = import_onnx("recurrent_layers")
    model = load_model(onnx, model)
    nodes = [(i, n) for i, n in enumerate(model.graph.node) if _is_recurrent(n)]
    _check_recurrent(onnx, model, [n for _, n in nodes])
    static = _Static(onnx, model)
    layers = []
    for index, node in nodes:
        slots = front.INPUTS[node.op_type]
        values = {}
        for slot, name in zip(slots, node.input):
            if not name:
                continue
            try:
                values[slot] = static.get(name)
            except _Unresolved as e:
                if slot in ("X", "sequence_lens", "initial_h", "initial_c"):
                    continue            # run-time inputs
                raise ValueError(
                    f"recurrent_layers: {_describe(node)} (graph node {index}): its {slot} "
                    f"input {name!r} cannot be resolved statically: {name!r} ← {e}.  Give "
                    f"the weights as initializers (or Constant nodes), or run the model with "
                    f"cgru.onnx.run, which computes such nodes at run time") from None
        for slot in ("W", "R"):
            if slot not in values:
                raise ValueError(f"recurrent_layers: {_describe(node)} (graph node {index}) "
                                 f"has no {slot} input")
        values.pop("X", None)
        try:
            layers.append(front._layer(node.op_type, node, index, values,
                                       _attributes(onnx, node)))
        except (ValueError, TypeError) as e:
            raise type(e)(f"recurrent_layers: {_describe(node)} (graph node {index}): "
                          f"{e}") from e
    return layers
