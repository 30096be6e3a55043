"""``coordinator worker --slots N`` as a real process against a real coordinator: one ClaimNext
fills every free slot and each commit claims its slot's next task, so the calls are far fewer
than the tasks, and every task still runs exactly once. The server's own RPC metrics count the
calls (the worker is another process: no client interceptor can)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from coordinator.cli import main
from coordinator.domain.states import AttemptEnd, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.sdk import WorkerClient
from tests.helpers import eventually
from tests.pool.test_worker_process import exit_code, start_worker
from tests.sdk.support import QUEUE, Served, served

SLOTS, TASKS = 8, 48
WORKER = "/coordinator.v1.WorkerService/"


@pytest.fixture
def metrics() -> Metrics:
    """A registry of this test's own, so it reads its calls, not the process's."""
    return Metrics(CollectorRegistry())


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str, metrics: Metrics) -> Iterator[Served]:
    """A coordinator (no authentication) on this test's prefix, counting on ``metrics``."""
    with served(etcd.endpoint, prefix, metrics=metrics) as running:
        yield running


def calls(metrics: Metrics, method: str) -> int:
    """How many ``method`` calls of WorkerService the server answered."""
    value = metrics.registry.get_sample_value(
        "coordinator_rpc_duration_seconds_count", {"method": WORKER + method}
    )
    return int(value or 0)


def test_a_multi_slot_worker_carries_several_tasks_per_call_and_runs_each_once(
    coordinator: Served, metrics: Metrics, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.touch()  # every handler finishes at once: the slots are what is measured
    with coordinator.client("producer") as producer:
        for n in range(TASKS):
            producer.create_task(f"t{n:02d}", queue=QUEUE, input=f"gate {gate}".encode())
        proc = start_worker(coordinator.target, tmp_path, max_concurrent=SLOTS, grace=5, slots=True)
        try:
            eventually(lambda: _all_done(producer), timeout=60, message="tasks left undone")
            # A commit's call is counted once it answered, after its txn made the task DONE
            # (and after the claim of its slot's next task): wait for the last ones.
            eventually(lambda: calls(metrics, "Commit") >= TASKS, message="commits unanswered")
            claim_nexts, commits = calls(metrics, "ClaimNext"), calls(metrics, "Commit")
            proc.terminate()
            assert exit_code(proc, tmp_path, 5) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        for n in range(TASKS):
            task_id = f"t{n:02d}"
            assert [a.end for a in producer.attempts(task_id)] == [AttemptEnd.COMMITTED], task_id
            assert producer.get_result(task_id).result == f"done {task_id}".encode()
    assert commits == TASKS
    # The first ClaimNext fills all 8 slots; each commit then claims its slot's next task, so
    # the other 40 tasks came with commits. The ClaimNexts after that are the idle loop's long
    # polls once the queue ran dry (and a few while a slot's commit found nothing yet).
    assert claim_nexts <= TASKS // 4, claim_nexts


def _all_done(producer: WorkerClient) -> bool:
    tasks = producer.list_tasks(queue=QUEUE)
    return len(tasks) == TASKS and all(t.state is TaskState.DONE for t in tasks)


@pytest.mark.parametrize(
    "flag", [["--max-concurrent", "2"], ["--claim-batch", "2"], ["--commit-then-next"]]
)
def test_slots_with_a_flag_it_sets_is_a_usage_error(flag: list[str]) -> None:
    result = CliRunner().invoke(main, ["worker", "x:y", "--queue", "q", "--slots", "4", *flag])
    assert result.exit_code == 2
    assert f"--slots sets {flag[0]} itself: give one or the other" in result.output
