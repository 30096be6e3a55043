"""The effect protocol, as steps with no I/O, and what it speaks in: the downstream's answers
(``DownstreamResult`` and its three exceptions), the ``Downstream`` contract and the outcome.

One ``claim.effect`` call runs prepare -> execute / skip / reconcile -> record (sdk/effects.py
says why). ``EffectRun`` is that protocol written once: a generator that yields each step (a
call to the coordinator behind the fence, a send or a lookup downstream) and is sent the step's
answer, or thrown the downstream's exception. The sync ``run_effect`` (sdk/effects.py) and the
asyncio one (sdk/aio/effects.py) only perform the steps.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Any, Protocol

from coordinator.domain.digests import digest_of
from coordinator.domain.effects import EffectAction, EffectState
from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import CoordinatorError
from coordinator.sdk._core.attempt import FencedAttempt
from coordinator.sdk.types import LossSource, fence_to_proto, outcome_of
from coordinator.v1 import types_pb2, worker_pb2

# --- the downstream's answers and contract ----------------------------------------------------


@dataclass(frozen=True)
class DownstreamResult:
    """What the downstream produced: a reference to it (message id, URL) and its ETag."""

    external_ref: str
    etag: str = ""


class DownstreamUncertain(CoordinatorError):
    """The call may or may not have been performed (timeout, lost response, 5xx)."""


class DownstreamRefused(CoordinatorError):
    """The downstream answered that it did not perform the call (a definite 4xx)."""


class LookupUnsupported(CoordinatorError):
    """The downstream cannot tell whether a key was performed (no idempotent results)."""


class Downstream(Protocol):
    """A side-effect target. Implementations send exactly the key they are given."""

    def execute(self, idempotency_key: str, generation: int, payload: bytes) -> DownstreamResult:
        """Perform the call once for ``idempotency_key``; ``generation`` is the fencing token.

        Raises DownstreamUncertain if the outcome is unknown, DownstreamRefused if the
        downstream definitely did not perform it.
        """
        ...

    def lookup(self, idempotency_key: str, generation: int) -> DownstreamResult | None:
        """The result of the call of ``idempotency_key`` if performed, None if not.

        ``generation`` lets a fencing downstream refuse later sends of older generations.
        Raises LookupUnsupported if it cannot tell, DownstreamUncertain if it did not answer.
        """
        ...


# --- the outcome ------------------------------------------------------------------------------


class EffectStatus(StrEnum):
    """How one ``claim.effect`` call ended."""

    # Sent now and confirmed; recorded COMMITTED.
    EXECUTED = "executed"
    # Already COMMITTED (by this or an earlier attempt): not sent.
    SKIPPED = "skipped"
    # An earlier attempt's call was found performed downstream: recorded COMMITTED, not sent.
    RECONCILED = "reconciled"
    # Nobody knows whether the call happened: recorded UNKNOWN. Never retry blindly.
    UNCERTAIN = "uncertain"
    # The downstream definitely did not perform it (refused): recorded ABSENT.
    NOT_PERFORMED = "not_performed"
    # The slot is bound to another payload whose call did not happen: nothing sent. Send the
    # original payload, or use a new slot.
    CONFLICT = "conflict"
    # The claim lost its fence (FENCED, CANCELLED, STALE_INPUT): nothing sent by this call.
    FENCED = "fenced"


@dataclass(frozen=True)
class EffectOutcome:
    """The result of ``claim.effect``: what happened, under which key, and what it produced."""

    status: EffectStatus
    effect_id: str = ""
    external_ref: str = ""
    etag: str = ""
    # The digest the slot is bound to (on a conflict: the original payload's, not ours).
    payload_digest: str = ""
    # The slot held another payload (PAYLOAD_CONFLICT); the original effect stands.
    conflict: bool = False
    # Whether this call sent anything downstream.
    sent: bool = False
    # Whether the coordinator accepted the record of what happened (False after losing the fence
    # mid-way: the effect stays uncertain and the next attempt reconciles it).
    recorded: bool = True
    outcome: Outcome = Outcome.OK
    reason: FenceReason = FenceReason.NONE
    message: str = ""

    @property
    def done(self) -> bool:
        """Whether the effect is known to have happened exactly once."""
        return self.status in (EffectStatus.EXECUTED, EffectStatus.SKIPPED, EffectStatus.RECONCILED)


# --- the protocol, as steps ------------------------------------------------------------------
#
# Written once, free of I/O (see the module doc).

# A prepare after ABSENT says EXECUTE; more rounds than this mean something is wrong.
_ROUNDS = 3

DOWNSTREAM_ERRORS = (DownstreamUncertain, DownstreamRefused, LookupUnsupported)
"""What a downstream raises to say how a step went; the protocol is told, not the caller."""


@dataclass(frozen=True)
class Call:
    """Call the coordinator: a WorkerService method behind the attempt's fence."""

    # Picks the method off a WorkerService stub, sync or asyncio (the lambda works on both).
    method: Callable[[Any], Any]
    request: Any


