"""The inbox: what waits for a person. Tasks in REVIEW with the committed result of the
revision shown (Accept / Reject carry that revision, so a decision on what was read never
applies to a newer round), NEEDS_APPROVAL tasks to approve, and uncertain effects to resolve.

Every button is shown to everyone signed in: the server's role table decides, and a refusal
comes back as its message."""

from __future__ import annotations

from functools import partial
from typing import Any

from starlette.requests import Request

from coordinator.console.routes.common import Context, attempt, page_token
from coordinator.console.settings import ConsoleSettings
from coordinator.sdk._rpc import Rpc
from coordinator.v1 import tasks_pb2, types_pb2, worker_pb2

# Each review row costs one GetResult: keep the review list short, page for more.
REVIEW_PAGE = 20


def inbox(request: Request, rpc: Rpc, settings: ConsoleSettings) -> Context:
    """Reviews with their results, approvals, and uncertain effects (one page each)."""
    review = rpc.call(
        rpc.tasks.ListTasks,
        tasks_pb2.ListTasksRequest(
            state=types_pb2.TASK_STATE_REVIEW,
            page_size=min(REVIEW_PAGE, settings.page_size),
            page_token=page_token(request, "review"),
            # A review card shows the input the result was made from (its first KiB); the
            # server keeps the page within its byte budget.
            include_input=True,
        ),
    )
    reviews = []
    for task in review.tasks:
        # The result of the revision shown: Accept and Reject below carry the same revision.
        read = tasks_pb2.GetResultRequest(task_id=task.task_id, revision=task.revision)
        reply, refused = attempt(partial(rpc.call, rpc.tasks.GetResult, read))
        result = reply.result if reply is not None else None
        reviews.append({"task": task, "result": result, "refused": refused})
    approvals = rpc.call(
        rpc.tasks.ListTasks,
        tasks_pb2.ListTasksRequest(
            state=types_pb2.TASK_STATE_NEEDS_APPROVAL,
            page_size=settings.page_size,
            page_token=page_token(request, "approval"),
        ),
    )
    effects: Any
    effects, effects_refused = attempt(
        lambda: rpc.call(
            rpc.worker.ListOpenEffects,
            worker_pb2.ListOpenEffectsRequest(
                page_size=settings.page_size,
                page_token=page_token(request, "effects"),
            ),
        )
    )
    listed = effects.effects if effects is not None else []
    return {
        "reviews": reviews,
        "review_next": review.next_page_token,
        "approvals": approvals.tasks,
        "approval_next": approvals.next_page_token,
        "effects": listed,
        "effects_next": effects.next_page_token if effects is not None else "",
        "effects_refused": effects_refused,
        "non_replayable": _non_replayable(rpc, {e.task_id for e in listed}),
    }


def _non_replayable(rpc: Rpc, task_ids: set[str]) -> dict[str, bool]:
    """Whether each task is NON_REPLAYABLE (one GetTask per task of the page, so at most a
    page's worth), for the warning next to "send again"; a task that cannot be read is left
    out, and its form warns as if it might be."""
    found: dict[str, bool] = {}
    for task_id in sorted(task_ids):
        read = tasks_pb2.GetTaskRequest(task_id=task_id)
        reply, _ = attempt(partial(rpc.call, rpc.tasks.GetTask, read))
        if reply is not None:
            found[task_id] = reply.task.non_replayable
    return found
