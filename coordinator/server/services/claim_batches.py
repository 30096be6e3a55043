"""Claiming through the long poll for ClaimNext and a Commit's ``next``, keyed or not.

A keyed call writes its idempotency key in its own claim txns (store/claims/claim_keys.py): a
retry whose first try won gets what that try won, still alive; once none is, it runs again.
"""

from __future__ import annotations

from coordinator.logging import bound, note
from coordinator.server.services.call_notes import note_claim
from coordinator.server.wire import worker_wire
from coordinator.server.wire.worker_requests import ClaimNextArgs
from coordinator.store import Caller, Store
from coordinator.store.claims.claim_keys import ClaimKey, KeyTaken
from coordinator.v1 import worker_pb2


class ClaimBatches:
    """The claims of one ClaimNext (or a Commit's ``next``), as its response."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def claim(
        self,
        next_claim: ClaimNextArgs,
        principal: str,
        caller: Caller,
        *,
        key: ClaimKey | None = None,
    ) -> worker_pb2.ClaimResponse:
        """Up to ``max_tasks`` claims, the first waiting up to ``wait``; each claim txn
        carrying ``key``, if given (KeyTaken when another try of the call wrote it)."""
        queue, epoch = next_claim.queue, next_claim.epoch
        with bound(queue=queue, epoch=epoch, principal=principal):
            results = self._store.long_poll.claim_batch(
                queue,
                principal=principal,
                epoch=epoch,
                ttl=next_claim.ttl,
                wait=next_claim.wait,
                caller=caller,
                max_tasks=next_claim.max_tasks,
                key=key,
            )
            note_claim(results[0])
            if len(results) > 1:
                note(claimed=len(results))
        return worker_wire.batch_to_proto(results)

    def keyed(
        self,
        next_claim: ClaimNextArgs,
        principal: str,
        caller: Caller,
        method: str,
        keyed: tuple[str, str],
    ) -> worker_pb2.ClaimResponse:
        """``claim`` for a call with an idempotency key and request digest (``keyed``): its
        key written by its claim txns; KeyReused if the key names another request."""
        key, digest = keyed
        keyed_claims = self._store.keyed_claims
        opened = keyed_claims.open(principal, key, method=method, digest=digest)
        try:
            return self.claim(next_claim, principal, caller, key=opened)
        except KeyTaken as taken:  # another try of this call (its first) won
            again = keyed_claims.taken(taken.kv, opened)
        if isinstance(again, ClaimKey):  # what it won has all ended: run as a call anew
            try:
                return self.claim(next_claim, principal, caller, key=again)
            except KeyTaken as taken:
                again = keyed_claims.replay(taken.kv, again)
        note(idempotent_replay=True, idempotency_key=key)
        return worker_wire.batch_to_proto(again)
