"""The benchmark's correctness machinery (bench/) on tiny problems; timings are never asserted.

1. Every system it times agrees with cgru on a tiny 2-layer bidirectional stack, in both
   dtypes (JAX through its pinned worker process, as in a run); every peer's LSTM, tanh and
   relu RNN builders too, an LSTM with a projection where the peer has one, cgru.torch's
   modules and cgru.Stream; a peer whose package is missing is skipped.
2. A system that computes something else fails validation; so does one that crashes.
3. ``main`` end to end: the JSON holds every figure and the plot is written; a failed
   validation gives exit code 1 and leaves that system untimed.
4. The optional peers skip cleanly when their package is missing (imports hidden).
5. Small parts: config parsing and flops, the run modes' configs, the bound for any gate
   count and a projection, block planning, cgru's own process and its memory figures, the
   targets of docs/speed.md, the OpenBLAS note.
6. ``bench.paced`` (calls at a pace): validation first, every system timed in turn.
"""
import json
import math
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:                 # bench/ is a top-level package of the checkout
    sys.path.insert(0, ROOT)

from bench import __main__ as bench_main  # noqa: E402
from bench import gemms, problems, report, systems, timing, workers  # noqa: E402

TINY = problems.Config("tiny", T=5, N=3, I=4, H=6, L=2, bidirectional=True)
TINY_SPEC = "5x3x4x6x2b"
PEER_KEYS = {"torch": {"torch_fwd", "torch_fb", "cgru_torch_fb"}, "onnxruntime": {"ort_fwd"},
             "openvino": {"openvino_fwd"}, "jax": {"jax_fb"}}
F32_ONLY = {"ort_fwd", "openvino_fwd"}
CGRU_OWN = {"cgru_fwd", "cgru_fb", "cgru_torch_fb", "cgru_stream_fwd", "bound_fwd", "bound_fb"}
KINDS = ["lstm", "rnn_tanh", "rnn_relu"]
FAST = ["--threads", "1", "--dtypes", "float32", "--rounds", "1", "--peak-size", "128"]


@pytest.fixture(scope="module")
def peers():
    return systems.load_peers()[0]


@pytest.fixture(scope="module")
def pool(peers):
    if "jax" not in peers:
        yield None
        return
    p = workers.PinnedPool()
    yield p
    p.close()


def _hide(monkeypatch, *names):
    for name in names:
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, mod)
        monkeypatch.setitem(sys.modules, name, None)      # import name -> ImportError


# --- 1. every system agrees with cgru ----------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_system_agrees_with_cgru(peers, pool, dtype):
    problem = problems.Problem(TINY, dtype, seed=3)
    built, _ = systems.build_systems(problem, 1, peers, all_dtypes=True,
                                     remote=pool.remote if pool else None)
    checks = systems.validate(problem, built, 1)
    for s in built:
        s.close()
    expected = {"cgru_fwd", "cgru_fb", "numpy_fb", "bound_fwd", "bound_fb"}
    for peer, keys in PEER_KEYS.items():
        if peer in peers:
            expected |= keys if dtype == "float32" else keys - F32_ONLY
    assert set(checks) == expected
    assert not {k: v for k, v in checks.items() if not v["ok"]}
    # the peers were really compared (an error of exactly 0 would mean cgru against itself)
    for key in expected - CGRU_OWN:
        assert 0 < checks[key]["err"] <= checks[key]["tol"], key
    # fb systems were compared on every gradient, not only on y and hy
    ref_fb = systems.cgru_reference(problem, 1)[1]
    assert {"dx", "dh0", "dW[3]", "dR[3]", "db_W[3]", "db_R[3]"} <= set(ref_fb)


def _peer_systems(peer, problem, pool, dtype):
    """The systems of ``peer`` (a PEER_KEYS name or ``numpy``) built on ``problem``, remote
    ones through the pinned pool; pytest.skip when its package is missing."""
    keys = {"numpy": {"numpy_fb"}}.get(peer) or PEER_KEYS[peer]
    if peer != "numpy" and peer not in systems.load_peers()[0]:
        pytest.skip(f"{peer} not installed")
    built = []
    for key in sorted(keys):
        cls = systems.BY_KEY[key]
        if dtype not in cls.dtypes or not cls.supports(problem.config):
            continue
        built.append(pool.remote(cls, problem, 1) if getattr(cls, "remote", False)
                     else cls(problem, 1))
    return built


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("peer", ["torch", "onnxruntime", "openvino", "jax", "numpy"])
def test_every_peer_computes_lstm_and_rnn(peer, kind, pool):
    for dtype in ("float32", "float64"):
        problem = problems.Problem(problems.parse_config(f"{kind}:{TINY_SPEC}"), dtype, seed=4)
        built = _peer_systems(peer, problem, pool, dtype)
        assert built or dtype == "float64"              # ONNX and OpenVINO: float32 only
        checks = systems.validate(problem, built, 1)
        for s in built:
            s.close()
        for key, rec in checks.items():
            assert rec["ok"], (key, dtype, rec)
            assert rec["err"] <= rec["tol"]
            if kind != "rnn_relu" and key not in CGRU_OWN:   # relu: peers may agree exactly
                assert rec["err"] > 0, (key, dtype)
            assert rec["against"].startswith("cgru")


def test_cgru_reference_of_an_lstm_has_its_cell_state():
    problem = problems.Problem(problems.parse_config(f"lstm:{TINY_SPEC}"), "float64")
    ref_fwd, ref_fb = systems.cgru_reference(problem, 1)
    assert {"y", "hy", "cy"} == set(ref_fwd)
    assert {"cy", "dc0", "dx", "dh0", "dW[3]"} <= set(ref_fb)
    assert ref_fb["dc0"].shape == problem.c0.shape


