"""A task's dependency edges against its record: the edge key, each upstream and its reverse
edge, and the WAITING task's blocked mark and release (the releaser's work, so lagging)."""

from __future__ import annotations

from coordinator.doctor.findings import Finding, Guard, Problem, Repair, RepairWrite
from coordinator.doctor.parsed import Parsed
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import TaskRecord
from coordinator.domain.states import TaskState
from coordinator.domain.waiting import blocking
from coordinator.store.dependencies import edges_of
from coordinator.store.etcd import KV


def check_edges(
    parsed: Parsed, keys: Keyspace, task: TaskRecord, kv: KV, out: list[Finding]
) -> None:
    """The edge key against the record's depends_on, then each upstream (exists, has its
    reverse edge), then whether a WAITING task's blocked mark and release are overdue."""
    tid = task.task_id
    deps_kv = parsed.deps.get(tid)
    stored = edges_of(deps_kv.value) if deps_kv is not None else ()
    if stored != task.depends_on:
        out.append(
            Finding(
                Problem.EDGES_MISMATCH,
                tid,
                f"task {tid} lists depends_on {list(task.depends_on)} but its edge key holds "
                f"{list(stored)}",
                (kv.key, keys.deps(tid)),
            )
        )
        return  # which edge list is true is not guessed: no reverse-edge repair either
    _check_upstreams(parsed, keys, task, kv, out)
    _check_waiting(parsed, task, kv, out)


def _check_upstreams(
    parsed: Parsed, keys: Keyspace, task: TaskRecord, kv: KV, out: list[Finding]
) -> None:
    """Every upstream exists (or was pruned) and has the reverse edge the releaser follows."""
    tid = task.task_id
    for upstream in task.depends_on:
        if upstream not in parsed.tasks and upstream not in parsed.tombstones:
            out.append(
                Finding(
                    Problem.DEPENDENCY_DANGLING,
                    tid,
                    f"task {tid} depends on {upstream}, which does not exist",
                    (kv.key, keys.task(upstream)),
                )
            )
        reverse = keys.dependent(upstream, tid)
        if tid not in parsed.dependents.get(upstream, {}):
            out.append(
                Finding(
                    Problem.REVERSE_EDGE_MISSING,
                    tid,
                    f"edge {tid} -> {upstream} has no reverse edge: the releaser would not see "
                    f"{upstream} finish",
                    (kv.key, reverse),
                    Repair(
                        f"add reverse edge {reverse}",
                        (Guard(kv.key, kv.mod_revision), Guard(reverse, 0)),
                        (RepairWrite(reverse, b""),),
                    ),
                )
            )


def _check_waiting(parsed: Parsed, task: TaskRecord, kv: KV, out: list[Finding]) -> None:
    """A WAITING task's blocked mark follows its upstreams, and it is released once they are
    all DONE (both lagging: the releaser's job)."""
    tid = task.task_id
    upstreams = [parsed.tasks[u][1] for u in task.depends_on if u in parsed.tasks]
    blocked = blocking(upstreams)
    if task.state is TaskState.WAITING and blocked != task.blocked_by:
        out.append(
            Finding(
                Problem.BLOCKED_MARK_OVERDUE,
                tid,
                f"task {tid} is WAITING marked blocked by ({', '.join(task.blocked_by)}) but its "
                f"FAILED or CANCELLED upstreams are ({', '.join(blocked)}) and no releaser "
                "updated the mark (is any replica running?)",
                (kv.key,),
                state_version=kv.mod_revision,
            )
        )
    elif task.state is TaskState.WAITING and all(
        u in parsed.tasks and parsed.tasks[u][1].state is TaskState.DONE for u in task.depends_on
    ):
        out.append(
            Finding(
                Problem.RELEASE_OVERDUE,
                tid,
                f"task {tid} is WAITING but every upstream is DONE and no releaser moved it to "
                "READY (is any replica running?)",
                (kv.key,),
                state_version=kv.mod_revision,
            )
        )
