"""Stored responses of keyed requests under ``{p}/idem/{principal}/{key}``.

``reserve`` creates the key PENDING with a create_revision == 0 compare, so of two concurrent
duplicates exactly one runs; the other waits briefly for the stored response and otherwise
gets RequestInFlight (ABORTED: retry). ``complete`` stores the response; ``abandon`` deletes
the reservation after an error, so a corrected retry can run. Both compare the reservation's
mod_revision, so they never touch a key someone else reserved since.

Expiry: a PENDING reservation lives on a short lease (a replica that dies mid-call frees the key
within ``pending_ttl``); a stored response lives on a long one (``ttl``, default 24 h), except
the answer of a call that hands out claims (``complete(..., claims=True)``), kept only as long
as the longest lease a claim can have (``limits.max_ttl``). Such an answer is worth replaying
only while the lease it granted can still be alive: later, a replay would hand back a dead claim
where a fresh run gives a live one. It also carries the task's input (up to 256 KiB, and up to
64 of them in a batch): the SDK keys every claim, and a day of a busy queue's inputs would fill
etcd. Any other answer over ``KEPT_LONG`` bytes (a task with its input) is kept ``LARGE_TTL``
for the same reason: one producer cancelling a task with a 256 KiB input under a new key per
call filled a 2 GiB etcd in 70 s. Storing an answer only adds data, so the space guard refuses
it above the high-water mark (the call is still answered; the key is freed).
Leases are shared by all keys written within one window of time (1 % of the TTL), so a
busy replica grants a lease per window, not per request; a key then lives between its TTL and
the TTL + window.

Bound: a principal holds at most ``max_keys`` keys (default ``MAX_KEYS_PER_PRINCIPAL``; 1,000
distinct keys from one caller were 1,000 records kept 24 h, with no end). A new key past it
makes room: the principal's oldest tenth go at once, if the newest of them is older than
``MIN_KEPT`` (a retry of a lost answer comes within seconds; refusing instead stopped a steady
producer that keys its creates for a day once it had made 10,000). Only a principal that made
the bound's worth of keyed calls within ``MIN_KEPT`` is refused RESOURCE_EXHAUSTED before its
call runs. The count is read with the key, so concurrent first uses of new keys by one
principal may pass it by their number, never more.
The keys of calls that hand out claims live apart (``{p}/idem-claims/{principal}/{key}``) and
are bounded by their lifetime instead (a lease of at most ``max_ttl``): a pool of hundreds of
workers sharing one token keys every claim, and counting those would refuse its creates.

Limit: the response is stored after the call's own txn, not inside it. If a replica dies between
the two, the reservation expires and a retry runs the call again; every call here is itself
safe to repeat (creates refuse a taken id, commits of the same digest answer COMMITTED, ...).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog

from coordinator.domain.idempotency import (
    IdemAction,
    IdemRecord,
    IdemState,
    KeyReused,
    conflict_message,
    decide,
)
from coordinator.domain.records import decode, encode
from coordinator.domain.space import WriteKind
from coordinator.errors import CoordinatorError, ResourceExhausted
from coordinator.store.context import StoreContext
from coordinator.store.etcd.lease_window import LeaseWindow
from coordinator.store.etcd.ops import (
    create_revision_is,
    delete,
    get,
    get_prefix,
    mod_revision_is,
    put,
)

log = structlog.get_logger(__name__)

DEFAULT_TTL = 24 * 3600.0
DEFAULT_PENDING_TTL = 60.0
# How long a duplicate waits for the first request's response before ABORTED.
DEFAULT_WAIT = 2.0
_POLL = 0.05
_DELETES_PER_TXN = 100  # etcd allows 128 operations a txn
MAX_KEYS_PER_PRINCIPAL = 10_000
"""Idempotency keys one principal holds at once (each kept ``ttl`` after its request, or until
the principal's newer keys make it the oldest past the bound)."""
MIN_KEPT = 600.0
"""Seconds a key is kept whatever the bound: none younger goes to make room."""
KEPT_LONG = 4096
"""The largest answer kept the whole ``ttl``: with ``max_keys`` a principal's long-kept answers
hold at most 40 MiB of etcd."""
LARGE_TTL = 120.0
"""How long a larger answer (a task with its input, up to 256 KiB) is kept: a retry of a lost
answer comes within seconds (the SDK's retry budget is 15 s). Its bytes are also charged to the
caller's write budget (server/interceptors/idempotency.py), so what a principal holds in large
answers is bounded by its budget times this."""


class RequestInFlight(CoordinatorError):
    """The same keyed request is running right now; retry shortly (gRPC ABORTED)."""


@dataclass(frozen=True)
class Reservation:
    """A PENDING key this caller holds: complete or abandon it."""

    key: str
    method: str
    request_digest: str
    mod_revision: int


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
        self._done = LeaseWindow(ctx.kv.grant, ttl)
        # A claim's answer: the longest lease, never longer than ``ttl`` (an operator's shorter
        # window holds for claims too).
        self._claims = LeaseWindow(ctx.kv.grant, min(ttl, float(ctx.limits.max_ttl)))
        self._large = LeaseWindow(ctx.kv.grant, min(ttl, LARGE_TTL))
        self._pending = LeaseWindow(ctx.kv.grant, pending_ttl)
        self._wait = wait

    def reserve(
        self,
        principal: str,
        key: str,
        *,
        method: str,
        digest: str,
        kind: WriteKind = WriteKind.GROWTH,
        claims: bool = False,
    ) -> Reservation | bytes:
        """Reserve ``key`` for this request (a Reservation: run it), or the stored response of
        the same earlier request (bytes: return them). KeyReused for a different request under
        the key; RequestInFlight if the same request is still running after a short wait. A new
        key is a write of ``kind`` for the space guard (SpaceRefused above high water). The key
        of a call that hands out ``claims`` lives apart and outside the bound (its answer is
        kept only as long as a lease), in one round trip: every claim the SDK sends is keyed."""
        etcd_key = self._ctx.keys.idem(principal, key, claims=claims)
        if not claims:
            self._check_bound(principal, etcd_key)
        deadline = time.monotonic() + self._wait
        held = self._take(etcd_key, method, digest, kind)
        while not isinstance(held, Reservation):
            action = decide(held, method=method, digest=digest)
            if action is IdemAction.REPLAY:
                return held.response
            if action is IdemAction.CONFLICT:
                raise KeyReused(conflict_message(key, held, method))
            if time.monotonic() >= deadline:
                raise RequestInFlight(
                    f"a request with idempotency key {key!r} is still in progress; retry shortly"
                )
            time.sleep(_POLL)
            # The same request is in flight: read until it stored its response, and take the
            # key if it was freed meanwhile (its call failed, or its replica died).
            kv = self._ctx.kv.get(etcd_key)
            held = (
                decode(IdemRecord, kv.value, mod_revision=kv.mod_revision)
                if kv
                else self._take(etcd_key, method, digest, kind)
            )
        return held

    def _check_bound(self, principal: str, etcd_key: str) -> None:
        """ResourceExhausted if ``etcd_key`` is new and ``principal`` already holds
        ``max_keys`` keys (claim calls' keys, which expire with a lease, are not counted)."""
        snap = self._ctx.kv.read(
            get(etcd_key),
            get_prefix(self._ctx.keys.idem(principal, ""), count_only=True),
        )
        if snap.range_one(0) is not None or snap.range_count(1) < self._max_keys:
            return
        if self._made_room(principal):
            return
        raise ResourceExhausted(
            f"principal {principal!r} holds {self._max_keys} idempotency keys, the limit, "
            f"and none of its oldest is {MIN_KEPT / 60:g} minutes old yet (older ones make "
            "room for new ones); reuse a key only for a retry, send this request without one, "
            "or retry in a few minutes"
        )

    def _made_room(self, principal: str) -> bool:
        """Delete ``principal``'s oldest tenth of keys if the newest of them is older than
        MIN_KEPT (True), else nothing (False). Once per tenth of the bound new keys, one
        keys-only read of the principal's keys."""
        ctx = self._ctx
        prefix = ctx.keys.idem(principal, "")
        held, _ = ctx.kv.range_page(prefix, ctx.kv.prefix_end(prefix), keys_only=True)
        oldest = sorted(held, key=lambda k: k.create_revision)[: max(1, self._max_keys // 10)]
        if not oldest:
            return True
        newest = ctx.kv.get(oldest[-1].key)
        if newest is not None and decode(IdemRecord, newest.value).at > ctx.clock.now() - MIN_KEPT:
            return False
        for first in range(0, len(oldest), _DELETES_PER_TXN):
            batch = oldest[first : first + _DELETES_PER_TXN]
            ctx.kv.txn([], [delete(k.key) for k in batch])
        log.info("idempotency keys made room", principal=principal, deleted=len(oldest))
        return True

    def _take(
        self, etcd_key: str, method: str, digest: str, kind: WriteKind
    ) -> Reservation | IdemRecord:
        """Reserve the key if it is free, else read what holds it: one round trip. Every claim
        the SDK sends is keyed, and a read before the reserve cost each of them one more etcd
        round trip (claim_next's median went from 5.6 to 7.5-9.7 ms)."""
        ctx = self._ctx
        record = IdemRecord(method, digest, IdemState.PENDING, ctx.clock.now())
        result = ctx.kv.txn(
            [create_revision_is(etcd_key, 0)],
            [put(etcd_key, encode(record), lease=self._pending.lease())],
            [get(etcd_key)],
            kind=kind,
        )
        if result.succeeded:
            return Reservation(etcd_key, method, digest, result.revision)
        kv = result.range_one(0)
        assert kv is not None  # the compare failed: the key exists at the txn's revision
        return decode(IdemRecord, kv.value, mod_revision=kv.mod_revision)

    def complete(self, reservation: Reservation, response: bytes, *, claims: bool = False) -> bool:
        """Store the response for replays: as long as the longest lease if it hands out
        ``claims`` (see the module docstring), ``LARGE_TTL`` if it is over ``KEPT_LONG``
        bytes, else ``ttl``; False if the reservation was lost meanwhile. A write that only
        adds data: above etcd's high-water mark the space guard refuses it (SpaceRefused)."""
        ctx = self._ctx
        record = IdemRecord(
            reservation.method,
            reservation.request_digest,
            IdemState.DONE,
            ctx.clock.now(),
            response=response,
        )
        window = self._done if len(response) <= KEPT_LONG else self._large
        if claims:
            window = self._claims
        return ctx.kv.txn(
            [mod_revision_is(reservation.key, reservation.mod_revision)],
            [put(reservation.key, encode(record), lease=window.lease())],
            kind=WriteKind.GROWTH,
        ).succeeded

    def abandon(self, reservation: Reservation) -> None:
        """Free the key after a failed call (errors are not stored)."""
        self._ctx.kv.txn(
            [mod_revision_is(reservation.key, reservation.mod_revision)],
            [delete(reservation.key)],
        )
