"""Tasks on the wire: CreateTask's request, the lineage and listing fields, and the task,
attempt and result records as protos. Pure and mechanical (see common_wire)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from coordinator.domain import validation
from coordinator.domain.checkpoints import resumable_checkpoint
from coordinator.domain.graph import check_dependencies
from coordinator.domain.lineage import thread_key
from coordinator.domain.records import AttemptRecord, ResultRecord, TaskRecord
from coordinator.domain.retry import attempts_counted
from coordinator.domain.states import TaskState
from coordinator.domain.waiting import waiting_reason
from coordinator.errors import InvalidArgument
from coordinator.server.wire import page_tokens
from coordinator.server.wire.common_wire import (
    parse_content_digest,
    task_state_to_proto,
    timestamp_to_proto,
)
from coordinator.server.wire.queue_wire import (
    check_runnable_window,
    parse_not_before,
    parse_retry_overrides,
    parse_schedule_to_close,
    policy_to_proto,
)
from coordinator.store.types import Neighbours, TaskSpec
from coordinator.v1 import tasks_pb2, types_pb2

DEFAULT_QUEUE = "default"

# --- proto -> domain -------------------------------------------------------------------------


def parse_task_spec(request: tasks_pb2.CreateTaskRequest, *, now: float) -> TaskSpec:
    """The store's TaskSpec for a CreateTaskRequest, every field checked (thread key
    normalized); ``now`` bounds how far ahead ``not_before`` may be."""
    task_id = parse_optional_task_id(request.task_id)
    queue = parse_queue_or_default(request.queue)
    priority = validation.priority(request.priority)
    digest = parse_input_payload("input", request.input, request.input_digest)
    root = parse_optional_id("root_task_id", request.root_task_id)
    parent = parse_optional_id("parent_task_id", request.parent_task_id)
    thread = parse_optional_thread(request.thread_key)
    depends_on = parse_dependencies(request.task_id, request.depends_on)
    retry = parse_retry_overrides(request.retry_policy, present=request.HasField("retry_policy"))
    not_before = parse_not_before(
        request.not_before, present=request.HasField("not_before"), now=now
    )
    deadline = parse_schedule_to_close(
        request.schedule_to_close, present=request.HasField("schedule_to_close")
    )
    check_runnable_window(not_before, deadline, now=now)
    return TaskSpec(
        task_id=task_id,
        queue=queue,
        priority=priority,
        input=request.input,
        input_digest=digest,
        requires_review=request.requires_review,
        non_replayable=request.non_replayable,
        root_task_id=root,
        parent_task_id=parent,
        thread_key=thread,
        depends_on=depends_on,
        retry=retry,
        not_before=not_before,
        schedule_to_close=deadline,
    )


def parse_input_payload(field: str, data: bytes, input_digest: str) -> str:
    """Check a task input and its digest; returns the digest to store."""
    validation.max_bytes(field, data, validation.MAX_INPUT_BYTES)
    return parse_content_digest("input_digest", input_digest, data)


def parse_optional_task_id(value: str) -> str:
    """A task id to create; empty lets the store generate one."""
    return validation.task_id(value) if value else ""


def parse_optional_id(field: str, value: str) -> str:
    """An optional task id field (root_task_id, parent_task_id, filters)."""
    return validation.task_id(value, field) if value else ""


def parse_optional_thread(value: str, field: str = "thread_key") -> str:
    """An optional thread key, normalized (domain.lineage)."""
    return thread_key(value, field) if value else ""


def parse_dependencies(
    task_id: str, values: Iterable[str], field: str = "depends_on"
) -> tuple[str, ...]:
    """A well-formed list of upstream ids for ``task_id`` (see domain.graph)."""
    return check_dependencies(task_id, list(values), field)


def parse_revision(value: int, field: str = "revision") -> int:
    """A required task revision (> 0): the one the caller looked at."""
    if value == 0:
        raise InvalidArgument(f"{field} is required: the task revision that was reviewed")
    return validation.positive(field, value)


def parse_reject_reason(value: str) -> str:
    """A required, bounded rejection reason."""
    if not value.strip():
        raise InvalidArgument("reason is required: say why the result is rejected")
    return validation.text("reason", value)


def parse_queue_or_default(value: str) -> str:
    """A queue name; empty means the default queue."""
    return validation.queue(value) if value else DEFAULT_QUEUE


def parse_queue_filter(value: str) -> str:
    """A queue to filter by; empty means every queue."""
    return validation.queue(value) if value else ""


def parse_state_filter(value: int) -> TaskState | None:
    """A task state to filter by; TASK_STATE_UNSPECIFIED (0) means every state."""
    if value == 0:
        return None
    try:
        return TaskState(value)
    except ValueError:
        raise InvalidArgument(f"state {value} is not a known TaskState") from None


def list_tasks_filters(request: tasks_pb2.ListTasksRequest) -> page_tokens.Filters:
    """The fields a ListTasks page token is bound to (as sent: a changed filter is another
    listing)."""
    return {
        "queue": request.queue,
        "state": request.state,
        "root_task_id": request.root_task_id,
        "parent_task_id": request.parent_task_id,
        "thread_key": request.thread_key,
        "blocked": request.blocked,
        "overdue": request.overdue,
    }


def parse_page_token(value: str, filters: page_tokens.Filters) -> str:
    """A ListTasks page token: the task id the next page starts after; empty: the first."""
    return page_tokens.parse("ListTasks", filters, value, _task_position)


def parse_retry_page_token(value: str, filters: page_tokens.Filters) -> str:
    """A RetryTasks page token: the task id the next pass starts after; empty: the first."""
    return page_tokens.parse("RetryTasks", filters, value, _task_position)


def parse_attempt_page_token(value: str, task_id: str) -> int:
    """A ListAttempts page token: the attempt number the page starts at; empty: the first."""
    return int(page_tokens.parse("ListAttempts", {"task_id": task_id}, value, _attempt_number) or 1)


def parse_dependents_page_token(value: str, task_id: str) -> str:
    """A ListDependencies page token: the dependent the next page starts after."""
    return page_tokens.parse("ListDependencies", {"task_id": task_id}, value, _task_position)


def _task_position(value: str) -> str:
    return validation.task_id(value, "page_token")


def _attempt_number(value: str) -> int:
    if not value.isdigit() or len(value) > 9 or int(value) < 1:
        raise InvalidArgument(f"page_token {value[:40]!r} is not an attempt number")
    return int(value)


# --- domain -> proto -------------------------------------------------------------------------


def task_to_proto(task: TaskRecord, *, checkpoint_size: int | None = None) -> types_pb2.Task:
    """A task record on the wire, with its state_version and its work-queue fields;
    ``checkpoint_size`` where the caller read the latest attempt (unset otherwise)."""
    return types_pb2.Task(
        task_id=task.task_id,
        revision=task.revision,
        state=task_state_to_proto(task.state),
        state_version=task.state_version,
        queue=task.queue,
        priority=task.priority,
        input_digest=task.input_digest,
        input=task.input,
        claim_generation=task.claim_generation,
        scheduler_epoch=task.scheduler_epoch,
        attempt=task.attempt,
        attempt_id=task.attempt_id,
        owner_id=task.owner_id,
        cancel_generation=task.cancel_generation,
        result_commit_id=task.result_commit_id,
        result_digest=task.result_digest,
        root_task_id=task.root_task_id,
        parent_task_id=task.parent_task_id,
        thread_key=task.thread_key,
        depends_on=list(task.depends_on),
        requires_review=task.requires_review,
        non_replayable=task.non_replayable,
        created_at=timestamp_to_proto(task.created_at),
        updated_at=timestamp_to_proto(task.updated_at),
        retry_policy=policy_to_proto(task),
        next_eligible_at=timestamp_to_proto(task.not_before),
        last_error=task.last_error,
        last_error_code=task.last_error_code,
        dead_letter_reason=types_pb2.DeadLetterReason.ValueType(int(task.dead_letter_reason)),
        attempts_counted=attempts_counted(task),
        deadline=timestamp_to_proto(task.deadline),
        checkpoint_size=checkpoint_size,
        blocked_by=list(task.blocked_by),
        waiting_reason=types_pb2.WaitingReason.ValueType(int(waiting_reason(task))),
        overdue_at=timestamp_to_proto(task.overdue_at),
    )


def task_with_attempts_to_proto(
    task: TaskRecord, attempts: Sequence[AttemptRecord]
) -> types_pb2.Task:
    """A task on the wire with what its latest attempts (oldest first) tell: the size of the
    checkpoint its next attempt resumes from."""
    latest = attempts[-1] if attempts else None
    return task_to_proto(task, checkpoint_size=len(resumable_checkpoint(task, latest)))


def attempt_to_proto(attempt: AttemptRecord) -> types_pb2.Attempt:
    """One attempt on the wire (end UNSPECIFIED while it runs)."""
    return types_pb2.Attempt(
        attempt_id=attempt.attempt_id,
        attempt=attempt.attempt,
        owner_id=attempt.owner_id,
        claim_generation=attempt.claim_generation,
        scheduler_epoch=attempt.scheduler_epoch,
        started_at=timestamp_to_proto(attempt.started_at),
        ended_at=timestamp_to_proto(attempt.ended_at),
        end=types_pb2.AttemptEnd.ValueType(int(attempt.end)),
        error_code=attempt.error_code,
        error_message=attempt.error_message,
        error_details=attempt.error_details,
        checkpoint_size=len(attempt.checkpoint),
    )


def result_to_proto(result: ResultRecord) -> tasks_pb2.TaskResult:
    """A canonical result on the wire, with the fence of the attempt that committed it."""
    return tasks_pb2.TaskResult(
        task_id=result.task_id,
        revision=result.revision,
        result=result.result,
        result_ref=result.result_ref,
        result_digest=result.result_digest,
        attempt_id=result.attempt_id,
        claim_generation=result.claim_generation,
        scheduler_epoch=result.scheduler_epoch,
        commit_id=result.commit_id,
        owner_id=result.owner_id,
        committed_at=timestamp_to_proto(result.committed_at),
        evidence=list(result.evidence),
    )


def task_node_to_proto(task: TaskRecord, *, pruned: bool = False) -> tasks_pb2.TaskNode:
    """A task as a node of the dependency graph (its state, not its input)."""
    return tasks_pb2.TaskNode(
        task_id=task.task_id,
        state=task_state_to_proto(task.state),
        revision=task.revision,
        queue=task.queue,
        pruned=pruned,
    )


def neighbours_to_proto(found: Neighbours, task_id: str) -> tasks_pb2.ListDependenciesResponse:
    """ListDependenciesResponse of ``task_id``: every upstream, one page of dependents."""
    pruned = found.pruned
    return tasks_pb2.ListDependenciesResponse(
        upstreams=[task_node_to_proto(t, pruned=t.task_id in pruned) for t in found.upstreams],
        dependents=[task_node_to_proto(t) for t in found.dependents],
        next_page_token=page_tokens.issue(
            "ListDependencies", {"task_id": task_id}, found.next_page_token
        ),
    )
