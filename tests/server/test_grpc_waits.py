"""A replica lengthens grpc's wait slices (coordinator.server.grpc_waits): the setting must still
exist in grpc, and a blocked stream read must still wake at once on a message."""

from __future__ import annotations

import grpc._common as grpc_common
import pytest

from coordinator.server.grpc_waits import lengthen_wait_slices
from coordinator.store import Store
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc
from tests.helpers import cancel, next_of
from tests.lifecycle.support import create, who


def test_grpc_still_has_the_wait_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpc_common, "MAXIMUM_WAIT_TIMEOUT", grpc_common.MAXIMUM_WAIT_TIMEOUT)
    assert lengthen_wait_slices(30.0) is True
    assert grpc_common.MAXIMUM_WAIT_TIMEOUT == 30.0


def test_a_blocked_stream_read_wakes_on_its_message_whatever_the_slice(
    monkeypatch: pytest.MonkeyPatch, tasks: tasks_pb2_grpc.TaskServiceStub, store: Store
) -> None:
    monkeypatch.setattr(grpc_common, "MAXIMUM_WAIT_TIMEOUT", grpc_common.MAXIMUM_WAIT_TIMEOUT)
    # A slice far longer than the call's deadline: were the read to wait out its slice, the
    # deadline would end the call first (DEADLINE_EXCEEDED instead of the event).
    lengthen_wait_slices(600.0)
    follow = tasks.WatchEvents(
        tasks_pb2.WatchEventsRequest(follow=True), metadata=who("pm-1", "pm"), timeout=60
    )
    try:
        create(store, "t-1")
        assert next_of(follow).task_id == "t-1"
    finally:
        cancel(follow)
