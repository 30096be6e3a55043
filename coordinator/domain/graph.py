"""The dependency graph's rules: well-formed edge lists, cycle detection, readiness (pure).

Edges point from a dependent to its upstreams (``a -> b``: a waits for b). The store reads the
part of the graph reachable from the new edges and asks ``find_cycle``; the write that follows
compares every node it read, so the answer still holds when the edges land.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from coordinator.domain import validation
from coordinator.domain.records import TaskRecord
from coordinator.domain.states import TaskState
from coordinator.errors import FailedPrecondition, InvalidArgument

MAX_DEPENDENCIES = 50
"""Upstreams per task. Bounded by etcd's 128 operations per txn: an edge change deletes the
old reverse edges and writes the new ones in one txn."""


def check_dependencies(
    task_id: str, depends_on: Sequence[str], field: str = "depends_on"
) -> tuple[str, ...]:
    """A well-formed edge list: bounded, valid ids, no duplicates, no self-dependency.

    A self-dependency is refused here (INVALID_ARGUMENT) because the request alone shows it;
    a longer cycle depends on the stored graph and is refused by the store
    (FAILED_PRECONDITION).
    """
    if len(depends_on) > MAX_DEPENDENCIES:
        raise InvalidArgument(
            f"{field} lists {len(depends_on)} tasks, the limit is {MAX_DEPENDENCIES}"
        )
    seen: set[str] = set()
    for index, upstream in enumerate(depends_on):
        validation.task_id(upstream, f"{field}[{index}]")
        if upstream in seen:
            raise InvalidArgument(f"{field} lists {upstream!r} twice")
        if task_id and upstream == task_id:
            raise InvalidArgument(
                f"{field} names the task itself ({task_id} -> {task_id}): a task cannot wait "
                "for itself"
            )
        seen.add(upstream)
    return tuple(depends_on)


def find_cycle(
    task_id: str, depends_on: Sequence[str], edges: Mapping[str, Sequence[str]]
) -> list[str] | None:
    """The shortest cycle that ``task_id -> depends_on`` would close, as a path that starts and
    ends with ``task_id``; None if the new edges keep the graph acyclic.

    ``edges`` holds the current outgoing edges of every node reachable from ``depends_on``
    (nodes missing from it have none); the task's own current edges are ignored, since they are
    being replaced.
    """
    previous: dict[str, str] = {}
    todo: deque[str] = deque()
    for upstream in depends_on:
        if upstream == task_id:
            return [task_id, task_id]
        if upstream not in previous:
            previous[upstream] = task_id
            todo.append(upstream)
    while todo:
        node = todo.popleft()
        for nxt in edges.get(node, ()):
            if nxt == task_id:
                path = [node]
                while path[-1] != task_id:
                    path.append(previous[path[-1]])
                return [*reversed(path), task_id]
            if nxt not in previous:
                previous[nxt] = node
                todo.append(nxt)
    return None


CYCLE_ENDS_SHOWN = 3
"""Tasks named at each end of a long cycle in a refusal."""


def format_cycle(path: Sequence[str]) -> str:
    """``a -> b -> c -> a``; a cycle of more than ``2 * CYCLE_ENDS_SHOWN`` tasks names its first
    and last few and its length: ``a -> b -> c -> ... -> x -> y -> a (a cycle of 5000 tasks)``.

    A cycle through a 5,000-task chain was named in full, a 100 KB status message that gRPC
    refused to carry (the caller read RESOURCE_EXHAUSTED and retried as if nothing had reached
    the server); the message now stays under a kilobyte whatever the cycle.
    """
    tasks = len(path) - 1  # the path starts and ends with the same task
    if tasks <= 2 * CYCLE_ENDS_SHOWN:
        return " -> ".join(path)
    shown = [*path[:CYCLE_ENDS_SHOWN], "...", *path[-CYCLE_ENDS_SHOWN:]]
    return " -> ".join(shown) + f" (a cycle of {tasks} tasks)"


_NEVER_DONE = (TaskState.CANCELLED, TaskState.FAILED)


def never_done(upstreams: Sequence[TaskRecord]) -> list[TaskRecord]:
    """The upstreams that will not become DONE unless an operator acts (CANCELLED is final, a
    FAILED one only a RetryTask revives)."""
    return [u for u in upstreams if u.state in _NEVER_DONE]


def describe_never_done(dead: Sequence[TaskRecord]) -> str:
    """``a (CANCELLED), b (FAILED)``: names the upstreams a dependent can never get past."""
    return ", ".join(f"{u.task_id} ({u.state.name})" for u in dead)


def check_upstreams(upstreams: Sequence[TaskRecord]) -> None:
    """Refuse a new edge to an upstream that is CANCELLED or FAILED: the dependent would be
    blocked from the start (an existing edge to one stays: the dependent is marked blocked,
    domain/waiting.py)."""
    dead = never_done(upstreams)
    if dead:
        raise FailedPrecondition(
            f"depends_on names tasks that are not going to be DONE: {describe_never_done(dead)}; "
            "a dependent would be blocked from the start (RetryTask a FAILED upstream first)"
        )


def unmet(upstreams: Sequence[TaskRecord]) -> list[str]:
    """The upstreams that are not DONE, in the given order. Only DONE releases dependents."""
    return [u.task_id for u in upstreams if u.state is not TaskState.DONE]


def satisfied_by(upstreams: Sequence[TaskRecord]) -> tuple[str, ...]:
    """``upstream@revision`` of each (DONE) upstream round that releases a dependent."""
    return tuple(f"{u.task_id}@{u.revision}" for u in upstreams)
