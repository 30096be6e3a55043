"""The claim transaction: Claim and ClaimNext.

One etcd txn moves a task from READY (or from CLAIMED whose claim key is gone) to CLAIMED,
creates the claim key on a fresh lease, writes the attempt and the event, and takes the task
out of the ready index. Its revision is the claim generation: the fencing token.
"""

from __future__ import annotations

import random
from dataclasses import replace

from coordinator import metrics
from coordinator.domain.decisions import Fence, FenceView, Verdict, clamp_ttl, decide_claim
from coordinator.domain.keys import task_id_from_ready_key
from coordinator.domain.records import AttemptRecord, ClaimRecord, TaskRecord, encode
from coordinator.domain.states import Op, Outcome, TaskState
from coordinator.errors import LeaseGone, NotFound
from coordinator.metrics import AcceptancePoint
from coordinator.store import coverage
from coordinator.store.context import (
    StoreContext,
    epoch_from_kv,
    new_attempt_id,
    task_from_kv,
)
from coordinator.store.effects import hold_for_approval
from coordinator.store.etcd import KV, create_revision_is, get, get_prefix, put
from coordinator.store.fence import epoch_is
from coordinator.store.held import HeldClaims
from coordinator.store.ready_index import ReadyIndex
from coordinator.store.reconcile import ReconcileStore
from coordinator.store.transition import close_expired_attempt, transition, transition_ops
from coordinator.store.types import ClaimResult

# ClaimNext picks at random among this many ready keys, so that concurrent workers do not all
# race for the same head-of-queue key.
HERD_SPREAD = 8
CLAIM_NEXT_TRIES = 16
# A claim txn that lost to a change other than a claim (a reclaim) reads and tries again.
_RACE_TRIES = 3


