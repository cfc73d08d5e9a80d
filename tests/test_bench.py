"""The benchmark's correctness machinery (cgru/_bench.py) on tiny problems; timings are never
asserted.

1. Every system it times agrees with cgru on a tiny 2-layer bidirectional stack, both dtypes.
2. A system that computes something else fails validation (so validation can fail).
3. ``main`` end to end: the JSON holds every figure and the plot is written; a failed
   validation gives exit code 1 and leaves the failing systems untimed.
4. Config parsing, the OpenBLAS note, the PERF.md target checks.
"""
import json

import pytest

from cgru import _bench

TINY = _bench.Config("tiny", T=5, N=3, I=4, H=6, L=2, bidirectional=True)
TINY_SPEC = "5x3x4x6x2b"


@pytest.fixture(scope="module")
def peers():
    return _bench.load_peers()[0]


# --- 1. validation of every system -------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_system_agrees_with_cgru(peers, dtype):
    problem = _bench.Problem(TINY, dtype, seed=3)
    systems, _ = _bench.build_systems(problem, 1, peers)
    checks = _bench.validate(problem, systems, 1)
    expected = {"cgru_fwd", "cgru_fb", "bound_fwd", "bound_fb"}
    if dtype == "float32":
        expected.add("numpy_fb")
    if "torch" in peers:
        expected |= {"torch_fwd", "torch_fb"}
    if "onnxruntime" in peers and dtype == "float32":
        expected.add("ort_fwd")
    assert set(checks) == expected
    bad = {k: v for k, v in checks.items() if not v["ok"]}
    assert not bad
    # the peers were really compared (an error of exactly 0 would mean cgru vs itself)
    for key in expected - {"cgru_fwd", "cgru_fb", "bound_fwd", "bound_fb"}:
        assert 0 < checks[key]["err"] <= checks[key]["tol"], key


def test_peers_are_present_for_the_ci():
    pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    peers, notes = _bench.load_peers()
    assert {"torch", "onnxruntime"} <= set(peers) and not notes


# --- 2. validation can fail --------------------------------------------------------------------

def test_a_wrong_system_fails_validation():
    problem = _bench.Problem(TINY, "float32", seed=3)
    other = _bench.Problem(TINY, "float32", seed=3)
    lp = other.params[1]
    lp.R[:] = lp.R[::-1].copy()          # layer 0, reverse direction: rows of R scrambled
    right = _bench.validate(problem, [_bench._NumpyFb(problem)], 1)["numpy_fb"]
    wrong = _bench.validate(problem, [_bench._NumpyFb(other)], 1)["numpy_fb"]
    assert right["ok"] and 0 < right["err"]
    assert not wrong["ok"] and wrong["err"] > 10 * wrong["tol"]


def test_a_crashing_system_fails_validation():
    problem = _bench.Problem(TINY, "float32")

    class Broken(_bench.System):
        key, kind = "broken", "fwd"

        def call(self):
            raise RuntimeError("boom")

        def outputs(self):
            return {"y": self.call()}

    checks = _bench.validate(problem, [Broken()], 1)
    assert not checks["broken"]["ok"] and "boom" in checks["broken"]["worst"]


# --- 3. main end to end -----------------------------------------------------------------------

def _run_main(tmp_path, *extra):
    out_json = tmp_path / "r" / "bench.json"
    out_png = tmp_path / "r" / "bench.png"
    code = _bench.main(["--configs", TINY_SPEC, "--threads", "1", "--dtypes", "float32",
                        "--rounds", "1", "--json", str(out_json), "--plot", str(out_png),
                        *extra])
    return code, json.loads(out_json.read_text()), out_png


