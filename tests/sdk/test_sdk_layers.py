"""The SDK's layers, held over its import graph: a pure core (sdk/_core/) that the sync and the
asyncio shells share and that imports neither shell nor any I/O, and two shells that never
import each other (the asyncio SDK used to reach the shared parts through the sync modules)."""

from __future__ import annotations

import ast
from pathlib import Path

SDK = Path(__file__).resolve().parents[2] / "coordinator" / "sdk"

# Leaf modules of the SDK that the core may use: pure types and helpers importing no shell.
LEAVES = {"types", "tasks", "_duration", "_status", "_flag", "_budget", "_target"}
# What would make the core do I/O or run something: sockets, processes, an event loop.
NO_IO = ("asyncio", "grpc.aio", "socket", "http", "subprocess", "os", "signal", "concurrent")
# The sync shell's modules (the asyncio shell has its own of each, or none).
SYNC_SHELL = {"client", "claim", "pool", "managed", "_renewer", "_rpc", "effects", "rediscover"}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (``from coordinator.sdk import _budget`` counts as
    ``coordinator.sdk._budget``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "coordinator.sdk":
                found |= {f"coordinator.sdk.{alias.name}" for alias in node.names}
    return found


def _sdk_parts(modules: set[str]) -> set[str]:
    """The SDK modules among ``modules``, relative to coordinator.sdk (``_core.held``)."""
    prefix = "coordinator.sdk."
    return {m.removeprefix(prefix) for m in modules if m.startswith(prefix)}


def test_the_core_imports_no_shell_and_no_io() -> None:
    core = sorted((SDK / "_core").glob("*.py"))
    assert len(core) >= 8  # the scan found the package
    for path in core:
        imported = _imports(path)
        parts = _sdk_parts(imported)
        outside = {p for p in parts if not p.startswith("_core") and p not in LEAVES}
        assert outside == set(), f"{path.name} imports SDK shell modules {outside}"
        io = {m for m in imported if any(m == x or m.startswith(f"{x}.") for x in NO_IO)}
        assert io == set(), f"{path.name} does I/O through {io}"


def test_the_asyncio_shell_imports_nothing_of_the_sync_shell() -> None:
    for path in sorted((SDK / "aio").glob("*.py")):
        reached = {p for p in _sdk_parts(_imports(path)) if p.split(".")[0] in SYNC_SHELL}
        assert reached == set(), f"aio/{path.name} imports the sync shell's {reached}"


def test_the_sync_shell_imports_nothing_of_the_asyncio_shell() -> None:
    for name in sorted(SYNC_SHELL):
        reached = {p for p in _sdk_parts(_imports(SDK / f"{name}.py")) if p.startswith("aio")}
        assert reached == set(), f"{name}.py imports the asyncio shell's {reached}"


def test_the_leaves_import_no_shell_and_no_core() -> None:
    for name in sorted(LEAVES):
        parts = _sdk_parts(_imports(SDK / f"{name}.py"))
        assert parts <= LEAVES, f"{name}.py imports {parts - LEAVES}"
