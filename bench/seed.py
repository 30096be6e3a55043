"""Seeding READY tasks straight into a coordinator keyspace, off the clock.

Each task is written exactly as ``CreateTask`` writes it (the store's own ``transition_ops``:
task record, ready-index key and the creation event, behind ``create_revision == 0``), only in
batches, so that tens of thousands of tasks take seconds instead of minutes. The coordinator
learns of them through its ready-index watch, as it would of tasks created by another replica.
"""

from __future__ import annotations

import time

from etcd3 import etcdrpc

from coordinator.clock import SystemClock
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.digests import digest_of
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import TaskRecord
from coordinator.domain.states import Op, TaskState
from coordinator.store.context import StoreContext
from coordinator.store.etcd.kv import EtcdKV
from coordinator.store.etcd.leases import ClaimLeases
from coordinator.store.etcd.ops import RequestOp
from coordinator.store.transition import ready_seq, transition_ops

# Three writes per task; etcd allows 128 operations per txn by default.
_BATCH = 40

TASK_INPUT = b"benchmark task input: 64 bytes of payload, the same for each task."
"""The input every seeded task carries."""


def task_id(queue: str, index: int) -> str:
    """The id of the ``index``-th seeded task of ``queue`` (``{queue}.{index}``).

    The dot after the queue name keeps one queue's ids from being a prefix of another's, so a
    queue's keys can be dropped by prefix.
    """
    return f"{queue}.{index:07d}"


class TaskSeeder:
    """Writes and drops batches of READY tasks in one keyspace."""

    def __init__(self, kv: EtcdKV, keys: Keyspace) -> None:
        self._kv = kv
        self.keys = keys
        self._ctx = StoreContext(kv, keys, ClaimLimits(), SystemClock(), ClaimLeases(kv))
        self._digest = digest_of(TASK_INPUT)

    def seed(self, queue: str, count: int) -> None:
        """Create ``count`` READY tasks in ``queue``, claimable in index order."""
        now = time.time()
        first_seq = ready_seq(now)
        for start in range(0, count, _BATCH):
            compares, ops = [], []
            for i in range(start, min(start + _BATCH, count)):
                tid = task_id(queue, i)
                task = TaskRecord(
                    task_id=tid,
                    queue=queue,
                    input_digest=self._digest,
                    state=TaskState.READY,
                    input=TASK_INPUT,
                    root_task_id=tid,
                    thread_key=tid,
                    created_at=now,
                    updated_at=now,
                    ready_seq=first_seq + i,
                )
                more_compares, more_ops = transition_ops(
                    self._ctx, None, task, Op.CREATE, by="bench-seeder"
                )
                compares += more_compares
                ops += more_ops
            if not self._kv.txn(compares, ops).succeeded:
                raise RuntimeError(f"seeding {queue} failed: a task id already exists")

    def drop(self, queue: str) -> None:
        """Delete the queue's ready keys and every key of its tasks (records, claims, ...)."""
        keys = self.keys
        families = [
            keys.ready_prefix(queue),
            keys.tasks_prefix + queue + ".",
            keys.claims_prefix + queue + ".",
            keys.claimed_prefix + queue + ".",
            f"{keys.prefix}/attempts/{queue}.",
            f"{keys.prefix}/events/{queue}.",
            keys.results_prefix + queue + ".",
        ]
        self._kv.txn((), [_delete_prefix(self._kv, prefix) for prefix in families])


def _delete_prefix(kv: EtcdKV, prefix: str) -> RequestOp:
    return etcdrpc.RequestOp(
        request_delete_range=etcdrpc.DeleteRangeRequest(
            key=prefix.encode(), range_end=kv.prefix_end(prefix).encode()
        )
    )
