"""Whole ONNX models for ``cgru.onnx``: ``run`` (cgru's recurrent nodes inside the ``onnx``
reference evaluator) and ``recurrent_layers`` (the recurrent nodes' weights, resolved
statically, as ``RecurrentLayer`` values).

How ``run_model`` splits a graph: ``onnx.reference.ReferenceEvaluator`` runs the model, with
``new_ops`` overriding the standard ``GRU``, ``LSTM`` and ``RNN`` (domain ``""``) by classes
that call ``cgru.onnx.gru`` / ``lstm`` / ``rnn``; the evaluator passes ``new_ops`` on to the
bodies of ``If``/``Loop``/``Scan``, and local functions are inlined first (the evaluator would
run a function's body without them).  Empty output names of a recurrent node are renamed in a
copy of the model: the evaluator stores every output by name, and an output called ``""``
would overwrite the value it hands to omitted optional inputs.

A model is untrusted input (``load_model``): its structure, its tensors and its external
data are checked before anything walks, folds or runs it — without recursion, and without
allocating what it merely declares; ``_size_guards`` wrap the evaluator's nodes whose output
size is given by value.
"""
from dataclasses import dataclass
import math
import os
import stat

import numpy as np

from cgru.onnx import operators as front
from cgru.core import validate

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


# --- intake: a model is untrusted input ----------------------------------------------------
# Subgraphs (If/Loop/Scan bodies) nested deeper than this are refused before anything walks
# them; a serialized model cannot nest much deeper anyway (protobuf's parser stops at 100
# message levels, three per subgraph).
MAX_GRAPH_DEPTH = 32
# the TensorProto fields that hold values (besides raw_data)
_VALUE_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data",
                 "uint64_data")
# sub-byte element types: bits per element, packed in raw_data and in int32_data alike
_PACKED_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2,
                "FLOAT6E2M3": 6, "FLOAT6E3M2": 6}


def load_model(onnx, model, base_dir=None):
    """The checked ``ModelProto`` of a path, serialized bytes or a ``ModelProto``, its external
    data read in (into a copy: a ``ModelProto`` given is never modified).

    ``ValueError`` for anything wrong with the model — bytes that do not parse, a path that is
    not a regular file, a graph that is not well formed (``_check_structure``), a tensor whose
    data does not match its type and shape (``_check_tensor``), external data that is not
    allowed or not confined to its directory (``_external_bytes``); ``TypeError`` for an
    argument of another Python type.  External data is read relative to ``base_dir`` when
    given, else to the model file's directory; a model given as bytes or a ``ModelProto``
    has none, so it may use external data only with ``base_dir``."""
    base_dir = _base_dir(base_dir)
    if isinstance(model, onnx.ModelProto):
        proto, origin, home, owned = model, "an onnx.ModelProto", None, False
    elif isinstance(model, bytes):
        proto = _parse(onnx, model, f"{len(model)} bytes", None)
        origin, home, owned = "bytes", None, True
    elif isinstance(model, (str, os.PathLike)):
        path = os.fsdecode(os.fspath(model))
        proto = _parse(onnx, _read_model_file(path), f"file {path!r}", path)
        origin, home, owned = f"the file {path!r}", os.path.dirname(os.path.abspath(path)), True
    else:
        raise TypeError(f"model: expected a path, serialized bytes or an onnx.ModelProto, got "
                        f"{type(model).__name__}")
    if not proto.HasField("graph"):
        raise ValueError(f"model: {origin} holds no graph (not an ONNX model, or an empty one)")
    _check_structure(onnx, proto)
    proto = _with_external_data(onnx, proto, base_dir if base_dir is not None else home,
                                origin, owned)
    for tensor, where in _tensors(onnx, proto):
        _check_tensor(onnx, tensor, where)
    for sparse, where in _sparse_tensors(onnx, proto):
        _check_sparse(onnx, sparse, where)
    return proto


def _base_dir(base_dir):
    """``base_dir`` checked: None, or the path of an existing directory."""
    if base_dir is None:
        return None
    if not isinstance(base_dir, (str, os.PathLike)):
        raise TypeError(f"base_dir: expected None or a directory path, got "
                        f"{type(base_dir).__name__}")
    path = os.fsdecode(os.fspath(base_dir))
    if not os.path.isdir(path):
        raise ValueError(f"base_dir: expected an existing directory, got {path!r}")
    return path


def _file_kind(mode):
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


def _open_regular(path, flags=0):
    """``(file, stat)`` of ``path`` opened for reading; ``ValueError`` whose message is what
    the path is instead (``"a directory"``, ``"a FIFO"``, …) when it is not a regular file.
    Opened without blocking, so a FIFO cannot hang the call."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
                 | flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(_file_kind(st.st_mode))
        return os.fdopen(fd, "rb"), st
    except BaseException:
        os.close(fd)
        raise


def _read_model_file(path):
    """The bytes of the model file ``path`` (``FileNotFoundError`` when there is none)."""
    try:
        f, _ = _open_regular(path)
    except IsADirectoryError:
        kind = "a directory"
    except ValueError as e:
        kind = str(e)
    else:
        with f:
            return f.read()
    raise ValueError(f"model: {path!r} is {kind}, not an ONNX file")


def _parse(onnx, data, what, path):
    """The ``ModelProto`` that ``data`` serializes — protobuf, or the text format that the
    file name's extension names (as ``onnx.load`` chooses it)."""
    fmt = None
    if path is not None:
        import onnx.serialization
        fmt = onnx.serialization.registry.get_format_from_file_extension(
            os.path.splitext(path)[1])
    try:
        if fmt is None or fmt == "protobuf":
            proto = onnx.ModelProto()
            proto.ParseFromString(data)
            return proto
        return onnx.load_model_from_string(data, format=fmt)
    except Exception as e:          # noqa: BLE001 — every parser error means the same here
        hint = ""
        if "depth" in str(e).lower():
            hint = "; its messages nest deeper than protobuf's parser allows"
        raise ValueError(f"model: cannot parse {what} as an ONNX model ({type(e).__name__}: "
                         f"{e}){hint}") from None


