"""Dependencies: WAITING is "not ready", never "failed"; only DONE of the current round releases;
cycles are refused atomically; the releaser is fast and safe on every replica."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import replace
from functools import partial
from typing import Any

import grpc
import pytest

from coordinator.domain.states import Op, Outcome, TaskState
from coordinator.errors import FailedPrecondition, NotFound, ResourceExhausted
from coordinator.server import build_server
from coordinator.store import Store
from coordinator.store.lifecycle import dependencies
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc
from tests.helpers import eventually
from tests.lifecycle.conftest import StoreFactory
from tests.lifecycle.support import claim, create, events, finish, snapshot


def _state(store: Store, task_id: str) -> TaskState:
    return store.tasks.get(task_id).state


def _is_ready(store: Store, task_id: str) -> bool:
    return _state(store, task_id) is TaskState.READY


def test_dependents_never_start_before_their_precondition(store: Store, etcd_client: Any) -> None:
    create(store, "dev", review=True)
    waiting = create(store, "qa", depends_on=("dev",), queue="qa")
    assert waiting.state is TaskState.WAITING
    assert etcd_client.get(store.ctx.keys.waiting("qa"))[1] is not None
    assert list(etcd_client.get_prefix(store.ctx.keys.ready_prefix("qa"))) == []
    refused = store.claims.claim("qa", principal="w2", epoch=1, ttl=30).verdict.outcome
    assert refused is Outcome.NOT_CLAIMABLE
    assert store.claims.claim_next("qa", principal="w2", epoch=1, ttl=30).verdict.outcome is (
        Outcome.NO_READY_TASK
    )
    finish(store, "dev", "w1")  # a report: REVIEW, not DONE
    assert store.releaser.scan() == 0
    assert _state(store, "qa") is TaskState.WAITING
    store.review.accept("dev", revision=1, reviewer="pm")
    eventually(lambda: _state(store, "qa") is TaskState.READY, timeout=5)
    assert store.claims.claim("qa", principal="w2", epoch=1, ttl=30).verdict.outcome is (
        Outcome.CLAIMED
    )
    # Waiting was never a failure: no attempt ran while it waited.
    assert [e.op for e in events(store, etcd_client, "qa")] == [
        Op.CREATE_WAITING,
        Op.UNBLOCK,
        Op.CLAIM,
    ]


def test_a_dependent_is_ready_within_a_second_of_its_last_upstream_becoming_done(
    store: Store,
) -> None:
    latencies = []
    for n in range(10):
        create(store, f"a{n}")
        create(store, f"b{n}")
        create(store, f"c{n}", depends_on=(f"a{n}", f"b{n}"))
        finish(store, f"a{n}")
        assert store.releaser.release(f"c{n}") is False  # b is not DONE yet
        assert _state(store, f"c{n}") is TaskState.WAITING
        finish(store, f"b{n}")
        done = time.monotonic()
        eventually(partial(_is_ready, store, f"c{n}"), 2, 0.005)
        latencies.append(time.monotonic() - done)
    print(
        f"release latency: median {statistics.median(latencies) * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms over {len(latencies)}"
    )
    assert max(latencies) < 1.0


def test_a_dependent_is_released_only_by_the_current_round_of_its_upstream(
    store: Store, etcd_client: Any
) -> None:
    create(store, "dev", review=True)
    create(store, "qa", depends_on=("dev",))
    finish(store, "dev", "w1")
    store.review.reject("dev", revision=1, reviewer="pm", reason="CSV export breaks on UTF-8")
    finish(store, "dev", "w1")  # round 2 reported, not accepted
    assert store.releaser.scan() == 0
    assert _state(store, "qa") is TaskState.WAITING
    store.review.accept("dev", revision=2, reviewer="pm")
    eventually(lambda: _state(store, "qa") is TaskState.READY, timeout=5)
    qa = store.tasks.get("qa")
    assert qa.satisfied_by == ("dev@2",)
    assert events(store, etcd_client, "qa")[-1].detail == "released by dev@2"


def test_a_release_computed_from_an_old_round_is_aborted(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    create(store, "dev", review=True)
    create(store, "qa", depends_on=("dev",))
    finish(store, "dev")
    # What a slow releaser saw: round 1 as if it were DONE. The round moved on since.
    stale = replace(store.tasks.get("dev"), state=TaskState.DONE)
    store.review.reject("dev", revision=1, reviewer="pm", reason="redo")
    monkeypatch.setattr(store.releaser._deps, "upstreams", lambda ids: [stale])
    assert store.releaser.release("qa") is False
    assert _state(store, "qa") is TaskState.WAITING


def test_a_cycle_is_refused_with_an_error_naming_it(store: Store, etcd_client: Any) -> None:
    create(store, "a")
    create(store, "b", depends_on=("a",))
    create(store, "c", depends_on=("b",))
    before = snapshot(store, etcd_client)
    with pytest.raises(FailedPrecondition) as refused:
        store.dependencies.set_dependencies("a", ("c",), expected_state_version=0, by="pm")
    assert str(refused.value) == "dependency cycle refused: a -> c -> b -> a"
    assert snapshot(store, etcd_client) == before


def _race(one: Store, two: Store, first: tuple[str, str], second: tuple[str, str]) -> list[str]:
    """Two replicas add one edge each at the same moment; what each one answered."""
    barrier = threading.Barrier(2)
    outcomes = ["", ""]

    def link(index: int, store: Store, task: str, upstream: str) -> None:
        barrier.wait()
        try:
            store.dependencies.set_dependencies(
                task, (upstream,), expected_state_version=0, by="pm"
            )
            outcomes[index] = "linked"
        except FailedPrecondition as exc:
            outcomes[index] = str(exc)

    threads = [
        threading.Thread(target=link, args=(0, one, *first)),
        threading.Thread(target=link, args=(1, two, *second)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@pytest.mark.parametrize("budget", [60, 0], ids=["compare-each-node", "compare-the-edge-range"])
def test_concurrent_edge_changes_never_close_a_cycle(
    budget: int, make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Past its budget of per-node compares the check compares the whole edge range instead.
    monkeypatch.setattr("coordinator.store.lifecycle.dependencies._PER_NODE_COMPARES", budget)
    one, two = make_store(), make_store()  # two replicas
    for task in ("x", "z"):
        create(one, task)
    create(one, "q", depends_on=("z",))
    create(one, "p", depends_on=("x",))
    # x -> q and z -> p are each harmless alone; together they close x -> q -> z -> p -> x.
    # Neither writer touches the other's upstream record: only the compares on the edges the
    # cycle check read can tell them apart.
    for _ in range(15):
        outcomes = _race(one, two, ("x", "q"), ("z", "p"))
        assert sorted(outcomes)[1] == "linked", outcomes
        assert sorted(outcomes)[0] in (
            "dependency cycle refused: x -> q -> z -> p -> x",
            "dependency cycle refused: z -> p -> x -> q -> z",
        ), outcomes
        assert sorted(one.tasks.get(t).depends_on for t in ("x", "z")) in (
            [(), ("p",)],
            [(), ("q",)],
        )
        for task in ("x", "z"):
            one.dependencies.set_dependencies(task, (), expected_state_version=0, by="pm")


def test_unknown_dependency_ids_are_refused_not_found(store: Store, etcd_client: Any) -> None:
    create(store, "a")
    before = snapshot(store, etcd_client)
    with pytest.raises(NotFound, match="do not exist: ghost, phantom"):
        create(store, "b", depends_on=("a", "ghost", "phantom"))
    with pytest.raises(NotFound, match="do not exist: ghost"):
        store.dependencies.set_dependencies("a", ("ghost",), expected_state_version=0, by="pm")
    assert snapshot(store, etcd_client) == before


def test_an_upstream_that_can_never_be_done_is_refused(store: Store) -> None:
    create(store, "a")
    store.tasks.cancel("a", by="pm", reason="dropped")
    with pytest.raises(FailedPrecondition, match=r"not going to be DONE: a \(CANCELLED\)"):
        create(store, "b", depends_on=("a",))


def test_set_dependencies_keeps_an_edge_to_a_cancelled_upstream_and_refuses_a_new_one(
    store: Store,
) -> None:
    create(store, "a")
    create(store, "b")
    create(store, "c")
    down = create(store, "down", depends_on=("a", "b"))
    store.tasks.cancel("a", by="pm", reason="dropped")
    store.tasks.cancel("c", by="pm", reason="dropped")
    eventually(lambda: store.tasks.get("down").blocked_by == ("a",), timeout=5)
    with pytest.raises(FailedPrecondition, match=r"not going to be DONE: c \(CANCELLED\)"):
        store.dependencies.set_dependencies("down", ("a", "c"), expected_state_version=0, by="pm")
    # Dropping "b" keeps the edge to "a": still WAITING, still blocked by it.
    kept = store.dependencies.set_dependencies("down", ("a",), expected_state_version=0, by="pm")
    assert (kept.state, kept.blocked_by) == (TaskState.WAITING, ("a",))
    # Dropping "a" too: nothing blocks it, and with no upstream left it is READY.
    freed = store.dependencies.set_dependencies("down", (), expected_state_version=0, by="pm")
    assert (freed.state, freed.blocked_by, down.state) == (TaskState.READY, (), TaskState.WAITING)


def test_releasing_is_safe_on_every_replica_at_once(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    replicas = [make_store() for _ in range(3)]
    store = replicas[0]
    create(store, "up")
    for n in range(20):
        create(store, f"d{n}", depends_on=("up",))
    finish(store, "up")
    for n in range(20):
        eventually(partial(_is_ready, store, f"d{n}"), timeout=5)
    for replica in replicas:  # and every replica's scan finds nothing left to do
        assert replica.releaser.scan() == 0
    for n in range(20):
        ops = [e.op for e in events(store, etcd_client, f"d{n}")]
        assert ops == [Op.CREATE_WAITING, Op.UNBLOCK]


def test_the_periodic_scan_releases_what_no_watch_saw(store: Store) -> None:
    store.releaser.close()  # no watch: as if every replica was down when "up" finished
    create(store, "up")
    create(store, "down", depends_on=("up",))
    finish(store, "up")
    assert _state(store, "down") is TaskState.WAITING
    assert store.releaser.scan() == 1
    assert _state(store, "down") is TaskState.READY


def test_set_dependencies_moves_a_task_between_ready_and_waiting(
    store: Store, etcd_client: Any
) -> None:
    create(store, "up")
    task = create(store, "t")
    blocked = store.dependencies.set_dependencies(
        "t", ("up",), expected_state_version=task.state_version, by="pm"
    )
    assert blocked.state is TaskState.WAITING
    # Only "up" is ready now (the watch-fed index may still be applying the earlier put).
    eventually(lambda: store.ready.size("default") == 1, timeout=5)
    with pytest.raises(FailedPrecondition, match="expected"):
        store.dependencies.set_dependencies(
            "t", (), expected_state_version=task.state_version, by="pm"
        )
    freed = store.dependencies.set_dependencies("t", (), expected_state_version=0, by="pm")
    assert (freed.state, freed.depends_on) == (TaskState.READY, ())
    assert [e.op for e in events(store, etcd_client, "t")] == [Op.CREATE, Op.BLOCK, Op.UNBLOCK]
    assert list(etcd_client.get_prefix(store.ctx.keys.dependents_prefix("up"))) == []


def test_executor_cannot_change_the_graph_of_the_task_it_holds(
    store: Store, etcd_client: Any
) -> None:
    create(store, "up")
    create(store, "t")
    claim(store, "t", "w1")
    before = snapshot(store, etcd_client)
    for caller in ("w1", "pm"):
        with pytest.raises(FailedPrecondition, match="CLAIMED; its dependencies can change only"):
            store.dependencies.set_dependencies("t", ("up",), expected_state_version=0, by=caller)
    assert snapshot(store, etcd_client) == before


def test_a_dependent_created_as_its_upstream_finishes_is_not_left_waiting(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.releaser.close()  # only the create txn itself can get this right
    create(store, "up")
    stale = store.tasks.get("up")  # READY, as a slow create read it ...
    finish(store, "up")  # ... just before it became DONE
    real = store.tasks._deps.upstreams
    reads = iter([[stale]])
    monkeypatch.setattr(store.tasks._deps, "upstreams", lambda ids: next(reads, None) or real(ids))
    # The create txn compares the upstream as read: it fails, reads again, and sees DONE.
    assert create(store, "down", depends_on=("up",)).state is TaskState.READY
    assert store.tasks.get("down").satisfied_by == ("up@1",)


def test_a_long_cycle_is_named_by_its_ends_and_a_large_graph_is_still_checked(
    store: Store, etcd_client: Any
) -> None:
    create(store, "n0")
    for n in range(1, 120):  # n119 -> n118 -> ... -> n0: past the per-node compare budget
        create(store, f"n{n}", depends_on=(f"n{n - 1}",))
    started = time.monotonic()
    with pytest.raises(FailedPrecondition) as refused:
        store.dependencies.set_dependencies("n0", ("n119",), expected_state_version=0, by="pm")
    took = time.monotonic() - started
    path = "n0 -> n119 -> n118 -> ... -> n2 -> n1 -> n0 (a cycle of 120 tasks)"
    assert str(refused.value) == f"dependency cycle refused: {path}"
    print(f"cycle check over 120 nodes: {took * 1000:.1f} ms")
    # An acyclic edge into the same graph lands (guarded by the whole edge range).
    create(store, "side")
    linked = store.dependencies.set_dependencies(
        "side", ("n119",), expected_state_version=0, by="pm"
    )
    assert (linked.state, linked.depends_on) == (TaskState.WAITING, ("n119",))


def test_a_cycle_through_a_long_chain_is_refused_briefly_over_grpc(store: Store) -> None:
    # 600 tasks: past the level-by-level walk (the whole deps range is read instead), and a
    # cycle whose full name (~5 KB) gRPC refused to carry before, answering RESOURCE_EXHAUSTED.
    create(store, "c0")
    for n in range(1, 600):
        create(store, f"c{n}", depends_on=(f"c{n - 1}",))
    server, port = build_server(store, listen="127.0.0.1:0", max_workers=4)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = tasks_pb2_grpc.TaskServiceStub(channel)
            request = tasks_pb2.SetDependenciesRequest(task_id="c0", depends_on=["c599"])
            with pytest.raises(grpc.RpcError) as refused:
                stub.SetDependencies(request, metadata=(("x-coordinator-principal", "pm"),))
    finally:
        server.stop(grace=None).wait()
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == (
        "dependency cycle refused: c0 -> c599 -> c598 -> ... -> c2 -> c1 -> c0 "
        "(a cycle of 600 tasks)"
    )
    assert store.tasks.get("c0").depends_on == ()


def test_one_whole_graph_cycle_check_at_a_time_the_next_told_to_retry(store: Store) -> None:
    """64 SetDependencies over a deep graph at once each read the whole deps range: 116 MB more
    of the replica's memory and every other caller's reads slowed. One at a time per replica;
    another meanwhile is RESOURCE_EXHAUSTED, which the SDK retries."""
    create(store, "d0")
    for n in range(1, 80):  # past the level-by-level walk: the whole range is read
        create(store, f"d{n}", depends_on=(f"d{n - 1}",))
    create(store, "side")
    # Another check of the whole graph runs:
    with dependencies._WHOLE_GRAPH_READ, pytest.raises(ResourceExhausted) as busy:
        store.dependencies.set_dependencies("side", ("d79",), expected_state_version=0, by="pm")
    assert str(busy.value) == (
        "the dependency graph is deep and another check of the whole graph for cycles runs on "
        "this replica; retry shortly"
    )
    assert store.tasks.get("side").depends_on == ()  # nothing written
    linked = store.dependencies.set_dependencies(
        "side", ("d79",), expected_state_version=0, by="pm"
    )
    assert linked.depends_on == ("d79",)
