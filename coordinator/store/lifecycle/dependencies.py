"""Dependency edges: reading upstreams, the atomic cycle check, and SetDependencies.

A task's edges live in two places written by the same txns: its record's ``depends_on`` (what
readers see) and ``{p}/deps/{task}`` (a small key rewritten only when the edges change), plus one
reverse edge ``{p}/dependents/{upstream}/{task}`` per edge for the releaser. The cycle check reads
the ``deps`` keys reachable from the new edges and the txn that writes the edges compares every
one of them (or, past a budget, the whole ``deps`` range), so a concurrent edge change anywhere
in the part it read aborts the write, which then re-reads and re-checks.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from coordinator.domain.graph import (
    check_upstreams,
    find_cycle,
    format_cycle,
    satisfied_by,
    unmet,
)
from coordinator.domain.records import TaskRecord
from coordinator.domain.states import Op, TaskState
from coordinator.domain.waiting import blocking
from coordinator.errors import FailedPrecondition, NotFound, ResourceExhausted
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import (
    KV,
    Compare,
    RequestOp,
    delete,
    get,
    get_prefix,
    mod_revision_is,
    put,
    range_unchanged_since,
)
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.lifecycle.task_list import VALUES_PER_READ
from coordinator.store.retention.tombstones import read_tombstones, task_not_found
from coordinator.store.transition import transition, transition_ops
from coordinator.store.types import Neighbours

# Reads per txn (etcd refuses more than 128 operations in one).
_BATCH = 100
# Past this many nodes the cycle check compares the whole deps range instead of each key.
_PER_NODE_COMPARES = 60
# The cycle check refuses to walk a graph larger than this.
MAX_GRAPH_NODES = 10_000
# Levels walked one read each before the cycle check reads the whole deps range instead (a
# read is about a millisecond; the range, at most MAX_GRAPH_NODES keys, a few dozen pages).
_WALK_LEVELS = 64
# deps keys per page of that read: at most 50 ids of 128 characters each, so under 2 MiB.
_DEPS_PAGE = 300
# The whole range is read only while it is this small (a few dozen pages); past it, the walk
# goes on level by level up to MAX_GRAPH_NODES.
_WHOLE_GRAPH_KEYS = 20_000
_CAS_TRIES = 8
_WHOLE_GRAPH_READ = threading.Lock()


@dataclass
class Subgraph:
    """The edges reachable from some tasks, as read, with what the write must compare."""

    edges: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # mod_revision of each node's deps key when read (0: it had none).
    versions: dict[str, int] = field(default_factory=dict)
    first_read: int = 0


def edges_value(depends_on: Sequence[str]) -> bytes:
    """The stored form of a task's outgoing edges."""
    return json.dumps(list(depends_on), separators=(",", ":")).encode()


def edges_of(value: bytes) -> tuple[str, ...]:
    """Outgoing edges from their stored form."""
    return tuple(json.loads(value))


def edges_detail(depends_on: Sequence[str]) -> str:
    """The event detail of an edge change."""
    return "depends_on: " + (", ".join(depends_on) if depends_on else "(none)")


