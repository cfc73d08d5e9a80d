"""Run the cgru benchmark from a checkout: ``python bench/run.py [--quick | --full] ...``.

The same as ``python -m cgru bench ...`` (see ``cgru/_bench.py`` and PERF.md).  For fair
figures unset the OpenBLAS variables for the run::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/run.py --quick
"""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _import_bench():
    """``cgru._bench`` from this checkout when its extensions are built, else the installed
    cgru."""
    sys.path.insert(0, _ROOT)
    try:
        from cgru import _bench
        return _bench
    except ImportError:
        sys.path.remove(_ROOT)
        for name in [m for m in sys.modules if m == "cgru" or m.startswith("cgru.")]:
            del sys.modules[name]
    from cgru import _bench
    return _bench


if __name__ == "__main__":
    sys.exit(_import_bench().main(sys.argv[1:]))
