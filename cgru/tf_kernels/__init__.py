"""TensorFlow's own ``CudnnRNN`` ops on the CPU: a TF kernel library computed by cgru.

TensorFlow defines the ``CudnnRNN`` op family in every build but registers kernels for GPUs
only, so on a CPU a graph, SavedModel, ``tf.function`` or layer holding one fails ("No OpKernel
was registered to support Op 'CudnnRNN'").  ``load_kernels()`` registers CPU kernels for all
eleven ops (``CudnnRNN``, ``CudnnRNNV2``, ``CudnnRNNV3``, their ``Backprop``s,
``CudnnRNNParamsSize``, ``CudnnRNNParamsToCanonical[V2]``, ``CudnnRNNCanonicalToParams[V2]``)::

    import tensorflow as tf
    import cgru.tf
    cgru.tf.load_kernels()          # the first call builds the library (about a minute)
    model = tf.saved_model.load("exported_on_a_gpu")      # now runs on the CPU

The kernels (``cudnn_rnn_kernels.cc``, C++ against the installed TensorFlow's headers) call
cgru's C ABI (``include/cgru.h``, ``libcgru``), so they compute exactly what ``cgru.tf``'s NumPy
functions compute, on the same opaque ``params`` layout, in float32 and float64 (float16 and
bfloat16 in float32, rounded); TensorFlow's registered gradients work through them unchanged.
docs/tf_kernels.md describes the build, the cache, the limits and the semantics.

The library is built once per build configuration — TensorFlow's version and compile and link
flags (its C++ ABI among them), the C++ compiler and its version, the sources and cgru's header,
and where libcgru lives — and cached in ``$CGRU_CACHE_DIR``, else ``$XDG_CACHE_HOME/cgru``, else
``~/.cache/cgru``, under ``tf_kernels/<key>/``.  A file lock (``fcntl``) makes concurrent
processes build it once; the compiler writes a temporary file that is renamed into place, so a
library in the cache is always complete.  ``$CXX`` picks the compiler (default ``c++``).
"""
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import threading
from contextlib import contextmanager

__all__ = ["load_kernels", "library_path", "cache_dir", "build_config", "BuildError",
           "LIBRARY", "SOURCES"]

LIBRARY = "libcgru_tf_kernels.so"
SOURCES = ("cudnn_rnn_kernels.cc",)
_HERE = os.path.dirname(os.path.abspath(__file__))
_BUILD_TIMEOUT = 3600          # seconds: a hung compiler is an error, not a hang
_load_lock = threading.Lock()
_loaded = None                 # the path of the library loaded into this process


class BuildError(RuntimeError):
    """The kernel library cannot be built: what is missing, or what the compiler said."""


