"""What a claim's lease says (domain/live_claims.py): expiry and last refresh from etcd's
whole-second answer, and whether a renewal refreshed it since the claim."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.live_claims import LeaseReading, lease_view

READ_AT = 1_700_000_100.0


def test_a_lease_read_ten_seconds_into_its_ttl() -> None:
    view = lease_view(
        LeaseReading(granted=30, remaining=20), read_at=READ_AT, claimed_at=READ_AT - 12
    )
    assert (view.granted, view.remaining) == (30, 20)
    assert view.expires_at == READ_AT + 20
    assert view.refreshed_at == READ_AT - 10
    assert view.renewed  # refreshed 10 s ago, the claim is 12 s old: a renewal did it


def test_the_grant_of_the_claim_itself_is_no_renewal() -> None:
    view = lease_view(
        LeaseReading(granted=30, remaining=18), read_at=READ_AT, claimed_at=READ_AT - 12
    )
    assert view.refreshed_at == READ_AT - 12
    assert not view.renewed


def test_a_reused_lease_refreshed_before_the_claim_is_no_renewal() -> None:
    # Pooled by the replica for 5 s before this claim took it (store/etcd/leases.py).
    view = lease_view(
        LeaseReading(granted=30, remaining=23), read_at=READ_AT, claimed_at=READ_AT - 2
    )
    assert view.refreshed_at == READ_AT - 7
    assert not view.renewed


def test_a_remaining_time_outside_the_grant_is_clamped() -> None:
    over = lease_view(LeaseReading(granted=30, remaining=31), read_at=READ_AT, claimed_at=READ_AT)
    assert (over.remaining, over.expires_at, over.refreshed_at) == (30, READ_AT + 30, READ_AT)
    under = lease_view(LeaseReading(granted=30, remaining=-1), read_at=READ_AT, claimed_at=READ_AT)
    assert (under.remaining, under.expires_at) == (0, READ_AT)


@given(
    granted=st.integers(min_value=2, max_value=600),
    elapsed_ms=st.integers(min_value=0, max_value=600_000),
    latency_ms=st.integers(min_value=0, max_value=500),
)
def test_the_view_never_outlives_nor_refreshes_later_than_the_truth(
    granted: int, elapsed_ms: int, latency_ms: int
) -> None:
    # Refreshed at t=0; the store reads its clock at `elapsed`, etcd answers `latency` later
    # with the whole seconds left, truncated (milliseconds keep the arithmetic exact).
    left_ms = granted * 1000 - elapsed_ms - latency_ms
    if left_ms <= 0:
        return  # expired: etcd answers "not found", no view is made
    reading = LeaseReading(granted, left_ms // 1000)
    view = lease_view(reading, read_at=elapsed_ms / 1000, claimed_at=0.0)
    assert view.expires_at <= granted
    assert view.refreshed_at <= 0.0
    assert not view.renewed
