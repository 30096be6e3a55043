"""What a worker pool is apart from how it runs handlers: its options and their bounds, how a
claim of it ends, its report, which ClaimNext a claim loop sends and what its answer won, the
loop's backoff after empty polls, and which ending a settled claim counts as. Pure, no I/O.

The thread pool (``WorkerPool``, sdk/pool.py) and the asyncio pool (``AsyncWorkerPool``,
sdk/aio/pool.py) both use these, so they check the same options, end a claim the same ways and
report alike.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog

from coordinator.domain import validation
from coordinator.errors import CoordinatorError, InvalidArgument
from coordinator.sdk._duration import Duration, DurationField, as_timedelta
from coordinator.sdk.types import ClaimRefused, LostReason, TransportError

log = structlog.get_logger("coordinator.sdk.pool")

MAX_CONCURRENT = 256
MAX_CLAIM_BATCH = 64
"""Tasks one claim of a pool may win at once (the server claims at most 64 a call)."""
MAX_QUEUES = 32
GIVE_BACK_TIMEOUT = timedelta(seconds=10)
"""How long the cut-off at the end of the grace waits for its releases: the pod's
terminationGracePeriodSeconds must exceed the grace plus this (the chart checks it)."""

SHUTDOWN_ERROR = "WorkerShutdown"
"""The error code of a claim given back because the shutdown grace ran out."""
UNREACHABLE = "unreachable"
"""How a poll that reached no coordinator says why it claimed nothing."""

UNFINISHED = "the handler returned no result"
"""Why a claim whose handler returned None without ending it is released."""


class Ending(enum.Enum):
    """How one claim of the pool ended."""

    COMMITTED = "committed"
    RELEASED = "released"
    FAILED = "failed"  # reported through claim.fail (retryable): the retry policy decides
    LOST = "lost"
    CUT_OFF = "cut_off"  # still running when the grace ran out; the pool gave its claim back
    UNSETTLED = "unsettled"  # the coordinator could not be told: the lease expires instead


@dataclass(frozen=True)
class PollBackoff:
    """How long a claim loop waits after a claim that got nothing: doubles up to ``maximum``."""

    # Both take seconds too (sdk/_duration.py).
    initial: DurationField[timedelta] = DurationField(timedelta(milliseconds=50))
    maximum: DurationField[timedelta] = DurationField(timedelta(seconds=2))

    def after(self, delay: float) -> float:
        """The wait after one more empty poll, given the last one (seconds)."""
        return min(delay * 2, self.maximum.total_seconds())


@dataclass(frozen=True)
class PoolReport:
    """How many of the pool's claims ended which way (``Ending``), once it has shut down."""

    endings: dict[Ending, int]

    def count(self, ending: Ending) -> int:
        """Claims that ended ``ending``."""
        return self.endings.get(ending, 0)


def check_claim_batch(claim_batch: int) -> None:
    """Refuse (InvalidArgument) a ``claim_batch`` one ClaimNext cannot carry."""
    if not 1 <= claim_batch <= MAX_CLAIM_BATCH:
        raise InvalidArgument(f"claim_batch must be 1 to {MAX_CLAIM_BATCH}, got {claim_batch}")


@dataclass(frozen=True)
class MultiSlot:
    """A multi-slot worker's pool options (``coordinator worker --slots N``): N claims at once,
    every free slot filled by one ClaimNext (``claim_batch``), and each commit claiming its
    slot's next task in the same call (``commit_then_next``), so one call carries several tasks.

    No commit asks for more than its own slot: the other free slots are already in the claim
    loop's one long poll, which a commit claiming for them too would race."""

    max_concurrent: int
    claim_batch: int
    commit_then_next: bool = True

    @classmethod
    def of(cls, slots: int) -> MultiSlot:
        """The options of ``slots`` slots (InvalidArgument out of 1 to MAX_CONCURRENT); one
        ClaimNext wins at most MAX_CLAIM_BATCH tasks, so more slots fill in several calls."""
        if not 1 <= slots <= MAX_CONCURRENT:
            raise InvalidArgument(f"slots must be 1 to {MAX_CONCURRENT}, got {slots}")
        return cls(slots, min(slots, MAX_CLAIM_BATCH))


