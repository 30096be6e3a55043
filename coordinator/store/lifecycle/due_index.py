"""What the promoter and the deadline enforcer share: a pass over an index sorted by due time,
up to now, page by page, with the task records the page names read in one round trip.

Both indexes (``{p}/delayed/...``, ``{p}/deadlines/...``) end their keys with the task id, so a
pass costs the due tasks, never a scan of all tasks; whatever a page's handler does is a CAS on
each task, so a record read here that moved meanwhile only makes its move fail.
"""

from __future__ import annotations

from collections.abc import Callable

from coordinator.domain.records import TaskRecord
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import get

PageHandler = Callable[[list[TaskRecord]], int]
"""Moves what it can of a page of due tasks; returns how many it moved."""


def due_pass(ctx: StoreContext, start: str, end: str, handle: PageHandler, *, page: int) -> int:
    """Hand every task named in the index range ``[start, end)`` to ``handle``, ``page`` at a
    time (a task gone meanwhile is left out); returns how many ``handle`` moved."""
    moved = 0
    while True:
        keys, _ = ctx.kv.range_page(start, end, limit=page, keys_only=True)
        if keys:
            moved += handle(_tasks(ctx, [kv.key.rsplit("/", 1)[1] for kv in keys]))
        if len(keys) < page:
            return moved
        start = keys[-1].key + "\0"


def _tasks(ctx: StoreContext, task_ids: list[str]) -> list[TaskRecord]:
    snap = ctx.kv.read(*(get(ctx.keys.task(t)) for t in task_ids))
    found = (snap.range_one(index) for index in range(len(task_ids)))
    return [task_from_kv(kv) for kv in found if kv is not None]
