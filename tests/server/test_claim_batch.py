"""Batched claims and commit-then-next over a real channel: ClaimNext(max_tasks) claims up to
that many tasks, each a claim of its own; Commit(next) commits and claims in one call."""

from __future__ import annotations

import grpc

from coordinator.domain.digests import digest_of
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests import helpers
from tests.helpers import Probe

WORKER_A = (("x-coordinator-principal", "worker-a"),)
CLAIMED = types_pb2.OUTCOME_CLAIMED


def _create(tasks: tasks_pb2_grpc.TaskServiceStub, *ids: str) -> None:
    for task_id in ids:
        tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id=task_id, input=task_id.encode()))


def _next(max_tasks: int = 0, wait: float = 0.0) -> worker_pb2.ClaimNextRequest:
    return worker_pb2.ClaimNextRequest(
        scheduler_epoch=1, ttl_seconds=30, max_tasks=max_tasks, wait_seconds=wait
    )


def _commit(claim: worker_pb2.ClaimResponse, **fields: object) -> worker_pb2.CommitRequest:
    result = b"done " + claim.input
    return worker_pb2.CommitRequest(
        fence=claim.fence,
        input_digest=claim.input_digest,
        result=result,
        result_digest=digest_of(result),
        **fields,  # type: ignore[arg-type]
    )


def test_claim_next_with_max_tasks_claims_that_many_each_its_own_claim(
    tasks: tasks_pb2_grpc.TaskServiceStub, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    _create(tasks, "t1", "t2", "t3", "t4", "t5")
    response = worker.ClaimNext(_next(max_tasks=3), metadata=WORKER_A)
    claims = [response, *response.more_claims]
    assert [c.outcome for c in claims] == [CLAIMED] * 3
    assert len({c.fence.task_id for c in claims}) == 3  # three tasks (of the first few ready)
    generations = [c.fence.claim_generation for c in claims]
    assert len(set(generations)) == 3  # three claim txns, three fencing tokens
    assert all(not c.more_claims and c.ttl_seconds == 30 for c in claims[1:])
    for claim in claims:  # each renews and commits on its own
        renewed = worker.Renew(worker_pb2.RenewRequest(fence=claim.fence), metadata=WORKER_A)
        assert renewed.outcome == types_pb2.OUTCOME_OK
    assert worker.Commit(_commit(claims[1]), metadata=WORKER_A).outcome == (
        types_pb2.OUTCOME_COMMITTED
    )
    rest = worker.ClaimNext(_next(max_tasks=64), metadata=WORKER_A)
    held = {c.fence.task_id for c in [*claims, rest, *rest.more_claims]}
    assert held == {"t1", "t2", "t3", "t4", "t5"}  # the two left, and no task twice
    empty = worker.ClaimNext(_next(max_tasks=64), metadata=WORKER_A)
    assert (empty.outcome, len(empty.more_claims)) == (types_pb2.OUTCOME_NO_READY_TASK, 0)


def test_a_commit_with_next_commits_and_claims_in_one_call(
    tasks: tasks_pb2_grpc.TaskServiceStub, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    _create(tasks, "t1", "t2")
    first = worker.ClaimNext(_next(), metadata=WORKER_A)
    answer = worker.Commit(_commit(first, next=_next()), metadata=WORKER_A)
    assert (answer.outcome, answer.state) == (
        types_pb2.OUTCOME_COMMITTED,
        types_pb2.TASK_STATE_DONE,
    )
    assert answer.next.outcome == CLAIMED
    assert {first.fence.task_id, answer.next.fence.task_id} == {"t1", "t2"}
    assert answer.next.fence.claim_generation > first.fence.claim_generation
    last = worker.Commit(_commit(answer.next, next=_next(max_tasks=5)), metadata=WORKER_A)
    assert last.outcome == types_pb2.OUTCOME_COMMITTED
    assert last.next.outcome == types_pb2.OUTCOME_NO_READY_TASK
    # A retried commit claims again (the lost answer's claim would expire with its lease).
    _create(tasks, "t3")
    stale = worker.Commit(_commit(first, next=_next()), metadata=WORKER_A)
    assert stale.outcome == types_pb2.OUTCOME_COMMITTED  # a retry of first's: as it landed
    assert (stale.next.outcome, stale.next.fence.task_id) == (CLAIMED, "t3")
    plain = worker.Commit(_commit(stale.next), metadata=WORKER_A)
    assert not plain.HasField("next")


def test_bad_batch_fields_are_refused_and_write_nothing(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
) -> None:
    _create(tasks, "t1", "t2")
    helpers.refused(
        worker.ClaimNext,
        _next(max_tasks=65),
        grpc.StatusCode.INVALID_ARGUMENT,
        "max_tasks must be 0 to 64, got 65",
        keyspace,
        metadata=WORKER_A,
    )
    claim = worker.ClaimNext(_next(), metadata=WORKER_A)
    for bad, named in (
        (_next(wait=1.0), "next.wait_seconds must be 0: a commit never waits"),
        (_next(max_tasks=-1), "next.max_tasks must be 0 to 64, got -1"),
        (worker_pb2.ClaimNextRequest(scheduler_epoch=1), "next.ttl_seconds"),
    ):
        helpers.refused(
            worker.Commit,
            _commit(claim, next=bad),
            grpc.StatusCode.INVALID_ARGUMENT,
            named,
            keyspace,
            metadata=WORKER_A,
        )
