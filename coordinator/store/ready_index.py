"""A watch-fed, in-memory copy of the ready index, so ClaimNext is O(log n) in ready tasks.

etcd 3.4 answers a ``limit=1`` range over a flat prefix in O(n) (it counts the whole range), so
asking etcd for "the first ready key" costs 10 ms at 100k keys. Instead each replica loads the
ready keys once (paged) and follows them with a watch. The copy is only a hint: the claim txn
compares the task record itself, so a stale entry costs one failed attempt, never a wrong claim.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable

import structlog
from sortedcontainers import SortedList

from coordinator.store.context import StoreContext
from coordinator.store.watch import PrefixWatch, WatchEvent

log = structlog.get_logger(__name__)

_PAGE = 1000


class ReadyIndex:
    """Per-queue sorted ready keys, kept current by a watch on ``{prefix}/ready/``."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx
        self._root = ctx.keys.ready_prefix()
        self._lock = threading.Lock()
        self._queues: dict[str, SortedList] = {}
        # Keys (relative) that a ClaimNext of this replica is trying right now: another
        # ClaimNext here picks a different one instead of losing the same race (see take()).
        self._taken: Counter[str] = Counter()
        self._watch: PrefixWatch | None = None
        self._closed = False
        # Told of each ready key that was not known yet (its queue) and of every reload
        # (None): the long polls waiting for a task (store/long_poll.py).
        self._listeners: list[Callable[[str | None], None]] = []

    def listen(self, listener: Callable[[str | None], None]) -> None:
        """Call ``listener(queue)`` for every new ready key, ``listener(None)`` on a reload."""
        self._listeners.append(listener)

    def start(self) -> None:
        """Load the index and start following it."""
        self._reload()

    def close(self) -> None:
        """Stop the watch."""
        self._closed = True
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def first(self, queue: str, count: int) -> list[str]:
        """Up to ``count`` ready keys of ``queue`` in claim order (full etcd keys), all of the
        highest priority that has a ready task: spreading claims must never skip a priority."""
        with self._lock:
            keys = self._queues.get(queue)
            if not keys:
                return []
            head = keys[:count]
        priority = _priority_part(head[0])
        return [self._root + k for k in head if _priority_part(k) == priority]

    def take(
        self, queue: str, spread: int, *, choose: Callable[[list[str]], str] = random.choice
    ) -> str | None:
        """Pick one of the first ``spread`` ready keys of ``queue`` at random and mark it taken
        until ``untake``: concurrent ClaimNext calls of this replica then pick different keys
        instead of racing each other for one (a lost race costs a lease grant, a failed txn, a
        revoke and a re-read). Like ``first``, it never leaves the highest ready priority: when
        every key of that priority is taken, it picks among the taken ones (a race, as without
        the marks). ``choose`` picks among the candidates. None when the queue has no ready key.
        """
        with self._lock:
            keys = self._queues.get(queue)
            if not keys:
                return None
            priority = _priority_part(keys[0])
            window = keys[: spread + len(self._taken)]
            head: list[str] = [k for k in window if _priority_part(k) == priority]
            free = [k for k in head if k not in self._taken][:spread]
            rel = choose(free or head[:spread])
            self._taken[rel] += 1
        return self._root + rel

    def untake(self, key: str) -> None:
        """End the mark ``take`` put on ``key`` (whatever became of the claim)."""
        rel = key[len(self._root) :]
        with self._lock:
            self._taken[rel] -= 1
            if self._taken[rel] <= 0:
                del self._taken[rel]

    def add(self, key: str) -> None:
        """Record a ready key (from a watch event, or right after our own write)."""
        rel = key[len(self._root) :]
        queue = rel.split("/", 1)[0]
        with self._lock:
            keys = self._queues.setdefault(queue, SortedList())
            new = rel not in keys
            if new:
                keys.add(rel)
        if new:
            for listener in self._listeners:
                listener(queue)

    def discard(self, key: str) -> None:
        """Forget a ready key (deleted, or found stale by a lost claim)."""
        rel = key[len(self._root) :]
        queue = rel.split("/", 1)[0]
        with self._lock:
            keys = self._queues.get(queue)
            if keys is not None:
                keys.discard(rel)

    def size(self, queue: str) -> int:
        """Number of ready keys known for ``queue``."""
        with self._lock:
            return len(self._queues.get(queue, ()))

    def _reload(self) -> None:
        kv = self._ctx.kv
        queues: dict[str, SortedList] = {}
        start, end = self._root, kv.prefix_end(self._root)
        revision = 0
        while True:
            page, revision = kv.range_page(start, end, limit=_PAGE, revision=revision)
            for item in page:
                rel = item.key[len(self._root) :]
                queues.setdefault(rel.split("/", 1)[0], SortedList()).add(rel)
            if len(page) < _PAGE:
                break
            start = page[-1].key + "\0"
        with self._lock:
            self._queues = queues
        for listener in self._listeners:
            listener(None)
        self._watch = kv.watch_prefix(
            self._root,
            start_revision=revision + 1,
            on_events=self._on_events,
            on_compacted=self._reload_quietly,
        )

    def _on_events(self, events: list[WatchEvent]) -> None:
        for event in events:
            if event.deleted:
                self.discard(event.key)
            else:
                self.add(event.key)

    def _reload_quietly(self) -> None:
        # Runs on the broken watch's own thread, which ends right after this returns; retry
        # until etcd answers, since a ready index that stopped following would go stale.
        while not self._closed:
            try:
                self._reload()
                return
            except Exception as exc:
                log.error("ready index reload failed; retrying", error=str(exc))
                time.sleep(1.0)


def _priority_part(rel: str) -> str:
    """The priority segment of a ready key relative to the index root ({queue}/{prio}/...)."""
    return rel.split("/", 2)[1]
