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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from coordinator.domain.decisions import (
    Fence,
    FenceView,
    Verdict,
    check_fence,
    check_owner,
    decide_renew,
)
from coordinator.domain.records import ClaimRecord, encode, with_changes
from coordinator.domain.space import WriteKind
from coordinator.domain.states import Outcome
from coordinator.errors import CoordinatorError, InvalidArgument, NotFound, SpaceRefused
from coordinator.metrics import AcceptancePoint
from coordinator.store import coverage
from coordinator.store.attempts.renew_screen import screen_fences
from coordinator.store.attempts.views import FenceCache, HeldClaims, diagnose, read_views
from coordinator.store.context import (
    StoreContext,
)
from coordinator.store.etcd.ops import (
    Compare,
    NestedTxn,
    RequestOp,
    mod_revision_is,
    nested_txn,
    put,
)
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


@dataclass(frozen=True)
class Renewal:
    """One claim to renew: its fence, the latest progress marker, and a checkpoint to keep
    (None: keep the one stored)."""

    fence: Fence
    progress: str = ""
    checkpoint: bytes | None = None


RenewAnswer = RenewResult | CoordinatorError
"""A renewal's answer, or the error a lone Renew would have raised for it."""


@dataclass
class _Txns:
    """A claim's txns, built once and sent again while they stay the same (the fence check is
    the same every round; the renewal txn while the claim key's mod_revision is)."""

    fence: list[Compare] | None = None
    check: NestedTxn | None = None
    quiet: NestedTxn | None = None  # the renewal that writes nothing
    quiet_for: int = 0  # the claim key's mod_revision it pins


@dataclass(frozen=True)
class _Known:
    """A claim's view and its attempt key's mod_revision (the claim key's is in the view);
    ``remembered``: not read by this call, so only a txn may accept on it."""

    view: FenceView
    attempt_revision: int
    remembered: bool = False
    txns: _Txns = field(default_factory=_Txns, compare=False)


@dataclass
class _Plan:
    """One claim's txn in this round: ``fence`` (fence_compares) then the ``pins`` that make
    its view current, and the writes."""

    index: int
    known: _Known
    fence: list[Compare]
    pins: list[Compare]
    ops: list[RequestOp] = field(default_factory=list)
    claim: ClaimRecord | None = None  # written: the marker moved
    attempt_written: bool = False
    checkpoint_refused: str = ""  # the space guard's refusal of a new checkpoint

    @property
    def compares(self) -> list[Compare]:
        """Every compare of the txn."""
        return [*self.fence, *self.pins]

    def txn(self) -> NestedTxn:
        """The txn to send (the claim's cached one when it writes nothing)."""
        txns = self.known.txns
        quiet = not self.ops and len(self.pins) == 1
        if not quiet:
            return nested_txn(self.compares, self.ops)
        claim = self.known.view.claim
        assert claim is not None
        if txns.quiet is None or txns.quiet_for != claim.mod_revision:
            txns.quiet, txns.quiet_for = nested_txn(self.compares), claim.mod_revision
        return txns.quiet

    def check(self) -> NestedTxn:
        """The fence alone, to compare again after the keepalive."""
        txns = self.known.txns
        if txns.check is None:
            txns.check = nested_txn(self.fence)
        return txns.check


