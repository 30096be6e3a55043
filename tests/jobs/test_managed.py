"""Managed jobs through the SDK against a real coordinator: ``job.run`` starts a command in its
own process group behind StartJob's fence, kills the whole group when the claim is lost, and
records how it ended."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from coordinator.domain.jobs import JobRecord, JobState
from coordinator.domain.records import ResultRecord, decode
from coordinator.errors import CoordinatorError
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Claim, ClaimLost, FenceReason, LossSource, Outcome, WorkerClient
from coordinator.sdk._proc import group_members, is_running, signal_group, start_ticks
from tests.helpers import eventually
from tests.sdk.support import QUEUE, Served, served

GRACE = timedelta(seconds=1)
# Long enough that a kill seen well before it ends (half of it, allowing for a slow test thread)
# proves the SIGTERM-ignoring child was not gone before the SIGKILL.
TREE_GRACE = timedelta(seconds=2)


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    """A coordinator on this test's prefix, with one READY task "t1"."""
    with served(etcd.endpoint, prefix) as running, running.client("producer") as producer:
        producer.create_task("t1", input=b"input", queue=QUEUE)
        yield running


@pytest.fixture
def client(coordinator: Served) -> Iterator[WorkerClient]:
    """A worker client; every job group it started is SIGKILLed after the test, pass or fail."""
    with coordinator.client("w1") as c:
        yield c
        for pgid in _started:
            signal_group(pgid, signal.SIGKILL)
        _started.clear()


_started: list[int] = []


@pytest.fixture(autouse=True)
def _track_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remember the group of every job ``Claim.run`` starts (for the cleanup above)."""
    original = Claim.run

    def run(self: Claim, *args: Any, **kwargs: Any) -> Any:
        proc = original(self, *args, **kwargs)
        _started.append(proc.pid)
        return proc

    monkeypatch.setattr(Claim, "run", run)


def claim(client: WorkerClient, ttl: float = 3) -> Claim:
    job = client.claim("t1", ttl=timedelta(seconds=ttl))
    assert isinstance(job, Claim), job
    return job


def stored_jobs(etcd_client: Any, prefix: str) -> list[JobRecord]:
    return [decode(JobRecord, v) for v, _ in etcd_client.get_prefix(f"{prefix}/jobs/t1/")]


def tree_script(tmp_path: Path) -> list[str]:
    """A shell that starts a child shell ignoring SIGTERM (which loops on ``sleep``s that
    inherit the ignored signal); both write their pids to files."""
    (tmp_path / "child.sh").write_text(
        f"trap '' TERM\necho $$ > {tmp_path}/child.pid\nwhile :; do sleep 0.05; done\n"
    )
    (tmp_path / "parent.sh").write_text(
        f"echo $$ > {tmp_path}/parent.pid\nsh {tmp_path}/child.sh &\nwait\n"
    )
    return ["sh", str(tmp_path / "parent.sh")]


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def lose_claim(how: str, client: WorkerClient) -> None:
    if how == "cancelled":
        client.cancel_task("t1", reason="the producer changed its mind")
    else:
        client.admin.bump_epoch()  # insecure mode: the caller holds every role


@pytest.mark.parametrize(("how", "seen"), [("cancelled", "CANCELLED"), ("epoch", "EPOCH_CHANGED")])
def test_claim_lost_kills_the_whole_process_tree_within_the_grace_period(
    client: WorkerClient, tmp_path: Path, etcd_client: Any, prefix: str, how: str, seen: str
) -> None:
    with claim(client) as job:
        proc = job.run(tree_script(tmp_path), grace=TREE_GRACE, log_dir=tmp_path / "logs")
        parent = eventually(lambda: read_pid(tmp_path / "parent.pid"))
        child = eventually(lambda: read_pid(tmp_path / "child.pid"))
        # Every process of the tree, as (pid, start time): wrapper, both shells, a sleep.
        tree = eventually(lambda: {p: start_ticks(p) for p in group_members(proc.pid)})
        assert {proc.pid, parent, child} <= set(tree)
        assert stored_jobs(etcd_client, prefix)[0].state is JobState.RUNNING

        lose_claim(how, client)
        assert job.wait_lost(timedelta(seconds=10))
        lost_at = time.monotonic()
        result = proc.wait(timedelta(seconds=10))
        took = time.monotonic() - lost_at

    assert result is not None and result.state is JobState.KILLED and result.recorded
    assert "claim lost" in result.detail and seen in result.detail
    # Gone after the grace period (plus the watcher's poll and the kill itself; slack for a
    # loaded CI machine) - and not at once: the child ignored SIGTERM, so only the SIGKILL
    # after the grace ended it.
    grace = TREE_GRACE.total_seconds()
    assert grace / 2 <= took <= grace + 5
    assert [p for p, ticks in tree.items() if ticks is not None and is_running(p, ticks)] == []
    assert group_members(proc.pid) == []
    (record,) = stored_jobs(etcd_client, prefix)
    assert (record.state, record.job_id, record.pid) == (JobState.KILLED, proc.job_id, proc.pid)
    assert record.ended_at > 0


def test_a_command_that_exits_is_recorded_with_its_status_and_cited_by_the_commit(
    client: WorkerClient, tmp_path: Path, etcd_client: Any, prefix: str
) -> None:
    with claim(client, ttl=30) as job:
        proc = job.run(["sh", "-c", "echo hello from the job; exit 3"], log_dir=tmp_path)
        result = proc.wait(timedelta(seconds=10))
        assert result is not None
        assert (result.state, result.exit_code, result.recorded) == (JobState.EXITED, 3, True)
        assert Path(proc.log_ref).read_text() == "hello from the job\n"
        assert job.commit(b"built", evidence=proc.evidence).committed

    (record,) = stored_jobs(etcd_client, prefix)
    assert (record.state, record.exit_code, record.log_ref) == (JobState.EXITED, 3, proc.log_ref)
    assert record.argv == ("sh", "-c", "echo hello from the job; exit 3")
    ((value, _),) = list(etcd_client.get_prefix(f"{prefix}/results/t1/"))
    assert decode(ResultRecord, value).evidence == (proc.job_id, proc.log_ref)


def test_a_job_still_running_when_its_attempt_commits_is_killed(
    client: WorkerClient, tmp_path: Path, etcd_client: Any, prefix: str
) -> None:
    with claim(client, ttl=30) as job:
        proc = job.run(["sleep", "300"], grace=GRACE, log_dir=tmp_path)
        assert job.commit(b"done without waiting").committed
        result = proc.wait(timedelta(seconds=10))
    assert result is not None and result.state is JobState.KILLED
    assert "committed" in result.detail
    assert group_members(proc.pid) == []
    assert [r.state for r in stored_jobs(etcd_client, prefix)] == [JobState.KILLED]


_COMMIT_AND_EXIT = """
import sys
from datetime import timedelta
from coordinator.sdk import WorkerClient
client = WorkerClient(sys.argv[1], principal="w1")
job = client.claim("t1", ttl=timedelta(seconds=30))
with job:
    proc = job.run(["sleep", "300"], grace=timedelta(seconds=1), log_dir=sys.argv[2])
    print(proc.pid, flush=True)
    job.commit(b"done without waiting")
