"""What the bench reports: the derived figures (ratios, FLOP limit, streaming overhead), the
targets of docs/speed.md §6, the tables, the JSON, the plot, the machine and its libraries.

Ratios are of medians.  Where cgru is the denominator there are two: against cgru in the
main process (``…/cgru_fb``) and against cgru measured in a process of its own
(``…/cgru_fb_alone``, docs/speed.md rule 9: "the figure to trust").  The tables and the
targets use the second when it was measured.
"""
import json
import math
import os
import platform
import shlex
import sys
import time

import numpy as np

OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
RECOMMENDED = "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m cgru bench"
ENV_VARS = OPENBLAS_VARS + ("OPENBLAS_NUM_THREADS", "OPENBLAS_VERBOSE", "OMP_NUM_THREADS",
                            "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS",
                            "XLA_FLAGS")

# peer key -> the cgru system it is compared with
PEER_OF = {"torch_fb": "cgru_fb", "jax_fb": "cgru_fb", "numpy_fb": "cgru_fb",
           "torch_fwd": "cgru_fwd", "ort_fwd": "cgru_fwd", "openvino_fwd": "cgru_fwd"}
# other ratios of medians: cgru.torch against torch (the swap of a module) and against the
# core API (its overhead); the Stream against cgru.forward
EXTRA_RATIOS = [("torch_fb", "cgru_torch_fb"), ("cgru_torch_fb", "cgru_fb"),
                ("cgru_torch_fb", "cgru_fb_alone"), ("cgru_stream_fwd", "cgru_fwd"),
                ("cgru_stream_fwd_alone", "cgru_fwd_alone"),
                ("cgru_stream_fwd_alone", "bound_fwd")]


# --- derived figures ---------------------------------------------------------------------------
def derive(result):
    """Add ``ratios`` and ``streaming`` to a section's result (in place) from its medians,
    its bound, its FLOP limit and cgru's figures from a process of its own."""
    med = {k: v["median_ms"] for k, v in result["systems"].items()}
    for k, v in (result.get("alone") or {}).get("systems", {}).items():
        med[k + "_alone"] = v["median_ms"]
    for kind, ms in (result.get("flop_limit_ms") or {}).items():
        if ms:
            med[f"flop_limit_{kind}"] = ms
    pairs = []
    for kind in ("fwd", "fb"):
        for cg in (f"cgru_{kind}", f"cgru_{kind}_alone"):
            pairs += [(cg, f"bound_{kind}"), (cg, f"flop_limit_{kind}")]
        pairs += [(f"bound_{kind}", f"flop_limit_{kind}"), (f"cgru_{kind}_alone", f"cgru_{kind}")]
    for peer, cg in PEER_OF.items():
        pairs += [(peer, cg), (peer, cg + "_alone")]
    pairs += EXTRA_RATIOS
    result["ratios"] = {f"{a}/{b}": med[a] / med[b] for a, b in pairs
                        if a in med and b in med and med[b] > 0}
    us = {k: 1e3 * v for k, v in med.items()
          if k.endswith("fwd") or k.endswith("fwd_alone")}
    bound = us.get("bound_fwd")

    def overhead(key):
        v = us.get(key + "_alone", us.get(key))
        return None if v is None or bound is None else v - bound
    result["streaming"] = dict(per_call_us=us, overhead_us=overhead("cgru_fwd"),
                               stream_overhead_us=overhead("cgru_stream_fwd"))
    return result


def trusted(result, kind, system="cgru"):
    """cgru's ``kind`` figure to trust: from its own process when measured, else in-process
    (``(key suffix, median ms)``); ``system="cgru_stream"``: the Stream's."""
    key = f"{system}_{kind}"
    alone = (result.get("alone") or {}).get("systems", {}).get(key)
    if alone:
        return "_alone", alone["median_ms"]
    rec = result["systems"].get(key)
    return "", (rec["median_ms"] if rec else None)


def streaming_overhead(result):
    """The per-call overhead the target is about (docs/speed.md §6): of the Stream's step
    when it was measured (the API for repeated small calls), else of ``cgru.forward``."""
    st = result.get("streaming") or {}
    v = st.get("stream_overhead_us")
    return v if v is not None else st.get("overhead_us")


