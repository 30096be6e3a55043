"""Long-poll ClaimNext: wait up to ``wait_seconds`` for a task instead of answering
NO_READY_TASK at once.

A waiter takes a place in its queue's line (``ReadyWaiters``), in arrival order. Each ready key
the replica's ready index learns of (from its watch, or from this replica's own writes) signals
the first waiter of that queue not yet signalled, which then tries ClaimNext; so a new task
wakes one waiter, not all of them, and waiters are served in the order they came; a waiter that
wins hands the turn on to the next (ready keys that came before their waiters signalled nobody).
A waiter that loses the task (to a claim through another replica) takes its place in line
again. The line's head also tries every ``_SLICE`` seconds on its own, so a signal lost to a
race never leaves a ready task waiting for the deadline; the others sleep until a signal, their
call's end or their deadline, and a waiter that becomes the head (the one before it left) is
woken to take up the head's looks. (Every waiter used to look every ``_SLICE``: 1,000 waiting
polls woke 500 times a second for nothing, each wake a thread taking the GIL.) Past
``max_waiters`` waiting on the replica a new one is refused RESOURCE_EXHAUSTED: each waiter
holds a server thread.

A waiter whose call ends (its caller cancelled, its deadline passed) leaves the line the moment
gRPC says so (``Caller.on_end``), not at its next look: it frees its place under
``max_waiters`` at once, passes on a signal it had taken, and its handler wakes and returns,
freeing the call's stream slot. A waiter that won a task is handed it only under the same lock
that callback takes, and only if its caller is still there (``ReadyWaiters.hand``); otherwise
the claim is given back at once (store/attempts/give_back.py). Before this, a departed caller was
noticed every 2 s: it went on claiming tasks nobody received, and its slot stayed taken.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from coordinator.domain import validation
from coordinator.domain.decisions import Verdict
from coordinator.domain.states import Outcome
from coordinator.errors import CoordinatorError, ReplicaRefused, ResourceExhausted
from coordinator.metrics import Metrics
from coordinator.store.attempts.give_back import GiveBacks
from coordinator.store.claims.claim import ClaimStore
from coordinator.store.claims.claim_keys import ClaimKey, KeyTaken
from coordinator.store.types import Caller, ClaimResult

# The head of a line tries this often on its own: a safety net for a signal lost to a race, not
# the way waiters learn of tasks (the signal is) nor of their caller leaving (``on_end`` is).
_SLICE = 2.0


class _Waiter:
    """One waiting ClaimNext: signalled when a ready key arrived for it; ``gone`` when its call
    ended while it stood in line. Both change only under ``ReadyWaiters``' lock."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.signalled = False
        self.in_line = True
        self.gone = False
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
    def enter(self, queue: str, caller: Caller) -> Iterator[_Waiter]:
        """Take a place at the end of ``queue``'s line for the duration, or until ``caller``'s
        call ends."""
        waiter = _Waiter(queue)
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
        # Registered once in line, so the callback always finds what to undo; a call that
        # ended before it was registered is gone already.
        if not caller.on_end(lambda: self._abandon(waiter)):
            self._abandon(waiter)
        try:
            yield waiter
        finally:
            with self._lock:
                self._leave(waiter)

    def _leave(self, waiter: _Waiter) -> bool:
        """Take ``waiter`` out of its line if it still stands there (the lock held); whether
        it did."""
        if not waiter.in_line:
            return False
        waiter.in_line = False
        line = self._lines[waiter.queue]
        was_head = line[0] is waiter
        line.remove(waiter)
        if not line:
            del self._lines[waiter.queue]  # no entry kept per past queue
        elif was_head:
            line[0].event.set()  # the new head sleeps until woken: it takes up the looks
        self._count -= 1
        self._metrics.claim_waiters.dec()
        return True

    def _abandon(self, waiter: _Waiter) -> None:
        """``waiter``'s call ended (gRPC's callback, on its own thread): out of the line now,
        and its handler woken to return. Nothing when it had left the line already."""
        with self._lock:
            if not self._leave(waiter):
                return
            waiter.gone = True
            self._metrics.claim_waiters_abandoned.inc()
            if waiter.signalled:  # a ready key had signalled it: the next waiter takes it
                self._signal_first(waiter.queue)
        waiter.event.set()

    def hand(self, waiter: _Waiter, alive: Callable[[], bool]) -> bool:
        """Whether the task ``waiter`` won may be handed to it: its caller is still there,
        checked under the lock its end-of-call callback takes, so either the waiter is served
        (out of the line, the callback finds nothing to do) or it is gone (and the claim must
        be given back), never both."""
        with self._lock:
            if waiter.gone or not alive():
                return False
            self._leave(waiter)
            return True

    def notify(self, queue: str) -> None:
        """A ready key arrived in ``queue``: signal its first waiter not yet signalled."""
        with self._lock:
            self._signal_first(queue)

    def _signal_first(self, queue: str) -> None:
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


