"""``coordinator tasks``: the producer's and reviewer's verbs (pm / admin roles).

``create`` prints the new task's id; ``list`` pages through ListTasks up to ``--limit``; ``get``
shows a task and its latest attempts (``--attempts``: all of them, a page at a time); ``result``
prints the canonical result of a revision (the payload on stdout, what committed it on
stderr); ``cancel``, ``accept``, ``reject`` and ``deps`` change a task. Every verb takes
``--json`` for scripts and the connection options of coordinator/cli/remote.py.

Bad options exit 2 naming the option (ids and queues are checked here with the server's own
rules, before any call); a refusal by the server exits 1 with its message. Each changing call
carries an idempotency key (``--idempotency-key`` for ``create``, else a fresh one per run), so
the transport retries of one run never apply twice.
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Callable
from typing import IO, Any

import click

from coordinator.cli import task_views as views
from coordinator.cli.remote import Remote, connect, remote_options, remote_settings
from coordinator.cli.task_retry import retry
from coordinator.domain import validation
from coordinator.domain.digests import digest_of
from coordinator.domain.idempotency import idempotency_key as check_idempotency_key
from coordinator.domain.states import TaskState
from coordinator.errors import InvalidArgument
from coordinator.sdk import AttemptInfo, ResultInfo, TaskInfo
from coordinator.v1 import tasks_pb2, types_pb2

LIST_PAGE = 1000  # ListTasks' largest page
ATTEMPTS_PAGE = 1000  # ListAttempts' largest page
MAX_LIMIT = 10_000  # tasks `list` prints at most (they are held to lay out the table)


def _checked(
    check: Callable[[str], str], *, empty_ok: bool = True
) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback that applies one of the server's pure checks to a value (or to each of
    a repeatable option's values): exit 2 naming the option instead of a call refused later.
    ``empty_ok``: an empty value means the option was left out."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        for item in value if isinstance(value, tuple) else (value,):
            if item or (item is not None and not empty_ok):
                try:
                    check(item)
                except InvalidArgument as exc:
                    raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
        return value

    return callback


_task_id = _checked(validation.task_id)
_task_argument = _checked(validation.task_id, empty_ok=False)
_json_option = click.option("--json", "as_json", is_flag=True, help="JSON for scripts.")


def _fresh_key() -> str:
    """An idempotency key for one run of a changing verb (its retries share it)."""
    return f"cli:{secrets.token_hex(16)}"


@click.group()
def tasks() -> None:
    """Create, inspect, review and cancel tasks (pm / admin roles)."""


# --- create ------------------------------------------------------------------------------------


def _read_input(text: str | None, file: IO[bytes] | None) -> bytes:
    """The input bytes from --input or --input-file, bounded by the server's limit."""
    if text is not None and file is not None:
        raise click.UsageError("give --input or --input-file, not both")
    limit = validation.MAX_INPUT_BYTES
    if file is not None:
        data, hint = file.read(limit + 1), "--input-file"
    else:
        data, hint = (text or "").encode(), "--input"
    if len(data) > limit:
        raise click.BadParameter(
            f"the input is over the server's limit of {limit} bytes", param_hint=hint
        )
    return data


@tasks.command()
@click.option(
    "--queue",
    default="default",
    show_default=True,
    callback=_checked(validation.queue),
    help="The queue the task waits in.",
)
@click.option(
    "--priority", type=click.IntRange(0, 999), default=0, show_default=True, help="Higher first."
)
@click.option("--input", "input_text", default=None, metavar="TEXT", help="The input (UTF-8).")
@click.option(
    "--input-file",
    type=click.File("rb"),
    default=None,
    metavar="FILE",
    help="Read the input from FILE ('-': standard input).",
)
@click.option(
    "--id", "task_id", default="", callback=_task_id, help="The task id (default: generated)."
)
@click.option(
    "--depends-on",
    multiple=True,
    metavar="TASK_ID",
    callback=_task_id,
    help="An upstream task (repeatable): the task WAITs until every one is DONE.",
)
@click.option(
    "--requires-review", is_flag=True, help="A commit goes to REVIEW; `tasks accept` makes it DONE."
)
@click.option(
    "--non-replayable",
    is_flag=True,
    help="After an attempt left an uncertain side effect, a human approves any retry.",
)
@click.option(
    "--idempotency-key",
    default="",
    callback=_checked(check_idempotency_key),
    help="Repeating the command with the same key returns the first task, never a second one.",
)
@_json_option
@remote_options
def create(
    queue: str,
    priority: int,
    input_text: str | None,
    input_file: IO[bytes] | None,
    task_id: str,
    depends_on: tuple[str, ...],
    requires_review: bool,
    non_replayable: bool,
    idempotency_key: str,
    as_json: bool,
    **settings: Any,
) -> None:
    """Create a task (READY, or WAITING on --depends-on) and print its id."""
    data = _read_input(input_text, input_file)
    request = tasks_pb2.CreateTaskRequest(
        task_id=task_id,
        queue=queue,
        priority=priority,
        input=data,
        input_digest=digest_of(data),
        requires_review=requires_review,
        non_replayable=non_replayable,
        depends_on=list(depends_on),
    )
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(
            remote.tasks.CreateTask, request, idempotency_key=idempotency_key or _fresh_key()
        )
    task = TaskInfo.from_proto(reply.task)
    if as_json:
        views.echo_json(task)
    else:
        click.echo(task.task_id)


# --- list / get --------------------------------------------------------------------------------


