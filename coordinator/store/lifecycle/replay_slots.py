"""Bounds on history replays: how many may read the event log's past at once on a replica.

A replay of the log's past (``EventLog.history``; a follow's catch-up from the start, or after
etcd compacted what its watch needed) reads the log in passes, each holding up to a pass's
positions in memory, and scans the log's keys once per pass. 32 whole-log replays from 4 worker
tokens took a replica from 69 to 421 MB (its limit is 512 Mi) and kept it busy for a minute
after the callers left (issue 25). So at most ``max_replays`` replays run at once on a replica,
and at most ``max_replays_per_principal`` of one principal; one past either is refused
RESOURCE_EXHAUSTED naming the setting before it reads anything (counted in
``coordinator_calls_refused_total{reason}``: ``replays``, ``replays_principal``). A replay
holds its slot until its last pass was read (or its stream ended), so the memory of all
replays on a replica is at most ``max_replays`` passes.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from coordinator.domain.stream_limits import Admission, StreamLimits, admission
from coordinator.errors import ResourceExhausted
from coordinator.metrics import Metrics

MAX_REPLAYS = 4
"""Replays at once on a replica (the setting's default)."""
MAX_REPLAYS_PER_PRINCIPAL = 2
"""Replays at once of one principal on a replica (the setting's default)."""


class ReplaySlots:
    """The replays running on this replica, per principal."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        max_replays: int = MAX_REPLAYS,
        max_per_principal: int = MAX_REPLAYS_PER_PRINCIPAL,
    ) -> None:
        # The same decision as the stream bounds: a total and a share per principal, here a
        # hard cap (a replay holds memory, so nobody borrows another's share).
        self._limits = StreamLimits(
            max_streams=max_replays, max_per_principal=max_per_principal, reserve=None
        )
        self._metrics = metrics
        self._lock = threading.Lock()
        self._running: Counter[str] = Counter()

    @contextmanager
    def hold(self, principal: str) -> Iterator[None]:
        """Run one replay of ``principal``, or raise ResourceExhausted naming the bound."""
        with self._lock:
            decision = admission(
                self._limits,
                open_total=sum(self._running.values()),
                open_of_principal=self._running[principal],
            )
            if decision is Admission.ADMITTED:
                self._running[principal] += 1
        if decision is not Admission.ADMITTED:
            self._refuse(decision, principal)
        try:
            yield
        finally:
            with self._lock:
                self._running[principal] -= 1
                if not self._running[principal]:
                    del self._running[principal]

    def running(self) -> int:
        """Replays running now."""
        with self._lock:
            return sum(self._running.values())

    def _refuse(self, decision: Admission, principal: str) -> None:
        limits = self._limits
        if decision is Admission.PRINCIPAL_FULL:
            self._metrics.count_call_refused("replays_principal")
            raise ResourceExhausted(
                f"principal {principal!r} already replays the event log "
                f"{limits.max_per_principal} times on this replica, the most one principal may "
                "(max_replays_per_principal); wait for one to end, or follow from a recent "
                "position instead of the whole log"
            )
        self._metrics.count_call_refused("replays")
        raise ResourceExhausted(
            f"this replica already runs {limits.max_streams} replays of the event log, its "
            "limit (max_replays); retry later or on another replica"
        )
