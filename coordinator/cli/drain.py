"""``coordinator drain``: pause claims and wait, showing progress, until nothing is left running.

Drained means: claims are paused, no claim holds a live lease, no side effect is UNKNOWN (or
PREPARED and never recorded), and no staged result can still be committed. Only then may an
operator switch pools (the seed's safe rollback). With ``--queue`` all of it is about one
queue: that queue's claims are paused, and only its tasks' claims, effects and staged results
are waited for; the other queues claim on. On timeout the command exits 1 and lists what is
left, so a script can stop there.
"""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from coordinator.cli.remote import Remote, connect, remote_options, remote_settings
from coordinator.cli.tasks import nothing_found
from coordinator.v1 import admin_pb2, tasks_pb2, types_pb2

_LISTED = 20  # claimed tasks named on timeout; the counts say how many there are in all

RESUME_HINT = "claims stay paused: `coordinator claims resume` lets workers claim again"
"""What drain says last whenever it leaves claims paused (it never resumes them itself)."""


def resume_hint(queue: str) -> str:
    """What drain says last whenever it leaves claims paused (it never resumes them itself)."""
    if not queue:
        return RESUME_HINT
    return (
        f"claims of queue {queue} stay paused: `coordinator claims resume --queue {queue}` "
        "lets workers claim them again"
    )


def _paused(status: admin_pb2.DrainStatusResponse) -> bool:
    return status.claims_paused or status.queue_paused


def render(status: admin_pb2.DrainStatusResponse, elapsed: float, timeout: float) -> Table:
    """The progress table: what still runs, and how long we have waited."""
    table = Table(title="coordinator drain", show_header=False, min_width=44)
    table.add_row("epoch", str(status.epoch))
    if status.queue:
        table.add_row("queue", status.queue)
    table.add_row("claims", "paused" if _paused(status) else "[red]accepted[/red]")
    for label, count in _counts(status):
        table.add_row(label, f"[green]{count}[/green]" if count == 0 else f"[yellow]{count}[/]")
    table.add_row("waited", f"{elapsed:.0f}s of {timeout:.0f}s")
    table.add_row("state", "[green]drained[/green]" if status.drained else "draining")
    return table


def _counts(status: admin_pb2.DrainStatusResponse) -> list[tuple[str, int]]:
    return [
        ("active leases", status.active_leases),
        ("UNKNOWN effects", status.unknown_effects),
        ("staged, uncommitted", status.staged_uncommitted),
    ]


@click.command()
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="Give up (exit 1, listing what is left) after this long.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="How often to poll DrainStatus.",
)
@click.option(
    "--reason",
    default="drain",
    show_default=True,
    help="Recorded with the pause (claims already paused keep the operator's reason).",
)
@click.option(
    "--queue",
    default="",
    help="Pause and wait for this queue's tasks only; the other queues claim on.",
)
@click.option(
    "--allow-empty",
    is_flag=True,
    help="Pause and drain --queue even if no task of it exists (a name set up ahead of its "
    "tasks); without it such a queue is refused as a likely misspelling.",
)
@remote_options
def drain(
    timeout: float, interval: float, reason: str, queue: str, allow_empty: bool, **settings: Any
) -> None:
    """Pause claims (of --queue only, if given), then wait until active leases, UNKNOWN effects
    and staged-but-uncommitted results (of that queue's tasks) are all zero (exit 0), or until
    --timeout (exit 1)."""
    # Its messages print with soft_wrap: a command to copy (the resume hint) stays on one line
    # in a log or a narrow terminal, never cut by a newline rich would insert.
    console = Console()
    with connect(**remote_settings(settings)) as remote:
        epoch = remote.call(remote.admin.GetEpoch, admin_pb2.GetEpochRequest())
        if queue and not allow_empty:
            _refuse_unknown(remote, queue, epoch)
        _pause(remote, console, reason, queue, epoch)
        started = time.monotonic()
        asked = admin_pb2.DrainStatusRequest(queue=queue)
        status = remote.call(remote.admin.DrainStatus, asked)
        with Live(render(status, 0.0, timeout), console=console, refresh_per_second=4) as live:
            while not status.drained:
                remaining = timeout - (time.monotonic() - started)
                if remaining <= 0:
                    break
                time.sleep(min(interval, remaining))
                status = remote.call(remote.admin.DrainStatus, asked)
                live.update(render(status, time.monotonic() - started, timeout))
        if not console.is_terminal:
            console.line()  # rich leaves the last frame unterminated off a terminal
        if status.drained:
            what = f"queue {queue}" if queue else "pools"
            console.print(f"drained at epoch {status.epoch}: safe to switch {what}", soft_wrap=True)
            console.print(resume_hint(queue), soft_wrap=True)
            return
        left = ", ".join(f"{label} {count}" for label, count in _counts(status) if count)
        if not _paused(status):
            left = ", ".join(filter(None, ["claims are no longer paused", left]))
        console.print(f"[red]not drained after {timeout:.0f}s[/red]: {left}", soft_wrap=True)
        for line in _claimed(remote, queue):
            console.print(f"  {line}", soft_wrap=True)
        if _paused(status):
            console.print(resume_hint(queue), soft_wrap=True)
    raise SystemExit(1)


def _refuse_unknown(remote: Remote, queue: str, epoch: admin_pb2.GetEpochResponse) -> None:
    """A usage error (exit 2, nothing paused) when no task of ``queue`` exists and it is not
    paused: "drained, safe to switch" about a misspelt queue sent a rollback script on while
    the real queue kept claiming."""
    listed = remote.call(
        remote.tasks.ListTasks, tasks_pb2.ListTasksRequest(queue=queue, page_size=1)
    )
    if listed.tasks or queue in epoch.paused_queues:
        return
    raise click.UsageError(
        f"{nothing_found(remote, queue)}: a misspelt --queue? Pass --allow-empty to pause and "
        "drain it anyway"
    )


def _pause(
    remote: Remote, console: Console, reason: str, queue: str, epoch: admin_pb2.GetEpochResponse
) -> None:
    """Pause claims (of ``queue``), keeping a pause already there (as ``epoch`` read it) and
    its reason."""
    if epoch.claims_paused:
        console.print(
            "claims were already paused: their pause and its reason are kept", soft_wrap=True
        )
    elif queue and queue in epoch.paused_queues:
        console.print(
            f"claims of queue {queue} were already paused: that pause is kept", soft_wrap=True
        )
    else:
        request = admin_pb2.PauseClaimsRequest(reason=reason, queue=queue)
        remote.call(remote.admin.PauseClaims, request)


def _claimed(remote: Remote, queue: str) -> list[str]:
    """The tasks (of ``queue``) still CLAIMED (at most ``_LISTED``), with holder and attempt."""
    request = tasks_pb2.ListTasksRequest(
        queue=queue, state=types_pb2.TASK_STATE_CLAIMED, page_size=_LISTED
    )
    reply = remote.call(remote.tasks.ListTasks, request)
    lines = [
        f"still claimed: {t.task_id} by {t.owner_id} (attempt {t.attempt_id}, "
        f"epoch {t.scheduler_epoch})"
        for t in reply.tasks
    ]
    if reply.next_page_token:
        lines.append(f"... and more (only the first {_LISTED} are listed)")
    return lines
