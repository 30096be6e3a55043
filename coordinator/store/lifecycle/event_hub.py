"""One etcd watch on the event log per replica, fanned out in memory to its follow streams.

A watch per follower cost ~143 KiB and 3 threads a stream (~6,200 threads for a replica with
1,000 follows), and etcd a watcher each. The hub opens one watch on the whole events prefix
while anyone follows, and hands each response to every follower's ``Mailbox``: a bounded queue
of its own, so the hub's thread never waits for a reader.

- A follower joins at its cursor when the hub holds everything after it: the hub keeps the
  ``RING_EVENTS`` newest events (and everything since its watch started), so a follower that
  starts from now, or resumes a moment back, joins with those as its backlog. One further back
  reads through a watch of its own until it reaches the hub (store/lifecycle/events.py).
- A mailbox that is full when a batch comes is detached (the batch is not put in it): its
  reader drains it and joins again from where it stands, losing nothing. One that stays
  detached for ``patience`` seconds is behind for good (the contract of today's slow followers:
  ``on_behind`` at once, on the hub's thread; ``StreamBehind`` when its reader next asks).
- One ticker thread looks at every attached follower's ``alive()`` each ``tick``: a follower
  whose call ended (cancelled, max age, revoked) is woken, instead of 1,000 handler threads
  waking every 0.5 s to look for themselves.
- With no follower for ``idle_close`` seconds the hub closes its watch; a compacted watch
  detaches everyone, who join again through their own reads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from coordinator.domain.positions import EventPosition
from coordinator.store.context import StoreContext
from coordinator.store.etcd.watch import PrefixWatch, WatchEvent

RING_EVENTS = 4_096
"""Newest events the hub keeps for followers joining a little way back (~1-2 MB)."""
IDLE_CLOSE = 30.0
"""Seconds the hub keeps its watch with no follower (a reconnecting pool finds it open)."""

Entry = tuple[EventPosition, WatchEvent]


class Behind(Exception):
    """The follower's mailbox stayed detached (full) for its whole patience."""


class Mailbox:
    """One follower's bounded queue of watch batches (each sorted by position)."""

    def __init__(
        self,
        capacity: int,
        patience: float,
        *,
        alive: Callable[[], bool],
        on_behind: Callable[[], None],
    ) -> None:
        self._capacity = capacity
        self._patience = patience
        self._alive = alive
        self._on_behind = on_behind
        self._cond = threading.Condition()
        self._batches: deque[list[Entry]] = deque()
        self._count = 0
        self._detached_at: float | None = None
        self._behind = False
        self._look = False
        self._ended = False

    def attach(self, backlog: list[Entry], now: float) -> None:
        """Start over (joined at the reader's cursor) with ``backlog`` waiting: at most
        ``capacity`` of it, and then detached, so the reader takes the rest by joining again
        (and one that takes nothing is found behind, whatever the ring held)."""
        with self._cond:
            self._batches.clear()
            self._count = min(len(backlog), self._capacity)
            self._detached_at = now if len(backlog) > self._capacity else None
            if backlog:
                self._batches.append(backlog[: self._capacity])

    def offer(self, batch: list[Entry], now: float) -> None:
        """Add a batch (on the hub's thread; never waits). A full mailbox is detached."""
        with self._cond:
            if self._detached_at is not None:
                return
            if self._count >= self._capacity:
                self._detached_at = now
            else:
                self._batches.append(batch)
                self._count += len(batch)
            self._cond.notify()

    def detach(self, now: float) -> None:
        """Make the reader join again from its cursor (the hub's watch was compacted)."""
        with self._cond:
            self._detached_at = now if self._detached_at is None else self._detached_at
            self._cond.notify()

    def end(self) -> None:
        """The hub closed (its store is closing): the reader stops following."""
        with self._cond:
            self._ended = self._look = True
            self._cond.notify()

    @property
    def ended(self) -> bool:
        """Whether the hub that fed this mailbox closed."""
        with self._cond:
            return self._ended

    def check(self, now: float) -> None:
        """The ticker's look: behind for good after ``patience`` detached; woken if its call
        ended."""
        newly_behind = False
        with self._cond:
            if self._detached_at is not None and not self._behind:
                newly_behind = now - self._detached_at >= self._patience
                self._behind = newly_behind
            if newly_behind or not self._alive():
                self._look = True
                self._cond.notify()
        if newly_behind:
            self._on_behind()

    def get(self) -> list[Entry] | None:
        """The oldest batch; [] when the reader should look at ``alive()``; None once detached
        and drained (join again). Raises Behind once behind for good."""
        with self._cond:
            while not (self._batches or self._behind or self._look):
                if self._detached_at is not None:
                    return None
                self._cond.wait()
            if self._behind:
                raise Behind
            if self._look:
                self._look = self._ended  # an ended mailbox answers [] from then on
                return []
            batch = self._batches.popleft()
            self._count -= len(batch)
            return batch


