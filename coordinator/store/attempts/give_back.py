"""An undelivered claim given back: the claim txn landed, but its answer cannot reach the caller.

A Claim or ClaimNext whose caller left (it cancelled, its deadline passed, or the server is
ending the call) while the claim txn ran would otherwise leave the task CLAIMED by nobody: no
worker holds its fence, live callers are told NO_READY_TASK, and when the lease runs out the
reclaimer counts an attempt that never ran against the retry budget (measured before this
module: `attempts_counted 1`, attempt EXPIRED, after a 1 s client deadline on a 4 s long poll).

So the server gives it back at once, in one txn behind the claim's own fence: the task READY
again at the place in line it had (it was never served), the claim key deleted, the attempt
closed UNDELIVERED, and, as ``domain/retry.py`` decides for that end, the attempt not counted
(``attempts_base`` moves up with it) and no backoff, while the task has had fewer than
SHUTDOWN_ALLOWANCE times its max_attempts attempts in all; past that it counts like an expiry
(``reclaim``, a backoff or the dead letter: ``domain/retry.py::undelivered_move``), so a caller
that leaves after every claim cannot cycle a task for ever. The fence compares make it a no-op
should anything have touched the task since the claim.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import structlog

from coordinator.domain.decisions import Fence, FenceView
from coordinator.domain.records import AttemptRecord, TaskRecord, with_changes
from coordinator.domain.retry import (
    UNDELIVERED,
    UNDELIVERED_COUNTED,
    RetryMove,
    undelivered_move,
)
from coordinator.domain.states import AttemptEnd, TaskState
from coordinator.errors import CoordinatorError, Undelivered
from coordinator.store.attempts.acceptance import AcceptancePoints
from coordinator.store.attempts.requeue import settled
from coordinator.store.attempts.views import HeldClaims
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import delete
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.transition import held_transition_ops, put_attempt, transition
from coordinator.store.types import Caller, ClaimResult

log = structlog.get_logger(__name__)


class GiveBacks:
    """Gives back claims whose answer could not be delivered."""

    def __init__(
        self,
        ctx: StoreContext,
        ready: ReadyIndex,
        held: HeldClaims,
        acceptance: AcceptancePoints,
    ) -> None:
        self._ctx = ctx
        self._ready = ready
        self._held = held
        self._acceptance = acceptance
        # One thread: give-backs found after the call ended are rare, each one small txn.
        self._late = ThreadPoolExecutor(max_workers=1, thread_name_prefix="give-back")

    def deliver(self, results: list[ClaimResult], caller: Caller, *, by: str) -> list[ClaimResult]:
        """``results`` when their answer can still reach ``caller``; else every claim among
        them is given back and Undelivered raised (so no replay stores the answer).

        The answer can still be lost after this look: the caller leaves while it is sent, or
        left already and the replica has not heard yet (measured on a loaded host: a cancel
        heard 0.25 s late, so the claim was answered into a cancelled call and its attempt
        later expired, counted). So once the call ended, if gRPC says the answer never went out,
        the claims are given back then, unless a retry would replay them (``replayable``)."""
        claimed = [r for r in results if r.fence is not None]
        if not claimed:
            return results
        if not caller.alive():
            self.undelivered(results, by=by)
        if not caller.replayable():

            def ended() -> None:
                if caller.answer_lost():  # on gRPC's thread: the txns run on our own
                    try:
                        self._late.submit(self.give_back_all, claimed, by=by)
                    except RuntimeError:  # the store is closing: the leases expire instead
                        log.warning("lost claim answer not given back: the store is closing")

            if not caller.on_end(ended):
                ended()
        return results

    def close(self) -> None:
        """Finish the give-backs of answers found lost (the store is closing)."""
        self._late.shutdown(wait=True)

    def undelivered(self, results: list[ClaimResult], *, by: str) -> NoReturn:
        """Give back the claims among ``results``, which nobody will receive, and raise
        Undelivered."""
        given = self.give_back_all(results, by=by)
        raise Undelivered(
            "the call ended before its claim could be answered (the caller cancelled, its "
            f"deadline passed, or the server is ending the call); {given} task(s) given back, "
            "the attempt not counted (within the task's allowance): claim again"
        )

    def give_back(self, claimed: ClaimResult, *, by: str) -> bool:
        """Give back the claim ``claimed`` granted to ``by``; True when the txn landed (False:
        the fence no longer held, so something else already moved the task on)."""
        fence = claimed.fence
        if fence is None:
            return False
        ctx, keys = self._ctx, self._ctx.keys
        # What the claim txn wrote, as this replica remembered it; read only if it was evicted.
        view = self._held.take(fence) or self._acceptance.view(fence)
        now = ctx.clock.now()
        move = undelivered_move(view.task, now)
        after, closed = self._returned(view, fence, move, claimed.ready_seq, now)
        compares, ops = held_transition_ops(
            ctx, view.task, after, move.op, fence, by=by, detail=_detail(move)
        )
        put_attempt(ctx, ops, closed)
        ops.append(delete(keys.claim(fence.task_id)))
        if not ctx.kv.txn(compares, ops).succeeded:
            log.warning("undelivered claim not given back: the task moved", task_id=fence.task_id)
            return False
        ctx.leases.release(view.task.lease_id)  # the txn deleted the lease's only key
        ctx.metrics.count_undelivered(after.queue)
        if move.uncounted:
            self._ready.add(keys.ready(after.queue, after.priority, after.ready_seq, after.task_id))
        else:  # counted past the allowance: a retry, a backoff or the dead letter like any
            settled(ctx, self._ready, after, UNDELIVERED)
        return True

    def give_back_all(self, results: list[ClaimResult], *, by: str) -> int:
        """Give back every claim among ``results`` (a batch nobody will receive); how many
        were. One failing does not keep the others: each is its own task and txn."""
        given = 0
        for result in results:
            if result.fence is None:
                continue
            try:
                given += self.give_back(result, by=by)
            except CoordinatorError as exc:  # the lease expires and the reclaimer takes it
                log.warning("undelivered claim not given back", error=str(exc))
        return given

    def _returned(
        self, view: FenceView, fence: Fence, move: RetryMove, ready_seq: int, now: float
    ) -> tuple[TaskRecord, AttemptRecord]:
        """The task moved as ``domain/retry.py`` decided for an undelivered attempt (READY
        again, uncounted, within the allowance), and the attempt closed."""
        task = view.task
        after = transition(
            task,
            move.op,
            now,
            claim_generation=fence.claim_generation,
            lease_id=0,
            **move.changes(task, UNDELIVERED),
        )
        if after.state is TaskState.READY and ready_seq:
            after = with_changes(after, ready_seq=ready_seq)  # its old place: it was never served
        return after, with_changes(view.attempt, end=AttemptEnd.UNDELIVERED, ended_at=now)


def _detail(move: RetryMove) -> str:
    """The give-back event's detail: uncounted, or, past the allowance, the retry decision's."""
    if move.uncounted:
        return UNDELIVERED.error + "; the attempt is not counted"
    return f"{move.detail} {UNDELIVERED_COUNTED}"
