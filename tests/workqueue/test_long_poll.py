"""Long-poll ClaimNext through a real server: woken by the ready index, one winner per task,
waiters served in arrival order, a typed refusal past the waiter cap, bounded wait_seconds."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent import futures
from functools import partial
from typing import Any

import grpc
import pytest

from coordinator.domain.states import Outcome
from coordinator.etcd_process import EtcdProcess
from coordinator.server import PRINCIPAL_METADATA_KEY, build_server
from coordinator.store import EtcdKV, Keyspace, Store, TaskSpec
from coordinator.store.claims import long_poll
from coordinator.store.claims.long_poll import LongPoll, ReadyWaiters
from coordinator.store.types import ClaimResult
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import InProcessCaller, eventually
from tests.store.support import StoreFactory

Probe = Callable[[], tuple[int, int]]


def _who(name: str) -> tuple[tuple[str, str], ...]:
    return ((PRINCIPAL_METADATA_KEY, name),)


def _waiting(store: Store, count: int) -> bool:
    return store.long_poll.waiting() == count


def _poll(wait: float, **fields: Any) -> worker_pb2.ClaimNextRequest:
    return worker_pb2.ClaimNextRequest(
        scheduler_epoch=1, ttl_seconds=30, wait_seconds=wait, **fields
    )


@pytest.fixture
def pool() -> Iterator[futures.ThreadPoolExecutor]:
    """Threads for the calls that wait."""
    with futures.ThreadPoolExecutor(max_workers=8) as executor:
        yield executor


def test_a_long_poll_answers_as_soon_as_a_task_becomes_ready(
    store: Store,
    worker: worker_pb2_grpc.WorkerServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    pool: futures.ThreadPoolExecutor,
) -> None:
    waiting = pool.submit(worker.ClaimNext, _poll(20), metadata=_who("w1"), timeout=30)
    eventually(lambda: store.long_poll.waiting() == 1, message="the poll did not wait")
    created_at = time.monotonic()
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t"))
    answer = waiting.result(timeout=25)
    took = time.monotonic() - created_at
    assert (answer.outcome, answer.fence.task_id) == (types_pb2.OUTCOME_CLAIMED, "t")
    assert took < 1.0, f"answered {took:.2f} s after the task became ready"
    assert store.long_poll.waiting() == 0


def test_a_long_poll_with_nothing_to_hand_out_answers_no_ready_task_at_its_end(
    store: Store, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    started = time.monotonic()
    answer = worker.ClaimNext(_poll(0.6), metadata=_who("w1"), timeout=10)
    assert answer.outcome == types_pb2.OUTCOME_NO_READY_TASK
    assert "had no ready task for 0.6 s" in answer.message
    assert time.monotonic() - started >= 0.6
    assert store.long_poll.waiting() == 0


def test_n_waiters_and_one_task_make_one_winner_in_arrival_order(
    store: Store,
    worker: worker_pb2_grpc.WorkerServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    pool: futures.ThreadPoolExecutor,
) -> None:
    polls = []
    for n in range(5):  # each one waiting before the next arrives: their arrival order
        polls.append(pool.submit(worker.ClaimNext, _poll(3), metadata=_who(f"w{n}"), timeout=30))
        eventually(partial(_waiting, store, n + 1), message=f"w{n} not waiting")
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="only"))
    answers = [p.result(timeout=25) for p in polls]
    outcomes = [a.outcome for a in answers]
    assert outcomes.count(types_pb2.OUTCOME_CLAIMED) == 1
    assert outcomes.count(types_pb2.OUTCOME_NO_READY_TASK) == 4
    assert answers[0].outcome == types_pb2.OUTCOME_CLAIMED  # the first to arrive won
    assert store.tasks.get("only").owner_id == "w0"


def test_waiters_are_served_in_arrival_order(
    store: Store,
    worker: worker_pb2_grpc.WorkerServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    pool: futures.ThreadPoolExecutor,
) -> None:
    polls = []
    for n in range(3):
        # The longest wait the server allows: a loaded machine must not time a waiter out
        # before its task comes (that would read as served out of order).
        polls.append(pool.submit(worker.ClaimNext, _poll(20), metadata=_who(f"w{n}"), timeout=30))
        eventually(partial(_waiting, store, n + 1), message=f"w{n} not waiting")
    for n in range(3):
        tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id=f"t{n}"))
        answer = polls[n].result(timeout=25)  # the oldest waiter gets each new task
        assert (answer.outcome, answer.fence.task_id) == (types_pb2.OUTCOME_CLAIMED, f"t{n}")
        assert not any(p.done() for p in polls[n + 1 :])


@pytest.fixture
def capped(etcd: EtcdProcess, prefix: str) -> Iterator[tuple[Store, grpc.Channel]]:
    """A server whose replica lets two long polls wait at once."""
    kv = EtcdKV.connect([etcd.endpoint])
    store = Store.open(kv, keys=Keyspace(prefix), max_claim_waiters=2)
    store.start()
    server, port = build_server(store, listen="127.0.0.1:0", max_workers=8)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            yield store, channel
    finally:
        server.stop(grace=None).wait()
        store.close()
        kv.close()


def test_past_the_waiter_cap_a_long_poll_is_refused_typed(
    capped: tuple[Store, grpc.Channel], pool: futures.ThreadPoolExecutor
) -> None:
    store, channel = capped
    worker = worker_pb2_grpc.WorkerServiceStub(channel)
    held = [
        pool.submit(worker.ClaimNext, _poll(2), metadata=_who(f"w{n}"), timeout=30)
        for n in range(2)
    ]
    eventually(lambda: store.long_poll.waiting() == 2, message="the two polls did not wait")
    with pytest.raises(grpc.RpcError) as refused:
        worker.ClaimNext(_poll(2), metadata=_who("w9"), timeout=30)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "2 ClaimNext calls waiting, its limit (max_claim_waiters)" in (
        refused.value.details() or ""
    )
    # A ClaimNext that does not wait is not a waiter: it answers at once.
    now = worker.ClaimNext(_poll(0), metadata=_who("w9"), timeout=30)
    assert now.outcome == types_pb2.OUTCOME_NO_READY_TASK
    assert [h.result(timeout=25).outcome for h in held] == [types_pb2.OUTCOME_NO_READY_TASK] * 2


@pytest.mark.parametrize(
    ("wait", "message"),
    [
        (-1.0, "wait_seconds must be 0 to 20 (max_claim_wait), got -1"),
        (20.5, "wait_seconds must be 0 to 20 (max_claim_wait), got 20.5"),
        (float("nan"), "wait_seconds must be 0 to 20 (max_claim_wait), got nan"),
    ],
)
def test_a_bad_wait_is_refused_and_writes_nothing(
    worker: worker_pb2_grpc.WorkerServiceStub, keyspace: Probe, wait: float, message: str
) -> None:
    before = keyspace()
    with pytest.raises(grpc.RpcError) as refused:
        worker.ClaimNext(_poll(wait), metadata=_who("w1"), timeout=30)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in (refused.value.details() or "")
    assert keyspace() == before


def test_a_winner_hands_the_turn_on_so_a_backlog_is_not_left_waiting(
    store: Store, pool: futures.ThreadPoolExecutor
) -> None:
    # Two tasks ready before anyone waits: their keys signalled nobody. A line of its own, with
    # a waiter ahead that never tries, so only a hand-over (not a turn at the head) wakes B.
    for n in range(2):
        store.tasks.create(TaskSpec(task_id=f"t{n}"), by="pm")
    waiters = ReadyWaiters(4, store.ctx.metrics)
    poll = LongPoll(store.claims, waiters, store.give_backs)

    def claim(who: str) -> ClaimResult:
        epoch = store.admin.epoch()
        return poll.claim_next(
            "default", principal=who, epoch=epoch, ttl=30, wait=3.0, caller=InProcessCaller()
        )

    with waiters.enter("default", InProcessCaller()):
        first = pool.submit(claim, "a")
        eventually(lambda: waiters.count() == 2, message="a is not waiting")
        second = pool.submit(claim, "b")
        eventually(lambda: waiters.count() == 3, message="b is not waiting")
        waiters.notify("default")  # the waiter ahead, which never tries
        waiters.notify("default")  # a: it wins one task and hands the turn on to b
        got = [f.result(timeout=10) for f in (first, second)]
    assert [r.verdict.outcome for r in got] == [Outcome.CLAIMED, Outcome.CLAIMED]
    assert sorted(r.fence.task_id for r in got if r.fence) == ["t0", "t1"]


@pytest.fixture
def replicas(make_store: StoreFactory) -> Iterator[list[tuple[Store, grpc.Channel]]]:
    """Two replicas on this test's prefix: each a store and a server, with a channel to it."""
    made: list[tuple[Store, grpc.Channel]] = []
    servers: list[grpc.Server] = []
    try:
        for _ in range(2):
            store = make_store()
            server, port = build_server(store, listen="127.0.0.1:0", max_workers=8)
            servers.append(server)
            made.append((store, grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS)))
        yield made
    finally:
        for _, channel in made:
            channel.close()
        for server in servers:
            server.stop(grace=None).wait()


