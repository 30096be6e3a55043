"""A per-principal budget of renewal items a second on a replica (RenewMany and Renew).

The claimed index makes a made-up fence cheap for etcd, but not for the replica: decoding,
checking and answering 1,000 fences costs ~35 ms of the interpreter, and a principal sending
RenewMany back to back from 40 threads (within its share of threads: coordinator.server
.call_shares) kept the interpreter busy enough that other principals' renewals missed their
deadlines and their claims were lost (measured, tests/server/test_fair_renewals.py). So each
principal may renew ``renew_rate_per_principal`` items a second on a replica (bursts of twice
that), counted before the request is parsed; past it the call is refused RESOURCE_EXHAUSTED
naming the setting and when to retry, and counted in
``coordinator_calls_refused_total{reason="renew_rate"}``. The default (2,000 a second) renews
1,000 claims of a 3 s TTL, or 4,000 of the default TTLs, from one principal on one replica.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from coordinator.domain.rate_budget import Bucket, Budget
from coordinator.errors import ResourceExhausted
from coordinator.metrics import Metrics

RENEW_RATE = 2000.0
"""Renewal items a second one principal may send a replica (the setting's default)."""
REFUSED = "renew_rate"
"""The ``reason`` label of a renewal refused past its principal's rate."""
_PRINCIPALS = 10_000  # buckets kept before the full ones (same as new ones) are dropped


class RenewBudgets:
    """Each principal's bucket of renewal items (domain/rate_budget.py)."""

    def __init__(self, rate: float, metrics: Metrics, clock: Callable[[], float]) -> None:
        self._budget = Budget(rate=rate, burst=2 * rate)
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, Bucket] = {}

    def take(self, principal: str, items: int) -> None:
        """Admit ``items`` renewals of ``principal``, or raise ResourceExhausted."""
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(principal) or self._budget.full(now)
            bucket, wait = self._budget.take(bucket, items, now)
            self._buckets[principal] = bucket
            if len(self._buckets) > _PRINCIPALS:
                self._forget_full(now)
        if wait:
            self._metrics.count_call_refused(REFUSED)
            raise ResourceExhausted(
                f"principal {principal!r} renews more than {self._budget.rate:g} claims a "
                f"second on this replica (renew_rate_per_principal); retry in {wait:.2f} s, "
                "or raise renew_rate_per_principal"
            )

    def _forget_full(self, now: float) -> None:
        budget = self._budget
        self._buckets = {
            p: b for p, b in self._buckets.items() if budget.refill(b, now).tokens < budget.burst
        }
