"""The report: one table row per scenario and implementation, then every violation."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from chaos.runner import Result

HEADER = (
    "scenario",
    "impl",
    "verdict",
    "ops",
    "commits",
    "fenced",
    "reconciled",
    "info",
    "pending",
    "fence checks",
    "followed",
    "streams refused",
    "unread ended",
    "dead letters",
    "violations",
)


def row(r: Result) -> tuple[str, ...]:
    """One result as table cells."""
    if r.unhealthy:
        return (r.scenario, r.implementation, "UNHEALTHY", *[""] * 11, r.unhealthy)
    if r.verdict is None:
        return (r.scenario, r.implementation, "SKIPPED", *[""] * 11, r.skipped)
    v = r.verdict
    gaps = any(x.rule == "fence-coverage" for x in v.violations)
    fenced = " ".join(f"{k}={n}" for k, n in sorted(v.fenced.items())) or "0"
    return (
        r.scenario,
        r.implementation,
        "PASS" if v.ok else "FAIL",
        str(v.operations),
        str(v.commits),
        fenced,
        str(v.reconciled),
        str(v.indefinite) + (f" ({v.settled_by_history} by log)" if v.settled_by_history else ""),
        str(r.unsettled),
        "-" if r.implementation == "naive" else str(v.fence_checks) + ("" if gaps else " (100%)"),
        followed(r),
        str(v.streams_refused),
        " ".join(f"{how}={n}" for how, n in sorted(v.unread_ended.items())) or "-",
        str(v.dead_lettered),
        str(len(v.violations)),
    )


def followed(r: Result) -> str:
    """Events the WatchEvents follower received, and its stream's breaks by status."""
    if r.implementation == "naive" or r.verdict is None:
        return "-"
    breaks = " ".join(f"{code}={n}" for code, n in sorted(r.follow_breaks.items()))
    return str(r.verdict.followed) + (f" (breaks: {breaks})" if breaks else "")


def table(results: Sequence[Result]) -> str:
    """The results as an aligned text table, followed by each violation."""
    rows = [HEADER, *(row(r) for r in results)]
    widths = [max(len(cells[i]) for cells in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) for cells in rows]
    for r in results:
        # The naive baseline must break the rules (it shows the checker can see a late write):
        # its violations are what a passing run expects, not an alarm.
        label = "expected (naive baseline)" if r.implementation == "naive" else "VIOLATION"
        for v in r.verdict.violations if r.verdict else ():
            lines.append(f"{label} [{r.scenario}/{r.implementation}] {v}")
    return "\n".join(lines)


def as_json(results: Sequence[Result]) -> str:
    """The results as JSON (for --report)."""
    out: list[dict[str, Any]] = []
    for r in results:
        item = asdict(r)
        if r.verdict is not None:
            item["verdict"]["ok"] = r.verdict.ok
        out.append(item)
    return json.dumps(out, indent=2, default=str)
