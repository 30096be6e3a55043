"""An idle pool long-polls: about one ClaimNext per wait period, whichever pool (threads or
asyncio), counted by the server's own metrics rather than timed.

Each ClaimNext on an empty queue waits its full period on the server, and the pool sends the
next one at once, so over an interval of E seconds at most E / wait + 1 calls end, and at least
E / wait - 1 do (the pool adds no backoff of its own to a poll that waited). The pool's backoff
for an empty answer is made tiny here, so a pool that stopped long-polling would send tens of
calls a second and break the upper bound; one that slept between polls breaks the lower one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.sdk import Cancellation, Claim, PollBackoff, WorkerPool
from coordinator.sdk.aio import AsyncClaim, AsyncWorkerClient, AsyncWorkerPool
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.sdk.both import LoopThread
from tests.sdk.support import Served, served

WAIT = timedelta(seconds=1)
QUICK = PollBackoff(initial=timedelta(milliseconds=10), maximum=timedelta(milliseconds=20))
CLAIM_NEXT = "/coordinator.v1.WorkerService/ClaimNext"
PERIODS = 4


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str, metrics: Metrics) -> Iterator[Served]:
    """A coordinator on this test's prefix counting on this test's own metrics."""
    with served(etcd.endpoint, prefix, metrics=metrics) as running:
        yield running


def sync_pool(coordinator: Served) -> Generator[Callable[[], None], None, None]:
    """An idle thread pool, running until the returned stop is called."""

    def handle(claim: Claim, cancel: Cancellation) -> bytes:
        return b""

    with coordinator.client("pool-1") as client, ThreadPoolExecutor(max_workers=1) as runner:
        pool = WorkerPool(client, handle, queues=["idle"], poll=QUICK, long_poll=WAIT)
        running = runner.submit(pool.run)

        def stop() -> None:
            pool.stop()
            running.result(timeout=30)

        try:
            yield stop
        finally:
            pool.stop()  # idempotent: the runner's exit must not wait for a running pool


def async_pool(coordinator: Served) -> Generator[Callable[[], None], None, None]:
    """An idle asyncio pool on a loop of its own, running until the returned stop is called."""

    async def handle(claim: AsyncClaim) -> bytes:
        return b""

    loop = LoopThread()

    async def start() -> tuple[AsyncWorkerClient, AsyncWorkerPool, Future[Any]]:
        client = AsyncWorkerClient(
            coordinator.target, principal="pool-1", channel_options=GRPC_OPTIONS
        )
        pool = AsyncWorkerPool(client, handle, queues=["idle"], poll=QUICK, long_poll=WAIT)
        return client, pool, asyncio.run_coroutine_threadsafe(pool.run(), loop.loop)

    client, pool, running = loop.run(start())

    def stop() -> None:
        loop.loop.call_soon_threadsafe(pool.stop)
        running.result(timeout=30)

    try:
        yield stop
    finally:
        loop.loop.call_soon_threadsafe(pool.stop)
        loop.run(client.close())
        loop.close()


@pytest.mark.parametrize("make_pool", [sync_pool, async_pool], ids=["threads", "asyncio"])
def test_an_idle_pool_sends_about_one_claim_next_per_wait_period(
    coordinator: Served,
    metrics: Metrics,
    make_pool: Callable[[Served], Generator[Callable[[], None], None, None]],
) -> None:
    def calls() -> int:
        value = metrics.registry.get_sample_value(
            "coordinator_rpc_duration_seconds_count", {"method": CLAIM_NEXT}
        )
        return int(value or 0)

    pool = make_pool(coordinator)
    stop = next(pool)
    try:
        first = eventually(calls, timeout=15, message="the pool sent no ClaimNext")
        started = time.monotonic()
        last = eventually(
            lambda: calls() if calls() >= first + PERIODS else None,
            timeout=PERIODS * WAIT.total_seconds() * 3 + 10,
            message=f"fewer than {PERIODS} more ClaimNext calls",
        )
        elapsed = time.monotonic() - started
        stop()
    finally:
        pool.close()
    periods = elapsed / WAIT.total_seconds()
    assert periods - 1 <= last - first <= periods + 1, (last - first, elapsed)
