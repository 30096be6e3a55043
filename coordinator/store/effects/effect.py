"""Side-effect slots in etcd: PrepareEffect, RecordEffect, GetEffect, ApproveRetry, and the hold
that parks a non-replayable task whose earlier attempt left an uncertain effect.

Prepare and record are acceptance points like commit: read the FenceView, check owner and fence
in the domain, decide in the domain (coordinator.domain.effects), then write behind
``fence_compares`` plus a CAS on the effect key (create_revision 0 for the first prepare, the
mod_revision read otherwise). A failed txn is read again and decided again, so a lost race is
answered from the state that won it.

Uncertain effects (PREPARED or UNKNOWN) are indexed per task under
``{p}/open-effects/{task}/{effect_id}``, written in the txn that changes the effect. Effect ids
are hashes, so the effect keys themselves cannot be ranged by task; the index makes both the
claim-time check of a non-replayable task and DrainStatus's count a short range over exactly
the uncertain effects, instead of a scan of every effect ever recorded. Likewise an UNKNOWN
effect's open reconciliation is indexed under ``{p}/reconcile/{task}/{effect_id}`` (see
store/effects/reconcile.py), kept in step by ``effect_write_ops`` from the record's reconcile_open
flag.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from coordinator import request_ids
from coordinator.domain.decisions import Fence, Verdict, check_fence, check_owner
from coordinator.domain.effect_ids import effect_id_of
from coordinator.domain.effects import (
    EffectAction,
    EffectRecord,
    EffectState,
    PrepareRequest,
    decide_hold,
    decide_prepare,
    decide_record,
    resolve,
)
from coordinator.domain.reconcile import Reconciliation, check_named_owner, open_on_unknown
from coordinator.domain.records import TaskRecord, decode, encode, with_changes
from coordinator.domain.states import Op, TaskState
from coordinator.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from coordinator.metrics import AcceptancePoint
from coordinator.store import coverage
from coordinator.store.attempts.acceptance import AcceptancePoints
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import (
    KV,
    Compare,
    RequestOp,
    create_revision_is,
    delete,
    get,
    get_prefix,
    mod_revision_is,
    put,
)
from coordinator.store.fence import fence_compares
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.transition import (
    claimless_move,
    transition,
    transition_ops,
)

# A prepare or record whose txn lost only to a concurrent change of the same effect retries.
_TRIES = 3
# etcd allows 128 operations per txn; an approval writes two per effect plus the transition.
MAX_EFFECTS_PER_TASK = 1024
"""Effect slots one task holds (all its revisions; they go with the task when it is pruned)."""
MAX_APPROVE_EFFECTS = 50
_READ_BATCH = 100


@dataclass(frozen=True)
class PrepareResult:
    """Outcome of PrepareEffect; ``effect`` is set whenever the fence held."""

    verdict: Verdict
    action: EffectAction = EffectAction.NONE
    effect: EffectRecord | None = None


@dataclass(frozen=True)
class RecordResult:
    """Outcome of RecordEffect; ``effect`` is set when the outcome is OK."""

    verdict: Verdict
    effect: EffectRecord | None = None


def effect_from_kv(kv: KV) -> EffectRecord:
    """Decode an effect with its key's mod_revision."""
    return decode(EffectRecord, kv.value, mod_revision=kv.mod_revision)


def effect_write_ops(
    ctx: StoreContext, before: EffectRecord | None, after: EffectRecord
) -> list[RequestOp]:
    """Write ``after`` and keep the open-effects index in step with its state."""
    keys = ctx.keys
    ops = [put(keys.effect(after.effect_id), encode(stamped(after)))]
    if before is None:  # the task's effects, for the pruner that removes them with the task
        ops.append(put(keys.task_effect(after.task_id, after.effect_id), b""))
    index = keys.open_effect(after.task_id, after.effect_id)
    was_open = before is not None and before.uncertain
    if after.uncertain and not was_open:
        ops.append(put(index, b""))
    elif was_open and not after.uncertain:
        ops.append(delete(index))
    # The reconcile index follows the record's reconcile_open flag (domain/reconcile.py).
    reconciling = before is not None and before.reconcile_open
    if after.reconcile_open and not reconciling:
        value = encode(Reconciliation.of(after))
        ops.append(put(keys.reconcile(after.task_id, after.effect_id), value))
    elif reconciling and not after.reconcile_open:
        ops.append(delete(keys.reconcile(after.task_id, after.effect_id)))
    return ops


