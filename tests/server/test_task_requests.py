"""TaskService's requests parsed in one place (coordinator/server/wire/task_requests.py): pure,
so each rule is checked here without a server; tests/server/test_bad_input.py checks the same
refusals over gRPC, with nothing written."""

from __future__ import annotations

import pytest

from coordinator.errors import InvalidArgument
from coordinator.server.wire import task_requests as requests
from coordinator.v1 import tasks_pb2


def test_a_reject_is_parsed_into_one_typed_value() -> None:
    request = tasks_pb2.RejectRequest(task_id="t1", revision=2, reason="wrong total")
    assert requests.parse_reject(request) == requests.RejectArgs(
        task_id="t1", revision=2, reason="wrong total"
    )


def test_the_first_wrong_field_is_named() -> None:
    with pytest.raises(InvalidArgument, match=r"^task_id is required"):
        requests.parse_reject(tasks_pb2.RejectRequest(revision=0))
    with pytest.raises(InvalidArgument, match=r"^revision"):
        requests.parse_reject(tasks_pb2.RejectRequest(task_id="t1"))


def test_a_list_attempts_page_token_is_checked_before_anything_is_read() -> None:
    # The handler reads the task only after this returns: a forged token costs no read.
    request = tasks_pb2.ListAttemptsRequest(task_id="t1", page_token="forged")
    with pytest.raises(InvalidArgument, match="page_token"):
        requests.parse_list_attempts(request)


def test_set_dependencies_refuses_a_task_that_waits_on_itself() -> None:
    request = tasks_pb2.SetDependenciesRequest(task_id="t1", depends_on=["t1"])
    with pytest.raises(InvalidArgument, match="depends_on"):
        requests.parse_set_dependencies(request)


def test_a_watch_from_the_start_follows_only_when_asked() -> None:
    assert requests.parse_watch_events(tasks_pb2.WatchEventsRequest()).follow is False
    assert requests.parse_watch_events(tasks_pb2.WatchEventsRequest(follow=True)).follow
