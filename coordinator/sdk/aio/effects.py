"""Side effects from an AsyncClaim: the effect protocol, awaited.

The protocol itself (prepare -> execute / skip / reconcile -> record, at most one send, the
effect id as the idempotency key) is ``EffectRun`` (sdk/_core/effects.py), shared with the sync
SDK; this module only performs its steps with awaits, against an ``AsyncDownstream``. A sync
``Downstream`` such as ``HttpDownstream`` is used through ``ThreadedDownstream``, which runs
each call in a thread.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from coordinator.sdk._core.attempt import FencedAttempt
from coordinator.sdk._core.calls import Req, Resp
from coordinator.sdk._core.effects import (
    Call,
    Downstream,
    DownstreamResult,
    EffectOutcome,
    EffectRun,
    Send,
    Step,
)
from coordinator.sdk._duration import Duration
from coordinator.sdk.aio._rpc import AsyncWorkerMethod


class AsyncDownstream(Protocol):
    """A side-effect target for asyncio; the contract of ``Downstream``, awaited."""

    async def execute(
        self, idempotency_key: str, generation: int, payload: bytes
    ) -> DownstreamResult:
        """Perform the call once for ``idempotency_key``; ``generation`` is the fencing token.

        Raises DownstreamUncertain if the outcome is unknown, DownstreamRefused if the
        downstream definitely did not perform it.
        """
        ...

    async def lookup(self, idempotency_key: str, generation: int) -> DownstreamResult | None:
        """The result of the call of ``idempotency_key`` if performed, None if not.

        Raises LookupUnsupported if it cannot tell, DownstreamUncertain if it did not answer.
        """
        ...


class ThreadedDownstream:
    """A sync ``Downstream`` (e.g. ``HttpDownstream``) as an ``AsyncDownstream``: each call
    runs in a worker thread, so the event loop (and every keepalive on it) keeps running."""

    def __init__(self, downstream: Downstream) -> None:
        self._downstream = downstream

    async def execute(
        self, idempotency_key: str, generation: int, payload: bytes
    ) -> DownstreamResult:
        """``Downstream.execute`` in a thread."""
        return await asyncio.to_thread(
            self._downstream.execute, idempotency_key, generation, payload
        )

    async def lookup(self, idempotency_key: str, generation: int) -> DownstreamResult | None:
        """``Downstream.lookup`` in a thread."""
        return await asyncio.to_thread(self._downstream.lookup, idempotency_key, generation)


class AsyncHeldAttempt(FencedAttempt, Protocol):
    """One attempt holding a claim, as the asyncio effect helper uses it (AsyncClaim is one)."""

    async def call(self, method: AsyncWorkerMethod[Req, Resp], request: Req) -> Resp:
        """Call a WorkerService method whose request carries ``fence``; its retries stop when
        the lease runs out."""
        ...

    def check(self, *, margin: Duration | None = None) -> None:
        """Raise ClaimLost unless the attempt is held with more than ``margin`` of lease left."""
        ...


async def run_effect(
    attempt: AsyncHeldAttempt,
    node_id: str,
    effect_slot: str,
    payload: bytes,
    downstream: AsyncDownstream,
    *,
    reconcile_principal: str = "",
) -> EffectOutcome:
    """Run the whole protocol for one slot (sdk/effects.py); at most one send."""
    run = EffectRun(attempt, node_id, effect_slot, payload, reconcile_principal=reconcile_principal)
    while (step := run.step) is not None:
        with run.catching():
            run.answer(await _perform(step, attempt, downstream))
    return run.outcome


async def _perform(step: Step, attempt: AsyncHeldAttempt, downstream: AsyncDownstream) -> Any:
    if isinstance(step, Call):
        return await attempt.call(step.method, step.request)
    if isinstance(step, Send):
        return await downstream.execute(step.key, step.generation, step.payload)
    return await downstream.lookup(step.key, step.generation)
