"""The acceptance points of a held claim: AuthorizeTool, StageResult, Commit, Release (Renew:
store/attempts/renewals.py).

Each one reads a FenceView, checks the owner and the fence in the domain (which names the
reason), then writes behind ``fence_compares`` so the check holds at the write's revision too.
When the compares fail, it reads again and lets the domain say why.

Commit, on every task's path, is a coroutine (``acommit``) awaiting its etcd calls through a
``StepIO`` (store/etcd/step_io.py); ``commit`` runs it on the calling thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from coordinator.domain.decisions import (
    CommitRefuse,
    CommitReplay,
    Fence,
    FenceView,
    Verdict,
    check_fence,
    check_owner,
    decide_commit,
    decide_stage,
)
from coordinator.domain.records import (
    AttemptRecord,
    ResultRecord,
    StagedResult,
    commit_id,
    encode,
    with_changes,
)
from coordinator.domain.retry import AttemptEnded
from coordinator.domain.space import WriteKind
from coordinator.domain.states import AttemptEnd, Op, Outcome
from coordinator.metrics import AcceptancePoint
from coordinator.store import coverage
from coordinator.store.attempts.requeue import ending_txn, settled
from coordinator.store.attempts.views import MOVED, HeldClaims, aread_view, diagnose, read_view
from coordinator.store.context import (
    StoreContext,
)
from coordinator.store.etcd.ops import Compare, create_revision_is, delete, mod_revision_is, put
from coordinator.store.etcd.step_io import StepIO, run_now
from coordinator.store.fence import fence_compares
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.transition import held_transition_ops, put_attempt, transition
from coordinator.store.types import CommitResult, StagingResult


@dataclass(frozen=True)
class CommitWrite:
    """What a Commit call asks to make canonical, and the input it worked on."""

    principal: str
    input_digest: str
    result_digest: str
    result: bytes
    result_ref: str
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class _CommitBasis:
    """A view a commit decides on. ``remembered``: what this replica's claim txn wrote, not
    read (its txn adds the ``pinned`` compares); ``last``: read after a lost txn, it only
    names the outcome."""

    view: FenceView
    pinned: tuple[Compare, ...] = ()
    remembered: bool = False
    last: bool = False


class AcceptancePoints:
    """Everything a claim holder can do with its fence."""

    def __init__(self, ctx: StoreContext, ready: ReadyIndex, held: HeldClaims) -> None:
        self._ctx = ctx
        self._ready = ready
        self._held = held

    def view(self, fence: Fence, *, with_result: bool = False) -> FenceView:
        """Read task, attempt, live claim and epoch at one revision (and, for commits, the
        canonical result of the attempt's task revision): ``views.read_view``."""
        return read_view(self._ctx, fence, with_result=with_result)

    def authorize_tool(self, fence: Fence, *, principal: str, tool: str, action: str) -> Verdict:
        """A tool acceptance point: OK only if the fence holds at this revision."""
        del tool, action  # recorded in the server's audit log, not in etcd
        view = self.view(fence)
        check_owner(view, fence, principal)
        verdict = check_fence(view, fence, now=self._ctx.clock.now())
        if not verdict.accepted:
            return verdict
        compares = fence_compares(self._ctx.keys, fence)
        if self._ctx.kv.txn(compares).succeeded:
            coverage.observe_fence(AcceptancePoint.AUTHORIZE, compares, self._ctx, fence)
            return verdict
        return self.diagnose(fence)

    def stage_result(
        self, fence: Fence, *, principal: str, result_digest: str, result: bytes, result_ref: str
    ) -> StagingResult:
        """Stage into the attempt's own area: allowed even after fencing, never canonical;
        refused (nothing written) once the task's deadline has passed (decide_stage)."""
        view = self.view(fence)
        check_owner(view, fence, principal)
        now = self._ctx.clock.now()
        allowed = decide_stage(view, now=now)
        if not allowed.accepted:
            return StagingResult(allowed)
        staged = StagedResult(
            task_id=fence.task_id,
            attempt_id=fence.attempt_id,
            revision=view.attempt.revision,
            claim_generation=fence.claim_generation,
            result_digest=result_digest,
            size=len(result),
            staged_at=now,
            result=result,
            result_ref=result_ref,
        )
        self._ctx.kv.txn(
            (),
            [put(self._ctx.keys.staging(fence.task_id, fence.attempt_id), encode(staged))],
            kind=WriteKind.GROWTH,
        )
        current = check_fence(view, fence, now=now).accepted
        return StagingResult(allowed, current=current)

    def commit(
        self,
        fence: Fence,
        *,
        principal: str,
        input_digest: str,
        result_digest: str,
        result: bytes,
        result_ref: str,
        evidence: tuple[str, ...] = (),
    ) -> CommitResult:
        """``acommit``, run on this thread."""
        write = CommitWrite(principal, input_digest, result_digest, result, result_ref, evidence)
        return run_now(self.acommit(self._ctx.io, fence, write))

    async def acommit(self, io: StepIO, fence: Fence, write: CommitWrite) -> CommitResult:
        """Make ``write``'s result canonical, once per task revision, behind the fence; its
        ``evidence`` (managed job ids, log refs) is kept in the canonical result record."""
        async for basis in self._commit_bases(io, fence):
            view = basis.view
            check_owner(view, fence, write.principal)
            decision = decide_commit(
                view,
                fence,
                input_digest=write.input_digest,
                result_digest=write.result_digest,
                now=self._ctx.clock.now(),
            )
            if isinstance(decision, CommitReplay):  # a retry of a commit that landed
                return CommitResult(decision.verdict, decision.result.commit_id, view.task.state)
            if isinstance(decision, CommitRefuse):
                if basis.remembered:  # it may be out of date: only a read may refuse
                    continue
                return self._refused(view, decision.verdict)
            if basis.last:
                break
            done = await self._write_commit(io, view, fence, write, *basis.pinned)
            if done is not None:
                return done
        # Our txn lost, yet the read after it would write again: a race, not a rule.
        return self._refused(view, MOVED)

    async def _commit_bases(self, io: StepIO, fence: Fence) -> AsyncIterator[_CommitBasis]:
        """What a commit decides on, each only if the one before did not answer: two views to
        write on (the one this replica's claim txn wrote, if it has it, no read; else a read;
        then a read), and after the second txn failed, one more read to say why.

        Every txn pins the attempt key as its view had it (its revision, or 0: no key, the
        task record holds the attempt): the holder's own keepalive may land a checkpoint in
        between, and a commit that kept the attempt in the record beside the key that
        checkpoint wrote would leave a DONE task with a RUNNING attempt (the key wins). The
        next read sees the key and closes it; nothing else fails a pin without moving the
        fence, which the read after it refuses."""
        attempt_key = self._ctx.keys.attempt(fence.task_id, fence.attempt_id)
        held = self._held.take(fence)
        if held is not None:
            pinned = (mod_revision_is(attempt_key, held.attempt.mod_revision),)
            yield _CommitBasis(held, pinned=pinned, remembered=True)
        for last in (False,) * (1 if held is not None else 2) + (True,):
            view = await aread_view(io, self._ctx, fence, with_result=True)
            pinned = (mod_revision_is(attempt_key, view.attempt.mod_revision),)
            yield _CommitBasis(view, pinned=pinned, last=last)

    async def _write_commit(
        self, io: StepIO, view: FenceView, fence: Fence, write: CommitWrite, *pinned: Compare
    ) -> CommitResult | None:
        """The commit txn on ``view``: its result, or None when a compare failed (nothing
        written)."""
        ctx, keys = self._ctx, self._ctx.keys
        task, now = view.task, ctx.clock.now()
        record = ResultRecord(
            task_id=task.task_id,
            revision=task.revision,
            attempt_id=fence.attempt_id,
            claim_generation=fence.claim_generation,
            scheduler_epoch=fence.scheduler_epoch,
            owner_id=write.principal,
            result_digest=write.result_digest,
            committed_at=now,
            result=write.result,
            result_ref=write.result_ref,
            evidence=write.evidence,
        )
        # The committed attempt stays in the task record if that is where it is (schema 3; no
        # checkpoint gave it a key): a key fewer.
        in_record = view.attempt.mod_revision == 0 and task.attempt_in_record
        after = transition(
            task,
            Op.COMMIT,
            now,
            result_commit_id=commit_id(fence.attempt_id, fence.claim_generation),
            result_digest=write.result_digest,
            lease_id=0,
            attempt_in_record=in_record,
        )
        compares, ops = held_transition_ops(ctx, task, after, Op.COMMIT, fence, by=write.principal)
        result_key = keys.result(task.task_id, task.revision)
        compares += [create_revision_is(result_key, 0), *pinned]
        ops.append(put(result_key, encode(record)))
        if not in_record:
            put_attempt(ctx, ops, self._closed(view, AttemptEnd.COMMITTED, now))
        ops.append(delete(keys.claim(task.task_id)))
        if not (await io.txn(compares, ops)).succeeded:
            return None
        await io.release(task.lease_id)  # our txn deleted its only key
        coverage.observe_fence(AcceptancePoint.COMMIT, compares, self._ctx, fence)
        self._ctx.metrics.observe_attempts(task.attempt)
        self._ctx.metrics.count_attempt_end(task.queue, "committed")
        if task.ready_at:
            self._ctx.metrics.observe_ready_to_commit(now - task.ready_at)
        return CommitResult(Verdict(Outcome.COMMITTED), after.result_commit_id, after.state)

    def release(self, fence: Fence, *, principal: str, reason: str) -> Verdict:
        """Give the task back, the attempt recorded as RELEASED; the task's retry policy counts
        it and decides: READY again, DELAYED for a backoff, or FAILED."""
        ctx = self._ctx
        self._held.take(fence)  # a released claim never commits
        view = self.view(fence)
        check_owner(view, fence, principal)
        verdict = check_fence(view, fence, now=ctx.clock.now())
        if not verdict.accepted:
            return verdict
        task, now = view.task, ctx.clock.now()
        ended = AttemptEnded(AttemptEnd.RELEASED, f"released: {reason}" if reason else "released")
        closed = self._closed(view, AttemptEnd.RELEASED, now)
        after, compares, ops = ending_txn(
            ctx, view, fence, ended, closed, at_once=Op.RELEASE, by=principal, now=now
        )
        if not ctx.kv.txn(compares, ops).succeeded:
            return self.diagnose(fence)
        ctx.leases.release(task.lease_id)  # our txn deleted its only key
        coverage.observe_fence(AcceptancePoint.RELEASE, compares, self._ctx, fence)
        settled(ctx, self._ready, after, ended)
        return verdict

    def diagnose(self, fence: Fence) -> Verdict:
        """Why the fence compares failed, from a fresh read: ``views.diagnose``."""
        return diagnose(self._ctx, fence)

    def _refused(self, view: FenceView, verdict: Verdict) -> CommitResult:
        """A refused commit; a FENCED one is counted with the compute its attempt threw away
        (from its start, or from its expiry when the reclaimer already counted up to there)."""
        if verdict.outcome is Outcome.FENCED:
            attempt = view.attempt
            expired = attempt.end is AttemptEnd.EXPIRED and attempt.ended_at > 0
            since = attempt.ended_at if expired else attempt.started_at
            self._ctx.metrics.count_fenced_commit(
                verdict.reason, wasted_seconds=self._ctx.clock.now() - since
            )
        return CommitResult(verdict)

    @staticmethod
    def _closed(view: FenceView, end: AttemptEnd, now: float) -> AttemptRecord:
        return with_changes(view.attempt, end=end, ended_at=now)
