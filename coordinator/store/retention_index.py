"""The prune index and the tombstone guard, as ops of the txn that moves a task.

Every task transition goes through ``store/transition.py``'s ``transition_ops``, which calls
``retention_ops``: the move that makes a task terminal writes ``{p}/prune-due/{due}/{task}`` in
its own txn, so the pruner finds due tasks by reading that index up to now - O(due), never a scan
of the tasks - and a task that is not terminal is never in it. A move that ends an attempt while
the task stays live writes ``{p}/attempt-sweep/{due}/{task}/{attempt}`` the same way, for the
sweep of that attempt's staged result and finished jobs (store/retention/attempt_sweep.py). A create
compares the id's tombstone absent, so an id that was pruned is refused, not silently reused.
"""

from __future__ import annotations

import json

from coordinator.domain.records import TaskRecord
from coordinator.domain.retention import micros
from coordinator.domain.states import TERMINAL_STATES
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import Compare, RequestOp, create_revision_is, put


def retention_ops(
    ctx: StoreContext, before: TaskRecord | None, after: TaskRecord
) -> tuple[list[Compare], list[RequestOp]]:
    """The compares and writes retention adds to the transition ``before`` -> ``after``."""
    compares: list[Compare] = []
    ops: list[RequestOp] = []
    was = before.state if before is not None else None
    if was is None:
        compares.append(create_revision_is(ctx.keys.tombstone(after.task_id), 0))
    if after.state in TERMINAL_STATES and was not in TERMINAL_STATES:
        due = ctx.retention.due_at(after)
        if due is not None:
            ops.append(put(ctx.keys.prune_due(micros(due), after.task_id), due_value(after)))
    sweep = ctx.retention.sweep_at(before, after)
    if sweep is not None and before is not None:
        key = ctx.keys.attempt_sweep(micros(sweep), after.task_id, before.attempt_id)
        ops.append(put(key, b""))
    return compares, ops


def due_value(task: TaskRecord) -> bytes:
    """The value of a prune-index key: what the oldest-terminal-task gauge and doctor read."""
    return json.dumps(
        {"queue": task.queue, "finished_at": task.updated_at}, separators=(",", ":")
    ).encode()


def finished_at_of(value: bytes) -> float:
    """The finish time stored in a prune-index value (0.0 if unreadable)."""
    try:
        return float(json.loads(value)["finished_at"])
    except (ValueError, KeyError, TypeError):
        return 0.0
