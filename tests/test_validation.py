"""Bad input to the public core API gets a clear error; good input in odd forms still works.

1. Every class of bad argument to ``forward``, ``backward``, ``reserve_nbytes``,
   ``dropout_masks``, ``Params``, ``Params.from_flat``, ``Topology``, ``Cell`` and
   ``Activation`` raises ``ValueError``/``TypeError`` whose message names the argument and,
   for shapes and dtypes, gives both the expected and the actual value.
2. Inputs are never modified; read-only, non-contiguous and negative-stride inputs give the
   same results as contiguous copies; NaN/Inf in ``x`` propagate without a crash (engine
   buffers poisoned with NaN there, via conftest's ``poison``, so only the input's NaN shows).
"""
import functools
import hashlib
import re

import numpy as np
import pytest

cgru = pytest.importorskip("cgru")
from cgru import (Activation, Cell, LayerParams, Network, Topology, backward,  # noqa: E402
                  dropout_masks, forward, reserve_nbytes)
from cgru.core import reference  # noqa: E402

# One small bidirectional two-layer stack; every size differs from the others so that a
# message quoting a shape is unambiguous: T=5, N=2, I=7, H=3, L·D=4, D·H=6.
T, N, I, H = 5, 2, 7, 3
LD, DH = 4, 6
TOPO = Topology(I, H, num_layers=2, direction="bidirectional")


def _raises(exc, *parts):
    """``pytest.raises(exc, match=…)`` requiring every one of ``parts`` (literally, any order)
    in the message."""
    return pytest.raises(exc, match="(?s)^" + "".join(f"(?=.*{re.escape(p)})" for p in parts))


@functools.lru_cache(maxsize=None)
def _case(dtype):
    """``(params, x, reserve)`` of a training forward in ``dtype`` (shared, never modified)."""
    dtype = np.dtype(dtype)
    params = Network.random(TOPO, dtype, seed=1)
    x = np.random.default_rng(2).standard_normal((T, N, I)).astype(dtype)
    reserve = forward(params, x, training=True).reserve
    for a in (x, reserve):
        a.flags.writeable = False
    return params, x, reserve


def _f64():
    return _case(np.float64)


def _call(fn, x, **kw):
    """``forward`` or ``backward`` (with the matching reserve) on float64 params."""
    params, _, reserve = _f64()
    if fn == "forward":
        return forward(params, x, **kw)
    return backward(params, x, reserve, **kw)


BOTH = pytest.mark.parametrize("fn", ["forward", "backward"])


# --- 1. x ---------------------------------------------------------------------------------------
@BOTH
@pytest.mark.parametrize("shape,batch_major,parts", [
    ((N, I), False, ("x:", "3-D", "[2, 7]")),
    ((1, T, N, I), False, ("x:", "3-D", "[1, 5, 2, 7]")),
    ((T, N, I - 1), False, ("x:", "7 features", "[T, N, I]", "[5, 2, 6]")),
    ((T, N, I + 1), False, ("x:", "7 features", "[5, 2, 8]")),
    ((N, T, I + 1), True, ("x:", "7 features", "[N, T, I]", "[2, 5, 8]")),
    ((0, N, I), False, ("x:", "T ≥ 1", "N ≥ 1", "[0, 2, 7]")),      # T = 0
    ((T, 0, I), False, ("x:", "T ≥ 1", "N ≥ 1", "[5, 0, 7]")),      # empty batch
    ((0, T, I), True, ("x:", "T ≥ 1", "N ≥ 1", "[0, 5, 7]")),       # empty batch, batch-major
    ((T, N, 0), False, ("x:", "7 features", "[5, 2, 0]")),
])
def test_x_bad_shape(fn, shape, batch_major, parts):
    with _raises(ValueError, *parts):
        _call(fn, np.zeros(shape), batch_major=batch_major)


@BOTH
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.int32, np.uint8, bool,
                                   np.complex128, object, ">f8"])
def test_x_bad_dtype(fn, dtype):
    x = np.zeros((T, N, I), dtype)
    with _raises(TypeError, "x:", "float64", str(np.dtype(dtype))):
        _call(fn, x)


@BOTH
@pytest.mark.parametrize("x", [[[[0.0] * I] * N] * T, 3.0, None, "x"],
                         ids=["list", "float", "None", "str"])
def test_x_not_an_array(fn, x):
    with _raises(TypeError, "x:", "numpy array", type(x).__name__):
        _call(fn, x)


# --- 2. h0, dhy ---------------------------------------------------------------------------------
H_BAD_SHAPES = [
    (2, N, H),          # L instead of L·D layer-directions
    (1, N, H),
    (LD + 1, N, H),
    (LD, N + 1, H),
    (LD, N, H + 1),
    (N, H),             # no layer-direction axis
    (1, LD, N, H),
]


@pytest.mark.parametrize("shape", H_BAD_SHAPES, ids=str)
@pytest.mark.parametrize("name", ["h0", "dhy"])
def test_state_bad_shape(name, shape):
    params, x, reserve = _f64()
    got = "[" + ", ".join(map(str, shape)) + "]"
    with _raises(ValueError, f"{name}:", "[L·D=4, N=2, H=3]", f"got {got}"):
        if name == "h0":
            forward(params, x, np.zeros(shape))
        else:
            backward(params, x, reserve, dhy=np.zeros(shape))


@pytest.mark.parametrize("name", ["h0", "dhy"])
def test_state_not_an_array(name):
    params, x, reserve = _f64()
    bad = np.zeros((LD, N, H)).tolist()
    with _raises(TypeError, f"{name}:", "numpy array", "list"):
        if name == "h0":
            forward(params, x, bad)
        else:
            backward(params, x, reserve, dhy=bad)


