"""Calls at a pace: what a caller pays per forward when it feeds the model as its input
arrives — a chunk every 20 ms, as a stream of audio frames does — against the same calls made
in a row.

    python -m bench.paced [--configs S1,S32,lstm:S32] [--pause-ms 20] [--calls 100]
                          [--threads 1 2] [--dtype float32] [--skip torch,openvino]

Between paced calls the threads of every library's pool go to sleep, and waking one can take
milliseconds on a virtual machine whose idle CPU the host has descheduled; a benchmark of
calls in a row (the main bench) never sees that.  For each config and thread count, every
forward system of the main bench that runs in this process (cgru's Stream and forward,
onnxruntime, OpenVINO, PyTorch; JAX runs in a worker and is left out) is first validated
against cgru as the main bench validates it, then timed: ``--calls`` calls each after a sleep
of ``--pause-ms``, and as many in a row.  Prints the median, 90th percentile and maximum of a
paced call and the median of a call in a row, in µs.  The systems take turns call by call, so
each meets the same machine.  Timings belong here, never in the tests.
"""
import argparse
import time

import numpy as np

from bench import problems, systems, timing

DEFAULT_CONFIGS = "S1,S32,lstm:S32"


def paced_systems(problem, n, peers, skip=()):
    """The forward systems of the main bench for ``problem`` at ``n`` threads that run in this
    process, each with its validation record: ``[(system, record)]``."""
    built, _ = systems.build_systems(problem, n, peers, skip=set(skip) | {"bound"})
    fwd = [s for s in built if s.kind == "fwd"]
    records = systems.validate(problem, fwd, n)
    return [(s, records[s.key]) for s in fwd]


def measure(entries, calls, pause_s):
    """``{key: {"paced": [µs], "in_row": [µs]}}``: the validated systems of ``entries``,
    ``calls`` paced calls each (turn by turn), then ``calls`` calls in a row each."""
    ok = [s for s, rec in entries if rec["ok"]]
    out = {s.key: {"paced": [], "in_row": []} for s in ok}
    for s in ok:
        s.call()
        s.call()
    for _ in range(calls):
        for s in ok:
            time.sleep(pause_s)
            out[s.key]["paced"].append(timing.time_call(s.call) * 1e6)
    for s in ok:
        out[s.key]["in_row"] = [timing.time_call(s.call) * 1e6 for _ in range(calls)]
    return out


def summary(samples):
    """``(median, p90, max)`` of the paced calls and the median of those in a row, µs."""
    p = np.asarray(samples["paced"])
    return (float(np.median(p)), float(np.percentile(p, 90)), float(p.max()),
            float(np.median(samples["in_row"])))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.paced",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help=f"comma-separated configs of the main bench (default {DEFAULT_CONFIGS})")
    ap.add_argument("--pause-ms", type=float, default=20.0)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--skip", default="",
                    help="comma-separated systems or peers to leave out (torch, onnxruntime, …)")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.pause_ms < 0:
        ap.error("--calls: at least 1; --pause-ms: not negative")
    skip = [s for s in args.skip.split(",") if s]
    peers, notes = systems.load_peers(skip)
    for note in notes:
        print(f"note: {note}")
    print(f"calls every {args.pause_ms:g} ms ({args.calls} each, the systems in turn), "
          f"µs a call")
    print(f"{'config':10} {'thr':>3} {'system':18} {'median':>8} {'p90':>8} {'max':>8} "
          f"{'in a row':>9}")
    for name in args.configs.split(","):
        problem = problems.Problem(problems.parse_config(name), args.dtype)
        for n in args.threads:
            entries = paced_systems(problem, n, peers, skip)
            for s, rec in entries:
                if not rec["ok"]:
                    print(f"{name:10} {n:3d} {s.key:18} failed its validation against "
                          f"{rec['against']}: {rec['worst']} {rec['err']:.3g}")
            for key, samples in measure(entries, args.calls, args.pause_ms / 1e3).items():
                med, p90, worst, in_row = summary(samples)
                print(f"{name:10} {n:3d} {key:18} {med:8.0f} {p90:8.0f} {worst:8.0f} "
                      f"{in_row:9.0f}")
            for s, _ in entries:
                s.close()


if __name__ == "__main__":
    main()
