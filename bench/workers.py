"""The bench's other processes: a worker runs systems, timings or memory measurements on
request, in a process of its own.

Three uses (docs/speed.md §5, rules 9 and 10):

* **JAX, pinned.** JAX ignores thread limits, so it runs in a worker pinned with
  ``os.sched_setaffinity`` (what ``taskset -c`` does) to the section's number of cores, before
  JAX is imported.  One worker per thread count lives for the whole run; in the main process a
  ``RemoteSystem`` stands for it and takes part in the interleaved blocks like any other
  system: the worker times each call with its own clock and the pauses wait for its threads
  to go quiet too.
* **cgru alone.** A fresh worker per config and dtype (both thread counts) runs only cgru (no
  other library is imported: checked) — ``cgru.forward``, the training step and, for the
  streaming configs, ``cgru.Stream`` —, held at once under their names (``build_as``) and
  timed, like JAX, as ``RemoteSystem``s in the section's interleaved rounds with the peers, so
  that no other library's allocations shape cgru's figures and its ratios to the peers come
  from the same rounds (docs/speed.md rule 9).
* **Peak memory** of a training step (forward + backward), first call and steady state, a
  fresh worker per system and problem (``run_memory``; cgru's in its own process, first).

Protocol: pickled ``(op, args)`` requests on the worker's stdin, ``("ok", value)`` or
``("error", traceback)`` replies on a private copy of its stdout (its ``sys.stdout`` goes to
stderr, which is a temporary file read back on errors).  ``python -m bench.workers [--cores
0,1]`` starts one.
"""
import gc
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OTHER_LIBRARIES = ("torch", "onnxruntime", "openvino", "jax", "tensorflow")


class WorkerError(RuntimeError):
    pass


# --- wire format -------------------------------------------------------------------------------
def _send(fh, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    fh.write(struct.pack("<Q", len(data)) + data)
    fh.flush()


def _read_exact(fd, n, deadline):
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("worker did not answer in time")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("worker exited")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(fd, deadline=None):
    (size,) = struct.unpack("<Q", _read_exact(fd, 8, deadline))
    return pickle.loads(_read_exact(fd, size, deadline))


# --- the parent's side -------------------------------------------------------------------------
class Worker:
    """A worker process; ``cores``: the CPUs to pin it to (``None``: not pinned)."""

    def __init__(self, cores=None, timeout=600.0, env=None):
        from bench import timing
        self.cores = None if cores is None else sorted(cores)
        self.timeout = timeout
        env = dict(os.environ, **(env or {}))
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "") \
            if env.get("PYTHONPATH") else ROOT
        cmd = [sys.executable, "-m", "bench.workers"]
        if self.cores is not None:
            cmd += ["--cores", ",".join(map(str, self.cores))]
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, env=env, cwd=ROOT)
        self.pid = self.proc.pid
        timing.register_pid(self.pid)

    def request(self, op, *args, timeout=None):
        try:
            _send(self.proc.stdin, (op, args))
            deadline = time.monotonic() + (timeout or self.timeout)
            status, value = _recv(self.proc.stdout.fileno(), deadline)
        except (OSError, EOFError, TimeoutError, pickle.UnpicklingError) as exc:
            tail = self._stderr_tail()
            self.close(kill=True)
            raise WorkerError(f"worker {op}: {exc.__class__.__name__}: {exc}{tail}") from None
        if status != "ok":
            raise WorkerError(f"worker {op} failed:\n{value}")
        return value

    def _stderr_tail(self, n=2000):
        try:
            self.stderr.seek(0)
            text = self.stderr.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""
        return f"\n--- worker stderr ---\n{text[-n:]}" if text.strip() else ""

    def close(self, kill=False):
        from bench import timing
        if self.proc.poll() is None:
            try:
                if not kill:
                    _send(self.proc.stdin, ("quit", ()))
                    self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            if self.proc.poll() is None:
                self.proc.kill()          # our own child, by its handle
                self.proc.wait()
        timing.unregister_pid(self.pid)
        for fh in (self.proc.stdin, self.proc.stdout, self.stderr):
            try:
                fh.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RemoteSystem:
    """A system that runs in a worker: ``cls(problem, n)`` is built there; ``outputs``,
    ``warmup`` and ``block`` are requests (timed by the worker's own clock).  ``name``: one
    of several systems the worker holds at once under their names (cgru's own process, whose
    fwd, fb and Stream are timed in the section's interleaved rounds; the key is then
    ``name``), else the worker's one system."""

    def __init__(self, worker, cls, problem, n, name=None):
        self.worker = worker
        self.key, self.kind, self.label = name or cls.key, cls.kind, cls.label
        self.name = name
        self.pids = (worker.pid,)
        if name is None:
            self.info = dict(worker.request("build", cls.key, problem, n), cores=worker.cores)
        else:
            self.info = dict(worker.request("build_as", name, cls.key, problem, n),
                             cores=worker.cores)

    def _request(self, op, *args):
        if self.name is None:
            return self.worker.request(op, *args)
        return self.worker.request(op + "_as", self.name, *args)

    def outputs(self):
        return self._request("outputs")

    def warmup(self, seconds, max_calls, single_s=0.25):
        return self._request("warmup", seconds, max_calls, single_s)

    def block(self, k, untimed):
        return self._request("block", k, untimed)

    def call(self):
        self.block(1, False)

    def close(self):
        try:
            self.worker.request("drop" if self.name is None else "drop_as", *(
                () if self.name is None else (self.name,)))
        except WorkerError:
            pass


