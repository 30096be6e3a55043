"""The retry budget and the dead letter in the checker, on handmade histories of a poison task.

The poison task's budget is 3 attempts: A (g=10) is frozen past its lease, B (g=20) and C (g=30)
are killed; the reclaimer dead-letters the task when C's lease expires, and A, resumed, commits
and must be refused. Each broken history breaks one rule of the budget.
"""

from __future__ import annotations

from chaos.checker import CheckReport, Evidence, FinalTask, check
from chaos.history import EtcdWrite, Observed, Operation, OpKind
from chaos.report import table
from chaos.runner import Result
from coordinator.domain.states import DeadLetterReason, TaskState
from coordinator.domain.states import Op as Transition


def op(op_id: str, kind: str, start: float, outcome: str, *, gen: int, attempt: str) -> Operation:
    return Operation(
        id=op_id,
        worker=attempt.split("-", maxsplit=1)[0],
        op=OpKind(kind),
        task="t1",
        start=start,
        end=start + 0.1,
        outcome=Observed(outcome),
        reason="SUPERSEDED" if outcome == "FENCED" else "",
        attempt_id=attempt,
        generation=gen,
        revision=1,
        request_id=f"{kind}-{attempt}",
    )


def w(revision: int, kind: str, to: str, *, attempt: str = "", gen: int = 0) -> EtcdWrite:
    generation = gen or (revision if kind == "claim" else 0)
    rid = f"{kind}-{attempt}" if kind in ("claim", "commit") else ""
    return EtcdWrite("t1", revision, Transition(kind), TaskState[to], rid, attempt, generation)


def failed(attempts: int, reason: DeadLetterReason = DeadLetterReason.EXHAUSTED) -> FinalTask:
    return FinalTask(
        "t1",
        TaskState.FAILED,
        revision=1,
        max_attempts=3,
        attempts_counted=attempts,
        dead_letter_reason=reason,
    )


def rules(verdict: CheckReport) -> list[tuple[str, str]]:
    return [(v.rule, v.task) for v in verdict.violations]


CLAIMS = [
    op("1", "claim", 0.0, "CLAIMED", gen=10, attempt="a-1"),
    op("2", "claim", 3.0, "CLAIMED", gen=20, attempt="b-2"),
    op("3", "claim", 6.0, "CLAIMED", gen=30, attempt="c-3"),
]
LATE_COMMIT = op("4", "commit", 9.0, "FENCED", gen=10, attempt="a-1")
LOG = [
    w(5, "create", "READY"),
    w(10, "claim", "CLAIMED", attempt="a-1"),
    w(15, "reclaim", "READY", attempt="a-1"),
    w(20, "claim", "CLAIMED", attempt="b-2"),
    w(25, "reclaim", "READY", attempt="b-2"),
    w(30, "claim", "CLAIMED", attempt="c-3"),
    w(35, "dead_letter", "FAILED", attempt="c-3"),
]


def evidence(ops: list[Operation], log: list[EtcdWrite], final: FinalTask) -> Evidence:
    return Evidence(ops, {"t1": final}, writes=log, poisoned=frozenset({"t1"}))


def test_a_poison_task_dead_lettered_after_its_budget_passes() -> None:
    verdict = check(evidence([*CLAIMS, LATE_COMMIT], LOG, failed(3)))
    assert verdict.violations == ()
    assert (verdict.dead_lettered, dict(verdict.fenced)) == (1, {"SUPERSEDED": 1})
    assert table([Result("poison-task", "coordinator", verdict)]).splitlines()[1].split()[-2:] == [
        "1",  # dead letters
        "0",  # violations
    ]


def test_a_fourth_claim_after_a_budget_of_three_is_reported() -> None:
    fourth = op("5", "claim", 10.0, "CLAIMED", gen=40, attempt="d-4")
    log = [
        *LOG[:-1],
        w(35, "reclaim", "READY", attempt="c-3"),
        w(40, "claim", "CLAIMED", attempt="d-4"),
        w(45, "dead_letter", "FAILED", attempt="d-4"),
    ]
    verdict = check(evidence([*CLAIMS, fourth, LATE_COMMIT], log, failed(4)))
    assert rules(verdict) == [
        ("claim-beyond-budget", "t1"),
        ("dead-letter-missing", "t1"),
        ("lost-task", "t1"),
    ]
    assert verdict.violations[0].detail == "attempt 4 of a task whose budget is 3"
    assert verdict.violations[0].ops == ("claim@40(d-4)",)
    assert "etcd's log holds 4 claims, its budget is 3" in verdict.violations[1].detail


