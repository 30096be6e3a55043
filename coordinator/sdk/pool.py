"""WorkerPool: a handler run over one or more queues, up to ``max_concurrent`` claims at once.

    def handle(claim: Claim, cancel: Cancellation) -> bytes | None:
        ...                                    # check cancel.is_cancelled() between steps
        return result                          # the pool commits it behind the claim's fence

    with WorkerClient(target, principal="pool-1") as client:
        pool = WorkerPool(client, handle, queues=["emails"], max_concurrent=4)
        stop_on_signals(pool)                  # SIGTERM / SIGINT: pool.stop()
        report = pool.run()                    # returns once shut down

One WorkerClient (one connection) serves every claim. Each queue has its own claim loop; a
loop claims only when a slot is free, so no claimed task waits for a thread while its lease
runs. A claim loop that got nothing polls again after a backoff that doubles up to
``PollBackoff.maximum``; each ClaimNext is a long poll (``wait=long_poll``), and a poll that
already waited that long on the server is sent again at once. An older server ignores the wait
and answers at once: the backoff then applies as before.

With ``claim_batch=N`` a loop with several free slots claims up to N tasks in one call
(``claim_many``), and with ``commit_then_next`` each commit claims the next task of its queue in
the same call (``commit_and_next``), which then keeps the slot: a busy queue costs one call a
task instead of two. ``MultiSlot.of(n)`` gives both for a pool of n slots (``coordinator worker
--slots n``).

Each claim's handler runs on its own thread; the client's one keepalive loop renews every claim.
The handler gets the Claim and a
Cancellation (sdk/cancellation.py), set when the claim is lost (``on_lost``) or when the
shutdown grace runs out. What the handler returns is committed; an exception gives the task
back as a retryable failure, ``claim.fail(error, retryable=True)`` (the task's retry policy
decides what follows), as do a SystemExit, a return value that is not bytes, and a result the
commit refuses (sdk/_core/settling.py). A handler that returns None has ended the claim
itself, or the pool releases it.

``stop()`` (SIGTERM through ``stop_on_signals``) stops claiming at once (the long polls in
flight are aborted, so a shutdown never claims, sdk/abort.py) and marks the pool unready, lets
running handlers finish until ``grace`` has passed, then cancels the rest and gives their claims
back (a retryable failure, as for an error; their renewals stop first) within
``GIVE_BACK_TIMEOUT``; ``run()`` then returns. The signal path never depends on a log line
(sdk/_signals.py): a log write that fails (a dead pipe, a full disk) is counted, not raised
(coordinator/logging.py). A handler thread that ignores its cancellation cannot be stopped from
outside (Python has no thread kill): it is abandoned (a daemon thread, so the process still
exits) and whatever it commits later is refused, its claim being gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import structlog

from coordinator.errors import CoordinatorError
from coordinator.sdk._core.flows import Flow
from coordinator.sdk._core.pool import (
    CLAIMED_STOPPING,
    GIVE_BACK_TIMEOUT,
    MAX_CLAIM_BATCH,
    MAX_CONCURRENT,
    MAX_QUEUES,
    SHUTDOWN_ERROR,
    SLOT_FAULT,
    Ending,
    MultiSlot,
    PollBackoff,
    Polling,
    PoolReport,
    PoolSettings,
    check_claim_batch,
    cut_off_reason,
    poll_answer,
    poll_call,
)
from coordinator.sdk._core.settling import ClaimCall, NextTask, cut_off_claim, settle
from coordinator.sdk._core.slots import OUTLIVED_CHECK, HandOver, Routes, Slots
from coordinator.sdk._duration import Duration
from coordinator.sdk._flag import Flag
from coordinator.sdk._signals import stop_on_signals
from coordinator.sdk.abort import Abort, CallAborted
from coordinator.sdk.cancellation import Cancellation, CancelReason
from coordinator.sdk.claim import Claim
from coordinator.sdk.client import WorkerClient
from coordinator.sdk.readiness import Readiness, set_all
from coordinator.sdk.types import LostReason, TransportError

log = structlog.get_logger(__name__)

Handler = Callable[[Claim, Cancellation], bytes | None]
"""Does one claim's work; returns the result to commit, or None having ended the claim itself."""

__all__ = [
    "GIVE_BACK_TIMEOUT",
    "MAX_CLAIM_BATCH",
    "MAX_CONCURRENT",
    "MAX_QUEUES",
    "SHUTDOWN_ERROR",
    "Ending",
    "Handler",
    "MultiSlot",
    "PollBackoff",
    "PoolReport",
    "WorkerPool",
    "stop_on_signals",
]


@dataclass(eq=False)
class _Running:
    """One claim of the pool, from the claim to its ending."""

    queue: str
    cancel: Cancellation
    claim: Claim | None = None
    # Set (under the pool's lock) when the grace ran out: the pool settles this claim, and the
    # handler's late answer is dropped.
    abandoned: bool = field(default=False)

    def lost(self, reason: LostReason) -> None:
        """The claim's on_lost: cancel the handler."""
        self.cancel.cancel(CancelReason.LOST, str(reason))


