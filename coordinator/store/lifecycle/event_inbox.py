"""A follower's own etcd watch, read into a bounded inbox: what a follower uses while it is
further back than the replica's shared watch holds (store/lifecycle/event_hub.py)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from coordinator.store.etcd.watch import WatchEvent


class InboxBehind(Exception):
    """The follower's inbox stayed full for its whole patience."""


class Compacted:
    """Marks the end of a watch whose history etcd compacted."""


COMPACTED = Compacted()
"""The one marker ``Inbox.get`` hands back for a compacted watch."""
Batch = list[WatchEvent]
"""One watch response's events."""


INBOX_BYTES = 1024 * 1024
"""The bytes of events (keys and values) one follower's inbox holds at most, besides its count of
events: 10,000 events of 2 KB (a 1 KB reason each) held 19 MB a follow, and 50 follows that
did not read took a replica from 124 MiB to over 1 GiB."""


def _size(batch: Batch) -> int:
    return sum(len(e.key) + len(e.value) for e in batch)


class Inbox:
    """Watch batches waiting for a follower's thread, bounded by events and by bytes.

    A full inbox makes the watch's thread wait (so the watch stops reading and etcd holds the
    rest back): a reader that is slow but moving loses nothing. One that stays full for
    ``patience`` seconds is behind for good: the inbox drops the watch's batches from then on,
    and the reader gets ``StreamBehind`` when it next asks.
    """

    def __init__(
        self,
        capacity: int,
        patience: float,
        on_behind: Callable[[], None],
        *,
        byte_capacity: int = INBOX_BYTES,
    ) -> None:
        self._capacity = capacity
        self._byte_capacity = byte_capacity
        self._bytes = 0
        self._patience = patience
        self._on_behind = on_behind
        self._cond = threading.Condition()
        self._batches: deque[Batch | Compacted] = deque()
        self._count = 0
        self._behind = False
        self._told = False
        self._closed = False

    def put(self, batch: Batch) -> None:
        """Add a watch batch (on the watch's thread); waits while the inbox is full."""
        deadline = time.monotonic() + self._patience
        with self._cond:
            while self._full() and not (self._closed or self._behind):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._behind = True
                    self._cond.notify_all()
                    break
                self._cond.wait(remaining)
            newly_behind = self._behind and not self._told
            self._told = self._told or self._behind
            if not (self._closed or self._behind):
                self._batches.append(batch)
                self._count += len(batch)
                self._bytes += _size(batch)
                self._cond.notify_all()
        if newly_behind:
            self._on_behind()

    def _full(self) -> bool:
        """Whether the inbox holds its count of events or its bytes (under the lock)."""
        return self._count >= self._capacity or self._bytes >= self._byte_capacity

    def compacted(self) -> None:
        """The watch ended: etcd compacted the history it needed."""
        with self._cond:
            self._batches.append(COMPACTED)
            self._cond.notify_all()

    def get(self, timeout: float) -> Batch | Compacted:
        """The oldest batch ([] after ``timeout`` with none); raises InboxBehind once the reader
        has fallen behind for good."""
        with self._cond:
            if not self._batches and not self._behind:
                self._cond.wait(timeout)
            if self._behind:
                raise InboxBehind
            if not self._batches:
                return []
            batch = self._batches.popleft()
            if not isinstance(batch, Compacted):
                self._count -= len(batch)
                self._bytes -= _size(batch)
                self._cond.notify_all()
            return batch

    def behind(self) -> bool:
        """Whether the reader has fallen behind for good."""
        with self._cond:
            return self._behind

    def close(self) -> None:
        """Release a watch thread waiting in ``put``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
