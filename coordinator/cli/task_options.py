"""What the ``coordinator tasks`` verbs share: the server's own checks as click callbacks, the
``--json`` flag and the idempotency key of one run (cli/tasks.py, cli/task_changes.py)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import click

from coordinator.domain import validation
from coordinator.errors import InvalidArgument


def checked(
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


task_id_values = checked(validation.task_id)
"""Checks each value of a task-id option (empty: left out)."""
task_id_argument = checked(validation.task_id, empty_ok=False)
"""Checks a TASK_ID argument."""
json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="JSON for scripts (a list: one JSON object per line).",
)
"""``--json``: JSON for scripts instead of text (a list prints one object per line)."""


def fresh_key() -> str:
    """An idempotency key for one run of a changing verb (its retries share it)."""
    return f"cli:{secrets.token_hex(16)}"
