"""Suite-wide fixtures: one real etcd per session, a fresh key prefix per test."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from typing import Any

import etcd3
import pytest

from coordinator.cli.local_up import STATE_DIR_ENV
from coordinator.etcd_process import EtcdProcess, find_etcd_binary
from coordinator.logging import configure_logging
from coordinator.store.control import versions

pytest_plugins = ["tests.fixtures"]

# grpc honours $http_proxy; our etcd is on loopback, so never route through a proxy.
GRPC_OPTIONS = [("grpc.enable_http_proxy", 0)]


@pytest.fixture(autouse=True, scope="session")
def _local_up_state(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep ``coordinator up``'s state file (cli/local_up.py) out of the real home, for this
    process and every CLI it starts."""
    os.environ[STATE_DIR_ENV] = str(tmp_path_factory.mktemp("local-up"))


@pytest.fixture(autouse=True, scope="session")
def _logs_on_stderr() -> None:
    """The in-process servers log as a replica does, JSON lines on stderr: the CLI tests read
    what a command prints on stdout, and every call is logged
    (coordinator.server.interceptors.call_log)."""
    configure_logging("info")


@pytest.fixture(autouse=True, scope="session")
def _newest_layout_at_once() -> None:
    """In-process stores write the newest schema's layout from their first call, not a few
    seconds after (``Standing.writes_schema``), so every test runs on it: a task's input in a
    key of its own. Records of the first schema are made on purpose where a test needs them
    (tests/store/test_task_inputs.py); servers run as processes keep the real wait."""
    versions.SETTLE_TTLS = 0


@pytest.fixture(scope="session")
def etcd() -> Iterator[EtcdProcess]:
    """A single-member etcd on free loopback ports, started once for the whole session.

    Compaction off: tests read old revisions (watch resumption, event history)."""
    with EtcdProcess(binary=find_etcd_binary(), compaction_retention=None) as proc:
        yield proc


@pytest.fixture(scope="session")
def etcd_client(etcd: EtcdProcess) -> Iterator[Any]:
    """An ``etcd3`` client connected to the session etcd."""
    client = etcd3.client(etcd.host, etcd.port, timeout=10, grpc_options=GRPC_OPTIONS)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    """A key prefix no other test uses: ``/t/<test name>-<8 hex>``."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name).strip("_")[:60]
    return f"/t/{name}-{secrets.token_hex(4)}"