# --- targets (docs/speed.md §6) -------------------------------------------------------------------
TARGETS = [  # name, comparison, limit, where
    ("training / FLOP limit", "<=", 1.15, "N ≥ 16"),
    ("training / GEMM-only bound", "<=", 0.9, "N ≥ 16"),
    ("PyTorch training / cgru training", ">=", 2.5, "float32 and float64"),
    ("JAX training / cgru training", ">=", 1.5, "every config"),
    ("onnxruntime fwd / cgru fwd", ">=", 1.0, "every config, S1 and S32 included"),
    ("OpenVINO fwd / cgru fwd", ">=", 1.0, "every config, S1 and S32 included"),
    ("streaming per-call overhead (µs)", "<=", 30.0,
     "S1: a Stream step minus its GEMM-only bound"),
    ("1-thread / 2-thread training", ">=", 1.8, "N ≥ 16"),
    ("peak memory / (reserve + inputs + outputs)", "<=", 1.2, "every config"),
]
_TARGET = {name: (op, limit) for name, op, limit, _ in TARGETS}


def targets(results, memory=()):
    """Every applicable target per result row: ``[{config, dtype, threads, target, value,
    limit, op, ok}]`` (``threads`` is ``None`` for memory rows)."""
    out = []

    def add(row, name, value, threads=None):
        if value is None or not math.isfinite(value):
            return
        op, limit = _TARGET[name]
        ok = value <= limit if op == "<=" else value >= limit
        out.append(dict(config=row["config"], dtype=row["dtype"], threads=threads,
                        target=name, value=float(value), limit=limit, op=op, ok=bool(ok)))

    by_key = {(r["config"], r["dtype"], r["threads"]): r for r in results}
    for r in results:
        N, T, n = r["shape"]["N"], r["shape"]["T"], r["threads"]
        q = r.get("ratios", {})
        sfx_fb, fb = trusted(r, "fb")
        sfx_fwd, _ = trusted(r, "fwd")
        if N >= 16:
            add(r, "training / FLOP limit", q.get(f"cgru_fb{sfx_fb}/flop_limit_fb"), n)
            add(r, "training / GEMM-only bound", q.get(f"cgru_fb{sfx_fb}/bound_fb"), n)
        add(r, "PyTorch training / cgru training", q.get(f"torch_fb/cgru_fb{sfx_fb}"), n)
        add(r, "JAX training / cgru training", q.get(f"jax_fb/cgru_fb{sfx_fb}"), n)
        add(r, "onnxruntime fwd / cgru fwd", q.get(f"ort_fwd/cgru_fwd{sfx_fwd}"), n)
        add(r, "OpenVINO fwd / cgru fwd", q.get(f"openvino_fwd/cgru_fwd{sfx_fwd}"), n)
        if T == 1 and N == 1:
            add(r, "streaming per-call overhead (µs)", streaming_overhead(r), n)
        one = by_key.get((r["config"], r["dtype"], 1))
        if n == 2 and N >= 16 and one is not None and fb:
            _, fb1 = trusted(one, "fb")
            if fb1:
                add(r, "1-thread / 2-thread training", fb1 / fb, n)
    for m in memory:
        add(m, "peak memory / (reserve + inputs + outputs)",
            (m.get("cgru") or {}).get("peak_over_minimum"))
    return out


def format_targets(tg, width=96):
    """One line per target: met/applicable, and the misses, wrapped."""
    lines = []
    for name, op, limit, where in TARGETS:
        rows = [t for t in tg if t["target"] == name]
        if not rows:
            lines.append(f"  {name} {op.replace('<=', '≤').replace('>=', '≥')} {limit:g} "
                         f"({where}): not measured")
            continue
        bad = [t for t in rows if not t["ok"]]
        head = (f"  {name} {op.replace('<=', '≤').replace('>=', '≥')} {limit:g} ({where}): "
                f"{len(rows) - len(bad)}/{len(rows)} met")
        if not bad:
            lines.append(head)
            continue
        line = head + "; missed:"
        for t in bad:
            th = "" if t["threads"] is None else f" {t['threads']}T"
            it = f"{t['config']} {short_dtype(t['dtype'])}{th} {t['value']:.3g}"
            if len(line) + len(it) + 2 > width:
                lines.append(line if line.endswith(":") else line + ",")
                line = "      " + it
            else:
                line += (" " if line.endswith(":") else ", ") + it
        lines.append(line)
    return "\n".join(lines)


