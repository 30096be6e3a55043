"""AsyncProducerCalls: the asyncio twin of ``ProducerCalls`` (sdk/producer.py), the calls that
read and change tasks beside ``AsyncWorkerClient``'s create and get: an asyncio agent reads an
upstream's result or a dead letter's attempts without blocking its loop. The requests are the
sync calls' own (sdk/_core/requests.py); the lists are async iterators, a page at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator

from coordinator.domain.states import TaskState
from coordinator.sdk._core.requests import (
    list_tasks_request,
    retry_task_request,
    update_input_request,
)
from coordinator.sdk._duration import Duration
from coordinator.sdk.aio._rpc import AsyncRpc
from coordinator.sdk.tasks import AttemptInfo, ResultInfo, TaskInfo
from coordinator.v1 import tasks_pb2


class AsyncProducerCalls:
    """A producer's calls on an asyncio client's connection (``AsyncWorkerClient`` is one)."""

    _rpc: AsyncRpc

    async def get_result(self, task_id: str, revision: int = 0) -> ResultInfo:
        """The canonical result of a task revision (0: its current one), with the attempt and
        fence that committed it. Raises NotFound for an unknown task or a revision without one."""
        request = tasks_pb2.GetResultRequest(task_id=task_id, revision=revision)
        response = await self._rpc.call(self._rpc.tasks.GetResult, request)
        return ResultInfo.from_proto(response.result)

    async def attempts(self, task_id: str, *, page_size: int = 100) -> AsyncIterator[AttemptInfo]:
        """Every attempt of the task, oldest first, read a page at a time as you iterate."""
        token = ""
        while True:
            request = tasks_pb2.ListAttemptsRequest(
                task_id=task_id, page_size=page_size, page_token=token
            )
            response = await self._rpc.call(self._rpc.tasks.ListAttempts, request)
            for attempt in response.attempts:
                yield AttemptInfo.from_proto(attempt)
            token = response.next_page_token
            if not token:
                return

    async def iter_tasks(
        self,
        *,
        queue: str = "",
        state: TaskState | None = None,
        blocked: bool = False,
        overdue: bool = False,
        page_size: int = 100,
    ) -> AsyncIterator[TaskInfo]:
        """The tasks of ``queue`` (all if empty) in ``state`` (any if None), by id, a page at a
        time; ``blocked``: a dead letter's WAITING dependents; ``overdue``: tasks marked so."""
        token = ""
        while True:
            request = list_tasks_request(
                queue=queue,
                state=state,
                blocked=blocked,
                overdue=overdue,
                page_size=page_size,
                token=token,
            )
            response = await self._rpc.call(self._rpc.tasks.ListTasks, request)
            for task in response.tasks:
                yield TaskInfo.from_proto(task)
            token = response.next_page_token
            if not token:
                return

    async def cancel_task(self, task_id: str, *, reason: str = "") -> TaskInfo:
        """Cancel a task: a live claim's next renew, authorize or commit gets CANCELLED."""
        request = tasks_pb2.CancelTaskRequest(task_id=task_id, reason=reason)
        return TaskInfo.from_proto((await self._rpc.call(self._rpc.tasks.CancelTask, request)).task)

    async def update_input(
        self, task_id: str, *, input: bytes, expected_revision: int = 0
    ) -> TaskInfo:
        """Replace a task's input: revision + 1, READY; a live claim's commit then gets
        STALE_INPUT. ``expected_revision`` (non-zero) makes it conditional."""
        request = update_input_request(task_id, input, expected_revision)
        response = await self._rpc.call(self._rpc.tasks.UpdateInput, request)
        return TaskInfo.from_proto(response.task)

    async def retry_task(
        self, task_id: str, *, reason: str = "", schedule_to_close: Duration | None = None
    ) -> TaskInfo:
        """Send a FAILED task back to READY with a fresh attempt budget (pm or admin);
        ``schedule_to_close``: a new deadline, that long from now."""
        request = retry_task_request(task_id, reason, schedule_to_close)
        response = await self._rpc.call(self._rpc.tasks.RetryTask, request)
        return TaskInfo.from_proto(response.task)
