"""Side effects on the wire: PrepareEffect, RecordEffect, GetEffect, ResolveEffect,
ListOpenEffects and ApproveRetry's requests, and effect records as protos. Pure and mechanical
(see common_wire); EffectState and EffectAction convert by value.
"""

from __future__ import annotations

from coordinator.domain import effects as domain
from coordinator.domain import reconcile, validation
from coordinator.domain.effects import EffectAction, EffectRecord, EffectState
from coordinator.errors import InvalidArgument
from coordinator.server.wire import page_tokens
from coordinator.server.wire.common_wire import parse_digest, timestamp_to_proto, verdict_fields
from coordinator.store.effects.effect import PrepareResult, RecordResult
from coordinator.v1 import types_pb2, worker_pb2

# --- proto -> domain -------------------------------------------------------------------------


def parse_effect_id(value: str) -> str:
    """A well-formed effect id (``eff-`` + 64 hex)."""
    return domain.check_effect_id(value)


def parse_effects_page_token(value: str, task: str, rpc: str) -> str:
    """A ListOpenEffects or ListEffects page token (``task_id/effect_id`` of the previous
    page's last effect) of the same ``task`` filter; empty: the first page."""
    return page_tokens.parse(rpc, {"task_id": task}, value, _effect_position)


def effects_page_token(position: str, task: str, rpc: str) -> str:
    """The next_page_token of a ListOpenEffects or ListEffects page that ended at ``position``."""
    return page_tokens.issue(rpc, {"task_id": task}, position)


def _effect_position(value: str) -> None:
    tid, _, eid = value.partition("/")
    validation.task_id(tid, "page_token")
    domain.check_effect_id(eid)


def parse_node_id(value: str) -> str:
    """The node that owns the slot."""
    return domain.check_name("node_id", value)


def parse_effect_slot(value: str) -> str:
    """The slot within the node."""
    return domain.check_name("effect_slot", value)


def parse_payload_digest(value: str) -> str:
    """The digest of the payload the caller would send."""
    return parse_digest("payload_digest", value)


def parse_recorded_state(value: int) -> EffectState:
    """RecordEffect's state: COMMITTED, UNKNOWN or ABSENT."""
    state = _parse_effect_state("state", value)
    if state not in domain.RECORDABLE:
        raise InvalidArgument(
            f"state must be EFFECT_STATE_COMMITTED, EFFECT_STATE_UNKNOWN or EFFECT_STATE_ABSENT, "
            f"got EFFECT_STATE_{state.name} (PREPARED is reached only through PrepareEffect)"
        )
    return state


def parse_resolution(value: int) -> EffectState:
    """ApproveRetry's resolution: ABSENT or COMMITTED."""
    state = _parse_effect_state("resolution", value)
    if state not in domain.RESOLUTIONS:
        raise InvalidArgument(
            "resolution must be EFFECT_STATE_ABSENT (it did not happen: send again) or "
            f"EFFECT_STATE_COMMITTED (it happened: skip it), got EFFECT_STATE_{state.name}"
        )
    return state


def parse_external_ref(value: str) -> str:
    """What the downstream produced (bounded)."""
    return validation.text("external_ref", value, domain.MAX_REF_CHARS)


def parse_etag(value: str) -> str:
    """The downstream resource's ETag (bounded)."""
    return validation.text("etag", value, domain.MAX_ETAG_CHARS)


def parse_reconcile_principal(value: str, state: EffectState) -> str:
    """RecordEffect's named reconcile owner (only with UNKNOWN; empty: the caller)."""
    return reconcile.check_reconcile_principal("reconcile_principal", value, state)


def _parse_effect_state(field: str, value: int) -> EffectState:
    if value == 0:
        raise InvalidArgument(f"{field} is required")
    try:
        return EffectState(value)
    except ValueError:
        raise InvalidArgument(f"{field} {value} is not a known EffectState") from None


# --- domain -> proto -------------------------------------------------------------------------


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
        prepared_at=timestamp_to_proto(effect.prepared_at),
        updated_at=timestamp_to_proto(effect.updated_at),
        detail=effect.detail,
        reconcile_owner=effect.reconcile_owner,
        reconcile_owner_attempt_id=effect.reconcile_owner_attempt_id,
        reconcile_opened_at=timestamp_to_proto(effect.reconcile_opened_at),
        reconcile_deadline=timestamp_to_proto(effect.reconcile_deadline),
        reconcile_escalation=effect.reconcile_escalation,
        reconcile_open=effect.reconcile_open,
        reconcile_escalated_at=timestamp_to_proto(effect.reconcile_escalated_at),
        reconcile_named=effect.reconcile_named,
    )


def action_to_proto(value: EffectAction) -> types_pb2.EffectAction.ValueType:
    """The wire EffectAction (NONE is UNSPECIFIED)."""
    return types_pb2.EffectAction.ValueType(int(value))


def prepare_to_proto(result: PrepareResult) -> worker_pb2.PrepareEffectResponse:
    """PrepareEffectResponse; the effect whenever the fence held."""
    response = worker_pb2.PrepareEffectResponse(
        **verdict_fields(result.verdict),
        action=action_to_proto(result.action),
    )
    if result.effect is not None:
        response.effect_id = result.effect.effect_id
        response.effect.CopyFrom(effect_to_proto(result.effect))
    return response


def record_to_proto(result: RecordResult) -> worker_pb2.RecordEffectResponse:
    """RecordEffectResponse; the effect when recorded."""
    response = worker_pb2.RecordEffectResponse(**verdict_fields(result.verdict))
    if result.effect is not None:
        response.effect.CopyFrom(effect_to_proto(result.effect))
    return response
