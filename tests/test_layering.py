"""The layering of the whole package, checked on the source (``ast``: an import inside a
function counts too).

* ``cgru.core`` never imports a frontend, a systems module or the C ABI's Python half;
* ``cgru._kernels`` imports nothing of cgru above it;
* nothing in the package imports the NumPy reference but the deprecated ``cgru.reference``
  path (tests and the benchmark's oracle do);
* the cell-kind modules import nothing compiled (the reference runs on them where the
  extensions are not built), and no core module outside them switches on a cell kind's name;
* no import circle anywhere in the package.
"""
import ast
import pathlib
import re

import pytest

import cgru

ROOT = pathlib.Path(cgru.__file__).parent
FRONTENDS = ("cgru.tf", "cgru.mps", "cgru.onnx", "cgru.arraymancer", "cgru.torch", "cgru.convert",
             "cgru.systems", "cgru.capi", "cgru.tf_kernels")


def _module_name(path):
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources():
    """``{module name: path}`` of every Python and Cython source of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*")):
        if path.suffix in (".py", ".pyx", ".pxd") and "__pycache__" not in path.parts:
            name = _module_name(path)
            if path.suffix == ".pxd" and name in out:
                continue
            out[name] = path
    return out


_CYTHON_FROM = re.compile(r"^\s*from\s+([\w.]+)\s+c?import\s+\(?([\w\s,]*)", re.M)
_CYTHON_IMPORT = re.compile(r"^\s*c?import\s+([\w.]+)", re.M)


def _imports(path, package):
    """The cgru modules ``path`` imports (``from cgru.core import plan`` → ``cgru.core.plan``
    when that is a module, else ``cgru.core``)."""
    text = path.read_text()
    names = set()
    if path.suffix in (".pyx", ".pxd"):                 # Cython: (c)imports by pattern
        for base, what in _CYTHON_FROM.findall(text):
            names.add(base)
            names.update(f"{base}.{w.strip()}" for w in what.split(",") if w.strip())
        names.update(_CYTHON_IMPORT.findall(text))
        return {n for n in names if n == "cgru" or n.startswith("cgru.")}
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                                  # relative
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            for a in node.names:
                names.add(f"{base}.{a.name}")
            names.add(base)
    return {n for n in names if n == "cgru" or n.startswith("cgru.")}


SOURCES = _sources()


def _resolve(name):
    """The package module an import names (the longest known prefix)."""
    while name and name not in SOURCES:
        name = name.rpartition(".")[0]
    return name


def _edges(mod, path):
    """What ``mod`` depends on: the modules it imports, but not its own ancestor packages
    (``from cgru.onnx import operators`` inside ``cgru.onnx.graph`` names its sibling; that
    Python runs the package's ``__init__`` first is not a dependency of the module)."""
    package = mod if path.name.startswith("__init__") else mod.rpartition(".")[0]
    deps = {_resolve(n) for n in _imports(path, package)}
    ancestors = {mod.rsplit(".", k)[0] for k in range(1, mod.count(".") + 1)}
    return deps - ancestors - {mod, ""}


GRAPH = {mod: _edges(mod, path) for mod, path in SOURCES.items()}


def _under(name, prefixes):
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("mod", sorted(m for m in SOURCES if m.startswith("cgru.core")))
def test_the_core_imports_no_frontend(mod):
    bad = sorted(n for n in GRAPH[mod] if _under(n, FRONTENDS))
    assert not bad, f"{mod} imports {bad}"


@pytest.mark.parametrize("mod", sorted(m for m in SOURCES if m.startswith("cgru._kernels")))
def test_the_kernels_import_nothing_above_them(mod):
    bad = sorted(n for n in GRAPH[mod] if not n.startswith("cgru._kernels"))
    assert not bad, f"{mod} imports {bad}"


def test_only_the_deprecated_path_imports_the_reference():
    users = sorted(m for m, deps in GRAPH.items() if "cgru.core.reference" in deps)
    assert users == ["cgru.reference"], users


@pytest.mark.parametrize("mod", sorted(m for m in SOURCES if m.startswith("cgru.core.kinds")))
def test_the_kinds_import_nothing_compiled(mod):
    bad = sorted(n for n in GRAPH[mod] if n.startswith("cgru._kernels") or
                 n in ("cgru.core.plan", "cgru.core.backend", "cgru.core.weights"))
    assert not bad, f"{mod} imports {bad}"


def test_no_core_module_switches_on_a_cell_kind_by_name():
    pattern = re.compile(r"\bkind\s*(==|!=|\bin\b)|\.kind\s*(==|!=)")
    hits = []
    for mod, path in SOURCES.items():
        if mod.startswith("cgru.core") and not mod.startswith("cgru.core.kinds"):
            for k, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and "dtype.kind" not in line:
                    hits.append(f"{path.name}:{k}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_no_import_circle():
    """Depth-first search of the import graph; a back edge is a circle."""
    state, stack, circles = {}, [], []

    def visit(mod):
        state[mod] = "open"
        stack.append(mod)
        for dep in sorted(GRAPH.get(mod, ())):
            if dep not in SOURCES or dep == "cgru":
                continue
            if state.get(dep) == "open":
                circles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[mod] = "done"
    for mod in sorted(SOURCES):
        if mod not in state:
            visit(mod)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)
