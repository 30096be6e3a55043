"""The package's import graph, read from the source with ``ast`` (nothing is imported): the
domain depends on nothing of the project's but the exception root, the store on no outer layer,
the store's wings and the server's groups on each other only along the edges listed here, and
no module of ``coordinator/`` takes part in an import cycle.

Every import counts, at module level or inside a function, except those under
``if TYPE_CHECKING:``: they never run, so they cannot make a cycle at import time, and an
annotation may name a type of a higher layer without depending on it.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "coordinator"
GENERATED = "coordinator.v1"

# What the domain may import besides itself: the one exception root its rules raise.
DOMAIN_MAY_IMPORT = frozenset({"coordinator.errors"})
# Layers the store serves; it must never reach back up into them.
ABOVE_STORE = ("server", "sdk", "cli", "doctor", "console")
# The store's wings and the wings each may import (every wing may import itself). "core" is the
# store's root modules (context, types, fence, transition, ...); ``coordinator/store/__init__.py``
# assembles every wing into ``Store`` and is left out of these rules.
WING_EDGES: dict[str, frozenset[str]] = {
    # etcd plumbing knows no task and nothing of the store above it.
    "etcd": frozenset(),
    "core": frozenset({"etcd"}),
    "indexes": frozenset({"core", "etcd"}),
    "retention": frozenset({"core", "etcd"}),
    "control": frozenset({"core", "etcd"}),
    # Creating a task or an edge reads the tombstones, to refuse a pruned id by name.
    "lifecycle": frozenset({"core", "etcd", "indexes", "retention"}),
    "attempts": frozenset({"core", "etcd", "indexes"}),
    # Prepare and Record are acceptance points (attempts); jobs page like ListTasks (lifecycle).
    "effects": frozenset({"core", "etcd", "indexes", "attempts", "lifecycle"}),
    # A claim remembers what it wrote for the holder's commit (attempts), a claim given back
    # undelivered ends its attempt (attempts), the approval and reconcile gates hold claims
    # (effects), and ListClaims pages like ListTasks (lifecycle).
    "claims": frozenset({"core", "etcd", "indexes", "attempts", "effects", "lifecycle"}),
}


# The server's groups and the groups each may import (every group may import itself). "root" is
# ``coordinator/server/``'s own modules (identity, status, tls, tokens, streams, ...) but
# ``app.py``, which assembles every group into a server, and the package's ``__init__``.
SERVER_GROUP_EDGES: dict[str, frozenset[str]] = {
    "root": frozenset(),
    # Parsing and converting is pure: it raises typed errors (status) and knows no caller.
    "wire": frozenset({"root"}),
    "interceptors": frozenset({"root"}),
    # A servicer parses with wire, asks the stream interceptor who is waiting, answers.
    "services": frozenset({"root", "wire", "interceptors"}),
}

# Edges inside a wing that were cut on purpose, each with why it must not come back.
CUT = {
    # Renewals read, cache and diagnose views through store/attempts/views.py, as the
    # acceptance points do; they needed acceptance only for its diagnose.
    ("coordinator.store.attempts.renewals", "coordinator.store.attempts.acceptance"),
}


@dataclass(frozen=True)
class Import:
    """One import statement's edge: ``source`` imports ``target`` at ``path``:``line``."""

    source: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target}"


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    _module_of(path): path
    for path in sorted(PACKAGE.rglob("*.py"))
    if not _module_of(path).startswith(GENERATED)
}


def _resolve(base: str, name: str | None) -> str | None:
    """The project module ``from base import name`` loads: ``base.name`` when that is a
    module, else ``base`` itself; None outside the project."""
    if name is not None and f"{base}.{name}" in MODULES:
        return f"{base}.{name}"
    return base if base in MODULES else None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(node: ast.AST, *, type_checking: bool) -> Iterator[ast.AST]:
    """Every node under ``node``, leaving out the bodies of ``if TYPE_CHECKING:`` unless
    ``type_checking``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
            for statement in child.orelse:
                yield statement
                yield from _statements(statement, type_checking=False)
            continue
        yield child
        yield from _statements(child, type_checking=type_checking)


def _imports_of(module: str, *, type_checking: bool = False) -> Iterator[Import]:
    path = MODULES[module]
    shown = str(path.relative_to(ROOT))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in _statements(tree, type_checking=type_checking):
        if isinstance(node, ast.Import):
            targets = [_resolve(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [_resolve(base, alias.name) for alias in node.names]
        else:
            continue
        for target in dict.fromkeys(t for t in targets if t is not None and t != module):
            if not target.startswith(GENERATED):
                yield Import(module, target, shown, node.lineno)


IMPORTS = [edge for module in MODULES for edge in _imports_of(module)]


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _wing(module: str) -> str | None:
    """The store wing ``module`` belongs to; None for the store's ``__init__`` and outside."""
    if not _under(module, "coordinator.store") or module == "coordinator.store":
        return None
    part = module.split(".")[2]
    return part if part in WING_EDGES else "core"


