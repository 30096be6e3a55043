"""AsyncWorkerPool on an event loop of its own (tests/sdk/both.py's LoopThread) against a real
coordinator: a pool of one, a loss cancelling the handler task, an error given back, and the
shutdown: no claim after stop, handlers finishing within the grace, the rest (one deaf to its
cancellation) cut off at the grace and given back as retryable failures."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from coordinator import lifeline
from coordinator.domain.states import AttemptEnd, TaskState
from coordinator.errors import InvalidArgument
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Ending, PoolReport, ReadyFile, TaskRetryPolicy, WorkerClient
from coordinator.sdk.aio import AsyncClaim, AsyncWorkerClient, AsyncWorkerPool
from coordinator.sdk.aio.pool import stop_on_signals
from coordinator.sdk.pool import SHUTDOWN_ERROR
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.pool.support import RecordedPool
from tests.sdk.both import LoopThread
from tests.sdk.support import Served, served

TTL = timedelta(seconds=2)  # renewed every 2/3 s: a loss is noticed quickly
NO_BACKOFF = TaskRetryPolicy(initial_backoff=timedelta(0))
AsyncHandlerFn = Callable[[AsyncClaim], Coroutine[Any, Any, bytes | None]]


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


class Pools:
    """Builds AsyncWorkerPools on a loop of their own and drives them from the test."""

    def __init__(self, target: str) -> None:
        self.loop = LoopThread()

        async def connect() -> AsyncWorkerClient:  # a grpc.aio channel is made on its loop
            return AsyncWorkerClient(target, principal="pool-1", channel_options=GRPC_OPTIONS)

        self.client = self.loop.run(connect())

    def start(self, handler: AsyncHandlerFn, **options: Any) -> tuple[AsyncWorkerPool, Future[Any]]:
        """A pool of ``handler`` (``ttl`` TTL, queue q unless given), running. Its long polls
        are short: a stopped pool waits for the one in flight (whatever it wins is given back)."""
        options.setdefault("queues", ["q"])
        options.setdefault("long_poll", timedelta(seconds=1))
        pool = AsyncWorkerPool(self.client, handler, ttl=TTL, **options)
        return pool, asyncio.run_coroutine_threadsafe(pool.run(), self.loop.loop)

    def stop(self, pool: AsyncWorkerPool) -> None:
        """``pool.stop()`` on its loop."""
        self.loop.loop.call_soon_threadsafe(pool.stop)

    def call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the loop (e.g. set an asyncio.Event)."""
        self.loop.loop.call_soon_threadsafe(fn)

    def close(self) -> None:
        """Close the client, then the loop."""
        self.loop.run(self.client.close())
        self.loop.close()


@pytest.fixture
def pools(coordinator: Served) -> Iterator[Pools]:
    """Async pools on their own loop, closed after the test."""
    made = Pools(coordinator.target)
    try:
        yield made
    finally:
        made.close()


def states(client: WorkerClient) -> dict[str, TaskState]:
    """Every task's state, by id."""
    return {t.task_id: t.state for t in client.list_tasks()}


def stopped(pools: Pools, pool: AsyncWorkerPool, running: Future[Any]) -> PoolReport:
    """Stop the pool and wait for its report."""
    pools.stop(pool)
    report: PoolReport = running.result(timeout=60)
    return report


def test_a_pool_of_one_runs_one_claim_at_a_time_and_commits_each(
    pools: Pools, producer: WorkerClient, tmp_path: Path
) -> None:
    for task_id in ("a1", "a2", "a3"):
        producer.create_task(task_id, queue="q", input=task_id.encode())
    gate = asyncio.Event()
    active, peak = [0], [0]

    async def handle(claim: AsyncClaim) -> bytes:
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        await gate.wait()
        active[0] -= 1
        return claim.input.upper()

    ready = ReadyFile(tmp_path / "ready")
    pool, running = pools.start(handle, readiness=[ready])
    eventually(lambda: list(states(producer).values()).count(TaskState.CLAIMED) == 1)
    # The task is CLAIMED in etcd before its answer reaches the pool (the server stores the
    # answer of a keyed claim first): wait for the pool to hold it.
    eventually(lambda: pool.held() == 1)
    assert ready.path.exists()
    pools.call(gate.set)
    eventually(lambda: set(states(producer).values()) == {TaskState.DONE})
    report = stopped(pools, pool, running)
    assert peak[0] == 1
    assert report.endings == {Ending.COMMITTED: 3}
    assert producer.get_result("a2").result == b"A2"
    assert not ready.path.exists()


def test_a_lost_claim_cancels_its_handler_task_and_nothing_is_committed(
    pools: Pools, producer: WorkerClient
) -> None:
    producer.create_task("t1", queue="q", input=b"in")
    cancelled: list[str] = []

    async def handle(claim: AsyncClaim) -> bytes:
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError as exc:
            cancelled.append(str(exc.args[0]) if exc.args else "")
            raise
        return b"never"

    pool, running = pools.start(handle)
    eventually(lambda: states(producer) == {"t1": TaskState.CLAIMED})
    producer.cancel_task("t1", reason="not needed")
    eventually(lambda: cancelled and pool.held() == 0)
    report = stopped(pools, pool, running)
    assert len(cancelled) == 1 and cancelled[0].startswith("claim lost: CANCELLED")
    assert report.endings == {Ending.LOST: 1}
    assert [a.end for a in producer.attempts("t1")] == [AttemptEnd.CANCELLED]


