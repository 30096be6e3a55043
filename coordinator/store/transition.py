"""How one task transition is written: task record, index keys and event in one txn.

A task moves between states only through ``transition()``: it checks the move against the
domain's table, and ``transition_ops()`` returns the compare and the writes that keep the ready
index, the claimed index, the waiting index and the event log in step with the record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coordinator import request_ids
from coordinator.domain.attempt_in_record import recorded_attempt
from coordinator.domain.decisions import Fence
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import AttemptRecord, EventRecord, TaskRecord, encode, with_changes
from coordinator.domain.states import UNCOMMITTED_STATES, AttemptEnd, Op, TaskState, next_state
from coordinator.domain.waiting import released
from coordinator.store.context import StoreContext, attempt_of
from coordinator.store.etcd.ops import (
    Compare,
    RequestOp,
    create_revision_is,
    delete,
    mod_revision_is,
    put,
)
from coordinator.store.fence import fence_compares
from coordinator.store.retention_index import retention_ops
from coordinator.store.task_inputs import input_ops


def transition(before: TaskRecord, op: Op, now: float, **changes: Any) -> TaskRecord:
    """``before`` after ``op``: the next state from the domain table, plus ``changes``.

    The record stops describing the attempt (``attempt_in_record``) unless ``changes`` say it
    still does (a claim and a commit of schema 3): ``transition_ops`` then writes its key."""
    state = next_state(before.state, op, requires_review=before.requires_review)
    changes.setdefault("attempt_in_record", False)
    after = with_changes(before, state=state, updated_at=now, **changes)
    if state is TaskState.READY and before.state is not TaskState.READY:
        after = with_changes(after, ready_seq=ready_seq(now))
        if before.state not in _RETRIES or after.revision != before.revision or not after.ready_at:
            after = with_changes(after, ready_at=now)
    if state is not TaskState.READY:
        after = with_changes(after, ready_seq=0)
    if state is not TaskState.DELAYED:
        after = with_changes(after, not_before=0.0)
    if before.state is TaskState.WAITING and state is not TaskState.WAITING:
        after = released(after, now)
    return after


# Back to READY for another attempt at the same revision: READY -> commit keeps counting.
_RETRIES = frozenset({TaskState.CLAIMED, TaskState.NEEDS_APPROVAL, TaskState.DELAYED})


def ready_seq(now: float) -> int:
    """FIFO position in the ready index (microseconds; ties are broken by task id)."""
    return int(now * 1_000_000)


def ready_time(seq: int) -> float:
    """The store clock time (seconds) a ready sequence was taken at: ``ready_seq``'s inverse."""
    return seq / 1_000_000


def transition_ops(
    ctx: StoreContext,
    before: TaskRecord | None,
    after: TaskRecord,
    op: Op,
    *,
    by: str,
    attempt_id: str = "",
    generation: int = 0,
    epoch: int = 0,
    detail: str = "",
) -> tuple[list[Compare], list[RequestOp]]:
    """The compares (first, the task is as read) and the writes of one transition."""
    keys = ctx.keys
    task_key = keys.task(after.task_id)
    if before is None:
        compares = [create_revision_is(task_key, 0)]
    else:
        compares = [mod_revision_is(task_key, before.state_version)]
    ops = [put(task_key, encode(after)), *input_ops(keys, before, after)]
    ops += _attempt_kept(ctx, before, after)
    was = before.state if before is not None else None
    ops += _moved(ctx, _ready_key, before, after)
    # The delayed index lets the promoter read only the DELAYED tasks that are due.
    ops += _moved(ctx, delayed_key, before, after)
    # The deadline index lets the enforcer read only the tasks whose deadline passed.
    ops += _moved(ctx, deadline_key, before, after)
    if was is TaskState.CLAIMED and after.state is not TaskState.CLAIMED:
        ops.append(delete(keys.claimed(after.task_id)))
    if after.state is TaskState.CLAIMED:
        # The queue as value: the claimed index counts claims per queue without task records.
        ops.append(put(keys.claimed(after.task_id), after.queue.encode()))
    # The waiting index lets the releaser's scan visit only WAITING tasks.
    if was is TaskState.WAITING and after.state is not TaskState.WAITING:
        ops.append(delete(keys.waiting(after.task_id)))
    if after.state is TaskState.WAITING and was is not TaskState.WAITING:
        ops.append(put(keys.waiting(after.task_id), b""))
    # The blocked and overdue indexes count WAITING tasks per queue (the queue as value) and
    # let doctor and the console find them without reading every record.
    ops += _moved(ctx, blocked_key, before, after, value=after.queue.encode())
    ops += _moved(ctx, overdue_key, before, after, value=after.queue.encode())
    event = EventRecord(
        task_id=after.task_id,
        op=op,
        from_state=was,
        to_state=after.state,
        at=after.updated_at,
        by=by,
        attempt_id=attempt_id,
        claim_generation=generation,
        scheduler_epoch=epoch,
        detail=detail,
        request_id=request_ids.current(),
    )
    prev_version = before.state_version if before is not None else 0
    ops.append(put(keys.event(after.task_id, prev_version), encode(event)))
    # The prune index (a terminal move) and the pruned-id guard (a create).
    more_compares, more_ops = retention_ops(ctx, before, after)
    return compares + more_compares, ops + more_ops


