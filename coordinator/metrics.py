"""Prometheus metrics of a coordinator replica: ``Metrics``, every metric on one registry.

A replica counts on ``METRICS`` (on ``REGISTRY``, the process-wide registry that
coordinator.server.metrics_http serves) unless its store was opened with other ``Metrics``: a
test passes a fresh registry's, so it reads what it did rather than a delta of the process's
counts. Counts are per replica process, since it started.

Fence-check coverage: for every acceptance point, the operations it
accepted and, of those, the ones whose accepting etcd txn compared both the scheduler epoch and
the claim generation. The second number is derived from the compares actually sent to etcd
(``coordinator.store.coverage``), not counted beside the first, so a point that skips its fence
shows up as coverage below 1.0. A fenced count of zero is not health if the checks never ran.

The seed's other figures (README "Metrics" lists each with the question it answers):

* claim contention rate: ``coordinator_claims_total{outcome="ALREADY_CLAIMED"}`` over all of
  ``coordinator_claims_total`` (one count per claim txn tried, so ClaimNext's retries on a stale
  hint count too: each is a race lost);
* renew failure rate: ``coordinator_renewals_total`` with ``outcome!="OK"`` over all of it;
* fenced commits by reason, attempts per task (observed when the count is final: at the canonical
  commit and at cancel), wasted compute seconds of fenced attempts, READY -> canonical commit
  latency, reclaim latency; these are counted by the store where the thing happens;
* the keyspace gauges (active leases, UNKNOWN/PREPARED effect backlog) are read from etcd on
  scrape (coordinator.server.metrics_http), so they are the same on every replica: aggregate
  them with ``max``, not ``sum``;
* attempt ends by queue, end and (failed) error code, for "most attempts of this queue fail
  with the same code" (the chart's CoordinatorQueueFailing alert);
* RPC latency and errors per method (coordinator.server.interceptors.rpc_metrics);
* long-lived calls (coordinator.server.streams): open now, refused by which bound, and ended by
  the server for which reason (no per-principal labels: principals are unbounded).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import IntEnum

from prometheus_client import CollectorRegistry

from coordinator.domain.states import FenceReason, Outcome
from coordinator.metric_families import (
    MAX_CODES_PER_QUEUE,
    MAX_LABELLED_QUEUES,
    OTHER_CODE,
    OTHER_QUEUE,
    MetricFamilies,
)


class AcceptancePoint(IntEnum):
    """Where a credential is checked; the values equal the wire's AcceptancePoint."""

    CLAIM = 1
    RENEW = 2
    AUTHORIZE = 3
    PREPARE = 4
    RECORD = 5
    COMMIT = 6
    RELEASE = 7
    START_JOB = 8
    FAIL = 9

    @property
    def label(self) -> str:
        """The metric label value (lower case)."""
        return self.name.lower()


@dataclass(frozen=True)
class PointCoverage:
    """Accepted and validated counts of one acceptance point in this process."""

    point: AcceptancePoint
    accepted: int
    validated: int

    @property
    def coverage(self) -> float:
        """validated / accepted; 1.0 while nothing was accepted."""
        return self.validated / self.accepted if self.accepted else 1.0


