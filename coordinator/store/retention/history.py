"""A task's whole history at one revision, and its archive form.

Before a task is pruned everything that belongs to it is read (store/retention/history_read.py): the
record, its attempts, events, canonical and staged results, managed jobs, effects (found through
the per-task effect index), its edges and identity-index keys, plus what would stop the prune
(uncertain effects, open reconciliations, WAITING dependents). The archive object keeps every
record's value as the JSON etcd held (``zcat | jq`` reads it), base64 where a value is not JSON.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from coordinator.domain.attempt_in_record import recorded_attempt
from coordinator.domain.keys import Keyspace
from coordinator.domain.lineage import identity_keys
from coordinator.domain.records import TaskRecord, encode
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import KV

ARCHIVE_FORMAT = 1
"""Version of the archive object's layout (``format`` in every object)."""


@dataclass
class TaskHistory:
    """Everything of one task, read at ``revision``."""

    task_kv: KV
    task: TaskRecord
    revision: int
    # The task's input key (schema 2: coordinator/store/task_inputs.py), None when the input
    # is inside the record.
    input_kv: KV | None = None
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

    def identity_keys(self, ctx: StoreContext) -> list[str]:
        """The lineage index keys the task was created with."""
        return identity_keys(ctx.keys, self.task)

    def size(self) -> int:
        """The bytes of its records' values (what archiving it holds in memory)."""
        kvs = [self.task_kv, *self.attempts, *self.events, *self.results, *self.staged]
        kvs += [*self.jobs, *self.effects, *([self.input_kv] if self.input_kv else [])]
        return sum(len(kv.value) for kv in kvs)

    def blocker(self) -> str:
        """Why the task must not be pruned yet ("" if nothing stops it)."""
        if self.open_effects:
            return "uncertain_effect"
        if self.open_reconciliations:
            return "open_reconciliation"
        if self.waiting_dependents:
            return "waiting_dependent"
        return ""

    def archive_object(self, keys: Keyspace, *, archived_at: float) -> dict[str, Any]:
        """The archive form: one JSON object per task (``input``: the task's input key, only
        when its record keeps the input there; always base64, so it comes back byte for byte)."""
        archived: dict[str, Any] = {
            "format": ARCHIVE_FORMAT,
            "task_id": self.task_id,
            "queue": self.task.queue,
            "state": self.task.state.name,
            "archived_at": archived_at,
            "etcd_revision": self.revision,
            "task": entry(self.task_kv),
            "attempts": self._attempt_entries(keys),
            "events": [entry(kv) for kv in self.events],
            "results": [entry(kv) for kv in self.results],
            "staged": [entry(kv) for kv in self.staged],
            "effects": [entry(kv) for kv in self.effects],
            "jobs": [entry(kv) for kv in self.jobs],
            "deps": entry(self.deps) if self.deps is not None else None,
        }
        if self.input_kv is not None:
            archived["input"] = entry(self.input_kv, raw=True)
        return archived

    def _attempt_entries(self, keys: Keyspace) -> list[dict[str, Any]]:
        """The attempts' keys, and the attempt the task record holds (schema 3: no key of its
        own) as an entry of its own, marked ``in_task_record``, with the key it would have."""
        entries = [entry(kv) for kv in self.attempts]
        recorded = recorded_attempt(self.task)
        if recorded is None:
            return entries
        key = keys.attempt(self.task_id, recorded.attempt_id)
        if all(kv.key != key for kv in self.attempts):  # a key of the attempt wins
            value = json.loads(encode(recorded))
            revisions = {"create_revision": 0, "mod_revision": 0}
            entries.append({"key": key, **revisions, "value": value, "in_task_record": True})
        return entries


def entry(kv: KV, *, raw: bool = False) -> dict[str, Any]:
    """One key as archived: its name, revisions and value (JSON as stored, else base64; always
    base64 when ``raw``: an input that happens to be JSON must not come back re-encoded)."""
    entry: dict[str, Any] = {
        "key": kv.key,
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
    }
    if not raw:
        try:
            entry["value"] = json.loads(kv.value)
            return entry
        except ValueError:
            pass  # not JSON: base64
    entry["value_b64"] = base64.b64encode(kv.value).decode()
    return entry


def entry_value(entry: dict[str, Any]) -> bytes:
    """The stored bytes of an archived entry, JSON re-encoded compactly (records are compact,
    key-sorted JSON, so this is byte for byte what etcd held)."""
    if "value_b64" in entry:
        return base64.b64decode(entry["value_b64"])
    return json.dumps(entry["value"], separators=(",", ":"), sort_keys=True).encode()
