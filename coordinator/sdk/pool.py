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
task instead of two.

Each claim's handler runs on its own thread; the client's one keepalive loop renews every claim.
The handler gets the Claim and a
Cancellation (sdk/cancellation.py), set when the claim is lost (``on_lost``) or when the
shutdown grace runs out. What the handler returns is committed; an exception gives the task
back as a retryable failure, ``claim.fail(error, retryable=True)`` (the task's retry policy
decides what follows). A handler that returns None has ended the claim itself, or the pool
releases it.

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import structlog

from coordinator.errors import CoordinatorError, InvalidArgument
from coordinator.sdk._core.pool import (
    GIVE_BACK_TIMEOUT,
    MAX_CLAIM_BATCH,
    MAX_CONCURRENT,
    MAX_QUEUES,
    SHUTDOWN_ERROR,
    UNFINISHED,
    Ending,
    PollBackoff,
    Polling,
    PoolReport,
    PoolSettings,
    Tally,
    after_handler,
    cut_off,
    cut_off_reason,
    given_back,
    released,
    unsettled,
)
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


@dataclass(eq=False)
class _Runnings:
    """The claims one ClaimNext of ``slots`` tasks wins, each routed its own loss."""

    queue: str
    stopping: Flag
    slots: int
    by_task: dict[str, _Running] = field(default_factory=dict)

    def won(self, claims: list[Claim]) -> list[_Running]:
        """A _Running per claim won (losses reported from now on reach its handler)."""
        runnings = [_Running(self.queue, Cancellation(self.stopping), claim) for claim in claims]
        self.by_task.update((r.claim.task_id, r) for r in runnings if r.claim is not None)
        return runnings

    def lost(self, reason: LostReason) -> None:
        """The batch's on_lost: cancel the handler of the claim that was lost."""
        running = self.by_task.get(reason.task_id)
        if running is not None:
            running.lost(reason)


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
        if not 1 <= claim_batch <= MAX_CLAIM_BATCH:
            raise InvalidArgument(f"claim_batch must be 1 to {MAX_CLAIM_BATCH}, got {claim_batch}")
        self._claim_batch, self._commit_then_next = claim_batch, commit_then_next
        self._client, self._handler = client, handler
        self._readiness = tuple(readiness)
        self._stopping = Flag()
        # A shutdown never claims: stop() aborts the long polls in flight, which would else win
        # the very tasks the cut-off gives back (issue 29), and the server claims nothing for a
        # caller that left (store/long_poll.py).
        self._polls = Abort()
        self._cond = threading.Condition()
        self._free = settings.max_concurrent
        self._running: set[_Running] = set()
        self._tally = Tally()

    def held(self) -> int:
        """How many claims the pool is running now."""
        with self._cond:
            return len(self._running)

    def stop(self) -> None:
        """Stop claiming now and shut down (``run`` returns once done). Idempotent; not from
        a signal handler (it takes a lock): use ``stop_on_signals``."""
        self._stopping.set()
        self._polls.abort()
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
        self._stopping.wait()
        set_all(self._readiness, False)
        # (abandoned mid-way, a claim answered as the stop came would wait out its lease)
        deadline, end = self._settings.stop_deadlines(time.monotonic())
        log.info("pool stopping: no new claims", running=self.held())
        self._cut_off(self._wait_for_handlers(deadline))
        for loop in loops:
            loop.join(max(end - time.monotonic(), 0.0))
        with self._cond:
            return self._tally.report()

    # --- claiming ---------------------------------------------------------------------------

    def _claim_loop(self, queue: str) -> None:
        polling = Polling(self._settings.poll)
        while slots := self._take_slots():
            runnings = _Runnings(queue, self._stopping, slots)
            sent = time.monotonic()
            try:
                got = self._claim(runnings)
            except CallAborted:  # stop() ended the poll (and what it may have won: sdk/abort.py)
                self._give_slot(slots)
                return
            except CoordinatorError as exc:
                self._give_slot(slots)
                self._fail(queue, exc)
                return
            if isinstance(got, list):
                polling.claimed()
                self._give_slot(slots - len(got))
                for running in runnings.won(got):
                    if not self._start(running):  # claimed while stopping: never run it
                        self._settle_cut_off(running, "claimed as the pool stopped")
                        self._give_slot()
                continue
            self._give_slot(slots)
            log_it, wait = polling.empty(got, time.monotonic() - sent)
            if log_it:
                log.info("nothing claimed", queue=queue, why=got)
            self._stopping.wait(wait)

    def _claim(self, runnings: _Runnings) -> list[Claim] | str:
        """One ClaimNext for as many tasks as slots were taken: the Claims, or why nothing was
        claimed. Raises the errors no retry cures (CoordinatorError other than
        TransportError)."""
        try:
            if runnings.slots == 1:
                got = self._client.claim_next(
                    runnings.queue,
                    ttl=self._settings.ttl,
                    on_lost=runnings.lost,
                    wait=self._settings.long_poll,
                    abort=self._polls,
                )
                return [got] if isinstance(got, Claim) else got.outcome.name
            many = self._client.claim_many(
                runnings.queue,
                ttl=self._settings.ttl,
                max_tasks=runnings.slots,
                on_lost=runnings.lost,
                wait=self._settings.long_poll,
                abort=self._polls,
            )
        except TransportError as exc:
            return f"unreachable: {exc}"
        return many if isinstance(many, list) else many.outcome.name

    def _take_slots(self) -> int:
        """Wait for a free slot and take it, with up to ``claim_batch`` - 1 more that are free
        now; 0 once stopping."""
        with self._cond:
            while self._free == 0 and not self._stopping.is_set():
                self._cond.wait()
            if self._stopping.is_set():
                return 0
            taken = min(self._free, self._claim_batch)
            self._free -= taken
            return taken

    def _give_slot(self, count: int = 1) -> None:
        if count <= 0:
            return
        with self._cond:
            self._free += count
            self._cond.notify_all()

    def _fail(self, queue: str, exc: CoordinatorError) -> None:
        """A claim refused for a reason no retry cures: stop the whole pool, loudly."""
        log.error("claim loop failed; stopping the pool", queue=queue, error=str(exc))
        with self._cond:
            self._tally.failed(exc)
        self.stop()

    # --- running ----------------------------------------------------------------------------

    def _start(self, running: _Running) -> bool:
        with self._cond:
            if self._stopping.is_set():
                return False
            self._running.add(running)
        name = f"claim-{running.claim.task_id}" if running.claim is not None else "claim"
        threading.Thread(target=self._work, args=(running,), name=name, daemon=True).start()
        return True

    def _work(self, running: _Running) -> None:
        current: _Running | None = running
        while current is not None:  # with commit_then_next, a commit hands the slot on
            current = self._run_one(current)

    def _run_one(self, running: _Running) -> _Running | None:
        """Run the handler on ``running``'s claim and settle it; the claim its commit won
        (commit_then_next), which keeps the slot, or None."""
        claim = running.claim
        assert claim is not None
        claim.start()
        result, error = None, None
        try:
            result = self._handler(claim, running.cancel)
        except Exception as exc:  # the handler's failure is the task's, never the pool's
            log.exception("handler raised", task_id=claim.task_id)
            error = exc
        with self._cond:
            if running.abandoned:
                return None  # the cut-off settled this claim; this answer came too late
        successor = _Running(running.queue, Cancellation(self._stopping))
        ending = self._settle(claim, result, error, successor if self._commit_then_next else None)
        return self._hand_over(running, ending, successor)

    def _hand_over(self, running: _Running, ending: Ending, successor: _Running) -> _Running | None:
        """Count ``running``'s ending; its slot goes to ``successor`` if its commit won one and
        the pool still runs, else it is freed (a successor won while stopping is given back)."""
        keep = successor.claim is not None
        with self._cond:
            if running in self._running:
                self._running.discard(running)
                self._tally.count(ending)
                if keep and not self._stopping.is_set():
                    self._running.add(successor)
                    return successor
                self._free += 1
                self._cond.notify_all()
        if keep:
            self._settle_cut_off(successor, "claimed as the pool stopped")
        return None

    def _settle(
        self,
        claim: Claim,
        result: bytes | None,
        error: Exception | None,
        successor: _Running | None,
    ) -> Ending:
        """Commit the result (claiming ``successor``'s task in the same call, if given), or
        give the task back; how the claim ended."""
        try:
            if result is not None and error is None and not claim.is_lost():
                self._commit(claim, result, successor)
            ending = after_handler(claim.committed, claim.is_lost())
            if ending is not None:
                return ending
            if error is not None:
                return _give_back(claim, error)
            claim.release(UNFINISHED)
            return released(claim.committed)
        except CoordinatorError as exc:
            log.warning("could not settle the claim", task_id=claim.task_id, error=str(exc))
            return unsettled(claim.committed)
        finally:
            claim.close()

    def _commit(self, claim: Claim, result: bytes, successor: _Running | None) -> None:
        if successor is None or self._stopping.is_set():
            claim.commit(result)
            return
        _, won = claim.commit_and_next(
            result, queue=successor.queue, ttl=self._settings.ttl, on_lost=successor.lost
        )
        successor.claim = won[0] if won else None

    # --- shutting down ----------------------------------------------------------------------

    def _wait_for_handlers(self, deadline: float) -> list[_Running]:
        """Wait until every handler ended or ``deadline``; the ones still running, abandoned."""
        with self._cond:
            while self._running and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            left_over = list(self._running)
            for running in left_over:
                running.abandoned = True
                self._running.discard(running)
            return left_over

    def _cut_off(self, left_over: list[_Running]) -> None:
        """Cancel the handlers still running and give their claims back, in parallel, for at
        most GIVE_BACK_TIMEOUT (a claim not settled by then expires with its lease)."""
        why = cut_off_reason(self._settings.grace)
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
        try:
            ending = cut_off(_give_back(claim, SHUTDOWN_ERROR, why), claim.committed)
        except CoordinatorError as exc:
            log.warning("could not give the claim back", task_id=claim.task_id, error=str(exc))
            ending = Ending.UNSETTLED
        finally:
            claim.close()
        with self._cond:
            self._tally.count(ending)


def _give_back(claim: Claim, error: Exception | str, message: str = "") -> Ending:
    """Fail the attempt, retryable: the task's retry policy decides what follows. ``error``:
    the handler's exception (its type names the failure, its traceback goes along) or an error
    code with ``message``."""
    claim.close()  # no renewal of a claim being given back: its lease only ends sooner
    claim.fail(error, retryable=True, message=message)
    return given_back(claim.is_lost())
