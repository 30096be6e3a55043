"""Fail: the holder reports that its attempt failed.

An acceptance point like Release (store/attempts/acceptance.py): the owner and the fence are checked
on a read, and the txn that closes the attempt as FAILED (with the reported error) and moves the
task compares the fence again, so a superseded, expired or re-epoched holder writes nothing. Where
the task goes is the retry decision's (domain/retry.py): READY, DELAYED for its backoff (or the
requested delay), or FAILED when the failure is not retryable or no attempt is left.
"""

from __future__ import annotations

import structlog

from coordinator.domain.decisions import Fence, check_fence, check_owner
from coordinator.domain.failures import FailureReport
from coordinator.domain.records import with_changes
from coordinator.domain.retry import AttemptEnded
from coordinator.domain.states import AttemptEnd, Op, TaskState
from coordinator.metrics import AcceptancePoint
from coordinator.store import coverage
from coordinator.store.attempts.acceptance import AcceptancePoints
from coordinator.store.attempts.requeue import ending_txn, settled
from coordinator.store.attempts.views import HeldClaims
from coordinator.store.context import StoreContext
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.types import FailResult

log = structlog.get_logger(__name__)


class Failures:
    """WorkerService.Fail on the store."""

    def __init__(
        self, ctx: StoreContext, ready: ReadyIndex, held: HeldClaims, points: AcceptancePoints
    ) -> None:
        self._ctx = ctx
        self._ready = ready
        self._held = held
        self._points = points

    def fail(self, fence: Fence, *, principal: str, report: FailureReport) -> FailResult:
        """Close the held attempt as FAILED with ``report`` and move the task on."""
        ctx = self._ctx
        self._held.take(fence)  # a failed claim never commits
        view = self._points.view(fence)
        check_owner(view, fence, principal)
        verdict = check_fence(view, fence, now=ctx.clock.now())
        if not verdict.accepted:
            return FailResult(verdict)
        task, now = view.task, ctx.clock.now()
        if report.bulky and ctx.kv.space.growth_refusal():
            # Details only add data: above etcd's high-water mark, unless the caller's share
            # admits them, the failure lands trimmed.
            report = report.trimmed()
        ended = AttemptEnded(
            AttemptEnd.FAILED,
            report.summary(),
            retryable=report.retryable,
            code=report.code,
            delay=report.delay,
            shutdown=report.shutdown,
        )
        closed = with_changes(
            view.attempt,
            end=AttemptEnd.FAILED,
            ended_at=now,
            error_code=report.code,
            error_message=report.message,
            error_details=report.details,
        )
        after, compares, ops = ending_txn(
            ctx, view, fence, ended, closed, at_once=Op.FAIL, by=principal, now=now
        )
        if not ctx.kv.txn(compares, ops).succeeded:
            return FailResult(self._points.diagnose(fence))
        ctx.leases.release(task.lease_id)  # our txn deleted its only key
        coverage.observe_fence(AcceptancePoint.FAIL, compares, ctx, fence)
        settled(ctx, self._ready, after, ended)
        eligible = {TaskState.READY: now, TaskState.DELAYED: after.not_before}
        return FailResult(verdict, after.state, eligible.get(after.state, 0.0))
