"""A replica the version record refuses does no background work: its reclaimer (a watch-and-scan
loop), its promoter (a periodic pass) and its pruner write nothing while an admin's raised
minimum refuses it, and catch up once a lowered minimum admits it again
(store/control/versions.py ``Standing``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from coordinator.archive.local import LocalSink
from coordinator.clock import ManualClock
from coordinator.domain.failures import FailureReport
from coordinator.domain.keys import Keyspace
from coordinator.domain.states import Outcome, TaskState
from coordinator.domain.versions import VersionRecord
from coordinator.errors import NotFound
from coordinator.etcd_process import EtcdProcess
from coordinator.store import EtcdKV, Store
from coordinator.store.control.versions import Standing, VersionStore
from tests.helpers import eventually
from tests.retention.conftest import POLICY, RETENTION
from tests.store.support import LIMITS, StoreFactory, claim, commit, create, wait_claim_gone

REFUSED_FOR = 2.0
"""Seconds a refused replica is watched doing nothing: four of its scans (0.5 s) and eight
promoter passes, where an admitted one acts within one."""


def _refuse(store: Store) -> None:
    VersionStore(store.ctx).set_minimums(min_coordinator_version="99.0")
    eventually(lambda: not store.ctx.admitted(), timeout=10, message="still admitted")


def _admit(store: Store) -> None:
    VersionStore(store.ctx).set_minimums(min_coordinator_version="0", allow_lower=True)


def test_a_refused_replica_reclaims_nothing_until_admitted_again(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(scan_interval=0.5)
    create(store, "t1")
    claim(store, "t1", ttl=1)
    _refuse(store)
    wait_claim_gone(store, etcd_client, "t1")  # the lease expired: etcd deleted the claim key
    time.sleep(REFUSED_FOR)
    # Neither the watch (it saw the deletion) nor four scans moved it.
    assert store.tasks.get("t1").state is TaskState.CLAIMED
    _admit(store)
    eventually(
        lambda: store.tasks.get("t1").state is TaskState.READY,
        timeout=15,
        message="admitted again, the reclaimer's scan did not reclaim the task",
    )


def test_a_refused_replica_promotes_nothing_until_admitted_again(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store()  # the promoter passes every 0.25 s
    create(store, "t1")
    fence = claim(store, "t1")
    report = FailureReport(retryable=True, code="RateLimited", delay=30.0)
    assert store.failures.fail(fence, principal="w1", report=report).state is TaskState.DELAYED
    _refuse(store)
    clock.advance(31)  # due
    time.sleep(REFUSED_FOR)
    assert store.tasks.get("t1").state is TaskState.DELAYED
    _admit(store)
    eventually(lambda: store.tasks.get("t1").state is TaskState.READY, timeout=15)


def test_a_refused_replica_prunes_nothing_until_admitted_again(
    etcd: EtcdProcess, prefix: str, clock: ManualClock, tmp_path: Path
) -> None:
    kv = EtcdKV.connect([etcd.endpoint])
    store = Store.open(
        kv,
        keys=Keyspace(prefix),
        limits=LIMITS,
        clock=clock,
        retention=POLICY,
        archive=LocalSink(tmp_path / "archive"),
        prune_interval=0.25,
    )
    store.start()
    try:
        create(store, "t1")
        assert commit(store, claim(store, "t1")).verdict.outcome is Outcome.COMMITTED
        _refuse(store)
        clock.advance(RETENTION + 1)  # past its retention
        time.sleep(REFUSED_FOR)
        assert store.tasks.get("t1").state is TaskState.DONE
        assert not (tmp_path / "archive").exists() or not any((tmp_path / "archive").iterdir())
        _admit(store)

        def pruned() -> bool:
            try:
                store.tasks.get("t1")
            except NotFound:
                return True
            return False

        eventually(pruned, timeout=15, message="admitted again, the pruner did not prune")
    finally:
        store.close()
        kv.close()


def test_the_standing_reads_through_a_cache_and_an_unreadable_record_admits() -> None:
    reads: list[VersionRecord] = []
    record = VersionRecord(min_coordinator_version="2.0")

    def read() -> VersionRecord:
        if not reads:
            reads.append(record)
            return record
        raise OSError("etcd away")

    old = Standing(read, own_version="1.9", ttl=3600.0)
    assert [old.admitted() for _ in range(20)] == [False] * 20  # one read, cached
    assert len(reads) == 1
    current = Standing(read, own_version="2.0", ttl=0.0)
    assert current.admitted() is True  # the record can no longer be read: admitted
    newer_schema = Standing(
        lambda: VersionRecord(schema_version=record.schema_version + 1), own_version="2.0"
    )
    assert newer_schema.admitted() is False