class ClaimStore:
    """Claim and ClaimNext."""

    def __init__(self, ctx: StoreContext, ready: ReadyIndex, held: HeldClaims) -> None:
        self._ctx = ctx
        self._ready = ready
        self._held = held
        self._reconcile = ReconcileStore(ctx, ready)

    def claim(
        self,
        task_id: str,
        *,
        principal: str,
        epoch: int,
        ttl: int,
        expected_state_version: int = 0,
    ) -> ClaimResult:
        """Claim one task for ``principal`` with a lease of ``ttl`` seconds (clamped)."""
        result: ClaimResult | None = None
        for _ in range(_RACE_TRIES):
            result = self._claim(
                task_id,
                principal=principal,
                epoch=epoch,
                ttl=ttl,
                expected_state_version=expected_state_version,
            )
            if result is not None:
                break
        if result is None:  # lost every try to changes that were not claims
            result = ClaimResult(
                Verdict(Outcome.ALREADY_CLAIMED, message="the task kept changing; claim again")
            )
        metrics.count_claim(result.verdict.outcome)  # contention: ALREADY_CLAIMED / all
        return result

    def _claim(
        self, task_id: str, *, principal: str, epoch: int, ttl: int, expected_state_version: int
    ) -> ClaimResult | None:
        """One read-decide-txn round; None when the txn lost to a change that left the task
        claimable (a reclaim, an input change): worth another round."""
        ctx, keys = self._ctx, self._ctx.keys
        task, verdict, reconciling = self._decide(task_id, epoch, expected_state_version)
        if not verdict.accepted:
            return ClaimResult(verdict, task=task)
        # An UNKNOWN effect's open reconciliation: wait for its owner, or escalate at the deadline.
        gated = self._reconcile.claim_gate(task, reconciling, by=principal, epoch=epoch)
        if gated is not None:
            return ClaimResult(gated, task=task)
        held = hold_for_approval(ctx, task, by=principal, epoch=epoch)
        if held is not None:  # non-replayable, and an earlier attempt left an effect uncertain
            if task.state is TaskState.READY:
                self._ready.discard(keys.ready(task.queue, task.priority, task.ready_seq, task_id))
            return ClaimResult(held, task=task)

        lease = ctx.leases.acquire(clamp_ttl(ttl, ctx.limits))
        lease_id, granted = lease.lease_id, lease.ttl
        now = ctx.clock.now()
        number = task.attempt + 1
        attempt_id = new_attempt_id(number)
        after = transition(
            task,
            Op.CLAIM,
            now,
            claim_generation=0,  # this txn's revision; see TaskRecord.claim_generation
            scheduler_epoch=epoch,
            attempt=number,
            attempt_id=attempt_id,
            owner_id=principal,
            lease_id=lease_id,
        )
        claim = ClaimRecord(
            attempt_id=attempt_id,
            owner_id=principal,
            lease_id=lease_id,
            ttl=granted,
            claimed_at=now,
            deadline=now + ctx.limits.max_claim_duration,
            stall_timeout=ctx.limits.stall_timeout,
            progress_at=now,
        )
        attempt = AttemptRecord(
            task_id=task_id,
            attempt_id=attempt_id,
            attempt=number,
            owner_id=principal,
            revision=task.revision,
            input_digest=task.input_digest,
            scheduler_epoch=epoch,
            ttl=granted,
            started_at=now,
        )
        compares, ops = transition_ops(
            ctx, task, after, Op.CLAIM, by=principal, attempt_id=attempt_id, epoch=epoch
        )
        compares += [
            create_revision_is(keys.claim(task_id), 0),
            epoch_is(keys, epoch),
            create_revision_is(keys.claims_paused, 0),
        ]
        ops += [
            put(keys.claim(task_id), encode(claim), lease=lease_id),
            put(keys.attempt(task_id, attempt_id), encode(attempt)),
        ]
        ops += close_expired_attempt(ctx, task, now)
        try:
            result = ctx.kv.txn(compares, ops)
        except LeaseGone:  # a reused lease is gone: nothing was written; try with a fresh grant
            ctx.leases.lost(lease_id)
            return None
        if not result.succeeded:
            ctx.leases.release(lease_id)  # nothing was attached to it
            lost = self._lost_race(task_id, epoch, expected_state_version)
            return None if lost is None else ClaimResult(lost)

        generation = result.revision
        coverage.observe(
            AcceptancePoint.CLAIM, compares, keys, task_id=task_id, epoch=epoch, generation=0
        )
        if task.state is TaskState.READY:
            # Our own replica drops the hint at once; the watch does it for the others.
            self._ready.discard(keys.ready(task.queue, task.priority, task.ready_seq, task_id))
        fence = Fence(task_id, attempt_id, generation, epoch, task.cancel_generation)
        claimed = replace(after, claim_generation=generation, state_version=generation)
        self._held.remember(
            fence,
            FenceView(
                task=claimed,
                attempt=replace(attempt, claim_generation=generation),
                claim=replace(claim, generation=generation, mod_revision=generation),
                epoch=epoch,
            ),
        )
        return ClaimResult(
            Verdict(Outcome.CLAIMED, message=verdict.message),
            fence=fence,
            task=claimed,
            attempt=number,
            ttl=granted,
            lease_expires_at=now + lease.remaining,
            deadline=claim.deadline,
            lease_remaining=lease.remaining,
        )

    def claim_next(self, queue: str, *, principal: str, epoch: int, ttl: int) -> ClaimResult:
        """Claim the next ready task of ``queue`` (or NO_READY_TASK)."""
        for _ in range(CLAIM_NEXT_TRIES):
            key = self._ready.take(queue, HERD_SPREAD, choose=random.choice)
            if key is None:
                break
            try:
                result = self.claim(
                    task_id_from_ready_key(key), principal=principal, epoch=epoch, ttl=ttl
                )
            except NotFound:
                self._ready.discard(key)
                continue
            finally:
                self._ready.untake(key)
            outcome = result.verdict.outcome
            if outcome in (Outcome.CLAIMED, Outcome.CLAIMS_PAUSED, Outcome.FENCED):
                return result
            self._ready.discard(key)  # a stale hint: someone else took it
        metrics.count_claim(Outcome.NO_READY_TASK)
        return ClaimResult(
            Verdict(Outcome.NO_READY_TASK, message=f"queue {queue!r} has no ready task")
        )

    def _decide(
        self, task_id: str, epoch: int, expected_state_version: int
    ) -> tuple[TaskRecord, Verdict, list[KV]]:
        """The task, the claim decision, and the task's open reconciliations (in the same
        read: no extra round trip; almost always an empty range)."""
        keys = self._ctx.keys
        snap = self._ctx.kv.read(
            get(keys.task(task_id)),
            get(keys.claim(task_id)),
            get(keys.epoch),
            get(keys.claims_paused),
            get_prefix(keys.reconcile_prefix(task_id)),
        )
        task_kv = snap.range_one(0)
        if task_kv is None:
            raise NotFound(f"task {task_id!r} does not exist")
        task = task_from_kv(task_kv)
        verdict = decide_claim(
            task,
            claim_alive=snap.range_one(1) is not None,
            expected_state_version=expected_state_version,
            caller_epoch=epoch,
            current_epoch=epoch_from_kv(snap.range_one(2)),
            paused=snap.range_one(3) is not None,
        )
        return task, verdict, snap.range_kvs(4)

    def _lost_race(self, task_id: str, epoch: int, expected_state_version: int) -> Verdict | None:
        """After a failed claim txn: the deterministic outcome for the loser (ALREADY_CLAIMED
        when another claim won: its key is alive), or None when what changed the task was not
        a claim (the reclaimer moved it to READY meanwhile, say) and it is still claimable."""
        _, verdict, _ = self._decide(task_id, epoch, expected_state_version)
        return None if verdict.accepted else verdict
