"""The event log: every transition's event, read back and followed live.

Events are written by the transition txn itself under ``{p}/events/{task}/{prev_state_version}``
and never rewritten or deleted, so the log can be replayed from any revision by a plain range
read (compaction does not touch live keys), and followed with a watch from the revision of
that read. Each event carries its etcd revision: resume with ``from_revision = revision + 1``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from coordinator.domain.records import EventRecord, decode
from coordinator.domain.states import Op
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd import KV
from coordinator.store.watch import PrefixWatch, WatchEvent

_PAGE = 1000
_IDENTITY_CACHE = 100_000


@dataclass(frozen=True)
class StoredEvent:
    """One transition as stored, with where it sits in etcd's history."""

    record: EventRecord
    # The etcd revision of the transition txn (the event key's create_revision).
    revision: int
    # The task's state_version before the transition (the event key's last segment).
    prev_state_version: int


@dataclass(frozen=True)
class EventFilter:
    """Which events a reader wants; empty fields match everything."""

    task_id: str = ""
    root_task_id: str = ""
    queue: str = ""
    ops: frozenset[Op] = field(default_factory=frozenset)


def event_from_kv(kv: KV) -> StoredEvent:
    """Decode an event; a claim event's generation is its own txn's revision (stored as 0,
    since the claim txn cannot know its revision before it commits)."""
    record = decode(EventRecord, kv.value)
    if record.op is Op.CLAIM and record.claim_generation == 0:
        record = replace(record, claim_generation=kv.create_revision)
    return StoredEvent(record, kv.create_revision, int(kv.key.rsplit("/", 1)[1]))


class EventLog:
    """Reads and follows the event log, filtered."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx
        # task_id -> (root_task_id, queue): both are fixed at creation, so safe to cache.
        self._identity: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def history(self, flt: EventFilter, *, from_revision: int = 0) -> tuple[list[StoredEvent], int]:
        """Every matching event written at or after ``from_revision``, in revision order, and
        the revision the log was read at."""
        kv = self._ctx.kv
        prefix = self._ctx.keys.events_prefix(flt.task_id)
        start, end, read_at = prefix, kv.prefix_end(prefix), 0
        found: list[StoredEvent] = []
        while True:
            page, read_at = kv.range_page(start, end, limit=_PAGE, revision=read_at)
            for item in page:
                if item.create_revision >= from_revision:
                    event = event_from_kv(item)
                    if self.matches(flt, event):
                        found.append(event)
            if len(page) < _PAGE:
                break
            start = page[-1].key + "\0"
        found.sort(key=lambda e: e.revision)
        return found, read_at

    def follow(
        self,
        flt: EventFilter,
        *,
        from_revision: int = 0,
        alive: Callable[[], bool],
        poll: float = 0.5,
    ) -> Iterator[StoredEvent]:
        """The history from ``from_revision``, then every new matching event as it is written,
        until ``alive()`` turns false (checked at least every ``poll`` seconds). A watch that
        loses its history to a compaction is replaced by a fresh read, so nothing is skipped."""
        last = from_revision - 1
        while alive():
            events, read_at = self.history(flt, from_revision=last + 1)
            for event in events:
                yield event
                last = max(last, event.revision)
            last = max(last, read_at)
            inbox: queue.Queue[list[WatchEvent] | None] = queue.Queue()
            watch = self._watch(flt, last + 1, inbox)
            try:
                while alive():
                    try:
                        batch = inbox.get(timeout=poll)
                    except queue.Empty:
                        continue
                    if batch is None:
                        break  # compacted: re-read from the last revision delivered
                    for raw in batch:
                        if raw.deleted or raw.mod_revision <= last:
                            continue
                        decoded = self._decode(raw)
                        last = raw.mod_revision
                        if decoded is not None and self.matches(flt, decoded):
                            yield decoded
            finally:
                watch.close()

    def matches(self, flt: EventFilter, event: StoredEvent) -> bool:
        """Whether ``event`` passes ``flt`` (root and queue are looked up once per task)."""
        record = event.record
        if flt.task_id and record.task_id != flt.task_id:
            return False
        if flt.ops and record.op not in flt.ops:
            return False
        if flt.root_task_id or flt.queue:
            root, queue_name = self._identity_of(record.task_id)
            if flt.root_task_id and root != flt.root_task_id:
                return False
            if flt.queue and queue_name != flt.queue:
                return False
        return True

    def _identity_of(self, task_id: str) -> tuple[str, str]:
        with self._lock:
            cached = self._identity.get(task_id)
        if cached is not None:
            return cached
        kv = self._ctx.kv.get(self._ctx.keys.task(task_id))
        if kv is None:
            return "", ""
        task = task_from_kv(kv)
        identity = (task.root_task_id, task.queue)
        with self._lock:
            if len(self._identity) >= _IDENTITY_CACHE:
                self._identity.clear()  # crude bound; a miss costs one read
            self._identity[task_id] = identity
        return identity

    def _watch(
        self, flt: EventFilter, start: int, inbox: queue.Queue[list[WatchEvent] | None]
    ) -> PrefixWatch:
        return self._ctx.kv.watch_prefix(
            self._ctx.keys.events_prefix(flt.task_id),
            start_revision=start,
            on_events=inbox.put,
            on_compacted=lambda: inbox.put(None),
        )

    @staticmethod
    def _decode(raw: WatchEvent) -> StoredEvent | None:
        # Event keys are written once, so the watch's mod_revision is their create_revision.
        kv = KV(raw.key, raw.value, raw.mod_revision, raw.mod_revision, 0)
        try:
            return event_from_kv(kv)
        except Exception:  # a malformed event is doctor's to report; the stream goes on
            return None