# --- 3. dy --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,batch_major", [
    ((T, N, DH - 1), False), ((T, N, H), False), ((T + 1, N, DH), False),
    ((T - 1, N, DH), False), ((T, N + 1, DH), False), ((T, N * DH), False),
    ((1, T, N, DH), False), ((T, N, DH), True), ((N, T, DH + 1), True),
], ids=str)
def test_dy_bad_shape(shape, batch_major):
    params, x, _ = _f64()
    if batch_major:
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
    reserve = forward(params, x, batch_major=batch_major, training=True).reserve
    want = "[2, 5, 6]" if batch_major else "[5, 2, 6]"
    got = "[" + ", ".join(map(str, shape)) + "]"
    with _raises(ValueError, "dy:", f"expected shape {want}", f"got {got}"):
        backward(params, x, reserve, dy=np.zeros(shape), batch_major=batch_major)


def test_dy_not_an_array():
    params, x, reserve = _f64()
    with _raises(TypeError, "dy:", "numpy array", "list"):
        backward(params, x, reserve, dy=np.zeros((T, N, DH)).tolist())


# --- 4. state_mask ------------------------------------------------------------------------------
@BOTH
@pytest.mark.parametrize("shape,batch_major", [
    ((T, N, DH - 1), False), ((T + 1, N, DH), False), ((T, N + 1, DH), False),
    ((1, T, N, DH), False), ((H,), False), ((T, N, DH), True), ((T, 1, 1), True),
], ids=str)
def test_state_mask_bad_shape(fn, shape, batch_major):
    params, x, _ = _f64()
    if batch_major:
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
    out = "[2, 5, 6]" if batch_major else "[5, 2, 6]"
    got = "[" + ", ".join(map(str, shape)) + "]"
    with _raises(ValueError, "state_mask:", "broadcastable", out, f"got {got}"):
        if fn == "forward":
            forward(params, x, state_mask=np.ones(shape), batch_major=batch_major)
        else:
            reserve = forward(params, x, batch_major=batch_major, training=True).reserve
            backward(params, x, reserve, state_mask=np.ones(shape), batch_major=batch_major)


@pytest.mark.parametrize("shape", [(T, N, DH), (T, 1, DH), (DH,), (T, N, 1), (1,)], ids=str)
def test_state_mask_broadcastable_shapes_work(shape):
    """Positive control for the test above: broadcastable shapes are accepted, and a mask of
    ones changes nothing."""
    params, x, _ = _f64()
    plain = forward(params, x)
    masked = forward(params, x, state_mask=np.ones(shape))
    np.testing.assert_allclose(masked.y, plain.y, rtol=1e-14, atol=1e-15)


# --- 5. mixed float dtypes ----------------------------------------------------------------------
def _mixed_call(params_dtype, arg):
    """Call forward/backward on ``params_dtype`` params with ``arg`` in the other dtype."""
    params, x, reserve = _case(params_dtype)
    other = np.float64 if np.dtype(params_dtype) == np.float32 else np.float32
    if arg == "x":
        return forward(params, x.astype(other))
    if arg == "x (backward)":
        return backward(params, x.astype(other), reserve)
    if arg == "h0":
        return forward(params, x, np.zeros((LD, N, H), other))
    if arg == "state_mask":
        return forward(params, x, state_mask=np.ones((T, N, DH), other))
    if arg == "dy":
        return backward(params, x, reserve, dy=np.zeros((T, N, DH), other))
    if arg == "dhy":
        return backward(params, x, reserve, dhy=np.zeros((LD, N, H), other))
    if arg == "dparams":
        return backward(params, x, reserve, dparams=Network.zeros(TOPO, other))
    raise AssertionError(arg)


@pytest.mark.parametrize("arg", ["x", "x (backward)", "h0", "state_mask", "dy", "dhy",
                                 "dparams"])
@pytest.mark.parametrize("params_dtype", ["float32", "float64"])
def test_mixed_float_dtypes(params_dtype, arg):
    other = "float64" if params_dtype == "float32" else "float32"
    name = arg.split()[0]
    with _raises(TypeError, f"{name}:", f"expected dtype {params_dtype}", f"got {other}"):
        _mixed_call(params_dtype, arg)


def test_params_of_mixed_dtypes():
    """One Params holds one dtype: a float32 R among float64 arrays is refused, naming it."""
    params = Network.random(TOPO, np.float64)
    layers = list(params)
    layers[1] = LayerParams(layers[1].W, layers[1].R.astype(np.float32), layers[1].b_W,
                            layers[1].b_R)
    with _raises(TypeError, "params[1].R", "float64", "float32"):
        Network(TOPO, layers)


# --- 6. lengths ---------------------------------------------------------------------------------
@pytest.mark.parametrize("lengths,exc,parts", [
    (np.array([-1, 2]), ValueError, ("lengths:", "[0, T=5]", "lengths[0] = -1")),
    (np.array([3, -7]), ValueError, ("lengths:", "[0, T=5]", "lengths[1] = -7")),
    (np.array([6, 2]), ValueError, ("lengths:", "[0, T=5]", "lengths[0] = 6")),
    (np.array([5, 2, 1]), ValueError, ("lengths:", "expected shape [2]", "got [3]")),
    (np.array([5]), ValueError, ("lengths:", "expected shape [2]", "got [1]")),
    (np.array([[5, 2]]), ValueError, ("lengths:", "expected shape [2]", "got [1, 2]")),
    (5, ValueError, ("lengths:", "expected shape [2]", "got []")),
    (np.array([5.0, 2.0]), TypeError, ("lengths:", "integer", "float64")),
    ([5.0, 2], TypeError, ("lengths:", "integer", "float64")),
    (np.array([np.nan, 2.0]), TypeError, ("lengths:", "integer", "float64")),
    ([float("nan"), 2], TypeError, ("lengths:", "integer", "float64")),
    (np.array([True, False]), TypeError, ("lengths:", "integer", "bool")),
    (np.array(["5", "2"]), TypeError, ("lengths:", "integer", "<U1")),
    (np.array([5, 2], object), TypeError, ("lengths:", "integer", "object")),
], ids=["neg0", "neg1", "gtT", "toolong", "tooshort", "2d", "scalar", "float", "floatlist",
        "nan", "nanlist", "bool", "str", "object"])
