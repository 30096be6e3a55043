"""A claim whose caller is gone claims nothing, through a real server and etcd: an abandoned
long poll leaves the line when its call ends (not at its next look: ``_SLICE`` is set to an hour
here, so only gRPC's end-of-call callback can end it), and a claim whose answer can no longer be
delivered is given back at once, READY again with its attempt not counted (UNDELIVERED), with or
without an idempotency key."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from functools import partial
from typing import Any

import grpc
import pytest

from chaos.budget import budget_replay
from chaos.history import EtcdWrite
from coordinator.domain.idempotency import IDEMPOTENCY_METADATA_KEY
from coordinator.domain.states import AttemptEnd, Op, TaskState
from coordinator.domain.stream_limits import StreamLimits
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.server import PRINCIPAL_METADATA_KEY, build_server, identity
from coordinator.server.interceptors import stream_interceptor
from coordinator.server.services import worker_service
from coordinator.store import EtcdKV, EventFilter, Keyspace, Store, TaskSpec
from coordinator.store.claims import long_poll
from coordinator.store.types import ClaimResult
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import cancel, eventually
from tests.workqueue.test_metrics import sample

UNDELIVERED = "coordinator_claims_undelivered_total"
ABANDONED = "coordinator_claim_waiters_abandoned_total"
OPEN = "coordinator_streams_open"


@pytest.fixture(autouse=True)
def no_periodic_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiter's own periodic look (every ``_SLICE``) never comes within a test: whatever ends
    an abandoned poll here is the end-of-call callback."""
    monkeypatch.setattr(long_poll, "_SLICE", 3600.0)


def _who(name: str, key: str = "") -> tuple[tuple[str, str], ...]:
    extra = ((IDEMPOTENCY_METADATA_KEY, key),) if key else ()
    return ((PRINCIPAL_METADATA_KEY, name), *extra)


def _poll(wait: float) -> worker_pb2.ClaimNextRequest:
    return worker_pb2.ClaimNextRequest(scheduler_epoch=1, ttl_seconds=30, wait_seconds=wait)


def _attempts(store: Store, task_id: str) -> list[tuple[int, AttemptEnd]]:
    return [(a.attempt, a.end) for a in store.tasks.attempts(task_id)]


def _deadline_exceeded(call: Callable[[], Any]) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_poll_past_its_client_deadline_claims_nothing_and_a_live_waiter_gets_the_task(
    store: Store,
    worker: worker_pb2_grpc.WorkerServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    metrics: Metrics,
) -> None:
    # The case: wait_seconds 4 with a 1 s client deadline; the task comes after it.
    _deadline_exceeded(partial(worker.ClaimNext, _poll(4), metadata=_who("left"), timeout=1))
    eventually(lambda: store.long_poll.waiting() == 0, message="the abandoned poll still waits")
    assert sample(metrics, ABANDONED) == 1
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t"))
    task = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t")).task
    assert (task.state, task.attempts_counted) == (types_pb2.TASK_STATE_READY, 0)
    answer = worker.ClaimNext(_poll(4), metadata=_who("live"), timeout=30)
    assert (answer.outcome, answer.fence.task_id, answer.attempt) == (
        types_pb2.OUTCOME_CLAIMED,
        "t",
        1,
    )
    assert store.tasks.get("t").owner_id == "live"
    assert _attempts(store, "t") == [(1, AttemptEnd.RUNNING)]


