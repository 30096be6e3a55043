"""Fixtures of the work-queue tests (Fail, retry policy, delays, deadlines, checkpoints, long
polls): the store fixtures (``make_store`` on a ManualClock) and the server fixtures
(``server``, ``worker``, ``tasks``, ``admin``, ``claimed``, ``keyspace``), each on this test's
own key prefix."""

from __future__ import annotations

from tests.server.conftest import (  # noqa: F401 (fixtures)
    admin,
    channel,
    claimed,
    keyspace,
    server,
    store,
    tasks,
    worker,
)
from tests.store.conftest import clock, make_store  # noqa: F401 (fixtures)
