"""``coordinator shadow --legacy LOG.jsonl``: compare a legacy claim scheme's winners with
claim.v1's (the logic is coordinator.shadow). Exit 0: no late write; 1: late writes found; 2: the
log is unreadable or invalid."""

from __future__ import annotations

import json
from typing import TextIO

import click

from coordinator.shadow import LegacyLogError, LoggedCommit, ShadowReport, compare, parse_log


def _describe(write: LoggedCommit | None) -> str:
    if write is None:
        return "none"
    return f"{write.owner} at ts={write.ts:g} (line {write.line}, result={write.result!r})"


def _print_text(report: ShadowReport) -> None:
    click.echo(
        f"{report.tasks} task(s), {report.commits} commit(s); "
        f"{len(report.differing)} task(s) differ; {len(report.late_writes)} late write(s)"
    )
    for diff in report.differing:
        click.echo(f"task {diff.task}:")
        click.echo(f"  legacy winner: {_describe(diff.legacy_winner)}")
        click.echo(f"  claim.v1 winner: {_describe(diff.v1_winner)}")
        for write in diff.late_writes:
            click.echo(f"  LATE WRITE ({write.v1_outcome}): {_describe(write)}")
        for write in diff.other_differences:
            click.echo(f"  also differs ({write.v1_outcome}): {_describe(write)}")


@click.command()
@click.option(
    "--legacy",
    "legacy",
    required=True,
    type=click.File("r"),
    metavar="LOG.jsonl",
    help="Legacy decision log: JSONL of {ts, task, op: claim|commit, owner, expires_at, result}.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def shadow(legacy: TextIO, as_json: bool) -> None:
    """Replay a legacy claim log under its own rule and claim.v1's; report where the winners
    differ and every late write the legacy scheme accepted that claim.v1 fences."""
    try:
        records = parse_log(legacy)
    except LegacyLogError as exc:
        click.echo(f"Error: {exc}", err=True)
        raise SystemExit(2) from exc
    report = compare(records)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        _print_text(report)
    raise SystemExit(1 if report.late_writes else 0)
