"""``coordinator demo --json`` end to end: etcd, a server, worker processes, one frozen worker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator import lifeline
from coordinator.cli.demo_report import verify
from coordinator.domain.records import ResultRecord
from coordinator.etcd_process import find_etcd_binary
from tests.helpers import eventually


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


@pytest.mark.slow
def test_the_demo_tells_its_story_as_it_happens() -> None:
    command = [*coordinator_command(), "demo", "--tasks", "6", "--workers", "2"]
    command += ["--etcd-bin", str(find_etcd_binary())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    lines = done.stdout.splitlines()  # one line per step, never wrapped (a log keeps them)
    steps = [
        "created 6 tasks in queue 'demo'",
        "is now FROZEN (SIGSTOP)",
        "worker-1's lease expired; worker-2 took",
        "committed by the new owner: DONE",
        "worker-1 wakes up (SIGCONT)",
        "FENCED SUPERSEDED - the store refused the late owner",
        "all 6 tasks DONE",
        "already sent (looked up by its effect key) and did not send it again",
    ]
    at = [next((n for n, line in enumerate(lines) if step in line), -1) for step in steps]
    assert -1 not in at, [s for s, i in zip(steps, at, strict=True) if i == -1]
    assert at == sorted(at), "the steps are told out of order"
    quiet = subprocess.run(
        [*command, "--quiet"], capture_output=True, text=True, timeout=90, check=False
    )
    assert quiet.returncode == 0 and "FROZEN" not in quiet.stdout


@pytest.mark.slow
@pytest.mark.parametrize("to", ["process group", "pid"])
def test_ctrl_c_stops_the_demo_and_everything_it_started(to: str) -> None:
    command = [*coordinator_command(), "demo", "--tasks", "200", "--workers", "2"]
    command += ["--etcd-bin", str(find_etcd_binary())]
    # SIGINT handled by default, as in a shell: a terminal's Ctrl-C goes to the whole process
    # group; `kill -INT PID` to the demo alone, which must then stop what it started itself.
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )
    lifeline.kill_with_parent(proc.pid)  # dies with this test run
    assert proc.stdout is not None
    started: list[int] = []
    try:
        for line in proc.stdout:  # by this line etcd, the outbox and every worker run
            if "FROZEN" in line:
                break
        started = _descendants(proc.pid)
        assert len(started) >= 4, started  # etcd (its own session), the outbox, two workers
        if to == "pid":
            os.kill(proc.pid, signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:  # a failed test leaves nothing running
        for pid in [proc.pid, *started] if proc.poll() is None else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted: the workers, outbox, server and etcd are stopped" in err
    assert "Traceback" not in err
    eventually(
        lambda: not any(_alive(pid) for pid in started),
        timeout=10,
        message=f"children outlived it: {[p for p in started if _alive(p)]}",
    )


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), whatever session it moved to."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
