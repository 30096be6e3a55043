"""Fixtures of the managed-job tests: the server fixtures (a real store and gRPC server on the
session etcd, task "t-1" claimed by worker-a) for the RPC tests."""

from __future__ import annotations

from tests.server.conftest import (  # noqa: F401 - fixtures, found by name
    admin,
    channel,
    claimed,
    keyspace,
    server,
    store,
    tasks,
    worker,
)
