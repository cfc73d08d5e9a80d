# The one place cgru decides how its work uses threads: its OpenMP parallel regions
# (parallel.h), the thread-count rule, whether this process is a forked child that runs
# serially, the clock the time loops poll with, and the BLAS library held at one thread inside
# cgru's calls.  Other compiled modules cimport these; Python code uses the def functions of
# threads.pyx.

ctypedef void (*item_fn)(void *ctx, int item) noexcept nogil
ctypedef void (*poll_fn)(void *ctx) noexcept nogil
ctypedef void (*member_fn)(void *ctx, int tid, int size) noexcept nogil

# Run fn(ctx, i) for every i in [0, n_items) on a team of up to n_threads threads (the caller
# among them); the caller runs poll(poll_ctx) about every 10 ms while it waits for the others
# (poll may be NULL).  Items must be independent: which thread runs which item varies.
cdef void parallel_for(int n_items, int n_threads, item_fn fn, void *ctx, poll_fn poll,
                       void *poll_ctx) noexcept nogil

# Run fn(ctx, tid, size) on every thread of a team of size ≤ n_threads (tid 0: the caller).
cdef void parallel_region(int n_threads, member_fn fn, void *ctx) noexcept nogil

# True on a team thread other than the caller, False on the thread that called cgru.
cdef bint is_worker() noexcept nogil

# Seconds of a monotonic clock.
cdef double wtime() noexcept nogil
