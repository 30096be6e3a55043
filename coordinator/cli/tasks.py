"""``coordinator tasks``: the producer's and reviewer's verbs (pm / admin roles).

``create`` prints the new task's id; ``list`` pages through ListTasks up to ``--limit``; ``get``
shows a task and its latest attempts (``--attempts``: all of them, a page at a time); ``result``
prints the canonical result of a revision (the payload on stdout, what committed it on
stderr); ``cancel``, ``accept``, ``reject`` and ``deps`` change a task (cli/task_changes.py),
``retry`` sends FAILED ones back (cli/task_retry.py). Every verb takes
``--json`` for scripts and the connection options of coordinator/cli/remote.py.

Bad options exit 2 naming the option (ids and queues are checked here with the server's own
rules, before any call); a refusal by the server exits 1 with its message. Each changing call
carries an idempotency key (``--idempotency-key`` for ``create``, else a fresh one per run), so
the transport retries of one run never apply twice.
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

import click

from coordinator.cli import task_views as views
from coordinator.cli.remote import Remote, connect, remote_options, remote_settings
from coordinator.cli.task_changes import accept, cancel, deps, reject
from coordinator.cli.task_create import create
from coordinator.cli.task_options import (
    checked,
    json_option,
    task_id_argument,
)
from coordinator.cli.task_retry import retry
from coordinator.domain import validation
from coordinator.domain.states import TaskState
from coordinator.errors import CoordinatorError
from coordinator.sdk import AttemptInfo, ResultInfo, TaskInfo
from coordinator.v1 import admin_pb2, tasks_pb2, types_pb2

LIST_PAGE = 1000  # ListTasks' largest page
ATTEMPTS_PAGE = 1000  # ListAttempts' largest page
MAX_LIMIT = 10_000  # tasks `list` prints at most (they are held to lay out the table)


@click.group()
def tasks() -> None:
    """Create, inspect, review and cancel tasks (pm / admin roles)."""


# --- list / get --------------------------------------------------------------------------------


def _list_json(task: TaskInfo) -> dict[str, Any]:
    listed: dict[str, Any] = views.to_json(task)
    for key in ("input", "input_encoding", "attempts"):
        listed.pop(key)
    return listed


@tasks.command("list")
@click.option("--queue", default="", callback=checked(validation.queue), help="Only this queue.")
@click.option(
    "--state",
    type=click.Choice([s.name for s in TaskState], case_sensitive=False),
    default=None,
    help="Only tasks in this state.",
)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIMIT),
    default=100,
    show_default=True,
    help="Print at most this many (a note on stderr says when more match).",
)
@click.option(
    "--blocked",
    is_flag=True,
    help="Only WAITING tasks blocked by a FAILED or CANCELLED upstream (a dead letter's "
    "dependents: `tasks retry` the upstream, or cancel them).",
)
@click.option(
    "--overdue",
    is_flag=True,
    help="Only tasks marked overdue: their schedule_to_close passed while they were WAITING.",
)
@json_option
@remote_options
def list_tasks(
    queue: str,
    state: str | None,
    limit: int,
    blocked: bool,
    overdue: bool,
    as_json: bool,
    **settings: Any,
) -> None:
    """List tasks in id order (without their inputs: `tasks get` shows one).

    STATE marks a WAITING task blocked by a FAILED or CANCELLED upstream, or past its
    deadline: WAITING(blocked), WAITING(overdue)."""
    wanted = types_pb2.TaskState.ValueType(TaskState[state.upper()] if state else 0)

    def page(size: int, token: str) -> tasks_pb2.ListTasksRequest:
        return tasks_pb2.ListTasksRequest(
            queue=queue,
            state=wanted,
            blocked=blocked,
            overdue=overdue,
            page_size=size,
            page_token=token,
        )

    found: list[TaskInfo] = []
    token = ""
    with connect(**remote_settings(settings)) as remote:
        while True:
            reply = remote.call(
                remote.tasks.ListTasks, page(min(LIST_PAGE, limit - len(found)), token)
            )
            found.extend(TaskInfo.from_proto(t) for t in reply.tasks)
            token = reply.next_page_token
            if not token or len(found) >= limit:
                break
        # A full last page leaves a token even when nothing follows: look before saying so. A
        # page may also come back empty with a token (the server stops scanning a sparse
        # filter after a bound): then more may follow.
        more = False
        if token:
            probe = remote.call(remote.tasks.ListTasks, page(1, token))
            more = bool(probe.tasks) or bool(probe.next_page_token)
        nothing = "" if found else nothing_found(remote, queue, _matching(state, blocked, overdue))
    if as_json:
        for task in found:
            click.echo(json.dumps(_list_json(task)))
    elif found:
        views.print_table(views.TASK_HEADERS, (views.task_row(t) for t in found))
    else:
        click.echo(nothing, err=True)
    if more:
        narrower = [f for f, given in (("--queue", queue), ("--state", state)) if not given]
        how = f" or filter by {'/'.join(narrower)}" if narrower else ""
        said = f"more tasks than --limit {limit} (at most {MAX_LIMIT}): raise it{how}"
        click.echo(said, err=True)


def _matching(state: str | None, blocked: bool, overdue: bool) -> str:
    """What the filters ask for, as an empty answer names it ("READY tasks", "blocked tasks")."""
    kinds = [k for k, given in (("blocked", blocked), ("overdue", overdue)) if given]
    return " ".join([*kinds, *([state.upper()] if state else []), "tasks"])


def nothing_found(remote: Remote, queue: str, matching: str = "tasks") -> str:
    """What an empty list says (``matching``: "READY tasks", ...): with ``--queue`` and no
    other filter, the queues that have work now (GetStats), so a misspelt name shows (said only
    to a caller allowed to read them)."""
    if not queue:
        return f"no {matching}"
    if matching != "tasks":  # the queue may well exist: nothing matches the filter in it
        return f"no {matching} in queue {queue!r}"
    try:
        stats = remote.rpc.call(remote.admin.GetStats, admin_pb2.GetStatsRequest())
    except CoordinatorError:
        return f"no tasks in queue {queue!r}"
    busy = [q.queue for q in stats.queues]
    if not busy:
        return f"no tasks in queue {queue!r} (no queue has a ready or claimed task now)"
    shown = ", ".join(busy[:10]) + (", ..." if len(busy) > 10 or stats.queues_left_out else "")
    return f"no tasks in queue {queue!r}; queues with ready or claimed tasks now: {shown}"


def _all_attempts(remote: Remote, task_id: str) -> Any:
    """Every attempt of the task, oldest first, one ListAttempts page at a time."""
    token = ""
    while True:
        request = tasks_pb2.ListAttemptsRequest(
            task_id=task_id, page_size=ATTEMPTS_PAGE, page_token=token
        )
        reply = remote.call(remote.tasks.ListAttempts, request)
        yield [AttemptInfo.from_proto(a) for a in reply.attempts]
        token = reply.next_page_token
        if not token:
            return


@tasks.command()
@click.argument("task_id", metavar="TASK_ID", callback=task_id_argument)
@click.option(
    "--attempts", "every_attempt", is_flag=True, help="Every attempt, not only the latest 20."
)
@json_option
@remote_options
def get(task_id: str, every_attempt: bool, as_json: bool, **settings: Any) -> None:
    """Show a task and its latest attempts."""
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.tasks.GetTask, tasks_pb2.GetTaskRequest(task_id=task_id))
        task = TaskInfo.from_proto(reply.task, tuple(reply.attempts))
        pages = _all_attempts(remote, task_id) if every_attempt else iter([list(task.attempts)])
        if as_json:
            _get_json(task, reply.attempt_count, pages)
        else:
            _get_table(task, reply.attempt_count, pages, every_attempt=every_attempt)


def _get_table(task: TaskInfo, count: int, pages: Any, *, every_attempt: bool) -> None:
    views.print_fields(views.task_fields(task))
    line = f"attempts: {count}"
    if count > len(task.attempts) and not every_attempt:
        line += f" (the latest {len(task.attempts)}; --attempts lists every one)"
    click.echo()
    click.echo(line)
    for number, page in enumerate(pages):
        if page:  # a table per page: a history has no bound, a page has
            rows = (views.attempt_row(a) for a in page)
            views.print_table(views.ATTEMPT_HEADERS, rows, show_header=number == 0)


def _get_json(task: TaskInfo, count: int, pages: Any) -> None:
    """One JSON document, written a page of attempts at a time (a history has no bound)."""
    body: dict[str, Any] = views.to_json(task)
    del body["attempts"]
    head = json.dumps({"task": body, "attempt_count": count})
    click.echo(head[:-1] + ', "attempts": [', nl=False)
    first = True
    for page in pages:
        for attempt in page:
            click.echo(("" if first else ", ") + json.dumps(views.to_json(attempt)), nl=False)
            first = False
    click.echo("]}")


# --- result ------------------------------------------------------------------------------------


@tasks.command()
@click.argument("task_id", metavar="TASK_ID", callback=task_id_argument)
@click.option(
    "--revision",
    type=click.IntRange(min=0),
    default=0,
    help="The task revision (default: its current one).",
)
@click.option(
    "--out",
    type=click.File("wb", lazy=True),
    default=None,
    metavar="FILE",
    help="Write the payload to FILE ('-': stdout, even when it is not text).",
)
@json_option
@remote_options
def result(
    task_id: str, revision: int, out: IO[bytes] | None, as_json: bool, **settings: Any
) -> None:
    """Print the committed result of a task revision: the payload on stdout (text only; else
    --out), the commit, attempt, fence, digest and evidence on stderr.

    On a terminal a payload without a final newline gets one, so the prompt does not stick to
    it; piped or redirected, stdout is the payload's exact bytes."""
    if as_json and out is not None:
        raise click.UsageError("--json carries the payload itself: drop --out")
    request = tasks_pb2.GetResultRequest(task_id=task_id, revision=revision)
    with connect(**remote_settings(settings)) as remote:
        found = ResultInfo.from_proto(remote.call(remote.tasks.GetResult, request).result)
    if as_json:
        views.echo_json(found)
        return
    payload = found.result
    if out is None and views.printable_text(payload) is None:
        raise click.UsageError(
            f"the result of {task_id} revision {found.revision} is {len(payload)} bytes of "
            "binary data: write it to a file with --out FILE"
        )
    views.print_fields(views.result_fields(found), err=True)
    if out is not None:
        out.write(payload)
        click.echo(f"wrote {len(payload)} bytes to {out.name}", err=True)
    else:
        on_terminal = sys.stdout.isatty()
        click.echo(payload, nl=on_terminal and not payload.endswith(b"\n"))


for command in (create, cancel, accept, reject, deps, retry):
    tasks.add_command(command)