@dataclass(frozen=True)
class Send:
    """Perform the call downstream (``Downstream.execute``), once, with this key."""

    key: str
    generation: int
    payload: bytes


@dataclass(frozen=True)
class Lookup:
    """Ask the downstream whether the key was performed (``Downstream.lookup``)."""

    key: str
    generation: int


Step = Call | Send | Lookup
"""One thing the protocol needs done, and whose answer it is sent."""

_Steps = Generator[Step, Any, EffectOutcome]


class EffectRun:
    """One ``claim.effect`` call's protocol, advanced by a driver: ``step`` is what to do next
    (None once ``outcome`` is known); ``answer`` it, or let ``catching`` tell it what the
    downstream raised."""

    def __init__(
        self,
        attempt: FencedAttempt,
        node_id: str,
        effect_slot: str,
        payload: bytes,
        *,
        reconcile_principal: str = "",
    ) -> None:
        slot = _Slot(attempt, node_id, effect_slot, reconcile_principal)
        self._steps = _protocol(slot, payload)
        self._outcome: EffectOutcome | None = None
        self.step: Step | None = self._advance(lambda: next(self._steps))

    @property
    def outcome(self) -> EffectOutcome:
        """How the call ended (once ``step`` is None)."""
        assert self._outcome is not None, "the protocol has not ended"
        return self._outcome

    def answer(self, reply: Any) -> None:
        """The answer to ``step``."""
        self.step = self._advance(lambda: self._steps.send(reply))

    @contextmanager
    def catching(self) -> Iterator[None]:
        """Performing ``step``: what the downstream raises goes to the protocol."""
        try:
            yield
        except DOWNSTREAM_ERRORS as exc:
            self.step = self._advance(partial(self._steps.throw, exc))

    def _advance(self, resume: Callable[[], Step]) -> Step | None:
        try:
            return resume()
        except StopIteration as done:
            self._outcome = done.value
            return None


@dataclass
class _Slot:
    """One ``claim.effect`` call in progress."""

    attempt: FencedAttempt
    node_id: str
    effect_slot: str
    reconcile_principal: str = ""  # who owns the reconciliation if the send ends UNKNOWN
    effect_id: str = ""
    bound_digest: str = ""
    conflict: bool = False
    sent: bool = False

    @property
    def generation(self) -> int:
        """The fencing token the downstream is given with the key."""
        return self.attempt.fence.claim_generation

    def outcome(self, status: EffectStatus, **fields: Any) -> EffectOutcome:
        return EffectOutcome(
            status,
            effect_id=self.effect_id,
            payload_digest=self.bound_digest,
            conflict=self.conflict,
            sent=self.sent,
            **fields,
        )


def _protocol(slot: _Slot, payload: bytes) -> _Steps:
    """prepare -> execute / skip / reconcile -> record, for one slot; at most one send."""
    digest = digest_of(payload)
    for _ in range(_ROUNDS):
        prepared: worker_pb2.PrepareEffectResponse = yield _prepare(slot, digest)
        outcome = outcome_of(prepared.outcome)
        if outcome not in (Outcome.OK, Outcome.PAYLOAD_CONFLICT):
            return _fenced(slot, outcome, FenceReason(prepared.reason), prepared.message)
        slot.effect_id = prepared.effect_id
        slot.bound_digest = prepared.effect.payload_digest
        slot.conflict = outcome is Outcome.PAYLOAD_CONFLICT
        action = EffectAction(prepared.action)
        if action is EffectAction.SKIP:
            effect = prepared.effect
            return slot.outcome(
                EffectStatus.SKIPPED,
                external_ref=effect.external_ref,
                etag=effect.etag,
                message=prepared.message,
            )
        if action is EffectAction.NONE:  # conflict with an original confirmed ABSENT
            return slot.outcome(EffectStatus.CONFLICT, message=prepared.message)
        # A key this attempt sent before is looked up, never sent again (SentKeys).
        first = action is not EffectAction.RECONCILE
        if not (first and slot.attempt.sent_keys.first_send(slot.effect_id)):
            found = yield from _reconcile(slot)
            if found is not None:
                return found
            if slot.conflict:  # the original never happened, and ours is not the slot's payload
                return slot.outcome(EffectStatus.CONFLICT, message=prepared.message)
            continue  # ABSENT: prepare again, which says EXECUTE with the same key
        return (yield from _execute(slot, payload))
    raise CoordinatorError(
        f"effect {slot.node_id}/{slot.effect_slot}: still not executable after {_ROUNDS} prepares"
    )


