"""TaskService's requests, each parsed in one place: ``parse_<rpc>`` checks every field of one
RPC's request and returns a typed value or raises InvalidArgument naming the first field that
is wrong. A handler calls its parse first, so a bad request reads and writes nothing.

The checks of single fields live in the area modules (task_wire, queue_wire, event_wire,
claim_wire, common_wire, and domain/validation for identifiers); this module only says which
fields each RPC has. Who calls is never a request field: handlers take it from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.bulk_retry import DeadLetterFilter
from coordinator.domain.positions import EventPosition
from coordinator.domain.states import TaskState
from coordinator.domain.validation import non_negative, task_id
from coordinator.server.wire import (
    claim_wire,
    common_wire,
    event_wire,
    page_tokens,
    queue_wire,
    task_wire,
)
from coordinator.store import EventFilter
from coordinator.store.types import TaskSpec
from coordinator.v1 import tasks_pb2


def parse_create_task(request: tasks_pb2.CreateTaskRequest, *, now: float) -> TaskSpec:
    """CreateTask's request (``now`` bounds ``not_before``)."""
    return task_wire.parse_task_spec(request, now=now)


def parse_get_task(request: tasks_pb2.GetTaskRequest) -> str:
    """GetTask's request: the task id."""
    return task_id(request.task_id)


@dataclass(frozen=True)
class AttemptPageArgs:
    """One page of a task's attempts: from attempt ``first``, at most ``page_size``."""

    task_id: str
    page_size: int
    first: int


def parse_list_attempts(request: tasks_pb2.ListAttemptsRequest) -> AttemptPageArgs:
    """ListAttempts' request."""
    tid = task_id(request.task_id)
    return AttemptPageArgs(
        task_id=tid,
        page_size=common_wire.parse_page_size(request.page_size),
        first=task_wire.parse_attempt_page_token(request.page_token, tid),
    )


@dataclass(frozen=True)
class TaskPageArgs:
    """One page of ListTasks, and the filters its page tokens are bound to."""

    queue: str
    state: TaskState | None
    root: str
    parent: str
    thread: str
    blocked: bool
    overdue: bool
    page_size: int
    page_token: str
    include_input: bool
    filters: page_tokens.Filters


def parse_list_tasks(request: tasks_pb2.ListTasksRequest) -> TaskPageArgs:
    """ListTasks' request."""
    filters = task_wire.list_tasks_filters(request)
    return TaskPageArgs(
        queue=task_wire.parse_queue_filter(request.queue),
        state=task_wire.parse_state_filter(request.state),
        root=task_wire.parse_optional_id("root_task_id", request.root_task_id),
        parent=task_wire.parse_optional_id("parent_task_id", request.parent_task_id),
        thread=task_wire.parse_optional_thread(request.thread_key),
        blocked=request.blocked,
        overdue=request.overdue,
        page_size=common_wire.parse_page_size(request.page_size),
        page_token=task_wire.parse_page_token(request.page_token, filters),
        include_input=request.include_input,
        filters=filters,
    )


def parse_get_result(request: tasks_pb2.GetResultRequest) -> tuple[str, int]:
    """GetResult's request: the task id and the revision (0: the current one)."""
    return task_id(request.task_id), non_negative("revision", request.revision)


@dataclass(frozen=True)
class CancelArgs:
    """A CancelTask, of the task alone or (``cascade``) its WAITING graph too."""

    task_id: str
    reason: str
    cascade: bool


def parse_cancel_task(request: tasks_pb2.CancelTaskRequest) -> CancelArgs:
    """CancelTask's request."""
    return CancelArgs(
        task_id=task_id(request.task_id),
        reason=common_wire.parse_text("reason", request.reason),
        cascade=request.cascade,
    )


@dataclass(frozen=True)
class UpdateInputArgs:
    """An UpdateInput: the new input, its checked digest, the revision the caller looked at."""

    task_id: str
    data: bytes
    input_digest: str
    expected_revision: int


def parse_update_input(request: tasks_pb2.UpdateInputRequest) -> UpdateInputArgs:
    """UpdateInput's request."""
    tid = task_id(request.task_id)
    digest = task_wire.parse_input_payload("input", request.input, request.input_digest)
    return UpdateInputArgs(
        task_id=tid,
        data=request.input,
        input_digest=digest,
        expected_revision=non_negative("expected_revision", request.expected_revision),
    )


@dataclass(frozen=True)
class RetryArgs:
    """A RetryTask: a FAILED task back to READY, with a new deadline or none (0)."""

    task_id: str
    reason: str
    schedule_to_close: float


