"""WorkerPool in this process against a real coordinator: the concurrency bound over several
queues, commits, losses cancelling the handler, errors giving the task back, long-poll use,
readiness (file and HTTP)."""

from __future__ import annotations

import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from coordinator.cli.ready_http import ReadyEndpoint
from coordinator.domain.states import AttemptEnd, TaskState
from coordinator.errors import InvalidArgument
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import (
    Cancellation,
    CancelReason,
    Claim,
    ClaimRefused,
    Duration,
    Ending,
    LostCallback,
    PoolReport,
    ReadyFile,
    TaskRetryPolicy,
    WorkerClient,
    WorkerPool,
)
from coordinator.sdk import pool as pool_module
from coordinator.sdk._core import settling
from coordinator.sdk._core.slots import ALL_HELD, NOT_ALL_HELD, OUTLIVED
from coordinator.sdk.abort import Abort
from coordinator.sdk.pool import SHUTDOWN_ERROR
from tests.helpers import eventually
from tests.sdk.support import Served, served

ZERO = timedelta(0)
TTL = timedelta(seconds=2)  # renewed every 2/3 s: a cancellation is noticed quickly


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    """A coordinator on this test's prefix."""
    with served(etcd.endpoint, prefix) as running:
        yield running


@pytest.fixture
def producer(coordinator: Served) -> Iterator[WorkerClient]:
    """Creates tasks and reads them back."""
    with coordinator.client("producer") as client:
        yield client


@pytest.fixture
def background() -> Iterator[ThreadPoolExecutor]:
    """Runs pools while the test drives them."""
    with ThreadPoolExecutor(max_workers=2) as executor:
        yield executor


def states(client: WorkerClient) -> dict[str, TaskState]:
    """Every task's state, by id."""
    return {t.task_id: t.state for t in client.list_tasks()}


def stop(pool: WorkerPool, running: Future[PoolReport]) -> PoolReport:
    """Stop the pool and wait for its report."""
    pool.stop()
    return running.result(timeout=30)


def test_at_most_max_concurrent_claims_over_two_queues_all_committed(
    coordinator: Served,
    producer: WorkerClient,
    background: ThreadPoolExecutor,
    tmp_path: Path,
) -> None:
    for task_id, queue in (("a1", "qa"), ("a2", "qa"), ("b1", "qb"), ("b2", "qb")):
        producer.create_task(task_id, queue=queue, input=task_id.encode())
    go = threading.Event()
    lock = threading.Lock()
    active, peak = [0], [0]

    def handle(claim: Claim, cancel: Cancellation) -> bytes:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        go.wait(30)
        with lock:
            active[0] -= 1
        return claim.input.upper()

    ready = ReadyFile(tmp_path / "ready")
    with coordinator.client("pool-1") as client:
        pool = WorkerPool(
            client, handle, queues=["qa", "qb"], max_concurrent=2, ttl=TTL, readiness=[ready]
        )
        running = background.submit(pool.run)
        # Both handlers running (two claims on the server can come before the second
        # handler's thread starts), and no third claim while they hold their slots.
        eventually(lambda: active[0] == 2)
        assert list(states(producer).values()).count(TaskState.CLAIMED) == 2
        assert ready.path.exists()
        go.set()
        eventually(lambda: set(states(producer).values()) == {TaskState.DONE})
        report = stop(pool, running)
    assert peak[0] == 2
    assert report.endings == {Ending.COMMITTED: 4}
    assert {t: producer.get_result(t).result for t in ("a1", "b2")} == {"a1": b"A1", "b2": b"B2"}
    assert not ready.path.exists()


def test_a_lost_job_cancels_its_handler_and_nothing_is_committed(
    coordinator: Served, producer: WorkerClient, background: ThreadPoolExecutor
) -> None:
    producer.create_task("t1", queue="q", input=b"in")
    seen: Future[tuple[CancelReason | None, str]] = Future()

    def handle(claim: Claim, cancel: Cancellation) -> bytes:
        cancel.wait_for_cancelled(timedelta(seconds=30))
        seen.set_result((cancel.reason, cancel.detail))
        return b"too late"

    with coordinator.client("pool-1") as client:
        pool = WorkerPool(client, handle, queues=["q"], ttl=TTL)
        running = background.submit(pool.run)
        eventually(lambda: states(producer) == {"t1": TaskState.CLAIMED})
        producer.cancel_task("t1", reason="not needed")
        reason, detail = seen.result(timeout=30)
        eventually(lambda: pool_idle(running, pool))
        report = stop(pool, running)
    assert reason is CancelReason.LOST
    assert "CANCELLED" in detail
    assert report.endings == {Ending.LOST: 1}
    assert [a.end for a in producer.attempts("t1")] == [AttemptEnd.CANCELLED]


