"""Fixtures of the SDK tests: ``sdk``, one test body run against both SDKs (tests/sdk/both.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sdk.both import Sdk


@pytest.fixture(params=["sync", "async"])
def sdk(request: pytest.FixtureRequest) -> Iterator[Sdk]:
    """The SDK under test: its clients are closed after the test."""
    made = Sdk(request.param)
    try:
        yield made
    finally:
        made.close()