def test_a_waiter_on_one_replica_is_woken_by_a_task_made_ready_through_another(
    replicas: list[tuple[Store, grpc.Channel]],
    pool: futures.ThreadPoolExecutor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No try of its own while it waits: only a wake-up from replica A's ready index (fed by
    # its etcd watch) can end the poll with a task before its 20 s are over (then it tries once
    # more); the answer is awaited for half of that, a bound on liveness, not a latency.
    monkeypatch.setattr(long_poll, "_SLICE", 3600.0)
    (a, channel_a), (b, channel_b) = replicas
    waiting = pool.submit(
        worker_pb2_grpc.WorkerServiceStub(channel_a).ClaimNext,
        _poll(20),
        metadata=_who("w1"),
        timeout=30,
    )
    eventually(partial(_waiting, a, 1), message="the poll did not wait on replica A")
    assert b.long_poll.waiting() == 0
    tasks_b = tasks_pb2_grpc.TaskServiceStub(channel_b)
    tasks_b.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t"), metadata=_who("pm"))
    answer = waiting.result(timeout=10)
    assert (answer.outcome, answer.fence.task_id) == (types_pb2.OUTCOME_CLAIMED, "t")
    assert a.tasks.get("t").owner_id == "w1"


def test_a_waiter_whose_caller_leaves_passes_its_wake_up_on_and_frees_its_place(
    store: Store,
) -> None:
    # No etcd involved: the line alone. A ready key woke the head; its caller leaves before it
    # looked, so the wake-up goes to the next waiter, and the place is free at once.
    waiters = ReadyWaiters(2, store.ctx.metrics)
    first, second = InProcessCaller(), InProcessCaller()
    with waiters.enter("q", first) as head, waiters.enter("q", second) as behind:
        waiters.notify("q")
        first.leave()
        assert (head.gone, waiters.count()) == (True, 1)
        assert waiters.wait(behind, 0) is True
        with waiters.enter("q", InProcessCaller()):  # the freed place, under a cap of 2
            assert waiters.count() == 2
        assert waiters.hand(behind, second.alive) is True  # served: out of the line
        assert waiters.count() == 0
        second.leave()  # its call ends after it was served: nothing to undo
    assert waiters.count() == 0


def test_only_the_head_looks_on_its_own_and_the_next_is_woken_when_it_leaves(
    store: Store,
) -> None:
    # No etcd involved: the line alone. Waiters behind the head sleep until something wakes
    # them (1,000 of them looking every slice were 500 wake-ups a second for nothing); when the
    # head leaves - served, gone, or at its deadline - the new head is woken to look.
    waiters = ReadyWaiters(3, store.ctx.metrics)
    callers = [InProcessCaller() for _ in range(3)]
    with (
        waiters.enter("q", callers[0]) as head,
        waiters.enter("q", callers[1]) as second,
        waiters.enter("q", callers[2]) as third,
    ):
        assert waiters.wait(second, 0) is False  # nothing woke it
        assert waiters.hand(head, callers[0].alive) is True  # the head is served
        assert waiters.first_in_line("q", second)
        assert waiters.wait(second, 0) is True  # woken: its turn to look
        assert waiters.wait(third, 0) is False  # still behind
        callers[1].leave()  # the new head's call ends
        assert waiters.wait(third, 0) is True
        assert waiters.first_in_line("q", third)
