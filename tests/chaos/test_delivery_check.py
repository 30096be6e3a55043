"""The delivery rules of the long-poll-cancel scenario (chaos/delivery_check.py), on handmade
histories: a caller left its poll at wall time 100.0; each broken history breaks one rule, and
the checker's budget replay does not count a claim given back."""

from __future__ import annotations

from chaos.budget import budget_replay
from chaos.checker import Evidence, FinalTask, check
from chaos.delivery_check import SLACK, abandoned_polls, undelivered_claims
from chaos.etcd_history import given_back
from chaos.history import ABANDONED, INFO, EtcdWrite, Observed, Operation, OpKind
from coordinator.domain.retry import UNDELIVERED, UNDELIVERED_COUNTED
from coordinator.domain.states import Op as Transition
from coordinator.domain.states import TaskState

LEFT_AT = 100.0


def abandoned(request_id: str = "poll-1") -> Operation:
    """A poll its caller left at ``LEFT_AT`` (recorded ``info``, reason abandoned)."""
    return Operation(
        id="abandon-1",
        worker="abandon",
        op=OpKind.CLAIM,
        task="",
        start=1.0,
        end=2.0,
        outcome=INFO,
        reason=ABANDONED,
        request_id=request_id,
        end_wall=LEFT_AT,
    )


def heard(attempt: str, generation: int) -> Operation:
    """A worker's claim that heard CLAIMED."""
    return Operation(
        id="w0-1",
        worker="w0",
        op=OpKind.CLAIM,
        task="t1",
        start=3.0,
        end=3.1,
        outcome=Observed.CLAIMED,
        attempt_id=attempt,
        generation=generation,
        revision=1,
        request_id="w0-claim",
    )


def claim(revision: int, attempt: str, at: float, request_id: str = "poll-1") -> EtcdWrite:
    return EtcdWrite(
        "t1",
        revision,
        Transition.CLAIM,
        TaskState.CLAIMED,
        request_id,
        attempt,
        revision,
        at=at,
    )


def give_back(revision: int, attempt: str, request_id: str = "poll-1") -> EtcdWrite:
    return EtcdWrite(
        "t1", revision, Transition.GIVE_BACK, TaskState.READY, request_id, attempt, given_back=True
    )


def rules(ops: list[Operation], writes: list[EtcdWrite]) -> list[str]:
    return [v.rule.value for v in undelivered_claims(ops, writes)[0]]


def test_a_claim_made_after_its_caller_left_and_kept_is_reported() -> None:
    late = claim(10, "a1", at=LEFT_AT + SLACK + 0.5)
    violations, in_flight = undelivered_claims([abandoned()], [late])
    assert [v.rule.value for v in violations] == ["undelivered-attempt-counted"]
    assert violations[0].ops == ("abandon:claim#abandon-1( g=0 -> info)", "claim@10(a1)")
    assert violations[0].detail.startswith("claimed 0.750 s after its caller left")
    assert in_flight == 0


def test_the_same_claim_given_back_breaks_nothing() -> None:
    log = [claim(10, "a1", at=LEFT_AT + 2), give_back(11, "a1")]
    assert undelivered_claims([abandoned()], log) == ([], 0)


def test_an_undelivered_claim_counted_past_the_allowance_is_given_back_too() -> None:
    """Past the allowance the give-back is the counted move (here the dead letter), which the
    event's detail names; the budget model counts it, and delivery holds."""
    detail = f"all 1 attempts used; last error: {UNDELIVERED.error} {UNDELIVERED_COUNTED}"
    assert given_back(Transition.DEAD_LETTER, detail)
    assert not given_back(Transition.DEAD_LETTER, "all 1 attempts used; last error: lease expired")
    assert given_back(Transition.GIVE_BACK, "")
    counted = EtcdWrite(
        "t1", 11, Transition.DEAD_LETTER, TaskState.FAILED, "poll-1", "a1", given_back=True
    )
    assert undelivered_claims([abandoned()], [claim(10, "a1", at=LEFT_AT + 2), counted]) == ([], 0)


def test_a_claim_made_before_its_caller_left_is_lost_in_flight_not_a_violation() -> None:
    assert undelivered_claims([abandoned()], [claim(10, "a1", at=LEFT_AT - 0.01)]) == ([], 1)
    assert undelivered_claims([abandoned()], [claim(10, "a1", at=LEFT_AT + SLACK)]) == ([], 1)


def test_a_claim_a_caller_heard_is_not_held_to_delivery_but_may_not_be_given_back() -> None:
    assert rules([heard("a1", 10)], [claim(10, "a1", at=LEFT_AT + 5, request_id="w0-claim")]) == []
    log = [claim(10, "a1", at=LEFT_AT + 5, request_id="w0-claim"), give_back(11, "a1")]
    assert rules([heard("a1", 10)], log) == ["delivered-claim-given-back"]


def test_only_claims_of_abandoned_polls_are_held_to_delivery() -> None:
    # A worker's claim whose answer it never heard (a lost answer it retried) is another rule's.
    other = claim(10, "a1", at=LEFT_AT + 5, request_id="w0-lost")
    assert undelivered_claims([abandoned()], [other]) == ([], 0)
    assert abandoned_polls([abandoned(), heard("a1", 10)]) == 1


def test_a_given_back_claim_is_not_counted_against_the_budget() -> None:
    log = [
        EtcdWrite("t1", 5, Transition.CREATE, TaskState.READY),
        claim(10, "a1", at=LEFT_AT),
        give_back(11, "a1"),
        claim(12, "a2", at=LEFT_AT, request_id="w0-claim"),
    ]
    assert budget_replay("t1", log, budget=1) == []
    assert [v.rule.value for v in budget_replay("t1", [*log[:2], log[3]], budget=1)] == [
        "claim-beyond-budget"
    ]


def test_the_checker_reports_the_rule_and_the_counts() -> None:
    late = claim(10, "a1", at=LEFT_AT + 3)
    final = {"t1": FinalTask("t1", TaskState.CLAIMED, revision=1)}
    verdict = check(Evidence([abandoned()], final, writes=[late]))
    assert "undelivered-attempt-counted" in [v.rule.value for v in verdict.violations]
    given = check(Evidence([abandoned()], final, writes=[late, give_back(11, "a1")]))
    assert "undelivered-attempt-counted" not in [v.rule.value for v in given.violations]
    assert (given.abandoned_polls, given.given_back, given.lost_in_flight) == (1, 1, 0)