# --- two runs compared ------------------------------------------------------------------------
AGREE = (0.05, 0.10)        # the tolerances ``compare`` counts ratios within
TARGET_KEYS = frozenset(("target", "config", "dtype", "threads", "value", "limit", "ok"))
_ABSOLUTE = "(µs)"          # in a target's name: its value is a time, not a ratio


def compare(first, second):
    """How far two runs' figures agree, target by target (each run: the ``targets`` of its
    JSON; a target is its name, config, dtype and threads).  Returns ``{"targets": [{target,
    threads, n, median, p10, p90, within}]`` — per target and thread count (None: a memory
    row), the second run's value over the first's, its median and 10th/90th percentiles, and
    how many lie within each of ``AGREE`` of 1 (a target in µs, which is a difference of times
    rather than a ratio: the second value minus the first, ``within`` None) —, ``"flips"``:
    the targets met in one run only (``{target, config, dtype, threads, first, second,
    limit}``), ``"met"``: (first, second) counts of targets met, ``"only_in"``: (first,
    second) counts of targets one run has and the other not}``."""
    def key(t):
        return t["target"], t["config"], t["dtype"], t["threads"]

    a = {key(t): t for t in first}
    b = {key(t): t for t in second}
    groups, flips = {}, []
    for k, ta in a.items():
        tb = b.get(k)
        if tb is None:
            continue
        va, vb = ta.get("value"), tb.get("value")
        if va is not None and vb is not None and math.isfinite(va) and math.isfinite(vb) and \
                (va or _ABSOLUTE in k[0]):
            groups.setdefault((k[0], k[3]), []).append(vb - va if _ABSOLUTE in k[0] else vb / va)
        if ta["ok"] != tb["ok"]:
            flips.append(dict(target=k[0], config=k[1], dtype=k[2], threads=k[3],
                              first=va, second=vb, limit=ta["limit"]))
    rows = []
    order = {name: i for i, (name, *_) in enumerate(TARGETS)}      # the report's order
    for (name, threads), ratios in sorted(
            groups.items(), key=lambda g: (order.get(g[0][0], len(order)), g[0][0],
                                           g[0][1] or 0)):
        r = np.asarray(ratios)
        rows.append(dict(target=name, threads=threads, n=len(r), median=float(np.median(r)),
                         p10=float(np.percentile(r, 10)), p90=float(np.percentile(r, 90)),
                         within=None if _ABSOLUTE in name else
                         [int(np.sum(np.abs(r - 1) <= tol)) for tol in AGREE]))
    return dict(targets=rows, flips=flips,
                met=(sum(t["ok"] for t in first), sum(t["ok"] for t in second)),
                only_in=(len(a.keys() - b.keys()), len(b.keys() - a.keys())))


