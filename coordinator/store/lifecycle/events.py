"""The event log: every transition's event, read back and followed live, in position order.

Events are written by the transition txn itself under ``{p}/events/{task}/{prev_state_version}``
and never rewritten. Several events can share one etcd revision (group commit nests txns; the
releaser moves several tasks at once), so readers order and resume by ``EventPosition``
(domain/positions.py: revision, then task id, then state_version), never by revision alone.

Memory per reader is bounded whatever the log's length:

- ``history`` selects the next ``_SELECT`` positions in passes over the keys (keys only, pages
  of ``_PAGE``, a bounded heap), then reads those events' values ``_LOAD`` at a time, so a log
  of any length is streamed, never listed whole. A pass costs a keys-only scan of the range
  read (one task's events with a task filter, else the whole log: ``from_revision`` near now
  is cheaper through ``follow``, which replays from etcd's watch history).
- ``follow`` takes live events from the replica's one shared watch (event_hub.py: a bounded
  mailbox per follower, fed in memory; one that stays full for ``patience`` seconds ends with
  ``StreamBehind`` carrying the position to resume after). A follower further back than the
  hub holds replays through an etcd watch of its own from its revision, into a bounded inbox
  (a full inbox holds that watch back), then joins the hub; one whose history etcd compacted
  reads it in ``history`` passes first.
- every run of passes holds a replay slot (store/lifecycle/replay_slots.py): a bounded number run
  at once, per replica and per principal, so the replicas' memory for replays is a few passes.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field

from coordinator.domain.positions import EventPosition, StreamBehind
from coordinator.domain.records import EventRecord, decode, with_changes
from coordinator.domain.states import Op
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import KV, get
from coordinator.store.etcd.watch import WatchEvent
from coordinator.store.lifecycle.event_hub import (
    Behind,
    EventHub,
    Mailbox,
    Place,
    place_of_key,
    position_of_key,
)
from coordinator.store.lifecycle.event_inbox import Compacted, Inbox, InboxBehind
from coordinator.store.lifecycle.replay_slots import ReplaySlots

_PAGE = 1000
# Event places (event_hub.Place) one history pass selects (~150 bytes each, measured with
# tracemalloc: ~0.75 MB a replay; as positions with their keys they took ~400 bytes, and 32
# replays of a whole 20,000 event list +352 MB), and event values read per round trip (etcd
# refuses more than 128 operations in one txn by default).
_SELECT = 5_000
_LOAD = 100
_IDENTITY_CACHE = 100_000
WHOLE_LOG = EventPosition.start_of(1)
"""Before the first event: reading after it reads the whole log."""
# Events a follower may have waiting before the watch is held back, and how long it may stay
# that far behind before its stream is ended.
INBOX_EVENTS = 10_000
PATIENCE_SECONDS = 10.0
FOLLOW_POLL = 0.5
"""Seconds at most between a follower's looks at whether its stream should go on."""


@dataclass(frozen=True)
class StoredEvent:
    """One transition as stored, with where it sits in etcd's history."""

    record: EventRecord
    # The etcd revision of the transition txn (the event key's create_revision).
    revision: int
    # The task's state_version before the transition (the event key's last segment).
    prev_state_version: int

    @property
    def position(self) -> EventPosition:
        """The one place of this event in the log."""
        return EventPosition(self.revision, self.record.task_id, self.prev_state_version)


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
        record = with_changes(record, claim_generation=kv.create_revision)
    return StoredEvent(record, kv.create_revision, int(kv.key.rsplit("/", 1)[1]))


