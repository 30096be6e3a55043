"""One task: its record, its attempts as a timeline (outcome and fence of each), its events,
every effect with its state (ListEffects; the uncertain ones can be resolved here), its place in
the dependency graph (ListDependencies: upstreams and dependents with their states), and its
committed result with the evidence cited.

Each part is its own call, and a part the person's role may not read (a worker reading the
result) shows the server's refusal in place; the rest of the page still renders."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from coordinator.console.gateway import Gateway
from coordinator.console.routes.common import Context, attempt, console_of, page_token
from coordinator.console.session import current
from coordinator.console.settings import ConsoleSettings
from coordinator.sdk._rpc import Rpc
from coordinator.v1 import tasks_pb2, types_pb2, worker_pb2

# The effect states a person may resolve (ResolveEffect): the outcome is not known.
_UNCERTAIN = frozenset({types_pb2.EFFECT_STATE_PREPARED, types_pb2.EFFECT_STATE_UNKNOWN})


def task(request: Request, rpc: Rpc, settings: ConsoleSettings) -> Context:
    """Everything the console can show about one task."""
    task_id = request.path_params["task_id"]
    got = rpc.call(rpc.tasks.GetTask, tasks_pb2.GetTaskRequest(task_id=task_id))
    attempts_token = page_token(request, "attempts")
    attempts = rpc.call(
        rpc.tasks.ListAttempts,
        tasks_pb2.ListAttemptsRequest(
            task_id=task_id, page_size=settings.page_size, page_token=attempts_token
        ),
    )
    effects: Any
    effects, effects_refused = attempt(
        lambda: rpc.call(
            rpc.worker.ListEffects,
            worker_pb2.ListEffectsRequest(
                task_id=task_id,
                page_size=settings.page_size,
                page_token=page_token(request, "effects"),
            ),
        )
    )
    graph: Any
    graph, graph_refused = attempt(
        lambda: rpc.call(
            rpc.tasks.ListDependencies,
            tasks_pb2.ListDependenciesRequest(
                task_id=task_id,
                page_size=settings.page_size,
                page_token=page_token(request, "dependents"),
            ),
        )
    )
    result, result_refused = _result(rpc, task_id) if got.task.result_commit_id else (None, None)
    events, more = _events(request, settings, task_id)
    return {
        "task": got.task,
        "attempt_count": got.attempt_count,
        "attempts": attempts.attempts,
        "attempts_next": attempts.next_page_token,
        "effects": effects.effects if effects is not None else [],
        "effects_next": effects.next_page_token if effects is not None else "",
        "effects_refused": effects_refused,
        "uncertain": _UNCERTAIN,
        "graph": graph,
        "graph_refused": graph_refused,
        "result": result,
        "result_refused": result_refused,
        "events": events,
        "events_more": more,
        "review": got.task.state == types_pb2.TASK_STATE_REVIEW,
        "approval": got.task.state == types_pb2.TASK_STATE_NEEDS_APPROVAL,
    }


def _result(rpc: Rpc, task_id: str) -> tuple[Any, str | None]:
    """The committed result of the task's current revision, or the refusal of a role that may
    not read it."""
    request = tasks_pb2.GetResultRequest(task_id=task_id, revision=0)
    return attempt(lambda: rpc.call(rpc.tasks.GetResult, request).result)


def _events(
    request: Request, settings: ConsoleSettings, task_id: str
) -> tuple[list[tasks_pb2.TaskEvent], bool]:
    """The task's first ``page_size`` events (a non-following stream, cut short: the events
    page pages on from the last one), and whether there are more."""
    credentials = current(request, console_of(request).signed_out)
    assert credentials is not None  # page() let the request in signed in
    gateway: Gateway = request.app.state.console.gateway
    found: list[tasks_pb2.TaskEvent] = []
    watch = tasks_pb2.WatchEventsRequest(task_id=task_id)
    with gateway.watch(credentials, watch, timeout=settings.rpc_timeout) as stream:
        for event in stream:
            if len(found) == settings.page_size:
                return found, True
            found.append(event)
    return found, False
