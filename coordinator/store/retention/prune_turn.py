"""One pruner pass at a time across the replicas.

Every replica runs a pruner, and replicas walking the same due tasks archived most of them twice
(74% of archive records were duplicates with two replicas, up to N times with N): each archive
write is a sink PUT and its storage, and the losing replica's prune txns failed for nothing. A
pass first takes the turn, ``{p}/control/prune-turn`` put if absent on a lease of ``TURN_TTL``;
a replica that finds it taken skips the pass (the holder prunes what is due for everyone). The
holder keeps the lease alive between pages and revokes it at the end of its pass, which deletes
the key; a holder that dies frees the turn when its lease expires. A pass that stalls past the
lease (a paused process) may overlap the next holder's: a task is then archived twice, as
before, never lost, and pruned once (each prune is its own CAS txn).
"""

from __future__ import annotations

from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import create_revision_is, put

TURN_TTL = 20
"""Seconds a pruner that stopped answering keeps the turn from the others (a page of a pass,
between two refreshes, takes a few seconds at the pruner's request rate)."""


class PruneTurn:
    """Take, keep and give back the pruner's turn (see the module docstring)."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx
        self._lease = 0

    def take(self) -> bool:
        """Whether this replica holds the turn now (it took it, or already held it)."""
        if self._lease:
            return True
        kv, key = self._ctx.kv, self._ctx.keys.prune_turn
        lease, _ = kv.grant(TURN_TTL)
        if kv.txn([create_revision_is(key, 0)], [put(key, b"", lease=lease)]).succeeded:
            self._lease = lease
            return True
        kv.revoke(lease)
        return False

    def keep(self) -> None:
        """Refresh the turn's lease (between pages of a long pass); nothing if not held."""
        if self._lease:
            self._ctx.kv.keepalive_many([self._lease])

    def give(self) -> None:
        """End the turn: revoking the lease deletes the key. Nothing if not held."""
        lease, self._lease = self._lease, 0
        if lease:
            self._ctx.kv.revoke(lease)