def parse_retry_task(request: tasks_pb2.RetryTaskRequest) -> RetryArgs:
    """RetryTask's request."""
    return RetryArgs(
        task_id=task_id(request.task_id),
        reason=common_wire.parse_text("reason", request.reason),
        schedule_to_close=queue_wire.parse_schedule_to_close(
            request.schedule_to_close, present=request.HasField("schedule_to_close")
        ),
    )


@dataclass(frozen=True)
class BulkRetryArgs:
    """A RetryTasks: which dead letters, one bounded page, and the filters its token binds."""

    picked: DeadLetterFilter
    limit: int
    filters: page_tokens.Filters
    page_token: str
    reason: str
    schedule_to_close: float
    dry_run: bool


def parse_retry_tasks(request: tasks_pb2.RetryTasksRequest) -> BulkRetryArgs:
    """RetryTasks' request."""
    picked = queue_wire.parse_dead_letter_filter(request)
    limit = queue_wire.parse_bulk_limit(request.limit)
    filters = queue_wire.retry_tasks_filters(request)
    return BulkRetryArgs(
        picked=picked,
        limit=limit,
        filters=filters,
        page_token=task_wire.parse_retry_page_token(request.page_token, filters),
        reason=common_wire.parse_text("reason", request.reason),
        schedule_to_close=queue_wire.parse_schedule_to_close(
            request.schedule_to_close, present=request.HasField("schedule_to_close")
        ),
        dry_run=request.dry_run,
    )


def parse_accept(request: tasks_pb2.AcceptRequest) -> tuple[str, int]:
    """Accept's request: the task id and the revision whose result is accepted."""
    return task_id(request.task_id), task_wire.parse_revision(request.revision)


@dataclass(frozen=True)
class RejectArgs:
    """A Reject: the revision whose result is rejected, and why."""

    task_id: str
    revision: int
    reason: str


def parse_reject(request: tasks_pb2.RejectRequest) -> RejectArgs:
    """Reject's request."""
    return RejectArgs(
        task_id=task_id(request.task_id),
        revision=task_wire.parse_revision(request.revision),
        reason=task_wire.parse_reject_reason(request.reason),
    )


@dataclass(frozen=True)
class DependenciesArgs:
    """A SetDependencies: the task's new upstreams, against the state version looked at."""

    task_id: str
    depends_on: tuple[str, ...]
    expected_state_version: int


def parse_set_dependencies(request: tasks_pb2.SetDependenciesRequest) -> DependenciesArgs:
    """SetDependencies' request."""
    tid = task_id(request.task_id)
    return DependenciesArgs(
        task_id=tid,
        depends_on=task_wire.parse_dependencies(tid, request.depends_on),
        expected_state_version=non_negative(
            "expected_state_version", request.expected_state_version
        ),
    )


@dataclass(frozen=True)
class ClaimPageArgs:
    """One page of live claims, of one queue or all (``queue`` empty)."""

    queue: str
    page_size: int
    page_token: str


def parse_list_claims(request: tasks_pb2.ListClaimsRequest) -> ClaimPageArgs:
    """ListClaims' request."""
    queue = task_wire.parse_queue_filter(request.queue)
    return ClaimPageArgs(
        queue=queue,
        page_size=claim_wire.parse_claims_page_size(request.page_size),
        page_token=claim_wire.parse_claims_page_token(request.page_token, queue),
    )


@dataclass(frozen=True)
class EventPageArgs:
    """One page of the event log, newest first, ending before ``before`` (None: the newest)."""

    filter: EventFilter
    before: EventPosition | None
    page_size: int


def parse_list_events(request: tasks_pb2.ListEventsRequest) -> EventPageArgs:
    """ListEvents' request."""
    return EventPageArgs(
        filter=event_wire.parse_list_filter(request),
        before=event_wire.parse_before(request),
        page_size=common_wire.parse_page_size(request.page_size),
    )


@dataclass(frozen=True)
class DependentsPageArgs:
    """A task's upstreams and one page of its dependents."""

    task_id: str
    page_size: int
    page_token: str


def parse_list_dependencies(request: tasks_pb2.ListDependenciesRequest) -> DependentsPageArgs:
    """ListDependencies' request."""
    tid = task_id(request.task_id)
    return DependentsPageArgs(
        task_id=tid,
        page_size=common_wire.parse_page_size(request.page_size),
        page_token=task_wire.parse_dependents_page_token(request.page_token, tid),
    )


@dataclass(frozen=True)
class WatchArgs:
    """A WatchEvents: which events, from where, and whether to follow live."""

    filter: EventFilter
    after: EventPosition
    follow: bool


def parse_watch_events(request: tasks_pb2.WatchEventsRequest) -> WatchArgs:
    """WatchEvents' request."""
    return WatchArgs(
        filter=event_wire.parse_event_filter(request),
        after=event_wire.parse_resume_point(request),
        follow=request.follow,
    )
