"""The client flows written once (sdk/_core/flows.py), driven without a server: what each
asks for next given each answer, the decisions both shells used to write twice."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import AlreadyExists, CoordinatorError, StoreUnavailable
from coordinator.sdk._core.flows import (
    CreateCall,
    Flow,
    ReadEpoch,
    ReadTask,
    RenewCall,
    SendClaim,
    claim_following_epoch,
    claim_next_point,
    claim_point,
    claiming,
    create_or_existing,
    first_of,
    renew_batch,
)
from coordinator.sdk._core.schedule import Due, Schedule
from coordinator.sdk.tasks import TaskInfo
from coordinator.sdk.types import ClaimRefused, NotSupported
from coordinator.v1 import tasks_pb2, types_pb2, worker_pb2

# --- create-or-find-existing ---------------------------------------------------------------


def _create(task_id: str = "t1", key: str = "") -> tuple[Flow[Any, TaskInfo], Any]:
    request = tasks_pb2.CreateTaskRequest(task_id=task_id, queue="q", input_digest="d1")
    return Flow(create_or_existing(task_id, request, key)), request


def _task(queue: str = "q", digest: str = "d1") -> TaskInfo:
    return TaskInfo.from_proto(
        types_pb2.Task(
            task_id="t1", queue=queue, input_digest=digest, state=types_pb2.TASK_STATE_READY
        )
    )


def test_a_create_that_lands_returns_its_task_and_is_retried_only_with_an_id_or_key() -> None:
    flow, request = _create()
    assert flow.step == CreateCall(request, retry=True, idempotency_key="", hint="")
    flow.answer(
        tasks_pb2.CreateTaskResponse(
            task=types_pb2.Task(task_id="t1", queue="q", state=types_pb2.TASK_STATE_READY)
        )
    )
    assert flow.step is None
    assert flow.result.task_id == "t1"
    anonymous, _ = _create(task_id="")
    assert isinstance(anonymous.step, CreateCall)
    assert anonymous.step.retry is False and anonymous.step.hint != ""
    keyed, _ = _create(task_id="", key="k1")
    assert keyed.step == CreateCall(keyed.step.request, True, "k1", "")  # type: ignore[union-attr]


def test_a_create_found_existing_returns_that_task_when_it_is_this_create() -> None:
    flow, _ = _create()
    flow.answer(AlreadyExists("taken"))
    assert flow.step == ReadTask("t1")
    existing = _task()
    flow.answer(existing)
    assert flow.step is None
    assert flow.result is existing


@pytest.mark.parametrize("found", [None, _task(queue="other"), _task(digest="d2")])
def test_a_create_found_existing_raises_already_exists_when_it_is_not_this_create(
    found: TaskInfo | None,
) -> None:
    flow, _ = _create()
    taken = AlreadyExists("taken")
    flow.answer(taken)
    with pytest.raises(AlreadyExists) as raised:
        flow.answer(found)  # None: pruned since, its tombstone refused the id
    assert raised.value is taken


def test_a_create_without_an_id_raises_already_exists_without_reading() -> None:
    flow, _ = _create(task_id="", key="k1")
    taken = AlreadyExists("taken")
    with pytest.raises(AlreadyExists) as raised:
        flow.answer(taken)
    assert raised.value is taken


# --- claim-then-follow-the-epoch ------------------------------------------------------------

MOVED = worker_pb2.ClaimResponse(
    outcome=types_pb2.OUTCOME_FENCED, reason=types_pb2.FENCE_REASON_EPOCH_CHANGED
)
CLAIMED = worker_pb2.ClaimResponse(outcome=types_pb2.OUTCOME_CLAIMED)


def _next(flow: Flow[Any, Any]) -> Any:
    """The flow's step, read afresh (an answer changed it)."""
    return flow.step


def test_a_claim_refused_for_a_moved_epoch_is_sent_once_more_under_the_new_one() -> None:
    request = worker_pb2.ClaimRequest(task_id="t1", scheduler_epoch=1)
    flow = Flow(claim_following_epoch(request))
    assert flow.step == SendClaim(request)
    flow.answer((MOVED, 1.0))
    assert _next(flow) == ReadEpoch()
    flow.answer(2)
    assert _next(flow) == SendClaim(request) and request.scheduler_epoch == 2
    flow.answer((MOVED, 2.0))  # moved again meanwhile: the next claim follows it
    assert flow.step is None
    assert flow.result == (MOVED, 2.0)


