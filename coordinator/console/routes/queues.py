"""The queues page: per queue, how many tasks wait in each state (the WAITING ones blocked or
overdue among them), how long the oldest ready task has waited, and whether claims are paused.

There is no queue listing RPC: the page reads one ListTasks page (at most ``count_cap`` tasks)
per state of interest and counts by queue. A state whose page was full shows its counts as
lower bounds ("N+") rather than the console paging through the whole keyspace. The oldest
ready age and the blocked and overdue counts are the server's own figures (GetStats, the ones
behind the coordinator_queue_* gauges; pm and admin may read them)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from starlette.requests import Request

from coordinator.console.routes.actions import RETRY_PAGE
from coordinator.console.routes.common import Context, attempt, page_token
from coordinator.console.settings import ConsoleSettings
from coordinator.sdk._rpc import Rpc
from coordinator.v1 import admin_pb2, tasks_pb2, types_pb2

COLUMNS = [
    (types_pb2.TASK_STATE_READY, "ready"),
    (types_pb2.TASK_STATE_CLAIMED, "claimed"),
    (types_pb2.TASK_STATE_WAITING, "waiting"),
    # Waiting out a retry backoff or a not_before: READY when due (docs/work-queue.md).
    (types_pb2.TASK_STATE_DELAYED, "delayed"),
    (types_pb2.TASK_STATE_REVIEW, "review"),
    (types_pb2.TASK_STATE_NEEDS_APPROVAL, "needs approval"),
    # FAILED is where a task ends when it will never be DONE: the dead letters.
    (types_pb2.TASK_STATE_FAILED, "failed (dead letters)"),
]


def queues(request: Request, rpc: Rpc, settings: ConsoleSettings) -> Context:
    """Counts per queue and state, the epoch and pause flag, and the drain counts if allowed."""
    epoch = rpc.call(rpc.admin.GetEpoch, admin_pb2.GetEpochRequest())
    counts: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    capped: set[int] = set()
    for state, _ in COLUMNS:
        reply = rpc.call(
            rpc.tasks.ListTasks,
            tasks_pb2.ListTasksRequest(state=state, page_size=settings.count_cap),
        )
        for task in reply.tasks:
            counts[task.queue][state] += 1
        if reply.next_page_token:
            capped.add(state)
    drain: Any
    drain, drain_refused = attempt(
        lambda: rpc.call(rpc.admin.DrainStatus, admin_pb2.DrainStatusRequest())
    )
    stats, stats_refused = attempt(
        lambda: rpc.call(rpc.admin.GetStats, admin_pb2.GetStatsRequest())
    )
    return {
        "epoch": epoch,
        "columns": COLUMNS,
        "rows": sorted(counts.items()),
        "capped": capped,
        "cap": settings.count_cap,
        "drain": drain,
        "drain_refused": drain_refused,
        **_oldest_ready(stats),
        "stats_refused": stats_refused,
    }


def _oldest_ready(stats: admin_pb2.GetStatsResponse | None) -> Context:
    """Seconds the oldest ready task of each queue has waited, the WAITING tasks blocked by a
    FAILED or CANCELLED upstream and the overdue ones per queue, and how many busy queues the
    server left out of its report. Only queues with a ready task have an age (GetStats also
    lists the queues that only have claims)."""
    if stats is None:  # the caller's role may not read it: the page says why
        return {"oldest": {}, "blocked": {}, "overdue": {}, "stats_left_out": 0}
    oldest = {q.queue: q.oldest_ready_age_seconds for q in stats.queues if q.ready_tasks}
    return {
        "oldest": oldest,
        "blocked": {q.queue: q.blocked_tasks for q in stats.queues if q.blocked_tasks},
        "overdue": {q.queue: q.overdue_tasks for q in stats.queues if q.overdue_tasks},
        "stats_left_out": stats.queues_left_out,
    }


def tasks(request: Request, rpc: Rpc, settings: ConsoleSettings) -> Context:
    """One page of tasks, filtered by queue, state, blocked and overdue (the queues page links
    here)."""
    queue = request.query_params.get("queue", "")[:64]
    state_name = request.query_params.get("state", "")
    state = (
        types_pb2.TaskState.Value(f"TASK_STATE_{state_name}")
        if _known(state_name)
        else types_pb2.TASK_STATE_UNSPECIFIED
    )
    token = page_token(request, "page_token")
    # WAITING tasks blocked by a FAILED or CANCELLED upstream, or overdue (ListTasks filters).
    blocked = request.query_params.get("blocked") == "1"
    overdue = request.query_params.get("overdue") == "1"
    reply = rpc.call(
        rpc.tasks.ListTasks,
        tasks_pb2.ListTasksRequest(
            queue=queue,
            state=state,
            page_size=settings.page_size,
            page_token=token,
            blocked=blocked,
            overdue=overdue,
        ),
    )
    return {
        "queue": queue,
        "state": state_name if state else "",
        "blocked": blocked,
        "overdue": overdue,
        "states": [n.removeprefix("TASK_STATE_") for n in types_pb2.TaskState.keys()[1:]],
        "tasks": reply.tasks,
        "next_page_token": reply.next_page_token,
        "retry_page": RETRY_PAGE,
    }


def _known(state_name: str) -> bool:
    return f"TASK_STATE_{state_name}" in types_pb2.TaskState.keys()[1:]
