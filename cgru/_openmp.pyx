"""OpenMP build information and the thread-count rule every cgru call uses."""
import os

from cgru._openmp cimport CGRU_OPENMP_ENABLED, omp_get_max_threads


def openmp_enabled():
    """True when the extensions were compiled with OpenMP (else all loops run serially)."""
    return bool(CGRU_OPENMP_ENABLED)


def _usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_num_threads(num_threads=None):
    """The thread count a call uses.

    ``None`` means every usable core, capped by ``OMP_NUM_THREADS`` when it is set; a positive
    int is taken as is; a negative int ``-k`` means "all usable cores but k-1" (as in
    scikit-learn).  ``0`` is an error.  Without OpenMP the answer is always 1.
    """
    if num_threads is None:
        n = _usable_cores()
        if os.environ.get("OMP_NUM_THREADS"):
            n = min(n, omp_get_max_threads())
    else:
        if isinstance(num_threads, bool) or not isinstance(num_threads, (int,)) and not hasattr(num_threads, "__index__"):
            raise TypeError(f"num_threads: expected an int or None, got {type(num_threads).__name__}")
        n = int(num_threads)
        if n == 0:
            raise ValueError("num_threads: expected a non-zero int or None, got 0")
        if n < 0:
            n = max(1, _usable_cores() + 1 + n)
    if not CGRU_OPENMP_ENABLED:
        return 1
    return n
