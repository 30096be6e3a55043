"""CancelTask with cascade: an operator ends a task and the WAITING graph below it.

Nothing else cancels a dependent: an upstream that ends FAILED or CANCELLED only blocks it
(domain/waiting.py), since a FAILED upstream may still be retried and commit. When the work
below a task is no longer wanted, the operator says so with one call.

The walk comes first and writes nothing: from the task, through the reverse edges, every
WAITING dependent, their WAITING dependents, and so on (a dependent that is not WAITING is
neither cancelled nor walked through: it was released by an earlier round or ended already).
A graph larger than ``MAX_CASCADE`` is refused before anything is written. Then the task is
cancelled (a FAILED or CANCELLED one stays as it is: already final), and each dependent by its
own CAS, in walk order, with an event naming the task; a dependent that left WAITING meanwhile
is skipped. A call cut short is finished by repeating it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from coordinator.domain.records import TaskRecord
from coordinator.domain.states import Op, TaskState
from coordinator.errors import FailedPrecondition
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import get
from coordinator.store.lifecycle.tasks import TaskStore
from coordinator.store.transition import transition, transition_ops

MAX_CASCADE = 1000
"""Dependents one cascade cancels at most: each is its own txn, and the walk holds them all
before the first is written."""

# Records read per txn (etcd allows 128 operations in one).
_BATCH = 100
_CAS_TRIES = 8
# A root in these states is final already: the cascade cancels only what is below it.
_ENDED = frozenset({TaskState.FAILED, TaskState.CANCELLED})


class Cascade:
    """CancelTask{cascade: true} on the store."""

    def __init__(self, ctx: StoreContext, tasks: TaskStore) -> None:
        self._ctx = ctx
        self._tasks = tasks

    def cancel(self, task_id: str, *, by: str, reason: str) -> tuple[TaskRecord, list[str]]:
        """Cancel ``task_id`` and its WAITING graph; returns the task and the dependents this
        call cancelled. FailedPrecondition (nothing written) past ``MAX_CASCADE``."""
        below = self.walk(task_id)
        task = self._tasks.get(task_id)
        if task.state not in _ENDED:
            task = self._tasks.cancel(task_id, by=by, reason=reason)
        detail = f"cancelled with its upstream {task_id}" + (f": {reason}" if reason else "")
        cancelled = [d for d in below if self._cancel_waiting(d, by=by, detail=detail)]
        return task, cancelled

    def walk(self, task_id: str) -> list[str]:
        """Every WAITING task downstream of ``task_id`` through WAITING tasks, breadth first.
        Only WAITING ones are remembered (at most ``MAX_CASCADE``): another dependent met twice
        is read twice, which costs less than holding every id of a wide graph."""
        seen: set[str] = {task_id}
        order: list[str] = []
        frontier = deque([task_id])
        while frontier:
            for page in self._dependent_pages(frontier.popleft()):
                waiting = [t.task_id for t in self._waiting([d for d in page if d not in seen])]
                seen.update(waiting)
                order += waiting
                frontier.extend(waiting)
                if len(order) > MAX_CASCADE:
                    raise FailedPrecondition(
                        f"the WAITING graph below task {task_id!r} has more than {MAX_CASCADE} "
                        "tasks; a cascade cancels at most that many: cancel with cascade "
                        "further down first (ListDependencies shows the dependents), then "
                        "this task"
                    )
        return order

    def _dependent_pages(self, upstream: str) -> Iterator[list[str]]:
        """The dependents of ``upstream`` from its reverse edges, a page at a time."""
        kv, keys = self._ctx.kv, self._ctx.keys
        prefix = keys.dependents_prefix(upstream)
        start, end = prefix, kv.prefix_end(prefix)
        while True:
            edges, _ = kv.range_page(start, end, limit=_BATCH, keys_only=True)
            if edges:
                yield [item.key.removeprefix(prefix) for item in edges]
            if len(edges) < _BATCH:
                return
            start = edges[-1].key + "\0"

    def _waiting(self, task_ids: list[str]) -> list[TaskRecord]:
        """The records of ``task_ids`` that exist and are WAITING, in order."""
        waiting: list[TaskRecord] = []
        for start in range(0, len(task_ids), _BATCH):
            batch = task_ids[start : start + _BATCH]
            snap = self._ctx.kv.read(*(get(self._ctx.keys.task(t)) for t in batch))
            for index in range(len(batch)):
                kv = snap.range_one(index)
                if kv is not None and (task := task_from_kv(kv)).state is TaskState.WAITING:
                    waiting.append(task)
        return waiting

    def _cancel_waiting(self, task_id: str, *, by: str, detail: str) -> bool:
        """Cancel one dependent if it is still WAITING; False if it left WAITING meanwhile."""
        ctx = self._ctx
        for _ in range(_CAS_TRIES):
            kv = ctx.kv.get(ctx.keys.task(task_id))
            if kv is None or (task := task_from_kv(kv)).state is not TaskState.WAITING:
                return False
            after = transition(
                task, Op.CANCEL, ctx.clock.now(), cancel_generation=task.cancel_generation + 1
            )
            compares, ops = transition_ops(ctx, task, after, Op.CANCEL, by=by, detail=detail)
            if ctx.kv.txn(compares, ops).succeeded:
                return True
        raise FailedPrecondition(f"task {task_id!r} kept changing; cancel with cascade again")