class PinnedPool:
    """One pinned worker per thread count ``n`` (the first ``n`` CPUs this process may use),
    started on first use, kept for the run.  The workers share a JAX compilation cache in a
    temporary directory removed by ``close``."""

    def __init__(self):
        from bench.systems import JAX_CACHE_ENV
        self.workers = {}
        self.cache = tempfile.mkdtemp(prefix="cgru-bench-jax-")
        self.env = {JAX_CACHE_ENV: self.cache}
        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else list(range(os.cpu_count() or 1))

    def get(self, n):
        w = self.workers.get(n)
        if w is None or w.proc.poll() is not None:
            w = self.workers[n] = Worker(cores=self.cpus[:max(1, min(n, len(self.cpus)))],
                                         env=self.env)
        return w

    def remote(self, cls, problem, n):
        return RemoteSystem(self.get(n), cls, problem, n)

    def start(self, threads, modules=()):
        """Start the workers of ``threads`` and import ``modules`` in each, all at once."""
        ws = [self.get(n) for n in threads]
        return [w.request("import", list(modules)) for w in ws]

    def close(self):
        import shutil
        for w in self.workers.values():
            w.close()
        self.workers = {}
        shutil.rmtree(self.cache, ignore_errors=True)


def run_memory(key, problem, n):
    """Peak memory of one training step of system ``key`` in a fresh process."""
    with Worker() as w:
        return w.request("memory", key, problem, n)


