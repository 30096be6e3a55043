"""Seeding READY tasks straight into a coordinator keyspace, off the clock.

Each task is written exactly as ``CreateTask`` writes it (the store's own ``transition_ops``:
task record, ready-index key and the creation event, behind ``create_revision == 0``), only in
batches, so that tens of thousands of tasks take seconds instead of minutes. The coordinator
learns of them through its ready-index watch, as it would of tasks created by another replica.

On a busy machine etcd answers a write now and then with ``etcdserver: request timed out``
(StoreUnavailable): a seeding run of 100k tasks once failed on one (issue 27). Each batch is
retried with backoff, a bounded number of times; see ``TaskSeeder._write``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from etcd3 import etcdrpc
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from bench.harness import say
from coordinator.clock import SystemClock
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.digests import digest_of
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import TaskRecord
from coordinator.domain.states import Op, TaskState
from coordinator.errors import StoreUnavailable
from coordinator.store.context import StoreContext
from coordinator.store.etcd import Compare, EtcdKV, RequestOp
from coordinator.store.leases import ClaimLeases
from coordinator.store.transition import ready_seq, transition_ops

# Three writes per task; etcd allows 128 operations per txn by default.
_BATCH = 40
# Tries of one batch (or drop) while etcd is unavailable, waiting 0.5, 1, 2, 4, 8 s between (the
# default backoff): about 15 s in all, past etcd's own request timeout (7 s), then it gives up.
SEED_ATTEMPTS = 6

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

    def __init__(self, kv: EtcdKV, keys: Keyspace, *, backoff: float = 0.5) -> None:
        """Seed into ``keys`` through ``kv``; a write etcd could not take is tried again after
        ``backoff`` seconds, doubling (``SEED_ATTEMPTS`` tries in all)."""
        self._kv = kv
        self.keys = keys
        self._ctx = StoreContext(kv, keys, ClaimLimits(), SystemClock(), ClaimLeases(kv))
        self._digest = digest_of(TASK_INPUT)
        self._backoff = backoff

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
            self._write(compares, ops, self.keys.task(task_id(queue, start)))

    def _write(self, compares: Sequence[Compare], ops: Sequence[RequestOp], first: str) -> None:
        """One batch, retried while etcd is unavailable.

        A timed-out txn may still have been applied. Its retry then fails its
        ``create_revision == 0`` compares; since a txn is all or nothing, the batch's first task
        being there means the earlier try wrote the whole batch (the seeder is the only writer
        of these ids), and only a first try that fails its compares is a real duplicate.
        """
        for attempt in _retrying(self._backoff):
            with attempt:
                if self._kv.txn(compares, ops).succeeded:
                    return
                if attempt.retry_state.attempt_number > 1 and self._kv.get(first) is not None:
                    return
                raise RuntimeError(f"seeding failed: a task of the batch from {first} exists")

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
        deletes = [_delete_prefix(self._kv, prefix) for prefix in families]
        for attempt in _retrying(self._backoff):  # a delete applied twice deletes nothing more
            with attempt:
                self._kv.txn((), deletes)


def _retrying(backoff: float) -> Retrying:
    """Tries of one write while etcd answers StoreUnavailable (bounded: ``SEED_ATTEMPTS``)."""
    return Retrying(
        retry=retry_if_exception_type(StoreUnavailable),
        stop=stop_after_attempt(SEED_ATTEMPTS),
        wait=wait_exponential(multiplier=backoff, max=16 * backoff),
        before_sleep=lambda state: say(
            f"seeding: etcd unavailable ({state.outcome and state.outcome.exception()}), "
            f"try {state.attempt_number + 1} of {SEED_ATTEMPTS}"
        ),
        reraise=True,
    )


def _delete_prefix(kv: EtcdKV, prefix: str) -> RequestOp:
    return etcdrpc.RequestOp(
        request_delete_range=etcdrpc.DeleteRangeRequest(
            key=prefix.encode(), range_end=kv.prefix_end(prefix).encode()
        )
    )
