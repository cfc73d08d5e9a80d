"""Build cgru's Cython extensions and libcgru (the C ABI).

The kernels' parallel regions are OpenMP (``cgru/_kernels/parallel.h``).  The build first
checks that the compiler can compile, link and run a small OpenMP program (as scikit-learn's
``check_openmp_support`` does); if it cannot — Apple's clang without libomp, say — it warns and
builds the kernels serially (``cgru.parallel_enabled()`` is then False).  The flags are
``-fopenmp`` (macOS: ``-Xpreprocessor -fopenmp`` and ``-lomp``); ``CGRU_OPENMP_CFLAGS`` and
``CGRU_OPENMP_LDFLAGS`` replace them (e.g. to build against LLVM's libomp with GCC:
``CGRU_OPENMP_LDFLAGS="-L/usr/lib/llvm-14/lib -lomp"``), ``CGRU_OPENMP=0`` builds serially.
``CGRU_DEBUG=1`` in the environment turns on Cython's bounds and wraparound checks and, where
the compiler supports them, the address and undefined-behaviour sanitizers.
"""
import os
import shlex
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

DEBUG = os.environ.get("CGRU_DEBUG", "") not in ("", "0")


compile_args = ["-O3", "-fno-math-errno", "-Wno-psabi", "-pthread"]
link_args = ["-pthread"]
if DEBUG:
    compile_args = ["-O1", "-g", "-fno-omit-frame-pointer"] + compile_args[1:]
    if os.environ.get("CGRU_SANITIZE", "1") != "0":
        compile_args += ["-fsanitize=address,undefined"]
        link_args += ["-fsanitize=address,undefined"]

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
}

KERNELS = "cgru/_kernels"
# The C kernels (the packed GEMM, the gate rows, the vector math; src/*.c over simd.h and
# gates.h), compiled once and linked into every module that calls them
KERNEL_SOURCES = [f"{KERNELS}/src/{part}.c" for part in ("gemm_f32", "gemm_f64", "gates_f32",
                                                          "gates_f64")]
KERNEL_HEADERS = [f"{KERNELS}/{h}" for h in ("simd.h", "gates.h")]
extensions = [
    Extension(
        f"cgru._kernels.{name}",
        [f"{KERNELS}/{name}.pyx"],
        include_dirs=[np.get_include(), KERNELS],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        depends=[f"{KERNELS}/{h}" for h in ("simd.h", "gates.h", "hash.h", "team.h",
                                            "threads.pxd", "blas.pxd", "loops.pxd", "entry.pxi",
                                            "driver.pxi")
                 + (("parallel.h",) if name == "threads" else ())]
        + (KERNEL_SOURCES if name != "threads" else []),
    )
    for name in ("threads", "blas", "loops", "gru", "lstm", "rnn")
]


OPENMP_PROBE = textwrap.dedent("""
    #include <omp.h>
    #include <stdio.h>
    int main(void) {
        int members = 0;
        #pragma omp parallel num_threads(2)
        {
            #pragma omp atomic
            members++;
        }
        printf("%d %d\\n", members, omp_get_max_threads() >= 1);
        return 0;
    }
""")


def openmp_flags():
    """``(compile flags, link flags)`` of the compiler's OpenMP: the defaults, or the
    ``CGRU_OPENMP_CFLAGS`` / ``CGRU_OPENMP_LDFLAGS`` the environment gives."""
    if sys.platform == "darwin":
        cflags, ldflags = ["-Xpreprocessor", "-fopenmp"], ["-lomp"]
    else:
        cflags, ldflags = ["-fopenmp"], ["-fopenmp"]
    if "CGRU_OPENMP_CFLAGS" in os.environ:
        cflags = shlex.split(os.environ["CGRU_OPENMP_CFLAGS"])
    if "CGRU_OPENMP_LDFLAGS" in os.environ:
        ldflags = shlex.split(os.environ["CGRU_OPENMP_LDFLAGS"])
    return cflags, ldflags


