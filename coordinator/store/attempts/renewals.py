"""Renew: keep claims' leases alive, one claim (Renew) or a worker's whole batch (RenewMany).

A renewal is an acceptance point. For each claim: check the owner and the fence on the claim's
view, decide within the claim's bounds (domain ``decide_renew``), run a txn behind
``fence_compares`` that writes only when the progress marker or the checkpoint changed, keep
the lease alive, then compare the fence once more: a commit or release landing between the txn
and the keepalive deletes the claim key but leaves the lease to the replica's pool
(store/etcd/leases.py), so a live lease alone proves nothing.

For a batch these steps run for all its claims together, which is what makes thousands of held
claims cheap (measured in ``python -m bench``, phase ``held``):

* Views this replica knows are not read again (``RenewViews``, read and cached by
  store/attempts/views.py as acceptance's are). A remembered view is used only through a txn
  that also compares the claim key's mod_revision (and, for a checkpoint, the attempt key's)
  with the remembered ones, so the txn lands only if the view is exactly current. A refusal
  decided on a remembered view is never final: a read decides it again.
* The txns of the batch share round trips (``EtcdKV.txn_many``: independent nested txns; every
  claim of a batch is a different task, so none writes a key another one compares), the leases
  are kept alive over one etcd keepalive stream, and the after-keepalive compares share a round
  trip too.
* A claim whose txn failed is read and decided again, up to the tries a lone Renew gets, so
  every claim gets exactly the answer a lone Renew would have given it.

A fence this replica does not remember is first screened (store/attempts/renew_screen.py): one that
names no claim that can be live is answered FENCED from memory, before any etcd work.

``arenew_many`` is the operation, a coroutine awaiting each etcd call through a ``StepIO``
(store/etcd/step_io.py); ``renew_many`` runs it on the calling thread. What a renewal builds
without I/O (its view, its txn, the view once it landed) is store/attempts/renew_plans.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from coordinator.domain.decisions import (
    Fence,
    Verdict,
    check_fence,
    check_owner,
    decide_renew,
)
from coordinator.domain.records import ClaimRecord, encode, with_changes
from coordinator.domain.states import Outcome
from coordinator.errors import CoordinatorError, InvalidArgument, NotFound
from coordinator.metrics import AcceptancePoint
from coordinator.store import coverage
from coordinator.store.attempts.renew_plans import (
    Known,
    Plan,
    Renewal,
    RenewAnswer,
    after_landing,
    duplicates,
    lease_of,
)
from coordinator.store.attempts.renew_screen import screen_fences
from coordinator.store.attempts.views import FenceCache, HeldClaims, adiagnose, aread_views
from coordinator.store.context import (
    StoreContext,
)
from coordinator.store.etcd.ops import (
    mod_revision_is,
    put,
)
from coordinator.store.etcd.step_io import StepIO, run_now
from coordinator.store.fence import fence_compares
from coordinator.store.indexes.claimed import ClaimedIndex
from coordinator.store.types import RenewResult

MAX_BATCH = 1000
"""Claims one RenewMany may carry."""
TRIES = 3
"""Txns one claim's renewal may lose (to a concurrent renewal of the same attempt) before it
asks the keyspace why."""
VIEWS = 16384
"""Claim views a replica remembers for renewals (without task inputs, about 1 KiB each: at most
~16 MiB). A replica renewing more claims than this reads the oldest again: slower, as correct."""
_READS_PER_TXN = 30  # four gets a claim: 120 of etcd's 128 operations per txn


_OK = Verdict(Outcome.OK)


class RenewViews(FenceCache[Known]):
    """The views of claims this replica granted or renewed, by fence, oldest dropped first."""

    def __init__(self, capacity: int = VIEWS) -> None:
        super().__init__(capacity)


class Renewals:
    """Renew and RenewMany (see the module docstring)."""

    def __init__(
        self,
        ctx: StoreContext,
        held: HeldClaims,
        views: RenewViews,
        claimed: ClaimedIndex | None = None,
    ) -> None:
        self._ctx = ctx
        self._held = held
        self._views = views
        self._claimed = claimed  # None: every fence is read

    def renew(
        self, fence: Fence, *, principal: str, progress: str, checkpoint: bytes | None = None
    ) -> RenewResult:
        """Keep one claim's lease alive, within its bounds; a ``checkpoint`` that differs from
        the attempt's is written with the attempt in the same fenced txn. Raises what a lone
        Renew raises (PermissionDenied, InvalidArgument, NotFound)."""
        [answer] = self.renew_many([Renewal(fence, progress, checkpoint)], principal=principal)
        if isinstance(answer, CoordinatorError):
            raise answer
        return answer

    def renew_many(self, renewals: Sequence[Renewal], *, principal: str) -> list[RenewAnswer]:
        """``arenew_many``, run on this thread."""
        return run_now(self.arenew_many(self._ctx.io, renewals, principal=principal))

    async def arenew_many(
        self, io: StepIO, renewals: Sequence[Renewal], *, principal: str
    ) -> list[RenewAnswer]:
        """Renew every claim of ``renewals`` (at most MAX_BATCH, each task once), each answered
        as a lone Renew would answer it."""
        if len(renewals) > MAX_BATCH:
            raise InvalidArgument(f"at most {MAX_BATCH} renewals per call, got {len(renewals)}")
        answers: dict[int, RenewAnswer] = dict(duplicates(renewals))
        if self._claimed is not None:
            fences = {i: r.fence for i, r in enumerate(renewals) if i not in answers}
            remembered = {i for i, f in fences.items() if self._remembered(f) is not None}
            screened = await screen_fences(io, self._ctx, self._claimed, fences, skip=remembered)
            answers.update(screened)
        todo = list(range(len(renewals)))
        fresh: set[int] = set()  # a remembered view failed them, or their txn lost: read
        for _ in range(TRIES):
            todo = [i for i in todo if i not in answers]
            if not todo:
                break
            known = await self._known(io, renewals, todo, fresh, answers)
            plans = self._decide(renewals, known, principal, answers, fresh)
            await self._apply(io, renewals, plans, answers, fresh)
        for i in (i for i in todo if i not in answers):
            answers[i] = RenewResult(await adiagnose(io, self._ctx, renewals[i].fence))
        outcomes = Counter(
            a.verdict.outcome for a in answers.values() if isinstance(a, RenewResult)
        )
        for outcome, count in outcomes.items():  # failure rate: not OK / all
            self._ctx.metrics.count_renewal(outcome, count)
        return [answers[i] for i in range(len(renewals))]

    # --- views -------------------------------------------------------------------------------

    async def _known(
        self,
        io: StepIO,
        renewals: Sequence[Renewal],
        todo: list[int],
        fresh: set[int],
        answers: dict[int, RenewAnswer],
    ) -> dict[int, Known]:
        """A view per claim of ``todo``: remembered where one is (and not failed), else read;
        a claim whose task or attempt does not exist is answered NotFound."""
        found: dict[int, Known] = {}
        to_read: list[int] = []
        for i in todo:
            known = None if i in fresh else self._remembered(renewals[i].fence)
            if known is None:
                to_read.append(i)
            else:
                found[i] = known
        for start in range(0, len(to_read), _READS_PER_TXN):
            chunk = to_read[start : start + _READS_PER_TXN]
            # Without task inputs: what a renewal decides on, and what it remembers.
            fences = [renewals[i].fence for i in chunk]
            reads = await aread_views(io, self._ctx, fences, inputs=False)
            for i, read in zip(chunk, reads, strict=True):
                if isinstance(read, NotFound):
                    answers[i] = read
                else:
                    found[i] = Known(read.view, read.attempt_revision)
        return found

    def _remembered(self, fence: Fence) -> Known | None:
        known = self._views.peek(fence)
        if known is not None:
            return known  # kept remembered (renew_plans.after_landing)
        granted = self._held.peek(fence)  # what this replica's claim txn wrote
        if granted is None:
            return None
        view = with_changes(granted, task=with_changes(granted.task, input=b""))
        # The attempt key's revision as the claim left it: the claim's, or 0 (no key: the task
        # record holds the attempt, schema 3).
        return Known(view, granted.attempt.mod_revision, remembered=True)

    # --- deciding ----------------------------------------------------------------------------

    def _decide(
        self,
        renewals: Sequence[Renewal],
        known: dict[int, Known],
        principal: str,
        answers: dict[int, RenewAnswer],
        fresh: set[int],
    ) -> list[Plan]:
        """The txn of every claim the domain lets renew; the others answered (or, refused on
        a remembered view, sent to be read)."""
        now = self._ctx.clock.now()
        plans: list[Plan] = []
        for i, k in known.items():
            renewal = renewals[i]
            try:
                check_owner(k.view, renewal.fence, principal)
            except CoordinatorError as exc:
                answers[i] = exc
                continue
            verdict = check_fence(k.view, renewal.fence, now=now)
            claim = k.view.claim
            if verdict.accepted and claim is not None:
                verdict, updated = decide_renew(claim, now=now, progress=renewal.progress)
                if verdict.accepted:
                    plans.append(self._plan(i, k, renewal, updated))
                    continue
            if k.remembered:  # it may be out of date: only a read may refuse
                fresh.add(i)
            else:
                self._views.take(renewal.fence)
                answers[i] = RenewResult(verdict)
        return plans

    def _plan(self, index: int, k: Known, renewal: Renewal, updated: ClaimRecord | None) -> Plan:
        """The claim's txn: the fence, the claim key as viewed (so the view is current when it
        lands), and the writes a changed marker or checkpoint needs."""
        keys, fence = self._ctx.keys, renewal.fence
        claim = k.view.claim
        assert claim is not None
        claim_key = keys.claim(fence.task_id)
        if k.txns.fence is None:
            k.txns.fence = fence_compares(keys, fence)
        plan = Plan(index, k, k.txns.fence, [mod_revision_is(claim_key, claim.mod_revision)])
        if updated is not None:
            plan.ops.append(put(claim_key, encode(updated), lease=claim.lease_id))
            plan.claim = updated
        if renewal.checkpoint is not None:
            attempt_key = keys.attempt(fence.task_id, fence.attempt_id)
            plan.pins.append(mod_revision_is(attempt_key, k.attempt_revision))
            if renewal.checkpoint != k.view.attempt.checkpoint:
                # Only the checkpoint is refused: the renewal goes on, or the claim would be
                # lost to a filling etcd; the answer says it was not kept (checkpoint_refused).
                plan.checkpoint_refused = self._ctx.kv.space.growth_refusal()
            if renewal.checkpoint != k.view.attempt.checkpoint and not plan.checkpoint_refused:
                kept = with_changes(k.view.attempt, checkpoint=renewal.checkpoint)
                plan.ops.append(put(attempt_key, encode(kept)))
                plan.attempt_written = True
        return plan

    # --- the round trips -------------------------------------------------------------------

    async def _apply(
        self,
        io: StepIO,
        renewals: Sequence[Renewal],
        plans: list[Plan],
        answers: dict[int, RenewAnswer],
        fresh: set[int],
    ) -> None:
        """Run the txns, keep the leases of those that landed alive, compare their fences
        again; answers each claim, or marks it to be read and tried again."""
        if not plans:
            return
        ctx = self._ctx
        results = await io.txn_many([p.txn() for p in plans])
        landed: list[tuple[Plan, int]] = []
        for plan, result in zip(plans, results, strict=True):
            if result.succeeded:
                landed.append((plan, result.revision))
            else:  # fenced meanwhile, a concurrent renewal, or a stale remembered view
                self._views.take(renewals[plan.index].fence)
                fresh.add(plan.index)
        if not landed:
            return
        leases = [lease_of(plan) for plan, _ in landed]
        ttls = await io.keepalive_many(leases)
        alive = [(p, rev) for p, rev in landed if ttls[lease_of(p)] > 0]
        for plan, _ in landed:
            if ttls[lease_of(plan)] <= 0:  # the lease went away after our txn: ask why
                ctx.leases.forget(lease_of(plan))
                await self._refused(io, renewals, plan, answers)
        checks = await io.txn_many([p.check() for p, _ in alive])  # the fence, again
        now = ctx.clock.now()
        accepted: dict[int, int] = {}  # lease -> the TTL it was refreshed to
        validated = 0
        for (plan, revision), check in zip(alive, checks, strict=True):
            if not check.succeeded:
                await self._refused(io, renewals, plan, answers)
                continue
            ttl = ttls[lease_of(plan)]
            accepted[lease_of(plan)] = ttl
            validated += self._accepted(renewals[plan.index], plan, revision, ttl, now, answers)
        ctx.leases.renewed_many(accepted)
        ctx.metrics.count_acceptances(
            AcceptancePoint.RENEW, accepted=len(accepted), validated=validated
        )

    def _accepted(
        self,
        renewal: Renewal,
        plan: Plan,
        revision: int,
        ttl: int,
        now: float,
        answers: dict[int, RenewAnswer],
    ) -> bool:
        """Answer OK; whether the txn that accepted it compared the fence (coverage)."""
        ctx, fence = self._ctx, renewal.fence
        claim = plan.known.view.claim
        assert claim is not None
        self._views.remember(fence, after_landing(plan, renewal, revision))
        answers[plan.index] = RenewResult(
            verdict=_OK,
            ttl=ttl,
            lease_expires_at=now + ttl,
            deadline=claim.deadline,
            checkpoint_refused=plan.checkpoint_refused,
        )
        return coverage.fence_validated(
            plan.compares,  # what the accepting txn sent
            ctx.keys,
            task_id=fence.task_id,
            epoch=fence.scheduler_epoch,
            generation=fence.claim_generation,
        )

    async def _refused(
        self, io: StepIO, renewals: Sequence[Renewal], plan: Plan, answers: dict[int, RenewAnswer]
    ) -> None:
        fence = renewals[plan.index].fence
        self._views.take(fence)
        answers[plan.index] = RenewResult(await adiagnose(io, self._ctx, fence))
