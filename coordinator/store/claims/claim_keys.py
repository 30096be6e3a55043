"""A keyed ClaimNext: its idempotency key is written by its own claim txns.

The SDK keys every ClaimNext, so that a retry after a lost answer gets the claims the first try
won instead of winning others (tests/sdk/test_lost_claim_answers.py). The generic path
(store/control/idempotency.py) cost such a call two txns and two writes of its key around the
claim: a PENDING reservation before, the stored answer after. A keyed ClaimNext instead costs
nothing more than one key in its claim txn:

- each claim txn it makes carries the key (``ClaimKey``): a compare that the key is as this
  call left it (absent, for a first try) and a put of the record naming every claim so far;
- a claim txn that meets the key written by another try (the first try of a retry, or a
  duplicate running meanwhile) writes nothing, and reads the key in its failure branch
  (``KeyTaken``): the call answers with that try's claims still alive (``taken``), or, when
  none is left, runs once more as a call whose first try failed would (its claims went back to
  the queue), expecting the record as read, so that of two such retries only one claims;
- a call that would answer without a claim (an empty queue, a long poll's end) first reads its
  key once (``ClaimKey.probe_due``): a retry whose first try won the only ready task finds it
  there instead of waiting out its poll while its claim expires unanswered;
- a call that wins nothing writes nothing.

The record names each claim (task, attempt, and the lease clock the answer gave), not a copy of
the answer, and so never a copy of up to 64 inputs. A replay reads each claim's task, claim key
and attempt, and answers those still alive as the first answer did (the same fence, input,
checkpoint and lease clock); one that ended meanwhile (expired, given back because the first
try's caller had gone, cancelled) is left out. The key used for another request is KeyReused
(ALREADY_EXISTS) when the call meets it.

The record lives on a lease of at most ``limits.max_ttl`` (one per window, as the generic
path's): a replay is worth something only while a claim it names can be alive. The records
live under their own prefix: a replica of the previous version does not read them, so during a
rolling upgrade a retry that lands on it runs again, as an unkeyed call would (the first try's
claim then expires after its TTL); a record of this kind is never misread as a stored answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice

from coordinator.domain.decisions import Fence, Verdict
from coordinator.domain.idempotency import (
    Grant,
    IdemAction,
    KeyedClaims,
    KeyReused,
    conflict_message,
    decide,
)
from coordinator.domain.records import decode, encode
from coordinator.domain.states import Outcome, TaskState
from coordinator.store.context import StoreContext, attempt_of, claim_from_kv, task_from_kv
from coordinator.store.etcd.lease_window import LeaseWindow
from coordinator.store.etcd.ops import KV, Compare, RequestOp, get, mod_revision_is, put
from coordinator.store.task_inputs import input_read, joined
from coordinator.store.types import ClaimResult

# Claims read back per etcd read by a replay: four keys each (the input's own key, schema 2),
# and each task's input may be up to 256 KiB, so a read stays within etcd's ops per txn and the
# client's message size.
_REPLAY_CHUNK = 8


class KeyTaken(Exception):
    """A claim txn of a keyed ClaimNext failed because its key was written meanwhile (a
    duplicate of the call won a claim first): nothing was written; answer with ``kv``."""

    def __init__(self, kv: KV) -> None:
        super().__init__("the idempotency key was written by another try of the call")
        self.kv = kv


class ClaimKey:
    """The key one keyed ClaimNext's claim txns carry, advanced by each claim that lands (used
    by that call's thread only)."""

    def __init__(
        self,
        etcd_key: str,
        key: str,
        record: KeyedClaims,
        window: LeaseWindow,
        *,
        revision: int = 0,
    ) -> None:
        self.etcd_key = etcd_key
        self.key = key
        self.record = record
        self._window = window
        # The key's mod_revision as this call read or last left it (0: absent).
        self._revision = revision
        self._lease_id = 0  # the window's lease the last put named
        self._pending = record  # the record the last put wrote
        self._probed = False

    def compare(self) -> Compare:
        """The key is as this call last left it."""
        return mod_revision_is(self.etcd_key, self._revision)

    def put(self, grant: Grant) -> RequestOp:
        """The record with ``grant`` added, on the window's lease (this call's record once the
        txn carrying it lands: ``landed``)."""
        self._pending = self.record.with_grant(grant)
        return put(self.etcd_key, encode(self._pending), lease=self._lease())

    def _lease(self) -> int:
        self._lease_id = self._window.lease()
        return self._lease_id

    def read(self) -> RequestOp:
        """The claim txn's failure branch reads the key, to tell a duplicate from a race."""
        return get(self.etcd_key)

    def landed(self, revision: int) -> None:
        """The claim txn carrying the last ``put`` landed at ``revision``."""
        self.record = self._pending
        self._revision = revision

    def meet(self, kv: KV | None) -> None:
        """The key as read (a failed claim txn's failure branch, a probe): KeyTaken if another
        try wrote it since this call read or last left it."""
        if kv is None:
            # A record this call expected expired meanwhile (its lease): expect the key absent.
            self._revision = 0
        elif kv.mod_revision != self._revision:
            raise KeyTaken(kv)

    def probe_due(self) -> bool:
        """Whether this call, about to answer without a claim, should read its key first:
        once, and only if it has won nothing."""
        due = not self._probed and not self.record.task_ids
        self._probed = True
        return due

    def lease_lost(self) -> None:
        """etcd refused a lease of the claim txn: the window's may be the one gone."""
        self._window.lost(self._lease_id)


