"""The releaser: moves a WAITING task to READY once every upstream is DONE, and marks it
blocked while an upstream is FAILED or CANCELLED.

A watch on the event log sees each transition to DONE at once and releases that task's
dependents (found through the reverse-edge index, never by scanning tasks); a periodic scan of
the waiting index catches whatever a watch gap missed. Each release is a CAS that compares the
dependent and every upstream record as read, so an upstream that moved on meanwhile (a new
round) aborts it, and every replica can run this loop at the same time.

An upstream that ends FAILED or CANCELLED does not end its dependents ("not ready" is not
"failed", domain/waiting.py): each stays WAITING with ``blocked_by`` naming it, written by the
same kind of CAS with a ``mark_blocked`` event, so it is visibly blocked (listed, counted per
queue) instead of silently waiting. A RetryTask of the upstream is an event too: the mark is
cleared, and the upstream's commit releases the dependents as usual, with no other call.
Ending the graph below a task is an operator's act (CancelTask with cascade,
store/lifecycle/cascade.py).
"""

from __future__ import annotations

import functools

import structlog

from coordinator.domain.records import TaskRecord
from coordinator.domain.states import Op, TaskState
from coordinator.domain.waiting import Reblock, Release, describe_blocked, settle
from coordinator.errors import NotFound
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import get_prefix, mod_revision_is
from coordinator.store.etcd.watch import WatchEvent
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.indexes.watch_loop import WatchScanLoop
from coordinator.store.lifecycle.dependencies import DependencyStore
from coordinator.store.transition import transition, transition_ops

log = structlog.get_logger(__name__)

RELEASER = "coordinator:releaser"

# Upstreams whose dependents are counted in one txn (etcd allows 128 operations per txn).
_UPSTREAMS_PER_READ = 64

# The upstream states after which a dependent is released (DONE) or marked blocked (the
# others); leaving FAILED (a RetryTask) clears the mark.
_SETTLES_DEPENDENTS = frozenset({TaskState.DONE, TaskState.CANCELLED, TaskState.FAILED})

# A release whose CAS lost (the dependent was edited meanwhile) reads again this often.
_TRIES = 3


