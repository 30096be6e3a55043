"""Owned reconciliation of UNKNOWN effects in etcd: the claim gate, the escalation at the
deadline, ResolveEffect, and the sweeper that escalates in every replica.

The rules are in ``coordinator.domain.reconcile``. A reconciliation is opened by RecordEffect
(store/effects/effect.py) in the txn that records UNKNOWN, which also writes the index key
``{p}/reconcile/{task}/{effect}`` (its value: owner and deadline); every txn that closes it
(a COMMITTED / ABSENT record, ResolveEffect, ApproveRetry, the escalation) deletes that key
through ``effect_write_ops``. So the claim path reads one short range per re-claimed task, and
the sweeper one range for the whole keyspace.

An escalation is one txn: the task to NEEDS_APPROVAL through ``transition()`` (event naming the
effects and the reason), the effects marked escalated, the index keys deleted, the claim key
compared absent, the task and every effect compared unchanged. Replicas racing on it: one txn
wins, the others' compares fail and they write nothing, so it happens exactly once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import structlog

from coordinator.domain.decisions import Verdict
from coordinator.domain.effects import EffectRecord, EffectState
from coordinator.domain.reconcile import (
    Gate,
    Reconciliation,
    check_resolver,
    decide_claim_gate,
    escalate,
    escalation_detail,
    resolve_owned,
)
from coordinator.domain.records import TaskRecord, decode, with_changes
from coordinator.domain.states import Op, Outcome, TaskState
from coordinator.errors import FailedPrecondition, NotFound
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.effects.effect import (
    effect_from_kv,
    effect_unchanged,
    effect_write_ops,
    stamped,
)
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
from coordinator.store.indexes.ready import ReadyIndex
from coordinator.store.transition import (
    claimless_move,
)

log = structlog.get_logger(__name__)

SWEEPER = "coordinator:reconcile-sweeper"
"""The ``by`` of escalations the sweeper makes (a claim's escalation names the claimer)."""

_TRIES = 3
# The states an escalation moves to NEEDS_APPROVAL; in any other state (REVIEW, DONE,
# CANCELLED, WAITING, NEEDS_APPROVAL) the reconciliation is closed as escalated and the effect
# stays UNKNOWN for an admin (DrainStatus counts it until ResolveEffect).
_MOVABLE = frozenset({TaskState.READY, TaskState.CLAIMED})


def reconciliations_from(kvs: Sequence[KV]) -> list[Reconciliation]:
    """Decode index values."""
    return [decode(Reconciliation, kv.value) for kv in kvs]


class ReconcileStore:
    """The claim gate, escalation, ResolveEffect and the sweep."""

    def __init__(self, ctx: StoreContext, ready: ReadyIndex) -> None:
        self._ctx = ctx
        self._ready = ready

    # --- the claim path ----------------------------------------------------------------------

    def claim_gate(
        self, task: TaskRecord, kvs: Sequence[KV], *, by: str, epoch: int
    ) -> Verdict | None:
        """Called by a claim that its decision accepted (READY, or CLAIMED whose claim is gone),
        with the task's ``{p}/reconcile/{task}/`` keys read together with the task: None to go
        on; RECONCILING while an open reconciliation waits for its owner (nothing written);
        NEEDS_APPROVAL when one is past its deadline (escalated, written)."""
        if not kvs:
            return None
        ctx = self._ctx
        decision = decide_claim_gate(
            task.attempt,
            reconciliations_from(kvs),
            now=ctx.clock.now(),
            handoffs=ctx.limits.reconcile_handoffs,
            task_revision=task.revision,
        )
        if decision.gate is Gate.PROCEED:
            return None
        if decision.gate is Gate.WAIT:
            return decision.verdict
        ids = [r.effect_id for r in decision.due]
        if self._escalate(task, ids, by=by, via="claim", epoch=epoch):
            return Verdict(
                Outcome.NEEDS_APPROVAL,
                message=f"effect(s) {', '.join(ids)} stayed UNKNOWN past the reconcile deadline: "
                "the task moved to NEEDS_APPROVAL and waits for AdminService.ApproveRetry",
            )
        return Verdict(
            Outcome.RECONCILING,
            message="the task or its reconciliation changed while escalating it; try again",
        )

    # --- the sweep ---------------------------------------------------------------------------

    def sweep(self) -> int:
        """Escalate every reconciliation past its deadline; returns how many tasks moved (or
        were closed). Each task is its own CAS: safe on every replica at once."""
        ctx = self._ctx
        prefix = ctx.keys.reconcile_prefix()
        kvs, _ = ctx.kv.range_page(prefix, ctx.kv.prefix_end(prefix))
        now = ctx.clock.now()
        due = sorted({r.task_id for r in reconciliations_from(kvs) if r.due(now)})
        return sum(1 for task_id in due if self.sweep_task(task_id))

    def sweep_task(self, task_id: str) -> bool:
        """Escalate the task's due reconciliations. False when nothing was due, a live claim
        keeps the task for now (escalated when it ends), or another replica won the race."""
        ctx, keys = self._ctx, self._ctx.keys
        snap = ctx.kv.read(
            get(keys.task(task_id)),
            get(keys.claim(task_id)),
            get_prefix(keys.reconcile_prefix(task_id)),
        )
        task_kv = snap.range_one(0)
        if task_kv is None or snap.range_one(1) is not None:
            return False
        now = ctx.clock.now()
        due = [r.effect_id for r in reconciliations_from(snap.range_kvs(2)) if r.due(now)]
        if not due:
            return False
        task = task_from_kv(task_kv)
        return self._escalate(task, due, by=SWEEPER, via="sweeper", epoch=task.scheduler_epoch)

    def _escalate(
        self, task: TaskRecord, effect_ids: list[str], *, by: str, via: str, epoch: int
    ) -> bool:
        """One txn: the due effects escalated, and the task to NEEDS_APPROVAL if it is READY or
        CLAIMED (claim key absent). False if any compare failed (nothing written)."""
        ctx, keys = self._ctx, self._ctx.keys
        snap = ctx.kv.read(*(get(keys.effect(e)) for e in effect_ids))
        found = [snap.range_one(n) for n in range(len(effect_ids))]
        before = [effect_from_kv(kv) for kv in found if kv is not None]
        still_open = [e for e in before if e.reconcile_open]
        now = ctx.clock.now()
        compares: list[Compare] = []
        ops: list[RequestOp] = []
        # An index key whose effect is gone or closed is a leftover: drop it in the same txn.
        open_ids = {e.effect_id for e in still_open}
        for eid in effect_ids:
            if eid not in open_ids:
                ops.append(delete(keys.reconcile(task.task_id, eid)))
        for effect in still_open:
            compares.append(effect_unchanged(ctx, effect.effect_id, effect))
            ops += effect_write_ops(ctx, effect, escalate(effect, now))
        # Only an effect of the task's current revision parks the task (domain/reconcile.py).
        current = [e for e in still_open if e.task_revision == task.revision]
        moves = bool(current) and task.state in _MOVABLE
        if moves:
            move = claimless_move(
                ctx,
                task,
                Op.ESCALATE_RECONCILE,
                now,
                by=by,
                epoch=epoch,
                detail=escalation_detail(current),
            )
            compares += move.compares
            ops += move.ops
        else:
            compares.append(mod_revision_is(keys.task(task.task_id), task.state_version))
        if not ctx.kv.txn(compares, ops).succeeded:
            return False
        if moves:
            self._ctx.metrics.count_reconcile_escalations(via, len(current))
            if task.state is TaskState.READY:
                self._ready.discard(
                    keys.ready(task.queue, task.priority, task.ready_seq, task.task_id)
                )
        log.warning(
            "reconciliation escalated" if moves else "reconciliation closed at its deadline",
            task_id=task.task_id,
            task_state=task.state.name,
            effects=sorted(open_ids),
            via=via,
            by=by,
        )
        return True

    # --- ResolveEffect -----------------------------------------------------------------------

    def resolve(
        self,
        effect_id: str,
        *,
        caller: str,
        is_admin: bool,
        resolution: EffectState,
        external_ref: str,
        etag: str,
        reason: str,
    ) -> EffectRecord:
        """The owner of the open reconciliation, or an admin, says what the downstream did,
        while no claim is alive; a READY task's ready key is written again so every replica's
        ClaimNext (which skipped it while RECONCILING) sees it once more."""
        ctx, keys = self._ctx, self._ctx.keys
        for _ in range(_TRIES):
            kv = ctx.kv.get(keys.effect(effect_id))
            if kv is None:
                raise NotFound(f"effect {effect_id!r} does not exist")
            effect = effect_from_kv(kv)
            check_resolver(effect, caller=caller, is_admin=is_admin)
            task = self._unclaimed_task(effect, effect_id)
            after = resolve_owned(
                effect,
                resolution,
                by=caller,
                reason=reason,
                external_ref=external_ref,
                etag=etag,
                now=ctx.clock.now(),
            )
            compares = [
                effect_unchanged(ctx, effect_id, effect),
                mod_revision_is(keys.task(task.task_id), task.state_version),
                create_revision_is(keys.claim(task.task_id), 0),
            ]
            ops = effect_write_ops(ctx, effect, after)
            ready_key = None
            if task.state is TaskState.READY:
                ready_key = keys.ready(task.queue, task.priority, task.ready_seq, task.task_id)
                ops.append(put(ready_key, b""))
            result = ctx.kv.txn(compares, ops)
            if result.succeeded:
                if ready_key is not None:
                    self._ready.add(ready_key)
                log.info(
                    "effect resolved",
                    effect_id=effect_id,
                    task_id=task.task_id,
                    resolution=resolution.name,
                    by=caller,
                )
                return with_changes(stamped(after), mod_revision=result.revision)
        raise FailedPrecondition(f"effect {effect_id} or its task kept changing; resolve again")

    def _unclaimed_task(self, effect: EffectRecord, effect_id: str) -> TaskRecord:
        """The task of ``effect``, which must have no live claim: while one lives, its holder
        reconciles behind the fence, never an operator around it."""
        keys = self._ctx.keys
        snap = self._ctx.kv.read(get(keys.task(effect.task_id)), get(keys.claim(effect.task_id)))
        task_kv = snap.range_one(0)
        if task_kv is None:
            raise NotFound(f"task {effect.task_id!r} of effect {effect_id} does not exist")
        if snap.range_one(1) is not None:
            raise FailedPrecondition(
                f"task {effect.task_id!r} has a live claim: its holder reconciles effect "
                f"{effect_id} with RecordEffect, behind the fence"
            )
        return task_from_kv(task_kv)


class ReconcileSweeper:
    """Runs ``ReconcileStore.sweep`` every ``interval`` seconds in a thread (every replica)."""

    name = "reconcile-sweeper"

    def __init__(
        self,
        store: ReconcileStore,
        admitted: Callable[[], bool] = lambda: True,
        *,
        interval: float = 5.0,
    ) -> None:
        """``admitted``: whether the version record admits this replica (a refused one sweeps
        nothing; ``StoreContext.admitted``)."""
        self._store = store
        self._admitted = admitted
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Sweep now, then every interval."""
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the loop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._admitted():
                    self._store.sweep()
            except Exception as exc:  # etcd outage: the next sweep tries again
                log.warning("background work failed", loop=self.name, error=str(exc))
            self._stop.wait(self._interval)
