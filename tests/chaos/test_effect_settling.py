"""Settling indefinite effect calls from the effect keys' history, on handmade histories.

Each effect call (prepare -> send -> record, one request id) names its effect key at invocation;
each EffectWrite is a put of an effect key as etcd holds it, with the request id of the call that
wrote it (EffectRecord.request_id). An indefinite effect call took effect exactly when a write of
its key carries its request id.
"""

from __future__ import annotations

from chaos.checker import CheckReport, Evidence, FinalTask, check
from chaos.history import INFO, EffectWrite, Observed, Operation, OpKind
from chaos.linearizability import SETTLED_BY_HISTORY, settle_effects
from coordinator.domain.effect_ids import effect_id
from coordinator.domain.effects import EffectState
from coordinator.domain.states import TaskState

KEY = effect_id("t1", 1, 1, "notify", "email")
OTHER = effect_id("t2", 1, 1, "notify", "email")
DONE = {"t1": FinalTask("t1", TaskState.DONE, revision=1, result_commit_id="a-1@10")}


def op(
    op_id: str,
    kind: str,
    start: float,
    end: float | None,
    outcome: str,
    *,
    rid: str,
    key: str = "",
    task: str = "t1",
) -> Operation:
    return Operation(
        id=op_id,
        worker="w0",
        op=OpKind(kind),
        task=task,
        start=start,
        end=end,
        outcome=Observed(outcome),
        attempt_id="a-1",
        generation=10,
        revision=1,
        effect_key=key,
        request_id=rid,
    )


def ew(revision: int, state: str, rid: str, key: str = KEY, task: str = "t1") -> EffectWrite:
    return EffectWrite(
        effect_id=key, task=task, revision=revision, state=EffectState[state], request_id=rid
    )


CLAIM = op("1", "claim", 0.0, 0.1, "CLAIMED", rid="ca")
COMMIT = op("3", "commit", 2.0, 2.1, "COMMITTED", rid="ma")


def evidence(
    history: list[Operation], effects: list[EffectWrite] | None, performed: int = 1
) -> Evidence:
    return Evidence(
        history, DONE, frozenset({"t1"}), performed={KEY: performed}, effect_writes=effects
    )


def settled(history: list[Operation], effects: list[EffectWrite]) -> Operation:
    (got,) = [o for o in settle_effects(history, effects) if o.op == "effect"]
    return got


def test_an_info_record_effect_that_took_effect_is_settled_from_the_effect_history() -> None:
    # The call timed out after its RecordEffect landed: both its prepare and its record carry
    # its request id; the later write says what it left (COMMITTED).
    history = [CLAIM, op("2", "effect", 1.0, 1.5, INFO, rid="eb", key=KEY), COMMIT]
    effects = [ew(12, "PREPARED", "eb"), ew(14, "COMMITTED", "eb")]
    got = settled(history, effects)
    assert (got.outcome, got.reason, got.effect_key) == ("COMMITTED", SETTLED_BY_HISTORY, KEY)
    verdict: CheckReport = check(evidence(history, effects))
    assert verdict.violations == ()
    assert (verdict.indefinite, verdict.settled_by_history) == (1, 1)


def test_an_info_record_effect_that_did_not_take_effect_is_settled_lost() -> None:
    # The worker was killed before its record: its prepare landed (PREPARED, its id), then a
    # later call of another worker recorded the key; the settled state is what *it* left.
    history = [CLAIM, op("2", "effect", 1.0, None, INFO, rid="eb", key=KEY), COMMIT]
    effects = [ew(12, "PREPARED", "eb"), ew(20, "COMMITTED", "ec")]
    assert settled(history, effects).outcome == "PREPARED"
    # Nothing of its own on its key: only another call's write, and its id on another key.
    nothing = [ew(12, "PREPARED", "ea"), ew(14, "COMMITTED", "ea"), ew(15, "PREPARED", "eb", OTHER)]
    got = settled(history, nothing)
    assert (got.outcome, got.reason) == ("LOST", SETTLED_BY_HISTORY)
    verdict = check(evidence(history, nothing))
    assert verdict.violations == ()
    assert (verdict.indefinite, verdict.settled_by_history) == (1, 1)


def test_without_the_effect_history_an_info_effect_stays_indefinite() -> None:
    history = [CLAIM, op("2", "effect", 1.0, 1.5, INFO, rid="eb", key=KEY), COMMIT]
    assert check(evidence(history, None)).settled_by_history == 0
    # An answered effect call is left as it is, even with its id in the history.
    answered = [CLAIM, op("2", "effect", 1.0, 1.5, "EXECUTED", rid="eb", key=KEY), COMMIT]
    assert settled(answered, [ew(12, "PREPARED", "eb")]).outcome == "EXECUTED"


def test_an_invocation_without_the_key_is_matched_by_task() -> None:
    # The chaos worker's invocations name no key: the id names the task's incarnation, which a
    # worker learns only from the PrepareEffect answer (and older histories named none either).
    history = [op("2", "effect", 1.0, None, INFO, rid="eb")]
    assert settled(history, [ew(12, "UNKNOWN", "eb")]).outcome == "UNKNOWN"
    assert settled(history, [ew(12, "UNKNOWN", "eb", OTHER, task="t2")]).outcome == "LOST"


def test_a_settled_effect_performed_twice_downstream_is_still_reported() -> None:
    history = [CLAIM, op("2", "effect", 1.0, 1.5, INFO, rid="eb", key=KEY), COMMIT]
    effects = [ew(12, "PREPARED", "eb"), ew(14, "COMMITTED", "eb")]
    verdict = check(evidence(history, effects, performed=2))
    assert [(v.rule, v.task) for v in verdict.violations] == [("duplicate-effect", KEY)]