@pytest.mark.parametrize("peer", ["torch", "onnxruntime", "openvino", "jax", "numpy"])
def test_an_lstm_with_a_projection(peer, pool):
    problem = problems.Problem(problems.parse_config(f"lstm:{TINY_SPEC}-P3"), "float64",
                               seed=2)
    assert problem.h0.shape == (4, 3, 3) and problem.c0.shape == (4, 3, 6)
    keys = {"numpy": {"numpy_fb"}}.get(peer) or PEER_KEYS[peer]
    classes = [systems.BY_KEY[k] for k in keys]
    if not all(cls.projection for cls in classes):        # ONNX and OpenVINO have none
        notes = []
        built, _ = systems.build_systems(problem, 1, {peer: None}, notes=notes, skip=("bound",))
        assert not keys & {s.key for s in built}
        for key in keys:
            assert f"{key}: no LSTM projection (proj_size) in this peer; skipped" in notes
        return
    built = _peer_systems(peer, problem, pool, "float64")
    checks = systems.validate(problem, built, 1)
    for s in built:
        s.close()
    assert set(checks) == keys
    for key, rec in checks.items():
        assert rec["ok"] and rec["err"] <= rec["tol"], (key, rec)
    if "torch_fb" in checks or "jax_fb" in checks or "numpy_fb" in checks:
        ref_fb = systems.cgru_reference(problem, 1)[1]
        assert ref_fb["dW_p[3]"].shape == (3, 6)              # the projection's gradient


def test_cgru_torch_is_the_swapped_module(peers):
    if "torch" not in peers:
        pytest.skip("torch not installed")
    import cgru.torch
    import torch
    for spec in (TINY_SPEC, f"lstm:{TINY_SPEC}", f"rnn_relu:{TINY_SPEC}"):
        problem = problems.Problem(problems.parse_config(spec), "float32", seed=1)
        s = systems.CgruTorchFb(problem, 2)
        name = systems._TORCH_CLASSES[problem.config.cell][0]
        assert type(s.module) is getattr(cgru.torch, name)
        assert isinstance(s.module, getattr(torch.nn, name)) and s.module.num_threads == 2
        rec = systems.validate(problem, [s], 2)["cgru_torch_fb"]
        assert rec["ok"] and rec["against"] == "cgru forward+backward", rec
        # the same training step as the torch peer: x, h0 (c0) and every weight
        assert len(s.inputs) == len(systems.TorchFb(problem, 2).inputs)


def _streaming(kind="gru", T=1, **kw):
    return problems.Config(f"s{T}", T, 1, 4, 6, cell=kind, streaming=True, **kw)


@pytest.mark.parametrize("kind", ["gru", "lstm", "rnn_tanh"])
def test_the_stream_is_timed_on_streaming_configs(kind):
    for T in (1, 7):
        problem = problems.Problem(_streaming(kind, T), "float64", seed=6)
        built, _ = systems.build_systems(problem, 2, {}, skip=("numpy",))
        assert "cgru_stream_fwd" in [s.key for s in built]
        checks = systems.validate(problem, built, 2)
        assert all(v["ok"] for v in checks.values()), checks
        assert checks["cgru_stream_fwd"]["against"] == "cgru forward"
        stream = next(s for s in built if s.key == "cgru_stream_fwd")
        assert len(stream.block(3, True)) == 3
    # not on whole-sequence configs (a Stream runs forward in time, chunk by chunk)
    for config in (problems.parse_config(f"{kind}:{TINY_SPEC}"),
                   problems.parse_config(f"{kind}:5x1x4x6x1")):
        built, _ = systems.build_systems(problems.Problem(config, "float32"), 1, {})
        assert "cgru_stream_fwd" not in [s.key for s in built]
    assert problems.parse_config(f"{kind}:S1").streaming
    assert problems.parse_config(f"{kind}:S32").streaming


def test_openvino_runs_in_f32_not_bf16(peers):
    if "openvino" not in peers:
        pytest.skip("openvino not installed")
    s = systems.OpenVinoFwd(problems.Problem(TINY, "float32"), 1)
    assert s.precision_ok and s.threads == 1


def test_jax_worker_is_pinned(pool):
    if pool is None:
        pytest.skip("jax not installed")
    (info,) = pool.start([1], ["jax"])
    assert len(info["cores"]) == 1 and info["versions"]["jax"]


# --- 2. validation can fail -------------------------------------------------------------------

def _scrambled(problem):
    lp = problem.net[1]                   # layer 0, reverse direction: rows of R reversed
    lp.R[:] = lp.R[::-1].copy()
    return problem


def test_a_wrong_system_fails_validation():
    problem = problems.Problem(TINY, "float32", seed=3)
    other = _scrambled(problems.Problem(TINY, "float32", seed=3))
    right = systems.validate(problem, [systems.NumpyFb(problem, 1)], 1)["numpy_fb"]
    wrong = systems.validate(problem, [systems.NumpyFb(other, 1)], 1)["numpy_fb"]
    assert right["ok"] and 0 < right["err"]
    assert not wrong["ok"] and wrong["err"] > 10 * wrong["tol"]


def test_a_crashing_or_incomplete_system_fails_validation():
    problem = problems.Problem(TINY, "float32")

    class Broken(systems.System):
        key, kind = "broken", "fwd"

        def outputs(self):
            raise RuntimeError("boom")

    class NoGradients(systems.System):
        key, kind = "partial", "fb"

        def outputs(self):
            return systems.CgruFwd(problem, 1).outputs()     # y and hy only

    checks = systems.validate(problem, [Broken(), NoGradients()], 1)
    assert not checks["broken"]["ok"] and "boom" in checks["broken"]["worst"]
    assert not checks["partial"]["ok"] and checks["partial"]["worst"].startswith("missing")


def test_a_peer_that_cannot_start_fails_validation(monkeypatch):
    def broken(self, p, n):
        raise OSError("no such device")

    monkeypatch.setattr(systems.NumpyFb, "__init__", broken)
    problem = problems.Problem(TINY, "float32")
    built, _ = systems.build_systems(problem, 1, {}, skip=("bound",))
    checks = systems.validate(problem, built, 1)
    assert [s.key for s in built] == ["cgru_fwd", "cgru_fb", "numpy_fb"]
    assert not checks["numpy_fb"]["ok"] and "no such device" in checks["numpy_fb"]["worst"]


# --- 3. main end to end -----------------------------------------------------------------------

def _run_main(tmp_path, *extra):
    out_json, out_png = tmp_path / "r" / "bench.json", tmp_path / "r" / "bench.png"
    code = bench_main.main(["--configs", TINY_SPEC, *FAST, "--json", str(out_json),
                            "--plot", str(out_png), *extra])
    return code, json.loads(out_json.read_text()), out_png


