"""``coordinator tasks retry``: send FAILED tasks (dead letters) back to the queue.

``retry TASK_ID``: TaskService.RetryTask (pm or admin): READY again with a fresh attempt
budget, one "retry" event naming the caller and ``--reason``; ``--schedule-to-close`` gives it a
new deadline (required for a task whose deadline passed). Repeating it is harmless. Prints the
task's new state.

``retry --queue Q [--state FAILED] [--error-code C] [--since T] [--limit N] [--dry-run]``: the
bulk recovery after a bad deploy, TaskService.RetryTasks a bounded page at a time (each page
with its own idempotency key, so a transport retry applies once). It prints one line per task
(``retried``, ``would retry`` or ``skipped ...: why``) and a summary; a run stopped by
``--limit`` prints the ``--page-token`` to resume with. Re-running the same command is safe too:
a retried task is READY, so it no longer matches. A command of the ``coordinator tasks`` group
(cli/tasks.py).
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from coordinator.cli.remote import Remote, connect, remote_options, remote_settings
from coordinator.domain.when import parse_since
from coordinator.errors import InvalidArgument
from coordinator.v1 import tasks_pb2, types_pb2

_PAGE = 500  # tasks one RetryTasks call retries (the server allows 1000)


def _since(text: str) -> datetime:
    """--since as the domain parses it; exit 2 naming the option otherwise."""
    try:
        return parse_since(text, datetime.now(UTC))
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None


@click.command()
@click.argument("task_id", required=False)
@click.option("--queue", default=None, help="Retry the matching dead letters of this queue.")
@click.option(
    "--state",
    type=click.Choice(["FAILED"], case_sensitive=False),
    default="FAILED",
    show_default=True,
    help="With --queue: the state picked (only a dead letter can be retried).",
)
@click.option("--error-code", default="", help="With --queue: only tasks that failed with it.")
@click.option(
    "--since",
    default=None,
    metavar="TIME",
    help="With --queue: only tasks failed since (ISO or 2h).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="With --queue: retry at most N tasks in this run (default: every match).",
)
@click.option("--page-token", default="", help="With --queue: resume where a run stopped.")
@click.option("--dry-run", is_flag=True, help="With --queue: list what would be retried.")
@click.option("--reason", default="", help="Why (recorded in each task's event).")
@click.option(
    "--schedule-to-close",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="A new deadline, this long from now (a task that TIMED_OUT needs one).",
)
@remote_options
def retry(
    task_id: str | None,
    queue: str | None,
    state: str,
    error_code: str,
    since: str | None,
    limit: int | None,
    page_token: str,
    dry_run: bool,
    reason: str,
    schedule_to_close: float | None,
    **settings: Any,
) -> None:
    """Send a FAILED task (TASK_ID), or a queue's FAILED tasks (--queue), back to READY with a
    fresh attempt budget."""
    bulk_only = error_code or since or limit or page_token or dry_run
    if task_id and queue:
        raise click.UsageError("give TASK_ID or --queue, not both")
    if not task_id and not queue:
        raise click.UsageError("give a TASK_ID, or --queue Q to retry a queue's dead letters")
    if task_id and bulk_only:
        raise click.UsageError(
            "--error-code, --since, --limit, --page-token and --dry-run go with --queue"
        )
    with connect(**remote_settings(settings)) as remote:
        if task_id:
            _retry_one(remote, task_id, reason, schedule_to_close)
            return
        request = tasks_pb2.RetryTasksRequest(
            queue=queue or "",
            state=types_pb2.TASK_STATE_FAILED,
            error_code=error_code,
            dry_run=dry_run,
            reason=reason,
        )
        if since:
            request.failed_since.FromDatetime(_since(since))
        if schedule_to_close is not None:
            request.schedule_to_close.FromTimedelta(timedelta(seconds=schedule_to_close))
        _retry_pages(remote, request, page_token, limit)


def _retry_one(remote: Remote, task_id: str, reason: str, schedule_to_close: float | None) -> None:
    """RetryTask on one task; prints its new state."""
    request = tasks_pb2.RetryTaskRequest(task_id=task_id, reason=reason)
    if schedule_to_close is not None:
        request.schedule_to_close.FromTimedelta(timedelta(seconds=schedule_to_close))
    task = remote.call(remote.tasks.RetryTask, request).task
    state = types_pb2.TaskState.Name(task.state).removeprefix("TASK_STATE_")
    click.echo(
        f"{task.task_id} {state} (next attempt #{task.attempt + 1}, a fresh budget of "
        f"{task.retry_policy.max_attempts or 'unlimited'} attempts)"
    )


def _retry_pages(
    remote: Remote, request: tasks_pb2.RetryTasksRequest, token: str, limit: int | None
) -> None:
    """RetryTasks page after page until the scan ends or ``limit`` tasks were retried; one
    line per task, then the summary (and the token to resume with when stopped early)."""
    retried = skipped = scanned = 0
    verb = "would retry" if request.dry_run else "retried"
    while True:
        left = _PAGE if limit is None else min(_PAGE, limit - retried - skipped)
        request.limit, request.page_token = left, token
        key = f"cli:{secrets.token_hex(16)}"
        reply = remote.call(remote.tasks.RetryTasks, request, idempotency_key=key)
        for task_id in reply.retried:
            click.echo(f"{verb} {task_id}")
        for skip in reply.skipped:
            click.echo(f"skipped {skip.task_id}: {skip.reason}")
        retried += len(reply.retried)
        skipped += len(reply.skipped)
        scanned += reply.scanned
        token = reply.next_page_token
        if not token or (limit is not None and retried + skipped >= limit):
            break
    # Scanned: every task record read in id order to find them, of any queue.
    click.echo(f"{verb} {retried}, skipped {skipped} of {request.queue} ({scanned} tasks read)")
    if token:
        click.echo(f"more may match: resume with --page-token {token}")
