"""How a pool ends one claim, as steps with no I/O: once its handler is done, commit the result
(with ``commit_then_next``, claiming the slot's next task in the same call), give the task back
(a retryable failure) or release it; at the end of the grace, give it back cut off.

Each is a generator that yields the claim method to call (``ClaimCall``) and is sent what it
returned, or thrown the CoordinatorError it raised, which the flow decides on. The thread pool
(sdk/pool.py) calls each step, the asyncio pool (sdk/aio/pool.py) awaits it; both close the
claim once the flow ended, as ``settled`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

import structlog

from coordinator.errors import CoordinatorError, InvalidArgument
from coordinator.sdk._core.held import HeldClaim, LostCallback
from coordinator.sdk._core.pool import (
    SHUTDOWN_ERROR,
    UNFINISHED,
    Ending,
    after_handler,
    cut_off,
    given_back,
    released,
    unsettled,
)
from coordinator.sdk._core.requests import RESULT_TYPES

log = structlog.get_logger("coordinator.sdk.pool")

ClaimT = TypeVar("ClaimT", bound=HeldClaim)


@dataclass(frozen=True)
class ClaimCall:
    """Call this method of the claim (``lambda claim: claim.close()``: the lambda works on a
    Claim and on an AsyncClaim, whose coroutine the asyncio pool awaits); answered with what it
    returned, or thrown the CoordinatorError it raised."""

    call: Callable[[Any], Any]


@dataclass(frozen=True)
class NextTask:
    """With ``commit_then_next``: the commit also claims the next task of ``queue`` for the
    slot, unless the pool is ``stopping`` by then (a stopping pool claims nothing)."""

    queue: str
    ttl: timedelta
    on_lost: LostCallback
    stopping: Callable[[], bool]


@dataclass(frozen=True)
class Settled(Generic[ClaimT]):
    """How a claim ended, and the claim its commit won for the slot (``NextTask``), if any."""

    ending: Ending
    won: ClaimT | None = None


Settling = Generator[ClaimCall, Any, Ending]

RELEASED_UNFINISHED = "handler returned None: claim released, the task will be claimed again"
STOPPED = "the handler returned no result as the worker was stopping"
RESULT_DISCARDED = (
    "the handler's result was discarded: the claim was lost before its commit landed (the "
    "attempt counts as the loss says; another attempt may run the task)"
)


def settle(
    claim: ClaimT,
    result: bytes | None,
    error: BaseException | None,
    follow: NextTask | None,
    *,
    stopping: bool = False,
) -> Generator[ClaimCall, Any, Settled[ClaimT]]:
    """End ``claim`` after its handler returned ``result`` or raised ``error``: commit the
    result, or give the task back for the error, or release a claim the handler left held
    (given back as a shutdown instead when the pool is ``stopping``: the handler stopped for
    it). A call the coordinator could not take leaves the claim to its lease (UNSETTLED)."""
    won: ClaimT | None = None
    if error is None and result is not None and not isinstance(result, RESULT_TYPES):
        error = TypeError(
            f"the handler returned {type(result).__name__}: a handler returns bytes (committed) "
            "or None (the claim released)"
        )
        log.error("handler returned no bytes", task_id=claim.task_id, error=str(error))
        result = None
    try:
        if result is not None and error is None and not claim.is_lost():
            try:
                won = yield from _commit(result, follow)
            except InvalidArgument as exc:  # the result itself refused (its size): no lease wait
                log.error("the commit was refused", task_id=claim.task_id, error=str(exc))
                return Settled((yield from give_back(claim, exc)))
        ending = after_handler(claim.finished_as, claim.is_lost())
        if ending is Ending.LOST and result is not None and error is None:
            # Said per claim: finished work thrown away (an outage past the lease, a pause)
            # otherwise shows only as the loss, and as the task running again.
            lost = claim.lost_reason
            log.warning(RESULT_DISCARDED, task_id=claim.task_id, result_bytes=len(result),
                        lost=str(lost) if lost else "")  # fmt: skip
        if ending is not None:
            return Settled(ending, won)
        if error is not None:
            return Settled((yield from give_back(claim, error)))
        if stopping:  # the handler gave up for the shutdown (cancel.is_shutting_down())
            return Settled((yield from cut_off_claim(claim, STOPPED)))
        # Said per claim: a handler that forgot its return value otherwise loops on the task
        # (each release counts an attempt) with no word until the pool stops.
        log.info(RELEASED_UNFINISHED, task_id=claim.task_id)
        yield ClaimCall(lambda held: held.release(UNFINISHED))
        return Settled(released(claim.committed))
    except CoordinatorError as exc:
        log.warning("could not settle the claim", task_id=claim.task_id, error=str(exc))
        return Settled(unsettled(claim.committed), won)


def _commit(result: bytes, follow: NextTask | None) -> Generator[ClaimCall, Any, Any]:
    """Commit ``result``; the claim the commit won for the slot (``follow``), or None."""
    if follow is None or follow.stopping():
        yield ClaimCall(lambda held: held.commit(result))
        return None
    _, won = yield ClaimCall(
        lambda held: held.commit_and_next(
            result, queue=follow.queue, ttl=follow.ttl, on_lost=follow.on_lost
        )
    )
    return won[0] if won else None


def give_back(
    claim: HeldClaim, error: BaseException | str, message: str = "", *, shutdown: bool = False
) -> Settling:
    """Fail the attempt, retryable: the task's retry policy decides what follows. ``error``:
    the handler's exception (its type names the failure, its traceback goes along) or an error
    code with ``message``. ``shutdown``: given back because the pool is stopping (not counted,
    no backoff, within the server's bound)."""
    # No renewal of a claim being given back: its lease only ends sooner.
    yield ClaimCall(lambda held: held.close())
    yield ClaimCall(
        lambda held: held.fail(error, retryable=True, message=message, shutdown=shutdown)
    )
    return given_back(claim.is_lost())


def cut_off_claim(claim: HeldClaim, why: str) -> Settling:
    """Give back a claim still running when the grace ran out (or claimed as the pool
    stopped): COMMITTED if its commit landed first, LOST, CUT_OFF, or UNSETTLED if the
    coordinator could not be told (the lease expires instead)."""
    try:
        given = yield from give_back(claim, SHUTDOWN_ERROR, why, shutdown=True)
    except CoordinatorError as exc:
        log.warning("could not give the claim back", task_id=claim.task_id, error=str(exc))
        return Ending.UNSETTLED
    return cut_off(given, claim.committed)
