"""Build cgru's Cython extensions and libcgru (the C ABI).

The kernels run on cgru's own pthread pool (``cgru/_pool.h``), so no OpenMP runtime is needed.
``CGRU_DEBUG=1`` in the environment turns on Cython's bounds and wraparound checks and, where
the compiler supports them, the address and undefined-behaviour sanitizers.
"""
import os

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
extensions = [
    Extension(
        f"cgru._kernels.{name}",
        [f"{KERNELS}/{name}.pyx"],
        include_dirs=[np.get_include(), KERNELS],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        depends=[f"{KERNELS}/{h}" for h in ("simd.h", "hash.h", "pool.h", "team.h", "threads.pxd",
                                            "blas.pxd", "loops.pxd", "entry.pxi")],
    )
    for name in ("threads", "blas", "loops", "gru", "lstm", "rnn")
]


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
    cmdclass={"build_ext": _capi.build_ext_class(build_ext)},
)
