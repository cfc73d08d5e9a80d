"""The C ABI: include/cgru.h and libcgru.

The C programs in tests/c are compiled here with the system compiler exactly as a user would
(``cc -Wall -Wextra -Werror -std=c99 prog.c $(python -m cgru --cflags --libs)``) and run with a
bare environment (no PYTHONPATH, no virtual environment on PATH): libcgru must find and start
the Python runtime of the environment where cgru is installed by itself.  Their results are
compared with cgru's Python API.  libcgru is also loaded into this (running) Python process with
ctypes, where it must join the interpreter.
"""
import ctypes
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

import cgru
from cgru import capi, tf
from cgru.capi.info import library_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C_DIR = os.path.join(ROOT, "tests", "c")
HEADER = os.path.join(ROOT, "include", "cgru.h")
CC = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
CXX = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the C tests use a POSIX shell")

# the example's problem (tests/c/gru_example.c)
T, N, I, H, L, D = 5, 5, 3, 4, 2, 2
TOL = {"float": 1e-6, "double": 1e-12}
DTYPE = {"float": np.float32, "double": np.float64}


def _bare_env(**extra):
    """What a user's shell might have: no Python variables at all."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    env.update(extra)
    return env


def _flags_command():
    return f"$({shlex.quote(sys.executable)} -m cgru --cflags --libs)"


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """``build(source, *flags, cxx=False) -> path of the program``, compiled once per module."""
    if CC is None:
        pytest.skip("no C compiler")
    if not os.path.isfile(library_path()):
        pytest.fail(f"{library_path()} is missing: libcgru was not built (pip install -e .)")
    out = tmp_path_factory.mktemp("capi")
    built = {}

    def build(source, *flags, cxx=False):
        if source not in built:
            exe = out / os.path.splitext(os.path.basename(source))[0]
            if cxx:
                if CXX is None:
                    pytest.skip("no C++ compiler")
                compiler = f"{CXX} -std=c++11 -Wall -Wextra -Werror -pedantic"
            else:
                compiler = f"{CC} -std=c99 -Wall -Wextra -Werror"
            cmd = (f"{compiler} {' '.join(flags)} -I{shlex.quote(C_DIR)} "
                   f"{shlex.quote(os.path.join(C_DIR, source))} -o {shlex.quote(str(exe))} "
                   f"{_flags_command()}")
            res = subprocess.run(cmd, shell=True, capture_output=True, text=True, cwd=out)
            assert res.returncode == 0, f"{cmd}\n{res.stdout}{res.stderr}"
            built[source] = str(exe)
        return built[source]
    return build


def _run(args, env=None, timeout=120):
    return subprocess.run(args, capture_output=True, text=True, env=env or _bare_env(),
                          timeout=timeout)


def _read_results(path):
    """The arrays a test program dumped (tests/c/common.h)."""
    kinds = {0: np.float32, 1: np.float64, 2: np.int32, 3: np.int64}
    data = open(path, "rb").read()
    out, pos = {}, 0
    while pos < len(data):
        name = data[pos:pos + 16].split(b"\0")[0].decode()
        kind = int(np.frombuffer(data, np.int32, 1, pos + 16)[0])
        count = int(np.frombuffer(data, np.int64, 1, pos + 20)[0])
        dt = np.dtype(kinds[kind])
        out[name] = np.frombuffer(data, dt, count, pos + 28).copy()
        pos += 28 + count * dt.itemsize
    return out


@pytest.fixture(scope="module")
def example_results(build, tmp_path_factory):
    """``results(dtype, layout) -> dict`` of tests/c/gru_example.c, run once per argument pair."""
    exe = build("gru_example.c")
    out = tmp_path_factory.mktemp("example")
    cache = {}

    def results(dtype, layout):
        if (dtype, layout) not in cache:
            path = out / f"{dtype}_{layout}.bin"
            res = _run([exe, dtype, layout, str(path)])
            assert res.returncode == 0, res.stdout + res.stderr
            assert "OK" in res.stdout
            cache[dtype, layout] = _read_results(path)
        return cache[dtype, layout]
    return results


# --- discovery: flags, header, exported symbols ---------------------------------------------
def test_cflags_libs_name_the_header_and_the_library(tmp_path):
    def flags(*args):  # run outside the source tree, as a user would
        return subprocess.run([sys.executable, "-m", "cgru", *args], capture_output=True,
                              text=True, cwd=tmp_path)
    res = flags("--cflags", "--libs")
    assert res.returncode == 0, res.stderr
    words = res.stdout.split()
    inc = [w[2:] for w in words if w.startswith("-I")]
    libdirs = [w[2:] for w in words if w.startswith("-L")]
    assert inc == [cgru.get_include()]
    assert os.path.isfile(os.path.join(inc[0], "cgru.h"))
    assert "-lcgru" in words and len(libdirs) == 1
    assert os.path.isfile(os.path.join(libdirs[0], os.path.basename(library_path())))
    assert f"-Wl,-rpath,{libdirs[0]}" in words
    assert flags("--cflags").stdout.split() == [f"-I{inc[0]}"]
    bad = flags("--cflags", "--nope")
    assert bad.returncode == 2 and "--nope" in bad.stderr


def _header_functions():
    text = open(HEADER).read()
    return set(re.findall(r"CGRU_API\s+[\w\s\*]+?\b(cgru_\w+)\s*\(", text))


def test_library_exports_exactly_the_header_functions():
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm")
    res = subprocess.run([nm, "-D", "--defined-only", library_path()], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    exported = {line.split()[-1] for line in res.stdout.splitlines()
                if line.split() and line.split()[-2] in ("T", "W")}
    functions = _header_functions()
    assert len(functions) == 10
    assert exported == functions


def test_status_codes_match_the_header():
    text = open(HEADER).read()
    codes = {name: int(v) for name, v in re.findall(r"CGRU_STATUS_(\w+)\s*=\s*(\d+)", text)}
    assert codes == {"SUCCESS": capi.SUCCESS, "BAD_PARAM": capi.BAD_PARAM,
                     "NOT_SUPPORTED": capi.NOT_SUPPORTED, "ALLOC_FAILED": capi.ALLOC_FAILED,
                     "INTERNAL_ERROR": capi.INTERNAL_ERROR,
                     "RUNTIME_UNAVAILABLE": capi.RUNTIME_UNAVAILABLE,
                     "BUFFER_TOO_SMALL": capi.BUFFER_TOO_SMALL}
    version = {k: int(v) for k, v in re.findall(r"#define CGRU_VERSION_(\w+) (\d+)", text)}
    assert "{MAJOR}.{MINOR}.{PATCH}".format(**version) == cgru.__version__


def test_header_compiles_as_cpp(build):
    res = _run([build("header_check.cpp", cxx=True)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"C++: cgru {cgru.__version__}" in res.stdout


def test_readme_example_program(build):
    """examples/gru_forward.c (the README's C section) builds warning-free and computes what
    cgru.forward computes."""
    exe = build(os.path.join("..", "..", "examples", "gru_forward.c"))
    res = _run([exe])
    assert res.returncode == 0, res.stdout + res.stderr
    hy = np.array([float(v) for v in res.stdout.split()]).reshape(2, 5)
    topo = cgru.Topology(3, 5)
    f32 = np.float32
    flat = f32(0.1) * (np.arange(topo.flat_size()) % 7).astype(f32) - f32(0.3)
    x = (f32(0.05) * np.arange(4 * 2 * 3).astype(f32)).reshape(4, 2, 3)
    want = cgru.forward(cgru.Params.from_flat(topo, flat), x, lengths=[4, 2]).hy[0]
    np.testing.assert_allclose(hy, want, atol=1e-6)


# --- the example against the Python API -----------------------------------------------------
def _topology():
    return cgru.Topology(I, H, num_layers=L, direction="bidirectional")


@pytest.mark.parametrize("layout", ["time", "batch"])
@pytest.mark.parametrize("dtype", ["float", "double"])
def test_example_matches_the_python_api(example_results, dtype, layout):
    r = example_results(dtype, layout)
    dt, tol = DTYPE[dtype], TOL[dtype]
    batch_major = layout == "batch"
    params = cgru.Params.from_flat(_topology(), r["weights"])
    xshape = (N, T, I) if batch_major else (T, N, I)
    yshape = (N, T, D * H) if batch_major else (T, N, D * H)
    hshape = (L * D, N, H)
    x, hx = r["x"].reshape(xshape), r["hx"].reshape(hshape)
    dy, dhy = r["dy"].reshape(yshape), r["dhy"].reshape(hshape)
    lengths = r["seq_lengths"]
    assert list(lengths) == [5, 2, 0, 4, 1]

    inf = cgru.forward(params, x, hx, lengths=lengths, batch_major=batch_major)
    f = cgru.forward(params, x, hx, lengths=lengths, batch_major=batch_major, training=True)
    g = cgru.backward(params, x, f.reserve, dy, dhy, batch_major=batch_major)
    expected = {"y_inf": inf.y, "hy_inf": inf.hy, "y": f.y, "hy": f.hy, "dx": g.dx,
                "dhx": g.dh0, "dw": g.dparams.flat(), "dw_twice": 2 * g.dparams.flat()}
    for name, want in expected.items():
        got = r[name]
        assert got.dtype == dt and got.size == want.size, name
        np.testing.assert_allclose(got, want.reshape(-1), rtol=tol, atol=tol, err_msg=name)
    assert np.all(r["y"].reshape(yshape)[(np.arange(T)[:, None] >= lengths) if not batch_major
                                         else (np.arange(T)[None, :] >= lengths[:, None])] == 0)
    assert np.abs(r["dw"]).max() > 0.1  # the gradients are not trivially zero


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_size_queries_agree_with_the_python_api(example_results, dtype):
    r = example_results(dtype, "time")
    dt = np.dtype(DTYPE[dtype])
    topo = _topology()
    weight_bytes, work_inf, reserve_inf, work_tr, reserve_tr = r["sizes"]
    assert weight_bytes == topo.flat_size() * dt.itemsize
    assert weight_bytes == tf.params_size(L, H, I, dtype=dt, direction="bidirectional") * \
        dt.itemsize
    assert (work_inf, reserve_inf, work_tr) == (0, 0, 0)
    # the training reserve holds the engine's reserve, a copy of x and the weight gradients
    assert reserve_tr >= cgru.reserve_nbytes(topo, T, N, dtype=dt) + T * N * I * dt.itemsize + \
        weight_bytes
    assert reserve_tr % 64 == 0


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_weight_params_address_cgru_tf_layout(example_results, dtype):
    """The example filled the weight space only through cgru_get_weight_params (the rest stayed
    NaN bytes); every matrix and bias must sit where cgru.tf's opaque layout has it."""
    r = example_results(dtype, "time")
    dt = np.dtype(DTYPE[dtype])
    space = r["weights"]
    assert np.isfinite(space).all()  # every element was reached through the accessor
    weights, biases = tf.params_to_canonical(L, H, I, space, direction="bidirectional")
    where = r["where"].reshape(L * D, 6, 5)
    raw = space.view(np.uint8)
    for pl in range(L * D):
        for k in range(6):
            m_off, rows, cols, b_off, b_len = (int(v) for v in where[pl, k])
            w, b = weights[pl * 6 + k], biases[pl * 6 + k]
            assert (rows, cols) == w.shape and b_len == b.size == H
            got_w = raw[m_off:m_off + w.nbytes].view(dt).reshape(w.shape)
            np.testing.assert_array_equal(got_w, w, err_msg=f"matrix {pl}/{k}")
            np.testing.assert_array_equal(raw[b_off:b_off + b.nbytes].view(dt), b,
                                          err_msg=f"bias {pl}/{k}")


# --- bad arguments, threads, the runtime ----------------------------------------------------
# name -> documented status (include/cgru.h); the *_ok cases are positive controls
BAD_ARGUMENTS = {
    "desc_init_null": "BAD_PARAM", "desc_null": "BAD_PARAM",
    "desc_not_initialised": "BAD_PARAM", "size_out_null": "BAD_PARAM",
    "data_type_unknown": "BAD_PARAM", "data_type_half": "NOT_SUPPORTED",
    "hidden_size_zero": "BAD_PARAM", "input_size_negative": "BAD_PARAM",
    "num_layers_zero": "BAD_PARAM", "direction_unknown": "BAD_PARAM",
    "input_mode_unknown": "BAD_PARAM", "skip_input_size_mismatch": "BAD_PARAM",
    "reset_after_not_bool": "BAD_PARAM", "num_threads_negative": "BAD_PARAM",
    "dropout_one": "BAD_PARAM", "dropout_negative": "BAD_PARAM", "dropout_nan": "BAD_PARAM",
    "temp_fwd_mode_unknown": "BAD_PARAM", "temp_seq_length_zero": "BAD_PARAM",
    "temp_batch_negative": "BAD_PARAM", "temp_outputs_null_ok": "SUCCESS",
    "params_pseudo_layer_too_big": "BAD_PARAM", "params_pseudo_layer_negative": "BAD_PARAM",
    "params_lin_layer_id_6": "BAD_PARAM", "params_weight_space_null": "BAD_PARAM",
    "params_weight_space_too_small": "BUFFER_TOO_SMALL", "params_outputs_null_ok": "SUCCESS",
    "fwd_desc_null": "BAD_PARAM", "fwd_x_null": "BAD_PARAM", "fwd_y_null": "BAD_PARAM",
    "fwd_weight_space_null": "BAD_PARAM", "fwd_weight_space_too_small": "BUFFER_TOO_SMALL",
    "fwd_reserve_null": "BAD_PARAM", "fwd_reserve_too_small": "BUFFER_TOO_SMALL",
    "fwd_mode_unknown": "BAD_PARAM", "fwd_layout_unknown": "BAD_PARAM",
    "fwd_seq_length_zero": "BAD_PARAM", "fwd_length_above_T": "BAD_PARAM",
    "fwd_length_negative": "BAD_PARAM", "fwd_x_misaligned": "BAD_PARAM",
    "fwd_inference_reserve_null_ok": "SUCCESS", "fwd_training_ok": "SUCCESS",
    "bww_before_backward_data": "BAD_PARAM", "bwd_dx_null": "BAD_PARAM",
    "bwd_weight_space_null": "BAD_PARAM", "bwd_reserve_null": "BAD_PARAM",
    "bwd_reserve_too_small": "BUFFER_TOO_SMALL", "bwd_reserve_never_written": "BAD_PARAM",
    "bwd_other_lengths": "BAD_PARAM", "bwd_other_layout": "BAD_PARAM", "bwd_ok": "SUCCESS",
    "bww_mode_unknown": "BAD_PARAM", "bww_dweight_space_null": "BAD_PARAM",
    "bww_dweight_space_too_small": "BUFFER_TOO_SMALL", "bww_reserve_null": "BAD_PARAM",
    "bww_ok": "SUCCESS",
}
# a word each message must contain: the argument it names
NAMED_ARGUMENT = {"fwd_x_null": "x:", "fwd_y_null": "y:", "bwd_dx_null": "dx:",
                  "fwd_length_above_T": "seq_lengths[1]", "size_out_null": "weight_space_size",
                  "fwd_reserve_too_small": "reserve_space_size", "desc_not_initialised":
                  "cgru_rnn_desc_init", "bww_before_backward_data": "cgru_rnn_backward_data"}


def test_every_bad_argument_returns_its_documented_status(build):
    res = _run([build("gru_bad_args.c", "-lm")])
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [line.split("\t") for line in res.stdout.splitlines()]
    cases = {f[0]: f[1:] for f in lines if not f[0].startswith("error_string_")}
    assert set(cases) == set(BAD_ARGUMENTS)
    for name, want in BAD_ARGUMENTS.items():
        status, message = cases[name]
        assert status == f"CGRU_STATUS_{want}", f"{name}: {status} {message}"
        if want == "SUCCESS":
            assert message == "", name  # a success clears the thread's message
        else:
            assert len(message) > 20, name
    for name, word in NAMED_ARGUMENT.items():
        assert word in cases[name][1], (name, cases[name][1])
    strings = {f[0]: f[1] for f in lines if f[0].startswith("error_string_")}
    names = ["SUCCESS", "BAD_PARAM", "NOT_SUPPORTED", "ALLOC_FAILED", "INTERNAL_ERROR",
             "RUNTIME_UNAVAILABLE", "BUFFER_TOO_SMALL", "UNKNOWN"]
    assert strings == {f"error_string_{i}": f"CGRU_STATUS_{n}" for i, n in enumerate(names)}


def test_four_threads_at_once_match_the_serial_results(build):
    res = _run([build("gru_threads.c", "-pthread")])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "threads: OK" in res.stdout


def test_runtime_unavailable_is_a_status(build, tmp_path):
    exe = build("gru_example.c")
    res = _run([exe, "float", "time", str(tmp_path / "r.bin")],
               env=_bare_env(CGRU_PYTHON="/nonexistent/bin/python"))
    assert res.returncode == 1
    assert "CGRU_STATUS_RUNTIME_UNAVAILABLE" in res.stderr and "CGRU_PYTHON" in res.stderr
    # the same variable naming this environment's python works
    ok = _run([exe, "float", "time", str(tmp_path / "r.bin")],
              env=_bare_env(CGRU_PYTHON=sys.executable))
    assert ok.returncode == 0, ok.stderr


def test_embedded_runtime_is_this_environment(build, tmp_path):
    """With nothing set up, libcgru runs the Python of the environment cgru is installed in
    (a virtual environment's site-packages, not its base Python's): numpy comes from where this
    process has it."""
    res = _run([build("gru_example.c"), "float", "time", str(tmp_path / "r.bin")],
               env=_bare_env(PYTHONVERBOSE="1"))
    assert res.returncode == 0, res.stderr[-2000:]
    numpy_dir = os.path.dirname(np.__file__)
    packages = re.findall(r"code object from '([^']*)[/\\]__pycache__[/\\]__init__\.[^']*'",
                          res.stderr)
    numpy_loaded = [d for d in packages if os.path.basename(d) == "numpy" and
                    os.path.basename(os.path.dirname(d)) in ("site-packages", "dist-packages")]
    assert numpy_loaded == [numpy_dir]


# --- valgrind ---------------------------------------------------------------------------------
def _valgrind(args):
    supp = os.path.join(C_DIR, "valgrind.supp")
    cmd = ["valgrind", "--error-exitcode=99", f"--suppressions={supp}", "--leak-check=full",
           "--show-leak-kinds=definite", "--errors-for-leak-kinds=definite"] + args
    # CPython's small-object allocator confuses memcheck: use malloc (documented in the .supp)
    return _run(cmd, env=_bare_env(PYTHONMALLOC="malloc", OMP_NUM_THREADS="1"), timeout=300)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_example_runs_clean_under_valgrind(build, tmp_path):
    res = _valgrind([build("gru_example.c"), "float", "batch", str(tmp_path / "r.bin")])
    assert res.returncode == 0, res.stderr[-4000:]
    assert "ERROR SUMMARY: 0 errors" in res.stderr
    assert "definitely lost: 0 bytes" in res.stderr or "no leaks are possible" in res.stderr


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_valgrind_setup_catches_an_invalid_read(build, tmp_path):
    """The same valgrind command fails on a program that reads past a malloc'd block."""
    src = tmp_path / "overread.c"
    src.write_text('#include <stdlib.h>\n#include <stdio.h>\n#include "cgru.h"\n'
                   "int main(void) { volatile int *p = malloc(4 * sizeof(int)); p[0] = 1;\n"
                   "  int v = p[4]; printf(\"%d %d\\n\", v, cgru_get_version()); free((void *)p);"
                   " return 0; }\n")
    exe = tmp_path / "overread"
    cmd = f"{CC} -std=c99 {src} -o {exe} {_flags_command()}"
    assert subprocess.run(cmd, shell=True, cwd=tmp_path).returncode == 0
    res = _valgrind([str(exe)])
    assert res.returncode == 99 and "Invalid read" in res.stderr


# --- loaded into this running Python process --------------------------------------------------
class _Desc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("data_type", ctypes.c_int32),
                ("input_size", ctypes.c_int32), ("hidden_size", ctypes.c_int32),
                ("num_layers", ctypes.c_int32), ("direction", ctypes.c_int32),
                ("input_mode", ctypes.c_int32), ("reset_after", ctypes.c_int32),
                ("num_threads", ctypes.c_int32), ("dropout", ctypes.c_double),
                ("seed", ctypes.c_int64), ("seed2", ctypes.c_int64)]