def stamped(effect: EffectRecord) -> EffectRecord:
    """``effect`` carrying the request id of the call writing it ("" from a background loop),
    the way store/transition.py puts it in the task's event."""
    return with_changes(effect, request_id=request_ids.current())


def effect_unchanged(ctx: StoreContext, effect_id: str, before: EffectRecord | None) -> Compare:
    """The effect key is as read (absent: never created)."""
    key = ctx.keys.effect(effect_id)
    if before is None:
        return create_revision_is(key, 0)
    return mod_revision_is(key, before.mod_revision)


def open_effects(ctx: StoreContext, task_id: str) -> list[EffectRecord]:
    """The task's uncertain effects (PREPARED or UNKNOWN), by effect id."""
    prefix = ctx.keys.open_effects_prefix(task_id)
    ids = [
        kv.key.rsplit("/", 1)[1]
        for kv in ctx.kv.range_page(prefix, ctx.kv.prefix_end(prefix), keys_only=True)[0]
    ]
    return _read_effects(ctx, ids)


def _read_effects(ctx: StoreContext, ids: list[str]) -> list[EffectRecord]:
    """The records of ``ids``, in that order (an index entry whose effect is gone is skipped)."""
    found: list[EffectRecord] = []
    for start in range(0, len(ids), _READ_BATCH):  # etcd allows 128 operations per txn
        batch = ids[start : start + _READ_BATCH]
        snap = ctx.kv.read(*(get(ctx.keys.effect(i)) for i in batch))
        kvs = (snap.range_one(n) for n in range(len(batch)))
        found += [effect_from_kv(kv) for kv in kvs if kv is not None]
    return found


def hold_for_approval(
    ctx: StoreContext,
    task: TaskRecord,
    *,
    by: str,
    epoch: int,
) -> Verdict | None:
    """Park a non-replayable task instead of claiming it, if an earlier attempt left an effect
    uncertain: NEEDS_APPROVAL (written: the task leaves the ready index), else None.

    Called by the claim after its decision accepted. If the hold txn loses a race, None is
    returned: the claim txn compares the same task state_version and claim key, so it fails
    too and the claim reports the race.
    """
    if not task.non_replayable or task.attempt == 0:
        return None  # no earlier attempt, no earlier effect
    verdict = decide_hold(task, open_effects(ctx, task.task_id))
    if verdict is None:
        return None
    move = claimless_move(
        ctx, task, Op.HOLD_FOR_APPROVAL, ctx.clock.now(), by=by, epoch=epoch, detail=verdict.message
    )
    if not ctx.kv.txn(move.compares, move.ops).succeeded:
        return None
    return verdict


