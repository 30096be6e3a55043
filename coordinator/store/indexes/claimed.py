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

The claimed index also screens renewals (domain/fence_screen.py): every claim txn writes the
task's key at the claim's generation, so the revision each key was last written at, the last
revision applied, and the recent claim ends tell whether a fence can name a live claim, without
asking etcd.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict

from coordinator.domain.fence_screen import Screen, screen
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import KV
from coordinator.store.etcd.watch import WatchEvent
from coordinator.store.indexes.prefix_copy import PrefixCopy


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


ENDED = 16384
"""Claim ends remembered (task id and the revision its key was last written at, ~150 bytes
each): a renewal racing its own claim's end within the last ENDED ends is read, so it gets the
exact reason (ALREADY_COMMITTED, RELEASED...). An older end is refused from memory."""


class ClaimedIndex(QueueCountIndex):
    """Claimed tasks per queue, kept current by a watch on ``{prefix}/claimed/``, and the
    screen of renewals' fences (``screen``)."""

    def __init__(self, ctx: StoreContext, *, ended: int = ENDED) -> None:
        super().__init__(ctx, ctx.keys.claimed_prefix)
        self._screen_lock = threading.Lock()
        self._written: dict[str, int] = {}
        self._ended: OrderedDict[str, int] = OrderedDict()
        self._ended_capacity = ended
        self._seen_through = 0  # 0: not loaded yet, nothing is screened

    def screen(self, task_id: str, generation: int) -> Screen:
        """Whether a fence of ``task_id`` at ``generation`` may name a live claim (READ
        before the first load: a copy that knows nothing screens nothing)."""
        with self._screen_lock:
            if not self._seen_through:
                return Screen.READ
            return screen(
                generation,
                seen_through=self._seen_through,
                written=self._written.get(task_id),
                ended=self._ended.get(task_id),
            )

    def replace(self, items: list[KV]) -> None:
        """A full load: also the revision each key was last written at."""
        super().replace(items)
        with self._screen_lock:
            self._written = {_task_id(kv.key): kv.mod_revision for kv in items}

    def loaded(self, revision: int) -> None:
        """The load's revision: every claim at or before it is in the copy."""
        with self._screen_lock:
            self._seen_through = revision

    def apply(self, events: list[WatchEvent]) -> None:
        """Index keys written (a claim) or deleted (its end), remembering recent ends."""
        super().apply(events)
        with self._screen_lock:
            for event in events:
                task_id = _task_id(event.key)
                if event.deleted:
                    last = self._written.pop(task_id, None)
                    if last is not None:
                        self._ended[task_id] = last
                        self._ended.move_to_end(task_id)
                        if len(self._ended) > self._ended_capacity:
                            self._ended.popitem(last=False)
                else:
                    self._written[task_id] = event.mod_revision
                self._seen_through = max(self._seen_through, event.mod_revision)


def _task_id(key: str) -> str:
    return key.rsplit("/", 1)[1]
