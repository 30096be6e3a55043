"""RetryTask: an operator sends a FAILED task (the dead letter) back to the queue.

The task becomes READY with a fresh attempt budget (its attempts so far no longer count against
its retry policy) in one CAS with its "retry" event. A task whose schedule_to_close deadline
passed (TIMED_OUT, or timed out since it failed) needs a new one, ``schedule_to_close`` from
now: with the old one it could never be claimed (domain/retry.py, ``retried_deadline``).

Repeating the call is harmless: a task whose latest transition is that retry (READY, nothing
happened to it since) is returned as it is. Any other task that is not FAILED is refused, a
task never dead-lettered too: a retry only undoes a dead letter.
"""

from __future__ import annotations

from coordinator.domain.records import TaskRecord
from coordinator.domain.retry import retried_deadline
from coordinator.domain.states import DeadLetterReason, Op, TaskState
from coordinator.errors import FailedPrecondition, NotFound
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd import KV, get, get_newest
from coordinator.store.events import event_from_kv
from coordinator.store.ready_index import ReadyIndex
from coordinator.store.transition import transition, transition_ops

_CAS_TRIES = 8


class DeadLetters:
    """RetryTask on the store."""

    def __init__(self, ctx: StoreContext, ready: ReadyIndex) -> None:
        self._ctx = ctx
        self._ready = ready

    def retry(
        self, task_id: str, *, by: str, reason: str, schedule_to_close: float = 0.0
    ) -> TaskRecord:
        """FAILED -> READY with a fresh budget (and, with ``schedule_to_close``, a deadline that
        far from now); FailedPrecondition for other states, and for a passed deadline not
        replaced."""
        ctx, keys = self._ctx, self._ctx.keys
        for _ in range(_CAS_TRIES):
            # The record and its latest event, at one revision: the event says whether the
            # task is where a retry put it.
            read = ctx.kv.read(get(keys.task(task_id)), get_newest(keys.events_prefix(task_id)))
            kv = read.range_one(0)
            if kv is None:
                raise NotFound(f"task {task_id!r} does not exist")
            task = task_from_kv(kv)
            if task.state is TaskState.READY and _last_op(read.range_one(1)) is Op.RETRY:
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
                deadline=retried_deadline(task, now, schedule_to_close),
            )
            compares, ops = transition_ops(ctx, task, after, Op.RETRY, by=by, detail=reason)
            result = ctx.kv.txn(compares, ops)
            if result.succeeded:
                self._ready.add(
                    keys.ready(after.queue, after.priority, after.ready_seq, after.task_id)
                )
                return task_from_kv(ctx.kv.get(keys.task(task_id)) or kv)
        raise FailedPrecondition(f"task {task_id!r} kept changing; retry it again")


def _last_op(event: KV | None) -> Op | None:
    """The op of a task's latest event (None: no event read)."""
    return event_from_kv(event).record.op if event is not None else None
