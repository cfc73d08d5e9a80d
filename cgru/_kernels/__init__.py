"""cgru's compiled kernels.

* ``threads``  OpenMP parallel regions (``parallel.h``), the thread-count rule, fork handling,
               BLAS held at one thread
* ``blas``     the row-major fused-type BLAS shim over ``scipy.linalg.cython_blas`` and the
               whole-sequence GEMMs as blocks on an OpenMP team
* ``loops``    what every cell kind's time loops share: signal polling, test probes, weight
               packing for the packed GEMM (``simd.h``), vector math, ``fingerprint``
* ``gru``      the GRU's fused forward/backward time loops

``simd.h`` holds the packed-weight GEMM and the vectorised activations, compiled for each ISA
(AVX-512, AVX2+FMA, baseline) and chosen at run time: a new ISA is one more entry in its
dispatch (``cgru_isa``).  A new cell kind is one more module beside ``gru`` using ``loops``.
"""
