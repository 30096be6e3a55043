"""Producer-side task operations: create (with lineage and dependencies), read, list (by
lineage, queue and state), cancel, change input.

Cancel and input change end a live claim in the same txn (claim key deleted, attempt closed),
so the holder's next acceptance point fails its fence compares and reads CANCELLED or
STALE_INPUT.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator

from coordinator.domain.attempt_in_record import recorded_attempt
from coordinator.domain.digests import check_digest
from coordinator.domain.graph import check_dependencies, check_upstreams, satisfied_by, unmet
from coordinator.domain.lineage import (
    Lineage,
    decide_lineage,
    identity_keys,
    index_value,
    thread_key,
)
from coordinator.domain.records import (
    AttemptRecord,
    EffectIdScheme,
    TaskRecord,
    with_changes,
)
from coordinator.domain.retry import policy_fields
from coordinator.domain.space import WriteKind
from coordinator.domain.states import AttemptEnd, Op, TaskState, is_legal, next_state
from coordinator.domain.versions import INPUT_KEY_SCHEMA
from coordinator.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from coordinator.store.context import StoreContext, attempt_from_kv, new_task_id, task_from_kv
from coordinator.store.etcd.ops import RequestOp, delete, get, get_prefix, mod_revision_is, put
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.lifecycle.dependencies import DependencyStore, edges_detail
from coordinator.store.lifecycle.task_list import READ_BYTES, read_page
from coordinator.store.retention.tombstones import (
    read_tombstones,
    task_not_found,
    tombstone_from_kv,
)
from coordinator.store.task_inputs import input_read, joined
from coordinator.store.transition import close_attempt, ready_seq, transition, transition_ops
from coordinator.store.types import TaskSpec

# Producer writes race only with claims and other producers; they retry their CAS this often.
_CAS_TRIES = 8
ATTEMPTS_PAGE = 100
"""Attempts read at once unless asked otherwise."""
MAX_ATTEMPT_RECORD_BYTES = 128 * 1024
"""The largest stored attempt record: a 64 KiB checkpoint and 16 KiB of error details (the
WorkerService limits), both base64 in JSON (~107 KiB), a 1,024-character error message that
JSON may escape to 6 bytes each, and its ids."""
# Attempt numbers read in one read txn: the most whose records cannot pass READ_BYTES (24). At
# 100 a read of attempts with maximal checkpoints was ~11 MiB, past the 4 MiB message limit,
# and ListAttempts answered INTERNAL.
_READS_PER_TXN = READ_BYTES // MAX_ATTEMPT_RECORD_BYTES


class TaskStore:
    """CreateTask, GetTask, ListTasks, CancelTask, UpdateInput."""

    def __init__(
        self, ctx: StoreContext, ready: ReadyIndex, dependencies: DependencyStore | None = None
    ) -> None:
        self._ctx = ctx
        self._ready = ready
        self._deps = dependencies or DependencyStore(ctx, ready)

    def create(self, spec: TaskSpec, *, by: str) -> TaskRecord:
        """Create a task: READY, or WAITING while any of ``spec.depends_on`` is not DONE.

        AlreadyExists if the id is taken; NotFound for an unknown upstream, root or parent. The
        txn compares every upstream record as read, so an upstream finishing meanwhile is never
        missed (its DONE either precedes this read or sees this task's reverse edge).
        """
        ctx = self._ctx
        task_id = spec.task_id or new_task_id()
        digest = check_digest("input_digest", spec.input_digest, data=spec.input)
        depends_on = check_dependencies(task_id, spec.depends_on)
        policy = ctx.limits.retry.resolve(spec.queue, dict(spec.retry))
        if spec.not_before and depends_on:
            raise InvalidArgument("not_before cannot be combined with depends_on")
        for _ in range(_CAS_TRIES):
            lineage = self._lineage(task_id, spec)
            upstreams = self._deps.upstreams(depends_on)
            check_upstreams(upstreams)
            waiting_on = unmet(upstreams)
            now = ctx.clock.now()
            delayed = spec.not_before > now
            op = Op.CREATE_WAITING if waiting_on else Op.CREATE_DELAYED if delayed else Op.CREATE
            state = next_state(None, op)
            task = with_changes(
                _new_task(ctx, task_id, spec, digest, lineage, state, now),
                depends_on=depends_on,
                satisfied_by=() if waiting_on else satisfied_by(upstreams),
                **policy_fields(policy),
            )
            detail = edges_detail(depends_on) if depends_on else ""
            compares, ops = transition_ops(ctx, None, task, op, by=by, detail=detail)
            compares += [
                mod_revision_is(ctx.keys.task(u.task_id), u.state_version) for u in upstreams
            ]
            ops += self._deps.edge_ops(task_id, (), depends_on)
            ops += self._identity_ops(task)
            result = ctx.kv.txn(
                compares,
                ops,
                [get(ctx.keys.task(task_id)), get(ctx.keys.tombstone(task_id))],
                kind=WriteKind.GROWTH,
            )
            if result.succeeded:
                if state is TaskState.READY:
                    self._ready.add(
                        ctx.keys.ready(task.queue, task.priority, task.ready_seq, task_id)
                    )
                return with_changes(
                    task, state_version=result.revision, created_revision=result.revision
                )
            if result.range_one(0) is not None:
                raise AlreadyExists(f"task {task_id!r} already exists")
            pruned = result.range_one(1)
            if pruned is not None:  # ids are not reused while the tombstone lasts
                raise AlreadyExists(
                    f"task id {task_id!r} was used: {tombstone_from_kv(pruned).describe()}"
                )
        raise FailedPrecondition(
            f"the upstreams of task {task_id!r} kept changing; create it again"
        )

    def _lineage(self, task_id: str, spec: TaskSpec) -> Lineage:
        """Root, parent and thread of a new task, checked against the named records."""
        named = [t for t in (spec.root_task_id, spec.parent_task_id) if t and t != task_id]
        records: dict[str, TaskRecord] = {}
        if named:
            snap = self._ctx.kv.read(*(get(self._ctx.keys.task(t)) for t in named))
            for index, name in enumerate(named):
                kv = snap.range_one(index)
                if kv is not None:
                    records[name] = task_from_kv(kv)
            pruned = [t for t in named if t not in records]
            for name, tombstone in read_tombstones(self._ctx, pruned).items():
                records[name] = tombstone.as_task()  # a pruned root or parent keeps its lineage
        return decide_lineage(
            task_id,
            root_task_id=spec.root_task_id,
            parent_task_id=spec.parent_task_id,
            thread=thread_key(spec.thread_key) if spec.thread_key else "",
            root=records.get(spec.root_task_id),
            parent=records.get(spec.parent_task_id),
        )

    def _identity_ops(self, task: TaskRecord) -> builtins.list[RequestOp]:
        """Index entries for the lineage filters of ListTasks (identity never changes, so they
        are written once, at creation). No compares are needed for root and parent: a root or
        parent that is pruned meanwhile keeps its lineage in its tombstone."""
        return [put(key, b"") for key in identity_keys(self._ctx.keys, task)]

    def get(self, task_id: str) -> TaskRecord:
        """The task with its input, or NotFound."""
        keys = self._ctx.keys
        snap = self._ctx.kv.read(get(keys.task(task_id)), input_read(keys, task_id))
        kv = snap.range_one(0)
        if kv is None:
            raise task_not_found(self._ctx, task_id)
        return joined(task_from_kv(kv), snap.range_one(1))

    def with_input(self, task: TaskRecord) -> TaskRecord:
        """``task`` (a record a call just read or wrote) with its input: the input key read at
        the record's revision when the record keeps its input there (schema 2), for an answer
        that carries the task. A record that holds a non-empty input has it already (as
        stored, a record of schema 2 holds none): no read."""
        if not task.input_in_key or task.input:
            return task
        keys = self._ctx.keys
        snap = self._ctx.kv.read(input_read(keys, task.task_id, revision=task.state_version))
        return joined(task, snap.range_one(0))

    def attempts(
        self, task_id: str, *, first: int = 1, count: int = ATTEMPTS_PAGE
    ) -> list[AttemptRecord]:
        """The task's attempts numbered ``first`` to ``first + count - 1``, oldest first."""
        return builtins.list(self._attempts(task_id, first, first + count))

    def attempts_page(
        self, task_id: str, *, first: int, count: int, max_bytes: int
    ) -> tuple[list[AttemptRecord], int]:
        """Like ``attempts``, but stopping before the attempts' error details and messages
        (what ListAttempts sends of them) pass ``max_bytes`` (at least one is returned: 16 KiB
        of details and a message fit any budget); returns them and the number to go on from.
        A page of 1,000 attempts with maximal details was 16 MiB, past the message limit."""
        found: builtins.list[AttemptRecord] = []
        sent = 0
        for attempt in self._attempts(task_id, first, first + count):
            sent += len(attempt.error_details) + len(attempt.error_message.encode()) + 256
            if found and sent > max_bytes:
                return found, attempt.attempt
            found.append(attempt)
        return found, first + count

    def _attempts(self, task_id: str, first: int, end: int) -> Iterator[AttemptRecord]:
        """Attempts numbered ``first`` to ``end - 1``. A task's history has no bound (every
        claim adds an attempt), so it is read a page at a time: attempt ids start with their
        number (``a{n}-``), so each number is one small prefix range, and a read covers
        ``_READS_PER_TXN`` numbers."""
        ctx = self._ctx
        prefix = ctx.keys.attempts_prefix(task_id)
        for start in range(first, end, _READS_PER_TXN):
            numbers = range(start, min(end, start + _READS_PER_TXN))
            # The task too, at the same revision: its record may hold its latest attempt.
            snap = ctx.kv.read(
                *(get_prefix(f"{prefix}a{n}-") for n in numbers), get(ctx.keys.task(task_id))
            )
            task_kv = snap.range_one(len(numbers))
            recorded = recorded_attempt(task_from_kv(task_kv)) if task_kv is not None else None
            for index, number in enumerate(numbers):
                found = [attempt_from_kv(kv) for kv in snap.range_kvs(index)]
                if recorded is not None and recorded.attempt == number and not found:
                    found.append(recorded)  # a key of the number would be its key: it wins
                yield from found

    def list(
        self,
        *,
        queue: str = "",
        state: TaskState | None = None,
        root: str = "",
        parent: str = "",
        thread: str = "",
        blocked: bool = False,
        overdue: bool = False,
        page_size: int = 100,
        page_token: str = "",
        include_input: bool = False,
    ) -> tuple[list[TaskRecord], str]:
        """Tasks in id order after ``page_token``, filtered; returns the page and the next token
        (store/lifecycle/task_list.py: a page may be short and still have one). Inputs are left out
        unless ``include_input``.

        A lineage filter (parent, else root, else thread) walks its identity index, so it costs
        the size of that family, not of the keyspace. ``blocked`` and ``overdue`` (the marks of
        domain/waiting.py) filter like queue and state, which alone scan the task
        records: both change with the task (state) or are few (queues), and an index per state
        would add writes to every transition for a listing that operators page through anyway.
        """
        keys = self._ctx.keys
        thread = thread_key(thread) if thread else ""
        if parent:
            prefix = keys.identity_prefix("parent", parent)
        elif root:
            prefix = keys.identity_prefix("root", root)
        elif thread:
            prefix = keys.identity_prefix("thread", index_value(thread))
        else:
            prefix = keys.tasks_prefix

        def wanted(task: TaskRecord) -> bool:
            return (
                (not queue or task.queue == queue)
                and (state is None or task.state is state)
                and (not root or task.root_task_id == root)
                and (not parent or task.parent_task_id == parent)
                and (not thread or task.thread_key == thread)
                and (not blocked or bool(task.blocked_by))
                and (not overdue or bool(task.overdue_at))
            )

        page = read_page(
            self._ctx,
            prefix,
            page_token,
            wanted,
            page_size=page_size,
            include_input=include_input,
        )
        return page.tasks, page.position

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
                self._ctx.metrics.observe_attempts(
                    task.attempt
                )  # final: no attempt follows a cancel
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
                # A new input moves a record of the first schema to the input key, once the
                # keyspace's schema allows it.
                input_in_key=task.input_in_key or self._ctx.writes_schema(INPUT_KEY_SCHEMA),
                revision=task.revision + 1,
                lease_id=0,
                attempts_base=task.attempt,  # new input, new attempt budget
            )
            if self._write_ending_claim(
                task, after, Op.UPDATE_INPUT, AttemptEnd.STALE_INPUT, by, "", WriteKind.GROWTH
            ):
                return self.get(task_id)
        raise FailedPrecondition(f"task {task_id!r} kept changing; update again")

    def _write_ending_claim(
        self,
        task: TaskRecord,
        after: TaskRecord,
        op: Op,
        end: AttemptEnd,
        by: str,
        detail: str,
        kind: WriteKind = WriteKind.DRAIN,
    ) -> bool:
        """Write a producer transition; if the task was CLAIMED, end that claim in the same txn.
        A new input (``kind`` GROWTH) is refused above the space guard's high-water mark."""
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
            ops.append(delete(keys.claim(task.task_id)))
            close_attempt(ctx, ops, task, end, after.updated_at)
        if not ctx.kv.txn(compares, ops, kind=kind).succeeded:
            return False
        if claimed:
            ctx.leases.revoke(task.lease_id)
        if after.state is TaskState.READY:
            self._ready.add(keys.ready(after.queue, after.priority, after.ready_seq, after.task_id))
        return True


