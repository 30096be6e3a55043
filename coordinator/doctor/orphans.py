"""Keys that name a task or an edge that does not exist (derived ones are repaired by
deleting them)."""

from __future__ import annotations

from coordinator.doctor.findings import Finding, Guard, Problem, Repair, RepairWrite
from coordinator.doctor.parsed import Parsed
from coordinator.domain.keys import Keyspace
from coordinator.domain.lineage import identity_keys
from coordinator.store.etcd.ops import KV
from coordinator.store.lifecycle.dependencies import edges_of


def check_orphans(parsed: Parsed, keys: Keyspace) -> list[Finding]:
    """Keys that name a task or an edge that does not exist (derived ones are deleted)."""
    return [
        *_index_orphans(parsed, keys),
        *_record_orphans(parsed),
        *_input_findings(parsed),
        *_edge_orphans(parsed, keys),
        *_identity_orphans(parsed, keys),
    ]


def _index_orphans(parsed: Parsed, keys: Keyspace) -> list[Finding]:
    """Ready, claimed and waiting index keys of a task that does not exist."""
    out: list[Finding] = []
    tasks = parsed.tasks
    for tid, ready in parsed.ready.items():
        if tid not in tasks:
            for r in ready:
                out.append(_orphan(Problem.READY_KEY_ORPHAN, tid, r, keys.task(tid), "ready key"))
    for section, problem in (
        ("claimed", Problem.CLAIMED_INDEX_ORPHAN),
        ("waiting", Problem.WAITING_INDEX_ORPHAN),
    ):
        for tid, index_kv in getattr(parsed, section).items():
            if tid not in tasks:
                out.append(_orphan(problem, tid, index_kv, keys.task(tid), f"{section} key"))
    return out


def _record_orphans(parsed: Parsed) -> list[Finding]:
    """Live claims and attempt, result and event records of a task that does not exist (and,
    for the records, left no tombstone: those are retention.py's)."""
    out: list[Finding] = []
    tasks = parsed.tasks
    for tid, claim_kv in parsed.claims.items():
        if tid not in tasks:
            out.append(
                Finding(
                    Problem.TASK_IN_TWO_PLACES,
                    tid,
                    f"a live claim key holds {tid}, which has no task record",
                    (claim_kv.key,),
                )
            )
    for section in ("attempts", "results", "events"):
        for tid, kvs in getattr(parsed, section).items():
            if tid not in tasks and tid not in parsed.tombstones:
                out.append(
                    Finding(
                        Problem.ORPHAN_RECORDS,
                        tid,
                        f"{len(kvs)} {section} record(s) of {tid}, which has no task record",
                        tuple(k.key for k in kvs),
                    )
                )
    return out


def _input_findings(parsed: Parsed) -> list[Finding]:
    """Input keys (schema 2) against their task records: a record that keeps its input in a
    key that is gone has lost it; a key no record keeps its input in is left over. Reported
    only: neither can be rebuilt (UpdateInput gives a task a new input)."""
    out: list[Finding] = []
    for tid, (kv, task) in parsed.tasks.items():
        if task.input_in_key and tid not in parsed.inputs:
            message = (
                f"task {tid} keeps its input in a key of its own, which is gone: its claims are "
                "refused until a new input (the SDK's client.update_input) or `coordinator "
                "tasks cancel` moves it on"
            )
            out.append(Finding(Problem.INPUT_MISSING, tid, message, (kv.key,)))
    for tid, kv in parsed.inputs.items():
        record = parsed.tasks.get(tid)
        if record is None or not record[1].input_in_key:
            whose = "which has no task record" if record is None else "whose record holds its own"
            message = f"an input key of {tid}, {whose}"
            out.append(Finding(Problem.ORPHAN_RECORDS, tid, message, (kv.key,)))
    return out


def _edge_orphans(parsed: Parsed, keys: Keyspace) -> list[Finding]:
    """Reverse edges without their forward edge."""
    out: list[Finding] = []
    for upstream, dependents in parsed.dependents.items():
        for dependent, edge_kv in dependents.items():
            guards = _reverse_edge_guards(parsed, keys, upstream, dependent, edge_kv)
            if guards is None:
                continue
            out.append(
                Finding(
                    Problem.REVERSE_EDGE_ORPHAN,
                    dependent,
                    f"reverse edge {dependent} -> {upstream} has no forward edge",
                    (edge_kv.key,),
                    Repair(
                        f"delete reverse edge {edge_kv.key}",
                        guards,
                        (RepairWrite(edge_kv.key, None),),
                    ),
                )
            )
    return out


def _reverse_edge_guards(
    parsed: Parsed, keys: Keyspace, upstream: str, dependent: str, edge_kv: KV
) -> tuple[Guard, ...] | None:
    """The guards of deleting an orphan reverse edge; None when the edge is no orphan (or the
    mismatch is reported as EDGES_MISMATCH already: not guessed)."""
    if dependent not in parsed.tasks:
        return (Guard(keys.task(dependent), 0), Guard(edge_kv.key, edge_kv.mod_revision))
    dep_kv, dep = parsed.tasks[dependent]
    if upstream in dep.depends_on:
        return None
    stored = parsed.deps.get(dependent)
    if stored is not None and upstream in edges_of(stored.value):
        return None
    return (
        Guard(dep_kv.key, dep_kv.mod_revision),
        Guard(keys.deps(dependent), stored.mod_revision if stored else 0),
        Guard(edge_kv.key, edge_kv.mod_revision),
    )


def _identity_orphans(parsed: Parsed, keys: Keyspace) -> list[Finding]:
    """Lineage index keys that match no task's identity."""
    out: list[Finding] = []
    tasks = parsed.tasks
    expected = {k for _, t in tasks.values() for k in identity_keys(keys, t)}
    for key, index_kv in parsed.identity.items():
        if key not in expected:
            tid = key.rsplit("/", 1)[1]
            guard = tasks[tid][0] if tid in tasks else None
            out.append(
                Finding(
                    Problem.IDENTITY_INDEX_ORPHAN,
                    tid,
                    f"lineage index key {key} does not match task {tid}",
                    (key,),
                    Repair(
                        f"delete identity index key {key}",
                        (
                            Guard(keys.task(tid), guard.mod_revision if guard else 0),
                            Guard(key, index_kv.mod_revision),
                        ),
                        (RepairWrite(key, None),),
                    ),
                )
            )
    return out


def _orphan(problem: Problem, tid: str, kv: KV, task_key: str, what: str) -> Finding:
    return Finding(
        problem,
        tid,
        f"{what} {kv.key} names task {tid}, which does not exist",
        (kv.key,),
        Repair(
            f"delete {what} {kv.key}",
            (Guard(task_key, 0), Guard(kv.key, kv.mod_revision)),
            (RepairWrite(kv.key, None),),
        ),
    )