def _execute(slot: _Slot, payload: bytes) -> _Steps:
    """Send once with the effect id as the key, then record what came of it."""
    slot.sent = True
    try:
        result: DownstreamResult = yield Send(slot.effect_id, slot.generation, payload)
    except DownstreamUncertain as exc:
        uncertain = _recorded(slot, EffectState.UNKNOWN, EffectStatus.UNCERTAIN, message=str(exc))
        return (yield from uncertain)
    except DownstreamRefused as exc:
        absent = _recorded(slot, EffectState.ABSENT, EffectStatus.NOT_PERFORMED, message=str(exc))
        return (yield from absent)
    return (yield from _recorded(slot, EffectState.COMMITTED, EffectStatus.EXECUTED, result=result))


def _reconcile(slot: _Slot) -> Generator[Step, Any, EffectOutcome | None]:
    """Ask the downstream about the key instead of sending; None when it was ABSENT."""
    try:
        found: DownstreamResult | None = yield Lookup(slot.effect_id, slot.generation)
    except (LookupUnsupported, DownstreamUncertain) as exc:
        uncertain = _recorded(slot, EffectState.UNKNOWN, EffectStatus.UNCERTAIN, message=str(exc))
        return (yield from uncertain)
    if found is not None:
        reconciled = _recorded(slot, EffectState.COMMITTED, EffectStatus.RECONCILED, result=found)
        return (yield from reconciled)
    response: worker_pb2.RecordEffectResponse = yield _record(slot, EffectState.ABSENT)
    if outcome_of(response.outcome) is not Outcome.OK:
        return _fenced(
            slot, outcome_of(response.outcome), FenceReason(response.reason), response.message
        )
    return None


def _recorded(
    slot: _Slot,
    state: EffectState,
    status: EffectStatus,
    *,
    result: DownstreamResult | None = None,
    message: str = "",
) -> _Steps:
    """Record ``state`` and describe the call as ``status`` (``recorded`` False if fenced)."""
    response: worker_pb2.RecordEffectResponse = yield _record(slot, state, result)
    outcome = outcome_of(response.outcome)
    if outcome is not Outcome.OK:
        slot.attempt.mark_lost(
            outcome, FenceReason(response.reason), response.message, LossSource.EFFECT
        )
    return slot.outcome(
        status,
        external_ref=result.external_ref if result else "",
        etag=result.etag if result else "",
        recorded=outcome is Outcome.OK,
        outcome=outcome,
        reason=FenceReason(response.reason),
        message=message or response.message,
    )


def _fenced(slot: _Slot, outcome: Outcome, reason: FenceReason, message: str) -> EffectOutcome:
    slot.attempt.mark_lost(outcome, reason, message, LossSource.EFFECT)
    return slot.outcome(
        EffectStatus.FENCED, recorded=False, outcome=outcome, reason=reason, message=message
    )


def _prepare(slot: _Slot, digest: str) -> Call:
    request = worker_pb2.PrepareEffectRequest(
        fence=fence_to_proto(slot.attempt.fence),
        node_id=slot.node_id,
        effect_slot=slot.effect_slot,
        payload_digest=digest,
    )
    return Call(lambda worker: worker.PrepareEffect, request)


def _record(slot: _Slot, state: EffectState, result: DownstreamResult | None = None) -> Call:
    request = worker_pb2.RecordEffectRequest(
        fence=fence_to_proto(slot.attempt.fence),
        effect_id=slot.effect_id,
        state=types_pb2.EffectState.ValueType(int(state)),
        external_ref=result.external_ref if result else "",
        etag=result.etag if result else "",
        reconcile_principal=slot.reconcile_principal if state is EffectState.UNKNOWN else "",
    )
    return Call(lambda worker: worker.RecordEffect, request)
