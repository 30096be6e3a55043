"""Side-effect slots as pure rules: the record, and what prepare and record decide.

A side effect (an email, a git push, a cloud resource) belongs to a *slot* of a task revision,
never to an attempt: ``effect_id = H(task_id, created_revision, revision, node_id,
effect_slot)`` (domain/effect_ids.py). Every generation of that revision sends the same id
downstream as its idempotency key, so a takeover can ask the downstream what the previous owner
did instead of doing it again. The first prepare binds the payload digest; a different digest
is a PAYLOAD_CONFLICT, whatever state the effect is in: only a new task revision or a new slot
(or a new task under a reused id) creates another effect. Attempts and generations are not in
the id, so a retry or a takeover of the same revision lands on the same record.

Nothing here does I/O; ``coordinator.store.effects.effect`` turns these decisions into etcd txns.
The integer values of the enums equal the wire enums in types.proto.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import IntEnum

from coordinator.domain.decisions import Verdict
from coordinator.domain.records import TaskRecord
from coordinator.domain.states import Outcome
from coordinator.domain.validation import no_dot_segments
from coordinator.errors import FailedPrecondition, InvalidArgument


class EffectState(IntEnum):
    """Where a side effect stands (see types.proto)."""

    PREPARED = 1
    COMMITTED = 2
    UNKNOWN = 3
    ABSENT = 4


class EffectAction(IntEnum):
    """What PrepareEffect tells the caller to do; NONE (the wire's UNSPECIFIED) means nothing."""

    NONE = 0
    EXECUTE = 1
    SKIP = 2
    RECONCILE = 3


# The downstream may or may not have performed the call: nobody may send before reconciling.
UNCERTAIN = frozenset({EffectState.PREPARED, EffectState.UNKNOWN})
# What RecordEffect accepts; PREPARED is reached only through PrepareEffect.
RECORDABLE = frozenset({EffectState.COMMITTED, EffectState.UNKNOWN, EffectState.ABSENT})
# What an admin may decide about an uncertain effect when approving a retry.
RESOLUTIONS = frozenset({EffectState.ABSENT, EffectState.COMMITTED})


_EFFECT_ID = re.compile(r"^eff-[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9._:@/-]{1,128}$")
MAX_REF_CHARS = 2048
MAX_ETAG_CHARS = 256


@dataclass(frozen=True)
class EffectRecord:
    """One effect under {p}/effects/{effect_id}."""

    effect_id: str
    task_id: str
    task_revision: int
    node_id: str
    effect_slot: str
    payload_digest: str
    state: EffectState
    # The generation (attempt, principal) that last moved it to PREPARED: the one that may send.
    prepared_generation: int
    prepared_attempt_id: str
    prepared_by: str
    prepared_at: float
    # The latest later generation told to RECONCILE it; it may record, like the preparer.
    reconciler_generation: int = 0
    recorded_generation: int = 0
    recorded_by: str = ""
    external_ref: str = ""
    etag: str = ""
    updated_at: float = 0.0
    # An admin resolution: who decided what, and why.
    detail: str = ""
    # Owned reconciliation (domain/reconcile.py), opened when the effect became UNKNOWN: the
    # owner (principal and attempt), whether RecordEffect named it, the task's attempt number
    # then (later claims are takeovers), when it opened, its deadline and the escalation.
    reconcile_owner: str = ""
    reconcile_owner_attempt_id: str = ""
    reconcile_named: bool = False
    reconcile_opened_attempt: int = 0
    reconcile_opened_at: float = 0.0
    reconcile_deadline: float = 0.0
    reconcile_escalation: str = ""
    # True from the opening until resolved (COMMITTED / ABSENT) or escalated; the index key
    # {p}/reconcile/{task}/{effect} exists exactly while it is true.
    reconcile_open: bool = False
    reconcile_escalated_at: float = 0.0
    # The request id (coordinator/request_ids.py) of the call whose txn last wrote the record;
    # "" for a background write (the sweeper) and for records written before it existed. The
    # chaos checker settles an indefinite effect call by finding it in the key's history.
    request_id: str = ""
    # etcd mod_revision of the effect key; never stored, attached on decode.
    mod_revision: int = field(default=0, compare=False)

    @property
    def uncertain(self) -> bool:
        """Whether the downstream may or may not have performed the call."""
        return self.state in UNCERTAIN

    def may_record(self, generation: int) -> bool:
        """Whether ``generation`` prepared this effect or was told to reconcile it."""
        return generation in (self.prepared_generation, self.reconciler_generation)


@dataclass(frozen=True)
class PrepareRequest:
    """A validated PrepareEffect of the generation that holds the claim; ``effect_id`` is the
    slot's id by the task's scheme (effect_ids.effect_id_of)."""

    effect_id: str
    task_id: str
    revision: int
    node_id: str
    effect_slot: str
    payload_digest: str
    generation: int
    attempt_id: str
    principal: str


@dataclass(frozen=True)
class PrepareDecision:
    """The answer to a prepare and the record to write (None: compare the fence, write nothing).

    On PAYLOAD_CONFLICT ``action`` says what to do about the *original* effect.
    """

    verdict: Verdict
    action: EffectAction
    effect: EffectRecord
    write: EffectRecord | None = None


def decide_prepare(
    existing: EffectRecord | None, req: PrepareRequest, now: float
) -> PrepareDecision:
    """What a prepare of ``req`` does to the slot's effect (the fence was checked before)."""
    if existing is None:
        fresh = EffectRecord(
            effect_id=req.effect_id,
            task_id=req.task_id,
            task_revision=req.revision,
            node_id=req.node_id,
            effect_slot=req.effect_slot,
            payload_digest=req.payload_digest,
            state=EffectState.PREPARED,
            prepared_generation=req.generation,
            prepared_attempt_id=req.attempt_id,
            prepared_by=req.principal,
            prepared_at=now,
            updated_at=now,
        )
        return PrepareDecision(_ok(), EffectAction.EXECUTE, fresh, fresh)
    if existing.payload_digest != req.payload_digest:
        return _conflict(existing, req, now)
    if existing.state is EffectState.COMMITTED:
        return PrepareDecision(
            _ok(f"already committed: {existing.external_ref}"), EffectAction.SKIP, existing
        )
    if existing.state is EffectState.ABSENT:
        again = replace(
            existing,
            state=EffectState.PREPARED,
            prepared_generation=req.generation,
            prepared_attempt_id=req.attempt_id,
            prepared_by=req.principal,
            prepared_at=now,
            reconciler_generation=0,
            updated_at=now,
        )
        return PrepareDecision(
            _ok("confirmed absent: send it with the same key"), EffectAction.EXECUTE, again, again
        )
    if existing.state is EffectState.PREPARED and existing.prepared_generation == req.generation:
        # This attempt prepared it and has not recorded anything: a retry of its own prepare
        # (the SDK records before it would prepare the same slot again).
        return PrepareDecision(
            _ok("prepared by this generation already"), EffectAction.EXECUTE, existing
        )
    return _reconcile(existing, req, now, _ok(_why_reconcile(existing, req.generation)))


def decide_record(
    existing: EffectRecord,
    *,
    state: EffectState,
    external_ref: str,
    etag: str,
    generation: int,
    principal: str,
    now: float,
) -> EffectRecord | None:
    """The record after RecordEffect, or None for a repeat of what is already recorded.

    Raises FailedPrecondition for a move the protocol does not allow (nothing is written).
    """
    if state not in RECORDABLE:
        raise InvalidArgument(f"state must be COMMITTED, UNKNOWN or ABSENT, got {state.name}")
    if existing.state is state and (
        state is not EffectState.COMMITTED
        or (existing.external_ref, existing.etag) == (external_ref, etag)
    ):
        return None  # a repeat (a retry after a lost response): already recorded
    if existing.state is EffectState.COMMITTED:
        raise FailedPrecondition(
            f"effect {existing.effect_id} is COMMITTED (external_ref {existing.external_ref!r}); "
            f"it cannot become {state.name}"
            + (" or change its external_ref" if state is EffectState.COMMITTED else "")
        )
    if existing.state not in UNCERTAIN:
        # ABSENT goes back to PREPARED only through a prepare: the holder is about to send.
        raise FailedPrecondition(
            f"effect {existing.effect_id} is {existing.state.name}; call PrepareEffect before "
            f"recording {state.name}"
        )
    if not existing.may_record(generation):
        raise FailedPrecondition(
            f"generation {generation} neither prepared effect {existing.effect_id} nor was told "
            "to reconcile it: call PrepareEffect first"
        )
    return replace(
        existing,
        state=state,
        external_ref=external_ref if state is EffectState.COMMITTED else existing.external_ref,
        etag=etag if state is EffectState.COMMITTED else existing.etag,
        recorded_generation=generation,
        recorded_by=principal,
        updated_at=now,
        reconcile_open=existing.reconcile_open and state is EffectState.UNKNOWN,
    )


def decide_hold(task: TaskRecord, open_effects: Iterable[EffectRecord]) -> Verdict | None:
    """NEEDS_APPROVAL when a new attempt of a non-replayable task would start over an uncertain
    effect of an earlier attempt; None when the claim may go on."""
    if not task.non_replayable:
        return None
    uncertain = sorted(e.effect_id for e in open_effects if e.uncertain)
    if not uncertain:
        return None
    shown = ", ".join(uncertain[:5]) + (" ..." if len(uncertain) > 5 else "")
    return Verdict(
        Outcome.NEEDS_APPROVAL,
        message=f"non-replayable task {task.task_id} has {len(uncertain)} uncertain effect(s) "
        f"from an earlier attempt ({shown}); an admin must ApproveRetry",
    )


def resolve(
    effect: EffectRecord, resolution: EffectState, *, by: str, reason: str, now: float
) -> EffectRecord:
    """An uncertain effect as an admin resolved it when approving a retry."""
    if resolution not in RESOLUTIONS:
        raise InvalidArgument(f"resolution must be ABSENT or COMMITTED, got {resolution.name}")
    note = f"resolved {resolution.name} by {by}" + (f": {reason}" if reason else "")
    return replace(
        effect,
        state=resolution,
        external_ref=effect.external_ref
        or (f"approved-by:{by}" if resolution is EffectState.COMMITTED else ""),
        reconciler_generation=0,
        recorded_by=by,
        detail=note,
        updated_at=now,
        reconcile_open=False,
    )


# --- validation (pure; raises InvalidArgument naming the field) ------------------------------


def check_effect_id(value: str, field_name: str = "effect_id") -> str:
    """An effect id as PrepareEffect returns it."""
    if not value:
        raise InvalidArgument(f"{field_name} is required")
    if not _EFFECT_ID.fullmatch(value):
        raise InvalidArgument(
            f"{field_name} must be 'eff-' followed by 64 lowercase hex digits, got {value[:80]!r}"
        )
    return value


def check_name(field_name: str, value: str) -> str:
    """A node id or effect slot: 1-128 characters of [A-Za-z0-9._:@/-], no ``.`` or ``..``
    part."""
    if not value:
        raise InvalidArgument(f"{field_name} is required")
    if not _NAME.fullmatch(value):
        raise InvalidArgument(
            f"{field_name} must be 1-128 characters of [A-Za-z0-9._:@/-], got {value[:140]!r}"
        )
    return no_dot_segments(field_name, value)


# --- helpers ---------------------------------------------------------------------------------


def _ok(message: str = "") -> Verdict:
    return Verdict(Outcome.OK, message=message)


def _why_reconcile(existing: EffectRecord, generation: int) -> str:
    who = (
        "this generation"
        if existing.prepared_generation == generation
        else f"generation {existing.prepared_generation}"
    )
    return f"{existing.state.name} by {who}: look it up downstream, do not send"


def _reconcile(
    existing: EffectRecord, req: PrepareRequest, now: float, verdict: Verdict
) -> PrepareDecision:
    """RECONCILE, letting this generation record the outcome (written unless it may already)."""
    if existing.may_record(req.generation):
        return PrepareDecision(verdict, EffectAction.RECONCILE, existing)
    marked = replace(existing, reconciler_generation=req.generation, updated_at=now)
    return PrepareDecision(verdict, EffectAction.RECONCILE, marked, marked)


def _conflict(existing: EffectRecord, req: PrepareRequest, now: float) -> PrepareDecision:
    """Another payload for a bound slot: the original stands; say what to do about it."""
    verdict = Verdict(
        Outcome.PAYLOAD_CONFLICT,
        message=f"slot {req.node_id}/{req.effect_slot} is bound to {existing.payload_digest} "
        f"({existing.state.name}), not {req.payload_digest}",
    )
    if existing.state is EffectState.COMMITTED:
        return PrepareDecision(verdict, EffectAction.SKIP, existing)
    if existing.state is EffectState.ABSENT:
        return PrepareDecision(verdict, EffectAction.NONE, existing)
    return _reconcile(existing, req, now, verdict)


__all__ = [
    "RECORDABLE",
    "RESOLUTIONS",
    "UNCERTAIN",
    "EffectAction",
    "EffectRecord",
    "EffectState",
    "PrepareDecision",
    "PrepareRequest",
    "check_effect_id",
    "check_name",
    "decide_hold",
    "decide_prepare",
    "decide_record",
    "resolve",
]