class DependencyStore:
    """Upstream reads, the cycle check, and SetDependencies."""

    def __init__(self, ctx: StoreContext, ready: ReadyIndex) -> None:
        self._ctx = ctx
        self._ready = ready

    def upstreams(self, depends_on: Sequence[str]) -> list[TaskRecord]:
        """The records of ``depends_on`` in order; NotFound naming every unknown id."""
        found, _ = self._known(depends_on)
        missing = [t for t in depends_on if t not in found]
        if missing:
            raise NotFound(f"depends_on names tasks that do not exist: {', '.join(missing)}")
        return [found[t] for t in depends_on]

    def neighbours(self, task_id: str, *, page_size: int, page_token: str = "") -> Neighbours:
        """ListDependencies: the task's upstreams with their states and one page of its
        dependents (after ``page_token``, a dependent's id) from the reverse edges."""
        kv = self._ctx.kv.get(self._ctx.keys.task(task_id))
        if kv is None:
            raise task_not_found(self._ctx, task_id)
        task = task_from_kv(kv)
        upstreams, pruned = self._known(task.depends_on)
        prefix = self._ctx.keys.dependents_prefix(task_id)
        start = prefix + page_token + "\0" if page_token else prefix
        page, _ = self._ctx.kv.range_page(
            start, self._ctx.kv.prefix_end(prefix), limit=page_size, keys_only=True
        )
        ids = [item.key.removeprefix(prefix) for item in page]
        dependents = self._records(ids)
        return Neighbours(
            upstreams=[upstreams[t] for t in task.depends_on if t in upstreams],
            pruned=frozenset(pruned),
            dependents=[dependents[t] for t in ids if t in dependents],
            next_page_token=ids[-1] if len(ids) == page_size else "",
        )

    def _known(self, task_ids: Sequence[str]) -> tuple[dict[str, TaskRecord], set[str]]:
        """The records of ``task_ids`` that exist, a pruned one as its tombstone's stand-in
        (it counts with its final state: DONE still releases, CANCELLED or FAILED still
        blocks; state_version 0, so a txn that compares it holds only while the task key
        stays absent), and the ids that were pruned."""
        found = self._records(task_ids)
        pruned = read_tombstones(self._ctx, [t for t in task_ids if t not in found])
        found.update({t: tombstone.as_task() for t, tombstone in pruned.items()})
        return found, set(pruned)

    def _records(self, task_ids: Sequence[str]) -> dict[str, TaskRecord]:
        """The task records of ``task_ids`` that exist, by id (read ``VALUES_PER_READ`` at a
        time: a record holds its input, and 100 of them were a read past the message limit)."""
        found: dict[str, TaskRecord] = {}
        for start in range(0, len(task_ids), VALUES_PER_READ):
            batch = task_ids[start : start + VALUES_PER_READ]
            snap = self._ctx.kv.read(*(get(self._ctx.keys.task(t)) for t in batch))
            for index, task_id in enumerate(batch):
                kv = snap.range_one(index)
                if kv is not None:
                    found[task_id] = task_from_kv(kv)
        return found

    def reachable(self, task_id: str, depends_on: Sequence[str]) -> Subgraph:
        """Every edge reachable from ``depends_on`` (stopping early at ``task_id``: a cycle).

        One read per level of the graph, a batch of nodes each; a chain is one node per level,
        so a 5,000-task chain took 5,000 reads (4.3 s). Past ``_WALK_LEVELS`` levels the whole
        ``deps`` range is read instead, in pages at one revision, unless it holds more than
        ``_WHOLE_GRAPH_KEYS`` keys (``_whole_graph``).
        """
        graph = Subgraph()
        frontier = list(dict.fromkeys(depends_on))
        queued = set(frontier)
        for level in itertools.count():
            if not frontier:
                return graph
            if level == _WALK_LEVELS and (whole := self._whole_graph(depends_on)) is not None:
                return whole
            if len(graph.edges) + len(frontier) > MAX_GRAPH_NODES:
                raise _too_large(depends_on)
            batch, frontier = frontier[:_BATCH], frontier[_BATCH:]
            snap = self._ctx.kv.read(*(get(self._ctx.keys.deps(t)) for t in batch))
            graph.first_read = graph.first_read or snap.revision
            for index, node in enumerate(batch):
                kv = snap.range_one(index)
                graph.edges[node] = edges_of(kv.value) if kv is not None else ()
                graph.versions[node] = kv.mod_revision if kv is not None else 0
                for nxt in graph.edges[node]:
                    if nxt == task_id:
                        return graph  # the cycle is already visible
                    if nxt not in queued:
                        queued.add(nxt)
                        frontier.append(nxt)
        raise AssertionError("unreachable")  # itertools.count never ends

    def _whole_graph(self, depends_on: Sequence[str]) -> Subgraph | None:
        """The part reachable from ``depends_on`` of every ``deps`` key, read a page at a time
        at one revision; None when the range holds more than ``_WHOLE_GRAPH_KEYS`` keys.
        One at a time per replica (ResourceExhausted for another meanwhile: the SDK retries
        it): 64 at once held the whole graph 64 times over, 116 MB more of the replica's
        memory, and slowed every other caller's reads."""
        if not _WHOLE_GRAPH_READ.acquire(blocking=False):
            raise ResourceExhausted(
                "the dependency graph is deep and another check of the whole graph for cycles "
                "runs on this replica; retry shortly"
            )
        try:
            return self._read_whole_graph(depends_on)
        finally:
            _WHOLE_GRAPH_READ.release()

    def _read_whole_graph(self, depends_on: Sequence[str]) -> Subgraph | None:
        kv, prefix = self._ctx.kv, self._ctx.keys.deps_prefix
        end = kv.prefix_end(prefix)
        if kv.read(get_prefix(prefix, count_only=True)).range_count(0) > _WHOLE_GRAPH_KEYS:
            return None
        start, revision = prefix, 0
        every: dict[str, KV] = {}
        while True:
            page, revision = kv.range_page(start, end, limit=_DEPS_PAGE, revision=revision)
            every.update((item.key[len(prefix) :], item) for item in page)
            if len(page) < _DEPS_PAGE:
                break
            start = page[-1].key + "\0"
        graph = Subgraph(first_read=revision)
        todo = list(dict.fromkeys(depends_on))
        while todo:
            node = todo.pop()
            if node not in graph.edges:
                item = every.get(node)
                graph.edges[node] = edges_of(item.value) if item is not None else ()
                graph.versions[node] = item.mod_revision if item is not None else 0
                todo += graph.edges[node]
        return graph

    def check_acyclic(self, task_id: str, depends_on: Sequence[str]) -> list[Compare]:
        """Refuse edges that would close a cycle (naming it); else the compares that keep the
        answer true until the write lands."""
        graph = self.reachable(task_id, depends_on)
        cycle = find_cycle(task_id, depends_on, graph.edges)
        if cycle is not None:
            raise FailedPrecondition(f"dependency cycle refused: {format_cycle(cycle)}")
        keys = self._ctx.keys
        if len(graph.versions) <= _PER_NODE_COMPARES:
            return [mod_revision_is(keys.deps(n), v) for n, v in graph.versions.items()]
        # Deletions are not seen, but removing an edge never closes a cycle.
        return [range_unchanged_since(keys.deps_prefix, graph.first_read)]

    def edge_ops(self, task_id: str, old: Sequence[str], new: Sequence[str]) -> list[RequestOp]:
        """Write the task's deps key and its reverse edges (old -> new)."""
        keys = self._ctx.keys
        ops: list[RequestOp] = []
        if tuple(old) == tuple(new):
            return ops
        ops.append(put(keys.deps(task_id), edges_value(new)) if new else delete(keys.deps(task_id)))
        ops += [delete(keys.dependent(u, task_id)) for u in old if u not in new]
        ops += [put(keys.dependent(u, task_id), b"") for u in new if u not in old]
        return ops

    def set_dependencies(
        self,
        task_id: str,
        depends_on: Sequence[str],
        *,
        expected_state_version: int,
        by: str,
    ) -> TaskRecord:
        """Replace the task's upstreams. READY or WAITING only; the state follows the new edges
        (WAITING while any upstream is not DONE, else READY)."""
        ctx = self._ctx
        for _ in range(_CAS_TRIES):
            task = self._get(task_id)
            if expected_state_version and expected_state_version != task.state_version:
                raise FailedPrecondition(
                    f"task {task_id!r} is at state_version {task.state_version}, expected "
                    f"{expected_state_version}"
                )
            if task.state not in (TaskState.READY, TaskState.WAITING):
                raise FailedPrecondition(
                    f"task {task_id!r} is {task.state.name}; its dependencies can change only "
                    "while it is READY or WAITING (nobody executes it yet)"
                )
            upstreams = self.upstreams(depends_on)
            # Only a new edge to a FAILED or CANCELLED upstream is refused: a kept one blocks.
            check_upstreams([u for u in upstreams if u.task_id not in task.depends_on])
            guards = self.check_acyclic(task_id, depends_on)
            if tuple(depends_on) == task.depends_on:
                return task
            waiting_on = unmet(upstreams)
            if task.state is TaskState.READY:
                op = Op.BLOCK if waiting_on else Op.SET_DEPENDENCIES
            else:
                op = Op.SET_DEPENDENCIES if waiting_on else Op.UNBLOCK
            after = transition(
                task,
                op,
                ctx.clock.now(),
                depends_on=tuple(depends_on),
                satisfied_by=() if waiting_on else satisfied_by(upstreams),
                blocked_by=blocking(upstreams) if waiting_on else (),
            )
            compares, ops = transition_ops(
                ctx, task, after, op, by=by, detail=edges_detail(depends_on)
            )
            compares += guards
            compares += [
                mod_revision_is(ctx.keys.task(u.task_id), u.state_version) for u in upstreams
            ]
            ops += self.edge_ops(task_id, task.depends_on, depends_on)
            if ctx.kv.txn(compares, ops).succeeded:
                if after.state is TaskState.READY:
                    self._ready.add(
                        ctx.keys.ready(after.queue, after.priority, after.ready_seq, task_id)
                    )
                return self._get(task_id)
        raise FailedPrecondition(
            f"the dependency graph around task {task_id!r} kept changing; set its dependencies "
            "again"
        )

    def _get(self, task_id: str) -> TaskRecord:
        kv = self._ctx.kv.get(self._ctx.keys.task(task_id))
        if kv is None:
            raise NotFound(f"task {task_id!r} does not exist")
        return task_from_kv(kv)


def _too_large(depends_on: Sequence[str]) -> FailedPrecondition:
    shown = ", ".join(depends_on[:5]) + (", ..." if len(depends_on) > 5 else "")
    return FailedPrecondition(
        f"the dependency graph reachable from {shown} has more than {MAX_GRAPH_NODES} tasks; "
        "the cycle check refuses to walk it"
    )