def format_compare(c, names=("first", "second")):
    """``compare``'s result as text (``names``: what the two runs are, e.g. their files): one
    line per target and thread count, then the flips."""
    tols = " / ".join(f"{100 * t:g} %" for t in AGREE)
    lines = [f"first: {names[0]} ({c['met'][0]} targets met)",
             f"second: {names[1]} ({c['met'][1]} targets met)",
             f"second / first per target (median, 10–90 %, share within {tols}):"]
    for r in c["targets"]:
        th = "" if r["threads"] is None else f" {r['threads']}T"
        if r["within"] is None:
            lines.append(f"  {r['target']}{th}: n={r['n']}, second − first: median "
                         f"{r['median']:+.1f}, {r['p10']:+.1f} to {r['p90']:+.1f}")
            continue
        within = " / ".join(f"{100 * w / r['n']:.0f} %" for w in r["within"])
        lines.append(f"  {r['target']}{th}: n={r['n']}, median {r['median']:.3f}, "
                     f"{r['p10']:.3f}–{r['p90']:.3f}, within {within}")
    if c["only_in"] != (0, 0):
        lines.append(f"targets in one run only: {c['only_in'][0]} (first), "
                     f"{c['only_in'][1]} (second)")
    lines.append(f"met in one run only: {len(c['flips'])}")
    for f in c["flips"]:
        th = "" if f["threads"] is None else f" {f['threads']}T"
        v = " → ".join("—" if x is None else f"{x:.3g}" for x in (f["first"], f["second"]))
        lines.append(f"  {f['target']}: {f['config']} {short_dtype(f['dtype'])}{th} {v} "
                     f"(limit {f['limit']:g})")
    return "\n".join(lines)


# --- tables --------------------------------------------------------------------------------
def short_dtype(dt):
    return {"float32": "f32", "float64": "f64"}.get(dt, dt)


def _fmt(v, spec="{:.2f}"):
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else spec.format(v)


def _ms(v):
    """Milliseconds with about 3 significant digits and no exponent."""
    if v is None:
        return "—"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else \
        f"{v:.2f}" if v >= 0.1 else f"{v:.3f}"


def _table(head, rows, markdown, left=3):
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) if i < left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    return "\n".join(out)


MAIN_HEAD = ("config", "dtype", "thr", "cgru fb ms (min–max)", "alone ms", "fb/bound",
             "fb/FLOP lim", "PyTorch fb/cgru", "PyTorch fb/cgru.torch", "JAX fb/cgru",
             "NumPy fb/cgru", "cgru fwd ms", "onnxrt fwd/cgru", "OpenVINO fwd/cgru",
             "other load")


def main_rows(results):
    rows = []
    for r in results:
        s, q = r["systems"], r.get("ratios", {})
        fb, fwd = s.get("cgru_fb"), s.get("cgru_fwd")
        sb, alone_fb = trusted(r, "fb")
        sf, fwd_ms = trusted(r, "fwd")
        fb_txt = "—" if fb is None else \
            f"{_ms(fb['median_ms'])} ({_ms(fb['min_ms'])}–{_ms(fb['max_ms'])})"
        rows.append((r["config"], short_dtype(r["dtype"]), str(r["threads"]), fb_txt,
                     _ms(alone_fb) if sb else "—",
                     _fmt(q.get(f"cgru_fb{sb}/bound_fb")),
                     _fmt(q.get(f"cgru_fb{sb}/flop_limit_fb")),
                     _fmt(q.get(f"torch_fb/cgru_fb{sb}")),
                     _fmt(q.get("torch_fb/cgru_torch_fb")),
                     _fmt(q.get(f"jax_fb/cgru_fb{sb}")),
                     _fmt(q.get(f"numpy_fb/cgru_fb{sb}")),
                     _ms(fwd_ms) if fwd_ms else (_ms(fwd["median_ms"]) if fwd else "—"),
                     _fmt(q.get(f"ort_fwd/cgru_fwd{sf}")),
                     _fmt(q.get(f"openvino_fwd/cgru_fwd{sf}")),
                     _load(r)))
    return rows


KIND_TITLES = {"gru": "GRU", "lstm": "LSTM", "rnn_tanh": "vanilla RNN (tanh)",
               "rnn_relu": "vanilla RNN (relu)"}


def by_kind(results):
    """``[(cell kind, [results])]`` in the order of ``KIND_TITLES``, then any other."""
    kinds = list(KIND_TITLES) + sorted({r.get("cell", "gru") for r in results} -
                                       set(KIND_TITLES))
    groups = [(k, [r for r in results if r.get("cell", "gru") == k]) for k in kinds]
    return [(k, rs) for k, rs in groups if rs]


def _load(r):
    """Other load during the section, and during cgru's own process (``section/alone``)."""
    sec = _fmt(r.get("other_load_cores"), "{:.1f}")
    alone = (r.get("alone") or {}).get("other_load_cores")
    return sec if alone is None else f"{sec}/{alone:.1f}"


