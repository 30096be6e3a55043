"""The bounds on managed job records, over gRPC against a real store: at most
MAX_JOBS_PER_TASK records a task (RESOURCE_EXHAUSTED past it, nothing written), ListJobs in
pages by count and by bytes (its tokens checked), and a record's bytes charged to its worker's
write budget (an auditor once recorded 2,752 jobs of 20 KB for one claim in 15 s, all
uncharged, and listed them in one 50 MiB answer)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from coordinator.domain.roles import Role
from coordinator.domain.write_budget import BudgetPolicy
from coordinator.server import build_server
from coordinator.store import Store
from coordinator.store.effects import jobs
from coordinator.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import Probe, refused
from tests.jobs.test_rpc import WORKER_A, Claim, start_request

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


def _listed(worker: worker_pb2_grpc.WorkerServiceStub, page_size: int) -> list[list[str]]:
    """Every page of worker-a's jobs, by job id."""
    pages: list[list[str]] = []
    request = worker_pb2.ListJobsRequest(page_size=page_size)
    while True:
        page = worker.ListJobs(request, metadata=WORKER_A)
        pages.append([s.job.job_id for s in page.jobs])
        if not page.next_page_token:
            return pages
        request.page_token = page.next_page_token


def test_a_task_holds_at_most_its_bound_of_job_records(
    worker: worker_pb2_grpc.WorkerServiceStub,
    claimed: Claim,
    keyspace: Probe,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jobs, "MAX_JOBS_PER_TASK", 3)
    for n in range(3):
        assert worker.StartJob(start_request(claimed, f"j-{n}"), metadata=WORKER_A).outcome == (
            types_pb2.OUTCOME_OK
        )
    refused(
        worker.StartJob,
        start_request(claimed, "j-3"),
        EXHAUSTED,
        "task 't-1' holds 3 managed job records, the limit",
        keyspace,
        metadata=WORKER_A,
    )
    # A retry of a start that landed is still answered as one.
    again = worker.StartJob(start_request(claimed, "j-2"), metadata=WORKER_A)
    assert again.outcome == types_pb2.OUTCOME_OK


def test_list_jobs_pages_by_count_and_by_bytes(
    store: Store,
    worker: worker_pb2_grpc.WorkerServiceStub,
    claimed: Claim,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = [f"j-{n}" for n in range(7)]
    for job_id in ids:
        worker.StartJob(start_request(claimed, job_id, argv=["x" * 1000]), metadata=WORKER_A)
    assert _listed(worker, 3) == [ids[0:3], ids[3:6], ids[6:]]
    assert _listed(worker, 7) == [ids]
    size = len(store.ctx.kv.get(store.ctx.keys.job("t-1", "j-0")).value)  # type: ignore[union-attr]
    monkeypatch.setattr(jobs, "PAGE_BYTES", 2 * size + size // 2)  # two records a page
    assert _listed(worker, 100) == [ids[0:2], ids[2:4], ids[4:6], ids[6:]]
    for token, named in (("garbage", "page_token"), ("j-3~000000000000", "page_token")):
        with pytest.raises(grpc.RpcError) as info:
            worker.ListJobs(worker_pb2.ListJobsRequest(page_token=token), metadata=WORKER_A)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert named in str(info.value.details())
    with pytest.raises(grpc.RpcError) as big:
        worker.ListJobs(worker_pb2.ListJobsRequest(page_size=1001), metadata=WORKER_A)
    assert big.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture
def budgeted(store: Store) -> Iterator[worker_pb2_grpc.WorkerServiceStub]:
    """A worker stub to a server whose workers may write 10,000 bytes (no refill to speak of)."""
    budgets = {Role.WORKER: BudgetPolicy(rate=1.0, window=10_000.0)}
    srv, port = build_server(store, listen="127.0.0.1:0", max_workers=8, write_budgets=budgets)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as chan:
            yield worker_pb2_grpc.WorkerServiceStub(chan)
    finally:
        srv.stop(grace=None).wait()


def test_a_job_record_is_charged_to_its_workers_write_budget(
    budgeted: worker_pb2_grpc.WorkerServiceStub, claimed: Claim, keyspace: Probe
) -> None:
    big = ["y" * 6000]
    assert budgeted.StartJob(
        start_request(claimed, "j-1", argv=big), metadata=WORKER_A
    ).outcome == (types_pb2.OUTCOME_OK)
    refused(
        budgeted.StartJob,
        start_request(claimed, "j-2", argv=big),
        EXHAUSTED,
        "write budget of 'worker-a'",
        keyspace,
        metadata=WORKER_A,
    )
