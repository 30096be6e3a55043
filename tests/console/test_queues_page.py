"""The queues page over HTTP: the oldest ready task's age per queue, the server's own figure
(GetStats, behind coordinator_queue_oldest_ready_age_seconds), on a store whose clock the test
moves; a worker, who may not read GetStats, sees why instead of a number."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.keys import Keyspace
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.sdk import Claim
from coordinator.store import EtcdKV, Store
from tests.console.conftest import Stack
from tests.console.http_client import signed_in
from tests.helpers import eventually


@pytest.fixture
def clock() -> ManualClock:
    """The store's clock (the ready index's ages are taken from it)."""
    return ManualClock()


@pytest.fixture
def store(etcd: EtcdProcess, prefix: str, metrics: Metrics, clock: ManualClock) -> Iterator[Store]:
    """The shared ``store`` fixture, on ``clock``."""
    kv = EtcdKV.connect([etcd.endpoint], timeout=5.0)
    store = Store.open(kv, keys=Keyspace(prefix), clock=clock, scan_interval=1.0, metrics=metrics)
    store.start()
    try:
        yield store
    finally:
        store.close()
        kv.close()


def _oldest(page: str, queue: str) -> str:
    row = page.split(f'href="/tasks?queue={queue}"', 1)[1].split("</tr>", 1)[0]
    found = re.search(r'data-label="oldest ready" class="num oldest">([^<]*)<', row)
    assert found is not None, row
    return found.group(1)


def test_the_oldest_ready_age_is_shown_per_queue(stack: Stack, clock: ManualClock) -> None:
    with stack.client("pm-1") as pm:
        pm.create_task("old-1", queue="reports", input=b"in")
        clock.advance(60)
        pm.create_task("old-2", queue="reports", input=b"in")
        clock.advance(65)
        pm.create_task("new-1", queue="emails", input=b"in")
        pm.create_task("later-1", queue="later", input=b"in")
    with stack.client("worker-a") as worker:
        assert isinstance(worker.claim("later-1", ttl=timedelta(seconds=30)), Claim)
    client = signed_in(stack.url, stack.token("pm-1"))

    def shown() -> tuple[str, str, str]:
        page = client.get("/queues").text
        return _oldest(page, "reports"), _oldest(page, "emails"), _oldest(page, "later")

    # reports' oldest waited 125 s; emails' was just made READY; later's only task is claimed.
    assert eventually(lambda: shown() == ("2 min 5 s", "0 s", "-"))


def test_a_worker_sees_why_there_is_no_age(stack: Stack) -> None:
    with stack.client("pm-1") as pm:
        pm.create_task("old-1", queue="reports", input=b"in")
    page = signed_in(stack.url, stack.token("worker-a")).get("/queues").text
    assert _oldest(page, "reports") == "-"
    assert "Oldest ready age: PERMISSION_DENIED: principal &#39;worker-a&#39;" in page
    assert "/coordinator.v1.AdminService/GetStats" in page
