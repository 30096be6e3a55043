"""A task's input in a key of its own (schema 2, domain/versions.py).

Under schema 1 a task's input lives inside its record, so every move of the task (claim,
commit, release, reclaim, retry) put the whole input again: a 256 KiB input cost 512 KiB of
etcd writes a claim -> commit cycle, kept in etcd's history until compaction. A record written
with ``input_in_key`` keeps its input in ``{p}/inputs/{id}`` instead, written by the create and
by UpdateInput only, deleted with the record by the pruner; the record stores an empty input.

Every reader that hands an input out (a claim, GetTask, ListTasks with inputs, a keyed claim's
replay, the archive, a task in an answer) reads the key in the same etcd read as the record
and joins it in (``joined``); every other reader never reads it. A record of schema 1 needs no
join: its input is inside it. Both layouts are read for as long as records of schema 1 can
remain; a replica writes the new one only once the keyspace's record has said schema 2 for
long enough (``Standing.writes_schema``).
"""

from __future__ import annotations

import structlog

from coordinator.domain.keys import Keyspace
from coordinator.domain.records import TaskRecord, with_changes
from coordinator.store.etcd.ops import KV, RequestOp, get, put

log = structlog.get_logger(__name__)


def input_ops(keys: Keyspace, before: TaskRecord | None, after: TaskRecord) -> list[RequestOp]:
    """The write of ``after``'s input key, if its record keeps the input there and the key does
    not hold it yet: a create, a new input, or a record moving to the layout. A move that
    keeps the input writes nothing (``after`` may not even carry it: only its digest)."""
    if not after.input_in_key:
        return []
    if before is not None and before.input_in_key and before.input_digest == after.input_digest:
        return []
    return [put(keys.input(after.task_id), after.input)]


def input_read(keys: Keyspace, task_id: str, *, revision: int = 0) -> RequestOp:
    """The read of a task's input key (at ``revision``, if given), for ``joined``."""
    return get(keys.input(task_id), revision=revision)


def joined(task: TaskRecord, found: KV | None) -> TaskRecord:
    """``task`` with its input: ``found`` (the input key, read with the record) joined in when
    the record keeps its input there; ``task`` itself when the input is inside it."""
    if not task.input_in_key:
        return task
    if found is None:  # written in the record's own txn and deleted only with it
        log.error("a task's input key is missing", task_id=task.task_id)
        return task
    return with_changes(task, input=found.value)
