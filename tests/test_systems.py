"""cgru.systems: the layering of the weight mappings.

A systems module maps one system's tensors and names to and from the network; it never
imports an op frontend (``cgru.tf``, ``cgru.mps``, ``cgru.onnx``, ``cgru.arraymancer``) nor the
public ``cgru.convert``, which only re-exports it.  Checked on the source (``ast``), so an
import inside a function counts too.
"""
import ast
import importlib
import pathlib
import pkgutil

import pytest

import cgru.systems
from cgru import convert

FRONTENDS = ("cgru.tf", "cgru.mps", "cgru.onnx", "cgru.arraymancer", "cgru.convert")
MODULES = sorted(m.name for m in pkgutil.iter_modules(cgru.systems.__path__))


def _imports(path):
    """Every module name an ``import`` / ``from … import`` statement of ``path`` names (with
    ``from cgru import tf`` as ``cgru.tf``)."""
    names = set()
    for node in ast.walk(ast.parse(pathlib.Path(path).read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_every_system_has_its_module():
    assert MODULES == ["_rules", "arraymancer", "keras", "mps", "onednn", "onnx", "tf", "torch"]


@pytest.mark.parametrize("name", MODULES)
def test_no_systems_module_imports_a_frontend(name):
    module = importlib.import_module(f"cgru.systems.{name}")
    assert module.__doc__ and module.__doc__.strip()
    bad = {n for n in _imports(module.__file__)
           if any(n == f or n.startswith(f + ".") for f in FRONTENDS)}
    assert not bad, f"cgru.systems.{name} imports {sorted(bad)}"


def test_the_package_docstring_lists_every_module():
    for name in MODULES:
        assert name in cgru.systems.__doc__


def test_convert_only_delegates_to_the_systems():
    for name in convert.__all__:
        fn = getattr(convert, name)
        assert fn.__module__.startswith("cgru.systems."), (name, fn.__module__)
    tree = ast.parse(pathlib.Path(convert.__file__).read_text())
    assert not [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def _package_imports(module):
    """``_imports`` of a module, or of every file of a package."""
    files = [module.__file__]
    if hasattr(module, "__path__"):
        files = sorted(str(p) for p in pathlib.Path(module.__path__[0]).glob("*.py"))
    return set().union(*(_imports(f) for f in files))


@pytest.mark.parametrize("frontend", ["cgru.tf", "cgru.mps", "cgru.onnx", "cgru.arraymancer"])
def test_frontends_map_weights_through_their_systems_module(frontend):
    module = importlib.import_module(frontend)
    names = _package_imports(module)
    system = "cgru.systems." + frontend.split(".")[1]
    assert any(n == system or n.startswith(system + ".") for n in names)
    assert "cgru.convert" not in names and not any(n.startswith("cgru.convert.") for n in names)
    assert "cgru._checks" not in names