class LongPoll:
    """ClaimNext that may wait for a task (``wait`` seconds, bounded by the servicer)."""

    def __init__(
        self,
        claims: ClaimStore,
        waiters: ReadyWaiters,
        give_backs: GiveBacks,
        *,
        refusal: Callable[[], str | None] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``refusal``: why the version record refuses this replica now (``StoreContext``)."""
        self._claims = claims
        self._waiters = waiters
        self._give_backs = give_backs
        self._refusal = refusal
        self._monotonic = monotonic
        self._stopping = threading.Event()

    def stop_waiting(self) -> None:
        """The replica is shutting down: every waiting long poll answers NO_READY_TASK now,
        and none waits or claims again. A task won in the shutdown's grace would go to a
        worker whose renewals this replica no longer takes (it refuses new calls), a claim
        lost before it started; left READY, it goes to a poll another replica answers."""
        self._stopping.set()
        self._waiters.notify_all()

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
        caller: Caller,
        key: ClaimKey | None = None,
    ) -> ClaimResult:
        """The first task of ``queue`` this call wins within ``wait`` seconds, else
        NO_READY_TASK; the call ending (``caller``) ends the wait, and a task won for a caller
        that is gone is given back (Undelivered is raised). ``key``: a keyed call's
        (store/claims/claim_keys.py; KeyTaken when a duplicate of the call won first)."""

        def attempt() -> ClaimResult:
            return self._claims.claim_next(
                queue, principal=principal, epoch=epoch, ttl=ttl, key=key
            )

        if wait <= 0:
            return attempt()
        if self._stopping.is_set():
            return _none(queue, wait, stopping=True)
        deadline = self._monotonic() + wait
        with self._waiters.enter(queue, caller) as waiter:
            result = self._wait_for_turns(queue, waiter, attempt, wait, deadline, caller)
            if result.fence is not None:
                self._confirm(caller, result, principal)
                if not self._waiters.hand(waiter, caller.alive):
                    self._give_backs.undelivered([result], by=principal)
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
        caller: Caller,
        max_tasks: int,
        key: ClaimKey | None = None,
    ) -> list[ClaimResult]:
        """Up to ``max_tasks`` tasks of ``queue``: the first as ``claim_next`` wins it (waiting
        up to ``wait``), then, once it is CLAIMED, whatever else is ready at once; each its own
        claim txn (each carrying ``key``, if any). The first result is always there (a
        refusal, NO_READY_TASK). Should the caller be gone by the end, every claim is given
        back and Undelivered raised."""
        first = self.claim_next(
            queue, principal=principal, epoch=epoch, ttl=ttl, wait=wait, caller=caller, key=key
        )
        results = [first]
        while (
            len(results) < max_tasks
            and results[-1].verdict.outcome is Outcome.CLAIMED
            and answer_has_room(results)
        ):
            try:
                more = self._claims.claim_next(
                    queue, principal=principal, epoch=epoch, ttl=ttl, key=key
                )
            except KeyTaken:  # the key's record still names what this call won so far
                break
            if more.verdict.outcome is not Outcome.CLAIMED:
                break
            results.append(more)
        return self._give_backs.deliver(results, caller, by=principal)

    def _confirm(self, caller: Caller, won: ClaimResult, principal: str) -> None:
        """Give back what a waiter won if its caller's credentials no longer hold, and raise
        the refusal. The periodic recheck of long-lived calls, and the token file's own reload
        interval, left a window after a revocation in which a long poll still won a task."""
        try:
            caller.confirm()
        except CoordinatorError:
            self._give_backs.give_back_all([won], by=principal)
            raise

    def _still_admitted(self) -> None:
        """Refuse the waiting call UNAVAILABLE (ReplicaRefused: another replica may serve it)
        once the version record refuses this replica. The version gate checks a call when it
        starts, through a cache of a couple of seconds; a long poll it let in just after an
        admin raised the minimum (or the schema) would otherwise claim with the new epoch from
        a replica refused for it."""
        refusal = self._refusal()
        if refusal is not None:
            raise ReplicaRefused(refusal)

    def _wait_for_turns(
        self,
        queue: str,
        waiter: _Waiter,
        attempt: Callable[[], ClaimResult],
        wait: float,
        deadline: float,
        caller: Caller,
    ) -> ClaimResult:
        # Nobody ahead: try at once; else wait for a turn, in arrival order. A waiter whose call
        # ended tries nothing more: what it won would reach nobody.
        turn = self._waiters.first_in_line(queue, waiter)
        while not waiter.gone and not self._stopping.is_set():
            if turn:
                self._still_admitted()
                result = attempt()
                if result.verdict.outcome is not Outcome.NO_READY_TASK:
                    return result
            left = deadline - self._monotonic()
            if left <= 0 or not caller.alive():
                break
            # Only the head looks on its own; the others are woken (a signal, their call's end,
            # their turn as head) or reach their deadline.
            signalled = self._waiters.wait(waiter, min(left, _SLICE) if turn else left)
            turn = signalled or self._waiters.first_in_line(queue, waiter)
        return _none(queue, wait, stopping=self._stopping.is_set())


def _none(queue: str, wait: float, *, stopping: bool) -> ClaimResult:
    """A long poll's answer without a task."""
    if stopping:
        why = f"this coordinator is shutting down: poll queue {queue!r} again (another answers)"
    else:
        why = f"queue {queue!r} had no ready task for {wait:g} s"
    return ClaimResult(Verdict(Outcome.NO_READY_TASK, message=why))


MAX_ANSWER_BYTES = 3 * 1024 * 1024
"""The inputs and checkpoints one ClaimNext answer carries at most, below gRPC's default 4 MiB
a message a client takes: 64 tasks of 256 KiB inputs made a 16.8 MB answer that no client could
read, so a keyed call's tasks stayed CLAIMED by nobody until their leases ran out, counted."""


def answer_has_room(results: list[ClaimResult]) -> bool:
    """Whether one more claim, whatever its input and checkpoint, keeps the answer within
    MAX_ANSWER_BYTES."""
    carried = sum(len(r.task.input) + len(r.checkpoint) for r in results if r.task is not None)
    largest = validation.MAX_INPUT_BYTES + validation.MAX_CHECKPOINT_BYTES
    return carried + largest <= MAX_ANSWER_BYTES
