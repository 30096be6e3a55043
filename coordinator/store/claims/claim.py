"""Claim and ClaimNext: the claim read, the decision, the gates, the lease and the claim txn
(built by store/claims/claim_txn.py). The txn's revision is the claim generation: the fencing
token.

A claim's I/O, in order: one read (``_read``: the decision and all a gate or a takeover
needs), the gates it was given (store/claims/gates.py), a lease, the txn that ``claim_write``
builds without I/O, then remembering what the txn wrote (store/attempts/views.py).

``aclaim`` and ``aclaim_next`` are the operations, as coroutines awaiting each etcd call
through a ``StepIO`` (store/etcd/step_io.py); ``claim`` and ``claim_next`` run them on the
calling thread. The gates are called as they are: they touch etcd only in rare cases (an
open reconciliation, a task held for approval).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from coordinator.domain.decisions import Fence, FenceView, Verdict, clamp_ttl, decide_claim
from coordinator.domain.keys import task_id_from_ready_key
from coordinator.domain.records import AttemptRecord, TaskRecord, as_stored, with_changes
from coordinator.domain.retry import takeover
from coordinator.domain.states import Outcome, TaskState
from coordinator.errors import LeaseGone, NotFound
from coordinator.metrics import AcceptancePoint
from coordinator.store import coverage
from coordinator.store.attempts.views import HeldClaims
from coordinator.store.claims.claim_keys import ClaimKey
from coordinator.store.claims.claim_txn import ClaimWrite, claim_write
from coordinator.store.claims.gates import ClaimGate, ClaimRead
from coordinator.store.context import (
    StoreContext,
    attempt_of,
    epoch_from_kv,
    new_attempt_id,
    task_from_kv,
)
from coordinator.store.etcd.leases import ClaimLease
from coordinator.store.etcd.ops import get, get_prefix
from coordinator.store.etcd.step_io import StepIO, run_now
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.task_inputs import input_read, joined
from coordinator.store.types import ClaimResult

# ClaimNext picks at random among this many ready keys, so that concurrent workers do not all
# race for the same head-of-queue key.
HERD_SPREAD = 8
CLAIM_NEXT_TRIES = 16
# A claim txn that lost to a change other than a claim (a reclaim) reads and tries again.
_RACE_TRIES = 3


class ClaimStore:
    """Claim and ClaimNext."""

    def __init__(
        self,
        ctx: StoreContext,
        ready: ReadyIndex,
        held: HeldClaims,
        gates: Sequence[ClaimGate],
    ) -> None:
        self._ctx = ctx
        self._ready = ready
        self._held = held
        self._gates = tuple(gates)

    def claim(
        self,
        task_id: str,
        *,
        principal: str,
        epoch: int,
        ttl: int,
        expected_state_version: int = 0,
        key: ClaimKey | None = None,
    ) -> ClaimResult:
        """``aclaim``, run on this thread."""
        return run_now(
            self.aclaim(
                self._ctx.io,
                task_id,
                principal=principal,
                epoch=epoch,
                ttl=ttl,
                expected_state_version=expected_state_version,
                key=key,
            )
        )

    async def aclaim(
        self,
        io: StepIO,
        task_id: str,
        *,
        principal: str,
        epoch: int,
        ttl: int,
        expected_state_version: int = 0,
        key: ClaimKey | None = None,
    ) -> ClaimResult:
        """Claim one task for ``principal`` with a lease of ``ttl`` seconds (clamped); with the
        ``key`` of a keyed ClaimNext in the same txn (KeyTaken if a duplicate wrote it)."""
        result: ClaimResult | None = None
        for _ in range(_RACE_TRIES):
            result = await self._claim(
                io,
                task_id,
                principal=principal,
                epoch=epoch,
                ttl=ttl,
                expected_state_version=expected_state_version,
                key=key,
            )
            if result is not None:
                break
        if result is None:  # lost every try to changes that were not claims
            result = ClaimResult(
                Verdict(Outcome.ALREADY_CLAIMED, message="the task kept changing; claim again")
            )
        self._ctx.metrics.count_claim(result.verdict.outcome)  # contention: ALREADY_CLAIMED / all
        return result

    async def _claim(
        self,
        io: StepIO,
        task_id: str,
        *,
        principal: str,
        epoch: int,
        ttl: int,
        expected_state_version: int,
        key: ClaimKey | None,
    ) -> ClaimResult | None:
        """One round: read and decide, the gates, a lease, the txn, remembering what it wrote.
        None when the txn lost to a change that left the task claimable (a reclaim, an input
        change): worth another round."""
        ctx = self._ctx
        read = await self._read(io, task_id, epoch, expected_state_version)
        if not read.verdict.accepted:
            return ClaimResult(read.verdict, task=read.task)
        for gate in self._gates:
            answer = gate.check(read, by=principal, epoch=epoch)
            if answer is not None:
                return ClaimResult(answer, task=read.task)
        lease = await io.lease(clamp_ttl(ttl, ctx.limits))
        now = ctx.clock.now()
        write = claim_write(
            ctx,
            read,
            principal=principal,
            epoch=epoch,
            lease=lease,
            attempt_id=new_attempt_id(read.task.attempt + 1),
            now=now,
            key=key,
        )
        try:
            result = await io.txn(write.compares, write.ops, [key.read()] if key else [])
        except LeaseGone:  # a reused lease is gone: nothing was written; try with a fresh grant
            ctx.leases.lost(lease.lease_id)
            if key is not None:
                key.lease_lost()
            return None
        if not result.succeeded:
            await io.release(lease.lease_id)  # nothing was attached to it
            if key is not None:
                key.meet(result.range_one(0))  # another try of the call won first: KeyTaken
            lost = await self._lost_race(io, task_id, epoch, expected_state_version)
            return None if lost is None else ClaimResult(lost)
        if key is not None:
            key.landed(result.revision)
        return self._granted(read, write, result.revision, lease, now)

    def _granted(
        self, read: ClaimRead, write: ClaimWrite, generation: int, lease: ClaimLease, now: float
    ) -> ClaimResult:
        """The claim txn landed at revision ``generation``: drop the ready hint, remember what
        the txn wrote (so the holder's commit through this replica skips its read), answer."""
        keys, task, attempt = self._ctx.keys, read.task, write.attempt
        coverage.observe(
            AcceptancePoint.CLAIM,
            write.compares,
            self._ctx,
            task_id=task.task_id,
            epoch=attempt.scheduler_epoch,
            generation=0,
        )
        if task.state is TaskState.READY:
            # Our own replica drops the hint at once; the watch does it for the others.
            self._ready.discard(keys.ready(task.queue, task.priority, task.ready_seq, task.task_id))
        elif read.takeover is not None:
            # A takeover ended the expired attempt and starts the next at once: a retry, as the
            # reclaimer counts one when it gets there first (its decision allowed it now).
            expired = read.takeover.ended.end.name.lower()
            self._ctx.metrics.count_attempt_end(task.queue, expired)
            self._ctx.metrics.count_retry(task.queue, expired, wait=0.0)
        fence = Fence(
            task.task_id,
            attempt.attempt_id,
            generation,
            attempt.scheduler_epoch,
            task.cancel_generation,
        )
        claimed = with_changes(write.after, claim_generation=generation, state_version=generation)
        self._held.remember(
            fence,
            FenceView(
                task=as_stored(claimed),  # what a read returns: no input joined in
                # its key's revision is the claim's, or 0: the task record holds it (schema 3)
                attempt=with_changes(
                    attempt,
                    claim_generation=generation,
                    mod_revision=0 if write.after.attempt_in_record else generation,
                ),
                claim=with_changes(write.claim, generation=generation, mod_revision=generation),
                epoch=attempt.scheduler_epoch,
            ),
        )
        return ClaimResult(
            Verdict(Outcome.CLAIMED, message=read.verdict.message),
            fence=fence,
            task=claimed,
            attempt=attempt.attempt,
            ttl=lease.ttl,
            lease_expires_at=now + lease.remaining,
            deadline=write.claim.deadline,
            lease_remaining=lease.remaining,
            checkpoint=attempt.checkpoint,
            ready_seq=task.ready_seq,
        )

    def claim_next(
        self, queue: str, *, principal: str, epoch: int, ttl: int, key: ClaimKey | None = None
    ) -> ClaimResult:
        """``aclaim_next``, run on this thread."""
        return run_now(
            self.aclaim_next(
                self._ctx.io, queue, principal=principal, epoch=epoch, ttl=ttl, key=key
            )
        )

    async def aclaim_next(
        self,
        io: StepIO,
        queue: str,
        *,
        principal: str,
        epoch: int,
        ttl: int,
        key: ClaimKey | None = None,
    ) -> ClaimResult:
        """Claim the next ready task of ``queue`` (or NO_READY_TASK); ``key`` as ``aclaim``."""
        for _ in range(CLAIM_NEXT_TRIES):
            ready_key = self._ready.take(queue, HERD_SPREAD, choose=random.choice)
            if ready_key is None:
                break
            try:
                result = await self.aclaim(
                    io,
                    task_id_from_ready_key(ready_key),
                    principal=principal,
                    epoch=epoch,
                    ttl=ttl,
                    key=key,
                )
            except NotFound:  # an index key without a record: doctor repairs it
                self._ready.bench(ready_key)
                continue
            finally:
                self._ready.untake(ready_key)
            outcome = result.verdict.outcome
            if outcome is Outcome.CLAIMED:
                return result
            if outcome in (Outcome.CLAIMS_PAUSED, Outcome.FENCED):
                return await self._unclaimed(io, result, key)
            # Someone else took it (its deletion is on its way), or it cannot be claimed now.
            self._ready.bench(ready_key)
        self._ctx.metrics.count_claim(Outcome.NO_READY_TASK)
        none = Verdict(Outcome.NO_READY_TASK, message=f"queue {queue!r} has no ready task")
        return await self._unclaimed(io, ClaimResult(none), key)

    async def _unclaimed(
        self, io: StepIO, result: ClaimResult, key: ClaimKey | None
    ) -> ClaimResult:
        """``result``, a ClaimNext's answer without a claim; a keyed call's first such answer
        reads its key first (KeyTaken if an earlier try of the call won meanwhile)."""
        if key is not None and key.probe_due():
            key.meet(await io.get(key.etcd_key))
        return result

    async def _read(
        self, io: StepIO, task_id: str, epoch: int, expected_state_version: int
    ) -> ClaimRead:
        """One read: the task, the claim decision, and what the gates and a takeover need -
        the task's open reconciliations and the paused queues (almost always two empty
        ranges); then, for a task that had an attempt, that attempt's record at the same
        revision (``_attempt_named``)."""
        keys = self._ctx.keys
        snap = await io.read(
            get(keys.task(task_id)),
            get(keys.claim(task_id)),
            get(keys.epoch),
            get(keys.claims_paused),
            get_prefix(keys.reconcile_prefix(task_id)),
            # Bounded by PauseClaims (MAX_PAUSED_QUEUES) and empty unless a queue is paused.
            get_prefix(keys.queue_paused_prefix, keys_only=True),
            input_read(keys, task_id),  # what the winner is handed (schema 2: its own key)
        )
        task_kv = snap.range_one(0)
        if task_kv is None:
            raise NotFound(f"task {task_id!r} does not exist")
        task = joined(task_from_kv(task_kv), snap.range_one(6))
        input_lost = task.input_in_key and snap.range_one(6) is None
        current_epoch = epoch_from_kv(snap.range_one(2))
        verdict = decide_claim(
            task,
            claim_alive=snap.range_one(1) is not None,
            expected_state_version=expected_state_version,
            caller_epoch=epoch,
            current_epoch=current_epoch,
            paused=snap.range_one(3) is not None,
        )
        # Claiming a CLAIMED task takes over its expired attempt: the retry policy decides.
        took = None
        if verdict.accepted and task.state is TaskState.CLAIMED:
            took = takeover(task, current_epoch, self._ctx.clock.now())
        if verdict.accepted and input_lost:
            # Written with the record and deleted only with it: gone means someone deleted it
            # by hand. Handing out an empty input with the task's digest would run wrong work.
            verdict = Verdict(
                Outcome.NOT_CLAIMABLE,
                message=(
                    f"the task's input key {keys.input(task_id)} is missing from etcd, deleted "
                    "by hand (`coordinator doctor` reports it); a new input (UpdateInput) or a "
                    "cancel moves the task on"
                ),
            )
        elif verdict.accepted and task.deadline and self._ctx.clock.now() >= task.deadline:
            # Past schedule_to_close: the deadline pass is about to fail it; start nothing.
            verdict = Verdict(
                Outcome.NOT_CLAIMABLE, message="the task's schedule_to_close deadline passed"
            )
        elif verdict.accepted and took is not None and took.refusal:
            verdict = Verdict(Outcome.NOT_CLAIMABLE, message=took.refusal)
        attempt = await self._attempt_named(io, task, snap.revision)
        paused = (kv.key.removeprefix(keys.queue_paused_prefix) for kv in snap.range_kvs(5))
        reconciling = tuple(snap.range_kvs(4))
        return ClaimRead(task, verdict, reconciling, attempt, frozenset(paused), took)

    async def _attempt_named(
        self, io: StepIO, task: TaskRecord, revision: int
    ) -> AttemptRecord | None:
        """The record of the attempt ``task`` names, read at ``revision`` (the task's read).

        It was read in the same txn as the newest key of the task's attempts range, sorted by
        create revision: etcd reads the whole range to sort it, so a claim cost grew with the
        task's attempt count (4 ms -> 35 ms at 7,300 attempts). One key by its name costs the
        same at any count; a task's first claim (no attempt yet) reads nothing more.
        """
        if not task.attempt_id:
            return None
        key = self._ctx.keys.attempt(task.task_id, task.attempt_id)
        found, _ = await io.range_page(key, key + "\0", revision=revision)
        return attempt_of(task, task.attempt_id, found[0] if found else None)

    async def _lost_race(
        self, io: StepIO, task_id: str, epoch: int, expected_state_version: int
    ) -> Verdict | None:
        """After a failed claim txn: the deterministic outcome for the loser (ALREADY_CLAIMED
        when another claim won: its key is alive), or None when what changed the task was not
        a claim (the reclaimer moved it to READY meanwhile, say) and it is still claimable."""
        verdict = (await self._read(io, task_id, epoch, expected_state_version)).verdict
        return None if verdict.accepted else verdict
