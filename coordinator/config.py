"""Every setting of a coordinator replica, with defaults, validated in one place.

The CLI (``coordinator serve``, ``coordinator up``) fills a ``Config`` from flags,
``COORDINATOR_*`` environment variables and a TOML config file (``--config``), in that order of
precedence; an invalid value raises ConfigError naming the setting, before anything connects or
listens. Config file keys are the field names below (``max_ttl = 60``; the file is read by
coordinator.config_file); the rules of single values live in coordinator.config_values.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from coordinator.config_values import (
    build_retry_defaults,
    check_address,
    check_space,
    error_codes,
    parse_retention,
    require_positive,
    require_together,
)
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.retention import (
    DEFAULT_ENDED_ATTEMPT_RETENTION,
    DEFAULT_RETENTION,
    DEFAULT_TOMBSTONE_RETENTION,
    RetentionPolicy,
)
from coordinator.domain.retry import RetryDefaults, RetryPolicy
from coordinator.domain.roles import Role
from coordinator.domain.stream_limits import StreamLimits
from coordinator.domain.write_budget import DEFAULT_HIGH_WATER_SHARE, BudgetPolicy
from coordinator.errors import ConfigError
from coordinator.logging import LEVELS

DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_ETCD = ("127.0.0.1:2379",)
DEFAULT_PREFIX = "/coordinator"
DEFAULT_METRICS_LISTEN = "127.0.0.1:9090"
DEFAULT_ARCHIVE = "~/.local/state/coordinator/archive"
DEFAULT_ETCD_QUOTA = 2 << 30  # etcd's default --quota-backend-bytes

_PREFIX = re.compile(r"^(/[A-Za-z0-9._-]+)+$")


@dataclass(frozen=True)
class Config:
    """Settings of one replica. Durations are seconds; every field has a working default."""

    etcd: tuple[str, ...] = DEFAULT_ETCD
    """etcd client endpoints, ``host:port`` each; the client fails over between them."""
    listen: str = DEFAULT_LISTEN
    """gRPC listen address; port 0 picks a free port."""
    prefix: str = DEFAULT_PREFIX
    """The etcd key prefix of this coordinator's keyspace."""
    min_ttl: int = ClaimLimits.min_ttl
    """Smallest lease TTL a claim is granted (requests below are raised to it)."""
    max_ttl: int = ClaimLimits.max_ttl
    """Largest lease TTL a claim is granted (requests above are lowered to it)."""
    max_claim_duration: float = ClaimLimits.max_claim_duration
    """A claim cannot be renewed past claim start + this."""
    stall_timeout: float = ClaimLimits.stall_timeout
    """Renewal is refused when the progress marker has not moved for this long (0: never)."""
    reconcile_timeout: float = ClaimLimits.reconcile_timeout
    """An UNKNOWN effect's owned reconciliation escalates to NEEDS_APPROVAL after this long."""
    reconcile_handoffs: int = ClaimLimits.reconcile_handoffs
    """Claims that may take over a task whose holder left an open reconciliation (0: none)."""
    retry_max_attempts: int = RetryPolicy.max_attempts
    """Attempts a task gets unless it or its queue says otherwise (0: unlimited)."""
    retry_initial_backoff: float = RetryPolicy.initial_backoff
    """Seconds before the first retry of a task (0: at once); later ones multiply it. The
    default of 1 s (doubling) keeps a handler that always fails from dead-lettering a queue in
    seconds."""
    retry_backoff_multiplier: float = RetryPolicy.backoff_multiplier
    """Each retry waits this many times longer than the one before (1-100)."""
    retry_max_backoff: float = RetryPolicy.max_backoff
    """The longest wait before a retry, in seconds (before jitter)."""
    retry_backoff_jitter: float = RetryPolicy.backoff_jitter
    """0-1: each wait is lengthened by up to this fraction of itself (fixed per task and
    attempt), so tasks that failed together come back spread out."""
    retry_non_retryable_errors: str = ""
    """Comma-separated error codes (WorkerService.Fail) that are never retried."""
    queue_retry_policies: str = ""
    """Per-queue defaults: 'QUEUE:field=value,field=value;QUEUE2:...' with the fields
    max_attempts, initial_backoff, backoff_multiplier, max_backoff, backoff_jitter and
    non_retryable_errors (codes separated by '|'); unset fields take the retry_* settings."""
    promote_interval: float = 0.25
    """How often each replica moves DELAYED tasks whose time came to READY (seconds)."""
    log_level: str = "info"
    """One of debug, info, warning, error, critical."""
    max_workers: int = 32
    """gRPC handler threads kept for unary calls (streams have max_streams more of their own)."""
    max_calls_per_principal: int = 8
    """Unary calls one principal may run at once on a replica (of max_workers threads); past
    it, RESOURCE_EXHAUSTED, so one principal's flood leaves threads to the others."""
    renew_rate_per_principal: float = 2000.0
    """Claims one principal may renew a second on a replica (Renew and RenewMany items, bursts
    of twice that); past it, RESOURCE_EXHAUSTED with when to retry."""
    max_streams: int = 2048
    """Long-lived calls (WatchEvents, other streams and waiting ClaimNext) open at once; each
    holds a parked thread of its own (never one of max_workers)."""
    max_streams_per_principal: int = 8
    """Long-lived calls a principal is always let hold (its guaranteed share); past it, it
    borrows idle slots but never the replica's last quarter, kept for the others."""
    max_replays: int = 4
    """Replays of the event log's past (WatchEvents from the start, or without follow) running
    at once on a replica; each holds a few MB while it runs. Past it, RESOURCE_EXHAUSTED."""
    max_replays_per_principal: int = 2
    """Replays of the event log's past one principal may run at once on a replica."""
    max_stream_age: float = 600.0
    """Seconds after which a stream is ended UNAVAILABLE; its caller resumes where it was."""
    max_claim_wait: float = 20.0
    """The longest a long-poll ClaimNext may wait for a task (seconds, at most 20)."""
    max_claim_waiters: int = 2048
    """Long-poll ClaimNext calls that may wait on a replica at once (each a long-lived call of
    max_streams, holding a parked thread). As large as max_streams by default, so that the
    streams' fair share decides who waits: below it, one pool's polls could fill it and lock
    out principals within their share."""
    shutdown_grace: float = 10.0
    """On SIGTERM, in-flight calls get this long to finish before they are cancelled."""
    etcd_timeout: float = 5.0
    """Timeout of each etcd request; a slower etcd makes calls fail with UNAVAILABLE."""
    health_interval: float = 3.0
    """How often the health status is re-checked against etcd."""
    reclaim_scan_interval: float = 5.0
    """Period of the reclaimer's full scan of claims (the watch catches most expiries sooner)."""
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    """Prometheus metrics listen address (its own port, never the gRPC one)."""
    metrics_tls: bool = False
    """Serve the metrics port over TLS with tls_cert/tls_key (scrapers need no certificate)."""
    metrics_read_timeout: float = 10.0
    """A metrics connection must send its request (and finish TLS) within this many seconds."""
    metrics_max_connections: int = 64
    """Open metrics connections at once; past it the oldest one still silent is closed."""
    health_listen: str | None = None
    """With TLS: a plaintext port that serves only gRPC health (kubelet probes speak no TLS)."""
    idempotency_ttl: float = 24 * 3600.0
    """How long the stored response of a request with an idempotency key is kept (seconds);
    that of a call that hands out claims at most ``max_ttl`` (store/control/idempotency.py)."""
    # --- retention (see coordinator.store.retention.pruner) ---------------------------------------
    retention: float | str = DEFAULT_RETENTION
    """How long a DONE, CANCELLED or FAILED task stays in etcd before it is archived and
    removed: seconds or 90s / 15m / 1h / 7d / 2w. 0 keeps tasks forever (and fills etcd)."""
    retention_per_queue: Mapping[str, float] | str = field(
        default_factory=lambda: MappingProxyType({})
    )
    """Per-queue retention overriding ``retention`` (TOML table, or ``q=1h,r=0``)."""
    tombstone_retention: float | str = DEFAULT_TOMBSTONE_RETENTION
    """How long a pruned task's tombstone stays (its id is refused, GetTask names the archive)."""
    ended_attempt_retention: float | str = DEFAULT_ENDED_ATTEMPT_RETENTION
    """How long the staged result and finished job records of an attempt that ended while its
    task stays live are kept before they are archived and removed (0: until the task is)."""
    archive: str = DEFAULT_ARCHIVE
    """Where histories go before pruning: a directory (gzip JSON Lines) or s3://bucket/prefix."""
    prune_interval: float = 10.0
    """Seconds between two passes of the pruner."""
    prune_rate: float = 500.0
    """etcd requests per second one replica's pruner makes, at most: reads, prunes, deferrals
    and tombstone expiry alike (about one per pruned task; it must not compete with claims)."""
    etcd_quota_bytes: int = DEFAULT_ETCD_QUOTA
    """etcd's --quota-backend-bytes: past it etcd refuses every write (NOSPACE)."""
    etcd_quota_warn_ratio: float = 0.8
    """Warn (log and coordinator_etcd_quota_ratio) when etcd's db passes this share of it."""
    etcd_quota_high_water: float = 0.8
    """Above this share of the quota the space guard refuses writes that only add data
    (creates, input changes, checkpoints, staged results, idempotency keys) so the pool drains,
    except those within their caller's write_budget_high_water_share."""
    etcd_quota_full: float = 0.9
    """Above this share of the quota (at least etcd_quota_high_water) no write that only adds
    data goes, shares included: the room left is the pool's to drain."""
    etcd_compact_keep: float = 300.0
    """Above etcd_quota_high_water the coordinator compacts etcd's history older than this
    many seconds (0: never; etcd's own compaction still runs)."""
    etcd_space_interval: float = 5.0
    """Seconds between two readings of etcd's db size and alarms (the space guard's state)."""
    write_budget_worker: float = 256 * 1024
    """Bytes per second a principal with the worker role may add (staged results,
    checkpoints), over a rolling write_budget_window; 0: no budget."""
    write_budget_pm: float = 1024 * 1024
    """Bytes per second a principal with the pm role may add (task inputs); 0: no budget."""
    write_budget_admin: float = 0.0
    """Bytes per second a principal with the admin role may add; 0 (the default): no budget."""
    write_budget_window: float = 60.0
    """The rolling window of the write budgets: a full budget holds rate x window bytes."""
    write_budget_high_water_share: float = DEFAULT_HIGH_WATER_SHARE
    """The share of its write budget a principal may still add above etcd_quota_high_water
    (0: none; principals without a budget have none)."""
    # --- authentication (see coordinator.server.interceptors.auth) -------------------------
    token_file: str | None = None
    """JSON token file: token hashes -> principal, roles; certificate principals -> roles."""
    token_reload_interval: float = 5.0
    """How often the token file is checked for changes (it is reloaded without a restart)."""
    tls_cert: str | None = None
    """PEM server certificate for the gRPC port (with tls_key); plaintext without it."""
    tls_key: str | None = None
    """PEM private key of tls_cert."""
    tls_client_ca: str | None = None
    """PEM CA for mutual TLS: clients must present a certificate it signed."""
    insecure: bool = False
    """No authentication: callers name their principal and roles in metadata (local use)."""
    insecure_allow_remote: bool = False
    """Allow insecure mode on a listen address other than loopback."""
    # --- the etcd connection -----------------------------------------------------------------
    etcd_ca_cert: str | None = None
    """PEM CA that signed etcd's server certificates (enables TLS to etcd)."""
    etcd_cert: str | None = None
    """PEM client certificate for etcd (with etcd_key and etcd_ca_cert)."""
    etcd_key: str | None = None
    """PEM private key of etcd_cert."""
    etcd_user: str | None = None
    """etcd user name (etcd auth; with etcd_password)."""
    etcd_password: str | None = None
    """etcd password; pass it by environment variable or file, never on a command line."""

    def __post_init__(self) -> None:
        if not self.etcd:
            raise ConfigError("etcd: at least one endpoint is required")
        for endpoint in self.etcd:
            check_address("etcd", endpoint)
        check_address("listen", self.listen, allow_port_zero=True)
        if not _PREFIX.match(self.prefix):
            raise ConfigError(
                "prefix must start with '/', have no trailing '/' and use only "
                f"[A-Za-z0-9._-] between slashes, got {self.prefix!r}"
            )
        self._check_claims()
        self._check_serving()
        self._check_metrics_and_health()
        self._check_retention()
        self._check_auth()
        self._check_etcd_security()

    def _check_claims(self) -> None:
        if self.min_ttl < 1:
            raise ConfigError(f"min_ttl must be >= 1 second, got {self.min_ttl}")
        if self.max_ttl < self.min_ttl:
            raise ConfigError(f"max_ttl ({self.max_ttl}) must be >= min_ttl ({self.min_ttl})")
        # Otherwise one grant could keep a lease alive past the claim's deadline.
        if self.max_claim_duration < self.max_ttl:
            raise ConfigError(
                f"max_claim_duration ({self.max_claim_duration}) must be >= max_ttl "
                f"({self.max_ttl})"
            )
        if self.stall_timeout < 0:
            raise ConfigError(f"stall_timeout must be >= 0 (0 disables), got {self.stall_timeout}")
        require_positive("reconcile_timeout", self.reconcile_timeout)
        if self.reconcile_handoffs < 0:
            raise ConfigError(f"reconcile_handoffs must be >= 0, got {self.reconcile_handoffs}")
        self.retry_defaults()  # a bad policy stops the server at start, naming the setting
        require_positive("promote_interval", self.promote_interval)

    def _check_serving(self) -> None:
        if self.log_level not in LEVELS:
            raise ConfigError(
                f"log_level must be one of {', '.join(LEVELS)}, got {self.log_level!r}"
            )
        require_positive("max_workers", self.max_workers)
        require_positive("max_calls_per_principal", self.max_calls_per_principal)
        require_positive("renew_rate_per_principal", self.renew_rate_per_principal)
        require_positive("max_streams", self.max_streams)
        require_positive("max_streams_per_principal", self.max_streams_per_principal)
        require_positive("max_stream_age", self.max_stream_age)
        require_positive("max_replays", self.max_replays)
        require_positive("max_replays_per_principal", self.max_replays_per_principal)
        if not 0 < self.max_claim_wait <= 20:
            raise ConfigError(f"max_claim_wait must be > 0 and <= 20, got {self.max_claim_wait}")
        require_positive("max_claim_waiters", self.max_claim_waiters)
        require_positive("etcd_timeout", self.etcd_timeout)
        require_positive("health_interval", self.health_interval)
        if self.shutdown_grace < 0:
            raise ConfigError(f"shutdown_grace must be >= 0, got {self.shutdown_grace}")
        require_positive("reclaim_scan_interval", self.reclaim_scan_interval)
        require_positive("idempotency_ttl", self.idempotency_ttl)
        require_positive("token_reload_interval", self.token_reload_interval)

    def _check_metrics_and_health(self) -> None:
        check_address("metrics_listen", self.metrics_listen, allow_port_zero=True)
        require_positive("metrics_read_timeout", self.metrics_read_timeout)
        require_positive("metrics_max_connections", self.metrics_max_connections)
        if self.metrics_tls and not self.tls_cert:
            raise ConfigError(
                "metrics_tls needs tls_cert and tls_key (it serves their certificate)"
            )
        if self.health_listen is not None:
            check_address("health_listen", self.health_listen, allow_port_zero=True)
            if not self.tls_cert:
                raise ConfigError(
                    "health_listen needs tls_cert: without TLS the gRPC port serves health itself"
                )

    def _check_retention(self) -> None:
        policy = parse_retention(
            self.retention,
            self.retention_per_queue,
            self.tombstone_retention,
            self.ended_attempt_retention,
            idempotency_ttl=self.idempotency_ttl,
        )
        # Normalized in place (the dataclass is frozen): flags and files give text.
        set_ = object.__setattr__
        set_(self, "retention", policy.default)
        set_(self, "retention_per_queue", policy.per_queue)
        set_(self, "tombstone_retention", policy.tombstone)
        set_(self, "ended_attempt_retention", policy.ended_attempt)
        if not self.archive.strip():
            raise ConfigError("archive: give a directory or an s3:// URL")
        require_positive("prune_interval", self.prune_interval)
        require_positive("prune_rate", self.prune_rate)
        require_positive("etcd_quota_bytes", self.etcd_quota_bytes)
        check_space(self)
        for role in Role:
            rate = getattr(self, f"write_budget_{role.value}")
            if rate < 0:
                raise ConfigError(f"write_budget_{role.value} must be >= 0, got {rate}")
        require_positive("write_budget_window", self.write_budget_window)

    def _check_auth(self) -> None:
        require_together("tls_cert", self.tls_cert, "tls_key", self.tls_key)
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        if self.insecure:
            if self.token_file or self.tls_client_ca:
                raise ConfigError(
                    "insecure cannot be combined with token_file or tls_client_ca: "
                    "choose authentication or none"
                )
            if not self.insecure_allow_remote and not is_loopback(self.listen):
                raise ConfigError(
                    f"insecure: refusing to serve without authentication on {self.listen!r}, "
                    "which is not a loopback address; configure token_file, or set "
                    "insecure_allow_remote (--insecure-allow-remote) if something else "
                    "authenticates callers"
                )
        elif self.insecure_allow_remote:
            raise ConfigError("insecure_allow_remote only applies together with insecure")

    def _check_etcd_security(self) -> None:
        require_together("etcd_cert", self.etcd_cert, "etcd_key", self.etcd_key)
        if self.etcd_cert and not self.etcd_ca_cert:
            raise ConfigError("etcd_cert needs etcd_ca_cert (the CA of etcd's server certificate)")
        require_together("etcd_user", self.etcd_user, "etcd_password", self.etcd_password)

    def auth_problem(self) -> str | None:
        """Why this config cannot serve (no authentication chosen), or None if it can.

        Kept out of ``__post_init__`` so that a Config can be built piecemeal (tests, ``up``);
        ``coordinator serve`` refuses to start with a problem here.
        """
        if self.insecure or self.token_file:
            return None
        return (
            "token_file: authentication is required: give a token file (--token-file), "
            "or pass --insecure for local use on a loopback address"
        )

    def etcd_security(self) -> dict[str, str | None]:
        """Keyword arguments of EtcdKV.connect for TLS and etcd auth."""
        return {
            "ca_cert": self.etcd_ca_cert,
            "cert_key": self.etcd_key,
            "cert_cert": self.etcd_cert,
            "user": self.etcd_user,
            "password": self.etcd_password,
        }

    @property
    def limits(self) -> ClaimLimits:
        """The claim bounds the store enforces."""
        return ClaimLimits(
            min_ttl=self.min_ttl,
            max_ttl=self.max_ttl,
            max_claim_duration=self.max_claim_duration,
            stall_timeout=self.stall_timeout,
            reconcile_timeout=self.reconcile_timeout,
            reconcile_handoffs=self.reconcile_handoffs,
            retry=self.retry_defaults(),
        )

    def retry_defaults(self) -> RetryDefaults:
        """The retry policy of new tasks: the server's, and each listed queue's."""
        server = RetryPolicy(
            max_attempts=self.retry_max_attempts,
            initial_backoff=self.retry_initial_backoff,
            backoff_multiplier=self.retry_backoff_multiplier,
            max_backoff=self.retry_max_backoff,
            backoff_jitter=self.retry_backoff_jitter,
            non_retryable_errors=error_codes(self.retry_non_retryable_errors),
        )
        return build_retry_defaults(server, self.queue_retry_policies)

    @property
    def retention_policy(self) -> RetentionPolicy:
        """How long terminal tasks and tombstones are kept (coordinator.store.retention.pruner)."""
        return RetentionPolicy(
            default=float(self.retention),
            per_queue=MappingProxyType(dict(self.retention_per_queue)),  # type: ignore[arg-type]
            tombstone=float(self.tombstone_retention),
            ended_attempt=float(self.ended_attempt_retention),
        )

    @property
    def stream_limits(self) -> StreamLimits:
        """The bounds of long-lived calls (coordinator.server.streams)."""
        return StreamLimits(
            max_streams=self.max_streams,
            max_per_principal=self.max_streams_per_principal,
            max_age=self.max_stream_age,
            max_claim_wait=self.max_claim_wait,
            # Credentials are checked at least as often as the token file may change.
            sweep_interval=min(1.0, self.token_reload_interval),
        )

    @property
    def write_budgets(self) -> Mapping[Role, BudgetPolicy]:
        """Each role's write budget (coordinator.server.interceptors.write_budgets)."""
        return {
            role: BudgetPolicy(
                getattr(self, f"write_budget_{role.value}"), self.write_budget_window
            )
            for role in Role
        }


def is_loopback(address: str) -> bool:
    """Whether a ``host:port`` listen address only accepts connections from this machine."""
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name, "0.0.0.0", "[::]" or "": reachable from elsewhere
