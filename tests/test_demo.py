"""``coordinator demo --json`` end to end: etcd, a server, worker processes, one frozen worker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.cli.demo import verify
from coordinator.domain.records import ResultRecord
from coordinator.etcd_process import find_etcd_binary


def coordinator_command() -> list[str]:
    """The installed ``coordinator`` script beside this interpreter, else the click group."""
    script = Path(sys.executable).with_name("coordinator")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from coordinator.cli import main; main()"]


@pytest.mark.slow
def test_demo_holds_every_invariant_and_fences_the_late_commit() -> None:
    command = [
        *coordinator_command(),
        *("demo", "--json", "--tasks", "12", "--workers", "3"),
        *("--etcd-bin", str(find_etcd_binary())),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    report = json.loads(done.stdout)
    assert report["invariants_ok"] is True, report
    assert report["tasks"] == report["committed"] == 12
    assert report["fenced"] >= 1
    assert set(report["fenced_reasons"]) <= {"SUPERSEDED", "LEASE_EXPIRED"}
    assert report["late_commit"]["outcome"] == "FENCED"
    assert sorted(report["attempts_per_task"]) == [f"task-{i:03d}" for i in range(12)]
    assert max(report["attempts_per_task"].values()) >= 2  # the frozen worker's task
    assert report["wall_seconds"] < 60
    # Side effects: one email per task, none sent twice, the frozen worker's reconciled.
    assert (report["effects"], report["duplicate_effects"]) == (12, 0)
    assert report["reconciled_effects"] >= 1
    assert report["reconciled_effect"]["status"] == "reconciled"
    assert report["invariants"]["no_duplicate_effects"] is True


def _history() -> tuple[
    list[dict[str, object]], dict[str, list[ResultRecord]], dict[str, list[tuple[int, int]]]
]:
    """A correct history of one task: attempt 1 frozen and fenced, attempt 2 committed."""
    records: list[dict[str, object]] = [
        {"op": "claim", "task": "t", "attempt": 1, "generation": 5, "outcome": "CLAIMED"},
        {"op": "claim", "task": "t", "attempt": 2, "generation": 9, "outcome": "CLAIMED"},
        {
            "op": "commit",
            "task": "t",
            "attempt": 2,
            "attempt_id": "a2",
            "generation": 9,
            "outcome": "COMMITTED",
            "reason": "NONE",
        },
        {
            "op": "commit",
            "task": "t",
            "attempt": 1,
            "attempt_id": "a1",
            "generation": 5,
            "outcome": "FENCED",
            "reason": "SUPERSEDED",
        },
    ]
    result = ResultRecord("t", 1, "a2", 9, 1, "w2", "sha256:" + "0" * 64, 0.0)
    return records, {"t": [result]}, {"t": [(1, 5), (2, 9)]}


def test_the_checker_accepts_a_correct_history() -> None:
    records, results, attempts = _history()
    report = verify(["t"], records, results, attempts, records[-1], [], wall=1.0)
    assert report.invariants_ok, report.invariants
    assert (report.fenced, report.fenced_reasons) == (1, {"SUPERSEDED": 1})
    assert report.late_commit is not None and report.late_commit["superseded_by"] == 9


@pytest.mark.parametrize(
    ("broken", "invariant"),
    [
        ("second_winner", "at_most_one_canonical_commit_per_task"),
        ("late_accepted", "late_commit_fenced"),
        ("generation_reused", "generations_increasing"),
        ("result_missing", "every_task_committed"),
    ],
)
def test_the_checker_catches_a_broken_history(broken: str, invariant: str) -> None:
    records, results, attempts = _history()
    late = records[-1]
    if broken == "second_winner":
        records[-1] = late = {**late, "outcome": "COMMITTED", "reason": "NONE"}
    elif broken == "late_accepted":
        late = {**late, "outcome": "COMMITTED"}
    elif broken == "generation_reused":
        attempts["t"] = [(1, 9), (2, 9)]
    else:
        results = {}
    report = verify(["t"], records, results, attempts, late, [], wall=1.0)
    assert not report.invariants[invariant]
    assert not report.invariants_ok