class EventHub:
    """The replica's one watch on the event log, and the mailboxes it feeds."""

    def __init__(
        self,
        ctx: StoreContext,
        *,
        tick: float,
        ring: int = RING_EVENTS,
        idle_close: float = IDLE_CLOSE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ctx = ctx
        self._tick = tick
        self._ring_size = ring
        self._idle_close = idle_close
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._watch: PrefixWatch | None = None
        # Which watch is current: a closed or compacted one's late batches are dropped.
        self._generation = 0
        self._ring: deque[Entry] = deque()
        # Every event after the floor reaches the hub (held in the ring, or still to come).
        self._floor = EventPosition.start_of(0)
        self._boxes: set[Mailbox] = set()
        self._idle_since = 0.0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    @property
    def followers(self) -> int:
        """Followers fed by the hub now."""
        with self._lock:
            return len(self._boxes)

    def covers(self, cursor: EventPosition) -> bool:
        """Whether a follower at ``cursor`` can join now (opens the watch if it is closed)."""
        with self._lock:
            self._open()
            return cursor >= self._floor

    def join(self, box: Mailbox, cursor: EventPosition) -> bool:
        """Attach ``box`` with every event after ``cursor`` the ring holds; False (not
        attached) when the hub does not hold everything after ``cursor``."""
        with self._lock:
            self._open()
            if cursor < self._floor:
                return False
            box.attach([entry for entry in self._ring if entry[0] > cursor], self._monotonic())
            self._boxes.add(box)
            return True

    def leave(self, box: Mailbox) -> None:
        """Detach ``box`` for good (its follower ended)."""
        with self._lock:
            self._boxes.discard(box)
            if not self._boxes:
                self._idle_since = self._monotonic()

    def close(self) -> None:
        """Close the watch and stop the ticker; every attached follower stops (nothing would
        wake it to look at its call any more)."""
        with self._lock:
            watch = self._shut()
            for box in self._boxes:
                box.end()
        if watch is not None:
            watch.close()

    def _open(self) -> None:
        if self._watch is not None:
            return
        prefix = self._ctx.keys.events_prefix("")
        _, now = self._ctx.kv.range_page(
            prefix, self._ctx.kv.prefix_end(prefix), limit=1, keys_only=True
        )
        self._ring.clear()
        self._floor = EventPosition.start_of(now)
        self._idle_since = self._monotonic()
        self._generation += 1
        generation = self._generation
        self._watch = self._ctx.kv.watch_prefix(
            prefix,
            start_revision=now,
            on_events=lambda raws: self._dispatch(raws, generation),
            on_compacted=lambda: self._compacted(generation),
        )
        if self._ticker is None:
            # A ticker of its own stop event: one told to stop never runs on beside the next.
            self._stop = threading.Event()
            self._ticker = threading.Thread(
                target=self._run, args=(self._stop,), name="event hub", daemon=True
            )
            self._ticker.start()

    def _shut(self) -> PrefixWatch | None:
        """Forget the watch (the caller closes it, outside the lock: its thread may be waiting
        for the lock in ``_dispatch``) and stop the ticker."""
        watch, self._watch = self._watch, None
        self._generation += 1  # a batch the closed watch still hands over is dropped
        self._ring.clear()
        self._stop.set()
        self._ticker = None
        return watch

    def _dispatch(self, raws: list[WatchEvent], generation: int) -> None:
        batch = sorted(
            ((_position(raw), raw) for raw in raws if not raw.deleted), key=lambda e: e[0]
        )
        if not batch:
            return
        now = self._monotonic()
        with self._lock:
            if generation != self._generation:
                return
            for entry in batch:
                if len(self._ring) >= self._ring_size:
                    self._floor = self._ring.popleft()[0]
                self._ring.append(entry)
            # Under the lock, so a follower joining now gets this batch exactly once.
            for box in self._boxes:
                box.offer(batch, now)

    def _compacted(self, generation: int) -> None:
        now = self._monotonic()
        with self._lock:
            if generation != self._generation:
                return
            self._generation += 1
            self._watch = None  # its thread ends after this callback
            self._ring.clear()
            for box in self._boxes:
                box.detach(now)

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self._tick):
            now = self._monotonic()
            with self._lock:
                boxes = list(self._boxes)
                idle = not boxes and now - self._idle_since >= self._idle_close
                watch = self._shut() if idle else None
            if idle:
                if watch is not None:
                    watch.close()
                return
            for box in boxes:
                box.check(now)


Place = tuple[int, str, int]
"""An event's position as a plain tuple (revision, task id, prev_state_version): it orders as
``EventPosition`` does and names the event's key (``Keyspace.event``), in less memory."""


def place_of_key(key: str, revision: int) -> Place:
    """The place of the event stored at ``key`` by the txn of ``revision``."""
    head, version = key.rsplit("/", 1)
    return revision, head.rsplit("/", 1)[1], int(version)


def position_of_key(key: str, revision: int) -> EventPosition:
    """The position of the event stored at ``key`` by the txn of ``revision``."""
    return EventPosition(*place_of_key(key, revision))


def _position(raw: WatchEvent) -> EventPosition:
    # Event keys are written once, so the watch's mod_revision is their create_revision.
    return position_of_key(raw.key, raw.mod_revision)