def test_main_writes_every_figure(tmp_path, capsys, peers):
    code, doc, png = _run_main(tmp_path)
    assert code == 0
    (res,) = doc["results"]
    assert (res["config"], res["dtype"], res["threads"]) == (TINY_SPEC, "float32", 1)
    assert all(v["ok"] for v in res["validation"].values())
    assert set(res["systems"]) == set(res["validation"])        # everything validated is timed
    expected = {"cgru_fwd", "cgru_fb", "numpy_fb", "bound_fwd", "bound_fb"}
    for peer, keys in PEER_KEYS.items():
        if peer in peers:
            expected |= keys
    assert set(res["systems"]) == expected
    for key, rec in res["systems"].items():
        assert rec["n"] == len(rec["samples_ms"]) >= 1
        if key.startswith("bound"):       # the bound is the raw time minus the call overhead
            assert 0 < rec["median_ms"] <= rec["raw_median_ms"]
        else:
            assert 0 < rec["min_ms"] <= rec["median_ms"] <= rec["max_ms"]
    assert res["systems"]["bound_fb"]["gemm_calls"] == 2 * 2 * (5 + 1) + 2 * 2 * (5 + 3)
    # cgru in a process of its own, validated against the main process
    alone = res["alone"]
    assert set(alone["systems"]) == {"cgru_fwd", "cgru_fb"} and alone["interleaved"]
    assert all(v["ok"] for v in alone["validation"].values())
    # the FLOP limit, from the peak GEMM measured in the same run (start and end)
    assert {p["when"] for p in doc["peak_gemm"]["measured"]} == {"start", "end"}
    assert all(p["ok"] and p["gflops"] > 0 for p in doc["peak_gemm"]["measured"])
    flops_fb = problems.parse_config(TINY_SPEC).flops("fb")
    assert res["flop_limit_ms"]["fb"] == pytest.approx(flops_fb / res["peak_gflops"] / 1e6)
    q = res["ratios"]
    for key in ("cgru_fb/bound_fb", "cgru_fb_alone/bound_fb", "cgru_fb_alone/flop_limit_fb",
                "numpy_fb/cgru_fb", "numpy_fb/cgru_fb_alone", "cgru_fb_alone/cgru_fb"):
        assert q[key] > 0, key
    for peer in PEER_KEYS:
        if peer in peers:
            for key in PEER_KEYS[peer] & set(report.PEER_OF):
                assert q[f"{key}/{report.PEER_OF[key]}_alone"] > 0
    assert res["streaming"]["per_call_us"]["cgru_fwd_alone"] > 0
    # each GEMM of the step alone, at 1 thread
    assert [g["name"] for g in res["gemms"]] == [
        name for name, *_ in gemms.products(problems.Problem(problems.parse_config(TINY_SPEC),
                                                             "float32"))]
    assert all(g["gflops"] > 0 for g in res["gemms"])
    assert sum(g["share"] for g in res["gemms"]) == pytest.approx(1.0)
    if "torch" in peers:                  # cgru.torch against nn.GRU, in its own column
        assert q["torch_fb/cgru_torch_fb"] > 0 and q["cgru_torch_fb/cgru_fb_alone"] > 0
    # peak memory: cgru from its own fresh process, PyTorch from another
    (mem,) = doc["memory"]
    c = mem["cgru"]
    assert c["minimum_bytes"] == c["reserve_bytes"] + c["input_bytes"] + c["output_bytes"]
    assert c["peak_over_minimum"] >= 1.0 and c["rss_growth_bytes"] >= 0
    # first call and steady state: the pool holds the reserve and the workspace between steps
    assert c["first_step_ms"] > 0 and c["steady_step_ms"] > 0
    assert c["pool_bytes"] >= c["reserve_bytes"] > 0
    if "torch" in peers:
        assert mem["torch"]["rss_growth_bytes"] >= 0
    # the machine, the libraries, the BLAS, the environment, the targets
    assert doc["machine"]["usable_cpus"] >= 1 and doc["versions"]["cgru"]
    assert any(lib.get("user_api") == "blas" for lib in doc["blas"]["threadpool_info"])
    assert set(report.OPENBLAS_VARS) <= set(doc["environment"])
    assert doc["validation_failures"] == [] and doc["targets"]
    assert res["other_load_cores"] is None or res["other_load_cores"] >= 0
    assert res["core_probes"] == [] and res["core_spread"] is None      # a 1-thread row
    assert res["sustained_gflops"] == [] and res["sustained_vs_peak"] is None
    out = capsys.readouterr().out
    assert "fb/bound" in out and TINY_SPEC in out and "targets met" in out
    assert "each GEMM of a training step alone" in out and "dW = dgᵀ·X" in out
    assert "PyTorch fb/cgru.torch" in out and "\nGRU\n" in out
    pytest.importorskip("matplotlib")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_reports_a_wrong_system(tmp_path, monkeypatch, capsys):
    init = systems.NumpyFb.__init__

    def wrong(self, p, n):                           # NumPy computes another network
        init(self, _scrambled(problems.Problem(p.config, p.dtype, seed=3)), n)

    monkeypatch.setattr(systems.NumpyFb, "__init__", wrong)
    code, doc, _ = _run_main(tmp_path, "--no-plot",
                             "--skip", "torch,onnxruntime,openvino,jax,memory,alone")
    assert code == 1
    assert {f["system"] for f in doc["validation_failures"]} == {"numpy_fb"}
    (res,) = doc["results"]
    assert "numpy_fb" not in res["systems"]                      # never timed
    assert {"cgru_fwd", "cgru_fb", "bound_fwd", "bound_fb"} <= set(res["systems"])
    assert "VALIDATION FAILED: numpy_fb" in capsys.readouterr().err


def test_sustained_gemm_is_a_rate():
    assert timing.sustained_gemm(1, size=64, calls=2) > 0
    assert timing.sustained_gemm(2, size=64, calls=2, gemm="cgru") > 0


