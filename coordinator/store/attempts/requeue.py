"""A held attempt's end and what the retry decision (domain/retry.py) makes of its task: the
txn that ends it (Release and Fail build it alike), then, once it landed, the ready hint for a
task READY again, the retry and dead-letter counts, a log line."""

from __future__ import annotations

import structlog

from coordinator.domain.decisions import Fence, FenceView
from coordinator.domain.records import AttemptRecord, TaskRecord
from coordinator.domain.retry import AttemptEnded, decide_after
from coordinator.domain.states import Op, TaskState
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import Compare, RequestOp, delete
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.transition import held_transition_ops, put_attempt, transition

log = structlog.get_logger(__name__)


def ending_txn(
    ctx: StoreContext,
    view: FenceView,
    fence: Fence,
    ended: AttemptEnded,
    closed: AttemptRecord,
    *,
    at_once: Op,
    by: str,
    now: float,
) -> tuple[TaskRecord, list[Compare], list[RequestOp]]:
    """The txn ending the attempt ``fence`` holds as ``closed`` (released, failed): the task
    moved as its retry policy decides (``at_once`` when it runs again now), the fence compares,
    the closed attempt record and the claim key's deletion."""
    task, keys = view.task, ctx.keys
    retry = decide_after(task, ended, now, at_once=at_once)
    after = transition(
        task,
        retry.op,
        now,
        claim_generation=fence.claim_generation,
        lease_id=0,
        **retry.changes(task, ended),
    )
    compares, ops = held_transition_ops(
        ctx, task, after, retry.op, fence, by=by, detail=retry.detail
    )
    put_attempt(ctx, ops, closed)
    ops.append(delete(keys.claim(task.task_id)))
    return after, compares, ops


def settled(ctx: StoreContext, ready: ReadyIndex, after: TaskRecord, ended: AttemptEnded) -> None:
    """``after`` was written by a retry decision on an attempt that ended as ``ended``."""
    end = ended.end.name.lower()
    ctx.metrics.count_attempt_end(after.queue, end, ended.code)
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
    wait = after.not_before - after.updated_at if after.state is TaskState.DELAYED else 0.0
    ctx.metrics.count_retry(after.queue, end, wait=wait)
    if after.state is TaskState.READY:
        ready.add(ctx.keys.ready(after.queue, after.priority, after.ready_seq, after.task_id))
