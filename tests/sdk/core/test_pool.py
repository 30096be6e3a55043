"""A pool's pure rules (sdk/_core/pool.py), as both pools use them: the backoff after empty
polls and which of them are logged, which ClaimNext a claim loop sends and what its answer won,
and which ending a settled claim counts as."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import InvalidArgument, NotFound, PermissionDenied
from coordinator.sdk._core.pool import (
    GIVE_BACK_TIMEOUT,
    Ending,
    MultiSlot,
    PollBackoff,
    Polling,
    PoolSettings,
    Tally,
    after_handler,
    cut_off,
    given_back,
    poll_answer,
    poll_call,
    released,
    unsettled,
)
from coordinator.sdk.types import ClaimRefused, TransportError


def test_empty_polls_double_the_wait_and_log_each_reason_once() -> None:
    polling = Polling(PollBackoff(initial=timedelta(seconds=1), maximum=timedelta(seconds=4)))
    answers = [polling.empty("NO_READY_TASK", 0.0) for _ in range(4)]
    assert answers == [(True, 1.0), (False, 2.0), (False, 4.0), (False, 4.0)]
    assert polling.empty("unreachable: down", 0.0) == (True, 4.0)  # a new reason is logged
    polling.claimed()
    assert polling.empty("unreachable: down", 0.0) == (False, 1.0)  # back to the initial wait


def test_a_poll_that_reached_no_coordinator_is_logged_as_a_warning_an_empty_queue_not() -> None:
    # A worker pointed at nothing said so at info level only, easy to miss.
    polling = Polling(PollBackoff(initial=timedelta(seconds=1), maximum=timedelta(seconds=4)))
    with capture_logs() as logs:
        polling.nothing("q", "NO_READY_TASK", 0.0)
        why = poll_answer(TransportError("down", code="UNAVAILABLE"))
        assert isinstance(why, str)
        polling.nothing("q", why, 0.0)
    assert [(e["log_level"], e["why"]) for e in logs] == [
        ("info", "NO_READY_TASK"),
        ("warning", "unreachable: down"),
    ]


def test_a_long_poll_that_waited_on_the_server_counts_towards_the_wait() -> None:
    polling = Polling(PollBackoff(initial=timedelta(seconds=2), maximum=timedelta(seconds=8)))
    assert polling.empty("NO_READY_TASK", 0.5) == (True, 1.5)
    assert polling.empty("NO_READY_TASK", 10.0) == (False, 0.0)  # waited longer already


@pytest.mark.parametrize(
    ("finished", "lost", "ending"),
    [
        ("committed", False, Ending.COMMITTED),
        ("committed", True, Ending.COMMITTED),  # its commit landed: the store decided
        ("", True, Ending.LOST),
        ("", False, None),  # still held: the pool fails or releases it
        # The handler ended it itself (claim.fail, claim.release) and returned None: nothing
        # is left to release (the release was refused FENCED, and the pool said "released").
        ("failed", False, Ending.FAILED),
        ("released", False, Ending.RELEASED),
    ],
)
def test_after_the_handler(finished: str, lost: bool, ending: Ending | None) -> None:
    assert after_handler(finished, lost) is ending


@pytest.mark.parametrize(
    ("given", "committed", "ending"),
    [
        (Ending.FAILED, False, Ending.CUT_OFF),
        (Ending.LOST, False, Ending.LOST),
        (Ending.FAILED, True, Ending.COMMITTED),
        (Ending.LOST, True, Ending.COMMITTED),
    ],
)
def test_a_claim_cut_off_at_the_end_of_the_grace(
    given: Ending, committed: bool, ending: Ending
) -> None:
    assert cut_off(given, committed) is ending


def test_give_back_release_and_unsettled_endings() -> None:
    assert (given_back(False), given_back(True)) == (Ending.FAILED, Ending.LOST)
    assert (released(False), released(True)) == (Ending.RELEASED, Ending.COMMITTED)
    assert (unsettled(False), unsettled(True)) == (Ending.UNSETTLED, Ending.COMMITTED)


def test_settings_take_seconds_and_refuse_what_no_pool_can_run() -> None:
    settings = PoolSettings.of(
        ["a", "b"], max_concurrent=4, ttl=30, grace=5, poll=None, long_poll=10
    )
    assert (settings.ttl, settings.grace, settings.poll) == (
        timedelta(seconds=30),
        timedelta(seconds=5),
        PollBackoff(),
    )
    assert settings.stop_deadlines(100.0) == (105.0, 105.0 + GIVE_BACK_TIMEOUT.total_seconds())
    with pytest.raises(InvalidArgument, match="distinct queues"):
        PoolSettings.of(["a", "a"], max_concurrent=1, ttl=30, grace=5, poll=None, long_poll=10)
    with pytest.raises(InvalidArgument, match="max_concurrent must be 1 to 256"):
        PoolSettings.of(["a"], max_concurrent=0, ttl=30, grace=5, poll=None, long_poll=10)


def test_the_tally_reports_the_endings_or_raises_the_first_fatal_error() -> None:
    tally = Tally()
    for ending in (Ending.COMMITTED, Ending.COMMITTED, Ending.LOST):
        tally.count(ending)
    report = tally.report()
    assert (report.count(Ending.COMMITTED), report.count(Ending.LOST)) == (2, 1)
    assert report.count(Ending.CUT_OFF) == 0
    first, second = NotFound("no queue"), PermissionDenied("no role")
    tally.failed(first)
    tally.failed(second)
    with pytest.raises(NotFound) as raised:
        tally.report()
    assert raised.value is first


def test_a_multi_slot_pool_fills_every_free_slot_in_one_call_and_commits_with_next() -> None:
    assert MultiSlot.of(8) == MultiSlot(max_concurrent=8, claim_batch=8, commit_then_next=True)
    assert MultiSlot.of(1) == MultiSlot(1, 1, True)
    # One ClaimNext wins at most 64 tasks: more slots than that fill in several calls.
    assert MultiSlot.of(256) == MultiSlot(256, 64, True)
    for bad in (0, 257):
        with pytest.raises(InvalidArgument, match=f"slots must be 1 to 256, got {bad}"):
            MultiSlot.of(bad)


class _Client:
    """Records the ClaimNext a claim loop sends."""

    def claim_next(self, queue: str, **options: Any) -> tuple[str, str, dict[str, Any]]:
        return "claim_next", queue, options

    def claim_many(self, queue: str, **options: Any) -> tuple[str, str, dict[str, Any]]:
        return "claim_many", queue, options


def test_one_free_slot_polls_with_claim_next_and_more_with_claim_many() -> None:
    settings = PoolSettings.of(
        ["q"], max_concurrent=4, ttl=9, grace=1, poll=None, long_poll=timedelta(seconds=5)
    )
    on_lost = print
    assert poll_call("q", 1, settings, on_lost, abort="A")(_Client()) == (
        "claim_next",
        "q",
        {
            "ttl": timedelta(seconds=9),
            "on_lost": on_lost,
            "wait": timedelta(seconds=5),
            "abort": "A",
        },
    )
    assert poll_call("q", 3, settings, on_lost)(_Client()) == (
        "claim_many",
        "q",
        {
            "ttl": timedelta(seconds=9),
            "max_tasks": 3,
            "on_lost": on_lost,
            "wait": timedelta(seconds=5),
        },
    )


def test_a_polls_answer_is_the_claims_it_won_or_why_none() -> None:
    refused = ClaimRefused(Outcome.NO_READY_TASK, FenceReason.NONE, "")
    assert poll_answer(refused) == "NO_READY_TASK"
    assert poll_answer(TransportError("down", code="UNAVAILABLE")) == "unreachable: down"
    assert poll_answer("claim") == ["claim"]
    assert poll_answer(["c1", "c2"]) == ["c1", "c2"]