def test_a_handler_error_is_a_retryable_failure_and_the_next_attempt_commits(
    pools: Pools, producer: WorkerClient
) -> None:
    producer.create_task("t1", queue="q", input=b"in", retry_policy=NO_BACKOFF)
    tries = [0]

    async def handle(claim: AsyncClaim) -> bytes:
        tries[0] += 1
        if tries[0] == 1:
            raise ValueError("boom")
        return b"second time lucky"

    pool, running = pools.start(handle)
    eventually(lambda: states(producer) == {"t1": TaskState.DONE})
    report = stopped(pools, pool, running)
    attempts = list(producer.attempts("t1"))
    assert [(a.end, a.error_code) for a in attempts] == [
        (AttemptEnd.FAILED, "ValueError"),
        (AttemptEnd.COMMITTED, ""),
    ]
    assert report.endings == {Ending.FAILED: 1, Ending.COMMITTED: 1}


def test_hurry_cuts_the_grace_short(pools: Pools, producer: WorkerClient) -> None:
    # What a second SIGTERM does (stop_on_signals); an hour of grace is not waited out.
    producer.create_task("slow", queue="q", input=b"slow", retry_policy=NO_BACKOFF)

    async def handle(claim: AsyncClaim) -> bytes:
        await asyncio.Event().wait()  # never finishes by itself
        return b"never"

    pool, running = pools.start(handle, grace=timedelta(hours=1))
    eventually(lambda: states(producer) == {"slow": TaskState.CLAIMED})
    pools.stop(pool)
    pools.call(pool.hurry)
    report: PoolReport = running.result(timeout=60)
    assert report.endings == {Ending.CUT_OFF: 1}
    assert [(a.end, a.error_code) for a in producer.attempts("slow")] == [
        (AttemptEnd.FAILED, SHUTDOWN_ERROR)
    ]


def test_stop_claims_nothing_more_lets_handlers_finish_then_cuts_off_at_the_grace(
    pools: Pools, producer: WorkerClient, tmp_path: Path
) -> None:
    for task_id in ("fast", "slow", "deaf"):
        producer.create_task(task_id, queue="q", input=task_id.encode(), retry_policy=NO_BACKOFF)
    finish, release_deaf = asyncio.Event(), asyncio.Event()
    seen: dict[str, str] = {}

    async def handle(claim: AsyncClaim) -> bytes:
        kind = claim.input.decode()
        try:
            if kind == "fast":
                await finish.wait()
                return b"fast done"
            await asyncio.Event().wait()  # never finishes by itself
        except asyncio.CancelledError:
            seen[kind] = "cancelled"
            if kind == "slow":
                raise
        # Deaf to its cancellation: carries on until the test lets it go.
        await release_deaf.wait()
        seen[kind] = "returned"
        return b"deaf finished anyway"

    ready = ReadyFile(tmp_path / "ready")
    grace = timedelta(seconds=3)
    pool, running = pools.start(handle, max_concurrent=3, grace=grace, readiness=[ready])
    eventually(lambda: list(states(producer).values()).count(TaskState.CLAIMED) == 3)
    pools.stop(pool)
    eventually(lambda: not ready.path.exists())  # unready at once, before the handlers end
    producer.create_task("late", queue="q", input=b"late")
    pools.call(finish.set)  # within the grace: its result is committed
    report: PoolReport = running.result(timeout=60)
    assert report.endings == {Ending.COMMITTED: 1, Ending.CUT_OFF: 2}
    assert seen == {"slow": "cancelled", "deaf": "cancelled"}
    task_states = states(producer)
    assert task_states["fast"] is TaskState.DONE
    for task_id in ("slow", "deaf"):
        assert task_states[task_id] is TaskState.READY
        assert [(a.end, a.error_code) for a in producer.attempts(task_id)] == [
            (AttemptEnd.FAILED, SHUTDOWN_ERROR)
        ]
    # A slot came free after the stop (fast's): nothing was claimed with it.
    assert task_states["late"] is TaskState.READY
    assert producer.get_task("late").attempt == 0
    pools.call(release_deaf.set)  # the deaf handler returns now: too late to commit
    eventually(lambda: seen.get("deaf") == "returned")
    assert states(producer)["deaf"] is TaskState.READY


