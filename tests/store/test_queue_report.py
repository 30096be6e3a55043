"""The autoscaling figures per queue (ready, oldest ready age, claimed) on two replicas: each
follows the keyspace with its own watches, and both report what the task records say after
creates, claims, commits and a reclaim."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.records import TaskRecord, decode
from coordinator.domain.states import Outcome, TaskState
from coordinator.store import Store
from coordinator.store.transition import ready_time
from tests.helpers import eventually
from tests.store.support import StoreFactory, claim, commit, create, wait_claim_gone

Figures = dict[str, tuple[int, float, int]]
"""queue -> (ready tasks, oldest ready age, claimed tasks)."""


@pytest.fixture
def replicas(make_store: StoreFactory) -> tuple[Store, Store]:
    return make_store(), make_store()


def _truth(store: Store, etcd_client: Any) -> Figures:
    """The figures from the task records themselves (what the indexes must agree with)."""
    ready: dict[str, list[int]] = {}
    claimed: dict[str, int] = {}
    for value, _ in etcd_client.get_prefix(store.ctx.keys.tasks_prefix):
        task = decode(TaskRecord, value, state_version=0)
        if task.state is TaskState.READY:
            ready.setdefault(task.queue, []).append(task.ready_seq)
        elif task.state is TaskState.CLAIMED:
            claimed[task.queue] = claimed.get(task.queue, 0) + 1
    now = store.ctx.clock.now()
    return {
        q: (
            len(ready.get(q, [])),
            now - ready_time(min(ready[q])) if q in ready else 0.0,
            claimed.get(q, 0),
        )
        for q in ready.keys() | claimed.keys()
    }


def _reported(store: Store) -> Figures:
    report = store.queue_report()
    assert report.left_out == 0
    for stats in report.queues:  # the gauge is the ready index, not a second count
        assert stats.ready == store.ready.size(stats.queue)
    return {s.queue: (s.ready, s.oldest_ready_age, s.claimed) for s in report.queues}


def _agree(replicas: tuple[Store, Store], etcd_client: Any, expected: Figures) -> None:
    """Both replicas report ``expected``, which is what the task records say."""
    assert _truth(replicas[0], etcd_client) == expected

    def both() -> bool:
        for store in replicas:
            assert _reported(store) == expected
        return True

    eventually(both, message=f"replicas did not report {expected}")


def test_both_replicas_report_what_the_task_records_say(
    replicas: tuple[Store, Store], etcd_client: Any, clock: ManualClock
) -> None:
    first, second = replicas
    create(first, "a1", queue="a")
    create(first, "a2", queue="a")
    clock.advance(5)
    create(second, "a3", queue="a", priority=9)  # claimed first, but not the oldest
    create(second, "b1", queue="b")
    clock.advance(2)
    _agree(replicas, etcd_client, {"a": (3, 7.0, 0), "b": (1, 2.0, 0)})

    took = second.claims.claim_next("a", principal="w2", epoch=1, ttl=30)
    assert took.verdict.outcome is Outcome.CLAIMED and took.fence is not None
    assert took.fence.task_id == "a3"
    _agree(replicas, etcd_client, {"a": (2, 7.0, 1), "b": (1, 2.0, 0)})

    claim(first, "a1", ttl=1)  # left to expire
    _agree(replicas, etcd_client, {"a": (1, 7.0, 2), "b": (1, 2.0, 0)})

    assert commit(second, took.fence, principal="w2").verdict.outcome is Outcome.COMMITTED
    _agree(replicas, etcd_client, {"a": (1, 7.0, 1), "b": (1, 2.0, 0)})

    wait_claim_gone(first, etcd_client, "a1")  # etcd expired it; the reclaimers' watch reacts
    eventually(lambda: first.tasks.get("a1").state is TaskState.READY, message="not reclaimed")
    clock.advance(1)
    _agree(replicas, etcd_client, {"a": (2, 8.0, 0), "b": (1, 3.0, 0)})

    b1 = claim(second, "b1")
    assert commit(second, b1, principal="w1").verdict.outcome is Outcome.COMMITTED
    a2 = claim(first, "a2")
    clock.advance(4)
    # a2 (the oldest) is claimed: the age is now a1's, READY again since the reclaim 5 s ago.
    _agree(replicas, etcd_client, {"a": (1, 5.0, 1)})
    assert commit(first, a2).verdict.outcome is Outcome.COMMITTED
    _agree(replicas, etcd_client, {"a": (1, 5.0, 0)})


def test_a_replica_started_later_loads_the_same_figures(
    make_store: StoreFactory, etcd_client: Any, clock: ManualClock
) -> None:
    early = make_store()
    create(early, "x1", queue="x")
    create(early, "x2", queue="x")
    claim(early, "x1")
    clock.advance(3)
    late = make_store()  # loads both indexes from etcd instead of following from empty
    _agree((early, late), etcd_client, {"x": (1, 3.0, 1)})