class WorkerPool:
    """Runs ``handler`` over ``queues`` with at most ``max_concurrent`` claims at once."""

    def __init__(
        self,
        client: WorkerClient,
        handler: Handler,
        *,
        queues: Sequence[str],
        max_concurrent: int = 1,
        ttl: Duration = timedelta(seconds=30),
        grace: Duration = timedelta(seconds=30),
        readiness: Iterable[Readiness] = (),
        poll: PollBackoff | None = None,
        long_poll: Duration = timedelta(seconds=10),
        claim_batch: int = 1,
        commit_then_next: bool = False,
    ) -> None:
        self._settings = settings = PoolSettings.of(
            queues,
            max_concurrent=max_concurrent,
            ttl=ttl,
            grace=grace,
            poll=poll,
            long_poll=long_poll,
        )
        check_claim_batch(claim_batch)
        self._commit_then_next = commit_then_next
        self._client, self._handler = client, handler
        self._readiness = tuple(readiness)
        self._stopping = Flag()
        # A shutdown never claims: stop() aborts the long polls in flight, which would else win
        # the very tasks the cut-off gives back (issue 29), and the server claims nothing for a
        # caller that left (store/claims/long_poll.py).
        self._polls = Abort()
        # The slots' accounting is the core's (sdk/_core/slots.py), kept under this lock.
        self._cond = threading.Condition()
        self._slots: Slots[_Running] = Slots(
            settings.max_concurrent, claim_batch, self._cond.notify_all
        )
        # Claims a commit won as the pool stopped, being given back on their handler's thread:
        # run() waits for them too (it once returned first, and the process exited mid-way).
        self._giving_back = 0
        self._hurried = Flag()  # the grace cut short (a second signal)

    def held(self) -> int:
        """How many claims the pool is running now."""
        with self._cond:
            return self._slots.held()

    def stop(self) -> None:
        """Stop claiming now and shut down (``run`` returns once done). Idempotent; not from
        a signal handler (it takes a lock): use ``stop_on_signals``."""
        self._stopping.set()
        self._polls.abort()
        with self._cond:
            self._cond.notify_all()

    def hurry(self) -> None:
        """Stop, and cut the grace short: the handlers still running are cancelled and their
        claims given back now (``stop_on_signals`` on a second signal)."""
        self.stop()
        self._hurried.set()
        with self._cond:
            self._cond.notify_all()

    def run(self) -> PoolReport:
        """Claim and run claims until ``stop()``, then shut down as the module says. Raises the
        error that stopped a claim loop (bad credentials, an unknown queue name, ...) once
        shut down."""
        loops = [
            threading.Thread(target=self._claim_loop, args=(q,), name=f"claim-{q}", daemon=True)
            for q in self._settings.queues
        ]
        for loop in loops:
            loop.start()
        set_all(self._readiness, True)
        log.info("pool claiming", **self._settings.logged())
        while not self._stopping.wait(OUTLIVED_CHECK):
            with self._cond:
                held = self._slots.outlived(time.monotonic(), self._settings.grace.total_seconds())
            if held is not None:  # every slot held by a handler past its lost claim, or not
                set_all(self._readiness, not held)
        set_all(self._readiness, False)
        # (abandoned mid-way, a claim answered as the stop came would wait out its lease)
        deadline, end = self._settings.stop_deadlines(time.monotonic())
        log.info("pool stopping: no new claims", running=self.held())
        self._cut_off(self._wait_for_handlers(deadline))
        for loop in loops:
            loop.join(max(end - time.monotonic(), 0.0))
        with self._cond:
            return self._slots.tally.report()

    # --- claiming ---------------------------------------------------------------------------

    def _claim_loop(self, queue: str) -> None:
        polling = Polling(self._settings.poll)
        while slots := self._take_slots():
            routes: Routes[_Running, Claim] = Routes()
            sent = time.monotonic()
            got: list[Claim] | str = []
            try:
                got = self._claim(queue, slots, routes)
            except CallAborted:  # stop() ended the poll (and what it may have won: sdk/abort.py)
                pass
            except CoordinatorError as exc:
                self._fail(queue, exc)
            with self._cond:
                self._slots.polled(slots, got)
            if isinstance(got, str):
                self._stopping.wait(polling.nothing(queue, got, time.monotonic() - sent))
                continue
            polling.claimed()
            for running in routes.won(got, lambda c: _Running(queue, self._cancellation(), c)):
                self._start(running)

    def _claim(self, queue: str, slots: int, routes: Routes[_Running, Claim]) -> list[Claim] | str:
        """One ClaimNext for ``slots`` tasks (``poll_call``): the Claims, or why nothing was
        claimed. Raises the errors no retry cures (CoordinatorError other than
        TransportError)."""
        call = poll_call(queue, slots, self._settings, routes.lost, abort=self._polls)
        try:
            answer = call(self._client)
        except TransportError as exc:
            answer = exc
        return poll_answer(answer)

    def _take_slots(self) -> int:
        """Wait for a free slot and take it, with up to ``claim_batch`` - 1 more that are free
        now; 0 once stopping."""
        with self._cond:
            while self._slots.full(self._stopping.is_set()):
                self._cond.wait()
            return self._slots.take(self._stopping.is_set())

    def _fail(self, queue: str, exc: CoordinatorError) -> None:
        """A claim refused for a reason no retry cures: stop the whole pool, loudly."""
        log.error("claim loop failed; stopping the pool", queue=queue, error=str(exc))
        with self._cond:
            self._slots.tally.failed(exc)
        self.stop()

    def _cancellation(self) -> Cancellation:
        return Cancellation(self._stopping)

    # --- running ----------------------------------------------------------------------------

    def _start(self, running: _Running) -> None:
        """Run ``running``'s handler on a thread of its own; one claimed as the pool stopped
        is given back, never run."""
        with self._cond:
            started = self._slots.start(running, self._stopping.is_set())
        if not started:
            self._settle_cut_off(running, CLAIMED_STOPPING)
            with self._cond:
                self._slots.give()
            return
        name = f"claim-{running.claim.task_id}" if running.claim is not None else "claim"
        threading.Thread(target=self._work, args=(running,), name=name, daemon=True).start()

    def _work(self, running: _Running) -> None:
        current: _Running | None = running
        while current is not None:  # with commit_then_next, a commit hands the slot on
            this = current
            try:
                current = self._run_one(this)
            except Exception:  # a fault past the handler's must not hold the slot for good
                log.exception(SLOT_FAULT, task_id=this.claim and this.claim.task_id)
                if this.claim is not None:  # no more renewals: the lease ends it
                    this.claim.close()
                with self._cond:
                    self._slots.hand_over(this, Ending.UNSETTLED, None, False)
                return

    def _run_one(self, running: _Running) -> _Running | None:
        """Run the handler on ``running``'s claim and settle it; the claim its commit won
        (commit_then_next), which keeps the slot, or None."""
        claim = running.claim
        assert claim is not None
        claim.start()
        result, error = None, None
        try:
            result = self._handler(claim, running.cancel)
        # The handler's failure is the task's, never the pool's; SystemExit too, which would
        # otherwise end this thread silently with the claim held and the slot taken.
        except BaseException as exc:
            log.exception("handler raised", task_id=claim.task_id)
            error = exc
        with self._cond:
            if running.abandoned:
                return None  # the cut-off settled this claim; this answer came too late
        successor = _Running(running.queue, self._cancellation())
        follow = NextTask(running.queue, self._settings.ttl, successor.lost, self._stopping.is_set)
        next_task = follow if self._commit_then_next else None
        steps = settle(claim, result, error, next_task, stopping=self._stopping.is_set())
        settled = _settled(claim, steps)
        successor.claim = settled.won
        with self._cond:
            handed = self._slots.hand_over(
                running, settled.ending, successor if settled.won else None, self._stopping.is_set()
            )
            give_back = handed is not HandOver.KEPT and successor.claim is not None
            self._giving_back += give_back
        if handed is HandOver.KEPT:
            return successor
        if give_back:
            try:
                self._settle_cut_off(successor, CLAIMED_STOPPING)
            finally:
                with self._cond:
                    self._giving_back -= 1
                    self._cond.notify_all()
        return None

    # --- shutting down ----------------------------------------------------------------------

    def _wait_for_handlers(self, deadline: float) -> list[_Running]:
        """Wait until every handler ended or ``deadline``; the ones still running, abandoned."""
        with self._cond:
            while (
                self._busy()
                and not self._hurried.is_set()
                and (left := deadline - time.monotonic()) > 0
            ):
                self._cond.wait(left)
            return self._slots.abandon()

    def _busy(self) -> bool:
        """Whether a claim is still running or being given back (under the lock)."""
        return bool(self._slots.held() or self._giving_back)

    def _cut_off(self, left_over: list[_Running]) -> None:
        """Cancel the handlers still running and give their claims back, in parallel, for at
        most GIVE_BACK_TIMEOUT (a claim not settled by then expires with its lease)."""
        why = cut_off_reason(self._settings.grace, self._hurried.is_set())
        for running in left_over:
            running.cancel.cancel(CancelReason.SHUTDOWN, why)
        threads = [
            threading.Thread(target=self._settle_cut_off, args=(r, why), daemon=True)
            for r in left_over
        ]
        for thread in threads:
            thread.start()
        end = time.monotonic() + GIVE_BACK_TIMEOUT.total_seconds()
        for thread in threads:
            thread.join(max(end - time.monotonic(), 0.0))

    def _settle_cut_off(self, running: _Running, why: str) -> None:
        claim = running.claim
        assert claim is not None
        ending = _settled(claim, cut_off_claim(claim, why))
        with self._cond:
            self._slots.tally.count(ending)


ResultT = TypeVar("ResultT")


def _settled(claim: Claim, steps: Generator[ClaimCall, Any, ResultT]) -> ResultT:
    """Run the steps of one of the core's settling flows (sdk/_core/settling.py) on ``claim``,
    then close it."""
    flow = Flow(steps)
    try:
        while (step := flow.step) is not None:
            with flow.catching(CoordinatorError):
                flow.answer(step.call(claim))
        return flow.result
    finally:
        claim.close()
