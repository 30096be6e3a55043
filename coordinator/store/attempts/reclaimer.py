"""The reclaimer: ends the attempt of a task whose claim lease expired, and moves the task as
its retry policy decides (READY again, DELAYED for a backoff, or FAILED: domain/retry.py).

An expired lease makes etcd delete the claim key; a watch on the claims prefix reacts to that at
once, and a periodic scan of the claimed index catches whatever a watch gap missed. Each reclaim
is a CAS (the task is as read and its claim key is still gone), so every replica can run this
loop at the same time.
"""

from __future__ import annotations

import functools
import time

import structlog

from coordinator.domain.retry import decide_after, expired
from coordinator.domain.states import Op, TaskState
from coordinator.store.attempts.requeue import settled
from coordinator.store.context import StoreContext, epoch_from_kv, task_from_kv
from coordinator.store.etcd.ops import get
from coordinator.store.etcd.watch import WatchEvent
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.indexes.watch_loop import WatchScanLoop
from coordinator.store.transition import claimless_move

log = structlog.get_logger(__name__)

RECLAIMER = "coordinator:reclaimer"

# Two reads per task in one txn (etcd's default limit is 128 operations per txn).
_TASKS_PER_READ = 64


class Reclaimer(WatchScanLoop):
    """Watch + scan loop that reclaims expired claims."""

    name = "reclaimer"
    # Only deletions of claim keys matter; the puts of every claim and renew stay in etcd.
    deletes_only = True

    def __init__(self, ctx: StoreContext, ready: ReadyIndex, *, scan_interval: float = 5.0) -> None:
        # One watch over the claimed index and the claim keys ("claimed/" sorts just below
        # "claims/"): a txn that ends a claim deletes both in one revision, which etcd never
        # splits across watch responses, so ``items_from`` can tell those ends from expiries.
        keys = ctx.keys
        super().__init__(
            ctx,
            prefix=keys.claimed_prefix,
            range_end=ctx.kv.prefix_end(keys.claims_prefix),
            scan_interval=scan_interval,
        )
        self._ready = ready
        # task id -> monotonic time this replica saw etcd delete its claim key (reclaim latency
        # is measured from there: the deletion is etcd's expiry, as close as we can see it).
        self._deleted_at: dict[str, float] = {}

    def scan(self) -> int:
        """Reclaim every task of the claimed index whose claim key is gone; returns the count."""
        keys, kv = self._ctx.keys, self._ctx.kv
        claimed, revision = kv.range_page(
            keys.claimed_prefix, kv.prefix_end(keys.claimed_prefix), keys_only=True
        )
        alive, _ = kv.range_page(
            keys.claims_prefix, kv.prefix_end(keys.claims_prefix), revision=revision, keys_only=True
        )
        alive_ids = {k.key.rsplit("/", 1)[1] for k in alive}
        count = 0
        for item in claimed:
            task_id = item.key.rsplit("/", 1)[1]
            if task_id not in alive_ids and self.reclaim(task_id):
                count += 1
        return count

    def reclaim(self, task_id: str) -> bool:
        """Move one CLAIMED task whose claim key is gone back to READY. False if nothing to do."""
        ctx, keys = self._ctx, self._ctx.keys
        deleted_at = self._deleted_at.pop(task_id, None)
        snap = ctx.kv.read(get(keys.task(task_id)), get(keys.claim(task_id)), get(keys.epoch))
        task_kv = snap.range_one(0)
        if task_kv is None or snap.range_one(1) is not None:
            return False
        task = task_from_kv(task_kv)
        if task.state is not TaskState.CLAIMED:
            return False
        # The retry policy decides what the expiry leads to: READY now, DELAYED, or FAILED; a
        # claim an epoch bump fenced first costs the task no attempt (within a bound).
        ended = expired(task.scheduler_epoch, epoch_from_kv(snap.range_one(2)))
        now = ctx.clock.now()
        retry = decide_after(task, ended, now, at_once=Op.RECLAIM)
        move = claimless_move(
            ctx,
            task,
            retry.op,
            now,
            by=RECLAIMER,
            epoch=task.scheduler_epoch,
            detail=retry.detail,
            **retry.changes(task, ended),
        )
        if not ctx.kv.txn(move.compares, move.ops).succeeded:
            return False
        after, closed = move.after, move.closed
        if deleted_at is not None:  # seen by the watch (a scan cannot tell when it expired)
            self._ctx.metrics.observe_reclaim(time.monotonic() - deleted_at)
        if closed is not None:
            self._ctx.metrics.count_wasted(closed.ended_at - closed.started_at)
        settled(ctx, self._ready, after, ended)
        log.info(
            "reclaimed expired claim",
            task_id=task_id,
            attempt=task.attempt,
            generation=task.claim_generation,
            epoch=task.scheduler_epoch,
            state=after.state.name,
        )
        return True

    def handle(self, item: str) -> None:
        """A claim key was deleted: reclaim its task if the claim expired."""
        self.reclaim(item)

    def handle_many(self, items: list[str]) -> None:
        """Claim keys were deleted: read all their tasks in one round trip, then reclaim those
        still CLAIMED without a claim key (most deletions are commits and releases, whose task
        has already moved on: nothing to do, and no read each)."""
        ctx, keys = self._ctx, self._ctx.keys
        for start in range(0, len(items), _TASKS_PER_READ):
            chunk = items[start : start + _TASKS_PER_READ]
            snap = ctx.kv.read(
                *(
                    op
                    for task_id in chunk
                    for op in (get(keys.task(task_id)), get(keys.claim(task_id)))
                )
            )
            for i, task_id in enumerate(chunk):
                task_kv = snap.range_one(2 * i)
                expired = (
                    task_kv is not None
                    and snap.range_one(2 * i + 1) is None
                    and task_from_kv(task_kv).state is TaskState.CLAIMED
                )
                if expired:
                    self._run(task_id, functools.partial(self.reclaim, task_id))
                else:
                    self._deleted_at.pop(task_id, None)

    def items_from(self, events: list[WatchEvent]) -> list[str]:
        """Task ids whose claim key was deleted by an expiry (or a lease revoke), not by a txn
        that ended the claim. Commit, release, cancel and the like move the task out of CLAIMED
        and so delete its claimed-index key in the same revision: nothing is left to reclaim,
        and reading the task back (on every replica, for every commit, its own included) would
        cost an etcd read and a record decode per cycle for nothing."""
        claims, claimed = self._ctx.keys.claims_prefix, self._ctx.keys.claimed_prefix
        ended = {
            (e.key[len(claimed) :], e.mod_revision) for e in events if e.key.startswith(claimed)
        }
        deleted = [
            task_id
            for e in events
            if e.deleted
            and e.key.startswith(claims)
            and ((task_id := e.key[len(claims) :]), e.mod_revision) not in ended
        ]
        now = time.monotonic()
        for task_id in deleted:
            self._deleted_at.setdefault(task_id, now)
        return deleted
