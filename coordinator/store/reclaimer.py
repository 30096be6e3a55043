"""The reclaimer: returns tasks whose claim lease expired to READY.

An expired lease makes etcd delete the claim key; a watch on the claims prefix reacts to that at
once, and a periodic scan of the claimed index catches whatever a watch gap missed. Each reclaim
is a CAS (the task is as read and its claim key is still gone), so every replica can run this
loop at the same time.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace

import structlog

from coordinator import metrics
from coordinator.domain.records import encode
from coordinator.domain.states import AttemptEnd, Op, TaskState
from coordinator.store.context import StoreContext, attempt_from_kv, task_from_kv
from coordinator.store.etcd import create_revision_is, get, put
from coordinator.store.ready_index import ReadyIndex
from coordinator.store.transition import transition, transition_ops
from coordinator.store.watch import PrefixWatch, WatchEvent

log = structlog.get_logger(__name__)

RECLAIMER = "coordinator:reclaimer"

# Queued by the watch when etcd compacted the history it needed (never a task id: ids are
# validated and cannot hold NUL).
_RESUME = "\0resume"


class Reclaimer:
    """Watch + scan loop that reclaims expired claims."""

    def __init__(self, ctx: StoreContext, ready: ReadyIndex, *, scan_interval: float = 5.0) -> None:
        self._ctx = ctx
        self._ready = ready
        self._scan_interval = scan_interval
        self._stop = threading.Event()
        # Task ids whose claim key was deleted, handed from the watch thread to the loop, so a
        # slow reclaim never holds up the client's shared watch thread.
        self._deleted: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._watch: PrefixWatch | None = None
        # task id -> monotonic time this replica saw etcd delete its claim key (reclaim latency
        # is measured from there: the deletion is etcd's expiry, as close as we can see it).
        self._deleted_at: dict[str, float] = {}

    def start(self, *, from_revision: int = 0) -> None:
        """Start the watch (from ``from_revision``; 0: from now) and the periodic scan."""
        self._follow(from_revision)
        self._thread = threading.Thread(target=self._loop, name="reclaimer", daemon=True)
        self._thread.start()

    def _follow(self, from_revision: int = 0) -> None:
        """Watch claim deletions from ``from_revision`` (0: from a fresh read's revision)."""
        if not from_revision:
            _, revision = self._ctx.kv.range_page(self._ctx.keys.epoch, self._ctx.keys.epoch + "\0")
            from_revision = revision + 1
        self._watch = self._ctx.kv.watch_prefix(
            self._ctx.keys.claims_prefix,
            start_revision=from_revision,
            on_events=self._on_events,
            # etcd compacted the history this watch needed, and the watch ends: the loop scans
            # (missed deletions are exactly what a scan finds) and follows again from now.
            on_compacted=lambda: self._deleted.put(_RESUME),
        )

    def close(self) -> None:
        """Stop both."""
        self._stop.set()
        self._deleted.put("")  # wake the loop
        if self._watch is not None:
            self._watch.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

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
        snap = ctx.kv.read(get(keys.task(task_id)), get(keys.claim(task_id)))
        task_kv = snap.range_one(0)
        if task_kv is None or snap.range_one(1) is not None:
            return False
        task = task_from_kv(task_kv)
        if task.state is not TaskState.CLAIMED:
            return False
        now = ctx.clock.now()
        after = transition(task, Op.RECLAIM, now, lease_id=0)
        compares, ops = transition_ops(
            ctx,
            task,
            after,
            Op.RECLAIM,
            by=RECLAIMER,
            attempt_id=task.attempt_id,
            generation=task.claim_generation,
            epoch=task.scheduler_epoch,
            detail="lease expired",
        )
        compares.append(create_revision_is(keys.claim(task_id), 0))
        attempt_kv = ctx.kv.get(keys.attempt(task_id, task.attempt_id))
        closed = None
        if attempt_kv is not None:
            closed = replace(attempt_from_kv(attempt_kv), end=AttemptEnd.EXPIRED, ended_at=now)
            ops.append(put(keys.attempt(task_id, task.attempt_id), encode(closed)))
        if not ctx.kv.txn(compares, ops).succeeded:
            return False
        if deleted_at is not None:  # seen by the watch (a scan cannot tell when it expired)
            metrics.observe_reclaim(time.monotonic() - deleted_at)
        if closed is not None:
            metrics.count_wasted(closed.ended_at - closed.started_at)
        self._ready.add(keys.ready(after.queue, after.priority, after.ready_seq, task_id))
        log.info(
            "reclaimed expired claim",
            task_id=task_id,
            attempt=task.attempt,
            generation=task.claim_generation,
            epoch=task.scheduler_epoch,
        )
        return True

    def _resume(self) -> None:
        """Follow again from now, then scan; retried (after a pause) until etcd answers."""
        try:
            self._follow()
        except Exception:
            if not self._stop.wait(1.0):
                self._deleted.put(_RESUME)
            raise
        self.scan()

    def _on_events(self, events: list[WatchEvent]) -> None:
        for event in events:
            if event.deleted:
                task_id = event.key.rsplit("/", 1)[1]
                self._deleted_at.setdefault(task_id, time.monotonic())
                self._deleted.put(task_id)

    def _loop(self) -> None:
        next_scan = time.monotonic() + self._scan_interval
        while not self._stop.is_set():
            try:
                task_id = self._deleted.get(timeout=max(0.0, next_scan - time.monotonic()))
            except queue.Empty:
                task_id = None
            try:
                if task_id == _RESUME:
                    log.warning("claims watch history compacted; rescanning and following anew")
                    self._resume()
                elif task_id:
                    self.reclaim(task_id)
                elif task_id is None:
                    self.scan()
                    next_scan = time.monotonic() + self._scan_interval
            except Exception as exc:
                log.warning("reclaim failed", task_id=task_id, error=str(exc))
