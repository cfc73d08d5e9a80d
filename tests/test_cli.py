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


def _help(capsys, *args):
    """What ``python -m cgru ARGS`` prints and its exit code, run in this process."""
    import pytest
    from cgru.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out = capsys.readouterr()
    return e.value.code, out.out + out.err


def test_help_is_plain_text_and_names_every_option(capsys):
    """The top-level help reads in a terminal (no reST markup) and names every command and
    every option the CLI takes, including the ones dispatched before argparse."""
    code, text = _help(capsys, "--help")
    assert code == 0
    assert "``" not in text and ":func:" not in text, text
    for word in ("info", "demo", "bench", "--cflags", "--libs", "--tf-kernels", "--version"):
        assert word in text, word


def test_every_command_has_its_own_help(capsys):
    """``python -m cgru CMD --help`` describes CMD (not the top-level help) and exits 0."""
    for command in ("info", "demo", "bench"):
        if command == "bench" and not _beside_bench():
            continue                     # an installed wheel: the next test
        code, text = _help(capsys, command, "--help")
        assert code == 0, command
        assert text.startswith(f"usage: python -m cgru {command}"), text[:200]
        assert "``" not in text, command


def _beside_bench(package_file=None):
    """Whether the cgru under test sits in a checkout, beside the repository's bench/."""
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(package_file or cgru.__file__)))
    return os.path.isfile(os.path.join(root, "bench", "__main__.py"))


def test_bench_outside_a_checkout_says_where_the_bench_is(capsys, monkeypatch, tmp_path):
    """An installed wheel has no bench/: ``python -m cgru bench`` says so and exits 2."""
    from cgru import __main__ as cli
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "cgru" / "__main__.py"))
    assert not _beside_bench(cli.__file__)
    assert cli.main(["bench", "--help"]) == 2
    assert "part of the source repository" in capsys.readouterr().err


def test_an_unbuilt_checkout_says_how_to_build(tmp_path):
    """cgru's Python files without the compiled modules (a fresh clone): the pure-Python parts
    import, and anything needing the kernels says to run pip install -e . first, rather than
    "cannot import name 'blas' from 'cgru._kernels'"."""
    import os
    import shutil
    src = os.path.dirname(cgru.__file__)
    shutil.copytree(src, tmp_path / "cgru", ignore=shutil.ignore_patterns(
        "*.so", "*.pyd", "*.c", "__pycache__", "*.dll", "*.dylib"))
    code = ("import cgru, cgru.core.reference\n"
            "net = cgru.Network.random(cgru.Topology(2, 3), 'float64', seed=0)\n"
            "for name in ('cgru.forward', 'cgru.tf'):\n"
            "    try:\n"
            "        exec('import cgru.tf' if name == 'cgru.tf' else 'cgru.forward')\n"
            "    except ImportError as e:\n"
            "        print(name, '->', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [ln.split(" -> ")[0] for ln in lines] == ["cgru.forward", "cgru.tf"], p.stdout
    for line in lines:
        assert "pip install -e ." in line and "not built" in line, line
