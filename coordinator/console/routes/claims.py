"""The live claims page: every CLAIMED task with its holder, generation, attempt and epoch.

The wire has no lease expiry per task (a claim's lease lives in etcd, not in the task record),
so the page shows when the claim was made (the task's updated_at) and, with scripts on, how
long it has been held; the table refreshes itself every few seconds."""

from __future__ import annotations

from starlette.requests import Request

from coordinator.console.routes.common import Context
from coordinator.console.settings import ConsoleSettings
from coordinator.sdk._rpc import Rpc
from coordinator.v1 import tasks_pb2, types_pb2


def claims(request: Request, rpc: Rpc, settings: ConsoleSettings) -> Context:
    """One page of live claims, optionally of one queue."""
    queue = request.query_params.get("queue", "")[:64]
    token = request.query_params.get("page_token", "")[:128]
    reply = rpc.call(
        rpc.tasks.ListTasks,
        tasks_pb2.ListTasksRequest(
            state=types_pb2.TASK_STATE_CLAIMED,
            queue=queue,
            page_size=settings.page_size,
            page_token=token,
        ),
    )
    return {"queue": queue, "claims": reply.tasks, "next_page_token": reply.next_page_token}
