"""``coordinator serve``: run one replica against an existing etcd.

Every setting is a flag (``--max-ttl``), an environment variable (``COORDINATOR_MAX_TTL``) and a
key of the TOML config file given by ``--config`` (``max_ttl = 60``), with that precedence:
flag, then environment, then file, then the default. The Kubernetes chart uses the file (a
ConfigMap) plus environment variables for secrets. An invalid setting stops the command before
anything connects, with exit code 2 and a message naming the setting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from coordinator.archive import check_sink
from coordinator.cli.origins import config_keys, with_origins
from coordinator.cli.secret_files import secret_from_file
from coordinator.config import Config, load_config_file, parse_endpoints
from coordinator.errors import ConfigError, StoreUnavailable
from coordinator.logging import LEVELS
from coordinator.server.app import serve as run_server
from coordinator.server.auth import authenticator_for, tls_for
from coordinator.server.version_gate import VersionRefused

F = TypeVar("F", bound=Callable[..., Any])

_DEFAULTS = Config()


def _option(name: str, *, help: str, **kwargs: Any) -> Callable[[F], F]:
    """``--name``, also read from ``COORDINATOR_NAME`` (--help shows both; ``serve`` adds its
    config key, see ``config_keys``)."""
    key = name.replace("-", "_")
    envvar = "COORDINATOR_" + key.upper()
    kwargs.setdefault("show_default", kwargs.get("default") not in (None, False))
    return click.option(
        f"--{name}",
        key,
        envvar=envvar,
        show_envvar=True,
        help=help,
        **kwargs,
    )


def _file(name: str, help: str) -> Callable[[F], F]:
    return _option(name, default=None, metavar="FILE", help=help)


def _seconds(name: str, default: float, help: str, *, zero: bool = False) -> Callable[[F], F]:
    return _option(
        name,
        type=click.FloatRange(min=0, min_open=not zero),
        default=default,
        metavar="SECONDS",
        help=help,
    )


def limit_options(func: F) -> F:
    """The claim-bound and logging options, shared by ``serve`` and ``up``."""
    # Applied bottom-up, so --help lists them top-down in this order.
    options = [
        _option(
            "min-ttl",
            type=click.IntRange(min=1),
            default=_DEFAULTS.min_ttl,
            metavar="SECONDS",
            help="Smallest lease TTL granted to a claim.",
        ),
        _option(
            "max-ttl",
            type=click.IntRange(min=1),
            default=_DEFAULTS.max_ttl,
            metavar="SECONDS",
            help="Largest lease TTL granted to a claim.",
        ),
        _seconds(
            "max-claim-duration",
            _DEFAULTS.max_claim_duration,
            "No renewal past claim start + this.",
        ),
        _seconds(
            "stall-timeout",
            _DEFAULTS.stall_timeout,
            "Refuse renewal when progress has not moved for this long (0: off).",
            zero=True,
        ),
        _option(
            "log-level",
            type=click.Choice(LEVELS),
            default=_DEFAULTS.log_level,
            help="Lowest level written to stderr (JSON lines).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _server_options(func: F) -> F:
    """Listen addresses, etcd, keyspace and runtime tuning."""
    options = [
        _option(
            "etcd",
            default=",".join(_DEFAULTS.etcd),
            metavar="HOST:PORT[,HOST:PORT...]",
            help="etcd client endpoints; the client fails over between them (a TOML list in a "
            "config file).",
        ),
        _option("listen", default=_DEFAULTS.listen, metavar="ADDR", help="gRPC listen address."),
        _option(
            "metrics-listen",
            default=_DEFAULTS.metrics_listen,
            metavar="ADDR",
            help="Prometheus metrics listen address (its own port).",
        ),
        _option(
            "metrics-tls",
            is_flag=True,
            default=False,
            help="Serve the metrics port over TLS with --tls-cert/--tls-key.",
        ),
        _seconds(
            "metrics-read-timeout",
            _DEFAULTS.metrics_read_timeout,
            "A metrics connection must send its request within this, or it is closed.",
        ),
        _option(
            "metrics-max-connections",
            type=click.IntRange(min=1),
            default=_DEFAULTS.metrics_max_connections,
            metavar="N",
            help="Open metrics connections at once (the oldest silent one is closed past it).",
        ),
        _option(
            "health-listen",
            default=None,
            metavar="ADDR",
            help="With --tls-cert: a plaintext port serving only gRPC health, for probes that "
            "speak no TLS (the kubelet's).",
        ),
        _option("prefix", default=_DEFAULTS.prefix, help="etcd key prefix of this keyspace."),
        limit_options,
        _option(
            "max-workers",
            type=click.IntRange(min=1),
            default=_DEFAULTS.max_workers,
            metavar="N",
            help="gRPC handler threads kept for unary calls (streams get --max-streams more).",
        ),
        _option(
            "max-calls-per-principal",
            type=click.IntRange(min=1),
            default=_DEFAULTS.max_calls_per_principal,
            metavar="N",
            help="Unary calls one principal may run at once (of --max-workers); past it, "
            "RESOURCE_EXHAUSTED.",
        ),
        _option(
            "renew-rate-per-principal",
            type=click.FloatRange(min=0, min_open=True),
            default=_DEFAULTS.renew_rate_per_principal,
            metavar="N",
            help="Claims one principal may renew a second on this replica; past it, "
            "RESOURCE_EXHAUSTED.",
        ),
        _option(
            "max-streams",
            type=click.IntRange(min=1),
            default=_DEFAULTS.max_streams,
            metavar="N",
            help="Long-lived calls (WatchEvents, other streams, waiting ClaimNext) open at once, "
            "each on a parked thread of its own; past it, RESOURCE_EXHAUSTED.",
        ),
        _option(
            "max-streams-per-principal",
            type=click.IntRange(min=1),
            default=_DEFAULTS.max_streams_per_principal,
            metavar="N",
            help="Long-lived calls a principal is always let hold; past it, it borrows idle "
            "slots but never the replica's last quarter (then RESOURCE_EXHAUSTED).",
        ),
        _option(
            "max-replays",
            type=click.IntRange(min=1),
            default=_DEFAULTS.max_replays,
            metavar="N",
            help="Replays of the event log's past running at once; past it, RESOURCE_EXHAUSTED.",
        ),
        _option(
            "max-replays-per-principal",
            type=click.IntRange(min=1),
            default=_DEFAULTS.max_replays_per_principal,
            metavar="N",
            help="Replays of the event log's past one principal may run at once; past it, "
            "RESOURCE_EXHAUSTED.",
        ),
        _seconds(
            "max-stream-age",
            _DEFAULTS.max_stream_age,
            "A stream older than this is ended UNAVAILABLE; its caller resumes where it was.",
        ),
        _option(
            "max-claim-wait",
            type=click.FloatRange(min=0, max=20, min_open=True),
            default=_DEFAULTS.max_claim_wait,
            metavar="SECONDS",
            help="The longest a long-poll ClaimNext may wait for a task (at most 20).",
        ),
        _option(
            "max-claim-waiters",
            type=click.IntRange(min=1),
            default=_DEFAULTS.max_claim_waiters,
            metavar="N",
            help="Long-poll ClaimNext calls waiting on the replica at once; past it, "
            "RESOURCE_EXHAUSTED.",
        ),
        _seconds(
            "shutdown-grace",
            _DEFAULTS.shutdown_grace,
            "On SIGTERM, in-flight calls get this long to finish.",
            zero=True,
        ),
        _seconds("etcd-timeout", _DEFAULTS.etcd_timeout, "Timeout of each etcd request."),
        _seconds("health-interval", _DEFAULTS.health_interval, "How often health re-checks etcd."),
        _seconds(
            "reclaim-scan-interval",
            _DEFAULTS.reclaim_scan_interval,
            "Period of the reclaimer's full scan for expired claims.",
        ),
        _seconds(
            "idempotency-ttl",
            _DEFAULTS.idempotency_ttl,
            "How long responses of requests with an idempotency key are kept (those that hand "
            "out claims: at most --max-ttl).",
        ),
        _seconds(
            "reconcile-timeout",
            _DEFAULTS.reconcile_timeout,
            "An UNKNOWN effect's owned reconciliation escalates to NEEDS_APPROVAL after this.",
        ),
        _option(
            "retention",
            default="7d",
            metavar="DURATION",
            help="How long a DONE, CANCELLED or FAILED task stays in etcd before it is archived "
            "and removed (seconds, or 90s/15m/1h/7d/2w; 0: forever, which fills etcd).",
        ),
        _option(
            "retention-per-queue",
            default="",
            metavar="QUEUE=DURATION[,...]",
            help="Per-queue retention overriding --retention (a TOML table in a config file).",
        ),
        _option(
            "tombstone-retention",
            default="1d",
            metavar="DURATION",
            help="How long a pruned task's tombstone stays: its id is refused meanwhile, and "
            "GetTask names the archive.",
        ),
        _option(
            "ended-attempt-retention",
            default="7d",
            metavar="DURATION",
            help="How long the staged result and finished job records of an attempt that ended "
            "while its task stays live are kept before they are archived and removed (0: until "
            "the task is pruned).",
        ),
        _option(
            "archive",
            default=_DEFAULTS.archive,
            metavar="DIR|s3://BUCKET/PREFIX",
            help="Where a task's history is written before it is pruned: a directory of gzip "
            "JSON Lines files, or S3 (pip install 'coordinator[s3]'; ?endpoint_url=&region=).",
        ),
        _seconds("prune-interval", _DEFAULTS.prune_interval, "Seconds between pruner passes."),
        _option(
            "prune-rate",
            type=click.FloatRange(min=0, min_open=True),
            default=_DEFAULTS.prune_rate,
            metavar="TASKS/S",
            help="etcd requests per second the pruner makes per replica, at most (reads and "
            "txns alike; about one per pruned task).",
        ),
        _option(
            "etcd-quota-bytes",
            type=click.IntRange(min=1),
            default=_DEFAULTS.etcd_quota_bytes,
            metavar="BYTES",
            help="etcd's --quota-backend-bytes (past it etcd refuses every write).",
        ),
        _option(
            "etcd-quota-warn-ratio",
            type=click.FloatRange(min=0, max=1, min_open=True),
            default=_DEFAULTS.etcd_quota_warn_ratio,
            metavar="RATIO",
            help="Warn when etcd's db size passes this share of --etcd-quota-bytes.",
        ),
        _option(
            "etcd-quota-high-water",
            type=click.FloatRange(min=0, max=1, min_open=True),
            default=_DEFAULTS.etcd_quota_high_water,
            metavar="RATIO",
            help="Above this share of --etcd-quota-bytes refuse writes that only add data "
            "(creates, checkpoints, staging, idempotency keys); commits and claims go on.",
        ),
        *(
            _option(
                f"write-budget-{role}",
                type=click.FloatRange(min=0),
                default=getattr(_DEFAULTS, f"write_budget_{role}"),
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
        _seconds(
            "write-budget-window",
            _DEFAULTS.write_budget_window,
            "The write budgets' rolling window: a full budget holds rate x window bytes.",
        ),
        _seconds(
            "etcd-space-interval",
            _DEFAULTS.etcd_space_interval,
            "Seconds between readings of etcd's db size and alarms (the space guard).",
        ),
        _option(
            "reconcile-handoffs",
            type=click.IntRange(min=0),
            default=_DEFAULTS.reconcile_handoffs,
            metavar="N",
            help="Claims that may take over a task whose holder left an open reconciliation.",
        ),
        _option(
            "retry-max-attempts",
            type=click.IntRange(min=0),
            default=_DEFAULTS.retry_max_attempts,
            metavar="N",
            help="Attempts a task gets unless it or its queue says otherwise (0: unlimited).",
        ),
        _seconds(
            "retry-initial-backoff",
            _DEFAULTS.retry_initial_backoff,
            "Wait before a task's first retry (0: at once); later waits multiply it.",
            zero=True,
        ),
        _option(
            "retry-backoff-multiplier",
            type=click.FloatRange(min=1, max=100),
            default=_DEFAULTS.retry_backoff_multiplier,
            metavar="X",
            help="Each retry waits this many times longer than the one before.",
        ),
        _seconds(
            "retry-max-backoff",
            _DEFAULTS.retry_max_backoff,
            "The longest wait before a retry.",
            zero=True,
        ),
        _option(
            "retry-backoff-jitter",
            type=click.FloatRange(min=0, max=1),
            default=_DEFAULTS.retry_backoff_jitter,
            metavar="FRACTION",
            help="Each retry's wait is lengthened by up to this fraction of itself, so tasks "
            "that failed together come back spread out.",
        ),
        _option(
            "retry-non-retryable-errors",
            default=_DEFAULTS.retry_non_retryable_errors,
            metavar="CODES",
            help="Comma-separated error codes (Fail) that are never retried.",
        ),
        _option(
            "queue-retry-policies",
            default=_DEFAULTS.queue_retry_policies,
            metavar="SPEC",
            help="Per-queue retry defaults: 'QUEUE:max_attempts=3,initial_backoff=2;Q2:...' "
            "(fields max_attempts, initial_backoff, backoff_multiplier, max_backoff, "
            "backoff_jitter, "
            "non_retryable_errors as codes separated by '|').",
        ),
        _seconds(
            "promote-interval",
            _DEFAULTS.promote_interval,
            "How often DELAYED tasks whose time came are made READY.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _security_options(func: F) -> F:
    """Authentication of callers, TLS, and the etcd connection's TLS and credentials."""
    options = [
        _file(
            "token-file",
            "JSON token file: sha256(token) -> principal, roles; certificate principal -> "
            "roles. Reloaded when it changes.",
        ),
        _seconds(
            "token-reload-interval",
            _DEFAULTS.token_reload_interval,
            "How often the token file is checked for changes.",
        ),
        _file("tls-cert", "PEM server certificate of the gRPC port (with --tls-key)."),
        _file("tls-key", "PEM private key of --tls-cert."),
        _file(
            "tls-client-ca",
            "PEM CA for mutual TLS: clients must present a certificate it signed; the "
            "principal is the certificate's URI or DNS SAN (its CN only without any SAN).",
        ),
        _option(
            "insecure",
            is_flag=True,
            default=False,
            help="No authentication: callers name their own principal and roles. Local use "
            "only; refused on a non-loopback --listen.",
        ),
        _option(
            "insecure-allow-remote",
            is_flag=True,
            default=False,
            help="With --insecure, allow a non-loopback --listen (something else must "
            "authenticate callers).",
        ),
    ]
    func = etcd_security_options(func)  # listed after these in --help
    for option in reversed(options):
        func = option(func)
    return func


