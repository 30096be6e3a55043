"""The store's watches survive an etcd restart: the ready index and the reclaimer keep following.

A watch that silently died (as the etcd3 client's does when its stream breaks) would leave
ClaimNext blind to new tasks and the reclaimer deaf to expiries until the next scan.
"""

from __future__ import annotations

from pathlib import Path

from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.keys import Keyspace
from coordinator.domain.states import Outcome, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.store import EtcdKV, Store, TaskSpec
from tests.helpers import RETRY_AT_ONCE, eventually


def test_ready_index_and_reclaimer_follow_across_an_etcd_restart(tmp_path: Path) -> None:
    etcd = EtcdProcess(data_dir=tmp_path / "etcd").start()
    kv = EtcdKV.connect([etcd.endpoint], timeout=3)
    # A scan interval far beyond the test: only the watch can reclaim in time.
    store = Store.open(
        kv,
        keys=Keyspace("/restart"),
        limits=ClaimLimits(min_ttl=1, max_ttl=10, retry=RETRY_AT_ONCE),
        scan_interval=600,
    )
    try:
        store.start()
        store.tasks.create(TaskSpec(task_id="before"), by="pm")
        eventually(lambda: store.ready.size("default") == 1, message="ready index saw 'before'")

        etcd.stop()
        etcd.start()

        # Written after the restart by another client: only a resumed watch can see it.
        other = Store.open(EtcdKV.connect([etcd.endpoint], timeout=3), keys=Keyspace("/restart"))
        eventually(lambda: _create(other, "after"), timeout=20, message="etcd back")
        eventually(
            lambda: store.ready.size("default") == 2,
            timeout=20,
            message="ready index resumed after the restart and saw 'after'",
        )

        claimed = store.claims.claim("after", principal="w1", epoch=1, ttl=1)
        assert claimed.verdict.outcome is Outcome.CLAIMED
        eventually(
            lambda: store.tasks.get("after").state is TaskState.READY,
            timeout=20,
            message="the reclaimer's watch saw the expired claim after the restart",
        )
    finally:
        store.close()
        kv.close()
        etcd.stop()


def _create(store: Store, task_id: str) -> bool:
    try:
        store.tasks.create(TaskSpec(task_id=task_id), by="pm")
    except Exception:
        return False
    return True