def _is_recurrent(node):
    return node.op_type in RECURRENT and node.domain in _DEFAULT_DOMAINS


def _named_subgraphs(onnx, node):
    """``(attribute name, graph)`` for every subgraph of ``node`` (If branches, Loop and Scan
    bodies, any GRAPH/GRAPHS attribute)."""
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.name, a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            for i, g in enumerate(a.graphs):
                yield f"{a.name}[{i}]", g


def _subgraphs(onnx, node):
    for _, g in _named_subgraphs(onnx, node):
        yield g


def _walk(onnx, graph):
    """Every node of ``graph`` and of the graphs nested in its nodes' attributes, depth first,
    without recursion (the depth is bounded by ``_check_structure``)."""
    stack = [iter(graph.node)]
    while stack:
        node = next(stack[-1], None)
        if node is None:
            stack.pop()
            continue
        yield node
        for g in reversed(list(_subgraphs(onnx, node))):
            stack.append(iter(g.node))


def _subgraph_where(attr, node, where, depth):
    """How a message names the subgraph ``attr`` of ``node`` in the body ``where``, at nesting
    ``depth`` (the enclosing chain spelled out only near the main graph)."""
    if depth <= 3:
        return f"the {attr} of {_describe(node)} in {where}"
    return f"the {attr} of {_describe(node)}, {depth} subgraphs deep"


def _bodies(onnx, model):
    """``(body, where)`` for every graph and local-function body of ``model`` (``body`` a
    ``GraphProto`` or ``FunctionProto``; ``where`` names it for messages), without
    recursion."""
    stack = [(model.graph, "the main graph", 0)]
    stack += [(f, f"local function {f.domain}::{f.name}", 0) for f in reversed(model.functions)]
    while stack:
        body, where, depth = stack.pop()
        yield body, where
        for node in body.node:
            for name, g in _named_subgraphs(onnx, node):
                stack.append((g, _subgraph_where(name, node, where, depth + 1), depth + 1))


# structure: what a well-formed graph is, checked before anything walks or runs it
def _check_structure(onnx, model):
    """Refuse a model whose graphs are not well formed, before any recursion, evaluation or
    static folding: subgraphs nested deeper than ``MAX_GRAPH_DEPTH``; a value assigned twice
    in one graph; a node that reads a value before it is computed (a cycle, or nodes out of
    ONNX's topological order) or that nothing provides; a graph output that nothing
    computes; a node of the main graph whose domain the model does not import; local
    functions defined twice or calling themselves (directly or through each other)."""
    functions = _check_functions(onnx, model)
    domains = {o.domain or "" for o in model.opset_import} | {d for d, _ in functions}
    if "ai.onnx" in domains:
        domains.add("")
    for node in model.graph.node:
        if (node.domain or "") not in domains:
            raise ValueError(f"model: {_describe(node)} in the main graph is of domain "
                             f"{node.domain!r}, which the model's opset_import does not list "
                             f"(it lists {sorted(domains)})")
    stack = [(model.graph, "the main graph", frozenset(), 0)]
    stack += [(f, f"local function {f.domain}::{f.name}", frozenset(), 0)
              for f in model.functions]
    while stack:
        body, where, outer, depth = stack.pop()
        for sub, sub_where, visible in _check_body(onnx, body, where, outer, depth + 1):
            if depth + 1 > MAX_GRAPH_DEPTH:
                raise ValueError(f"model: subgraphs nest deeper than {MAX_GRAPH_DEPTH} levels "
                                 f"({sub_where})")
            stack.append((sub, sub_where, visible, depth + 1))


def _names_in(onnx, body):
    """``(inputs, initializers, outputs)``: the names a graph or function body takes, defines
    before its first node, and gives back."""
    if isinstance(body, onnx.FunctionProto):
        return list(body.input), [], list(body.output)
    inits = [t.name for t in body.initializer] + \
        [t.values.name for t in body.sparse_initializer]
    return [i.name for i in body.input], inits, [o.name for o in body.output]


def _check_body(onnx, body, where, outer, sub_depth):
    """Check one graph or function body (``outer``: the names its enclosing graphs make
    visible to it); returns ``[(subgraph, where, visible names)]`` to check next (at
    ``sub_depth``)."""
    own = {}
    inputs, inits, outputs = _names_in(onnx, body)

    def define(name, what):
        if name in own:
            raise ValueError(f"model: {where} defines {name!r} twice (as {own[name]} and as "
                             f"{what}); ONNX assigns each value once")
        own[name] = what

    for name in inputs:
        define(name, "an input")
    for name in inits:
        if own.get(name) != "an input":
            define(name, "an initializer")
    producer = {o: n for n in body.node for o in n.output if o}
    children = []
    for node in body.node:
        for name in node.input:
            if name and name not in own and name not in outer:
                raise ValueError(_unavailable(node, name, where, producer.get(name)))
        for attr, g in _named_subgraphs(onnx, node):
            children.append((g, _subgraph_where(attr, node, where, sub_depth),
                             outer | frozenset(own)))
        for name in node.output:
            if name:
                define(name, f"an output of {_describe(node)}")
    for name in outputs:
        if name not in own and name not in outer:
            raise ValueError(f"model: {where} has the output {name!r}, which no node, input or "
                             f"initializer provides")
    return children


def _unavailable(node, name, where, later):
    if later is not None:
        return (f"model: {_describe(node)} in {where} reads {name!r} before {_describe(later)} "
                f"computes it: the nodes form a cycle or are out of topological order (ONNX "
                f"lists each node after the nodes whose outputs it reads)")
    return (f"model: {_describe(node)} in {where} reads {name!r}, which no node, input or "
            f"initializer provides")


