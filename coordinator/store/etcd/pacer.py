"""A request pacer: at most ``rate`` requests per second, spaced evenly, never in bursts.

The pruner (and its sweep of ended attempts' records) sends every etcd request it makes - the
index pages, the history reads, the prune, defer and tombstone txns - through one pacer, so
background cleanup takes a bounded share of etcd and never competes with claims for it, however
much is due at once. The clock and the wait are injected: a test drives time and counts the
requests of each interval without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Pacer:
    """Hands out one slot every ``1 / rate`` seconds; ``take`` waits for the next one."""

    def __init__(
        self,
        rate: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], object] | None = None,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self._interval = 1.0 / rate
        self._clock = clock
        self._wait = wait or time.sleep
        self._lock = threading.Lock()
        self._next = 0.0

    @property
    def rate(self) -> float:
        """Slots per second."""
        return 1.0 / self._interval

    def take(self) -> None:
        """Wait for this caller's slot (callers are served in turn)."""
        with self._lock:
            now = self._clock()
            slot = max(self._next, now)
            # An idle pacer does not save slots up: the next request waits a full interval
            # after the last one, so a backlog never arrives at etcd as a burst.
            self._next = slot + self._interval
        if slot > now:
            self._wait(slot - now)