def test_lengths_bad(lengths, exc, parts):
    params, x, _ = _f64()
    with _raises(exc, *parts):
        forward(params, x, lengths=lengths)


def test_lengths_huge_unsigned_reports_the_actual_value():
    params, x, _ = _f64()
    with _raises(ValueError, "lengths:", "[0, T=5]", "lengths[0] = 18446744073709551615"):
        forward(params, x, lengths=np.array([2 ** 64 - 1, 2], np.uint64))


@pytest.mark.parametrize("lengths", [np.array([4, 0], np.int32), np.array([4, 0], np.uint8),
                                     [4, 0], (4, 0), np.array([0, 9, 4])[::-2]],
                         ids=["int32", "uint8", "list", "tuple", "view"])
def test_lengths_other_integer_forms_work(lengths):
    """Positive control: any integer array-like of the right size is accepted and means the
    same as int64."""
    params, x, _ = _f64()
    want = forward(params, x, lengths=np.array([4, 0], np.int64))
    got = forward(params, x, lengths=lengths)
    np.testing.assert_array_equal(got.y, want.y)
    np.testing.assert_array_equal(got.hy, want.hy)


# --- 7. the reserve -----------------------------------------------------------------------------
def _nbytes(topology=TOPO, t=T, n=N, cell=None, dtype=np.float64):
    return reserve_nbytes(topology, t, n, cell=cell, dtype=dtype)


def test_reserve_from_inference_forward():
    params, x, _ = _f64()
    fw = forward(params, x)
    assert fw.reserve is None
    with _raises(TypeError, "reserve:", "training forward", "NoneType"):
        backward(params, x, fw.reserve)


def test_reserve_empty():
    params, x, _ = _f64()
    with _raises(ValueError, "reserve:", "empty", "training=True"):
        backward(params, x, np.zeros(0, np.uint8))


@pytest.mark.parametrize("what", ["T", "N", "topology", "dtype", "reset_after"])
def test_reserve_from_a_call_of_another_size(what):
    """A reserve whose size does not fit this backward: both byte counts in the message."""
    params, x, reserve = _f64()
    if what == "T":
        other = forward(params, x[:T - 1], training=True).reserve
    elif what == "N":
        other = forward(params, x[:, :1], training=True).reserve
    elif what == "topology":
        topo1 = Topology(I, H, num_layers=1, direction="bidirectional")
        other = forward(Network.random(topo1, np.float64), x, training=True).reserve
    elif what == "dtype":
        other = _case(np.float32)[2]
    else:  # written by a reset-before forward, read by a default-cell backward
        other = forward(params.with_cell(Cell(reset_after=False)), x, training=True).reserve
    assert other.size != reserve.size
    with _raises(ValueError, "reserve:", f"expected {_nbytes()} bytes", "dtype float64",
                 f"got {other.size}"):
        backward(params, x, other)


@pytest.mark.parametrize("what", ["direction", "flip_z", "activation"])
def test_reserve_from_a_call_of_the_same_size(what):
    """Same byte count, different call: the header fingerprint catches it."""
    params, x, _ = _f64()
    cell = None
    if what == "direction":
        rev = Network.random(Topology(I, H, num_layers=2, direction="reverse"), np.float64)
        other = forward(rev, x, training=True).reserve
        params = Network.random(Topology(I, H, num_layers=2, direction="forward"), np.float64)
    elif what == "flip_z":
        other = forward(params.with_cell(Cell(flip_z=True)), x, training=True).reserve
    else:  # two non-fast cells (both save pre-activations): clip vs a relu candidate
        other = forward(params.with_cell(Cell(clip=5.0)), x, training=True).reserve
        cell = Cell(g="relu")
        params = params.with_cell(cell)
    assert other.size == _nbytes(params.topology, cell=cell)
    with _raises(ValueError, "reserve:", "different topology, cell"):
        backward(params, x, other)


@pytest.mark.parametrize("x_shape,batch_major", [
    ((T - 1, N, I), False), ((T, N - 1, I), False), ((T + 1, N, I), False), ((N, T, I), False),
    ((T, N, I), True)], ids=str)
def test_backward_x_of_another_size_than_the_reserve(x_shape, batch_major):
    """x whose T or N differs from the forward's (including T and N swapped by a wrong
    batch_major): the reserve does not fit, and the message gives the sizes."""
    params, x, reserve = _f64()
    xt, xn = (x_shape[1], x_shape[0]) if batch_major else x_shape[:2]
    want = _nbytes(t=xt, n=xn)
    with _raises(ValueError, "reserve:", f"expected {want} bytes", f"T={xt}", f"N={xn}",
                 f"got {reserve.size}"):
        backward(params, np.zeros(x_shape), reserve, batch_major=batch_major)


def test_reserve_truncated_or_padded():
    params, x, reserve = _f64()
    for bad in (reserve[:-64], reserve[:-1], np.concatenate([reserve, np.zeros(64, np.uint8)])):
        with _raises(ValueError, "reserve:", f"expected {reserve.size} bytes", f"got {bad.size}"):
            backward(params, x, bad)


@pytest.mark.parametrize("kind", ["float32", "int8", "2d", "float64"])
def test_reserve_not_uint8(kind):
    params, x, reserve = _f64()
    bad = {"float32": reserve.view(np.float32), "int8": reserve.view(np.int8),
           "2d": reserve.reshape(-1, 64), "float64": reserve.astype(np.float64)}[kind]
    with _raises(TypeError, "reserve:", "1-D uint8", str(bad.dtype), str(list(bad.shape))):
        backward(params, x, bad)


