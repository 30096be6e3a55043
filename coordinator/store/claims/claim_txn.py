"""The claim transaction, built without I/O: ``claim_write``.

One etcd txn moves a task from READY (or from CLAIMED whose claim key is gone) to CLAIMED,
creates the claim key on a fresh lease, starts the attempt (in the task record at schema 3, in a
key of its own before) and writes the event, and takes the task out of the ready index. Its
revision is the claim generation: the fencing token. The claim operation that reads, decides
and sends it is store/claims/claim.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.checkpoints import resumable_checkpoint
from coordinator.domain.idempotency import Grant
from coordinator.domain.records import AttemptRecord, ClaimRecord, TaskRecord, encode, with_changes
from coordinator.domain.states import AttemptEnd, Op, TaskState
from coordinator.domain.versions import ATTEMPT_IN_RECORD_SCHEMA
from coordinator.store.claims.claim_keys import ClaimKey
from coordinator.store.claims.gates import ClaimRead
from coordinator.store.context import StoreContext
from coordinator.store.etcd.leases import ClaimLease
from coordinator.store.etcd.ops import Compare, RequestOp, create_revision_is, put
from coordinator.store.fence import epoch_is
from coordinator.store.transition import put_attempt, transition, transition_ops


@dataclass(frozen=True)
class ClaimWrite:
    """The claim txn built on one read: the records it writes, its compares and its ops."""

    after: TaskRecord
    claim: ClaimRecord
    attempt: AttemptRecord
    compares: list[Compare]
    ops: list[RequestOp]


def claim_write(
    ctx: StoreContext,
    read: ClaimRead,
    *,
    principal: str,
    epoch: int,
    lease: ClaimLease,
    attempt_id: str,
    now: float,
    key: ClaimKey | None = None,
) -> ClaimWrite:
    """The claim txn of ``principal`` on ``read``: the task to CLAIMED, the claim key on the
    lease, the new attempt, and for a takeover the old attempt closed as EXPIRED; with a
    ``key`` (a keyed ClaimNext) its record naming this claim too, if the key is as that call
    left it (store/claims/claim_keys.py). Only builds: reads and writes nothing (``ctx`` gives
    the key layout and the limits)."""
    keys, task = ctx.keys, read.task
    takeover = task.state is TaskState.CLAIMED
    claim, attempt = _new_records(
        ctx, read, principal=principal, epoch=epoch, lease=lease, attempt_id=attempt_id, now=now
    )
    after = _claimed(ctx, read, attempt, lease)
    # The task key's mod_revision compare (what this claim read is still current) comes from
    # transition_ops, as for every move of a task.
    compares, ops = transition_ops(
        ctx, task, after, Op.CLAIM, by=principal, attempt_id=attempt_id, epoch=epoch
    )
    compares += [
        create_revision_is(keys.claim(task.task_id), 0),
        epoch_is(keys, epoch),
        create_revision_is(keys.claims_paused, 0),
        create_revision_is(keys.queue_paused(task.queue), 0),
    ]
    ops.append(put(keys.claim(task.task_id), encode(claim), lease=lease.lease_id))
    if not after.attempt_in_record:
        ops.append(put(keys.attempt(task.task_id, attempt_id), encode(attempt)))
    # The task's compare holds the attempt too: whatever ends an attempt writes the task.
    if takeover and read.attempt is not None:
        put_attempt(ctx, ops, with_changes(read.attempt, end=AttemptEnd.EXPIRED, ended_at=now))
    if key is not None:  # a keyed ClaimNext: the key's record names this claim too
        compares.append(key.compare())
        ops.append(key.put(_grant(read, attempt_id, lease, now)))
    return ClaimWrite(after, claim, attempt, compares, ops)


def _claimed(
    ctx: StoreContext, read: ClaimRead, attempt: AttemptRecord, lease: ClaimLease
) -> TaskRecord:
    """The read task CLAIMED for ``attempt`` on ``lease``. At schema 3 the record describes the
    attempt, which then gets no key of its own unless it starts from a checkpoint (the record
    holds none). A takeover writes the retry decision on the attempt it closes, as the
    reclaimer would: its error, or an uncounted attempt (an epoch bump fenced it)."""
    task = read.task
    closing = read.takeover.changes(task) if read.takeover is not None else {}
    return transition(
        task,
        Op.CLAIM,
        attempt.started_at,
        claim_generation=0,  # this txn's revision; see TaskRecord.claim_generation
        scheduler_epoch=attempt.scheduler_epoch,
        attempt=attempt.attempt,
        attempt_id=attempt.attempt_id,
        owner_id=attempt.owner_id,
        lease_id=lease.lease_id,
        last_error=closing.get("last_error", task.last_error),
        last_error_code=closing.get("last_error_code", task.last_error_code),
        attempts_base=closing.get("attempts_base", task.attempts_base),
        attempt_in_record=ctx.writes_schema(ATTEMPT_IN_RECORD_SCHEMA) and not attempt.checkpoint,
        attempt_ttl=lease.ttl,
        attempt_started_at=attempt.started_at,
    )


def _grant(read: ClaimRead, attempt_id: str, lease: ClaimLease, now: float) -> Grant:
    """This claim as a keyed ClaimNext's record names it: as the answer will (the lease clock,
    the decision's message; store/claims/claim_keys.py)."""
    remaining = lease.remaining
    return Grant(read.task.task_id, attempt_id, now + remaining, remaining, read.verdict.message)


def _new_records(
    ctx: StoreContext,
    read: ClaimRead,
    *,
    principal: str,
    epoch: int,
    lease: ClaimLease,
    attempt_id: str,
    now: float,
) -> tuple[ClaimRecord, AttemptRecord]:
    """The live claim (on ``lease``, within the replica's limits) and the new attempt that
    ``claim_write`` puts."""
    task, limits = read.task, ctx.limits
    claim = ClaimRecord(
        attempt_id=attempt_id,
        owner_id=principal,
        lease_id=lease.lease_id,
        ttl=lease.ttl,
        claimed_at=now,
        deadline=now + limits.max_claim_duration,
        stall_timeout=limits.stall_timeout,
        progress_at=now,
    )
    attempt = AttemptRecord(
        task_id=task.task_id,
        attempt_id=attempt_id,
        attempt=task.attempt + 1,
        owner_id=principal,
        revision=task.revision,
        input_digest=task.input_digest,
        scheduler_epoch=epoch,
        ttl=lease.ttl,
        started_at=now,
        checkpoint=handed_checkpoint(read),
    )
    return claim, attempt


def handed_checkpoint(read: ClaimRead) -> bytes:
    """The checkpoint a new attempt starts from (domain/checkpoints.py): the previous
    attempt's, if it ran on the same revision; the new attempt keeps it until it writes its
    own."""
    return resumable_checkpoint(read.task, read.attempt)
