"""The admission decision of long-lived calls, over every count around its bounds."""

from __future__ import annotations

import pytest

from coordinator.domain.stream_limits import (
    UNAUTHENTICATED_CALLERS,
    Admission,
    StreamLimits,
    admission,
    refusal_message,
)

HARD = StreamLimits(max_streams=4, max_per_principal=2, reserve=None)
"""A hard per-principal cap (the replay slots' rule)."""
SHARED = StreamLimits(max_streams=8, max_per_principal=2, reserve=0.25)
"""A guaranteed share of 2, idle slots lent past it but never the last 2 of 8."""


@pytest.mark.parametrize("open_total", range(7))
@pytest.mark.parametrize("open_of_principal", range(4))
def test_a_hard_cap_admits_only_below_both_bounds_and_names_the_principal_cap_first(
    open_total: int, open_of_principal: int
) -> None:
    decision = admission(HARD, open_total=open_total, open_of_principal=open_of_principal)
    if open_of_principal >= 2:
        # The caller's own cap is what it can act on (close one of its own), so it is named
        # even when the replica is full too.
        assert decision is Admission.PRINCIPAL_FULL
    elif open_total >= 4:
        assert decision is Admission.SERVER_FULL
    else:
        assert decision is Admission.ADMITTED


@pytest.mark.parametrize("open_total", range(11))
@pytest.mark.parametrize("open_of_principal", range(9))
def test_past_its_share_a_principal_borrows_idle_slots_but_never_the_reserve(
    open_total: int, open_of_principal: int
) -> None:
    if open_of_principal > open_total:
        return  # not a reachable count
    decision = admission(SHARED, open_total=open_total, open_of_principal=open_of_principal)
    if open_of_principal >= 2 and open_total >= 6:
        assert decision is Admission.PRINCIPAL_FULL
    elif open_total >= 8:
        assert decision is Admission.SERVER_FULL
    else:
        assert decision is Admission.ADMITTED


def test_a_lone_principal_fills_all_but_the_reserve_and_a_newcomer_still_gets_its_share() -> None:
    held = {"pool": 0, "late": 0, "third": 0}

    def admit(who: str) -> Admission:
        decision = admission(SHARED, open_total=sum(held.values()), open_of_principal=held[who])
        if decision is Admission.ADMITTED:
            held[who] += 1
        return decision

    pool = [admit("pool") for _ in range(10)]
    assert pool.count(Admission.ADMITTED) == 6
    assert set(pool[6:]) == {Admission.PRINCIPAL_FULL}
    late = [admit("late") for _ in range(3)]
    # "late" got its guaranteed 2 out of the reserve; a third is a borrow, and the reserve
    # left (8 - 6 - 2 = 0) is gone, so the replica is full for everyone now.
    assert late == [Admission.ADMITTED, Admission.ADMITTED, Admission.PRINCIPAL_FULL]
    assert admit("third") is Admission.SERVER_FULL


def test_callers_sharing_the_anonymous_count_never_borrow() -> None:
    assert (
        admission(SHARED, open_total=2, open_of_principal=2, borrows=False)
        is Admission.PRINCIPAL_FULL
    )
    assert admission(SHARED, open_total=2, open_of_principal=2) is Admission.ADMITTED


def test_refusals_name_the_bound_and_its_setting() -> None:
    principal = refusal_message(Admission.PRINCIPAL_FULL, HARD, "w-1")
    assert principal.startswith("principal 'w-1' already holds 2 open streams, the most")
    assert "max_streams_per_principal" in principal
    server = refusal_message(Admission.SERVER_FULL, HARD, "w-1")
    assert "this replica already serves 4 open streams, its limit (max_streams)" in server
    anonymous = refusal_message(Admission.PRINCIPAL_FULL, SHARED, UNAUTHENTICATED_CALLERS)
    assert anonymous.startswith("unauthenticated callers (who share one count) already hold 2")
    borrower = refusal_message(Admission.PRINCIPAL_FULL, SHARED, "pool")
    assert borrower == (
        "principal 'pool' already holds its share of 2 open streams or more "
        "(max_streams_per_principal) and the replica's last 2 of 8 slots are kept for other "
        "principals; retry later or on another replica, close one, or raise max_streams"
    )