def test_a_two_thread_row_looks_at_each_core_before_and_after(monkeypatch, tmp_path):
    probes = iter([0.0, 0.3, 0.05])          # the run's noise probe, then before and after

    def probe(*args, **kw):
        spread = next(probes)
        return dict(per_core_ms={"0": 1.0, "1": 1.0 + spread}, core_spread=spread,
                    together_ms={"0": 1.0 + spread / 2, "1": 1.0 + spread},
                    together_slowdown=spread / 2)
    monkeypatch.setattr(timing, "core_probe", probe)
    rates = iter([100.0, 150.0])                  # before and after the row's rounds
    monkeypatch.setattr(timing, "sustained_gemm", lambda n, gemm="blas": next(rates))
    monkeypatch.setattr(timing, "gemm_peak",
                        lambda dt, n, **kw: dict(ok=True, gflops=200.0, dtype=dt, threads=n))
    code, doc, _ = _run_main(tmp_path, "--no-plot", "--threads", "2",
                             "--skip", "torch,onnxruntime,openvino,jax,memory,alone,gemms")
    assert code == 0
    (res,) = doc["results"]
    assert res["threads"] == 2 and len(res["core_probes"]) == 2
    assert res["core_spread"] == pytest.approx(0.3)
    assert any("the cores differed by 30 %" in note for note in res["notes"])
    assert res["together_slowdown"] == pytest.approx(0.15)
    assert any("the cores slowed each other by 15 %" in note for note in res["notes"])
    assert res["sustained_gflops"] == [100.0, 150.0]
    assert res["sustained_vs_peak"] == pytest.approx(0.5)
    assert any("SGEMM of tens of ms ran at 50 %" in note for note in res["notes"])
    assert doc["machine_noise"]["core_spread"] == 0.0


# --- 4. optional peers --------------------------------------------------------------------------

def test_missing_peers_are_skipped_with_a_note(monkeypatch, tmp_path, capsys):
    _hide(monkeypatch, "torch", "onnxruntime", "openvino", "jax")
    found, notes = systems.load_peers()
    assert found == {}
    for name in ("torch", "onnxruntime", "openvino", "jax"):
        assert any(n.startswith(name + " not available") for n in notes), name
    problem = problems.Problem(TINY, "float32")
    built, _ = systems.build_systems(problem, 1, found, remote=lambda *a: pytest.fail("remote"))
    assert [s.key for s in built] == ["cgru_fwd", "cgru_fb", "numpy_fb", "bound_fwd",
                                      "bound_fb"]
    # cgru's own systems stay: the Stream on a streaming LSTM config; cgru.torch needs torch
    problem = problems.Problem(_streaming("lstm", 3), "float32")
    built, _ = systems.build_systems(problem, 1, found, remote=lambda *a: pytest.fail("remote"))
    assert [s.key for s in built] == ["cgru_fwd", "cgru_fb", "cgru_stream_fwd", "numpy_fb",
                                      "bound_fwd", "bound_fb"]
    assert all(v["ok"] for v in systems.validate(problem, built, 1).values())
    code, doc, _ = _run_main(tmp_path, "--no-plot", "--skip", "alone")
    assert code == 0
    (res,) = doc["results"]
    assert set(res["systems"]) == {"cgru_fwd", "cgru_fb", "numpy_fb", "bound_fwd", "bound_fb"}
    assert "torch" not in doc["memory"][0] and "cgru" in doc["memory"][0]
    out = capsys.readouterr().out
    assert "note: openvino not available" in out and "note: jax not available" in out


def test_a_worker_without_the_package_reports_it():
    with workers.Worker() as w:
        info = w.request("import", ["no_such_package_for_cgru_bench"])
    assert info["versions"]["no_such_package_for_cgru_bench"].startswith("unavailable")


# --- 5. small parts ---------------------------------------------------------------------------

def test_parse_config():
    assert problems.parse_config("B") == problems.CONFIGS["B"]
    assert problems.parse_config("T32-H256") is problems.CONFIGS["S32"]
    c = problems.parse_config("5x3x4x6x2b")
    assert (c.T, c.N, c.I, c.H, c.L, c.bidirectional, c.cell) == (5, 3, 4, 6, 2, True, "gru")
    assert not problems.parse_config("5x3x4x6x1").bidirectional
    lstm = problems.parse_config("lstm:B")
    assert (lstm.cell, lstm.G, lstm.T, lstm.N, lstm.H) == ("lstm", 4, 100, 32, 256)
    assert problems.parse_config("rnn_relu:5x3x4x6x1").G == 1
    proj = problems.parse_config("lstm:B-P128")
    assert (proj.name, proj.P, proj.S, proj.H, proj.topology.proj_size) == \
        ("lstm:B-P128", 128, 128, 256, 128)
    assert problems.parse_config("lstm:5x3x4x6x2b-P3").P == 3
    assert problems.parse_config("lstm:S1").streaming
    for bad in ("Z", "5x3x4x6", "5x0x4x6x1", "axbxcxdxe", "cnn:B", "", "B-P128",
                "rnn_tanh:B-P64", "lstm:B-P0", "lstm:B-P300"):
        with pytest.raises(ValueError, match="config"):
            problems.parse_config(bad)
    with pytest.raises(SystemExit):
        bench_main.make_parser().parse_args(["--configs", "Z"])


def test_skip_takes_a_list_and_repeats():
    parse = bench_main.make_parser().parse_args
    assert parse(["--skip", "jax,torch", "--skip", "memory"]).skip == ["jax", "torch", "memory"]
    assert parse([]).skip == []
    with pytest.raises(SystemExit):
        parse(["--skip", "jax,nothing"])


