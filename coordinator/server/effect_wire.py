"""Request checks and proto conversion of the side-effect RPCs (pure and mechanical, no rules).

Like coordinator.server.validate and .convert, for PrepareEffect, RecordEffect, GetEffect,
ApproveRetry and GetStats: messages name the field as the .proto spells it, enums convert by
value (the domain's integers equal the wire's).
"""

from __future__ import annotations

from coordinator.domain import effects as domain
from coordinator.domain import reconcile, validation
from coordinator.domain.effects import EffectAction, EffectRecord, EffectState
from coordinator.domain.queue_stats import QueueReport
from coordinator.errors import InvalidArgument
from coordinator.metrics import PointCoverage
from coordinator.server import convert, validate
from coordinator.store.effects import PrepareResult, RecordResult
from coordinator.v1 import admin_pb2, types_pb2, worker_pb2

# --- requests --------------------------------------------------------------------------------


def effect_id(value: str) -> str:
    """A well-formed effect id (``eff-`` + 64 hex)."""
    return domain.check_effect_id(value)


def open_effects_page_token(value: str, task: str) -> str:
    """A ListOpenEffects page token (``task_id/effect_id`` of the previous page's last
    effect), of ``task`` when the listing is one task's; empty: the first page."""
    if not value:
        return ""
    tid, _, eid = value.partition("/")
    try:
        validation.task_id(tid, "page_token")
        domain.check_effect_id(eid)
    except InvalidArgument:
        raise InvalidArgument(
            f"page_token {value[:60]!r} is not one ListOpenEffects returned"
        ) from None
    if task and tid != task:
        raise InvalidArgument(f"page_token {value[:60]!r} is not of task {task!r}")
    return value


def node_id(value: str) -> str:
    """The node that owns the slot."""
    return domain.check_name("node_id", value)


def effect_slot(value: str) -> str:
    """The slot within the node."""
    return domain.check_name("effect_slot", value)


def payload_digest(value: str) -> str:
    """The digest of the payload the caller would send."""
    return validate.digest("payload_digest", value)


def recorded_state(value: int) -> EffectState:
    """RecordEffect's state: COMMITTED, UNKNOWN or ABSENT."""
    state = _effect_state("state", value)
    if state not in domain.RECORDABLE:
        raise InvalidArgument(
            f"state must be EFFECT_STATE_COMMITTED, EFFECT_STATE_UNKNOWN or EFFECT_STATE_ABSENT, "
            f"got EFFECT_STATE_{state.name} (PREPARED is reached only through PrepareEffect)"
        )
    return state


def resolution(value: int) -> EffectState:
    """ApproveRetry's resolution: ABSENT or COMMITTED."""
    state = _effect_state("resolution", value)
    if state not in domain.RESOLUTIONS:
        raise InvalidArgument(
            "resolution must be EFFECT_STATE_ABSENT (it did not happen: send again) or "
            f"EFFECT_STATE_COMMITTED (it happened: skip it), got EFFECT_STATE_{state.name}"
        )
    return state


def external_ref(value: str) -> str:
    """What the downstream produced (bounded)."""
    return validation.text("external_ref", value, domain.MAX_REF_CHARS)


def etag(value: str) -> str:
    """The downstream resource's ETag (bounded)."""
    return validation.text("etag", value, domain.MAX_ETAG_CHARS)


def reconcile_principal(value: str, state: EffectState) -> str:
    """RecordEffect's named reconcile owner (only with UNKNOWN; empty: the caller)."""
    return reconcile.check_principal("reconcile_principal", value, state)


def _effect_state(field: str, value: int) -> EffectState:
    if value == 0:
        raise InvalidArgument(f"{field} is required")
    try:
        return EffectState(value)
    except ValueError:
        raise InvalidArgument(f"{field} {value} is not a known EffectState") from None


# --- responses -------------------------------------------------------------------------------


def effect_to_proto(effect: EffectRecord) -> types_pb2.Effect:
    """An effect record on the wire."""
    return types_pb2.Effect(
        effect_id=effect.effect_id,
        task_id=effect.task_id,
        task_revision=effect.task_revision,
        node_id=effect.node_id,
        effect_slot=effect.effect_slot,
        payload_digest=effect.payload_digest,
        state=types_pb2.EffectState.ValueType(int(effect.state)),
        prepared_generation=effect.prepared_generation,
        prepared_attempt_id=effect.prepared_attempt_id,
        reconciler_generation=effect.reconciler_generation,
        recorded_generation=effect.recorded_generation,
        external_ref=effect.external_ref,
        etag=effect.etag,
        prepared_at=convert.timestamp(effect.prepared_at),
        updated_at=convert.timestamp(effect.updated_at),
        detail=effect.detail,
        reconcile_owner=effect.reconcile_owner,
        reconcile_owner_attempt_id=effect.reconcile_owner_attempt_id,
        reconcile_opened_at=convert.timestamp(effect.reconcile_opened_at),
        reconcile_deadline=convert.timestamp(effect.reconcile_deadline),
        reconcile_escalation=effect.reconcile_escalation,
        reconcile_open=effect.reconcile_open,
        reconcile_escalated_at=convert.timestamp(effect.reconcile_escalated_at),
        reconcile_named=effect.reconcile_named,
    )


def action(value: EffectAction) -> types_pb2.EffectAction.ValueType:
    """The wire EffectAction (NONE is UNSPECIFIED)."""
    return types_pb2.EffectAction.ValueType(int(value))


def prepare_response(result: PrepareResult) -> worker_pb2.PrepareEffectResponse:
    """PrepareEffectResponse; the effect whenever the fence held."""
    verdict = result.verdict
    response = worker_pb2.PrepareEffectResponse(
        outcome=convert.outcome(verdict.outcome),
        reason=convert.reason(verdict.reason),
        message=verdict.message,
        action=action(result.action),
    )
    if result.effect is not None:
        response.effect_id = result.effect.effect_id
        response.effect.CopyFrom(effect_to_proto(result.effect))
    return response


def record_response(result: RecordResult) -> worker_pb2.RecordEffectResponse:
    """RecordEffectResponse; the effect when recorded."""
    verdict = result.verdict
    response = worker_pb2.RecordEffectResponse(
        outcome=convert.outcome(verdict.outcome),
        reason=convert.reason(verdict.reason),
        message=verdict.message,
    )
    if result.effect is not None:
        response.effect.CopyFrom(effect_to_proto(result.effect))
    return response


def stats_response(points: list[PointCoverage], queues: QueueReport) -> admin_pb2.GetStatsResponse:
    """GetStatsResponse: fence-check coverage per acceptance point, and the queue figures."""
    return admin_pb2.GetStatsResponse(
        queues=[
            admin_pb2.QueueStats(
                queue=q.queue,
                ready_tasks=q.ready,
                oldest_ready_age_seconds=q.oldest_ready_age,
                claimed_tasks=q.claimed,
            )
            for q in queues.queues
        ],
        queues_left_out=queues.left_out,
        fence_coverage=[
            admin_pb2.FenceCoverage(
                point=admin_pb2.AcceptancePoint.ValueType(int(p.point)),
                accepted=p.accepted,
                validated=p.validated,
                coverage=p.coverage,
            )
            for p in points
        ],
    )
