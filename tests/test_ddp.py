"""``DistributedDataParallel`` over 2 local CPU processes (gloo) with a cgru GRU.

Runs ``examples/ddp_train.py`` (2 ranks spawned by the script, gloo on 127.0.0.1, a free port;
each rank trains on its half of one batch and saves its per-step gradients and weights) and
checks them against a single process training the same model on the whole batch: DDP's
averaged gradients and the updated weights are those of the whole batch, to round-off, and
identical on both ranks.  Bounded in time: ``init_process_group`` has a 60 s timeout, and the
whole run is killed (its process group) after ``TIMEOUT`` seconds.
"""
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ddp_train.py"
TIMEOUT = 240
STEPS = 3
TOL = {"float32": 5e-5, "float64": 1e-12}     # max |Δ| relative to max |single-process value|


def example_module():
    spec = importlib.util.spec_from_file_location("ddp_train", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(*args):
    """``python examples/ddp_train.py *args`` → its stdout; killed after ``TIMEOUT`` s, first
    with SIGABRT, on which every process of the run (``PYTHONFAULTHANDLER``) prints the Python
    stack of each of its threads: the failure then says where the run hung."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)    # the example and the ranks it spawned
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        else:
            try:
                os.killpg(proc.pid, signal.SIGKILL)     # any rank left
            except ProcessLookupError:
                pass
        pytest.fail(f"examples/ddp_train.py did not finish within {TIMEOUT} s; the stacks of "
                    f"its processes:\n{err[-12000:]}")
    assert proc.returncode == 0, f"examples/ddp_train.py failed:\n{err[-3000:]}"
    return out


def close(got, want, tol, what):
    scale = max(want.abs().max().item(), 1e-30)
    err = (got - want).abs().max().item()
    assert err <= tol * scale, f"{what}: max |Δ| = {err:.3g} > {tol} × {scale:.3g}"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_ddp_equals_single_process(dtype, tmp_path):
    prefix = tmp_path / "run"
    out = run_example("--steps", str(STEPS), "--dtype", dtype, "--save", str(prefix))
    ranks = [torch.load(f"{prefix}.rank{r}.pt") for r in range(2)]

    ex = example_module()
    model = ex.make_model(getattr(torch, dtype))
    x, target = ex.make_batch(getattr(torch, dtype))
    single = ex.train(model, x, target, STEPS)
    names = [n for n, _ in model.named_parameters()]

    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(lines) == STEPS, out
    for step, (loss, grads, weights) in enumerate(single):
        printed = float(lines[step].rsplit(" ", 1)[1])
        assert abs(printed - loss.item()) <= 1e-5 * loss.item() + 1e-6, lines[step]
        for r, history in enumerate(ranks):
            _, rank_grads, rank_weights = history[step]
            for name, a, b in zip(names, rank_grads, grads):
                close(a, b, TOL[dtype], f"rank {r} step {step + 1} grad {name}")
            for name, a, b in zip(names, rank_weights, weights):
                close(a, b, TOL[dtype], f"rank {r} step {step + 1} {name}")
        for a, b in zip(ranks[0][step][2], ranks[1][step][2]):
            assert torch.equal(a, b), "the ranks' weights differ"
