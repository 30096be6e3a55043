"""A WorkerPool whose every claim answer is lost once still runs each task on its first attempt.

Tasks allow one attempt only (``max_attempts=1``): a claim that started a second attempt, or
left one unheld to expire, would dead-letter its task. The pool claims in batches
(``claim_batch``) and with each commit (``commit_then_next``), so all three claiming paths of
the sync SDK (claim_next, claim_many, commit_and_next) lose an answer here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import grpc
import pytest

from coordinator import request_ids
from coordinator.domain.states import AttemptEnd, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Ending, TaskRetryPolicy, WorkerPool
from tests.helpers import eventually
from tests.sdk.support import Served, served

TASKS = 12


class _LostOnce(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection reset on the way back"


class LoseEveryClaimsFirstAnswer(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Lets the first try of every call that claims (ClaimNext, Commit with next) run on the
    server, then loses its answer; its retries (the same request id) get through."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seen: dict[str, str] = {}  # request id -> method
        self.batches = 0  # ClaimNexts for more than one task whose answer was lost

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call_id = dict(details.metadata or ()).get(request_ids.METADATA_KEY, "")
        method = details.method.rsplit("/", 1)[-1]
        claims = method == "ClaimNext" or (method == "Commit" and request.HasField("next"))
        call = continuation(details, request)
        with self._lock:
            first = claims and call_id not in self.seen
            if first:
                self.seen[call_id] = method
                self.batches += int(getattr(request, "max_tasks", 0) > 1)
        if first:
            call.result()  # it ran on the server...
            raise _LostOnce()  # ...and its answer never came back
        return call


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    with served(etcd.endpoint, prefix) as running:
        with running.client("producer") as producer:
            once = TaskRetryPolicy(max_attempts=1)
            for n in range(TASKS):
                producer.create_task(f"t{n}", queue="q", input=b"x", retry_policy=once)
        yield running


def test_every_task_runs_once_on_its_first_attempt_though_each_claim_answer_was_lost_once(
    coordinator: Served,
) -> None:
    lose = LoseEveryClaimsFirstAnswer()
    with (
        coordinator.client("w", interceptors=[lose]) as client,
        coordinator.client("reader") as reader,
        ThreadPoolExecutor(1) as background,
    ):
        pool = WorkerPool(
            client,
            lambda claim, cancel: b"done",
            queues=["q"],
            max_concurrent=3,
            ttl=timedelta(seconds=2),  # a claim left unheld expires (and dead-letters) soon
            long_poll=timedelta(seconds=1),
            claim_batch=3,
            commit_then_next=True,
        )
        running = background.submit(pool.run)

        def ended() -> bool:
            states = {reader.get_task(f"t{n}").state for n in range(TASKS)}
            return states <= {TaskState.DONE, TaskState.FAILED}

        try:
            eventually(ended, timeout=60)
        finally:
            pool.stop()
        report = running.result(timeout=30)
        tasks = [reader.get_task(f"t{n}") for n in range(TASKS)]
    assert [(t.state, t.attempt, [a.end for a in t.attempts]) for t in tasks] == [
        (TaskState.DONE, 1, [AttemptEnd.COMMITTED])
    ] * TASKS
    assert report.endings == {Ending.COMMITTED: TASKS}
    # Each claiming path lost an answer: a ClaimNext of one task, a batch, a commit's next.
    assert {"ClaimNext", "Commit"} <= set(lose.seen.values()) and lose.batches >= 1
