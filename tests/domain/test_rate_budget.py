"""The token bucket behind the per-principal renewal rate."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.rate_budget import Budget

BUDGET = Budget(rate=100.0, burst=200.0)


def test_a_full_bucket_admits_its_burst_then_refuses_with_the_wait() -> None:
    bucket, wait = BUDGET.take(BUDGET.full(0.0), 200, 0.0)
    assert (bucket.tokens, wait) == (0.0, 0.0)
    bucket, wait = BUDGET.take(bucket, 50, 0.0)
    assert bucket.tokens == 0.0
    assert wait == 0.5  # 50 tokens at 100 a second


def test_tokens_come_back_at_the_rate_up_to_the_burst() -> None:
    bucket, _ = BUDGET.take(BUDGET.full(0.0), 200, 0.0)
    assert BUDGET.refill(bucket, 1.0).tokens == 100.0
    assert BUDGET.refill(bucket, 60.0).tokens == 200.0


def test_work_larger_than_the_burst_runs_from_a_full_bucket() -> None:
    bucket, wait = BUDGET.take(BUDGET.full(0.0), 1000, 0.0)
    assert (bucket.tokens, wait) == (0.0, 0.0)


def test_a_clock_that_steps_back_adds_nothing() -> None:
    bucket, _ = BUDGET.take(BUDGET.full(10.0), 200, 10.0)
    assert BUDGET.refill(bucket, 5.0).tokens == 0.0


@given(costs=st.lists(st.integers(min_value=1, max_value=300), max_size=50))
def test_admitted_work_never_exceeds_burst_plus_rate_times_time(costs: list[int]) -> None:
    """At one instant, what is admitted is at most the burst (plus one oversized call)."""
    bucket, admitted = BUDGET.full(0.0), 0
    for cost in costs:
        bucket, wait = BUDGET.take(bucket, cost, 0.0)
        if not wait:
            admitted += min(cost, 200)
    assert admitted <= 200
