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
import sysconfig
import threading

import numpy as np
import pytest

import cgru
from cgru import capi, tf
from cgru.capi.info import library_path
from cgru._kernels.threads import MAX_THREADS

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


# kept from this process's environment: the settings of a sanitizer run (.ci/debug style)
_SANITIZER_VARIABLES = ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS")


def _bare_env(**extra):
    """What a user's shell might have: no Python variables at all (but a sanitizer run's)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    env.update({k: os.environ[k] for k in _SANITIZER_VARIABLES if k in os.environ})
    env.update(extra)
    return env


def _flags_command():
    return f"$({shlex.quote(sys.executable)} -m cgru --cflags --libs)"


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """``build(source, *flags, cxx=False, libs="") -> path of the program``, compiled once per
    module; ``libs`` goes after the source and cgru's flags (libraries to link)."""
    if CC is None:
        pytest.skip("no C compiler")
    if not os.path.isfile(library_path()):
        pytest.fail(f"{library_path()} is missing: libcgru was not built (pip install -e .)")
    out = tmp_path_factory.mktemp("capi")
    built = {}

    def build(source, *flags, cxx=False, libs=""):
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
                   f"{_flags_command()} {libs}")
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
    """The functions the header declares (``(cgru_rnn_desc_init)`` in parentheses too: the
    0.1 entry point a macro of the same name stands in front of)."""
    text = open(HEADER).read()
    return set(re.findall(r"CGRU_API\s+[\w\s\*]+?\(?\b(cgru_\w+)\)?\s*\(", text))


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
    assert len(functions) == 13
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
    want = cgru.forward(cgru.Network.from_flat(topo, flat), x, lengths=[4, 2]).hy[0]
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
    params = cgru.Network.from_flat(_topology(), r["weights"])
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
    assert weight_bytes == tf.params_size(L, H, I, dtype=dt, direction="bidirectional",
                                        rnn_mode="gru") * \
        dt.itemsize
    assert reserve_inf == 0
    # the workspace: the engine's, for the largest call of the sequence
    from cgru.core.engine import workspace_nbytes
    assert work_inf == workspace_nbytes(topo, cgru.GRUCell(), dt, T, N, False) > 0
    assert work_tr == workspace_nbytes(topo, cgru.GRUCell(), dt, T, N, True) >= work_inf
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
    weights, biases = tf.params_to_canonical(L, H, I, space, direction="bidirectional",
                                             rnn_mode="gru")
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
                  "cgru_rnn_desc_init", "bww_before_backward_data": "cgru_rnn_backward_data",
                  "bwd_other_lengths": "seq_lengths", "bwd_other_layout": "layout"}


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


def _run_bounded(args, timeout, what, env=None):
    """``_run`` that fails the test (instead of hanging CI) when ``args`` outlive ``timeout``."""
    def text(out):  # what the process printed before it was killed (bytes on POSIX)
        return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")
    try:
        return _run(args, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what} did not finish within {timeout} s (hung)\n"
                    f"{(text(e.stdout) + text(e.stderr))[-2000:]}")


# T·N = 1024, I = 16, H = 64, bidirectional: every call splits its work over threads inside
LARGE = {"T": 16, "N": 64, "I": 16, "H": 64, "L": 2}


def test_four_threads_on_large_shapes_match_the_serial_results(build):
    """tests/c/gru_threads.c on shapes where each of the 4 concurrent calls also runs
    multi-threaded inside (desc->num_threads = 0): cgru's threads and the BLAS's of one call
    must not disturb another's, every result bitwise the serial one's."""
    exe = build("gru_threads.c", "-pthread")
    res = _run_bounded([exe, *(str(v) for v in LARGE.values()), "0"], 600, "gru_threads")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "threads: OK" in res.stdout


def test_forward_in_a_forked_child_matches_the_parent(build):
    """tests/c/gru_fork.c: after a multi-threaded forward in the parent, the child of a fork()
    runs the same forward (it must neither hang on the parent's thread pools nor differ).  The
    program bounds the child's time itself (60 s); the test bounds the whole run."""
    res = _run_bounded([build("gru_fork.c"), "60"], 180, "gru_fork")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "fork: OK" in res.stdout


def test_forks_while_another_thread_is_inside_a_call(build):
    """tests/c/gru_fork_calls.c busy: 20 forks, each once a worker thread has entered a new
    cgru_rnn_forward (on every usable core); the forking thread is not the one that started the
    interpreter.  Every child's forward is bitwise the parent's (children hung in
    PyGILState_Ensure: the GIL stayed with the worker, which does not exist in the child), and
    the parent's calls around the forks are unchanged.  The program bounds each child (60 s),
    the test the whole run."""
    exe = build("gru_fork_calls.c", "-pthread")
    res = _run_bounded([exe, "busy", "20", "60"], 900, "gru_fork_calls busy")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "fork_calls busy: OK (20 children" in res.stdout


