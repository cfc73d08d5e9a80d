"""``python -m cgru``: the demo (the README's first command) checks every gradient and says OK;
``info`` and ``--version`` describe the installed build."""
import re
import subprocess
import sys

import cgru


def _run(*args):
    return subprocess.run([sys.executable, "-m", "cgru", *args], capture_output=True, text=True,
                          timeout=300)


def test_demo_checks_every_kind_and_says_ok():
    p = _run("demo")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out.rstrip().endswith("OK"), out
    for label in ("bidirectional GRU", "LSTM, projection", "ReLU RNN"):
        line = next(l for l in out.splitlines() if label in l)
        err = float(re.search(r"largest relative error ([0-9.e+-]+)", line).group(1))
        assert err < 1e-7, line
    assert "reserve" in out and "weight gradients" in out


def test_version_and_info():
    p = _run("--version")
    assert p.returncode == 0 and p.stdout.strip().endswith(cgru.__version__), p.stdout
    p = _run("info")
    assert p.returncode == 0, p.stderr
    assert f"cgru {cgru.__version__}" in p.stdout and "blas" in p.stdout.lower()


def test_unknown_command_is_an_error():
    p = _run("frobnicate")
    assert p.returncode != 0 and "invalid choice" in p.stderr