def pool_idle(running: Future[PoolReport], pool: WorkerPool) -> bool:
    """Whether the pool holds no claim (it is still running)."""
    assert not running.done()
    return pool.held() == 0


def test_a_handler_error_gives_the_task_back_and_the_next_attempt_commits(
    coordinator: Served, producer: WorkerClient, background: ThreadPoolExecutor
) -> None:
    producer.create_task("t1", queue="q", input=b"in")
    tries = [0]

    def handle(claim: Claim, cancel: Cancellation) -> bytes:
        tries[0] += 1
        if tries[0] == 1:
            raise ValueError("boom")
        return b"second time lucky"

    with coordinator.client("pool-1") as client:
        pool = WorkerPool(client, handle, queues=["q"], ttl=TTL)
        running = background.submit(pool.run)
        eventually(lambda: states(producer) == {"t1": TaskState.DONE})
        report = stop(pool, running)
    assert [a.end for a in producer.attempts("t1")] == [AttemptEnd.FAILED, AttemptEnd.COMMITTED]
    assert report.endings == {Ending.FAILED: 1, Ending.COMMITTED: 1}


def test_a_handler_that_failed_its_claim_itself_is_counted_failed_not_released(
    coordinator: Served, producer: WorkerClient, background: ThreadPoolExecutor
) -> None:
    """A poison input failed for good by the handler, which then returns None: the pool sent a
    Release the server refused FENCED/FAILED, logged "claim released, the task will be claimed
    again" (it will not) and counted it released."""
    producer.create_task("t1", queue="q", input=b"poison")

    def handle(claim: Claim, cancel: Cancellation) -> None:
        claim.fail("PoisonInput", retryable=False, message="cannot parse")

    with coordinator.client("pool-1") as client:
        pool = WorkerPool(client, handle, queues=["q"], ttl=TTL)
        running = background.submit(pool.run)
        eventually(lambda: states(producer) == {"t1": TaskState.FAILED})
        report = stop(pool, running)
    assert [(a.end, a.error_code) for a in producer.attempts("t1")] == [
        (AttemptEnd.FAILED, "PoisonInput")
    ]
    assert report.endings == {Ending.FAILED: 1}


def test_a_handler_returning_text_fails_its_attempt_and_frees_its_slot(
    coordinator: Served, producer: WorkerClient, background: ThreadPoolExecutor
) -> None:
    # Once the text reached the digest on the slot's thread, which died holding the slot: the
    # pool of one never claimed again and waited its whole grace at stop.
    now = TaskRetryPolicy(initial_backoff=ZERO)
    for task_id in ("t1", "t2"):
        producer.create_task(task_id, queue="q", input=task_id.encode(), retry_policy=now)
    tries: dict[str, int] = {}

    def handle(claim: Claim, cancel: Cancellation) -> Any:
        tries[claim.task_id] = tries.get(claim.task_id, 0) + 1
        text = claim.input.decode().upper()
        return text if tries[claim.task_id] == 1 else text.encode()

    with coordinator.client("pool-1") as client:
        pool = WorkerPool(client, handle, queues=["q"], max_concurrent=1, ttl=TTL)
        running = background.submit(pool.run)
        eventually(lambda: states(producer) == {"t1": TaskState.DONE, "t2": TaskState.DONE})
        report = stop(pool, running)
    for task_id in ("t1", "t2"):
        attempts = [(a.end, a.error_code) for a in producer.attempts(task_id)]
        assert attempts == [(AttemptEnd.FAILED, "TypeError"), (AttemptEnd.COMMITTED, "")]
        assert producer.get_result(task_id).result == task_id.upper().encode()
    assert report.endings == {Ending.FAILED: 2, Ending.COMMITTED: 2}


