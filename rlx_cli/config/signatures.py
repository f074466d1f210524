"""The registered components' signatures, for checking a config without importing torch.

``components/__init__`` imports every component module, and they import torch (1 to 4 s). A config's check needs
only their signatures, which ``declared`` reads from their source (``ast``). ``registry()`` is
``components.registry`` without the package: loaded from its file under its own name when the package is not
imported yet (it imports nothing of the package), so that the package, once a run imports it, registers its
functions into that same module.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import math
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from components.registry import Signatures

NAME = "components.registry"


def components_folder() -> Path:
    """The ``components`` package's folder, found without running the package."""
    return Path(importlib.util.find_spec("components").submodule_search_locations[0])


def registry() -> ModuleType:
    """``components.registry``, imported on its own when ``components`` is not imported yet."""
    if NAME in sys.modules:
        return sys.modules[NAME]
    if "components" in sys.modules:
        return importlib.import_module(NAME)
    spec = importlib.util.spec_from_file_location(NAME, components_folder() / "registry.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    spec.loader.exec_module(module)
    return module


@cache
def table() -> Signatures:
    """group -> name -> ``registry.Signature`` of every registered component: read from the source, or, where a
    declaration is not a literal ``declared`` can read, from the functions themselves (importing them)."""
    try:
        return declared()
    except Undeclared:
        importlib.import_module("components")
        return registry().signatures()


class Undeclared(ValueError):
    """A registration ``declared`` cannot read without running the module (a default computed by a call)."""


def declared(root: Path | None = None) -> Signatures:
    """Every ``@register``-ed function's ``registry.Signature``, read from the source of the package at ``root`` (the
    ``components`` folder) without importing it: the decorator's group, name, ``ranges`` and ``choices`` and the
    function's parameters, evaluated from literals, ``math`` constants and the modules' own constants (also those
    imported from another module of the package). ``Undeclared`` names what it cannot read;
    tests/test_torch_free_refusal.py holds it equal to ``registry.signatures()``."""
    root = components_folder() if root is None else root
    modules = {".".join((root.name, *f.relative_to(root).with_suffix("").parts)).removesuffix(".__init__"):
               ast.parse(f.read_text(), str(f)) for f in sorted(root.rglob("*.py"))}  # fmt: skip
    table: Signatures = {}
    for module, tree in modules.items():
        for fn in (node for node in tree.body if isinstance(node, ast.FunctionDef)):
            for decorator in fn.decorator_list:
                if _registers(decorator):
                    group, name, signature = _declaration(fn, decorator, module, modules)
                    table.setdefault(group, {})[name] = signature
    return table


def _registers(decorator: ast.expr) -> bool:
    """Whether ``decorator`` is a call of ``register`` (or ``registry.register``)."""
    called = decorator.func if isinstance(decorator, ast.Call) else None
    return (isinstance(called, ast.Name) and called.id == "register") or (
        isinstance(called, ast.Attribute) and called.attr == "register"
    )


def _declaration(fn: ast.FunctionDef, decorator: ast.Call, module: str, modules: dict[str, ast.Module]):
    """(group, name, Signature) of ``fn`` registered by ``decorator`` in ``module``."""
    value = lambda node: _literal(node, module, modules)  # noqa: E731
    group, name = (value(arg) for arg in decorator.args[:2])
    options = {kw.arg: value(kw.value) for kw in decorator.keywords}
    args = fn.args
    keyword = {a.arg: inspect.Parameter.empty if d is None else value(d)
               for a, d in zip(args.kwonlyargs, args.kw_defaults)}  # fmt: skip
    every = tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))
    ranges, choices = dict(options.get("ranges") or {}), dict(options.get("choices") or {})
    return group, name, registry().Signature(every, keyword, ranges, choices, f"{module}.{fn.name}")


OPERATORS = {ast.USub: lambda x: -x, ast.UAdd: lambda x: +x, ast.Add: lambda x, y: x + y,
             ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y, ast.Div: lambda x, y: x / y,
             ast.Pow: lambda x, y: x**y}  # fmt: skip


def _literal(node: ast.AST, module: str, modules: dict[str, ast.Module]) -> Any:
    """The value of ``node`` in ``module``: a literal, a tuple, list or dict of them, arithmetic on them, ``math.X``,
    or a module-level name bound to one (in this module, or imported from another of ``modules``)."""
    again = lambda child: _literal(child, module, modules)  # noqa: E731
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple | ast.List):
        values = [again(element) for element in node.elts]
        return values if isinstance(node, ast.List) else tuple(values)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {again(k): again(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](again(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](again(node.left), again(node.right))
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math":
        return getattr(math, node.attr)
    if isinstance(node, ast.Name):
        for statement in reversed(modules[module].body):  # the last binding at module level wins
            if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                if any(isinstance(t, ast.Name) and t.id == node.id for t in targets):
                    return again(statement.value)
            if isinstance(statement, ast.ImportFrom) and statement.module in modules:
                for alias in statement.names:
                    if (alias.asname or alias.name) == node.id:
                        return _literal(ast.Name(alias.name), statement.module, modules)
    raise Undeclared(f"{module}, line {getattr(node, 'lineno', '?')}: {ast.unparse(node)} is not a literal")
