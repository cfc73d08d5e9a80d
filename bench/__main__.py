"""``python -m bench`` / ``python -m cgru bench``: time cgru against its peers and its two
yardsticks, the method of docs/speed.md.

A run measures, in this order: the machine's other load and noise; the peak SGEMM/DGEMM rate
per thread count (the FLOP limit); then one *section* per config, dtype and thread count —
every system validated against cgru, cgru in a process of its own too (one fresh process per
config and dtype, for both thread counts, which first measures cgru's peak memory), then all
of them timed in one set of interleaved blocks (JAX in a worker pinned to that many cores,
cgru's own process's blocks among the others); finally the peak memory of a training step of
PyTorch, in a fresh process each.  It writes the JSON (every
sample) and the plot, prints the tables and the targets, and exits with 1 when a validation
failed (that system is not timed), 130 when interrupted, else 0.
"""
import argparse
import dataclasses
import datetime
import json
import math
import os
import sys
import time

if __package__ in (None, ""):       # ``python bench/__main__.py``: make ``bench`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import gemms, problems, report, systems, timing, workers  # noqa: E402

OPTIONAL = ("torch", "cgru_torch", "stream", "onnxruntime", "openvino", "jax", "numpy",
            "alone", "memory", "bound", "gemms")


# --- one section -------------------------------------------------------------------------------
def run_section(config, dtype, n, peers, mode, *, rounds=None, progress=None, seed=0,
                pool=None, peaks=None, skip=(), memory=False, alone_worker=None):
    """Build, validate and time every system for one (config, dtype, threads); then cgru in a
    process of its own (``alone_worker``, else a fresh one; ``memory``: which first measures
    the peak memory of a training step, in ``result["alone"]["memory"]``).  Returns the
    section's result (see report.derive for its ratios)."""
    from threadpoolctl import ThreadpoolController

    progress = progress or (lambda what: None)
    phase, t_phase = {}, [time.perf_counter()]

    def lap(name):
        now = time.perf_counter()
        phase[name] = round(now - t_phase[0], 3)
        t_phase[0] = now

    load = timing.OtherLoad()
    problem = problems.Problem(config, dtype, seed)
    notes = []
    remote = pool.remote if pool is not None and "jax" in peers else None
    with ThreadpoolController().limit(limits=n):
        progress("setting up")
        built, bound = systems.build_systems(problem, n, peers, remote=remote, skip=skip,
                                             notes=notes)
        lap("setup_s")
        progress("validating")
        try:
            reference = systems.cgru_reference(problem, n)
        except Exception:                     # validate() reports it for every system
            reference = None
        checks = systems.validate(problem, built, n, reference)
        good = [s for s in built if checks[s.key]["ok"]]
        overhead = systems.call_overhead_s(problem.dtype)
        lap("validate_s")
        alone = None
        if "alone" not in skip and reference is not None:
            progress("cgru in a process of its own")
            alone = _Alone(problem, n, reference, memory, alone_worker)
            lap("alone_s")
        # one set of interleaved rounds for every system, cgru's own process among them; a
        # 2-thread section looks at the cores before and after (a host slowing one vCPU)
        cores = [timing.core_probe()] if n > 1 else []
        # the GEMM of the run's float32 peak, so that the two compare
        kind = ((peaks or {}).get(("float32", n)) or {}).get("gemm", "blas")
        sustained = [timing.sustained_gemm(n, gemm=kind)] if n > 1 else []
        try:
            samples = timing.measure(good + (alone.good if alone else []), mode, rounds,
                                     progress)
        except BaseException:
            if alone is not None and alone.fresh:
                alone.worker.close(kill=True)
            raise
        if cores:
            cores.append(timing.core_probe())
            sustained.append(timing.sustained_gemm(n, gemm=kind))
        lap("measure_s")
    other = load.cores()
    for s in built:
        s.close()

    c = config
    spreads = [p["core_spread"] for p in cores if p["core_spread"] is not None]
    core_spread = max(spreads) if spreads else None
    if core_spread is not None and core_spread > 0.1:
        notes.append(f"the cores differed by {100 * core_spread:.0f} % around this row (a job "
                     f"pinned to each): its {n}-thread figures wait for the slower core")
    slowdowns = [p["together_slowdown"] for p in cores if p.get("together_slowdown") is not None]
    together = max(slowdowns) if slowdowns else None
    if together is not None and together > 0.1:
        notes.append(f"the cores slowed each other by {100 * together:.0f} % around this row "
                     f"(the job on both at once against each alone): its {n}-thread figures "
                     f"are slowed alike")
    peak32 = (peaks or {}).get(("float32", n))
    sustained_vs_peak = min(sustained) / peak32["gflops"] \
        if sustained and peak32 and peak32.get("ok") else None
    if sustained_vs_peak is not None and sustained_vs_peak < 0.9:
        notes.append(f"a {n}-thread SGEMM of tens of ms ran at {100 * sustained_vs_peak:.0f} % "
                     f"of the run's {n}-thread peak around this row: the host gave the busy "
                     f"cores less, and this row's {n}-thread figures are slowed alike")
    result = dict(config=c.name, cell=c.cell, shape=dataclasses.asdict(c),
                  dtype=problem.dtype.name, threads=n,
                  gflop=dict(fwd=c.flops("fwd") / 1e9, fb=c.flops("fb") / 1e9),
                  validation=checks, systems={s.key: timing.stats(samples[s.key])
                                              for s in good},
                  other_load_cores=other, core_probes=cores, core_spread=core_spread,
                  together_slowdown=together, sustained_gflops=sustained,
                  sustained_vs_peak=sustained_vs_peak, notes=notes)
    try:
        import cgru
        result["reserve_bytes"] = int(cgru.reserve_nbytes(problem.net, c.T, c.N))
    except Exception:  # noqa: BLE001 - informational
        result["reserve_bytes"] = None
    # the bound: raw gemm_rm time minus the Python cost of each call (the engine has none)
    result["bound_call_overhead_us"] = overhead * 1e6
    for kind in ("fwd", "fb"):
        rec = result["systems"].get(f"bound_{kind}")
        if rec is not None:
            calls = bound.calls(kind)
            rec["gemm_calls"] = calls
            for key in ("median_ms", "min_ms", "max_ms"):
                raw = rec[key]
                rec["raw_" + key] = raw
                rec[key] = max(raw - calls * overhead * 1e3, 0.5 * raw)
    set_flop_limit(result, (peaks or {}).get((problem.dtype.name, n)), derive=False)
    if n == 1 and "gemms" not in skip and not c.streaming:
        # each GEMM of the step alone, on cgru's route (bench/gemms.py); its fraction of the
        # peak is taken in the report, against the peak the FLOP limit uses
        progress("each GEMM alone")
        result["gemms"] = gemms.rates(problem, None)
        lap("gemms_s")

    if alone is not None:
        result["alone"] = alone.result(samples, other)
    result["phase_s"] = phase
    return report.derive(result)


