"""History trimming: above the high-water mark the coordinator compacts etcd's history itself.

etcd keeps every overwritten value until it is compacted (the bundled etcd's periodic
compaction keeps an hour), so a busy pool fills a small quota with history alone: a pool
running 22 create/claim/commit cycles a second and one worker token at its write budget grew a
256 MiB etcd 0.75 MiB/s with an hour's retention, past the high-water mark in under five
minutes, whatever the space guard refused. Above the mark (and at NOSPACE) every replica asks
etcd to compact the history older than ``keep`` seconds, at most every ``every`` seconds: the
old values become free pages that new writes reuse, so the db stops growing without an
operator (the file shrinks only by a defragmentation, still the operator's; docs/retention.md).

Nothing the coordinator decides reads old revisions: fences compare current revisions, and a
watch whose history was compacted is reloaded by its owner (store/etcd/watch.py). The
revisions come from the db-size watch's readings (etcd's Status), kept for ``keep`` seconds.
An etcd that keeps compaction to its root user refuses: the trim warns once and stops trying.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import structlog

from coordinator.domain.space import SpaceState, compaction_target
from coordinator.errors import StoreRefused
from coordinator.metrics import METRICS, Metrics
from coordinator.store.etcd.kv import EtcdKV

log = structlog.get_logger(__name__)

DEFAULT_KEEP = 300.0
"""Seconds of history kept when the coordinator compacts (the bundled etcd keeps an hour)."""


class HistoryTrim:
    """Compacts etcd's history older than ``keep`` seconds while etcd is above high water."""

    def __init__(
        self,
        kv: EtcdKV,
        *,
        keep: float = DEFAULT_KEEP,
        every: float | None = None,
        metrics: Metrics = METRICS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kv = kv
        self._keep = keep
        self._every = every if every is not None else keep / 10
        self._metrics = metrics
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()
        self._compacted = 0
        self._last: float | None = None
        self._refused = False

    def observe(self, revision: int, state: SpaceState) -> int | None:
        """Take one reading (etcd's revision now, the guard's state); compacts when it is
        due. Returns the revision compacted to, or None."""
        now = self._clock()
        self._samples.append((now, revision))
        while len(self._samples) > 1 and now - self._samples[1][0] >= self._keep:
            self._samples.popleft()  # the newest reading old enough is all a target needs
        if state is SpaceState.CLEAR or self._refused or self._keep <= 0:
            return None
        if self._last is not None and now - self._last < self._every:
            return None
        target = compaction_target(
            self._samples, now=now, keep=self._keep, compacted=self._compacted
        )
        if target is None:
            return None
        self._last = now
        try:
            done = self._kv.compact(target)
        except StoreRefused as exc:
            self._refused = True
            log.warning(
                "etcd refuses to compact for this user; above high water only an operator's "
                "compaction frees space",
                error=str(exc),
            )
            return None
        self._compacted = target
        if not done:  # another replica (or etcd's own compactor) was there first
            return None
        self._metrics.etcd_compactions.inc()
        log.info("compacted etcd history above high water", revision=target, keep_s=self._keep)
        return target
