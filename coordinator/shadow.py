"""Shadow comparison for teams moving off a naive ``ownerId`` + ``expiresAt`` claim.

``coordinator shadow --legacy LOG.jsonl`` replays a legacy decision log twice and reports every
task whose winner differs, above all the *late writes*: commits the legacy scheme accepted that
claim.v1 fences (reported even when a later commit overwrote one, so the winners agree).
Pure logic, no I/O; ``coordinator.cli.shadow`` reads the file and prints.

The log: one JSON object per line, ``{"ts", "task", "op": "claim"|"commit", "owner",
"expires_at", "result"}``. ``ts`` and ``expires_at`` are epoch seconds or ISO 8601 times;
``expires_at`` matters on claims (the lease end the legacy store recorded); ``result`` is what a
commit wrote (shown in the report; optional). Records are replayed in ``ts`` order (file order
among equal times). Every claim in the log is one the legacy scheme granted.

Legacy rule: a commit is accepted if its owner claimed the task earlier, whatever happened
since (expiry, another owner's claim); the last accepted commit wins.

claim.v1's rule: a claim while another owner's claim is live is refused (CLAIM_CONFLICT); a
claim by the holder while its claim is live renews it; any other claim starts a new generation.
A commit is accepted only from the holder of the current generation while its lease is live and
the task is not committed yet; the first accepted commit is canonical. A commit after the
owner's lease ended is fenced EXPIRED (the lease deleted the claim key); one after another owner
claimed the task is fenced SUPERSEDED.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class LegacyLogError(ValueError):
    """A line of the legacy log is not a valid record (the message names the line)."""


class LegacyOp(StrEnum):
    """What a line of the legacy log records."""

    CLAIM = "claim"
    COMMIT = "commit"


class V1Outcome(StrEnum):
    """What claim.v1 does with a commit of the log."""

    ACCEPTED = "accepted"
    FENCED_EXPIRED = "fenced_expired"
    FENCED_SUPERSEDED = "fenced_superseded"
    NOT_HOLDER = "not_holder"  # never held a v1 claim (its claim was refused, or none)
    ALREADY_COMMITTED = "already_committed"


FENCED = frozenset({V1Outcome.FENCED_EXPIRED, V1Outcome.FENCED_SUPERSEDED})


@dataclass(frozen=True)
class Record:
    """One line of the legacy log."""

    line: int
    ts: float
    task: str
    op: LegacyOp
    owner: str
    expires_at: float | None
    result: Any = None


@dataclass(frozen=True)
class LoggedCommit:
    """A commit of the log, as the report shows it."""

    line: int
    ts: float
    owner: str
    result: Any
    v1_outcome: str = ""


@dataclass(frozen=True)
class TaskDiff:
    """A task whose winners differ under the two rules, or where the legacy scheme accepted a
    late write (even one a later commit overwrote: whatever read it in between saw it)."""

    task: str
    winners_differ: bool
    legacy_winner: LoggedCommit | None
    v1_winner: LoggedCommit | None
    late_writes: list[LoggedCommit] = field(default_factory=list)
    other_differences: list[LoggedCommit] = field(default_factory=list)


@dataclass(frozen=True)
class ShadowReport:
    tasks: int
    commits: int
    differing: list[TaskDiff]

    @property
    def late_writes(self) -> list[LoggedCommit]:
        return [w for d in self.differing for w in d.late_writes]

    def to_json(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "commits": self.commits,
            "differing_tasks": len(self.differing),
            "late_writes": len(self.late_writes),
            "differing": [asdict(d) for d in self.differing],
        }


def _time(value: Any, what: str, line: int) -> float:
    if isinstance(value, bool):
        raise LegacyLogError(f"line {line}: {what} must be a number or an ISO 8601 time")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            pass
    raise LegacyLogError(f"line {line}: {what} must be a number or an ISO 8601 time, not {value!r}")


def parse_log(lines: Iterable[str]) -> list[Record]:
    """The records of a JSONL legacy log (blank lines skipped); LegacyLogError on a bad one."""
    records = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LegacyLogError(f"line {number}: not JSON: {exc.msg}") from exc
        if not isinstance(data, Mapping):
            raise LegacyLogError(f"line {number}: expected a JSON object")
        try:
            op = LegacyOp(str(data.get("op")))
        except ValueError:
            raise LegacyLogError(
                f"line {number}: op must be 'claim' or 'commit', not {data.get('op')!r}"
            ) from None
        for name in ("task", "owner"):
            if not isinstance(data.get(name), str) or not data[name]:
                raise LegacyLogError(f"line {number}: {name} must be a non-empty string")
        expires = data.get("expires_at")
        if op is LegacyOp.CLAIM and expires is None:
            raise LegacyLogError(f"line {number}: a claim needs expires_at")
        records.append(
            Record(
                line=number,
                ts=_time(data.get("ts"), "ts", number),
                task=data["task"],
                op=op,
                owner=data["owner"],
                expires_at=None if expires is None else _time(expires, "expires_at", number),
                result=data.get("result"),
            )
        )
    return records


def _write(record: Record, outcome: V1Outcome | None = None) -> LoggedCommit:
    return LoggedCommit(
        line=record.line,
        ts=record.ts,
        owner=record.owner,
        result=record.result,
        v1_outcome=outcome.value if outcome is not None else "",
    )


def _outcome_of(record: Record | None) -> tuple[str, str] | None:
    """What a winner left behind: its owner and result (a retried commit leaves the same)."""
    if record is None:
        return None
    return record.owner, json.dumps(record.result, sort_keys=True)


@dataclass
class _V1Claim:
    owner: str
    expires_at: float


@dataclass
class _V1Replay:
    """The v1 rules over one task's records, in time order: who holds the claim, whose claims
    were superseded, who won."""

    holder: _V1Claim | None = None
    # Owners whose v1 claim was superseded by another owner's generation.
    superseded: set[str] = field(default_factory=set)
    winner: Record | None = None

    def claim(self, rec: Record) -> None:
        """A claim (or renewal) under v1's lease rules."""
        assert rec.expires_at is not None
        if self.winner is not None:
            return  # committed: v1 hands the task out no more
        holder = self.holder
        live = holder is not None and rec.ts < holder.expires_at
        if holder is not None and live and holder.owner == rec.owner:
            holder.expires_at = rec.expires_at  # renewal of the live claim
        elif not live:
            if holder is not None and holder.owner != rec.owner:
                self.superseded.add(holder.owner)
            self.superseded.discard(rec.owner)
            self.holder = _V1Claim(rec.owner, rec.expires_at)  # a new generation
        # else: CLAIM_CONFLICT, another owner's claim is live

    def commit(self, rec: Record) -> V1Outcome:
        """What v1 answers a commit; the fence compares come first, as in the commit txn."""
        if rec.owner in self.superseded:
            return V1Outcome.FENCED_SUPERSEDED
        holder = self.holder
        if holder is not None and holder.owner == rec.owner:
            if rec.ts < holder.expires_at:
                self.winner, self.holder = rec, None
                return V1Outcome.ACCEPTED
            return V1Outcome.FENCED_EXPIRED
        if self.winner is not None and self.winner.owner == rec.owner:
            return V1Outcome.ALREADY_COMMITTED  # a retry: answered from the stored result
        return V1Outcome.NOT_HOLDER


