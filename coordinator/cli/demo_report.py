"""What ``coordinator demo`` measured: the invariants checked against the workers' reports,
etcd's records and the outbox's call counts (``verify``, pure), and the summary it prints.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from coordinator.demo.worker import Record
from coordinator.domain.effects import EffectRecord, EffectState
from coordinator.domain.records import ResultRecord


@dataclass
class Report:
    """What the demo measured; ``invariants`` maps each checked property to whether it held."""

    tasks: int
    committed: int
    fenced: int
    fenced_reasons: dict[str, int]
    attempts_per_task: dict[str, int]
    wall_seconds: float
    invariants: dict[str, bool]
    late_commit: Record | None
    fenced_commits: list[Record] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # Side effects: recorded effects, calls the outbox performed more than once per key (must be
    # 0), and effects a later attempt reconciled by key instead of sending again (>= 1).
    effects: int = 0
    duplicate_effects: int = 0
    reconciled_effects: int = 0
    reconciled_effect: Record | None = None

    @property
    def invariants_ok(self) -> bool:
        """Whether every invariant held (and nothing went wrong on the way)."""
        return bool(self.invariants) and all(self.invariants.values()) and not self.problems

    def to_json(self) -> Record:
        """The one JSON object ``--json`` prints."""
        return {**asdict(self), "invariants_ok": self.invariants_ok}


def verify(
    ids: list[str],
    records: list[Record],
    results: dict[str, list[ResultRecord]],
    attempts: dict[str, list[tuple[int, int]]],
    late: Record | None,
    problems: list[str],
    *,
    wall: float,
    effects: list[EffectRecord] | None = None,
    performed: dict[str, int] | None = None,
) -> Report:
    """Check the invariants against the workers' reports, etcd's records and (when given) the
    effect records and the outbox's performed calls per key (pure)."""
    commits = [r for r in records if r.get("op") == "commit"]
    winners: dict[str, set[str]] = {}
    for c in commits:
        if c["outcome"] == "COMMITTED":
            winners.setdefault(c["task"], set()).add(c["attempt_id"])
    fenced = [c for c in commits if c["outcome"] == "FENCED"]
    claims: dict[str, list[tuple[int, int]]] = {}
    for r in records:
        if r.get("op") == "claim" and r.get("outcome") == "CLAIMED":
            claims.setdefault(r["task"], []).append((r["attempt"], r["generation"]))

    def increasing(pairs: list[tuple[int, int]]) -> bool:
        gens = [g for _, g in sorted(pairs)]
        return all(a < b for a, b in itertools.pairwise(gens))

    invariants = {
        "at_most_one_canonical_commit_per_task": all(len(v) <= 1 for v in results.values())
        and all(len(v) <= 1 for v in winners.values()),
        "every_task_committed": all(len(results.get(t, [])) == 1 for t in ids),
        "canonical_result_is_the_reported_commit": all(
            {r.attempt_id for r in results.get(t, [])} == winners.get(t, set()) for t in ids
        ),
        "late_commit_fenced": late is not None and late["outcome"] == "FENCED",
        "generations_increasing": all(increasing(v) for v in attempts.values())
        and all(sorted(v) == sorted(attempts.get(t, [])) for t, v in claims.items()),
    }
    effect_figures: dict[str, Any] = {}
    if effects is not None:
        effect_figures = _check_effects(ids, records, effects, performed or {}, invariants)
    if late is not None:
        winner = next(iter(results.get(late["task"], [])), None)
        late = {**late, "superseded_by": winner.claim_generation if winner else None}
    return Report(
        tasks=len(ids),
        committed=sum(1 for t in ids if results.get(t)),
        fenced=len(fenced),
        fenced_reasons=dict(Counter(c["reason"] for c in fenced)),
        attempts_per_task={t: len(attempts.get(t, [])) for t in ids},
        wall_seconds=round(wall, 2),
        invariants=invariants,
        late_commit=late,
        fenced_commits=fenced,
        problems=problems,
        **effect_figures,
    )


