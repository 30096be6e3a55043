"""ListTasks' pages: task keys first, then their records in reads of bounded size, and a byte
budget on what one page returns.

A task record holds its input (up to ``MAX_INPUT_BYTES``), so a range read of 100 task records
was up to 26 MiB: after about 16 tasks with legal 256 KiB inputs, every listing by queue or
state answered INTERNAL (etcd's answer passed the 4 MiB gRPC message limit), even for a queue
of tiny tasks, and the console's pages answered 502 for everyone. Now the keys come from a
keys-only range, the records from reads of at most ``VALUES_PER_READ`` keys (sized for the
largest legal record, so no read can pass ``READ_BYTES``), a page stops before its records pass
``PAGE_BYTES`` (inputs count only when asked for), and a call stops scanning after
``SCAN_BYTES`` of records read, answering a shorter page with a token to go on from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from coordinator.domain.records import TaskRecord, with_changes
from coordinator.domain.validation import MAX_INPUT_BYTES
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import get
from coordinator.store.task_inputs import input_read, joined


def _base64_len(size: int) -> int:
    """Bytes of ``size`` bytes in base64 (records are JSON: domain/records.py's encode)."""
    return 4 * -(-size // 3)


MAX_RECORD_BYTES = _base64_len(MAX_INPUT_BYTES) + 64 * 1024
"""The largest stored task record: its input in base64 plus everything else it holds (ids, up
to 50 dependencies and blocked_by ids of 128 characters, a last error of 1,024 characters that
JSON may escape to 6 bytes each, timestamps)."""
READ_BYTES = 3 * 1024 * 1024
"""One etcd read of task records at most: under the client's 4 MiB message limit with room."""
VALUES_PER_READ = READ_BYTES // MAX_RECORD_BYTES
"""Task records fetched per read (7): the most that cannot pass READ_BYTES."""
PAGE_BYTES = 3 * 1024 * 1024
"""Bytes of task records one page returns at most (under the 4 MiB ListTasks answer)."""
SCAN_BYTES = 64 * 1024 * 1024
"""Bytes of task records one call reads at most while filtering, so a filter matching few of
many large tasks answers a shorter page (with a token) instead of reading the keyspace."""
_KEYS_PER_RANGE = 500
"""Keys per keys-only range (about 100 bytes each: one small read)."""
SCAN_KEYS = 10_000
"""Task keys one call looks at most, for the same reason when the tasks are small."""


@dataclass(frozen=True)
class Page:
    """One page: the matching tasks and the id to resume after ("" when the scan ended)."""

    tasks: list[TaskRecord]
    position: str


def record_cost(task: TaskRecord, size: int, *, include_input: bool) -> int:
    """Bytes a task adds to a page: what was read of it (``size``: its record, and its input
    key when read), its input counted as sent (raw bytes, or nothing) rather than as stored."""
    sent_input = len(task.input) if include_input else 0
    # Read as it is stored: raw in its own key (joined only when asked for), else base64.
    stored_input = len(task.input) if task.input_in_key else _base64_len(len(task.input))
    return size - stored_input + sent_input


def read_page(
    ctx: StoreContext,
    prefix: str,
    after: str,
    wanted: Callable[[TaskRecord], bool],
    *,
    page_size: int,
    include_input: bool,
) -> Page:
    """Up to ``page_size`` tasks matching ``wanted`` among the keys under ``prefix`` (task
    records, or index keys ending in a task id) after task id ``after``.

    The page ends at ``page_size`` tasks, before ``PAGE_BYTES``, or after ``SCAN_BYTES`` read
    or ``SCAN_KEYS`` looked at; ``position`` is then the last task id looked at, so the next
    page resumes right after it (a short or even empty page with a position means "more may
    follow"). Inputs are dropped unless ``include_input``.
    """
    found: list[TaskRecord] = []
    page_bytes = scanned_bytes = 0
    position = ""
    records = _records(ctx, prefix, after, include_input=include_input)
    for scanned_keys, (task_id, task, size) in enumerate(records, 1):
        cost = record_cost(task, size, include_input=include_input)
        if wanted(task):
            if found and page_bytes + cost > PAGE_BYTES:
                return Page(found, position)
            found.append(task if include_input else with_changes(task, input=b""))
            page_bytes += cost
        position = task_id
        scanned_bytes += size
        if len(found) == page_size or scanned_bytes >= SCAN_BYTES or scanned_keys >= SCAN_KEYS:
            return Page(found, position)
    return Page(found, "")


def _records(
    ctx: StoreContext, prefix: str, after: str, *, include_input: bool
) -> Iterator[tuple[str, TaskRecord, int]]:
    """(task id, record, stored size) in key order after ``after``; an index key whose task
    is gone is skipped (doctor reports it). Keys come a keys-only page at a time, records
    ``VALUES_PER_READ`` at a time, each read at one consistent revision; with
    ``include_input``, each with its input key (schema 2), joined in and counted in its size
    (a record that keeps its input elsewhere and that input are no bigger than the largest
    record that holds one, so a read stays under ``READ_BYTES``)."""
    kv, keys = ctx.kv, ctx.keys
    start = prefix + after + "\0" if after else prefix
    end = kv.prefix_end(prefix)
    while True:
        page, _ = kv.range_page(start, end, limit=_KEYS_PER_RANGE, keys_only=True)
        ids = [item.key.rsplit("/", 1)[1] for item in page]
        for first in range(0, len(ids), VALUES_PER_READ):
            batch = ids[first : first + VALUES_PER_READ]
            reads = [get(keys.task(t)) for t in batch]
            if include_input:
                reads += [input_read(keys, t) for t in batch]
            snap = kv.read(*reads)
            for i, task_id in enumerate(batch):
                item = snap.range_one(i)
                if item is None:
                    continue
                task, size = task_from_kv(item), len(item.value)
                if include_input and task.input_in_key:
                    task = joined(task, snap.range_one(len(batch) + i))
                    size += len(task.input)
                yield task_id, task, size
        if len(page) < _KEYS_PER_RANGE:
            return
        start = page[-1].key + "\0"
