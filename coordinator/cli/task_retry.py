"""``coordinator tasks retry TASK_ID``: send a FAILED task (the dead letter) back to the queue.

TaskService.RetryTask (pm or admin): READY again with a fresh attempt budget, one "retry" event
naming the caller and ``--reason``; ``--schedule-to-close`` gives it a new deadline (required
for a task whose deadline passed). Repeating it is harmless. Prints the task's new state.
A command of the ``coordinator tasks`` group (cli/tasks.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import click

from coordinator.cli.remote import connect, remote_options, remote_settings
from coordinator.v1 import tasks_pb2, types_pb2


@click.command()
@click.argument("task_id")
@click.option("--reason", default="", help="Why (recorded in the task's event).")
@click.option(
    "--schedule-to-close",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="A new deadline, this long from now (a task that TIMED_OUT needs one).",
)
@remote_options
def retry(task_id: str, reason: str, schedule_to_close: float | None, **settings: Any) -> None:
    """Send a FAILED task back to READY with a fresh attempt budget."""
    request = tasks_pb2.RetryTaskRequest(task_id=task_id, reason=reason)
    if schedule_to_close is not None:
        request.schedule_to_close.FromTimedelta(timedelta(seconds=schedule_to_close))
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.tasks.RetryTask, request)
    task = reply.task
    state = types_pb2.TaskState.Name(task.state).removeprefix("TASK_STATE_")
    click.echo(
        f"{task.task_id} {state} (attempt {task.attempt}, fresh budget of "
        f"{task.retry_policy.max_attempts or 'unlimited'} attempts)"
    )