"""


def test_a_script_that_commits_and_exits_leaves_no_job_running(
    coordinator: Served, tmp_path: Path, etcd_client: Any, prefix: str
) -> None:
    """The script exits right after its commit, its client never closed: the interpreter's exit
    waits for the watcher's kill and its record (the watcher is a daemon thread: the job used
    to run on, recorded RUNNING)."""
    done = subprocess.run(
        [sys.executable, "-c", _COMMIT_AND_EXIT, coordinator.target, str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    pgid = int(done.stdout)
    lingering = group_members(pgid)
    signal_group(pgid, signal.SIGKILL)
    assert lingering == []
    [record] = stored_jobs(etcd_client, prefix)
    assert record.state is JobState.KILLED and "committed" in record.detail, record


def test_kill_on_request(client: WorkerClient, tmp_path: Path) -> None:
    with claim(client, ttl=30) as job:
        proc = job.run(["sleep", "300"], grace=GRACE, log_dir=tmp_path)
        assert proc.alive()
        result = proc.kill("enough")
        assert (result.state, result.detail, result.recorded) == (JobState.KILLED, "enough", True)
        assert not proc.alive() and group_members(proc.pid) == []


def test_a_fenced_start_never_runs_the_command_and_writes_nothing(
    coordinator: Served, client: WorkerClient, tmp_path: Path, etcd_client: Any, prefix: str
) -> None:
    job = claim(client)  # no keepalive: only StartJob can tell the SDK the claim is gone
    store = coordinator.store
    claim_kv = store.ctx.kv.get(store.ctx.keys.claim("t1"))
    assert claim_kv is not None
    store.ctx.kv.revoke(claim_kv.lease)  # as on expiry
    with coordinator.client("w2") as other:
        eventually(lambda: isinstance(other.claim("t1", ttl=timedelta(seconds=30)), Claim))

    marker = tmp_path / "ran"
    with pytest.raises(ClaimLost) as info:
        job.run(["touch", str(marker)], log_dir=tmp_path)
    lost = info.value.reason
    assert lost is not None
    assert (lost.outcome, lost.reason, lost.source) == (
        Outcome.FENCED,
        FenceReason.SUPERSEDED,
        LossSource.JOB,
    )
    assert job.is_lost() and job.lost_reason == lost
    assert not marker.exists()  # the leader exited at the gate: the command never ran
    assert list(etcd_client.get_prefix(f"{prefix}/jobs/")) == []
    assert list(etcd_client.get_prefix(f"{prefix}/jobs-by-worker/")) == []


def test_a_task_directory_linked_out_of_the_log_dir_is_refused_before_anything_runs(
    client: WorkerClient, tmp_path: Path, etcd_client: Any, prefix: str
) -> None:
    logs, elsewhere = tmp_path / "logs", tmp_path / "elsewhere"
    logs.mkdir()
    elsewhere.mkdir()
    (logs / "t1").symlink_to(elsewhere, target_is_directory=True)
    job = claim(client, ttl=30)
    marker = tmp_path / "ran"
    with pytest.raises(CoordinatorError, match="is not inside the log directory"):
        job.run(["touch", str(marker)], log_dir=logs)
    assert list(elsewhere.iterdir()) == []
    assert not marker.exists()
    assert list(etcd_client.get_prefix(f"{prefix}/jobs/")) == []
    assert not job.is_lost()  # a local refusal: the claim itself is fine
