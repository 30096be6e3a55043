"""``coordinator tasks create``: TaskService.CreateTask from the command line.

Every field a producer's SDK can set has an option: the queue, priority and input, the
dependencies, review and replay, the task's own retry policy (each ``--max-attempts``,
``--*-backoff``, ``--backoff-jitter`` or ``--non-retryable-errors`` left out is the queue's,
else the server's default), ``--not-before`` (DELAYED until then) and ``--schedule-to-close``
(FAILED as TIMED_OUT past it, whatever runs). Bad values exit 2 naming the option, nothing
sent. A command of the ``coordinator tasks`` group (cli/tasks.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any, cast

import click

from coordinator.cli import task_views as views
from coordinator.cli.options import F, apply
from coordinator.cli.remote import connect, remote_options, remote_settings
from coordinator.cli.task_options import checked, fresh_key, json_option, task_id_values
from coordinator.domain import retry, validation
from coordinator.domain.idempotency import idempotency_key as check_idempotency_key
from coordinator.domain.when import parse_not_before
from coordinator.errors import InvalidArgument
from coordinator.sdk import TaskInfo, TaskRetryPolicy
from coordinator.sdk._core.requests import create_request


def _read_input(text: str | None, file: IO[bytes] | None) -> bytes:
    """The input bytes from --input or --input-file, bounded by the server's limit."""
    if text is not None and file is not None:
        raise click.UsageError("give --input or --input-file, not both")
    limit = validation.MAX_INPUT_BYTES
    if file is not None:
        data, hint = file.read(limit + 1), "--input-file"
    else:
        data, hint = (text or "").encode(), "--input"
    if text is None and file is None:  # allowed (a task may need no input), but said
        click.echo("note: no --input or --input-file: the task's input is empty", err=True)
    if len(data) > limit:
        raise click.BadParameter(
            f"the input is over the server's limit of {limit} bytes", param_hint=hint
        )
    return data


def _not_before(ctx: click.Context, param: click.Parameter, text: str | None) -> datetime | None:
    """--not-before as the domain parses it; exit 2 naming the option otherwise."""
    if text is None:
        return None
    try:
        return parse_not_before(text, datetime.now(UTC))
    except InvalidArgument as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _codes(ctx: click.Context, param: click.Parameter, text: str | None) -> tuple[str, ...]:
    """--non-retryable-errors: comma-separated error codes."""
    codes = tuple(code.strip() for code in (text or "").split(",") if code.strip())
    if len(codes) > retry.MAX_NON_RETRYABLE:
        raise click.BadParameter(
            f"at most {retry.MAX_NON_RETRYABLE} codes, got {len(codes)}", ctx=ctx, param=param
        )
    return codes


def _unset(name: str, metavar: str, help: str, **kwargs: Any) -> Callable[[F], F]:
    """``--name``, None when left out (the queue's, else the server's value applies)."""
    return click.option(f"--{name}", default=None, metavar=metavar, help=help, **kwargs)


_SECONDS = click.FloatRange(0, retry.MAX_BACKOFF)
_POLICY_OPTIONS: list[Callable[[F], F]] = [
    _unset(
        "max-attempts",
        "N",
        "Attempts the task gets in all (0: unlimited). Default: its queue's, else the server's.",
        type=click.IntRange(0, retry.MAX_ATTEMPTS),
    ),
    _unset(
        "initial-backoff", "SECONDS", "Wait before its first retry (0: at once).", type=_SECONDS
    ),
    _unset(
        "backoff-multiplier",
        "X",
        "Each retry waits this many times longer than the one before.",
        type=click.FloatRange(1, retry.MAX_MULTIPLIER),
    ),
    _unset("max-backoff", "SECONDS", "The longest wait before a retry.", type=_SECONDS),
    _unset(
        "backoff-jitter",
        "FRACTION",
        "Each wait lengthened by up to this fraction of itself.",
        type=click.FloatRange(0, retry.MAX_JITTER),
    ),
    _unset(
        "non-retryable-errors",
        "CODES",
        "Comma-separated error codes (a worker's Fail) that are never retried.",
        callback=_codes,
    ),
    _unset(
        "not-before",
        "WHEN",
        "DELAYED until then: an ISO 8601 time (UTC if it names no zone) or a span from now "
        "(90s, 30m, 2h, 1d).",
        callback=_not_before,
    ),
    _unset(
        "schedule-to-close",
        "SECONDS",
        "FAILED (TIMED_OUT) this long after its creation if not finished, whatever runs.",
        type=click.FloatRange(0, min_open=True),
    ),
]
"""The task's retry policy and its times."""


def policy_options(func: F) -> F:
    """The retry-policy and time options of ``tasks create``: ``func`` gets the policy's as one
    ``retry_policy`` (None when no option set one, so the queue's or server's applies)."""

    @functools.wraps(func)
    def with_policy(**kwargs: Any) -> Any:
        fields = {f.name: kwargs.pop(f.name) for f in dataclasses.fields(TaskRetryPolicy)}
        policy = TaskRetryPolicy(**fields)
        return func(retry_policy=None if policy == TaskRetryPolicy() else policy, **kwargs)

    return apply(cast(F, with_policy), _POLICY_OPTIONS)


@click.command()
@click.option(
    "--queue",
    default="default",
    show_default=True,
    callback=checked(validation.queue),
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
    "--id", "task_id", default="", callback=task_id_values, help="The task id (default: generated)."
)
@click.option(
    "--depends-on",
    multiple=True,
    metavar="TASK_ID",
    callback=task_id_values,
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
    callback=checked(check_idempotency_key),
    help="Repeating the command with the same key returns the first task, never a second one.",
)
@policy_options
@json_option
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
    retry_policy: TaskRetryPolicy | None,
    not_before: datetime | None,
    schedule_to_close: float | None,
    as_json: bool,
    **settings: Any,
) -> None:
    """Create a task (READY; DELAYED until --not-before; WAITING on --depends-on) and print
    its id."""
    request = create_request(
        task_id,
        input=_read_input(input_text, input_file),
        queue=queue,
        priority=priority,
        requires_review=requires_review,
        non_replayable=non_replayable,
        retry_policy=retry_policy,
        not_before=not_before,
        schedule_to_close=schedule_to_close,
        depends_on=depends_on,
    )
    with connect(**remote_settings(settings)) as remote:
        reply = remote.call(
            remote.tasks.CreateTask, request, idempotency_key=idempotency_key or fresh_key()
        )
    task = TaskInfo.from_proto(reply.task)
    if as_json:
        views.echo_json(task)
    else:
        click.echo(task.task_id)
