"""RetryTask: an operator sends a FAILED task (the dead letter) back to the queue.

The task becomes READY with a fresh attempt budget (its attempts so far no longer count against
its retry policy) in one CAS with its "retry" event. Repeating the call is harmless: a task
already back in the queue with no attempt counted since is returned as it is.
"""

from __future__ import annotations

from coordinator.domain.records import TaskRecord
from coordinator.domain.retry import attempts_counted
from coordinator.domain.states import DeadLetterReason, Op, TaskState
from coordinator.errors import FailedPrecondition, NotFound
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.ready_index import ReadyIndex
from coordinator.store.transition import transition, transition_ops

_CAS_TRIES = 8
# States a retried task may be in before its next attempt counts: a repeated RetryTask sees it.
_REQUEUED = frozenset({TaskState.READY, TaskState.DELAYED, TaskState.CLAIMED})


class DeadLetters:
    """RetryTask on the store."""

    def __init__(self, ctx: StoreContext, ready: ReadyIndex) -> None:
        self._ctx = ctx
        self._ready = ready

    def retry(self, task_id: str, *, by: str, reason: str) -> TaskRecord:
        """FAILED -> READY with a fresh budget; FailedPrecondition for other states."""
        ctx, keys = self._ctx, self._ctx.keys
        for _ in range(_CAS_TRIES):
            kv = ctx.kv.get(keys.task(task_id))
            if kv is None:
                raise NotFound(f"task {task_id!r} does not exist")
            task = task_from_kv(kv)
            if task.state in _REQUEUED and attempts_counted(task) == 0:
                return task  # a repeat: already back with a fresh budget
            if task.state is not TaskState.FAILED:
                raise FailedPrecondition(
                    f"task {task_id!r} is {task.state.name}; only a FAILED task can be retried"
                )
            now = ctx.clock.now()
            after = transition(
                task,
                Op.RETRY,
                now,
                attempts_base=task.attempt,
                dead_letter_reason=DeadLetterReason.NONE,
            )
            compares, ops = transition_ops(ctx, task, after, Op.RETRY, by=by, detail=reason)
            result = ctx.kv.txn(compares, ops)
            if result.succeeded:
                self._ready.add(
                    keys.ready(after.queue, after.priority, after.ready_seq, after.task_id)
                )
                return task_from_kv(ctx.kv.get(keys.task(task_id)) or kv)
        raise FailedPrecondition(f"task {task_id!r} kept changing; retry it again")
