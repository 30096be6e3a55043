"""The SDK's size rule (issue 26, item 6): no module of coordinator/sdk/ over 450 lines and no
function over 60, so a reader finds one concept per module and one step per function. A module
or function that must be longer is named in EXCEPTIONS with its reason (none today)."""

from __future__ import annotations

import ast
from pathlib import Path

SDK = Path(__file__).resolve().parents[2] / "coordinator" / "sdk"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
EXCEPTIONS: dict[str, str] = {}
"""``module`` or ``module:function`` (relative to coordinator/sdk/) -> why it may be longer."""


def _modules() -> list[Path]:
    found = sorted(SDK.rglob("*.py"))
    assert len(found) > 30  # the scan found the package
    return found


def test_no_sdk_module_is_over_450_lines() -> None:
    long = {
        str(path.relative_to(SDK)): lines
        for path in _modules()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert {name: n for name, n in long.items() if name not in EXCEPTIONS} == {}


def test_no_sdk_function_is_over_60_lines() -> None:
    long: dict[str, int] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                name = f"{path.relative_to(SDK)}:{node.name}"
                if lines > MAX_FUNCTION_LINES and name not in EXCEPTIONS:
                    long[name] = lines
    assert long == {}