def set_flop_limit(result, peak, derive=True):
    """The section's FLOP limit (ms) of fwd and fb from a measured ``peak`` GEMM rate."""
    flops = problems.Config(**{k: v for k, v in result["shape"].items()})
    result["flop_limit_ms"] = {kind: timing.flop_limit_ms(flops.flops(kind), peak)
                               for kind in ("fwd", "fb")}
    result["peak_gflops"] = peak["gflops"] if peak else None
    if derive:
        report.derive(result)


class _Alone:
    """cgru's fwd and fb (and its Stream on the streaming configs) in a process of its own
    (``worker``, else a fresh one; with ``memory``, which first measures the peak memory of a
    training step while the process is fresh), validated against the main process's forward
    and training step; ``good`` are the ones that passed, as remote systems keyed
    ``…_alone`` for the section's interleaved rounds — so that their ratios to the peers come
    from the same rounds as the peers' own figures."""

    def __init__(self, problem, n, reference, memory, worker):
        self.tol = systems.TOL[problem.dtype.name]
        self.fresh = worker is None
        self.worker = workers.Worker() if worker is None else worker
        self.memory = self.pid = None
        self.good, self.validation = [], {}
        try:
            if memory:
                self.memory = self.worker.request("memory", "cgru_fb", problem, n)
            for cls in (systems.CgruFwd, systems.CgruFb, systems.CgruStreamFwd):
                if not cls.supports(problem.config):
                    continue
                rs = workers.RemoteSystem(self.worker, cls, problem, n, name=cls.key + "_alone")
                self.pid = rs.info["pid"]
                ref = reference[1] if cls.kind == "fb" else reference[0]
                ok, worst, err = systems.compare(rs.outputs(), ref, self.tol)
                loaded = rs.info["other_libraries_loaded"]
                if loaded:
                    ok, worst = False, f"not alone: {', '.join(loaded)} loaded"
                self.validation[rs.key] = dict(ok=bool(ok), against="cgru in the main process",
                                               worst=worst, err=float(err), tol=self.tol)
                if ok:
                    self.good.append(rs)
        except workers.WorkerError as exc:
            why = str(exc).splitlines()[-1] if str(exc) else repr(exc)
            rec = dict(ok=False, against="cgru in the main process", worst=why, err=math.inf,
                       tol=self.tol)
            self.validation = {"cgru_fwd_alone": rec, "cgru_fb_alone": rec}
            self.good = []

    def result(self, samples, other_load):
        """The section's ``alone`` record: its systems' stats under their own keys (``cgru_fb``
        …), from the interleaved ``samples``."""
        for rs in self.good:
            rs.close()
        if self.fresh:
            self.worker.close()
        timed = {rs.key[:-len("_alone")]: timing.stats(samples[rs.key]) for rs in self.good
                 if samples.get(rs.key)}
        return dict(systems=timed, validation=self.validation, other_load_cores=other_load,
                    pid=self.pid, memory=self.memory, interleaved=True)


