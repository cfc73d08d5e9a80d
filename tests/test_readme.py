"""The README's code runs as written: every ```python block is executed in a fresh process (in
a scratch directory, in README order within its section), and the C block is the example the C
ABI tests build and run."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

# Python modules a block may import that are optional for cgru's users: the block is skipped
# (not failed) when one is missing, as the tests that need them are.
OPTIONAL = ("torch", "onnx", "onnxruntime", "tensorflow", "keras", "matplotlib")


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
    mods = set(re.findall(r"^\s*(?:import|from)\s+([A-Za-z_][\w]*)", code, re.M))
    mods |= set(re.findall(r"^\s*import\s+[\w.]+\s*,\s*([A-Za-z_]\w*)", code, re.M))
    return sorted(m for m in mods if m in OPTIONAL)


@pytest.mark.parametrize("line,code", PY_BLOCKS, ids=[f"README.md:{n}" for n, _ in PY_BLOCKS])
def test_readme_python_block_runs(line, code, tmp_path):
    for mod in _needs(code):
        pytest.importorskip(mod)
    if "torch.onnx.export" in code:           # torch's ONNX exporter runs on onnxscript
        pytest.importorskip("onnxscript")
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning:__main__",
                           str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (f"README.md:{line} failed:\n{code}\n--- stdout\n"
                                  f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")


def test_readme_c_example_is_the_tested_example():
    blocks = _blocks("c")
    assert len(blocks) == 1, "the README shows one C program: examples/gru_forward.c"
    example = open(os.path.join(ROOT, "examples", "gru_forward.c"), encoding="utf-8").read()
    assert blocks[0][1] == example, ("the README's C block differs from examples/gru_forward.c, "
                                     "which tests/test_capi.py builds and runs")
