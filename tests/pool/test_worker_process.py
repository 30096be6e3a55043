"""``coordinator worker`` as a real process against a real coordinator: what SIGTERM does.

The process holds claims; after SIGTERM it claims nothing more, removes its readiness file at
once, lets the handlers that finish within the grace commit, gives back what is left when the
grace runs out (a handler deaf to its cancellation included) and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator import lifeline
from coordinator.domain.jobs import JobRecord, JobState
from coordinator.domain.records import decode
from coordinator.domain.states import AttemptEnd, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import WorkerClient
from coordinator.sdk._core.pool import HURRIED
from coordinator.sdk._proc import group_members, signal_group
from coordinator.sdk._signals import DUPLICATE_WINDOW
from coordinator.sdk.pool import GIVE_BACK_TIMEOUT
from tests.helpers import eventually
from tests.sdk.support import QUEUE, Served, served

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-c", "from coordinator.cli import main; main()"]


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    """A coordinator (no authentication) on this test's prefix."""
    with served(etcd.endpoint, prefix) as running:
        yield running


@pytest.fixture
def producer(coordinator: Served) -> Iterator[WorkerClient]:
    """Creates the tasks and reads them back."""
    with coordinator.client("producer") as client:
        yield client


def start_worker(
    target: str,
    tmp_path: Path,
    *,
    max_concurrent: int,
    grace: float,
    principal: str = "pool-1",
    output: int | None = None,
    ttl: int = 30,
    slots: bool = False,
) -> subprocess.Popen[bytes]:
    """``coordinator worker tests.pool.handlers:gated`` on QUEUE, logging to tmp_path (an empty
    ``principal``: no --principal, the verb's default), or with stdout and stderr both going to
    ``output`` (subprocess.PIPE, or a file descriptor) if given. With ``slots``, a multi-slot
    worker: ``--slots max_concurrent`` instead of ``--max-concurrent``."""
    args = [
        "worker",
        "tests.pool.handlers:gated",
        "--queue",
        QUEUE,
        "--slots" if slots else "--max-concurrent",
        str(max_concurrent),
        "--grace",
        str(grace),
        "--ttl",
        str(ttl),
        "--ready-file",
        str(tmp_path / "ready"),
        "--target",
        target,
        "--insecure",
    ]
    if principal:
        args += ["--principal", principal]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    if output is not None:
        proc = subprocess.Popen([*COMMAND, *args], cwd=ROOT, stdout=output, stderr=output, env=env)
    else:
        with (tmp_path / "worker.log").open("wb") as log:
            proc = subprocess.Popen([*COMMAND, *args], cwd=ROOT, stderr=log, env=env)
    lifeline.kill_with_parent(proc.pid)  # dies with this test run
    return proc


def claimed(client: WorkerClient) -> set[str]:
    """The ids of the tasks of QUEUE that are CLAIMED now."""
    return {t.task_id for t in client.list_tasks(queue=QUEUE, state=TaskState.CLAIMED)}


def ends(client: WorkerClient, task_id: str) -> list[AttemptEnd]:
    """How each attempt of the task ended, oldest first."""
    return [a.end for a in client.attempts(task_id)]


def exit_code(proc: subprocess.Popen[bytes], tmp_path: Path, grace: float) -> int:
    """The exit code, awaited for the grace plus the give-back bound plus slack for a busy
    machine (Kubernetes would kill the pod at terminationGracePeriodSeconds)."""
    try:
        return proc.wait(timeout=grace + GIVE_BACK_TIMEOUT.total_seconds() + 20)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the worker did not exit; log:\n{(tmp_path / 'worker.log').read_text()}")