def etcd_security_options(func: F) -> F:
    """TLS and credentials of the etcd connection, shared by ``serve`` and ``doctor``."""
    options = [
        _file("etcd-ca-cert", "PEM CA of etcd's server certificates (TLS to etcd)."),
        _file("etcd-cert", "PEM client certificate for etcd (with --etcd-key)."),
        _file("etcd-key", "PEM private key of --etcd-cert."),
        _option(
            "etcd-user",
            default=None,
            callback=secret_from_file("COORDINATOR_ETCD_USER_FILE"),
            help="etcd user name (etcd auth); or COORDINATOR_ETCD_USER_FILE naming a file.",
        ),
        _option(
            "etcd-password",
            default=None,
            callback=secret_from_file("COORDINATOR_ETCD_PASSWORD_FILE"),
            help="etcd password; set it by environment variable (or COORDINATOR_ETCD_PASSWORD_FILE"
            " naming a file holding it), not on the command line.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _load_config_file(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """Eager ``--config``: the file's settings become the defaults the other options fall back
    to (so a flag or an environment variable still wins)."""
    del param
    if not value:
        return
    try:
        settings = load_config_file(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param_hint="'--config'") from exc
    if isinstance(settings.get("etcd"), list):
        settings["etcd"] = ",".join(str(e) for e in settings["etcd"])
    per_queue = settings.get("retention_per_queue")
    if isinstance(per_queue, dict):  # a TOML table; the option takes QUEUE=DURATION,...
        settings["retention_per_queue"] = ",".join(f"{q}={d}" for q, d in per_queue.items())
    _check_types(ctx, value, settings)
    ctx.default_map = {**(ctx.default_map or {}), **settings}


def _check_types(ctx: click.Context, path: str, settings: dict[str, Any]) -> None:
    """Convert each file value as its option would, now: a bad one is blamed on the file and
    its key, not on the flag and environment variable it would otherwise surface through."""
    options = {p.name: p for p in ctx.command.params if p.name}
    for key, raw in settings.items():
        option = options.get(key)
        if option is None:
            continue
        try:
            option.type_cast_value(ctx, raw)
        except click.BadParameter as exc:
            raise click.BadParameter(
                f"{key} = {raw!r} in {path}: {exc.message}", ctx=ctx, param_hint="'--config'"
            ) from exc


def build_config(**settings: Any) -> Config:
    """A Config from CLI settings; an invalid one becomes a usage error naming the setting."""
    try:
        return Config(**settings)
    except ConfigError as exc:
        raise click.BadParameter(with_origins(str(exc))) from exc


def preflight(config: Config) -> None:
    """Refuse (usage error, exit 2) a config that cannot serve: no authentication chosen, an
    unreadable or invalid token file, unreadable TLS files, an archive that cannot be written."""
    try:
        authenticator_for(config)
        tls = tls_for(config)
        if tls is not None:
            tls.credentials()
        check_sink(config.archive)
    except ConfigError as exc:
        raise click.BadParameter(with_origins(str(exc))) from exc


def run(config: Config, *, ready: Callable[[str], None] | None = None) -> int:
    """Serve until signalled; store and config errors become a clean CLI failure."""
    try:
        return run_server(config, ready=ready)
    except (VersionRefused, ConfigError) as exc:  # a bad setting (or too old): exit 2
        click.echo(f"Error: {exc}", err=True)
        raise SystemExit(2) from exc
    except StoreUnavailable as exc:
        raise click.ClickException(str(exc)) from exc


@config_keys
@click.command()
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    envvar="COORDINATOR_CONFIG",
    show_envvar=True,
    is_eager=True,
    expose_value=False,
    callback=_load_config_file,
    metavar="FILE",
    help="TOML file of settings (keys as named below); flags and env vars override it.",
)
@_server_options
@_security_options
def serve(**settings: Any) -> None:
    """Serve the coordinator's gRPC API over an existing etcd until SIGTERM/SIGINT.

    Callers must authenticate (--token-file, optionally with mutual TLS) unless --insecure.
    """
    settings["etcd"] = parse_endpoints(settings["etcd"])
    config = build_config(**settings)
    preflight(config)
    raise SystemExit(run(config))