class RenewViews(FenceCache[_Known]):
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
        """Renew every claim of ``renewals`` (at most MAX_BATCH, each task once), each answered
        as a lone Renew would answer it."""
        if len(renewals) > MAX_BATCH:
            raise InvalidArgument(f"at most {MAX_BATCH} renewals per call, got {len(renewals)}")
        answers: dict[int, RenewAnswer] = dict(_duplicates(renewals))
        if self._claimed is not None:
            fences = {i: r.fence for i, r in enumerate(renewals) if i not in answers}
            remembered = {i for i, f in fences.items() if self._remembered(f) is not None}
            answers.update(screen_fences(self._ctx, self._claimed, fences, skip=remembered))
        todo = list(range(len(renewals)))
        fresh: set[int] = set()  # a remembered view failed them, or their txn lost: read
        for _ in range(TRIES):
            todo = [i for i in todo if i not in answers]
            if not todo:
                break
            known = self._known(renewals, todo, fresh, answers)
            plans = self._decide(renewals, known, principal, answers, fresh)
            self._apply(renewals, plans, answers, fresh)
        for i in (i for i in todo if i not in answers):
            answers[i] = RenewResult(diagnose(self._ctx, renewals[i].fence))
        outcomes = Counter(
            a.verdict.outcome for a in answers.values() if isinstance(a, RenewResult)
        )
        for outcome, count in outcomes.items():  # failure rate: not OK / all
            self._ctx.metrics.count_renewal(outcome, count)
        return [answers[i] for i in range(len(renewals))]

    # --- views -------------------------------------------------------------------------------

    def _known(
        self,
        renewals: Sequence[Renewal],
        todo: list[int],
        fresh: set[int],
        answers: dict[int, RenewAnswer],
    ) -> dict[int, _Known]:
        """A view per claim of ``todo``: remembered where one is (and not failed), else read;
        a claim whose task or attempt does not exist is answered NotFound."""
        found: dict[int, _Known] = {}
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
            reads = read_views(self._ctx, [renewals[i].fence for i in chunk], inputs=False)
            for i, read in zip(chunk, reads, strict=True):
                if isinstance(read, NotFound):
                    answers[i] = read
                else:
                    found[i] = _Known(read.view, read.attempt_revision)
        return found

    def _remembered(self, fence: Fence) -> _Known | None:
        known = self._views.peek(fence)
        if known is not None:
            return known  # kept remembered (_after)
        granted = self._held.peek(fence)  # what this replica's claim txn wrote
        if granted is None:
            return None
        view = with_changes(granted, task=with_changes(granted.task, input=b""))
        return _Known(view, fence.claim_generation, remembered=True)

    # --- deciding ----------------------------------------------------------------------------

    def _decide(
        self,
        renewals: Sequence[Renewal],
        known: dict[int, _Known],
        principal: str,
        answers: dict[int, RenewAnswer],
        fresh: set[int],
    ) -> list[_Plan]:
        """The txn of every claim the domain lets renew; the others answered (or, refused on
        a remembered view, sent to be read)."""
        now = self._ctx.clock.now()
        plans: list[_Plan] = []
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

    def _checkpoint_refusal(self) -> str:
        """The space guard's refusal of a new checkpoint (it only adds data), "" if allowed.
        Only the checkpoint is refused: the renewal goes on, or the claim would be lost to a
        filling etcd, and the answer says the checkpoint was not kept (checkpoint_refused)."""
        try:
            self._ctx.kv.space.admit(WriteKind.GROWTH)
        except SpaceRefused as exc:
            return str(exc)
        return ""

    def _plan(self, index: int, k: _Known, renewal: Renewal, updated: ClaimRecord | None) -> _Plan:
        """The claim's txn: the fence, the claim key as viewed (so the view is current when it
        lands), and the writes a changed marker or checkpoint needs."""
        keys, fence = self._ctx.keys, renewal.fence
        claim = k.view.claim
        assert claim is not None
        claim_key = keys.claim(fence.task_id)
        if k.txns.fence is None:
            k.txns.fence = fence_compares(keys, fence)
        plan = _Plan(index, k, k.txns.fence, [mod_revision_is(claim_key, claim.mod_revision)])
        if updated is not None:
            plan.ops.append(put(claim_key, encode(updated), lease=claim.lease_id))
            plan.claim = updated
        if renewal.checkpoint is not None:
            attempt_key = keys.attempt(fence.task_id, fence.attempt_id)
            plan.pins.append(mod_revision_is(attempt_key, k.attempt_revision))
            if renewal.checkpoint != k.view.attempt.checkpoint:
                plan.checkpoint_refused = self._checkpoint_refusal()
            if renewal.checkpoint != k.view.attempt.checkpoint and not plan.checkpoint_refused:
                kept = with_changes(k.view.attempt, checkpoint=renewal.checkpoint)
                plan.ops.append(put(attempt_key, encode(kept)))
                plan.attempt_written = True
        return plan

    # --- the round trips -------------------------------------------------------------------

    def _apply(
        self,
        renewals: Sequence[Renewal],
        plans: list[_Plan],
        answers: dict[int, RenewAnswer],
        fresh: set[int],
    ) -> None:
        """Run the txns, keep the leases of those that landed alive, compare their fences
        again; answers each claim, or marks it to be read and tried again."""
        if not plans:
            return
        ctx = self._ctx
        results = ctx.kv.txn_many([p.txn() for p in plans])
        landed: list[tuple[_Plan, int]] = []
        for plan, result in zip(plans, results, strict=True):
            if result.succeeded:
                landed.append((plan, result.revision))
            else:  # fenced meanwhile, a concurrent renewal, or a stale remembered view
                self._views.take(renewals[plan.index].fence)
                fresh.add(plan.index)
        if not landed:
            return
        leases = [_lease(plan) for plan, _ in landed]
        ttls = ctx.kv.keepalive_many(leases)
        alive = [(p, rev) for p, rev in landed if ttls[_lease(p)] > 0]
        for plan, _ in landed:
            if ttls[_lease(plan)] <= 0:  # the lease went away after our txn: ask why
                ctx.leases.forget(_lease(plan))
                self._refused(renewals, plan, answers)
        checks = ctx.kv.txn_many([p.check() for p, _ in alive])  # the fence, again
        now = ctx.clock.now()
        accepted: dict[int, int] = {}  # lease -> the TTL it was refreshed to
        validated = 0
        for (plan, revision), check in zip(alive, checks, strict=True):
            if not check.succeeded:
                self._refused(renewals, plan, answers)
                continue
            ttl = ttls[_lease(plan)]
            accepted[_lease(plan)] = ttl
            validated += self._accepted(renewals[plan.index], plan, revision, ttl, now, answers)
        ctx.leases.renewed_many(accepted)
        ctx.metrics.count_acceptances(
            AcceptancePoint.RENEW, accepted=len(accepted), validated=validated
        )

    def _accepted(
        self,
        renewal: Renewal,
        plan: _Plan,
        revision: int,
        ttl: int,
        now: float,
        answers: dict[int, RenewAnswer],
    ) -> bool:
        """Answer OK; whether the txn that accepted it compared the fence (coverage)."""
        ctx, fence = self._ctx, renewal.fence
        claim = plan.known.view.claim
        assert claim is not None
        self._views.remember(fence, _after(plan, renewal, revision))
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

    def _refused(
        self, renewals: Sequence[Renewal], plan: _Plan, answers: dict[int, RenewAnswer]
    ) -> None:
        fence = renewals[plan.index].fence
        self._views.take(fence)
        answers[plan.index] = RenewResult(diagnose(self._ctx, fence))


