"""Leases shared by time window, for keys that only need to expire (idempotency keys)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class LeaseWindow:
    """One lease per window of time, with TTL ``ttl + window``, shared by every key written in
    that window: each key outlives ``ttl``, and a busy replica grants one lease per window.
    ``grant(ttl)`` grants a lease (``EtcdKV.grant``: its id and granted TTL)."""

    def __init__(self, grant: Callable[[int], tuple[int, int]], ttl: float) -> None:
        self._grant = grant
        self._window = max(1.0, ttl / 100)
        self._ttl = int(ttl + self._window) + 1
        self._lock = threading.Lock()
        self._lease = 0
        self._until = 0.0

    def lease(self) -> int:
        """The lease of the current window (granted at its first key)."""
        with self._lock:
            now = time.monotonic()
            if now >= self._until:
                self._lease, _ = self._grant(self._ttl)
                self._until = now + self._window
            return self._lease

    def lost(self, lease_id: int) -> None:
        """etcd refused ``lease_id`` (LeaseGone): the next key gets a fresh grant."""
        with self._lock:
            if self._lease == lease_id:
                self._until = 0.0