def run_memory(configs, dtypes, threads, peers, seed, skip=(), progress=None, parallel=2,
               cgru_records=None):
    """Peak memory of one training step per (config, dtype), of cgru and of PyTorch, each in a
    fresh process; ``parallel`` of those processes at a time (nothing is timed here).
    ``cgru_records``: ``{(config, dtype): record}`` already measured by cgru's own process."""
    from concurrent.futures import ThreadPoolExecutor
    jobs, out = [], []
    cgru_records = cgru_records or {}
    for c in configs:
        for dt in dtypes:
            problem = problems.Problem(c, dt, seed)
            row = dict(config=c.name, dtype=problem.dtype.name, threads=threads)
            out.append(row)
            if cgru_records.get((c.name, problem.dtype.name)):
                row["cgru"] = cgru_records[(c.name, problem.dtype.name)]
            for key, name, needed in (("cgru_fb", "cgru", None), ("torch_fb", "torch", "torch")):
                if name in row or (needed and (needed not in peers or needed in skip)):
                    continue
                if c.cell in systems.BY_KEY[key].kinds:
                    jobs.append((row, name, key, problem))

    def one(job):
        row, name, key, problem = job
        try:
            row[name] = workers.run_memory(key, problem, threads)
        except workers.WorkerError as exc:
            row[name] = dict(error=str(exc)[-2000:])
        if progress:
            progress(f"{row['config']} {row['dtype']} {name}")

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as ex:
        list(ex.map(one, jobs))
    return out


# --- arguments ---------------------------------------------------------------------------------
def _parse_threads(text):
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        vals = []
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive ints like 1,2, got {text!r}")
    return sorted(set(vals))


def _parse_list(allowed):
    def parse(text):
        vals = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in vals if v not in allowed]
        if not vals or bad:
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(allowed)}, "
                                             f"got {text!r}")
        return vals
    return parse


