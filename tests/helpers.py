"""Test helpers shared across the suite. Waits poll with a deadline; tests never sleep blindly."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def eventually(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "condition did not become true",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that value.

    An AssertionError raised by the predicate counts as "not yet", so a block of asserts can be
    polled too. On the deadline the test fails with ``message`` and the last value or assertion.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = predicate()
        except AssertionError as exc:
            last = f"last assertion: {exc}"
        else:
            if result:
                return result
            last = f"last value {result!r}"
        if time.monotonic() >= deadline:
            pytest.fail(f"{message} (not within {timeout}s; {last})")
        time.sleep(interval)