def _check_functions(onnx, model):
    """The ``(domain, name)`` of the model's local functions, refused when one is defined
    twice or when they call each other in a cycle (inlining them would never end)."""
    functions = {}
    for f in model.functions:
        key = (f.domain, f.name, getattr(f, "overload", ""))
        if key in functions:
            raise ValueError(f"model: local function {f.domain}::{f.name} is defined twice")
        functions[key] = f
    keys = {(d, n) for d, n, _ in functions}
    calls = {}
    for (d, n, _), f in functions.items():
        callees = calls.setdefault((d, n), set())
        stack = [f.node]
        while stack:
            for node in stack.pop():
                if (node.domain, node.op_type) in keys:
                    callees.add((node.domain, node.op_type))
                stack.extend(g.node for g in _subgraphs(onnx, node))
    _refuse_call_cycles(calls)
    return keys


def _refuse_call_cycles(calls):
    """``ValueError`` naming a cycle of ``calls`` (``{function: called functions}``), found by
    a depth-first search without recursion."""
    done = set()
    for start in sorted(calls):
        if start in done:
            continue
        path, stack = [start], [iter(sorted(calls[start]))]
        while stack:
            callee = next(stack[-1], None)
            if callee is None:
                done.add(path.pop())
                stack.pop()
            elif callee in path:
                cycle = path[path.index(callee):] + [callee]
                text = " → ".join(f"{d}::{n}" for d, n in cycle)
                raise ValueError(f"model: local functions call themselves ({text}); a function "
                                 f"may not be recursive")
            elif callee not in done:
                path.append(callee)
                stack.append(iter(sorted(calls.get(callee, ()))))


# tensors: every TensorProto of a model, and what its data must be
def _attribute_tensors(attribute, where):
    if attribute.HasField("t"):
        yield attribute.t, f"the tensor of attribute {attribute.name!r} of {where}"
    for i, t in enumerate(attribute.tensors):
        yield t, f"tensor {i} of attribute {attribute.name!r} of {where}"


def _attribute_sparse(attribute, where):
    if attribute.HasField("sparse_tensor"):
        yield attribute.sparse_tensor, f"the sparse tensor of attribute {attribute.name!r} " \
                                       f"of {where}"
    for i, t in enumerate(attribute.sparse_tensors):
        yield t, f"sparse tensor {i} of attribute {attribute.name!r} of {where}"


def _sparse_tensors(onnx, model):
    """``(SparseTensorProto, where)`` for every sparse tensor of ``model``."""
    for body, where in _bodies(onnx, model):
        for t in getattr(body, "sparse_initializer", ()):
            yield t, f"sparse initializer {t.values.name!r} of {where}"
        for node in body.node:
            for a in node.attribute:
                yield from _attribute_sparse(a, f"{_describe(node)} in {where}")


def _tensors(onnx, model):
    """``(TensorProto, where)`` for every tensor of ``model``: initializers, node attributes,
    the values and indices of sparse tensors — in every graph and function."""
    for body, where in _bodies(onnx, model):
        for t in getattr(body, "initializer", ()):
            yield t, f"initializer {t.name!r} of {where}"
        for node in body.node:
            for a in node.attribute:
                yield from _attribute_tensors(a, f"{_describe(node)} in {where}")
    for sparse, where in _sparse_tensors(onnx, model):
        yield sparse.values, f"the values of {where}"
        if sparse.HasField("indices"):
            yield sparse.indices, f"the indices of {where}"


def _element_type(onnx, tensor, where):
    """``(name, numpy dtype, value field, bits per element or None)`` of a tensor's
    ``data_type``; ``ValueError`` for an unknown or undefined one."""
    dt = tensor.data_type
    try:
        if dt == onnx.TensorProto.UNDEFINED:
            raise ValueError
        name = onnx.TensorProto.DataType.Name(dt)
        np_dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dt))
        field = onnx.helper.tensor_dtype_to_field(dt)
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"model: {where} has data_type {dt}, which is not an ONNX element "
                         f"type (that the installed onnx package knows)") from None
    return name, np_dtype, field, _PACKED_BITS.get(name)


def _elements(dims, where):
    """The element count of a declared shape (a Python int: no overflow)."""
    if any(d < 0 for d in dims):
        raise ValueError(f"model: {where} has a negative dimension in its shape {list(dims)}")
    return math.prod(dims)


