"""AsyncWorkerPool: an async handler run over one or more queues, up to ``max_concurrent``
claims at once, every one a task on one event loop and one AsyncWorkerClient.

    async def handle(claim: AsyncClaim) -> bytes | None:
        ...                                    # CancelledError: the claim was lost, or the
        return result                          # grace ran out; the pool commits the result

    async def main() -> None:
        async with AsyncWorkerClient(target, principal="pool-1") as client:
            pool = AsyncWorkerPool(client, handle, queues=["emails"], max_concurrent=8)
            stop_on_signals(pool)              # SIGTERM / SIGINT: pool.stop()
            report = await pool.run()          # returns once shut down

    asyncio.run(main())

The thread pool's semantics (sdk/pool.py), on asyncio: one claim loop per queue, which claims
only when a slot is free, with a long poll (``wait=long_poll``) and the same backoff after an
empty answer; what the handler returns is committed, an exception gives the task back as a
retryable failure (``claim.fail(error, retryable=True)``), None releases a claim the handler did
not end itself. ``stop()`` stops claiming at once (the long polls in flight are cancelled, so a
shutdown never claims) and marks the pool unready, lets running handlers finish until ``grace``
has passed, then cancels the rest and gives their claims back (a retryable failure; their
renewals stop first) within ``GIVE_BACK_TIMEOUT``; ``run()`` then returns. ``claim_batch`` and
``commit_then_next`` batch the calls as there (``MultiSlot.of(n)``: a multi-slot pool).

Where asyncio differs from threads: the handler runs as its own task, so the pool cancels it
(CancelledError inside the handler) when its claim is lost (``on_lost``) and when the grace runs
out; there is no Cancellation object, and ``pool.stopping`` tells a handler the shutdown has
begun. A handler that swallows CancelledError runs on until it returns, but its claim was given
back: whatever it commits then is refused (and, as any such task, it holds ``asyncio.run`` up
at exit). Handlers must not block the loop (``asyncio.to_thread``
for blocking work): a blocked loop renews no claim.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine, Generator, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import structlog

from coordinator.errors import CoordinatorError
from coordinator.sdk._core.flows import Flow
from coordinator.sdk._core.pool import (
    CLAIMED_STOPPING,
    GIVE_BACK_TIMEOUT,
    SLOT_FAULT,
    Ending,
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
from coordinator.sdk._signals import SignalCount, answer_signal
from coordinator.sdk.aio._events import wait_for
from coordinator.sdk.aio.claim import AsyncClaim
from coordinator.sdk.aio.client import AsyncWorkerClient
from coordinator.sdk.readiness import Readiness, set_all
from coordinator.sdk.types import LostReason, TransportError

log = structlog.get_logger(__name__)

AsyncHandler = Callable[[AsyncClaim], Coroutine[Any, Any, bytes | None]]
"""Does one claim's work; returns the result to commit, or None having ended the claim itself."""


@dataclass(eq=False)
class _Running:
    """One claim of the pool, from the claim to its ending."""

    queue: str
    claim: AsyncClaim | None = None
    # The pool's task for this claim (handler, then settling), and the handler's own task.
    work: asyncio.Task[None] | None = None
    handler: asyncio.Task[bytes | None] | None = None
    # Set when the grace ran out: the cut-off settles this claim, the work task does not.
    abandoned: bool = False

    def lost(self, reason: LostReason) -> None:
        """The claim's on_lost (called on the loop): cancel the handler."""
        if self.handler is not None:
            self.handler.cancel(f"claim lost: {reason}")


