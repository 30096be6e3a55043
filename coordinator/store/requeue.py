"""What follows a transition the retry decision chose (domain/retry.py), once its txn landed:
the ready hint for a task READY again, the retry and dead-letter counts, a log line."""

from __future__ import annotations

import structlog

from coordinator.domain.records import TaskRecord
from coordinator.domain.retry import AttemptEnded
from coordinator.domain.states import TaskState
from coordinator.store.context import StoreContext
from coordinator.store.ready_index import ReadyIndex

log = structlog.get_logger(__name__)


def settled(ctx: StoreContext, ready: ReadyIndex, after: TaskRecord, ended: AttemptEnded) -> None:
    """``after`` was written by a retry decision on an attempt that ended as ``ended``."""
    end = ended.end.name.lower()
    if after.state is TaskState.FAILED:
        reason = after.dead_letter_reason.name.lower()
        ctx.metrics.count_dead_letter(after.queue, reason)
        ctx.metrics.observe_attempts(after.attempt)  # final: no attempt follows a dead letter
        log.warning(
            "task dead-lettered",
            task_id=after.task_id,
            queue=after.queue,
            reason=reason,
            attempts=after.attempt,
            last_error=ended.error,
        )
        return
    ctx.metrics.count_retry(after.queue, end, delayed=after.state is TaskState.DELAYED)
    if after.state is TaskState.READY:
        ready.add(ctx.keys.ready(after.queue, after.priority, after.ready_seq, after.task_id))
