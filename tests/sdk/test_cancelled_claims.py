"""An asyncio claim call cancelled as its answer came (``asyncio.timeout`` around
``claim_next``, a TaskGroup, a shutdown): the answer was in, the coroutine had not resumed to
take it, and the claim it won stayed CLAIMED by nobody until its lease ran out, its attempt
counted. Now the transport hands such an answer on (sdk/aio/_rpc.py ``_answer``) and the client
gives its claims back at once, uncounted (sdk/aio/unheard.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from coordinator.domain.states import AttemptEnd, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk.aio import AsyncWorkerClient
from coordinator.sdk.aio._rpc import _answer
from coordinator.sdk.aio.unheard import UNHEARD
from coordinator.v1 import worker_pb2
from tests.conftest import GRPC_OPTIONS
from tests.sdk.support import QUEUE, served_with_task


class _Call:
    """A call whose answer the test sets: done, cancelled and awaitable as a grpc.aio call."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def __await__(self) -> Any:
        return self.answer.__await__()

    def done(self) -> bool:
        return self.answer.done()

    def cancelled(self) -> bool:
        return self.answer.cancelled()


@pytest.mark.parametrize("answered", [True, False], ids=["answer-in", "answer-not-yet"])
def test_an_answer_that_came_as_its_caller_was_cancelled_is_handed_on(answered: bool) -> None:
    async def race() -> list[str]:
        heard: list[str] = []
        call = _Call()
        waiting = asyncio.ensure_future(_answer(call, heard.append))
        await asyncio.sleep(0)  # the caller awaits the call
        if answered:
            call.answer.set_result("claimed t1")  # in, the caller not resumed yet...
        waiting.cancel()  # ...when the cancellation comes
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert call.cancelled() is not answered  # not answered yet: the call is cancelled
        return heard

    assert asyncio.run(race()) == (["claimed t1"] if answered else [])


def test_an_unheard_claim_is_given_back_at_once_and_not_counted(
    etcd: EtcdProcess, prefix: str
) -> None:
    with served_with_task(etcd.endpoint, prefix) as coordinator:

        async def unheard() -> None:
            client = AsyncWorkerClient(
                coordinator.target, principal="agent", channel_options=GRPC_OPTIONS
            )
            request = worker_pb2.ClaimNextRequest(
                queue=QUEUE, scheduler_epoch=await client.epoch(), ttl_seconds=60
            )
            response = await client._rpc.call(client._rpc.worker.ClaimNext, request)
            assert coordinator.store.tasks.get("t1").state is TaskState.CLAIMED
            client._unheard.give_back(response)  # what the transport does with such an answer
            await client.close()  # waits for the give-back

        asyncio.run(unheard())
        task = coordinator.store.tasks.get("t1")
        # At once (not after the 60 s lease), as a shutdown: not counted.
        assert (task.state, task.attempt, task.attempt - task.attempts_base) == (
            TaskState.READY,
            1,
            0,
        )
        (attempt,) = coordinator.store.tasks.attempts("t1")
        assert (attempt.end, attempt.error_code, attempt.error_message) == (
            AttemptEnd.FAILED,
            "WorkerShutdown",
            UNHEARD,
        )
