"""A task's whole history read at one revision, and its archive form.

Before a task is pruned everything that belongs to it is read here: the record, its attempts,
events, canonical and staged results, managed jobs, effects (found through the per-task effect
index), its edges and identity-index keys, plus what would stop the prune (uncertain effects,
open reconciliations, WAITING dependents). The archive object keeps every record's value as the
JSON etcd held (``zcat | jq`` reads it), base64 where a value is not JSON.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.doctor.parsed import identity_keys
from coordinator.domain.jobs import JobRecord
from coordinator.domain.records import TaskRecord, decode
from coordinator.store.context import StoreContext, task_from_kv
from coordinator.store.etcd import KV, RequestOp, get, get_prefix

ARCHIVE_FORMAT = 1
"""Version of the archive object's layout (``format`` in every object)."""

# Each task reads this many ranges in the first txn (etcd allows 128 operations per txn).
_READS_PER_TASK = 11
TASKS_PER_READ = 11
_READ_BATCH = 100


@dataclass
class TaskHistory:
    """Everything of one task, read at ``revision``."""

    task_kv: KV
    task: TaskRecord
    revision: int
    attempts: list[KV] = field(default_factory=list)
    events: list[KV] = field(default_factory=list)
    results: list[KV] = field(default_factory=list)
    staged: list[KV] = field(default_factory=list)
    jobs: list[KV] = field(default_factory=list)
    effects: list[KV] = field(default_factory=list)
    effect_index: list[str] = field(default_factory=list)
    deps: KV | None = None
    open_effects: int = 0
    open_reconciliations: int = 0
    waiting_dependents: list[str] = field(default_factory=list)

    @property
    def task_id(self) -> str:
        """The task's id."""
        return self.task.task_id

    def job_records(self) -> list[JobRecord]:
        """The managed job records (for their per-worker index keys)."""
        return [decode(JobRecord, kv.value) for kv in self.jobs]

    def identity_keys(self, ctx: StoreContext) -> list[str]:
        """The lineage index keys the task was created with."""
        return identity_keys(ctx.keys, self.task)

    def blocker(self) -> str:
        """Why the task must not be pruned yet ("" if nothing stops it)."""
        if self.open_effects:
            return "uncertain_effect"
        if self.open_reconciliations:
            return "open_reconciliation"
        if self.waiting_dependents:
            return "waiting_dependent"
        return ""

    def archive_object(self, *, archived_at: float) -> dict[str, Any]:
        """The archive form: one JSON object per task."""
        return {
            "format": ARCHIVE_FORMAT,
            "task_id": self.task_id,
            "queue": self.task.queue,
            "state": self.task.state.name,
            "archived_at": archived_at,
            "etcd_revision": self.revision,
            "task": _entry(self.task_kv),
            "attempts": [_entry(kv) for kv in self.attempts],
            "events": [_entry(kv) for kv in self.events],
            "results": [_entry(kv) for kv in self.results],
            "staged": [_entry(kv) for kv in self.staged],
            "effects": [_entry(kv) for kv in self.effects],
            "jobs": [_entry(kv) for kv in self.jobs],
            "deps": _entry(self.deps) if self.deps is not None else None,
        }


def _entry(kv: KV) -> dict[str, Any]:
    """One key as archived: its name, revisions and value (JSON as stored, else base64)."""
    entry: dict[str, Any] = {
        "key": kv.key,
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
    }
    try:
        entry["value"] = json.loads(kv.value)
    except ValueError:
        entry["value_b64"] = base64.b64encode(kv.value).decode()
    return entry


def entry_value(entry: dict[str, Any]) -> bytes:
    """The stored bytes of an archived entry, JSON re-encoded compactly (records are compact,
    key-sorted JSON, so this is byte for byte what etcd held)."""
    if "value_b64" in entry:
        return base64.b64decode(entry["value_b64"])
    return json.dumps(entry["value"], separators=(",", ":"), sort_keys=True).encode()


def read_histories(ctx: StoreContext, task_ids: Sequence[str]) -> list[TaskHistory]:
    """The histories of those of ``task_ids`` that still exist (a pruned one is skipped)."""
    found: list[TaskHistory] = []
    for start in range(0, len(task_ids), TASKS_PER_READ):
        found += _read_batch(ctx, task_ids[start : start + TASKS_PER_READ])
    return found


def _read_batch(ctx: StoreContext, task_ids: Sequence[str]) -> list[TaskHistory]:
    keys = ctx.keys
    ops: list[RequestOp] = []
    for t in task_ids:
        ops += [
            get(keys.task(t)),
            get_prefix(keys.attempts_prefix(t)),
            get_prefix(keys.events_prefix(t)),
            get_prefix(keys.results_of(t)),
            get_prefix(f"{keys.staging_prefix}{t}/"),
            get_prefix(keys.jobs_prefix(t)),
            get_prefix(keys.task_effects_prefix(t), keys_only=True),
            get_prefix(keys.open_effects_prefix(t), count_only=True),
            get_prefix(keys.reconcile_prefix(t), count_only=True),
            get(keys.deps(t)),
            get_prefix(keys.dependents_prefix(t), keys_only=True),
        ]
    snap = ctx.kv.read(*ops)
    histories: list[TaskHistory] = []
    for i, _ in enumerate(task_ids):
        base = i * _READS_PER_TASK
        task_kv = snap.range_one(base)
        if task_kv is None:
            continue
        histories.append(
            TaskHistory(
                task_kv=task_kv,
                task=task_from_kv(task_kv),
                revision=snap.revision,
                attempts=snap.range_kvs(base + 1),
                events=snap.range_kvs(base + 2),
                results=snap.range_kvs(base + 3),
                staged=snap.range_kvs(base + 4),
                jobs=snap.range_kvs(base + 5),
                effect_index=[kv.key for kv in snap.range_kvs(base + 6)],
                open_effects=snap.range_count(base + 7),
                open_reconciliations=snap.range_count(base + 8),
                deps=snap.range_one(base + 9),
            )
        )
        dependents = [kv.key.rsplit("/", 1)[1] for kv in snap.range_kvs(base + 10)]
        if dependents:
            histories[-1].waiting_dependents = _waiting(ctx, dependents, snap.revision)
    for history in histories:
        if history.effect_index:
            _read_effects(ctx, history)
    return histories


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
