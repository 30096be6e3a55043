"""What a worker pool is apart from how it runs handlers: its options and their bounds, how a
claim of it ends, its report, and the backoff of an empty poll. Pure, no I/O.

The thread pool (``WorkerPool``, sdk/pool.py) and the asyncio pool (``AsyncWorkerPool``,
sdk/aio/pool.py) both use these, so they check the same options, end a claim the same ways and
report alike.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from coordinator.domain import validation
from coordinator.errors import InvalidArgument
from coordinator.sdk._duration import DurationField

MAX_CONCURRENT = 256
MAX_CLAIM_BATCH = 64
"""Tasks one claim of a pool may win at once (the server claims at most 64 a call)."""
MAX_QUEUES = 32
GIVE_BACK_TIMEOUT = timedelta(seconds=10)
"""How long the cut-off at the end of the grace waits for its releases: the pod's
terminationGracePeriodSeconds must exceed the grace plus this (the chart checks it)."""

SHUTDOWN_ERROR = "WorkerShutdown"
"""The error code of a claim given back because the shutdown grace ran out."""

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


def cut_off_reason(grace: timedelta) -> str:
    """What a claim given back at the end of the grace says."""
    return f"the shutdown grace of {grace.total_seconds():g}s ran out"