def test_flops_match_docs_speed_md():
    # docs/speed.md §3: fwd GEMM flops for the whole stack (M = 1e6, G = 1e9); fb = 3 × fwd
    table = {"A": 78.6e6, "B": 2.52e9, "C": 10.1e9, "D": 0.63e9, "E": 8.81e9, "F": 12.6e9,
             "S1": 0.79e6, "S32": 25.2e6}
    for name, fwd in table.items():
        c = problems.CONFIGS[name]
        assert c.flops("fwd") == pytest.approx(fwd, rel=0.005), name
        assert c.flops("fb") == 3 * c.flops("fwd")
    # 2·T·N·G·H·(in + H) per layer-direction; layer 1 of a bidirectional stack reads 2H
    F = problems.CONFIGS["F"]
    per_dir = 2 * 100 * 32 * 3 * 256
    assert F.flops_fwd() == 2 * per_dir * (256 + 256) + 2 * per_dir * (512 + 256)
    assert problems.parse_config("lstm:F").flops_fwd() * 3 == F.flops_fwd() * 4
    assert problems.parse_config("rnn_tanh:F").flops_fwd() * 3 == F.flops_fwd()
    # a projection P: recurrent products [N, P]·[P, 4H] plus [N, H]·[H, P] per step (§1)
    B, P = problems.parse_config("lstm:B-P128"), 128
    assert B.flops_fwd() == 2 * 100 * 32 * (4 * 256 * (256 + P) + P * 256)
    Fp = problems.parse_config("lstm:F-P64")           # layer 1 reads D·P = 128 inputs
    assert Fp.layer_width(1) == 128
    assert Fp.flops_fwd() == 2 * 2 * 100 * 32 * (4 * 256 * (256 + 64) + 64 * 256) + \
        2 * 2 * 100 * 32 * (4 * 256 * (128 + 64) + 64 * 256)


@pytest.mark.parametrize("spec", ["B", "gru:30x3x5x7x1", "lstm:30x3x5x7x1",
                                  "lstm:30x3x5x8x1-P3", "rnn_tanh:300x4x9x5x1"])
def test_each_gemm_alone_covers_the_step(spec):
    """bench/gemms.py's products: their flops times their calls are the step's GEMM flops
    (one layer-direction configs), and each is timed."""
    problem = problems.Problem(problems.parse_config(spec), "float64")
    c, prods = problem.config, gemms.products(problem)
    assert sum(2 * m * n * k * calls for _, (m, n, k), calls, _ in prods) == \
        pytest.approx(c.flops("fb"), rel=1e-12)
    rows = gemms.rates(problem, peak_gflops=50.0, min_s=0.001)
    assert [r["name"] for r in rows] == [p[0] for p in prods]
    assert all(r["gflops"] > 0 and r["of_peak"] == r["gflops"] / 50.0 for r in rows)


@pytest.mark.parametrize("kind", ["gru", "lstm", "rnn_tanh"])
def test_the_bound_does_the_gemms_of_g_gates(kind):
    try:
        problem = problems.Problem(problems.parse_config(f"{kind}:5x3x4x6x2b"), "float64")
    except ValueError as exc:
        pytest.skip(str(exc))                 # that cell kind is not in this cgru yet
    b = systems.Bound(problem)
    G = problems.CELL_KINDS[kind]
    assert b.layers[1]["dirs"][0]["dW"].shape == (G * 6, 12)
    assert b.check() <= 1e-12
    assert b.calls("fwd") == 4 * (1 + 5) and b.calls("fb") == 4 * (1 + 5) + 4 * (5 + 3)


def test_the_bound_of_an_lstm_with_a_projection():
    problem = problems.Problem(problems.parse_config("lstm:5x3x4x6x2b-P3"), "float64")
    b = systems.Bound(problem)
    a = b.layers[1]["dirs"][1]
    assert a["dW"].shape == (24, 6) and a["dR"].shape == (24, 3) and a["dWp"].shape == (3, 6)
    assert b.check() <= 1e-12
    # per layer-direction: X·Wᵀ, 5 × (h·Rᵀ, m·W_pᵀ); backward 5 × (dh·W_p, dg·R), dW_p, dR,
    # dW, dX
    assert b.calls("fwd") == 4 * (1 + 2 * 5)
    assert b.calls("fb") == 4 * (1 + 2 * 5) + 4 * (2 * 5 + 4)


def test_the_modes_cover_every_cell_kind():
    quick = problems.mode_configs(problems.MODES["quick"])
    kinds = {c.cell for c in quick}
    assert "lstm" in kinds and kinds & {"rnn_tanh", "rnn_relu"} and "gru" in kinds
    assert any(c.streaming for c in quick) and any(c.L > 1 and c.bidirectional for c in quick)
    assert problems.MODES["quick"].dtypes == ("float32",)
    default = problems.MODES["default"]
    names = {c.name for c in problems.mode_configs(default)}
    for kind in ("", "lstm:", "rnn_tanh:"):     # docs/speed.md §7: the same configs A–F, S1, S32
        for shape in ("A", "B", "C", "D", "E", "F", "S1", "S32"):
            assert kind + shape in names
    assert "lstm:B-P128" in names and "rnn_relu:B" in names
    assert set(default.dtypes) == {"float32", "float64"}
    full = {c.name for c in problems.mode_configs(problems.MODES["full"])}
    assert names < full and "DS" in full
    help_text = bench_main.make_parser().format_help()
    assert "lstm:B" in help_text


def test_plan_blocks():
    m = problems.MODES["default"]
    assert timing.plan_blocks(0.001, m, 5) == (25, True, 5)          # at most 25 per block
    assert timing.plan_blocks(0.3, m, 5)[1] is False                 # no untimed call > 0.25 s
    assert timing.plan_blocks(0.3, m, 5)[2] == m.min_blocks
    assert timing.plan_blocks(10 * m.slow_s, m, 5)[2] == 1            # pathologically slow
    assert timing.plan_blocks(0.001, m, 1)[2] == 1                    # --rounds 1
    assert timing.plan_blocks(m.untimed_s * 2, m, 5)[:2] == (1, False)  # no untimed call
    s = timing.stats([0.003, 0.001, 0.002])
    assert (s["median_ms"], s["min_ms"], s["max_ms"], s["n"]) == pytest.approx((2, 1, 3, 3))


def test_measure_interleaves_and_collects_every_sample():
    calls = []

    class Fake(systems.System):
        def __init__(self, key):
            self.key, self.kind = key, "fwd"

        def call(self):
            calls.append(self.key)

    mode = problems.Mode("t", (), (), rounds=3, block_s=0.0, budget_s=1.0, pause_s=0.0,
                         warmup_s=0.0)
    samples = timing.measure([Fake("a"), Fake("b")], mode)
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3}
    assert calls[:4] == ["a", "a", "b", "b"]          # two warm-up calls each
    timed = calls[4:]                                 # then blocks of an untimed + a timed call
    assert timed[:4] == ["a", "a", "b", "b"] and timed[4:8] == ["b", "b", "a", "a"]


