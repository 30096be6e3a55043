"""``coordinator shadow``: a synthetic legacy log with planted late writes among benign
histories; the report names exactly the planted ones."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from coordinator.shadow import LegacyLogError, compare, parse_log

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-c", "from coordinator.cli import main; main()"]


def claim(ts: float | str, task: str, owner: str, expires_at: float | str) -> dict[str, Any]:
    return {"ts": ts, "task": task, "op": "claim", "owner": owner, "expires_at": expires_at}


def commit(ts: float | str, task: str, owner: str, result: str) -> dict[str, Any]:
    return {"ts": ts, "task": task, "op": "commit", "owner": owner, "result": result}


def synthetic_log() -> tuple[list[dict[str, Any]], set[tuple[str, str]]]:
    """Benign histories plus planted late writes; returns the records (shuffled across tasks,
    each task's own in time order) and the planted late writes as (task, result)."""
    records: list[dict[str, Any]] = []
    planted: set[tuple[str, str]] = set()
    base = 1_000.0
    for i in range(40):  # benign: one owner, renewed once, commits within its lease
        t = f"clean-{i}"
        records += [claim(base, t, "w1", base + 10), claim(base + 8, t, "w1", base + 20)]
        records += [commit(base + 15, t, "w1", f"{t}-ok")]
    for i in range(10):  # benign: the owner expires, another claims and commits; no late commit
        t = f"handover-{i}"
        records += [claim(base, t, "a", base + 10), claim(base + 11, t, "b", base + 30)]
        records += [commit(base + 20, t, "b", f"{t}-b")]
    for i in range(5):  # benign: the expired owner claims again, then commits
        t = f"reclaim-{i}"
        records += [claim(base, t, "a", base + 10), claim(base + 12, t, "a", base + 30)]
        records += [commit(base + 20, t, "a", f"{t}-a")]
    for i in range(5):  # benign: a retried commit of the winner
        t = f"retry-{i}"
        records += [claim(base, t, "a", base + 10), commit(base + 5, t, "a", f"{t}-a")]
        records += [commit(base + 6, t, "a", f"{t}-a")]
    # Planted 1: superseded owner commits after the new owner's commit (legacy: last wins).
    for i in range(3):
        t = f"late-after-{i}"
        records += [claim(base, t, "a", base + 10), claim(base + 12, t, "b", base + 40)]
        records += [commit(base + 20, t, "b", f"{t}-b"), commit(base + 25, t, "a", f"{t}-a")]
        planted.add((t, f"{t}-a"))
    # Planted 2: superseded owner commits before the new owner (winners agree; still late).
    t = "late-before"
    records += [claim(base, t, "a", base + 10), claim(base + 12, t, "b", base + 40)]
    records += [commit(base + 14, t, "a", "late-before-a"), commit(base + 30, t, "b", "ok-b")]
    planted.add((t, "late-before-a"))
    # Planted 3: expired, nobody claimed since: v1 fences it (the lease took the claim key).
    t = "late-expired"
    records += [claim(base, t, "a", base + 10), commit(base + 11, t, "a", "late-expired-a")]
    planted.add((t, "late-expired-a"))
    # Planted 4: ISO times, two late writers on one task.
    t = "late-iso"
    records += [
        claim("2026-01-01T00:00:00+00:00", t, "a", "2026-01-01T00:00:10+00:00"),
        claim("2026-01-01T00:00:11+00:00", t, "b", "2026-01-01T00:00:20+00:00"),
        claim("2026-01-01T00:00:21+00:00", t, "c", "2026-01-01T00:00:40+00:00"),
        commit("2026-01-01T00:00:25+00:00", t, "c", "late-iso-c"),
        commit("2026-01-01T00:00:26+00:00", t, "b", "late-iso-b"),
        commit("2026-01-01T00:00:27+00:00", t, "a", "late-iso-a"),
    ]
    planted |= {(t, "late-iso-b"), (t, "late-iso-a")}
    random.Random(8).shuffle(records)  # tasks interleave; replay orders by ts
    return records, planted


def _jsonl(records: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(r) for r in records]


def test_the_report_names_exactly_the_planted_late_writes() -> None:
    records, planted = synthetic_log()
    report = compare(parse_log(_jsonl(records)))
    found = {(d.task, w.result) for d in report.differing for w in d.late_writes}
    assert found == planted
    assert report.tasks == 40 + 10 + 5 + 5 + 3 + 3
    by_task = {d.task: d for d in report.differing}
    # Nothing but the planted tasks is reported, and no benign write counts as late.
    assert set(by_task) == {task for task, _ in planted}
    assert all(not d.other_differences for d in report.differing)
    after = by_task["late-after-0"]
    assert after.winners_differ
    assert after.legacy_winner is not None and after.legacy_winner.result == "late-after-0-a"
    assert after.v1_winner is not None and after.v1_winner.result == "late-after-0-b"
    assert after.late_writes[0].v1_outcome == "fenced_superseded"
    assert not by_task["late-before"].winners_differ
    expired = by_task["late-expired"]
    assert expired.v1_winner is None and expired.late_writes[0].v1_outcome == "fenced_expired"
    assert by_task["late-iso"].v1_winner is not None
    assert by_task["late-iso"].v1_winner.result == "late-iso-c"


def test_a_refused_claim_is_not_a_late_write_but_still_differs() -> None:
    # Legacy granted b a claim while a's was live (its clock was off); v1 refuses it, so b's
    # commit is NOT_HOLDER: a difference, not a fenced late write.
    lines = _jsonl(
        [
            claim(0, "t", "a", 10),
            claim(5, "t", "b", 20),
            commit(6, "t", "a", "a"),
            commit(7, "t", "b", "b"),
        ]
    )
    (diff,) = compare(parse_log(lines)).differing
    assert diff.winners_differ and diff.late_writes == []
    assert diff.legacy_winner is not None and diff.legacy_winner.result == "b"
    assert diff.v1_winner is not None and diff.v1_winner.result == "a"
    assert [w.v1_outcome for w in diff.other_differences] == ["not_holder"]


def test_bad_lines_are_named() -> None:
    with pytest.raises(LegacyLogError, match="line 2: op must be 'claim' or 'commit'"):
        parse_log([json.dumps(claim(0, "t", "a", 1)), json.dumps({"op": "steal"})])
    with pytest.raises(LegacyLogError, match="line 1: a claim needs expires_at"):
        parse_log([json.dumps({"ts": 0, "task": "t", "op": "claim", "owner": "a"})])
    with pytest.raises(LegacyLogError, match="line 1: ts must be a number or an ISO 8601"):
        parse_log([json.dumps(commit(0, "t", "a", "r") | {"ts": "later"})])


def _shadow(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, "shadow", "--legacy", str(path), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_json_report_and_exit_codes(tmp_path: Path) -> None:
    records, planted = synthetic_log()
    log = tmp_path / "legacy.jsonl"
    log.write_text("\n".join(_jsonl(records)) + "\n")
    result = _shadow(log, "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["late_writes"] == len(planted)
    found = {(d["task"], w["result"]) for d in report["differing"] for w in d["late_writes"]}
    assert found == planted

    clean = tmp_path / "clean.jsonl"
    clean.write_text("\n".join(_jsonl([claim(0, "t", "a", 10), commit(1, "t", "a", "r")])))
    result = _shadow(clean)
    assert result.returncode == 0, result.stderr
    assert "0 late write(s)" in result.stdout

    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    result = _shadow(bad)
    assert result.returncode == 2
    assert "line 1: not JSON" in result.stderr
