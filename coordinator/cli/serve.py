"""``coordinator serve``: run one replica against an existing etcd.

Every option can also come from ``COORDINATOR_<NAME>`` (e.g. ``COORDINATOR_ETCD``,
``COORDINATOR_MAX_TTL``), which is how the Kubernetes chart configures it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from coordinator.config import Config, parse_endpoints
from coordinator.errors import ConfigError, StoreUnavailable
from coordinator.logging import LEVELS
from coordinator.server.app import serve as run_server

F = TypeVar("F", bound=Callable[..., Any])

_DEFAULTS = Config()


def _option(name: str, **kwargs: Any) -> Callable[[F], F]:
    """A ``--name`` option that also reads ``COORDINATOR_NAME`` and shows both in --help."""
    envvar = "COORDINATOR_" + name.upper().replace("-", "_")
    return click.option(f"--{name}", envvar=envvar, show_envvar=True, show_default=True, **kwargs)


def limit_options(func: F) -> F:
    """The claim-bound and logging options, shared by ``serve`` and ``up``."""
    # Applied bottom-up, so --help lists them top-down in this order.
    options = [
        _option(
            "min-ttl",
            type=click.IntRange(min=1),
            default=_DEFAULTS.min_ttl,
            help="Smallest lease TTL granted to a claim (seconds).",
        ),
        _option(
            "max-ttl",
            type=click.IntRange(min=1),
            default=_DEFAULTS.max_ttl,
            help="Largest lease TTL granted to a claim (seconds).",
        ),
        _option(
            "max-claim-duration",
            type=click.FloatRange(min=0, min_open=True),
            default=_DEFAULTS.max_claim_duration,
            help="No renewal past claim start + this (seconds).",
        ),
        _option(
            "stall-timeout",
            type=click.FloatRange(min=0),
            default=_DEFAULTS.stall_timeout,
            help="Refuse renewal when progress has not moved for this long (seconds; 0: off).",
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


def build_config(**settings: Any) -> Config:
    """A Config from CLI settings; an invalid one becomes a usage error naming the setting."""
    try:
        return Config(**settings)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from exc


def run(config: Config, *, ready: Callable[[str], None] | None = None) -> int:
    """Serve until signalled; store and config errors become a clean CLI failure."""
    try:
        return run_server(config, ready=ready)
    except (ConfigError, StoreUnavailable) as exc:
        raise click.ClickException(str(exc)) from exc


@click.command()
@_option(
    "etcd",
    default=",".join(_DEFAULTS.etcd),
    metavar="HOST:PORT[,HOST:PORT...]",
    help="etcd client endpoints; the client fails over between them.",
)
@_option("listen", default=_DEFAULTS.listen, metavar="ADDR", help="gRPC listen address.")
@_option("prefix", default=_DEFAULTS.prefix, help="etcd key prefix of this keyspace.")
@limit_options
def serve(
    etcd: str,
    listen: str,
    prefix: str,
    min_ttl: int,
    max_ttl: int,
    max_claim_duration: float,
    stall_timeout: float,
    log_level: str,
) -> None:
    """Serve the coordinator's gRPC API over an existing etcd until SIGTERM/SIGINT."""
    config = build_config(
        etcd=parse_endpoints(etcd),
        listen=listen,
        prefix=prefix,
        min_ttl=min_ttl,
        max_ttl=max_ttl,
        max_claim_duration=max_claim_duration,
        stall_timeout=stall_timeout,
        log_level=log_level,
    )
    raise SystemExit(run(config))