class EffectStore:
    """PrepareEffect, RecordEffect, GetEffect and ApproveRetry."""

    def __init__(self, ctx: StoreContext, ready: ReadyIndex, points: AcceptancePoints) -> None:
        self._ctx = ctx
        self._ready = ready
        self._points = points

    def get(self, effect_id: str) -> EffectRecord:
        """The effect, or NotFound."""
        kv = self._ctx.kv.get(self._ctx.keys.effect(effect_id))
        if kv is None:
            raise NotFound(f"effect {effect_id!r} does not exist")
        return effect_from_kv(kv)

    def open_effects(self, task_id: str) -> list[EffectRecord]:
        """The task's uncertain effects."""
        return open_effects(self._ctx, task_id)

    def list_open(
        self, *, task_id: str = "", page_size: int, page_token: str = ""
    ) -> tuple[list[EffectRecord], str]:
        """One page of uncertain effects (of ``task_id``, or of every task) in (task, effect)
        order, and the token of the next page ("" after the last): ``task_id/effect_id`` of
        the page's last entry. Keys only from the index, then the records in batches."""
        return self._page(self._ctx.keys.open_effects_prefix, task_id, page_size, page_token)

    def list_all(
        self, *, task_id: str = "", page_size: int, page_token: str = ""
    ) -> tuple[list[EffectRecord], str]:
        """One page of every effect, whatever its state, (of ``task_id``, or of every task)
        from the per-task effect index, in (task, effect) order; the token as ``list_open``'s."""
        return self._page(self._ctx.keys.task_effects_prefix, task_id, page_size, page_token)

    def _page(
        self, index: Callable[[str], str], task_id: str, page_size: int, page_token: str
    ) -> tuple[list[EffectRecord], str]:
        """A page of an effect index keyed ``{task_id}/{effect_id}`` (``index`` builds its
        prefix), read keys only, then the records in batches."""
        prefix, base = index(task_id), index("")
        start = base + page_token + "\0" if page_token else prefix
        page, _ = self._ctx.kv.range_page(
            start, self._ctx.kv.prefix_end(prefix), limit=page_size, keys_only=True
        )
        ids = [kv.key.rsplit("/", 1)[1] for kv in page]
        token = page[-1].key.removeprefix(base) if len(page) == page_size else ""
        return _read_effects(self._ctx, ids), token

    def count_open(self) -> int:
        """Uncertain effects across the keyspace (DrainStatus's unknown_effects)."""
        snap = self._ctx.kv.read(get_prefix(self._ctx.keys.open_effects_prefix(), count_only=True))
        return snap.range_count(0)

    def prepare(
        self, fence: Fence, *, principal: str, node_id: str, effect_slot: str, payload_digest: str
    ) -> PrepareResult:
        """Bind or look up the slot's effect and say what to do (see worker.proto)."""
        ctx = self._ctx
        for _ in range(_TRIES):
            view = self._points.view(fence)
            check_owner(view, fence, principal)
            verdict = check_fence(view, fence, now=ctx.clock.now())
            if not verdict.accepted:
                return PrepareResult(verdict)
            revision = view.attempt.revision
            request = PrepareRequest(
                effect_id=effect_id_of(view.task, revision, node_id, effect_slot),
                task_id=fence.task_id,
                revision=revision,
                node_id=node_id,
                effect_slot=effect_slot,
                payload_digest=payload_digest,
                generation=fence.claim_generation,
                attempt_id=fence.attempt_id,
                principal=principal,
            )
            existing = self._read(request)
            decision = decide_prepare(existing, request, ctx.clock.now())
            eid = decision.effect.effect_id
            compares = [*fence_compares(ctx.keys, fence), effect_unchanged(ctx, eid, existing)]
            ops = effect_write_ops(ctx, existing, decision.write) if decision.write else []
            result = ctx.kv.txn(compares, ops)
            if result.succeeded:
                coverage.observe_fence(AcceptancePoint.PREPARE, compares, self._ctx, fence)
                effect = decision.write or decision.effect
                if decision.write is not None:
                    effect = _at(effect, result.revision)
                return PrepareResult(decision.verdict, decision.action, effect)
        return PrepareResult(self._points.diagnose(fence))

    def record(
        self,
        fence: Fence,
        *,
        principal: str,
        effect_id: str,
        state: EffectState,
        external_ref: str,
        etag: str,
        reconcile_principal: str = "",
    ) -> RecordResult:
        """Record what the downstream did (COMMITTED / UNKNOWN / ABSENT), behind the fence.

        PREPARED -> UNKNOWN opens an owned reconciliation in the same txn (domain/reconcile.py),
        owned by ``reconcile_principal`` or, when empty, by the caller.
        """
        ctx = self._ctx
        for _ in range(_TRIES):
            view = self._points.view(fence)
            check_owner(view, fence, principal)
            existing = self._prepared(effect_id, fence)
            verdict = check_fence(view, fence, now=ctx.clock.now())
            if not verdict.accepted:
                return RecordResult(verdict)
            if existing.task_revision != view.attempt.revision:
                raise FailedPrecondition(
                    f"effect {effect_id} belongs to revision {existing.task_revision} of the "
                    f"task, the attempt runs revision {view.attempt.revision}"
                )
            check_named_owner(existing, reconcile_principal)
            after = decide_record(
                existing,
                state=state,
                external_ref=external_ref,
                etag=etag,
                generation=fence.claim_generation,
                principal=principal,
                now=ctx.clock.now(),
            )
            if after is not None:
                after = open_on_unknown(
                    existing,
                    after,
                    holder=principal,
                    attempt_id=fence.attempt_id,
                    attempt=view.attempt.attempt,
                    named_owner=reconcile_principal,
                    now=after.updated_at,
                    timeout=ctx.limits.reconcile_timeout,
                )
            compares = [
                *fence_compares(ctx.keys, fence),
                effect_unchanged(ctx, effect_id, existing),
            ]
            ops = effect_write_ops(ctx, existing, after) if after is not None else []
            result = ctx.kv.txn(compares, ops)
            if result.succeeded:
                coverage.observe_fence(AcceptancePoint.RECORD, compares, self._ctx, fence)
                return RecordResult(verdict, _at(after, result.revision) if after else existing)
        return RecordResult(self._points.diagnose(fence))

    def _prepared(self, effect_id: str, fence: Fence) -> EffectRecord:
        """The effect a Record names, which PrepareEffect must have written for the fence's
        task: NotFound or InvalidArgument otherwise (before any fence check, as a request error)."""
        kv = self._ctx.kv.get(self._ctx.keys.effect(effect_id))
        if kv is None:
            raise NotFound(f"effect {effect_id} was never prepared: call PrepareEffect first")
        existing = effect_from_kv(kv)
        if existing.task_id != fence.task_id:
            raise InvalidArgument(
                f"effect {effect_id} belongs to task {existing.task_id!r}, "
                f"not to fence.task_id {fence.task_id!r}"
            )
        return existing

    def approve_retry(
        self, task_id: str, *, by: str, resolution: EffectState, reason: str
    ) -> tuple[TaskRecord, list[EffectRecord]]:
        """Resolve a NEEDS_APPROVAL task's uncertain effects and make it READY again, in one
        txn whose event names the approver."""
        ctx, keys = self._ctx, self._ctx.keys
        for _ in range(_TRIES):
            kv = ctx.kv.get(keys.task(task_id))
            if kv is None:
                raise NotFound(f"task {task_id!r} does not exist")
            task = task_from_kv(kv)
            if task.state is not TaskState.NEEDS_APPROVAL:
                raise FailedPrecondition(
                    f"task {task_id!r} is {task.state.name}; only a NEEDS_APPROVAL task can be "
                    "approved for retry"
                )
            pending = self.open_effects(task_id)
            if len(pending) > MAX_APPROVE_EFFECTS:
                raise FailedPrecondition(
                    f"task {task_id!r} has {len(pending)} uncertain effects; one approval "
                    f"resolves at most {MAX_APPROVE_EFFECTS}"
                )
            now = ctx.clock.now()
            resolved = [resolve(e, resolution, by=by, reason=reason, now=now) for e in pending]
            after = transition(task, Op.APPROVE_RETRY, now)
            ids = ", ".join(e.effect_id for e in resolved) or "none"
            detail = f"approved by {by}: effects resolved {resolution.name} ({ids})" + (
                f"; {reason}" if reason else ""
            )
            compares, ops = transition_ops(ctx, task, after, Op.APPROVE_RETRY, by=by, detail=detail)
            for before, new in zip(pending, resolved, strict=True):
                compares.append(effect_unchanged(ctx, new.effect_id, before))
                ops += effect_write_ops(ctx, before, new)
            result = ctx.kv.txn(compares, ops)
            if result.succeeded:
                self._ready.add(keys.ready(after.queue, after.priority, after.ready_seq, task_id))
                ready = with_changes(after, state_version=result.revision)
                return ready, [_at(e, result.revision) for e in resolved]
        raise FailedPrecondition(f"task {task_id!r} kept changing; approve again")

    def _read(self, request: PrepareRequest) -> EffectRecord | None:
        """The slot's effect, if bound; ResourceExhausted for a new slot of a task that holds
        MAX_EFFECTS_PER_TASK (one claim bound 1,500 slots, 12 MB, in 16 s)."""
        keys = self._ctx.keys
        snap = self._ctx.kv.read(
            get(keys.effect(request.effect_id)),
            get_prefix(keys.task_effects_prefix(request.task_id), count_only=True),
        )
        kv = snap.range_one(0)
        if kv is not None:
            return effect_from_kv(kv)
        if snap.range_count(1) >= MAX_EFFECTS_PER_TASK:
            raise ResourceExhausted(
                f"task {request.task_id!r} holds {MAX_EFFECTS_PER_TASK} effect slots, the "
                "limit: a new slot cannot be bound; reuse a slot for a retry of the same effect"
            )
        return None


def _at(effect: EffectRecord, revision: int) -> EffectRecord:
    """``effect`` as written at ``revision`` (its key's new mod_revision and request id)."""
    return with_changes(stamped(effect), mod_revision=revision)
