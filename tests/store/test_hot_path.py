"""The hot path's shortcuts keep every outcome: ClaimNext's in-flight marks, the background loops'
batched reads, and the reclaimer's deletions-only watch."""

from __future__ import annotations

import threading
from typing import Any

from coordinator.clock import ManualClock
from coordinator.domain.states import Outcome, TaskState
from coordinator.store import Store
from coordinator.store.attempts.reclaimer import Reclaimer
from coordinator.store.claims.claim import HERD_SPREAD
from coordinator.store.indexes.watch_loop import BATCH
from tests.helpers import eventually
from tests.store.support import StoreFactory, claim, commit, create


def _ready_keys(store: Store, queue: str, count: int) -> list[str]:
    return store.ready.first(queue, count)


def _lost_races(store: Store) -> float:
    labels = {"outcome": Outcome.ALREADY_CLAIMED.name}
    return store.ctx.metrics.registry.get_sample_value("coordinator_claims_total", labels) or 0.0


def test_take_hands_concurrent_claims_different_keys_and_untake_frees_them(store: Store) -> None:
    for n in range(3):
        create(store, f"t{n}", queue="q")
    taken = [store.ready.take("q", HERD_SPREAD) for _ in range(3)]
    keys = [key for key in taken if key is not None]
    assert len(keys) == 3
    assert sorted(keys) == sorted(_ready_keys(store, "q", 3))  # three different keys
    for key in taken:
        assert key is not None
        store.ready.untake(key)
    again = store.ready.take("q", 1)
    assert again == _ready_keys(store, "q", 1)[0]  # free again: the head is offered first


def test_take_never_leaves_the_highest_priority_even_when_all_of_it_is_taken(
    store: Store, clock: ManualClock
) -> None:
    create(store, "urgent", queue="q", priority=9)
    clock.advance(1)
    create(store, "bulk", queue="q", priority=0)
    first = store.ready.take("q", HERD_SPREAD)
    second = store.ready.take("q", HERD_SPREAD)
    # Both on the urgent key: a race the claim txn settles, never a skipped priority.
    assert first == second
    assert first is not None and first.endswith("/urgent")
    store.ready.untake(first)
    assert store.ready.take("q", HERD_SPREAD) == first  # still marked once: no negative count
    assert store.ready.take("nothing-here", HERD_SPREAD) is None


def test_concurrent_claim_next_on_one_replica_does_not_race_itself(store: Store) -> None:
    workers = 8
    for n in range(workers):
        create(store, f"t{n}", queue="q")
    barrier = threading.Barrier(workers)
    results: list[Any] = []

    def work(n: int) -> None:
        barrier.wait()
        results.append(store.claims.claim_next("q", principal=f"w{n}", epoch=1, ttl=30))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.verdict.outcome for r in results] == [Outcome.CLAIMED] * workers
    assert len({r.fence.task_id for r in results}) == workers
    assert _lost_races(store) == 0  # each took its own key: no lost race, no wasted lease


def test_the_reclaimer_watch_reclaims_a_batch_of_expiries_and_skips_commits(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    expiring = [f"x{n}" for n in range(5)]
    for task_id in [*expiring, "done"]:
        create(store, task_id)
    fences = {task_id: claim(store, task_id, ttl=1) for task_id in expiring}
    done = claim(store, "done", ttl=30)
    assert commit(store, done).verdict.outcome is Outcome.COMMITTED
    eventually(
        lambda: all(store.tasks.get(t).state is TaskState.READY for t in expiring),
        timeout=15,
        message="the reclaimer's watch did not return every expired task to READY",
    )
    for task_id, fence in fences.items():
        assert store.tasks.get(task_id).claim_generation == fence.claim_generation
    assert store.tasks.get("done").state is TaskState.DONE


def test_handle_many_reads_once_and_reclaims_only_expired_claims(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)
    for task_id in ("expired", "alive", "done"):
        create(store, task_id)
    claim(store, "expired", ttl=1)
    claim(store, "alive", ttl=30)
    assert commit(store, claim(store, "done", ttl=30)).verdict.outcome is Outcome.COMMITTED
    eventually(lambda: etcd_client.get(store.ctx.keys.claim("expired"))[0] is None, timeout=15)
    loop = Reclaimer(store.ctx, store.ready)  # not started: driven by hand
    reads: list[int] = []
    read = store.ctx.kv.read

    def counting(*ops: Any) -> Any:
        reads.append(len(ops))
        return read(*ops)

    store.ctx.kv.read = counting  # type: ignore[method-assign]
    try:
        loop.handle_many(["expired", "alive", "done", "missing"])
    finally:
        del store.ctx.kv.read
    assert reads[0] == 8  # task and claim key of all four, in one round trip
    states = {t: store.tasks.get(t).state for t in ("expired", "alive", "done")}
    assert states == {
        "expired": TaskState.READY,
        "alive": TaskState.CLAIMED,
        "done": TaskState.DONE,
    }


def test_the_loop_drains_queued_items_into_one_batch(store: Store) -> None:
    loop = Reclaimer(store.ctx, store.ready)  # not started: its queue is driven by hand
    for item in ["a", "b", "a", "", "c"]:
        loop._items.put(item)
    first = loop._items.get_nowait()
    items, controls = loop._drain(first)
    assert items == ["a", "b", "c"]  # distinct, in queue order
    assert controls == {""}  # the scan request is kept, not lost
    for n in range(BATCH + 5):
        loop._items.put(f"t{n}")
    items, _ = loop._drain(loop._items.get_nowait())
    assert len(items) == BATCH  # the rest waits for the next turn
    assert loop._items.qsize() == 5