def _new_task(
    ctx: StoreContext,
    task_id: str,
    spec: TaskSpec,
    digest: str,
    lineage: Lineage,
    state: TaskState,
    now: float,
) -> TaskRecord:
    """The record of a new task in ``state`` with what ``spec``, its checked input digest and
    ``lineage`` fix for good (``create`` adds the edges and the retry policy); its input in a
    key of its own once the keyspace's schema allows it (coordinator/store/task_inputs.py)."""
    return TaskRecord(
        task_id=task_id,
        queue=spec.queue,
        input_digest=digest,
        state=state,
        priority=spec.priority,
        input=spec.input,
        root_task_id=lineage.root_task_id,
        parent_task_id=lineage.parent_task_id,
        thread_key=lineage.thread_key,
        requires_review=spec.requires_review,
        non_replayable=spec.non_replayable,
        created_at=now,
        updated_at=now,
        ready_seq=ready_seq(now) if state is TaskState.READY else 0,
        ready_at=now if state is TaskState.READY else 0.0,
        not_before=spec.not_before if spec.not_before > now else 0.0,  # delayed, as create saw
        deadline=now + spec.schedule_to_close if spec.schedule_to_close else 0.0,
        effect_ids=EffectIdScheme.V2,
        input_in_key=ctx.writes_schema(INPUT_KEY_SCHEMA),
    )
