"""The snapshot sorted by section (task ids extracted, records decoded), shared by the
per-task checks and the orphan checks."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TypeVar

from coordinator.doctor.findings import Finding, Problem, Snapshot
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import TaskRecord, decode
from coordinator.store.etcd.ops import KV

T = TypeVar("T")


@dataclass
class Parsed:
    """The snapshot sorted by section, task ids extracted."""

    tasks: dict[str, tuple[KV, TaskRecord]] = field(default_factory=dict)
    ready: dict[str, list[KV]] = field(default_factory=lambda: defaultdict(list))
    claims: dict[str, KV] = field(default_factory=dict)
    claimed: dict[str, KV] = field(default_factory=dict)
    waiting: dict[str, KV] = field(default_factory=dict)
    blocked: dict[str, KV] = field(default_factory=dict)
    overdue: dict[str, KV] = field(default_factory=dict)
    attempts: dict[str, list[KV]] = field(default_factory=lambda: defaultdict(list))
    results: dict[str, list[KV]] = field(default_factory=lambda: defaultdict(list))
    events: dict[str, list[KV]] = field(default_factory=lambda: defaultdict(list))
    deps: dict[str, KV] = field(default_factory=dict)
    # Inputs kept in a key of their own (schema 2: store/task_inputs.py), by task id.
    inputs: dict[str, KV] = field(default_factory=dict)
    # upstream -> dependent -> reverse-edge key
    dependents: dict[str, dict[str, KV]] = field(default_factory=lambda: defaultdict(dict))
    identity: dict[str, KV] = field(default_factory=dict)
    effects: dict[str, KV] = field(default_factory=dict)  # by effect id
    # (task id, effect id) -> key of the open-effects and the reconcile indexes
    open_effects: dict[tuple[str, str], KV] = field(default_factory=dict)
    reconcile: dict[tuple[str, str], KV] = field(default_factory=dict)
    # Retention: tombstones by task id, prune-index keys by task id, per-task effect index
    # (task id, effect id), staged results and job records by task id, the per-worker job index.
    tombstones: dict[str, KV] = field(default_factory=dict)
    prune_due: dict[str, KV] = field(default_factory=dict)
    task_effects: dict[tuple[str, str], KV] = field(default_factory=dict)
    staging: dict[str, list[KV]] = field(default_factory=lambda: defaultdict(list))
    jobs: dict[str, list[KV]] = field(default_factory=lambda: defaultdict(list))
    worker_jobs: dict[str, KV] = field(default_factory=dict)  # by job id
    prune_pending: dict[str, KV] = field(default_factory=dict)
    # The indexes sorted by time ({p}/delayed/{due_ms}/{id}, {p}/deadlines/{ms}/{id}), by task.
    delayed: dict[str, list[KV]] = field(default_factory=lambda: defaultdict(list))
    deadlines: dict[str, list[KV]] = field(default_factory=lambda: defaultdict(list))
    findings: list[Finding] = field(default_factory=list)


# One branch per section of the keyspace: a flat dispatch, clearer as it is than as a table.
def parse(snap: Snapshot, keys: Keyspace) -> Parsed:  # noqa: C901, PLR0912
    """Sort every key of the keyspace into its section; undecodable task records are findings."""
    parsed = Parsed()
    root = keys.prefix + "/"
    for key, kv in sorted(snap.kvs.items()):
        if not key.startswith(root):
            continue
        section, _, rest = key[len(root) :].partition("/")
        parts = rest.split("/")
        if section == "tasks":
            task = decode_or_report(parsed, TaskRecord, kv, rest, state_version=kv.mod_revision)
            if task is not None:
                parsed.tasks[rest] = (kv, task)
        elif section == "ready":
            parsed.ready[parts[-1]].append(kv)
        elif section in ("claims", "claimed", "waiting", "deps", "blocked", "overdue", "inputs"):
            getattr(parsed, section)[rest] = kv
        elif section in ("attempts", "results", "events"):
            getattr(parsed, section)[parts[0]].append(kv)
        elif section == "dependents" and len(parts) == 2:
            parsed.dependents[parts[0]][parts[1]] = kv
        elif section == "index":
            parsed.identity[key] = kv
        elif section == "effects":
            parsed.effects[rest] = kv
        elif section in ("open-effects", "reconcile", "task-effects") and len(parts) == 2:
            index = {
                "open-effects": parsed.open_effects,
                "reconcile": parsed.reconcile,
                "task-effects": parsed.task_effects,
            }[section]
            index[(parts[0], parts[1])] = kv
        elif section == "tombstones":
            parsed.tombstones[rest] = kv
        elif section == "prune-pending":
            parsed.prune_pending[rest] = kv
        elif section == "prune-due" and len(parts) == 2:
            parsed.prune_due[parts[1]] = kv
        elif section in ("staging", "jobs") and len(parts) == 2:
            getattr(parsed, section)[parts[0]].append(kv)
        elif section in ("delayed", "deadlines") and len(parts) == 2:
            getattr(parsed, section)[parts[1]].append(kv)
        elif section == "jobs-by-worker" and len(parts) == 2:
            parsed.worker_jobs[parts[1]] = kv
    return parsed


def decode_or_report(parsed: Parsed, cls: type[T], kv: KV, task_id: str, **meta: int) -> T | None:
    """``kv`` decoded as ``cls``, or None with an UNDECODABLE finding added to ``parsed``."""
    try:
        return decode(cls, kv.value, **meta)
    except Exception as exc:
        parsed.findings.append(
            Finding(
                Problem.UNDECODABLE,
                task_id,
                f"{kv.key} does not decode as {cls.__name__}: {type(exc).__name__}: {exc}",
                (kv.key,),
            )
        )
        return None
