"""A held claim's lease clock and what its renewals carry, under one lock: the keepalive (a
thread, or a task) writes it while the caller reads it.

The clock is the local monotonic one, started at the send of the last accepted call (claim or
renewal), so it errs early; the server's lease end is kept as wire (seconds, nanos) and made a
datetime only when someone reads it. The pending checkpoint is the latest one recorded and not
yet kept by a renewal: a renewal answered ``checkpoint_refused`` leaves it pending, so the next
renewal sends it again (only the latest one: a newer checkpoint replaces it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from coordinator.v1 import worker_pb2

REFUSAL_LOG_INTERVAL = 60.0
"""Seconds between two log lines about one claim's refused checkpoints (a spent write budget
refuses every renewal's checkpoint until it refills: one line says so, not one per renewal)."""


class Lease:
    """When a claim's lease ends by the local clock, and its renewals' progress and checkpoint."""

    def __init__(
        self, *, expires_at: float, server_end: tuple[int, int], clock: Callable[[], float]
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._expires_at = expires_at
        self._server_end = server_end
        self._progress = ""
        self._checkpoint: bytes | None = None  # None: nothing new to send
        self._renewals = 0
        self._refusals = 0
        self._refusal = ""
        self._refusal_logged_at: float | None = None

    def left(self) -> float:
        """Seconds left by the local clock (negative once it ran out)."""
        with self._lock:
            return self._expires_at - self._clock()

    @property
    def server_end(self) -> tuple[int, int]:
        """The lease end the server last reported, as wire (seconds, nanos)."""
        with self._lock:
            return self._server_end

    @property
    def renewals(self) -> int:
        """How many renewals the server accepted."""
        with self._lock:
            return self._renewals

    @property
    def refusals(self) -> tuple[int, str]:
        """How many accepted renewals did not keep their checkpoint, and the last one's text."""
        with self._lock:
            return self._refusals, self._refusal

    @property
    def checkpoint_pending(self) -> bool:
        """Whether a checkpoint is recorded that no renewal has kept yet."""
        with self._lock:
            return self._checkpoint is not None

    def record(self, *, progress: str | None = None, checkpoint: bytes | None = None) -> None:
        """Note the latest progress marker or checkpoint for the next renewal."""
        with self._lock:
            if progress is not None:
                self._progress = progress
            if checkpoint is not None:
                self._checkpoint = bytes(checkpoint)

    def payload(self) -> tuple[str, bytes | None]:
        """What the next renewal carries: the latest marker, and the pending checkpoint."""
        with self._lock:
            return self._progress, self._checkpoint

    def renewed(
        self, sent: float, response: worker_pb2.RenewResponse, sent_checkpoint: bytes | None
    ) -> bool:
        """Apply an accepted renewal sent at ``sent`` that carried ``sent_checkpoint``; whether
        its refused checkpoint is to be logged now (at most once per REFUSAL_LOG_INTERVAL)."""
        refused = response.checkpoint_refused
        with self._lock:
            self._expires_at = sent + max(response.ttl_seconds, 1)
            end = response.lease_expires_at
            self._server_end = (end.seconds, end.nanos)
            self._renewals += 1
            if not refused:
                if sent_checkpoint and self._checkpoint == sent_checkpoint:
                    self._checkpoint = None  # kept by the server; nothing newer since
                return False
            # Not kept: it stays pending for the next renewal.
            self._refusals += 1
            self._refusal = refused
            now = self._clock()
            last = self._refusal_logged_at
            if last is not None and now - last < REFUSAL_LOG_INTERVAL:
                return False
            self._refusal_logged_at = now
            return True
