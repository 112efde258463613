"""The package itself: the stub describes the real API, and Model() finds the shipped model from wherever the package
was imported (the build tree, or an installed copy that carries it as package data)."""

import ast
import inspect
import os
import pathlib

import mambacpp
from conftest import DEFAULT_MODEL

STUB = pathlib.Path(mambacpp.__file__).with_name("__init__.pyi")


def stub_tree():
    assert STUB.exists(), f"missing the type stub next to the package: {STUB}"
    return ast.parse(STUB.read_text())


def test_stub_names_every_public_name():
    tree = stub_tree()
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert set(mambacpp.__all__) <= names, f"missing from the stub: {set(mambacpp.__all__) - names}"


def test_stub_methods_exist_and_public_methods_are_in_the_stub():
    for node in stub_tree().body:
        if not isinstance(node, ast.ClassDef) or not hasattr(mambacpp, node.name):
            continue
        cls = getattr(mambacpp, node.name)
        # Methods and properties must exist on the class (annotated attributes are set per instance: not checked).
        stubbed = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        for name in stubbed:
            assert hasattr(cls, name), f"{node.name}.{name} is in the stub only"
        if inspect.isclass(cls) and cls.__module__.startswith("mambacpp._") and "_mambacpp" not in cls.__module__:
            public = {n for n, v in vars(cls).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
            assert public <= stubbed, f"{node.name}: not in the stub: {public - stubbed}"


def test_default_model_is_found():
    package_dir = pathlib.Path(mambacpp.__file__).parent
    packaged = package_dir / "models" / "default"
    expected = packaged if (packaged / "config.json").exists() and not os.environ.get("MAMBACPP_MODEL") else DEFAULT_MODEL
    assert pathlib.Path(mambacpp.default_model_dir()).resolve() == expected.resolve()
    m = mambacpp.Model(device="cpu", threads=1)
    assert pathlib.Path(m.path).resolve() == expected.resolve() and m.tokenizer is not None
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (expected / name).read_bytes() == (DEFAULT_MODEL / name).read_bytes()
