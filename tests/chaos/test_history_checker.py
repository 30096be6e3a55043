"""Settling from etcd's own history, and the per-task linearizability check, on handmade logs.

Each operation carries the request id its call sent; each write is a transition event as etcd
holds it. An indefinite operation took effect exactly when its request id is in the log.
"""

from __future__ import annotations

from chaos.checker import CheckReport, Evidence, FinalTask, check, log_replay
from chaos.history import EtcdWrite, Observed, Operation, OpKind
from coordinator.domain.states import Op as Transition
from coordinator.domain.states import TaskState


def op(
    op_id: str,
    kind: str,
    start: float,
    end: float | None,
    outcome: str,
    *,
    gen: int = 0,
    attempt: str = "",
    task: str = "t1",
    rid: str = "",
    revision: int = 1,
    reason: str = "",
) -> Operation:
    return Operation(
        id=op_id,
        worker=(attempt or op_id).split("-", maxsplit=1)[0],
        op=OpKind(kind),
        task=task,
        start=start,
        end=end,
        outcome=Observed(outcome),
        reason=reason,
        attempt_id=attempt,
        generation=gen,
        revision=revision,
        request_id=rid,
    )


def w(
    revision: int, kind: str, to: str, *, attempt: str = "", gen: int = 0, rid: str = ""
) -> EtcdWrite:
    generation = gen or (revision if kind == "claim" else 0)
    return EtcdWrite("t1", revision, Transition(kind), TaskState[to], rid, attempt, generation)


def rules(verdict: CheckReport) -> list[tuple[str, str]]:
    return [(v.rule, v.task) for v in verdict.violations]


# A claims (g=10) and pauses; the reclaimer takes the task back; B claims (g=20).
CLAIMS = [
    op("1", "claim", 0.0, 0.1, "CLAIMED", gen=10, attempt="a-1", rid="ca"),
    op("2", "claim", 5.0, 5.1, "CLAIMED", gen=20, attempt="b-1", rid="cb"),
]
LOG = [
    w(5, "create", "READY", rid="p1"),
    w(10, "claim", "CLAIMED", attempt="a-1", rid="ca"),
    w(15, "reclaim", "READY", attempt="a-1"),
    w(20, "claim", "CLAIMED", attempt="b-1", rid="cb"),
]
DONE_BY_B = {"t1": FinalTask("t1", TaskState.DONE, revision=1, result_commit_id="b-1@20")}
READY = {"t1": FinalTask("t1", TaskState.READY, revision=1)}


def test_an_info_commit_that_took_effect_is_settled_committed_from_the_log() -> None:
    # B's commit response was lost (its worker never heard back): its request id is in the log.
    history = [*CLAIMS, op("3", "commit", 6.0, None, "info", gen=20, attempt="b-1", rid="mb")]
    log = [*LOG, w(30, "commit", "DONE", attempt="b-1", gen=20, rid="mb")]
    verdict = check(Evidence(history, DONE_BY_B, frozenset({"t1"}), writes=log))
    assert verdict.violations == ()
    assert (verdict.commits, verdict.indefinite, verdict.settled_by_history) == (1, 1, 1)


def test_an_info_commit_that_did_not_take_effect_is_settled_lost_from_the_log() -> None:
    # A timed out, B's commit never reached etcd either: no request id in the log, task READY.
    history = [*CLAIMS, op("3", "commit", 6.0, 6.5, "info", gen=20, attempt="b-1", rid="mb")]
    verdict = check(Evidence(history, READY, frozenset({"t1"}), writes=LOG))
    assert verdict.violations == ()
    assert (verdict.commits, verdict.indefinite, verdict.settled_by_history) == (0, 1, 1)


def test_a_lost_claim_response_is_settled_with_its_task_and_generation() -> None:
    # ClaimNext's response was lost: the history names no task; the log names task and g.
    history = [op("1", "claim", 0.0, 0.5, "info", task="", rid="ca"), CLAIMS[1]]
    verdict = check(Evidence(history, READY, frozenset({"t1"}), writes=LOG))
    assert verdict.violations == ()
    assert verdict.settled_by_history == 1


