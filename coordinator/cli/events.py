"""``coordinator events``: print the transition log, one line per event; ``--follow`` live.

Each line starts with the event's etcd revision. A followed stream that breaks (the server
restarts, the network drops, or the server ended it for reading too slowly) is resumed after the
position of the last event printed (several events can share a revision), so no event is
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
from coordinator.cli.task_views import shown
from coordinator.sdk import PRINCIPAL_METADATA
from coordinator.sdk._status import translate
from coordinator.v1 import tasks_pb2, types_pb2

_RESUME_DELAY = 1.0
# Statuses after which a followed stream resumes: the server or the network went away, or the
# server ended a stream that read too slowly (it resumes after the last event printed).
_RESUMABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
)


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
        "position": {
            "revision": event.position.revision,
            "task_id": event.position.task_id,
            "prev_state_version": event.position.prev_state_version,
        },
    }


def _position(position: tasks_pb2.EventPosition) -> str:
    return f"{position.revision}/{position.task_id}/{position.prev_state_version}"


def _parse_position(text: str) -> tasks_pb2.EventPosition:
    revision, _, rest = text.partition("/")
    task_id, _, version = rest.rpartition("/")
    try:
        return tasks_pb2.EventPosition(
            revision=int(revision), task_id=task_id, prev_state_version=int(version)
        )
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not REV/TASK/VERSION (e.g. 1042/report-7/1040)", param_hint="--after"
        ) from None


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
@click.option(
    "--after",
    default="",
    metavar="REV/TASK/VERSION",
    help="Start after this event position (the 'position' of --json output, as "
    "revision/task_id/prev_state_version): how a script resumes without gaps or repeats.",
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
    after: str,
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
    if after:
        request.after.CopyFrom(_parse_position(after))
    try:
        while True:
            with connect(**remote) as conn:
                try:
                    for event in conn.tasks.WatchEvents(request, metadata=metadata):
                        click.echo(
                            json.dumps(event_json(event)) if as_json else shown(format_event(event))
                        )
                        request.ClearField("from_revision")
                        request.after.CopyFrom(event.position)
                    return
                except grpc.RpcError as exc:
                    if not (follow and exc.code() in _RESUMABLE):
                        raise click.ClickException(str(translate(exc))) from exc
                    cause = exc.details() or exc.code().name
            where = (
                f"after {_position(request.after)}"
                if request.HasField("after")
                else f"from revision {request.from_revision}"
            )
            click.echo(f"# stream broke ({cause}); resuming {where}", err=True)
            time.sleep(_RESUME_DELAY)
    except KeyboardInterrupt:
        return
