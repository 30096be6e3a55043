"""Every watch consumer handles several keys changing in one etcd revision.

Group commit nests the concurrent txns of a replica into one etcd txn, so under load one revision
holds many transitions. A consumer that dedups or resumes by revision alone would handle the
first key of such a revision and drop the rest. Each test makes one revision carry several
changes for another replica's watch (its periodic scan off, so only the watch can act)."""

from __future__ import annotations

import functools

from coordinator.domain.states import TaskState
from coordinator.store import EventFilter, Store, TaskSpec
from coordinator.store.etcd import delete
from tests.helpers import eventually
from tests.store.support import StoreFactory, claim, commit, create, in_one_revision

N = 6


def _states(store: Store, names: list[str]) -> list[TaskState]:
    return [store.tasks.get(name).state for name in names]


def _event_revisions(store: Store, names: list[str], op: str) -> set[int]:
    return {
        e.revision
        for name in names
        for e in store.events.history(EventFilter(task_id=name))
        if e.record.op.value == op
    }


def test_the_ready_index_learns_every_task_created_in_one_revision(
    make_store: StoreFactory,
) -> None:
    writer = make_store(reclaim=False)
    reader = make_store(reclaim=False)  # learns of ready keys only through its watch
    names = [f"t{i}" for i in range(N)]
    in_one_revision(writer, [functools.partial(create, writer, n, queue="q") for n in names])
    assert len(_event_revisions(writer, names, "create")) == 1
    eventually(lambda: reader.ready.size("q") == N, timeout=10)
    claimed = {reader.claims.claim_next("q", principal="w", epoch=1, ttl=30) for _ in names}
    assert {c.fence.task_id for c in claimed if c.fence} == set(names)


def test_the_reclaimer_reclaims_every_claim_that_ended_in_one_revision(
    make_store: StoreFactory,
) -> None:
    holder = make_store(reclaim=False)
    names = [f"t{i}" for i in range(N)]
    for name in names:
        create(holder, name)
        claim(holder, name, ttl=30)
    reclaimer = make_store()  # watch-driven reclaimer, scan off
    keys = holder.ctx.keys
    # The claim keys vanish together, as when one revoke or one batch ends several claims.
    holder.ctx.kv.txn([], [delete(keys.claim(n)) for n in names])
    eventually(lambda: _states(reclaimer, names) == [TaskState.READY] * N, timeout=10)


def test_the_releaser_releases_every_dependent_of_upstreams_done_in_one_revision(
    make_store: StoreFactory,
) -> None:
    committer = make_store(reclaim=False)
    ups = [f"up{i}" for i in range(N)]
    downs = [f"down{i}" for i in range(N)]
    fences = []
    for up, down in zip(ups, downs, strict=True):
        create(committer, up)
        committer.tasks.create(TaskSpec(task_id=down, depends_on=(up,)), by="pm")
        fences.append(claim(committer, up))
    releaser = make_store()  # watch-driven releaser, scan off
    # Each action is the commit txn alone (the input digest read beforehand).
    digests = {up: committer.tasks.get(up).input_digest for up in ups}
    actions = [
        functools.partial(commit, committer, f, input_digest=digests[f.task_id]) for f in fences
    ]
    in_one_revision(committer, actions)
    assert _states(committer, ups) == [TaskState.DONE] * N
    assert len(_event_revisions(committer, ups, "commit")) == 1
    eventually(lambda: _states(releaser, downs) == [TaskState.READY] * N, timeout=10)