def _replay_task(records: list[Record]) -> TaskDiff | None:
    legacy_owners: set[str] = set()
    legacy_winner: Record | None = None
    v1 = _V1Replay()
    outcomes: list[tuple[Record, V1Outcome]] = []
    for rec in records:
        if rec.op is LegacyOp.CLAIM:
            legacy_owners.add(rec.owner)
            v1.claim(rec)
            continue
        if rec.owner in legacy_owners:
            legacy_winner = rec  # last write wins
        outcomes.append((rec, v1.commit(rec)))
    return _diff(records[0].task, legacy_owners, legacy_winner, v1.winner, outcomes)


def _diff(
    task: str,
    legacy_owners: set[str],
    legacy_winner: Record | None,
    v1_winner: Record | None,
    outcomes: list[tuple[Record, V1Outcome]],
) -> TaskDiff | None:
    """Where the two rules part: different winners, and the commits only legacy accepted."""
    late: list[LoggedCommit] = []
    other: list[LoggedCommit] = []
    for rec, outcome in outcomes:
        if rec.owner not in legacy_owners or outcome is V1Outcome.ACCEPTED:
            continue  # legacy refused it too, or both accept it
        (late if outcome in FENCED else other).append(_write(rec, outcome))
    differ = _outcome_of(legacy_winner) != _outcome_of(v1_winner)
    if not differ and not late:
        return None
    return TaskDiff(
        task=task,
        winners_differ=differ,
        legacy_winner=None if legacy_winner is None else _write(legacy_winner),
        v1_winner=None if v1_winner is None else _write(v1_winner, V1Outcome.ACCEPTED),
        late_writes=late,
        other_differences=other,
    )


def compare(records: Iterable[Record]) -> ShadowReport:
    """Replay ``records`` under both rules; the tasks whose winners differ, in task order."""
    by_task: dict[str, list[Record]] = {}
    commits = 0
    for rec in sorted(records, key=lambda r: (r.ts, r.line)):
        by_task.setdefault(rec.task, []).append(rec)
        commits += rec.op is LegacyOp.COMMIT
    differing = [
        diff for task in sorted(by_task) if (diff := _replay_task(by_task[task])) is not None
    ]
    return ShadowReport(tasks=len(by_task), commits=commits, differing=differing)
