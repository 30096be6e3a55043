"""The sweep of ended attempts: a live task's old staged results and finished job records are
archived and removed ``ended_attempt_retention`` after their attempt ended, not kept until the
task is pruned; running jobs, the live attempt's records and the attempts themselves stay."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner

from coordinator.archive import latest_copies, latest_swept
from coordinator.archive.local import LocalSink
from coordinator.cli import main
from coordinator.clock import ManualClock
from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.jobs import JobState
from coordinator.domain.retention import RetentionPolicy
from coordinator.domain.states import TaskState
from coordinator.store import Store
from coordinator.store.effects.jobs import JobSpec
from tests.retention.conftest import RETENTION, TOMBSTONE_RETENTION
from tests.retention.test_pruner import FailingSink, count, keys_naming, tombstone_keys
from tests.store.support import claim, commit, create, snapshot

SWEEP = 2 * RETENTION
POLICY = RetentionPolicy(default=RETENTION, tombstone=TOMBSTONE_RETENTION, ended_attempt=SWEEP)
SWEPT = "coordinator_ended_attempt_records_swept_total"


def stage(store: Store, fence: Fence, result: bytes) -> None:
    store.acceptance.stage_result(
        fence, principal="w1", result_digest=digest_of(result), result=result, result_ref=""
    )


def job(store: Store, fence: Fence, job_id: str, *, ended: bool) -> None:
    spec = JobSpec(job_id=job_id, host="h", pid=1, start_ticks=1, argv=("x",), log_ref="l")
    assert store.jobs.start(fence, principal="w1", spec=spec).verdict.outcome.name == "OK"
    if ended:
        store.jobs.finish(
            fence.task_id, job_id, principal="w1", state=JobState.EXITED, exit_code=0, detail=""
        )


def released_then_claimed(store: Store) -> tuple[Fence, Fence]:
    """t1: attempt 1 staged a result, ran a job that exited and one still running, and was
    released; attempt 2 holds the claim now and staged a result too."""
    create(store, "t1")
    first = claim(store, "t1")
    stage(store, first, b"first try")
    job(store, first, "exited", ended=True)
    job(store, first, "running", ended=False)
    store.acceptance.release(first, principal="w1", reason="giving up for now")
    second = claim(store, "t1")
    stage(store, second, b"second try")
    return first, second


def test_an_ended_attempts_staged_result_and_finished_jobs_are_archived_then_removed(
    make_store: Any, clock: ManualClock, etcd_client: Any, sink: LocalSink
) -> None:
    store = make_store(retention=POLICY)
    first, second = released_then_claimed(store)
    keys = store.ctx.keys
    swept = count(store, SWEPT)
    assert store.pruner is not None
    clock.advance(SWEEP - 1)
    assert store.pruner.run_pass().swept == 0  # not due yet
    clock.advance(2)

    report = store.pruner.run_pass()

    assert report.swept == 2 and count(store, SWEPT) - swept == 2
    left = snapshot(store, etcd_client)
    assert keys.staging("t1", first.attempt_id) not in left
    assert keys.staging("t1", second.attempt_id) in left  # the live attempt's
    assert keys.job("t1", "exited") not in left
    assert keys.worker_job("w1", "exited") not in left
    assert keys.job("t1", "running") in left  # a restarted worker still needs it
    assert not any(k.startswith(keys.attempt_sweep_prefix) for k in left)
    assert len(store.tasks.attempts("t1")) == 2  # the task's history itself stays
    assert store.tasks.get("t1").state is TaskState.CLAIMED
    objects = list(sink.read())
    assert latest_copies(objects) == {}  # not a pruned task
    ((where, obj),) = latest_swept(objects).items()
    assert where == ("t1", first.attempt_id)
    assert obj["staged"][0]["value"]["result_digest"] == digest_of(b"first try")
    assert [e["value"]["job_id"] for e in obj["jobs"]] == ["exited"]
    shown = CliRunner().invoke(main, ["archive", "show", "t1", "--archive", str(sink.url[7:])])
    assert shown.exit_code == 0, shown.output
    assert f"ended attempt {first.attempt_id}: staged 1 jobs 1" in shown.output


def test_a_task_pruned_before_its_sweep_takes_everything_and_leaves_no_sweep_key(
    make_store: Any, clock: ManualClock, etcd_client: Any, sink: LocalSink
) -> None:
    store = make_store(retention=POLICY)
    _, second = released_then_claimed(store)
    assert commit(store, second).verdict.outcome.name == "COMMITTED"
    clock.advance(RETENTION + 1)
    assert store.pruner is not None
    assert store.pruner.run_pass().pruned == 1
    (task,) = latest_copies(sink.read()).values()
    assert len(task["staged"]) == 2 and len(task["jobs"]) == 2  # all of it, in the task
    clock.advance(SWEEP)

    report = store.pruner.run_pass()

    assert report.swept == 0
    assert keys_naming(store, etcd_client, "t1") == tombstone_keys(store, etcd_client, "t1")
    assert latest_swept(sink.read()) == {}


def test_a_sink_that_fails_sweeps_nothing(
    make_store: Any, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(retention=POLICY, archive=FailingSink())
    released_then_claimed(store)
    clock.advance(SWEEP + 1)
    before = snapshot(store, etcd_client)
    failures = count(store, "coordinator_archive_failures_total")
    assert store.pruner is not None

    report = store.pruner.run_pass()

    assert report.swept == 0
    assert snapshot(store, etcd_client) == before
    assert count(store, "coordinator_archive_failures_total") - failures == 1


def test_lifetime_zero_keeps_an_ended_attempts_records_with_its_task(
    make_store: Any, clock: ManualClock, etcd_client: Any
) -> None:
    keep = RetentionPolicy(default=RETENTION, tombstone=TOMBSTONE_RETENTION, ended_attempt=0)
    store = make_store(retention=keep)
    first, _ = released_then_claimed(store)
    clock.advance(10 * SWEEP)
    assert store.pruner is not None

    assert store.pruner.run_pass().swept == 0
    left = snapshot(store, etcd_client)
    assert store.ctx.keys.staging("t1", first.attempt_id) in left
    assert not any(k.startswith(store.ctx.keys.attempt_sweep_prefix) for k in left)