@pytest.mark.parametrize("kind", ["bytes", "list"])
def test_reserve_not_an_array(kind):
    params, x, reserve = _f64()
    bad = reserve.tobytes() if kind == "bytes" else reserve.tolist()
    with _raises(TypeError, "reserve:", type(bad).__name__):
        backward(params, x, bad)


@pytest.mark.parametrize("kind", ["random", "zeros", "ones"])
def test_reserve_garbage_of_the_right_size(kind):
    params, x, reserve = _f64()
    rng = np.random.default_rng(5)
    bad = {"random": rng.integers(0, 256, reserve.size, dtype=np.uint8),
           "zeros": np.zeros(reserve.size, np.uint8),
           "ones": np.full(reserve.size, 255, np.uint8)}[kind]
    with _raises(ValueError, "reserve:", "not a cgru reserve"):
        backward(params, x, bad)


def test_reserve_with_good_header_and_corrupt_lengths():
    params, x, reserve = _f64()
    bad = reserve.copy()
    bad[128:136] = np.array([T + 100], np.int64).view(np.uint8)  # lengths[0] (after header)
    with _raises(ValueError, "reserve:", "sequence lengths do not verify"):
        backward(params, x, bad)


@pytest.mark.parametrize("value", [1.5, np.nan, -1.0])
def test_reserve_with_corrupt_dropout_field(value):
    params, x, reserve = _f64()
    bad = reserve.copy()
    bad[48:56] = np.array([value], np.float64).view(np.uint8)  # header slot 6: dropout
    with _raises(ValueError, "reserve:"):
        backward(params, x, bad)


def test_reserve_read_only_and_misaligned_work():
    """A read-only reserve (and one at an odd address) gives the same gradients."""
    params, x, reserve = _f64()
    assert not reserve.flags.writeable
    dy = np.random.default_rng(6).standard_normal((T, N, DH))
    want = backward(params, x, reserve.copy(), dy=dy)
    got = backward(params, x, reserve, dy=dy)
    odd = np.empty(reserve.size + 1, np.uint8)[1:]
    odd[:] = reserve
    got_odd = backward(params, x, odd, dy=dy)
    for g in (got, got_odd):
        np.testing.assert_array_equal(g.dx, want.dx)
        np.testing.assert_array_equal(g.dh0, want.dh0)
        np.testing.assert_array_equal(g.dparams.flat(), want.dparams.flat())


def test_reserve_strided_view_works():
    params, x, reserve = _f64()
    dy = np.random.default_rng(7).standard_normal((T, N, DH))
    want = backward(params, x, reserve, dy=dy)
    big = np.zeros(2 * reserve.size, np.uint8)
    big[::2] = reserve
    got = backward(params, x, big[::2], dy=dy)
    np.testing.assert_array_equal(got.dx, want.dx)


# --- 8. names, dropout, threads, dparams, topology ----------------------------------------------
@pytest.mark.parametrize("direction", ["backward", "bi", "Forward", "", None, 2])
def test_topology_unknown_direction(direction):
    with _raises(ValueError, "direction:", "forward", "bidirectional", repr(direction)):
        Topology(I, H, direction=direction)


@pytest.mark.parametrize("mode", ["skip_input", "linear_input", "auto", "", None])
def test_topology_unknown_input_mode(mode):
    with _raises(ValueError, "input_mode:", "linear", "skip", "projected", repr(mode)):
        Topology(I, H, input_mode=mode)


def test_topology_skip_needs_input_size_equal_hidden_size():
    with _raises(ValueError, "input_mode='skip'", "input_size == hidden_size", "input_size=7",
                 "hidden_size=3"):
        Topology(I, H, input_mode="skip")
    assert Topology(H, H, input_mode="skip").input_size == H  # positive control


def test_topology_projected_needs_d_times_3h_inputs():
    with _raises(ValueError, "input_mode='projected'", "18", "input_size=7"):
        Topology(I, H, direction="bidirectional", input_mode="projected")


@pytest.mark.parametrize("field,value,exc,parts", [
    ("input_size", 0, ValueError, ("input_size:", "positive", "0")),
    ("hidden_size", -3, ValueError, ("hidden_size:", "positive", "-3")),
    ("num_layers", 0, ValueError, ("num_layers:", "positive", "0")),
    ("num_layers", 1.0, TypeError, ("num_layers:", "int", "float")),
    ("input_size", "7", TypeError, ("input_size:", "int", "str")),
    ("hidden_size", True, TypeError, ("hidden_size:", "int", "bool")),
    ("hidden_size", None, TypeError, ("hidden_size:", "int", "NoneType")),
])
def test_topology_bad_sizes(field, value, exc, parts):
    kw = dict(input_size=I, hidden_size=H, num_layers=1)
    kw[field] = value
    with _raises(exc, *parts):
        Topology(**kw)


@pytest.mark.parametrize("name", ["swish", "gelu", "sigmod", "", "tanh2"])
def test_unknown_activation_name(name):
    with _raises(ValueError, "activation:", repr(name), "sigmoid", "tanh"):
        Activation(name)
    for slot in ("f_r", "f_z", "g"):
        with _raises(ValueError, "activation:", repr(name)):
            Cell(**{slot: name})


@pytest.mark.parametrize("value", [3, None, 1.5, ["tanh"]])
def test_activation_of_the_wrong_type(value):
    with _raises(TypeError, "Cell.g:", "activation name", repr(value)):
        Cell(g=value)


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), "1"])
def test_activation_bad_alpha(alpha):
    with pytest.raises((TypeError, ValueError), match="alpha"):
        Activation("elu", alpha)


@pytest.mark.parametrize("kw,exc,parts", [
    (dict(reset_after="yes"), TypeError, ("Cell.reset_after:", "bool", "'yes'")),
    (dict(flip_z=2), TypeError, ("Cell.flip_z:", "bool", "2")),
    (dict(clip=-1.0), ValueError, ("Cell.clip:", "positive", "-1.0")),
    (dict(clip=0), ValueError, ("Cell.clip:", "positive", "0")),
    (dict(clip=float("nan")), ValueError, ("Cell.clip:", "positive", "nan")),
    (dict(clip="3"), ValueError, ("Cell.clip:", "positive", "'3'")),
])
def test_cell_bad_options(kw, exc, parts):
    with _raises(exc, *parts):
        Cell(**kw)