def check_options(queues: Sequence[str], max_concurrent: int, grace: timedelta) -> None:
    """Refuse (InvalidArgument) what no pool can run: no queue, too many or repeated queues,
    a bad queue name, a concurrency out of bounds, a negative grace."""
    if not 1 <= len(queues) <= MAX_QUEUES or len(set(queues)) != len(queues):
        raise InvalidArgument(f"give 1 to {MAX_QUEUES} distinct queues, got {list(queues)}")
    for queue in queues:
        validation.queue(queue)
    if not 1 <= max_concurrent <= MAX_CONCURRENT:
        raise InvalidArgument(f"max_concurrent must be 1 to {MAX_CONCURRENT}")
    if grace < timedelta(0):
        raise InvalidArgument(f"grace must not be negative, got {grace}")


@dataclass(frozen=True)
class PoolSettings:
    """A pool's options, checked (``of``): what either pool claims, for how long, and how it
    stops."""

    queues: tuple[str, ...]
    max_concurrent: int
    ttl: timedelta
    grace: timedelta
    poll: PollBackoff
    long_poll: timedelta

    @classmethod
    def of(
        cls,
        queues: Sequence[str],
        *,
        max_concurrent: int,
        ttl: Duration,
        grace: Duration,
        poll: PollBackoff | None,
        long_poll: Duration,
    ) -> PoolSettings:
        """The settings, or InvalidArgument for what no pool can run (``check_options``)."""
        grace = as_timedelta(grace, "grace")
        check_options(queues, max_concurrent, grace)
        return cls(
            tuple(queues),
            max_concurrent,
            as_timedelta(ttl, "ttl"),
            grace,
            poll or PollBackoff(),
            as_timedelta(long_poll, "long_poll"),
        )

    def logged(self) -> dict[str, object]:
        """What a pool's start logs of its settings."""
        return {"queues": list(self.queues), "max_concurrent": self.max_concurrent}

    def stop_deadlines(self, now: float) -> tuple[float, float]:
        """When the grace of a stop at ``now`` ends, and when the give-backs after it must be
        done (a claim loop whose claim was answered as the stop came has that long too)."""
        deadline = now + self.grace.total_seconds()
        return deadline, deadline + GIVE_BACK_TIMEOUT.total_seconds()


class Tally:
    """How a pool's claims ended, and the error that stopped it (the first one); not
    thread-safe: the thread pool counts under its lock, the asyncio pool on its loop."""

    def __init__(self) -> None:
        self._endings: Counter[Ending] = Counter()
        self._fatal: CoordinatorError | None = None

    def count(self, ending: Ending) -> None:
        """One more claim ended ``ending``."""
        self._endings[ending] += 1

    def failed(self, exc: CoordinatorError) -> None:
        """A claim loop stopped on ``exc`` (the first one is raised by ``report``)."""
        if self._fatal is None:
            self._fatal = exc

    def report(self) -> PoolReport:
        """The report of a pool that shut down; raises the error that stopped it, if any."""
        report = PoolReport(dict(self._endings))
        log.info("pool stopped", **{e.value: n for e, n in report.endings.items()})
        if self._fatal is not None:
            raise self._fatal
        return report


def cut_off_reason(grace: timedelta, hurried: bool) -> str:
    """What a claim given back at the end of the grace says (``hurried``: a second signal
    ended it early)."""
    if hurried:
        return "a second signal cut the shutdown grace short"
    return f"the shutdown grace of {grace.total_seconds():g}s ran out"


CLAIMED_STOPPING = "claimed as the pool stopped"
"""What a claim won as the pool stopped says when it is given back, never run."""


