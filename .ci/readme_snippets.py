"""Write each ```python block of a Markdown file to its own module, for mypy.

    python .ci/readme_snippets.py README.md OUT_DIR

OUT_DIR/readme_line_<N>.py holds the block that starts at line N (the line of its fence), so
that mypy's messages point back at the README.
"""
import pathlib
import re
import sys


def blocks(text):
    """``(line of the fence, code)`` of every ```python block."""
    for m in re.finditer(r"^```python[ \t]*\n(.*?)^```", text, re.M | re.S):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)


def main(readme, out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    found = list(blocks(pathlib.Path(readme).read_text(encoding="utf-8")))
    if not found:
        sys.exit(f"{readme}: no ```python block")
    for line, code in found:
        (out / f"readme_line_{line}.py").write_text(code, encoding="utf-8")
    print(f"{len(found)} Python blocks of {readme} in {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
