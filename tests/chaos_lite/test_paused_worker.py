"""A real worker process frozen (SIGSTOP) past its TTL: its late commit must be FENCED.

The scenario of the seeds: the paused process does not know it expired; another worker takes
the task over and commits; the first one wakes up and commits its stale result. The store, not
the SDK, must refuse it, and the task must keep exactly one canonical result.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from coordinator.demo.worker import WorkerProcess
from coordinator.domain.records import ResultRecord, decode
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Claim, TaskState, WorkerClient
from tests.helpers import eventually
from tests.sdk.support import QUEUE, Served, served

pytestmark = pytest.mark.slow


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    """A coordinator on this test's prefix, with one READY task "t1"."""
    with served(etcd.endpoint, prefix) as running, running.client("producer") as producer:
        producer.create_task("t1", input=b"input", queue=QUEUE)
        yield running


@pytest.fixture
def sleeper(coordinator: Served) -> Iterator[WorkerProcess]:
    """A worker process that announces its first task and is frozen (SIGSTOP) right then."""
    worker = WorkerProcess("sleeper", coordinator.target, queue=QUEUE, ttl=1, hold_first=1.0)
    worker.start(on_holding=lambda _: worker.signal(signal.SIGSTOP))
    try:
        yield worker
    finally:
        worker.stop()


def claim_if_free(client: WorkerClient) -> Claim | None:
    """Claim t1 if its lease has expired (a direct claim works before the reclaimer runs)."""
    claim = client.claim("t1", ttl=timedelta(seconds=10))
    return claim if isinstance(claim, Claim) else None


def test_a_worker_frozen_past_its_ttl_is_fenced_on_commit(
    coordinator: Served, sleeper: WorkerProcess, etcd_client: Any, prefix: str
) -> None:
    holding = sleeper.wait_for("holding", timeout=20)
    assert holding is not None and holding["task"] == "t1"

    with coordinator.client("rescuer") as rescuer:
        rescue = eventually(lambda: claim_if_free(rescuer), timeout=15)
        with rescue as claim:
            assert claim.generation > holding["generation"]
            assert claim.commit(b"rescued").committed

        sleeper.signal(signal.SIGCONT)
        late = sleeper.wait_for("commit", timeout=20, task="t1")
        assert late is not None, sleeper.records
        assert late["generation"] == holding["generation"]
        assert (late["outcome"], late["reason"]) == ("FENCED", "SUPERSEDED")

        task = rescuer.get_task("t1")
    assert task.state is TaskState.DONE
    assert task.result_commit_id == f"{claim.fence.attempt_id}@{claim.generation}"
    generations = [a.claim_generation for a in task.attempts]
    assert len(generations) == 2 and generations[0] < generations[1]

    stored = list(etcd_client.get_prefix(f"{prefix}/results/t1/"))
    assert len(stored) == 1  # exactly one canonical result, the rescuer's
    result = decode(ResultRecord, stored[0][0])
    assert (result.owner_id, result.claim_generation) == ("rescuer", claim.generation)