def _check_tensor(onnx, tensor, where):
    """Refuse a tensor whose data does not match its declared element type and shape — one
    data field, holding exactly the values the shape declares — before anything converts it
    (a huge declared shape with little data is refused here, not allocated)."""
    if tensor.HasField("segment"):
        raise ValueError(f"model: {where} is a segment of a tensor; segmented tensors are not "
                         f"supported")
    name, np_dtype, field, bits = _element_type(onnx, tensor, where)
    count = _elements(tensor.dims, where)
    used = [f for f in _VALUE_FIELDS if len(getattr(tensor, f))]
    if tensor.HasField("raw_data"):
        used.append("raw_data")
    if len(used) > 1:
        raise ValueError(f"model: {where} holds values in {len(used)} fields ({', '.join(used)});"
                         f" a tensor has one")
    shape = f"shape {list(tensor.dims)} ({count} {name} elements)"
    if not used:
        if count:
            raise ValueError(f"model: {where} declares {shape} but holds no data")
        return
    if used[0] == "raw_data":
        if name == "STRING":
            raise ValueError(f"model: {where} is a STRING tensor with raw_data; strings are "
                             f"kept in string_data")
        want = -(-count * (bits or 8 * np_dtype.itemsize) // 8)
        got, unit = len(tensor.raw_data), "bytes of raw_data"
    elif used[0] != field:
        raise ValueError(f"model: {where} is a {name} tensor with its values in {used[0]}; "
                         f"{name} values are kept in {field} (or raw_data)")
    else:
        want = -(-count * bits // 8) if bits else count * (2 if np_dtype.kind == "c" else 1)
        got, unit = len(getattr(tensor, field)), f"{field} entries"
    if got != want:
        raise ValueError(f"model: {where} declares {shape}, which take {want} {unit}, but "
                         f"holds {got}")


def memory_limit():
    """The machine's physical memory in bytes: no tensor a model declares may be larger (such
    a tensor could not be computed; allocating it would fail or exhaust the machine)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return validate.MAX_BYTES


def _check_sparse(onnx, sparse, where):
    """A sparse tensor's dense shape is checked like a dense tensor's (it is made dense when
    used): no negative dimension, and no larger than the machine's memory."""
    _, np_dtype, _, _ = _element_type(onnx, sparse.values, f"the values of {where}")
    _elements(sparse.dims, where)
    message = _oversize(list(sparse.dims), np_dtype.itemsize)
    if message:
        raise ValueError(f"model: {where} {message}")


# external data: read from confined files only
def _is_external(onnx, tensor):
    return tensor.HasField("data_location") and \
        tensor.data_location == onnx.TensorProto.EXTERNAL


def _with_external_data(onnx, model, base, origin, owned):
    """``model`` with every external tensor's bytes read into ``raw_data`` (in a copy unless
    ``owned``); ``ValueError`` when it has external data and no ``base`` directory."""
    external = [(t, where) for t, where in _tensors(onnx, model) if _is_external(onnx, t)]
    if not external:
        return model
    if base is None:
        tensor, where = external[0]
        location = _external_info(tensor, where).get("location", "")
        raise ValueError(f"model: {where} keeps its data in the external file {location!r}, "
                         f"and a model given as {origin} has no directory of its own: pass "
                         f"base_dir= (the directory its external data is confined to)")
    if not owned:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
        external = [(t, w) for t, w in _tensors(onnx, model) if _is_external(onnx, t)]
    root = os.path.realpath(base)
    for tensor, where in external:
        tensor.raw_data = _external_bytes(tensor, where, root)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    return model


def _external_info(tensor, where):
    """A tensor's ``external_data`` entries as a dict (a key given twice is refused)."""
    info = {}
    for entry in tensor.external_data:
        if entry.key in info:
            raise ValueError(f"model: {where} gives its external-data key {entry.key!r} twice")
        info[entry.key] = entry.value
    return info


def _external_int(info, key, where):
    """The external-data ``offset``/``length`` of a tensor: None, or an int ≥ 0."""
    value = info.get(key)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"model: {where} has the external-data {key} {value!r}; expected an "
                         f"integer ≥ 0") from None
    if number < 0:
        raise ValueError(f"model: {where} has the external-data {key} {number}; expected an "
                         f"integer ≥ 0")
    return number


def _confined(location, root, where):
    """The path of the external-data file ``location`` inside the directory ``root`` (a real
    path), refused — as onnx refuses it — when it is empty or absolute, when it is a symbolic
    link, or when, symbolic links and ``..`` resolved, it lies outside ``root``."""
    said = f"model: {where} keeps its data in {location!r}"
    if not location or "\0" in location:
        raise ValueError(f"{said}: expected a file name relative to the model's directory")
    if os.path.isabs(location) or os.path.splitdrive(location)[0] or \
            location.startswith(("/", "\\")):
        raise ValueError(f"{said}, an absolute path: external data must be given relative to "
                         f"the model's directory ({root!r})")
    parts = os.path.normpath(location).replace("\\", "/").split("/")
    if ".." in parts:
        raise ValueError(f"{said}, which leads out of the model's directory ({root!r}) through "
                         f"'..': external data must lie inside it")
    path = os.path.join(root, location)
    if os.path.islink(path):
        raise ValueError(f"{said}, a symbolic link: external data must be a regular file "
                         f"inside {root!r}")
    resolved = os.path.realpath(path)
    if os.path.commonpath([root, resolved]) != root:
        raise ValueError(f"{said}, which resolves to {resolved!r}, outside the directory "
                         f"{root!r} that external data is confined to")
    return resolved


def _external_bytes(tensor, where, root):
    """The bytes of one external tensor, from its file inside ``root``: ``offset`` and
    ``length`` within the file, the file regular, not a symbolic link (nor followed when
    opened) and not a hard link (one link only, as onnx requires)."""
    info = _external_info(tensor, where)
    location = info.get("location", "")
    path = _confined(location, root, where)
    offset = _external_int(info, "offset", where) or 0
    length = _external_int(info, "length", where)
    said = f"model: {where} keeps its data in {location!r}"
    try:
        f, st = _open_regular(path, getattr(os, "O_NOFOLLOW", 0))
    except ValueError as e:
        raise ValueError(f"{said}, which is {e}, not a regular file") from None
    except OSError as e:
        raise ValueError(f"{said}, which cannot be opened ({e.strerror or e})") from None
    with f:
        if st.st_nlink > 1:
            raise ValueError(f"{said}, a file with {st.st_nlink} hard links: external data "
                             f"must be a file of its own")
        if offset > st.st_size:
            raise ValueError(f"{said} at offset {offset}, past the end of the file "
                             f"({st.st_size} bytes)")
        if length is None:
            length = st.st_size - offset
        elif offset + length > st.st_size:
            raise ValueError(f"{said}: {length} bytes at offset {offset}, past the end of the "
                             f"file ({st.st_size} bytes)")
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise ValueError(f"{said}: read {len(data)} of {length} bytes (the file changed)")
    return data


def _describe(node):
    return f"{node.op_type} node {node.name!r}" if node.name else f"an unnamed {node.op_type} node"


# attribute -> the AttributeProto type the GRU/LSTM/RNN schemas give it
_ATTRIBUTE_TYPES = {"hidden_size": "INT", "direction": "STRING", "activations": "STRINGS",
                    "activation_alpha": "FLOATS", "activation_beta": "FLOATS", "clip": "FLOAT",
                    "layout": "INT", "linear_before_reset": "INT", "input_forget": "INT"}


def _type_name(onnx, attribute_type):
    try:
        return onnx.AttributeProto.AttributeType.Name(attribute_type)
    except ValueError:
        return f"unknown type {attribute_type}"


def _attributes(onnx, node):
    """The node's attributes, checked against its operator (names and AttributeProto types);
    names decoded to ``str``."""
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
        if a.name in out:
            raise ValueError(f"model: {_describe(node)} gives its attribute {a.name!r} twice")
        want = _ATTRIBUTE_TYPES[a.name]
        if a.type != getattr(onnx.AttributeProto, want):
            raise ValueError(f"model: {_describe(node)}: attribute {a.name!r} is of type "
                             f"{_type_name(onnx, a.type)}; an ONNX {node.op_type}'s "
                             f"{a.name} is {want}")
        value = onnx.helper.get_attribute_value(a)
        if isinstance(value, list):
            value = [validate.text(v) for v in value]
        out[a.name] = validate.text(value)
    return out


def _default_opset(model):
    versions = [o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS]
    return versions[0] if versions else None


def _check_arity(node):
    """A recurrent node has at most its operator's inputs and outputs, and names X, W, R."""
    slots, outs = front.INPUTS[node.op_type], front.OUTPUTS[node.op_type]
    if len(node.input) > len(slots):
        raise ValueError(f"model: {_describe(node)} has {len(node.input)} inputs; an ONNX "
                         f"{node.op_type} takes at most {len(slots)} ({', '.join(slots)})")
    if len(node.output) > len(outs):
        raise ValueError(f"model: {_describe(node)} has {len(node.output)} outputs; an ONNX "
                         f"{node.op_type} gives at most {len(outs)} ({', '.join(outs)})")
    given = list(node.input) + [""] * 3
    for slot, name in zip(slots[:3], given):
        if not name:
            raise ValueError(f"model: {_describe(node)} has no {slot} input (an ONNX "
                             f"{node.op_type} requires X, W and R)")


def _check_recurrent(onnx, model, nodes):
    """Refuse recurrent nodes of opsets before 7, with too many inputs or outputs, without
    X, W or R, or with unknown or mistyped attributes — before any work."""
    opset = _default_opset(model)
    for node in nodes:
        if opset is not None and opset < 7:
            older = {"GRU": "GRU-1/GRU-3", "LSTM": "LSTM-1", "RNN": "RNN-1"}[node.op_type]
            raise ValueError(f"model: {older} (opset {opset} < 7) are not supported; re-export "
                             f"the model with opset ≥ 7")
        _check_arity(node)
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


_LOOP = []


def _loop_op():
    """The reference evaluator's ``Loop`` with ONNX's shape for its scan outputs: it stacks each
    iteration's value with ``np.vstack``, which gives ``[n, 1]`` for scalars and ``[n·a, b]`` for
    ``[a, b]`` values where ONNX (and onnxruntime) give ``[n]`` and ``[n, a, b]``; the values,
    in the same order, are reshaped to ``[n, *shape of one iteration]``.  (A loop that runs no
    iteration and has scan outputs still fails in the evaluator, with its own message.)"""
    if not _LOOP:
        from onnx.reference.ops.op_loop import Loop as ReferenceLoop

        class Loop(ReferenceLoop):
            op_domain = ""

            def __init__(self, onnx_node, run_params):
                super().__init__(onnx_node, run_params)
                run_body = self._run_body       # set on the instance by OpRun, for `body`

                def recorded(inputs, attributes=None, bindings=None):
                    outputs = run_body(inputs, attributes=attributes, bindings=bindings)
                    if self.K > 0:
                        self._iterations.append([np.shape(o) for o in outputs[-self.K:]])
                    return outputs
                self._run_body = recorded
                self._iterations = []

            def _run(self, *args, **kwargs):
                self._iterations = []
                res = super()._run(*args, **kwargs)
                if self.K == 0 or not self._iterations:
                    return res
                n, shapes = len(self._iterations), self._iterations[-1]
                if any(s != shapes for s in self._iterations):
                    raise ValueError(f"Loop: scan outputs of different shapes in different "
                                     f"iterations ({self._iterations[0]}, {shapes})")
                res = list(res)
                for k, shape in enumerate(shapes):
                    i = len(res) - self.K + k
                    res[i] = np.reshape(res[i], (n,) + tuple(shape))
                return tuple(res)

        Loop.__module__ = __name__
        _LOOP.append(Loop)
    return _LOOP


# nodes whose output size a model states by value (an input or an attribute), not by the size
# of an input: the reference evaluator would allocate whatever they declare
def _ints(a):
    return [int(v) for v in np.asarray(a).ravel()]


def _size_constant_of_shape(onnx, node, inputs):
    value = _node_attributes(onnx, node).get("value")
    itemsize = 4 if value is None else onnx.numpy_helper.to_array(value).itemsize
    return _ints(inputs[0]), itemsize


def _size_expand(onnx, node, inputs):
    data, shape = inputs[:2]
    return list(np.broadcast_shapes(data.shape, tuple(_ints(shape)))), data.itemsize


def _size_tile(onnx, node, inputs):
    x, repeats = inputs[:2]
    repeats = _ints(repeats)
    if len(repeats) != x.ndim:
        return None
    return [d * r for d, r in zip(x.shape, repeats)], x.itemsize


def _size_range(onnx, node, inputs):
    start, limit, delta = (np.asarray(v).item() for v in inputs[:3])
    if delta == 0:
        return None
    count = (limit - start) / delta
    count = math.ceil(count) if math.isfinite(count) else math.inf
    return [max(count, 0)], np.asarray(inputs[0]).itemsize


def _size_one_hot(onnx, node, inputs):
    indices, depth, values = inputs[:3]
    return list(np.shape(indices)) + _ints(depth)[:1], np.asarray(values).itemsize


def _size_random(onnx, node, inputs):
    attrs = _node_attributes(onnx, node)
    dtype = attrs.get("dtype", onnx.TensorProto.FLOAT)
    return list(attrs["shape"]), np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype)).itemsize


