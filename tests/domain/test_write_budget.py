"""The write budget's rule (domain/write_budget.py): a token bucket per principal."""

from __future__ import annotations

import pytest

from coordinator.domain.roles import Role
from coordinator.domain.write_budget import (
    Bucket,
    BudgetPolicy,
    Refused,
    Spent,
    high_water_shares,
    policy_for,
    refusal_message,
    spend,
)

POLICY = BudgetPolicy(rate=100.0, window=10.0)  # holds 1,000 bytes, refills 100 a second


def test_a_new_principal_starts_with_a_full_window() -> None:
    assert spend(None, POLICY, 1000, now=5.0) == Spent(Bucket(0.0, 5.0))
    assert spend(None, POLICY, 1001, now=5.0) == Refused(retry_after=0.0, never=True)


def test_the_bucket_refills_at_the_rate_up_to_the_window() -> None:
    empty = Bucket(0.0, 0.0)
    assert spend(empty, POLICY, 300, now=2.0) == Refused(retry_after=1.0)  # 200 back, 100 short
    assert spend(empty, POLICY, 300, now=3.0) == Spent(Bucket(0.0, 3.0))
    assert spend(empty, POLICY, 1000, now=60.0) == Spent(Bucket(0.0, 60.0))  # capped at 1,000


def test_a_clock_that_goes_back_refills_nothing() -> None:
    assert spend(Bucket(50.0, 10.0), POLICY, 60, now=9.0) == Refused(retry_after=0.1)


def test_a_refusal_takes_nothing() -> None:
    bucket = Bucket(500.0, 0.0)
    assert isinstance(spend(bucket, POLICY, 600, now=0.0), Refused)
    assert spend(bucket, POLICY, 500, now=0.0) == Spent(Bucket(0.0, 0.0))


def test_a_zero_rate_is_no_budget() -> None:
    assert spend(None, BudgetPolicy(0.0, 10.0), 1 << 30, now=0.0) == Spent(Bucket(0.0, 0.0))


@pytest.mark.parametrize(
    ("roles", "expected"),
    [
        ({Role.WORKER}, BudgetPolicy(100.0, 10.0)),
        ({Role.WORKER, Role.PM}, BudgetPolicy(400.0, 10.0)),  # the most generous role
        ({Role.WORKER, Role.ADMIN}, BudgetPolicy(0.0, 0.0)),  # an unbounded role wins
        (set(), BudgetPolicy(0.0, 0.0)),
    ],
)
def test_policy_for(roles: set[Role], expected: BudgetPolicy) -> None:
    policies = {
        Role.WORKER: BudgetPolicy(100.0, 10.0),
        Role.PM: BudgetPolicy(400.0, 10.0),
        Role.ADMIN: BudgetPolicy(0.0, 10.0),
    }
    assert policy_for(roles, policies) == expected


def test_refusals_name_the_budget_and_when_to_retry() -> None:
    later = refusal_message("w-1", "write_budget_worker", POLICY, 300, Refused(1.5))
    never = refusal_message("w-1", "write_budget_worker", POLICY, 5000, Refused(0.0, never=True))
    assert later.startswith("write budget of 'w-1' (100 bytes/s over 10 s, write_budget_worker)")
    assert later.endswith("is spent: this call writes 300 bytes; retry after 1.5 s")
    assert "more than a whole window allows" in never and "raise write_budget_worker" in never


def test_high_water_shares_scale_the_rate_and_keep_the_window() -> None:
    policies = {
        Role.WORKER: BudgetPolicy(rate=256.0, window=60.0),
        Role.PM: BudgetPolicy(rate=1024.0, window=10.0),
        Role.ADMIN: BudgetPolicy(rate=0.0, window=60.0),  # no budget: no share
    }
    assert high_water_shares(policies, 1 / 16) == {
        Role.WORKER: BudgetPolicy(rate=16.0, window=60.0),
        Role.PM: BudgetPolicy(rate=64.0, window=10.0),
    }
    assert high_water_shares(policies, 0.0) == {}  # a share of 0 is none, not "unbounded"