@pytest.mark.parametrize("slots", [False, True], ids=["max-concurrent", "slots"])
def test_sigterm_stops_claiming_commits_the_finished_and_releases_the_rest(
    coordinator: Served, producer: WorkerClient, tmp_path: Path, slots: bool
) -> None:
    # With --slots the three are claimed by one ClaimNext, and the finished ones commit without
    # claiming a next task: a stopping worker claims nothing, so late-1 and late-2 stay READY.
    gate, never, ready = tmp_path / "gate", tmp_path / "never", tmp_path / "ready"
    for task_id in ("fast-1", "fast-2"):
        producer.create_task(task_id, queue=QUEUE, input=f"gate {gate}".encode())
    producer.create_task("slow", queue=QUEUE, input=f"gate {never}".encode())
    grace = 8.0
    proc = start_worker(coordinator.target, tmp_path, max_concurrent=3, grace=grace, slots=slots)
    try:
        eventually(lambda: claimed(producer) == {"fast-1", "fast-2", "slow"}, timeout=30)
        assert ready.read_text().startswith("claiming")
        # Every slot is taken: these wait, READY, and must still be READY after the signal.
        for task_id in ("late-1", "late-2"):
            producer.create_task(task_id, queue=QUEUE, input=f"gate {gate}".encode())

        proc.send_signal(signal.SIGTERM)
        eventually(lambda: not ready.exists(), message="readiness file still there")
        assert proc.poll() is None  # still within the grace: the handlers may finish
        gate.touch()  # fast-1 and fast-2 finish now; slow never does
        assert exit_code(proc, tmp_path, grace) == 0
    finally:
        if proc.poll() is None:
            proc.kill()

    states = {t.task_id: t.state for t in producer.list_tasks(queue=QUEUE)}
    assert states == {
        "fast-1": TaskState.DONE,
        "fast-2": TaskState.DONE,
        "slow": TaskState.READY,
        "late-1": TaskState.READY,
        "late-2": TaskState.READY,
    }
    assert producer.get_result("fast-1").result == b"done fast-1"
    assert producer.get_result("fast-2").result == b"done fast-2"
    assert ends(producer, "slow") == [AttemptEnd.FAILED]  # given back (retryable), not expired
    assert ends(producer, "late-1") == ends(producer, "late-2") == []  # never claimed


def test_a_second_sigterm_cuts_the_grace_short(
    coordinator: Served, producer: WorkerClient, tmp_path: Path
) -> None:
    # A repeated SIGTERM once changed nothing: a 20 s grace was waited out in full. (One sent
    # twice at once is the same stop: tests/pool/test_signals.py.)
    producer.create_task("slow", queue=QUEUE, input=f"gate {tmp_path / 'never'}".encode())
    proc = start_worker(coordinator.target, tmp_path, max_concurrent=1, grace=3600.0)
    log = tmp_path / "worker.log"
    try:
        eventually(lambda: claimed(producer) == {"slow"}, timeout=30)
        eventually((tmp_path / "slow.started").exists, message="not running yet")
        proc.send_signal(signal.SIGTERM)
        eventually(lambda: not (tmp_path / "ready").exists(), message="readiness file still there")
        assert proc.poll() is None  # an hour of grace
        time.sleep(DUPLICATE_WINDOW)
        proc.send_signal(signal.SIGTERM)
        assert exit_code(proc, tmp_path, grace=0.0) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert ends(producer, "slow") == [AttemptEnd.FAILED]  # cancelled and given back at once
    assert HURRIED in log.read_text()
    (attempt,) = producer.attempts("slow")
    assert attempt.error_message == "a second signal cut the shutdown grace short"


def test_a_handler_deaf_to_cancellation_is_cut_off_at_the_grace(
    coordinator: Served, producer: WorkerClient, tmp_path: Path
) -> None:
    producer.create_task("deaf", queue=QUEUE, input=f"stubborn {tmp_path / 'never'}".encode())
    grace = 1.0
    proc = start_worker(coordinator.target, tmp_path, max_concurrent=1, grace=grace, principal="")
    try:
        # The handler runs: the worker holds the claim (a SIGTERM while the claim's answer is
        # still on its way is another case: the poll is cancelled, see sdk/abort.py).
        eventually((tmp_path / "deaf.started").exists, timeout=30)
        proc.send_signal(signal.SIGTERM)
        # The handler thread is still looping: the process exits anyway, claim given back.
        assert exit_code(proc, tmp_path, grace) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    task = producer.get_task("deaf")
    assert (task.state, ends(producer, "deaf")) == (TaskState.READY, [AttemptEnd.FAILED])
    # Without --principal the claims are a worker's, not "operator"'s (the other verbs' default).
    assert [a.owner_id for a in producer.attempts("deaf")] == ["worker"]
    assert not (tmp_path / "ready").exists()
    log = (tmp_path / "worker.log").read_text()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert [line.get("cut_off") for line in lines if line["event"] == "pool stopped"] == [1], log


def test_a_managed_job_dies_with_the_claim_its_stopping_worker_gave_back(
    coordinator: Served, producer: WorkerClient, tmp_path: Path, etcd_client: Any, prefix: str
) -> None:
    """The claim given back at the grace's end ends the job: its group is killed and recorded
    KILLED before the process exits. The watcher is a daemon thread, so the worker used to
    exit first, leaving the job running (a second copy would run beside it) and RUNNING."""
    producer.create_task("build", queue=QUEUE, input=f"job {tmp_path / 'never'}".encode())
    grace = 1.0
    proc = start_worker(coordinator.target, tmp_path, max_concurrent=1, grace=grace)
    try:
        eventually((tmp_path / "build.job").exists, timeout=30)
        pgid = int((tmp_path / "build.job").read_text())
        eventually(lambda: len(group_members(pgid)) == 3, timeout=30)  # leader, shell, sleep
        proc.send_signal(signal.SIGTERM)
        assert exit_code(proc, tmp_path, grace) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        lingering = group_members(pgid)
        signal_group(pgid, signal.SIGKILL)
    assert lingering == []
    [record] = [decode(JobRecord, v) for v, _ in etcd_client.get_prefix(f"{prefix}/jobs/")]
    assert (record.state, record.detail) == (JobState.KILLED, "claim lost: " + record.detail[12:])
    assert "nothing left to work on" in record.detail, record.detail
    assert producer.get_task("build").state is TaskState.READY


