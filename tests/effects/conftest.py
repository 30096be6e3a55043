"""Fixtures of the effect tests: the store fixtures (``make_store``) and the server fixtures
(``server``, ``worker``, ``admin``, ``claimed`` ...), each on this test's own key prefix."""

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
