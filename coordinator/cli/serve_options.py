"""The options of ``coordinator serve``, one list per concern, in the order --help shows them.

Every setting of coordinator.config is an option here (tests/ops/test_config.py checks that);
``up`` and ``doctor`` take the shared ones from cli/options.py.
"""

from __future__ import annotations

from collections.abc import Callable

import click

from coordinator.cli.options import (
    DEFAULTS,
    F,
    apply,
    etcd_security_options,
    file_option,
    limit_options,
    option,
    seconds_option,
)

_LISTEN_OPTIONS: list[Callable[[F], F]] = [
    option(
        "etcd",
        default=",".join(DEFAULTS.etcd),
        metavar="HOST:PORT[,HOST:PORT...]",
        help="etcd client endpoints; the client fails over between them (a TOML list in a "
        "config file).",
    ),
    option("listen", default=DEFAULTS.listen, metavar="ADDR", help="gRPC listen address."),
    option(
        "metrics-listen",
        default=DEFAULTS.metrics_listen,
        metavar="ADDR",
        help="Prometheus metrics listen address (its own port).",
    ),
    option(
        "metrics-tls",
        is_flag=True,
        default=False,
        help="Serve the metrics port over TLS with --tls-cert/--tls-key.",
    ),
    seconds_option(
        "metrics-read-timeout",
        DEFAULTS.metrics_read_timeout,
        "A metrics connection must send its request within this, or it is closed.",
    ),
    option(
        "metrics-max-connections",
        type=click.IntRange(min=1),
        default=DEFAULTS.metrics_max_connections,
        metavar="N",
        help="Open metrics connections at once (the oldest silent one is closed past it).",
    ),
    option(
        "health-listen",
        default=None,
        metavar="ADDR",
        help="With --tls-cert: a plaintext port serving only gRPC health, for probes that "
        "speak no TLS (the kubelet's).",
    ),
    option("prefix", default=DEFAULTS.prefix, help="etcd key prefix of this keyspace."),
]
"""etcd, the listen addresses (gRPC, metrics, health) and the keyspace."""

_CALL_OPTIONS: list[Callable[[F], F]] = [
    option(
        "max-workers",
        type=click.IntRange(min=1),
        default=DEFAULTS.max_workers,
        metavar="N",
        help="gRPC handler threads kept for unary calls (streams get --max-streams more).",
    ),
    option(
        "max-calls-per-principal",
        type=click.IntRange(min=1),
        default=DEFAULTS.max_calls_per_principal,
        metavar="N",
        help="Unary calls one principal may run at once (of --max-workers); past it, "
        "RESOURCE_EXHAUSTED.",
    ),
    option(
        "renew-rate-per-principal",
        type=click.FloatRange(min=0, min_open=True),
        default=DEFAULTS.renew_rate_per_principal,
        metavar="N",
        help="Claims one principal may renew a second on this replica; past it, "
        "RESOURCE_EXHAUSTED.",
    ),
    option(
        "max-streams",
        type=click.IntRange(min=1),
        default=DEFAULTS.max_streams,
        metavar="N",
        help="Long-lived calls (WatchEvents, other streams, waiting ClaimNext) open at once, "
        "each on a parked thread of its own; past it, RESOURCE_EXHAUSTED.",
    ),
    option(
        "max-streams-per-principal",
        type=click.IntRange(min=1),
        default=DEFAULTS.max_streams_per_principal,
        metavar="N",
        help="Long-lived calls a principal is always let hold; past it, it borrows idle "
        "slots but never the replica's last quarter (then RESOURCE_EXHAUSTED).",
    ),
    option(
        "max-replays",
        type=click.IntRange(min=1),
        default=DEFAULTS.max_replays,
        metavar="N",
        help="Replays of the event log's past running at once; past it, RESOURCE_EXHAUSTED.",
    ),
    option(
        "max-replays-per-principal",
        type=click.IntRange(min=1),
        default=DEFAULTS.max_replays_per_principal,
        metavar="N",
        help="Replays of the event log's past one principal may run at once; past it, "
        "RESOURCE_EXHAUSTED.",
    ),
    seconds_option(
        "max-stream-age",
        DEFAULTS.max_stream_age,
        "A stream older than this is ended UNAVAILABLE; its caller resumes where it was.",
    ),
    option(
        "max-claim-wait",
        type=click.FloatRange(min=0, max=20, min_open=True),
        default=DEFAULTS.max_claim_wait,
        metavar="SECONDS",
        help="The longest a long-poll ClaimNext may wait for a task (at most 20).",
    ),
    option(
        "max-claim-waiters",
        type=click.IntRange(min=1),
        default=DEFAULTS.max_claim_waiters,
        metavar="N",
        help="Long-poll ClaimNext calls waiting on the replica at once; past it, "
        "RESOURCE_EXHAUSTED.",
    ),
    seconds_option(
        "shutdown-grace",
        DEFAULTS.shutdown_grace,
        "On SIGTERM, in-flight calls get this long to finish (a second signal: none).",
        zero=True,
    ),
]
"""The bounds of calls: handler threads, per-principal shares, streams, long polls."""

