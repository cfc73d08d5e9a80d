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
# work_ns: about how long the items would take the caller alone (product_ns, pass_ns; 0 for
# unknown) — a team whose threads have been asleep is not woken for less than their waking
# takes on this machine (parallel.h: cold teams).
cdef void parallel_for(int n_items, int n_threads, item_fn fn, void *ctx, poll_fn poll,
                       void *poll_ctx, double work_ns) noexcept nogil

# Run fn(ctx, tid, size) on every thread of a team of size ≤ n_threads (tid 0: the caller);
# work_ns as for parallel_for.
cdef void parallel_region(int n_threads, member_fn fn, void *ctx, double work_ns) noexcept nogil

# Rough single-thread times for work_ns: a product of `macs` multiply-adds (float64 if f64) at
# about half of a core's peak, and a pass over `nbytes` of memory (threads.pyx).
cdef double product_ns(double macs, bint f64) noexcept nogil
cdef double pass_ns(double nbytes) noexcept nogil

# True on a team thread other than the caller, False on the thread that called cgru.
cdef bint is_worker() noexcept nogil

# Seconds of a monotonic clock.
cdef double wtime() noexcept nogil
