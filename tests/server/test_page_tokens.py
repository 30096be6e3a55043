"""Page tokens: every list RPC refuses a token it did not issue for this very listing (issue 24:
ListClaims and ListDependencies answered "garbage" with an empty last page), and the tokens it
issues resume where the page ended.

The pure rules (coordinator/server/wire/page_tokens.py) first, then each list RPC over gRPC.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.errors import InvalidArgument
from coordinator.server.wire import page_tokens
from coordinator.server.wire.task_wire import list_tasks_filters
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests import helpers
from tests.helpers import Probe

WORKER_A = (("x-coordinator-principal", "worker-a"),)


def _any(value: str) -> None:
    del value


_filters = st.dictionaries(st.sampled_from(["queue", "task_id", "state"]), st.text(max_size=8))


@given(rpc=st.text(max_size=12), filters=_filters, position=st.text(min_size=1, max_size=40))
def test_an_issued_token_resumes_at_its_position(
    rpc: str, filters: dict[str, str], position: str
) -> None:
    token = page_tokens.issue(rpc, filters, position.replace("~", "-"))
    assert page_tokens.parse(rpc, filters, token, _any) == position.replace("~", "-")


@given(filters=_filters, cut=st.integers(1, 12), extra=st.text(min_size=1, max_size=3))
def test_a_token_changed_in_any_way_is_refused(
    filters: dict[str, str], cut: int, extra: str
) -> None:
    token = page_tokens.issue("ListTasks", filters, "t-1")
    for changed in (token[:-cut], token + extra, "t-2" + token[3:], "t-1"):
        with pytest.raises(InvalidArgument, match="is not one ListTasks returned"):
            page_tokens.parse("ListTasks", filters, changed, _any)
    with pytest.raises(InvalidArgument, match="is not one ListClaims returned"):
        page_tokens.parse("ListClaims", filters, token, _any)
    with pytest.raises(InvalidArgument, match="queue 'other'"):
        page_tokens.parse("ListTasks", {**filters, "queue": "other"}, token, _any)


def test_empty_is_the_first_page_and_the_last() -> None:
    assert page_tokens.issue("ListTasks", {}, "") == ""
    assert page_tokens.parse("ListTasks", {}, "", _any) == ""


# --- over gRPC -------------------------------------------------------------------------------

EFFECT = "t-1/eff-" + "0" * 64
TASKS_OF_DEFAULT = tasks_pb2.ListTasksRequest(queue="default")

# (rpc, the request with a token, the filters its tokens are bound to, a position of its shape)
Listing = tuple[str, Callable[[str], Any], dict[str, Any], str]
LISTINGS: list[Listing] = [
    (
        "ListTasks",
        lambda token: tasks_pb2.ListTasksRequest(queue="default", page_token=token),
        dict(list_tasks_filters(TASKS_OF_DEFAULT)),
        "t-1",
    ),
    (
        "ListAttempts",
        lambda token: tasks_pb2.ListAttemptsRequest(task_id="t-1", page_token=token),
        {"task_id": "t-1"},
        "1",
    ),
    (
        "ListClaims",
        lambda token: tasks_pb2.ListClaimsRequest(queue="default", page_token=token),
        {"queue": "default"},
        "t-1",
    ),
    (
        "ListDependencies",
        lambda token: tasks_pb2.ListDependenciesRequest(task_id="t-1", page_token=token),
        {"task_id": "t-1"},
        "t-1",
    ),
    (
        "ListOpenEffects",
        lambda token: worker_pb2.ListOpenEffectsRequest(task_id="t-1", page_token=token),
        {"task_id": "t-1"},
        EFFECT,
    ),
    (
        "ListEffects",
        lambda token: worker_pb2.ListEffectsRequest(task_id="t-1", page_token=token),
        {"task_id": "t-1"},
        EFFECT,
    ),
    (
        "RetryTasks",
        lambda token: tasks_pb2.RetryTasksRequest(queue="default", dry_run=True, page_token=token),
        {"queue": "default"},
        "t-1",
    ),
]


def _refusals(rpc: str, filters: dict[str, Any], position: str) -> list[tuple[str, str]]:
    """(id, token) of every token ``rpc`` must refuse for ``filters``."""
    issued = page_tokens.issue(rpc, filters, position)
    other_rpc = "ListClaims" if rpc != "ListClaims" else "ListTasks"
    other_filters = {**filters, next(iter(filters)): "other"}
    return [
        ("garbage", "garbage"),
        ("bare-position", position),  # the token before it carried a check
        ("another-rpc", page_tokens.issue(other_rpc, filters, position)),
        ("other-filters", page_tokens.issue(rpc, other_filters, position)),
        ("truncated", issued[:-1]),
        ("bad-position", page_tokens.issue(rpc, filters, "not a position")),
    ]


CASES = [
    pytest.param(rpc, build, token, id=f"{rpc}-{case}")
    for rpc, build, filters, position in LISTINGS
    for case, token in _refusals(rpc, filters, position)
]


def _stub(rpc: str, channel: grpc.Channel) -> Any:
    if rpc.endswith("Effects"):
        return getattr(worker_pb2_grpc.WorkerServiceStub(channel), rpc)
    return getattr(tasks_pb2_grpc.TaskServiceStub(channel), rpc)


@pytest.mark.parametrize(("rpc", "build", "token"), CASES)
def test_every_list_refuses_a_token_it_did_not_issue_for_this_listing(
    rpc: str,
    build: Callable[[str], Any],
    token: str,
    claimed: worker_pb2.ClaimResponse,
    channel: grpc.Channel,
    keyspace: Probe,
) -> None:
    named = f"page_token {token[:60]!r} is not one {rpc} returned"
    helpers.refused(
        _stub(rpc, channel), build(token), grpc.StatusCode.INVALID_ARGUMENT, named, keyspace
    )


@pytest.mark.parametrize(
    ("rpc", "build", "filters", "position"), [pytest.param(*x, id=x[0]) for x in LISTINGS]
)
def test_every_list_accepts_the_tokens_it_issues(
    rpc: str,
    build: Callable[[str], Any],
    filters: dict[str, Any],
    position: str,
    claimed: worker_pb2.ClaimResponse,
    channel: grpc.Channel,
) -> None:
    _stub(rpc, channel)(build(page_tokens.issue(rpc, filters, position)), metadata=WORKER_A)


def test_list_tasks_pages_through_with_its_tokens(tasks: tasks_pb2_grpc.TaskServiceStub) -> None:
    for name in ("a", "b", "c"):
        tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id=name))
    seen: list[str] = []
    token = ""
    while True:
        page = tasks.ListTasks(tasks_pb2.ListTasksRequest(page_size=2, page_token=token))
        seen.extend(t.task_id for t in page.tasks)
        token = page.next_page_token
        if not token:
            break
        assert helpers.resumes_at(token) == seen[-1]
    assert seen == ["a", "b", "c"]
