"""A pool's pure rules (sdk/_core/pool.py), as both pools use them: the backoff after empty
polls and which of them are logged, and which ending a settled claim counts as."""

from __future__ import annotations

from datetime import timedelta

import pytest

from coordinator.sdk._core.pool import (
    Ending,
    PollBackoff,
    Polling,
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
