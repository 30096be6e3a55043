"""What a WAITING task is waiting for, and what its upstreams decide for it (pure, no I/O).

"Not ready" is not "failed" (the lifecycle spec): a dependent never ends because of its
upstreams or of a deadline it could not meet while it could not run.

- An upstream that is FAILED (a dead letter) or CANCELLED blocks its dependents: they stay
  WAITING, with ``blocked_by`` naming it, never claimable. A FAILED upstream may be retried
  (RetryTask) and still commit; the releaser then clears the mark and releases them as usual.
  Ending the graph below a task is an operator's explicit act (CancelTask with cascade).
- A WAITING task whose schedule_to_close passes is marked overdue (``overdue_at``), not failed.
  When it is released later, the deadline is waived: it was spent waiting on upstreams the task
  could not help, and enforcing it on release would fail the task before any worker saw it,
  which is the business failure the deadline must not declare. The task then runs under its
  retry policy and lease bounds like any task without a schedule_to_close.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from coordinator.domain.graph import satisfied_by
from coordinator.domain.records import TaskRecord
from coordinator.domain.states import TaskState, WaitingReason

# Upstream states that can never release a dependent unless an operator acts.
_BLOCKING = frozenset({TaskState.FAILED, TaskState.CANCELLED})


def waiting_reason(task: TaskRecord) -> WaitingReason:
    """Why ``task`` waits (NONE when it is not WAITING)."""
    if task.state is not TaskState.WAITING:
        return WaitingReason.NONE
    return WaitingReason.UPSTREAM_FAILED if task.blocked_by else WaitingReason.UPSTREAMS_PENDING


def blocking(upstreams: Sequence[TaskRecord]) -> tuple[str, ...]:
    """The ids of the upstreams that block a dependent (FAILED or CANCELLED), in order."""
    return tuple(u.task_id for u in upstreams if u.state in _BLOCKING)


@dataclass(frozen=True)
class Release:
    """Every upstream is DONE: WAITING -> READY, released by these upstream rounds."""

    satisfied_by: tuple[str, ...]


@dataclass(frozen=True)
class Reblock:
    """Still WAITING, but the set of blocking upstreams changed: rewrite ``blocked_by``."""

    blocked_by: tuple[str, ...]


@dataclass(frozen=True)
class KeepWaiting:
    """Nothing to write: some upstream is not DONE and the blocked mark is current."""


Settlement = Release | Reblock | KeepWaiting


def settle(task: TaskRecord, upstreams: Sequence[TaskRecord]) -> Settlement:
    """What the releaser writes for the WAITING ``task`` given its upstreams as read now."""
    blocked = blocking(upstreams)
    if blocked != task.blocked_by:
        return Reblock(blocked)
    if all(u.state is TaskState.DONE for u in upstreams):
        return Release(satisfied_by(upstreams))
    return KeepWaiting()


def describe_blocked(task_id: str, upstreams: Sequence[TaskRecord], blocked: Sequence[str]) -> str:
    """The event detail of a Reblock: which upstreams block ``task_id`` now, and in what
    state, or that none does any more."""
    if not blocked:
        return "no upstream is FAILED or CANCELLED any more: waiting for upstreams to be DONE"
    states = {u.task_id: u.state.name for u in upstreams}
    named = ", ".join(f"{u} ({states.get(u, '?')})" for u in blocked)
    ways = []
    if any(states.get(u) != TaskState.CANCELLED.name for u in blocked):
        ways.append("retry a FAILED one (`tasks retry`)")
    if any(states.get(u) == TaskState.CANCELLED.name for u in blocked):
        ways.append(
            f"a CANCELLED one never runs again: change {task_id}'s upstreams "
            f"(`tasks deps {task_id} --set`/`--clear`) or cancel {task_id}"
        )
    return f"blocked by {named}: {task_id} stays WAITING until each is DONE; " + "; ".join(ways)


def is_overdue(task: TaskRecord, now: float) -> bool:
    """Whether ``task`` is WAITING past its schedule_to_close and not yet marked overdue."""
    return (
        task.state is TaskState.WAITING
        and bool(task.deadline)
        and task.deadline <= now
        and not task.overdue_at
    )


def released(task: TaskRecord, now: float) -> TaskRecord:
    """``task`` as it leaves WAITING at ``now``: a deadline that passed while it waited (marked
    overdue or not yet) is waived, and the task keeps ``overdue_at`` to say so; a deadline
    still ahead stays. Nothing blocks a task that left WAITING."""
    if task.deadline and task.deadline <= now:
        return replace(task, deadline=0.0, overdue_at=task.overdue_at or now, blocked_by=())
    return replace(task, blocked_by=())