@pytest.fixture(scope="module")
def lib():
    if not os.path.isfile(library_path()):
        pytest.fail(f"{library_path()} is missing: libcgru was not built (pip install -e .)")
    lib = ctypes.CDLL(library_path())
    lib.cgru_get_last_error_message.restype = ctypes.c_char_p
    lib.cgru_get_error_string.restype = ctypes.c_char_p
    return lib


def _ptr(a):
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


def _call(lib, name, *args):
    status = getattr(lib, name)(*args)
    assert status == 0, (name, status, lib.cgru_get_last_error_message().decode())


# (name, Topology kwargs, cell reset_after, dropout, batch_major, dtype)
IN_PROCESS = [
    ("reverse_reset_before", dict(input_size=3, hidden_size=5, direction="reverse"), 0, 0.0,
     False, np.float64),
    ("skip_input_bidirectional", dict(input_size=4, hidden_size=4, num_layers=2,
                                      direction="bidirectional", input_mode="skip"), 1, 0.0,
     True, np.float32),
    ("three_layers_dropout", dict(input_size=2, hidden_size=3, num_layers=3), 1, 0.4, False,
     np.float64),
]


@pytest.mark.parametrize("name,topo_kw,reset_after,dropout,batch_major,dtype", IN_PROCESS,
                         ids=[c[0] for c in IN_PROCESS])
