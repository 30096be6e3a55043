"""What still runs of one queue's tasks: the counts of a per-queue DrainStatus.

Read from etcd at the revision of the drain's first read, never from a watch-fed copy: a copy
that lags by one claim would call a queue drained while that claim still runs.

* Claims: the claimed index (``{p}/claimed/{task}``, value: the task's queue) exists exactly
  while a task is CLAIMED, so counting its values equal to the queue is one paged range and no
  task read. A key with an empty value (written by an older coordinator) names no queue: it
  counts for every queue, as it might be any (it goes when that claim ends).
* Uncertain effects: the open-effect index is keyed by task, so the queue of each task found
  there is read (a handful of tasks, in batches). A task that cannot be read counts.
"""

from __future__ import annotations

from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import get

_PAGE = 1000
_TASK_BATCH = 100  # reads per txn; etcd allows 128 operations


def count_claimed(ctx: StoreContext, queue: str, revision: int) -> int:
    """CLAIMED tasks of ``queue`` at ``revision`` (claimed index values naming no queue too)."""
    kv, root = ctx.kv, ctx.keys.claimed_prefix
    start, end = root, kv.prefix_end(root)
    count = 0
    while True:
        page, _ = kv.range_page(start, end, limit=_PAGE, revision=revision)
        count += sum(1 for item in page if item.value.decode() in ("", queue))
        if len(page) < _PAGE:
            return count
        start = page[-1].key + "\0"


def count_open_effects(ctx: StoreContext, queue: str, revision: int) -> int:
    """Effects PREPARED or UNKNOWN at ``revision`` whose task is in ``queue``."""
    kv, root = ctx.kv, ctx.keys.open_effects_prefix()
    start, end = root, kv.prefix_end(root)
    per_task: dict[str, int] = {}
    while True:
        page, _ = kv.range_page(start, end, limit=_PAGE, revision=revision, keys_only=True)
        for item in page:
            task_id = item.key.removeprefix(root).split("/", 1)[0]
            per_task[task_id] = per_task.get(task_id, 0) + 1
        if len(page) < _PAGE:
            break
        start = page[-1].key + "\0"
    task_ids = sorted(per_task)
    count = 0
    for first in range(0, len(task_ids), _TASK_BATCH):
        batch = task_ids[first : first + _TASK_BATCH]
        snap = kv.read(*(get(ctx.keys.task(t), revision=revision) for t in batch))
        for i, task_id in enumerate(batch):
            task = snap.range_one(i)
            if task is None or task_from_kv(task).queue == queue:
                count += per_task[task_id]
    return count
