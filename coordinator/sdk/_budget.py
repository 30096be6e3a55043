"""How long one SDK call keeps retrying: plain functions over seconds, no gRPC.

A call retries until the earlier of two ends:

- the retry budget (``CallRetry.budget``), long enough to ride out a coordinator replica's
  restart or an etcd leader change, counted from the first try's failure: a long poll's wait
  (ClaimNext with ``wait``, up to 20 s) spends none of it, so a replica restarted late in the
  wait is retried like any other call (it once got no retry at all);
- for a call made behind a claim's fence (commit, release, stage, authorize, effects, managed
  jobs), the lease time the claim had left when the call began (``Claim.remaining()``): past
  the lease's end the claim cannot be held any more, so a retry could only learn what a later
  call learns as well.
"""

from __future__ import annotations

MIN_TRY_TIMEOUT = 0.2
"""Seconds a retry gets at least, even close to the deadline: a shorter try cannot answer."""


def retry_deadline(start: float, failed: float, budget: float, lease_left: float | None) -> float:
    """When a call that began at ``start``, and whose first try failed at ``failed``, stops
    retrying: ``budget`` seconds after that failure, or as soon as the lease ends
    (``lease_left`` seconds after ``start``) for a call behind a claim's fence."""
    end = failed + max(budget, 0.0)
    if lease_left is not None:
        end = min(end, start + lease_left)
    return max(end, start)


def out_of_time(now: float, upcoming_sleep: float, deadline: float) -> bool:
    """Whether the next try, after ``upcoming_sleep`` of backoff, would start at or after
    ``deadline`` (then the call gives up now instead of sleeping in vain)."""
    return now + upcoming_sleep >= deadline


def try_timeout(now: float, deadline: float, per_try: float) -> float:
    """The gRPC deadline of a retry: the policy's ``per_try`` timeout, cut to what is left
    before ``deadline`` but never below MIN_TRY_TIMEOUT."""
    return min(per_try, max(deadline - now, MIN_TRY_TIMEOUT))
