"""The checker must fail: handmade histories, each with one broken rule, and a clean one."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.checker import CheckReport, Coverage, Evidence, FinalTask, check
from chaos.history import End, Observed, Operation, OpKind, Recorder, load
from chaos.report import table
from chaos.runner import Result
from coordinator.domain.effects import EffectState
from coordinator.domain.states import Outcome as CoordinatorOutcome
from coordinator.domain.states import TaskState
from coordinator.sdk import EffectStatus


def op(
    op_id: str,
    kind: str,
    start: float,
    end: float | None,
    outcome: str,
    *,
    gen: int,
    attempt: str,
    task: str = "t1",
    reason: str = "",
) -> Operation:
    return Operation(
        id=op_id,
        worker=attempt.split("-", maxsplit=1)[0],
        op=OpKind(kind),
        task=task,
        start=start,
        end=end,
        outcome=Observed(outcome),
        reason=reason,
        attempt_id=attempt,
        generation=gen,
    )


def rules(verdict: CheckReport) -> list[tuple[str, str]]:
    return [(v.rule, v.task) for v in verdict.violations]


DONE_BY_B = {"t1": FinalTask("t1", TaskState.DONE, result_commit_id="b-1@20")}

# A pauses with g=10, B claims (g=20) after A's lease expired and commits; A wakes and commits.
CLEAN = [
    op("1", "claim", 0.0, 0.1, "CLAIMED", gen=10, attempt="a-1"),
    op("2", "claim", 5.0, 5.1, "CLAIMED", gen=20, attempt="b-1"),
    op("3", "commit", 6.0, 6.1, "COMMITTED", gen=20, attempt="b-1"),
    op("4", "commit", 9.0, 9.1, "FENCED", gen=10, attempt="a-1", reason="SUPERSEDED"),
]


def test_a_clean_history_passes_and_is_counted() -> None:
    verdict = check(Evidence(CLEAN, DONE_BY_B, frozenset({"t1"}), {"k": 1}))
    assert verdict.violations == ()
    assert (verdict.operations, verdict.commits, dict(verdict.fenced)) == (4, 1, {"SUPERSEDED": 1})


def test_an_unfenced_late_write_is_reported_as_late_write_and_double_commit() -> None:
    late = [*CLEAN[:3], op("4", "commit", 9.0, 9.1, "COMMITTED", gen=10, attempt="a-1")]
    verdict = check(Evidence(late, DONE_BY_B, frozenset({"t1"})))
    assert rules(verdict) == [
        ("double-commit", "t1"),
        ("late-write-not-fenced", "t1"),
        ("acknowledged-commit-lost", "t1"),
    ]
    assert "a:commit#4(t1 g=10 -> COMMITTED)" in verdict.violations[1].ops


def test_a_late_write_that_wins_the_final_state_is_still_reported() -> None:
    # The naive baseline's failure: the stale owner overwrites the rescuer's result.
    late = [*CLEAN[:3], op("4", "commit", 9.0, 9.1, "COMMITTED", gen=10, attempt="a-1")]
    final = {"t1": FinalTask("t1", TaskState.DONE, result_commit_id="a-1@10")}
    verdict = check(Evidence(late, final, frozenset({"t1"})))
    assert [r for r, _ in rules(verdict)] == [
        "double-commit",
        "late-write-not-fenced",
        "acknowledged-commit-lost",  # B's acknowledged commit was overwritten
    ]


def test_a_superseded_commit_before_the_rival_commits_is_still_late() -> None:
    history = [
        op("1", "claim", 0.0, 0.1, "CLAIMED", gen=10, attempt="a-1"),
        op("2", "claim", 5.0, 5.1, "CLAIMED", gen=20, attempt="b-1"),
        op("3", "commit", 6.0, 6.1, "COMMITTED", gen=10, attempt="a-1"),
    ]
    final = {"t1": FinalTask("t1", TaskState.DONE, result_commit_id="a-1@10")}
    assert rules(check(Evidence(history, final))) == [("late-write-not-fenced", "t1")]


def test_overlapping_operations_are_not_blamed() -> None:
    # B's claim had not completed when A's commit started: either order is possible.
    history = [
        op("1", "claim", 0.0, 0.1, "CLAIMED", gen=10, attempt="a-1"),
        op("2", "claim", 5.0, 6.5, "CLAIMED", gen=20, attempt="b-1"),
        op("3", "commit", 6.0, 6.1, "COMMITTED", gen=10, attempt="a-1"),
    ]
    final = {"t1": FinalTask("t1", TaskState.DONE, result_commit_id="a-1@10")}
    assert check(Evidence(history, final)).violations == ()


def test_a_non_increasing_generation_is_reported() -> None:
    history = [
        op("1", "claim", 0.0, 0.1, "CLAIMED", gen=20, attempt="a-1"),
        op("2", "claim", 5.0, 5.1, "CLAIMED", gen=20, attempt="b-1"),
    ]
    final = {"t1": FinalTask("t1", TaskState.CLAIMED)}
    assert rules(check(Evidence(history, final))) == [("generation-not-increasing", "t1")]


def test_a_duplicate_effect_is_reported_with_its_key() -> None:
    verdict = check(Evidence(CLEAN, DONE_BY_B, frozenset({"t1"}), {"k1": 1, "k2": 2}))
    assert rules(verdict) == [("duplicate-effect", "k2")]
    assert "performed 2 times" in str(verdict.violations[0])


def test_a_lost_task_is_reported() -> None:
    final = {**DONE_BY_B, "t2": FinalTask("t2", TaskState.FAILED)}
    verdict = check(Evidence(CLEAN, final, frozenset({"t1", "t2", "t3"})))
    assert rules(verdict) == [("lost-task", "t2"), ("lost-task", "t3")]


def test_an_acknowledged_commit_missing_after_restarts_is_reported() -> None:
    final = {"t1": FinalTask("t1", TaskState.READY)}
    assert rules(check(Evidence(CLEAN, final))) == [("acknowledged-commit-lost", "t1")]


def test_fence_coverage_below_100_percent_is_reported() -> None:
    coverage = [Coverage("r1", "COMMIT", 5, 5), Coverage("r2", "RENEW", 7, 6)]
    verdict = check(Evidence(CLEAN, DONE_BY_B, coverage=coverage))
    assert rules(verdict) == [("fence-coverage", "")]
    assert verdict.violations[0].ops == ("r2:RENEW",)


def test_indefinite_commits_are_settled_from_etcd() -> None:
    # B's commit lost its response but landed; A's indefinite commit did not land.
    history = [
        *CLEAN[:2],
        op("3", "commit", 6.0, None, "info", gen=20, attempt="b-1"),
        op("4", "commit", 9.0, 9.1, "info", gen=10, attempt="a-1"),
    ]
    verdict = check(Evidence(history, DONE_BY_B, frozenset({"t1"})))
    assert (verdict.violations, verdict.commits, verdict.indefinite) == ((), 1, 2)


def test_the_recorder_pairs_invocations_with_completions(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    rec = Recorder(path, "w")
    first = rec.invoke(OpKind.CLAIM, task="t1")
    rec.complete(first, End.OK, Observed.CLAIMED, generation=7, attempt_id="x")
    second = rec.invoke(OpKind.COMMIT, task="t1", generation=7, attempt_id="x")
    third = rec.invoke(OpKind.COMMIT, task="t1", generation=7, attempt_id="x")
    rec.complete(third, End.INFO, message="UNAVAILABLE")
    rec.close()
    with path.open("a") as f:
        f.write('{"torn')
    ops = {o.id: o for o in load([path])}
    assert (ops[first].op, ops[first].outcome, ops[first].generation) == (
        OpKind.CLAIM,
        Observed.CLAIMED,
        7,
    )
    assert (ops[second].outcome, ops[second].end) == (Observed.INFO, None)
    assert ops[third].outcome is Observed.INFO and ops[third].end is not None


def test_an_unknown_op_or_outcome_in_a_history_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text(
        '{"type": "invoke", "id": "w-1", "op": "commit", "worker": "w", "time": 1}\n'
        '{"type": "ok", "id": "w-1", "outcome": "COMMITED", "worker": "w", "time": 2}\n'
    )
    with pytest.raises(ValueError, match="COMMITED"):
        load([path])
    path.write_text('{"type": "invoke", "id": "w-1", "op": "comit", "worker": "w", "time": 1}\n')
    with pytest.raises(ValueError, match="comit"):
        load([path])


def test_every_answer_the_coordinator_can_give_is_an_outcome() -> None:
    # The worker records coordinator outcomes, effect statuses and effect states by name.
    names = [o.name for o in CoordinatorOutcome] + [s.name for s in EffectStatus]
    names += [s.name for s in EffectState]
    assert [n for n in names if n not in Observed.__members__] == []


def test_the_report_names_each_violation_and_lines_up() -> None:
    verdict = check(Evidence(CLEAN, DONE_BY_B, frozenset({"t1"}), {"k2": 2}))
    skipped = Result("clock-skew", "coordinator", None, skipped="no faketime")
    text = table([Result("worker-pause", "coordinator", verdict), skipped])
    lines = text.splitlines()
    assert {line.index("coordinator") for line in lines[1:3]} == {lines[0].index("impl")}
    assert "FAIL" in lines[1] and "SKIPPED" in lines[2] and "no faketime" in lines[2]
    assert lines[3] == (
        "VIOLATION [worker-pause/coordinator] duplicate-effect on k2: "
        "performed 2 times at the downstream []"
    )


# An epoch bump (an operator's, naming no task) between A's claim and A's commit.
BUMP = op("op-1", "bump_epoch", 1.0, 1.1, "OK", gen=0, attempt="", task="")
A_CLAIMED = op("1", "claim", 0.0, 0.1, "CLAIMED", gen=10, attempt="a-1")
A_DONE = {"t1": FinalTask("t1", TaskState.DONE, result_commit_id="a-1@10")}
A_READY = {"t1": FinalTask("t1", TaskState.READY)}


def test_an_old_epoch_commit_after_a_bump_must_be_refused_epoch_changed() -> None:
    accepted = op("2", "commit", 2.0, 2.1, "COMMITTED", gen=10, attempt="a-1")
    verdict = check(Evidence([A_CLAIMED, BUMP, accepted], A_DONE))
    assert rules(verdict) == [("old-epoch-not-fenced", "t1")]
    assert "answered COMMITTED" in verdict.violations[0].detail
    other = op("2", "commit", 2.0, 2.1, "FENCED", gen=10, attempt="a-1", reason="SUPERSEDED")
    verdict = check(Evidence([A_CLAIMED, BUMP, other], A_READY))
    assert rules(verdict) == [("old-epoch-not-fenced", "t1")]
    assert "FENCED (SUPERSEDED)" in verdict.violations[0].detail
    right = op("2", "commit", 2.0, 2.1, "FENCED", gen=10, attempt="a-1", reason="EPOCH_CHANGED")
    verdict = check(Evidence([A_CLAIMED, BUMP, right], A_READY))
    assert verdict.violations == () and dict(verdict.fenced) == {"EPOCH_CHANGED": 1}


def test_commits_the_bump_does_not_order_are_not_judged_by_it() -> None:
    # Invoked while the bump was in flight: it may have landed first.
    overlapping = op("2", "commit", 1.05, 1.2, "COMMITTED", gen=10, attempt="a-1")
    assert check(Evidence([A_CLAIMED, BUMP, overlapping], A_DONE)).violations == ()
    # Claimed while the bump was in flight: the claim may carry the new epoch.
    late_claim = op("1", "claim", 0.9, 1.05, "CLAIMED", gen=10, attempt="a-1")
    commit = op("2", "commit", 2.0, 2.1, "COMMITTED", gen=10, attempt="a-1")
    assert check(Evidence([late_claim, BUMP, commit], A_DONE)).violations == ()
    # A retry of a commit that landed before the bump hears COMMITTED again.
    first = op("2", "commit", 0.5, 0.6, "COMMITTED", gen=10, attempt="a-1")
    retry = op("3", "commit", 2.0, 2.1, "COMMITTED", gen=10, attempt="a-1")
    assert check(Evidence([A_CLAIMED, first, BUMP, retry], A_DONE)).violations == ()


def watch(op_id: str, outcome: str, reason: str = "") -> Operation:
    return Operation(op_id, "flood-0", OpKind.WATCH, "", 1.0, 1.1, Observed(outcome), reason=reason)


def test_a_flood_stream_refused_otherwise_than_resource_exhausted_is_reported() -> None:
    flood = [
        watch("f-1", "OK"),
        watch("f-2", "REFUSED", "RESOURCE_EXHAUSTED"),
        watch("f-3", "ABANDONED"),  # the flood itself stopped waiting
    ]
    verdict = check(Evidence([*CLEAN, *flood], DONE_BY_B, frozenset({"t1"})))
    assert (verdict.violations, verdict.streams_refused) == ((), 1)
    timed_out = [*flood, watch("f-4", "REFUSED", "DEADLINE_EXCEEDED")]
    verdict = check(Evidence([*CLEAN, *timed_out], DONE_BY_B, frozenset({"t1"})))
    assert rules(verdict) == [("stream-refused-wrongly", "")]
    assert verdict.violations[0].detail == "refused DEADLINE_EXCEEDED, not RESOURCE_EXHAUSTED"
    assert verdict.streams_refused == 1


def unread(outcome: str, reason: str = "") -> Operation:
    return Operation(
        "u-1", "operator-abuse", OpKind.UNREAD, "", 1.0, 5.0, Observed(outcome), reason=reason
    )


def test_a_stream_nobody_read_must_be_ended_by_its_age_or_its_buffer() -> None:
    for how in ("max_age", "behind"):
        verdict = check(Evidence([*CLEAN, unread("ENDED", how)], DONE_BY_B, frozenset({"t1"})))
        assert (verdict.violations, dict(verdict.unread_ended)) == ((), {how: 1})
    never = Operation("u-1", "operator-abuse", OpKind.UNREAD, "", 1.0, None, Observed.INFO)
    for wrong, said in (
        (unread("ENDED", "CANCELLED"), "ENDED CANCELLED"),  # cut without its status
        (unread("ABANDONED", "still open"), "ABANDONED still open"),  # never ended
        (never, "info (no status)"),  # the run died before the heal
    ):
        verdict = check(Evidence([*CLEAN, wrong], DONE_BY_B, frozenset({"t1"})))
        assert rules(verdict) == [("unread-stream-not-ended", "")]
        assert verdict.violations[0].detail.startswith(f"a stream nobody read ended {said},")
        assert dict(verdict.unread_ended) == {}
