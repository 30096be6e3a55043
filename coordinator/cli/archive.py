"""``coordinator archive show|export``: read back what the pruner archived.

Both read the sink directly (the same ``--archive`` a replica writes to; no coordinator or etcd
needed), so they also work after a task's tombstone expired. ``show TASK_ID`` prints the latest
copy of one task (a task archived twice, after a crash or by two racing replicas, has identical
copies); ``export`` writes the latest copy of every task, one JSON object a line, for ``jq`` or
another store. Reading scans the whole archive: O(archive), meant for an operator, not a hot
path (the tombstone's message names the file or object a task went to, for a direct ``zcat``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, TextIO

import click

from coordinator.archive import ArchiveError, ArchiveSink, latest_copies, latest_swept, open_sink
from coordinator.config import DEFAULT_ARCHIVE
from coordinator.errors import ConfigError


@click.group()
def archive() -> None:
    """Read the histories of pruned tasks from the archive."""


def _archive_option(func: Any) -> Any:
    return click.option(
        "--archive",
        "url",
        envvar="COORDINATOR_ARCHIVE",
        show_envvar=True,
        default=DEFAULT_ARCHIVE,
        show_default=True,
        metavar="DIR|s3://BUCKET/PREFIX",
        help="The archive the replicas write to (their `archive` setting).",
    )(func)


def _sink(url: str) -> ArchiveSink:
    try:
        return open_sink(url)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="'--archive'") from exc


def _objects(sink: ArchiveSink, task_id: str) -> list[dict[str, Any]]:
    """Every archived object of ``task_id``."""
    try:
        return [o for o in sink.read() if o.get("task_id") == task_id]
    except ArchiveError as exc:
        raise click.ClickException(str(exc)) from exc


@archive.command()
@click.argument("task_id")
@_archive_option
@click.option("--json", "as_json", is_flag=True, help="Print the archived object as JSON.")
def show(task_id: str, url: str, as_json: bool) -> None:
    """Print the archived history of TASK_ID (exit 1 if it is not in the archive), and the
    records of its attempts swept earlier (ended attempts of the task while it was live)."""
    mine = _objects(_sink(url), task_id)
    found = latest_copies(mine).get(task_id)
    swept = sorted(latest_swept(mine).values(), key=lambda o: float(o.get("archived_at", 0)))
    if found is None and not swept:
        raise click.ClickException(f"task {task_id!r} is not in the archive at {url}")
    if as_json:
        for obj in ([found] if found is not None else []) + swept:
            click.echo(json.dumps(obj, indent=2, sort_keys=True))
        return
    lines = _summary(found) if found is not None else [f"task {task_id} (not pruned yet)"]
    lines += [
        f"ended attempt {o['attempt_id']}: staged {len(o['staged'])} jobs {len(o['jobs'])} "
        f"(swept {datetime.fromtimestamp(float(o['archived_at']), tz=UTC).isoformat()})"
        for o in swept
    ]
    for line in lines:
        click.echo(line)


def _summary(obj: dict[str, Any]) -> list[str]:
    """The archived task, its transitions and how many records of each kind it had."""
    task = obj["task"]["value"]
    archived = datetime.fromtimestamp(float(obj["archived_at"]), tz=UTC).isoformat()
    lines = [
        f"task {obj['task_id']} queue {obj['queue']} state {obj['state']}",
        f"revision {task.get('revision')} attempts {len(obj['attempts'])} archived {archived}",
    ]
    for entry in obj["events"]:
        event = entry["value"]
        when = datetime.fromtimestamp(float(event["at"]), tz=UTC).isoformat()
        detail = f" ({event['detail']})" if event.get("detail") else ""
        lines.append(
            f"  {when} {event['op']} {event.get('from_state') or '-'} -> {event['to_state']} "
            f"by {event.get('by') or '-'}{detail}"
        )
    lines += [
        f"{section} {len(obj[section])}" for section in ("results", "staged", "effects", "jobs")
    ]
    return lines


@archive.command()
@_archive_option
@click.option(
    "--output",
    type=click.File("w"),
    default="-",
    show_default=True,
    help="Where to write the JSON Lines (one archived task a line).",
)
def export(url: str, output: TextIO) -> None:
    """Write the latest archived copy of every task as JSON Lines, in task id order, then the
    records of ended attempts swept before their task was pruned ("kind": "ended_attempt")."""
    sink = _sink(url)
    try:  # two scans, each keeping only the latest copies, rather than the archive in memory
        copies, swept = latest_copies(sink.read()), latest_swept(sink.read())
    except ArchiveError as exc:
        raise click.ClickException(str(exc)) from exc
    for obj in [copies[t] for t in sorted(copies)] + [swept[k] for k in sorted(swept)]:
        output.write(json.dumps(obj, separators=(",", ":"), sort_keys=True) + "\n")
    click.echo(f"exported {len(copies)} task(s), {len(swept)} swept attempt(s)", err=True)
