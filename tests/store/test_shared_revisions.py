"""Every watch consumer handles several keys changing in one etcd revision.

Group commit nests the concurrent txns of a replica into one etcd txn, so under load one revision
holds many transitions. A consumer that dedups or resumes by revision alone would handle the
first key of such a revision and drop the rest. Each test makes one revision carry several
changes for another replica's watch (its periodic scan off, so only the watch can act): through
a held group-commit round (``in_one_revision``), as one txn of index keys, or - for calls that
read before they write, like a cancel - from 16 threads at once, checked to share revisions."""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor

from coordinator.domain.states import Outcome, TaskState
from coordinator.store import ClaimResult, EventFilter, Store, TaskSpec
from coordinator.store.etcd.ops import delete, put
from tests.helpers import InProcessCaller, eventually
from tests.store.support import StoreFactory, claim, commit, create, in_one_revision

N = 6
WRITERS = 16


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


def test_the_releaser_marks_every_dependent_of_upstreams_cancelled_in_shared_revisions(
    make_store: StoreFactory,
) -> None:
    canceller = make_store(reclaim=False)
    ups = [f"up{i:02}" for i in range(4 * WRITERS)]
    downs = [f"down{i:02}" for i in range(4 * WRITERS)]
    for up, down in zip(ups, downs, strict=True):
        create(canceller, up)
        canceller.tasks.create(TaskSpec(task_id=down, depends_on=(up,)), by="pm")
    releaser = make_store()  # watch-driven releaser, scan off
    # A cancel reads, then writes: WRITERS threads at once, so group commit shares revisions.
    start = threading.Barrier(WRITERS)

    def cancel_all(chunk: list[str]) -> None:
        start.wait()
        for up in chunk:
            canceller.tasks.cancel(up, by="pm", reason="r")

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(cancel_all, [ups[i::WRITERS] for i in range(WRITERS)]))
    revisions = [r for up in ups for r in _event_revisions(canceller, [up], "cancel")]
    assert len(set(revisions)) < len(revisions), "no cancels shared a revision: proves nothing"
    # Blocked, each by its own upstream, and still WAITING: a cancel never cascades by itself.
    eventually(
        lambda: [releaser.tasks.get(d).blocked_by for d in downs] == [(u,) for u in ups],
        timeout=10,
    )
    assert _states(releaser, downs) == [TaskState.WAITING] * len(downs)


def test_the_claimed_index_and_queue_gauges_count_claims_made_and_ended_in_one_revision(
    make_store: StoreFactory,
) -> None:
    writer = make_store(reclaim=False)
    reader = make_store(reclaim=False)  # counts claims only through its watch
    keys = writer.ctx.keys
    names = [f"t{i}" for i in range(N)]
    # The claimed-index keys of N claims appear in one revision, as when group commit batches
    # N claim txns (the key's value is the task's queue: store/transition.py), then go in one.
    writer.ctx.kv.txn([], [put(keys.claimed(n), b"q") for n in names])

    def gauges() -> tuple[int, int] | None:
        stats = {s.queue: s for s in reader.queue_report().queues}
        return (stats["q"].ready, stats["q"].claimed) if "q" in stats else None

    eventually(lambda: reader.claimed.counts() == {"q": N}, timeout=10)
    assert gauges() == (0, N)
    writer.ctx.kv.txn([], [delete(keys.claimed(n)) for n in names[1:]])
    eventually(lambda: reader.claimed.counts() == {"q": 1}, timeout=10)
    assert gauges() == (0, 1)


def test_tasks_ready_in_one_revision_wake_as_many_long_poll_waiters(
    make_store: StoreFactory,
) -> None:
    writer = make_store(reclaim=False)
    reader = make_store(reclaim=False)  # learns of ready keys only through its watch
    names = [f"t{i}" for i in range(N)]
    heard: list[str | None] = []
    reader.ready.listen(heard.append)  # what wakes the waiters: one call per new ready key

    def wait_for_a_task() -> ClaimResult:
        return reader.long_poll.claim_next(
            "q", principal="w", epoch=1, ttl=30, wait=30.0, caller=InProcessCaller()
        )

    with ThreadPoolExecutor(N) as pool:
        waiting = [pool.submit(wait_for_a_task) for _ in names]
        eventually(lambda: reader.long_poll.waiting() == N, timeout=10)
        in_one_revision(writer, [functools.partial(create, writer, n, queue="q") for n in names])
        assert len(_event_revisions(writer, names, "create")) == 1
        won = [future.result(timeout=30) for future in waiting]
    assert [r.verdict.outcome for r in won] == [Outcome.CLAIMED] * N
    assert sorted(r.fence.task_id for r in won if r.fence) == names  # each task to one waiter
    assert heard == ["q"] * N
