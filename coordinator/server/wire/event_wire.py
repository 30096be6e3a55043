"""The event log on the wire: WatchEvents' filter and resume point, and events as protos.

Pure and mechanical like every ``*_wire`` module: ``parse_*`` raises InvalidArgument naming the
field as the .proto spells it, ``*_to_proto`` converts a record, nothing does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from coordinator.domain import positions, validation
from coordinator.domain.positions import EventPosition
from coordinator.domain.states import Op
from coordinator.errors import InvalidArgument
from coordinator.server.wire.common_wire import task_state_to_proto, timestamp_to_proto
from coordinator.server.wire.task_wire import parse_optional_id, parse_queue_filter
from coordinator.store import EventFilter, StoredEvent
from coordinator.v1 import tasks_pb2

MAX_OPS_FILTER = len(Op)

RESUME_AFTER_METADATA = "coordinator-resume-after-bin"
"""Trailing metadata of a follow stream ended for reading too slowly: the EventPosition (binary)
to resume after."""


def parse_event_filter(request: tasks_pb2.WatchEventsRequest) -> EventFilter:
    """Which events a WatchEvents request wants (empty fields: any)."""
    return EventFilter(
        task_id=parse_optional_id("task_id", request.task_id),
        root_task_id=parse_optional_id("root_task_id", request.root_task_id),
        queue=parse_queue_filter(request.queue),
        ops=parse_ops(request.ops),
    )


def parse_list_filter(request: tasks_pb2.ListEventsRequest) -> EventFilter:
    """Which events a ListEvents request wants (empty fields: any)."""
    return EventFilter(
        task_id=parse_optional_id("task_id", request.task_id),
        root_task_id=parse_optional_id("root_task_id", request.root_task_id),
        queue=parse_queue_filter(request.queue),
    )


def parse_before(request: tasks_pb2.ListEventsRequest) -> EventPosition | None:
    """Where a ListEvents page ends (exclusive); None: at the newest event."""
    if not request.HasField("before"):
        return None
    before = request.before
    if before.revision < 1:
        raise InvalidArgument(f"before.revision must be >= 1, got {before.revision}")
    task = validation.task_id(before.task_id, "before.task_id") if before.task_id else ""
    return EventPosition(before.revision, task, before.prev_state_version)


def parse_ops(values: Iterable[str]) -> frozenset[Op]:
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


def parse_resume_point(request: tasks_pb2.WatchEventsRequest) -> EventPosition:
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


def resume_after_to_metadata(position: EventPosition) -> tuple[tuple[str, bytes]]:
    """The trailing metadata that hands a follower the position to resume after."""
    return ((RESUME_AFTER_METADATA, position_to_proto(position).SerializeToString()),)


def event_to_proto(event: StoredEvent) -> tasks_pb2.TaskEvent:
    """One stored transition on the wire."""
    record = event.record
    return tasks_pb2.TaskEvent(
        position=position_to_proto(event.position),
        revision=event.revision,
        task_id=record.task_id,
        op=record.op.value,
        from_state=task_state_to_proto(record.from_state),
        to_state=task_state_to_proto(record.to_state),
        by=record.by,
        attempt_id=record.attempt_id,
        claim_generation=record.claim_generation,
        scheduler_epoch=record.scheduler_epoch,
        at=timestamp_to_proto(record.at),
        detail=record.detail,
        prev_state_version=event.prev_state_version,
        request_id=record.request_id,
    )
