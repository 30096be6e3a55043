"""A watch-fed, in-memory copy of the ready index, so ClaimNext is O(log n) in ready tasks.

etcd 3.4 answers a ``limit=1`` range over a flat prefix in O(n) (it counts the whole range), so
asking etcd for "the first ready key" costs 10 ms at 100k keys. Instead each replica loads the
ready keys once (paged) and follows them with a watch. The copy is only a hint: the claim txn
compares the task record itself, so a stale entry costs one failed attempt, never a wrong claim.

The same copy answers the autoscaling figures (``heads``: ready tasks and the oldest ready
sequence per queue) without a read: every replica follows the same keys, so all report alike.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from time import monotonic

from sortedcontainers import SortedList

from coordinator.domain.queue_stats import ReadyHead
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import KV
from coordinator.store.etcd.watch import WatchEvent
from coordinator.store.indexes.prefix_copy import PrefixCopy
from coordinator.store.transition import ready_time

BENCH_SECONDS = 5.0
"""How long a ready key a ClaimNext could not claim is passed by on this replica."""


class ReadyIndex(PrefixCopy):
    """Per-queue sorted ready keys, kept current by a watch on ``{prefix}/ready/``."""

    def __init__(self, ctx: StoreContext) -> None:
        super().__init__(ctx, ctx.keys.ready_prefix(), keys_only=True)
        self._lock = threading.Lock()
        self._queues: dict[str, SortedList] = {}
        # Keys (relative) that a ClaimNext of this replica is trying right now: another
        # ClaimNext here picks a different one instead of losing the same race (see take()).
        self._taken: Counter[str] = Counter()
        # Keys (relative) a ClaimNext here found it could not claim now, with the monotonic time
        # until which take() passes them by (see bench()).
        self._benched: dict[str, float] = {}
        # Told of each ready key that was not known yet (its queue) and of every reload
        # (None): the long polls waiting for a task (store/claims/long_poll.py).
        self._listeners: list[Callable[[str | None], None]] = []

    def listen(self, listener: Callable[[str | None], None]) -> None:
        """Call ``listener(queue)`` for every new ready key, ``listener(None)`` on a reload."""
        self._listeners.append(listener)

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
            benched = self._still_benched(monotonic())
            window = [
                k for k in keys[: spread + len(self._taken) + len(benched)] if k not in benched
            ]
            if not window:
                return None
            priority = _priority_part(window[0])
            head: list[str] = [k for k in window if _priority_part(k) == priority]
            free = [k for k in head if k not in self._taken][:spread]
            rel = choose(free or head[:spread])
            self._taken[rel] += 1
        return self._root + rel

    def bench(self, key: str) -> None:
        """Pass ``key`` by in ``take`` for BENCH_SECONDS: a ClaimNext found it not claimable now
        (another claim won it, its txn kept losing, its task is held up). It stays in the
        index, counted by ``size`` and ``heads`` like on every other replica, and is offered
        again afterwards unless its deletion arrived: dropping it for good on a refusal that
        etcd's index never followed hid the task from this replica until a restart."""
        rel = key[len(self._root) :]
        with self._lock:
            self._benched[rel] = monotonic() + BENCH_SECONDS

    def _still_benched(self, now: float) -> dict[str, float]:
        """The benched keys whose time has not passed (the others forgotten); under the lock."""
        for rel in [r for r, until in self._benched.items() if until <= now]:
            del self._benched[rel]
        return self._benched

    def untake(self, key: str) -> None:
        """End the mark ``take`` put on ``key`` (whatever became of the claim)."""
        rel = key[len(self._root) :]
        with self._lock:
            self._taken[rel] -= 1
            if self._taken[rel] <= 0:
                del self._taken[rel]

    def add(self, key: str) -> None:
        """Record a ready key (from a watch event, or right after our own write); a benched
        one is written again, so it is offered at once."""
        rel = key[len(self._root) :]
        queue = rel.split("/", 1)[0]
        with self._lock:
            self._benched.pop(rel, None)
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
            self._benched.pop(rel, None)

    def size(self, queue: str) -> int:
        """Number of ready keys known for ``queue``."""
        with self._lock:
            return len(self._queues.get(queue, ()))

    def heads(self) -> dict[str, ReadyHead]:
        """Every queue with a ready key: how many, and the oldest one's sequence. The oldest
        key is the first of some priority (keys sort by priority, then sequence), so this
        visits one key per priority present, not every key."""
        with self._lock:
            return {q: _head(keys) for q, keys in self._queues.items() if keys}

    def replace(self, items: list[KV]) -> None:
        """A full load: the index is exactly these keys."""
        queues: dict[str, SortedList] = {}
        for item in items:
            rel = item.key[len(self._root) :]
            queues.setdefault(rel.split("/", 1)[0], SortedList()).add(rel)
        with self._lock:
            self._queues = queues
        for listener in self._listeners:
            listener(None)

    def apply(self, events: list[WatchEvent]) -> None:
        """Ready keys created or deleted."""
        for event in events:
            if event.deleted:
                self.discard(event.key)
            else:
                self.add(event.key)


def _head(keys: SortedList) -> ReadyHead:
    """``keys`` is not empty; its first key of each priority is that priority's oldest."""
    oldest = _seq_part(keys[0])
    index = 0
    while index < len(keys):
        queue, priority, seq, _ = keys[index].split("/", 3)
        oldest = min(oldest, int(seq))
        # '/' < '0': every key of this priority sorts below "{queue}/{priority}0".
        index = keys.bisect_left(f"{queue}/{priority}0")
    return ReadyHead(len(keys), ready_time(oldest))


def _seq_part(rel: str) -> int:
    """The ready sequence of a ready key relative to the index root."""
    return int(rel.split("/", 3)[2])


def _priority_part(rel: str) -> str:
    """The priority segment of a ready key relative to the index root ({queue}/{prio}/...)."""
    return rel.split("/", 2)[1]
