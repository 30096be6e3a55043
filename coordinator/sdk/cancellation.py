"""The cancellation signal a WorkerPool hands each handler, next to its Claim.

A handler is told to stop in two cases, and only then: its claim was lost (a renewal refused,
the lease ran out: no commit can land any more), or the pool is shutting down and the handler
outlived the grace period (the pool then gives its claim back itself). Python cannot stop a
thread from outside, so the handler has to look: ``is_cancelled()`` between steps, or
``wait_for_cancelled(timeout)`` instead of a sleep, as a Temporal activity does.

``is_shutting_down()`` turns true earlier, at the SIGTERM: the handler still has until the
grace runs out to finish, and may use the warning to take a shorter path.
"""

from __future__ import annotations

import enum
import threading

from coordinator.sdk._duration import Duration, timeout_seconds
from coordinator.sdk._flag import Flag


class CancelReason(enum.Enum):
    """Why a handler was cancelled."""

    LOST = "lost"
    """The claim lost its claim: whatever the handler commits now is refused."""
    SHUTDOWN = "shutdown"
    """The pool's grace period ran out: the pool gave the claim back."""


class Cancellation:
    """Set once, by the pool; read and waited on by the handler. Never blocks the pool."""

    def __init__(self, shutting_down: Flag) -> None:
        self._shutting_down = shutting_down
        self._flag = Flag()
        self._lock = threading.Lock()
        self._reason: CancelReason | None = None
        self._detail = ""

    @property
    def reason(self) -> CancelReason | None:
        """Why the handler was cancelled, or None while it was not."""
        with self._lock:
            return self._reason

    @property
    def detail(self) -> str:
        """What cancelled it, in words (the loss reason, or the grace that ran out)."""
        with self._lock:
            return self._detail

    def is_cancelled(self) -> bool:
        """Whether the handler should stop now. Never blocks."""
        return self._flag.is_set()

    def wait_for_cancelled(self, timeout: Duration | None = None) -> bool:
        """Block until cancelled or ``timeout`` passes; returns ``is_cancelled()``."""
        return self._flag.wait(timeout_seconds(timeout))

    def is_shutting_down(self) -> bool:
        """Whether the pool stopped claiming (SIGTERM): finish within the grace period."""
        return self._shutting_down.is_set()

    def cancel(self, reason: CancelReason, detail: str) -> None:
        """Cancel the handler (the pool calls this); the first reason is kept."""
        with self._lock:
            if self._reason is not None:
                return
            self._reason, self._detail = reason, detail
        self._flag.set()

    def __repr__(self) -> str:
        reason = self.reason
        return f"Cancellation({reason.value if reason else 'running'})"