STREAM_HEAD = ("config", "dtype", "thr", "cgru fwd µs alone", "in process", "Stream µs alone",
               "bound µs", "fwd overhead µs", "Stream overhead µs", "PyTorch µs",
               "onnxrt µs", "OpenVINO µs", "other load")


def stream_rows(results):
    rows = []
    for r in results:
        if not r["shape"].get("streaming") and not (r["shape"]["N"] == 1 and r["shape"]["T"] <= 32):
            continue
        st = r.get("streaming") or {}
        us = st.get("per_call_us", {})

        def f(k):
            return _fmt(us.get(k), "{:.1f}")
        stream = us.get("cgru_stream_fwd_alone", us.get("cgru_stream_fwd"))
        rows.append((r["config"], short_dtype(r["dtype"]), str(r["threads"]),
                     f("cgru_fwd_alone"), f("cgru_fwd"), _fmt(stream, "{:.1f}"),
                     f("bound_fwd"), _fmt(st.get("overhead_us"), "{:.1f}"),
                     _fmt(st.get("stream_overhead_us"), "{:.1f}"), f("torch_fwd"),
                     f("ort_fwd"), f("openvino_fwd"), _load(r)))
    return rows


MEM_HEAD = ("config", "dtype", "cgru peak MiB", "minimum MiB", "peak/minimum",
            "cgru RSS growth MiB", "steady RSS MiB", "pool MiB", "first / steady step ms",
            "PyTorch RSS growth MiB", "PyTorch/cgru (RSS)")


GEMM_HEAD = ("config", "dtype", "product", "m×n×k", "calls", "GFLOP/s", "of peak", "share")


def gemm_rows(results):
    """Rows of the per-GEMM table: each 1-thread section's ``gemms`` (bench/gemms.py), the
    fraction of peak against the section's ``peak_gflops``."""
    rows = []
    for r in results:
        peak = r.get("peak_gflops")
        for g in r.get("gemms") or ():
            rows.append([r["config"], short_dtype(r["dtype"]), g["name"],
                         f"{g['m']}×{g['n']}×{g['k']}", f"{g['calls']:g}",
                         f"{g['gflops']:.1f}", _fmt(g["gflops"] / peak if peak else None),
                         _fmt(g["share"])])
    return rows


def memory_rows(memory):
    rows = []
    mib = 1 / 2 ** 20
    for m in memory:
        c, t = m.get("cgru") or {}, m.get("torch") or {}
        cr, tr = c.get("rss_growth_bytes"), t.get("rss_growth_bytes")

        def b(v):
            return _fmt(None if v is None else v * mib, "{:.2f}")
        first, steady = c.get("first_step_ms"), c.get("steady_step_ms")
        rows.append((m["config"], short_dtype(m["dtype"]),
                     b(c.get("peak_bytes")), b(c.get("minimum_bytes")),
                     _fmt(c.get("peak_over_minimum"), "{:.3f}"),
                     b(cr), b(c.get("steady_rss_growth_bytes")), b(c.get("pool_bytes")),
                     "—" if first is None or steady is None else
                     f"{_ms(first)} / {_ms(steady)}",
                     b(tr), _fmt(tr / cr if cr and tr is not None else None)))
    return rows