def test_in_process_joins_the_running_interpreter(lib, name, topo_kw, reset_after, dropout,
                                                   batch_major, dtype):
    """ctypes releases the GIL; libcgru takes it again and runs in this interpreter."""
    topo = cgru.Topology(**topo_kw)
    desc = _Desc()
    _call(lib, "cgru_rnn_desc_init", ctypes.byref(desc))
    desc.data_type = 1 if dtype == np.float64 else 0
    desc.input_size, desc.hidden_size = topo.input_size, topo.hidden_size
    desc.num_layers = topo.num_layers
    desc.direction = {"forward": 0, "bidirectional": 1, "reverse": 2}[topo.direction]
    desc.input_mode = {"linear": 0, "skip": 1}[topo.input_mode]
    desc.reset_after, desc.dropout, desc.seed, desc.seed2 = reset_after, dropout, 11, -3
    desc.num_threads = 2  # results do not depend on it
    Tn, Nn = 4, 3
    rng = np.random.default_rng(5)
    params = cgru.Params.random(topo, dtype, seed=3)
    cell = cgru.Cell(reset_after=bool(reset_after))
    x = rng.standard_normal((Nn, Tn, topo.input_size) if batch_major
                            else (Tn, Nn, topo.input_size)).astype(dtype)
    hshape = (topo.num_layer_directions, Nn, topo.hidden_size)
    lengths = np.array([4, 0, 2], np.int32)
    f = cgru.forward(params, x, None, cell=cell, lengths=lengths, batch_major=batch_major,
                     training=True, dropout=dropout, seed=(11, -3))
    dy = rng.standard_normal(f.y.shape).astype(dtype)
    g = cgru.backward(params, x, f.reserve, dy, None, cell=cell, batch_major=batch_major)

    wbytes, work, reserve_bytes = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
    _call(lib, "cgru_get_weight_space_size", ctypes.byref(desc), ctypes.byref(wbytes))
    _call(lib, "cgru_get_temp_space_sizes", ctypes.byref(desc), 1, Tn, Nn, ctypes.byref(work),
          ctypes.byref(reserve_bytes))
    weights = params.flat()
    assert wbytes.value == weights.nbytes
    y, hy = np.full_like(f.y, np.nan), np.full(hshape, np.nan, dtype)
    dx, dhx = np.full_like(x, np.nan), np.full(hshape, np.nan, dtype)
    dweights = np.ones_like(weights)
    reserve = np.zeros(reserve_bytes.value // 8, np.int64)
    layout = int(batch_major)
    _call(lib, "cgru_rnn_forward", ctypes.byref(desc), 1, layout, Tn, Nn, _ptr(lengths),
          _ptr(x), _ptr(y), None, _ptr(hy), wbytes, _ptr(weights), work, None, reserve_bytes,
          _ptr(reserve))
    _call(lib, "cgru_rnn_backward_data", ctypes.byref(desc), layout, Tn, Nn, _ptr(lengths),
          _ptr(dy), _ptr(dx), None, _ptr(dhx), wbytes, _ptr(weights), work, None, reserve_bytes,
          _ptr(reserve))
    _call(lib, "cgru_rnn_backward_weights", ctypes.byref(desc), 0, layout, Tn, Nn,
          _ptr(lengths), wbytes, _ptr(dweights), work, None, reserve_bytes, _ptr(reserve))
    tol = 1e-12 if dtype == np.float64 else 1e-6
    for got, want in ((y, f.y), (hy, f.hy), (dx, g.dx), (dhx, g.dh0),
                      (dweights, 1 + g.dparams.flat())):  # ADD onto ones
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if dropout:  # the masks are really applied, and are those of (seed, seed2)
        other = cgru.forward(params, x, None, cell=cell, lengths=lengths,
                             batch_major=batch_major, training=True, dropout=dropout, seed=12)
        assert not np.allclose(other.y, y)


def test_in_process_calls_from_python_threads(lib):
    """Several Python threads call libcgru at once (each call takes the GIL inside)."""
    topo = cgru.Topology(3, 4, num_layers=2, direction="bidirectional")
    params = cgru.Params.random(topo, np.float64, seed=1)
    weights = params.flat()
    desc = _Desc()
    _call(lib, "cgru_rnn_desc_init", ctypes.byref(desc))
    desc.data_type, desc.input_size, desc.hidden_size = 1, 3, 4
    desc.num_layers, desc.direction = 2, 1
    xs = [np.random.default_rng(k).standard_normal((6, 9, 3)) for k in range(4)]
    ys = [np.empty((6, 9, 8)) for _ in range(4)]
    statuses = [None] * 4

    def work(k):
        for _ in range(3):
            statuses[k] = lib.cgru_rnn_forward(
                ctypes.byref(desc), 0, 0, 6, 9, None, _ptr(xs[k]), _ptr(ys[k]), None, None,
                ctypes.c_size_t(weights.nbytes), _ptr(weights), ctypes.c_size_t(0), None,
                ctypes.c_size_t(0), None)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [0] * 4
    for k in range(4):
        np.testing.assert_array_equal(ys[k], cgru.forward(params, xs[k]).y)


def test_weight_params_of_skip_input(lib):
    """With CGRU_SKIP_INPUT the layer-0 input matrices are not stored: NULL, {H, 0}."""
    desc = _Desc()
    _call(lib, "cgru_rnn_desc_init", ctypes.byref(desc))
    desc.input_size = desc.hidden_size = 4
    desc.num_layers, desc.direction, desc.input_mode = 2, 1, 1
    topo = cgru.Topology(4, 4, 2, "bidirectional", "skip")
    space = np.zeros(topo.flat_size(), np.float32)
    m, b = ctypes.c_void_p(), ctypes.c_void_p()
    dims, b_dim = (ctypes.c_int32 * 2)(), ctypes.c_int32()
    base = space.ctypes.data
    for pl, k, stored in ((0, 0, False), (1, 2, False), (1, 3, True), (2, 0, True)):
        _call(lib, "cgru_get_weight_params", ctypes.byref(desc), pl, ctypes.c_size_t(space.nbytes),
              _ptr(space), k, ctypes.byref(m), dims, ctypes.byref(b), ctypes.byref(b_dim))
        assert (m.value is not None) == stored
        assert list(dims) == [4, topo.shapes(pl)["W"][1] if k < 3 else 4] and b_dim.value == 4
        assert base <= b.value < base + space.nbytes


def test_in_process_errors_are_statuses(lib):
    desc = _Desc()
    _call(lib, "cgru_rnn_desc_init", ctypes.byref(desc))
    desc.input_size, desc.hidden_size = 3, 0
    size = ctypes.c_size_t()
    status = lib.cgru_get_weight_space_size(ctypes.byref(desc), ctypes.byref(size))
    assert status == capi.BAD_PARAM
    assert b"desc->hidden_size" in lib.cgru_get_last_error_message()
    assert lib.cgru_get_error_string(status) == b"CGRU_STATUS_BAD_PARAM"
