"""TaskService: producers create, inspect, list, cancel and change tasks.

Thin like the other servicers: validate the whole request, call ``store.tasks``, convert the
records. The contract is in protos/coordinator/v1/tasks.proto.
"""

from __future__ import annotations

import grpc
import structlog

from coordinator.domain.validation import non_negative, priority, task_id
from coordinator.logging import bound
from coordinator.server import convert, validate
from coordinator.server.identity import principal_of
from coordinator.server.status import rpc
from coordinator.store import Store
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc

log = structlog.get_logger(__name__)


class TaskService(tasks_pb2_grpc.TaskServiceServicer):
    """Producer-side calls onto ``store.tasks`` (method names are the proto's: noqa N802)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    @rpc
    def CreateTask(  # noqa: N802
        self, request: tasks_pb2.CreateTaskRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.CreateTaskResponse:
        """Create a READY task."""
        validate.optional_task_id(request.task_id)
        queue = validate.queue_or_default(request.queue)
        priority(request.priority)
        digest = validate.input_payload("input", request.input, request.input_digest)
        principal = principal_of(context)
        spec = convert.task_spec(request, queue=queue, input_digest=digest)
        task = self._store.tasks.create(spec, by=principal)
        with bound(task_id=task.task_id, principal=principal):
            log.info("task created", queue=task.queue, input_digest=task.input_digest)
        return tasks_pb2.CreateTaskResponse(task=convert.task_to_proto(task))

    @rpc
    def GetTask(  # noqa: N802
        self, request: tasks_pb2.GetTaskRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.GetTaskResponse:
        """The task and every attempt of it."""
        tid = task_id(request.task_id)
        task = self._store.tasks.get(tid)
        attempts = self._store.tasks.attempts(tid)
        return tasks_pb2.GetTaskResponse(
            task=convert.task_to_proto(task),
            attempts=[convert.attempt_to_proto(a) for a in attempts],
        )

    @rpc
    def ListTasks(  # noqa: N802
        self, request: tasks_pb2.ListTasksRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.ListTasksResponse:
        """One page of tasks in id order."""
        tasks, token = self._store.tasks.list(
            queue=validate.queue_filter(request.queue),
            state=validate.state_filter(request.state),
            page_size=validate.page_size(request.page_size),
            page_token=validate.page_token(request.page_token),
        )
        return tasks_pb2.ListTasksResponse(
            tasks=[convert.task_to_proto(t) for t in tasks], next_page_token=token
        )

    @rpc
    def CancelTask(  # noqa: N802
        self, request: tasks_pb2.CancelTaskRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.CancelTaskResponse:
        """Cancel the task; a live claim's next acceptance point gets CANCELLED."""
        tid = task_id(request.task_id)
        reason = validate.text("reason", request.reason)
        principal = principal_of(context)
        task = self._store.tasks.cancel(tid, by=principal, reason=reason)
        with bound(task_id=tid, principal=principal):
            log.info("task cancelled", cancel_generation=task.cancel_generation, reason=reason)
        return tasks_pb2.CancelTaskResponse(task=convert.task_to_proto(task))

    @rpc
    def UpdateInput(  # noqa: N802
        self, request: tasks_pb2.UpdateInputRequest, context: grpc.ServicerContext
    ) -> tasks_pb2.UpdateInputResponse:
        """Replace the input (revision + 1); a live claim's commit gets STALE_INPUT."""
        tid = task_id(request.task_id)
        digest = validate.input_payload("input", request.input, request.input_digest)
        expected = non_negative("expected_revision", request.expected_revision)
        principal = principal_of(context)
        task = self._store.tasks.update_input(
            tid, data=request.input, input_digest=digest, expected_revision=expected, by=principal
        )
        with bound(task_id=tid, principal=principal):
            log.info("task input updated", revision=task.revision, input_digest=digest)
        return tasks_pb2.UpdateInputResponse(task=convert.task_to_proto(task))
