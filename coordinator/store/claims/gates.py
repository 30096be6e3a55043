"""The gates a claim passes after its decision accepted and before its txn: each may stop the
claim with its own answer, and may write to do so.

``ClaimStore`` is given its gates (``Store.open`` wires them, in order), so the claim path
shows every I/O step it takes: its read, each gate, the lease, its txn. A gate sees what the
claim decision read (``ClaimRead``), at one revision, and reads more only when it acts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from coordinator.domain.decisions import Verdict
from coordinator.domain.records import AttemptRecord, TaskRecord
from coordinator.domain.retry import Takeover
from coordinator.domain.states import Outcome, TaskState
from coordinator.store.context import StoreContext
from coordinator.store.effects.effect import hold_for_approval
from coordinator.store.effects.reconcile import ReconcileStore
from coordinator.store.etcd.ops import KV
from coordinator.store.indexes.ready import ReadyIndex


@dataclass(frozen=True)
class ClaimRead:
    """What a claim read in one round trip, and the claim decision on it."""

    task: TaskRecord
    verdict: Verdict
    # The task's open reconciliations (``{p}/reconcile/{task}/``): almost always none.
    reconciling: tuple[KV, ...]
    # The record of the attempt the task names, if it has one: a takeover closes it as EXPIRED.
    attempt: AttemptRecord | None
    # The queues paused one by one (``{p}/control/queue_paused/``): almost always none.
    paused_queues: frozenset[str] = frozenset()
    # A CLAIMED task's expired attempt and the retry decision on it; None unless a takeover.
    takeover: Takeover | None = None


class ClaimGate(Protocol):
    """One check between a claim's decision and its txn."""

    def check(self, read: ClaimRead, *, by: str, epoch: int) -> Verdict | None:
        """None to let the claim of ``by`` go on; else the claim's answer."""
        ...


class QueuePauseGate:
    """A queue paused by itself (AdminService.PauseClaims with a queue): its tasks are not
    claimed, by id or by ClaimNext; other queues claim on. Reads and writes nothing: the claim
    read carries the paused queues, and the claim txn compares the queue's pause key (so a
    pause landing between the read and the txn fails the txn, and the next read sees it)."""

    def check(self, read: ClaimRead, *, by: str, epoch: int) -> Verdict | None:
        """CLAIMS_PAUSED if the task's queue is paused, else None."""
        queue = read.task.queue
        if queue not in read.paused_queues:
            return None
        return Verdict(
            Outcome.CLAIMS_PAUSED, message=f"new claims of queue {queue!r} are paused by an admin"
        )


class SpaceGate:
    """Above etcd's high-water mark a task that has had RETRIES_ABOVE_HIGH_WATER attempts is
    NOT_CLAIMABLE until the space guard clears (domain/space.py ``retry_refusal``): a retry
    writes an attempt and its events, the one growth the guard let through whatever its caller
    sent. Reads and writes nothing; ClaimNext passes the task by and claims others."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    def check(self, read: ClaimRead, *, by: str, epoch: int) -> Verdict | None:
        """NOT_CLAIMABLE with the guard's reason, or None."""
        why = self._ctx.kv.space.retry_refusal(read.task.attempt)
        return Verdict(Outcome.NOT_CLAIMABLE, message=why) if why else None


class ReconcileGate:
    """An UNKNOWN effect's open reconciliation: wait for its owner (RECONCILING), or escalate
    at its deadline (NEEDS_APPROVAL, written); see store/effects/reconcile.py."""

    def __init__(self, reconcile: ReconcileStore) -> None:
        self._reconcile = reconcile

    def check(self, read: ClaimRead, *, by: str, epoch: int) -> Verdict | None:
        """The reconciliation's answer, or None when none is open."""
        return self._reconcile.claim_gate(read.task, read.reconciling, by=by, epoch=epoch)


class ApprovalGate:
    """A non-replayable task whose earlier attempt left an effect uncertain is parked in
    NEEDS_APPROVAL instead of claimed (written: it leaves the ready index)."""

    def __init__(self, ctx: StoreContext, ready: ReadyIndex) -> None:
        self._ctx = ctx
        self._ready = ready

    def check(self, read: ClaimRead, *, by: str, epoch: int) -> Verdict | None:
        """NEEDS_APPROVAL if the task was parked, else None."""
        task = read.task
        held = hold_for_approval(self._ctx, task, by=by, epoch=epoch)
        if held is not None and task.state is TaskState.READY:
            keys = self._ctx.keys
            self._ready.discard(keys.ready(task.queue, task.priority, task.ready_seq, task.task_id))
        return held
