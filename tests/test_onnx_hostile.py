"""cgru.onnx.run and cgru.onnx.recurrent_layers on hostile ONNX models: the model is untrusted
input (docs/onnx.md, "A model is untrusted input").

Each hostile model is built here with onnx.helper from a valid one-GRU model and must give a
ValueError naming what is wrong (TypeError only for a Python argument of the wrong type),
never another exception, a hang or a read outside the model's directory:

1. external data: bytes and ModelProtos read none without base_dir=, a path reads from its
   own directory; absolute locations, '..', symbolic and hard links, directories, FIFOs,
   offsets and lengths past the file's end are refused (onnx.load's own rules);
2. structure: cycles, nodes out of topological order, values read but never provided or
   assigned twice, subgraphs nested too deep, recursive local functions, undeclared domains,
   directories / FIFOs / garbage / empty bytes as models;
3. tensors: data that does not match the declared type and shape, huge declared shapes
   (refused, never allocated), unknown element types, sparse tensors;
4. nodes: attribute types and values, arity, and the static checks recurrent_layers shares
   with run (layout, sequence_lens, initial states);
5. a derandomized hypothesis fuzz over mutated models (bytes and fields): a ValueError or
   TypeError, or a result equal to the onnx reference evaluator's own.

The oracles: the arrays the test wrote (external data), cgru.onnx.run of the same model with
its data inline, onnxruntime for a model saved with external data, numpy for the guarded
size-by-value nodes, onnx.reference.ReferenceEvaluator for the fuzz.  Whatever could hang (a
FIFO) runs in a subprocess with a timeout.
"""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cgru
import cgru.onnx as connx

onnx = pytest.importorskip("onnx")
from cgru.onnx import graph as _onnx_graph  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

T, N, I, H = 3, 2, 3, 2
RNG = np.random.default_rng(7)
W = RNG.uniform(-0.5, 0.5, (1, 3 * H, I)).astype(np.float32)
R = RNG.uniform(-0.5, 0.5, (1, 3 * H, H)).astype(np.float32)
B = RNG.uniform(-0.5, 0.5, (1, 6 * H)).astype(np.float32)
X = RNG.standard_normal((T, N, I)).astype(np.float32)
# more than any machine's memory, in elements of 4 bytes
HUGE = 2 ** 50


def _graph(nodes, initializers, inputs=("X",), outputs=("Y", "Y_h"), opset=17, **kw):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kw)


def _gru(inputs=("X", "W", "R", "B"), outputs=("Y", "Y_h"), **attrs):
    return helper.make_node("GRU", list(inputs), list(outputs), name="gru",
                            **{"hidden_size": H, **attrs})


def _weights(**arrays):
    arrays = {"W": W, "R": R, "B": B, **arrays}
    return [numpy_helper.from_array(v, k) for k, v in arrays.items() if v is not None]


def _model(extra=(), node=None, inits=None, **kw):
    """A valid model: ``extra`` nodes, then one GRU node (``node``) on initializers."""
    return _graph(list(extra) + [node or _gru()], _weights() if inits is None else inits, **kw)


def _initializer(model, name):
    return next(t for t in model.graph.initializer if t.name == name)


def _refused(model, match, error=ValueError, **kw):
    """Both run and recurrent_layers refuse ``model`` with ``error`` matching ``match``."""
    with pytest.raises(error, match=match):
        connx.run(model, {"X": X}, **kw)
    with pytest.raises(error, match=match):
        connx.recurrent_layers(model, **kw)


def _inline_run(model=None):
    return connx.run(model or _model(), {"X": X})