@pytest.mark.parametrize("value", [1.0, 1, 1.5, -0.1, -1e-12, float("nan"), float("inf")])
@pytest.mark.parametrize("where", ["forward", "forward_inference", "dropout_masks"])
def test_dropout_out_of_range(where, value):
    with _raises(ValueError, "dropout:", "[0, 1)", repr(value)):
        if where == "dropout_masks":
            dropout_masks(TOPO, T, N, dropout=value)
        else:
            params, x, _ = _f64()
            forward(params, x, training=where == "forward", dropout=value)


@pytest.mark.parametrize("value", ["0.5", None, True, [0.5]])
def test_dropout_of_the_wrong_type(value):
    params, x, _ = _f64()
    with _raises(TypeError, "dropout:", repr(value)):
        forward(params, x, training=True, dropout=value)


@pytest.mark.parametrize("seed,exc,parts", [
    (1.5, TypeError, ("seed:", "int", "1.5")),
    ("1", TypeError, ("seed:", "int", "'1'")),
    ((1, 2, 3), ValueError, ("seed:", "(seed, seed2)", "(1, 2, 3)")),
    ((1, "2"), TypeError, ("seed2:", "int", "'2'")),
    (2 ** 64, ValueError, ("seed:", "64-bit", str(2 ** 64))),
])
def test_bad_seed(seed, exc, parts):
    params, x, _ = _f64()
    with _raises(exc, *parts):
        forward(params, x, training=True, dropout=0.5, seed=seed)


@BOTH
@pytest.mark.parametrize("value,exc,parts", [
    (0, ValueError, ("num_threads:", "non-zero", "0")),
    (1.5, TypeError, ("num_threads:", "int", "float")),
    ("2", TypeError, ("num_threads:", "int", "str")),
    (True, TypeError, ("num_threads:", "int", "bool")),
])
def test_num_threads_bad(fn, value, exc, parts):
    params, x, _ = _f64()
    with _raises(exc, *parts):
        _call(fn, x, num_threads=value)


@pytest.mark.parametrize("what", ["topology", "direction", "dtype", "type", "accumulate",
                                  "read_only"])
def test_dparams_bad(what):
    params, x, reserve = _f64()
    if what == "topology":
        other = Topology(I, H, num_layers=1, direction="bidirectional")
        kw, exc = dict(dparams=Network.zeros(other, np.float64)), ValueError
        parts = ("dparams:", "num_layers=2", "num_layers=1")
    elif what == "direction":
        other = Topology(I, H, num_layers=2, direction="forward")
        kw, exc = dict(dparams=Network.zeros(other, np.float64)), ValueError
        parts = ("dparams:", "direction='bidirectional'", "direction='forward'")
    elif what == "dtype":
        kw, exc = dict(dparams=Network.zeros(TOPO, np.float32)), TypeError
        parts = ("dparams:", "float64", "float32")
    elif what == "type":
        kw, exc = dict(dparams=params.flat()), TypeError
        parts = ("dparams:", "cgru.Network", "ndarray")
    elif what == "accumulate":
        kw, exc = dict(accumulate=True), ValueError
        parts = ("dparams:", "accumulate=True")
    else:
        dp = Network.zeros(TOPO, np.float64)
        dp[2].R.flags.writeable = False
        kw, exc = dict(dparams=dp), ValueError
        parts = ("dparams[2].R", "read-only")
    with _raises(exc, *parts):
        backward(params, x, reserve, **kw)


@BOTH
@pytest.mark.parametrize("value", ["default", 0, {"reset_after": True}])
def test_cell_of_the_wrong_type(fn, value):
    with _raises(TypeError, "cell:", "cgru.Cell", type(value).__name__):
        _call(fn, _f64()[1], cell=value)


@BOTH
def test_params_of_the_wrong_type(fn):
    params, x, reserve = _f64()
    with _raises(TypeError, "net:", "cgru.Network", "list"):
        if fn == "forward":
            forward(list(params), x)
        else:
            backward(list(params), x, reserve)


# --- 9. reserve_nbytes, dropout_masks -----------------------------------------------------------
@pytest.mark.parametrize("fn", [reserve_nbytes, dropout_masks], ids=["reserve_nbytes",
                                                                     "dropout_masks"])
def test_size_queries_bad_dtype(fn):
    kw = dict(dropout=0.5) if fn is dropout_masks else {}
    for dt in (np.int32, np.float16, "complex128"):
        with _raises(TypeError, "dtype:", "float32 or float64", str(np.dtype(dt))):
            fn(TOPO, T, N, dtype=dt, **kw)


def test_reserve_nbytes_bad_topology_and_cell():
    with _raises(TypeError, "topology:", "cgru.Topology", "str"):
        reserve_nbytes("gru", T, N)
    with _raises(TypeError, "cell:", "cgru.Cell", "str"):
        reserve_nbytes(TOPO, T, N, cell="gru")


def test_reserve_nbytes_matches_the_reserve():
    """Positive control: the query gives the size forward returns."""
    params, x, reserve = _f64()
    assert reserve_nbytes(TOPO, T, N, dtype=np.float64) == reserve.size
    assert reserve_nbytes(TOPO, np.int64(T), np.int32(N), dtype="float64") == reserve.size


@pytest.mark.parametrize("fn", [reserve_nbytes, dropout_masks], ids=["reserve_nbytes",
                                                                     "dropout_masks"])