# --- the worker's side -------------------------------------------------------------------------
def _status_kib(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss():
    """Reset the kernel's peak-RSS mark (VmHWM) of this process; False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _pool_bytes():
    """Bytes of the idle blocks cgru's pool (``cgru.core.plan.recycled``) holds, if loaded."""
    plan = sys.modules.get("cgru.core.plan")
    state = getattr(plan, "pool_state", None) if plan is not None else None
    return None if state is None else int(state()[1])


STEADY_STEPS = 2      # training steps after the first, for the steady-state figures


def _memory(key, problem, n):
    """Peak memory of a training step (forward + backward) of system ``key``, first-call and
    steady state.  The first step at this size in a fresh process, its results held until the
    peak is read (as a caller holds them); then (cgru only) ``STEADY_STEPS`` more steps, each
    dropping the previous step's results first, as a training loop does.  A tiny step of the
    same cell runs first, so that one-time library set-up is not counted.  Measures:

    * RSS growth of the first step: the kernel's peak resident set during it (VmHWM, reset
      just before it through ``/proc/self/clear_refs``; else the lifetime peak
      ``ru_maxrss``) minus the resident set before it — every allocation of every library,
      as pages touched; tracemalloc's own bookkeeping (cgru only, below) is subtracted.
    * tracemalloc (cgru only): the peak of the NumPy/Python allocations during the first
      step, exact to the byte — cgru allocates its outputs, reserve and workspaces as NumPy
      arrays (its kernels' small per-chunk scratch is malloc'd and not seen).  Not
      meaningful for PyTorch, whose allocator it does not see.
    * steady state: the peak RSS during the later steps over the RSS before the first
      (``steady_rss_growth_bytes``), the bytes cgru's pool holds between steps
      (``pool_bytes``: the reserve and workspace blocks it hands out again), and the time of
      the first step and the median of the later ones (``first_step_ms``,
      ``steady_step_ms``): the first faults in every page, the later ones reuse the pool."""
    import resource
    import tracemalloc
    from threadpoolctl import ThreadpoolController
    from bench import problems, systems
    cls = systems.BY_KEY[key]
    c = problem.config
    traced = key.startswith("cgru")
    tiny = problems.Problem(problems.Config("tiny", 2, 1, 8, 8, 1, False, c.cell,
                                            P=min(c.P, 4)), problem.dtype)
    with ThreadpoolController().limit(limits=n):
        cls(tiny, n).call()
        s = cls(problem, n)
        gc.collect()
        rss0 = _status_kib("VmRSS")
        exact = _reset_peak_rss()
        ru0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if traced:
            tracemalloc.start()
        t0 = time.perf_counter()
        out = s.call()
        first_ms = (time.perf_counter() - t0) * 1e3
        traced_peak = overhead = None
        if traced:
            traced_peak = tracemalloc.get_traced_memory()[1]
            overhead = tracemalloc.get_tracemalloc_memory()
            tracemalloc.stop()
        hwm = _status_kib("VmHWM") if exact else resource.getrusage(
            resource.RUSAGE_SELF).ru_maxrss
        del out
        steady_ms = []
        if exact:
            _reset_peak_rss()
        for _ in range(STEADY_STEPS if traced else 0):    # the pool is cgru's
            t0 = time.perf_counter()
            out = s.call()
            steady_ms.append((time.perf_counter() - t0) * 1e3)
            del out
        hwm_steady = _status_kib("VmHWM") if exact and steady_ms else None
        pool = _pool_bytes() if traced else None
    rss_growth = max(0, (hwm - rss0) * 1024 - (overhead or 0))
    rec = dict(system=key, rss_growth_bytes=int(rss_growth),
               rss_method="VmHWM after /proc/self/clear_refs" if exact else
               f"ru_maxrss (lifetime peak; {ru0} KiB before the step)",
               tracemalloc_overhead_bytes=overhead, traced_peak_bytes=traced_peak,
               input_bytes=problem.input_nbytes(), output_bytes=problem.output_nbytes(),
               threads=n, first_step_ms=first_ms,
               steady_step_ms=float(sorted(steady_ms)[len(steady_ms) // 2]) if steady_ms
               else None,
               steady_rss_growth_bytes=None if hwm_steady is None else
               int(max(0, (hwm_steady - rss0) * 1024)),
               pool_bytes=pool)
    if traced:
        import cgru
        rec["reserve_bytes"] = int(cgru.reserve_nbytes(problem.net, c.T, c.N))
        rec["minimum_bytes"] = rec["reserve_bytes"] + rec["input_bytes"] + rec["output_bytes"]
        rec["peak_bytes"] = rec["input_bytes"] + traced_peak    # the inputs were held before
        rec["peak_over_minimum"] = rec["peak_bytes"] / rec["minimum_bytes"]
        rec["rss_peak_over_minimum"] = (rec["input_bytes"] + rss_growth) / rec["minimum_bytes"]
    return rec


def serve(inp, out):
    """The worker's loop: answer requests read from descriptor ``inp`` on file ``out`` until
    ``quit`` or end of input."""
    state = {}
    while True:
        try:
            op, args = _recv(inp)
        except EOFError:
            return
        try:
            if op == "quit":
                _send(out, ("ok", None))
                return
            value = _handle(state, op, args)
            _send(out, ("ok", value))
        except Exception:
            _send(out, ("error", traceback.format_exc()))


def _handle(state, op, args):
    if op == "import":
        import importlib
        versions = {}
        for name in args[0]:
            try:
                versions[name] = getattr(importlib.import_module(name), "__version__", None)
            except Exception as exc:
                versions[name] = f"unavailable: {exc.__class__.__name__}: {exc}"
        return dict(versions=versions, pid=os.getpid(),
                    cores=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                    else None)
    if op == "build":
        from bench import systems
        key, problem, n = args
        from threadpoolctl import ThreadpoolController
        state.pop("system", None)
        state["limit"] = ThreadpoolController().limit(limits=n)   # held until the next build
        state["system"] = systems.BY_KEY[key](problem, n)
        return dict(pid=os.getpid())
    if op == "drop":
        state.pop("system", None)
        state.pop("limit", None)
        gc.collect()
        return None
    if op == "build_as":            # one of several systems held at once, by name
        from bench import systems
        from threadpoolctl import ThreadpoolController
        name, key, problem, n = args
        named = state.setdefault("named", {})
        if state.get("named_threads") != n:         # every named system runs at n threads
            if state.get("named_limit") is not None:
                state["named_limit"].restore_original_limits()
            state["named_limit"] = ThreadpoolController().limit(limits=n)
            state["named_threads"] = n
        named.pop(name, None)
        named[name] = systems.BY_KEY[key](problem, n)
        return dict(pid=os.getpid(),
                    other_libraries_loaded=sorted(m for m in OTHER_LIBRARIES
                                                  if m in sys.modules))
    if op in ("outputs_as", "warmup_as", "block_as"):
        name, *rest = args
        s = state.get("named", {}).get(name)
        if s is None:
            raise RuntimeError(f"{op}: no system {name!r} built")
        return getattr(s, op[:-3])(*rest)
    if op == "drop_as":
        state.get("named", {}).pop(args[0], None)
        gc.collect()
        return None
    if op in ("outputs", "warmup", "block"):
        s = state.get("system")
        if s is None:
            raise RuntimeError(f"{op}: no system built")
        return getattr(s, op)(*args)
    if op == "memory":
        return _memory(*args)
    raise ValueError(f"unknown request {op!r}")


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m bench.workers")
    ap.add_argument("--cores", default=None, help="CPUs to pin this process to, e.g. 0,1")
    args = ap.parse_args(argv)
    if args.cores:                  # before anything starts a thread pool
        os.sched_setaffinity(0, [int(c) for c in args.cores.split(",")])
    inp = os.dup(0)                 # the protocol's own descriptors
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                   # prints of any library go to stderr, not to the protocol
    sys.stdout = sys.stderr
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    serve(inp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
