"""The pruner against a real etcd: what is removed, what is kept, and what stays behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from coordinator.archive import ArchiveError, latest_copies
from coordinator.archive.local import LocalSink
from coordinator.clock import ManualClock
from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.effects import EffectState
from coordinator.domain.failures import FailureReport
from coordinator.domain.states import Outcome, TaskState
from coordinator.errors import AlreadyExists, FailedPrecondition, NotFound
from coordinator.store import Store, TaskSpec
from coordinator.store.effects.jobs import JobSpec
from coordinator.store.retention.history import entry_value
from coordinator.store.retention.prune_turn import PruneTurn
from coordinator.store.retention.pruner import PassReport
from tests.helpers import eventually
from tests.retention.conftest import RETENTION, TOMBSTONE_RETENTION
from tests.retention.sinks import WrappedSink
from tests.store.support import (
    REFUSED_FOR,
    admit_by_version,
    claim,
    commit,
    create,
    refuse_by_version,
    snapshot,
)

PAST = RETENTION + 1


def finish(store: Store, task_id: str, **kwargs: Any) -> None:
    """Create ``task_id`` and commit it (DONE)."""
    create(store, task_id, **kwargs)
    assert commit(store, claim(store, task_id)).verdict.outcome is Outcome.COMMITTED


def effect(store: Store, fence: Fence, slot: str, state: EffectState) -> str:
    """Prepare an effect in ``slot`` and record it ``state``; returns its id."""
    prepared = store.effects.prepare(
        fence, principal="w1", node_id="n", effect_slot=slot, payload_digest=digest_of(b"x")
    )
    assert prepared.effect is not None
    eid = prepared.effect.effect_id
    recorded = store.effects.record(
        fence, principal="w1", effect_id=eid, state=state, external_ref="m1", etag=""
    )
    assert recorded.verdict.outcome is Outcome.OK
    return eid


def rich_task(store: Store, task_id: str) -> str:
    """A DONE task with a committed effect, a staged result and a managed job; its effect id."""
    create(store, task_id)
    fence = claim(store, task_id)
    eid = effect(store, fence, "email", EffectState.COMMITTED)
    store.acceptance.stage_result(
        fence, principal="w1", result_digest=digest_of(b"r"), result=b"r", result_ref=""
    )
    spec = JobSpec(job_id=f"j-{task_id}", host="h", pid=1, start_ticks=1, argv=("x",), log_ref="l")
    assert store.jobs.start(fence, principal="w1", spec=spec).verdict.outcome is Outcome.OK
    assert commit(store, fence).verdict.outcome is Outcome.COMMITTED
    return eid


def keys_naming(store: Store, etcd_client: Any, task_id: str) -> list[str]:
    """Every key of the keyspace whose name or value names ``task_id``."""
    return sorted(
        key
        for key, (value, _) in snapshot(store, etcd_client).items()
        if f"/{task_id}" in key or value == task_id.encode()
    )


def tombstone_keys(store: Store, etcd_client: Any, task_id: str) -> list[str]:
    keys = store.ctx.keys
    return [
        k
        for k in keys_naming(store, etcd_client, task_id)
        if k == keys.tombstone(task_id) or k.startswith(keys.tombstone_due_prefix)
    ]


def count(store: Store, name: str, **labels: str) -> float:
    return store.ctx.metrics.registry.get_sample_value(name, labels) or 0.0


def test_done_and_cancelled_tasks_are_removed_with_every_key_but_the_tombstone(
    make_store: Any, clock: ManualClock, etcd_client: Any, sink: LocalSink
) -> None:
    store = make_store()
    eid = rich_task(store, "done")
    create(store, "cancelled")
    fence = claim(store, "cancelled")
    store.tasks.cancel("cancelled", by="pm", reason="no longer wanted")
    assert store.renewals.renew(fence, principal="w1", progress="").verdict.outcome is (
        Outcome.CANCELLED
    )
    create(store, "kept")  # READY: never pruned
    assert store.pruner is not None
    before = count(store, "coordinator_pruned_tasks_total")

    clock.advance(RETENTION - 1)
    assert store.pruner.run_pass().pruned == 0  # not due yet
    clock.advance(2)
    report = store.pruner.run_pass()

    assert (report.pruned, report.archived, report.not_pruned) == (2, 2, 0)
    assert count(store, "coordinator_pruned_tasks_total") - before == 2
    for task_id in ("done", "cancelled"):
        left = keys_naming(store, etcd_client, task_id)
        assert left == tombstone_keys(store, etcd_client, task_id) and len(left) == 2, left
    keys = store.ctx.keys
    assert not any(eid in k for k in snapshot(store, etcd_client)), "the effect record stayed"
    assert store.tasks.get("kept").state is TaskState.READY
    assert keys.prune_due_prefix not in "".join(snapshot(store, etcd_client))


def test_get_of_a_pruned_task_names_the_archive_and_its_id_is_refused(
    make_store: Any, clock: ManualClock, sink: LocalSink
) -> None:
    store = make_store()
    finish(store, "t1")
    clock.advance(PAST)
    assert store.pruner is not None
    store.pruner.run_pass()

    with pytest.raises(NotFound) as got:
        store.tasks.get("t1")
    assert "finished DONE and was archived" in str(got.value)
    assert sink.url in str(got.value) and "coordinator archive show t1" in str(got.value)
    with pytest.raises(AlreadyExists) as refused:
        create(store, "t1")
    assert "task id 't1' was used" in str(refused.value)


def test_a_tombstone_expires_after_its_retention_and_frees_the_id(
    make_store: Any, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store()
    finish(store, "t1")
    clock.advance(PAST)
    assert store.pruner is not None
    store.pruner.run_pass()
    clock.advance(TOMBSTONE_RETENTION - 1)
    assert store.pruner.run_pass().tombstones_expired == 0
    clock.advance(2)

    assert store.pruner.run_pass().tombstones_expired == 1
    assert keys_naming(store, etcd_client, "t1") == []
    create(store, "t1")  # the id is free again after the documented bound
    assert store.tasks.get("t1").state is TaskState.READY


def test_review_needs_approval_and_uncertain_effects_are_never_pruned(
    make_store: Any, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store()
    create(store, "review", review=True)
    commit(store, claim(store, "review"))
    store.tasks.create(TaskSpec(task_id="nr", input=b"i", non_replayable=True), by="pm")
    fence = claim(store, "nr", ttl=1)
    store.effects.prepare(
        fence, principal="w1", node_id="n", effect_slot="s", payload_digest=digest_of(b"p")
    )
    store.acceptance.release(fence, principal="w1", reason="test")
    assert store.claims.claim("nr", principal="w2", epoch=1, ttl=5).verdict.outcome is (
        Outcome.NEEDS_APPROVAL
    )
    create(store, "unknown")
    eid = effect(store, claim(store, "unknown"), "s", EffectState.UNKNOWN)
    store.tasks.cancel("unknown", by="pm", reason="stop")
    deferred = count(store, "coordinator_prune_deferred_total", reason="uncertain_effect")

    clock.advance(10 * RETENTION)
    assert store.pruner is not None
    report = store.pruner.run_pass()

    assert (report.pruned, report.deferred) == (0, 1)
    assert (
        count(store, "coordinator_prune_deferred_total", reason="uncertain_effect") - deferred == 1
    )
    assert store.tasks.get("review").state is TaskState.REVIEW
    assert store.tasks.get("nr").state is TaskState.NEEDS_APPROVAL
    assert store.tasks.get("unknown").state is TaskState.CANCELLED
    # Settled, the cancelled task goes at its next look (one retention later).
    store.reconcile.resolve(
        eid,
        caller="admin",
        is_admin=True,
        resolution=EffectState.ABSENT,
        external_ref="",
        etag="",
        reason="gone",
    )
    assert store.pruner.run_pass().pruned == 0
    clock.advance(PAST)
    assert store.pruner.run_pass().pruned == 1
    with pytest.raises(NotFound):
        store.tasks.get("unknown")


def test_the_archive_holds_exactly_what_etcd_held(
    make_store: Any, clock: ManualClock, etcd_client: Any, sink: LocalSink
) -> None:
    store = make_store()
    eid = rich_task(store, "t1")
    keys = store.ctx.keys
    held = {
        k: v
        for k, (v, _) in snapshot(store, etcd_client).items()
        if k == keys.task("t1")
        or k == keys.effect(eid)
        or any(
            k.startswith(p)
            for p in (
                keys.attempts_prefix("t1"),
                keys.events_prefix("t1"),
                keys.results_of("t1"),
                f"{keys.staging_prefix}t1/",
                keys.jobs_prefix("t1"),
            )
        )
    }
    clock.advance(PAST)
    assert store.pruner is not None
    store.pruner.run_pass()

    (obj,) = list(sink.read())
    sections = ("attempts", "events", "results", "staged", "effects", "jobs")
    archived = {
        e["key"]: entry_value(e) for s in sections for e in obj[s] if not e.get("in_task_record")
    }
    archived[obj["task"]["key"]] = entry_value(obj["task"])
    assert archived == held
    # The committed attempt has no key: the archive has it from the task record (schema 3).
    (recorded,) = [e for e in obj["attempts"] if e.get("in_task_record")]
    assert recorded["value"]["end"] == "COMMITTED"
    assert len(obj["events"]) == 3 and len(obj["staged"]) == len(obj["jobs"]) == 1
    assert (obj["task_id"], obj["state"], obj["format"]) == ("t1", "DONE", 1)


class FailingSink:
    """A sink that never confirms."""

    url = "file:///nowhere"

    def write(self, objects: Sequence[dict[str, Any]]) -> str:
        raise ArchiveError("disk full")

    def read(self) -> Any:
        return iter(())


def test_a_sink_that_fails_prunes_nothing_and_is_counted_and_logged(
    make_store: Any, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(archive=FailingSink())
    finish(store, "t1")
    finish(store, "t2")
    clock.advance(PAST)
    before_keys = snapshot(store, etcd_client)
    failures = count(store, "coordinator_archive_failures_total")
    assert store.pruner is not None

    with capture_logs() as logs:
        report = store.pruner.run_pass()

    assert (report.pruned, report.archive_failed) == (0, True)
    assert snapshot(store, etcd_client) == before_keys
    assert count(store, "coordinator_archive_failures_total") - failures == 1
    (line,) = [e for e in logs if e["event"] == "archive write failed; nothing pruned"]
    assert (line["log_level"], line["tasks"]) == ("error", 2) and "disk full" in line["error"]


class CrashAfterArchive(WrappedSink):
    """Confirms the archive, then loses etcd before the prune (a replica dying in between)."""

    def __init__(self, inner: LocalSink, store: list[Store]) -> None:
        super().__init__(inner)
        self._store = store

    def write(self, objects: Sequence[dict[str, Any]]) -> str:
        location = self.inner.write(objects)
        self._store[0].ctx.kv.close()
        return location


def test_a_crash_between_archive_and_prune_archives_twice_and_loses_nothing(
    make_store: Any, clock: ManualClock, sink: LocalSink
) -> None:
    holder: list[Store] = []
    doomed = make_store(archive=CrashAfterArchive(sink, holder))
    holder.append(doomed)
    survivor = make_store()
    finish(survivor, "t1")
    clock.advance(PAST)
    assert doomed.pruner is not None and survivor.pruner is not None

    with pytest.raises(Exception):  # noqa: B017 - etcd is gone mid-pass, any error
        doomed.pruner.run_pass()
    assert survivor.tasks.get("t1").state is TaskState.DONE  # archived, not pruned
    assert survivor.pruner.run_pass().pruned == 1

    copies = [o for o in sink.read() if o["task_id"] == "t1"]
    assert len(copies) == 2
    assert copies[0]["task"] == copies[1]["task"] and copies[0]["events"] == copies[1]["events"]
    with pytest.raises(NotFound):
        survivor.tasks.get("t1")


class MovesTheTask(WrappedSink):
    """Confirms the archive, and meanwhile the task key is written again (the task moved)."""

    def __init__(self, inner: LocalSink, etcd_client: Any, key: str) -> None:
        super().__init__(inner)
        self._client, self._key = etcd_client, key
        self.moved = False

    def write(self, objects: Sequence[dict[str, Any]]) -> str:
        if not self.moved:
            value, _ = self._client.get(self._key)
            self._client.put(self._key, value)
            self.moved = True
        return self.inner.write(objects)


def test_a_task_that_moved_during_the_prune_is_kept(
    make_store: Any, clock: ManualClock, etcd_client: Any, sink: LocalSink, prefix: str
) -> None:
    moving = MovesTheTask(sink, etcd_client, f"{prefix}/tasks/t1")
    store = make_store(archive=moving)
    finish(store, "t1")
    clock.advance(PAST)
    assert store.pruner is not None

    report = store.pruner.run_pass()

    assert (report.archived, report.pruned, report.not_pruned) == (1, 0, 1)
    assert store.tasks.get("t1").state is TaskState.DONE
    assert store.pruner.run_pass().pruned == 1  # read again, archived again, pruned


def test_two_replicas_pruning_at_once_prune_each_task_once(
    make_store: Any, clock: ManualClock, sink: LocalSink, etcd_client: Any
) -> None:
    first, second = make_store(), make_store()
    ids = [f"t{i:02d}" for i in range(40)]
    for task_id in ids:
        finish(first, task_id)
    clock.advance(PAST)
    before = count(first, "coordinator_pruned_tasks_total")
    reports: list[Any] = []
    errors: list[BaseException] = []

    def run(store: Store) -> None:
        try:
            assert store.pruner is not None
            reports.append(store.pruner.run_pass())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sum(r.pruned for r in reports) == 40
    assert count(first, "coordinator_pruned_tasks_total") - before == 40
    assert set(latest_copies(sink.read())) == set(ids)
    for task_id in ids:
        assert keys_naming(first, etcd_client, task_id) == tombstone_keys(
            first, etcd_client, task_id
        )


def test_a_task_with_more_records_than_one_txn_holds_is_pruned_in_pages(
    make_store: Any, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store()
    create(store, "big")
    fence = claim(store, "big")
    for slot in range(90):
        effect(store, fence, f"s{slot}", EffectState.COMMITTED)
    commit(store, fence)
    clock.advance(PAST)
    assert store.pruner is not None

    assert store.pruner.run_pass().pruned == 1

    keys = store.ctx.keys
    left = snapshot(store, etcd_client)
    assert not any(k.startswith(keys.effects_prefix) for k in left)
    assert not any(k.startswith(keys.prune_pending_prefix) for k in left)
    assert keys_naming(store, etcd_client, "big") == tombstone_keys(store, etcd_client, "big")


def test_a_pruned_done_upstream_still_releases_and_a_cancelled_one_still_refuses(
    make_store: Any, clock: ManualClock
) -> None:
    store = make_store()
    finish(store, "up")
    create(store, "gone")
    store.tasks.cancel("gone", by="pm", reason="x")
    clock.advance(PAST)
    assert store.pruner is not None
    assert store.pruner.run_pass().pruned == 2

    task = store.tasks.create(TaskSpec(task_id="down", input=b"i", depends_on=("up",)), by="pm")
    assert (task.state, task.satisfied_by) == (TaskState.READY, ("up@1",))
    with pytest.raises(FailedPrecondition) as refused:
        store.tasks.create(TaskSpec(task_id="d2", input=b"i", depends_on=("gone",)), by="pm")
    assert "gone (CANCELLED)" in str(refused.value)
    with pytest.raises(NotFound):
        store.tasks.create(TaskSpec(task_id="d3", input=b"i", depends_on=("never",)), by="pm")


def test_an_upstream_with_a_waiting_dependent_is_kept_until_the_dependent_moves(
    make_store: Any, clock: ManualClock
) -> None:
    store = make_store()  # no releaser runs: the dependent stays WAITING until released here
    create(store, "up")
    store.tasks.create(TaskSpec(task_id="down", input=b"i", depends_on=("up",)), by="pm")
    commit(store, claim(store, "up"))
    clock.advance(PAST)
    assert store.pruner is not None

    report = store.pruner.run_pass()

    assert (report.pruned, report.deferred) == (0, 1)
    assert store.tasks.get("down").state is TaskState.WAITING
    assert store.releaser.release("down")
    clock.advance(PAST)
    assert store.pruner.run_pass().pruned == 1
    assert store.tasks.get("down").state is TaskState.READY


def test_a_dead_letter_sent_back_to_the_queue_drops_its_prune_key_and_is_kept(
    make_store: Any, clock: ManualClock, etcd_client: Any, prefix: str
) -> None:
    store = make_store()
    create(store, "t1")
    fence = claim(store, "t1")
    failed = store.failures.fail(
        fence, principal="w1", report=FailureReport(retryable=False, code="bad-input")
    )
    assert store.tasks.get("t1").state is TaskState.FAILED, failed
    store.dead_letters.retry("t1", by="pm", reason="input fixed")  # FAILED -> READY
    due = f"{prefix}/prune-due/"
    assert len(list(etcd_client.get_prefix(due))) == 1  # the FAILED move's key, now dead
    clock.advance(PAST)
    assert store.pruner is not None
    report = store.pruner.run_pass()
    assert (report.archived, report.pruned) == (0, 0)
    assert store.tasks.get("t1").state is TaskState.READY  # kept: it is live again
    assert list(etcd_client.get_prefix(due)) == []  # the dead key is gone, not warned forever
    commit(store, claim(store, "t1"))  # terminal again (DONE): a fresh key, pruned when due
    clock.advance(PAST)
    assert store.pruner.run_pass().pruned == 1


def test_a_replica_the_version_record_refuses_prunes_nothing_until_admitted_again(
    make_store: Any, clock: ManualClock, sink: LocalSink
) -> None:
    store = make_store(reclaim=True, prune_interval=0.25)  # the pruner runs every 0.25 s
    finish(store, "t1")
    refuse_by_version(store)
    clock.advance(PAST)
    time.sleep(REFUSED_FOR)
    assert store.tasks.get("t1").state is TaskState.DONE  # neither archived nor deleted
    assert [o["task_id"] for o in sink.read()] == []
    admit_by_version(store)

    def pruned() -> bool:
        try:
            store.tasks.get("t1")
        except NotFound:
            return True
        return False

    eventually(pruned, timeout=15, message="admitted again, the pruner did not prune")
    assert "t1" in {o["task_id"] for o in sink.read()}  # archived first


def test_one_replica_prunes_at_a_time_so_each_task_is_archived_once(
    make_store: Any, clock: ManualClock, sink: LocalSink
) -> None:
    """Every replica's pruner walking the same due tasks archived 74% of them twice with two
    replicas (N times with N): a pass takes the turn first, and the others skip theirs."""
    first, second = make_store(), make_store()
    assert first.pruner is not None and second.pruner is not None
    ids = [f"t{i:02d}" for i in range(20)]
    for task_id in ids:
        finish(first, task_id)
    clock.advance(PAST)
    holder = PruneTurn(first.ctx)
    assert holder.take()
    assert second.pruner.pass_in_turn() is None  # the turn is taken: nothing read or archived
    assert list(sink.read()) == []
    holder.give()
    report = second.pruner.pass_in_turn()
    assert report is not None and (report.archived, report.pruned) == (20, 20)
    assert first.pruner.pass_in_turn() == PassReport()  # its turn: nothing left due
    assert sorted(o["task_id"] for o in sink.read() if not o.get("kind")) == ids  # each once
