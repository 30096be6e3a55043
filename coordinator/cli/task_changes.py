"""``coordinator tasks cancel | accept | reject | deps``: the verbs that change a task.

``cancel`` ends a task (``--cascade``: and every WAITING task below it); ``accept`` and
``reject`` review a revision's committed result; ``deps`` shows a task's upstreams, and with
``--set`` or ``--clear`` replaces them. Each change carries a fresh idempotency key, so the
transport retries of one run never apply twice. Commands of the ``coordinator tasks`` group
(cli/tasks.py).
"""

from __future__ import annotations

import json
from typing import Any

import click

from coordinator.cli import task_views as views
from coordinator.cli.remote import Remote, connect, remote_options, remote_settings
from coordinator.cli.task_options import fresh_key, json_option, task_id_argument, task_id_values
from coordinator.domain.states import TaskState
from coordinator.sdk import TaskInfo
from coordinator.v1 import tasks_pb2

# --- cancel / accept / reject ------------------------------------------------------------------


def _changed(task: TaskInfo, line: str, as_json: bool) -> None:
    """Print a changed task: ``line``, or the task as JSON."""
    if as_json:
        views.echo_json(task)
    else:
        click.echo(line)


@click.command()
@click.argument("task_id", metavar="TASK_ID", callback=task_id_argument)
@click.option("--reason", default="", help="Why (kept in the event).")
@click.option(
    "--cascade",
    is_flag=True,
    help="Also cancel every WAITING task below it (at most 1000; a FAILED task stays FAILED).",
)
@json_option
@remote_options
def cancel(task_id: str, reason: str, cascade: bool, as_json: bool, **settings: Any) -> None:
    """Cancel a task: a worker holding it hears CANCELLED at its next call."""
    request = tasks_pb2.CancelTaskRequest(task_id=task_id, reason=reason, cascade=cascade)
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.tasks.CancelTask, request, idempotency_key=fresh_key())
    task = TaskInfo.from_proto(reply.task)
    line = f"{task.task_id} {task.state} (cancel_generation {task.cancel_generation})"
    if cascade:
        line += "\ncancelled below it: " + (", ".join(reply.cascaded) or "nothing")
    _changed(task, line, as_json)


_revision_option = click.option(
    "--revision",
    type=click.IntRange(min=1),
    required=True,
    help="The revision whose result you reviewed (`tasks result` shows it).",
)


@click.command()
@click.argument("task_id", metavar="TASK_ID", callback=task_id_argument)
@_revision_option
@json_option
@remote_options
def accept(task_id: str, revision: int, as_json: bool, **settings: Any) -> None:
    """Accept the committed result of a revision: REVIEW -> DONE."""
    request = tasks_pb2.AcceptRequest(task_id=task_id, revision=revision)
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.tasks.Accept, request, idempotency_key=fresh_key())
    task = TaskInfo.from_proto(reply.task)
    _changed(task, f"{task.task_id} {task.state}: accepted revision {revision}", as_json)


def _reason(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value.strip():
        raise click.BadParameter("say why the result is rejected", ctx=ctx, param=param)
    return value


@click.command()
@click.argument("task_id", metavar="TASK_ID", callback=task_id_argument)
@_revision_option
@click.option("--reason", required=True, callback=_reason, help="Why (kept in the event).")
@json_option
@remote_options
def reject(task_id: str, revision: int, reason: str, as_json: bool, **settings: Any) -> None:
    """Reject the committed result of a revision: a new round opens (revision + 1, READY)."""
    request = tasks_pb2.RejectRequest(task_id=task_id, revision=revision, reason=reason)
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.tasks.Reject, request, idempotency_key=fresh_key())
    task = TaskInfo.from_proto(reply.task)
    line = f"{task.task_id} {task.state} at revision {task.revision}: rejected revision {revision}"
    _changed(task, line, as_json)


# --- deps --------------------------------------------------------------------------------------


@click.command()
@click.argument("task_id", metavar="TASK_ID", callback=task_id_argument)
@click.option(
    "--set",
    "upstreams",
    multiple=True,
    metavar="TASK_ID",
    callback=task_id_values,
    help="Replace the upstreams with these (repeatable).",
)
@click.option("--clear", is_flag=True, help="Remove every upstream.")
@click.option(
    "--expected-state-version",
    type=click.IntRange(min=1),
    default=None,
    help="Only change a task still at this state_version (`tasks get` shows it).",
)
@json_option
@remote_options
def deps(
    task_id: str,
    upstreams: tuple[str, ...],
    clear: bool,
    expected_state_version: int | None,
    as_json: bool,
    **settings: Any,
) -> None:
    """Show a task's upstreams and their states; --set or --clear replaces them (the task must
    be READY or WAITING)."""
    if upstreams and clear:
        raise click.UsageError("--set and --clear exclude each other")
    if expected_state_version is not None and not (upstreams or clear):
        raise click.UsageError("--expected-state-version goes with --set or --clear")
    with connect(**remote_settings(settings)) as remote:
        if upstreams or clear:
            request = tasks_pb2.SetDependenciesRequest(
                task_id=task_id,
                depends_on=list(upstreams),
                expected_state_version=expected_state_version or 0,
            )
            reply = remote.call(remote.tasks.SetDependencies, request, idempotency_key=fresh_key())
        else:
            reply = remote.call(remote.tasks.GetTask, tasks_pb2.GetTaskRequest(task_id=task_id))
        task = TaskInfo.from_proto(reply.task)
        states = [(up, _state_of(remote, up)) for up in task.depends_on]
    if as_json:
        upstream = [{"task_id": up, "state": state} for up, state in states]
        click.echo(
            json.dumps({"task_id": task.task_id, "state": task.state.name, "depends_on": upstream})
        )
        return
    click.echo(f"{task.task_id} {task.state}")
    if states:
        views.print_table(("UPSTREAM", "STATE"), ((up, state or "-") for up, state in states))
    else:
        click.echo("no upstreams")


def _state_of(remote: Remote, task_id: str) -> str | None:
    """An upstream's state; None if it no longer exists."""
    reply = remote.call_or_none(remote.tasks.GetTask, tasks_pb2.GetTaskRequest(task_id=task_id))
    return None if reply is None else TaskState(reply.task.state).name
