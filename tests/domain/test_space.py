"""The space guard's rule (domain/space.py), every case of kind x state x puts."""

from __future__ import annotations

import itertools

import pytest

from coordinator.domain.space import (
    RETRIES_ABOVE_HIGH_WATER,
    SpaceState,
    SpaceVerdict,
    WriteKind,
    compaction_target,
    decide_write,
    refusal_message,
    refuses_every_txn_at_nospace,
    retry_refusal,
    space_state,
)

ALLOW, HIGH, FULL, NOSPACE = (
    SpaceVerdict.ALLOW,
    SpaceVerdict.REFUSE_HIGH_WATER,
    SpaceVerdict.REFUSE_FULL,
    SpaceVerdict.REFUSE_NOSPACE,
)

# (kind, state, puts) -> verdict: the whole table, so a changed row fails by name.
TABLE = {
    (WriteKind.DRAIN, SpaceState.CLEAR, False): ALLOW,
    (WriteKind.DRAIN, SpaceState.CLEAR, True): ALLOW,
    (WriteKind.GROWTH, SpaceState.CLEAR, False): ALLOW,
    (WriteKind.GROWTH, SpaceState.CLEAR, True): ALLOW,
    # Above high water the pool drains: claims, renewals, commits, releases, prunes go on.
    (WriteKind.DRAIN, SpaceState.HIGH_WATER, False): ALLOW,
    (WriteKind.DRAIN, SpaceState.HIGH_WATER, True): ALLOW,
    (WriteKind.GROWTH, SpaceState.HIGH_WATER, False): HIGH,
    (WriteKind.GROWTH, SpaceState.HIGH_WATER, True): HIGH,
    # Above the full mark no growth at all; the pool still drains.
    (WriteKind.DRAIN, SpaceState.FULL, False): ALLOW,
    (WriteKind.DRAIN, SpaceState.FULL, True): ALLOW,
    (WriteKind.GROWTH, SpaceState.FULL, False): FULL,
    (WriteKind.GROWTH, SpaceState.FULL, True): FULL,
    # At NOSPACE only what puts nothing (reads, compares, deletes) goes to etcd.
    (WriteKind.DRAIN, SpaceState.NOSPACE, False): ALLOW,
    (WriteKind.DRAIN, SpaceState.NOSPACE, True): NOSPACE,
    (WriteKind.GROWTH, SpaceState.NOSPACE, False): NOSPACE,
    (WriteKind.GROWTH, SpaceState.NOSPACE, True): NOSPACE,
}


def test_the_table_covers_every_case() -> None:
    assert set(TABLE) == set(itertools.product(WriteKind, SpaceState, (False, True)))


@pytest.mark.parametrize(("case", "verdict"), TABLE.items(), ids=str)
def test_decide_write(case: tuple[WriteKind, SpaceState, bool], verdict: SpaceVerdict) -> None:
    kind, state, puts = case
    assert decide_write(kind, state, puts=puts) is verdict


@pytest.mark.parametrize(("case", "verdict"), TABLE.items(), ids=str)
def test_a_write_within_its_callers_share_changes_only_growth_above_high_water(
    case: tuple[WriteKind, SpaceState, bool], verdict: SpaceVerdict
) -> None:
    kind, state, puts = case
    if (kind, state) == (WriteKind.GROWTH, SpaceState.HIGH_WATER):
        verdict = ALLOW
    assert decide_write(kind, state, puts=puts, within_share=True) is verdict


@pytest.mark.parametrize(
    ("size", "alarm", "state"),
    [
        (0, False, SpaceState.CLEAR),
        (799, False, SpaceState.CLEAR),
        (800, False, SpaceState.HIGH_WATER),  # the mark itself is above
        (999, False, SpaceState.HIGH_WATER),
        (1000, False, SpaceState.FULL),  # at the quota, alarm not (yet) raised: full by default
        (0, True, SpaceState.NOSPACE),  # defragmented but not disarmed: etcd still refuses
        (900, True, SpaceState.NOSPACE),
    ],
)
def test_space_state(size: int, alarm: bool, state: SpaceState) -> None:
    got = space_state(db_size=size, quota_bytes=1000, high_water=0.8, nospace_alarm=alarm)
    assert got is state


@pytest.mark.parametrize(
    ("size", "alarm", "state"),
    [
        (799, False, SpaceState.CLEAR),
        (800, False, SpaceState.HIGH_WATER),
        (899, False, SpaceState.HIGH_WATER),
        (900, False, SpaceState.FULL),  # the full mark itself is full
        (2000, False, SpaceState.FULL),
        (950, True, SpaceState.NOSPACE),  # the alarm wins
    ],
)
def test_space_state_with_a_full_mark(size: int, alarm: bool, state: SpaceState) -> None:
    got = space_state(db_size=size, quota_bytes=1000, high_water=0.8, full=0.9, nospace_alarm=alarm)
    assert got is state


def test_refusals_name_the_guard_the_cause_and_when_to_retry() -> None:
    high = refusal_message(HIGH, retry_after=5.0)
    full = refusal_message(FULL, retry_after=5.0)
    nospace = refusal_message(NOSPACE, retry_after=2.5)
    assert high.startswith("space guard:") and "high-water share" in high
    assert "retry after 5 s" in high and "without a budget" in high
    assert full.startswith("space guard:") and "full mark" in full and "retry after 5 s" in full
    assert nospace.startswith("space guard:") and "NOSPACE" in nospace
    assert "retry after 2.5 s" in nospace and "defragment" in nospace


@pytest.mark.parametrize(
    ("now", "compacted", "target"),
    [
        (5.0, 0, None),  # nothing 10 s old yet
        (10.0, 0, 100),  # the first reading is exactly 10 s old
        (25.0, 0, 300),  # the newest reading at least 10 s old (t=15), not the oldest
        (25.0, 300, None),  # already compacted there
        (100.0, 0, 400),
    ],
)
def test_compaction_target(now: float, compacted: int, target: int | None) -> None:
    samples = [(0.0, 100), (5.0, 200), (15.0, 300), (20.0, 400)]
    assert compaction_target(samples, now=now, keep=10.0, compacted=compacted) == target


@pytest.mark.parametrize(
    ("version", "refuses"),
    [
        ("3.4.23", False),
        ("3.5.0", True),
        ("3.5.1", True),
        ("3.5.6", True),
        ("3.5.7", False),
        ("3.5.21", False),
        ("3.6.0", False),
        ("not a version", False),
    ],
)
def test_the_etcd_versions_that_refuse_every_txn_at_nospace(version: str, refuses: bool) -> None:
    assert refuses_every_txn_at_nospace(version) is refuses


def test_above_the_high_water_mark_a_task_past_its_allowed_attempts_is_not_claimed() -> None:
    allowed = RETRIES_ABOVE_HIGH_WATER
    for state in SpaceState:
        assert retry_refusal(state, allowed - 1, retry_after=5) == ""  # the first few run
        assert retry_refusal(SpaceState.CLEAR, allowed * 100, retry_after=5) == ""
    for state in (SpaceState.HIGH_WATER, SpaceState.FULL, SpaceState.NOSPACE):
        why = retry_refusal(state, allowed, retry_after=5)
        assert why.startswith("space guard: etcd's database is above its high-water mark")
        assert f"this task has had {allowed} attempts" in why
        assert why.endswith("retry after 5 s")
