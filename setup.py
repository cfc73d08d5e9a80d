"""Build cgru's Cython extensions.

OpenMP is used when the compiler accepts ``-fopenmp``; otherwise the same sources build
serially (``cgru.openmp_enabled()`` reports which).  ``CGRU_DEBUG=1`` in the environment turns
on Cython's bounds and wraparound checks and, where the compiler supports them, the address and
undefined-behaviour sanitizers.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

DEBUG = os.environ.get("CGRU_DEBUG", "") not in ("", "0")


def _compiler_accepts(flag):
    """True when the C compiler builds and links a trivial OpenMP program with ``flag``."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return False
    src = "#include <omp.h>\nint main(void){return omp_get_max_threads() > 0 ? 0 : 1;}\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.c")
        with open(path, "w") as fh:
            fh.write(src)
        try:
            res = subprocess.run([cc, flag, path, "-o", os.path.join(tmp, "t")],
                                 capture_output=True)
        except OSError:
            return False
        return res.returncode == 0


OPENMP = sys.platform != "win32" and _compiler_accepts("-fopenmp")
compile_args = ["-O3", "-fno-math-errno", "-Wno-psabi"]
link_args = []
if OPENMP:
    compile_args.append("-fopenmp")
    link_args.append("-fopenmp")
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

extensions = [
    Extension(
        f"cgru.{name}",
        [f"cgru/{name}.pyx"],
        include_dirs=[np.get_include(), "cgru"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        depends=["cgru/_simd.h", "cgru/_openmp.pxd", "cgru/_blas.pxd"],
    )
    for name in ("_openmp", "_blas", "_kernels")
]


def _load_capi_build():
    """cgru/_capi/build.py (libcgru, the C ABI library), loaded by path: the cgru package
    cannot be imported before its extensions exist."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cgru", "_capi", "build.py")
    spec = importlib.util.spec_from_file_location("cgru_capi_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_capi = _load_capi_build()

setup(
    ext_modules=cythonize(extensions, compiler_directives=directives,
                          compile_time_env={"CGRU_OPENMP": OPENMP}) + _capi.extensions(),
    cmdclass={"build_ext": _capi.build_ext_class(build_ext)},
)
