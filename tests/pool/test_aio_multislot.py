"""AsyncWorkerPool as a multi-slot pool (``MultiSlot.of(n)``: ``claim_batch`` and
``commit_then_next``) against a real coordinator: one ClaimNext fills every free slot, each
commit claims its slot's next task, every task runs exactly once; a stop mid-run commits what
finishes without claiming more, and each loss reaches only its own handler. The server's own
RPC metrics count the calls."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import asdict

import pytest
from prometheus_client import CollectorRegistry

from coordinator.domain.states import AttemptEnd, TaskState
from coordinator.errors import InvalidArgument
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.sdk import Ending, WorkerClient
from coordinator.sdk.aio import AsyncClaim, AsyncWorkerPool
from coordinator.sdk.pool import MultiSlot
from tests.helpers import eventually
from tests.pool.test_aio_pool import Pools, states, stopped
from tests.pool.test_multislot_worker import calls
from tests.sdk.support import Served, served

SLOTS, TASKS = 4, 24


@pytest.fixture
def metrics() -> Metrics:
    """A registry of this test's own, so it reads its calls, not the process's."""
    return Metrics(CollectorRegistry())


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str, metrics: Metrics) -> Iterator[Served]:
    """A coordinator on this test's prefix, counting on ``metrics``."""
    with served(etcd.endpoint, prefix, metrics=metrics) as running:
        yield running


@pytest.fixture
def producer(coordinator: Served) -> Iterator[WorkerClient]:
    """Creates tasks and reads them back."""
    with coordinator.client("producer") as client:
        yield client


@pytest.fixture
def pools(coordinator: Served) -> Iterator[Pools]:
    """Async pools on their own loop, closed after the test."""
    made = Pools(coordinator.target)
    try:
        yield made
    finally:
        made.close()


def test_a_multi_slot_pool_carries_several_tasks_per_call_and_runs_each_once(
    pools: Pools, producer: WorkerClient, metrics: Metrics
) -> None:
    for n in range(TASKS):
        producer.create_task(f"t{n:02d}", queue="q", input=b"x")

    async def handle(claim: AsyncClaim) -> bytes:
        return f"done {claim.task_id}".encode()

    pool, running = pools.start(handle, **asdict(MultiSlot.of(SLOTS)))
    eventually(lambda: set(states(producer).values()) == {TaskState.DONE}, timeout=60)
    claim_nexts, commits = calls(metrics, "ClaimNext"), calls(metrics, "Commit")
    report = stopped(pools, pool, running)
    assert report.endings == {Ending.COMMITTED: TASKS}
    for n in range(TASKS):
        task_id = f"t{n:02d}"
        assert [a.end for a in producer.attempts(task_id)] == [AttemptEnd.COMMITTED], task_id
        assert producer.get_result(task_id).result == f"done {task_id}".encode()
    assert commits == TASKS
    # The first ClaimNext fills the 4 slots; each commit then claims its slot's next task.
    assert claim_nexts <= TASKS // SLOTS, claim_nexts


def test_a_stopped_multi_slot_pool_commits_what_finishes_and_claims_nothing_more(
    pools: Pools, producer: WorkerClient, metrics: Metrics
) -> None:
    for task_id in ("a", "b", "c", "d"):
        producer.create_task(task_id, queue="q", input=b"x")
    gate, started = asyncio.Event(), set()

    async def handle(claim: AsyncClaim) -> bytes:
        started.add(claim.task_id)
        await gate.wait()
        return b"done"

    pool, running = pools.start(handle, **asdict(MultiSlot.of(SLOTS)))
    eventually(lambda: started == {"a", "b", "c", "d"})
    assert calls(metrics, "ClaimNext") == 1  # one call filled the four slots
    for task_id in ("late-1", "late-2"):  # every slot is taken: these wait, READY
        producer.create_task(task_id, queue="q", input=b"x")
    pools.stop(pool)
    eventually(lambda: pool.stopping)
    pools.call(gate.set)  # within the grace: the four commit, without claiming a next task
    report = running.result(timeout=60)
    assert report.endings == {Ending.COMMITTED: 4}
    assert states(producer) == {
        "a": TaskState.DONE,
        "b": TaskState.DONE,
        "c": TaskState.DONE,
        "d": TaskState.DONE,
        "late-1": TaskState.READY,
        "late-2": TaskState.READY,
    }
    assert list(producer.attempts("late-1")) == list(producer.attempts("late-2")) == []


def test_a_claim_batch_out_of_bounds_is_refused(pools: Pools) -> None:
    async def handle(claim: AsyncClaim) -> bytes:
        return b""

    for bad in (0, 65):
        with pytest.raises(InvalidArgument, match=f"claim_batch must be 1 to 64, got {bad}"):
            AsyncWorkerPool(pools.client, handle, queues=["q"], claim_batch=bad)
