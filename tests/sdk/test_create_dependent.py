"""A producer creates a dependent task from the SDK (``depends_on``), as it could only with the
raw stubs or the CLI: WAITING until its upstream is DONE, then READY; and an asyncio producer
has the sync one's calls."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from coordinator.domain.states import AttemptEnd, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import ClaimRefused, TaskRetryPolicy
from coordinator.sdk.aio import AsyncWorkerClient
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.sdk.support import QUEUE, served

ONCE = TaskRetryPolicy(max_attempts=1)


def test_a_task_created_with_depends_on_waits_for_its_upstream(
    etcd: EtcdProcess, prefix: str
) -> None:
    with served(etcd.endpoint, prefix) as coordinator, coordinator.client("pm") as client:
        client.create_task("up", input=b"first", queue=QUEUE)
        waiting = client.create_task("down", input=b"then", queue=QUEUE, depends_on=["up"])
        assert (waiting.state, waiting.depends_on) == (TaskState.WAITING, ("up",))

        async def create_async() -> TaskState:
            aio = AsyncWorkerClient(
                coordinator.target, principal="pm", channel_options=GRPC_OPTIONS
            )
            try:
                made = await aio.create_task("down-2", queue=QUEUE, depends_on=["up", "down"])
                return made.state
            finally:
                await aio.close()

        assert asyncio.run(create_async()) is TaskState.WAITING
        claim = client.claim("up", ttl=timedelta(seconds=30))
        assert not isinstance(claim, ClaimRefused), claim
        with claim:
            assert claim.commit(b"done").committed
        eventually(lambda: client.get_task("down").state is TaskState.READY)
        assert client.get_task("down-2").state is TaskState.WAITING  # "down" is not DONE yet


def test_an_asyncio_agent_reads_and_changes_tasks_without_the_sync_client(
    etcd: EtcdProcess, prefix: str
) -> None:
    """What a sync producer can do beside create and get, an asyncio one can too, on its loop:
    an upstream's result, a dead letter's attempts, sending it back, a new input, a cancel."""
    with served(etcd.endpoint, prefix) as coordinator, coordinator.client("pm") as client:
        client.create_task("up", input=b"in", queue=QUEUE)
        done = client.claim("up", ttl=timedelta(seconds=30))
        assert not isinstance(done, ClaimRefused), done
        with done:
            assert done.commit(b"the answer").committed
        client.create_task("bad", input=b"x", queue=QUEUE, retry_policy=ONCE)
        failing = client.claim("bad", ttl=timedelta(seconds=30))
        assert not isinstance(failing, ClaimRefused), failing
        failing.fail(ValueError("bad row"), retryable=False)

        async def agent() -> list[object]:
            aio = AsyncWorkerClient(
                coordinator.target, principal="pm", channel_options=GRPC_OPTIONS
            )
            try:
                result = await aio.get_result("up")
                ends = [(a.attempt, a.end, a.error_code) async for a in aio.attempts("bad")]
                failed = [t.task_id async for t in aio.iter_tasks(queue=QUEUE, page_size=1)]
                back = await aio.retry_task("bad", reason="fixed")
                changed = await aio.update_input("bad", input=b"y", expected_revision=1)
                gone = await aio.cancel_task("bad", reason="not needed")
                return [result.result, ends, failed, back.state, changed.revision, gone.state]
            finally:
                await aio.close()

        assert asyncio.run(agent()) == [
            b"the answer",
            [(1, AttemptEnd.FAILED, "ValueError")],
            ["bad", "up"],
            TaskState.READY,
            2,
            TaskState.CANCELLED,
        ]