def _attempt_kept(
    ctx: StoreContext, before: TaskRecord | None, after: TaskRecord
) -> list[RequestOp]:
    """The put that gives ``before``'s attempt its own key when the record ``after`` no longer
    describes it (schema 3): a move ending the attempt replaces it with the attempt closed
    (``put_attempt``), any other move keeps it as it was."""
    if before is None or not before.attempt_in_record:
        return []
    if after.attempt_in_record and after.attempt_id == before.attempt_id:
        return []  # a commit: the record still describes the attempt
    kept = recorded_attempt(before)
    if kept is None:
        return []
    return [put(ctx.keys.attempt(kept.task_id, kept.attempt_id), encode(kept))]


def put_attempt(ctx: StoreContext, ops: list[RequestOp], attempt: AttemptRecord) -> None:
    """Append to a transition's ``ops`` the put of ``attempt`` (closed by the move), in place of
    the put ``transition_ops`` made of it as it was: etcd refuses a txn that names a key twice."""
    key = ctx.keys.attempt(attempt.task_id, attempt.attempt_id)
    raw = key.encode()
    ops[:] = [op for op in ops if op.request_put.key != raw]
    ops.append(put(key, encode(attempt)))


def held_transition_ops(
    ctx: StoreContext,
    before: TaskRecord,
    after: TaskRecord,
    op: Op,
    fence: Fence,
    *,
    by: str,
    detail: str = "",
) -> tuple[list[Compare], list[RequestOp]]:
    """``transition_ops`` for a move that ends the attempt ``fence`` holds (commit, release,
    fail, give-back): the writes of the move behind ``fence_compares``.

    The fence already compares the task key's ``mod_revision`` to the generation, and the
    holder decides on a task at that revision (``check_fence``), so the move's own compare of
    the same key is the same compare twice: it is left out. It stays only where the view's
    revision differs from the generation, so the txn is never less strict than both."""
    compares, ops = transition_ops(
        ctx,
        before,
        after,
        op,
        by=by,
        attempt_id=fence.attempt_id,
        generation=fence.claim_generation,
        epoch=fence.scheduler_epoch,
        detail=detail,
    )
    if before.state_version == fence.claim_generation:
        compares = compares[1:]  # transition_ops puts the task's compare first
    return fence_compares(ctx.keys, fence) + compares, ops


def _moved(
    ctx: StoreContext,
    index_key: Callable[[Keyspace, TaskRecord], str | None],
    before: TaskRecord | None,
    after: TaskRecord,
    *,
    value: bytes = b"",
) -> list[RequestOp]:
    """The writes that move a task's key in one index (``index_key``: None when the task is
    not in it) from ``before`` to ``after``, with ``value``. etcd refuses a txn that names one
    key twice, so an unchanged key is left alone."""
    old = index_key(ctx.keys, before) if before is not None else None
    new = index_key(ctx.keys, after)
    ops = []
    if old is not None and old != new:
        ops.append(delete(old))
    if new is not None and new != old:
        ops.append(put(new, value))
    return ops


