"""Where the C ABI's header and library are: ``cgru.get_include()`` and
``python -m cgru --cflags --libs``.

    cc prog.c $(python -m cgru --cflags --libs)

builds a program against ``include/cgru.h`` and links ``libcgru`` with an rpath, so that it runs
with nothing else set up (libcgru then starts the Python runtime of this environment itself).
"""
import os
import sys

# libcgru and the installed header live in the cgru package directory (one level up)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_include():
    """The directory holding ``cgru.h``: the installed package's ``include/`` or, in a source
    checkout (editable or in-place build), the repository's ``include/``."""
    for d in (os.path.join(_PACKAGE_DIR, "include"),
              os.path.join(os.path.dirname(_PACKAGE_DIR), "include")):
        if os.path.isfile(os.path.join(d, "cgru.h")):
            return d
    raise FileNotFoundError(f"cgru.h: not found in {_PACKAGE_DIR}/include nor in the source "
                            f"checkout above it; reinstall cgru")


def get_library_dir():
    """The directory holding ``libcgru`` (the package directory)."""
    return _PACKAGE_DIR


def library_path():
    """Path of the shared library ``libcgru`` (it may not exist if the build skipped it)."""
    name = {"darwin": "libcgru.dylib", "win32": "cgru.dll"}.get(sys.platform, "libcgru.so")
    return os.path.join(_PACKAGE_DIR, name)


def cflags():
    """Compiler flags: the include directory."""
    return f"-I{get_include()}"


def libs():
    """Linker flags: the library directory, ``-lcgru`` and an rpath to it."""
    d = get_library_dir()
    return f"-L{d} -Wl,-rpath,{d} -lcgru"


_FLAGS = {"--cflags": cflags, "--libs": libs}


def main(argv):
    """``python -m cgru --cflags --libs``: print the requested flags on one line."""
    unknown = [a for a in argv if a not in _FLAGS]
    if unknown or not argv:
        print(f"usage: python -m cgru [--cflags] [--libs]  (unknown: {' '.join(unknown)})",
              file=sys.stderr)
        return 2
    if not os.path.isfile(library_path()) and "--libs" in argv:
        print(f"warning: {library_path()} does not exist (was cgru built with a C compiler?)",
              file=sys.stderr)
    print(" ".join(_FLAGS[a]() for a in argv))
    return 0
