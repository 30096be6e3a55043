"""schedule_to_close: a task that can run and whose deadline passed moves to FAILED (TIMED_OUT);
a WAITING one is marked overdue instead.

A task created with a schedule_to_close has a key in the deadline index,
``{p}/deadlines/{deadline_ms:015d}/{task_id}``, for as long as it waits for a result (written and
deleted by the transitions themselves, store/transition.py), so the tasks whose deadline passed
are one range from the start of the index to now: O(passed) per pass. Each time-out is a CAS on
the task as read; a CLAIMED task's claim is ended in the same txn (its claim key deleted, its
attempt closed TIMED_OUT), so the holder's next acceptance point fails its fence compares and
reads FENCED (DEADLINE_EXCEEDED). Every replica runs the pass (store/lifecycle/promoter.py's loop);
a task moves once.

A WAITING task could not run, so its deadline is no business failure (domain/waiting.py): the
pass marks it overdue (``overdue_at``, a ``mark_overdue`` event, the overdue metric and index)
and it stays WAITING, out of the deadline index; its release later waives the deadline.
"""

from __future__ import annotations

import structlog

from coordinator.domain.records import TaskRecord
from coordinator.domain.states import (
    UNCOMMITTED_STATES,
    AttemptEnd,
    DeadLetterReason,
    Op,
    TaskState,
)
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import delete
from coordinator.store.lifecycle.due_index import due_pass
from coordinator.store.transition import close_attempt, transition, transition_ops

log = structlog.get_logger(__name__)

DEADLINES = "coordinator:deadlines"

# Task records (and their running attempts) read per txn: etcd allows 128 operations.
_PAGE = 50


class Deadlines:
    """Moves tasks past their schedule_to_close deadline to FAILED (WAITING ones: overdue)."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    def time_out_due(self) -> int:
        """One pass: time out every task whose deadline passed (a WAITING one: marked
        overdue); returns how many it moved or marked."""
        ctx, keys = self._ctx, self._ctx.keys
        now = ctx.clock.now()
        start, end = keys.deadlines_prefix, keys.deadlines_due_end(now)
        return due_pass(ctx, start, end, lambda tasks: self._time_out(tasks, now), page=_PAGE)

    def _time_out(self, tasks: list[TaskRecord], now: float) -> int:
        moved = 0
        for task in tasks:
            if task.state not in UNCOMMITTED_STATES or not task.deadline or task.deadline > now:
                continue  # moved on meanwhile, or not quite due: the next pass
            write = self._mark_overdue if task.state is TaskState.WAITING else self._write
            if write(task, now):
                moved += 1
        return moved

    def _mark_overdue(self, task: TaskRecord, now: float) -> bool:
        """A WAITING task past its deadline: marked overdue, still WAITING."""
        ctx = self._ctx
        after = transition(task, Op.MARK_OVERDUE, now, overdue_at=now)
        detail = (
            f"schedule_to_close deadline passed {now - task.deadline:.0f} s ago while WAITING: "
            "overdue, not failed; it runs when its upstreams are DONE"
        )
        compares, ops = transition_ops(
            ctx, task, after, Op.MARK_OVERDUE, by=DEADLINES, detail=detail
        )
        if not ctx.kv.txn(compares, ops).succeeded:
            return False  # released, cancelled or edited meanwhile: the next pass reads again
        ctx.metrics.count_overdue(task.queue)
        log.warning("waiting task overdue", task_id=task.task_id, queue=task.queue)
        return True

    def _write(self, task: TaskRecord, now: float) -> bool:
        ctx, keys = self._ctx, self._ctx.keys
        detail = f"schedule_to_close deadline passed after {task.attempt} attempt(s)"
        after = transition(
            task,
            Op.TIME_OUT,
            now,
            lease_id=0,
            dead_letter_reason=DeadLetterReason.TIMED_OUT,
        )
        compares, ops = transition_ops(
            ctx,
            task,
            after,
            Op.TIME_OUT,
            by=DEADLINES,
            attempt_id=task.attempt_id,
            generation=task.claim_generation,
            epoch=task.scheduler_epoch,
            detail=detail,
        )
        if task.state is TaskState.CLAIMED:
            ops.append(delete(keys.claim(task.task_id)))
            close_attempt(ctx, ops, task, AttemptEnd.TIMED_OUT, now)
        if not ctx.kv.txn(compares, ops).succeeded:
            return False  # another replica timed it out, or the task moved on
        if task.state is TaskState.CLAIMED:
            ctx.leases.revoke(task.lease_id)
        self._ctx.metrics.count_dead_letter(task.queue, DeadLetterReason.TIMED_OUT.name.lower())
        self._ctx.metrics.observe_attempts(task.attempt)
        log.warning("task timed out", task_id=task.task_id, queue=task.queue, state=task.state.name)
        return True