class AsyncWorkerPool:
    """Runs ``handler`` over ``queues`` with at most ``max_concurrent`` claims at once."""

    def __init__(
        self,
        client: AsyncWorkerClient,
        handler: AsyncHandler,
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
        self._stopping = asyncio.Event()
        self._hurried = asyncio.Event()  # the grace cut short (a second signal)
        self._changed = asyncio.Event()  # a slot came free, or the pool is stopping
        self._polls: set[asyncio.Task[list[AsyncClaim] | str]] = set()  # ClaimNexts in flight
        # The slots' accounting is the core's (sdk/_core/slots.py), on this loop.
        self._slots: Slots[_Running] = Slots(
            settings.max_concurrent, claim_batch, self._changed.set
        )

    stopped = False
    """Whether ``run()`` has returned: the pool is done (a signal then ends the process)."""

    @property
    def stopping(self) -> bool:
        """Whether the pool stopped claiming: a handler has until the grace runs out."""
        return self._stopping.is_set()

    def held(self) -> int:
        """How many claims the pool is running now."""
        return self._slots.held()

    def stop(self) -> None:
        """Stop claiming now and shut down (``run`` returns once done). Idempotent. Call it on
        the pool's loop: from another thread, ``loop.call_soon_threadsafe(pool.stop)``."""
        self._stopping.set()
        self._changed.set()
        # A shutdown never claims: a long poll left running would win the very tasks the
        # cut-off gives back (issue 29: 2 runs in 5). Cancelled, the call ends on the server
        # too, which claims nothing for a caller that left (store/claims/long_poll.py).
        for poll in self._polls:
            poll.cancel("the pool is stopping")

    def hurry(self) -> None:
        """Stop, and cut the grace short: the handlers still running are cancelled and their
        claims given back now (``stop_on_signals`` on a second signal). On the pool's loop."""
        self.stop()
        self._hurried.set()

    async def run(self) -> PoolReport:
        """Claim and run claims until ``stop()``, then shut down as the module says. Raises the
        error that stopped a claim loop (bad credentials, an unknown queue name, ...) once
        shut down."""
        loop = asyncio.get_running_loop()
        loops = [
            loop.create_task(self._claim_loop(q), name=f"claim-{q}") for q in self._settings.queues
        ]
        try:
            set_all(self._readiness, True)
            log.info("pool claiming", **self._settings.logged())
            while not await wait_for(self._stopping, OUTLIVED_CHECK):
                held = self._slots.outlived(loop.time(), self._settings.grace.total_seconds())
                if held is not None:  # every slot held by a handler past its lost claim, or not
                    set_all(self._readiness, not held)
            set_all(self._readiness, False)
            # (cancelled mid-way, a claim answered as the stop came would wait out its lease)
            deadline, end = self._settings.stop_deadlines(loop.time())
            log.info("pool stopping: no new claims", running=self.held())
            await self._cut_off(await self._wait_for_handlers(deadline))
            await asyncio.wait(loops, timeout=max(end - loop.time(), 0.0))
        finally:
            for task in loops:
                task.cancel()
            self.stopped = True
        return self._slots.tally.report()

    # --- claiming ---------------------------------------------------------------------------

    async def _claim_loop(self, queue: str) -> None:
        loop = asyncio.get_running_loop()
        polling = Polling(self._settings.poll)
        while slots := await self._take_slots():
            routes: Routes[_Running, AsyncClaim] = Routes()
            sent = loop.time()
            poll = loop.create_task(self._claim(queue, slots, routes), name=f"claim-next-{queue}")
            self._polls.add(poll)
            got: list[AsyncClaim] | str = []
            try:
                got = await poll
            except asyncio.CancelledError:
                if not self._stopping.is_set():
                    raise  # (stop() cancelled the poll: what it won, sdk/abort.py)
            except CoordinatorError as exc:
                self._fail(queue, exc)
            finally:
                self._polls.discard(poll)
            self._slots.polled(slots, got)
            if isinstance(got, str):
                await wait_for(self._stopping, polling.nothing(queue, got, loop.time() - sent))
                continue
            polling.claimed()
            for running in routes.won(got, lambda claim: _Running(queue, claim)):
                await self._start(running)

    async def _claim(
        self, queue: str, slots: int, routes: Routes[_Running, AsyncClaim]
    ) -> list[AsyncClaim] | str:
        """One ClaimNext for ``slots`` tasks (``poll_call``): the AsyncClaims, or why nothing was
        claimed. Raises the errors no retry cures (CoordinatorError other than
        TransportError)."""
        try:
            answer = await poll_call(queue, slots, self._settings, routes.lost)(self._client)
        except TransportError as exc:
            answer = exc
        return poll_answer(answer)

    async def _take_slots(self) -> int:
        """Wait for a free slot and take it, with up to ``claim_batch`` - 1 more that are free
        now; 0 once stopping."""
        while self._slots.full(self._stopping.is_set()):
            self._changed.clear()  # no await between the check and the wait: no wake-up lost
            await self._changed.wait()
        return self._slots.take(self._stopping.is_set())

    def _fail(self, queue: str, exc: CoordinatorError) -> None:
        """A claim refused for a reason no retry cures: stop the whole pool, loudly."""
        log.error("claim loop failed; stopping the pool", queue=queue, error=str(exc))
        self._slots.tally.failed(exc)
        self.stop()

    # --- running ----------------------------------------------------------------------------

    async def _start(self, running: _Running) -> None:
        """Run ``running``'s handler in a task of its own; one claimed as the pool stopped is
        given back, never run."""
        if not self._slots.start(running, self._stopping.is_set()):
            await self._settle_cut_off(running, CLAIMED_STOPPING)
            self._slots.give()
            return
        name = f"claim-{running.claim.task_id}" if running.claim is not None else "claim"
        running.work = asyncio.get_running_loop().create_task(self._work(running), name=name)

    async def _work(self, running: _Running) -> None:
        current: _Running | None = running
        while current is not None:  # with commit_then_next, a commit hands the slot on
            this = current
            try:
                current = await self._run_one(this)
            except Exception:  # a fault past the handler's must not hold the slot for good
                log.exception(SLOT_FAULT, task_id=this.claim and this.claim.task_id)
                if this.claim is not None:  # no more renewals: the lease ends it
                    await this.claim.close()
                self._slots.hand_over(this, Ending.UNSETTLED, None, False)
                return

    async def _run_one(self, running: _Running) -> _Running | None:
        """Run the handler on ``running``'s claim and settle it; the claim its commit won
        (commit_then_next), which keeps the slot and this work task, or None."""
        claim = running.claim
        assert claim is not None
        claim.start()
        handler = running.handler = asyncio.get_running_loop().create_task(
            self._handler(claim), name=f"handler-{claim.task_id}"
        )
        if claim.is_lost():  # lost before its handler existed to be cancelled
            handler.cancel()
        # Waiting never cancels the handler: only a loss or the cut-off does.
        await asyncio.wait([handler])
        if running.abandoned:
            return None  # the cut-off settled this claim; this answer came too late
        result, error = _outcome(handler, claim)
        successor = _Running(running.queue, work=running.work)
        follow = NextTask(running.queue, self._settings.ttl, successor.lost, self._stopping.is_set)
        next_task = follow if self._commit_then_next else None
        steps = settle(claim, result, error, next_task, stopping=self._stopping.is_set())
        settled = await _settled(claim, steps)
        successor.claim = settled.won
        handed = self._slots.hand_over(
            running, settled.ending, successor if settled.won else None, self._stopping.is_set()
        )
        if handed is HandOver.KEPT:
            return successor
        if successor.claim is not None:  # won as the pool stopped: never run it
            await self._settle_cut_off(successor, CLAIMED_STOPPING)
        return None

    # --- shutting down ----------------------------------------------------------------------

    async def _wait_for_handlers(self, deadline: float) -> list[_Running]:
        """Wait until every claim settled or ``deadline``; the ones still running, abandoned."""
        pending: set[asyncio.Future[Any]] = {
            r.work for r in self._slots.running() if r.work is not None
        }
        loop = asyncio.get_running_loop()
        hurried = loop.create_task(self._hurried.wait())
        while pending and not hurried.done() and (left := deadline - loop.time()) > 0:
            _, pending = await asyncio.wait(
                pending | {hurried}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            pending.discard(hurried)
        hurried.cancel()
        return self._slots.abandon()

    async def _cut_off(self, left_over: list[_Running]) -> None:
        """Cancel the handlers still running and give their claims back, concurrently, for at
        most GIVE_BACK_TIMEOUT (a claim not settled by then expires with its lease)."""
        if not left_over:
            return
        why = cut_off_reason(self._settings.grace, self._hurried.is_set())
        for running in left_over:
            if running.handler is not None:
                running.handler.cancel(why)
        loop = asyncio.get_running_loop()
        give_backs = [loop.create_task(self._settle_cut_off(r, why)) for r in left_over]
        _, late = await asyncio.wait(give_backs, timeout=GIVE_BACK_TIMEOUT.total_seconds())
        for task in late:
            task.cancel()  # counted UNSETTLED by _settle_cut_off
        if late:
            await asyncio.wait(late)
        for running in left_over:  # waiting on a handler deaf to its cancellation: stop waiting
            if running.work is not None:
                running.work.cancel()

    async def _settle_cut_off(self, running: _Running, why: str) -> None:
        claim = running.claim
        assert claim is not None
        ending = Ending.UNSETTLED  # (also when cancelled: GIVE_BACK_TIMEOUT ran out)
        try:
            ending = await _settled(claim, cut_off_claim(claim, why))
        finally:
            self._slots.tally.count(ending)


ResultT = TypeVar("ResultT")


async def _settled(claim: AsyncClaim, steps: Generator[ClaimCall, Any, ResultT]) -> ResultT:
    """Run the steps of one of the core's settling flows (sdk/_core/settling.py) on ``claim``,
    awaiting each, then close it."""
    flow = Flow(steps)
    try:
        while (step := flow.step) is not None:
            with flow.catching(CoordinatorError):
                flow.answer(await step.call(claim))
        return flow.result
    finally:
        await claim.close()


def _outcome(
    handler: asyncio.Task[bytes | None], claim: AsyncClaim
) -> tuple[bytes | None, Exception | None]:
    """What the finished ``handler`` left: its result, or its exception (a cancelled handler
    left neither: its claim was lost, or it gave up itself)."""
    if handler.cancelled():
        return None, None
    error = handler.exception()
    if error is None:
        return handler.result(), None
    if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: the worker stops,
        return None, None  # not the task failing: the claim is released
    log.error("handler raised", task_id=claim.task_id, exc_info=error)
    return None, error


def stop_on_signals(
    pool: AsyncWorkerPool, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
) -> Callable[[], None]:
    """Make ``signals`` stop ``pool``; returns a function removing the handlers. Call it on the
    running loop of the main thread (asyncio runs its signal handlers there, as loop
    callbacks, so they may call ``stop()`` directly)."""
    loop = asyncio.get_running_loop()
    count = SignalCount()

    def on_signal(signum: signal.Signals) -> None:
        if pool.stopped:
            # Nothing left to stop: a handler that swallowed its CancelledError keeps
            # asyncio.run() waiting for it at the loop's end. The signal does what it would
            # have done without us: the process ends.
            log.warning("pool already stopped: the signal ends the process", signal=signum.name)
            restore()
            signal.raise_signal(signum)
            return
        answer_signal(pool, count.hurries(), signum)

    for signum in signals:
        loop.add_signal_handler(signum, on_signal, signum)

    def restore() -> None:
        for signum in signals:
            loop.remove_signal_handler(signum)

    return restore
