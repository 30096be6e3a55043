"""A pool's pure rules (sdk/_core/pool.py), as both pools use them: the backoff after empty
polls and which of them are logged, and which ending a settled claim counts as."""

from __future__ import annotations

from datetime import timedelta

import pytest

from coordinator.errors import InvalidArgument, NotFound, PermissionDenied
from coordinator.sdk._core.pool import (
    GIVE_BACK_TIMEOUT,
    Ending,
    PollBackoff,
    Polling,
    PoolSettings,
    Tally,
    after_handler,
    cut_off,
    given_back,
    released,
    unsettled,
)


def test_empty_polls_double_the_wait_and_log_each_reason_once() -> None:
    polling = Polling(PollBackoff(initial=timedelta(seconds=1), maximum=timedelta(seconds=4)))
    answers = [polling.empty("NO_READY_TASK", 0.0) for _ in range(4)]
    assert answers == [(True, 1.0), (False, 2.0), (False, 4.0), (False, 4.0)]
    assert polling.empty("unreachable: down", 0.0) == (True, 4.0)  # a new reason is logged
    polling.claimed()
    assert polling.empty("unreachable: down", 0.0) == (False, 1.0)  # back to the initial wait


def test_a_long_poll_that_waited_on_the_server_counts_towards_the_wait() -> None:
    polling = Polling(PollBackoff(initial=timedelta(seconds=2), maximum=timedelta(seconds=8)))
    assert polling.empty("NO_READY_TASK", 0.5) == (True, 1.5)
    assert polling.empty("NO_READY_TASK", 10.0) == (False, 0.0)  # waited longer already


@pytest.mark.parametrize(
    ("committed", "lost", "ending"),
    [
        (True, False, Ending.COMMITTED),
        (True, True, Ending.COMMITTED),  # its commit landed: the store decided
        (False, True, Ending.LOST),
        (False, False, None),  # still held: the pool fails or releases it
    ],
)
def test_after_the_handler(committed: bool, lost: bool, ending: Ending | None) -> None:
    assert after_handler(committed, lost) is ending


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