class Polling:
    """One claim loop's wait after empty polls (``PollBackoff``) and which of them to log."""

    def __init__(self, backoff: PollBackoff) -> None:
        self._backoff = backoff
        self._delay = backoff.initial.total_seconds()
        self._refused = ""

    def claimed(self) -> None:
        """A poll won something: the next empty one waits the initial delay again."""
        self._delay = self._backoff.initial.total_seconds()

    def empty(self, why: str, waited: float) -> tuple[bool, float]:
        """A poll that won nothing, for ``why``, after ``waited`` seconds: whether to log it
        (once per change of reason: an idle queue must not flood the log), and how long to wait
        before the next one (a long poll that already waited on the server counts towards
        it)."""
        log_it, self._refused = why != self._refused, why
        wait = max(self._delay - waited, 0.0)
        self._delay = self._backoff.after(self._delay)
        return log_it, wait

    def nothing(self, queue: str, why: str, waited: float) -> float:
        """``empty``, logging ``why`` of ``queue`` once per change: the wait before the next
        poll."""
        log_it, wait = self.empty(why, waited)
        if log_it:  # a coordinator out of reach is a warning: an empty queue is not
            say = log.warning if why.startswith(UNREACHABLE) else log.info
            say("nothing claimed", queue=queue, why=why)
        return wait


def given_back(lost: bool) -> Ending:
    """A claim the pool failed (retryable) to give it back: LOST if that found it lost."""
    return Ending.LOST if lost else Ending.FAILED


def cut_off(given: Ending, committed: bool) -> Ending:
    """How a claim given back at the end of the grace ended: COMMITTED if the handler's commit
    landed first (the store decided), LOST if it was lost, else CUT_OFF."""
    if committed:
        return Ending.COMMITTED
    return given if given is Ending.LOST else Ending.CUT_OFF


def after_handler(finished: str, lost: bool) -> Ending | None:
    """How a claim ended once its handler's result was committed (or not), or once the handler
    ended it itself (``finished``: claim.fail, claim.release): None while it is still held,
    for the pool to fail it (an error) or release it."""
    if finished == "committed":
        return Ending.COMMITTED
    if lost:
        return Ending.LOST
    return _BY_HANDLER.get(finished)


_BY_HANDLER = {"failed": Ending.FAILED, "released": Ending.RELEASED}


def released(committed: bool) -> Ending:
    """A claim the pool released: COMMITTED if the release found its own commit had landed."""
    return Ending.COMMITTED if committed else Ending.RELEASED


STOPPING = "signal received: stopping"
HURRIED = "signal received again: the grace cut short"
REPEATED = "signal received again within a second: the same stop, the grace kept"
"""What a pool's signal handlers log on a first signal, a later one, and a repeat of the first
(``sdk/_signals.py``)."""

SLOT_FAULT = "claim not settled (a fault past its handler): slot freed, claim left to its lease"
"""What a pool logs when settling a claim raised something unexpected (a bug, not the handler's
exception, which gives the task back): the slot goes back to the claim loops either way."""


def unsettled(committed: bool) -> Ending:
    """A claim the coordinator could not be told about: COMMITTED if its commit is known to
    have landed, else UNSETTLED (its lease expires)."""
    return Ending.COMMITTED if committed else Ending.UNSETTLED


def poll_call(
    queue: str,
    slots: int,
    settings: PoolSettings,
    on_lost: Callable[[LostReason], None],
    **extra: Any,
) -> Callable[[Any], Any]:
    """The one ClaimNext a claim loop of ``queue`` sends for ``slots`` free slots, as a call on
    the client (a WorkerClient's answer, an AsyncWorkerClient's coroutine): ``claim_next`` for
    one slot, ``claim_many`` for more; a long poll of ``settings.long_poll``; ``extra`` goes
    along (the thread pool's ``abort``)."""
    ttl, wait = settings.ttl, settings.long_poll
    if slots == 1:
        return lambda client: client.claim_next(queue, ttl=ttl, on_lost=on_lost, wait=wait, **extra)
    return lambda client: client.claim_many(
        queue, ttl=ttl, max_tasks=slots, on_lost=on_lost, wait=wait, **extra
    )


def poll_answer(answer: object) -> list[Any] | str:
    """What a poll's ``answer`` won: the claims (one claim_next's, or claim_many's list), or
    why none (its refusal's outcome, or ``unreachable``: a transport error's)."""
    if isinstance(answer, ClaimRefused):
        return answer.outcome.name
    if isinstance(answer, TransportError):
        return f"{UNREACHABLE}: {answer}"
    return answer if isinstance(answer, list) else [answer]
