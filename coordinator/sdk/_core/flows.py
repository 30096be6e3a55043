"""Three client flows written once, as steps with no I/O: create-or-find-existing, a claim that
follows a new scheduler epoch, and a keepalive batch's fallback from RenewMany to one Renew per
claim (an older coordinator).

Each flow is a generator that yields the call it needs and is sent that call's answer; a
refusal the flow decides on (AlreadyExists, NotFound, a transport error) is sent as a value, not
thrown, so the decision stays here. ``Flow`` runs one: the sync shells (sdk/producer.py,
sdk/client.py, sdk/_renewer.py) and the asyncio ones (sdk/aio/) only perform each step, the way
sdk/_core/effects.py shares the effect protocol.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from coordinator.errors import AlreadyExists, CoordinatorError
from coordinator.sdk._core.requests import (
    CREATE_HINT,
    AnyClaim,
    create_is_retried,
    epoch_moved,
    is_this_create,
    repinned,
)
from coordinator.sdk._core.schedule import Answer, Due, Schedule, answers_of
from coordinator.sdk.tasks import TaskInfo
from coordinator.sdk.types import NotSupported
from coordinator.v1 import tasks_pb2, worker_pb2

StepT = TypeVar("StepT")
ResultT = TypeVar("ResultT")


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
