"""Watch-fed, in-memory copies of the per-queue indexes (claimed, blocked, overdue), counted
per queue.

The claimed index (``{prefix}/claimed/{task_id}``) exists exactly while a task is CLAIMED, and
its value is the task's queue (store/transition.py writes it). Counting claims per queue from
the task records would read every claimed task's record on each scrape; this copy costs one
paged load at start and one watch event per claim and per claim end, like the ready index.

It keeps task id -> queue rather than a counter per queue: a deletion carries no value, and a
set is idempotent, so a reload or a replayed event can never make a count drift. A key with an
empty value (written by a coordinator older than this one, which put no queue there) counts in
no queue until its claim ends (at most ``max_claim_duration``). The blocked and overdue
indexes (WAITING tasks with a FAILED or CANCELLED upstream, or past their schedule_to_close)
carry the queue the same way and are counted by the same class.
"""

from __future__ import annotations

import threading
from collections import Counter

from coordinator.store.context import StoreContext
from coordinator.store.etcd import KV
from coordinator.store.prefix_copy import PrefixCopy
from coordinator.store.watch import WatchEvent


class QueueCountIndex(PrefixCopy):
    """Tasks per queue in one index whose values are queues, kept current by a watch."""

    def __init__(self, ctx: StoreContext, prefix: str) -> None:
        super().__init__(ctx, prefix, keys_only=False)
        self._lock = threading.Lock()
        self._queue_of: dict[str, str] = {}
        self._counts: Counter[str] = Counter()

    def counts(self) -> dict[str, int]:
        """Tasks per queue (queues with none are absent)."""
        with self._lock:
            return dict(self._counts)

    def replace(self, items: list[KV]) -> None:
        """A full load: the index is exactly these keys."""
        queue_of = {_task_id(kv.key): kv.value.decode() for kv in items if kv.value}
        with self._lock:
            self._queue_of = queue_of
            self._counts = Counter(queue_of.values())

    def apply(self, events: list[WatchEvent]) -> None:
        """Index keys written (a claim, a mark) or deleted (its end)."""
        with self._lock:
            for event in events:
                task_id = _task_id(event.key)
                self._forget(task_id)
                if not event.deleted and event.value:
                    queue = event.value.decode()
                    self._queue_of[task_id] = queue
                    self._counts[queue] += 1

    def _forget(self, task_id: str) -> None:
        queue = self._queue_of.pop(task_id, None)
        if queue is not None:
            self._counts[queue] -= 1
            if not self._counts[queue]:
                del self._counts[queue]


class ClaimedIndex(QueueCountIndex):
    """Claimed tasks per queue, kept current by a watch on ``{prefix}/claimed/``."""

    def __init__(self, ctx: StoreContext) -> None:
        super().__init__(ctx, ctx.keys.claimed_prefix)


def _task_id(key: str) -> str:
    return key.rsplit("/", 1)[1]
