"""The pure rules of a call's retry window (sdk/_budget.py) and of its target (sdk/_target.py)."""

from __future__ import annotations

import re

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.errors import InvalidArgument
from coordinator.sdk._budget import MIN_TRY_TIMEOUT, out_of_time, retry_deadline, try_timeout
from coordinator.sdk._core.calls import CallPlan, CallRetry
from coordinator.sdk._target import Endpoints, channel_target, endpoint_targets

seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(
    start=seconds,
    took=seconds,
    budget=seconds,
    lease_left=st.floats(-1e6, 1e6, allow_nan=False),
)
def test_a_call_behind_a_fence_retries_until_the_budget_or_the_lease_ends(
    start: float, took: float, budget: float, lease_left: float
) -> None:
    failed = start + took
    expected = max(min(failed + budget, start + lease_left), start)
    assert retry_deadline(start, failed, budget, lease_left) == expected


@given(start=seconds, took=seconds, budget=seconds)
def test_any_other_call_retries_for_the_whole_budget_after_its_first_failure(
    start: float, took: float, budget: float
) -> None:
    assert retry_deadline(start, start + took, budget, None) == start + took + budget


def test_the_lease_cuts_the_budget_and_an_ended_lease_leaves_no_retry() -> None:
    assert retry_deadline(100.0, 100.0, 15.0, 4.0) == 104.0
    assert retry_deadline(100.0, 100.0, 15.0, 40.0) == 115.0
    assert retry_deadline(100.0, 100.0, 15.0, -3.0) == 100.0


def test_a_long_poll_that_failed_late_in_its_wait_keeps_its_whole_budget() -> None:
    # A ClaimNext waiting 20 s whose replica restarted at 16 s once had no retry left.
    assert retry_deadline(100.0, 116.0, 15.0, None) == 131.0


def test_a_try_that_would_start_at_the_deadline_is_not_made() -> None:
    assert not out_of_time(10.0, 0.4, 10.5)
    assert out_of_time(10.0, 0.5, 10.5)
    assert out_of_time(11.0, 0.0, 10.5)


def test_a_retry_gets_what_is_left_of_the_window_within_bounds() -> None:
    assert try_timeout(0.0, 100.0, 10.0) == 10.0  # the policy's per-try timeout
    assert try_timeout(0.0, 3.0, 10.0) == 3.0  # what is left before the deadline
    assert try_timeout(0.0, 0.05, 10.0) == MIN_TRY_TIMEOUT  # never too short to answer
    assert try_timeout(0.0, 0.05, 0.1) == 0.1  # nor longer than the per-try timeout


@pytest.mark.parametrize(
    ("given_target", "target"),
    [
        ("localhost:7070", "localhost:7070"),
        ("dns:///coordinator.example:7070", "dns:///coordinator.example:7070"),
        ("ipv4:10.0.0.1:7070,10.0.0.2:7070", "ipv4:10.0.0.1:7070,10.0.0.2:7070"),
        ("10.0.0.1:7070, 10.0.0.2:7071", "ipv4:10.0.0.1:7070,10.0.0.2:7071"),
        (["10.0.0.1:7070", "10.0.0.2:7070"], "ipv4:10.0.0.1:7070,10.0.0.2:7070"),
        (["[::1]:7070", "[::2]:7070"], "ipv6:[::1]:7070,[::2]:7070"),
        (["coordinator:7070"], "coordinator:7070"),
    ],
)
def test_replica_lists_become_one_grpc_target(given_target: str | list[str], target: str) -> None:
    assert channel_target(given_target) == target


@pytest.mark.parametrize(
    ("given_target", "message"),
    [
        ("host1:7070,host2:7070", "'host1:7070': several coordinator addresses must each be"),
        ("10.0.0.1:7070,[::1]:7070", "replica addresses mix IPv4 and IPv6"),
        ("10.0.0.1:7070,10.0.0.2", "'10.0.0.2': several coordinator addresses"),
        ("::1:7070,::2:7070", "'::1:7070': several coordinator addresses"),
        ([], "no coordinator address given"),
        (" , ", "no coordinator address given"),
    ],
)
def test_a_replica_list_grpc_cannot_resolve_is_refused_with_the_way_out(
    given_target: str | list[str], message: str
) -> None:
    with pytest.raises(InvalidArgument, match="^" + re.escape(message)) as raised:
        channel_target(given_target)
    if "several" in message:
        assert "dns:///" in str(raised.value)


@pytest.mark.parametrize(
    ("given_target", "targets"),
    [
        ("localhost:7070", ["localhost:7070"]),
        ("dns:///coordinator.example:7070", ["dns:///coordinator.example:7070"]),
        ("10.0.0.1:7070, 10.0.0.2:7071", ["ipv4:10.0.0.1:7070", "ipv4:10.0.0.2:7071"]),
        ("ipv4:10.0.0.1:7070,10.0.0.2:7070", ["ipv4:10.0.0.1:7070", "ipv4:10.0.0.2:7070"]),
        (["[::1]:7070", "[::2]:7070"], ["ipv6:[::1]:7070", "ipv6:[::2]:7070"]),
    ],
)
def test_each_replica_given_gets_a_channel_of_its_own(
    given_target: str | list[str], targets: list[str]
) -> None:
    assert endpoint_targets(given_target) == targets


def test_a_failed_try_moves_the_client_on_once_however_many_calls_failed_there() -> None:
    endpoints = Endpoints(["a", "b", "c"], first=1)
    assert endpoints.current == 1
    for _ in range(5):  # five calls that all tried b fail together
        endpoints.failed(1)
    assert endpoints.current == 2  # moved on once, not five times
    endpoints.failed(2)
    assert endpoints.current == 0  # round the list
    alone = Endpoints(["a"], first=0)
    alone.failed(0)
    assert (alone.current, alone.channel) == (0, "a")  # one replica: its channel itself


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "Socket closed"


def test_a_call_plan_counts_its_budget_from_the_first_failure() -> None:
    now = [100.0]
    plan = CallPlan(
        CallRetry(),
        (),
        clock=lambda: now[0],
        retry=True,
        timeout=None,
        idempotency_key="",
        lease_left=None,
        hint="",
    )
    now[0] = 116.0  # a 20 s long poll whose replica went away 16 s in
    plan.first_failed(_Unavailable(), Endpoints([object()], first=0), 0)
    assert plan.deadline == 116.0 + CallRetry().budget.total_seconds()
