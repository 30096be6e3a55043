"""RetryTask: an operator sends a FAILED task (the dead letter) back to the queue.

The task becomes READY with a fresh attempt budget (its attempts so far no longer count against
its retry policy) in one CAS with its "retry" event. A task whose schedule_to_close deadline
passed (TIMED_OUT, or timed out since it failed) needs a new one, ``schedule_to_close`` from
now: with the old one it could never be claimed (domain/retry.py, ``retried_deadline``).

Repeating the call is harmless: a task whose latest transition is that retry (READY, nothing
happened to it since) is returned as it is. Any other task that is not FAILED is refused, a
task never dead-lettered too: a retry only undoes a dead letter.

RetryTasks (``retry_many``) is the same retry over a queue's dead letters picked by a
``DeadLetterFilter`` (domain/bulk_retry.py), a bounded page per call in task-id order. It is
idempotent and resumable without state of its own: a retried task is READY, so it no longer
matches, and the page token is the last id read.
"""

from __future__ import annotations

from coordinator.domain.bulk_retry import MAX_SCAN, BulkRetryPage, DeadLetterFilter, Skipped
from coordinator.domain.records import TaskRecord
from coordinator.domain.retry import retried_deadline
from coordinator.domain.states import DeadLetterReason, Op, TaskState
from coordinator.errors import FailedPrecondition, NotFound
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import KV, get, get_newest
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.lifecycle.events import event_from_kv
from coordinator.store.transition import transition, transition_ops

_CAS_TRIES = 8
_SCAN_PAGE = 250  # task records per etcd range while scanning for dead letters


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

    def retry_many(
        self,
        picked: DeadLetterFilter,
        *,
        limit: int,
        page_token: str = "",
        dry_run: bool = False,
        by: str,
        reason: str,
        schedule_to_close: float = 0.0,
    ) -> BulkRetryPage:
        """``retry`` on each task ``picked`` matches after ``page_token`` (id order), at most
        ``limit`` of them and at most MAX_SCAN records read; with ``dry_run`` only lists them.
        A task RetryTask refuses (it changed, its deadline passed) is skipped with the reason."""
        keys = self._ctx.keys
        start = keys.task(page_token) + "\0" if page_token else keys.tasks_prefix
        end = self._ctx.kv.prefix_end(keys.tasks_prefix)
        retried: list[str] = []
        skipped: list[Skipped] = []
        scanned, last = 0, page_token
        while scanned < MAX_SCAN:
            want = min(_SCAN_PAGE, MAX_SCAN - scanned)
            page, _ = self._ctx.kv.range_page(start, end, limit=want)
            for kv in page:
                task = task_from_kv(kv)
                scanned, last = scanned + 1, task.task_id
                if not picked.matches(task):
                    continue
                if dry_run:
                    retried.append(task.task_id)
                else:
                    self._retry_one(task.task_id, by, reason, schedule_to_close, retried, skipped)
                if len(retried) + len(skipped) >= limit:
                    return BulkRetryPage(tuple(retried), tuple(skipped), last, scanned)
            if len(page) < want:
                return BulkRetryPage(tuple(retried), tuple(skipped), "", scanned)
            start = page[-1].key + "\0"
        return BulkRetryPage(tuple(retried), tuple(skipped), last, scanned)

    def _retry_one(
        self,
        task_id: str,
        by: str,
        reason: str,
        schedule_to_close: float,
        retried: list[str],
        skipped: list[Skipped],
    ) -> None:
        """Retry one picked task; a refusal is a skip with its message, not the call's error:
        one task that cannot go back must not stop the rest of a queue's recovery."""
        try:
            self.retry(task_id, by=by, reason=reason, schedule_to_close=schedule_to_close)
        except (FailedPrecondition, NotFound) as exc:
            skipped.append(Skipped(task_id, str(exc)))
        else:
            retried.append(task_id)


def _last_op(event: KV | None) -> Op | None:
    """The op of a task's latest event (None: no event read)."""
    return event_from_kv(event).record.op if event is not None else None
