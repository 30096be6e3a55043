"""Long-poll ClaimNext: wait up to ``wait_seconds`` for a task instead of answering
NO_READY_TASK at once.

A waiter takes a place in its queue's line (``ReadyWaiters``), in arrival order. Each ready key
the replica's ready index learns of (from its watch, or from this replica's own writes) signals
the first waiter of that queue not yet signalled, which then tries ClaimNext; so a new task
wakes one waiter, not all of them, and waiters are served in the order they came; a waiter that
wins hands the turn on to the next (ready keys that came before their waiters signalled nobody).
A waiter that loses the task (to a claim through another replica) takes its place in line
again. The line's head also tries every ``_SLICE`` seconds on its own, so a signal lost to a
race never leaves a ready task waiting for the deadline. Past ``max_waiters`` waiting on the
replica a new one is refused RESOURCE_EXHAUSTED: each waiter holds a server thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from coordinator.domain.decisions import Verdict
from coordinator.domain.states import Outcome
from coordinator.errors import ResourceExhausted
from coordinator.metrics import Metrics
from coordinator.store.acceptance import AcceptancePoints
from coordinator.store.claims import ClaimStore
from coordinator.store.types import ClaimResult

# A waiter checks whether its caller is still there (and the head of a line tries) this often:
# a safety net for a signal lost to a race, not the way waiters learn of tasks (the signal is).
_SLICE = 2.0


class _Waiter:
    """One waiting ClaimNext: signalled when a ready key arrived for it."""

    def __init__(self) -> None:
        self.signalled = False
        self.event = threading.Event()


class ReadyWaiters:
    """The replica's waiting ClaimNext calls, one line per queue, at most ``max_waiters``."""

    def __init__(self, max_waiters: int, metrics: Metrics) -> None:
        self.max_waiters = max_waiters
        self._metrics = metrics
        self._lock = threading.Lock()
        self._lines: dict[str, deque[_Waiter]] = {}
        self._count = 0

    @contextmanager
    def enter(self, queue: str) -> Iterator[_Waiter]:
        """Take a place at the end of ``queue``'s line for the duration."""
        waiter = _Waiter()
        with self._lock:
            if self._count >= self.max_waiters:
                self._metrics.count_stream_refused("claim_waiters_full")
                raise ResourceExhausted(
                    f"this replica already has {self.max_waiters} ClaimNext calls waiting, its "
                    "limit (max_claim_waiters); retry later or on another replica, or raise "
                    "max_claim_waiters"
                )
            self._lines.setdefault(queue, deque()).append(waiter)
            self._count += 1
            self._metrics.claim_waiters.inc()
        try:
            yield waiter
        finally:
            with self._lock:
                line = self._lines[queue]
                line.remove(waiter)
                if not line:
                    del self._lines[queue]  # no entry kept per past queue
                self._count -= 1
                self._metrics.claim_waiters.dec()

    def notify(self, queue: str) -> None:
        """A ready key arrived in ``queue``: signal its first waiter not yet signalled."""
        with self._lock:
            for waiter in self._lines.get(queue, ()):
                if not waiter.signalled:
                    waiter.signalled = True
                    waiter.event.set()
                    return

    def notify_all(self) -> None:
        """The ready index was reloaded: every waiter looks again."""
        with self._lock:
            for line in self._lines.values():
                for waiter in line:
                    waiter.signalled = True
                    waiter.event.set()

    def first_in_line(self, queue: str, waiter: _Waiter) -> bool:
        """Whether ``waiter`` is the head of ``queue``'s line."""
        with self._lock:
            line = self._lines.get(queue)
            return line is not None and len(line) > 0 and line[0] is waiter

    def wait(self, waiter: _Waiter, timeout: float) -> bool:
        """Wait up to ``timeout`` for a signal; True if one came (it is used up)."""
        signalled = waiter.event.wait(timeout)
        with self._lock:
            waiter.event.clear()
            waiter.signalled = False
        return signalled

    def count(self) -> int:
        """Waiters on this replica now."""
        with self._lock:
            return self._count


CALLER_LEFT = "the caller left before its claim was answered"
"""The release reason of a claim won for a caller that was gone by then."""