_DECLARED_SIZE = {"ConstantOfShape": _size_constant_of_shape, "Expand": _size_expand,
                  "Tile": _size_tile, "Range": _size_range, "OneHot": _size_one_hot,
                  "RandomNormal": _size_random, "RandomUniform": _size_random}


def _node_attributes(onnx, node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _oversize(shape, itemsize):
    """How a message says that a tensor of ``shape`` (elements of ``itemsize`` bytes) is larger
    than the machine's memory (``memory_limit``); None when it is not."""
    if any(d < 0 for d in shape):
        return None                  # not a size: the node's own implementation refuses it
    nbytes = math.prod(shape) * itemsize
    limit = memory_limit()
    if nbytes <= limit:
        return None
    return (f"declares a tensor of shape {list(shape)} ({nbytes} bytes), larger than this "
            f"machine's memory ({limit} bytes)")


def _check_declared_output(onnx, node, inputs):
    """``NodeError`` when a size-by-value node would make an output larger than the machine's
    memory — before its implementation allocates it."""
    try:
        declared = _DECLARED_SIZE[node.op_type](onnx, node, inputs)
    except Exception:           # noqa: BLE001 — malformed inputs: the implementation says so
        declared = None
    message = None if declared is None else _oversize(*declared)
    if message:
        raise NodeError(node, ValueError(message))


_GUARDS = []


def _size_guards():
    """``OpRun`` classes named like the nodes of ``_DECLARED_SIZE`` (domain ``""``) that check
    the size of their output and then run the reference evaluator's own implementation (of
    the model's opset): more of the evaluator's ``new_ops`` (made once, on first use)."""
    if not _GUARDS:
        from onnx.reference.op_run import OpRun
        from onnx.reference.ops import load_op
        onnx = import_onnx()

        def __init__(self, onnx_node, run_params, schema=None):
            OpRun.__init__(self, onnx_node, run_params, schema)
            version = run_params["opsets"].get(onnx_node.domain or "")
            self.implementation = load_op("", onnx_node.op_type, version)(onnx_node,
                                                                          run_params)

        def run(self, *inputs, **kwargs):
            _check_declared_output(onnx, self.onnx_node, inputs)
            return self.implementation.run(*inputs, **kwargs)

        def _run(self, *inputs, **kwargs):
            return self.implementation._run(*inputs, **kwargs)

        for op_type in _DECLARED_SIZE:
            _GUARDS.append(type(op_type, (OpRun,), {
                "op_domain": "", "__init__": __init__, "run": run, "_run": _run,
                "__module__": __name__}))
    return _GUARDS


def _prepared(onnx, model):
    """A copy of ``model`` ready for the evaluator: local functions inlined, and recurrent
    nodes' empty output names replaced by fresh ones."""
    model_copy = onnx.ModelProto()
    model_copy.CopyFrom(model)
    if model_copy.functions:
        import onnx.inliner
        try:
            model_copy = onnx.inliner.inline_local_functions(model_copy)
        except Exception as e:      # noqa: BLE001 — onnx's checker and inliner errors vary
            raise ValueError(f"model: its local functions cannot be inlined "
                             f"({type(e).__name__}: {e})") from None
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


def _output_names(graph, feeds, outputs):
    """The names ``run`` returns: the graph's outputs, or ``outputs`` checked."""
    if outputs is None:
        return [o.name for o in graph.output]
    if isinstance(outputs, (str, bytes)) or not hasattr(outputs, "__iter__"):
        raise TypeError(f"outputs: expected None or a list of value names, got {outputs!r}")
    names = list(outputs)
    known = {o for n in graph.node for o in n.output if o} | set(feeds) | \
        {t.name for t in graph.initializer} | {i.name for i in graph.input}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"outputs: {unknown} are not values of the graph (its outputs are "
                         f"{[o.name for o in graph.output]})")
    return names


