"""The demo's side-effect invariants (coordinator.cli.demo_report.verify) on made-up histories."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coordinator.cli.demo_report import verify
from coordinator.domain.digests import digest_of
from coordinator.domain.effect_ids import effect_id
from coordinator.domain.effects import EffectRecord, EffectState
from coordinator.domain.records import ResultRecord

KEY = effect_id("t", 1, 1, "notify", "email")
# Sent by generation 5 (response lost), reconciled and recorded by generation 9.
RECONCILED = EffectRecord(
    effect_id=KEY,
    task_id="t",
    task_revision=1,
    node_id="notify",
    effect_slot="email",
    payload_digest=digest_of(b"X"),
    state=EffectState.COMMITTED,
    prepared_generation=5,
    prepared_attempt_id="a1",
    prepared_by="w1",
    prepared_at=0.0,
    reconciler_generation=9,
    recorded_generation=9,
    external_ref="msg-1",
)


def run(effects: list[EffectRecord], performed: dict[str, int]) -> dict[str, object]:
    records: list[dict[str, object]] = [
        {"op": "claim", "task": "t", "attempt": 1, "generation": 5, "outcome": "CLAIMED"},
        {"op": "claim", "task": "t", "attempt": 2, "generation": 9, "outcome": "CLAIMED"},
        {"op": "effect", "task": "t", "status": "reconciled", "effect_id": KEY},
        {"op": "commit", "task": "t", "attempt_id": "a2", "outcome": "COMMITTED"},
        {"op": "commit", "task": "t", "attempt_id": "a1", "outcome": "FENCED", "reason": "X"},
    ]
    result = ResultRecord("t", 1, "a2", 9, 1, "w2", digest_of(b"r"), 0.0)
    report = verify(
        ["t"],
        records,
        {"t": [result]},
        {"t": [(1, 5), (2, 9)]},
        records[-1],
        [],
        wall=1.0,
        effects=effects,
        performed=performed,
    )
    return {**report.to_json(), **report.invariants}


def test_a_reconciled_effect_performed_once_holds() -> None:
    report = run([RECONCILED], {KEY: 1})
    assert report["invariants_ok"] is True
    assert (report["duplicate_effects"], report["reconciled_effects"], report["effects"]) == (
        0,
        1,
        1,
    )


@pytest.mark.parametrize(
    ("effects", "performed", "broken"),
    [
        ([RECONCILED], {KEY: 2}, "no_duplicate_effects"),
        ([RECONCILED], {KEY: 0}, "every_effect_committed_once"),
        ([replace(RECONCILED, state=EffectState.UNKNOWN)], {KEY: 1}, "every_effect_committed_once"),
        ([replace(RECONCILED, recorded_generation=5)], {KEY: 1}, "effect_reconciled_not_resent"),
        ([], {}, "every_effect_committed_once"),
    ],
    ids=["sent-twice", "never-sent", "left-unknown", "not-reconciled", "no-effect"],
)
def test_a_broken_effect_history_is_caught(
    effects: list[EffectRecord], performed: dict[str, int], broken: str
) -> None:
    report = run(effects, performed)
    assert report[broken] is False
    assert report["invariants_ok"] is False
    if broken == "no_duplicate_effects":
        assert report["duplicate_effects"] == 1