def format_tables(results, memory=(), peaks=(), markdown=False):
    parts = []
    for kind, rs in by_kind(results):
        parts.append(f"{'### ' if markdown else ''}{KIND_TITLES.get(kind, kind)}\n")
        parts.append(_table(MAIN_HEAD, main_rows(rs), markdown) + "\n")
    parts.append("ratios of medians, against cgru measured in a process of its own ('alone'); "
                 "fb = training forward+backward;\nratio > 1 = cgru faster, except fb/bound "
                 "and fb/FLOP lim (cgru's time over its yardstick); PyTorch fb/cgru.torch: "
                 "nn.GRU/LSTM/RNN against cgru.torch's module,\nthe same training step in "
                 "the same process; other load: cores kept busy by other processes (in the "
                 "section / while cgru ran alone)")
    srows = stream_rows(results)
    if srows:
        parts.append("\nstreaming (batch 1, per call; overhead = the call alone − its "
                     "GEMM-only bound; Stream = cgru.Stream(net).step(x, state)):")
        parts.append(_table(STREAM_HEAD, srows, markdown))
    grows = gemm_rows(results)
    if grows:
        parts.append("\neach GEMM of a training step alone, at 1 thread, on cgru's route "
                     "(first layer-direction; bench/gemms.py): m×n×k, calls per step, "
                     "GFLOP/s, its fraction of the section's peak GEMM rate, its share of the "
                     "step's GEMM time:")
        parts.append(_table(GEMM_HEAD, grows, markdown))
    mrows = memory_rows(memory)
    if mrows:
        parts.append("\npeak memory of a training step (fresh process each; cgru peak = "
                     "inputs + tracemalloc peak of the first step, minimum = reserve + inputs "
                     "+ outputs; RSS growth = peak RSS during the first step − RSS before; "
                     "steady = peak RSS of the next steps − RSS before the first; pool = "
                     "what cgru's buffer pool holds between steps):")
        parts.append(_table(MEM_HEAD, mrows, markdown, left=2))
    if peaks:
        parts.append("\npeak GEMM (2048³ at the section's threads, the faster of SciPy's BLAS "
                     "and cgru's packed GEMM): " + ", ".join(
                         f"{'S' if p['dtype'] == 'float32' else 'D'}GEMM {p['threads']}T "
                         f"{p['gflops']:.0f} GFLOP/s ({p.get('gemm', 'blas')}; BLAS "
                         f"{p.get('blas_gflops', p['gflops']):.0f}, cgru "
                         f"{p.get('cgru_gflops', math.nan):.0f})" for p in peaks))
    return "\n".join(parts)


# --- plot ------------------------------------------------------------------------------------
PLOT_SERIES = [  # ratio key (with the cgru suffix placeholder), label, target
    ("cgru_fb{s}/bound_fb", "cgru fb / GEMM-only bound", 0.9),
    ("cgru_fb{s}/flop_limit_fb", "cgru fb / FLOP limit", 1.15),
    ("torch_fb/cgru_fb{s}", "PyTorch fb / cgru fb", 2.5),
    ("torch_fb/cgru_torch_fb", "PyTorch fb / cgru.torch fb", None),
    ("jax_fb/cgru_fb{s}", "JAX fb / cgru fb", 1.5),
    ("ort_fwd/cgru_fwd{s}", "onnxruntime fwd / cgru fwd", 1.0),
    ("openvino_fwd/cgru_fwd{s}", "OpenVINO fwd / cgru fwd", 1.0),
    ("numpy_fb/cgru_fb{s}", "NumPy fb / cgru fb", None),
]