def test_fifty_abandoned_polls_leave_their_places_at_once_and_a_live_caller_is_admitted(
    etcd: EtcdProcess, prefix: str, metrics: Metrics
) -> None:
    kv = EtcdKV.connect([etcd.endpoint], timeout=5.0)
    store = Store.open(kv, keys=Keyspace(prefix), max_claim_waiters=4, metrics=metrics)
    store.start()
    # Both bounds a waiting poll counts against are 4: the waiters' and the streams'.
    limits = StreamLimits(max_streams=4, max_per_principal=4)
    server, port = build_server(store, listen="127.0.0.1:0", max_workers=8, streams=limits)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            worker = worker_pb2_grpc.WorkerServiceStub(channel)
            for n in range(50):  # twelve times the cap: each place must be free again
                call = worker.ClaimNext.future(_poll(20), metadata=_who(f"w{n}"), timeout=30)
                eventually(lambda: store.long_poll.waiting() == 1, message=f"w{n} not waiting")
                cancel(call)
                eventually(lambda: store.long_poll.waiting() == 0, message=f"w{n} kept its place")
                eventually(lambda: sample(metrics, OPEN) == 0, message=f"w{n} kept its stream")
            assert sample(metrics, ABANDONED) == 50
            live = worker.ClaimNext.future(_poll(20), metadata=_who("live"), timeout=30)
            eventually(lambda: store.long_poll.waiting() == 1, message="live not admitted")
            store.tasks.create(TaskSpec(task_id="t"), by="pm")
            answer = live.result(timeout=25)
            assert (answer.outcome, answer.fence.task_id) == (types_pb2.OUTCOME_CLAIMED, "t")
            assert sample(metrics, UNDELIVERED, queue="default") == 0
    finally:
        server.stop(grace=None).wait()
        store.close()
        kv.close()


class _HeldClaim:
    """Wraps a store claim method: the claim txn lands, then the call is held until the test
    says go (after the caller's deadline passed), so its answer cannot be delivered."""

    def __init__(self, real: Callable[..., ClaimResult]) -> None:
        self._real = real
        self.go = threading.Event()
        self.claimed: list[ClaimResult] = []

    def __call__(self, *args: Any, **kwargs: Any) -> ClaimResult:
        result = self._real(*args, **kwargs)
        if result.fence is not None:
            self.claimed.append(result)
            self.go.wait(30)
        return result


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[grpc.ServicerContext]:
    """The server-side context of every worker call, recorded as its handler starts, so a test
    can wait for the server's own view of a call's deadline."""
    seen: list[grpc.ServicerContext] = []
    real = identity.principal_of

    def recorded(context: grpc.ServicerContext) -> str:
        seen.append(context)
        return real(context)

    monkeypatch.setattr(worker_service, "principal_of", recorded)
    return seen


def _gone_for_the_server(calls: list[grpc.ServicerContext]) -> None:
    """Wait until the server, too, sees the call's deadline passed (what ``CallerOf.alive``
    asks): the client's DEADLINE_EXCEEDED comes at its own deadline, the server's, sent as the
    time left, a moment later."""
    eventually(lambda: calls and calls[-1].time_remaining() <= 0, message="server deadline")


