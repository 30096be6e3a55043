"""Fixtures of the owned-reconciliation tests: the store fixtures (``make_store``, ``clock``) and
the server fixtures, each on this test's own key prefix."""

from __future__ import annotations

from tests.server.conftest import (  # noqa: F401 (fixtures)
    admin,
    channel,
    keyspace,
    server,
    tasks,
    worker,
)
from tests.store.conftest import clock, make_store  # noqa: F401 (fixtures)
