"""Reading tombstones: what GetTask, CreateTask, dependencies and lineage see of a pruned task.

A pruned task's key is gone, but its tombstone (domain/retention.py) says how it ended and where
its history went, for ``tombstone_retention``. A dependency on it is settled by its final state
(a DONE upstream still releases, a CANCELLED one still blocks), and its id is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.domain.records import decode
from coordinator.domain.retention import Tombstone
from coordinator.errors import NotFound
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import KV, get

# Reads per txn (etcd allows 128 operations in one).
_BATCH = 100


def tombstone_from_kv(kv: KV) -> Tombstone:
    """Decode a tombstone."""
    return decode(Tombstone, kv.value)


def read_tombstones(ctx: StoreContext, task_ids: Sequence[str]) -> dict[str, Tombstone]:
    """The tombstones among ``task_ids``, by id."""
    found: dict[str, Tombstone] = {}
    for start in range(0, len(task_ids), _BATCH):
        batch = task_ids[start : start + _BATCH]
        snap = ctx.kv.read(*(get(ctx.keys.tombstone(t)) for t in batch))
        for index, task_id in enumerate(batch):
            kv = snap.range_one(index)
            if kv is not None:
                found[task_id] = tombstone_from_kv(kv)
    return found


def task_not_found(ctx: StoreContext, task_id: str) -> NotFound:
    """NotFound for a task key that is absent: naming the archive if the task was pruned."""
    kv = ctx.kv.get(ctx.keys.tombstone(task_id))
    if kv is not None:
        return NotFound(tombstone_from_kv(kv).describe())
    return NotFound(f"task {task_id!r} does not exist")