class KeyedClaimStore:
    """Open a keyed ClaimNext's key, and replay the claims an earlier try won."""

    def __init__(self, ctx: StoreContext, *, ttl: float) -> None:
        self._ctx = ctx
        self._window = LeaseWindow(ctx.kv.grant, min(ttl, float(ctx.limits.max_ttl)))

    def open(self, principal: str, key: str, *, method: str, digest: str) -> ClaimKey:
        """The key this call's claim txns carry, expected absent (no I/O: a first try, the
        usual case, costs no read; a retry learns of its first try from its claim txn or its
        probe)."""
        etcd_key = self._ctx.keys.keyed_claims(principal, key)
        return ClaimKey(etcd_key, key, KeyedClaims(method, digest), self._window)

    def taken(self, kv: KV, opened: ClaimKey) -> ClaimKey | list[ClaimResult]:
        """The call met ``kv``, written by another try: that try's claims still alive, as it
        answered them; or, when none is, the key to run again with, expecting ``kv`` (of two
        retries that both find it so, one claims). KeyReused if ``kv`` names another request.
        Reads only."""
        alive = self._replayed(kv, opened.key, opened.record)
        if alive:
            return alive
        return ClaimKey(
            opened.etcd_key, opened.key, opened.record, self._window, revision=kv.mod_revision
        )

    def replay(self, kv: KV, opened: ClaimKey) -> list[ClaimResult]:
        """As ``taken`` for a call that ran again already: NO_READY_TASK when none is alive."""
        alive = self._replayed(kv, opened.key, opened.record)
        if alive:
            return alive
        message = "another try of this call won first, and its claims have ended; claim again"
        return [ClaimResult(Verdict(Outcome.NO_READY_TASK, message=message))]

    def _replayed(self, kv: KV, key: str, asked: KeyedClaims) -> list[ClaimResult]:
        """The claims ``kv``'s record names that are still alive; KeyReused if it was written
        for another request than ``asked``."""
        record = decode(KeyedClaims, kv.value, mod_revision=kv.mod_revision)
        verdict = decide(record, method=asked.method, digest=asked.request_digest)
        if verdict is IdemAction.CONFLICT:
            raise KeyReused(conflict_message(key, record, asked.method))
        return [result for chunk in _chunks(record.grants()) for result in self._alive(chunk)]

    def _alive(self, grants: Sequence[Grant]) -> list[ClaimResult]:
        keys = self._ctx.keys
        ops: list[RequestOp] = []
        for grant in grants:
            ops += [
                get(keys.task(grant.task_id)),
                get(keys.claim(grant.task_id)),
                get(keys.attempt(grant.task_id, grant.attempt_id)),
                input_read(keys, grant.task_id),
            ]
        snap = self._ctx.kv.read(*ops)
        results = []
        for n, grant in enumerate(grants):
            task_kv, claim_kv, attempt_kv = (snap.range_one(4 * n + i) for i in range(3))
            if task_kv is None or claim_kv is None:
                continue
            # Alive: the task is still at the claim's revision (every move of a task writes
            # it, and the fence compares it) and names this attempt.
            if task_kv.mod_revision != claim_kv.create_revision:
                continue
            task = joined(task_from_kv(task_kv), snap.range_one(4 * n + 3))
            claim = claim_from_kv(claim_kv)
            if task.state is not TaskState.CLAIMED or task.attempt_id != grant.attempt_id:
                continue
            attempt = attempt_of(task, grant.attempt_id, attempt_kv)  # its key, or the record
            if attempt is None:
                continue
            fence = Fence(
                task.task_id,
                grant.attempt_id,
                claim.generation,
                attempt.scheduler_epoch,
                task.cancel_generation,
            )
            results.append(
                ClaimResult(
                    Verdict(Outcome.CLAIMED, message=grant.message),
                    fence=fence,
                    task=task,
                    attempt=attempt.attempt,
                    ttl=claim.ttl,
                    lease_expires_at=grant.lease_expires_at,
                    deadline=claim.deadline,
                    lease_remaining=grant.lease_remaining,
                    checkpoint=attempt.checkpoint,
                )
            )
        return results


def _chunks(grants: Iterable[Grant]) -> Iterable[list[Grant]]:
    it = iter(grants)
    while chunk := list(islice(it, _REPLAY_CHUNK)):
        yield chunk