_EVALUATOR_NOTE = ("cgru.onnx.run computes the GRU, LSTM and RNN nodes itself and every other "
                   "node with onnx.reference.ReferenceEvaluator")


def _evaluator(onnx, model):
    """The reference evaluator of ``model`` with cgru's recurrent nodes and the size guards;
    whatever it cannot load is the model's error (``ValueError``)."""
    from onnx.reference import ReferenceEvaluator
    if len(model.graph.sparse_initializer):
        raise ValueError(f"model: the main graph has sparse initializers "
                         f"({model.graph.sparse_initializer[0].values.name!r}, …), which "
                         f"the reference evaluator cannot load; {_EVALUATOR_NOTE}")
    prepared = _prepared(onnx, model)
    try:
        return ReferenceEvaluator(prepared, new_ops=_cgru_ops() + _size_guards() + _loop_op())
    except NotImplementedError as e:
        raise front.UnsupportedNodeError(f"model: {e} — {_EVALUATOR_NOTE}, which has no "
                                   f"implementation for this one") from e
    except Exception as e:          # noqa: BLE001 — the evaluator's errors vary by node
        raise ValueError(f"model: the reference evaluator cannot load it ({type(e).__name__}: "
                         f"{e})") from e


def _evaluate(evaluator, names, feeds):
    """``evaluator.run``: an error of a recurrent node (or of a size guard) keeps its type and
    names the node; any other error of the evaluator is the model's (``ValueError``)."""
    try:
        return evaluator.run(names, feeds)
    except NodeError as e:
        error = e.error
        raise type(error)(f"{_describe(e.node)}: {error}") from error
    except NotImplementedError as e:
        raise front.UnsupportedNodeError(f"model: {e} — {_EVALUATOR_NOTE}") from e
    except Exception as e:          # noqa: BLE001 — the evaluator's errors vary by node
        raise ValueError(f"model: the reference evaluator failed on a node other than GRU, "
                         f"LSTM and RNN ({type(e).__name__}: {e})") from e


def _run_model(model, inputs, outputs=None, base_dir=None):
    onnx = import_onnx()
    model = load_model(onnx, model, base_dir)
    graph = model.graph
    _check_recurrent(onnx, model, [n for n in _walk(onnx, graph) if _is_recurrent(n)]
                     + [n for f in model.functions for n in f.node if _is_recurrent(n)])
    feeds = _feeds(onnx, graph, inputs)
    names = _output_names(graph, feeds, outputs)
    values = _evaluate(_evaluator(onnx, model), names, feeds)
    return dict(zip(names, values))


# --- recurrent_layers ----------------------------------------------------------------------
class _Unresolved(Exception):
    pass


