"""The size rule of ``coordinator/``: no module over 450 lines, no function over 60.

A module past a few hundred lines holds more than one concept, and a function past a screen
mixes steps a reader has to hold at once (STYLE: "one module per concept, 100-400 lines"). The
rule is read from the source with ``ast`` (no import, no server): a module's size is its line
count, a function's the lines from its ``def`` to its last statement (decorators left out,
docstring and nested functions counted). Generated code (``coordinator/v1/``) is exempt.

The exceptions are named below, each with its reason. An exception that no longer exceeds its
limit fails too, so the list only ever shrinks with the code.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "coordinator"
GENERATED = PACKAGE / "v1"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60

MODULE_EXCEPTIONS: dict[str, str] = {}
"""Modules allowed over the limit for good, with the reason."""

FUNCTION_EXCEPTIONS: dict[str, str] = {}
"""Functions allowed over the limit for good, with the reason (``module::qualified.name``)."""


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if not path.is_relative_to(GENERATED):
            yield path.relative_to(PACKAGE).as_posix(), path


def _functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every function below ``node``: its qualified name and its length in lines."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + child.name
            yield name, (child.end_lineno or child.lineno) - child.lineno + 1
            yield from _functions(child, f"{name}.<locals>.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def _module_sizes() -> dict[str, int]:
    return {name: len(path.read_text().splitlines()) for name, path in _modules()}


def _function_sizes() -> dict[str, int]:
    sizes = {}
    for name, path in _modules():
        for function, lines in _functions(ast.parse(path.read_text(), str(path))):
            sizes[f"{name}::{function}"] = lines
    return sizes


def test_no_module_is_over_the_limit() -> None:
    allowed = MODULE_EXCEPTIONS
    over = {
        name: lines
        for name, lines in _module_sizes().items()
        if lines > MAX_MODULE_LINES and name not in allowed
    }
    assert not over, (
        f"modules over {MAX_MODULE_LINES} lines: {over}; split them along a seam (one concept "
        "per module) rather than adding an exception"
    )


def test_no_function_is_over_the_limit() -> None:
    allowed = FUNCTION_EXCEPTIONS
    over = {
        name: lines
        for name, lines in _function_sizes().items()
        if lines > MAX_FUNCTION_LINES and name not in allowed
    }
    assert not over, (
        f"functions over {MAX_FUNCTION_LINES} lines: {over}; split them into named steps "
        "rather than adding an exception"
    )


def test_every_exception_is_still_needed() -> None:
    """An exception whose module or function is gone or back under the limit is removed, so
    the lists name exactly what is over today."""
    modules, functions = _module_sizes(), _function_sizes()
    stale = [name for name in MODULE_EXCEPTIONS if modules.get(name, 0) <= MAX_MODULE_LINES] + [
        name for name in FUNCTION_EXCEPTIONS if functions.get(name, 0) <= MAX_FUNCTION_LINES
    ]
    assert not stale, f"exceptions no longer needed (remove them from this test): {stale}"


def test_the_rule_sees_nested_functions_and_methods() -> None:
    """The walk names methods by class and nested functions under their parent, and measures
    from ``def`` to the last line (the decorator left out)."""
    body = "\n".join(f"        x{i} = {i}" for i in range(3))
    tree = ast.parse(
        f"class A:\n    @staticmethod\n    def f():\n        def g():\n            pass\n{body}\n"
    )
    assert dict(_functions(tree)) == {"A.f": 6, "A.f.<locals>.g": 2}


def test_every_reason_is_given() -> None:
    for table in (MODULE_EXCEPTIONS, FUNCTION_EXCEPTIONS):
        assert all(reason.strip() for reason in table.values())