def test_a_handler_calling_sys_exit_fails_its_attempt_and_frees_its_slot(
    coordinator: Served, producer: WorkerClient, background: ThreadPoolExecutor
) -> None:
    # SystemExit once ended the slot's thread without a word, the claim renewed for good.
    producer.create_task("t1", queue="q", retry_policy=TaskRetryPolicy(initial_backoff=ZERO))
    tries = [0]

    def handle(claim: Claim, cancel: Cancellation) -> bytes:
        tries[0] += 1
        if tries[0] == 1:
            sys.exit("the handler gave up")
        return b"done"

    with coordinator.client("pool-1") as client:
        pool = WorkerPool(client, handle, queues=["q"], max_concurrent=1, ttl=TTL)
        running = background.submit(pool.run)
        eventually(lambda: states(producer) == {"t1": TaskState.DONE})
        report = stop(pool, running)
    attempts = [(a.end, a.error_code) for a in producer.attempts("t1")]
    assert attempts == [(AttemptEnd.FAILED, "SystemExit"), (AttemptEnd.COMMITTED, "")]
    assert report.endings == {Ending.FAILED: 1, Ending.COMMITTED: 1}


def test_a_fault_past_the_handler_frees_the_slot_and_leaves_the_claim_to_its_lease(
    coordinator: Served,
    producer: WorkerClient,
    background: ThreadPoolExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faults = [RuntimeError("a bug while settling")]
    real = settling.settle

    def settle(*args: Any, **kwargs: Any) -> Any:
        if faults:
            raise faults.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(pool_module, "settle", settle)
    producer.create_task("t1", queue="q", input=b"in")
    with coordinator.client("pool-1") as client:
        pool = WorkerPool(client, lambda claim, cancel: b"done", queues=["q"], ttl=TTL)
        running = background.submit(pool.run)
        # The slot went back to the claim loop: the task, expired, is claimed again and done.
        eventually(lambda: states(producer) == {"t1": TaskState.DONE}, timeout=20)
        report = stop(pool, running)
    assert [a.end for a in producer.attempts("t1")] == [AttemptEnd.EXPIRED, AttemptEnd.COMMITTED]
    assert report.endings == {Ending.UNSETTLED: 1, Ending.COMMITTED: 1}


def test_a_handler_error_reaches_job_fail_whole_and_retryable(
    coordinator: Served,
    producer: WorkerClient,
    background: ThreadPoolExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failed: list[tuple[object, bool]] = []

    def fail(
        claim: Claim, error: object, *, retryable: bool, message: str = "", shutdown: bool = False
    ) -> None:
        failed.append((error, retryable))
        claim.release("failed")  # what WorkerService.Fail does to a retryable failure, in short

    # Replaces the SDK's own claim.fail where it has one: the pool must call whichever is there.
    monkeypatch.setattr(Claim, "fail", fail, raising=False)
    producer.create_task("t1", queue="q", input=b"in")
    boom = ValueError("boom")

    def handle(claim: Claim, cancel: Cancellation) -> bytes:
        if not failed:
            raise boom
        return b"second time lucky"

    with coordinator.client("pool-1") as client:
        pool = WorkerPool(client, handle, queues=["q"], ttl=TTL)
        running = background.submit(pool.run)
        eventually(lambda: states(producer) == {"t1": TaskState.DONE})
        report = stop(pool, running)
    assert failed == [(boom, True)]
    assert report.endings == {Ending.FAILED: 1, Ending.COMMITTED: 1}


class LongPolling(WorkerClient):
    """The SDK's client, recording the wait of each ClaimNext the pool sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waits: list[Duration | None] = []

    def claim_next(
        self,
        queue: str = "default",
        *,
        ttl: Duration,
        on_lost: LostCallback | None = None,
        safety_margin: Duration | None = None,
        wait: Duration | None = None,
        abort: Abort | None = None,
    ) -> Claim | ClaimRefused:
        self.waits.append(wait)
        return super().claim_next(
            queue, ttl=ttl, on_lost=on_lost, safety_margin=safety_margin, wait=wait, abort=abort
        )


def test_the_pool_long_polls(
    coordinator: Served, producer: WorkerClient, background: ThreadPoolExecutor
) -> None:
    producer.create_task("t1", queue="q", input=b"in")
    with LongPolling(coordinator.target, principal="pool-1") as client:
        pool = WorkerPool(client, done, queues=["q"], ttl=TTL, long_poll=timedelta(seconds=3))
        running = background.submit(pool.run)
        eventually(lambda: states(producer) == {"t1": TaskState.DONE})
        stop(pool, running)
    assert client.waits and set(client.waits) == {timedelta(seconds=3)}


@pytest.mark.parametrize("run", range(5))
def test_a_shutdown_never_claims_the_task_it_just_gave_back(
    coordinator: Served, producer: WorkerClient, background: ThreadPoolExecutor, run: int
) -> None:
    # A free slot keeps the claim loop in a long poll when the stop comes; the claim cut off at
    # the grace becomes READY at once (no backoff): the poll must not win it back, and the
    # claim must not be left CLAIMED when run() returns (issue 29, seen on the asyncio pool).
    no_backoff = TaskRetryPolicy(initial_backoff=timedelta(0))
    producer.create_task("held", queue="q", input=b"in", retry_policy=no_backoff)

    started = threading.Event()

    def handle(claim: Claim, cancel: Cancellation) -> bytes | None:
        started.set()
        cancel.wait_for_cancelled(timedelta(seconds=60))
        return None

    with coordinator.client("pool-1") as client:
        pool = WorkerPool(
            client,
            handle,
            queues=["q"],
            max_concurrent=2,
            ttl=TTL,
            grace=timedelta(0),
            long_poll=timedelta(seconds=10),
        )
        running = background.submit(pool.run)
        assert started.wait(30)  # the pool holds the claim
        report = stop(pool, running)
    assert report.endings == {Ending.CUT_OFF: 1}
    assert states(producer) == {"held": TaskState.READY}
    assert [(a.end, a.error_code) for a in producer.attempts("held")] == [
        (AttemptEnd.FAILED, SHUTDOWN_ERROR)
    ]


def done(claim: Claim, cancel: Cancellation) -> bytes:
    """A handler that succeeds at once."""
    return b"done"


def test_readiness_endpoint_answers_200_while_claiming_then_503(
    coordinator: Served, background: ThreadPoolExecutor
) -> None:
    endpoint = ReadyEndpoint("127.0.0.1:0")
    url = f"http://127.0.0.1:{endpoint.port}/ready"
    try:
        assert status(url) == 503
        with coordinator.client("pool-1") as client:
            pool = WorkerPool(client, done, queues=["q"], ttl=TTL, readiness=[endpoint])
            running = background.submit(pool.run)
            eventually(lambda: status(url) == 200)
            stop(pool, running)
        assert status(url) == 503
    finally:
        endpoint.close()


def status(url: str) -> int:
    """The HTTP status of a GET (no proxy: loopback)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queues": []}, "give 1 to 32 distinct queues"),
        ({"queues": ["q", "q"]}, "give 1 to 32 distinct queues"),
        ({"queues": ["q"], "max_concurrent": 0}, "max_concurrent must be 1 to 256"),
        ({"queues": ["q"], "grace": timedelta(seconds=-1)}, "grace must not be negative"),
    ],
)
def test_bad_options_are_refused(
    coordinator: Served, options: dict[str, Any], message: str
) -> None:
    handler: Callable[[Claim, Cancellation], bytes] = done
    with coordinator.client("pool-1") as client, pytest.raises(InvalidArgument, match=message):
        WorkerPool(client, handler, **options)


