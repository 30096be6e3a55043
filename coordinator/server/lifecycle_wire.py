"""Validation and conversion for the lifecycle calls of TaskService (review, dependencies,
lineage, events). Pure and mechanical like validate.py and convert.py: raises InvalidArgument
naming the field, never does I/O."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import grpc
import structlog

from coordinator.domain import positions, validation
from coordinator.domain.graph import check_dependencies
from coordinator.domain.lineage import thread_key
from coordinator.domain.positions import EventPosition
from coordinator.domain.states import Op
from coordinator.errors import CoordinatorError, InvalidArgument, StreamBehind
from coordinator.server.convert import task_state, timestamp
from coordinator.server.status import status_code_of
from coordinator.store import StoredEvent
from coordinator.v1 import tasks_pb2

log = structlog.get_logger(__name__)

S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")

MAX_OPS_FILTER = len(Op)


def dependencies(task_id: str, values: Iterable[str], field: str = "depends_on") -> tuple[str, ...]:
    """A well-formed list of upstream ids for ``task_id`` (see domain.graph)."""
    return check_dependencies(task_id, list(values), field)


def optional_id(field: str, value: str) -> str:
    """An optional task id field (root_task_id, parent_task_id, filters)."""
    return validation.task_id(value, field) if value else ""


def optional_thread(value: str, field: str = "thread_key") -> str:
    """An optional thread key, normalized (domain.lineage)."""
    return thread_key(value, field) if value else ""


def revision(value: int, field: str = "revision") -> int:
    """A required task revision (> 0): the one the caller looked at."""
    if value == 0:
        raise InvalidArgument(f"{field} is required: the task revision that was reviewed")
    return validation.positive(field, value)


def reason(value: str) -> str:
    """A required, bounded rejection reason."""
    if not value.strip():
        raise InvalidArgument("reason is required: say why the result is rejected")
    return validation.text("reason", value)


def ops(values: Iterable[str]) -> frozenset[Op]:
    """An operation filter: each value a known operation name."""
    names = list(values)
    if len(names) > MAX_OPS_FILTER:
        raise InvalidArgument(f"ops lists {len(names)} names, there are only {MAX_OPS_FILTER}")
    found: set[Op] = set()
    for index, name in enumerate(names):
        try:
            found.add(Op(name))
        except ValueError:
            known = ", ".join(op.value for op in Op)
            raise InvalidArgument(
                f"ops[{index}] {name[:40]!r} is not an operation ({known})"
            ) from None
    return frozenset(found)


RESUME_AFTER_METADATA = "coordinator-resume-after-bin"
"""Trailing metadata of a follow stream ended for reading too slowly: the EventPosition (binary)
to resume after."""

# How long a follower found behind may stay stuck in a send before its call is cancelled (a
# client that stopped reading would otherwise hold its handler thread for ever).
STUCK_SEND_GRACE = 10.0


def resume_point(request: tasks_pb2.WatchEventsRequest) -> EventPosition:
    """Where a WatchEvents request starts: after its ``after`` position, or at the start of
    its ``from_revision``."""
    after = None
    if request.HasField("after"):
        after = EventPosition(
            request.after.revision,
            validation.task_id(request.after.task_id, "after.task_id")
            if request.after.task_id
            else "",
            request.after.prev_state_version,
        )
    return positions.resume_point(from_revision=request.from_revision, after=after)


def position_to_proto(position: EventPosition) -> tasks_pb2.EventPosition:
    """An event position on the wire."""
    return tasks_pb2.EventPosition(
        revision=position.revision,
        task_id=position.task_id,
        prev_state_version=position.prev_state_version,
    )


def cut_when_stuck(context: grpc.ServicerContext) -> Callable[[], None]:
    """``on_behind`` for a follow stream: cancel the call if its thread is still stuck sending
    (to a client that stopped reading) ``STUCK_SEND_GRACE`` seconds later. A reader that is
    merely slow gets there first and ends with RESOURCE_EXHAUSTED and its resume position."""

    def on_behind() -> None:
        timer = threading.Timer(STUCK_SEND_GRACE, context.cancel)
        timer.daemon = True
        timer.start()

    return on_behind


def behind(context: grpc.ServicerContext, exc: StreamBehind) -> None:
    """Hand a follower that fell behind the position to resume after (trailing metadata)."""
    context.set_trailing_metadata(
        ((RESUME_AFTER_METADATA, position_to_proto(exc.position).SerializeToString()),)
    )


def event_to_proto(event: StoredEvent) -> tasks_pb2.TaskEvent:
    """One stored transition on the wire."""
    record = event.record
    return tasks_pb2.TaskEvent(
        position=position_to_proto(event.position),
        revision=event.revision,
        task_id=record.task_id,
        op=record.op.value,
        from_state=task_state(record.from_state),
        to_state=task_state(record.to_state),
        by=record.by,
        attempt_id=record.attempt_id,
        claim_generation=record.claim_generation,
        scheduler_epoch=record.scheduler_epoch,
        at=timestamp(record.at),
        detail=record.detail,
        prev_state_version=event.prev_state_version,
        request_id=record.request_id,
    )


def stream_rpc(
    method: Callable[[S, Req, grpc.ServicerContext], Iterator[Resp]],
) -> Callable[[S, Req, grpc.ServicerContext], Iterator[Resp]]:
    """``@rpc`` for server-streaming methods: errors raised while streaming map to statuses
    through the same table (status.STATUS_CODES)."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: S, request: Req, context: grpc.ServicerContext) -> Iterator[Resp]:
        try:
            yield from method(self, request, context)
        except CoordinatorError as exc:
            code = status_code_of(exc)
            log.info("rpc refused", rpc=name, code=code.name, error=str(exc))
            context.abort(code, str(exc))
        except Exception:
            if not context.is_active():  # the caller went away mid-stream
                return
            log.exception("rpc failed unexpectedly", rpc=name)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {name}; see the server log")

    return wrapper
