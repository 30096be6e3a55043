"""More of what the pruner removes and keeps: a dead-lettered (FAILED) task goes with every key,
an open reconciliation keeps its task, and the archived and oldest-terminal metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from coordinator.archive.local import LocalSink
from coordinator.clock import ManualClock
from coordinator.domain.digests import digest_of
from coordinator.domain.effects import EffectState
from coordinator.domain.failures import FailureReport
from coordinator.domain.states import TaskState
from coordinator.errors import NotFound
from coordinator.store.effects.jobs import JobSpec
from tests.retention.conftest import RETENTION
from tests.retention.sinks import WrappedSink
from tests.retention.test_pruner import (
    PAST,
    count,
    effect,
    finish,
    keys_naming,
    tombstone_keys,
)
from tests.store.support import claim, commit, create, snapshot

OLDEST = "coordinator_oldest_terminal_task_age_seconds"


def test_a_dead_lettered_failed_task_is_pruned_with_every_key_but_the_tombstone(
    make_store: Any, clock: ManualClock, etcd_client: Any, sink: LocalSink
) -> None:
    store = make_store()
    create(store, "dead")
    fence = claim(store, "dead")
    eid = effect(store, fence, "email", EffectState.COMMITTED)
    store.acceptance.stage_result(
        fence, principal="w1", result_digest=digest_of(b"r"), result=b"r", result_ref=""
    )
    spec = JobSpec(job_id="j-dead", host="h", pid=1, start_ticks=1, argv=("x",), log_ref="l")
    assert store.jobs.start(fence, principal="w1", spec=spec).verdict.outcome.name == "OK"
    store.failures.fail(
        fence, principal="w1", report=FailureReport(retryable=False, code="bad-input")
    )
    assert store.tasks.get("dead").state is TaskState.FAILED  # a dead letter
    clock.advance(PAST)
    assert store.pruner is not None

    report = store.pruner.run_pass()

    assert (report.archived, report.pruned, report.deferred) == (1, 1, 0)
    left = keys_naming(store, etcd_client, "dead")
    assert left == tombstone_keys(store, etcd_client, "dead") and len(left) == 2, left
    assert not any(eid in k or "j-dead" in k for k in snapshot(store, etcd_client))
    with pytest.raises(NotFound) as gone:
        store.tasks.get("dead")
    assert "finished FAILED and was archived" in str(gone.value)
    (obj,) = list(sink.read())
    assert obj["state"] == "FAILED"
    assert obj["attempts"][-1]["value"]["error_code"] == "bad-input"
    assert (len(obj["effects"]), len(obj["staged"]), len(obj["jobs"])) == (1, 1, 1)


def test_an_open_reconciliation_keeps_its_task_until_it_is_closed(
    make_store: Any, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store()
    finish(store, "t1")
    # A reconciliation left open on a finished task (its effect settled, the record not yet
    # closed): the prune must wait for it, whatever else says the task is done.
    reconcile_key = store.ctx.keys.reconcile("t1", "e1")
    etcd_client.put(reconcile_key, b'{"owner":"w1"}')
    clock.advance(PAST)
    deferred = count(store, "coordinator_prune_deferred_total", reason="open_reconciliation")
    assert store.pruner is not None

    report = store.pruner.run_pass()

    assert (report.pruned, report.deferred) == (0, 1)
    assert store.tasks.get("t1").state is TaskState.DONE
    assert (
        count(store, "coordinator_prune_deferred_total", reason="open_reconciliation") - deferred
        == 1
    )
    etcd_client.delete(reconcile_key)
    clock.advance(PAST)
    assert store.pruner.run_pass().pruned == 1


class OpensAReconciliation(WrappedSink):
    """Confirms the archive, and meanwhile a reconciliation opens on the task."""

    def __init__(self, inner: LocalSink, etcd_client: Any, key: str) -> None:
        super().__init__(inner)
        self._client, self._key = etcd_client, key

    def write(self, objects: Sequence[dict[str, Any]]) -> str:
        self._client.put(self._key, b'{"owner":"w1"}')
        return self.inner.write(objects)


def test_a_reconciliation_opened_during_the_prune_keeps_the_task(
    make_store: Any, clock: ManualClock, etcd_client: Any, sink: LocalSink, prefix: str
) -> None:
    store = make_store(archive=OpensAReconciliation(sink, etcd_client, f"{prefix}/reconcile/t1/e1"))
    finish(store, "t1")
    clock.advance(PAST)
    assert store.pruner is not None

    report = store.pruner.run_pass()

    assert (report.archived, report.pruned, report.not_pruned) == (1, 0, 1)
    assert store.tasks.get("t1").state is TaskState.DONE


def test_archived_tasks_are_counted_even_when_their_prune_loses(
    make_store: Any, clock: ManualClock, etcd_client: Any, sink: LocalSink, prefix: str
) -> None:
    store = make_store(archive=OpensAReconciliation(sink, etcd_client, f"{prefix}/reconcile/t1/e1"))
    finish(store, "t1")
    finish(store, "t2")
    clock.advance(PAST)
    archived = count(store, "coordinator_archived_tasks_total")
    pruned = count(store, "coordinator_pruned_tasks_total")
    assert store.pruner is not None

    store.pruner.run_pass()

    assert count(store, "coordinator_archived_tasks_total") - archived == 2
    assert count(store, "coordinator_pruned_tasks_total") - pruned == 1  # t1's prune lost
    assert sorted(o["task_id"] for o in sink.read()) == ["t1", "t2"]


def test_the_oldest_terminal_task_age_follows_the_head_of_the_prune_index(
    make_store: Any, clock: ManualClock
) -> None:
    store = make_store()
    finish(store, "first")
    clock.advance(40)
    finish(store, "second")
    clock.advance(10)
    assert store.pruner is not None

    store.pruner.run_pass()  # nothing due yet: the gauge says how old the oldest is
    assert count(store, OLDEST) == 50.0

    clock.advance(40)
    finish(store, "third")
    clock.advance(21)  # first and second are due; the gauge is read at most once a minute
    assert store.pruner.run_pass().pruned == 2
    assert count(store, OLDEST) == 21.0  # third is the oldest now

    clock.advance(RETENTION)
    assert store.pruner.run_pass().pruned == 1
    assert count(store, OLDEST) == 0.0  # no terminal task waits


def test_the_attempt_a_task_record_holds_is_archived_with_the_others(
    make_store: Any, clock: ManualClock, sink: LocalSink
) -> None:
    store = make_store()
    create(store, "t")
    first = claim(store, "t")
    assert store.acceptance.release(first, principal="w1", reason="busy").outcome.name == "OK"
    # the second attempt commits: the task record holds it (schema 3)
    assert commit(store, claim(store, "t")).verdict.outcome.name == "COMMITTED"
    task = store.tasks.get("t")
    assert task.attempt_in_record
    clock.advance(PAST)
    assert store.pruner is not None
    assert store.pruner.run_pass().pruned == 1
    (obj,) = list(sink.read())
    released, committed = obj["attempts"]
    assert (released["value"]["end"], "in_task_record" in released) == ("RELEASED", False)
    assert committed["key"] == store.ctx.keys.attempt("t", task.attempt_id)
    assert (committed["value"]["end"], committed["in_task_record"]) == ("COMMITTED", True)
    assert committed["value"]["claim_generation"] == task.claim_generation
