"""A token bucket: how much work a caller may start now, and when to retry if not.

Pure (the caller hands in the time). A bucket holds at most ``burst`` tokens and gains ``rate``
a second; work of ``cost`` tokens is admitted when the bucket holds them. A full bucket and a
bucket never used are the same, so whoever keeps buckets may forget the full ones.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    """Tokens held at time ``at``."""

    tokens: float
    at: float


@dataclass(frozen=True)
class Budget:
    """``rate`` tokens a second, at most ``burst`` held."""

    rate: float
    burst: float

    def full(self, now: float) -> Bucket:
        """A bucket never used (or long idle)."""
        return Bucket(self.burst, now)

    def refill(self, bucket: Bucket, now: float) -> Bucket:
        """``bucket`` at ``now`` (a clock that stepped back adds nothing)."""
        gained = max(0.0, now - bucket.at) * self.rate
        return Bucket(min(self.burst, bucket.tokens + gained), max(now, bucket.at))

    def take(self, bucket: Bucket, cost: float, now: float) -> tuple[Bucket, float]:
        """The bucket after admitting ``cost`` at ``now``, and 0.0; or, when it holds too few
        tokens, the bucket unchanged (refilled) and the seconds until it would hold them. Work
        larger than ``burst`` is admitted from a full bucket (which it leaves empty), so no
        single call can never run."""
        current = self.refill(bucket, now)
        needed = min(cost, self.burst)
        if current.tokens >= needed:
            return Bucket(current.tokens - needed, current.at), 0.0
        return current, (needed - current.tokens) / self.rate
