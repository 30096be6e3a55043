"""Fixtures of the work-queue tests (Fail, retry policy, delays, deadlines, checkpoints, long
polls): the store fixtures (``make_store`` on a ManualClock); the server fixtures (``server``,
``worker``, ``tasks``, ``admin``, ``claimed``, ``keyspace``) are the shared ones
(tests/fixtures.py), each on this test's own key prefix."""

from __future__ import annotations

from tests.store.conftest import clock, make_store  # noqa: F401 (fixtures)
