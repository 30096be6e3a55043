"""``--target``: the client-side scenarios against an already running coordinator (staging)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.runner import run_scenario
from coordinator.etcd_process import EtcdProcess
from tests.sdk.support import served

pytestmark = pytest.mark.slow


def test_the_pause_scenario_runs_against_a_deployed_coordinator(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    with served(etcd.endpoint, prefix) as running:
        result = run_scenario(
            "worker-pause", duration=3, seed=3, root=tmp_path, target=running.target
        )
        with running.client("observer") as observer:
            queues = {t.queue for t in observer.list_tasks()}
    assert result.verdict is not None and result.verdict.violations == ()
    assert result.verdict.fenced.get("SUPERSEDED", 0) >= 1
    assert result.verdict.fence_checks > 0
    assert len(queues) == 1 and queues.pop().startswith("chaos-")  # a queue of its own


def test_server_side_faults_are_skipped_with_a_reason_against_a_deployed_coordinator() -> None:
    result = run_scenario("replica-kill", duration=1, seed=1, target="127.0.0.1:1")
    assert result.verdict is None
    assert "server-side fault" in result.skipped


def test_the_stream_flood_is_not_run_against_a_deployed_coordinator() -> None:
    result = run_scenario("abuse", duration=1, seed=1, target="127.0.0.1:1")
    assert result.verdict is None
    assert result.skipped.startswith("local harness only (not --target): it floods")