# --- 1. external data -----------------------------------------------------------------------
def _external(model, name, location, **keys):
    """``model`` with initializer ``name``'s data moved out to ``location`` (a copy; the bytes
    are the caller's to write)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    t = _initializer(copy, name)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in {"location": location, **keys}.items():
        e = t.external_data.add()
        e.key, e.value = k, str(v)
    return copy


@pytest.fixture
def secret(tmp_path, monkeypatch):
    """A directory holding a file ``w.bin`` the size of W, the working directory: what a
    model must never read by naming it."""
    (tmp_path / "w.bin").write_bytes(b"\x7f" * W.nbytes)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("form", ["bytes", "ModelProto"])
def test_bytes_and_modelprotos_read_no_external_data_without_base_dir(secret, form):
    model = _external(_model(), "W", "w.bin")
    given = model.SerializeToString() if form == "bytes" else model
    what = "bytes" if form == "bytes" else "an onnx.ModelProto"
    _refused(given, rf"initializer 'W' of the main graph keeps its data in the external file "
                    rf"'w.bin', and a model given as {what} has no directory of its own: pass "
                    rf"base_dir=")


@pytest.mark.parametrize("form", ["bytes", "ModelProto", "path"])
def test_base_dir_confines_and_reads_external_data(tmp_path, form):
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    data.mkdir()
    (data / "w.bin").write_bytes(W.tobytes())
    (home / "w.bin").write_bytes(b"\x7f" * W.nbytes)        # beside the file: not read
    model = _external(_model(), "W", "w.bin")
    before = model.SerializeToString()
    onnx.save(model, str(home / "m.onnx"))
    given = {"bytes": before, "ModelProto": model, "path": home / "m.onnx"}[form]
    (layer,) = connx.recurrent_layers(given, base_dir=data)
    np.testing.assert_array_equal(layer.weights["W"], W)
    got = connx.run(given, {"X": X}, base_dir=str(data))
    want = _inline_run()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert model.SerializeToString() == before              # the caller's model unchanged


def test_a_path_reads_external_data_from_its_own_directory(tmp_path, monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    home = tmp_path / "home"
    home.mkdir()
    model = _model()
    onnx.save(model, str(home / "m.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert _initializer(onnx.load(str(home / "m.onnx"), load_external_data=False),
                        "W").data_location == TensorProto.EXTERNAL
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    (elsewhere / "weights.bin").write_bytes(b"\x7f" * 4096)   # the working directory's
    monkeypatch.chdir(elsewhere)
    (layer,) = connx.recurrent_layers(home / "m.onnx")
    for k, v in {"W": W, "R": R, "B": B}.items():
        np.testing.assert_array_equal(layer.weights[k], v)
    got = connx.run(str(home / "m.onnx"), {"X": X})
    sess = ort.InferenceSession(str(home / "m.onnx"), providers=["CPUExecutionProvider"])
    for g, w in zip(got.values(), sess.run(None, {"X": X})):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _hostile_location(tmp_path, case):
    """``(home, location, keys, match)``: a model directory and an external location in it
    that onnx's rules refuse."""
    home = tmp_path / "home"
    home.mkdir()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(W.tobytes())
    (home / "w.bin").write_bytes(W.tobytes())
    keys, loc = {}, "w.bin"
    if case == "absolute":
        loc, match = str(outside), "an absolute path"
    elif case == "dotdot":
        loc, match = "../outside.bin", "through '..'"
    elif case == "dotdot inside":
        loc, match = "sub/../../home/w.bin", "through '..'"
    elif case == "symlink out":
        os.symlink(outside, home / "link.bin")
        loc, match = "link.bin", "a symbolic link"
    elif case == "symlink in":
        os.symlink(home / "w.bin", home / "link.bin")
        loc, match = "link.bin", "a symbolic link"
    elif case == "directory symlink":
        os.symlink(tmp_path, home / "up")
        loc, match = "up/outside.bin", "outside the directory"
    elif case == "hard link":
        os.link(home / "w.bin", home / "twice.bin")
        loc, match = "twice.bin", "2 hard links"
    elif case == "directory":
        (home / "d").mkdir()
        loc, match = "d", "which is a directory, not a regular file"
    elif case == "missing":
        loc, match = "nothing.bin", "cannot be opened"
    elif case == "empty":
        loc, match = "", "expected a file name relative"
    elif case == "offset past end":
        keys, match = {"offset": W.nbytes + 1}, "past the end of the file"
    elif case == "length past end":
        keys, match = {"offset": 8, "length": W.nbytes}, "past the end of the file"
    elif case == "negative offset":
        keys, match = {"offset": -4}, "offset -4; expected an integer ≥ 0"
    elif case == "non-integer length":
        keys, match = {"length": "lots"}, "length 'lots'; expected an integer ≥ 0"
    elif case == "short length":
        keys, match = {"length": W.nbytes - 4}, "which take 72 bytes of raw_data, but holds 68"
    return home, loc, keys, match


@pytest.mark.parametrize("case", [
    "absolute", "dotdot", "dotdot inside", "symlink out", "symlink in", "directory symlink",
    "hard link", "directory", "missing", "empty", "offset past end", "length past end",
    "negative offset", "non-integer length", "short length"])