def openmp_works(compiler, cflags, ldflags):
    """``(True, "")`` when ``compiler`` compiles, links and runs OPENMP_PROBE with the flags
    (a team of 2 threads ran), else ``(False, why)``."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "cgru_openmp_probe.c")
        with open(src, "w") as f:
            f.write(OPENMP_PROBE)
        try:
            objects = compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
            exe = os.path.join(tmp, "cgru_openmp_probe")
            compiler.link_executable(objects, exe, extra_postargs=ldflags)
            out = subprocess.run([exe], capture_output=True, text=True, timeout=60,
                                 env=dict(os.environ, OMP_NUM_THREADS="2"))
        except Exception as e:  # noqa: BLE001 - CompileError, LinkError, OSError: all say "no"
            return False, f"{type(e).__name__}: {e}"
        if out.returncode != 0 or out.stdout.split() != ["2", "1"]:
            return False, f"the probe ran with exit {out.returncode}, output {out.stdout!r}"
        return True, ""


def compile_kernels(cmd):
    """The objects of KERNEL_SOURCES in ``cmd.build_temp``, each compiled with the modules'
    flags (in parallel, on ``cmd.parallel`` threads) unless newer than its source and headers."""
    from concurrent.futures import ThreadPoolExecutor

    def one(src):
        obj = cmd.compiler.object_filenames([src], output_dir=cmd.build_temp)[0]
        newest = max(os.path.getmtime(f) for f in [src] + KERNEL_HEADERS)
        if cmd.force or not os.path.exists(obj) or os.path.getmtime(obj) < newest:
            cmd.compiler.compile([src], output_dir=cmd.build_temp, include_dirs=[KERNELS],
                                 extra_postargs=compile_args)
        return obj

    workers = cmd.parallel if isinstance(cmd.parallel, int) and cmd.parallel > 1 else 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, KERNEL_SOURCES))


def build_ext_openmp(base):
    """``base`` that first probes the compiler's OpenMP and adds its flags to the kernels (or
    warns and builds them serially), compiles the C kernels once for every module, and
    compiles on every core unless told ``-j``."""
    class build_ext_with_openmp(base):
        def finalize_options(self):
            # compile the extensions in parallel (pip's builds pass no -j)
            if self.parallel is None:
                self.parallel = os.cpu_count() or 1
            super().finalize_options()

        def build_extensions(self):
            kernels = [e for e in self.extensions if e.name.startswith("cgru._kernels.")]
            if os.environ.get("CGRU_OPENMP", "1") == "0":
                self.warn("CGRU_OPENMP=0: cgru's kernels are built without OpenMP (serial)")
            elif kernels:
                cflags, ldflags = openmp_flags()
                ok, why = openmp_works(self.compiler, cflags, ldflags)
                if ok:
                    for ext in kernels:
                        ext.extra_compile_args = list(ext.extra_compile_args) + cflags
                        ext.extra_link_args = list(ext.extra_link_args) + ldflags
                else:
                    self.warn(f"the compiler cannot build OpenMP programs with {cflags} / "
                              f"{ldflags} ({why}): cgru's kernels are built without OpenMP and "
                              f"run serially; set CGRU_OPENMP_CFLAGS / CGRU_OPENMP_LDFLAGS (e.g. "
                              f"for a libomp install) to enable threads")
            if kernels:
                objects = compile_kernels(self)
                for ext in kernels:
                    if ext.name != "cgru._kernels.threads":
                        ext.extra_objects = list(ext.extra_objects or []) + objects
            super().build_extensions()
    return build_ext_with_openmp


def _load_capi_build():
    """cgru/capi/build.py (libcgru, the C ABI library), loaded by path: the cgru package
    cannot be imported before its extensions exist."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cgru", "capi", "build.py")
    spec = importlib.util.spec_from_file_location("cgru_capi_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_capi = _load_capi_build()

setup(
    ext_modules=cythonize(extensions, compiler_directives=directives) + _capi.extensions(),
    cmdclass={"build_ext": _capi.build_ext_class(build_ext_openmp(build_ext))},
)
