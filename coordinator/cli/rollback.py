"""The safe-rollback verbs over AdminService: ``claims pause|resume`` and ``epoch show|bump``.

The seed's procedure: stop new claims (``claims pause``), raise the scheduler epoch
(``epoch bump``; every claim, renew, tool authorization and commit carrying the old epoch is
refused from then on), wait until nothing of the old pool is left (``coordinator drain``), then
switch pools and ``claims resume``. ``--queue`` pauses and resumes one queue's claims only, for
a rollback of the pool serving that queue (docs/operations.md). Each verb needs the admin role
(``epoch show``: any role).
"""

from __future__ import annotations

from typing import Any

import click

from coordinator.cli.remote import connect, remote_options, remote_settings
from coordinator.v1 import admin_pb2

_QUEUE_HELP = "Only this queue's tasks (repeat for several, e.g. every queue of one pool)."


@click.group()
def claims() -> None:
    """Pause or resume new claims, of every queue or of some (live claims keep running)."""


@claims.command()
@click.option(
    "--reason",
    default="paused by an operator",
    show_default=True,
    help="Why, stored with the pause (`coordinator drain` keeps it).",
)
@click.option("--queue", "queues", multiple=True, help=_QUEUE_HELP)
@remote_options
def pause(reason: str, queues: tuple[str, ...], **settings: Any) -> None:
    """Refuse new claims (CLAIMS_PAUSED) until `coordinator claims resume`: of every queue,
    or with --queue of those queues only (the others claim on)."""
    with connect(**remote_settings(settings)) as remote:
        for queue in queues or ("",):
            request = admin_pb2.PauseClaimsRequest(reason=reason, queue=queue)
            remote.call(remote.admin.PauseClaims, request)
            click.echo(f"claims{_of(queue)} paused ({reason})")


@claims.command()
@click.option("--queue", "queues", multiple=True, help=_QUEUE_HELP)
@remote_options
def resume(queues: tuple[str, ...], **settings: Any) -> None:
    """Accept new claims again: lift the global pause, or with --queue those queues' pauses."""
    with connect(**remote_settings(settings)) as remote:
        for queue in queues or ("",):
            request = admin_pb2.ResumeClaimsRequest(queue=queue)
            reply = remote.call(remote.admin.ResumeClaims, request)
            click.echo(f"claims{_of(queue)} resumed")
        if not queues and reply.paused_queues:
            click.echo(f"still paused one by one: {', '.join(reply.paused_queues)}")


def _of(queue: str) -> str:
    return f" of queue {queue}" if queue else ""


@click.group()
def epoch() -> None:
    """Show or raise the scheduler epoch."""


@epoch.command()
@remote_options
def show(**settings: Any) -> None:
    """Print the current scheduler epoch, whether claims are paused, and the paused queues."""
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.admin.GetEpoch, admin_pb2.GetEpochRequest())
    click.echo(f"epoch {reply.epoch}")
    click.echo(f"claims {'paused' if reply.claims_paused else 'accepted'}")
    if reply.paused_queues:
        click.echo(f"paused queues: {', '.join(reply.paused_queues)}")


@epoch.command()
@click.option(
    "--expected",
    type=click.IntRange(min=1),
    default=None,
    help="Only bump from this epoch (refused if someone bumped meanwhile).",
)
@click.option(
    "--revoke-leases",
    is_flag=True,
    help="Also revoke every claim made before the bump: its task goes back to READY now "
    "instead of when its lease would expire.",
)
@remote_options
def bump(expected: int | None, revoke_leases: bool, **settings: Any) -> None:
    """Raise the scheduler epoch by one: every call carrying the old epoch is refused."""
    request = admin_pb2.BumpEpochRequest(expected_epoch=expected or 0, revoke_leases=revoke_leases)
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.admin.BumpEpoch, request)
    line = f"epoch bumped to {reply.epoch}"
    if revoke_leases:
        line += f"; revoked {reply.revoked_leases} lease(s)"
    click.echo(line)