@pytest.mark.parametrize("arg,value,exc", [
    ("T", -1, ValueError), ("N", -2, ValueError), ("T", 0, ValueError), ("N", 0, ValueError),
    ("T", 5.5, TypeError), ("N", "2", TypeError),
], ids=["T-1", "N-2", "T0", "N0", "T5.5", "Nstr"])
def test_size_queries_bad_sizes(fn, arg, value, exc):
    sizes = dict(T=T, N=N)
    sizes[arg] = value
    kw = dict(dropout=0.5) if fn is dropout_masks else {}
    with _raises(exc, f"{arg}:", repr(value) if exc is TypeError else str(value)):
        fn(TOPO, sizes["T"], sizes["N"], **kw)


def test_dropout_masks_bad_topology():
    with _raises(TypeError, "topology:", "cgru.Topology", "str"):
        dropout_masks("gru", T, N, dropout=0.5)


# --- 10. Params, Params.from_flat --------------------------------------------------------------
def _layers_with(i, name, value):
    layers = list(Network.random(TOPO, np.float64))
    arrays = layers[i].arrays()
    arrays[name] = value
    layers[i] = LayerParams(**arrays)
    return layers


@pytest.mark.parametrize("i,name,shape,want", [
    (1, "R", (9, 4), "(9, 3)"),
    (1, "R", (3, 9), "(9, 3)"),
    (0, "W", (9, 6), "(9, 7)"),          # layer 0 reads x: width I = 7
    (2, "W", (9, 7), "(9, 6)"),          # layer 1 reads the bidirectional output: width D·H
    (3, "b_W", (9, 1), "(9,)"),
    (3, "b_R", (6,), "(9,)"),
])
def test_params_bad_shape(i, name, shape, want):
    with _raises(ValueError, f"params[{i}].{name}:", f"expected shape {want}", f"got {shape}"):
        Network(TOPO, _layers_with(i, name, np.zeros(shape)))


@pytest.mark.parametrize("dtype", [np.int64, np.float16, np.complex128, bool, object])
def test_params_non_float_dtype(dtype):
    with _raises(TypeError, "params[0].W", "float32 or float64", str(np.dtype(dtype))):
        Network(TOPO, _layers_with(0, "W", np.zeros((9, 7), dtype)))


def test_params_bad_containers():
    layers = list(Network.random(TOPO, np.float64))
    with _raises(ValueError, "params:", "expected 4 layer-directions", "got 3"):
        Network(TOPO, layers[:3])
    with _raises(TypeError, "params[2]:", "LayerParams", "tuple"):
        Network(TOPO, layers[:2] + [tuple(layers[2].arrays().values())] + layers[3:])
    with _raises(TypeError, "params[1].R:", "numpy array", "list"):
        Network(TOPO, _layers_with(1, "R", np.zeros((9, 3)).tolist()))
    with _raises(TypeError, "topology:", "cgru.Topology", "tuple"):
        Network((I, H), layers)


def test_params_dict_layer_with_missing_keys():
    layers = list(Network.random(TOPO, np.float64))
    layers[1] = {"W": layers[1].W, "R": layers[1].R}
    with _raises(TypeError, "params[1]", "b_W", "b_R"):
        Network(TOPO, layers)


@pytest.mark.parametrize("flat,exc,parts", [
    (np.zeros(5), ValueError, ("flat:", f"1-D array of {TOPO.flat_size()}", "(5,)")),
    (np.zeros(TOPO.flat_size() + 1), ValueError,
     ("flat:", str(TOPO.flat_size()), f"({TOPO.flat_size() + 1},)")),
    (np.zeros((1, TOPO.flat_size())), ValueError,
     ("flat:", "1-D", f"(1, {TOPO.flat_size()})")),
    (np.zeros(TOPO.flat_size(), np.int64), TypeError, ("flat.dtype:", "float32 or float64",
                                                        "int64")),
    ([0.0] * TOPO.flat_size(), TypeError, ("flat:", "numpy array", "list")),
], ids=["short", "long", "2d", "int", "list"])
def test_from_flat_bad(flat, exc, parts):
    with _raises(exc, *parts):
        Network.from_flat(TOPO, flat)


def test_from_flat_bad_topology():
    with _raises(TypeError, "topology:", "cgru.Topology", "str"):
        Network.from_flat("gru", np.zeros(5))


# --- 11. inputs untouched, read-only, views, NaN/Inf -------------------------------------------
CONFIGS = {
    "default": dict(topo=TOPO, cell=Cell(), batch_major=False, dropout=0.0, mask=False),
    "reset_before_clip_mask_bm": dict(
        topo=TOPO, cell=Cell(reset_after=False, f_z="hard_sigmoid", clip=2.0), batch_major=True,
        dropout=0.0, mask=True),
    "dropout_3layers_reverse": dict(
        topo=Topology(I, H, num_layers=3, direction="reverse"), cell=Cell(flip_z=True),
        batch_major=False, dropout=0.4, mask=False),
    "skip_input": dict(topo=Topology(H, H, num_layers=2, direction="bidirectional",
                                     input_mode="skip"),
                       cell=Cell(), batch_major=True, dropout=0.0, mask=True),
}


def _inputs(cfg, dtype=np.float64, seed=0):
    """Every array input of one forward + backward of ``cfg``, as a dict."""
    topo = cfg["topo"]
    rng = np.random.default_rng(seed)
    ld, dh = topo.num_layer_directions, topo.output_size
    xs = (N, T, topo.input_size) if cfg["batch_major"] else (T, N, topo.input_size)
    ys = (N, T, dh) if cfg["batch_major"] else (T, N, dh)
    arrs = dict(x=rng.standard_normal(xs), h0=rng.standard_normal((ld, N, H)),
                lengths=np.array([T, 2]), dy=rng.standard_normal(ys),
                dhy=rng.standard_normal((ld, N, H)))
    if cfg["mask"]:
        arrs["state_mask"] = rng.uniform(0.5, 1.5, ys)
    arrs = {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in arrs.items()}
    return Network.random(topo, dtype, seed=seed, cell=cfg["cell"]), arrs


