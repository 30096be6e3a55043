"""``coordinator drain``: pause claims and wait, showing progress, until nothing is left running.

Drained means: claims are paused, no claim holds a live lease, no side effect is UNKNOWN (or
PREPARED and never recorded), and no staged result can still be committed. Only then may an
operator switch pools (the seed's safe rollback). On timeout the command exits 1 and lists what
is left, so a script can stop there.
"""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from coordinator.cli.remote import Remote, connect, remote_options, remote_settings
from coordinator.v1 import admin_pb2, tasks_pb2, types_pb2

_LISTED = 20  # claimed tasks named on timeout; the counts say how many there are in all

RESUME_HINT = "claims stay paused: `coordinator claims resume` lets workers claim again"
"""What drain says last whenever it leaves claims paused (it never resumes them itself)."""


def render(status: admin_pb2.DrainStatusResponse, elapsed: float, timeout: float) -> Table:
    """The progress table: what still runs, and how long we have waited."""
    table = Table(title="coordinator drain", show_header=False, min_width=44)
    table.add_row("epoch", str(status.epoch))
    table.add_row("claims", "paused" if status.claims_paused else "[red]accepted[/red]")
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
@remote_options
def drain(timeout: float, interval: float, reason: str, **settings: Any) -> None:
    """Pause claims, then wait until active leases, UNKNOWN effects and staged-but-uncommitted
    results are all zero (exit 0), or until --timeout (exit 1)."""
    console = Console()
    with connect(**remote_settings(settings)) as remote:
        if remote.call(remote.admin.GetEpoch, admin_pb2.GetEpochRequest()).claims_paused:
            console.print("claims were already paused: their pause and its reason are kept")
        else:
            remote.call(remote.admin.PauseClaims, admin_pb2.PauseClaimsRequest(reason=reason))
        started = time.monotonic()
        status = remote.call(remote.admin.DrainStatus, admin_pb2.DrainStatusRequest())
        with Live(render(status, 0.0, timeout), console=console, refresh_per_second=4) as live:
            while not status.drained:
                remaining = timeout - (time.monotonic() - started)
                if remaining <= 0:
                    break
                time.sleep(min(interval, remaining))
                status = remote.call(remote.admin.DrainStatus, admin_pb2.DrainStatusRequest())
                live.update(render(status, time.monotonic() - started, timeout))
        if not console.is_terminal:
            console.line()  # rich leaves the last frame unterminated off a terminal
        if status.drained:
            console.print(f"drained at epoch {status.epoch}: safe to switch pools")
            console.print(RESUME_HINT)
            return
        left = ", ".join(f"{label} {count}" for label, count in _counts(status) if count)
        if not status.claims_paused:
            left = ", ".join(filter(None, ["claims are no longer paused", left]))
        console.print(f"[red]not drained after {timeout:.0f}s[/red]: {left}")
        for line in _claimed(remote):
            console.print(f"  {line}")
        if status.claims_paused:
            console.print(RESUME_HINT)
    raise SystemExit(1)


def _claimed(remote: Remote) -> list[str]:
    """The tasks still CLAIMED (at most ``_LISTED``), with their holder and attempt."""
    request = tasks_pb2.ListTasksRequest(state=types_pb2.TASK_STATE_CLAIMED, page_size=_LISTED)
    reply = remote.call(remote.tasks.ListTasks, request)
    lines = [
        f"still claimed: {t.task_id} by {t.owner_id} (attempt {t.attempt_id}, "
        f"epoch {t.scheduler_epoch})"
        for t in reply.tasks
    ]
    if reply.next_page_token:
        lines.append(f"... and more (only the first {_LISTED} are listed)")
    return lines