# --- what the library depends on ------------------------------------------------------------
def cache_dir():
    """The cache root: ``$CGRU_CACHE_DIR``, else ``$XDG_CACHE_HOME/cgru``, else
    ``~/.cache/cgru``."""
    explicit = os.environ.get("CGRU_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "cgru")


def _tensorflow():
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError("cgru.tf.load_kernels needs TensorFlow: pip install \"cgru[tf]\" "
                          "(tensorflow-cpu), or any TensorFlow 2 with its C++ headers") from e
    return tf


def _compiler():
    """``(argv, version line)`` of the C++ compiler: ``$CXX`` (may carry flags), else ``c++``,
    ``g++`` or ``clang++`` on ``PATH``."""
    hint = ("install a C++17 compiler (Debian/Ubuntu: apt-get install g++; Fedora: dnf install "
            "gcc-c++; macOS: xcode-select --install; conda: conda install -c conda-forge "
            "cxx-compiler) or set CXX to one")
    env = os.environ.get("CXX", "").strip()
    if env:
        argv = shlex.split(env)
        if shutil.which(argv[0]) is None:
            raise BuildError(f"CXX={env!r}: {argv[0]} is not an executable on PATH; {hint}")
    else:
        found = next((shutil.which(c) for c in ("c++", "g++", "clang++") if shutil.which(c)),
                     None)
        if found is None:
            raise BuildError(f"no C++ compiler found (CXX is unset and none of c++, g++, "
                             f"clang++ is on PATH); {hint}")
        argv = [found]
    try:
        res = subprocess.run(argv + ["--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"the C++ compiler {argv[0]} does not run ({e}); {hint}") from e
    lines = (res.stdout or res.stderr).splitlines()
    return argv, lines[0].strip() if lines else ""


def _tf_include(tf):
    include = tf.sysconfig.get_include()
    if not os.path.isfile(os.path.join(include, "tensorflow", "core", "framework",
                                       "op_kernel.h")):
        raise BuildError(f"TensorFlow's C++ headers are missing (no "
                         f"tensorflow/core/framework/op_kernel.h under {include}); install a "
                         f"TensorFlow wheel that ships them (pip install tensorflow-cpu, or "
                         f"tensorflow)")
    return include


def _libcgru():
    """``(include dir, library dir)`` of cgru's C ABI."""
    from cgru.capi import info
    if not os.path.isfile(info.library_path()):
        raise BuildError(f"{info.library_path()} is missing: cgru was installed without its C "
                         f"ABI library; reinstall it with a C compiler available (pip install "
                         f"cgru, or pip install -e . in a checkout)")
    return info.get_include(), info.get_library_dir()


def _sources_digest(header_dir):
    h = hashlib.sha256()
    for path in [os.path.join(_HERE, s) for s in SOURCES] + [os.path.join(header_dir, "cgru.h")]:
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read())
    return h.hexdigest()


def build_config():
    """Everything the library's build depends on, as a dict (its digest is the cache key):
    TensorFlow's version, compile and link flags, the compiler and its version, cgru's C ABI
    (header and library directories) and a digest of the sources."""
    tf = _tensorflow()
    include = _tf_include(tf)
    compiler, version = _compiler()
    cgru_include, cgru_libdir = _libcgru()
    return {"tensorflow": tf.__version__, "tf_include": include,
            "compile_flags": list(tf.sysconfig.get_compile_flags()),
            "link_flags": list(tf.sysconfig.get_link_flags()),
            "compiler": compiler, "compiler_version": version,
            "cgru_include": cgru_include, "cgru_libdir": cgru_libdir,
            "sources": _sources_digest(cgru_include)}


def _key(config):
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:20]


def _command(config, output):
    """The compiler's argv: one shared library from the sources, linked to TensorFlow's
    framework library and to libcgru, with run paths to both."""
    tf_dirs = [f[2:] for f in config["link_flags"] if f.startswith("-L")]
    return (config["compiler"]
            + ["-shared", "-fPIC", "-O2", "-Wno-deprecated-declarations"]
            + config["compile_flags"] + [f"-I{config['cgru_include']}"]
            + [os.path.join(_HERE, s) for s in SOURCES]
            + ["-o", output] + config["link_flags"]
            + [f"-L{config['cgru_libdir']}", "-lcgru"]
            + [f"-Wl,-rpath,{d}" for d in [config["cgru_libdir"]] + tf_dirs])


# --- the cache --------------------------------------------------------------------------------
@contextmanager
def _file_lock(path):
    """An exclusive ``fcntl`` lock on ``path`` (created if needed) for the ``with`` body."""
    try:
        import fcntl
    except ImportError as e:          # Windows: neither fcntl nor libcgru
        raise BuildError("TensorFlow's CudnnRNN kernels are built on Linux and macOS only "
                         "(the cache lock needs fcntl, the kernels need libcgru)") from e
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _compile(config, directory, target):
    """Build into a temporary file beside ``target``, then rename it into place (atomic: a
    library at ``target`` is always complete).  The compiler's output goes to build.log."""
    tmp = os.path.join(directory, f".{LIBRARY}.{os.getpid()}.tmp")
    command = _command(config, tmp)
    log = os.path.join(directory, "build.log")
    try:
        try:
            res = subprocess.run(command, capture_output=True, text=True,
                                 timeout=_BUILD_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            raise BuildError(f"building {LIBRARY} took more than {_BUILD_TIMEOUT} s; "
                             f"command: {shlex.join(command)}") from e
        with open(log, "w") as f:
            f.write(shlex.join(command) + "\n\n" + res.stdout + res.stderr)
        if res.returncode != 0 or not os.path.isfile(tmp):
            errors = [ln for ln in res.stderr.splitlines() if "error" in ln][:20]
            raise BuildError(f"building {LIBRARY} failed (exit status {res.returncode}):\n"
                             + "\n".join(errors or res.stderr.splitlines()[-20:])
                             + f"\nfull log: {log}")
        with open(os.path.join(directory, "build.json"), "w") as f:
            json.dump(config, f, indent=1, sort_keys=True)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def library_path():
    """The path of the kernel library for the installed TensorFlow, built first if the cache
    does not hold it yet (under a file lock: concurrent callers build it once).  Raises
    ``BuildError`` saying what to install when there is no compiler, no TensorFlow headers or
    no libcgru, or what the compiler said."""
    config = build_config()
    directory = os.path.join(cache_dir(), "tf_kernels", _key(config))
    target = os.path.join(directory, LIBRARY)
    if not os.path.isfile(target):
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise BuildError(f"cannot create the cache directory {directory} ({e}); set "
                             f"CGRU_CACHE_DIR to a writable directory") from e
        with _file_lock(os.path.join(directory, "build.lock")):
            if not os.path.isfile(target):      # another process may have built it meanwhile
                _compile(config, directory, target)
    return target


def load_kernels():
    """Build (first use) and load the CPU kernels of TensorFlow's eleven ``CudnnRNN`` ops into
    this process's TensorFlow; returns the library's path.  Idempotent: later calls return the
    same path without loading again.  Call it before running (or loading) a graph that holds
    ``CudnnRNN`` ops."""
    global _loaded
    with _load_lock:
        if _loaded is None:
            tf = _tensorflow()
            path = library_path()
            tf.load_op_library(path)
            _loaded = path
        return _loaded
