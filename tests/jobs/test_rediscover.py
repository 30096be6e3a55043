"""``rediscover`` after a worker restart, with real processes.

A worker process is SIGKILLed while its managed jobs run (they live on: their own sessions).
Another worker takes over one task after its lease expires. The restarted worker's rediscover
must kill the orphan of the superseded attempt, re-attach the job of the still-current one, and
never signal a process whose pid matches a record but whose start time does not.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from coordinator import lifeline
from coordinator.domain.jobs import JobRecord, JobState, RediscoverAction
from coordinator.domain.records import decode
from coordinator.etcd_process import EtcdProcess
from coordinator.fence_wire import fence_to_proto
from coordinator.sdk import Claim, ClaimLost, WorkerClient
from coordinator.sdk._proc import group_members, is_running, signal_group, start_ticks
from coordinator.sdk.managed import exit_ref
from coordinator.v1 import worker_pb2
from tests.helpers import eventually
from tests.sdk.support import QUEUE, Served, served

pytestmark = pytest.mark.slow

GRACE = timedelta(seconds=1)
REPO = Path(__file__).resolve().parents[2]
NO_SUCH_PID = 4_194_304 + 77  # above the largest pid_max Linux allows


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    """A coordinator on this test's prefix with READY tasks "a" and "b"."""
    with served(etcd.endpoint, prefix) as running, running.client("producer") as producer:
        for task_id in ("a", "b"):
            producer.create_task(task_id, input=task_id.encode(), queue=QUEUE)
        yield running


@pytest.fixture
def groups() -> Iterator[list[int]]:
    """Process groups to SIGKILL after the test, whatever happened."""
    started: list[int] = []
    yield started
    for pgid in started:
        signal_group(pgid, signal.SIGKILL)


def stored(etcd_client: Any, prefix: str) -> dict[str, JobRecord]:
    records = [decode(JobRecord, v) for v, _ in etcd_client.get_prefix(f"{prefix}/jobs/")]
    return {r.task_id: r for r in records}


def tree_of(pgid: int, size: int) -> dict[int, int]:
    """The group's processes as {pid: start time}, once it has ``size`` of them (else empty)."""
    tree = {p: t for p in group_members(pgid) if (t := start_ticks(p)) is not None}
    return tree if len(tree) == size else {}


def alive(tree: dict[int, int]) -> list[int]:
    return sorted(pid for pid, ticks in tree.items() if is_running(pid, ticks))


def take_over(client: WorkerClient, task_id: str) -> Claim | None:
    job = client.claim(task_id, ttl=timedelta(seconds=30))
    return job if isinstance(job, Claim) else None


def test_restart_kills_the_superseded_orphan_and_reattaches_the_current_job(
    coordinator: Served, tmp_path: Path, etcd_client: Any, prefix: str, groups: list[int]
) -> None:
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.jobs.job_worker", "--target", coordinator.target),
            *("--principal", "w1", "--log-dir", str(tmp_path), "--task", "a:2", "--task", "b:30"),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    lifeline.kill_with_parent(worker.pid)  # dies with this test run
    lines: list[dict[str, Any]] = []
    reader = threading.Thread(
        target=lambda: lines.extend(json.loads(line) for line in worker.stdout or ()),
        daemon=True,
    )
    reader.start()
    try:
        eventually(lambda: any(line.get("ready") for line in lines), timeout=30)
        jobs = {line["task"]: line for line in lines if "task" in line}
        groups.extend(j["pid"] for j in jobs.values())
        # Each job's group: the leader, the shell and its sleep, as (pid, start time).
        trees = {task: eventually(partial(tree_of, j["pid"], 3)) for task, j in jobs.items()}
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert {t: len(alive(tree)) for t, tree in trees.items()} == {"a": 3, "b": 3}

    with coordinator.client("w2") as w2:
        taken = eventually(lambda: take_over(w2, "a"), timeout=15)  # a's 2 s lease ran out
        assert taken is not None
        assert taken.generation > jobs["a"]["gen"]

        with coordinator.client("w1") as restarted:
            found = {r.job.task_id: r for r in restarted.rediscover(grace=GRACE)}
            assert set(found) == {"a", "b"}
            a, b = found["a"], found["b"]
            assert (a.action, a.current, a.job.state) == (
                RediscoverAction.KILL,
                False,
                JobState.KILLED,
            )
            assert a.process is None and alive(trees["a"]) == []
            assert (b.action, b.current, b.job.state) == (
                RediscoverAction.REATTACH,
                True,
                JobState.RUNNING,
            )
            assert alive(trees["b"]) == sorted(trees["b"])
            assert stored(etcd_client, prefix)["a"].state is JobState.KILLED
            assert stored(etcd_client, prefix)["b"].state is JobState.RUNNING

            with pytest.raises(ClaimLost, match="not the job's"):
                restarted.resume(a.job, ttl=timedelta(seconds=30))  # a moved on to w2

            # The restarted worker resumes b's attempt from the record's fence, ties the
            # re-attached job to it and commits: the job, whose authority ends, is killed.
            handle = b.process
            assert handle is not None and handle.alive() and handle.job_id == jobs["b"]["job_id"]
            with restarted.resume(b.job, ttl=timedelta(seconds=30)) as resumed:
                assert resumed.generation == jobs["b"]["gen"]
                handle.bind(resumed)
                assert resumed.commit(b"b, after a restart", evidence=handle.evidence).committed
                result = handle.wait(timedelta(seconds=10))
            assert result is not None and (result.state, result.recorded) == (JobState.KILLED, True)
            assert "committed" in result.detail
            assert alive(trees["b"]) == []

            # Rediscovering again only reports: both are terminal now.
            again = restarted.rediscover(grace=GRACE)
            assert sorted((r.job.task_id, r.action, r.job.state) for r in again) == [
                ("a", RediscoverAction.REPORT, JobState.KILLED),
                ("b", RediscoverAction.REPORT, JobState.KILLED),
            ]