def test_gemm_peak_is_checked():
    p = timing.gemm_peak("float64", 1, size=64, calls=2)
    assert p["ok"] and p["err"] < 1e-12 and len(p["samples_ms"]) == 2
    # the faster of the BLAS and cgru's own GEMM, both recorded
    assert p["gemm"] in ("blas", "cgru")
    assert p["gflops"] == max(p["blas_gflops"], p["cgru_gflops"])
    assert timing.flop_limit_ms(2e9, dict(p, gflops=100.0)) == pytest.approx(20.0)
    assert timing.flop_limit_ms(2e9, dict(p, ok=False)) is None


def test_noise_probe_times_each_core_and_restores_the_affinity(monkeypatch):
    import os
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    pinned = []
    if before is not None:
        real = os.sched_setaffinity

        def recording(pid, cpus):
            pinned.append(set(cpus))
            real(pid, cpus)
        monkeypatch.setattr(os, "sched_setaffinity", recording)
    n = timing.noise_probe(calls=4, size=32)
    assert n["median_ms"] > 0 and n["spread"] >= 0
    if before is None or len(before) < 2:
        assert n["per_core_ms"] is None and n["core_spread"] is None
        assert n["together_ms"] is None and n["together_slowdown"] is None
        return
    assert sorted(n["per_core_ms"]) == sorted(str(c) for c in before)
    k = len(before)        # each core in turn, the affinity restored, then one thread each
    assert pinned[:k + 1] == [{c} for c in sorted(before)] + [set(before)]
    assert sorted(min(p) for p in pinned[k + 1:]) == sorted(before)
    assert all(len(p) == 1 for p in pinned[k + 1:])
    assert n["core_spread"] == pytest.approx(
        max(n["per_core_ms"].values()) / min(n["per_core_ms"].values()) - 1)
    assert os.sched_getaffinity(0) == before
    # the job on every core at once, one thread pinned to each, against each alone
    assert sorted(n["together_ms"]) == sorted(n["per_core_ms"])
    assert n["together_slowdown"] == pytest.approx(max(
        n["together_ms"][c] / n["per_core_ms"][c] for c in n["per_core_ms"]) - 1)


def test_cgru_alone_runs_nothing_else():
    """cgru's own process: validated (the training step bitwise the main process's), nothing
    else imported there, its systems timed by the same interleaved rounds as any other (here
    alone), its first training step's peak memory measured first."""
    from bench.__main__ import _Alone
    problem = problems.Problem(TINY, "float64", seed=5)
    mode = problems.Mode("t", (), (), rounds=1, block_s=0.0, budget_s=0.1, pause_s=0.0,
                         warmup_s=0.0)
    ref = systems.cgru_reference(problem, 1)
    a = _Alone(problem, 1, ref, True, None)
    assert {s.key for s in a.good} == {"cgru_fwd_alone", "cgru_fb_alone"}
    assert all(v["ok"] for v in a.validation.values()), a.validation
    fb = next(s for s in a.good if s.key == "cgru_fb_alone")
    assert systems.compare(fb.outputs(), ref[1], 0.0)[0]               # bitwise the same
    rec = a.result(timing.measure(a.good, mode), None)
    assert set(rec["systems"]) == {"cgru_fwd", "cgru_fb"} and rec["interleaved"]
    assert a.worker.proc.poll() is not None                            # its own: closed
    m = rec["memory"]
    assert m["peak_over_minimum"] >= 1.0 and m["pool_bytes"] >= m["reserve_bytes"]
    assert m["steady_rss_growth_bytes"] is None or m["steady_rss_growth_bytes"] >= 0
    # a streaming LSTM: the Stream too, validated; one worker serves both thread counts
    problem = problems.Problem(_streaming("lstm", 4), "float32", seed=5)
    ref = systems.cgru_reference(problem, 1)
    with workers.Worker() as w:
        for n in (1, 2):
            a = _Alone(problem, n, ref, False, w)
            assert all(v["ok"] for v in a.validation.values()), a.validation
            assert {s.key for s in a.good} == {"cgru_fwd_alone", "cgru_fb_alone",
                                                "cgru_stream_fwd_alone"}
            rec = a.result(timing.measure(a.good, mode), None)
            assert set(rec["systems"]) == {"cgru_fwd", "cgru_fb", "cgru_stream_fwd"}
            assert rec["pid"] == w.pid and w.proc.poll() is None


def _row(config, N, threads, *, T=100, dtype="float32", fb=10.0, fb_alone=None, fwd=3.0,
         **ratios):
    r = dict(config=config, dtype=dtype, threads=threads, shape=dict(T=T, N=N),
             systems={"cgru_fb": {"median_ms": fb}, "cgru_fwd": {"median_ms": fwd}},
             ratios=ratios)
    if fb_alone is not None:
        r["alone"] = dict(systems={"cgru_fb": {"median_ms": fb_alone},
                                   "cgru_fwd": {"median_ms": fwd}})
    return r