def _run(cfg, params, a):
    """forward (training) then backward of ``cfg`` on the arrays ``a``."""
    common = dict(batch_major=cfg["batch_major"],
                  state_mask=a.get("state_mask"))
    fw = forward(params, a["x"], a["h0"], lengths=a["lengths"], training=True,
                 dropout=cfg["dropout"], seed=(3, 4), **common)
    g = backward(params, a["x"], fw.reserve, a["dy"], a["dhy"], **common)
    return fw, g


def _digest(a):
    return (a.shape, a.dtype.str, a.strides, hashlib.sha256(np.ascontiguousarray(a)).hexdigest())


def _assert_same(r1, r2):
    (f1, g1), (f2, g2) = r1, r2
    # (the reserve's alignment padding is not written, so its bytes are not compared; the
    # gradients read everything else in it)
    assert f1.reserve.size == f2.reserve.size
    for u, v in ((f1.y, f2.y), (f1.hy, f2.hy), (g1.dx, g2.dx), (g1.dh0, g2.dh0),
                 (g1.dparams.flat(), g2.dparams.flat())):
        np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_inputs_are_never_modified(name, poison):
    cfg = CONFIGS[name]
    params, a = _inputs(cfg)
    before = {k: _digest(v) for k, v in a.items()}
    p_before = [_digest(v) for lp in params for v in lp.arrays().values()]
    fw, g = _run(cfg, params, a)
    reserve_before = _digest(fw.reserve)
    backward(params, a["x"], fw.reserve, a["dy"], a["dhy"],
             batch_major=cfg["batch_major"], state_mask=a.get("state_mask"))
    assert {k: _digest(v) for k, v in a.items()} == before
    assert [_digest(v) for lp in params for v in lp.arrays().values()] == p_before
    assert _digest(fw.reserve) == reserve_before
    for out in (fw.y, fw.hy, g.dx, g.dh0, g.dparams.flat()):  # every output written
        assert np.isfinite(out).all()


@pytest.mark.parametrize("name", ["default", "reset_before_clip_mask_bm"])
def test_read_only_inputs_work(name):
    cfg = CONFIGS[name]
    params, a = _inputs(cfg)
    want = _run(cfg, params, a)
    ro = {k: v.copy() for k, v in a.items()}
    for v in ro.values():
        v.flags.writeable = False
    ro_params = params.copy()
    for lp in ro_params:
        for v in lp.arrays().values():
            v.flags.writeable = False
    got = _run(cfg, ro_params, ro)
    _assert_same(got, want)


def _strided_copy(a, how):
    """The values of ``a`` in a non-contiguous or negative-stride view."""
    if how == "reversed":   # negative strides on every axis
        big = np.ascontiguousarray(a[(slice(None, None, -1),) * a.ndim])
        v = big[(slice(None, None, -1),) * a.ndim]
    elif how == "fortran":
        v = np.asfortranarray(a)
    else:                   # every other element of a wider array, on every axis
        big = np.full(tuple(2 * s for s in a.shape), np.nan if a.dtype.kind == "f" else -1,
                      a.dtype)
        v = big[(slice(None, None, 2),) * a.ndim]
        v[...] = a
    np.testing.assert_array_equal(v, a)
    assert not v.flags.c_contiguous or a.ndim == 1 and how == "fortran"
    return v


@pytest.mark.parametrize("how", ["reversed", "fortran", "step2"])
@pytest.mark.parametrize("name", ["default", "reset_before_clip_mask_bm"])
def test_non_contiguous_views_give_the_same_results(name, how):
    cfg = CONFIGS[name]
    params, a = _inputs(cfg)
    want = _run(cfg, params, a)
    views = {k: _strided_copy(v, how) for k, v in a.items()}
    got = _run(cfg, params, views)
    _assert_same(got, want)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_inf_in_x_propagate_without_crash(bad, poison):
    """One non-finite entry in sequence 0 at time 2 of a one-layer forward GRU: sequence 0's
    outputs before t = 2 and everything of sequence 1 are unchanged; NaN makes sequence 0 NaN
    from t = 2 on; ±Inf gives what the NumPy reference gives (NaN where it gives NaN)."""
    topo = Topology(I, H)
    params = Network.random(topo, np.float64, seed=3)
    x = np.random.default_rng(4).standard_normal((T, N, I))
    clean = forward(params, x, training=True)
    xb = x.copy()
    xb[2, 0, 1] = bad
    fw = forward(params, xb, training=True)
    np.testing.assert_array_equal(fw.y[:2, 0], clean.y[:2, 0])
    np.testing.assert_array_equal(fw.y[:, 1], clean.y[:, 1])
    np.testing.assert_array_equal(fw.hy[:, 1], clean.hy[:, 1])
    if np.isnan(bad):
        assert np.isnan(fw.y[2:, 0]).all()
        assert np.isnan(fw.hy[:, 0]).all()
    else:
        y_ref, hy_ref = reference.forward(params, xb)
        np.testing.assert_allclose(fw.y, y_ref, rtol=1e-12, atol=1e-14, equal_nan=True)
        np.testing.assert_allclose(fw.hy, hy_ref, rtol=1e-12, atol=1e-14, equal_nan=True)
    dy = np.ones((T, N, H))
    g = backward(params, xb, fw.reserve, dy)
    g_clean = backward(params, x, clean.reserve, dy)
    np.testing.assert_allclose(g.dx[:, 1], g_clean.dx[:, 1], rtol=1e-12, atol=1e-14)
    if np.isnan(bad):
        assert np.isnan(g.dx[:3, 0]).any()


def test_nan_in_x_of_a_bidirectional_stack(poison):
    """NaN in a bidirectional two-layer stack reaches every output of its sequence (the
    reverse direction carries it back in time, layer 2 mixes both), never the other one."""
    params, x, _ = _f64()
    xb = x.copy()
    xb[2, 0, 3] = np.nan
    fw = forward(params, xb, training=True)
    clean = forward(params, x)
    assert np.isnan(fw.y[:, 0]).all()
    np.testing.assert_array_equal(fw.y[:, 1], clean.y[:, 1])
    g = backward(params, xb, fw.reserve, np.ones((T, N, DH)))
    assert np.isfinite(g.dx[:, 1]).all()


