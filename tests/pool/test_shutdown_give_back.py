"""A pool's shutdown costs a task no attempt: what a stopping pool gives back (its handler
cut off at the grace, or ending early because the pool is stopping) goes back as a shutdown
(FailRequest.shutdown), READY at once and not counted. Before, five rolling restarts of a
pool dead-lettered a healthy long task ("all 5 attempts used")."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from coordinator.domain.states import AttemptEnd, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Cancellation, Claim, Ending, WorkerPool
from coordinator.sdk.pool import SHUTDOWN_ERROR
from tests.helpers import eventually
from tests.sdk.support import Served, served

TTL = timedelta(seconds=2)


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    with served(etcd.endpoint, prefix) as running:
        yield running


@pytest.mark.parametrize("handler", ["polite", "deaf-until-cancelled"])
def test_rolling_restarts_of_a_pool_cost_a_long_task_no_attempt(
    coordinator: Served, handler: str
) -> None:
    def handle(claim: Claim, cancel: Cancellation) -> bytes | None:
        if handler == "polite":  # stops when its pool does, as the docs recommend
            while not cancel.is_shutting_down():
                cancel.wait_for_cancelled(timedelta(milliseconds=20))
        else:  # runs until the grace is over and the cut-off cancels it
            cancel.wait_for_cancelled(timedelta(seconds=30))
        return None

    with coordinator.client("producer") as producer:
        producer.create_task("long", queue="q", input=b"hours of work")  # 5 attempts
        for restart in range(6):
            with coordinator.client(f"pod-{restart}") as client, ThreadPoolExecutor(1) as bg:
                pool = WorkerPool(
                    client, handle, queues=["q"], ttl=TTL, grace=timedelta(milliseconds=200)
                )
                running = bg.submit(pool.run)
                eventually(lambda: producer.get_task("long").state is TaskState.CLAIMED)
                pool.stop()
                assert running.result(timeout=30).endings == {Ending.CUT_OFF: 1}
        task = producer.get_task("long")
        assert (task.state, task.attempts_counted) == (TaskState.READY, 0)
        attempts = [(a.end, a.error_code) for a in producer.attempts("long")]
        assert attempts == [(AttemptEnd.FAILED, SHUTDOWN_ERROR)] * 6