def test_rediscover_never_kills_a_reused_pid_and_records_what_it_can_know(
    coordinator: Served, tmp_path: Path, etcd_client: Any, prefix: str, groups: list[int]
) -> None:
    # A process that is not the job's but has the recorded pid (as after pid reuse): same pid,
    # another start time.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    groups.append(stranger.pid)
    ticks = start_ticks(stranger.pid)
    assert ticks is not None
    exited_log = tmp_path / "j-exited.log"
    Path(exit_ref(str(exited_log))).write_text("7")  # what a job's leader leaves when it ends

    with coordinator.client("w1") as w1:
        job = take_over(w1, "a")
        assert job is not None
        here = socket.gethostname()
        for job_id, host, pid, start, log in [
            ("j-reused", here, stranger.pid, ticks - 1, tmp_path / "j-reused.log"),
            ("j-exited", here, NO_SUCH_PID, 5, exited_log),
            ("j-lost", here, NO_SUCH_PID, 5, tmp_path / "j-lost.log"),
            # pid and start time match a process here, but the job ran on another host.
            ("j-elsewhere", f"not-{here}", stranger.pid, ticks, tmp_path / "j-elsewhere.log"),
        ]:
            request = worker_pb2.StartJobRequest(
                fence=fence_to_proto(job.fence),
                job_id=job_id,
                host=host,
                pid=pid,
                start_ticks=start,
                argv=["sleep", "300"],
                log_ref=str(log),
            )
            assert job.call(lambda worker: worker.StartJob, request).outcome == 1
        job.release("superseded on purpose")  # the attempt is no longer current

        found = {r.job.job_id: r for r in w1.rediscover(grace=GRACE)}
        outcomes = {
            k: (r.action, r.current, r.job.state, r.job.exit_code) for k, r in found.items()
        }
        assert outcomes == {
            "j-reused": (RediscoverAction.MARK_LOST, False, JobState.LOST, 0),
            "j-exited": (RediscoverAction.RECORD_EXIT, False, JobState.EXITED, 7),
            "j-lost": (RediscoverAction.MARK_LOST, False, JobState.LOST, 0),
            "j-elsewhere": (RediscoverAction.ELSEWHERE, False, JobState.RUNNING, 0),
        }
        assert stranger.poll() is None and is_running(stranger.pid, ticks)
    states = sorted(
        (r.job_id, r.state)
        for r in (decode(JobRecord, v) for v, _ in etcd_client.get_prefix(f"{prefix}/jobs/"))
    )
    assert states == [
        ("j-elsewhere", JobState.RUNNING),
        ("j-exited", JobState.EXITED),
        ("j-lost", JobState.LOST),
        ("j-reused", JobState.LOST),
    ]
    os.kill(stranger.pid, signal.SIGKILL)
    stranger.wait()
