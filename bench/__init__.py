"""cgru's speed benchmark (docs/speed.md): ``python -m bench`` or ``python -m cgru bench``.

problems  the cell kinds (GRU, LSTM with or without a projection, tanh/relu RNN),
          configurations, run modes, problem data and their GEMM flops
systems   every system timed (cgru, cgru.Stream, cgru.torch, the peers, the bound), each
          validated against cgru before it is timed
timing    warm-up, interleaved blocks with pauses, medians, other load, noise, peak GEMM
workers   the other processes: JAX pinned to n cores, cgru alone, peak memory (first
          step and steady state)
report    ratios, targets, tables, JSON, plot, machine and library versions
__main__  main(argv) and its options
"""
