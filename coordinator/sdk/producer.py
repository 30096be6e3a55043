"""ProducerCalls: the calls that create and read tasks (TaskService), which a ``WorkerClient``
offers next to its claims; an operator's calls are apart, behind ``client.admin``
(sdk/admin.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from coordinator.domain.states import TaskState
from coordinator.errors import AlreadyExists, NotFound
from coordinator.sdk._core.flows import CreateCall, Flow, ReadTask, create_or_existing
from coordinator.sdk._core.requests import (
    create_request,
    list_tasks_request,
    retry_task_request,
    update_input_request,
)
from coordinator.sdk._duration import Duration
from coordinator.sdk._rpc import Rpc
from coordinator.sdk.tasks import AttemptInfo, ResultInfo, TaskInfo, TaskRetryPolicy
from coordinator.v1 import tasks_pb2


class ProducerCalls:
    """A producer's calls on a client's connection (``WorkerClient`` is one): create a task,
    read it, its attempts and result, list, cancel, change its input, retry it."""

    _rpc: Rpc

    def create_task(
        self,
        task_id: str = "",
        *,
        input: bytes = b"",
        queue: str = "default",
        priority: int = 0,
        requires_review: bool = False,
        non_replayable: bool = False,
        idempotency_key: str = "",
        retry_policy: TaskRetryPolicy | None = None,
        not_before: datetime | None = None,
        schedule_to_close: Duration | None = None,
        depends_on: Sequence[str] | None = (),
    ) -> TaskInfo:
        """Create a READY task; an empty ``task_id`` lets the server generate one.

        ``retry_policy`` sets how often it is tried (unset fields: the queue's, else the
        server's defaults); ``not_before`` keeps it DELAYED until then; ``depends_on`` keeps it
        WAITING until those tasks are DONE (a FAILED or CANCELLED one marks it blocked); past
        ``schedule_to_close`` from now it is FAILED (TIMED_OUT) whatever runs.

        Retried on transport errors only with an explicit id or an ``idempotency_key`` (a
        retry with neither could create a second task; with a key the server answers a retry
        whose first try landed with that try's response, generated id included). With an id,
        an existing task of the same queue and input digest is returned instead of
        AlreadyExists, so a retry whose first try landed is harmless.
        """
        request = create_request(
            task_id,
            input=input,
            queue=queue,
            priority=priority,
            requires_review=requires_review,
            non_replayable=non_replayable,
            retry_policy=retry_policy,
            not_before=not_before,
            schedule_to_close=schedule_to_close,
            depends_on=depends_on,
        )
        flow = Flow(create_or_existing(task_id, request, idempotency_key))
        while (step := flow.step) is not None:
            flow.answer(self._create_step(step))
        return flow.result

    def _create_step(self, step: CreateCall | ReadTask) -> Any:
        """Perform one step of ``create_or_existing``; the refusal it decides on as a value."""
        if isinstance(step, ReadTask):
            try:
                return self.get_task(step.task_id)
            except NotFound:
                return None
        try:
            return self._rpc.call(
                self._rpc.tasks.CreateTask,
                step.request,
                retry=step.retry,
                idempotency_key=step.idempotency_key,
                hint=step.hint,
            )
        except AlreadyExists as taken:
            return taken

    def get_task(self, task_id: str) -> TaskInfo:
        """The task and its latest attempts, oldest first (at most 20: ``task.attempt`` counts
        them all, ``attempts()`` reads every one). Raises NotFound for an unknown id."""
        response = self._rpc.call(
            self._rpc.tasks.GetTask, tasks_pb2.GetTaskRequest(task_id=task_id)
        )
        return TaskInfo.from_proto(response.task, tuple(response.attempts))

    def get_result(self, task_id: str, revision: int = 0) -> ResultInfo:
        """The canonical result of a task revision (0: its current revision), with the attempt
        and fence that committed it: what a reviewer accepts (pm/admin). Raises NotFound for an
        unknown task or a revision without a committed result."""
        request = tasks_pb2.GetResultRequest(task_id=task_id, revision=revision)
        return ResultInfo.from_proto(self._rpc.call(self._rpc.tasks.GetResult, request).result)

    def attempts(self, task_id: str, *, page_size: int = 100) -> Iterator[AttemptInfo]:
        """Every attempt of the task, oldest first, read a page at a time as you iterate."""
        token = ""
        while True:
            request = tasks_pb2.ListAttemptsRequest(
                task_id=task_id, page_size=page_size, page_token=token
            )
            response = self._rpc.call(self._rpc.tasks.ListAttempts, request)
            yield from (AttemptInfo.from_proto(a) for a in response.attempts)
            token = response.next_page_token
            if not token:
                return

    def list_tasks(
        self,
        *,
        queue: str = "",
        state: TaskState | None = None,
        blocked: bool = False,
        overdue: bool = False,
        page_size: int = 100,
    ) -> list[TaskInfo]:
        """Every task of ``queue`` (all queues if empty) in ``state`` (any if None), by id;
        ``blocked``: only WAITING tasks blocked by a FAILED or CANCELLED upstream (a dead
        letter's dependents); ``overdue``: only tasks marked overdue (ListTasksRequest). Holds
        them all: ``iter_tasks`` reads the same a page at a time."""
        return list(
            self.iter_tasks(
                queue=queue, state=state, blocked=blocked, overdue=overdue, page_size=page_size
            )
        )

    def iter_tasks(
        self,
        *,
        queue: str = "",
        state: TaskState | None = None,
        blocked: bool = False,
        overdue: bool = False,
        page_size: int = 100,
    ) -> Iterator[TaskInfo]:
        """``list_tasks``'s tasks, read ``page_size`` (at most 1000) at a time as they are
        consumed: a queue of any size without holding it."""
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
            response = self._rpc.call(self._rpc.tasks.ListTasks, request)
            yield from (TaskInfo.from_proto(t) for t in response.tasks)
            token = response.next_page_token
            if not token:
                return

    def cancel_task(self, task_id: str, *, reason: str = "") -> TaskInfo:
        """Cancel a task: a live claim's next renew, authorize or commit gets CANCELLED."""
        request = tasks_pb2.CancelTaskRequest(task_id=task_id, reason=reason)
        return TaskInfo.from_proto(self._rpc.call(self._rpc.tasks.CancelTask, request).task)

    def update_input(self, task_id: str, *, input: bytes, expected_revision: int = 0) -> TaskInfo:
        """Replace a task's input (producer): revision + 1, READY; a live claim's commit then
        gets STALE_INPUT. ``expected_revision`` (non-zero) makes it conditional."""
        request = update_input_request(task_id, input, expected_revision)
        return TaskInfo.from_proto(self._rpc.call(self._rpc.tasks.UpdateInput, request).task)

    def retry_task(
        self, task_id: str, *, reason: str = "", schedule_to_close: Duration | None = None
    ) -> TaskInfo:
        """Send a FAILED task back to READY with a fresh attempt budget (pm or admin).

        ``schedule_to_close`` gives it a new deadline, that long from now; a task whose own
        deadline passed (TIMED_OUT) needs one (FailedPrecondition without)."""
        request = retry_task_request(task_id, reason, schedule_to_close)
        return TaskInfo.from_proto(self._rpc.call(self._rpc.tasks.RetryTask, request).task)
