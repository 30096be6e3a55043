"""A one-way flag that can be waited on, whose Event is made only when someone waits.

A Claim has two such flags (stop, lost) and most claims end without anyone waiting on either: a
worker that commits in milliseconds never starts its keepalive. A ``threading.Event`` per flag
would cost each claim two Conditions (and each ``set`` a notify) for nothing.
"""

from __future__ import annotations

import threading


class Flag:
    """Like ``threading.Event`` without ``clear``: ``set`` once, ``is_set``, ``wait``."""

    __slots__ = ("_event", "_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._event: threading.Event | None = None

    def is_set(self) -> bool:
        """Whether ``set`` was called. Never blocks."""
        return self._set

    def set(self) -> None:
        """Set the flag and wake every waiter (idempotent)."""
        with self._lock:
            self._set = True
            event = self._event
        if event is not None:
            event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is set or ``timeout`` passes; returns ``is_set()``."""
        with self._lock:
            if self._set:
                return True
            # Made under the lock: a ``set`` either saw this event or happened before the
            # check above, so no wake-up is lost.
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)
