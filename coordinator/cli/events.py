"""``coordinator events``: print the transition log, one line per event; ``--follow`` live.

Each line starts with the event's etcd revision. A followed stream that breaks (the server
restarts, the network drops) is resumed from the last revision printed + 1, so no event is
printed twice or skipped. Ctrl-C ends it (exit 0).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import click
import grpc

from coordinator.cli.remote import connect, remote_options, remote_settings
from coordinator.sdk._rpc import PRINCIPAL_METADATA, translate
from coordinator.v1 import tasks_pb2, types_pb2

_RESUME_DELAY = 1.0


def format_event(event: tasks_pb2.TaskEvent) -> str:
    """One human line: revision, time, task, from -> to, op, who, attempt, generation, epoch."""
    at = datetime.fromtimestamp(event.at.ToNanoseconds() / 1e9, UTC).isoformat(
        timespec="milliseconds"
    )
    line = (
        f"{event.revision:>8} {at} {event.task_id} "
        f"{_state(event.from_state)}->{_state(event.to_state)} op={event.op} by={event.by}"
    )
    if event.attempt_id:
        line += f" attempt={event.attempt_id} gen={event.claim_generation}"
    if event.scheduler_epoch:
        line += f" epoch={event.scheduler_epoch}"
    if event.detail:
        line += f" ({event.detail})"
    return line


def event_json(event: tasks_pb2.TaskEvent) -> dict[str, Any]:
    """The event as one JSON object."""
    return {
        "revision": event.revision,
        "task_id": event.task_id,
        "op": event.op,
        "from": _state(event.from_state),
        "to": _state(event.to_state),
        "by": event.by,
        "attempt_id": event.attempt_id,
        "claim_generation": event.claim_generation,
        "scheduler_epoch": event.scheduler_epoch,
        "at": event.at.ToNanoseconds() / 1e9,
        "detail": event.detail,
    }


def _state(value: int) -> str:
    if value == 0:
        return "-"
    return types_pb2.TaskState.Name(value).removeprefix("TASK_STATE_")  # type: ignore[arg-type]


@click.command()
@click.option("--task", "task_id", default="", help="Only this task's events.")
@click.option("--root", "root_task_id", default="", help="Only events of this root's tree.")
@click.option("--queue", default="", help="Only events of tasks in this queue.")
@click.option("--op", "ops", multiple=True, help="Only these operations (repeatable).")
@click.option(
    "--from-revision",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="N",
    help="Start at etcd revision N (0: the whole log).",
)
@click.option("--follow", is_flag=True, help="Keep printing new events as they happen.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@remote_options
def events(
    task_id: str,
    root_task_id: str,
    queue: str,
    ops: tuple[str, ...],
    from_revision: int,
    follow: bool,
    as_json: bool,
    **settings: Any,
) -> None:
    """Print task transition events (from, to, op, by, attempt, generation, epoch, time)."""
    remote = remote_settings(settings)
    metadata = ((PRINCIPAL_METADATA, remote["principal"]),)
    request = tasks_pb2.WatchEventsRequest(
        task_id=task_id,
        root_task_id=root_task_id,
        queue=queue,
        ops=list(ops),
        from_revision=from_revision,
        follow=follow,
    )
    last = from_revision - 1
    try:
        while True:
            with connect(**remote) as conn:
                try:
                    for event in conn.tasks.WatchEvents(request, metadata=metadata):
                        click.echo(
                            json.dumps(event_json(event)) if as_json else format_event(event)
                        )
                        last = event.revision
                    return
                except grpc.RpcError as exc:
                    resumable = exc.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    )
                    if not (follow and resumable):
                        raise click.ClickException(str(translate(exc))) from exc
            click.echo(f"# stream broke; resuming from revision {last + 1}", err=True)
            request.from_revision = last + 1
            time.sleep(_RESUME_DELAY)
    except KeyboardInterrupt:
        return