# --- 4. flags, thread counts, masked arrays, activation parameters ----------------------------
@pytest.mark.parametrize("kw", [dict(training="no"), dict(batch_major=[]), dict(training=1),
                                dict(batch_major=np.array([True]))], ids=str)
def test_forward_flags_must_be_bools(kw):
    """A flag is never read by truthiness: ``training="no"`` is a TypeError, not True."""
    params, x, _ = _f64()
    name = next(iter(kw))
    with _raises(TypeError, f"{name}:", "bool"):
        forward(params, x, **kw)


@pytest.mark.parametrize("kw", [dict(accumulate="yes"), dict(batch_major=None)], ids=str)
def test_backward_flags_must_be_bools(kw):
    params, x, reserve = _f64()
    name = next(iter(kw))
    with _raises(TypeError, f"{name}:", "bool"):
        backward(params, x, reserve, **kw)


@BOTH
@pytest.mark.parametrize("value", [2 ** 31, 10 ** 6, -10 ** 6])
def test_num_threads_beyond_any_machine_is_a_value_error(fn, value):
    """Not an OverflowError from deep inside: a ValueError naming the argument."""
    params, x, _ = _f64()
    with _raises(ValueError, "num_threads:", "at most"):
        _call(fn, x, num_threads=value)


@pytest.mark.parametrize("arg", ["x", "h0", "state_mask", "weight"])
def test_masked_arrays_are_refused(arg):
    """cgru would ignore a masked array's mask: refused, never silently unmasked."""
    params, x, _ = _f64()
    kw = {}
    if arg == "x":
        x = np.ma.masked_array(x, mask=x > 1)
    elif arg == "h0":
        kw["h0"] = np.ma.masked_array(np.zeros((LD, N, H)))
    elif arg == "state_mask":
        kw["state_mask"] = np.ma.masked_array(np.ones((T, N, DH)))
    else:
        lp = params[0]
        with _raises(TypeError, "params[0].W:", "masked array"):
            Network(TOPO, [LayerParams(np.ma.masked_array(lp.W), lp.R, lp.b_W, lp.b_R)]
                   + list(params)[1:])
        return
    with _raises(TypeError, f"{arg}:", "masked array"):
        forward(params, x, **kw)


@pytest.mark.parametrize("act", [("scaled_tanh", 1e300, 1e300), ("affine", 1e39, 0.0),
                                 ("leaky_relu", -1e40, 0.0)], ids=str)
def test_activation_parameters_beyond_float32(act):
    """In float32 such an alpha/beta would overflow to inf (all-NaN results): refused for a
    float32 network, accepted in float64."""
    cell = Cell(g=act)
    p32 = _case(np.float32)[0]
    x32 = np.zeros((T, N, I), np.float32)
    with _raises(ValueError, "cell.g:", "float32"):
        forward(p32.with_cell(cell), x32)
    p64, x64, _ = _f64()
    forward(p64.with_cell(cell), x64)


# --- 5. no silent copies: a network keeps the caller's arrays ------------------------------------
def test_network_keeps_the_callers_arrays_in_any_layout():
    """Weights in Fortran order, transposed views, strided views: kept as given, so that an
    update in place is what the next call computes with (no stale copy)."""
    topo = Topology(I, H)
    rng = np.random.default_rng(7)
    W = np.asfortranarray(rng.standard_normal((3 * H, I)))
    R = rng.standard_normal((H, 3 * H)).T                # a transposed view
    b_W = rng.standard_normal(6 * H)[::2]                # a strided view
    b_R = rng.standard_normal(3 * H)
    net = Network(topo, [LayerParams(W, R, b_W, b_R)])
    assert net[0].W is W and net[0].R is R and net[0].b_W is b_W
    x = rng.standard_normal((T, N, I))
    y1 = forward(net, x).y
    np.testing.assert_allclose(y1, reference.forward(net, x)[0], rtol=1e-12, atol=1e-13)
    R *= 0.5                                             # the caller updates in place
    y2 = forward(net, x).y
    assert not np.allclose(y1, y2)
    np.testing.assert_allclose(y2, reference.forward(net, x)[0], rtol=1e-12, atol=1e-13)


def test_dparams_of_any_layout_receive_the_gradients_in_place():
    params, x, reserve = _f64()
    want = backward(params, x, reserve).dparams
    layers = [LayerParams(*(np.asfortranarray(np.ones_like(a)) if a.ndim == 2 else
                            np.ones(2 * a.size)[::2] for a in lp.arrays().values()))
              for lp in want]
    dparams = Network(TOPO, layers)
    held = [a for lp in dparams for a in lp.arrays().values()]
    got = backward(params, x, reserve, dparams=dparams, accumulate=True).dparams
    assert got is dparams
    for w, g in zip(want, got):
        for name in ("W", "R", "b_W", "b_R"):
            np.testing.assert_allclose(getattr(g, name), getattr(w, name) + 1, rtol=1e-13)
    assert all(a is b for a, b in zip([a for lp in got for a in lp.arrays().values()], held))


def test_padded_lengths_are_told_apart_from_full_ones():
    """``validate.padded``: the shared lengths of a call without any are known by identity;
    any other array is read (an equal copy of full lengths too)."""
    from cgru.core import validate
    assert not validate.padded(validate.full_lengths(5, 3), 5)
    assert not validate.padded(np.array([5, 5, 5], np.int64), 5)
    assert validate.padded(np.array([5, 4, 5], np.int64), 5)
    assert validate.padded(np.array([0], np.int64), 1)
    assert not validate.padded(np.zeros(0, np.int64), 5)
