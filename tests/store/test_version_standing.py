"""A replica the version record refuses does no background work: its reclaimer (a watch-and-scan
loop) and its promoter (a periodic pass) write nothing while an admin's raised minimum refuses
it, and catch up once a lowered minimum admits it again (store/control/versions.py
``Standing``; the pruner's case is in tests/retention/test_pruner.py)."""

from __future__ import annotations

import time
from concurrent import futures
from typing import Any

import pytest
from structlog.testing import capture_logs

import coordinator
from coordinator.clock import ManualClock
from coordinator.domain.failures import FailureReport
from coordinator.domain.states import TaskState
from coordinator.domain.versions import VersionRecord
from coordinator.errors import ReplicaRefused
from coordinator.store.control.versions import Standing, VersionStore
from coordinator.store.indexes.watch_loop import _RESUME
from tests.helpers import InProcessCaller, eventually
from tests.store.support import (
    REFUSED_FOR,
    StoreFactory,
    admit_by_version,
    claim,
    create,
    refuse_by_version,
    wait_claim_gone,
)


def test_a_refused_replica_reclaims_nothing_until_admitted_again(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(scan_interval=0.5)
    create(store, "t1")
    claim(store, "t1", ttl=1)
    refuse_by_version(store)
    wait_claim_gone(store, etcd_client, "t1")  # the lease expired: etcd deleted the claim key
    time.sleep(REFUSED_FOR)
    # Neither the watch (it saw the deletion) nor four scans moved it.
    assert store.tasks.get("t1").state is TaskState.CLAIMED
    admit_by_version(store)
    eventually(
        lambda: store.tasks.get("t1").state is TaskState.READY,
        timeout=15,
        message="admitted again, the reclaimer's scan did not reclaim the task",
    )


def test_a_refused_replica_follows_again_after_its_watch_ended_and_reclaims_by_it_once_admitted(
    make_store: StoreFactory,
) -> None:
    store = make_store()  # no periodic scan: only the reclaimer's watch can reclaim here
    refuse_by_version(store)
    ended = store.reclaimer._watch
    assert ended is not None
    ended.close()  # as when etcd compacted the history the watch needed ...
    store.reclaimer._items.put(_RESUME)  # ... and told the loop so
    eventually(lambda: store.reclaimer._watch is not ended, message="not following again")
    admit_by_version(store)
    create(store, "t1")
    claim(store, "t1", ttl=1, epoch=store.admin.epoch())  # each minimum set bumped the epoch
    eventually(
        lambda: store.tasks.get("t1").state is TaskState.READY,
        timeout=15,
        message="the watch followed while refused did not reclaim once admitted",
    )


def test_a_refused_replica_promotes_nothing_until_admitted_again(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store()  # the promoter passes every 0.25 s
    create(store, "t1")
    fence = claim(store, "t1")
    report = FailureReport(retryable=True, code="RateLimited", delay=30.0)
    assert store.failures.fail(fence, principal="w1", report=report).state is TaskState.DELAYED
    refuse_by_version(store)
    clock.advance(31)  # due
    time.sleep(REFUSED_FOR)
    assert store.tasks.get("t1").state is TaskState.DELAYED
    admit_by_version(store)
    eventually(lambda: store.tasks.get("t1").state is TaskState.READY, timeout=15)


def test_a_long_poll_let_in_before_the_refusal_claims_nothing_after_it(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    newer = VersionStore(store.ctx, own_version="99.0")  # a replica of a newer version
    newer.set_minimums(min_coordinator_version="99.0")  # bumps the epoch
    # The version gate, its reading of the record a couple of seconds old, let this call in:
    # it waits with the new epoch, as a worker that just asked for it would.
    epoch, caller = store.admin.epoch(), InProcessCaller()
    with futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            store.long_poll.claim_next,
            "default",
            principal="w1",
            epoch=epoch,
            ttl=30,
            wait=20.0,
            caller=caller,
        )
        eventually(lambda: store.long_poll.waiting() == 1, message="not waiting")
        eventually(lambda: not store.ctx.admitted(), timeout=10, message="still admitted")
        create(store, "t1")  # through a replica the record admits
        with pytest.raises(ReplicaRefused) as refused:
            waiting.result(timeout=15)
    assert str(refused.value) == (
        f"coordinator version {coordinator.__version__} is below the keyspace's minimum "
        "coordinator version 99.0; upgrade the coordinator"
    )
    assert store.tasks.get("t1").state is TaskState.READY
    assert store.long_poll.waiting() == 0


def test_the_standing_reads_through_a_cache_and_an_unreadable_record_admits() -> None:
    reads: list[VersionRecord] = []
    record = VersionRecord(min_coordinator_version="2.0")

    def read() -> VersionRecord:
        if not reads:
            reads.append(record)
            return record
        raise OSError("etcd away")

    old = Standing(read, own_version="1.9", ttl=3600.0)
    below = "coordinator version 1.9 is below the keyspace's minimum coordinator version 2.0"
    assert [old.refusal() for _ in range(20)] == [f"{below}; upgrade the coordinator"] * 20
    # ... from one read, cached
    assert len(reads) == 1
    current = Standing(read, own_version="2.0", ttl=0.0)
    assert current.refusal() is None  # the record can no longer be read: admitted
    newer_schema = Standing(
        lambda: VersionRecord(schema_version=record.schema_version + 1), own_version="2.0"
    )
    assert "knows keyspace schema" in str(newer_schema.refusal())


def test_the_standing_says_each_change_of_answer_once() -> None:
    answers: list[VersionRecord | None] = [None] * 3
    answers += [VersionRecord(min_coordinator_version="3.0")] * 3
    answers += [VersionRecord(min_coordinator_version="1.0")] * 3

    def read() -> VersionRecord:
        answer = answers.pop(0)
        if answer is None:
            raise OSError("etcd away")
        return answer

    standing = Standing(read, own_version="2.0", ttl=0.0)
    with capture_logs() as logs:
        seen = [standing.current() for _ in range(9)]
    assert [refusal for _, refusal in seen] == [None] * 3 + [
        "coordinator version 2.0 is below the keyspace's minimum coordinator version 3.0; "
        "upgrade the coordinator"
    ] * 3 + [None] * 3
    assert [record is None for record, _ in seen] == [True] * 3 + [False] * 6
    assert [(entry["log_level"], entry["event"]) for entry in logs] == [
        ("warning", "cannot read the version record: admitted until it can be"),
        ("warning", "refused by the version record: calls refused, background work paused"),
        ("info", "admitted by the version record: calls and background work go on"),
    ]