@pytest.fixture
def held(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[_HeldClaim]:
    """Claims by id and ClaimNext's claims, each held after its txn until ``go``."""
    held_next = _HeldClaim(store.claims.claim_next)
    monkeypatch.setattr(store.claims, "claim_next", held_next)
    yield held_next
    held_next.go.set()


@pytest.mark.parametrize("key", ["", "poll-1"], ids=["no-key", "idempotency-key"])
def test_a_claim_whose_answer_cannot_be_delivered_is_given_back_uncounted(
    store: Store,
    worker: worker_pb2_grpc.WorkerServiceStub,
    held: _HeldClaim,
    calls: list[grpc.ServicerContext],
    metrics: Metrics,
    key: str,
) -> None:
    store.tasks.create(TaskSpec(task_id="t"), by="pm")
    with futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(worker.ClaimNext, _poll(4), metadata=_who("left", key), timeout=1)
        eventually(lambda: held.claimed, message="the claim txn did not land")
        _deadline_exceeded(call.result)
        _gone_for_the_server(calls)
        held.go.set()  # the handler goes on with a claim its caller will never hear of
        given_back = eventually(
            lambda: store.tasks.get("t").state is TaskState.READY, message="not given back"
        )
    assert given_back
    task, undelivered = store.tasks.get("t"), held.claimed[0]
    assert undelivered.fence is not None
    assert (task.attempt - task.attempts_base, task.not_before, task.last_error) == (0, 0.0, "")
    assert _attempts(store, "t") == [(1, AttemptEnd.UNDELIVERED)]
    assert store.ctx.kv.get(store.ctx.keys.claim("t")) is None
    ops = [e.record.op for e in store.events.history(EventFilter(task_id="t"))]
    assert ops[-2:] == [Op.CLAIM, Op.GIVE_BACK]
    assert sample(metrics, UNDELIVERED, queue="default") == 1
    # The retry (the same idempotency key, when there was one) claims afresh: no stored answer
    # hands out the given-back attempt.
    held.claimed.clear()
    retry = worker.ClaimNext(_poll(4), metadata=_who("left", key), timeout=30)
    assert (retry.outcome, retry.attempt) == (types_pb2.OUTCOME_CLAIMED, 2)
    assert retry.fence.attempt_id != undelivered.fence.attempt_id
    assert store.tasks.get("t").attempt - store.tasks.get("t").attempts_base == 1
    assert _attempts(store, "t") == [(1, AttemptEnd.UNDELIVERED), (2, AttemptEnd.RUNNING)]


def test_a_claim_by_id_whose_caller_left_is_given_back_too(
    store: Store,
    worker: worker_pb2_grpc.WorkerServiceStub,
    monkeypatch: pytest.MonkeyPatch,
    calls: list[grpc.ServicerContext],
    metrics: Metrics,
) -> None:
    store.tasks.create(TaskSpec(task_id="t"), by="pm")
    claim = _HeldClaim(store.claims.claim)
    monkeypatch.setattr(store.claims, "claim", claim)
    request = worker_pb2.ClaimRequest(task_id="t", scheduler_epoch=1, ttl_seconds=30)
    with futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(worker.Claim, request, metadata=_who("left"), timeout=1)
        eventually(lambda: claim.claimed, message="the claim txn did not land")
        _deadline_exceeded(call.result)
        _gone_for_the_server(calls)
        claim.go.set()
        eventually(lambda: store.tasks.get("t").state is TaskState.READY, message="kept")
    assert _attempts(store, "t") == [(1, AttemptEnd.UNDELIVERED)]
    assert sample(metrics, UNDELIVERED, queue="default") == 1


@pytest.mark.parametrize("key", ["", "poll-2"], ids=["no-key", "idempotency-key"])
def test_an_answer_lost_after_the_last_look_is_given_back_once_the_call_ended(
    store: Store,
    worker: worker_pb2_grpc.WorkerServiceStub,
    held: _HeldClaim,
    monkeypatch: pytest.MonkeyPatch,
    metrics: Metrics,
    key: str,
) -> None:
    # The replica has not heard that its caller left (measured: a cancel heard 0.25 s late on
    # a loaded host), so it answers into a call gRPC then finds cancelled. Without a key the
    # claim is given back once the call ended; with one it stays for the retry to replay.
    # A ClaimNext that does not wait: no waiter whose end-of-call callback is heard first.
    monkeypatch.setattr(stream_interceptor.CallerOf, "alive", lambda self: True)
    store.tasks.create(TaskSpec(task_id="t"), by="pm")
    with futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(worker.ClaimNext, _poll(0), metadata=_who("left", key), timeout=1)
        eventually(lambda: held.claimed, message="the claim txn did not land")
        _deadline_exceeded(call.result)
        held.go.set()
    lost = held.claimed[0]
    assert lost.fence is not None
    if not key:
        eventually(lambda: store.tasks.get("t").state is TaskState.READY, message="kept")
        assert _attempts(store, "t") == [(1, AttemptEnd.UNDELIVERED)]
        assert sample(metrics, UNDELIVERED, queue="default") == 1
        return
    held.claimed.clear()
    retry = worker.ClaimNext(_poll(0), metadata=_who("left", key), timeout=30)
    assert (retry.outcome, retry.fence.attempt_id) == (
        types_pb2.OUTCOME_CLAIMED,
        lost.fence.attempt_id,
    )
    assert held.claimed == []  # replayed: no claim txn ran
    assert store.tasks.get("t").state is TaskState.CLAIMED
    assert sample(metrics, UNDELIVERED, queue="default") == 0


def test_a_delivered_claim_is_not_given_back_when_its_call_ends(
    store: Store, worker: worker_pb2_grpc.WorkerServiceStub, metrics: Metrics
) -> None:
    # gRPC's own account of the call (answer_lost reads it) says "closed", not "cancelled".
    store.tasks.create(TaskSpec(task_id="t"), by="pm")
    answer = worker.ClaimNext(_poll(4), metadata=_who("live"), timeout=30)
    assert answer.outcome == types_pb2.OUTCOME_CLAIMED
    # Another call through the same path after it, so the first one's end has been handled.
    store.tasks.create(TaskSpec(task_id="u"), by="pm")
    second = worker.ClaimNext(_poll(4), metadata=_who("live"), timeout=30)
    assert second.outcome == types_pb2.OUTCOME_CLAIMED
    store.give_backs.close()  # every give-back found after a call's end has run
    assert store.tasks.get("t").state is TaskState.CLAIMED
    assert sample(metrics, UNDELIVERED, queue="default") == 0


def test_undelivered_claims_count_past_the_allowance_so_a_vanishing_caller_cannot_cycle_a_task(
    store: Store, metrics: Metrics
) -> None:
    """A caller that leaves after every claim it makes (a deadline that always runs out just
    then, a crash between claim and answer) gets its claims given back uncounted only while the
    task has had fewer than 4 x max_attempts attempts in all; past that they count, so the
    task backs off and, its budget spent, is the dead letter, saying why."""
    store.tasks.create(TaskSpec(task_id="t", retry=(("max_attempts", 1),)), by="pm")
    for n in range(1, 5):
        granted = store.claims.claim("t", principal="left", epoch=1, ttl=30)
        assert granted.fence is not None and granted.attempt == n
        assert store.give_backs.give_back(granted, by="left")
    task = store.tasks.get("t")
    assert (task.state, task.dead_letter_reason.name) == (TaskState.FAILED, "EXHAUSTED")
    assert task.last_error == "the claim's answer could not be delivered"
    assert task.attempt - task.attempts_base == 1  # the 4th in all, the only one counted
    assert _attempts(store, "t") == [(n, AttemptEnd.UNDELIVERED) for n in range(1, 5)]
    events = [e.record for e in store.events.history(EventFilter(task_id="t"))]
    assert [(e.op, e.detail) for e in events if e.op in (Op.GIVE_BACK, Op.DEAD_LETTER)] == [
        *[(Op.GIVE_BACK, "the claim's answer could not be delivered; the attempt is not counted")]
        * 3,
        (
            Op.DEAD_LETTER,
            "all 1 attempts used; last error: the claim's answer could not be delivered "
            "(undelivered past the allowance: counted)",
        ),
    ]
    assert sample(metrics, UNDELIVERED, queue="default") == 4
    # The chaos checker's budget model reads this log as the server decided it: the three
    # give-backs uncounted, the fourth claim the one attempt of the budget.
    log = [
        EtcdWrite("t", n, e.op, e.to_state, attempt_id=e.attempt_id)
        for n, e in enumerate(events, start=1)
    ]
    assert budget_replay("t", log, budget=1) == []
    dead = sample(
        metrics, "coordinator_tasks_dead_lettered_total", queue="default", reason="exhausted"
    )
    assert dead == 1
    assert store.ctx.kv.get(store.ctx.keys.claim("t")) is None
