"""``coordinator serve``: run one replica against an existing etcd.

Every setting is a flag (``--max-ttl``), an environment variable (``COORDINATOR_MAX_TTL``) and a
key of the TOML config file given by ``--config`` (``max_ttl = 60``), with that precedence:
flag, then environment, then file, then the default. The Kubernetes chart uses the file (a
ConfigMap) plus environment variables for secrets. An invalid setting stops the command before
anything connects, with exit code 2 and a message naming the setting. The options themselves
are listed in cli/serve_options.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from coordinator.archive import check_sink
from coordinator.cli.origins import config_keys, with_origins
from coordinator.cli.serve_options import security_options, server_options
from coordinator.config import Config
from coordinator.config_file import load_config_file
from coordinator.config_values import parse_endpoints
from coordinator.errors import ConfigError, StoreUnavailable
from coordinator.server.app import serve as run_server
from coordinator.server.interceptors.auth import authenticator_for, tls_for
from coordinator.server.interceptors.version_gate import VersionRefused


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
@server_options
@security_options
def serve(**settings: Any) -> None:
    """Serve the coordinator's gRPC API over an existing etcd until SIGTERM/SIGINT.

    Callers must authenticate (--token-file, optionally with mutual TLS) unless --insecure.
    """
    settings["etcd"] = parse_endpoints(settings["etcd"])
    config = build_config(**settings)
    preflight(config)
    raise SystemExit(run(config))
