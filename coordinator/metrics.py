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
* RPC latency and errors per method (coordinator.server.rpc_metrics);
* long-lived calls (coordinator.server.streams): open now, refused by which bound, and ended by
  the server for which reason (no per-principal labels: principals are unbounded).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import IntEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from coordinator.domain.states import FenceReason, Outcome

MAX_CODES_PER_QUEUE = 20
"""Distinct error codes coordinator_attempt_ends_total labels per queue (the rest: OTHER_CODE)."""
OTHER_CODE = "other"


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


class Metrics:
    """Every metric of a coordinator replica, on one registry.

    The store and the server take one (``Store.open(metrics=...)``; the server uses its
    store's), so a test can count on a fresh registry of its own instead of reading deltas of
    the process-wide one.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        """Create every metric on ``registry`` (a registry holds one set: names are unique)."""
        self.registry = registry
        # Error codes labelled per queue so far (count_attempt_end's bound).
        self._codes: dict[str, set[str]] = {}
        self._codes_lock = threading.Lock()
        self.fence_accepted = Counter(
            "coordinator_fence_accepted",
            "Operations an acceptance point accepted (answered from a txn whose compares held).",
            ["point"],
            registry=registry,
        )
        self.fence_validated = Counter(
            "coordinator_fence_validated",
            "Accepted operations whose txn compared both the scheduler epoch and the claim "
            "generation.",
            ["point"],
            registry=registry,
        )
        self.claims = Counter(
            "coordinator_claims",
            "Claim txns tried, by outcome; contention rate = ALREADY_CLAIMED / all.",
            ["outcome"],
            registry=registry,
        )
        self.renewals = Counter(
            "coordinator_renewals",
            "Renew calls answered, by outcome; renew failure rate = not OK / all.",
            ["outcome"],
            registry=registry,
        )
        self.renewals_screened = Counter(
            "coordinator_renewals_screened",
            "Renewals answered FENCED from the claimed index, with no etcd read (fences that "
            "name no live claim: a surge means made-up or long-dead fences).",
            registry=registry,
        )
        self.calls_refused = Counter(
            "coordinator_calls_refused",
            "Calls refused RESOURCE_EXHAUSTED before they ran, by the bound that refused them "
            "(principal_share: the caller held its share of the replica's threads; "
            "renew_rate: it renewed past its rate; replays, replays_principal: replays of the "
            "event log's past at once).",
            ["reason"],
            registry=registry,
        )
        self.fenced_commits = Counter(
            "coordinator_fenced_commits",
            "Commits refused FENCED, by the fence reason.",
            ["reason"],
            registry=registry,
        )
        self.wasted_compute = Counter(
            "coordinator_wasted_compute_seconds",
            "Seconds from an attempt's start to its expiry or its fenced commit (work thrown "
            "away).",
            registry=registry,
        )
        self.attempts_per_task = Histogram(
            "coordinator_attempts_per_task",
            "Attempts a task took, observed when final: at the canonical commit, cancel and dead "
            "letter.",
            buckets=(0, 1, 2, 3, 4, 5, 8, 13, 21),
            registry=registry,
        )
        self.ready_to_commit = Histogram(
            "coordinator_ready_to_commit_seconds",
            "Seconds from a task revision becoming READY to its canonical commit (retries "
            "included).",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
            registry=registry,
        )
        self.reclaim_latency = Histogram(
            "coordinator_reclaim_latency_seconds",
            "Seconds from this replica seeing etcd delete an expired claim key to the task being "
            "READY again (etcd's own expiry detection comes before and is not included).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.reconcile_escalations = Counter(
            "coordinator_effect_reconcile_escalations",
            "UNKNOWN effects whose owned reconciliation reached its deadline unresolved and moved "
            "the task to NEEDS_APPROVAL, by where it was noticed (sweeper, claim).",
            ["via"],
            registry=registry,
        )
        self.retries = Counter(
            "coordinator_retries",
            "Attempts that ended without a result and were followed by another, by queue and by how"
            " the attempt ended (expired, released, failed) and whether it waits out a backoff.",
            ["queue", "end", "delayed"],
            registry=registry,
        )
        self.attempt_ends = Counter(
            "coordinator_attempt_ends",
            "Attempts that ended, by queue, how (committed, failed, expired, released) and, for a "
            "failed one, the error code its holder reported (at most "
            f"{MAX_CODES_PER_QUEUE} codes per queue, later ones counted as 'other'): "
            "a queue whose attempts mostly fail with one code has a bad handler or downstream.",
            ["queue", "end", "code"],
            registry=registry,
        )
        self.backoff_wait = Histogram(
            "coordinator_retry_backoff_seconds",
            "Seconds a retried task waits before it is READY again (DELAYED by its backoff or a "
            "Fail's delay; 0 for a retry READY at once), by queue, observed with each retry.",
            ["queue"],
            buckets=(0, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600, 21600, 86400),
            registry=registry,
        )
        self.dead_lettered = Counter(
            "coordinator_tasks_dead_lettered",
            "Tasks moved to FAILED, by queue and reason (exhausted, non_retryable, timed_out).",
            ["queue", "reason"],
            registry=registry,
        )
        self.overdue = Counter(
            "coordinator_tasks_overdue",
            "WAITING tasks marked overdue (schedule_to_close passed while their upstreams were "
            "not DONE): still WAITING, not failed.",
            ["queue"],
            registry=registry,
        )
        self.promoted = Counter(
            "coordinator_tasks_promoted",
            "DELAYED tasks moved to READY by this replica's promoter when their time came.",
            registry=registry,
        )
        self.claim_waiters = Gauge(
            "coordinator_claim_waiters",
            "Long-poll ClaimNext calls waiting for a task on this replica now (max_claim_waiters).",
            registry=registry,
        )
        self.claims_undelivered = Counter(
            "coordinator_claims_undelivered",
            "Claims whose answer could not reach their caller (it cancelled, its deadline passed)"
            " and that were given back at once, by queue: READY again, the attempt not counted.",
            ["queue"],
            registry=registry,
        )
        self.claim_waiters_abandoned = Counter(
            "coordinator_claim_waiters_abandoned",
            "Long-poll ClaimNext calls whose caller left (cancelled, deadline passed) while they "
            "waited: each left the line and freed its place the moment its call ended.",
            registry=registry,
        )
        self.streams_open = Gauge(
            "coordinator_streams_open",
            "Long-lived calls (streams, long polls) open on this replica now, each holding a "
            "thread.",
            registry=registry,
        )
        self.streams_refused = Counter(
            "coordinator_streams_refused",
            "Long-lived calls refused RESOURCE_EXHAUSTED, by the bound that refused them "
            "(server_full: max_streams; principal_full: past the max_streams_per_principal "
            "share with only the replica's reserve left; claim_waiters_full: "
            "max_claim_waiters).",
            ["reason"],
            registry=registry,
        )
        self.streams_ended = Counter(
            "coordinator_streams_ended",
            "Long-lived calls the server ended, by reason (max_age, unauthenticated, "
            "permission_denied, behind: a follower's buffer stayed full; cancelled: of those, "
            "the ones cut because the handler did not end in time).",
            ["reason"],
            registry=registry,
        )
        self.pruned_tasks = Counter(
            "coordinator_pruned_tasks",
            "Terminal tasks this replica removed from etcd after archiving them (a tombstone "
            "stays).",
            registry=registry,
        )
        self.archived_tasks = Counter(
            "coordinator_archived_tasks",
            "Task histories this replica wrote to the archive sink and the sink confirmed (a task "
            "may be archived twice: after a crash, or by two replicas racing; it is pruned once).",
            registry=registry,
        )
        self.archive_failures = Counter(
            "coordinator_archive_failures",
            "Archive writes the sink did not confirm; the tasks of that batch were not pruned.",
            registry=registry,
        )
        self.prune_deferred = Counter(
            "coordinator_prune_deferred",
            "Due tasks whose prune was put off, by reason (uncertain_effect, open_reconciliation, "
            "waiting_dependent).",
            ["reason"],
            registry=registry,
        )
        self.tombstones_expired = Counter(
            "coordinator_tombstones_expired",
            "Tombstones of pruned tasks removed after tombstone_retention (their ids may be "
            "reused).",
            registry=registry,
        )
        self.swept_records = Counter(
            "coordinator_ended_attempt_records_swept",
            "Staged results and finished job records of ended attempts of live tasks that this "
            "replica archived and removed after ended_attempt_retention.",
            registry=registry,
        )
        self.oldest_terminal_age = Gauge(
            "coordinator_oldest_terminal_task_age_seconds",
            "Seconds since the task first due for pruning became terminal (the oldest terminal task"
            " still in etcd when one retention applies); a figure far above the retention means the"
            " pruner is behind or blocked. 0 when no terminal task waits.",
            registry=registry,
        )
        self.etcd_db_size = Gauge(
            "coordinator_etcd_db_size_bytes",
            "etcd's database size as its Status RPC reports it (dbSize: what the quota counts).",
            registry=registry,
        )
        self.etcd_quota_ratio = Gauge(
            "coordinator_etcd_quota_ratio",
            "etcd database size over etcd_quota_bytes; at 1.0 etcd refuses every write (NOSPACE).",
            registry=registry,
        )
        self.space_state = Gauge(
            "coordinator_space_guard_state",
            "The space guard's state: 0 clear, 1 above the high-water mark (writes that only "
            "add data refused), 2 etcd's NOSPACE alarm active (every put refused).",
            registry=registry,
        )
        self.space_refusals = Counter(
            "coordinator_space_refusals_total",
            "Writes the space guard refused before sending them to etcd, by state "
            "(high_water, nospace).",
            ["state"],
            registry=registry,
        )
        self.write_budget_refusals = Counter(
            "coordinator_write_budget_refusals_total",
            "Writes refused (a call) or not kept (a checkpoint) because their caller's write "
            "budget was spent, by what (input, staged_result, checkpoint).",
            ["what"],
            registry=registry,
        )
        self.rpc_duration = Histogram(
            "coordinator_rpc_duration_seconds",
            "Seconds a unary RPC took in the server (after authentication), by method.",
            ["method"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.rpc_errors = Counter(
            "coordinator_rpc_errors",
            "RPCs that ended with a non-OK gRPC status, by method and status code.",
            ["method", "code"],
            registry=registry,
        )
        self.keyspace_read_errors = Counter(
            "coordinator_keyspace_read_errors",
            "Scrapes whose etcd read for the keyspace gauges failed (the gauges were left out).",
            registry=registry,
        )

    def count_retry(self, queue: str, end: str, *, wait: float) -> None:
        """Count one attempt end followed by another attempt, READY after ``wait`` seconds
        (0: at once), and observe the wait."""
        self.retries.labels(queue=queue, end=end, delayed=str(wait > 0).lower()).inc()
        self.backoff_wait.labels(queue=queue).observe(max(wait, 0.0))

    def count_undelivered(self, queue: str) -> None:
        """Count one claim given back because its answer could not be delivered."""
        self.claims_undelivered.labels(queue=queue).inc()

    def count_overdue(self, queue: str) -> None:
        """Count one WAITING task marked overdue (its schedule_to_close passed)."""
        self.overdue.labels(queue=queue).inc()

    def count_attempt_end(self, queue: str, end: str, code: str = "") -> None:
        """Count one attempt end; ``code`` (a failed attempt's error code) is folded into
        "other" once its queue has MAX_CODES_PER_QUEUE others: codes come from workers, and
        each one kept is a series for as long as the replica runs."""
        if code:
            with self._codes_lock:
                seen = self._codes.setdefault(queue, set())
                if code not in seen:
                    if len(seen) >= MAX_CODES_PER_QUEUE:
                        code = OTHER_CODE
                    else:
                        seen.add(code)
        self.attempt_ends.labels(queue=queue, end=end, code=code).inc()

    def count_dead_letter(self, queue: str, reason: str) -> None:
        """Count one task moved to FAILED."""
        self.dead_lettered.labels(queue=queue, reason=reason).inc()

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
