"""What a live claim's lease says, from what etcd answered about it (LeaseTimeToLive).

Pure: the store reads the claim key, the task record and the lease, and hands in the numbers.
etcd reports a lease's TTL in whole seconds, truncated, and the store's clock is read just
before it asks: both roundings go one way, so a claim is never shown to live longer, nor to have
been refreshed more recently, than it was.

A renewal writes to etcd only when its progress marker moves (a keepalive alone is no write),
so no count of renewals exists to show. The lease itself says when it was last refreshed:
granted TTL minus the seconds left, before the read. That is either the grant or the latest
keepalive a renewal sent; it is a renewal when it is later than the claim (a lease reused from
an earlier claim of the same replica may have been refreshed before this claim was made).
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.records import ClaimRecord, TaskRecord


@dataclass(frozen=True)
class LeaseReading:
    """etcd's answer about one lease: the TTL it was granted and the whole seconds left."""

    granted: int
    remaining: int


@dataclass(frozen=True)
class LeaseView:
    """A lease read at ``read_at``: when it expires unless renewed, and when it was last
    refreshed (``renewed``: after the claim, so by a renewal)."""

    granted: int
    remaining: int
    expires_at: float
    refreshed_at: float
    renewed: bool


@dataclass(frozen=True)
class LiveClaim:
    """A live claim as ListClaims reports it: the task it holds, the claim key, the lease."""

    task: TaskRecord
    claim: ClaimRecord
    lease: LeaseView


def lease_view(reading: LeaseReading, *, read_at: float, claimed_at: float) -> LeaseView:
    """The lease of a claim made at ``claimed_at``, from ``reading`` taken just after
    ``read_at`` (the store's clock before it asked etcd)."""
    remaining = max(0, min(reading.remaining, reading.granted))
    refreshed_at = read_at - (reading.granted - remaining)
    return LeaseView(
        granted=reading.granted,
        remaining=remaining,
        expires_at=read_at + remaining,
        refreshed_at=refreshed_at,
        renewed=refreshed_at > claimed_at,
    )