class Metrics(MetricFamilies):
    """Every metric of a coordinator replica, on one registry, and the ways to count on them.

    The store and the server take one (``Store.open(metrics=...)``; the server uses its
    store's), so a test can count on a fresh registry of its own instead of reading deltas of
    the process-wide one. The metrics themselves are created by coordinator.metric_families.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        """Create every metric on ``registry`` (a registry holds one set: names are unique)."""
        # Error codes labelled per queue so far (count_attempt_end's bound), and the queues
        # labelled so far (_queue's).
        self._codes: dict[str, set[str]] = {}
        self._queues: set[str] = set()
        self._labels_lock = threading.Lock()
        super().__init__(registry)

    def _queue(self, queue: str) -> str:
        """``queue`` as a counter's label: OTHER_QUEUE once MAX_LABELLED_QUEUES others were
        labelled (each queue kept is a few series for as long as the replica runs)."""
        with self._labels_lock:
            if queue in self._queues:
                return queue
            if len(self._queues) >= MAX_LABELLED_QUEUES:
                return OTHER_QUEUE
            self._queues.add(queue)
            return queue

    def count_retry(self, queue: str, end: str, *, wait: float) -> None:
        """Count one attempt end followed by another attempt, READY after ``wait`` seconds
        (0: at once), and observe the wait."""
        queue = self._queue(queue)
        self.retries.labels(queue=queue, end=end, delayed=str(wait > 0).lower()).inc()
        self.backoff_wait.labels(queue=queue).observe(max(wait, 0.0))

    def count_undelivered(self, queue: str) -> None:
        """Count one claim given back because its answer could not be delivered."""
        self.claims_undelivered.labels(queue=self._queue(queue)).inc()

    def count_overdue(self, queue: str) -> None:
        """Count one WAITING task marked overdue (its schedule_to_close passed)."""
        self.overdue.labels(queue=self._queue(queue)).inc()

    def count_attempt_end(self, queue: str, end: str, code: str = "") -> None:
        """Count one attempt end; ``code`` (a failed attempt's error code) is folded into
        "other" once its queue has MAX_CODES_PER_QUEUE others: codes come from workers, and
        each one kept is a series for as long as the replica runs."""
        queue = self._queue(queue)
        if code:
            with self._labels_lock:
                seen = self._codes.setdefault(queue, set())
                if code not in seen:
                    if len(seen) >= MAX_CODES_PER_QUEUE:
                        code = OTHER_CODE
                    else:
                        seen.add(code)
        self.attempt_ends.labels(queue=queue, end=end, code=code).inc()

    def count_dead_letter(self, queue: str, reason: str) -> None:
        """Count one task moved to FAILED."""
        self.dead_lettered.labels(queue=self._queue(queue), reason=reason).inc()

    def count_stream_refused(self, reason: str) -> None:
        """Count one long-lived call refused by a bound."""
        self.streams_refused.labels(reason=reason).inc()

    def count_stream_ended(self, reason: str) -> None:
        """Count one long-lived call ended by the server."""
        self.streams_ended.labels(reason=reason).inc()

    def count_reconcile_escalations(self, via: str, effects: int) -> None:
        """Count effects escalated to NEEDS_APPROVAL at their reconcile deadline."""
        self.reconcile_escalations.labels(via=via).inc(effects)

    def count_claim(self, outcome: Outcome) -> None:
        """Count one claim txn tried (or refused before it) with its outcome."""
        self.claims.labels(outcome=outcome.name).inc()

    def count_renewal(self, outcome: Outcome, count: int) -> None:
        """Count ``count`` renewals answered ``outcome``."""
        self.renewals.labels(outcome=outcome.name).inc(count)

    def count_screened_renewals(self, count: int) -> None:
        """Count ``count`` renewals refused from the claimed index without a read."""
        self.renewals_screened.inc(count)

    def count_call_refused(self, reason: str) -> None:
        """Count one call refused RESOURCE_EXHAUSTED by a bound before it ran."""
        self.calls_refused.labels(reason=reason).inc()

    def count_fenced_commit(self, reason: FenceReason, *, wasted_seconds: float) -> None:
        """Count a commit refused FENCED and the compute its attempt threw away."""
        self.fenced_commits.labels(reason=reason.name).inc()
        self.count_wasted(wasted_seconds)

    def count_wasted(self, seconds: float) -> None:
        """Add compute thrown away by a fenced or expired attempt (never negative: clocks step)."""
        self.wasted_compute.inc(max(0.0, seconds))

    def observe_attempts(self, attempts: int) -> None:
        """A task's attempt count is final (committed or cancelled)."""
        self.attempts_per_task.observe(attempts)

    def observe_ready_to_commit(self, seconds: float) -> None:
        """A canonical commit, ``seconds`` after its task revision became READY."""
        self.ready_to_commit.observe(max(0.0, seconds))

    def observe_reclaim(self, seconds: float) -> None:
        """A reclaim txn succeeded ``seconds`` after the claim key's deletion was seen."""
        self.reclaim_latency.observe(max(0.0, seconds))

    def count_acceptance(self, point: AcceptancePoint, *, validated: bool) -> None:
        """Count one accepted operation at ``point`` (and whether its fence was validated)."""
        self.count_acceptances(point, accepted=1, validated=int(validated))

    def count_acceptances(self, point: AcceptancePoint, *, accepted: int, validated: int) -> None:
        """Count ``accepted`` operations at ``point``, ``validated`` of them fence-checked (a
        batch's, counted once)."""
        if accepted:
            self.fence_accepted.labels(point=point.label).inc(accepted)
        if validated:
            self.fence_validated.labels(point=point.label).inc(validated)

    def fence_coverage(self) -> list[PointCoverage]:
        """Coverage of every acceptance point, in point order."""
        return [
            PointCoverage(
                point,
                self._sample("coordinator_fence_accepted_total", point),
                self._sample("coordinator_fence_validated_total", point),
            )
            for point in AcceptancePoint
        ]

    def _sample(self, name: str, point: AcceptancePoint) -> int:
        return int(self.registry.get_sample_value(name, {"point": point.label}) or 0)


REGISTRY = CollectorRegistry(auto_describe=True)
"""The process-wide registry a replica serves (not in prometheus_client's global registry)."""

METRICS = Metrics(REGISTRY)
"""The metrics on ``REGISTRY``: what a store uses unless given others."""