def test_targets():
    rows = [
        _row("B", 32, 1, fb=10.0, fb_alone=11.0, **{
            "cgru_fb_alone/flop_limit_fb": 1.1, "cgru_fb_alone/bound_fb": 0.95,
            "cgru_fb/bound_fb": 0.5,                       # in-process: not the one used
            "torch_fb/cgru_fb_alone": 2.6, "jax_fb/cgru_fb_alone": 1.4,
            "ort_fwd/cgru_fwd_alone": 1.0, "openvino_fwd/cgru_fwd_alone": 0.99}),
        _row("B", 32, 2, fb=5.0, fb_alone=6.0, **{"cgru_fb_alone/bound_fb": 0.8}),
        _row("A", 1, 1, fb=2.0, **{"cgru_fb/bound_fb": 2.0, "torch_fb/cgru_fb": 3.0}),
    ]
    s1 = _row("S1", 1, 1, T=1, fb=0.1)
    s1["streaming"] = dict(overhead_us=29.0)
    rows.append(s1)
    s1s = _row("lstm:S1", 1, 1, T=1, fb=0.1)     # the Stream's overhead is the one that counts
    s1s["streaming"] = dict(overhead_us=80.0, stream_overhead_us=12.0)
    rows.append(s1s)
    memory = [dict(config="B", dtype="float32", cgru=dict(peak_over_minimum=1.25)),
              dict(config="S1", dtype="float32", cgru=dict(peak_over_minimum=1.1))]
    got = {(t["config"], t["threads"], t["target"]): t["ok"]
           for t in report.targets(rows, memory)}
    assert got == {
        ("B", 1, "training / FLOP limit"): True,              # 1.1 ≤ 1.15
        ("B", 1, "training / GEMM-only bound"): False,        # 0.95 (alone), not 0.5
        ("B", 1, "PyTorch training / cgru training"): True,   # 2.6 ≥ 2.5
        ("B", 1, "JAX training / cgru training"): False,      # 1.4 < 1.5
        ("B", 1, "onnxruntime fwd / cgru fwd"): True,         # 1.0 ≥ 1.0
        ("B", 1, "OpenVINO fwd / cgru fwd"): False,           # 0.99
        ("B", 2, "training / GEMM-only bound"): True,         # 0.8
        ("B", 2, "1-thread / 2-thread training"): True,       # 11 / 6 = 1.83 (alone figures)
        ("A", 1, "PyTorch training / cgru training"): True,   # no alone figure: in-process
        ("S1", 1, "streaming per-call overhead (µs)"): True,  # 29 ≤ 30
        ("lstm:S1", 1, "streaming per-call overhead (µs)"): True,  # the Stream's 12
        ("B", None, "peak memory / (reserve + inputs + outputs)"): False,
        ("S1", None, "peak memory / (reserve + inputs + outputs)"): True,
    }
    speedup = [t for t in report.targets(rows) if t["target"].startswith("1-thread")]
    assert speedup[0]["value"] == pytest.approx(11.0 / 6.0)     # cgru alone at 1 and 2 threads
    assert "missed" in report.format_targets(report.targets(rows, memory))


def _target(name, config, value, ok, threads=1, dtype="float32", limit=1.0):
    return dict(target=name, config=config, dtype=dtype, threads=threads, value=value,
                limit=limit, op=">=", ok=ok)


def test_compare_says_how_far_two_runs_agree():
    """``--compare``'s figures: per target and thread count the second run's value over the
    first's (a time in µs: the difference), its median, and how many ratios lie within 5 % and
    10 %; the targets met in one run only; targets one run lacks are counted, not compared."""
    pt, fl, us = ("PyTorch training / cgru training", "training / FLOP limit",
                  "streaming per-call overhead (µs)")
    mem = "peak memory / (reserve + inputs + outputs)"
    first = [_target(pt, "A", 1.00, True), _target(pt, "B", 2.00, True),
             _target(pt, "C", 1.00, True), _target(pt, "D", 1.00, False, threads=2),
             _target(fl, "B", 1.10, True), _target(us, "S1", 10.0, True),
             _target(mem, "B", 1.3, False, threads=None), _target(pt, "E", 1.0, True),
             _target(pt, "F", 1.0, True)]
    second = [_target(pt, "A", 1.02, True), _target(pt, "B", 2.60, True),
              _target(pt, "C", 1.08, False),             # met in the first run only
              _target(pt, "D", 0.90, False, threads=2), _target(fl, "B", 1.10, True),
              _target(us, "S1", 12.5, True), _target(mem, "B", 1.3, False, threads=None),
              _target(pt, "F", None, True),              # not measured: not compared
              _target(pt, "G", 1.0, True)]               # only in the second run
    c = report.compare(first, second)
    by = {(r["target"], r["threads"]): r for r in c["targets"]}
    r = by[(pt, 1)]                                      # ratios 1.02, 1.3, 1.08
    assert r["n"] == 3 and r["median"] == pytest.approx(1.08) and r["within"] == [1, 2]
    assert by[(pt, 2)]["within"] == [0, 1] and by[(pt, 2)]["median"] == pytest.approx(0.9)
    assert by[(fl, 1)]["within"] == [1, 1]
    assert by[(us, 1)]["median"] == pytest.approx(2.5) and by[(us, 1)]["within"] is None
    assert by[(mem, None)]["median"] == 1.0
    assert [(f["target"], f["config"], f["first"], f["second"]) for f in c["flips"]] == \
        [(pt, "C", 1.0, 1.08)]
    assert c["met"] == (7, 6) and c["only_in"] == (1, 1)
    text = report.format_compare(c, ("one.json", "two.json"))
    assert "first: one.json (7 targets met)" in text and "met in one run only: 1" in text
    assert "C f32 1T 1 → 1.08 (limit 1)" in text and "second − first: median +2.5" in text
    # the same run twice agrees exactly
    same = report.compare(first, first)
    assert not same["flips"] and all(r["within"] is None or r["within"][0] == r["n"]
                                     for r in same["targets"])


def test_compare_from_the_command_line(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"targets": [_target("training / FLOP limit", "B", 1.1, True)]}))
    b.write_text(json.dumps({"targets": [_target("training / FLOP limit", "B", 1.2, False)]}))
    assert bench_main.main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "met in one run only: 1" in out and "B f32 1T 1.1 → 1.2" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"results": []}))
    assert bench_main.main(["--compare", str(a), str(bad)]) == 2
    assert "bad.json is not the JSON of a bench run" in capsys.readouterr().err
    assert bench_main.main(["--compare", str(tmp_path / "missing.json"), str(a)]) == 2
    assert "cannot read" in capsys.readouterr().err
    odd = tmp_path / "odd.json"                  # a list of targets, one of them not a record
    odd.write_text(json.dumps({"targets": [_target("training / FLOP limit", "B", 1.1, True),
                                           {"target": "training / FLOP limit"}]}))
    assert bench_main.main(["--compare", str(a), str(odd)]) == 2
    err = capsys.readouterr().err
    assert "odd.json: 1 of its targets are not target records" in err and "config" in err
    odd.write_text(json.dumps({"targets": [_target("training / FLOP limit", "B", "1.1", True)]}))
    assert bench_main.main(["--compare", str(a), str(odd)]) == 2
    assert "not target records" in capsys.readouterr().err