def test_the_log_is_cross_checked_with_the_final_state() -> None:
    # The log holds B's commit, yet etcd's task is READY with no result: reported.
    history = [*CLAIMS, op("3", "commit", 6.0, None, "info", gen=20, attempt="b-1", rid="mb")]
    log = [*LOG, w(30, "commit", "DONE", attempt="b-1", gen=20, rid="mb")]
    verdict = check(Evidence(history, READY, frozenset({"t1"}), writes=log))
    assert rules(verdict) == [("log-disagrees-with-final-state", "t1")]


def test_a_refused_call_that_wrote_and_an_acknowledged_one_that_did_not_are_reported() -> None:
    history = [
        *CLAIMS,
        op("3", "commit", 6.0, 6.1, "FENCED", gen=10, attempt="a-1", rid="ma"),
        op("4", "commit", 7.0, 7.1, "COMMITTED", gen=20, attempt="b-1", rid="mb"),
    ]
    log = [*LOG, w(30, "commit", "DONE", attempt="a-1", gen=10, rid="ma")]
    final = {"t1": FinalTask("t1", TaskState.DONE, revision=1, result_commit_id="a-1@10")}
    got = rules(check(Evidence(history, final, frozenset({"t1"}), writes=log)))
    assert ("refused-call-took-effect", "t1") in got
    assert ("acknowledged-call-not-in-log", "t1") in got
    assert ("log-not-linearizable", "t1") in got  # A committed while B held the claim


def test_a_history_that_breaks_real_time_order_is_reported() -> None:
    # B's claim (revision 20) completed before A's claim (revision 10) was even invoked.
    history = [
        op("1", "claim", 1.0, 1.1, "CLAIMED", gen=10, attempt="a-1", rid="ca"),
        op("2", "claim", 0.0, 0.1, "CLAIMED", gen=20, attempt="b-1", rid="cb"),
    ]
    final = {"t1": FinalTask("t1", TaskState.CLAIMED, revision=1)}
    verdict = check(Evidence(history, final, frozenset({"t1"}), writes=LOG))
    assert rules(verdict) == [("generation-not-increasing", "t1"), ("real-time-order", "t1")]
    assert verdict.violations[1].ops == (
        "a:claim#1(t1 g=10 -> CLAIMED)",
        "b:claim#2(t1 g=20 -> CLAIMED)",
    )
    # The same calls overlapping in time: either order is a valid linearization.
    overlapping = [
        history[0],
        op("2", "claim", 0.0, 1.05, "CLAIMED", gen=20, attempt="b-1", rid="cb"),
    ]
    assert check(Evidence(overlapping, final, frozenset({"t1"}), writes=LOG)).violations == ()


def test_the_log_replay_rejects_a_non_linearizable_log() -> None:
    assert log_replay("t1", [*LOG, w(30, "commit", "DONE", attempt="b-1", gen=20)]) == []
    late = [*LOG, w(30, "commit", "DONE", attempt="a-1", gen=10)]
    assert [v.detail for v in log_replay("t1", late)] == [
        "commit by attempt a-1 while the live claim is b-1"
    ]
    twice = [*LOG, w(30, "commit", "DONE", attempt="b-1"), w(31, "commit", "DONE", attempt="b-1")]
    assert [v.rule for v in log_replay("t1", twice)] == ["log-not-linearizable"]
    backwards = [w(10, "claim", "CLAIMED", attempt="a-1"), w(9, "claim", "CLAIMED", attempt="b-1")]
    assert "claim generation 9 after generation 10" in log_replay("t1", backwards)[0].detail


def test_a_commit_on_the_old_input_after_an_input_change_must_be_refused() -> None:
    # The operator's input change (revision 1 -> 2) completed before A's commit started.
    history = [
        CLAIMS[0],
        op("op-1", "update_input", 2.0, 2.1, "OK", revision=2, rid="u1"),
        op("3", "commit", 3.0, 3.1, "COMMITTED", gen=10, attempt="a-1", rid="ma"),
    ]
    final = {"t1": FinalTask("t1", TaskState.DONE, revision=2, result_commit_id="a-1@10")}
    got = rules(check(Evidence(history, final, frozenset({"t1"}))))
    assert got == [("late-write-not-fenced", "t1"), ("stale-result", "t1")]
    refused = [*history[:2], op("3", "commit", 3.0, 3.1, "STALE_INPUT", gen=10, attempt="a-1")]
    verdict = check(Evidence(refused, {"t1": FinalTask("t1", TaskState.READY, revision=2)}))
    assert verdict.violations == () and dict(verdict.fenced) == {"STALE_INPUT": 1}