@pytest.mark.parametrize("mode", ["churn", "churn-python"], ids=["c_fork", "python_fork"])
def test_forks_while_threads_that_each_make_a_call_come_and_go(build, mode):
    """tests/c/gru_fork_calls.c churn: 300 forks while threads that each make one call (a
    forward or a small call) start and end back to back, forked by a C fork() or the way
    os.fork forks (churn-python).  A fork that caught such a thread while CPython made or
    deleted its thread state left the child waiting forever in PyOS_AfterFork_Child (most runs
    hung before libcgru kept one thread state per thread, made and deleted under a lock that
    its forks hold).  Every child computes bitwise the parent's result, and once the threads
    ended the interpreter holds no thread state of theirs."""
    exe = build("gru_fork_calls.c", "-pthread")
    res = _run_bounded([exe, mode, "300", "60"], 900, f"gru_fork_calls {mode}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"fork_calls {mode}: OK (300 children" in res.stdout


# sitecustomize.py for tests/c/gru_fork_calls.c setup: holds libcgru's set-up (the first call)
# at one point — while the embedded interpreter starts ("site"), or as cgru.capi is imported
# ("import") — until the program writes a byte on the pipe named by $CGRU_TEST_SETUP_GATE.
_SETUP_GATE = """\
import os
import sys

_gate = os.environ.get("CGRU_TEST_SETUP_GATE")
_at = os.environ.get("CGRU_TEST_SETUP_GATE_AT")


def _hold():
    ready, release = (int(fd) for fd in _gate.split(","))
    os.write(ready, b"r")
    os.read(release, 1)


class _HoldAtImport:
    def find_spec(self, name, path=None, target=None):
        if name == "cgru.capi":
            sys.meta_path.remove(self)
            _hold()
        return None


if _gate and _at == "site":
    _hold()
elif _gate and _at == "import":
    sys.meta_path.insert(0, _HoldAtImport())
"""


@pytest.mark.parametrize("at", ["site", "import"])
def test_fork_during_the_first_calls_set_up(build, tmp_path, at):
    """tests/c/gru_fork_calls.c setup: the main thread forks while a worker's first call is
    setting the runtime up (held at ``at`` by a sitecustomize): the child's calls return
    CGRU_STATUS_RUNTIME_UNAVAILABLE naming the fork (a child hung, or ran on the half-started
    interpreter); the parent's set-up finishes, and a child forked after it computes bitwise
    the parent's result."""
    (tmp_path / "sitecustomize.py").write_text(_SETUP_GATE)
    exe = build("gru_fork_calls.c", "-pthread")
    env = _bare_env(PYTHONPATH=str(tmp_path), CGRU_TEST_SETUP_GATE_AT=at)
    res = _run_bounded([exe, "setup", "1", "60"], 300, "gru_fork_calls setup", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "fork_calls setup: OK" in res.stdout


def test_fork_before_any_call(build):
    """tests/c/gru_fork_calls.c fresh: a child forked before the first call starts a runtime
    of its own; its result is bitwise the parent's."""
    res = _run_bounded([build("gru_fork_calls.c", "-pthread"), "fresh", "1", "60"], 300,
                       "gru_fork_calls fresh")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "fork_calls fresh: OK" in res.stdout


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


def _embed_flags():
    """(cflags, libs) of a program that embeds this Python, as ``python3-config --embed
    --cflags --ldflags`` prints them, from this interpreter's sysconfig (a virtual environment
    has no python3-config of its own).  The headers are included as system headers, so that
    -Wall -Wextra -Werror apply to the test program only."""
    v = sysconfig.get_config_var
    libdir = v("LIBDIR")
    cflags = f"-isystem {shlex.quote(sysconfig.get_paths()['include'])}"
    libs = " ".join([f"-L{shlex.quote(libdir)}", f"-lpython{v('LDVERSION')}", v("LIBS") or "",
                     v("SYSLIBS") or "", f"-Wl,-rpath,{shlex.quote(libdir)}"])
    return cflags, libs


def _host_env():
    """The environment of a program that embeds Python itself: bare, but with the cgru under
    test on the path (its interpreter is the host's, which libcgru joins; an installed cgru is
    on it anyway)."""
    return _bare_env(PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(cgru.__file__))))


_needs_shared_libpython = pytest.mark.skipif(
    not sysconfig.get_config_var("Py_ENABLE_SHARED"),
    reason="this Python has no shared libpython to embed")


@_needs_shared_libpython
def test_calls_after_the_host_finalises_python(build):
    """tests/c/gru_after_finalize.c embeds Python itself: a cgru call joins its interpreter;
    after Py_Finalize the next calls return CGRU_STATUS_RUNTIME_UNAVAILABLE saying so (they
    crashed in PyGILState_Ensure), and so do calls after the host initialises Python again
    (NumPy cannot be loaded twice in one process; libcgru says so instead of trying)."""
    cflags, libs = _embed_flags()
    exe = build("gru_after_finalize.c", cflags, libs=libs)
    res = _run_bounded([exe, sys.executable], 120, "gru_after_finalize", env=_host_env())
    assert res.returncode == 0, (f"exit status {res.returncode} (negative: killed by that "
                                 f"signal)\n{res.stdout}{res.stderr}")
    cases = {f[0]: f[1:] for f in (line.split("\t") for line in res.stdout.splitlines())}
    assert cases["weight_space_size"] == ["CGRU_STATUS_SUCCESS", ""], cases
    assert cases["forward_running"] == ["CGRU_STATUS_SUCCESS", ""], cases
    for name in ("forward_finalised", "weight_space_size_finalised", "forward_reinitialised"):
        status, message = cases[name]
        assert status == "CGRU_STATUS_RUNTIME_UNAVAILABLE", (name, message)
        assert "finalised" in message and "Py_Finalize" in message, message
        assert "initialised again" in message and "NumPy" in message, message


@_needs_shared_libpython
def test_finalize_while_other_threads_are_inside_calls(build):
    """tests/c/gru_python_host.c finalize: the host runs Py_FinalizeEx while two threads call
    cgru_rnn_forward back to back, one of the calls held inside cgru.capi until the atexit
    callbacks run.  Every call returns (CPython ended the threads when they took the GIL
    again: they never returned), each a success with the reference result until the first
    CGRU_STATUS_RUNTIME_UNAVAILABLE, the held one a success; a call after Py_FinalizeEx
    returns RUNTIME_UNAVAILABLE too."""
    cflags, libs = _embed_flags()
    exe = build("gru_python_host.c", "-pthread", cflags, libs=libs)
    res = _run_bounded([exe, sys.executable, "finalize", "2", "60"], 300,
                       "gru_python_host finalize", env=_host_env())
    assert res.returncode == 0, (f"exit status {res.returncode}\n{res.stdout}{res.stderr}")
    assert "python_host finalize: OK (2 workers got every call back" in res.stdout


@_needs_shared_libpython
def test_fork_from_a_thread_holding_the_gil(build):
    """tests/c/gru_python_host.c fork-with-gil: the host's main thread holds the GIL while a
    worker is inside a cgru call (waiting for the GIL) and forks three times: each child (the
    GIL still its main thread's) computes the reference and finalises its interpreter (not
    waiting for the parent's worker); then the worker's call completes in the parent."""
    cflags, libs = _embed_flags()
    exe = build("gru_python_host.c", "-pthread", cflags, libs=libs)
    res = _run_bounded([exe, sys.executable, "fork-with-gil", "3", "60"], 300,
                       "gru_python_host fork-with-gil", env=_host_env())
    assert res.returncode == 0, (f"exit status {res.returncode}\n{res.stdout}{res.stderr}")
    assert "python_host fork-with-gil: OK (3 children" in res.stdout


# --- valgrind ---------------------------------------------------------------------------------
def _valgrind(args, options=()):
    """The repository's valgrind command on ``args`` (``options`` are added after its own)."""
    supp = os.path.join(C_DIR, "valgrind.supp")
    cmd = ["valgrind", "--error-exitcode=99", f"--suppressions={supp}", "--leak-check=full",
           "--show-leak-kinds=definite", "--errors-for-leak-kinds=definite", *options] + args
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


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_valgrind_suppressions_cover_the_dynamic_loader_only(build):
    """tests/c/valgrind_loader.c leaves at exit only blocks of glibc's dynamic loader (dlopen,
    dlclose, failed dlopen/dlsym, a thread's TLS); some of them are "definitely lost" even on
    this machine's glibc (dlclose), and how each is classified differs between glibc builds.
    The repository's command must pass on it even counting every leak kind, and must still
    fail when the program loses a block of its own."""
    exe = build("valgrind_loader.c", libs="-ldl -pthread")
    libpython = os.path.join(sysconfig.get_config_var("LIBDIR") or "",
                             sysconfig.get_config_var("INSTSONAME") or "")
    libraries = [library_path()] + ([libpython] if os.path.isfile(libpython) else [])
    every_kind = ["--show-leak-kinds=all", "--errors-for-leak-kinds=all"]
    res = _valgrind([exe, *libraries])
    assert res.returncode == 0, res.stderr[-4000:]
    assert "loader: OK" in res.stdout
    res = _valgrind([exe, *libraries], every_kind)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "ERROR SUMMARY: 0 errors" in res.stderr
    leak = _valgrind([exe, "leak", *libraries], every_kind)
    assert leak.returncode == 99, leak.stderr[-4000:]
    assert re.search(r"123 bytes in 1 blocks are definitely lost.*\n.*malloc.*\n.*main",
                     leak.stderr), leak.stderr[-4000:]


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
    cell = cgru.Cell(reset_after=bool(reset_after))
    params = cgru.Network.random(topo, dtype, seed=3, cell=cell)
    x = rng.standard_normal((Nn, Tn, topo.input_size) if batch_major
                            else (Tn, Nn, topo.input_size)).astype(dtype)
    hshape = (topo.num_layer_directions, Nn, topo.hidden_size)
    lengths = np.array([4, 0, 2], np.int32)
    f = cgru.forward(params, x, None, lengths=lengths, batch_major=batch_major,
                     training=True, dropout=dropout, seed=(11, -3))
    dy = rng.standard_normal(f.y.shape).astype(dtype)
    g = cgru.backward(params, x, f.reserve, dy, None, batch_major=batch_major)

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
        other = cgru.forward(params, x, None, lengths=lengths,
                             batch_major=batch_major, training=True, dropout=dropout, seed=12)
        assert not np.allclose(other.y, y)


def test_in_process_calls_from_python_threads(lib):
    """Several Python threads call libcgru at once (each call takes the GIL inside)."""
    topo = cgru.Topology(3, 4, num_layers=2, direction="bidirectional")
    params = cgru.Network.random(topo, np.float64, seed=1)
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


def _python_host_forks(how, forks):
    """Run in a fresh Python process by test_forks_of_a_python_process_using_libcgru: libcgru,
    loaded with ctypes, joins this interpreter; a Python thread calls cgru_rnn_forward back to
    back (ctypes releases the GIL: a C thread inside a call) while the main thread forks
    ``forks`` times, each once the worker has entered a new call, by a C fork() through ctypes
    (``how="c"``) or by os.fork (``how="os"``).  Each child checks that Python's fork callbacks
    ran once (os.register_at_fork's after_in_child: not at all after a bare C fork, twice if
    both libcgru and os.fork re-initialised the interpreter), computes the forward (bitwise the
    parent's) and exits through Py_Finalize (sys.exit), which must not wait for the parent's
    calls.  Prints JSON: failures, the before-fork callback count, the worker's bad results."""
    import json
    import time
    lib = ctypes.CDLL(library_path())
    lib.cgru_get_last_error_message.restype = ctypes.c_char_p
    counts = {"before": 0, "child": 0}

    def count(key):
        counts[key] += 1
    os.register_at_fork(before=lambda: count("before"), after_in_child=lambda: count("child"))
    topo = cgru.Topology(8, 32)
    weights = cgru.Network.random(topo, np.float32, seed=5).flat()
    desc = _desc_of(lib, topo, np.float32)
    desc.num_threads = 0
    x = np.random.default_rng(6).standard_normal((16, 32, 8)).astype(np.float32)

    def forward():
        y = np.empty((16, 32, 32), np.float32)
        status = lib.cgru_rnn_forward(ctypes.byref(desc), 0, 0, 16, 32, None, _ptr(x), _ptr(y),
                                      None, None, ctypes.c_size_t(weights.nbytes),
                                      _ptr(weights), ctypes.c_size_t(0), None,
                                      ctypes.c_size_t(0), None)
        return status, y
    status, want = forward()
    assert status == 0, lib.cgru_get_last_error_message()
    calls = threading.Condition()
    state = {"entered": 0, "stop": False, "bad": 0}

    def worker():
        while True:
            with calls:
                if state["stop"]:
                    return
                state["entered"] += 1
                calls.notify_all()
            st, y = forward()
            if st != 0 or not np.array_equal(y, want):
                state["bad"] += 1
    thread = threading.Thread(target=worker)
    thread.start()
    fork = ctypes.CDLL(None, use_errno=True).fork if how == "c" else os.fork
    failures, seen = [], 0
    for k in range(forks):
        with calls:
            calls.wait_for(lambda: state["entered"] > seen)
            seen = state["entered"]
        pid = fork()
        if pid == 0:
            st, y = forward()
            sys.exit(0 if counts["child"] == 1 and st == 0 and np.array_equal(y, want) else 3)
        deadline = time.monotonic() + 60   # a hang detector, not a measure
        done, status = os.waitpid(pid, os.WNOHANG)
        while not done and time.monotonic() < deadline:
            time.sleep(0.01)
            done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            failures.append(f"fork {k}: the child did not finish within 60 s (hung)")
        elif os.waitstatus_to_exitcode(status) != 0:
            failures.append(f"fork {k}: the child ended with {os.waitstatus_to_exitcode(status)}")
    with calls:
        state["stop"] = True
    thread.join()
    print(json.dumps({"failures": failures, "before": counts["before"], "bad": state["bad"]}))


@pytest.mark.parametrize("how", ["c", "os"], ids=["c_fork_through_ctypes", "os_fork"])
def test_forks_of_a_python_process_using_libcgru(how):
    """A Python process that uses libcgru through ctypes forks while a thread is inside a call
    (_python_host_forks): with a C fork() (a C fork even in a Python process: libcgru's
    handlers take the GIL and re-initialise the interpreter as os.fork does) and with os.fork
    (Python's own handling: libcgru must not do it again).  Every child finishes with the
    parent's result, Python's fork callbacks ran exactly once per fork, and the parent's calls
    are unchanged."""
    import json
    forks = 8
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
            f"import test_capi; test_capi._python_host_forks({how!r}, {forks})")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail("the forking Python process did not finish within 600 s (hung)")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.splitlines()[-1])
    assert out == {"failures": [], "before": forks, "bad": 0}, (out, res.stderr[-3000:])


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


# --- one training sequence, every buffer in one arena ----------------------------------------
_DIRECTION_CODES = {"forward": 0, "bidirectional": 1, "reverse": 2}
INT_MAX = 2 ** 31 - 1


def _desc_of(lib, topo, dtype=np.float64, **fields):
    """A descriptor of ``topo`` and ``dtype`` (cgru_rnn_desc_init, then the fields)."""
    desc = _Desc()
    _call(lib, "cgru_rnn_desc_init", ctypes.byref(desc))
    desc.data_type = 1 if np.dtype(dtype) == np.float64 else 0
    desc.input_size, desc.hidden_size = topo.input_size, topo.hidden_size
    desc.num_layers = topo.num_layers
    desc.direction = _DIRECTION_CODES[topo.direction]
    desc.input_mode = {"linear": 0, "skip": 1}[topo.input_mode]
    for name, value in fields.items():
        setattr(desc, name, value)
    return desc


def _changed(desc, **fields):
    """A copy of ``desc`` with ``fields`` set."""
    other = _Desc.from_buffer_copy(desc)
    for name, value in fields.items():
        setattr(other, name, value)
    return other


def _message(lib):
    return lib.cgru_get_last_error_message().decode()