def test_a_claim_is_not_resent_when_the_epoch_did_not_move_or_it_was_not_the_reason() -> None:
    request = worker_pb2.ClaimRequest(task_id="t1", scheduler_epoch=1)
    same = Flow(claim_following_epoch(request))
    same.answer((MOVED, 1.0))
    same.answer(1)
    assert same.step is None and same.result == (MOVED, 1.0)
    won = Flow(claim_following_epoch(request))
    won.answer((CLAIMED, 1.0))
    assert won.step is None and won.result == (CLAIMED, 1.0)


def test_a_client_with_no_pinned_epoch_reads_it_before_building_the_claim() -> None:
    point = claim_point("t1", ttl=timedelta(seconds=9), expected_state_version=4)
    unpinned = Flow(claiming(point, None))
    assert unpinned.step == ReadEpoch()
    unpinned.answer(3)
    assert _next(unpinned) == SendClaim(
        worker_pb2.ClaimRequest(
            task_id="t1", scheduler_epoch=3, ttl_seconds=9, expected_state_version=4
        )
    )
    pinned = Flow(claiming(point, 5))
    assert isinstance(pinned.step, SendClaim) and pinned.step.request.scheduler_epoch == 5
    assert point.method(SimpleNamespace(Claim="Claim")) == "Claim" and point.timeout is None


def test_a_claim_next_is_a_long_poll_of_its_wait_with_a_deadline_one_try_longer() -> None:
    point = claim_next_point(
        "q", ttl=9, wait=timedelta(seconds=5), call_timeout=timedelta(seconds=10), max_tasks=3
    )
    flow = Flow(claiming(point, 2))
    assert flow.step == SendClaim(
        worker_pb2.ClaimNextRequest(
            queue="q", scheduler_epoch=2, ttl_seconds=9, wait_seconds=5.0, max_tasks=3
        )
    )
    assert point.timeout == 15.0
    assert point.method(SimpleNamespace(ClaimNext="ClaimNext")) == "ClaimNext"
    plain = claim_next_point("q", ttl=9, wait=None, call_timeout=timedelta(seconds=10))
    assert plain.timeout is None


def test_a_claim_for_one_task_is_its_one_claim_or_the_refusal() -> None:
    refused = ClaimRefused(Outcome.NO_READY_TASK, FenceReason.NONE, "")
    assert first_of(["c1"]) == "c1"
    assert first_of(refused) is refused


# --- a keepalive batch ----------------------------------------------------------------------


# Stands for a WorkerService stub: a RenewCall picks one of these names off it.
_STUB = SimpleNamespace(RenewMany="RenewMany", Renew="Renew")


def _batch(n: int) -> list[Due]:
    return [(object(), worker_pb2.RenewRequest(), float(i + 1)) for i in range(n)]  # type: ignore[misc]


def test_a_batch_goes_as_one_renew_many_and_gets_an_answer_per_claim() -> None:
    schedule, batch = Schedule(), _batch(2)
    flow = Flow(renew_batch(schedule, batch))
    assert isinstance(flow.step, RenewCall)
    assert isinstance(flow.step.request, worker_pb2.RenewManyRequest)
    assert flow.step.timeout == 2.0
    assert flow.step.method(_STUB) == "RenewMany"
    one = worker_pb2.RenewManyResult(renewal=worker_pb2.RenewResponse(ttl_seconds=9))
    flow.answer(worker_pb2.RenewManyResponse(results=[one, one]))
    assert flow.step is None
    assert [a.ttl_seconds for a in flow.result if not isinstance(a, Exception)] == [9, 9]


def test_a_failed_renew_many_is_every_claims_answer() -> None:
    flow = Flow(renew_batch(Schedule(), _batch(3)))
    failed = StoreUnavailable("down")
    flow.answer(failed)
    assert flow.result == [failed, failed, failed]


def test_an_older_coordinator_is_renewed_one_renew_per_claim_from_then_on() -> None:
    schedule, batch = Schedule(), _batch(2)
    flow = Flow(renew_batch(schedule, batch))
    flow.answer(NotSupported("no RenewMany"))
    assert schedule.batched is False
    assert flow.step == RenewCall(batch[0][1], 1.0)
    assert flow.step.method(_STUB) == "Renew"
    first = worker_pb2.RenewResponse(ttl_seconds=9)
    flow.answer(first)
    assert flow.step == RenewCall(batch[1][1], 2.0)
    refused: CoordinatorError = StoreUnavailable("down")
    flow.answer(refused)
    assert flow.result == [first, refused]
    later = Flow(renew_batch(schedule, batch))
    assert later.step == RenewCall(batch[0][1], 1.0)  # never asks RenewMany again
