"""How ``coordinator tasks`` shows tasks, attempts and results: rich tables for people, JSON for
scripts. Pure formatting over the SDK's value types; no calls.

Tables are plain aligned columns, each printed whole (a terminal wraps a long line; nothing is
cut short to fit), without trailing blanks or styles, so the output is stable for grep and
diff. Payloads (input, result) are shown as text only when they are printable UTF-8; JSON
carries them as UTF-8 text or base64, saying which in ``<field>_encoding``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from coordinator.domain.states import TaskState
from coordinator.sdk import AttemptInfo, ResultInfo, TaskInfo, TaskRetryPolicy

_PREVIEW_CHARS = 80  # of an input shown in `tasks get`
_UNBOUNDED_WIDTH = 100_000  # no column is folded or cut


def printable_text(data: bytes) -> str | None:
    """``data`` as text if it is UTF-8 of printable characters (and line breaks, tabs)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if all(ch.isprintable() or ch in "\n\r\t" for ch in text):
        return text
    return None


def shown(text: str) -> str:
    """``text`` safe to print on a terminal: every character Python does not call printable
    but tabs (control characters: an escape sequence in a cancel reason or an error message a
    caller sent; line and paragraph separators that would print a fake event or field line;
    format characters: a right-to-left override that reverses what follows, a zero-width
    space) as ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``."""
    if text.isprintable():
        return text
    return "".join(c if c == "\t" or c.isprintable() else _escaped(c) for c in text)


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def to_json(value: Any) -> Any:
    """A JSON-ready copy of an SDK value: enums by name, times in ISO 8601, durations in
    seconds, bytes as payloads."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            if isinstance(item, bytes):
                out.update(payload_json(field.name, item))
            else:
                out[field.name] = to_json(item)
        return out
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    return value


def payload_json(name: str, data: bytes) -> dict[str, str]:
    """``{name: text, name_encoding: "utf-8"}``, or base64 when the bytes are not UTF-8."""
    try:
        return {name: data.decode("utf-8"), f"{name}_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {name: base64.b64encode(data).decode(), f"{name}_encoding": "base64"}


def echo_json(value: Any) -> None:
    """One JSON document on one line."""
    click.echo(json.dumps(to_json(value), sort_keys=False))


def print_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    show_header: bool = True,
    err: bool = False,
) -> None:
    """Columns without borders (one per header); ``err``: to stderr."""
    table = Table(box=None, pad_edge=False, show_header=show_header)
    for header in headers:
        table.add_column(header, no_wrap=True)
    for row in rows:
        table.add_row(*(Text(shown(cell)) for cell in row))  # cells are data, never markup
    # Never at the terminal's width: rich would cut ids and digests short to fit.
    console = Console(width=_UNBOUNDED_WIDTH, no_color=True, highlight=False, force_terminal=False)
    with console.capture() as captured:
        console.print(table)
    for line in captured.get().splitlines():
        click.echo(line.rstrip(), err=err)


def print_fields(fields: Iterable[tuple[str, str]], *, err: bool = False) -> None:
    """A key/value listing."""
    print_table(("", ""), fields, show_header=False, err=err)


def when(at: datetime | None) -> str:
    """A time to the second, or '-' for never."""
    return at.isoformat(timespec="seconds") if at else "-"


TASK_HEADERS = ("TASK", "QUEUE", "STATE", "REV", "PRIO", "ATTEMPTS", "OWNER", "UPDATED")


def task_row(task: TaskInfo) -> tuple[str, ...]:
    """One line of ``tasks list``."""
    return (
        task.task_id,
        task.queue,
        _state(task),
        str(task.revision),
        str(task.priority),
        _budget(task),
        _holder(task),
        when(task.updated_at),
    )


def _state(task: TaskInfo) -> str:
    """The state, and for a WAITING task what `tasks get` would say of it: blocked by a FAILED
    or CANCELLED upstream, past its deadline."""
    marks = [m for m, on in (("blocked", task.blocked_by), ("overdue", task.overdue_at)) if on]
    return f"{task.state.name}({','.join(marks)})" if marks else task.state.name


def task_fields(task: TaskInfo) -> list[tuple[str, str]]:
    """The key/value lines of ``tasks get``."""
    text = printable_text(task.input)
    if text is None:
        shown = f"<{len(task.input)} bytes, not printable>"
    elif len(text) > _PREVIEW_CHARS:
        shown = repr(text[:_PREVIEW_CHARS]) + f"... ({len(task.input)} bytes)"
    else:
        shown = repr(text)
    return [
        ("task", task.task_id),
        ("queue", task.queue),
        ("state", task.state.name),
        ("revision", str(task.revision)),
        ("priority", str(task.priority)),
        ("state_version", str(task.state_version)),
        ("input", shown),
        ("input_digest", task.input_digest),
        ("depends_on", ", ".join(task.depends_on) or "-"),
        ("requires_review", _yes(task.requires_review)),
        ("non_replayable", _yes(task.non_replayable)),
        ("root / parent", f"{task.root_task_id or '-'} / {task.parent_task_id or '-'}"),
        ("thread", task.thread_key or "-"),
        ("attempt", f"{task.attempt} {task.attempt_id}".rstrip()),
        ("attempts_counted", _counted(task)),
        ("retry_policy", _policy(task.retry_policy)),
        ("last_error", task.last_error or "-"),
        ("dead_letter", task.dead_letter_reason.name if task.dead_letter_reason else "-"),
        ("next_eligible", when(task.next_eligible_at)),
        ("deadline", when(task.deadline)),
        ("blocked_by", ", ".join(task.blocked_by) or "-"),
        ("overdue", f"{when(task.overdue_at)} (deadline waived)" if task.overdue_at else "-"),
        ("owner", _holder(task) if task.state is TaskState.CLAIMED else _last_owner(task)),
        ("generation / epoch", f"{task.claim_generation} / {task.scheduler_epoch}"),
        ("cancel_generation", str(task.cancel_generation)),
        ("result", f"{task.result_commit_id} {task.result_digest}" if task.result_digest else "-"),
        ("checkpoint", _size(task.checkpoint_size)),
        ("created / updated", f"{when(task.created_at)} / {when(task.updated_at)}"),
    ]


ATTEMPT_HEADERS = ("#", "ATTEMPT", "OWNER", "GEN", "EPOCH", "STARTED", "ENDED", "END", "CHECKPOINT")


def attempt_row(attempt: AttemptInfo) -> tuple[str, ...]:
    """One line of the attempts of ``tasks get``."""
    return (
        str(attempt.attempt),
        attempt.attempt_id,
        attempt.owner_id,
        str(attempt.claim_generation),
        str(attempt.scheduler_epoch),
        when(attempt.started_at),
        when(attempt.ended_at),
        f"{attempt.end.name}:{attempt.error_code}" if attempt.error_code else attempt.end.name,
        _size(attempt.checkpoint_size),
    )


def result_fields(result: ResultInfo) -> list[tuple[str, str]]:
    """The key/value lines that ``tasks result`` prints about the payload."""
    return [
        ("task", f"{result.task_id} revision {result.revision}"),
        ("commit", result.commit_id),
        ("attempt", f"{result.attempt_id} by {result.owner_id}"),
        ("generation / epoch", f"{result.claim_generation} / {result.scheduler_epoch}"),
        ("committed", when(result.committed_at)),
        ("digest", result.result_digest),
        ("size", f"{len(result.result)} bytes"),
        ("ref", result.result_ref or "-"),
        ("evidence", ", ".join(result.evidence) or "-"),
    ]


def _counted(task: TaskInfo) -> str:
    """The attempts counted against the task's retry policy, of how many (0: unlimited)."""
    most = task.retry_policy.max_attempts
    return (
        f"{task.attempts_counted} of {most or 'unlimited'}"
        if most is not None
        else str(task.attempts_counted)
    )