def test_external_data_outside_the_rules_is_refused(tmp_path, case):
    home, loc, keys, match = _hostile_location(tmp_path, case)
    model = _external(_model(), "W", loc, **keys)
    onnx.save(model, str(home / "m.onnx"))
    _refused(str(home / "m.onnx"), match)
    _refused(model, match, base_dir=home)


def _run_in_subprocess(code, timeout=120):
    """Run ``code`` (which prints a last line) in a fresh interpreter with this cgru; its
    output, or a failure when it does not finish in ``timeout`` seconds."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(cgru.__file__))] +
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("what", ["model", "external data"])
def test_a_fifo_is_refused_without_blocking(tmp_path, what):
    """Opening a FIFO for reading blocks until a writer comes: cgru must not wait."""
    os.mkfifo(tmp_path / "fifo")
    if what == "external data":
        onnx.save(_external(_model(), "W", "fifo"), str(tmp_path / "m.onnx"))
        path = tmp_path / "m.onnx"
    else:
        path = tmp_path / "fifo"
    out = _run_in_subprocess(f"""
        import cgru.onnx
        try:
            cgru.onnx.recurrent_layers({str(path)!r})
        except ValueError as e:
            print("ValueError", e)
        """)
    assert out.startswith("ValueError") and "is a FIFO, not" in out


def test_base_dir_is_checked():
    with pytest.raises(TypeError, match="base_dir: expected None or a directory path, got int"):
        connx.recurrent_layers(_model(), base_dir=3)
    with pytest.raises(ValueError, match="base_dir: expected an existing directory"):
        connx.run(_model(), {"X": X}, base_dir="/nonexistent/cgru")


# --- 2. structure ---------------------------------------------------------------------------
def test_a_cycle_is_refused():
    nodes = [helper.make_node("Identity", ["W2"], ["W1"], name="a"),
             helper.make_node("Identity", ["W1"], ["W2"], name="b")]
    _refused(_model(nodes, _gru(("X", "W1", "R"))),
             "Identity node 'a' in the main graph reads 'W2' before Identity node 'b' computes "
             "it: the nodes form a cycle or are out of topological order")


def test_a_node_reading_its_own_output_is_refused():
    _refused(_model([helper.make_node("Identity", ["W1"], ["W1"], name="self")],
                    _gru(("X", "W1", "R"))),
             "Identity node 'self' in the main graph reads 'W1' before Identity node 'self'")


def test_nodes_out_of_topological_order_are_refused():
    model = _graph([_gru(("X", "W1", "R")), helper.make_node("Identity", ["W"], ["W1"],
                                                             name="late")], _weights())
    _refused(model, "GRU node 'gru' in the main graph reads 'W1' before Identity node 'late'")


def test_a_value_that_nothing_provides_is_refused():
    _refused(_model(node=_gru(("X", "nowhere", "R"))),
             "GRU node 'gru' in the main graph reads 'nowhere', which no node, input or "
             "initializer provides")
    model = _model()
    model.graph.output.append(helper.make_tensor_value_info("ghost", TensorProto.FLOAT, None))
    _refused(model, "the main graph has the output 'ghost', which no node")


def test_a_value_assigned_twice_is_refused():
    nodes = [helper.make_node("Identity", ["W"], ["V"], name="one"),
             helper.make_node("Identity", ["R"], ["V"], name="two")]
    _refused(_model(nodes), r"defines 'V' twice \(as an output of Identity node 'one' and as "
                            r"an output of Identity node 'two'\)")
    _refused(_model([helper.make_node("Identity", ["R"], ["W"], name="over")]),
             "defines 'W' twice")


def _nested(depth):
    """A valid model whose GRU's output passes through ``depth`` nested If nodes, built in
    place (no serialization: a parsed file could not nest this deep)."""
    model = _model()
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "yes"))
    model.graph.output.append(helper.make_tensor_value_info("Z0", TensorProto.FLOAT, None))
    graph = model.graph
    for level in range(depth):
        node = graph.node.add()
        node.op_type, node.name = "If", f"if{level}"
        node.input.append("yes")
        node.output.append(f"Z{level}")
        for branch in ("then_branch", "else_branch"):
            a = node.attribute.add()
            a.name, a.type = branch, onnx.AttributeProto.GRAPH
            a.g.name = f"{branch}{level}"
            a.g.output.add().name = f"Z{level + 1}" if branch == "then_branch" and \
                level + 1 < depth else "Y_h"
        graph = node.attribute[0].g
    return model


def test_subgraphs_nested_within_the_limit_run():
    got = connx.run(_nested(_onnx_graph.MAX_GRAPH_DEPTH), {"X": X})
    np.testing.assert_array_equal(got["Z0"], _inline_run()["Y_h"])


@pytest.mark.parametrize("depth", [33, 400, 3000])
def test_subgraphs_nested_too_deep_are_refused(depth):
    model = _nested(depth)
    _refused(model, r"subgraphs nest deeper than 32 levels \(the then_branch of If node "
                    r"'if32', 33 subgraphs deep\)")


def test_bytes_nested_deeper_than_protobuf_parses_are_refused():
    data = _nested(40).SerializeToString()
    _refused(data, "cannot parse .* nest deeper than protobuf's parser allows")


def test_a_long_chain_of_glue_nodes_resolves_without_recursion():
    n = 5000
    nodes = [helper.make_node("Identity", [f"w{i}"], [f"w{i + 1}"], name=f"id{i}")
             for i in range(n)]
    inits = _weights(W=None) + [numpy_helper.from_array(W, "w0")]
    model = _graph(nodes + [_gru(("X", f"w{n}", "R", "B"))], inits)
    (layer,) = connx.recurrent_layers(model)
    np.testing.assert_array_equal(layer.weights["W"], W)
    # from a graph input: the chain in the message is cut, not 5000 links long
    model = _graph(nodes + [_gru(("X", f"w{n}", "R", "B"))], _weights(W=None),
                   inputs=("X", "w0"))
    with pytest.raises(ValueError, match=r"'w5000' ← Identity node 'id4999' ← .*"
                                         r"\(4989 more\) … ← graph input 'w0'") as e:
        connx.recurrent_layers(model)
    assert len(str(e.value)) < 1000


def test_recursive_local_functions_are_refused():
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    f = helper.make_function("local", "F", ["a"], ["b"],
                             [helper.make_node("G", ["a"], ["b"], domain="local")], opsets)
    g = helper.make_function("local", "G", ["a"], ["b"],
                             [helper.make_node("F", ["a"], ["b"], domain="local")], opsets)
    model = _model([helper.make_node("F", ["W"], ["W1"], domain="local", name="call")],
                   _gru(("X", "W1", "R")), functions=[f, g])
    model.opset_import.append(helper.make_opsetid("local", 1))
    _refused(model, r"local functions call themselves \(local::F → local::G → local::F\)")


def test_a_domain_the_model_does_not_import_is_refused():
    model = _model()
    del model.opset_import[:]
    _refused(model, "GRU node 'gru' in the main graph is of domain '', which the model's "
                    "opset_import does not list")


def test_a_directory_is_not_a_model(tmp_path):
    _refused(str(tmp_path), rf"model: '{re.escape(str(tmp_path))}' is a directory, not an "
                            rf"ONNX file")
    with pytest.raises(FileNotFoundError):
        connx.recurrent_layers(tmp_path / "nothing.onnx")


@pytest.mark.parametrize("data", [b"", b"\x00\x01garbage" * 10, b"hello world"])
def test_garbage_bytes_are_refused(data):
    _refused(data, "model: (cannot parse|bytes holds no graph)")


def test_truncated_bytes_are_refused():
    data = _model().SerializeToString()
    for cut in (len(data) // 3, len(data) - 5):
        _refused(data[:cut], r"model: cannot parse \d+ bytes as an ONNX model")


def test_a_model_of_another_type_is_a_type_error():
    _refused(bytearray(b"x"), "model: expected a path, serialized bytes or an onnx.ModelProto, "
                              "got bytearray", TypeError)


def test_a_node_the_evaluator_cannot_run_is_a_value_error_and_not_implemented():
    node = helper.make_node("NoSuchOperator", ["Y_h"], ["Z"], name="odd")
    model = _model(outputs=("Z",))
    model.graph.node.append(node)
    with pytest.raises(connx.UnsupportedNodeError, match="NoSuchOperator") as e:
        connx.run(model, {"X": X})
    assert isinstance(e.value, ValueError) and isinstance(e.value, NotImplementedError)


# --- 3. tensors -----------------------------------------------------------------------------
def _mutated_w(change):
    model = _model()
    change(_initializer(model, "W"))
    return model


def _dims(*dims):
    def change(t):
        t.dims[:] = dims
    return change


def _float_data(n):
    def change(t):
        t.ClearField("raw_data")
        t.float_data[:] = [0.5] * n
    return change


@pytest.mark.parametrize("change,match", [
    (_dims(1, 6, 4), r"declares shape \[1, 6, 4\] \(24 FLOAT elements\), which take 96 bytes "
                     r"of raw_data, but holds 72"),
    (_dims(HUGE, HUGE), r"declares shape \[1125899906842624, 1125899906842624\]"),
    (_dims(-1, 18), r"has a negative dimension in its shape \[-1, 18\]"),
    (lambda t: t.ClearField("raw_data"), r"declares shape \[1, 6, 3\] \(18 FLOAT elements\) "
                                         r"but holds no data"),
    (_float_data(5), "which take 18 float_data entries, but holds 5"),
    (lambda t: t.int64_data.append(1), r"holds values in 2 fields \(int64_data, raw_data\)"),
    (lambda t: setattr(t, "data_type", 12345), "has data_type 12345, which is not an ONNX "
                                               "element type"),
    (lambda t: setattr(t, "data_type", TensorProto.UNDEFINED), "has data_type 0"),
    (lambda t: setattr(t, "data_type", TensorProto.STRING), "a STRING tensor with raw_data"),
    (lambda t: (t.ClearField("raw_data"), t.int32_data.extend([1] * 18)),
     "a FLOAT tensor with its values in int32_data; FLOAT values are kept in float_data"),
    (lambda t: (setattr(t, "data_type", TensorProto.INT4), _dims(2 ** 20, 2 ** 20)(t)),
     r"\(1099511627776 INT4 elements\), which take 549755813888 bytes of raw_data, but "
     r"holds 72"),
], ids=["dims", "huge dims", "negative dim", "no data", "float_data size", "two fields",
        "unknown type", "undefined type", "string raw", "wrong field", "int4 huge"])
def test_tensor_data_must_match_its_type_and_shape(change, match):
    _refused(_mutated_w(change), "model: initializer 'W' of the main graph .*" + match)


def test_a_constant_tensor_is_checked_like_an_initializer():
    value = numpy_helper.from_array(W)
    value.dims[:] = [HUGE]
    node = helper.make_node("Constant", [], ["W1"], name="k", value=value)
    _refused(_model([node], _gru(("X", "W1", "R"))),
             r"the tensor of attribute 'value' of Constant node 'k' in the main graph "
             r"declares shape \[1125899906842624\]")


def test_a_sparse_tensor_larger_than_memory_is_refused():
    model = _model()
    values = numpy_helper.from_array(np.array([1.0], np.float32), "S")
    indices = numpy_helper.from_array(np.array([0], np.int64), "S_i")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [HUGE]))
    _refused(model, r"sparse initializer 'S' of the main graph declares a tensor of shape "
                    r"\[1125899906842624\] \(4503599627370496 bytes\), larger than this "
                    r"machine's memory")


def _size_node(op_type, sizes):
    """``(nodes, initializers)``: one ``op_type`` node computing output 'big' from the
    initializers ``sizes`` (name → array), with the attributes it needs."""
    attrs = {}
    if op_type == "RandomNormal":
        attrs["shape"] = [int(v) for v in sizes.pop("shape")]
    if op_type == "ConstantOfShape":
        attrs["value"] = numpy_helper.from_array(np.array([0.5], np.float32))
    node = helper.make_node(op_type, list(sizes), ["big"], name="big", **attrs)
    return node, [numpy_helper.from_array(np.asarray(v), k) for k, v in sizes.items()]


_SMALL_AND_HUGE = {
    "ConstantOfShape": (lambda n: {"shape": np.array([2, n], np.int64)},
                        lambda a: np.full((2, 3), 0.5, np.float32)),
    "Expand": (lambda n: {"data": np.arange(3, dtype=np.float32), "shape": np.array([n, 1, 3])},
               lambda a: np.broadcast_to(np.arange(3, dtype=np.float32), (3, 1, 3))),
    "Tile": (lambda n: {"x": np.arange(6, dtype=np.float32).reshape(2, 3),
                        "repeats": np.array([n, 2])},
             lambda a: np.tile(np.arange(6, dtype=np.float32).reshape(2, 3), (3, 2))),
    "Range": (lambda n: {"start": np.array(0.0, np.float32), "limit": np.array(n, np.float32),
                         "delta": np.array(0.5, np.float32)},
              lambda a: np.arange(0, 3, 0.5, dtype=np.float32)),
    "OneHot": (lambda n: {"indices": np.array([0, 2]), "depth": np.array(n),
                          "values": np.array([0.0, 1.0], np.float32)},
               lambda a: np.eye(3, dtype=np.float32)[[0, 2]]),
    "RandomNormal": (lambda n: {"shape": [n, 2]}, lambda a: a),
}


@pytest.mark.parametrize("op_type", list(_SMALL_AND_HUGE))
def test_size_by_value_nodes_refuse_outputs_larger_than_memory(op_type):
    """run refuses them before the reference evaluator allocates (before: MemoryError, or
    the machine's memory exhausted); a small one still gives numpy's result."""
    sizes, want = _SMALL_AND_HUGE[op_type]
    node, inits = _size_node(op_type, sizes(HUGE))
    model = _model([node], inits=_weights() + inits, outputs=("Y", "big"))
    with pytest.raises(ValueError, match=rf"^{op_type} node 'big': declares a tensor of shape "
                                         rf".*larger than this machine's memory"):
        connx.run(model, {"X": X})
    node, inits = _size_node(op_type, sizes(3))
    model = _model([node], inits=_weights() + inits, outputs=("Y", "big"))
    got = connx.run(model, {"X": X})["big"]
    if op_type == "RandomNormal":
        assert got.shape == (3, 2) and got.dtype == np.float32
    else:
        np.testing.assert_array_equal(got, want(got))


def test_a_huge_weight_is_not_folded_statically():
    node = helper.make_node("ConstantOfShape", ["shape"], ["W1"], name="cos",
                            value=numpy_helper.from_array(np.array([0.5], np.float32)))
    inits = _weights() + [numpy_helper.from_array(np.array([1, 6, HUGE]), "shape")]
    with pytest.raises(ValueError, match=r"its W input 'W1' cannot be resolved statically: "
                                         r".*ConstantOfShape node 'cos'.*larger than this "
                                         r"machine's memory"):
        connx.recurrent_layers(_model([node], _gru(("X", "W1", "R")), inits))


# --- 4. recurrent nodes ---------------------------------------------------------------------
def _typed_attribute(name, value, attribute_type):
    a = helper.make_attribute(name, value)
    assert a.type == attribute_type
    return a


@pytest.mark.parametrize("name,value,got,want", [
    ("hidden_size", "two", "STRING", "INT"), ("hidden_size", 2.0, "FLOAT", "INT"),
    ("hidden_size", numpy_helper.from_array(np.array([2])), "TENSOR", "INT"),
    ("direction", 3, "INT", "STRING"), ("activations", [1, 2], "INTS", "STRINGS"),
    ("activation_alpha", ["x"], "STRINGS", "FLOATS"), ("clip", "a", "STRING", "FLOAT"),
    ("layout", [0], "INTS", "INT"),
    ("linear_before_reset", helper.make_graph([], "e", [], []), "GRAPH", "INT")])
def test_attributes_of_the_wrong_type_are_refused(name, value, got, want):
    node = _gru()
    del node.attribute[:]
    if name != "hidden_size":
        node.attribute.append(helper.make_attribute("hidden_size", H))
    node.attribute.append(_typed_attribute(name, value, getattr(onnx.AttributeProto, got)))
    _refused(_model(node=node), rf"GRU node 'gru': attribute '{name}' is of type {got}; an "
                                rf"ONNX GRU's {name} is {want}")


@pytest.mark.parametrize("attrs,match", [
    (dict(layout=2), "layout: expected one of 0, 1, got 2"),
    (dict(hidden_size=-1), "hidden_size: expected a positive int, got -1"),
    (dict(hidden_size=2 ** 62), "hidden_size: 4611686018427387904 disagrees with R's last"),
    (dict(direction="up"), "direction: expected one of 'forward', 'reverse', 'bidirectional'"),
    (dict(linear_before_reset=7), "linear_before_reset: expected one of 0, 1, got 7"),
    (dict(clip=-1.0), "clip: expected None or a positive float, got -1.0"),
    (dict(activations=["Foo", "Tanh"]), r"activations\[0\]: unknown ONNX activation 'Foo'"),
    (dict(activations=["Tanh"]), "activations: expected 2 names"),
    (dict(activation_alpha=[1.0, 2.0]), "2 alpha and 0 beta value.s. left over"),
])
def test_out_of_range_attributes_are_refused_by_run_and_recurrent_layers(attrs, match):
    _refused(_model(node=_gru(**attrs)), match)


def test_recurrent_nodes_with_too_many_inputs_or_outputs_are_refused():
    extra = _gru(("X", "W", "R", "B", "", "", "B"))
    _refused(_model(node=extra), "GRU node 'gru' has 7 inputs; an ONNX GRU takes at most 6 "
                                 r"\(X, W, R, B, sequence_lens, initial_h\)")
    more = _gru(outputs=("Y", "Y_h", "Y_c"))
    _refused(_model(node=more, outputs=("Y",)), "GRU node 'gru' has 3 outputs; an ONNX GRU "
                                                "gives at most 2")
    _refused(_model(node=_gru(("X", "W", ""))), "GRU node 'gru' has no R input")


def _both_messages(model):
    """The errors of run and recurrent_layers on ``model``, without their prefixes."""
    errors = []
    for call in (lambda: connx.run(model, {"X": X}), lambda: connx.recurrent_layers(model)):
        with pytest.raises((ValueError, TypeError)) as e:
            call()
        errors.append((type(e.value), str(e.value).split("): ", 1)[-1].split("': ", 1)[-1]))
    return errors


@pytest.mark.parametrize("name,value", [
    ("sequence_lens", np.array([1.5, 2], np.float32)),
    ("initial_h", np.zeros((3, N, 7), np.float32)),
    ("initial_h", np.zeros((1, N, H), np.float64))])
def test_recurrent_layers_checks_static_inputs_as_run_does(name, value):
    """One check function: the same error, word for word, from both."""
    slots = {"sequence_lens": ("X", "W", "R", "B", "sl"),
             "initial_h": ("X", "W", "R", "B", "", "sl")}[name]
    model = _model(node=_gru(slots), inits=_weights() + [numpy_helper.from_array(value, "sl")])
    (run_error, run_text), (layers_error, layers_text) = _both_messages(model)
    assert run_error is layers_error and run_text == layers_text, (run_text, layers_text)


def test_recurrent_layers_refuses_negative_static_lengths_and_checks_t_with_a_static_x():
    lens = numpy_helper.from_array(np.array([-5, 1], np.int32), "sl")
    model = _model(node=_gru(("X", "W", "R", "B", "sl")), inits=_weights() + [lens])
    _refused(model, r"sequence_lens: expected values (≥ 0|in \[0, T=3\]).*got "
                    r"sequence_lens\[0\] = -5")
    lens = numpy_helper.from_array(np.array([T + 1, 1], np.int32), "sl")
    static_x = _weights(X=X) + [lens]
    model = _graph([_gru(("X", "W", "R", "B", "sl"))], static_x, inputs=())
    with pytest.raises(ValueError, match=r"sequence_lens: expected values in \[0, T=3\], got "
                                         r"sequence_lens\[0\] = 4"):
        connx.recurrent_layers(model)


# --- 5. fuzz ----------------------------------------------------------------------------------
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

# CGRU_FUZZ_SCALE=k: k times the examples, at random (test_fuzz.py's switch)
_SCALE = int(os.environ.get("CGRU_FUZZ_SCALE") or 0)
FUZZ = settings(max_examples=150 * max(_SCALE, 1), deadline=None, derandomize=not _SCALE,
                database=None,
                suppress_health_check=[HealthCheck.too_slow])


def _fuzz_model():
    """A small valid model with glue nodes, a subgraph and attributes to mutate."""
    glue = [helper.make_node("Transpose", ["Wt"], ["W1"], name="t", perm=[0, 2, 1]),
            helper.make_node("Identity", ["R"], ["R1"], name="id")]
    wt = numpy_helper.from_array(np.ascontiguousarray(W.transpose(0, 2, 1)), "Wt")
    gru = _gru(("X", "W1", "R1", "B"), linear_before_reset=1, clip=5.0,
               activations=["Sigmoid", "Tanh"])
    return _graph(glue + [gru], [wt] + _weights(W=None))


def _clipped_reference_gru():
    """onnx's reference GRU with the operator's ``clip`` applied to every pre-activation, as
    the operator defines it.  The reference evaluator's GRU ignores ``clip`` — harmless on the
    fuzz model's own weights, whose pre-activations stay inside ±5, but a mutated weight
    (an exponent bit flipped) drives them past it, and the unclipped answer is then wrong.  It
    also ignores ``activations`` and ``sequence_lens``: a node that sets anything but the
    default activations, or gives lengths, it refuses to judge (None below)."""
    from onnx.reference.ops.op_gru import GRU

    class ClippedGRU(GRU):
        op_domain = ""

        def f(self, x):
            return super().f(self._clip(x))

        def g(self, x):
            return super().g(self._clip(x))

        def _clip(self, x):
            c = self._clip_value
            return x if c is None else np.clip(x, -c, c).astype(x.dtype)

        def _run(self, X, W, R, B=None, sequence_lens=None, initial_h=None, **attributes):
            names = [a.decode() if isinstance(a, bytes) else a
                     for a in (attributes.get("activations") or ())]
            if sequence_lens is not None or (names and names != ["Sigmoid", "Tanh"] *
                                             (len(names) // 2 or 1)):
                raise NotImplementedError("not judged: the reference ignores this")
            self._clip_value = attributes.get("clip")
            return super()._run(X, W, R, B, sequence_lens, initial_h, **attributes)

    ClippedGRU.__name__ = "GRU"
    return ClippedGRU


def _reference_outputs(model):
    """The onnx reference evaluator's outputs (its GRU with ``clip``), or None when it
    cannot or does not judge."""
    from onnx.reference import ReferenceEvaluator
    try:
        return ReferenceEvaluator(model, new_ops=[_clipped_reference_gru()]).run(None, {"X": X})
    except Exception:           # noqa: BLE001 — the oracle may refuse what cgru refused too
        return None


def _check_outcome(model_or_bytes):
    """A ValueError or TypeError, or results equal to the reference evaluator's."""
    try:
        got = connx.run(model_or_bytes, {"X": X})
    except (ValueError, TypeError):
        got = None
    try:
        connx.recurrent_layers(model_or_bytes)
    except (ValueError, TypeError):
        pass
    if got is not None:
        proto = model_or_bytes if isinstance(model_or_bytes, onnx.ModelProto) else \
            onnx.load_model_from_string(model_or_bytes)
        want = _reference_outputs(proto)
        if want is not None:
            for g, w in zip(got.values(), want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_bytes(data):
    raw = bytearray(_fuzz_model().SerializeToString())
    for _ in range(data.draw(st.integers(1, 3))):
        # mostly bit flips: most other edits break the wire format, which the parser refuses
        kind = data.draw(st.sampled_from(["flip"] * 6 + ["cut", "insert", "delete"]))
        at = data.draw(st.integers(0, len(raw) - 1))
        if kind == "flip":
            raw[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut":
            del raw[at:]
        elif kind == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del raw[at:at + data.draw(st.integers(1, 8))]
        if not raw:
            break
    _check_outcome(bytes(raw))


_FIELDS = ["dims", "data_type", "node input", "node output", "op_type", "attribute type",
           "attribute int", "external", "opset", "duplicate node"]


@FUZZ
@given(field=st.sampled_from(_FIELDS), data=st.data())
def test_fuzz_mutated_fields(field, data):
    model = _fuzz_model()
    graph = model.graph
    value = data.draw(st.integers(-3, 2 ** 40))
    t = graph.initializer[data.draw(st.integers(0, len(graph.initializer) - 1))]
    node = graph.node[data.draw(st.integers(0, len(graph.node) - 1))]
    names = [n for n in node.output] + [i.name for i in graph.initializer] + ["X", "", "zz"]
    if field == "dims":
        t.dims[data.draw(st.integers(0, len(t.dims) - 1))] = value
    elif field == "data_type":
        t.data_type = data.draw(st.integers(0, 30))
    elif field == "node input" and len(node.input):
        node.input[data.draw(st.integers(0, len(node.input) - 1))] = \
            data.draw(st.sampled_from(names))
    elif field == "node output":
        node.output[0] = data.draw(st.sampled_from(names))
    elif field == "op_type":
        node.op_type = data.draw(st.sampled_from(["GRU", "LSTM", "RNN", "Identity", "If",
                                                  "Loop", "Transpose", "Nope"]))
    elif field in ("attribute type", "attribute int") and len(node.attribute):
        a = node.attribute[data.draw(st.integers(0, len(node.attribute) - 1))]
        if field == "attribute type":
            a.type = data.draw(st.integers(0, 14))     # every AttributeType (protobuf refuses others)
        else:
            a.i = value
    elif field == "external":
        t.data_location = TensorProto.EXTERNAL
        e = t.external_data.add()
        e.key, e.value = "location", data.draw(st.sampled_from(["w.bin", "/etc/passwd", ""]))
    elif field == "opset":
        model.opset_import[0].version = data.draw(st.integers(-1, 30))
    elif field == "duplicate node":
        graph.node.append(node)
    _check_outcome(model)