def test_every_store_folder_is_a_listed_wing() -> None:
    folders = {p.name for p in (PACKAGE / "store").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(WING_EDGES) - {"core"}


def test_the_domain_imports_nothing_of_the_project_but_the_exception_root() -> None:
    wrong = [
        str(edge)
        for edge in IMPORTS
        if _under(edge.source, "coordinator.domain")
        and not _under(edge.target, "coordinator.domain")
        and edge.target not in DOMAIN_MAY_IMPORT
    ]
    assert wrong == [], "the domain is pure: move the import out, or the rule in\n" + "\n".join(
        wrong
    )


def test_the_exception_root_imports_nothing_of_the_project() -> None:
    # Everything raises these, the domain included: an import here would tie a circle (as
    # errors -> domain.positions once did, under TYPE_CHECKING).
    every = [
        str(edge)
        for edge in _imports_of("coordinator.errors", type_checking=True)
        if edge.target != "coordinator.errors"
    ]
    assert every == []


def test_the_store_never_imports_a_layer_above_it() -> None:
    above = tuple(f"coordinator.{layer}" for layer in ABOVE_STORE)
    wrong = [
        str(edge)
        for edge in IMPORTS
        if _under(edge.source, "coordinator.store")
        and any(_under(edge.target, layer) for layer in above)
    ]
    assert wrong == [], "the store serves these layers, never imports them:\n" + "\n".join(wrong)


def test_the_store_wings_import_each_other_only_along_the_listed_edges() -> None:
    wrong = []
    for edge in IMPORTS:
        source, target = _wing(edge.source), _wing(edge.target)
        if source is None or target is None or source == target:
            continue
        if target not in WING_EDGES[source]:
            wrong.append(f"{edge} (wing {source} -> {target} is not in WING_EDGES)")
    if any(_wing(e.source) is not None and e.target == "coordinator.store" for e in IMPORTS):
        wrong.append("a store module imports coordinator.store, which assembles every wing")
    assert wrong == [], "\n".join(wrong)


def _server_group(module: str) -> str | None:
    """The server group ``module`` belongs to; None for ``app``, the ``__init__`` and outside."""
    if not _under(module, "coordinator.server") or module in {
        "coordinator.server",
        "coordinator.server.app",
    }:
        return None
    part = module.split(".")[2]
    return part if part in SERVER_GROUP_EDGES else "root"


def test_every_server_folder_is_a_listed_group() -> None:
    server = PACKAGE / "server"
    folders = {p.name for p in server.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(SERVER_GROUP_EDGES) - {"root"}


def test_the_server_groups_import_each_other_only_along_the_listed_edges() -> None:
    wrong = [
        f"{edge} (group {source} -> {target} is not in SERVER_GROUP_EDGES)"
        for edge in IMPORTS
        if (source := _server_group(edge.source)) is not None
        and (target := _server_group(edge.target)) is not None
        and source != target
        and target not in SERVER_GROUP_EDGES[source]
    ]
    wrong += [
        f"{edge} (only the server's __init__ imports app, which assembles every group)"
        for edge in IMPORTS
        if edge.target == "coordinator.server.app"
        and _under(edge.source, "coordinator.server")
        and edge.source != "coordinator.server"
    ]
    assert wrong == [], "\n".join(wrong)


def test_the_listed_server_group_edges_point_one_way() -> None:
    order: list[str] = []
    pending = dict(SERVER_GROUP_EDGES)
    while pending:
        ready = sorted(g for g, deps in pending.items() if deps <= set(order))
        assert ready, f"the server group edges form a cycle among {sorted(pending)}"
        order += ready
        for group in ready:
            del pending[group]


def test_the_edges_cut_on_purpose_stay_cut() -> None:
    back = [str(edge) for edge in IMPORTS if (edge.source, edge.target) in CUT]
    assert back == [], "an edge cut on purpose is back (see CUT):\n" + "\n".join(back)


def test_the_listed_wing_edges_point_one_way() -> None:
    order: list[str] = []
    pending = dict(WING_EDGES)
    while pending:
        ready = sorted(w for w, deps in pending.items() if deps <= set(order))
        assert ready, f"the wing edges form a cycle among {sorted(pending)}"
        order += ready
        for wing in ready:
            del pending[wing]


def _cycle() -> list[str]:
    """One import cycle among the package's modules, or [] (iterative DFS: three colours)."""
    graph: dict[str, list[str]] = {m: [] for m in MODULES}
    for edge in IMPORTS:
        graph[edge.source].append(edge.target)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start, first in graph.items():
        if start in state:
            continue
        path, stack = [start], [iter(first)]
        state[start] = 1
        while stack:
            step = next(stack[-1], None)
            if step is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(step) == 1:
                return [*path[path.index(step) :], step]
            elif step not in state:
                state[step] = 1
                path.append(step)
                stack.append(iter(graph[step]))
    return []


def test_no_module_of_the_package_is_part_of_an_import_cycle() -> None:
    cycle = _cycle()
    edges = {(e.source, e.target): e for e in IMPORTS}
    shown = [str(edges[pair]) for pair in itertools.pairwise(cycle)]
    assert cycle == [], "an import cycle:\n" + "\n".join(shown)


def test_the_graph_reader_sees_imports() -> None:
    # The rules above pass vacuously if no edge is read: check some the code is known to have.
    pairs = {(e.source, e.target) for e in IMPORTS}
    assert ("coordinator.store.claims.claim_txn", "coordinator.store.fence") in pairs
    assert ("coordinator.store.attempts.renewals", "coordinator.store.coverage") in pairs
    assert (
        "coordinator.server.services.worker_service",
        "coordinator.server.wire.worker_wire",
    ) in pairs