def _list_json(task: TaskInfo) -> dict[str, Any]:
    listed: dict[str, Any] = views.to_json(task)
    for key in ("input", "input_encoding", "attempts"):
        listed.pop(key)
    return listed


@tasks.command("list")
@click.option("--queue", default="", callback=_checked(validation.queue), help="Only this queue.")
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
@_json_option
@remote_options
def list_tasks(queue: str, state: str | None, limit: int, as_json: bool, **settings: Any) -> None:
    """List tasks in id order (without their inputs: `tasks get` shows one)."""
    wanted = types_pb2.TaskState.ValueType(TaskState[state.upper()] if state else 0)
    found: list[TaskInfo] = []
    token = ""
    with connect(**remote_settings(settings)) as remote:
        while True:
            request = tasks_pb2.ListTasksRequest(
                queue=queue,
                state=wanted,
                page_size=min(LIST_PAGE, limit - len(found)),
                page_token=token,
            )
            reply = remote.call(remote.tasks.ListTasks, request)
            found.extend(TaskInfo.from_proto(t) for t in reply.tasks)
            token = reply.next_page_token
            if not token or len(found) >= limit:
                break
        # A full last page leaves a token even when nothing follows: look before saying so. A
        # page may also come back empty with a token (the server stops scanning a sparse
        # filter after a bound): then more may follow.
        more = False
        if token:
            probe = remote.call(
                remote.tasks.ListTasks,
                tasks_pb2.ListTasksRequest(
                    queue=queue, state=wanted, page_size=1, page_token=token
                ),
            )
            more = bool(probe.tasks) or bool(probe.next_page_token)
    if as_json:
        for task in found:
            click.echo(json.dumps(_list_json(task)))
    elif found:
        views.print_table(views.TASK_HEADERS, (views.task_row(t) for t in found))
    else:
        click.echo("no tasks", err=True)
    if more:
        click.echo(
            f"more tasks than --limit {limit}: raise it or filter by --queue/--state", err=True
        )


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
@click.argument("task_id", metavar="TASK_ID", callback=_task_argument)
@click.option(
    "--attempts", "every_attempt", is_flag=True, help="Every attempt, not only the latest 20."
)
@_json_option
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
@click.argument("task_id", metavar="TASK_ID", callback=_task_argument)
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
@_json_option
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


# --- cancel / accept / reject ------------------------------------------------------------------


def _changed(task: TaskInfo, line: str, as_json: bool) -> None:
    if as_json:
        views.echo_json(task)
    else:
        click.echo(line)


@tasks.command()
@click.argument("task_id", metavar="TASK_ID", callback=_task_argument)
@click.option("--reason", default="", help="Why (kept in the event).")
@click.option(
    "--cascade",
    is_flag=True,
    help="Also cancel every WAITING task below it (at most 1000; a FAILED task stays FAILED).",
)
@_json_option
@remote_options
def cancel(task_id: str, reason: str, cascade: bool, as_json: bool, **settings: Any) -> None:
    """Cancel a task: a worker holding it hears CANCELLED at its next call."""
    request = tasks_pb2.CancelTaskRequest(task_id=task_id, reason=reason, cascade=cascade)
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.tasks.CancelTask, request, idempotency_key=_fresh_key())
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


@tasks.command()
@click.argument("task_id", metavar="TASK_ID", callback=_task_argument)
@_revision_option
@_json_option
@remote_options
def accept(task_id: str, revision: int, as_json: bool, **settings: Any) -> None:
    """Accept the committed result of a revision: REVIEW -> DONE."""
    request = tasks_pb2.AcceptRequest(task_id=task_id, revision=revision)
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.tasks.Accept, request, idempotency_key=_fresh_key())
    task = TaskInfo.from_proto(reply.task)
    _changed(task, f"{task.task_id} {task.state}: accepted revision {revision}", as_json)


def _reason(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value.strip():
        raise click.BadParameter("say why the result is rejected", ctx=ctx, param=param)
    return value


@tasks.command()
@click.argument("task_id", metavar="TASK_ID", callback=_task_argument)
@_revision_option
@click.option("--reason", required=True, callback=_reason, help="Why (kept in the event).")
@_json_option
@remote_options
def reject(task_id: str, revision: int, reason: str, as_json: bool, **settings: Any) -> None:
    """Reject the committed result of a revision: a new round opens (revision + 1, READY)."""
    request = tasks_pb2.RejectRequest(task_id=task_id, revision=revision, reason=reason)
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(remote.tasks.Reject, request, idempotency_key=_fresh_key())
    task = TaskInfo.from_proto(reply.task)
    line = f"{task.task_id} {task.state} at revision {task.revision}: rejected revision {revision}"
    _changed(task, line, as_json)


# --- deps --------------------------------------------------------------------------------------


@tasks.command()
@click.argument("task_id", metavar="TASK_ID", callback=_task_argument)
@click.option(
    "--set",
    "upstreams",
    multiple=True,
    metavar="TASK_ID",
    callback=_task_id,
    help="Replace the upstreams with these (repeatable).",
)
@click.option("--clear", is_flag=True, help="Remove every upstream.")
@click.option(
    "--expected-state-version",
    type=click.IntRange(min=1),
    default=None,
    help="Only change a task still at this state_version (`tasks get` shows it).",
)
@_json_option
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
            reply = remote.call(remote.tasks.SetDependencies, request, idempotency_key=_fresh_key())
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


tasks.add_command(retry)