def _check_effects(
    ids: list[str],
    records: list[Record],
    effects: list[EffectRecord],
    performed: dict[str, int],
    invariants: dict[str, bool],
) -> dict[str, Any]:
    """Add the side-effect invariants; returns the effect figures of the report.

    A duplicate is a key the outbox performed more than once. A reconciled effect is a COMMITTED
    one recorded by another generation than the one that sent it: a later attempt found it
    performed downstream and did not send again.
    """
    duplicates = sum(n - 1 for n in performed.values() if n > 1)
    reconciled = [
        e
        for e in effects
        if e.state is EffectState.COMMITTED and e.recorded_generation != e.prepared_generation
    ]
    by_task: dict[str, list[EffectRecord]] = {}
    for e in effects:
        by_task.setdefault(e.task_id, []).append(e)
    invariants["no_duplicate_effects"] = duplicates == 0
    invariants["every_effect_committed_once"] = all(
        len(by_task.get(t, [])) == 1
        and by_task[t][0].state is EffectState.COMMITTED
        and performed.get(by_task[t][0].effect_id, 0) == 1
        for t in ids
    )
    invariants["effect_reconciled_not_resent"] = any(
        performed.get(e.effect_id, 0) == 1 for e in reconciled
    )
    line = next(
        (r for r in records if r.get("op") == "effect" and r.get("status") == "reconciled"), None
    )
    return {
        "effects": len(effects),
        "duplicate_effects": duplicates,
        "reconciled_effects": len(reconciled),
        "reconciled_effect": line,
    }


def render(report: Report, console: Console) -> None:
    """The readable summary."""
    spread = Counter(report.attempts_per_task.values())
    figures = Table(title="coordinator demo", show_header=False)
    figures.add_row("tasks", str(report.tasks))
    figures.add_row("canonical commits", str(report.committed))
    figures.add_row("fenced commits", str(report.fenced))
    figures.add_row(
        "attempts per task",
        ", ".join(f"{n} attempt(s): {c} task(s)" for n, c in sorted(spread.items())),
    )
    late = report.late_commit
    if late is not None:
        figures.add_row(
            "late commit",
            f"{late['task']} generation {late['generation']} -> {late['outcome']} "
            f"{late['reason']} (canonical: generation {late['superseded_by']})",
        )
    figures.add_row("side effects (emails)", str(report.effects))
    figures.add_row("duplicate effects", str(report.duplicate_effects))
    figures.add_row("reconciled, not resent", str(report.reconciled_effects))
    rec = report.reconciled_effect
    if rec is not None:
        conflict = "PAYLOAD_CONFLICT, " if rec.get("conflict") else ""
        figures.add_row(
            "reconciled effect",
            f"{rec['task']} generation {rec['generation']}: {conflict}found "
            f"{rec['external_ref']} by key {rec['effect_id'][:16]}..., sent nothing",
        )
    figures.add_row("wall time", f"{report.wall_seconds:.1f} s")
    console.print(figures)
    if report.fenced_commits:
        fenced = Table(title="fenced commits (refused by the store)")
        for column in ("task", "worker", "attempt", "generation", "reason", "lost before commit"):
            fenced.add_column(column)
        for c in report.fenced_commits:
            fenced.add_row(
                c["task"],
                c["worker"],
                str(c["attempt"]),
                str(c["generation"]),
                c["reason"],
                "yes" if c.get("lost_before_commit") else "no",
            )
        console.print(fenced)
    checks = Table(title="invariants")
    checks.add_column("property")
    checks.add_column("held")
    for name, held in report.invariants.items():
        checks.add_row(name.replace("_", " "), "[green]yes[/]" if held else "[red]NO[/]")
    console.print(checks)
    for problem in report.problems:
        console.print(f"[red]problem:[/] {problem}")
    verdict = "[green]all invariants held[/]" if report.invariants_ok else "[red]FAILED[/]"
    console.print(verdict)
