"""Producer-side task operations: create, read, list, cancel, change input.

Cancel and input change end a live claim in the same txn (claim key deleted, attempt closed),
so the holder's next acceptance point fails its fence compares and reads CANCELLED or
STALE_INPUT.
"""

from __future__ import annotations

import builtins
from dataclasses import replace

from coordinator.domain.digests import check_digest
from coordinator.domain.records import AttemptRecord, TaskRecord, encode
from coordinator.domain.states import AttemptEnd, Op, TaskState, is_legal
from coordinator.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from coordinator.store.context import StoreContext, attempt_from_kv, new_task_id, task_from_kv
from coordinator.store.etcd import RequestOp, delete, put
from coordinator.store.ready_index import ReadyIndex
from coordinator.store.transition import ready_seq, transition, transition_ops
from coordinator.store.types import TaskSpec

# Producer writes race only with claims and other producers; they retry their CAS this often.
_CAS_TRIES = 8


class TaskStore:
    """CreateTask, GetTask, ListTasks, CancelTask, UpdateInput."""

    def __init__(self, ctx: StoreContext, ready: ReadyIndex) -> None:
        self._ctx = ctx
        self._ready = ready

    def create(self, spec: TaskSpec, *, by: str) -> TaskRecord:
        """Create a READY task; AlreadyExists if the id is taken."""
        ctx = self._ctx
        now = ctx.clock.now()
        task_id = spec.task_id or new_task_id()
        digest = check_digest("input_digest", spec.input_digest, data=spec.input)
        draft = TaskRecord(
            task_id=task_id,
            queue=spec.queue,
            input_digest=digest,
            state=TaskState.READY,
            priority=spec.priority,
            input=spec.input,
            root_task_id=task_id,
            thread_key=task_id,
            requires_review=spec.requires_review,
            non_replayable=spec.non_replayable,
            created_at=now,
        )
        task = replace(draft, updated_at=now, ready_seq=ready_seq(now))
        compares, ops = transition_ops(ctx, None, task, Op.CREATE, by=by)
        result = ctx.kv.txn(compares, ops)
        if not result.succeeded:
            raise AlreadyExists(f"task {task_id!r} already exists")
        self._ready.add(ctx.keys.ready(task.queue, task.priority, task.ready_seq, task_id))
        return replace(task, state_version=result.revision)

    def get(self, task_id: str) -> TaskRecord:
        """The task, or NotFound."""
        kv = self._ctx.kv.get(self._ctx.keys.task(task_id))
        if kv is None:
            raise NotFound(f"task {task_id!r} does not exist")
        return task_from_kv(kv)

    def attempts(self, task_id: str) -> list[AttemptRecord]:
        """Every attempt of the task, oldest first."""
        prefix = self._ctx.keys.attempts_prefix(task_id)
        kvs, _ = self._ctx.kv.range_page(prefix, self._ctx.kv.prefix_end(prefix))
        return sorted((attempt_from_kv(kv) for kv in kvs), key=lambda a: a.attempt)

    def list(
        self,
        *,
        queue: str = "",
        state: TaskState | None = None,
        page_size: int = 100,
        page_token: str = "",
    ) -> tuple[list[TaskRecord], str]:
        """Tasks in id order after ``page_token``, filtered; returns the page and the next token."""
        kv, prefix = self._ctx.kv, self._ctx.keys.tasks_prefix
        start = prefix + page_token + "\0" if page_token else prefix
        end = kv.prefix_end(prefix)
        found: list[TaskRecord] = []
        while len(found) < page_size:
            page, _ = kv.range_page(start, end, limit=page_size)
            for item in page:
                task = task_from_kv(item)
                if (not queue or task.queue == queue) and (state is None or task.state is state):
                    found.append(task)
                    if len(found) == page_size:
                        return found, task.task_id
            if len(page) < page_size:
                return found, ""
            start = page[-1].key + "\0"
        return found, ""

    def cancel(self, task_id: str, *, by: str, reason: str) -> TaskRecord:
        """Cancel: cancel_generation + 1, CANCELLED, a live claim ended."""
        for _ in range(_CAS_TRIES):
            task = self.get(task_id)
            if task.state is TaskState.CANCELLED:
                return task
            if not is_legal(task.state, Op.CANCEL):
                raise FailedPrecondition(
                    f"task {task_id!r} is {task.state.name}; it cannot be cancelled"
                )
            now = self._ctx.clock.now()
            after = transition(
                task, Op.CANCEL, now, cancel_generation=task.cancel_generation + 1, lease_id=0
            )
            if self._write_ending_claim(task, after, Op.CANCEL, AttemptEnd.CANCELLED, by, reason):
                return self.get(task_id)
        raise FailedPrecondition(f"task {task_id!r} kept changing; cancel again")

    def update_input(
        self, task_id: str, *, data: bytes, input_digest: str, expected_revision: int, by: str
    ) -> TaskRecord:
        """New input: revision + 1, a live claim ended (its commit becomes STALE_INPUT)."""
        digest = check_digest("input_digest", input_digest, data=data)
        for _ in range(_CAS_TRIES):
            task = self.get(task_id)
            if expected_revision and expected_revision != task.revision:
                raise FailedPrecondition(
                    f"task {task_id!r} is at revision {task.revision}, expected {expected_revision}"
                )
            if not is_legal(task.state, Op.UPDATE_INPUT):
                raise FailedPrecondition(
                    f"task {task_id!r} is {task.state.name}; its input is final"
                )
            if digest == task.input_digest:
                raise InvalidArgument("the new input is identical to the current input")
            now = self._ctx.clock.now()
            after = transition(
                task,
                Op.UPDATE_INPUT,
                now,
                input=data,
                input_digest=digest,
                revision=task.revision + 1,
                lease_id=0,
            )
            if self._write_ending_claim(
                task, after, Op.UPDATE_INPUT, AttemptEnd.STALE_INPUT, by, ""
            ):
                return self.get(task_id)
        raise FailedPrecondition(f"task {task_id!r} kept changing; update again")

    def _write_ending_claim(
        self, task: TaskRecord, after: TaskRecord, op: Op, end: AttemptEnd, by: str, detail: str
    ) -> bool:
        """Write a producer transition; if the task was CLAIMED, end that claim in the same txn."""
        ctx, keys = self._ctx, self._ctx.keys
        compares, ops = transition_ops(
            ctx,
            task,
            after,
            op,
            by=by,
            attempt_id=task.attempt_id,
            generation=task.claim_generation,
            epoch=task.scheduler_epoch,
            detail=detail,
        )
        claimed = task.state is TaskState.CLAIMED
        if claimed:
            ops += [
                delete(keys.claim(task.task_id)),
                *self._close_attempt(task, end, after.updated_at),
            ]
        if not ctx.kv.txn(compares, ops).succeeded:
            return False
        if claimed:
            ctx.kv.revoke(task.lease_id)
        if after.state is TaskState.READY:
            self._ready.add(keys.ready(after.queue, after.priority, after.ready_seq, after.task_id))
        return True

    def _close_attempt(
        self, task: TaskRecord, end: AttemptEnd, now: float
    ) -> builtins.list[RequestOp]:
        key = self._ctx.keys.attempt(task.task_id, task.attempt_id)
        kv = self._ctx.kv.get(key)
        if kv is None:
            return []
        return [put(key, encode(replace(attempt_from_kv(kv), end=end, ended_at=now)))]