def test_derive_ratios_and_streaming_overhead():
    r = dict(systems={"cgru_fwd": {"median_ms": 0.10}, "bound_fwd": {"median_ms": 0.02},
                      "ort_fwd": {"median_ms": 0.05}, "cgru_fb": {"median_ms": 1.0},
                      "bound_fb": {"median_ms": 0.8}, "torch_fb": {"median_ms": 3.0},
                      "cgru_torch_fb": {"median_ms": 1.2},
                      "cgru_stream_fwd": {"median_ms": 0.04}},
             alone=dict(systems={"cgru_fwd": {"median_ms": 0.12},
                                 "cgru_fb": {"median_ms": 1.1},
                                 "cgru_stream_fwd": {"median_ms": 0.035}}),
             flop_limit_ms={"fwd": 0.01, "fb": 0.5})
    report.derive(r)
    q = r["ratios"]
    assert q["cgru_fb_alone/bound_fb"] == pytest.approx(1.1 / 0.8)
    assert q["cgru_fb_alone/flop_limit_fb"] == pytest.approx(2.2)
    assert q["ort_fwd/cgru_fwd_alone"] == pytest.approx(0.05 / 0.12)
    assert q["ort_fwd/cgru_fwd"] == pytest.approx(0.5)
    assert r["streaming"]["overhead_us"] == pytest.approx(100.0)     # 120 µs − 20 µs
    assert r["streaming"]["stream_overhead_us"] == pytest.approx(15.0)  # 35 µs − 20 µs (alone)
    assert report.streaming_overhead(r) == pytest.approx(15.0)
    assert q["torch_fb/cgru_torch_fb"] == pytest.approx(2.5)
    assert q["cgru_torch_fb/cgru_fb_alone"] == pytest.approx(1.2 / 1.1)
    assert q["cgru_stream_fwd_alone/cgru_fwd_alone"] == pytest.approx(0.035 / 0.12)
    assert not any(math.isnan(v) for v in q.values())


def test_env_note_names_the_command():
    assert report.env_note({"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None}) is None
    note = report.env_note({"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": None})
    assert "OPENBLAS_CORETYPE=Haswell" in note and report.RECOMMENDED in note
    note = report.env_note({"OPENBLAS_L2_SIZE": "1024"}, ["--quick"])
    assert note.endswith(report.RECOMMENDED + " --quick")


def test_entry_points_exist():
    import cgru.__main__ as cli
    assert callable(bench_main.main) and "bench" in cli.bench.__doc__
    assert np.isfinite(systems.call_overhead_s("float32", repeats=10, batches=1))


def test_the_run_times_are_quoted_alike():
    """How long ``--quick`` and a default run take: one figure each (``Mode.about``), which
    the help, the README and docs/speed.md quote."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    speed = open(os.path.join(ROOT, "docs", "speed.md"), encoding="utf-8").read()
    help_text = bench_main.make_parser().format_help()
    quick, default = problems.MODES["quick"].about, problems.MODES["default"].about
    assert quick and default and quick != default
    assert quick in " ".join(help_text.split())
    for doc in (readme, speed):
        lines = [ln for ln in doc.splitlines() if "python -m cgru bench" in ln and "#" in ln]
        quoted = {("--quick" in ln, ln.split("#", 1)[1]) for ln in lines}
        assert quoted and all((quick if q else default) in c for q, c in quoted), quoted


def test_results_go_to_the_stated_directory(tmp_path, monkeypatch):
    """Without --out/--json/--plot a run writes under the user's cache directory, never the
    current directory; --out moves both files, --json/--plot each one."""
    def paths(*argv):
        return bench_main.output_paths(bench_main.make_parser().parse_args(list(argv)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "cgru" / "bench"
    assert paths("--quick") == (str(cache / "bench.json"), str(cache / "bench.png"))
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = tmp_path / "home" / ".cache" / "cgru" / "bench"
    assert paths() == (str(home / "bench.json"), str(home / "bench.png"))
    out = tmp_path / "o"
    assert paths("--out", str(out)) == (str(out / "bench.json"), str(out / "bench.png"))
    assert paths("--out", str(out), "--plot", "p.png") == (str(out / "bench.json"), "p.png")


# --- paced calls (bench/paced.py) ------------------------------------------------------------
def test_paced_calls_validate_first_and_time_every_system_in_turn(peers, capsys):
    """``python -m bench.paced`` on the streaming configs: every forward system of the main
    bench that runs in-process (the peers present) is validated against cgru, then each gets
    the same number of paced calls and calls in a row, one line each; a system that failed
    its validation is not timed."""
    from bench import paced
    problem = problems.Problem(problems.parse_config("S1"), "float32")
    entries = paced.paced_systems(problem, 1, peers)
    keys = {s.key for s, _ in entries}
    assert {"cgru_fwd", "cgru_stream_fwd"} <= keys
    assert not keys & {"bound_fwd", "jax_fb"} and all(s.kind == "fwd" for s, _ in entries)
    assert all(rec["ok"] for _, rec in entries), entries
    calls = []
    for s, _ in entries:
        s.call = (lambda f, k: lambda: calls.append(k) or f())(s.call, s.key)
    wrong = systems.CgruFwd(problem, 1)
    wrong.key, wrong.outputs = "wrong_fwd", lambda: {"y": np.zeros(1), "hy": np.zeros(1)}
    got = paced.measure(entries + [(wrong, dict(ok=False))], calls=3, pause_s=0.0)
    assert set(got) == keys
    assert all(len(v["paced"]) == len(v["in_row"]) == 3 for v in got.values())
    n = len(keys)   # two warm-up calls each, then the paced calls turn by turn
    assert calls[2 * n:5 * n] == [s.key for s, _ in entries] * 3
    med, p90, worst, in_row = paced.summary(got["cgru_fwd"])
    assert 0 < med <= p90 <= worst and in_row > 0

    paced.main(["--configs", "S1", "--calls", "2", "--pause-ms", "0", "--threads", "1",
                "--skip", "openvino"])
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.startswith("S1 ")]
    assert {r[2] for r in rows} >= {"cgru_fwd", "cgru_stream_fwd"}
    assert "openvino_fwd" not in out and all(len(r) == 7 for r in rows), out
