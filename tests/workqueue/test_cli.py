"""``coordinator tasks retry``, the SDK's view of a dead letter and its long-poll ClaimNext,
against a real server."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from click.testing import CliRunner

from coordinator.cli import main
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Claim, DeadLetterReason, Outcome, TaskRetryPolicy, TaskState
from tests.helpers import eventually
from tests.sdk.support import QUEUE, served


def test_tasks_retry_sends_a_dead_letter_back_with_a_fresh_budget(
    etcd: EtcdProcess, prefix: str
) -> None:
    with served(etcd.endpoint, prefix) as running, running.client("w1") as client:
        policy = TaskRetryPolicy(max_attempts=2, initial_backoff=timedelta(0), backoff_jitter=0.4)
        client.create_task("t1", input=b"in", queue=QUEUE, retry_policy=policy)
        for _ in range(2):
            claim = client.claim("t1", ttl=timedelta(seconds=30))
            assert isinstance(claim, Claim)
            claim.fail(ValueError("bad row 7"))
        dead = client.get_task("t1")
        assert (dead.state, dead.dead_letter_reason, dead.attempts_counted) == (
            TaskState.FAILED,
            DeadLetterReason.EXHAUSTED,
            2,
        )
        assert dead.last_error == "ValueError: bad row 7"
        assert (dead.retry_policy.max_attempts, dead.retry_policy.backoff_jitter) == (2, 0.4)

        base = ["tasks", "retry", "--target", running.target, "--insecure"]
        out = CliRunner().invoke(main, [*base, "t1", "--reason", "fixed row 7"])
        assert out.exit_code == 0, out.output
        # (The in-process server's log lines land in the same captured output.)
        assert (
            out.output.splitlines()[-1]
            == "t1 READY (next attempt #3, a fresh budget of 2 attempts)"
        )
        task = client.get_task("t1")
        assert (task.state, task.attempts_counted) == (TaskState.READY, 0)
        gone = CliRunner().invoke(main, [*base, "ghost"])
        assert gone.exit_code != 0
        assert "ghost" in gone.output


def test_the_sdk_long_polls_for_a_task(etcd: EtcdProcess, prefix: str) -> None:
    with (
        served(etcd.endpoint, prefix) as running,
        running.client("w1") as client,
        running.client("pm") as producer,
    ):
        empty = client.claim_next(QUEUE, ttl=timedelta(seconds=30), wait=timedelta(seconds=0.3))
        assert not isinstance(empty, Claim) and empty.outcome is Outcome.NO_READY_TASK
        with ThreadPoolExecutor(max_workers=1) as pool:
            waiting = pool.submit(
                client.claim_next, QUEUE, ttl=timedelta(seconds=30), wait=timedelta(seconds=15)
            )
            eventually(lambda: running.store.long_poll.waiting() == 1, message="not waiting")
            producer.create_task("t1", input=b"in", queue=QUEUE)
            claim = waiting.result(timeout=20)
        assert isinstance(claim, Claim) and claim.task_id == "t1"
        # The lease clock starts at the answer, not at the call: the wait is not taken off.
        assert claim.remaining() > timedelta(seconds=20)
        claim.release("done with the test")


def test_iter_tasks_reads_a_page_at_a_time_as_it_is_consumed(
    etcd: EtcdProcess, prefix: str
) -> None:
    with served(etcd.endpoint, prefix) as running, running.client("pm") as client:
        for n in range(5):
            client.create_task(f"t{n}", queue=QUEUE)
        tasks = client.iter_tasks(queue=QUEUE, page_size=2)
        assert [next(tasks).task_id for _ in range(2)] == ["t0", "t1"]  # the first page
        client.create_task("t9", queue=QUEUE)  # after it was read: a later page has it
        assert [t.task_id for t in tasks] == ["t2", "t3", "t4", "t9"]
        assert [t.task_id for t in client.list_tasks(queue=QUEUE, page_size=2)] == [
            "t0",
            "t1",
            "t2",
            "t3",
            "t4",
            "t9",
        ]