class Releaser(WatchScanLoop):
    """Watch + scan loop that releases dependents whose upstreams are all DONE (and marks
    those with a FAILED or CANCELLED upstream blocked, or no longer blocked)."""

    name = "releaser"

    def __init__(
        self,
        ctx: StoreContext,
        ready: ReadyIndex,
        dependencies: DependencyStore,
        *,
        scan_interval: float = 5.0,
    ) -> None:
        # A first scan right away: releases missed while no replica ran.
        super().__init__(
            ctx, prefix=ctx.keys.events_prefix(), scan_interval=scan_interval, scan_first=True
        )
        self._ready = ready
        self._deps = dependencies

    def scan(self) -> int:
        """Try to release every task of the waiting index; returns how many were released."""
        keys, kv = self._ctx.keys, self._ctx.kv
        waiting, _ = kv.range_page(
            keys.waiting_prefix, kv.prefix_end(keys.waiting_prefix), keys_only=True
        )
        return sum(self.release(item.key.rsplit("/", 1)[1]) for item in waiting)

    def release_dependents(self, upstream: str) -> int:
        """Try to release every dependent of ``upstream``; returns how many were released."""
        keys, kv = self._ctx.keys, self._ctx.kv
        prefix = keys.dependents_prefix(upstream)
        edges, _ = kv.range_page(prefix, kv.prefix_end(prefix), keys_only=True)
        return sum(self.release(item.key.rsplit("/", 1)[1]) for item in edges)

    def release(self, task_id: str) -> bool:
        """Move one WAITING task whose upstreams are all DONE to READY. False if nothing to do
        (or another replica did it)."""
        for _ in range(_TRIES):
            released = self._try_release(task_id)
            if released is not None:
                return released
        return False

    def _try_release(self, task_id: str) -> bool | None:
        """True: released; False: nothing to release; None: the CAS lost, read again."""
        read = self._read_waiting(task_id)
        if read is None:
            return False
        task, upstreams = read
        match settle(task, upstreams):
            case Release(rounds):
                return self._unblock(task, upstreams, rounds)
            case Reblock(blocked):
                return self._mark_blocked(task, upstreams, blocked)
            case _:
                return False

    def _read_waiting(self, task_id: str) -> tuple[TaskRecord, list[TaskRecord]] | None:
        """The WAITING task and its upstreams as they are now; None if it is not WAITING (or
        gone, or has a dangling edge: never guess, doctor reports it)."""
        ctx = self._ctx
        kv = ctx.kv.get(ctx.keys.task(task_id))
        if kv is None:
            return None
        task = task_from_kv(kv)
        if task.state is not TaskState.WAITING:
            return None
        try:
            return task, self._deps.upstreams(task.depends_on)
        except NotFound as exc:
            log.warning("dependent has a missing upstream", task_id=task_id, error=str(exc))
            return None

    def _unblock(
        self, task: TaskRecord, upstreams: list[TaskRecord], rounds: tuple[str, ...]
    ) -> bool | None:
        """WAITING -> READY, as long as every upstream is still at the round read. True:
        released; None: the CAS lost, read again."""
        ctx = self._ctx
        after = transition(task, Op.UNBLOCK, ctx.clock.now(), satisfied_by=rounds)
        compares, ops = transition_ops(
            ctx, task, after, Op.UNBLOCK, by=RELEASER, detail="released by " + ", ".join(rounds)
        )
        # The current round of every upstream, exactly as read: a newer round aborts this.
        compares += [mod_revision_is(ctx.keys.task(u.task_id), u.state_version) for u in upstreams]
        if not ctx.kv.txn(compares, ops).succeeded:
            return None
        task_id = task.task_id
        self._ready.add(ctx.keys.ready(after.queue, after.priority, after.ready_seq, task_id))
        log.info("released dependent", task_id=task_id, satisfied_by=list(rounds))
        return True

    def _mark_blocked(
        self, task: TaskRecord, upstreams: list[TaskRecord], blocked: tuple[str, ...]
    ) -> bool | None:
        """Rewrite a WAITING dependent's ``blocked_by`` as its upstreams stand now (it stays
        WAITING). False: released nothing; None: the CAS lost, or the mark was cleared: read
        again."""
        ctx = self._ctx
        after = transition(task, Op.MARK_BLOCKED, ctx.clock.now(), blocked_by=blocked)
        detail = describe_blocked(task.task_id, upstreams, blocked)
        compares, ops = transition_ops(
            ctx, task, after, Op.MARK_BLOCKED, by=RELEASER, detail=detail
        )
        compares += [mod_revision_is(ctx.keys.task(u.task_id), u.state_version) for u in upstreams]
        if not ctx.kv.txn(compares, ops).succeeded:
            return None
        log.info(
            "dependent blocked" if blocked else "dependent unblocked",
            task_id=task.task_id,
            blocked_by=list(blocked),
        )
        # Cleared: read again at once, since the upstreams may all be DONE already (a retried
        # upstream that committed before this pass ran).
        return False if blocked else None

    def handle(self, item: str) -> None:
        """An upstream became DONE, CANCELLED or FAILED, or left FAILED: settle its
        dependents."""
        self.release_dependents(item)

    def handle_many(self, items: list[str]) -> None:
        """Several upstreams' items at once: one round trip finds which of them have dependents
        at all (most tasks have none: no read each); ``handle`` then does the work for those."""
        keys = self._ctx.keys
        for start in range(0, len(items), _UPSTREAMS_PER_READ):
            chunk = items[start : start + _UPSTREAMS_PER_READ]
            snap = self._ctx.kv.read(
                *(get_prefix(keys.dependents_prefix(u), count_only=True) for u in chunk)
            )
            for i, upstream in enumerate(chunk):
                if snap.range_count(i):
                    self._run(upstream, functools.partial(self.handle, upstream))

    def items_from(self, events: list[WatchEvent]) -> list[str]:
        """Tasks whose transition event may say they became DONE, CANCELLED or FAILED, or left
        FAILED (a RetryTask: their dependents are no longer blocked by them), screened on the
        event's bytes, never decoded (see ``_may_settle``)."""
        root = self._prefix
        return [
            event.key[len(root) :].rsplit("/", 1)[0]
            for event in events
            if not event.deleted and _may_settle(event.value)
        ]


# Every state name that may settle dependents, as the record codec writes it (by name: domain/
# records.py). Every claim event and most events of a busy pool name none of them, so the watch
# (on every replica, for every transition) skips them without decoding a record. A false match
# (a principal or a detail that happens to hold one of these words) costs only a share of the
# batched count in ``handle_many``: ``release`` reads the records and ``settle`` decides.
# (FAILED is among them, so an event leaving FAILED matches too.)
_SETTLING_NAMES = tuple(sorted(state.name.encode() for state in _SETTLES_DEPENDENTS))


def _may_settle(value: bytes) -> bool:
    """Whether an encoded event can be a move to or out of a settling state (no false
    negative: a settling event always names its state)."""
    return any(name in value for name in _SETTLING_NAMES)
