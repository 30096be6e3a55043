"""The shape the reclaimer and the releaser share: a watch that queues work, a periodic scan
that catches what a watch gap missed, both served by one thread.

The watch callback only queues items (a slow CAS must not hold up the watch stream). When etcd
compacts the history the watch needs, the watch ends; the loop then scans (whatever the watch
missed is exactly what a scan finds) and follows again from now, retrying until etcd answers.
Every unit of work is an idempotent CAS, so every replica can run the same loop at once. A
replica the version record refuses does none (``StoreContext.admitted``).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable

import structlog

from coordinator.store.context import StoreContext
from coordinator.store.etcd.watch import PrefixWatch, WatchEvent

log = structlog.get_logger(__name__)

# Queued by the watch when etcd compacted the history it needed (never a task id: ids are
# validated and cannot hold NUL). An empty item asks for a scan now.
_RESUME = "\0resume"
_SCAN_NOW = ""

# Queued items handed to ``handle_many`` at once: under load the watch queues one item per
# commit, and a batch lets a subclass read them all in one etcd round trip.
BATCH = 64


class WatchScanLoop:
    """Subclasses say what to watch (``prefix``), what a watch batch means (``items_from``),
    what to do per item (``handle``) and how to find everything at once (``scan``)."""

    name = "watch-scan"
    # Whether the watch needs deletions only (etcd then drops puts before sending them).
    deletes_only = False

    def __init__(
        self,
        ctx: StoreContext,
        *,
        prefix: str,
        scan_interval: float,
        scan_first: bool = False,
        range_end: str = "",
    ) -> None:
        self._ctx = ctx
        self._prefix = prefix
        self._range_end = range_end  # "": the prefix alone
        self._scan_interval = scan_interval
        self._scan_first = scan_first
        self._stop = threading.Event()
        # Items handed from the watch thread to the loop.
        self._items: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._watch: PrefixWatch | None = None

    def start(self, *, from_revision: int = 0) -> None:
        """Start the watch (from ``from_revision``; 0: from now) and the periodic scan."""
        self._follow(from_revision)
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()
        if self._scan_first:
            self._items.put(_SCAN_NOW)

    def close(self) -> None:
        """Stop both."""
        self._stop.set()
        self._items.put(_SCAN_NOW)  # wake the loop, which sees the stop
        if self._watch is not None:
            self._watch.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def scan(self) -> int:
        """Do every pending unit of work found by reading the keyspace; returns how many."""
        raise NotImplementedError

    def handle(self, item: str) -> None:
        """Do the work one queued item stands for."""
        raise NotImplementedError

    def handle_many(self, items: list[str]) -> None:
        """Do the work of several queued items (distinct, in queue order); one by one unless a
        subclass batches its reads."""
        for item in items:
            self._run(item, functools.partial(self.handle, item))

    def items_from(self, events: list[WatchEvent]) -> list[str]:
        """The items a batch of watch events asks for (runs on the watch thread: keep it cheap)."""
        raise NotImplementedError

    def _follow(self, from_revision: int = 0) -> None:
        if not from_revision:
            keys = self._ctx.keys
            _, revision = self._ctx.kv.range_page(keys.epoch, keys.epoch + "\0")
            from_revision = revision + 1
        self._watch = self._ctx.kv.watch_prefix(
            self._prefix,
            start_revision=from_revision,
            on_events=self._on_events,
            on_compacted=lambda: self._items.put(_RESUME),
            deletes_only=self.deletes_only,
            range_end=self._range_end,
        )

    def _resume(self, *, scan: bool = True) -> None:
        """Follow again from now, then scan (unless ``scan`` is False); retried (after a pause)
        until etcd answers."""
        try:
            self._follow()
        except Exception:
            if not self._stop.wait(1.0):
                self._items.put(_RESUME)
            raise
        if scan:
            self.scan()

    def _on_events(self, events: list[WatchEvent]) -> None:
        for item in self.items_from(events):
            self._items.put(item)

    def _loop(self) -> None:
        next_scan = time.monotonic() + self._scan_interval
        while not self._stop.is_set():
            try:
                item = self._items.get(timeout=max(0.0, next_scan - time.monotonic()))
            except queue.Empty:
                item = _SCAN_NOW
            if self._stop.is_set():
                return
            items, controls = self._drain(item)
            if not self._ctx.admitted():
                # Refused by the version record: nothing written from here, the watch kept (the
                # first scan once admitted again finds what was skipped).
                if _RESUME in controls:
                    self._run(_RESUME, functools.partial(self._resume, scan=False))
                if _SCAN_NOW in controls:
                    next_scan = time.monotonic() + self._scan_interval
                continue
            if items:
                self._run(f"{len(items)} items", functools.partial(self.handle_many, items))
            if _RESUME in controls:
                log.warning(
                    "watch history compacted; rescanning and following anew", loop=self.name
                )
                self._run(_RESUME, self._resume)
            if _SCAN_NOW in controls:
                self._run(_SCAN_NOW, self.scan)
                next_scan = time.monotonic() + self._scan_interval

    def _drain(self, first: str) -> tuple[list[str], set[str]]:
        """``first`` and whatever else is queued right now: up to BATCH distinct items in queue
        order, and the control items (resume, scan) met on the way."""
        items: list[str] = []
        controls: set[str] = set()
        item = first
        while True:
            if item in (_RESUME, _SCAN_NOW):
                controls.add(item)
            elif item not in items:
                items.append(item)
            if len(items) >= BATCH:
                return items, controls
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                return items, controls

    def _run(self, item: str, work: Callable[[], object]) -> None:
        try:
            work()
        except Exception as exc:
            log.warning("background work failed", loop=self.name, item=item, error=str(exc))
