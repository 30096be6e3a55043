"""Flag: the one-way, waitable flag behind a Claim's stop and lost signals."""

from __future__ import annotations

import threading

from coordinator.sdk._flag import Flag
from tests.helpers import eventually


def test_wait_times_out_while_unset() -> None:
    flag = Flag()
    assert not flag.wait(0.01)
    assert not flag.is_set()


def test_set_before_wait_is_seen_at_once() -> None:
    flag = Flag()
    flag.set()
    flag.set()  # idempotent
    assert flag.is_set() and flag.wait(0) and flag.wait()


def test_set_wakes_every_waiter() -> None:
    flag = Flag()
    woke: list[bool] = []

    def waiter() -> None:
        woke.append(flag.wait(30))

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for thread in threads:
        thread.start()
    # Set once a waiter made the event it blocks on (others may still be on their way in:
    # set() must wake them too).
    eventually(lambda: flag._event is not None, timeout=10)
    flag.set()
    for thread in threads:
        thread.join(10)
    assert woke == [True, True, True]
