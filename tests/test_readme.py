"""The README's code runs as written: every ```python block is executed in a fresh process (in
a scratch directory, in README order within its section), and the C block is the example the C
ABI tests build and run."""
import os
import re
import subprocess
import sys

import pytest
from conftest import package_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

# The optional packages (pip names) a block may use, by the top-level module they import as:
# the block is skipped when one is missing, as the tests that need them are, unless
# CGRU_TEST_REQUIRE_OPTIONAL is set (CI, which installs them all): then it fails.
OPTIONAL = {"torch": "torch", "onnx": "onnx", "onnxruntime": "onnxruntime",
            "onnxscript": "onnxscript", "tensorflow": "tensorflow", "keras": "keras",
            "tf_keras": "tf_keras", "matplotlib": "matplotlib", "jax": "jax",
            "openvino": "openvino"}
REQUIRE_OPTIONAL = bool(os.environ.get("CGRU_TEST_REQUIRE_OPTIONAL"))

# Runs a block as __main__, then writes the top-level modules it loaded (as JSON) to argv[2].
_RUNNER = """import json, runpy, sys
try:
    runpy.run_path(sys.argv[1], run_name="__main__")
finally:
    with open(sys.argv[2], "w") as f:
        json.dump(sorted({m.split(".")[0] for m in list(sys.modules)}), f)
"""


def _blocks(lang):
    """(line number, code) of each fenced block of ``lang`` in the README."""
    text = open(README, encoding="utf-8").read()
    out = []
    for m in re.finditer(r"^```" + lang + r"[ \t]*\n(.*?)^```", text, re.M | re.S):
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1)))
    return out


PY_BLOCKS = _blocks("python")


def test_the_readme_has_python_examples():
    assert len(PY_BLOCKS) >= 5


def _needs(code):
    """The optional modules a block imports (and onnxscript for torch's ONNX exporter)."""
    import ast
    mods = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            mods.add(node.module.split(".")[0])
    if "torch.onnx.export" in code:
        mods.add("onnxscript")
    return sorted(m for m in mods if m in OPTIONAL)


def _named_before(line):
    """The README's prose (outside code blocks) from the heading above ``line`` to it."""
    prose, fenced = [], False
    for ln in open(README, encoding="utf-8").read().splitlines()[:line - 1]:
        if ln.startswith("```"):
            fenced = not fenced
        elif not fenced:
            prose = [] if ln.startswith("#") else prose + [ln]
    return "\n".join(prose)


def _missing(mod):
    import importlib.util
    return importlib.util.find_spec(mod) is None


def _loaded(path):
    import json
    return json.loads(path.read_text())


# Optional packages that another one loads by itself where they are installed (TensorFlow's
# saved_model and tf.function load keras, which loads jax and matplotlib if present): not the
# example's own needs.
PULLED_IN_BY = {"tensorflow": ("keras", "tf_keras", "jax", "matplotlib")}


@pytest.mark.parametrize("line,code", PY_BLOCKS, ids=[f"README.md:{n}" for n, _ in PY_BLOCKS])
def test_readme_python_block_runs(line, code, tmp_path):
    """The block runs as written, and the README names, before it, every optional package it
    loads ("needs `onnxscript`, …"): checked on the modules the run actually loaded."""
    for mod in _needs(code):
        if _missing(mod):
            if REQUIRE_OPTIONAL:
                pytest.fail(f"README.md:{line} needs {OPTIONAL[mod]}, which is not installed "
                            f"(CGRU_TEST_REQUIRE_OPTIONAL is set)")
            pytest.skip(f"README.md:{line} needs {OPTIONAL[mod]}")
    script, runner, loaded = tmp_path / "snippet.py", tmp_path / "run.py", tmp_path / "mods"
    script.write_text(code, encoding="utf-8")
    runner.write_text(_RUNNER, encoding="utf-8")
    env = package_env()
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:__main__",
                           str(runner), str(script), str(loaded)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (f"README.md:{line} failed:\n{code}\n--- stdout\n"
                                  f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
    direct = set(_needs(code))
    pulled = {m for d in direct for m in PULLED_IN_BY.get(d, ())} - direct
    used = sorted(set(_loaded(loaded)) & set(OPTIONAL) - pulled)
    prose = _named_before(line)
    unnamed = [OPTIONAL[m] for m in used if f"`{OPTIONAL[m]}`" not in prose]
    assert not unnamed, (f"README.md:{line} loads {', '.join(unnamed)}: name them before the "
                         f"block (\"needs `{'`, `'.join(unnamed)}`\")")


def test_readme_c_example_is_the_tested_example():
    blocks = _blocks("c")
    assert len(blocks) == 1, "the README shows one C program: examples/gru_forward.c"
    example = open(os.path.join(ROOT, "examples", "gru_forward.c"), encoding="utf-8").read()
    assert blocks[0][1] == example, ("the README's C block differs from examples/gru_forward.c, "
                                     "which tests/test_capi.py builds and runs")


def test_readme_test_command_installs_what_ci_installs():
    """The README's test command installs the test extra at the versions CI pins (without the
    constraints, pip would take the newest torch, which need not be the build the tests were
    made with), and CI runs that same install."""
    commands = [code for _, code in _blocks("bash")]
    test_cmd = [c for c in commands if "pytest" in c]
    assert test_cmd, "the README starts with a command that installs and runs the tests"
    assert '-e ".[test]" -c .ci/constraints.txt' in test_cmd[0], test_cmd[0]
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert "constraints=(-c .ci/constraints.txt)" in ci
    assert 'pip install --quiet -e ".[test]" "${constraints[@]}"' in ci
