"""A long training loop: does a step cost more, or hold more memory, at step 10,000 than at
step 100?  (The weights change in place every step, as under an optimizer, so every step
meets weights the previous one did not see.)

    python -m bench.long_loop [--steps 10000] [--hidden 8 32] [--torch]

Prints, per configuration, the CPU time per step (process time, so other load on the machine
does not count) over the first and the last window of steps, their ratio, and the growth of
the resident set between the two windows.  cgru's kept-weights cache is reported too (entries,
bytes).  Timings belong here, never in the tests (the tests count the cache's entries).
"""
import argparse
import time

import numpy as np

import cgru
from cgru.core import weights

WINDOW = 200


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _core_step(H):
    net = cgru.Network.random(cgru.Topology(H, H, 2), np.float32, seed=1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 4, H)).astype(np.float32)
    dy = rng.standard_normal((16, 4, H)).astype(np.float32)
    lr = np.float32(1e-4)

    def step():
        f = cgru.forward(net, x, training=True)
        g = cgru.backward(net, x, f.reserve, dy)
        for lp, dlp in zip(net, g.dparams):
            for name, a in lp.arrays().items():
                a -= lr * dlp.arrays()[name]
    return step


def _torch_step(H):
    import torch
    import cgru.torch
    torch.manual_seed(0)
    rnn = cgru.torch.GRU(H, H, num_layers=2)
    opt = torch.optim.SGD(rnn.parameters(), lr=1e-4)
    x = torch.randn(16, 4, H)

    def step():
        opt.zero_grad()
        rnn(x)[0].sum().backward()
        opt.step()
    return step


def _measure(step, steps):
    windows = []
    for i in range(steps):
        if i in (100, steps - WINDOW):
            t0, rss0 = time.process_time(), _rss_kib()
        step()
        if i in (100 + WINDOW - 1, steps - 1):
            windows.append(((time.process_time() - t0) / WINDOW * 1e3, rss0))
    (first_ms, rss_first), (last_ms, rss_last) = windows
    return first_ms, last_ms, (rss_last - rss_first) / 1024, weights.cached_entries()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.long_loop", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--hidden", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--torch", action="store_true", help="also through cgru.torch + SGD")
    args = ap.parse_args(argv)
    if args.steps < 2 * WINDOW + 100:
        ap.error(f"--steps: at least {2 * WINDOW + 100}")
    kinds = [("cgru.forward/backward", _core_step)] + (
        [("cgru.torch GRU + SGD", _torch_step)] if args.torch else [])
    print(f"{'loop':24} {'H':>4} {'ms/step @100':>13} {f'ms/step @{args.steps}':>15} "
          f"{'ratio':>6} {'RSS growth MiB':>15} {'kept entries, MiB':>18}")
    for name, make in kinds:
        for H in args.hidden:
            cgru.release_memory()
            first, last, grown, (n, nbytes) = _measure(make(H), args.steps)
            print(f"{name:24} {H:4d} {first:13.3f} {last:15.3f} {last / first:6.2f} "
                  f"{grown:15.1f} {n:8d}, {nbytes / 2 ** 20:7.2f}")


if __name__ == "__main__":
    main()