def test_a_handler_that_outlives_its_lost_claim_is_said_and_a_pool_so_held_goes_unready(
    coordinator: Served,
    producer: WorkerClient,
    background: ThreadPoolExecutor,
    tmp_path: Path,
) -> None:
    """A handler deaf to its cancellation held its slot for good after its claim was lost: the
    pool claimed nothing more, stayed ready and said nothing. Past the grace it is logged,
    and with every slot so held the pool is unready until one is free again."""
    producer.create_task("t1", queue="q", input=b"in")
    finish = threading.Event()

    def deaf(claim: Claim, cancel: Cancellation) -> bytes:
        finish.wait(60)  # never looks at its cancellation
        return b"too late"

    ready = ReadyFile(tmp_path / "ready")
    with coordinator.client("pool-1") as client, capture_logs() as logs:
        pool = WorkerPool(
            client, deaf, queues=["q"], ttl=TTL, grace=timedelta(seconds=1), readiness=[ready]
        )
        running = background.submit(pool.run)
        try:
            eventually(lambda: states(producer) == {"t1": TaskState.CLAIMED})
            assert ready.path.exists()
            producer.cancel_task("t1", reason="not needed")  # the claim is lost
            eventually(lambda: not ready.path.exists(), message="still ready, every slot held")
            assert not running.done() and pool.held() == 1
            finish.set()  # the handler returns at last: its slot is free again
            eventually(ready.path.exists, message="not ready again")
        finally:
            finish.set()
            report = stop(pool, running)
    assert report.endings == {Ending.LOST: 1}
    said = [e["event"] for e in logs if e["event"] in (OUTLIVED, ALL_HELD, NOT_ALL_HELD)]
    assert said == [OUTLIVED, ALL_HELD, NOT_ALL_HELD]
