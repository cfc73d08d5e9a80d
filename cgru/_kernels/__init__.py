"""cgru's compiled kernels.

* ``threads``  OpenMP parallel regions (``parallel.h``), the thread-count rule, fork handling,
               BLAS held at one thread
* ``blas``     the row-major fused-type BLAS shim over ``scipy.linalg.cython_blas`` and the
               whole-sequence GEMMs as blocks on an OpenMP team
* ``loops``    what every cell kind's time loops share: signal polling, test probes, weight
               packing for the packed GEMM (``simd.h``), vector math, ``fingerprint``
* ``gru``      the GRU's fused gate math of one step, forward and backward
* ``lstm``     the LSTM's (peepholes, the recurrent projection, coupled gates)
* ``rnn``      the vanilla RNN's

Each of the three includes ``driver.pxi``, the time loop of a work item written once for every
kind (state slots, masks, padded rows, the output, the backward's carry and recurrent product,
each work item's scratch in the call's workspace, signal polling), and ``entry.pxi``, the
Python entry points (``scratch_size``, ``forward_layer``, ``backward_layer``).

``simd.h`` holds the packed-weight GEMM and the vectorised activations, compiled for each ISA
(AVX-512, AVX2+FMA, baseline) and chosen at run time: the GEMM by an explicit switch on
``cgru_isa()`` (a new ISA is one more case there), the activations by the compiler's
``target_clones``.  ``gates.h`` holds the default cells' fused row math (the GRU's sigmoid/tanh
cell in both reset forms, the LSTM's, the RNN's tanh and relu, forward and backward) on the same
vectors, dispatched by the same switch; the Cython modules themselves are compiled for the
baseline, so the other cells' row math (general activations, clips, peepholes) runs one
scalar at a time.  ``hash.h`` is the fingerprint behind the reserves' MACs, ``team.h`` the
team that shares one direction's per-step products, ``parallel.h`` the OpenMP regions.  A new
cell kind is one more module beside ``gru``: its step, and the two includes.

In the fused-type (``floating``) code, numeric constants are typed variables (``cdef floating
one = 1``), never literals beside a float: Cython writes ``1 - z`` as ``1.0 - z``, a double
expression that runs float32 math in double, one scalar at a time
(``tests/test_simd.py`` reads the generated C for it, and the machine code of ``gates.h``'s
kernels for their ISA versions).
"""
import glob as _glob
import importlib.machinery as _machinery
import os as _os


def _unbuilt():
    """The ``.pyx`` sources here without their compiled module (a source checkout that was
    never built; a wheel holds every module)."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    return sorted(_os.path.basename(pyx) for pyx in _glob.glob(_os.path.join(here, "*.pyx"))
                  if not any(_os.path.exists(_os.path.splitext(pyx)[0] + suffix)
                             for suffix in _machinery.EXTENSION_SUFFIXES))


if _unbuilt():
    raise ImportError(
        f"cgru's compiled kernels are not built in {_os.path.dirname(_os.path.abspath(__file__))}"
        f" ({', '.join(_unbuilt())} without their extension modules): in a source checkout, "
        f"run `pip install -e .` first (or `python setup.py build_ext --inplace`). The "
        f"pure-Python parts (cgru.core.reference, the cells and networks) import without them.")