class EventLog:
    """Reads and follows the event log, filtered."""

    def __init__(
        self,
        ctx: StoreContext,
        *,
        inbox_events: int = INBOX_EVENTS,
        patience: float = PATIENCE_SECONDS,
        slots: ReplaySlots | None = None,
    ) -> None:
        self._ctx = ctx
        self._slots = slots if slots is not None else ReplaySlots(ctx.metrics)
        self._inbox_events = inbox_events
        self._patience = patience
        self._hub = EventHub(ctx, tick=min(FOLLOW_POLL, patience / 2))
        # task_id -> (root_task_id, queue): both are fixed at creation, so safe to cache.
        self._identity: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the shared watch (followers still open see no further event)."""
        self._hub.close()

    @property
    def followers(self) -> int:
        """Follow streams fed by the replica's shared watch now."""
        return self._hub.followers

    @property
    def replays_running(self) -> int:
        """Replays of the log's past holding a slot now (store/lifecycle/replay_slots.py)."""
        return self._slots.running()

    @property
    def inbox_events(self) -> int:
        """Events a follower may have waiting before it is held back (then found behind)."""
        return self._inbox_events

    def history(
        self, flt: EventFilter, *, after: EventPosition = WHOLE_LOG, principal: str = ""
    ) -> Iterator[StoredEvent]:
        """Every matching event after ``after``, in position order, up to the revision the
        log was first read at; streamed in passes of bounded size, within a replay slot of
        ``principal`` (ResourceExhausted, before any read, when none is free)."""
        for events, _ in self._passes(flt, after, principal):
            yield from events

    def newest(
        self, flt: EventFilter, *, before: EventPosition | None, count: int
    ) -> list[StoredEvent]:
        """The ``count`` newest matching events before ``before`` (None: the newest of the
        log), newest first. One keys-only pass over the range, as a history pass costs, with a
        heap of ``count`` positions: a page to read back through, bounded whatever the log."""
        horizon = [0]
        candidates = self._candidates(flt, WHOLE_LOG, horizon)
        if before is not None:
            bound = _place(before)
            candidates = (place for place in candidates if place < bound)
        chosen = heapq.nlargest(count, candidates)
        found: list[StoredEvent] = []
        for start in range(0, len(chosen), _LOAD):
            found += [e for e in self._load(chosen[start : start + _LOAD]) if self.matches(flt, e)]
        return found

    def follow(
        self,
        flt: EventFilter,
        *,
        after: EventPosition = WHOLE_LOG,
        alive: Callable[[], bool],
        on_behind: Callable[[], None] = lambda: None,
        poll: float = FOLLOW_POLL,
        principal: str = "",
    ) -> Iterator[StoredEvent]:
        """Every matching event after ``after``, then each new one as it is written, until
        ``alive()`` turns false (looked at at least every ``poll`` seconds). Raises
        ``StreamBehind`` when the reader fell too far behind (``on_behind`` is called the
        moment that is decided, on another thread: the reader may be stuck sending). Live
        events come from the replica's one shared watch (store/lifecycle/event_hub.py); a
        follower further back than the hub holds reads through a watch of its own until it
        reaches it, and one whose watch history etcd compacted reads it in passes, within a
        replay slot of ``principal``."""
        cursor = after
        box = Mailbox(self._inbox_events, self._patience, alive=alive, on_behind=on_behind)
        try:
            while alive() and not box.ended:
                if self._hub.join(box, cursor):
                    cursor = yield from self._shared(box, flt, cursor, alive)
                else:
                    cursor = yield from self._catch_up(
                        flt, cursor, alive, on_behind, poll, principal
                    )
        finally:
            self._hub.leave(box)

    def _shared(
        self, box: Mailbox, flt: EventFilter, cursor: EventPosition, alive: Callable[[], bool]
    ) -> Generator[StoredEvent, None, EventPosition]:
        """The hub's batches through ``box`` until the reader's end, or until the box was
        detached and drained (returns the cursor to join again from)."""
        while alive() and not box.ended:
            try:
                batch = box.get()
            except Behind:
                raise StreamBehind(cursor, self._inbox_events) from None
            if batch is None:
                return cursor
            for position, raw in batch:
                if position <= cursor:
                    continue  # the ring's backlog and a batch can overlap at a join
                cursor = position
                event = self._decode(raw)
                if event is not None and self.matches(flt, event):
                    yield event
        return cursor

    def _catch_up(
        self,
        flt: EventFilter,
        cursor: EventPosition,
        alive: Callable[[], bool],
        on_behind: Callable[[], None],
        poll: float,
        principal: str,
    ) -> Generator[StoredEvent, None, EventPosition]:
        """Every matching event after ``cursor`` through a watch of the follower's own, until
        the hub covers the cursor reached (returned). Once etcd compacted the history that
        watch needed, the rest is read in passes (``_replay``) instead."""
        inbox = Inbox(self._inbox_events, self._patience, on_behind)
        watch = self._ctx.kv.watch_prefix(
            self._ctx.keys.events_prefix(flt.task_id),
            start_revision=cursor.revision,
            on_events=inbox.put,
            on_compacted=inbox.compacted,
        )
        try:
            while alive():
                try:
                    batch = inbox.get(timeout=poll)
                except InboxBehind:
                    raise StreamBehind(cursor, self._inbox_events) from None
                if isinstance(batch, Compacted):
                    break
                for raw in sorted(batch, key=_watch_position):
                    position = _watch_position(raw)
                    if raw.deleted or position <= cursor:
                        continue
                    cursor = position
                    event = self._decode(raw)
                    if event is not None and self.matches(flt, event):
                        yield event
                # One already found behind ends as such: it is not let join the hub instead.
                if batch and not inbox.behind() and self._hub.covers(cursor):
                    return cursor
            else:
                return cursor
        finally:
            inbox.close()
            watch.close()
        # etcd compacted the revisions the watch needed: read them from the keys instead.
        return (yield from self._replay(flt, cursor, principal))

    def _replay(
        self, flt: EventFilter, cursor: EventPosition, principal: str
    ) -> Generator[StoredEvent, None, EventPosition]:
        """Every matching event after ``cursor`` read in passes (within a replay slot); returns
        the position a follower watches on from (the passes' horizon)."""
        for events, horizon in self._passes(flt, cursor, principal):
            for event in events:
                cursor = max(cursor, event.position)
                yield event
            cursor = max(cursor, EventPosition.end_of(horizon))
        return cursor

    def matches(self, flt: EventFilter, event: StoredEvent) -> bool:
        """Whether ``event`` passes ``flt`` (root and queue are looked up once per task)."""
        if flt.ops and event.record.op not in flt.ops:
            return False
        return self._task_matches(flt, event.record.task_id)

    def _task_matches(self, flt: EventFilter, task_id: str) -> bool:
        if flt.task_id and task_id != flt.task_id:
            return False
        if flt.root_task_id or flt.queue:
            root, queue_name = self._identity_of(task_id)
            if flt.root_task_id and root != flt.root_task_id:
                return False
            if flt.queue and queue_name != flt.queue:
                return False
        return True

    def _passes(
        self, flt: EventFilter, after: EventPosition, principal: str
    ) -> Iterator[tuple[list[StoredEvent], int]]:
        """Passes over the log, each the next ``_SELECT`` events after the last (decoded and
        filtered), with the horizon: the revision of the first read, above which no pass looks
        (events come later than the reader asked; a follower watches on from there). Within a
        replay slot of ``principal``, held until the last pass (or the reader's end)."""
        with self._slots.hold(principal):
            yield from self._unbounded_passes(flt, after)

    def _unbounded_passes(
        self, flt: EventFilter, after: EventPosition
    ) -> Iterator[tuple[list[StoredEvent], int]]:
        horizon = [0]
        cursor = after
        while True:
            chosen = heapq.nsmallest(_SELECT, self._candidates(flt, cursor, horizon))
            for start in range(0, len(chosen), _LOAD):
                loaded = self._load(chosen[start : start + _LOAD])
                yield [e for e in loaded if self.matches(flt, e)], horizon[0]
            if len(chosen) < _SELECT:
                yield [], horizon[0]
                return
            cursor = EventPosition(*chosen[-1])

    def _load(self, places: list[Place]) -> list[StoredEvent]:
        """The events at ``places``, in that order (one read; a key pruned meanwhile and a
        malformed event are left out)."""
        keys = self._ctx.keys
        snap = self._ctx.kv.read(*(get(keys.event(task, version)) for _, task, version in places))
        found = (
            self._decode_kv(kv) for kv in (snap.range_one(i) for i in range(len(places))) if kv
        )
        return [event for event in found if event is not None]

    def _candidates(
        self, flt: EventFilter, cursor: EventPosition, horizon: list[int]
    ) -> Iterator[Place]:
        """The place of every event after ``cursor`` and at or below the horizon (fixed by the
        first page read, when ``horizon[0]`` is 0) whose task passes the filter, page by page."""
        kv = self._ctx.kv
        prefix = self._ctx.keys.events_prefix(flt.task_id)
        start, end = prefix, kv.prefix_end(prefix)
        after = _place(cursor)
        while True:
            page, read_at = kv.range_page(start, end, limit=_PAGE, keys_only=True)
            horizon[0] = horizon[0] or read_at
            for item in page:
                place = place_of_key(item.key, item.create_revision)
                if after < place and place[0] <= horizon[0] and self._task_matches(flt, place[1]):
                    yield place
            if len(page) < _PAGE:
                return
            start = page[-1].key + "\0"

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

    @staticmethod
    def _decode_kv(kv: KV) -> StoredEvent | None:
        try:
            return event_from_kv(kv)
        except Exception:  # a malformed event is doctor's to report; the stream goes on
            return None

    @classmethod
    def _decode(cls, raw: WatchEvent) -> StoredEvent | None:
        # Event keys are written once, so the watch's mod_revision is their create_revision.
        return cls._decode_kv(KV(raw.key, raw.value, raw.mod_revision, raw.mod_revision, 0))


def _place(position: EventPosition) -> Place:
    return position.revision, position.task_id, position.prev_state_version


def _watch_position(raw: WatchEvent) -> EventPosition:
    return position_of_key(raw.key, raw.mod_revision)
