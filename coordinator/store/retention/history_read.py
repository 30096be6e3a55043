"""Reading task histories for the pruner: batched for the common small task, paged for any other.

A task's history has no bound of its own (every claim adds an attempt, every move an event), and
one gRPC message holds at most 4 MiB: a task with 12,000 attempts does not fit in one range, let
alone beside ten other tasks. So:

- one txn reads ``TASKS_PER_READ`` tasks at once, each section (attempts, events, results,
  staged results, jobs, effect index, dependents) only up to a first-page limit that the records
  of a typical task fit in;
- a section that had more is read on, page by page, **at the txn's revision** (the same
  snapshot: the archive is of one consistent history), each page small enough for the largest
  records the server accepts (results and staged results of 512 KiB, attempts with a 64 KiB
  checkpoint);
- a batch etcd cannot answer in one message (tasks with the largest inputs and results) is read
  again one task at a time, each section's first page one record long.

``read_whole`` is the first step alone: it answers only when one message held every history of
the batch whole, so the pruner sends several at once (a pass is bound by round trips) and holds
at most that many messages; any other batch it reads with ``read_histories``, page after page.
The history is accumulated whole (one archive object per task); the pruner bounds how many
bytes of histories it holds at once (store/retention/pruner.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from coordinator.domain.keys import Keyspace
from coordinator.errors import CoordinatorError, StoreUnavailable
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd.ops import KV, RequestOp, TxnResult, get, get_prefix
from coordinator.store.retention.history import TaskHistory
from coordinator.store.task_inputs import input_read

_READ_BATCH = 100


@dataclass(frozen=True)
class _Section:
    """One paged range of a task: where it is, its first-page limit in the batched read, and
    the page size after that (the largest records it may hold, times it, stay within 4 MiB)."""

    name: str
    prefix: Callable[[Keyspace, str], str]
    first: int
    page: int
    keys_only: bool = False


_SECTIONS = (
    _Section("attempts", lambda k, t: k.attempts_prefix(t), first=16, page=24),
    _Section("events", lambda k, t: k.events_prefix(t), first=32, page=1000),
    _Section("results", lambda k, t: k.results_of(t), first=2, page=4),
    _Section("staged", lambda k, t: f"{k.staging_prefix}{t}/", first=2, page=4),
    _Section("jobs", lambda k, t: k.jobs_prefix(t), first=8, page=100),
    _Section("effect_index", lambda k, t: k.task_effects_prefix(t), 64, 1000, keys_only=True),
    _Section("dependents", lambda k, t: k.dependents_prefix(t), 64, 1000, keys_only=True),
)
# Per task in the first txn: the task, the sections, two counts, the edges and the input key.
_READS_PER_TASK = 1 + len(_SECTIONS) + 4
TASKS_PER_READ = 128 // _READS_PER_TASK
"""Tasks read in one txn (10, at 12 ops each: etcd allows 128 operations per txn)."""


def read_histories(ctx: StoreContext, task_ids: Sequence[str]) -> Iterator[TaskHistory]:
    """The whole histories of those of ``task_ids`` that still exist (a pruned one is
    skipped), each read at one revision, one after the other as they are read."""
    for start in range(0, len(task_ids), TASKS_PER_READ):
        yield from _read_batch(ctx, task_ids[start : start + TASKS_PER_READ])


def read_whole(ctx: StoreContext, task_ids: Sequence[str]) -> list[TaskHistory] | None:
    """The histories of ``task_ids`` (at most TASKS_PER_READ) if one txn held all of them
    whole - the common case, bounded by one gRPC message, so several may be read at once -
    else None: read those with ``read_histories``, one page after the other."""
    ops: list[RequestOp] = []
    for task_id in task_ids:
        ops += _first_reads(ctx.keys, task_id, 0)
    try:
        snap = ctx.kv.read(*ops)
    except StoreUnavailable:
        raise
    except CoordinatorError:  # more than one gRPC message holds
        return None
    for n in range(len(task_ids)):
        sections = range(n * _READS_PER_TASK + 1, n * _READS_PER_TASK + 1 + len(_SECTIONS))
        if any(snap.range_more(i) for i in sections):
            return None
    return list(_histories(ctx, snap, task_ids))


def _read_batch(
    ctx: StoreContext, task_ids: Sequence[str], *, first: int = 0
) -> Iterator[TaskHistory]:
    """One txn for ``task_ids`` (sections up to their first-page limit, or ``first``)."""
    ops: list[RequestOp] = []
    for task_id in task_ids:
        ops += _first_reads(ctx.keys, task_id, first)
    try:
        snap = ctx.kv.read(*ops)
    except StoreUnavailable:
        raise
    except CoordinatorError:  # the answer exceeds one gRPC message: one task at a time
        if len(task_ids) == 1 and first == 1:
            raise
        for task_id in task_ids:
            yield from _read_batch(ctx, [task_id], first=1)
        return
    yield from _histories(ctx, snap, task_ids)


def _histories(
    ctx: StoreContext, snap: TxnResult, task_ids: Sequence[str]
) -> Iterator[TaskHistory]:
    for n, task_id in enumerate(task_ids):
        history = _history(ctx, snap, n * _READS_PER_TASK, task_id)
        if history is not None:
            if history.effect_index:
                _read_effects(ctx, history)
            yield history


def _first_reads(keys: Keyspace, task_id: str, first: int) -> list[RequestOp]:
    ops = [get(keys.task(task_id))]
    ops += [
        get_prefix(s.prefix(keys, task_id), keys_only=s.keys_only, limit=first or s.first)
        for s in _SECTIONS
    ]
    ops += [
        get_prefix(keys.open_effects_prefix(task_id), count_only=True),
        get_prefix(keys.reconcile_prefix(task_id), count_only=True),
        get(keys.deps(task_id)),
        input_read(keys, task_id),  # the archive keeps the input (schema 2: its own key)
    ]
    return ops


def _history(ctx: StoreContext, snap: TxnResult, base: int, task_id: str) -> TaskHistory | None:
    """The task at ``base`` of ``snap`` with every section read to its end."""
    task_kv = snap.range_one(base)
    if task_kv is None:
        return None
    sections: dict[str, list[KV]] = {}
    for n, section in enumerate(_SECTIONS, start=base + 1):
        kvs = snap.range_kvs(n)
        if snap.range_more(n):
            kvs += _rest(ctx, section, task_id, kvs[-1].key, snap.revision)
        sections[section.name] = kvs
    counts = base + 1 + len(_SECTIONS)
    history = TaskHistory(
        task_kv=task_kv,
        task=task_from_kv(task_kv),
        input_kv=snap.range_one(counts + 3),
        revision=snap.revision,
        attempts=sections["attempts"],
        events=sections["events"],
        results=sections["results"],
        staged=sections["staged"],
        jobs=sections["jobs"],
        effect_index=[kv.key for kv in sections["effect_index"]],
        open_effects=snap.range_count(counts),
        open_reconciliations=snap.range_count(counts + 1),
        deps=snap.range_one(counts + 2),
    )
    dependents = [kv.key.rsplit("/", 1)[1] for kv in sections["dependents"]]
    if dependents:
        history.waiting_dependents = _waiting(ctx, dependents, snap.revision)
    return history


def _rest(
    ctx: StoreContext, section: _Section, task_id: str, after: str, revision: int
) -> list[KV]:
    """The keys of ``section`` after ``after``, page by page, at ``revision``."""
    kv = ctx.kv
    end = kv.prefix_end(section.prefix(ctx.keys, task_id))
    found: list[KV] = []
    while True:
        page, _ = kv.range_page(
            after + "\0", end, limit=section.page, revision=revision, keys_only=section.keys_only
        )
        found += page
        if len(page) < section.page:
            return found
        after = page[-1].key


def _read_effects(ctx: StoreContext, history: TaskHistory) -> None:
    """The effect records named by the task's effect index, at the history's revision."""
    ids = [key.rsplit("/", 1)[1] for key in history.effect_index]
    for start in range(0, len(ids), _READ_BATCH):
        batch = ids[start : start + _READ_BATCH]
        snap = ctx.kv.read(*(get(ctx.keys.effect(e), revision=history.revision) for e in batch))
        history.effects += [kv for n in range(len(batch)) if (kv := snap.range_one(n))]


def _waiting(ctx: StoreContext, dependents: Sequence[str], revision: int) -> list[str]:
    """Those of ``dependents`` that are WAITING (a pruned upstream must not strand them)."""
    waiting: list[str] = []
    for start in range(0, len(dependents), _READ_BATCH):
        batch = dependents[start : start + _READ_BATCH]
        snap = ctx.kv.read(*(get(ctx.keys.waiting(d), revision=revision) for d in batch))
        waiting += [d for n, d in enumerate(batch) if snap.range_one(n) is not None]
    return waiting