class _Static:
    """The values of a graph that do not depend on its run-time inputs, computed on demand
    (each node once, by the reference evaluator) without recursion: the graph is acyclic and
    in topological order (``_check_structure``), so a chain of any length resolves."""

    def __init__(self, onnx, model):
        self.onnx = onnx
        graph = model.graph
        self.opsets = {(o.domain or ""): o.version for o in model.opset_import}
        self.values = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
        self.inputs = {i.name for i in graph.input} - set(self.values)
        self.producer = {o: n for n in graph.node for o in n.output if o}
        # name -> (why it is dynamic, the name it depends on that is dynamic too, or None)
        self.failed = {}

    def get(self, name):
        """The value of ``name``; ``_Unresolved`` with the chain that makes it dynamic."""
        pending = [name]
        while pending:
            current = pending[-1]
            if current in self.values or current in self.failed:
                pending.pop()
                continue
            node = self.producer.get(current)
            reason = self._dynamic(current, node)
            if reason is not None:
                self.failed[current] = (reason, None)
                pending.pop()
                continue
            missing = [i for i in node.input
                       if i and i not in self.values and i not in self.failed]
            if missing:
                pending.extend(missing)
                continue
            pending.pop()
            self._fold(node)
        if name in self.failed:
            raise _Unresolved(self.chain(name))
        return self.values[name]

    def chain(self, name, shown=12):
        """``A ← B ← … ← why``: how ``name`` depends on a run-time value (long chains cut)."""
        links, current = [], name
        while current is not None:
            text, current = self.failed[current]
            links.append(text)
        if len(links) > shown:
            links = links[:shown - 1] + [f"… ({len(links) - shown} more) …", links[-1]]
        return " ← ".join(links)

    def _dynamic(self, name, node):
        """Why ``name`` cannot be known statically by itself, or None."""
        if name in self.inputs:
            return f"graph input {name!r} (not an initializer: its value comes at run time)"
        if node is None:
            return f"{name!r}, which no initializer, graph input or node provides"
        here = _describe(node)
        if node.op_type in _RANDOM:
            return f"{here} (random values)"
        if list(_subgraphs(self.onnx, node)):
            return f"{here} (control flow with a subgraph)"
        if _is_recurrent(node):
            return f"{here} (a recurrent node's output)"
        return None

    def _fold(self, node):
        """Compute ``node`` from its static inputs (or mark its outputs dynamic)."""
        here = _describe(node)
        outputs = [o for o in node.output if o]
        dynamic = next((i for i in node.input if i in self.failed), None)
        if dynamic is not None:
            for o in outputs:
                self.failed[o] = (here, dynamic)
            return
        args = {i: self.values[i] for i in node.input if i}
        h = self.onnx.helper
        graph = h.make_graph([node], "static", [h.make_empty_tensor_value_info(i) for i in args],
                             [h.make_empty_tensor_value_info(o) for o in outputs])
        from onnx.reference import ReferenceEvaluator
        try:
            outs = ReferenceEvaluator(graph, opsets=self.opsets,
                                      new_ops=_size_guards()).run(None, args)
        except Exception as e:          # noqa: BLE001 — the evaluator's errors vary by node
            if isinstance(e, NodeError):
                e = e.error
            reason = (f"{here}, which the reference evaluator could not compute statically "
                      f"({type(e).__name__}: {e})")
            for o in outputs:
                self.failed[o] = (reason, None)
            return
        for o, v in zip(outputs, outs):
            self.values[o] = np.asarray(v)


def _recurrent_layers(model, base_dir=None):
    onnx = import_onnx("recurrent_layers")
    model = load_model(onnx, model, base_dir)
    nodes = [(i, n) for i, n in enumerate(model.graph.node) if _is_recurrent(n)]
    _check_recurrent(onnx, model, [n for _, n in nodes])
    static = _Static(onnx, model)
    return [_recurrent_layer(onnx, static, index, node) for index, node in nodes]


def _recurrent_layer(onnx, static, index, node):
    """The ``RecurrentLayer`` of one node: its static inputs resolved, then checked as ``run``
    checks them (``cgru.onnx._check_node``)."""
    where = f"recurrent_layers: {_describe(node)} (graph node {index})"
    values = {}
    for slot, name in zip(front.INPUTS[node.op_type], node.input):
        if not name:
            continue
        try:
            values[slot] = static.get(name)
        except _Unresolved as e:
            if slot in ("X", "sequence_lens", "initial_h", "initial_c"):
                continue            # run-time inputs
            raise ValueError(
                f"{where}: its {slot} input {name!r} cannot be resolved statically: {name!r} "
                f"← {e}.  Give the weights as initializers (or Constant nodes), or run the "
                f"model with cgru.onnx.run, which computes such nodes at run time") from None
    try:
        return _layer(node.op_type, node, index, values, _attributes(onnx, node))
    except (ValueError, TypeError) as e:
        raise type(e)(f"{where}: {e}") from e


# --- the public names ----------------------------------------------------------------------
_TRUST = """
    A model is untrusted input.  ``ValueError`` for anything wrong with it, naming what is
    wrong (the tensor, the node, its input or attribute, expected vs actual), before any work:
    bytes that do not parse, a path that is not a regular file (``FileNotFoundError`` when
    there is none), subgraphs nested more than 32 deep, a graph with a cycle or out of
    topological order, a value assigned twice or read but never provided, recursive local
    functions, a tensor whose data does not match its type and shape, a tensor larger than
    the machine's memory, recurrent nodes with unknown, mistyped or out-of-range attributes
    or too many inputs; ``TypeError`` for an argument of another Python type.

    External data (tensors kept in files beside the model) is read only from inside one
    directory: ``base_dir`` when given, else the directory of the model file.  A model given
    as bytes or an ``onnx.ModelProto`` has no directory, so its external data needs
    ``base_dir`` (``ValueError`` without it).  Every location must be relative and, symbolic
    links and ``..`` resolved, inside that directory; the file must be a regular file with
    one link (not a symbolic or hard link), and ``offset``/``length`` must lie within it —
    onnx's own rules for ``onnx.load``.  A ``ModelProto`` given is never modified.
"""