_TIMING_OPTIONS: list[Callable[[F], F]] = [
    seconds_option("etcd-timeout", DEFAULTS.etcd_timeout, "Timeout of each etcd request."),
    seconds_option("health-interval", DEFAULTS.health_interval, "How often health re-checks etcd."),
    seconds_option(
        "reclaim-scan-interval",
        DEFAULTS.reclaim_scan_interval,
        "Period of the reclaimer's full scan for expired claims.",
    ),
    seconds_option(
        "idempotency-ttl",
        DEFAULTS.idempotency_ttl,
        "How long responses of requests with an idempotency key are kept (those that hand "
        "out claims: at most --max-ttl).",
    ),
    seconds_option(
        "reconcile-timeout",
        DEFAULTS.reconcile_timeout,
        "An UNKNOWN effect's owned reconciliation escalates to NEEDS_APPROVAL after this.",
    ),
]
"""Timeouts and the periods of background checks."""

_RETENTION_OPTIONS: list[Callable[[F], F]] = [
    option(
        "retention",
        default="7d",
        metavar="DURATION",
        help="How long a DONE, CANCELLED or FAILED task stays in etcd before it is archived "
        "and removed (seconds, or 90s/15m/1h/7d/2w; 0: forever, which fills etcd).",
    ),
    option(
        "retention-per-queue",
        default="",
        metavar="QUEUE=DURATION[,...]",
        help="Per-queue retention overriding --retention (a TOML table in a config file).",
    ),
    option(
        "tombstone-retention",
        default="1d",
        metavar="DURATION",
        help="How long a pruned task's tombstone stays: its id is refused meanwhile, and "
        "GetTask names the archive.",
    ),
    option(
        "ended-attempt-retention",
        default="7d",
        metavar="DURATION",
        help="How long the staged result and finished job records of an attempt that ended "
        "while its task stays live are kept before they are archived and removed (0: until "
        "the task is pruned).",
    ),
    option(
        "archive",
        default=DEFAULTS.archive,
        metavar="DIR|s3://BUCKET/PREFIX",
        help="Where a task's history is written before it is pruned: a directory of gzip "
        "JSON Lines files, or S3 (pip install 'coordinator[s3]'; ?endpoint_url=&region=).",
    ),
    seconds_option("prune-interval", DEFAULTS.prune_interval, "Seconds between pruner passes."),
    option(
        "prune-rate",
        type=click.FloatRange(min=0, min_open=True),
        default=DEFAULTS.prune_rate,
        metavar="TASKS/S",
        help="etcd requests per second the pruner makes per replica, at most (reads and "
        "txns alike; about one per pruned task).",
    ),
]
"""How long ended tasks stay, where their history goes, the pruner's pace."""

_SPACE_OPTIONS: list[Callable[[F], F]] = [
    option(
        "etcd-quota-bytes",
        type=click.IntRange(min=1),
        default=DEFAULTS.etcd_quota_bytes,
        metavar="BYTES",
        help="etcd's --quota-backend-bytes (past it etcd refuses every write).",
    ),
    option(
        "etcd-quota-warn-ratio",
        type=click.FloatRange(min=0, max=1, min_open=True),
        default=DEFAULTS.etcd_quota_warn_ratio,
        metavar="RATIO",
        help="Warn when etcd's db size passes this share of --etcd-quota-bytes.",
    ),
    option(
        "etcd-quota-high-water",
        type=click.FloatRange(min=0, max=1, min_open=True),
        default=DEFAULTS.etcd_quota_high_water,
        metavar="RATIO",
        help="Above this share of --etcd-quota-bytes refuse writes that only add data "
        "(creates, checkpoints, staging, idempotency keys) beyond each caller's "
        "--write-budget-high-water-share; commits and claims go on.",
    ),
    option(
        "etcd-quota-full",
        type=click.FloatRange(min=0, max=1, min_open=True),
        default=DEFAULTS.etcd_quota_full,
        metavar="RATIO",
        help="Above this share of --etcd-quota-bytes (at least --etcd-quota-high-water) "
        "refuse every write that only adds data, shares included.",
    ),
    *(
        option(
            f"write-budget-{role}",
            type=click.FloatRange(min=0),
            default=getattr(DEFAULTS, f"write_budget_{role}"),
            metavar="BYTES/S",
            help=f"Bytes per second a principal with the {role} role may add to etcd "
            f"({what}), over --write-budget-window; 0: no budget.",
        )
        for role, what in (
            ("worker", "staged results, checkpoints"),
            ("pm", "task inputs"),
            ("admin", "task inputs"),
        )
    ),
    seconds_option(
        "write-budget-window",
        DEFAULTS.write_budget_window,
        "The write budgets' rolling window: a full budget holds rate x window bytes.",
    ),
    option(
        "write-budget-high-water-share",
        type=click.FloatRange(min=0, max=1),
        default=DEFAULTS.write_budget_high_water_share,
        metavar="SHARE",
        help="The share of its write budget a principal may still add while etcd is above "
        "--etcd-quota-high-water (0: none).",
    ),
    seconds_option(
        "etcd-compact-keep",
        DEFAULTS.etcd_compact_keep,
        "Above --etcd-quota-high-water compact etcd's history older than this (0: never).",
        zero=True,
    ),
    seconds_option(
        "etcd-space-interval",
        DEFAULTS.etcd_space_interval,
        "Seconds between readings of etcd's db size and alarms (the space guard).",
    ),
]
"""etcd's quota, the space guard and the write budgets."""