def test_a_restarted_worker_kills_the_jobs_its_killed_predecessor_left_running(
    coordinator: Served, producer: WorkerClient, tmp_path: Path, etcd_client: Any, prefix: str
) -> None:
    """SIGKILL leaves a worker's managed jobs running (their own sessions), and nothing killed
    them once their attempts were superseded: the task ran again beside its old job. The next
    `coordinator worker` of the principal on the host kills them as it starts."""
    producer.create_task("build", queue=QUEUE, input=f"job {tmp_path / 'never'}".encode())
    first = start_worker(coordinator.target, tmp_path, max_concurrent=1, grace=1.0, ttl=2)
    try:
        eventually((tmp_path / "build.job").exists, timeout=30)
        pgid = int((tmp_path / "build.job").read_text())
        (tmp_path / "build.job").unlink()
        first.kill()
        first.wait(timeout=30)
        assert len(group_members(pgid)) == 3  # the job outlived its worker
        eventually(lambda: producer.get_task("build").state is TaskState.READY, timeout=30)
        second = start_worker(coordinator.target, tmp_path, max_concurrent=1, grace=1.0, ttl=2)
        try:
            eventually(lambda: group_members(pgid) == [], timeout=30)
            eventually((tmp_path / "build.job").exists, timeout=30)  # the task runs again
        finally:
            second.send_signal(signal.SIGTERM)
            exit_code(second, tmp_path, 1.0)
    finally:
        if first.poll() is None:
            first.kill()
        signal_group(pgid, signal.SIGKILL)
    records = [decode(JobRecord, v) for v, _ in etcd_client.get_prefix(f"{prefix}/jobs/")]
    old = next(r for r in records if r.pid == pgid)
    assert old.state is JobState.KILLED and "no longer holds the claim" in old.detail, old


def test_a_worker_starts_without_a_coordinator_and_says_it_did_not_look_for_orphans(
    tmp_path: Path,
) -> None:
    """Looking for orphaned jobs is one try: a coordinator not up yet neither stops the worker
    (a crash loop) nor holds its start up for a retry budget."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        target = f"127.0.0.1:{probe.getsockname()[1]}"
    proc = start_worker(target, tmp_path, max_concurrent=1, grace=1.0)
    try:
        eventually((tmp_path / "ready").exists, timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert exit_code(proc, tmp_path, 1.0) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "worker.log").read_text()
    events = [json.loads(line)["event"] for line in log.splitlines() if line.startswith("{")]
    assert events[:2] == ["orphaned jobs not looked for", "pool claiming"], log


def _stops_with_dead_output(
    coordinator: Served, producer: WorkerClient, tmp_path: Path, output: int, close: bool
) -> None:
    """A worker whose stdout and stderr cannot be written (``output``; the read end closed if
    ``close``) still stops on SIGTERM within its grace and gives its claim back at once."""
    producer.create_task("held", queue=QUEUE, input=f"gate {tmp_path / 'never'}".encode())
    grace = 1.0
    # A TTL far longer than the test waits: the claim must be given back, not left to expire.
    proc = start_worker(
        coordinator.target, tmp_path, max_concurrent=1, grace=grace, output=output, ttl=600
    )
    try:
        eventually((tmp_path / "held.started").exists, timeout=30)  # claim held
        if close:
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()  # the pipes' reader is gone: every write now fails EPIPE
            proc.stderr.close()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=grace + GIVE_BACK_TIMEOUT.total_seconds() + 20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0
    task = producer.get_task("held")
    assert (task.state, ends(producer, "held")) == (TaskState.READY, [AttemptEnd.FAILED])


def test_sigterm_stops_a_worker_whose_log_pipe_was_closed(
    coordinator: Served, producer: WorkerClient, tmp_path: Path
) -> None:
    _stops_with_dead_output(coordinator, producer, tmp_path, subprocess.PIPE, close=True)


def test_sigterm_stops_a_worker_whose_log_disk_is_full(
    coordinator: Served, producer: WorkerClient, tmp_path: Path
) -> None:
    with open("/dev/full", "wb") as full:  # the stand-in for a full disk: writes fail ENOSPC
        _stops_with_dead_output(coordinator, producer, tmp_path, full.fileno(), close=False)