def plot(results, path):
    """Bars of the ratios per config (log scale, growing from 1), one panel per dtype and
    thread count; each series' target as a dotted line in its colour."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    panels = sorted({(r["dtype"], r["threads"]) for r in results})
    series = [s for s in PLOT_SERIES
              if any(_series_value(r, s[0]) is not None for r in results)]
    n_cfg = max(len([r for r in results if (r["dtype"], r["threads"]) == p]) for p in panels)
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(max(8, 1.3 * n_cfg + 2), 1.2 + 3 * len(panels)))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (dt, n) in zip(axes[:, 0], panels):
        sub = [r for r in results if (r["dtype"], r["threads"]) == (dt, n)]
        x = np.arange(len(sub))
        w = 0.8 / max(1, len(series))
        for j, (key, label, target) in enumerate(series):
            vals = np.array([_series_value(r, key) or np.nan for r in sub], float)
            col = colors[j % len(colors)]
            ax.bar(x + (j - (len(series) - 1) / 2) * w, vals - 1, w, bottom=1, label=label,
                   color=col)
            if target is not None:
                ax.axhline(target, color=col, lw=0.8, ls=":")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xticks(x)
        ax.set_xticklabels([r["config"] for r in sub])
        ax.set_ylabel("ratio of medians")
        ax.set_title(f"{dt}, {n} thread{'s' if n > 1 else ''} (dotted: targets)", fontsize=10)
        ax.grid(axis="y", which="major", alpha=0.3)
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.9 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _series_value(r, key):
    s, _ = trusted(r, "fb" if "fb" in key else "fwd")
    return r.get("ratios", {}).get(key.format(s=s))


# --- machine, libraries, environment ----------------------------------------------------------
def _cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return sorted(f for f in flags if f.startswith(("avx", "fma", "amx")))
    except OSError:
        pass
    return None


def machine_info():
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return dict(cpu=_cpu_model(), logical_cpus=os.cpu_count(), usable_cpus=usable,
                simd_flags=_cpu_flags(), platform=platform.platform(),
                python=platform.python_version())


def library_versions(peers, extra=None):
    import cgru
    import scipy
    import threadpoolctl
    v = dict(cgru=cgru.__version__, numpy=np.__version__, scipy=scipy.__version__,
             threadpoolctl=threadpoolctl.__version__)
    try:
        v["cgru_parallel"] = bool(cgru.parallel_enabled())
    except Exception:  # noqa: BLE001 - informational only
        v["cgru_parallel"] = None
    for name, ver in peers.items():
        if ver is not None:
            v[name] = ver
    if "onnxruntime" in peers:
        import onnx
        v["onnx"] = onnx.__version__
    for name, ver in (extra or {}).items():
        v[name] = ver
    try:
        import matplotlib
        v["matplotlib"] = matplotlib.__version__
    except ImportError:
        v["matplotlib"] = None
    return v


def blas_info():
    """The BLAS in use: cgru's binding (``blas_control``), the time-loop ISA and every BLAS and
    OpenMP library of this process (``threadpoolctl.threadpool_info``, with the kernel
    OpenBLAS runs in ``architecture``)."""
    from threadpoolctl import threadpool_info
    import scipy.linalg.cython_blas  # noqa: F401  (load SciPy's BLAS so threadpoolctl sees it)
    out = dict(threadpool_info=threadpool_info())
    try:
        from cgru._kernels.threads import blas_control
        how, path, threads = blas_control()
        out["cgru_blas"] = dict(how=how, path=path, threads_now=threads)
    except Exception as exc:  # noqa: BLE001 - informational only
        out["cgru_blas"] = f"unavailable: {exc}"
    try:
        from cgru._kernels.loops import simd_isa
        out["cgru_time_loop_isa"] = simd_isa()
    except Exception:  # noqa: BLE001
        out["cgru_time_loop_isa"] = None
    return out


def environment():
    return {k: os.environ.get(k) for k in ENV_VARS}


def env_note(env, argv=()):
    """The warning printed when the OpenBLAS variables are set (``None`` when they are not),
    with the command to rerun (``argv``: the bench's own arguments)."""
    set_vars = [k for k in OPENBLAS_VARS if env.get(k) is not None]
    if not set_vars:
        return None
    cmd = " ".join([RECOMMENDED, *map(shlex.quote, argv)])
    return ("NOTE: " + ", ".join(f"{k}={env[k]}" for k in set_vars) + " set: SciPy's OpenBLAS "
            "(cgru, the bound, the FLOP limit) runs slower kernels while PyTorch, onnxruntime "
            "and OpenVINO do not.\n      For fair figures rerun with:  " + cmd)


def write_json(path, doc):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, allow_nan=True, default=_json_default)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


class Progress:
    """One status line on stderr (rewritten in place on a terminal)."""

    def __init__(self, total, stream=None):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()
        self.head = ""

    def section(self, head):
        self.done += 1
        self.head = head
        self("start")

    def __call__(self, what):
        msg = (f"[{self.done}/{self.total}] {self.head}: {what} "
               f"({time.perf_counter() - self.t0:.0f} s)")
        if self.tty:
            self.stream.write("\r\033[K" + msg)
            self.stream.flush()
        elif what == "start":          # not a terminal: one line per section
            print(msg, file=self.stream, flush=True)

    def end(self):
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()
