"""The metric families of a coordinator replica, created on one registry and grouped by area.

``MetricFamilies`` only creates them; coordinator.metrics.Metrics adds the methods the store and
the server count with, and the module docstring there says what each figure answers.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MAX_CODES_PER_QUEUE = 20
"""Distinct error codes coordinator_attempt_ends_total labels per queue (the rest: OTHER_CODE)."""
OTHER_CODE = "other"
MAX_LABELLED_QUEUES = 500
"""Distinct queues the queue-labelled counters name (the later ones: OTHER_QUEUE). Queues are
a producer's to make up: a token creating a task in a new queue each time once made 8,220
queues four series each (33,000 lines a scrape, 32 MiB of a replica's memory)."""
OTHER_QUEUE = "(other)"
"""The queue label of the queues past MAX_LABELLED_QUEUES (no queue is named so: queue names are
[A-Za-z0-9._-])."""


class MetricFamilies:
    """Every metric of a replica on one registry (a registry holds one set: names are unique)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        """Create every metric on ``registry``, area by area, in exposition order."""
        self.registry = registry
        self._fence_and_claims(registry)
        self._commits(registry)
        self._retries(registry)
        self._waits_and_streams(registry)
        self._retention(registry)
        self._space_and_calls(registry)

    def _fence_and_claims(self, registry: CollectorRegistry) -> None:
        """Fence-check coverage, claim and renewal outcomes, refused calls."""
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

    def _commits(self, registry: CollectorRegistry) -> None:
        """Fenced commits, wasted compute, attempts and the latencies around a commit."""
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

    def _retries(self, registry: CollectorRegistry) -> None:
        """Retries, attempt ends, backoff, dead letters, overdue and promoted tasks."""
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

    def _waits_and_streams(self, registry: CollectorRegistry) -> None:
        """Long-poll waiters and the long-lived calls."""
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

    def _retention(self, registry: CollectorRegistry) -> None:
        """The pruner, the archive, tombstones and sweeps."""
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

    def _space_and_calls(self, registry: CollectorRegistry) -> None:
        """etcd's space, the write budgets, RPC latency and errors."""
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
        self.etcd_compactions = Counter(
            "coordinator_etcd_compactions_total",
            "Compactions of etcd's history this replica made above the high-water mark.",
            registry=registry,
        )
        self.space_state = Gauge(
            "coordinator_space_guard_state",
            "The space guard's state: 0 clear, 1 above the high-water mark (writes that only "
            "add data refused beyond each caller's share; above the full mark all of them), "
            "2 etcd's NOSPACE alarm active (every put refused).",
            registry=registry,
        )
        self.space_refusals = Counter(
            "coordinator_space_refusals_total",
            "Writes the space guard refused before sending them to etcd, by state "
            "(high_water, full, nospace; retry: a claim of a task past its attempts allowed "
            "above the high-water mark).",
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