def run(model, inputs, outputs=None, *, base_dir=None):
    """Run an ONNX model: ``{output name: array}``, in the graph's output order.

    ``model``: a path to an ``.onnx`` file, its bytes, or an ``onnx.ModelProto`` — a whole
    model such as ``torch.onnx.export`` writes.  Every ``GRU``, ``LSTM`` and ``RNN`` node
    (opset ≥ 7; inside ``If``/``Loop``/``Scan`` bodies and local functions too) is computed by
    cgru (``gru``, ``lstm``, ``rnn``); every other node by the ``onnx`` package's reference
    evaluator (``onnx.reference.ReferenceEvaluator``).  ``inputs``: a dict from graph input
    name to array — initializers supply the rest, and a value given under an initializer's
    name replaces it.  ``outputs``: the names to return (``None``: the graph's outputs; any
    value the graph computes may be named).  Arrays are checked against the graph inputs'
    declared element types and fixed dimensions.  ``base_dir``: the directory the model's
    external data is confined to (see below).  Nodes that declare their output's size by
    value (``ConstantOfShape``, ``Expand``, ``Tile``, ``Range``, ``OneHot``, ``RandomNormal``,
    ``RandomUniform``) are refused before they allocate more than the machine's memory; any
    other error of the reference evaluator is a ``ValueError`` too.  Needs the optional
    ``onnx`` package (``gru``, ``lstm`` and ``rnn`` do not).
    """
    return _run_model(model, inputs, outputs, base_dir)


if run.__doc__:                 # None under python -OO
    run.__doc__ += _TRUST


@dataclass(frozen=True, eq=False)
class RecurrentLayer:
    """One ``GRU`` / ``LSTM`` / ``RNN`` node of a model with its weights (``recurrent_layers``).

    ``op_type``; ``name`` (the node's, may be ``""``); ``index`` (its position in
    ``graph.node``); ``inputs`` / ``outputs`` (the node's value names, ``""`` for an omitted
    one); ``attributes`` (as the node gives them, names decoded to ``str``); ``weights``
    (``{"W", "R"}`` and ``"B"``, ``"P"`` when the node has them, in ONNX's layout and gate
    order, read from the model); ``initial`` (whichever of ``sequence_lens``, ``initial_h``,
    ``initial_c`` the model fixes statically — the others come at run time); ``networks``
    (the cgru networks of the node: one, or a forward and a reverse one when the two
    directions' activations differ).
    """
    op_type: str
    name: str
    index: int
    inputs: tuple
    outputs: tuple
    attributes: dict
    weights: dict
    initial: dict
    networks: tuple

    @property
    def network(self):
        """The node as one ``cgru.Network`` (``ValueError`` when its directions differ in
        activations: use ``networks``)."""
        if len(self.networks) != 1:
            raise ValueError(f"{self.op_type} node {self.name!r}: its two directions use "
                             f"different activations, which one cgru network cannot hold; "
                             f"use .networks (forward, reverse)")
        return self.networks[0]

    @property
    def batch_major(self):
        """True for ``layout=1`` (``X`` ``[N, T, I]``): pass as ``cgru.forward(...,
        batch_major=...)``."""
        return int(self.attributes.get("layout", 0)) == 1

    def __call__(self, X, **inputs):
        """The node's outputs for ``X`` (``gru``/``lstm``/``rnn``): the model's static
        ``initial`` values unless ``sequence_lens=``, ``initial_h=``, ``initial_c=`` are
        given."""
        args = {**self.weights, **self.initial, **inputs}
        return front.OPERATORS[self.op_type](X, **args, **self.attributes)


def recurrent_layers(model, *, base_dir=None):
    """The ``GRU``, ``LSTM`` and ``RNN`` nodes of a model's main graph, in graph order, as
    ``RecurrentLayer`` values (weights, attributes and cgru ``Network``\\ s).

    Weights are read from initializers — also those the graph lists as inputs (their stored
    value is taken) — and through any chain of deterministic nodes with static inputs
    (``Constant``, ``Identity``, ``Transpose``, ``Slice``, ``Concat``, …, evaluated once by the
    reference evaluator).  A weight that depends on a graph input without an initializer (or on
    a random or control-flow node) cannot be resolved statically: ``ValueError`` naming the
    node, the input and the chain.  Needs the ``onnx`` package.

    ``layer.network`` runs, converts (``cgru.convert.to_torch``, …) and differentiates
    (``cgru.forward(..., training=True)``, ``cgru.backward``) like any network; mind
    ``layer.batch_major`` and that ONNX's ``Y`` is ``[T, D, N, H]`` where cgru's ``y`` is
    ``[T, N, D·H]``.  ``layer(X)`` computes the node itself.

    Each node is checked as ``run`` checks it (one check function): its attributes
    (``layout``, ``direction``, …), its weights and the ``sequence_lens``, ``initial_h``,
    ``initial_c`` the model fixes (``sequence_lens`` against ``T`` only when ``X`` is static
    too).  ``base_dir`` as for ``run``.
    """
    return _recurrent_layers(model, base_dir)


if recurrent_layers.__doc__:
    recurrent_layers.__doc__ += _TRUST


def _layer(op_type, node, index, values, attrs):
    """A ``RecurrentLayer`` of ``node`` from its static input ``values`` (by slot; ``X`` among
    them only when the model fixes it), checked by ``_check_node`` as ``run`` checks it."""
    checked = front._check_node(op_type, values.get("X"), values["W"], values["R"], values.get("B"),
                          values.get("sequence_lens"), values.get("initial_h"),
                          values.get("initial_c"), values.get("P"), attrs)
    weights = {k: values[k] for k in ("W", "R", "B", "P") if values.get(k) is not None}
    initial = {k: values[k] for k in ("sequence_lens", "initial_h", "initial_c")
               if values.get(k) is not None}
    return RecurrentLayer(op_type=op_type, name=node.name, index=index,
                          inputs=tuple(node.input), outputs=tuple(node.output),
                          attributes=dict(attrs), weights=weights, initial=initial,
                          networks=tuple(net for net, _ in checked.runs))