def _parse_configs(text):
    try:
        return [problems.parse_config(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text):
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return v


def default_out_dir():
    """Where a run writes its JSON and plot unless told: ``cgru/bench`` in the user's cache
    directory (``$XDG_CACHE_HOME``, else ``~/.cache``), never the current directory."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "cgru", "bench")


def output_paths(args):
    """``(JSON path, plot path)`` of a run: ``--json``/``--plot`` as given, else
    ``bench.json``/``bench.png`` in ``--out`` (default: ``default_out_dir()``)."""
    out_dir = args.out or default_out_dir()
    return (args.json or os.path.join(out_dir, "bench.json"),
            args.plot or os.path.join(out_dir, "bench.png"))


def make_parser():
    p = argparse.ArgumentParser(
        prog="python -m cgru bench",
        description="Time cgru against PyTorch, onnxruntime, OpenVINO, JAX, NumPy by hand, the "
                    "GEMM-only bound and the FLOP limit (method: docs/speed.md).  Run it with "
                    "the OpenBLAS variables unset: " + report.RECOMMENDED)
    m = p.add_mutually_exclusive_group()
    m.add_argument("--quick", action="store_true",
                   help=f"float32, configs {', '.join(problems.MODES['quick'].configs)}, "
                        f"{problems.MODES['quick'].rounds} rounds "
                        f"({problems.MODES['quick'].about})")
    m.add_argument("--full", action="store_true",
                   help="adds the DeepSpeech-sized config DS and more rounds")
    p.add_argument("--threads", type=_parse_threads, default=[1, 2],
                   help="thread counts, comma-separated (default 1,2)")
    p.add_argument("--configs", type=_parse_configs, default=None,
                   help="override the mode's configs: names (" + ", ".join(problems.CONFIGS) +
                        ", T32-H256 = S32) or TxNxIxHxL[b], optionally kind:… (lstm:B)")
    p.add_argument("--dtypes", type=_parse_list(("float32", "float64")), default=None,
                   help="override the mode's dtypes (float32,float64)")
    p.add_argument("--rounds", type=_positive_int, default=None,
                   help="override the number of rounds")
    p.add_argument("--skip", type=_parse_list(OPTIONAL), default=[], action="extend",
                   help="leave out, comma-separated or repeated: " + ", ".join(OPTIONAL))
    p.add_argument("--peak-size", type=_positive_int, default=2048,
                   help="size of the square GEMM of the FLOP limit (default 2048)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="the directory of the JSON and the plot (default: cgru/bench in the "
                        "user's cache directory, $XDG_CACHE_HOME or ~/.cache)")
    p.add_argument("--json", default=None,
                   help="where to write every figure (default DIR/bench.json)")
    p.add_argument("--plot", default=None,
                   help="where to write the PNG plot (default DIR/bench.png)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and inputs")
    p.add_argument("--markdown", action="store_true",
                   help="print the tables as Markdown (for the README)")
    p.add_argument("--compare", nargs=2, metavar=("FIRST", "SECOND"), default=None,
                   help="run nothing: compare two runs' JSON files target by target (how far "
                        "their ratios agree, which targets only one of them meets)")
    return p


# --- main --------------------------------------------------------------------------------------
def compare_runs(first, second):
    """``--compare``: print how far two runs' JSON files agree (``report.compare``); 0, or 2
    with a message when a file is not a bench run's JSON."""
    docs = []
    for path in (first, second):
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as exc:
            print(f"--compare: cannot read {path}: {exc}", file=sys.stderr)
            return 2
        if not isinstance(doc, dict) or not isinstance(doc.get("targets"), list):
            print(f"--compare: {path} is not the JSON of a bench run (no list of targets)",
                  file=sys.stderr)
            return 2
        bad = [t for t in doc["targets"]
               if not (isinstance(t, dict) and report.TARGET_KEYS <= t.keys() and
                       (t["value"] is None or type(t["value"]) in (int, float)))]
        if bad:
            print(f"--compare: {path}: {len(bad)} of its targets are not target records "
                  f"(each needs {', '.join(sorted(report.TARGET_KEYS))}, the value a number "
                  f"or null); the first: "
                  f"{str(bad[0])[:80]}", file=sys.stderr)
            return 2
        docs.append(doc)
    print(report.format_compare(report.compare(docs[0]["targets"], docs[1]["targets"]),
                                (first, second)))
    return 0


def main(argv=None):
    """Entry point of ``python -m bench`` and ``python -m cgru bench``; returns the exit code
    (1: a validation failed, 130: interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)
    if args.compare:
        return compare_runs(*args.compare)
    args.json, args.plot = output_paths(args)
    t_start = time.perf_counter()
    mode = problems.MODES["quick" if args.quick else "full" if args.full else "default"]
    configs = args.configs or problems.mode_configs(mode)
    dtypes = args.dtypes or list(mode.dtypes)
    skip = set(args.skip)
    env = report.environment()
    env_note = report.env_note(env, argv)
    if env_note:
        print(env_note, file=sys.stderr)
    peers, notes = systems.load_peers(skip)
    machine = report.machine_info()
    if max(args.threads) > (machine["usable_cpus"] or 1):
        notes.append(f"{max(args.threads)} threads requested, {machine['usable_cpus']} usable "
                     "cores")
    for n in notes:
        print("note:", n, file=sys.stderr)
    idle = timing.other_load_now()
    noise = timing.noise_probe()
    if idle is not None and idle > 0.25:
        print(f"note: other processes keep {idle:.1f} cores busy; timings will be noisy "
              "(2-thread figures especially); see the 'other load' column", file=sys.stderr)
    if noise["spread"] > 0.2:
        print(f"note: machine noise: a fixed 1 ms job varies by {100 * noise['spread']:.0f} % "
              "(p10–p90); figures will be noisy", file=sys.stderr)
    if (noise["core_spread"] or 0) > 0.1:
        print(f"note: the cores differ: the same job runs {100 * noise['core_spread']:.0f} % "
              f"slower on one than on another ({noise['per_core_ms']} ms); 2-thread figures "
              "wait for the slower core", file=sys.stderr)
    if (noise["together_slowdown"] or 0) > 0.1:
        print(f"note: the cores slow each other: the same job on all of them at once runs "
              f"{100 * noise['together_slowdown']:.0f} % slower than alone; 2-thread figures "
              "will be slowed alike", file=sys.stderr)

    pool, extra_versions = None, {}
    sections = [(c, dt, n) for c in configs for dt in dtypes for n in args.threads]
    progress = report.Progress(len(sections) + 1 + ("memory" not in skip))
    results, failures, memory, interrupted = [], [], [], False
    alone = None                    # ((config, dtype), cgru's own worker process)
    peaks, peak_log = {}, []
    try:
        if "jax" in peers:
            pool = workers.PinnedPool()
            try:
                for info in pool.start(args.threads, ["jax", "jaxlib"]):
                    bad = {k: v for k, v in info["versions"].items()
                           if isinstance(v, str) and v.startswith("unavailable")}
                    if bad:
                        raise workers.WorkerError("; ".join(f"{k} {v}" for k, v in bad.items()))
                    extra_versions.update(info["versions"])
            except workers.WorkerError as exc:
                notes.append(f"jax not available in its worker ({exc}); skipped")
                print("note:", notes[-1], file=sys.stderr)
                peers.pop("jax")
                pool.close()
                pool = None
        progress.section("peak GEMM rate")
        for dt in dtypes:
            for n in args.threads:
                progress(f"{dt} {n}T")
                peaks[(dt, n)] = timing.gemm_peak(dt, n, size=args.peak_size)
                peak_log.append(dict(peaks[(dt, n)], when="start"))
                if not peaks[(dt, n)]["ok"]:
                    failures.append(dict(config="peak GEMM", dtype=dt, threads=n,
                                         system="gemm_peak", ok=False, against="NumPy",
                                         worst="C rows", err=peaks[(dt, n)]["err"], tol=0))
        for c, dt, n in sections:
            progress.section(f"{c.name} {dt} {n}T")
            if "alone" not in skip and (alone is None or alone[0] != (c.name, dt)
                                        or alone[1].proc.poll() is not None):
                if alone is not None:       # cgru's own process: one per config and dtype
                    alone[1].close()
                alone = ((c.name, dt), workers.Worker())
            r = run_section(c, dt, n, peers, mode, rounds=args.rounds, progress=progress,
                            seed=args.seed, pool=pool, peaks=peaks, skip=skip,
                            memory="memory" not in skip and n == args.threads[0],
                            alone_worker=alone[1] if alone else None)
            checks = dict(r["validation"], **(r.get("alone") or {}).get("validation", {}))
            for key, rec in checks.items():
                if not rec["ok"]:
                    failures.append(dict(config=c.name, dtype=dt, threads=n, system=key, **rec))
                    progress.end()
                    print(f"\n!!! VALIDATION FAILED: {key} on {c.name} ({c.describe()}) {dt} "
                          f"{n}T: {rec['worst']} differs from {rec['against']} by "
                          f"{rec['err']:.3g} (tolerance {rec['tol']:g}); not timed\n",
                          file=sys.stderr, flush=True)
            results.append(r)
        if alone is not None:
            alone[1].close()
            alone = None
        # the peak again: the FLOP limit uses the faster of the two (contention only slows)
        progress.head = "peak GEMM rate again"
        for (dt, n), first in list(peaks.items()):
            again = timing.gemm_peak(dt, n, size=args.peak_size)
            peak_log.append(dict(again, when="end"))
            if again["ok"] and again["gflops"] > first["gflops"]:
                peaks[(dt, n)] = again
        for r in results:
            set_flop_limit(r, peaks.get((r["dtype"], r["threads"])))
        if "memory" not in skip:
            progress.section("peak memory, fresh processes")
            cgru_mem = {(r["config"], r["dtype"]): (r.get("alone") or {}).get("memory")
                        for r in results if r["threads"] == args.threads[0]}
            memory = run_memory(configs, dtypes, args.threads[0], peers, args.seed, skip,
                                progress, parallel=machine["usable_cpus"] or 1,
                                cgru_records=cgru_mem)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if pool is not None:
            pool.close()
        if alone is not None:
            alone[1].close(kill=True)
    progress.end()
    elapsed = time.perf_counter() - t_start

    tg = report.targets(results, memory)
    doc = dict(
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        argv=argv, mode=mode.name, elapsed_s=elapsed, interrupted=interrupted,
        machine=machine, other_load_cores_at_start=idle, machine_noise=noise,
        versions=report.library_versions(peers, extra_versions), blas=report.blas_info(),
        environment=env, openblas_vars_set=[k for k in report.OPENBLAS_VARS if env.get(k)],
        notes=notes,
        method=dict(mode=dataclasses.asdict(mode), rounds_override=args.rounds,
                    tolerance=systems.TOL, skip=sorted(skip),
                    bound="raw gemm_rm time minus calls × measured per-call Python overhead; "
                          "samples_ms are raw",
                    flop_limit="config GEMM flops / peak rate (median of the timed 2048³ "
                               "GEMMs at the section's thread count)",
                    alone="cgru fwd and fb timed in a fresh process importing no other "
                          "library, its blocks in the section's interleaved rounds with the "
                          "peers'; ratios '…_alone' use it",
                    jax="worker process pinned with sched_setaffinity to the first n usable "
                        "CPUs before importing jax",
                    memory="fresh process per system and problem: peak RSS growth (VmHWM "
                           "reset via /proc/self/clear_refs) and, for cgru, the tracemalloc "
                           "peak of NumPy allocations; peak = inputs + traced peak"),
        peak_gemm=dict(used=list(peaks.values()), measured=peak_log),
        configs={c.name: dataclasses.asdict(c) for c in configs}, results=results,
        memory=memory, targets=tg, validation_failures=failures)
    report.write_json(args.json, doc)

    print(f"cgru bench ({mode.name}, {elapsed:.0f} s) on {machine['cpu']}, "
          f"{machine['usable_cpus']} cores; other load at start {report._fmt(idle, '{:.1f}')} "
          f"cores, machine noise {100 * noise['spread']:.0f} %"
          + (f", cores differ by {100 * noise['core_spread']:.0f} %"
             if noise["core_spread"] is not None else "")
          + (f", slow each other by {100 * noise['together_slowdown']:.0f} %"
             if noise["together_slowdown"] is not None else ""))
    print(report.format_tables(results, memory, list(peaks.values()), markdown=args.markdown))
    met = sum(t["ok"] for t in tg)
    print(f"\ndocs/speed.md targets met: {met}/{len(tg)}")
    print(report.format_targets(tg))
    for n in notes:
        print("note:", n)
    section_notes = {}
    for r in results:
        for n in r.get("notes", []):
            section_notes.setdefault(n, []).append(r["config"])
    for n, where in section_notes.items():
        print(f"note: {n} ({', '.join(dict.fromkeys(where))})")
    print(f"JSON: {args.json}")
    if not args.no_plot and results:
        try:
            report.plot(results, args.plot)
            print(f"plot: {args.plot}")
        except ImportError as exc:
            print(f"note: matplotlib not available ({exc}); no plot")
    if env_note:
        print(env_note)
    if failures:
        print(f"!!! {len(failures)} VALIDATION FAILURE(S): "
              + "; ".join(f"{f['system']} on {f['config']} {f['dtype']} {f['threads']}T"
                          for f in failures), file=sys.stderr)
        return 1
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
