"""The releaser: moves a WAITING task to READY once every upstream is DONE.

A watch on the event log sees each transition to DONE at once and releases that task's
dependents (found through the reverse-edge index, never by scanning tasks); a periodic scan of
the waiting index catches whatever a watch gap missed. Each release is a CAS that compares the
dependent and every upstream record as read, so an upstream that moved on meanwhile (a new
round) aborts it, and every replica can run this loop at the same time.
"""

from __future__ import annotations

import queue
import threading
import time

import structlog

from coordinator.domain.graph import satisfied_by, unmet
from coordinator.domain.records import EventRecord, decode
from coordinator.domain.states import Op, TaskState
from coordinator.errors import NotFound
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.dependencies import DependencyStore
from coordinator.store.etcd import mod_revision_is
from coordinator.store.ready_index import ReadyIndex
from coordinator.store.transition import transition, transition_ops
from coordinator.store.watch import PrefixWatch, WatchEvent

log = structlog.get_logger(__name__)

RELEASER = "coordinator:releaser"

# Queued by the watch when etcd compacted its history: scan, then follow again from now.
_RESUME = "\0resume"

# A release whose CAS lost (the dependent was edited meanwhile) reads again this often.
_TRIES = 3


class Releaser:
    """Watch + scan loop that releases dependents whose upstreams are all DONE."""

    def __init__(
        self,
        ctx: StoreContext,
        ready: ReadyIndex,
        dependencies: DependencyStore,
        *,
        scan_interval: float = 5.0,
    ) -> None:
        self._ctx = ctx
        self._ready = ready
        self._deps = dependencies
        self._scan_interval = scan_interval
        self._stop = threading.Event()
        # Upstreams that just became DONE, handed from the watch thread to the loop.
        self._done: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._watch: PrefixWatch | None = None

    def start(self, *, from_revision: int = 0) -> None:
        """Start the watch (from ``from_revision``; 0: from now) and the periodic scan."""
        self._follow(from_revision)
        self._thread = threading.Thread(target=self._loop, name="releaser", daemon=True)
        self._thread.start()
        self._done.put("")  # a first scan right away: releases missed while no replica ran

    def _follow(self, from_revision: int = 0) -> None:
        """Watch the event log from ``from_revision`` (0: from a fresh read's revision)."""
        if not from_revision:
            _, revision = self._ctx.kv.range_page(self._ctx.keys.epoch, self._ctx.keys.epoch + "\0")
            from_revision = revision + 1
        self._watch = self._ctx.kv.watch_prefix(
            self._ctx.keys.events_prefix(),
            start_revision=from_revision,
            on_events=self._on_events,
            # etcd compacted the history this watch needed, and the watch ends: the loop scans
            # (missed DONE events are exactly what a scan of the waiting index finds) and
            # follows again from now, so later releases stay within a second.
            on_compacted=lambda: self._done.put(_RESUME),
        )

    def _resume(self) -> None:
        """Follow again from now, then scan; retried (after a pause) until etcd answers."""
        try:
            self._follow()
        except Exception:
            if not self._stop.wait(1.0):
                self._done.put(_RESUME)
            raise
        self.scan()

    def close(self) -> None:
        """Stop both."""
        self._stop.set()
        self._done.put("")
        if self._watch is not None:
            self._watch.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

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
        ctx = self._ctx
        kv = ctx.kv.get(ctx.keys.task(task_id))
        if kv is None:
            return False
        task = task_from_kv(kv)
        if task.state is not TaskState.WAITING:
            return False
        try:
            upstreams = self._deps.upstreams(task.depends_on)
        except NotFound as exc:  # a dangling edge: never guess; doctor reports it
            log.warning("dependent has a missing upstream", task_id=task_id, error=str(exc))
            return False
        if unmet(upstreams):
            return False
        rounds = satisfied_by(upstreams)
        after = transition(task, Op.UNBLOCK, ctx.clock.now(), satisfied_by=rounds)
        compares, ops = transition_ops(
            ctx, task, after, Op.UNBLOCK, by=RELEASER, detail="released by " + ", ".join(rounds)
        )
        # The current round of every upstream, exactly as read: a newer round aborts this.
        compares += [mod_revision_is(ctx.keys.task(u.task_id), u.state_version) for u in upstreams]
        if not ctx.kv.txn(compares, ops).succeeded:
            return None
        self._ready.add(ctx.keys.ready(after.queue, after.priority, after.ready_seq, task_id))
        log.info("released dependent", task_id=task_id, satisfied_by=list(rounds))
        return True

    def _on_events(self, events: list[WatchEvent]) -> None:
        for event in events:
            if event.deleted:
                continue
            try:
                record = decode(EventRecord, event.value)
            except Exception:  # a malformed event is doctor's business, not the watch's
                continue
            if record.to_state is TaskState.DONE:
                self._done.put(record.task_id)

    def _loop(self) -> None:
        next_scan = time.monotonic() + self._scan_interval
        while not self._stop.is_set():
            try:
                upstream = self._done.get(timeout=max(0.0, next_scan - time.monotonic()))
            except queue.Empty:
                upstream = None
            if self._stop.is_set():
                return
            try:
                if upstream == _RESUME:
                    log.warning("event watch history compacted; rescanning and following anew")
                    self._resume()
                elif upstream:
                    self.release_dependents(upstream)
                else:
                    self.scan()
                    next_scan = time.monotonic() + self._scan_interval
            except Exception as exc:
                log.warning("release failed", upstream=upstream, error=str(exc))
