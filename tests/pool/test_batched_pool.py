"""WorkerPool's batched options against a real coordinator: ``commit_then_next`` hands a slot
from a commit to the task it claimed in the same call; ``claim_batch`` claims as many tasks as
slots are free in one ClaimNext, each routed its own loss."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from coordinator.domain.states import TaskState
from coordinator.errors import InvalidArgument
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Cancellation, Claim, Ending, WorkerPool
from tests.helpers import eventually
from tests.sdk.support import CallCounter, Served, served

TTL = timedelta(seconds=2)


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    with served(etcd.endpoint, prefix) as running:
        yield running


def _create(coordinator: Served, count: int) -> None:
    with coordinator.client("producer") as producer:
        for n in range(count):
            producer.create_task(f"t{n}", queue="q", input=b"x")


def _done(coordinator: Served, count: int) -> bool:
    with coordinator.client("reader") as reader:
        return all(reader.get_task(f"t{n}").state is TaskState.DONE for n in range(count))


class _Recorded(CallCounter):
    """Counts calls and keeps the ClaimNext requests (their max_tasks)."""

    def __init__(self) -> None:
        super().__init__()
        self.claim_nexts: list[Any] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if details.method.endswith("/ClaimNext"):
            self.claim_nexts.append(request)
        return super().intercept_unary_unary(continuation, details, request)


def test_commit_then_next_runs_a_busy_queue_with_one_call_per_task(coordinator: Served) -> None:
    _create(coordinator, 8)
    counter = _Recorded()
    with (
        coordinator.client("w", interceptors=[counter]) as client,
        ThreadPoolExecutor(1) as background,
    ):
        pool = WorkerPool(
            client,
            lambda claim, cancel: b"done",
            queues=["q"],
            ttl=TTL,
            commit_then_next=True,
            long_poll=timedelta(seconds=1),
        )
        running = background.submit(pool.run)
        eventually(lambda: _done(coordinator, 8), timeout=30)
        commits, claim_nexts = counter.calls.get("Commit"), len(counter.claim_nexts)
        pool.stop()
        report = running.result(timeout=30)
    assert report.endings[Ending.COMMITTED] == 8
    assert commits == 8
    # The first task came from a ClaimNext; the other seven each from the commit before it.
    # ClaimNexts after that are the idle loop's long polls once the queue ran dry.
    assert counter.claim_nexts[0].max_tasks == 0
    assert claim_nexts <= 1 + 8 // 4, claim_nexts


def test_claim_batch_fills_the_free_slots_in_one_call_and_routes_each_loss(
    coordinator: Served,
) -> None:
    _create(coordinator, 4)
    counter = _Recorded()
    gate = threading.Event()
    started: list[str] = []
    cancelled: list[str] = []

    def handler(claim: Claim, cancel: Cancellation) -> bytes | None:
        started.append(claim.task_id)
        while not gate.is_set():
            if cancel.wait_for_cancelled(timedelta(seconds=0.05)):
                cancelled.append(claim.task_id)
                return None
        return b"done"

    with (
        coordinator.client("w", interceptors=[counter]) as client,
        coordinator.client("admin") as admin,
        ThreadPoolExecutor(1) as background,
    ):
        pool = WorkerPool(client, handler, queues=["q"], max_concurrent=4, claim_batch=4, ttl=TTL)
        running = background.submit(pool.run)
        eventually(lambda: len(started) == 4, timeout=15)
        assert counter.claim_nexts[0].max_tasks == 4  # one call for the four free slots
        assert len(counter.claim_nexts) == 1
        admin.cancel_task("t2", reason="not needed")  # only t2's handler hears of it
        eventually(lambda: cancelled, timeout=15)
        gate.set()
        eventually(lambda: pool.held() == 0, timeout=15)
        pool.stop()
        report = running.result(timeout=30)
    assert cancelled == ["t2"]
    assert (report.endings[Ending.COMMITTED], report.endings[Ending.LOST]) == (3, 1)


def test_a_claim_batch_out_of_bounds_is_refused(coordinator: Served) -> None:
    with coordinator.client("w") as client:
        for bad in (0, 65):
            with pytest.raises(InvalidArgument, match=f"claim_batch must be 1 to 64, got {bad}"):
                WorkerPool(client, lambda c, x: None, queues=["q"], claim_batch=bad)


def test_a_task_a_commit_won_as_the_pool_stopped_is_given_back_before_run_returns(
    coordinator: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # run() once returned while the handler's thread was still giving that task back: the
    # process exited mid-way, the task waited out its lease, and the report missed it.
    _create(coordinator, 2)
    stopping: list[WorkerPool] = []
    real_commit_and_next, real_fail = Claim.commit_and_next, Claim.fail

    def commit_and_next(claim: Claim, *args: Any, **kwargs: Any) -> Any:
        stopping[0].stop()  # the stop comes while the commit (and its next claim) travels
        return real_commit_and_next(claim, *args, **kwargs)

    def slow_fail(claim: Claim, *args: Any, **kwargs: Any) -> Any:
        time.sleep(1.0)
        return real_fail(claim, *args, **kwargs)

    monkeypatch.setattr(Claim, "commit_and_next", commit_and_next)
    monkeypatch.setattr(Claim, "fail", slow_fail)
    with coordinator.client("w") as client:
        pool = WorkerPool(
            client, lambda claim, cancel: b"done", queues=["q"], ttl=TTL, commit_then_next=True
        )
        stopping.append(pool)
        report = pool.run()
    assert report.endings == {Ending.COMMITTED: 1, Ending.CUT_OFF: 1}
    with coordinator.client("reader") as reader:  # already given back, not waiting on a lease
        states = sorted(reader.get_task(f"t{n}").state.name for n in range(2))
        given_back = [a.error_code for n in range(2) for a in reader.attempts(f"t{n}")]
        assert states == ["DONE", "READY"]
        assert sorted(given_back) == ["", "WorkerShutdown"]
