"""The pure rules of a call's retry window (sdk/_budget.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coordinator.sdk._budget import MIN_TRY_TIMEOUT, out_of_time, retry_deadline, try_timeout

seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(start=seconds, budget=seconds, lease_left=st.floats(-1e6, 1e6, allow_nan=False))
def test_a_call_behind_a_fence_retries_until_the_budget_or_the_lease_ends(
    start: float, budget: float, lease_left: float
) -> None:
    assert retry_deadline(start, budget, lease_left) == start + max(min(budget, lease_left), 0)


@given(start=seconds, budget=seconds)
def test_any_other_call_retries_for_the_whole_budget(start: float, budget: float) -> None:
    assert retry_deadline(start, budget, None) == start + budget


def test_the_lease_cuts_the_budget_and_an_ended_lease_leaves_no_retry() -> None:
    assert retry_deadline(100.0, 15.0, 4.0) == 104.0
    assert retry_deadline(100.0, 15.0, 40.0) == 115.0
    assert retry_deadline(100.0, 15.0, -3.0) == 100.0


def test_a_try_that_would_start_at_the_deadline_is_not_made() -> None:
    assert not out_of_time(10.0, 0.4, 10.5)
    assert out_of_time(10.0, 0.5, 10.5)
    assert out_of_time(11.0, 0.0, 10.5)


def test_a_retry_gets_what_is_left_of_the_window_within_bounds() -> None:
    assert try_timeout(0.0, 100.0, 10.0) == 10.0  # the policy's per-try timeout
    assert try_timeout(0.0, 3.0, 10.0) == 3.0  # what is left before the deadline
    assert try_timeout(0.0, 0.05, 10.0) == MIN_TRY_TIMEOUT  # never too short to answer
    assert try_timeout(0.0, 0.05, 0.1) == 0.1  # nor longer than the per-try timeout
