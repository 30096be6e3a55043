"""A producer creates a dependent task from the SDK (``depends_on``), as it could only with the
raw stubs or the CLI: WAITING until its upstream is DONE, then READY."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from coordinator.domain.states import TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import ClaimRefused
from coordinator.sdk.aio import AsyncWorkerClient
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.sdk.support import QUEUE, served


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
