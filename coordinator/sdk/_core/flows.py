"""Three client flows written once, as steps with no I/O: create-or-find-existing, a claim
(``ClaimPoint``: Claim or ClaimNext, its request and deadline) under the pinned epoch that
follows a new scheduler epoch, and a keepalive batch's fallback from RenewMany to one Renew per
claim (an older coordinator).

Each flow is a generator that yields the call it needs and is sent that call's answer; a
refusal the flow decides on (AlreadyExists, NotFound, a transport error) is sent as a value, not
thrown, so the decision stays here (``Flow.catching`` throws one in instead, for a flow that
decides with try/except). ``Flow`` runs one: the sync shells (sdk/producer.py, sdk/client.py,
sdk/_renewer.py, sdk/pool.py) and the asyncio ones (sdk/aio/) only perform each step, the way
sdk/_core/effects.py shares the effect protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from coordinator.errors import AlreadyExists, CoordinatorError
from coordinator.sdk._core.requests import (
    CREATE_HINT,
    AnyClaim,
    claim_next_request,
    claim_request,
    create_is_retried,
    epoch_moved,
    is_this_create,
    long_poll,
    repinned,
)
from coordinator.sdk._core.schedule import Answer, Due, Schedule, answers_of
from coordinator.sdk._duration import Duration
from coordinator.sdk.tasks import TaskInfo
from coordinator.sdk.types import ClaimRefused, NotSupported
from coordinator.v1 import tasks_pb2, worker_pb2

StepT = TypeVar("StepT")
ResultT = TypeVar("ResultT")
ClaimT = TypeVar("ClaimT")


class Flow(Generic[StepT, ResultT]):
    """One flow advanced by a driver: ``step`` is the call to make next (None once ``result``
    is known); ``answer`` it with the call's reply. A refusal the flow does not absorb is
    raised from ``answer``."""

    def __init__(self, steps: Generator[StepT, Any, ResultT]) -> None:
        self._steps = steps
        self._result: ResultT | None = None
        self.step: StepT | None = self._advance(None)

    @property
    def result(self) -> ResultT:
        """What the flow ended with (once ``step`` is None)."""
        assert self.step is None, "the flow has not ended"
        return self._result  # type: ignore[return-value]  # set when the generator returned

    def answer(self, reply: Any) -> None:
        """The reply to ``step``."""
        self.step = self._advance(reply)

    @contextmanager
    def catching(self, *errors: type[BaseException]) -> Iterator[None]:
        """Performing ``step``: one of ``errors`` it raises is thrown into the flow, which
        decides on it (or lets it out of here)."""
        try:
            yield
        except errors as exc:
            self.step = self._advance(exc, throw=True)

    def _advance(self, reply: Any, *, throw: bool = False) -> StepT | None:
        try:
            return self._steps.throw(reply) if throw else self._steps.send(reply)
        except StopIteration as done:
            self._result = done.value
            return None


# --- create-or-find-existing -------------------------------------------------------------------


@dataclass(frozen=True)
class CreateCall:
    """Send CreateTask; answered with its response, or the AlreadyExists it raised."""

    request: tasks_pb2.CreateTaskRequest
    retry: bool
    idempotency_key: str
    hint: str


@dataclass(frozen=True)
class ReadTask:
    """Read the task ``task_id``; answered with its TaskInfo, or None if NotFound."""

    task_id: str


def create_or_existing(
    task_id: str, request: tasks_pb2.CreateTaskRequest, idempotency_key: str
) -> Generator[CreateCall | ReadTask, Any, TaskInfo]:
    """Create a task; with an explicit id, a task found existing that this create would have
    made (a retry whose first try landed) is returned instead of AlreadyExists."""
    retry = create_is_retried(task_id, idempotency_key)
    hint = "" if retry else CREATE_HINT
    answer = yield CreateCall(request, retry, idempotency_key, hint)
    if not isinstance(answer, AlreadyExists):
        return TaskInfo.from_proto(answer.task)
    if not task_id:
        raise answer
    existing = yield ReadTask(task_id)
    # None: pruned since (its tombstone refused the id), not ours to return.
    if existing is None or not is_this_create(existing, request):
        raise answer from None
    return existing  # type: ignore[no-any-return]  # the shell answers ReadTask with TaskInfo


# --- claim-then-follow-the-epoch ---------------------------------------------------------------


@dataclass(frozen=True)
class SendClaim:
    """Send the claim ``request`` as one call; answered with (response, lease clock start)."""

    request: AnyClaim


@dataclass(frozen=True)
class ReadEpoch:
    """Read (and pin) the scheduler epoch; answered with it."""


Sent = tuple[worker_pb2.ClaimResponse, float]


@dataclass(frozen=True)
class ClaimPoint:
    """One claim call of a client: the WorkerService method it sends (``method`` picks it off
    a sync or an asyncio stub), its request under a given scheduler epoch, and its deadline (a
    long poll's: its wait plus one try; None: the policy's)."""

    method: Callable[[Any], Any]
    request: Callable[[int], AnyClaim]
    timeout: float | None = None


def claim_point(task_id: str, *, ttl: Duration, expected_state_version: int) -> ClaimPoint:
    """A claim of ``task_id`` (Claim)."""
    return ClaimPoint(
        lambda worker: worker.Claim,
        lambda epoch: claim_request(
            task_id, ttl=ttl, epoch=epoch, expected_state_version=expected_state_version
        ),
    )


def claim_next_point(
    queue: str, *, ttl: Duration, wait: Duration | None, call_timeout: timedelta, max_tasks: int = 1
) -> ClaimPoint:
    """A claim of up to ``max_tasks`` ready tasks of ``queue`` (ClaimNext), a long poll of
    ``wait`` if given (``long_poll``)."""
    waited, timeout = long_poll(wait, call_timeout)
    return ClaimPoint(
        lambda worker: worker.ClaimNext,
        lambda epoch: claim_next_request(
            queue, ttl=ttl, epoch=epoch, wait=waited, max_tasks=max_tasks
        ),
        timeout,
    )


def claiming(point: ClaimPoint, pinned: int | None) -> Generator[SendClaim | ReadEpoch, Any, Sent]:
    """``point``'s answer under the client's ``pinned`` epoch (read, and pinned, first if it
    has none), following a new epoch once (``claim_following_epoch``)."""
    epoch: int = pinned if pinned is not None else (yield ReadEpoch())
    return (yield from claim_following_epoch(point.request(epoch)))


def first_of(won: list[ClaimT] | ClaimRefused) -> ClaimT | ClaimRefused:
    """The one claim a claim call for one task won, or its refusal."""
    return won[0] if isinstance(won, list) else won


def claim_following_epoch(request: AnyClaim) -> Generator[SendClaim | ReadEpoch, Any, Sent]:
    """A claim's answer, following a new epoch once: refused only because the epoch moved on,
    the claim is re-pinned and sent again; a second refusal means the epoch moved again
    meanwhile, and the next claim follows it."""
    sent: Sent = yield SendClaim(request)
    if epoch_moved(sent[0]) and repinned(request, (yield ReadEpoch())):
        sent = yield SendClaim(request)
    return sent


# --- a keepalive batch, batched or one Renew per claim ------------------------------------------


@dataclass(frozen=True)
class RenewCall:
    """One renewal call, never retried by the SDK (the keepalive loop is the retry, and each
    try ends before the lease); answered with its response or the CoordinatorError raised."""

    request: worker_pb2.RenewManyRequest | worker_pb2.RenewRequest
    timeout: float

    def method(self, worker: Any) -> Any:
        """The method of the WorkerService stub ``worker`` (sync or asyncio) to call."""
        batched = isinstance(self.request, worker_pb2.RenewManyRequest)
        return worker.RenewMany if batched else worker.Renew


def renew_batch(schedule: Schedule, batch: list[Due]) -> Generator[RenewCall, Any, list[Answer]]:
    """One answer per claim of ``batch``: one RenewMany while the coordinator has it; one that
    answers UNIMPLEMENTED (an older version) turns the schedule to one Renew per claim."""
    if schedule.batched:
        request, timeout = schedule.call(batch)
        reply = yield RenewCall(request, timeout)
        if isinstance(reply, NotSupported):
            schedule.batched = False
        elif isinstance(reply, CoordinatorError):
            return [reply] * len(batch)
        else:
            return answers_of(reply)
    answers: list[Answer] = []
    for _, lone, lone_timeout in batch:
        answers.append((yield RenewCall(lone, lone_timeout)))
    return answers