class LongPoll:
    """ClaimNext that may wait for a task (``wait`` seconds, bounded by the servicer)."""

    def __init__(
        self,
        claims: ClaimStore,
        waiters: ReadyWaiters,
        acceptance: AcceptancePoints,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._claims = claims
        self._waiters = waiters
        self._acceptance = acceptance
        self._monotonic = monotonic

    def waiting(self) -> int:
        """Long polls waiting on this replica now."""
        return self._waiters.count()

    def claim_next(
        self,
        queue: str,
        *,
        principal: str,
        epoch: int,
        ttl: int,
        wait: float,
        alive: Callable[[], bool],
    ) -> ClaimResult:
        """The first task of ``queue`` this call wins within ``wait`` seconds, else
        NO_READY_TASK; ``alive`` false (the caller left, the server ends the call) ends it."""

        def attempt() -> ClaimResult:
            return self._claims.claim_next(queue, principal=principal, epoch=epoch, ttl=ttl)

        if wait <= 0:
            return attempt()
        deadline = self._monotonic() + wait
        with self._waiters.enter(queue) as waiter:
            result = self._wait_for_turns(queue, waiter, attempt, wait, deadline, alive)
        if result.verdict.outcome is not Outcome.NO_READY_TASK:
            # Ready keys that arrived before their waiters (a backlog, a batch promoted at once)
            # signalled nobody, so the index may hold more: a winner hands the turn on to the
            # next in line. Without it a backlog was served one waiter per _SLICE (measured by
            # the bench's promote phase: 45 of 200 ready tasks claimed in 30 s by 8 waiters).
            self._waiters.notify(queue)
        return result

    def claim_batch(
        self,
        queue: str,
        *,
        principal: str,
        epoch: int,
        ttl: int,
        wait: float,
        alive: Callable[[], bool],
        max_tasks: int,
    ) -> list[ClaimResult]:
        """Up to ``max_tasks`` tasks of ``queue``: the first as ``claim_next`` wins it (waiting
        up to ``wait``), then, once it is CLAIMED, whatever else is ready at once; each its own
        claim txn. The first result is always there (a refusal, NO_READY_TASK)."""
        first = self.claim_next(
            queue, principal=principal, epoch=epoch, ttl=ttl, wait=wait, alive=alive
        )
        results = [first]
        while len(results) < max_tasks and results[-1].verdict.outcome is Outcome.CLAIMED:
            more = self._claims.claim_next(queue, principal=principal, epoch=epoch, ttl=ttl)
            if more.verdict.outcome is not Outcome.CLAIMED:
                break
            results.append(more)
        if not alive():
            self._give_back(results, principal)
        return results

    def _give_back(self, results: list[ClaimResult], principal: str) -> None:
        # The caller left (a stopping worker cancelled its poll) while the claims were made: no
        # answer reaches it, so nobody would hold them until their leases ran out. Released now,
        # the tasks are READY again at once (each release counts as an attempt, as an expiry
        # would). A caller that leaves after this check still misses its answer: a window of
        # one response write, not of a whole claim.
        for result in results:
            if result.fence is not None:
                self._acceptance.release(result.fence, principal=principal, reason=CALLER_LEFT)

    def _wait_for_turns(
        self,
        queue: str,
        waiter: _Waiter,
        attempt: Callable[[], ClaimResult],
        wait: float,
        deadline: float,
        alive: Callable[[], bool],
    ) -> ClaimResult:
        # Nobody ahead: try at once; else wait for a turn, in arrival order.
        turn = self._waiters.first_in_line(queue, waiter)
        while True:
            # Never claim for a caller that left (a stopping pool cancels its polls): the task
            # would be CLAIMED by nobody until its lease ran out.
            if turn and alive():
                result = attempt()
                if result.verdict.outcome is not Outcome.NO_READY_TASK:
                    return result
            left = deadline - self._monotonic()
            if left <= 0 or not alive():
                return ClaimResult(
                    Verdict(
                        Outcome.NO_READY_TASK,
                        message=f"queue {queue!r} had no ready task for {wait:g} s",
                    )
                )
            signalled = self._waiters.wait(waiter, min(left, _SLICE))
            turn = signalled or self._waiters.first_in_line(queue, waiter)
