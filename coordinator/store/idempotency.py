"""Stored responses of keyed requests under ``{p}/idem/{principal}/{key}``.

``reserve`` creates the key PENDING with a create_revision == 0 compare, so of two concurrent
duplicates exactly one runs; the other waits briefly for the stored response and otherwise
gets RequestInFlight (ABORTED: retry). ``complete`` stores the response; ``abandon`` deletes
the reservation after an error, so a corrected retry can run. Both compare the reservation's
mod_revision, so they never touch a key someone else reserved since.

Expiry: a PENDING reservation lives on a short lease (a replica that dies mid-call frees the key
within ``pending_ttl``); a stored response lives on a long one (``ttl``, default 24 h). Leases are
shared by all keys written within one window of time (1 % of the TTL), so a busy replica grants
a lease per window, not per request; a key then lives between ``ttl`` and ``ttl`` + window.

Bound: a principal holds at most ``max_keys`` keys (default ``MAX_KEYS_PER_PRINCIPAL``); a
request with a new key past it is refused RESOURCE_EXHAUSTED before it runs (1,000 distinct keys
from one caller were 1,000 records kept 24 h, with no end). The count is read with the key, so
concurrent first uses of new keys by one principal may pass it by their number, never more.

Limit: the response is stored after the call's own txn, not inside it. If a replica dies between
the two, the reservation expires and a retry runs the call again; every call here is itself
safe to repeat (creates refuse a taken id, commits of the same digest answer COMMITTED, ...).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from coordinator.domain.idempotency import (
    IdemAction,
    IdemRecord,
    IdemState,
    conflict_message,
    decide,
)
from coordinator.domain.records import decode, encode
from coordinator.errors import AlreadyExists, CoordinatorError, ResourceExhausted
from coordinator.store.context import StoreContext
from coordinator.store.etcd import (
    create_revision_is,
    delete,
    get,
    get_prefix,
    mod_revision_is,
    put,
)

DEFAULT_TTL = 24 * 3600.0
DEFAULT_PENDING_TTL = 60.0
# How long a duplicate waits for the first request's response before ABORTED.
DEFAULT_WAIT = 2.0
_POLL = 0.05
MAX_KEYS_PER_PRINCIPAL = 10_000
"""Idempotency keys one principal holds at once (each kept ``ttl`` after its request)."""


class KeyReused(AlreadyExists):
    """The idempotency key was already used for a different request."""


class RequestInFlight(CoordinatorError):
    """The same keyed request is running right now; retry shortly (gRPC ABORTED)."""


@dataclass(frozen=True)
class Reservation:
    """A PENDING key this caller holds: complete or abandon it."""

    key: str
    method: str
    request_digest: str
    mod_revision: int


class _LeaseWindow:
    """One lease per window of time, with TTL ``ttl + window``, shared by every key written in
    that window: each key outlives ``ttl``, and a busy replica grants one lease per window."""

    def __init__(self, ctx: StoreContext, ttl: float) -> None:
        self._ctx = ctx
        self._window = max(1.0, ttl / 100)
        self._ttl = int(ttl + self._window) + 1
        self._lock = threading.Lock()
        self._lease = 0
        self._until = 0.0

    def lease(self) -> int:
        with self._lock:
            now = time.monotonic()
            if now >= self._until:
                self._lease, _ = self._ctx.kv.grant(self._ttl)
                self._until = now + self._window
            return self._lease


class IdempotencyStore:
    """Reserve, complete and abandon idempotency keys."""

    def __init__(
        self,
        ctx: StoreContext,
        *,
        ttl: float = DEFAULT_TTL,
        pending_ttl: float = DEFAULT_PENDING_TTL,
        wait: float = DEFAULT_WAIT,
        max_keys: int = MAX_KEYS_PER_PRINCIPAL,
    ) -> None:
        self._ctx = ctx
        self._ttl = ttl
        self._max_keys = max_keys
        self._done = _LeaseWindow(ctx, ttl)
        self._pending = _LeaseWindow(ctx, pending_ttl)
        self._wait = wait

    def reserve(self, principal: str, key: str, *, method: str, digest: str) -> Reservation | bytes:
        """Reserve ``key`` for this request (a Reservation: run it), or the stored response of
        the same earlier request (bytes: return them). KeyReused for a different request under
        the key; RequestInFlight if the same request is still running after a short wait."""
        ctx = self._ctx
        etcd_key = ctx.keys.idem(principal, key)
        deadline = time.monotonic() + self._wait
        held = ctx.keys.idem(principal, "")
        while True:
            snap = ctx.kv.read(get(etcd_key), get_prefix(held, count_only=True))
            kv = snap.range_one(0)
            existing = decode(IdemRecord, kv.value, mod_revision=kv.mod_revision) if kv else None
            action = decide(existing, method=method, digest=digest)
            if action is IdemAction.RUN and snap.range_count(1) >= self._max_keys:
                raise ResourceExhausted(
                    f"principal {principal!r} holds {self._max_keys} idempotency keys, the "
                    f"limit: each is kept {self._ttl / 3600:g} h after its request; reuse a key "
                    "only for a retry, send this request without one, or retry after older keys "
                    "expire"
                )
            if action is IdemAction.REPLAY and existing is not None:
                return existing.response
            if action is IdemAction.CONFLICT and existing is not None:
                raise KeyReused(conflict_message(key, existing, method))
            if action is IdemAction.RUN:
                record = IdemRecord(method, digest, IdemState.PENDING, ctx.clock.now())
                result = ctx.kv.txn(
                    [create_revision_is(etcd_key, 0)],
                    [put(etcd_key, encode(record), lease=self._pending.lease())],
                )
                if result.succeeded:
                    return Reservation(etcd_key, method, digest, result.revision)
                continue  # a duplicate reserved it first: read what it stored
            if time.monotonic() >= deadline:
                raise RequestInFlight(
                    f"a request with idempotency key {key!r} is still in progress; retry shortly"
                )
            time.sleep(_POLL)

    def complete(self, reservation: Reservation, response: bytes) -> bool:
        """Store the response for replays; False if the reservation was lost meanwhile."""
        ctx = self._ctx
        record = IdemRecord(
            reservation.method,
            reservation.request_digest,
            IdemState.DONE,
            ctx.clock.now(),
            response=response,
        )
        return ctx.kv.txn(
            [mod_revision_is(reservation.key, reservation.mod_revision)],
            [put(reservation.key, encode(record), lease=self._done.lease())],
        ).succeeded

    def abandon(self, reservation: Reservation) -> None:
        """Free the key after a failed call (errors are not stored)."""
        self._ctx.kv.txn(
            [mod_revision_is(reservation.key, reservation.mod_revision)],
            [delete(reservation.key)],
        )
