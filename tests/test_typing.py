"""The type information cgru ships (PEP 561): ``py.typed`` and the stub of the package's
public names, checked against the objects Python actually runs.

The compiled modules' stubs (``cgru/_kernels/*.pyi``) are checked against the extensions by
mypy's ``stubtest`` in CI (.ci/run); the package stub ``cgru/__init__.pyi`` is checked here,
name by name and parameter by parameter, because ``stubtest cgru`` needs all of cgru to pass
mypy first."""
import ast
import inspect
import pathlib

import pytest

import cgru

PACKAGE = pathlib.Path(cgru.__file__).parent
STUB = PACKAGE / "__init__.pyi"
COMPILED = ("blas", "gru", "lstm", "rnn", "loops", "threads")


def stub_tree():
    return ast.parse(STUB.read_text(encoding="utf-8"))


def stub_functions():
    """``{name: ast.FunctionDef}`` of the stub's top-level functions and, as ``Class.method``,
    the methods of its classes."""
    found = {}
    for node in stub_tree().body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not any(
                        isinstance(d, ast.Name) and d.id == "property"
                        for d in item.decorator_list):
                    found[f"{node.name}.{item.name}"] = item
    return found


def stub_parameters(fn):
    """``[(name, kind, has a default)]`` of a stub's function, as ``inspect`` names kinds."""
    a = fn.args
    positional = a.posonlyargs + a.args
    n_without = len(positional) - len(a.defaults)
    params = [(p.arg, inspect.Parameter.POSITIONAL_ONLY if p in a.posonlyargs
               else inspect.Parameter.POSITIONAL_OR_KEYWORD, i >= n_without)
              for i, p in enumerate(positional)]
    if a.vararg:
        params.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, False))
    params += [(p.arg, inspect.Parameter.KEYWORD_ONLY, d is not None)
               for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, False))
    return params


def runtime_parameters(obj):
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty)
            for p in inspect.signature(obj).parameters.values()]


def runtime_object(dotted):
    obj = cgru
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("name", sorted(stub_functions()))
def test_stub_signature_is_the_runtime_signature(name):
    """Each function of the stub takes the parameters the running function takes: the same
    names (a keyword a user writes from the stub works), kinds and optional ones."""
    fn = stub_functions()[name]
    assert stub_parameters(fn) == runtime_parameters(runtime_object(name)), name


def test_stub_names_every_public_name():
    """The stub declares every name of ``cgru.__all__`` (a missing one would be an error in
    the user's type checker although it works) and nothing that does not exist."""
    declared = set()
    for node in stub_tree().body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            declared.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
    assert set(cgru.__all__) <= declared, set(cgru.__all__) - declared
    for name in declared & set(cgru.__all__):
        getattr(cgru, name)


def test_result_fields_are_the_runtime_fields():
    """``Forward``/``Gradients``: the stub's fields are the named tuple's fields, in order."""
    for node in stub_tree().body:
        if isinstance(node, ast.ClassDef) and node.name in ("Forward", "Gradients"):
            fields = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)]
            assert tuple(fields) == getattr(cgru, node.name)._fields, node.name


def test_type_information_is_installed():
    """``py.typed`` (PEP 561: a type checker reads the package's annotations) and a stub beside
    every compiled module (a type checker cannot read an extension)."""
    assert (PACKAGE / "py.typed").is_file()
    for name in COMPILED:
        assert (PACKAGE / "_kernels" / f"{name}.pyi").is_file(), name
