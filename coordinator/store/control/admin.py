"""Safe-rollback controls: the scheduler epoch, pausing claims (all, or one queue's), and drain
status (of the keyspace, or of one queue's tasks)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from coordinator.domain.records import StagedResult, TaskRecord, decode
from coordinator.domain.states import UNCOMMITTED_STATES
from coordinator.errors import FailedPrecondition, ResourceExhausted
from coordinator.store.context import StoreContext, claim_from_kv, epoch_from_kv, task_from_kv
from coordinator.store.control.queue_drain import count_claimed, count_open_effects
from coordinator.store.control.versions import VersionStore
from coordinator.store.etcd.ops import (
    create_revision_is,
    delete,
    get,
    get_prefix,
    mod_revision_is,
    put,
)
from coordinator.store.types import DrainStatus

_CAS_TRIES = 8
# etcd allows 128 operations per txn.
_READ_BATCH = 100
# Staged values read per round trip: each may hold MAX_RESULT_BYTES (512 KiB, about 700 KB
# encoded), and a response must stay under gRPC's 4 MB message limit.
_VALUES_PER_READ = 4
MAX_PAUSED_QUEUES = 64
"""Queues paused one by one at once: every claim reads their keys (store/claims/claim.py), so the
set stays small; pausing every queue is the global pause. Two admins pausing a new queue at
the same instant may each pass the check, exceeding it by one: a bound on cost, not a rule."""


class AdminStore:
    """GetEpoch, BumpEpoch, PauseClaims, ResumeClaims, DrainStatus."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    def ensure_initialized(self) -> int:
        """Create the epoch key (epoch 1) if this keyspace is new; returns the epoch."""
        key = self._ctx.keys.epoch
        self._ctx.kv.txn([create_revision_is(key, 0)], [put(key, b"1")])
        VersionStore(self._ctx).ensure()
        return self.epoch()

    def epoch(self) -> int:
        """The current scheduler epoch."""
        return epoch_from_kv(self._ctx.kv.get(self._ctx.keys.epoch))

    def bump_epoch(self, expected: int = 0) -> int:
        """Raise the epoch by one (CAS); with ``expected``, only from that epoch."""
        return self._bump(expected)[0]

    def bump_epoch_revoking(self, expected: int = 0) -> tuple[int, int]:
        """Bump the epoch, then revoke every claim made before the bump: (epoch, revoked)."""
        epoch, revision = self._bump(expected)
        return epoch, self.revoke_leases(before_revision=revision)

    def _bump(self, expected: int) -> tuple[int, int]:
        """The new epoch and the revision of the txn that wrote it."""
        key = self._ctx.keys.epoch
        for _ in range(_CAS_TRIES):
            kv = self._ctx.kv.get(key)
            current = epoch_from_kv(kv)
            if expected and current != expected:
                raise FailedPrecondition(f"scheduler epoch is {current}, expected {expected}")
            compare = mod_revision_is(key, kv.mod_revision if kv is not None else 0)
            result = self._ctx.kv.txn([compare], [put(key, str(current + 1).encode())])
            if result.succeeded:
                return current + 1, result.revision
        raise FailedPrecondition("the epoch kept changing; bump again")

    def revoke_leases(self, *, before_revision: int) -> int:
        """Revoke the lease of every live claim created before ``before_revision``.

        Each claim key goes with its lease, so the reclaimer returns the task to READY exactly
        as after an expiry (the attempt is recorded as expired). Claims made after the bump
        carry the new epoch and are left alone. Returns how many leases were revoked.
        """
        kv = self._ctx.kv
        start = self._ctx.keys.claims_prefix
        end = kv.prefix_end(start)
        revoked = 0
        while True:
            page, _ = kv.range_page(start, end, limit=_READ_BATCH, keys_only=True)
            for item in page:
                if item.lease and item.create_revision < before_revision:
                    self._ctx.leases.revoke(item.lease)
                    revoked += 1
            if len(page) < _READ_BATCH:
                return revoked
            start = page[-1].key + "\0"

    def claims_paused(self) -> bool:
        """Whether new claims are refused (the global pause)."""
        return self._ctx.kv.get(self._ctx.keys.claims_paused) is not None

    def paused_queues(self) -> list[str]:
        """The queues whose claims are paused one by one, by name."""
        prefix = self._ctx.keys.queue_paused_prefix
        snap = self._ctx.kv.read(get_prefix(prefix, keys_only=True))
        return [item.key.removeprefix(prefix) for item in snap.range_kvs(0)]

    def pause_claims(self, reason: str, queue: str = "") -> None:
        """Refuse new claims until resumed: of every queue, or of ``queue``'s tasks only."""
        keys, kv = self._ctx.keys, self._ctx.kv
        if not queue:
            kv.txn((), [put(keys.claims_paused, reason.encode())])
            return
        key = keys.queue_paused(queue)
        snap = kv.read(get_prefix(keys.queue_paused_prefix, count_only=True), get(key))
        if snap.range_one(1) is None and snap.range_count(0) >= MAX_PAUSED_QUEUES:
            raise ResourceExhausted(
                f"{MAX_PAUSED_QUEUES} queues are paused already: resume one first, or pause "
                "every queue (no queue)"
            )
        kv.txn((), [put(key, reason.encode())])

    def resume_claims(self, queue: str = "") -> None:
        """Lift the global pause, or ``queue``'s own pause (the other one stays)."""
        keys = self._ctx.keys
        self._ctx.kv.txn((), [delete(keys.queue_paused(queue) if queue else keys.claims_paused)])

    def drain_status(self, queue: str = "") -> DrainStatus:
        """Live claims, and staged results that their task revision may still commit: of the
        whole keyspace, or of ``queue``'s tasks (store/control/queue_drain.py). Uncertain effects
        are counted here only for a queue (the keyspace's: EffectStore.count_open)."""
        keys, kv = self._ctx.keys, self._ctx.kv
        reads = [
            get(keys.epoch),
            get(keys.claims_paused),
            get_prefix(keys.claims_prefix, count_only=True),
        ]
        snap = kv.read(*reads, *([get(keys.queue_paused(queue))] if queue else []))
        status = DrainStatus(
            epoch=epoch_from_kv(snap.range_one(0)),
            claims_paused=snap.range_one(1) is not None,
            active_leases=snap.range_count(2),
            unknown_effects=0,
            staged_uncommitted=self._count_pending(snap.revision, queue),
        )
        if not queue:
            return status
        return replace(
            status,
            active_leases=count_claimed(self._ctx, queue, snap.revision),
            unknown_effects=count_open_effects(self._ctx, queue, snap.revision),
            queue=queue,
            queue_paused=snap.range_one(3) is not None,
        )

    def _count_pending(self, revision: int, queue: str) -> int:
        """Staged results that can still become canonical: the task is still at that revision,
        not yet committed, and the staging attempt still holds the task's live claim (only the
        holder can commit). A result staged for a revision that was committed, cancelled or
        superseded by new input, or by an attempt whose claim ended (expired, revoked,
        released), can never become canonical, so it does not hold up a drain. With ``queue``,
        only those of that queue's tasks. All read at ``revision``.

        A staged value may be 512 KiB, so they are never listed whole (a handful passed gRPC's
        4 MB message limit): the staging keys are paged keys only, and only the values of the
        live holders' results are read, a few at a time, for the revision they were staged at.
        """
        pending = 0
        for page in self._staged_keys(revision):
            pending += self._of_current_revision(self._held(page, revision, queue), revision)
        return pending

    def _staged_keys(self, revision: int) -> Iterator[list[tuple[str, str, str]]]:
        """Every staged result's (key, task_id, attempt_id) at ``revision``, page by page."""
        kv, prefix = self._ctx.kv, self._ctx.keys.staging_prefix
        start, end = prefix, kv.prefix_end(prefix)
        while True:
            page, _ = kv.range_page(
                start, end, limit=_READ_BATCH, revision=revision, keys_only=True
            )
            yield [(item.key, *_staged_ids(item.key.removeprefix(prefix))) for item in page]
            if len(page) < _READ_BATCH:
                return
            start = page[-1].key + "\0"

    def _held(
        self, staged: list[tuple[str, str, str]], revision: int, queue: str
    ) -> list[tuple[str, TaskRecord]]:
        """The staged results (key, task) whose attempt holds its uncommitted task's live claim
        (of ``queue``'s tasks, with one)."""
        task_ids = sorted({task_id for _, task_id, _ in staged})
        tasks, holders = {}, {}
        batch_size = _READ_BATCH // 2  # two reads per task
        for start in range(0, len(task_ids), batch_size):
            batch = task_ids[start : start + batch_size]
            keys = self._ctx.keys
            snap = self._ctx.kv.read(
                *(get(keys.task(t), revision=revision) for t in batch),
                *(get(keys.claim(t), revision=revision) for t in batch),
            )
            for i, task_id in enumerate(batch):
                item = snap.range_one(i)
                if item is not None:
                    tasks[task_id] = task_from_kv(item)
                claim_kv = snap.range_one(len(batch) + i)
                if claim_kv is not None:
                    holders[task_id] = claim_from_kv(claim_kv).attempt_id
        return [
            (key, task)
            for key, task_id, attempt_id in staged
            if (task := tasks.get(task_id)) is not None
            and task.state in UNCOMMITTED_STATES
            and (not queue or task.queue == queue)
            and holders.get(task_id) == attempt_id
        ]

    def _of_current_revision(self, held: list[tuple[str, TaskRecord]], revision: int) -> int:
        """How many of the ``held`` results were staged for their task's current revision."""
        count = 0
        for start in range(0, len(held), _VALUES_PER_READ):
            batch = held[start : start + _VALUES_PER_READ]
            snap = self._ctx.kv.read(*(get(key, revision=revision) for key, _ in batch))
            for i, (_, task) in enumerate(batch):
                item = snap.range_one(i)
                if item is not None and decode(StagedResult, item.value).revision == task.revision:
                    count += 1
        return count


def _staged_ids(rest: str) -> tuple[str, str]:
    """(task_id, attempt_id) of a staging key past its prefix: ids never contain "/"."""
    task_id, _, attempt_id = rest.partition("/")
    return task_id, attempt_id
