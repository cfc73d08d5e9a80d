# The one place cgru touches OpenMP.  Builds without OpenMP too: then every helper reports a
# single thread and the `prange` loops in the kernels run serially.
cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    #define CGRU_OPENMP_ENABLED 1
    #else
    #include <time.h>
    #define CGRU_OPENMP_ENABLED 0
    static inline int omp_get_max_threads(void) { return 1; }
    static inline int omp_get_thread_num(void) { return 0; }
    static inline double omp_get_wtime(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    }
    #endif
    """
    bint CGRU_OPENMP_ENABLED
    int omp_get_max_threads() noexcept nogil
    int omp_get_thread_num() noexcept nogil
    double omp_get_wtime() noexcept nogil