_OK = Verdict(Outcome.OK)


def _lease(plan: _Plan) -> int:
    claim = plan.known.view.claim
    assert claim is not None
    return claim.lease_id


def _after(plan: _Plan, renewal: Renewal, revision: int) -> _Known:
    """The view once ``plan``'s txn landed at ``revision``: what it wrote, as etcd now holds it
    (kept to be remembered: the next renewal of the claim decides on it, through its txn)."""
    known = plan.known
    written = plan.claim is not None or plan.attempt_written
    if not written:
        return known if known.remembered else with_changes(known, remembered=True)
    view = known.view
    claim = view.claim
    assert claim is not None
    if plan.claim is not None:
        claim = with_changes(plan.claim, mod_revision=revision)
    attempt, attempt_revision = view.attempt, known.attempt_revision
    if plan.attempt_written and renewal.checkpoint is not None:
        attempt, attempt_revision = with_changes(attempt, checkpoint=renewal.checkpoint), revision
    return _Known(
        with_changes(view, claim=claim, attempt=attempt), attempt_revision, True, known.txns
    )


def _duplicates(renewals: Sequence[Renewal]) -> Iterator[tuple[int, CoordinatorError]]:
    """Every item naming a task an earlier item of the same call names."""
    seen: dict[str, int] = {}
    for i, renewal in enumerate(renewals):
        task_id = renewal.fence.task_id
        if task_id in seen:
            yield (
                i,
                InvalidArgument(
                    f"renewals[{i}] names task {task_id!r}, as renewals[{seen[task_id]}] does: "
                    "renew each claim once per call"
                ),
            )
        else:
            seen[task_id] = i
