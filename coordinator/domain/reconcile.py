"""Owned reconciliation of UNKNOWN effects, as pure rules (seed 004: the unknown_reconcile
disposition needs a named owner, an opened-at time, a deadline and an escalation, and while it
waits the runtime must not wake an agent again and again).

When RecordEffect moves an effect from PREPARED to UNKNOWN, a reconciliation opens in the same
txn. Its **owner** is the recording holder (principal and attempt) or the principal the request
named. While the owner's claim is alive, the owner reconciles with RecordEffect (behind the
fence). Once that claim ends with the reconciliation still open:

- an owner that was *named* keeps it: no claim is handed out (Claim answers RECONCILING,
  ClaimNext skips the task) until the owner or an admin resolves it (ResolveEffect);
- a default owner (the holder) lets at most ``handoffs`` later claims take the task over
  (default 1: a takeover reconciles by looking the key up downstream, never by sending, which
  is issue 3's RECONCILE path); after those, the task is not handed out either.

At the deadline, still open, the reconciliation escalates: the task moves to NEEDS_APPROVAL (a
human decides with ApproveRetry), with an event naming the effect and the reason. The deadline
does not take a live claim away (only cancel and an input change end a live claim): a holder past
it keeps the task until its claim ends, and the escalation happens then. The deadline is never
extended, so the number of hand-outs between UNKNOWN and escalation is bounded by ``handoffs``.

Nothing here does I/O; ``coordinator.store.reconcile`` applies these rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import IntEnum

from coordinator.domain.decisions import Verdict
from coordinator.domain.effects import EffectRecord, EffectState, resolve
from coordinator.domain.roles import check_principal
from coordinator.domain.states import Outcome
from coordinator.errors import FailedPrecondition, InvalidArgument, PermissionDenied

ESCALATION = "NEEDS_APPROVAL"
"""What happens at the deadline: the task moves to NEEDS_APPROVAL (the only escalation)."""


@dataclass(frozen=True)
class Reconciliation:
    """The value of ``{p}/reconcile/{task}/{effect}``: one open reconciliation (a copy of the
    effect record's ``reconcile_*`` fields, written in the same txn and never changed while
    open, so the claim path and the sweeper read a task's reconciliations in one short range)."""

    effect_id: str
    task_id: str
    task_revision: int
    owner: str
    owner_attempt_id: str
    named: bool
    opened_attempt: int
    opened_at: float
    deadline: float
    escalation: str = ESCALATION

    def due(self, now: float) -> bool:
        """Whether the deadline has passed."""
        return now >= self.deadline

    def takeovers(self, task_attempt: int) -> int:
        """Claims granted after the attempt that opened it (the task's attempt numbers count)."""
        return max(0, task_attempt - self.opened_attempt)

    @classmethod
    def of(cls, effect: EffectRecord) -> Reconciliation:
        """The index value for an effect whose reconciliation is open."""
        return cls(
            effect_id=effect.effect_id,
            task_id=effect.task_id,
            task_revision=effect.task_revision,
            owner=effect.reconcile_owner,
            owner_attempt_id=effect.reconcile_owner_attempt_id,
            named=effect.reconcile_named,
            opened_attempt=effect.reconcile_opened_attempt,
            opened_at=effect.reconcile_opened_at,
            deadline=effect.reconcile_deadline,
            escalation=effect.reconcile_escalation or ESCALATION,
        )


class Gate(IntEnum):
    """What a claim does about the task's open reconciliations."""

    PROCEED = 0
    WAIT = 1
    ESCALATE = 2


@dataclass(frozen=True)
class GateDecision:
    """The gate, the answer to give when it is WAIT, and the reconciliations that are due."""

    gate: Gate
    verdict: Verdict | None = None
    due: tuple[Reconciliation, ...] = ()


def open_on_unknown(
    before: EffectRecord,
    after: EffectRecord,
    *,
    holder: str,
    attempt_id: str,
    attempt: int,
    named_owner: str,
    now: float,
    timeout: float,
) -> EffectRecord:
    """``after`` with a reconciliation opened, if this record moves the effect to UNKNOWN.

    Opens only on the move PREPARED -> UNKNOWN (a repeat of UNKNOWN writes nothing and never
    extends the deadline). ``named_owner`` empty: the holder owns it.
    """
    if after.state is not EffectState.UNKNOWN or before.state is not EffectState.PREPARED:
        return after
    if after.reconcile_open:
        return after
    return replace(
        after,
        reconcile_owner=named_owner or holder,
        reconcile_owner_attempt_id=attempt_id,
        reconcile_named=bool(named_owner),
        reconcile_opened_attempt=attempt,
        reconcile_opened_at=now,
        reconcile_deadline=now + timeout,
        reconcile_escalation=ESCALATION,
        reconcile_open=True,
        reconcile_escalated_at=0.0,
    )


def check_named_owner(existing: EffectRecord, named_owner: str) -> None:
    """A named owner applies only to the UNKNOWN record that opens the reconciliation: naming
    another owner for one already open is FailedPrecondition (the owner never changes)."""
    if named_owner and existing.reconcile_open and existing.reconcile_owner != named_owner:
        raise FailedPrecondition(
            f"effect {existing.effect_id} already has an open reconciliation owned by "
            f"{existing.reconcile_owner!r}; its owner cannot become {named_owner!r}"
        )


def decide_claim_gate(
    task_attempt: int,
    reconciliations: Iterable[Reconciliation],
    *,
    now: float,
    handoffs: int,
    task_revision: int,
) -> GateDecision:
    """What a claim of a task (whose previous claim has ended) does about its open
    reconciliations: escalate the due ones, wait for an owner, or go on.

    Only reconciliations of the task's current revision count: a new revision (input change,
    review rejection) is new business input whose effects are new effects; an older revision's
    UNKNOWN effect is still reconciled and escalated, but never holds up the new round.
    """
    entries = sorted(
        (r for r in reconciliations if r.task_revision == task_revision),
        key=lambda r: r.effect_id,
    )
    due = tuple(r for r in entries if r.due(now))
    if due:
        return GateDecision(Gate.ESCALATE, due=due)
    for r in entries:
        allowed = 0 if r.named else handoffs
        if r.takeovers(task_attempt) >= allowed:
            return GateDecision(Gate.WAIT, verdict=waiting(r, now))
    return GateDecision(Gate.PROCEED)


def waiting(r: Reconciliation, now: float) -> Verdict:
    """RECONCILING: who the task waits for, and until when."""
    why = "named as its owner" if r.named else "its owner; the takeovers it allows are used"
    return Verdict(
        Outcome.RECONCILING,
        message=f"effect {r.effect_id} is UNKNOWN and waits for reconciliation by {r.owner!r} "
        f"({why}) for {max(0.0, r.deadline - now):.0f}s more; then the task escalates to "
        f"{r.escalation}. An admin or the owner may ResolveEffect it sooner",
    )


def escalate(effect: EffectRecord, now: float) -> EffectRecord:
    """The effect after its reconciliation escalated (it stays UNKNOWN: a human decides)."""
    return replace(
        effect,
        reconcile_open=False,
        reconcile_escalated_at=now,
        detail=f"reconciliation by {effect.reconcile_owner!r} escalated to "
        f"{effect.reconcile_escalation or ESCALATION} at its deadline",
        updated_at=now,
    )


def escalation_detail(effects: Iterable[EffectRecord]) -> str:
    """The event detail of an escalation: which effects, whose, and why."""
    parts = [
        f"{e.effect_id} (owner {e.reconcile_owner!r}, opened {e.reconcile_opened_at:.3f}, "
        f"deadline {e.reconcile_deadline:.3f})"
        for e in effects
    ]
    return "UNKNOWN effect still unreconciled at its deadline: " + ", ".join(parts)


def check_resolver(effect: EffectRecord, *, caller: str, is_admin: bool) -> None:
    """Who may resolve ``effect`` without a claim: an admin (any uncertain effect) or the owner
    of its open reconciliation. Raises FailedPrecondition / PermissionDenied."""
    if not effect.uncertain:
        raise FailedPrecondition(
            f"effect {effect.effect_id} is {effect.state.name}, not PREPARED or UNKNOWN: "
            "there is nothing to resolve"
        )
    if is_admin:
        return
    if effect.reconcile_open and effect.reconcile_owner == caller:
        return
    owner = repr(effect.reconcile_owner) if effect.reconcile_open else "nobody (none is open)"
    raise PermissionDenied(
        f"only an admin or the owner of the effect's open reconciliation ({owner}) may resolve "
        f"effect {effect.effect_id}; {caller!r} is neither"
    )


def resolve_owned(
    effect: EffectRecord,
    resolution: EffectState,
    *,
    by: str,
    reason: str,
    external_ref: str,
    etag: str,
    now: float,
) -> EffectRecord:
    """The effect as its owner or an admin resolved it (closes the reconciliation)."""
    resolved = resolve(effect, resolution, by=by, reason=reason, now=now)
    if resolution is EffectState.COMMITTED and external_ref:
        resolved = replace(resolved, external_ref=external_ref, etag=etag)
    return resolved


def check_reconcile_principal(field_name: str, value: str, state: EffectState) -> str:
    """RecordEffect's optional reconcile owner: only with UNKNOWN, and a principal by the one
    rule every caller's principal keeps (domain/roles.py), since only a caller of that
    principal can ever resolve it; a name no caller can have would hold the task until the
    reconcile deadline escalates it."""
    if not value:
        return value
    if state is not EffectState.UNKNOWN:
        raise InvalidArgument(f"{field_name} applies only with state UNKNOWN, got {state.name}")
    return check_principal(field_name, value)


__all__ = [
    "ESCALATION",
    "Gate",
    "GateDecision",
    "Reconciliation",
    "check_named_owner",
    "check_reconcile_principal",
    "check_resolver",
    "decide_claim_gate",
    "escalate",
    "escalation_detail",
    "open_on_unknown",
    "resolve_owned",
    "waiting",
]
