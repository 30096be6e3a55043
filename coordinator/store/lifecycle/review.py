"""Accept and Reject: a reviewer's decision about one revision of a task in REVIEW.

Each reads the task and the canonical result of its current revision, lets the domain check
the reviewer (not the executor), the revision and the state, and writes the transition behind a
compare on the task record as read: a decision about revision N can never land on revision N+1.
Reject opens a new round (revision + 1, READY); the old result stays under its own revision.
"""

from __future__ import annotations

from coordinator.domain.records import ResultRecord, TaskRecord, decode
from coordinator.domain.review import ReviewAction, ReviewDecision, check_review
from coordinator.domain.states import Op, TaskState
from coordinator.errors import FailedPrecondition, NotFound
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import KV, create_revision_is
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.transition import transition, transition_ops

_CAS_TRIES = 8


class ReviewStore:
    """Accept and Reject."""

    def __init__(self, ctx: StoreContext, ready: ReadyIndex) -> None:
        self._ctx = ctx
        self._ready = ready

    def accept(self, task_id: str, *, revision: int, reviewer: str) -> TaskRecord:
        """REVIEW -> DONE for ``revision``; a retry after it landed returns the DONE task."""
        return self._decide(task_id, ReviewDecision.ACCEPT, revision, reviewer, "")

    def reject(self, task_id: str, *, revision: int, reviewer: str, reason: str) -> TaskRecord:
        """REVIEW -> READY at revision + 1; the rejected result stays in history."""
        return self._decide(task_id, ReviewDecision.REJECT, revision, reviewer, reason)

    def _decide(
        self, task_id: str, decision: ReviewDecision, revision: int, reviewer: str, reason: str
    ) -> TaskRecord:
        ctx = self._ctx
        for _ in range(_CAS_TRIES):
            task, result_kv = self._read(task_id)
            result = decode(ResultRecord, result_kv.value) if result_kv is not None else None
            action = check_review(
                task, result, decision=decision, revision=revision, reviewer=reviewer
            )
            if action is ReviewAction.ALREADY_APPLIED:
                return task
            # check_review refuses a REVIEW task without a canonical result.
            assert result is not None and result_kv is not None
            now = ctx.clock.now()
            if decision is ReviewDecision.ACCEPT:
                op, after = Op.ACCEPT, transition(task, Op.ACCEPT, now)
                detail = f"accepted revision {revision}"
            else:
                op = Op.REJECT
                after = transition(
                    task,
                    Op.REJECT,
                    now,
                    revision=task.revision + 1,
                    result_commit_id="",
                    result_digest="",
                )
                detail = f"rejected revision {revision}: {reason}"
            compares, ops = transition_ops(
                ctx,
                task,
                after,
                op,
                by=reviewer,
                attempt_id=result.attempt_id,
                generation=result.claim_generation,
                epoch=result.scheduler_epoch,
                detail=detail,
            )
            # The result reviewed is the one that stays canonical for this revision.
            compares.append(
                create_revision_is(
                    ctx.keys.result(task_id, task.revision), result_kv.create_revision
                )
            )
            if ctx.kv.txn(compares, ops).succeeded:
                if after.state is TaskState.READY:
                    self._ready.add(
                        ctx.keys.ready(after.queue, after.priority, after.ready_seq, task_id)
                    )
                return self._read(task_id)[0]
        raise FailedPrecondition(f"task {task_id!r} kept changing; review it again")

    def _read(self, task_id: str) -> tuple[TaskRecord, KV | None]:
        keys = self._ctx.keys
        kv = self._ctx.kv.get(keys.task(task_id))
        if kv is None:
            raise NotFound(f"task {task_id!r} does not exist")
        task = task_from_kv(kv)
        return task, self._ctx.kv.get(keys.result(task_id, task.revision))
