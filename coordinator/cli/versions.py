"""``coordinator versions show|set-minimum``: the version gate (and the schema) over AdminService.

``set-minimum`` raises the oldest coordinator and/or SDK version the keyspace admits and bumps
the scheduler epoch in the same etcd txn: claims made before it carry the old epoch, so an old
worker's renew and commit are refused, an older coordinator refuses to start, and an older SDK's
calls are refused FAILED_PRECONDITION. Needs the admin role (``show``: any role).
"""

from __future__ import annotations

from typing import Any

import click

from coordinator.cli.remote import connect, remote_options, remote_settings
from coordinator.v1 import admin_pb2


@click.group()
def versions() -> None:
    """Show or raise the keyspace's schema and minimum coordinator and SDK versions."""


def _echo(record: admin_pb2.VersionRecord) -> None:
    click.echo(f"schema_version {record.schema_version}")
    click.echo(f"min_coordinator_version {record.min_coordinator_version}")
    click.echo(f"min_sdk_version {record.min_sdk_version}")
    click.echo(f"require_sdk_version {'yes' if record.require_sdk_version else 'no'}")


@versions.command()
@remote_options
def show(**settings: Any) -> None:
    """Print the keyspace's version record and the answering coordinator's version."""
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.admin.GetVersions, admin_pb2.GetVersionsRequest())
    _echo(reply.versions)
    click.echo(f"coordinator_version {reply.coordinator_version}")


@versions.command("set-minimum")
@click.option(
    "--coordinator",
    "min_coordinator",
    default="",
    metavar="VERSION",
    help="Oldest coordinator version allowed to start against the keyspace.",
)
@click.option(
    "--sdk",
    "min_sdk",
    default="",
    metavar="VERSION",
    help="Oldest SDK version whose calls are admitted.",
)
@click.option(
    "--require-sdk-version/--no-require-sdk-version",
    default=None,
    help="Also refuse calls that name no SDK version (raw gRPC clients).",
)
@click.option(
    "--allow-lower", is_flag=True, help="Allow lowering a minimum (lets old binaries back in)."
)
@click.option(
    "--schema",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Raise the keyspace schema (never lowered). Every replica must know it first: those "
    "that do not are refused. See docs/migration.md.",
)
@remote_options
def set_minimum(
    min_coordinator: str,
    min_sdk: str,
    require_sdk_version: bool | None,
    allow_lower: bool,
    schema: int | None,
    **settings: Any,
) -> None:
    """Raise the minimum versions (or the schema) and bump the scheduler epoch, in one txn."""
    if not min_coordinator and not min_sdk and require_sdk_version is None and schema is None:
        raise click.UsageError("give --coordinator, --sdk, --require-sdk-version or --schema")
    request = admin_pb2.SetMinimumVersionsRequest(
        min_coordinator_version=min_coordinator,
        min_sdk_version=min_sdk,
        require_sdk_version=require_sdk_version,
        allow_lower=allow_lower,
        schema_version=schema or 0,
    )
    with connect(**remote_settings(settings)) as remote:
        before = remote.call(remote.admin.GetEpoch, admin_pb2.GetEpochRequest()).epoch
        reply = remote.call(remote.admin.SetMinimumVersions, request)
    _echo(reply.versions)
    if reply.epoch == before:
        click.echo(f"unchanged: the minimums were already so; the epoch stays {reply.epoch}")
    else:
        click.echo(f"epoch bumped to {reply.epoch}")