def _holder(task: TaskInfo) -> str:
    """Who holds the task: its owner while CLAIMED, else nobody (the record keeps the last
    attempt's owner, which in a READY task's row read like a holder)."""
    return (task.owner_id or "-") if task.state is TaskState.CLAIMED else "-"


def _last_owner(task: TaskInfo) -> str:
    return f"- (the last attempt's: {task.owner_id})" if task.owner_id else "-"


def _budget(task: TaskInfo) -> str:
    """The ATTEMPTS column: counted of the policy's most ("2/5"; "2/unlimited"); the count
    alone when the answer carries no policy."""
    most = task.retry_policy.max_attempts
    if most is None:
        return str(task.attempts_counted)
    return f"{task.attempts_counted}/{most or 'unlimited'}"


def _policy(policy: TaskRetryPolicy) -> str:
    """A resolved retry policy on one line: the waits, then the codes never retried."""
    if policy.max_attempts is None:
        return "-"
    waits = (
        f"backoff {_seconds(policy.initial_backoff)} x{policy.backoff_multiplier:g} up to "
        f"{_seconds(policy.max_backoff)}, jitter {policy.backoff_jitter or 0:g}"
    )
    never = ", ".join(policy.non_retryable_errors)
    return f"{waits}; never retried: {never}" if never else waits


def _seconds(span: timedelta | None) -> str:
    return f"{span.total_seconds():g}s" if span is not None else "-"


def _size(checkpoint_size: int | None) -> str:
    """A checkpoint's size in bytes, '-' for none (or not known)."""
    return f"{checkpoint_size} bytes" if checkpoint_size else "-"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