_RETRY_OPTIONS: list[Callable[[F], F]] = [
    option(
        "reconcile-handoffs",
        type=click.IntRange(min=0),
        default=DEFAULTS.reconcile_handoffs,
        metavar="N",
        help="Claims that may take over a task whose holder left an open reconciliation.",
    ),
    option(
        "retry-max-attempts",
        type=click.IntRange(min=0),
        default=DEFAULTS.retry_max_attempts,
        metavar="N",
        help="Attempts a task gets unless it or its queue says otherwise (0: unlimited).",
    ),
    seconds_option(
        "retry-initial-backoff",
        DEFAULTS.retry_initial_backoff,
        "Wait before a task's first retry (0: at once); later waits multiply it.",
        zero=True,
    ),
    option(
        "retry-backoff-multiplier",
        type=click.FloatRange(min=1, max=100),
        default=DEFAULTS.retry_backoff_multiplier,
        metavar="X",
        help="Each retry waits this many times longer than the one before.",
    ),
    seconds_option(
        "retry-max-backoff",
        DEFAULTS.retry_max_backoff,
        "The longest wait before a retry.",
        zero=True,
    ),
    option(
        "retry-backoff-jitter",
        type=click.FloatRange(min=0, max=1),
        default=DEFAULTS.retry_backoff_jitter,
        metavar="FRACTION",
        help="Each retry's wait is lengthened by up to this fraction of itself, so tasks "
        "that failed together come back spread out.",
    ),
    option(
        "retry-non-retryable-errors",
        default=DEFAULTS.retry_non_retryable_errors,
        metavar="CODES",
        help="Comma-separated error codes (Fail) that are never retried.",
    ),
    option(
        "queue-retry-policies",
        default=DEFAULTS.queue_retry_policies,
        metavar="SPEC",
        help="Per-queue retry defaults: 'QUEUE:max_attempts=3,initial_backoff=2;Q2:...' "
        "(fields max_attempts, initial_backoff, backoff_multiplier, max_backoff, "
        "backoff_jitter, "
        "non_retryable_errors as codes separated by '|').",
    ),
    seconds_option(
        "promote-interval",
        DEFAULTS.promote_interval,
        "How often DELAYED tasks whose time came are made READY.",
    ),
]
"""Reconciliation handoffs, the retry policy and the promoter."""

_SECURITY_OPTIONS: list[Callable[[F], F]] = [
    file_option(
        "token-file",
        "JSON token file: sha256(token) -> principal, roles; certificate principal -> "
        "roles. Reloaded when it changes.",
    ),
    seconds_option(
        "token-reload-interval",
        DEFAULTS.token_reload_interval,
        "How often the token file is checked for changes.",
    ),
    file_option("tls-cert", "PEM server certificate of the gRPC port (with --tls-key)."),
    file_option("tls-key", "PEM private key of --tls-cert."),
    file_option(
        "tls-client-ca",
        "PEM CA for mutual TLS: clients must present a certificate it signed; the "
        "principal is the certificate's URI or DNS SAN (its CN only without any SAN).",
    ),
    option(
        "insecure",
        is_flag=True,
        default=False,
        help="No authentication: callers name their own principal and roles. Local use "
        "only; refused on a non-loopback --listen.",
    ),
    option(
        "insecure-allow-remote",
        is_flag=True,
        default=False,
        help="With --insecure, allow a non-loopback --listen (something else must "
        "authenticate callers).",
    ),
]
"""Authentication of callers and TLS of the gRPC port."""


def server_options(func: F) -> F:
    """Listen addresses, etcd, keyspace and runtime tuning."""
    return apply(
        func,
        [
            *_LISTEN_OPTIONS,
            limit_options,
            *_CALL_OPTIONS,
            *_TIMING_OPTIONS,
            *_RETENTION_OPTIONS,
            *_SPACE_OPTIONS,
            *_RETRY_OPTIONS,
        ],
    )


def security_options(func: F) -> F:
    """Authentication of callers, TLS, and the etcd connection's TLS and credentials."""
    return apply(func, [*_SECURITY_OPTIONS, etcd_security_options])