def test_a_commit_accepted_after_the_dead_letter_is_reported() -> None:
    accepted = op("4", "commit", 9.0, "COMMITTED", gen=10, attempt="a-1")
    log = [*LOG, w(40, "commit", "DONE", attempt="a-1", gen=10)]
    final = FinalTask("t1", TaskState.DONE, revision=1, result_commit_id="a-1@10", max_attempts=3)
    verdict = check(evidence([*CLAIMS, accepted], log, final))
    assert rules(verdict) == [
        ("late-write-not-fenced", "t1"),
        ("log-not-linearizable", "t1"),
        ("write-after-dead-letter", "t1"),
        ("dead-letter-missing", "t1"),
    ]
    assert verdict.violations[2].detail == "a commit accepted on a FAILED task"


def test_a_claim_of_a_dead_lettered_task_is_reported() -> None:
    again = op("5", "claim", 10.0, "CLAIMED", gen=40, attempt="d-4")
    log = [*LOG, w(40, "claim", "CLAIMED", attempt="d-4")]
    verdict = check(evidence([*CLAIMS, again], log, failed(3)))
    assert ("write-after-dead-letter", "t1") in rules(verdict)
    assert verdict.violations[0].detail == "a claim of a FAILED task"


def test_a_dead_letter_before_the_budget_is_used_is_reported() -> None:
    log = [*LOG[:4], w(25, "dead_letter", "FAILED", attempt="b-2")]
    verdict = check(evidence([*CLAIMS[:2], LATE_COMMIT], log, failed(2)))
    assert rules(verdict) == [
        ("dead-letter-before-budget", "t1"),
        ("dead-letter-missing", "t1"),
        ("lost-task", "t1"),
    ]
    assert verdict.violations[0].detail == "dead-lettered after 2 of its 3 attempts"
    assert "final state FAILED (EXHAUSTED after 2 of 3 attempts)" in verdict.violations[2].detail


def test_a_poison_task_that_was_done_is_reported() -> None:
    # The coordinator let a fourth worker finish it instead of dead-lettering it.
    log = [*LOG[:-1], w(35, "commit", "DONE", attempt="c-3", gen=30)]
    done = FinalTask("t1", TaskState.DONE, revision=1, result_commit_id="c-3@30", max_attempts=3)
    commit = op("5", "commit", 7.0, "COMMITTED", gen=30, attempt="c-3")
    verdict = check(evidence([*CLAIMS, commit, LATE_COMMIT], log, done))
    assert rules(verdict) == [("dead-letter-missing", "t1")]
    assert verdict.violations[0].detail == (
        "not dead-lettered as its budget says: it ended DONE (NONE) after 0 of 3 attempts; "
        "etcd's log holds no dead_letter"
    )
    assert verdict.dead_lettered == 0


def test_a_failed_task_is_lost_unless_its_budget_was_exhausted() -> None:
    legit = Evidence(CLAIMS, {"t1": failed(3)}, frozenset({"t1"}), writes=LOG)
    assert check(legit).violations == ()
    timed_out = {"t1": failed(3, DeadLetterReason.TIMED_OUT)}
    verdict = check(Evidence(CLAIMS, timed_out, frozenset({"t1"}), writes=LOG))
    assert rules(verdict) == [("lost-task", "t1")]


def test_retry_task_starts_a_fresh_budget() -> None:
    log = [
        *LOG,
        w(40, "retry", "READY"),
        w(45, "claim", "CLAIMED", attempt="d-4"),
        w(50, "reclaim", "READY", attempt="d-4"),
    ]
    fourth = op("5", "claim", 10.0, "CLAIMED", gen=45, attempt="d-4")
    final = FinalTask("t1", TaskState.READY, revision=1, max_attempts=3, attempts_counted=1)
    verdict = check(Evidence([*CLAIMS, fourth], {"t1": final}, frozenset({"t1"}), writes=log))
    assert verdict.violations == ()