def test_main_writes_every_figure(tmp_path, capsys):
    code, doc, png = _run_main(tmp_path)
    assert code == 0
    (res,) = doc["results"]
    assert (res["config"], res["dtype"], res["threads"]) == ("5x3x4x6x2b", "float32", 1)
    assert all(v["ok"] for v in res["validation"].values())
    assert set(res["systems"]) == set(res["validation"])
    for key, rec in res["systems"].items():
        assert rec["n"] == len(rec["samples_ms"]) >= 1
        if key.startswith("bound"):   # the bound is the raw time minus the call overhead
            assert 0 < rec["median_ms"] <= rec["raw_median_ms"]
        else:
            assert 0 < rec["min_ms"] <= rec["median_ms"] <= rec["max_ms"]
    assert res["systems"]["bound_fb"]["gemm_calls"] == 2 * 2 * (5 + 1) + 2 * 2 * (5 + 3)
    assert "cgru_fb/bound" in res["ratios"] and "numpy_fb/cgru_fb" in res["ratios"]
    assert doc["machine"]["usable_cpus"] >= 1 and doc["versions"]["cgru"]
    assert any(lib.get("user_api") == "blas" for lib in doc["threadpool_info"])
    assert set(_bench.OPENBLAS_VARS) <= set(doc["environment"])
    assert doc["validation_failures"] == []
    assert res["other_load_cores"] is None or res["other_load_cores"] >= 0
    out = capsys.readouterr().out
    assert "fb/bound" in out and "5x3x4x6x2b" in out
    pytest.importorskip("matplotlib")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_reports_a_failed_validation(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(_bench.TOL, "float32", -1.0)     # nothing can pass
    code, doc, _ = _run_main(tmp_path, "--no-plot")
    assert code == 1
    failed = {f["system"] for f in doc["validation_failures"]}
    assert "cgru_fb" in failed and "numpy_fb" in failed
    (res,) = doc["results"]
    assert not failed & set(res["systems"])              # never timed silently
    assert "VALIDATION FAILED" in capsys.readouterr().err


# --- 4. small parts ---------------------------------------------------------------------------

def test_parse_config():
    assert _bench.parse_config("B") == _bench.CONFIGS["B"]
    c = _bench.parse_config("5x3x4x6x2b")
    assert (c.T, c.N, c.I, c.H, c.L, c.bidirectional) == (5, 3, 4, 6, 2, True)
    assert not _bench.parse_config("5x3x4x6x1").bidirectional
    for bad in ("Z", "5x3x4x6", "5x0x4x6x1", "axbxcxdxe"):
        with pytest.raises(ValueError, match="config"):
            _bench.parse_config(bad)


def test_flops_match_perf_md():
    # 2·T·N·3H·(I + H) per layer-direction; layer 1 of a bidirectional stack reads 2H
    c = _bench.CONFIGS["F"]
    per_dir = 2 * 100 * 32 * 768
    assert c.flops_fwd() == 2 * per_dir * (256 + 256) + 2 * per_dir * (512 + 256)


def test_env_note_names_the_command():
    assert _bench._env_note({"OPENBLAS_CORETYPE": None, "OPENBLAS_L2_SIZE": None}) is None
    note = _bench._env_note({"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": None})
    assert "OPENBLAS_CORETYPE=Haswell" in note and _bench.RECOMMENDED in note
    note = _bench._env_note({"OPENBLAS_L2_SIZE": "1024"}, ["--quick"])
    assert note.endswith("env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m cgru bench --quick")


def test_targets():
    def res(name, N, threads, fb, bound, torch_fb):
        return dict(config=name, shape=dict(N=N), dtype="float32", threads=threads,
                    systems={"cgru_fb": {"median_ms": fb}},
                    ratios={"cgru_fb/bound": fb / bound, "torch_fb/cgru_fb": torch_fb / fb})
    rs = [res("B", 32, 1, 10.0, 9.5, 25.0), res("B", 32, 2, 6.5, 6.0, 12.0),
          res("A", 1, 1, 1.2, 1.0, 3.0)]
    got = {(t["config"], t["threads"], t["target"]): t["ok"] for t in _bench.targets(rs)}
    bound, torch, speedup = "cgru fb / bound ≤", "PyTorch fb / cgru fb ≥", \
        "cgru fb speed-up 2T/1T ≥"
    assert got == {("B", 1, bound): True, ("B", 1, torch): True,          # 1.05, 2.5
                   ("B", 2, bound): True, ("B", 2, torch): False,         # 1.08, 1.85
                   ("B", 2, speedup): False,                              # 1.54
                   ("A", 1, bound): True, ("A", 1, torch): True}          # 1.2 ≤ 1.3, 2.5
