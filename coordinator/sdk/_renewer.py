"""One keepalive loop for every claim of a client: renewals that fall due together go to the
coordinator in one RenewMany call.

Each claim keeps its own schedule and gets its own answer, so loss detection stays per claim
(sdk/_core/schedule.py). The loop sleeps until the first renewal is due, then sends the calls
the schedule makes. A coordinator that cannot be reached loses a claim only once its own lease
ran out by the local clock, as before. A coordinator that has no RenewMany (UNIMPLEMENTED: an
older version) is renewed one Renew per claim, from the same loop.

``Schedule`` is the pure part (which claims are due, in which calls, what each answer is:
sdk/_core/schedule.py), with ``renew_batch`` (sdk/_core/flows.py: RenewMany or one Renew per
claim); the sync ``Renewer`` here runs them on a thread, sdk/aio/_renewer.py on the event loop.

Measured (``python -m bench``, phase ``held``): what 10,000 held claims cost the client, the
coordinator and etcd.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from coordinator.errors import CoordinatorError
from coordinator.sdk._core.flows import Flow, RenewCall, renew_batch
from coordinator.sdk._core.schedule import Answer, Due, Renewable, Schedule, apply, crashed
from coordinator.sdk._rpc import Rpc


class Renewer:
    """The keepalive loop of one sync client, on its own thread (see the module docstring). The
    thread starts with the first claim and stops with ``close``."""

    def __init__(self, rpc: Rpc, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._rpc = rpc
        self._clock = clock
        self._cond = threading.Condition()
        self._schedule = Schedule()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, claim: Renewable) -> None:
        """Keep ``claim`` alive from now on (its first renewal at TTL/3 from now)."""
        with self._cond:
            if self._closed:
                raise CoordinatorError("the client is closed: its claims are not renewed")
            self._schedule.add(claim, claim.next_renewal(self._clock(), True))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="keepalive", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        """Stop the loop (claims still held are no longer renewed: their leases run out)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._rpc.policy.timeout.total_seconds())

    def __len__(self) -> int:
        with self._cond:
            return self._schedule.wanted()

    def _loop(self) -> None:
        while (due := self._wait_for_due()) is not None:
            for batch in due:
                sent = self._clock()
                try:
                    renewed = apply(batch, self._send(batch), sent)
                except Exception as exc:
                    crashed(batch, exc)
                    continue
                with self._cond:
                    if not self._closed:
                        self._schedule.again(renewed)

    def _wait_for_due(self) -> list[list[Due]] | None:
        """Sleep until a renewal is due; the calls to make, or None once closed."""
        with self._cond:
            while not self._closed:
                when, now = self._schedule.next_due(), self._clock()
                if when is not None and when <= now:
                    return self._schedule.take(now, self._rpc.policy)
                self._cond.wait(when - now if when is not None else None)
            return None

    def _send(self, batch: list[Due]) -> Sequence[Answer]:
        """One answer per claim of ``batch`` (RenewMany, or one Renew per claim: _core/flows.py)."""
        flow = Flow(renew_batch(self._schedule, batch))
        while (step := flow.step) is not None:
            flow.answer(self._renew(step))
        return flow.result

    def _renew(self, step: RenewCall) -> Any:
        method = step.method(self._rpc.worker)
        try:
            return self._rpc.call(method, step.request, retry=False, timeout=step.timeout)
        except CoordinatorError as exc:
            return exc
