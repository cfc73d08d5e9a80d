"""Build libcgru, the C ABI library (include/cgru.h), as part of ``pip install``.

``setup.py`` loads this file by path (it must not import the ``cgru`` package, which needs its
compiled extensions) and uses:

* ``extensions()``: ``[a setuptools Extension]`` named ``cgru.libcgru`` from ``cgru/capi/*.c``,
  compiled against the building Python's headers (for ``PyConfig``) but not linked to libpython
  (libcgru loads it at run time), exporting only the ``CGRU_API`` symbols (with
  ``CGRU_DEBUG=1``, as for the kernels: -O1 -g and, unless ``CGRU_SANITIZE=0``, the address and
  undefined-behaviour sanitizers).  It records the
  building Python (``sys.executable``) and its libpython, the fallbacks libcgru uses to find the
  environment to embed (``runtime.c``).
* ``build_ext_class(base)``: ``base`` (setuptools' ``build_ext``) that names that extension's
  output ``cgru/libcgru.so`` (a plain shared library, so ``-lcgru`` finds it; in-place and
  editable builds copy it into the source tree like the other extensions) and puts a copy of
  ``include/cgru.h`` in the built package (``cgru/include/cgru.h``) so that installed wheels
  carry the header that ``cgru.get_include()`` returns.
"""
import os
import shutil
import sys
import sysconfig

from setuptools import Extension

NAME = "cgru.libcgru"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SOURCES = ["cgru/capi/capi.c", "cgru/capi/messages.c", "cgru/capi/runtime.c"]
HEADER = os.path.join("include", "cgru.h")


def _c_string(text):
    """``text`` as a C string literal for a -D macro."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def library_filename():
    """Name of the shared library on this platform."""
    if sys.platform == "darwin":
        return "libcgru.dylib"
    if sys.platform == "win32":
        return "cgru.dll"
    return "libcgru.so"


def _libpython():
    """(path, soname) of the building Python's shared library ('' when unknown)."""
    soname = sysconfig.get_config_var("INSTSONAME") or ""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    if soname.endswith(".a"):  # a static-only build: try the shared library's usual name
        soname = sysconfig.get_config_var("LDLIBRARY") or ""
        if soname.endswith(".a"):
            soname = f"libpython{sysconfig.get_config_var('LDVERSION')}.so.1.0"
    return (os.path.join(libdir, soname) if libdir and soname else ""), soname


def _debug_flags():
    """(compile, link) flags of a ``CGRU_DEBUG=1`` build (setup.py's rule for the kernels)."""
    if os.environ.get("CGRU_DEBUG", "") in ("", "0"):
        return ["-O2"], []
    sanitize = ([] if os.environ.get("CGRU_SANITIZE", "1") == "0"
                else ["-fsanitize=address,undefined"])
    return ["-O1", "-g", "-fno-omit-frame-pointer"] + sanitize, sanitize


def extensions():
    """``[the libcgru Extension]``, or ``[]`` where libcgru is not supported (Windows: it uses
    dlopen and pthreads)."""
    if sys.platform == "win32":
        return []
    libpython, soname = _libpython()
    optimise, link = _debug_flags()
    return [Extension(
        NAME,
        sources=SOURCES,
        include_dirs=["include", sysconfig.get_paths()["include"]],
        define_macros=[
            ("CGRU_BUILDING_LIBRARY", "1"),
            ("CGRU_BUILD_PYTHON", _c_string(sys.executable)),
            ("CGRU_BUILD_LIBPYTHON", _c_string(libpython)),
            ("CGRU_BUILD_LIBPYTHON_SONAME", _c_string(soname)),
        ],
        extra_compile_args=optimise + ["-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wextra"],
        extra_link_args=link,
        libraries=["dl", "pthread"] if sys.platform.startswith("linux") else [],
        depends=["include/cgru.h", "cgru/capi/runtime.h", "cgru/capi/messages.h"],
    )]


def build_ext_class(base):
    class build_ext(base):
        def get_ext_filename(self, fullname):
            if fullname == NAME:
                return os.path.join("cgru", library_filename())
            return super().get_ext_filename(fullname)

        def get_ext_fullpath(self, ext_name):
            path = super().get_ext_fullpath(ext_name)
            if self.get_ext_fullname(ext_name) == NAME:
                return os.path.join(os.path.dirname(path), library_filename())
            return path

        def get_export_symbols(self, ext):
            if ext.name == NAME:
                return []  # not a Python module: no PyInit_ symbol
            return super().get_export_symbols(ext)

        def run(self):
            super().run()
            target = os.path.join(self.build_lib, "cgru", "include")
            os.makedirs(target, exist_ok=True)
            shutil.copyfile(os.path.join(ROOT, HEADER), os.path.join(target, "cgru.h"))

    return build_ext
