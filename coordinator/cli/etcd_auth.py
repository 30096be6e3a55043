"""``coordinator etcd-auth``: turn on etcd auth with a coordinator user limited to its prefix.

The chart's bundled etcd runs it as a Job at every install and upgrade (coordinator.etcd_auth
says what it leaves behind). Passwords come from environment variables or the files they
name (a mounted Kubernetes Secret), never from the command line:
``COORDINATOR_ETCD_ROOT_PASSWORD`` (or ``..._FILE``) for root and ``COORDINATOR_ETCD_PASSWORD``
(or ``..._FILE``) for the coordinator's user - the same variables ``coordinator serve`` reads.
Exit code 0 when etcd is in that state, 1 (with the reason) when not.
"""

from __future__ import annotations

import click

from coordinator.cli.options import etcd_security_options
from coordinator.cli.secret_files import secret_from_file
from coordinator.config import DEFAULT_ETCD, DEFAULT_PREFIX
from coordinator.config_values import check_address, parse_endpoints
from coordinator.errors import ConfigError
from coordinator.etcd_auth import AuthPlan, EtcdAuthError, EtcdTLS, ensure_auth


@click.command("etcd-auth")
@click.option(
    "--etcd",
    envvar="COORDINATOR_ETCD",
    show_envvar=True,
    default=",".join(DEFAULT_ETCD),
    show_default=True,
    metavar="HOST:PORT[,HOST:PORT...]",
    help="etcd client endpoints (tried in turn).",
)
@click.option(
    "--prefix",
    envvar="COORDINATOR_PREFIX",
    show_envvar=True,
    default=DEFAULT_PREFIX,
    show_default=True,
    help="The keyspace the coordinator's user may read and write (nothing else).",
)
@click.option(
    "--root-password",
    envvar="COORDINATOR_ETCD_ROOT_PASSWORD",
    show_envvar=True,
    callback=secret_from_file("COORDINATOR_ETCD_ROOT_PASSWORD_FILE"),
    help="etcd root's password; set it by environment variable (or"
    " COORDINATOR_ETCD_ROOT_PASSWORD_FILE naming a file holding it), not on the command line.",
)
@etcd_security_options
def etcd_auth(
    etcd: str,
    prefix: str,
    root_password: str | None,
    etcd_ca_cert: str | None,
    etcd_cert: str | None,
    etcd_key: str | None,
    etcd_user: str | None,
    etcd_password: str | None,
) -> None:
    """Enable etcd auth (idempotent): root, and --etcd-user with --etcd-password on --prefix."""
    if not etcd_user:
        raise click.BadParameter("--etcd-user: name the coordinator's etcd user")
    if not root_password:
        raise click.BadParameter(
            "--root-password: set COORDINATOR_ETCD_ROOT_PASSWORD or"
            " COORDINATOR_ETCD_ROOT_PASSWORD_FILE"
        )
    endpoints = parse_endpoints(etcd)
    try:
        for endpoint in endpoints:
            check_address("etcd", endpoint)
        plan = AuthPlan(
            root_password=root_password,
            user=etcd_user,
            password=etcd_password or "",
            prefix=prefix,
        )
    except (ConfigError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from exc
    tls = EtcdTLS(etcd_ca_cert, etcd_cert, etcd_key) if etcd_ca_cert else None
    try:
        outcome = ensure_auth(endpoints, plan, tls=tls)
    except EtcdAuthError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"etcd auth {outcome.value}: user {etcd_user!r} may use {prefix}/ only")