def _ready_key(keys: Keyspace, task: TaskRecord) -> str | None:
    if task.state is not TaskState.READY:
        return None
    return keys.ready(task.queue, task.priority, task.ready_seq, task.task_id)


def deadline_key(keys: Keyspace, task: TaskRecord) -> str | None:
    """The deadline-index key ``task`` has: while it awaits a result, if it has a deadline
    (doctor checks the index against it). A WAITING task marked overdue leaves the index: its
    deadline was handled (domain/waiting.py), and a pass must not read it again and again."""
    if not task.deadline or task.state not in UNCOMMITTED_STATES:
        return None
    if task.state is TaskState.WAITING and task.overdue_at:
        return None
    return keys.deadline(task.deadline, task.task_id)


def blocked_key(keys: Keyspace, task: TaskRecord) -> str | None:
    """The blocked-index key ``task`` has: while it is WAITING with a FAILED or CANCELLED
    upstream."""
    if task.state is not TaskState.WAITING or not task.blocked_by:
        return None
    return keys.blocked(task.task_id)


def overdue_key(keys: Keyspace, task: TaskRecord) -> str | None:
    """The overdue-index key ``task`` has: while it is WAITING past its schedule_to_close."""
    if task.state is not TaskState.WAITING or not task.overdue_at:
        return None
    return keys.overdue(task.task_id)


def delayed_key(keys: Keyspace, task: TaskRecord) -> str | None:
    """The delayed-index key ``task`` has: while it is DELAYED, at its not_before."""
    if task.state is not TaskState.DELAYED:
        return None
    return keys.delayed(task.not_before, task.task_id)


@dataclass(frozen=True)
class ClaimlessMove:
    """A transition of a task nobody holds (READY, or CLAIMED with its claim key gone): the
    record after it, the txn's compares and ops, and the attempt it closes as EXPIRED."""

    after: TaskRecord
    compares: list[Compare]
    ops: list[RequestOp]
    closed: AttemptRecord | None


def claimless_move(
    ctx: StoreContext,
    task: TaskRecord,
    op: Op,
    now: float,
    *,
    by: str,
    epoch: int,
    detail: str,
    **changes: Any,
) -> ClaimlessMove:
    """``op`` on a task nobody holds (the reclaim, a hold for approval, a reconcile escalation):
    the transition (with ``changes``), a compare that no claim key exists (a new claim in
    between aborts it), and the close of the attempt whose claim ended."""
    after = transition(task, op, now, lease_id=0, **changes)
    compares, ops = transition_ops(
        ctx,
        task,
        after,
        op,
        by=by,
        attempt_id=task.attempt_id,
        generation=task.claim_generation,
        epoch=epoch,
        detail=detail,
    )
    compares.append(create_revision_is(ctx.keys.claim(task.task_id), 0))
    closed = close_attempt(ctx, ops, task, AttemptEnd.EXPIRED, now)
    return ClaimlessMove(after, compares, ops, closed)


def close_attempt(
    ctx: StoreContext, ops: list[RequestOp], task: TaskRecord, end: AttemptEnd, now: float
) -> AttemptRecord | None:
    """Put the attempt of a CLAIMED ``task``, closed as ``end`` at ``now``, into ``ops`` (a
    transition's, in place of its as-it-was put: ``put_attempt``); the attempt closed, or None
    if the task is not CLAIMED or its attempt is nowhere (neither a key nor its record)."""
    if task.state is not TaskState.CLAIMED or not task.attempt_id:
        return None
    kv = ctx.kv.get(ctx.keys.attempt(task.task_id, task.attempt_id))
    attempt = attempt_of(task, task.attempt_id, kv)
    if attempt is None:
        return None
    closed = with_changes(attempt, end=end, ended_at=now)
    put_attempt(ctx, ops, closed)
    return closed
