"""The asyncio client's keepalive loop: one task on the event loop renews every claim of the
client, those due together in one RenewMany (the schedule and what each answer does are shared
with the sync loop: sdk/_core/schedule.py, and the RenewMany -> Renew fallback:
sdk/_core/flows.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from coordinator.errors import CoordinatorError
from coordinator.sdk._core.flows import Flow, RenewCall, renew_batch
from coordinator.sdk._core.schedule import Answer, Due, Renewable, Schedule, apply, crashed
from coordinator.sdk.aio._events import wait_for
from coordinator.sdk.aio._rpc import AsyncRpc


class AsyncRenewer:
    """The keepalive loop of one asyncio client; its task starts with the first claim and
    stops with ``close``. Use it from the client's event loop only."""

    def __init__(self, rpc: AsyncRpc, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._rpc = rpc
        self._clock = clock
        self._schedule = Schedule()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def add(self, claim: Renewable) -> None:
        """Keep ``claim`` alive from now on (its first renewal at TTL/3 from now)."""
        if self._closed:
            raise CoordinatorError("the client is closed: its claims are not renewed")
        self._schedule.add(claim, claim.next_renewal(self._clock(), True))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="keepalive")
        self._wake.set()

    async def close(self) -> None:
        """Stop the loop; a renewal in flight is cancelled (renewing is idempotent)."""
        self._closed = True
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task])

    def __len__(self) -> int:
        return self._schedule.wanted()

    async def _loop(self) -> None:
        while not self._closed:
            when = self._schedule.next_due()
            now = self._clock()
            if when is None or when > now:
                self._wake.clear()
                await wait_for(self._wake, when - now if when is not None else None)
                continue
            for batch in self._schedule.take(now, self._rpc.policy):
                sent = self._clock()
                try:
                    renewed = apply(batch, await self._send(batch), sent)
                except Exception as exc:
                    crashed(batch, exc)
                    continue
                self._schedule.again(renewed)

    async def _send(self, batch: list[Due]) -> Sequence[Answer]:
        """One answer per claim of ``batch`` (RenewMany, or one Renew per claim: _core/flows.py)."""
        flow = Flow(renew_batch(self._schedule, batch))
        while (step := flow.step) is not None:
            flow.answer(await self._renew(step))
        return flow.result

    async def _renew(self, step: RenewCall) -> Any:
        method = step.method(self._rpc.worker)
        try:
            return await self._rpc.call(method, step.request, retry=False, timeout=step.timeout)
        except CoordinatorError as exc:
            return exc
