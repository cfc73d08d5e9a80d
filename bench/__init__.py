"""cgru's speed benchmark (docs/speed.md): ``python -m bench`` or ``python -m cgru bench``.

problems  the cell kinds, configurations, run modes, problem data and their GEMM flops
systems   every system timed, each validated against cgru before it is timed
timing    warm-up, interleaved blocks with pauses, medians, other load, noise, peak GEMM
workers   the other processes: JAX pinned to n cores, cgru alone, peak memory
report    ratios, targets, tables, JSON, plot, machine and library versions
__main__  main(argv) and its options
"""
