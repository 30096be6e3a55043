"""Per-principal write budgets: how many bytes of data a caller may add to etcd, and when.

A token bucket per principal: it holds at most ``rate x window`` bytes and refills at ``rate``
bytes per second, so a caller may write a burst of a window's worth, then ``rate`` on average
over any rolling window. What it counts is what only adds data: task inputs (CreateTask,
UpdateInput), staged results and checkpoints. The space guard (domain/space.py) stops everyone
once etcd is nearly full; the budget stops one caller long before, so one token cannot fill
etcd for all the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from coordinator.domain.rate_budget import Bucket, Budget
from coordinator.domain.roles import Role

DEFAULT_HIGH_WATER_SHARE = 1 / 16
"""The share of its budget a principal may still use above etcd's high-water mark: a pool
creating small tasks stays far inside it; a principal that filled etcd has spent it."""

# Bucket is the token bucket's (domain/rate_budget.py): a principal's bytes left at a time.
__all__ = [
    "DEFAULT_HIGH_WATER_SHARE",
    "Bucket",
    "BudgetPolicy",
    "Refused",
    "Spent",
    "high_water_shares",
    "policy_for",
    "refund",
    "refusal_message",
    "spend",
]


@dataclass(frozen=True)
class BudgetPolicy:
    """``rate`` bytes per second over a rolling ``window`` of seconds; a rate of 0 is no
    budget at all."""

    rate: float
    window: float

    @property
    def unbounded(self) -> bool:
        """Whether this policy lets everything through."""
        return self.rate <= 0

    @property
    def capacity(self) -> float:
        """The bytes a full bucket holds: one window's worth."""
        return self.rate * self.window


@dataclass(frozen=True)
class Spent:
    """The write fits: the bucket after it."""

    bucket: Bucket


@dataclass(frozen=True)
class Refused:
    """The write does not fit now: seconds until it would (``never``: it is larger than a
    whole window's budget, so waiting cannot help)."""

    retry_after: float
    never: bool = False


def spend(bucket: Bucket | None, policy: BudgetPolicy, nbytes: int, now: float) -> Spent | Refused:
    """Take ``nbytes`` from ``bucket`` (None: a principal not seen yet, full) under ``policy``."""
    if policy.unbounded:
        return Spent(Bucket(0.0, now))
    capacity = policy.capacity
    left = _left(bucket, policy, now)
    if nbytes <= left:
        return Spent(Bucket(left - nbytes, now))
    if nbytes > capacity:
        return Refused(retry_after=0.0, never=True)
    return Refused(retry_after=(nbytes - left) / policy.rate)


def refund(bucket: Bucket | None, policy: BudgetPolicy, nbytes: int, now: float) -> Bucket:
    """``bucket`` with ``nbytes`` given back (a call charged, then refused for its input,
    wrote nothing), never past a full bucket."""
    return Bucket(min(policy.capacity, _left(bucket, policy, now) + nbytes), now)


def _left(bucket: Bucket | None, policy: BudgetPolicy, now: float) -> float:
    """The bytes ``bucket`` (None: full) holds at ``now``, by the token bucket's own refill
    rule (a clock that went back refills nothing)."""
    budget = Budget(policy.rate, policy.capacity)
    return budget.refill(bucket or budget.full(now), now).tokens


def policy_for(roles: Iterable[Role], policies: Mapping[Role, BudgetPolicy]) -> BudgetPolicy:
    """The budget of a caller with ``roles``: its most generous role's (an unbounded one wins;
    a caller with no budgeted role has none)."""
    chosen = [policies[role] for role in roles if role in policies]
    if not chosen or any(policy.unbounded for policy in chosen):
        return BudgetPolicy(rate=0.0, window=0.0)
    return max(chosen, key=lambda policy: (policy.rate, policy.window))


def refusal_message(
    principal: str, role_setting: str, policy: BudgetPolicy, nbytes: int, refused: Refused
) -> str:
    """The typed refusal's message: whose budget, its size, and when (or whether) to retry."""
    budget = (
        f"write budget of {principal!r} ({policy.rate:g} bytes/s over {policy.window:g} s, "
        f"{role_setting})"
    )
    if refused.never:
        return (
            f"{budget}: this call writes {nbytes} bytes, more than a whole window allows; "
            f"send less or raise {role_setting}"
        )
    return (
        f"{budget} is spent: this call writes {nbytes} bytes; "
        f"retry after {refused.retry_after:.1f} s"
    )


def high_water_shares(
    policies: Mapping[Role, BudgetPolicy], share: float
) -> dict[Role, BudgetPolicy]:
    """Each role's high-water share: ``share`` of its budget's rate over the same window (what
    its principals may still add while etcd is above the high-water mark). Roles without a
    budget have no share: above the mark their growth is refused."""
    return {
        role: BudgetPolicy(rate=policy.rate * share, window=policy.window)
        for role, policy in policies.items()
        if not policy.unbounded and share > 0
    }
