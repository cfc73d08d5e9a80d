# The one place cgru decides how its work uses threads: its own thread pool (pool.h), the
# clock the time loops poll with, and the BLAS library held at one thread inside cgru's calls.
# Other compiled modules cimport these; Python code uses the def functions of threads.pyx.

ctypedef void (*item_fn)(void *ctx, int item) noexcept nogil
ctypedef void (*poll_fn)(void *ctx) noexcept nogil

# Run fn(ctx, i) for every i in [0, n_items) on up to n_threads threads (the caller among them);
# the caller runs poll(poll_ctx) about every 10 ms while it waits for the others (poll may be
# NULL).  Items must be independent: which thread runs which item varies.
cdef void parallel_for(int n_items, int n_threads, item_fn fn, void *ctx, poll_fn poll,
                       void *poll_ctx) noexcept nogil

# True on a pool worker, False on the thread that called cgru.
cdef bint is_worker() noexcept nogil

# Seconds of a monotonic clock.
cdef double wtime() noexcept nogil