@pytest.mark.parametrize("run", range(5))
def test_a_shutdown_never_claims_the_task_it_just_gave_back(
    pools: Pools, producer: WorkerClient, run: int
) -> None:
    # A free slot keeps the claim loop in a long poll when the stop comes; the claim cut off at
    # the grace becomes READY at once (no backoff): the poll must not win it back. Repeated,
    # since the race was lost 2 runs in 5 (issue 29).
    producer.create_task("held", queue="q", input=b"in", retry_policy=NO_BACKOFF)

    started: list[str] = []

    async def handle(claim: AsyncClaim) -> bytes:
        started.append(claim.task_id)
        await asyncio.Event().wait()  # until cut off
        return b"never"

    pool, running = pools.start(
        handle, max_concurrent=2, grace=timedelta(0), long_poll=timedelta(seconds=10)
    )
    eventually(lambda: started == ["held"])  # the pool holds the claim
    report = stopped(pools, pool, running)
    assert report.endings == {Ending.CUT_OFF: 1}
    assert states(producer) == {"held": TaskState.READY}
    assert [(a.end, a.error_code) for a in producer.attempts("held")] == [
        (AttemptEnd.FAILED, SHUTDOWN_ERROR)
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queues": []}, "give 1 to 32 distinct queues"),
        ({"queues": ["q", "q"]}, "give 1 to 32 distinct queues"),
        ({"max_concurrent": 0}, "max_concurrent must be 1 to 256"),
        ({"grace": timedelta(seconds=-1)}, "grace must not be negative"),
    ],
)
def test_bad_options_are_refused(pools: Pools, options: dict[str, Any], message: str) -> None:
    async def handle(claim: AsyncClaim) -> bytes:
        return b""

    options.setdefault("queues", ["q"])
    with pytest.raises(InvalidArgument, match=message):
        AsyncWorkerPool(pools.client, handle, **options)


def test_stop_on_signals_stops_at_the_first_signal_and_hurries_at_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each signal here comes at once after the last: none is a repeat (tests/pool/test_signals.py).
    monkeypatch.setattr("coordinator.sdk._signals.DUPLICATE_WINDOW", 0.0)
    pool = RecordedPool()

    async def signalled() -> None:
        restore = stop_on_signals(cast(AsyncWorkerPool, pool))
        try:
            for signum, count in ((signal.SIGTERM, 1), (signal.SIGINT, 2), (signal.SIGTERM, 3)):
                os.kill(os.getpid(), signum)  # the loop's handler takes it: the test runs on
                for _ in range(200):
                    if len(pool.calls) == count:
                        break
                    await asyncio.sleep(0.01)
        finally:
            restore()

    asyncio.run(signalled())
    assert pool.calls == ["stop", "hurry", "hurry"]
    # The handlers are gone again: the default SIGTERM handler is back.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_handler_that_outlives_its_lost_claim_makes_a_pool_so_held_unready(
    pools: Pools, producer: WorkerClient, tmp_path: Path
) -> None:
    """As with the thread pool (tests/pool/test_pool.py): a handler that swallows its
    cancellation holds its slot past its lost claim; with every slot so held the pool is
    unready until one is free again."""
    producer.create_task("t1", queue="q", input=b"in")
    finish = asyncio.Event()

    async def deaf(claim: AsyncClaim) -> bytes:
        while not finish.is_set():
            try:
                await finish.wait()
            except asyncio.CancelledError:
                continue  # swallowed, on purpose
        return b"too late"

    ready = ReadyFile(tmp_path / "ready")
    pool, running = pools.start(deaf, grace=timedelta(seconds=1), readiness=[ready])
    try:
        eventually(lambda: states(producer) == {"t1": TaskState.CLAIMED})
        eventually(ready.path.exists)
        producer.cancel_task("t1", reason="not needed")  # the claim is lost
        eventually(lambda: not ready.path.exists(), message="still ready, every slot held")
        assert not running.done()
        pools.call(finish.set)  # the handler returns at last: its slot is free again
        eventually(ready.path.exists, message="not ready again")
    finally:
        pools.call(finish.set)
        report = stopped(pools, pool, running)
    assert report.endings == {Ending.LOST: 1}


HUNG_AFTER_STOP = """
import asyncio, sys
from coordinator.sdk.aio.pool import stop_on_signals

class Stopped:  # a pool whose run() has returned
    stopped = True
    def stop(self): print("stop", flush=True)
    def hurry(self): print("hurry", flush=True)

async def deaf():
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue  # swallowed: asyncio.run() waits for it for ever at the loop's end

async def main():
    stop_on_signals(Stopped())
    asyncio.get_running_loop().create_task(deaf())
    await asyncio.sleep(0)
    print("hung", flush=True)

asyncio.run(main())
"""


def test_a_signal_after_the_pool_stopped_ends_a_process_a_deaf_handler_holds(
    tmp_path: Path,
) -> None:
    """A handler that swallows CancelledError keeps asyncio.run() waiting at the loop's end;
    the pool's signal handlers used to stay and only log "the grace cut short", so nothing but
    SIGKILL ended the process. Once the pool has stopped, a signal ends it."""
    script = tmp_path / "hung.py"
    script.write_text(HUNG_AFTER_STOP)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lifeline.kill_with_parent(proc.pid)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "hung\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
        out, err = proc.communicate()
        lines = (out + err).splitlines()
        assert "stop" not in lines and "hurry" not in lines  # nothing left to stop
        assert any("pool already stopped: the signal ends the process" in line for line in lines)
    finally:
        proc.kill()
