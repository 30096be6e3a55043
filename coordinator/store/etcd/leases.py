"""Claim leases, reused: the lease a finished short claim leaves empty carries the next claim.

Every claim holds its own etcd lease and the claim key dies with it: expiry is what reclaims the
work of a holder that stopped renewing. Granting a lease per claim and revoking it at commit are
two raft proposals per cycle, as much etcd work as the claim and the commit txns together. When
a claim ends by its holder's own commit or release (or a claim txn loses its race), the txn that
ended it deleted the only key on the lease, so the lease is as good as a fresh grant, minus the
time it has run. This replica keeps such a lease for its next claim of the same TTL instead of
revoking it:

- one claim at a time per lease, so the per-claim TTL, the renewal bounds and the fencing token
  (the claim key's create revision) are exactly as with a fresh lease;
- only leases this replica granted or renewed itself, and only while at least two thirds of the
  TTL remain by this replica's monotonic clock since it last saw etcd refresh them; the claim
  reports the expiry that remains, and the SDK renews at a third of the TTL;
- a pooled lease that is not young enough, or one the pool has no room for, is left to expire
  (it holds no key) or revoked as before.

A lease etcd no longer has makes the claim txn fail with LeaseGone; the claim then empties the
pool and takes a fresh grant.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from coordinator.store.etcd.kv import EtcdKV

POOL_PER_TTL = 1024
"""Empty leases kept per TTL; more are revoked."""
_YOUNG = 1 / 3
"""A lease is reused only while less than this fraction of its TTL has run since its refresh."""


@dataclass(frozen=True)
class ClaimLease:
    """A lease for one claim: its id, the TTL etcd granted, and the seconds left of it."""

    lease_id: int
    ttl: int
    remaining: float


class ClaimLeases:
    """Grant, reuse and give back the leases claims hold (see the module docstring)."""

    def __init__(self, kv: EtcdKV, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._kv = kv
        self._now = monotonic
        self._lock = threading.Lock()
        # lease id -> (granted TTL, when etcd last refreshed it), oldest refresh first.
        self._known: OrderedDict[int, tuple[int, float]] = OrderedDict()
        self._pool: dict[int, list[int]] = {}  # TTL -> empty leases, freshest last

    def acquire(self, ttl: int) -> ClaimLease:
        """A young empty lease of ``ttl`` seconds from the pool, or a fresh grant."""
        now = self._now()
        with self._lock:
            pool = self._pool.get(ttl)
            while pool:
                lease_id = pool.pop()
                known = self._known.get(lease_id)
                if known is not None and self._young(known, now):
                    return ClaimLease(lease_id, known[0], known[0] - (now - known[1]))
                self._known.pop(lease_id, None)  # too old: left to expire (it holds no key)
        lease_id, granted = self._kv.grant(ttl)
        with self._lock:
            self._remember(lease_id, granted, now)
        return ClaimLease(lease_id, granted, float(granted))

    def renewed_many(self, ttls: Mapping[int, int]) -> None:
        """etcd just refreshed each lease to its TTL (renewals through this replica, a batch
        under one lock)."""
        now = self._now()
        with self._lock:
            for lease_id, ttl in ttls.items():
                self._remember(lease_id, ttl, now)

    def release(self, lease_id: int) -> None:
        """The claim on ``lease_id`` ended and its key was deleted by the caller's txn: keep
        the lease for another claim if it is young, revoke it otherwise."""
        now = self._now()
        with self._lock:
            known = self._known.get(lease_id)
            if known is not None and self._young(known, now):
                pool = self._pool.setdefault(known[0], [])
                if len(pool) < POOL_PER_TTL:
                    pool.append(lease_id)
                    return
            self._known.pop(lease_id, None)
        self._kv.revoke(lease_id)

    def revoke(self, lease_id: int) -> None:
        """Revoke a claim's lease (its key goes with it); never reused."""
        self.forget(lease_id)
        self._kv.revoke(lease_id)

    def forget(self, lease_id: int) -> None:
        """Never reuse ``lease_id`` (it is gone, or going)."""
        with self._lock:
            self._known.pop(lease_id, None)

    def lost(self, lease_id: int) -> None:
        """etcd refused ``lease_id`` from the pool: whatever lost it (a restore from backup, a
        revoke by another replica's epoch bump) may have taken the others too, so the pool is
        emptied rather than tried lease by lease."""
        with self._lock:
            self._known.pop(lease_id, None)
            for pool in self._pool.values():
                for pooled in pool:
                    self._known.pop(pooled, None)
                pool.clear()

    def pooled(self) -> int:
        """How many empty leases wait for a claim."""
        with self._lock:
            return sum(len(pool) for pool in self._pool.values())

    @staticmethod
    def _young(known: tuple[int, float], now: float) -> bool:
        ttl, refreshed = known
        return now - refreshed < ttl * _YOUNG

    def _remember(self, lease_id: int, ttl: int, now: float) -> None:
        self._known[lease_id] = (ttl, now)
        self._known.move_to_end(lease_id)
        # Forget leases long past any TTL: they expired unless renewed elsewhere.
        while self._known:
            oldest, (old_ttl, refreshed) = next(iter(self._known.items()))
            if now - refreshed <= old_ttl:
                break
            del self._known[oldest]