class _Sequence:
    """A training forward, backward_data and backward_weights (SET) through libcgru, time-major,
    every buffer (x, y, hx, hy, dy, dx, dhy, dhx, seq_lengths, other_lengths, weight_space,
    dweight_space, reserve_space) at its own 64-byte aligned place in one arena with room to
    spare at its end.  Each call takes ``argument=buffer`` or ``argument=(buffer, byte offset)``
    to pass a pointer into another buffer instead of the argument's own: even a call that
    wrongly accepted overlapping buffers would write only inside the arena."""

    CALLS = ("forward", "backward_data", "backward_weights")
    ARGUMENTS = {"forward": ("seq_lengths", "x", "y", "hx", "hy", "weight_space",
                             "work_space", "reserve_space"),
                 "backward_data": ("seq_lengths", "dy", "dx", "dhy", "dhx", "weight_space",
                                   "work_space", "reserve_space"),
                 "backward_weights": ("seq_lengths", "dweight_space", "reserve_space")}

    def __init__(self, lib, topo, *, T, N, dtype=np.float64, seed=0, **fields):
        self.lib, self.topo, self.T, self.N = lib, topo, T, N
        self.dtype = np.dtype(dtype)
        self.desc = _desc_of(lib, topo, dtype, **fields)
        wbytes, work, rbytes = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
        _call(lib, "cgru_get_weight_space_size", ctypes.byref(self.desc), ctypes.byref(wbytes))
        _call(lib, "cgru_get_temp_space_sizes", ctypes.byref(self.desc), 1, T, N,
              ctypes.byref(work), ctypes.byref(rbytes))
        assert work.value > 0
        self.wbytes, self.rbytes = wbytes.value, rbytes.value
        self.work_bytes = work.value        # what the calls pass (0: cgru's own pool)
        I, DH = topo.input_size, topo.output_size
        state = (topo.num_layer_directions, N, topo.hidden_size)
        self.shapes = {"x": (T, N, I), "y": (T, N, DH), "hx": state, "hy": state,
                       "dy": (T, N, DH), "dx": (T, N, I), "dhy": state, "dhx": state}
        self.sizes = {name: int(np.prod(s)) * self.dtype.itemsize
                      for name, s in self.shapes.items()}
        self.sizes.update(seq_lengths=4 * N, other_lengths=4 * N, weight_space=self.wbytes,
                          dweight_space=self.wbytes, work_space=work.value,
                          reserve_space=self.rbytes)
        self.offsets, pos = {}, 0
        for name, nbytes in self.sizes.items():
            self.offsets[name] = pos
            pos += -(-nbytes // 64) * 64
        self.memory = np.zeros(pos + max(self.sizes.values()) + 128, np.uint8)
        self.start = -self.memory.ctypes.data % 64          # the arena's first 64-byte boundary
        rng = np.random.default_rng(seed)
        for name in ("x", "hx", "dy", "dhy"):
            self.array(name)[...] = rng.standard_normal(self.shapes[name])
        lengths = (np.arange(N) * 5 + seed) % T          # ≤ T − 1: valid for T − 1 too
        lengths[0] = T - 1
        self.array("seq_lengths")[...] = lengths
        lengths[0] = T - 2
        self.array("other_lengths")[...] = lengths
        self.array("weight_space")[...] = cgru.Network.random(topo, self.dtype, seed=seed + 1).flat()

    def array(self, name):
        """The buffer ``name`` as an array (a view of the arena)."""
        dtype = (np.int32 if name.endswith("lengths") else
                 np.uint8 if name in ("reserve_space", "work_space") else self.dtype)
        begin = self.start + self.offsets[name]
        a = self.memory[begin:begin + self.sizes[name]].view(dtype)
        return a.reshape(self.shapes[name]) if name in self.shapes else a

    def address(self, name):
        return self.memory.ctypes.data + self.start + self.offsets[name]

    def _pointers(self, names, moved):
        out = {}
        for name in names:
            where = moved.pop(name, name)
            buffer, offset = where if isinstance(where, tuple) else (where, 0)
            out[name] = ctypes.c_void_p(self.address(buffer) + offset)
        assert not moved, f"not arguments of this call: {sorted(moved)}"
        return out

    def forward(self, desc=None, layout=0, T=None, **moved):
        p = self._pointers(self.ARGUMENTS["forward"], moved)
        return self.lib.cgru_rnn_forward(
            ctypes.byref(desc or self.desc), 1, layout, T or self.T, self.N, p["seq_lengths"],
            p["x"], p["y"], p["hx"], p["hy"], ctypes.c_size_t(self.wbytes), p["weight_space"],
            *self._work(p), ctypes.c_size_t(self.rbytes), p["reserve_space"])

    def backward_data(self, desc=None, layout=0, T=None, **moved):
        p = self._pointers(self.ARGUMENTS["backward_data"], moved)
        return self.lib.cgru_rnn_backward_data(
            ctypes.byref(desc or self.desc), layout, T or self.T, self.N, p["seq_lengths"],
            p["dy"], p["dx"], p["dhy"], p["dhx"], ctypes.c_size_t(self.wbytes),
            p["weight_space"], *self._work(p), ctypes.c_size_t(self.rbytes),
            p["reserve_space"])

    def _work(self, p):
        """(work_space_size, work_space) of a call: the arena's work_space, or 0 and NULL."""
        if not self.work_bytes:
            return ctypes.c_size_t(0), None
        return ctypes.c_size_t(self.work_bytes), p["work_space"]

    def backward_weights(self, desc=None, layout=0, T=None, **moved):
        p = self._pointers(self.ARGUMENTS["backward_weights"], moved)
        return self.lib.cgru_rnn_backward_weights(
            ctypes.byref(desc or self.desc), 1, layout, T or self.T, self.N, p["seq_lengths"],
            ctypes.c_size_t(self.wbytes), p["dweight_space"], ctypes.c_size_t(0), None,
            ctypes.c_size_t(self.rbytes), p["reserve_space"])

    def run(self, start="forward", until="backward_weights", desc=None):
        """The calls from ``start`` to ``until`` (included), each asserted to succeed."""
        for call in self.CALLS[self.CALLS.index(start):self.CALLS.index(until) + 1]:
            status = getattr(self, call)(desc=desc)
            assert status == 0, (call, status, _message(self.lib))

    def results(self):
        """The bytes of every output buffer."""
        return {name: self.array(name).tobytes()
                for name in ("y", "hy", "dx", "dhx", "dweight_space")}


# --- overlapping buffers ----------------------------------------------------------------------
# (call, argument, (the buffer it is pointed into, byte offset)): every one must be refused
OVERLAPS = [
    ("forward", "y", ("x", 0)),
    ("forward", "y", ("weight_space", 40)),
    ("forward", "hy", ("hx", 0)),
    ("forward", "hy", ("y", 16)),
    ("forward", "y", ("reserve_space", 64)),
    ("forward", "reserve_space", ("x", 0)),
    ("forward", "seq_lengths", ("y", 8)),
    ("backward_data", "dx", ("dy", 0)),
    ("backward_data", "dx", ("weight_space", 8)),
    ("backward_data", "dx", ("dhx", 0)),
    ("backward_data", "dhx", ("dhy", 0)),
    ("backward_data", "dhx", ("reserve_space", 128)),
    ("backward_data", "dy", ("reserve_space", 256)),
    ("forward", "work_space", ("x", 0)),
    ("forward", "y", ("work_space", 8)),
    ("forward", "work_space", ("weight_space", 64)),
    ("backward_data", "work_space", ("reserve_space", 64)),
    ("backward_data", "dx", ("work_space", 0)),
    ("backward_weights", "dweight_space", ("reserve_space", 0)),
    ("backward_weights", "dweight_space", ("reserve_space", 512)),
]
# the buffers each call writes (include/cgru.h: out, in/out)
WRITTEN = {"forward": {"y", "hy", "work_space", "reserve_space"},
           "backward_data": {"dx", "dhx", "work_space", "reserve_space"},
           "backward_weights": {"dweight_space"}}
_SMALL_TOPOLOGY = dict(input_size=5, hidden_size=4, num_layers=2, direction="bidirectional")


@pytest.mark.parametrize("call,argument,into", OVERLAPS,
                         ids=[f"{c}-{a}-in-{w[0]}" for c, a, w in OVERLAPS])
def test_overlapping_buffers_are_refused(lib, call, argument, into):
    """An output overlapping any other buffer of the call is BAD_PARAM naming both (it was
    accepted and corrupted the results); nothing is written; apart, the call succeeds."""
    seq = _Sequence(lib, cgru.Topology(**_SMALL_TOPOLOGY), T=6, N=3)
    if call != "forward":
        seq.run(until=seq.CALLS[seq.CALLS.index(call) - 1])
    # the buffers of the call that the moved argument's bytes overlap (a buffer larger than
    # the one it is moved into reaches the next ones too)
    start = seq.address(into[0]) + into[1]
    end = start + seq.sizes[argument]
    partners = {b for b in seq.ARGUMENTS[call] if b != argument and
                seq.address(b) < end and start < seq.address(b) + seq.sizes[b]}
    assert into[0] in partners
    before = seq.memory.copy()
    status = getattr(seq, call)(**{argument: into})
    message = _message(lib)
    assert status == capi.BAD_PARAM, (status, message)
    named = re.match(r"(\w+): overlaps (\w+) ", message)
    assert named, message
    assert argument in named.groups() and set(named.groups()) - {argument} <= partners, message
    assert named.group(1) in WRITTEN[call], message  # the message starts with an output
    assert np.array_equal(seq.memory, before), "a refused call wrote into the buffers"
    assert getattr(seq, call)() == 0, _message(lib)


def test_inputs_may_share_memory(lib):
    """Read-only buffers overlapping each other are fine: hx inside x, dhy inside dy."""
    topo = cgru.Topology(**_SMALL_TOPOLOGY)
    shared, apart = (_Sequence(lib, topo, T=6, N=3, seed=2) for _ in range(2))
    h_n = int(np.prod(apart.shapes["hx"]))
    apart.array("hx").reshape(-1)[...] = apart.array("x").reshape(-1)[:h_n]
    apart.array("dhy").reshape(-1)[...] = apart.array("dy").reshape(-1)[:h_n]
    for status in (shared.forward(hx="x"), shared.backward_data(dhy="dy"),
                   shared.backward_weights()):
        assert status == 0, _message(lib)
    apart.run()
    assert shared.results() == apart.results()


# --- the workspace ----------------------------------------------------------------------------
def test_work_space_holds_the_calls_temporaries(lib):
    """The forward and backward_data carve their temporaries from the caller's work_space: its
    bytes change in each call, what it held before does not matter (bytes 0xFF are NaN in
    either dtype), and the results are bitwise those of work_space_size 0 (cgru's pool)."""
    topo = cgru.Topology(**_SMALL_TOPOLOGY)
    results = []
    for fill in (0x00, 0xFF):
        seq = _Sequence(lib, topo, T=6, N=3, seed=4)
        for call in seq.CALLS:
            seq.array("work_space")[...] = fill
            assert getattr(seq, call)() == 0, _message(lib)
            written = (seq.array("work_space") != fill).any()
            assert written == (call != "backward_weights"), call
        results.append(seq.results())
    pooled = _Sequence(lib, topo, T=6, N=3, seed=4)
    pooled.work_bytes = 0
    pooled.run()
    assert results[0] == results[1] == pooled.results()


@pytest.mark.parametrize("call", ["forward", "backward_data"])
def test_work_space_too_small_is_refused_and_null_is_cgrus_own(lib, call):
    """A work_space smaller than the query's size is BUFFER_TOO_SMALL naming both sizes, and
    nothing is written; NULL with the query's size (a caller of ABI 0.1, whose query returned
    0) runs on cgru's own pool."""
    seq = _Sequence(lib, cgru.Topology(**_SMALL_TOPOLOGY), T=6, N=3)
    if call != "forward":
        seq.run(until="forward")
    need = seq.work_bytes
    before = seq.memory.copy()
    seq.work_bytes = need - 1
    assert getattr(seq, call)() == capi.BUFFER_TOO_SMALL
    assert _message(lib).startswith(f"work_space_size: {need - 1} bytes is too small; "
                                    f"work_space needs {need} bytes"), _message(lib)
    assert np.array_equal(seq.memory, before), "a refused call wrote into the buffers"
    seq.work_bytes = need
    seq._work = lambda p: (ctypes.c_size_t(need), None)
    assert getattr(seq, call)() == 0, _message(lib)
    assert (seq.array("work_space") == before[seq.start + seq.offsets["work_space"]:][
        :need]).all(), "the arena's work_space was written though NULL was passed"


def test_calls_given_their_buffers_allocate_nothing(lib, monkeypatch):
    """With a work_space, the forward and backward_data write every result straight into the
    caller's buffers — y, hy, the engine's reserve inside the reserve space, dx, dhx — and take
    every temporary from work_space: no buffer of cgru's own is allocated (``plan.empty``,
    the pool), and the results are bitwise those of a Python call."""
    from cgru.core import backend, plan
    seq = _Sequence(lib, cgru.Topology(**_SMALL_TOPOLOGY), T=6, N=3, seed=5)
    allocated = []
    real_empty, real_recycled = plan.empty, plan.recycled
    monkeypatch.setattr(backend.CPU, "empty",
                        staticmethod(lambda *a: allocated.append(a) or real_empty(*a)))
    monkeypatch.setattr(plan, "recycled", lambda n: allocated.append(n) or real_recycled(n))
    for call in ("forward", "backward_data"):
        assert getattr(seq, call)() == 0, _message(lib)
        assert allocated == [], (call, allocated)
    monkeypatch.undo()
    topo = seq.topo
    net = cgru.Network.from_flat(topo, seq.array("weight_space"))
    lengths = seq.array("seq_lengths").astype(np.int64)
    f = cgru.forward(net, seq.array("x"), seq.array("hx"), lengths=lengths, training=True)
    g = cgru.backward(net, seq.array("x"), f.reserve, seq.array("dy"), seq.array("dhy"))
    for name, want in (("y", f.y), ("hy", f.hy), ("dx", g.dx), ("dhx", g.dh0)):
        assert seq.array(name).tobytes() == want.tobytes(), name


def test_a_failed_training_forward_leaves_its_reserve_space_refused(lib, monkeypatch):
    """The engine writes its reserve inside the reserve space during the forward: a forward
    that fails part way (here its second layer's loops) leaves the reserve space refused by
    backward_data — not the previous forward's header over half of the new one's data."""
    from cgru.core import kinds
    from cgru.core.backend import BACKEND
    seq = _Sequence(lib, cgru.Topology(**_SMALL_TOPOLOGY), T=6, N=3, seed=6)
    seq.run(until="forward")                    # a valid reserve space from a first forward
    kernels = BACKEND.kernels(kinds.of(cgru.GRUCell()))
    real, calls = kernels.forward_layer, []

    def failing(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("injected")
        return real(*args, **kw)

    monkeypatch.setattr(kernels, "forward_layer", failing)
    assert seq.forward() == capi.ALLOC_FAILED, _message(lib)
    monkeypatch.undo()
    assert seq.backward_data() == capi.BAD_PARAM
    assert "not written by a training cgru_rnn_forward" in _message(lib), _message(lib)
    seq.run()                                   # a new forward makes it valid again


# --- the reserve space across the calls of one sequence ---------------------------------------
def test_backward_accepts_a_descriptor_differing_only_in_num_threads(lib):
    """desc->num_threads does not change any result, so the backward calls may use another
    value than the training forward (they were refused: it was part of the reserve's
    fingerprint); dx, dhx and the weight gradients are bitwise those of num_threads = 1."""
    topo = cgru.Topology(16, 48, num_layers=2, direction="bidirectional")

    def results(backward_threads):
        seq = _Sequence(lib, topo, T=8, N=32, seed=4, num_threads=1)
        seq.run(until="forward")
        seq.run(start="backward_data", desc=_changed(seq.desc, num_threads=backward_threads))
        return seq.results()

    want = results(1)
    for n in (2, 0):
        got = results(n)
        for name in want:
            assert got[name] == want[name], f"{name} with num_threads={n} in the backward calls"


# (what differs in the backward calls from the training forward, the call's arguments, the
# name the message must give)
RESERVE_MISMATCHES = [
    ("reset_after", {"desc": {"reset_after": 0}}, "desc->reset_after"),
    ("dropout", {"desc": {"dropout": 0.25}}, "desc->dropout"),
    ("seed", {"desc": {"seed": 5}}, "desc->seed"),
    ("data_type", {"desc": {"data_type": 0}}, "desc->data_type"),
    ("direction", {"desc": {"direction": 2}}, "desc->direction"),
    ("layout", {"layout": 1}, "layout"),
    ("max_seq_length", {"T": 5}, "max_seq_length"),
    ("seq_lengths", {"seq_lengths": "other_lengths"}, "seq_lengths"),
]


@pytest.mark.parametrize("what,kwargs,name", RESERVE_MISMATCHES,
                         ids=[m[0] for m in RESERVE_MISMATCHES])
def test_reserve_of_a_different_forward_names_the_difference(lib, what, kwargs, name):
    """A reserve space from a training forward with another descriptor, layout, T or
    seq_lengths is BAD_PARAM saying so and naming what differs, in both backward calls (a
    reset_after or direction difference changes the reserve's layout and was reported as a
    "bad header", or as a size error)."""
    seq = _Sequence(lib, cgru.Topology(**_SMALL_TOPOLOGY), T=6, N=3)
    kwargs = dict(kwargs)
    if "desc" in kwargs:
        kwargs["desc"] = _changed(seq.desc, **kwargs["desc"])
    seq.run(until="forward")
    for call in ("backward_data", "backward_weights"):
        status = getattr(seq, call)(**kwargs)
        message = _message(lib)
        assert status == capi.BAD_PARAM, (call, status, message)
        assert message.startswith("reserve_space: "), message
        differ = re.search(r"with a different (.*) than this ", message)
        assert differ and name in differ.group(1), message   # named as what differs
        assert "bad header" not in message, message
        if call == "backward_data":
            seq.run(until="backward_data")  # the reserve is intact: the sequence goes on


def test_reserve_of_another_cgru_version_or_none(lib):
    seq = _Sequence(lib, cgru.Topology(**_SMALL_TOPOLOGY), T=6, N=3)
    seq.run(until="forward")
    header = seq.array("reserve_space")[:16].view(np.int64)
    header[1] += 1
    assert seq.backward_data() == capi.BAD_PARAM
    message = _message(lib)
    assert message.startswith("reserve_space: ") and "version" in message, message
    header[0] = 0
    assert seq.backward_data() == capi.BAD_PARAM
    assert "not written by a training cgru_rnn_forward" in _message(lib)


# --- size queries: the bounds of the compute calls, closed forms -----------------------------
def _sizes(lib, desc, fwd_mode, T_, N_):
    work, reserve = ctypes.c_size_t(), ctypes.c_size_t()
    status = lib.cgru_get_temp_space_sizes(ctypes.byref(desc), fwd_mode, T_, N_,
                                           ctypes.byref(work), ctypes.byref(reserve))
    return status, _message(lib), reserve.value


def _forward_nothing(lib, desc, fwd_mode, T_, N_):
    """cgru_rnn_forward with every buffer NULL: only the checks before the buffers run."""
    status = lib.cgru_rnn_forward(ctypes.byref(desc), fwd_mode, 0, T_, N_, None, None, None,
                                  None, None, ctypes.c_size_t(0), None, ctypes.c_size_t(0),
                                  None, ctypes.c_size_t(0), None)
    return status, _message(lib)


@pytest.mark.parametrize("T_,N_", [(65536, 65536), (INT_MAX, INT_MAX), (INT_MAX, 2)])
def test_temp_space_sizes_refuse_what_the_forward_refuses(lib, T_, N_):
    """T·N beyond the kernels' 32-bit BLAS ints: the size query refuses it like the forward
    (it returned SUCCESS and ~412 GB for T = N = 65536), naming both arguments."""
    desc = _desc_of(lib, cgru.Topology(3, 4))
    for fwd_mode in (0, 1):
        status, message, _ = _sizes(lib, desc, fwd_mode, T_, N_)
        assert status == capi.BAD_PARAM, (fwd_mode, status, message)
        assert message.startswith("max_seq_length") and "batch_size" in message, message
        assert str(T_ * N_) in message and str(INT_MAX) in message, message
        assert _forward_nothing(lib, desc, fwd_mode, T_, N_) == (status, message)


def test_size_queries_refuse_dimensions_the_kernels_cannot_take(lib):
    """3H beyond 32 bits (desc->hidden_size) and buffers beyond 2^62 bytes (x): every size
    query refuses what the compute calls refuse, with the same status and message."""
    wide = _desc_of(lib, cgru.Topology(3, 3, 1))
    wide.hidden_size = 716_000_000                      # 3H = 2148000000 > INT_MAX
    size = ctypes.c_size_t()
    status = lib.cgru_get_weight_space_size(ctypes.byref(wide), ctypes.byref(size))
    message = _message(lib)
    assert status == capi.BAD_PARAM and message.startswith("desc->hidden_size"), message
    assert "3H" in message and str(INT_MAX) in message, message
    for fwd_mode in (0, 1):
        assert _sizes(lib, wide, fwd_mode, 2, 2)[:2] == (status, message)
        assert _forward_nothing(lib, wide, fwd_mode, 2, 2) == (status, message)

    huge_x = _desc_of(lib, cgru.Topology(3, 1))
    huge_x.input_size = 2 ** 30                          # x: (2^31 − 1)·2^30·4 bytes > 2^62
    assert lib.cgru_get_weight_space_size(ctypes.byref(huge_x), ctypes.byref(size)) == 0
    for fwd_mode in (0, 1):
        status, message, _ = _sizes(lib, huge_x, fwd_mode, INT_MAX, 1)
        assert status == capi.NOT_SUPPORTED, message
        assert message.startswith("max_seq_length, batch_size, desc->input_size: x ["), message
        assert "2^62" in message, message
        assert _forward_nothing(lib, huge_x, fwd_mode, INT_MAX, 1) == (status, message)


def _weight_params_nothing(lib, desc):
    """cgru_get_weight_params of pseudo-layer 0's first matrix in a weight space that is never
    dereferenced (any address): only the descriptor's checks and the size check run."""
    m, b = ctypes.c_void_p(), ctypes.c_void_p()
    dims, b_dim = (ctypes.c_int32 * 2)(), ctypes.c_int32()
    status = lib.cgru_get_weight_params(ctypes.byref(desc), 0, ctypes.c_size_t(2 ** 63),
                                        ctypes.c_void_p(1 << 20), 0, ctypes.byref(m), dims,
                                        ctypes.byref(b), ctypes.byref(b_dim))
    return status, _message(lib)


# (case, descriptor fields, T, N, the arguments the message must start with, which refuse)
SIZE_REFUSALS = [
    ("weight_space", dict(hidden_size=700_000_000), 2, 2,
     "desc (input_size 3, hidden_size 700000000, num_layers 1, direction 0, proj_size 0): its "
     "weight space", ("weight_space_size", "temp_inference", "temp_training", "weight_params",
                      "forward")),
    ("states", dict(num_layers=INT_MAX, hidden_size=2048), 1, 2 ** 20,
     "batch_size, desc->num_layers, desc->direction, desc->hidden_size: hx, hy, cx, cy [",
     ("temp_inference", "temp_training", "forward")),
    ("training_reserve", dict(num_layers=2 ** 28, hidden_size=1, input_size=1), 2 ** 15, 2 ** 15,
     "max_seq_length, batch_size, desc: the training reserve space", ("temp_training",)),
]


@pytest.mark.parametrize("case,fields,T_,N_,arguments,refusing", SIZE_REFUSALS,
                         ids=[c[0] for c in SIZE_REFUSALS])
def test_size_refusals_name_the_arguments(lib, case, fields, T_, N_, arguments, refusing):
    """A size beyond 2^62 bytes: CGRU_STATUS_NOT_SUPPORTED from every size query and compute
    call that needs it, with one message that starts with the C arguments the size follows
    from (the training reserve's was BAD_PARAM naming cgru's Python function reserve_nbytes);
    the other size queries answer."""
    desc = _desc_of(lib, cgru.Topology(3, 4))
    for name, value in fields.items():
        setattr(desc, name, value)
    size = ctypes.c_size_t()
    got = {
        "weight_space_size": (lib.cgru_get_weight_space_size(ctypes.byref(desc),
                                                             ctypes.byref(size)), _message(lib)),
        "temp_inference": _sizes(lib, desc, 0, T_, N_)[:2],
        "temp_training": _sizes(lib, desc, 1, T_, N_)[:2],
        "weight_params": _weight_params_nothing(lib, desc),
    }
    forward = _forward_nothing(lib, desc, 0, T_, N_)   # past its size checks: NULL buffers
    if "forward" in refusing:
        got["forward"] = forward
    else:
        assert forward[0] == capi.BAD_PARAM and "NULL" in forward[1], forward
    refused = {name: result for name, result in got.items() if result[0] != capi.SUCCESS}
    assert set(refused) == set(refusing), got
    messages = {message for _, message in refused.values()}
    assert len(messages) == 1, refused
    message = messages.pop()
    assert {status for status, _ in refused.values()} == {capi.NOT_SUPPORTED}, refused
    assert message.startswith(arguments), message
    assert "2^62" in message, message


@pytest.mark.parametrize("num_threads", [-1, MAX_THREADS + 1, INT_MAX])
def test_size_queries_refuse_the_thread_counts_the_calls_refuse(lib, num_threads):
    """desc->num_threads outside 0…256 (cgru's thread limit, as the header says): the size
    queries refuse it with the compute calls' status and message (they returned sizes for 257
    or more, which every compute call then refused)."""
    assert "1…256, or 0: all usable cores" in open(HEADER).read() and MAX_THREADS == 256
    desc = _desc_of(lib, cgru.Topology(3, 4))
    desc.num_threads = num_threads
    size = ctypes.c_size_t()
    results = [
        (lib.cgru_get_weight_space_size(ctypes.byref(desc), ctypes.byref(size)), _message(lib)),
        _sizes(lib, desc, 0, 2, 3)[:2], _sizes(lib, desc, 1, 2, 3)[:2],
        _weight_params_nothing(lib, desc), _forward_nothing(lib, desc, 0, 2, 3)]
    status, message = results[0]
    assert status == capi.BAD_PARAM and message.startswith("desc->num_threads"), message
    assert str(num_threads) in message and str(MAX_THREADS) in message, message
    assert results == [(status, message)] * len(results)
    desc.num_threads = MAX_THREADS
    assert lib.cgru_get_weight_space_size(ctypes.byref(desc), ctypes.byref(size)) == 0


def _closed_form_elements(I, H, L, D, skip=False):
    """Elements of the weight space (include/cgru.h WEIGHT SPACE), independently of capi.py."""
    w0 = 0 if skip else I
    return D * 3 * H * (w0 + H) + (L - 1) * D * 3 * H * (D * H + H) + L * D * 6 * H


def _huge_stack_child(direction):
    """Run in a child process by test_sizes_of_a_stack_of_int_max_layers: the size queries,
    the weight accessor and a forward on L = INT_MAX layers; prints their results as JSON."""
    import json
    lib = ctypes.CDLL(library_path())
    lib.cgru_get_last_error_message.restype = ctypes.c_char_p
    desc = _Desc()
    lib.cgru_rnn_desc_init(ctypes.byref(desc))
    desc.input_size, desc.hidden_size, desc.num_layers, desc.direction = 3, 4, INT_MAX, direction
    out = {}
    size = ctypes.c_size_t()
    status = lib.cgru_get_weight_space_size(ctypes.byref(desc), ctypes.byref(size))
    out["weight_space_size"] = [status, size.value, _message(lib)]
    out["temp_space_sizes"] = list(_sizes(lib, desc, 1, 2, 3))
    if status == 0:
        base = 1 << 20   # a weight space is never dereferenced by the accessor: any address
        m, b = ctypes.c_void_p(), ctypes.c_void_p()
        dims, b_dim = (ctypes.c_int32 * 2)(), ctypes.c_int32()
        status = lib.cgru_get_weight_params(ctypes.byref(desc), INT_MAX - 1, size,
                                            ctypes.c_void_p(base), 3, ctypes.byref(m), dims,
                                            ctypes.byref(b), ctypes.byref(b_dim))
        out["weight_params"] = [status, (m.value or base) - base, (b.value or base) - base,
                                list(dims), _message(lib)]
    out["forward"] = list(_forward_nothing(lib, desc, 0, 2, 3))
    print(json.dumps(out))


@pytest.mark.parametrize("direction", [0, 1], ids=["unidirectional", "bidirectional"])
def test_sizes_of_a_stack_of_int_max_layers(direction):
    """desc->num_layers = INT_MAX: the size queries answer at once (they took ~30 minutes, a
    Python loop over the layers).  Unidirectional: the closed-form sizes and offsets;
    bidirectional: L·D pseudo-layers exceed int32, refused by every call alike.  The timeout
    only catches a hang."""
    import json
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
            f"import test_capi; test_capi._huge_stack_child({direction})")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the size queries with num_layers = INT_MAX did not return within 120 s")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.splitlines()[-1])
    L, H, I = INT_MAX, 4, 3
    if direction == 0:
        elements = _closed_form_elements(I, H, L, 1)
        assert out["weight_space_size"] == [0, 4 * elements, ""]
        status, message, reserve = out["temp_space_sizes"]
        assert status == 0 and reserve > 4 * elements and reserve % 64 == 0, message
        # R_r (lin_layer_id 3) of the last pseudo-layer: after L − 1 whole layers and its W
        m_off = 3 * H * (I + H) + (L - 2) * 3 * H * (H + H) + 3 * H * H
        b_off = (elements - L * 6 * H) + ((L - 1) * 6 + 3) * H
        assert out["weight_params"] == [0, 4 * m_off, 4 * b_off, [H, H], ""]
        assert out["forward"][0] == capi.BAD_PARAM and "weight_space:" in out["forward"][1]
    else:
        status, _, message = out["weight_space_size"]
        assert status == capi.BAD_PARAM and message.startswith("desc->num_layers"), message
        assert str(2 * L) in message and str(INT_MAX) in message, message
        assert out["temp_space_sizes"][:2] == [status, message]
        assert out["forward"] == [status, message]


@pytest.mark.parametrize("input_mode", ["linear", "skip"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional", "reverse"])
@pytest.mark.parametrize("L", [1, 2, 3])
def test_weight_space_layout_of_the_accessor(lib, L, direction, input_mode):
    """cgru_get_weight_space_size and every offset of cgru_get_weight_params (closed forms)
    agree with where cgru.Network.from_flat takes each matrix and bias from."""
    I, H = (3, 3) if input_mode == "skip" else (5, 3)
    topo = cgru.Topology(I, H, L, direction, input_mode)
    desc = _desc_of(lib, topo)
    size = ctypes.c_size_t()
    _call(lib, "cgru_get_weight_space_size", ctypes.byref(desc), ctypes.byref(size))
    assert size.value == 8 * topo.flat_size() == 8 * _closed_form_elements(
        I, H, L, topo.num_directions, input_mode == "skip")
    index = cgru.Network.from_flat(topo, np.arange(topo.flat_size(), dtype=np.float64))
    space = np.zeros(topo.flat_size())
    base = space.ctypes.data
    m, b = ctypes.c_void_p(), ctypes.c_void_p()
    dims, b_dim = (ctypes.c_int32 * 2)(), ctypes.c_int32()
    for pl in range(topo.num_layer_directions):
        lp = index[pl]
        for k in range(6):
            _call(lib, "cgru_get_weight_params", ctypes.byref(desc), pl, size, _ptr(space), k,
                  ctypes.byref(m), dims, ctypes.byref(b), ctypes.byref(b_dim))
            matrix = (lp.W if k < 3 else lp.R)[k % 3 * H:(k % 3 + 1) * H]
            bias = (lp.b_W if k < 3 else lp.b_R)[k % 3 * H:(k % 3 + 1) * H]
            assert list(dims) == list(matrix.shape) and b_dim.value == H, (pl, k)
            if matrix.size:
                first = int(matrix.flat[0])
                assert m.value == base + 8 * first, (pl, k)
                assert np.array_equal(matrix.reshape(-1), np.arange(first, first + matrix.size))
            else:
                assert m.value is None, (pl, k)
            assert b.value == base + 8 * int(bias[0]), (pl, k)
            assert np.array_equal(bias, np.arange(bias[0], bias[0] + H))


@pytest.mark.parametrize("reset_after", [0, 1])
@pytest.mark.parametrize("L", [1, 2, 3, 9, 40])
def test_training_reserve_size_is_its_regions(lib, L, reset_after):
    """The training reserve size (deep stacks included, which capi.py does not size layer by
    layer) is the header, the engine's reserve, the copy of x and the weight gradients, each
    rounded up to 64 bytes (cgru/capi.py)."""
    topo = cgru.Topology(3, 4, L, "bidirectional")
    T_, N_ = 5, 7
    desc = _desc_of(lib, topo, np.float32, reset_after=reset_after)
    status, message, reserve = _sizes(lib, desc, 1, T_, N_)
    assert status == 0, message
    up = lambda n: -(-n // 64) * 64  # noqa: E731
    engine = cgru.reserve_nbytes(topo, T_, N_, cell=cgru.Cell(reset_after=bool(reset_after)),
                                 dtype=np.float32)
    assert reserve == (capi._HEADER_BYTES + up(engine) + up(T_ * N_ * 3 * 4) +
                       up(topo.flat_size() * 4))


# --- many Python threads on large shapes ------------------------------------------------------
def test_in_process_large_calls_from_python_threads_match_the_main_thread(lib):
    """The same forward + backward data + backward weights on shapes that split every call over
    threads inside (T·N = 1024, desc->num_threads = 0), from the main thread and from 4 Python
    threads at once: bitwise identical.  Bounded: the threads are joined with a timeout, and a
    watchdog ends the process should a hung call hold the GIL (no CI hangs)."""
    import faulthandler
    topo = cgru.Topology(LARGE["I"], LARGE["H"], num_layers=LARGE["L"],
                         direction="bidirectional")

    def sequence():
        return _Sequence(lib, topo, T=LARGE["T"], N=LARGE["N"], seed=9, num_threads=0)

    timeout = 600
    faulthandler.dump_traceback_later(timeout + 60, exit=True)
    try:
        main = sequence()
        main.run()
        want = main.results()
        sequences = [sequence() for _ in range(4)]
        errors = []

        def work(seq):
            try:
                seq.run()
            except AssertionError as e:
                errors.append(e)

        threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in sequences]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in threads), f"a call did not return within {timeout} s"
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert not errors, errors
    for k, seq in enumerate(sequences):
        got = seq.results()
        for name in want:
            assert got[name] == want[name], f"thread {k}: {name} differs from the main thread's"


# --- cuDNN's other modes: LSTM (with projection), RNN_TANH, RNN_RELU --------------------------
class _DescV2(ctypes.Structure):
    """The 0.2 descriptor (include/cgru.h): the 0.1 fields, then cell_mode and proj_size."""
    _fields_ = _Desc._fields_ + [("cell_mode", ctypes.c_int32), ("proj_size", ctypes.c_int32)]


_MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}
_CELLS = {"rnn_relu": cgru.RNNCell("relu"), "rnn_tanh": cgru.RNNCell("tanh"),
          "lstm": cgru.LSTMCell(), "gru": cgru.GRUCell()}


def _desc_v2(lib, topo, kind, dtype, **fields):
    desc = _DescV2()
    _call(lib, "cgru_rnn_desc_init_size", ctypes.byref(desc), ctypes.c_size_t(ctypes.sizeof(desc)))
    assert desc.struct_size == ctypes.sizeof(desc) and desc.cell_mode == 3   # GRU by default
    desc.data_type = 1 if dtype == np.float64 else 0
    desc.input_size, desc.hidden_size = topo.input_size, topo.hidden_size
    desc.num_layers = topo.num_layers
    desc.direction = {"forward": 0, "bidirectional": 1, "reverse": 2}[topo.direction]
    desc.input_mode = {"linear": 0, "skip": 1}[topo.input_mode]
    desc.cell_mode, desc.proj_size = _MODES[kind], topo.proj_size
    for k, v in fields.items():
        setattr(desc, k, v)
    return desc


MODE_CASES = [
    ("lstm", dict(input_size=3, hidden_size=5, num_layers=2, direction="bidirectional"),
     np.float64, False),
    ("lstm", dict(input_size=3, hidden_size=5, num_layers=2, proj_size=2), np.float32, True),
    ("lstm", dict(input_size=4, hidden_size=4, direction="reverse", input_mode="skip"),
     np.float64, False),
    ("rnn_tanh", dict(input_size=3, hidden_size=4, num_layers=2, direction="bidirectional"),
     np.float32, True),
    ("rnn_relu", dict(input_size=3, hidden_size=4), np.float64, False),
]


@pytest.mark.parametrize("kind,topo_kw,dtype,batch_major", MODE_CASES,
                         ids=[f"{c[0]}-{'-'.join(map(str, c[1].values()))}" for c in MODE_CASES])
def test_every_cell_mode_matches_the_python_api(lib, monkeypatch, kind, topo_kw, dtype,
                                                batch_major):
    """forward_ex (cx, cy), backward_data_ex (dcy, dcx) and backward_weights of each mode equal
    cgru.forward / cgru.backward of the same network; the weight space is Network.flat().  The
    weight gradients are computed straight into the reserve space (no buffer of the engine's),
    the Python API's into a buffer of its own."""
    from cgru.core import engine
    in_place = []
    real_in_place = engine._in_place
    monkeypatch.setattr(engine, "_in_place", lambda call: in_place.append(real_in_place(call))
                        or in_place[-1])
    topo = cgru.Topology(**topo_kw)
    desc = _desc_v2(lib, topo, kind, dtype, dropout=0.3 if topo.num_layers > 1 else 0.0,
                    seed=5, seed2=6)
    net = cgru.Network.random(topo, dtype, seed=3, cell=_CELLS[kind])
    Tn, Nn = 4, 3
    rng = np.random.default_rng(8)
    x = rng.standard_normal((Nn, Tn, topo.input_size) if batch_major
                            else (Tn, Nn, topo.input_size)).astype(dtype)
    LD, S, Hh = topo.num_layer_directions, topo.state_size, topo.hidden_size
    hx = rng.standard_normal((LD, Nn, S)).astype(dtype)
    lstm = kind == "lstm"
    cx = rng.standard_normal((LD, Nn, Hh)).astype(dtype) if lstm else None
    lengths = np.array([4, 1, 3], np.int32)
    f = cgru.forward(net, x, hx, c0=cx, lengths=lengths, batch_major=batch_major, training=True,
                     dropout=desc.dropout, seed=(5, 6))
    dy = rng.standard_normal(f.y.shape).astype(dtype)
    dhy = rng.standard_normal(f.hy.shape).astype(dtype)
    dcy = rng.standard_normal(f.cy.shape).astype(dtype) if lstm else None
    g = cgru.backward(net, x, f.reserve, dy, dhy, dcy=dcy, batch_major=batch_major)
    assert in_place == [False]

    wbytes, work, reserve_bytes = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
    _call(lib, "cgru_get_weight_space_size", ctypes.byref(desc), ctypes.byref(wbytes))
    assert wbytes.value == net.flat_size() * np.dtype(dtype).itemsize
    _call(lib, "cgru_get_temp_space_sizes", ctypes.byref(desc), 1, Tn, Nn, ctypes.byref(work),
          ctypes.byref(reserve_bytes))
    weights = net.flat()
    y = np.empty_like(f.y)
    hy = np.empty_like(f.hy)
    cy = np.empty_like(f.cy) if lstm else None
    reserve = np.empty(reserve_bytes.value, np.uint8)
    _call(lib, "cgru_rnn_forward_ex", ctypes.byref(desc), 1, int(batch_major), Tn, Nn,
          _ptr(lengths), _ptr(x), _ptr(y), _ptr(hx), _ptr(hy), _ptr(cx), _ptr(cy),
          ctypes.c_size_t(wbytes.value), _ptr(weights), ctypes.c_size_t(0), None,
          ctypes.c_size_t(reserve.size), _ptr(reserve))
    np.testing.assert_array_equal(y, f.y)
    np.testing.assert_array_equal(hy, f.hy)
    if lstm:
        np.testing.assert_array_equal(cy, f.cy)
    dw_at = int(reserve[:64].view(np.int64)[6])       # the header's offset of the gradients
    reserve[dw_at:dw_at + wbytes.value] = 0xFF            # NaN: each element must be written
    dx = np.empty_like(x)
    dhx = np.empty_like(hx)
    dcx = np.empty_like(cx) if lstm else None
    _call(lib, "cgru_rnn_backward_data_ex", ctypes.byref(desc), int(batch_major), Tn, Nn,
          _ptr(lengths), _ptr(dy), _ptr(dx), _ptr(dhy), _ptr(dhx), _ptr(dcy), _ptr(dcx),
          ctypes.c_size_t(wbytes.value), _ptr(weights), ctypes.c_size_t(0), None,
          ctypes.c_size_t(reserve.size), _ptr(reserve))
    np.testing.assert_array_equal(dx, g.dx)
    np.testing.assert_array_equal(dhx, g.dh0)
    if lstm:
        np.testing.assert_array_equal(dcx, g.dc0)
    assert in_place == [False, True]
    dw = np.full_like(weights, np.nan)
    _call(lib, "cgru_rnn_backward_weights", ctypes.byref(desc), 1, int(batch_major), Tn, Nn,
          _ptr(lengths), ctypes.c_size_t(wbytes.value), _ptr(dw), ctypes.c_size_t(0), None,
          ctypes.c_size_t(reserve.size), _ptr(reserve))
    np.testing.assert_array_equal(dw, g.dparams.flat())


@pytest.mark.parametrize("kind,proj", [("lstm", 0), ("lstm", 2), ("rnn_tanh", 0),
                                       ("rnn_relu", 0), ("gru", 0)])
def test_weight_params_of_every_mode(lib, kind, proj):
    """cgru_get_weight_params finds every matrix and bias of every mode where Network.flat()
    puts it (linLayerIDs 0…2G−1, and 8 for the LSTM projection, which has no bias)."""
    topo = cgru.Topology(3, 4, 2, "bidirectional", proj_size=proj)
    net = cgru.Network.random(topo, np.float64, seed=1, cell=_CELLS[kind])
    desc = _desc_v2(lib, topo, kind, np.float64)
    weights = net.flat()
    base = weights.ctypes.data
    G, Hh, S = net.cell.gates, topo.hidden_size, topo.state_size
    m_addr, b_addr = ctypes.c_void_p(), ctypes.c_void_p()
    m_dims, b_dim = (ctypes.c_int32 * 2)(), ctypes.c_int32()
    for i in range(topo.num_layer_directions):
        lp = net[i]
        for k in range(2 * G + (1 if proj else 0)):
            _call(lib, "cgru_get_weight_params", ctypes.byref(desc), i,
                  ctypes.c_size_t(weights.nbytes), _ptr(weights), k, ctypes.byref(m_addr),
                  m_dims, ctypes.byref(b_addr), ctypes.byref(b_dim))
            rows, cols = m_dims[0], m_dims[1]
            off = (m_addr.value - base) // 8
            got = weights[off:off + rows * cols].reshape(rows, cols)
            if k == 2 * G:                               # the projection
                np.testing.assert_array_equal(got, lp.W_p)
                assert b_addr.value is None and b_dim.value == 0
                continue
            want = (lp.W if k < G else lp.R)[(k % G) * Hh:(k % G + 1) * Hh]
            np.testing.assert_array_equal(got, want)
            boff = (b_addr.value - base) // 8
            bias = (lp.b_W if k < G else lp.b_R)[(k % G) * Hh:(k % G + 1) * Hh]
            np.testing.assert_array_equal(weights[boff:boff + Hh], bias)
        status = lib.cgru_get_weight_params(ctypes.byref(desc), i,
                                            ctypes.c_size_t(weights.nbytes), _ptr(weights),
                                            2 * G + (1 if proj else 0), None, None, None, None)
        assert status == capi.BAD_PARAM
        assert b"lin_layer_id" in lib.cgru_get_last_error_message()
    assert S == (proj or Hh)


@pytest.mark.parametrize("what,fields,expect", [
    ("unknown cell mode", dict(cell_mode=7), b"desc->cell_mode: unknown value 7"),
    ("projection on a GRU", dict(cell_mode=3, proj_size=2), b"desc->proj_size"),
    ("projection wider than H", dict(cell_mode=2, proj_size=9), b"desc->proj_size"),
])
def test_bad_cell_mode_fields(lib, what, fields, expect):
    desc = _desc_v2(lib, cgru.Topology(3, 4), "gru", np.float32, **fields)
    size = ctypes.c_size_t()
    assert lib.cgru_get_weight_space_size(ctypes.byref(desc), ctypes.byref(size)) == capi.BAD_PARAM
    assert expect in lib.cgru_get_last_error_message()


def test_cell_states_of_a_gru_are_refused(lib):
    topo = cgru.Topology(3, 4)
    desc = _desc_v2(lib, topo, "gru", np.float64)
    net = cgru.Network.random(topo, np.float64, cell=cgru.GRUCell())
    w = net.flat()
    x, y, c = np.zeros((2, 1, 3)), np.zeros((2, 1, 4)), np.zeros((1, 1, 4))
    status = lib.cgru_rnn_forward_ex(ctypes.byref(desc), 0, 0, 2, 1, None, _ptr(x), _ptr(y),
                                     None, None, _ptr(c), None, ctypes.c_size_t(w.nbytes),
                                     _ptr(w), ctypes.c_size_t(0), None, ctypes.c_size_t(0), None)
    assert status == capi.BAD_PARAM
    assert lib.cgru_get_last_error_message().startswith(b"cx: expected NULL")


def test_programs_built_against_the_0_1_header_still_run(tmp_path):
    """tests/c/abi-0.1/cgru.h is cgru 0.1's header: the example built against it (its smaller
    descriptor, cgru_rnn_desc_init and the 0.1 forward/backward) runs with this library and
    gives the same results as built against today's header."""
    if CC is None:
        pytest.skip("no C compiler")
    results = {}
    for tag, inc in (("0.1", os.path.join(C_DIR, "abi-0.1")), ("now", cgru.get_include())):
        exe = tmp_path / f"example_{tag.replace('.', '_')}"
        cmd = (f"{CC} -std=c99 -Wall -Wextra -Werror -I{shlex.quote(inc)} -I{shlex.quote(C_DIR)} "
               f"{shlex.quote(os.path.join(C_DIR, 'gru_example.c'))} -o {shlex.quote(str(exe))} "
               f"{_flags_command()}")
        res = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        assert res.returncode == 0, cmd + res.stdout + res.stderr
        out = tmp_path / f"{tag}.bin"
        run = _run([str(exe), "double", "time", str(out)])
        assert run.returncode == 0 and "OK" in run.stdout, run.stdout + run.stderr
        results[tag] = _read_results(out)
    assert results["0.1"].keys() == results["now"].keys()
    for name in results["now"]:
        np.testing.assert_array_equal(results["0.1"][name], results["now"][name], err_msg=name)


def test_repeated_calls_on_one_weight_space_pack_once_and_see_changes(lib, monkeypatch):
    """The weight space at one address is wrapped by the same view on every call, so cgru's
    kept copy of the weights (and its packs) is found again; weights changed in place between
    calls are seen by the next one (the kept copy is proven by its bytes)."""
    from cgru.core import plan, weights as kept_weights
    packs = []
    real = kept_weights.pack_rhs
    monkeypatch.setattr(kept_weights, "pack_rhs", lambda B, fwd: packs.append(1) or real(B, fwd))
    cgru.release_memory()
    topo = cgru.Topology(3, 4)
    params = cgru.Network.random(topo, np.float64, seed=2)
    desc = _Desc()
    _call(lib, "cgru_rnn_desc_init", ctypes.byref(desc))
    desc.data_type, desc.input_size, desc.hidden_size, desc.num_layers = 1, 3, 4, 1
    weights = params.flat()
    x = np.random.default_rng(3).standard_normal((5, 2, 3))
    y = np.empty((5, 2, 4))

    def forward():
        _call(lib, "cgru_rnn_forward", ctypes.byref(desc), 0, 0, 5, 2, None, _ptr(x), _ptr(y),
              None, None, ctypes.c_size_t(weights.nbytes), _ptr(weights), ctypes.c_size_t(0),
              None, ctypes.c_size_t(0), None)
        return y.copy()
    first = forward()
    made = len(packs)
    for _ in range(3):
        np.testing.assert_array_equal(forward(), first)
    assert len(packs) == made == 2        # R for the time loop, W for the input projection
    weights[-20] += 0.5                       # a bias, in place in the weight space
    changed = forward()
    want = cgru.forward(cgru.Network.from_flat(topo, weights), x).y
    np.testing.assert_allclose(changed, want, rtol=1e-12, atol=1e-13)
    assert not np.allclose(changed, first)


def test_repeated_calls_read_the_descriptor_and_wrap_the_weights_once(lib, monkeypatch):
    """A host's calls repeat one descriptor and one weight space: the descriptor is turned
    into a model once, the weight space into a network once (libcgru keeps both for the next
    call), and every call still gives the Python API's result."""
    import cgru.capi as capi
    size = ctypes.c_size_t()
    _call(lib, "cgru_get_weight_space_size", ctypes.byref(_desc_of(lib, cgru.Topology(1, 1))),
          ctypes.byref(size))                   # libcgru's set-up (its warm-up) done before
    made = {"models": 0, "networks": 0}
    real_model, real_view = capi._make_model, capi._params_view

    def count(what, real):
        def counted(*args):
            made[what] += 1
            return real(*args)
        return counted
    monkeypatch.setattr(capi, "_make_model", count("models", real_model))
    monkeypatch.setattr(capi, "_params_view", count("networks", real_view))
    monkeypatch.setattr(capi, "_MODELS", {})
    topo = cgru.Topology(3, 5)
    weights = cgru.Network.random(topo, np.float64, seed=6).flat()
    desc = _desc_v2(lib, topo, "gru", np.float64, seed=77)   # a descriptor no other test uses
    x = np.random.default_rng(7).standard_normal((4, 2, 3))
    want = cgru.forward(cgru.Network.from_flat(topo, weights), x).y
    for _ in range(4):
        _call(lib, "cgru_get_weight_space_size", ctypes.byref(desc), ctypes.byref(size))
        y = np.empty((4, 2, 5))
        _call(lib, "cgru_rnn_forward", ctypes.byref(desc), 0, 0, 4, 2, None, _ptr(x), _ptr(y),
              None, None, size, _ptr(weights), ctypes.c_size_t(0), None, ctypes.c_size_t(0),
              None)
        np.testing.assert_array_equal(y, want)
    assert made == {"models": 1, "networks": 1}, made


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("states", ["none", "hx", "hy", "both"])
def test_repeated_inference_writes_the_callers_buffers_as_the_first_call(lib, monkeypatch,
                                                                          kind, states):
    """From the third identical inference on, a call runs as the engine's repeated calls run
    (straight into the plan's runner), writing the caller's y, hy and cy: bitwise what the
    first calls (the general path) and the Python API compute, with or without hx / hy (and
    cx / cy), and weights changed in place are seen."""
    from cgru.core import engine
    runs = []
    real = engine.run_recorded
    monkeypatch.setattr(engine, "run_recorded", lambda *a: runs.append(1) or real(*a))
    topo = cgru.Topology(3, 4, 2, "bidirectional")
    net = cgru.Network.random(topo, np.float32, seed=12, cell=_CELLS[kind])
    weights = net.flat()
    desc = _desc_v2(lib, topo, kind, np.float32)
    rng = np.random.default_rng(13)
    x = rng.standard_normal((6, 3, 3)).astype(np.float32)
    h0 = rng.standard_normal((4, 3, 4)).astype(np.float32)
    c0 = rng.standard_normal((4, 3, 4)).astype(np.float32) if kind == "lstm" else None
    give_h0, give_hy = states in ("hx", "both"), states in ("hy", "both")
    lstm = kind == "lstm"
    for change in range(2):
        if change:
            weights[7] += 0.25                            # in place, between calls
        out = cgru.forward(cgru.Network.from_flat(topo, weights, cell=_CELLS[kind]), x,
                           h0 if give_h0 else None, c0=c0 if give_h0 else None)
        for _ in range(4):     # the engine makes a runner on the 2nd call, runs it from the 3rd
            y, hy = np.full((6, 3, 8), np.nan, np.float32), np.full((4, 3, 4), np.nan, np.float32)
            cy = np.full((4, 3, 4), np.nan, np.float32)
            _call(lib, "cgru_rnn_forward_ex", ctypes.byref(desc), 0, 0, 6, 3, None, _ptr(x),
                  _ptr(y), _ptr(h0) if give_h0 else None, _ptr(hy) if give_hy else None,
                  _ptr(c0) if lstm and give_h0 else None, _ptr(cy) if lstm and give_hy else None,
                  ctypes.c_size_t(weights.nbytes), _ptr(weights), ctypes.c_size_t(0), None,
                  ctypes.c_size_t(0), None)
            np.testing.assert_array_equal(y, out.y)
            if give_hy:
                np.testing.assert_array_equal(hy, out.hy)
                if lstm:
                    np.testing.assert_array_equal(cy, out.cy)
    assert len(runs) >= 4, runs            # the repeated calls (2 per weights) took that path


def test_many_reserve_spaces_keep_the_weights_copies_found(lib, monkeypatch):
    """A host that trains five networks in turn, with a fresh reserve space each step (at 12
    addresses in turn), as TensorFlow's kernels do for a stack of five layers: cgru's copy of
    each network's weights is made once and found again on every later call (the reserve
    spaces' gradient regions, which libcgru wraps as well, never push a weight space's wrapper
    out), and every step's gradients are the Python API's."""
    from cgru.core import weights as kept_weights
    topo = cgru.Topology(3, 4)
    nets = [cgru.Network.random(topo, np.float64, seed=14 + k) for k in range(5)]
    spaces = [net.flat() for net in nets]
    desc = _desc_v2(lib, topo, "gru", np.float64)
    x = np.random.default_rng(15).standard_normal((5, 2, 3))
    y, dx, dy = np.empty((5, 2, 4)), np.empty_like(x), np.ones((5, 2, 4))
    want = []
    for net in nets:
        f = cgru.forward(net, x, training=True)
        want.append(cgru.backward(net, x, f.reserve, dy).dparams.flat())
    work, rbytes = ctypes.c_size_t(), ctypes.c_size_t()
    _call(lib, "cgru_get_temp_space_sizes", ctypes.byref(desc), 1, 5, 2, ctypes.byref(work),
          ctypes.byref(rbytes))
    reserves = [np.zeros(rbytes.value // 8 + 1) for _ in range(12)]
    copies = []
    for step in range(40):
        if step == 5:                        # each network's weights have been copied once
            real = kept_weights.Kept.of_copy.__func__
            monkeypatch.setattr(kept_weights.Kept, "of_copy",
                                classmethod(lambda cls, *a: copies.append(1) or real(cls, *a)))
        k, r = step % 5, reserves[step % 12]
        weights, wb = spaces[k], ctypes.c_size_t(spaces[k].nbytes)
        args = (work, None, rbytes, _ptr(r))
        _call(lib, "cgru_rnn_forward", ctypes.byref(desc), 1, 0, 5, 2, None, _ptr(x), _ptr(y),
              None, None, wb, _ptr(weights), *args)
        _call(lib, "cgru_rnn_backward_data", ctypes.byref(desc), 0, 5, 2, None, _ptr(dy),
              _ptr(dx), None, None, wb, _ptr(weights), *args)
        dw = np.full_like(weights, np.nan)
        _call(lib, "cgru_rnn_backward_weights", ctypes.byref(desc), 1, 0, 5, 2, None, wb,
              _ptr(dw), *args)
        np.testing.assert_array_equal(dw, want[k])
    assert copies == [], f"{len(copies)} weight arrays copied again"


def test_a_failed_backward_data_leaves_no_weight_gradients_to_take(lib):
    """Backward data computes the weight gradients straight into the reserve space: one that
    fails (here: the weights changed since the forward) may leave them partly written, so
    backward weights refuses them until a backward data succeeds — and then gives the Python
    API's."""
    topo = cgru.Topology(3, 4)
    net = cgru.Network.random(topo, np.float64, seed=16)
    weights = net.flat()
    desc = _desc_v2(lib, topo, "gru", np.float64)
    x = np.random.default_rng(17).standard_normal((5, 2, 3))
    y, dx, dy = np.empty((5, 2, 4)), np.empty_like(x), np.ones((5, 2, 4))
    f = cgru.forward(net, x, training=True)
    want = cgru.backward(net, x, f.reserve, dy).dparams.flat()
    work, rbytes = ctypes.c_size_t(), ctypes.c_size_t()
    _call(lib, "cgru_get_temp_space_sizes", ctypes.byref(desc), 1, 5, 2, ctypes.byref(work),
          ctypes.byref(rbytes))
    reserve = np.zeros(rbytes.value // 8 + 1)
    wb = ctypes.c_size_t(weights.nbytes)
    args = (work, None, rbytes, _ptr(reserve))

    def backward_data():
        return lib.cgru_rnn_backward_data(ctypes.byref(desc), 0, 5, 2, None, _ptr(dy),
                                          _ptr(dx), None, None, wb, _ptr(weights), *args)

    def backward_weights(dw):
        return lib.cgru_rnn_backward_weights(ctypes.byref(desc), 1, 0, 5, 2, None, wb,
                                             _ptr(dw), *args)
    _call(lib, "cgru_rnn_forward", ctypes.byref(desc), 1, 0, 5, 2, None, _ptr(x), _ptr(y),
          None, None, wb, _ptr(weights), *args)
    assert backward_data() == 0
    kept = weights[3]
    weights[3] = kept + 1.0                   # not the forward's weights any more
    assert backward_data() == 1               # BAD_PARAM
    assert b"weight" in lib.cgru_get_last_error_message()
    dw = np.zeros_like(weights)
    assert backward_weights(dw) == 1
    assert b"backward_data has not run" in lib.cgru_get_last_error_message()
    assert not dw.any()
    weights[3] = kept                         # the forward's weights again
    assert backward_data() == 0
    assert backward_weights(dw) == 0
    np.testing.assert_array_equal(dw, want)


def test_one_weight_space_read_as_another_network_by_each_descriptor(lib):
    """One weight space buffer passed with descriptors that give it the same size but another
    meaning — the GRU's reset gate before or after, the tanh or ReLU RNN, a forward or reversed
    direction —, in turn, twice: each call computes its own descriptor's network (what libcgru
    keeps per weight space and descriptor must never serve another)."""
    cases = [("gru", 1, "forward"), ("gru", 0, "forward"), ("rnn_tanh", 1, "forward"),
             ("rnn_relu", 1, "forward"), ("gru", 1, "reverse"), ("rnn_tanh", 1, "reverse")]
    weights = {}
    for kind in ("gru", "rnn_tanh"):
        net = cgru.Network.random(cgru.Topology(3, 4), np.float64, seed=8,
                                  cell=cgru.GRUCell() if kind == "gru" else cgru.RNNCell())
        weights[kind] = net.flat()
    x = np.random.default_rng(9).standard_normal((5, 2, 3))
    space = np.empty(max(w.size for w in weights.values()))
    results = {}
    for round_ in range(2):
        for kind, reset_after, direction in cases:
            w = weights["gru" if kind == "gru" else "rnn_tanh"]
            space[:w.size] = w
            desc = _desc_v2(lib, cgru.Topology(3, 4, direction=direction), kind, np.float64,
                            reset_after=reset_after)
            y = np.empty((5, 2, 4))
            _call(lib, "cgru_rnn_forward", ctypes.byref(desc), 0, 0, 5, 2, None, _ptr(x),
                  _ptr(y), None, None, ctypes.c_size_t(w.nbytes), _ptr(space),
                  ctypes.c_size_t(0), None, ctypes.c_size_t(0), None)
            cell = (cgru.GRUCell(reset_after=bool(reset_after)) if kind == "gru" else
                    cgru.RNNCell(kind[4:]))
            want = cgru.forward(cgru.Network.from_flat(
                cgru.Topology(3, 4, direction=direction), w, cell=cell), x).y
            np.testing.assert_array_equal(y, want, err_msg=f"{kind} {reset_after} {direction}")
            results.setdefault((kind, reset_after, direction), y)
    firsts = list(results.values())
    assert all(not np.array_equal(a, b) for i, a in enumerate(firsts) for b in firsts[i + 1:])


@pytest.mark.parametrize("tamper", ["state", "dw", "a recorded argument"])
def test_a_changed_reserve_space_is_refused(lib, tamper):
    """The C reserve space's header is sealed (a keyed MAC) and so is the weight gradient that
    backward_data leaves in it: a state flipped to "backward_data done", a changed dw or a
    changed recorded argument is refused instead of handing out wrong weight gradients."""
    topo = cgru.Topology(3, 4)
    params = cgru.Network.random(topo, np.float64, seed=4)
    desc = _Desc()
    _call(lib, "cgru_rnn_desc_init", ctypes.byref(desc))
    desc.data_type, desc.input_size, desc.hidden_size, desc.num_layers = 1, 3, 4, 1
    weights = params.flat()
    x = np.random.default_rng(5).standard_normal((5, 2, 3))
    y, dx = np.empty((5, 2, 4)), np.empty_like(x)
    dy = np.ones_like(y)
    wbytes, work, rbytes = ctypes.c_size_t(weights.nbytes), ctypes.c_size_t(), ctypes.c_size_t()
    _call(lib, "cgru_get_temp_space_sizes", ctypes.byref(desc), 1, 5, 2, ctypes.byref(work),
          ctypes.byref(rbytes))
    reserve = np.zeros(rbytes.value // 8, np.int64)
    dweights = np.zeros_like(weights)
    args = (wbytes, _ptr(weights), work, None, rbytes, _ptr(reserve))
    _call(lib, "cgru_rnn_forward", ctypes.byref(desc), 1, 0, 5, 2, None, _ptr(x), _ptr(y),
          None, None, *args)
    if tamper == "state":
        reserve[2] = 2                       # "backward_data has run": dw would be garbage
    else:
        _call(lib, "cgru_rnn_backward_data", ctypes.byref(desc), 0, 5, 2, None, _ptr(dy),
              _ptr(dx), None, None, *args)
        if tamper == "dw":
            reserve[reserve[6] // 8] += 1         # the first word of dw (slot 6: its offset)
        else:
            reserve[8 + 7] ^= 1                  # desc->dropout's bits, as recorded
    status = lib.cgru_rnn_backward_weights(ctypes.byref(desc), 1, 0, 5, 2, None, wbytes,
                                           _ptr(dweights), work, None, rbytes, _ptr(reserve))
    message = lib.cgru_get_last_error_message().decode()
    assert status == 1, (status, message)
    assert "reserve_space:" in message and ("does not verify" in message or
                                            "were changed since" in message), message
