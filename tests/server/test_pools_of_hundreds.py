"""One replica holds a pool of hundreds of long polls and follow streams (issue 25, item 5).

A real server over a real etcd, through real channels; callers name themselves (insecure
mode), so one test is 200 agents with tokens of their own and a pool of 800 sharing one. The
calls are opened as futures (grpc's own threads carry them), never one client thread each.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, MutableMapping
from typing import Any

import grpc
import grpc._common as grpc_common
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from coordinator.domain.stream_limits import StreamLimits
from coordinator.server import build_server
from coordinator.server.grpc_waits import lengthen_wait_slices
from coordinator.server.refusal_log import RefusalLog
from coordinator.store import Store
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.conftest import GRPC_OPTIONS
from tests.helpers import cancel, eventually, next_of
from tests.lifecycle.support import create, who

QUEUE = "pool"
AGENTS = 200
SHARED = 800
WAIT = 10.0
"""Seconds each poll waits: long enough for all of them to be admitted before any ends."""
CHANNELS = 8


class Replica:
    """A server for ``store`` and channels to it."""

    def __init__(self, store: Store, **options: Any) -> None:
        self.store = store
        self.server, port = build_server(
            store, listen="127.0.0.1:0", max_workers=16, health_interval=0.5, **options
        )
        target = f"127.0.0.1:{port}"
        self.channels = [
            grpc.insecure_channel(target, options=GRPC_OPTIONS) for _ in range(CHANNELS)
        ]
        self.worker = [worker_pb2_grpc.WorkerServiceStub(c) for c in self.channels]
        self.tasks = [tasks_pb2_grpc.TaskServiceStub(c) for c in self.channels]
        admin = admin_pb2_grpc.AdminServiceStub(self.channels[0])
        self.epoch = admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=who("pm", "pm")).epoch

    def poll(self, n: int, principal: str, wait: float = WAIT) -> grpc.Future:  # type: ignore[type-arg]
        """A waiting ClaimNext of ``principal`` on the ``n``-th channel."""
        request = worker_pb2.ClaimNextRequest(
            queue=QUEUE, scheduler_epoch=self.epoch, ttl_seconds=30, wait_seconds=wait
        )
        stub = self.worker[n % CHANNELS]
        return stub.ClaimNext.future(request, metadata=who(principal, "worker"), timeout=60)

    def gauge(self, name: str) -> float:
        """A gauge of this test's metrics."""
        return self.store.ctx.metrics.registry.get_sample_value(name) or 0.0

    def close(self) -> None:
        """Close the channels and stop the server."""
        for channel in self.channels:
            channel.close()
        self.server.stop(grace=None).wait()


@pytest.fixture
def replica(store: Store) -> Iterator[Replica]:
    """A server with the default bounds of long-lived calls."""
    served = Replica(store)
    try:
        yield served
    finally:
        served.close()


def _pool_principal(n: int) -> str:
    """200 agents with their own token, then 800 callers of one shared token."""
    return f"agent-{n}" if n < AGENTS else "pool"


def test_a_thousand_waiting_claim_next_are_admitted_and_each_task_wakes_one(
    replica: Replica, store: Store
) -> None:
    create(store, "held", queue="other")
    held = replica.worker[0].Claim(
        worker_pb2.ClaimRequest(task_id="held", scheduler_epoch=replica.epoch, ttl_seconds=30),
        metadata=who("agent-0", "worker"),
    )
    polls = [replica.poll(n, _pool_principal(n)) for n in range(AGENTS + SHARED)]
    eventually(
        lambda: replica.gauge("coordinator_claim_waiters") == AGENTS + SHARED,
        timeout=WAIT,
        message="not every poll was admitted to wait",
    )
    # While they wait: a unary call, a renewal and a health check answer (not timed).
    task = replica.tasks[0].GetTask(
        tasks_pb2.GetTaskRequest(task_id="held"), metadata=who("pm", "pm"), timeout=10
    )
    assert task.task.state == types_pb2.TASK_STATE_CLAIMED
    renewed = replica.worker[1].RenewMany(
        worker_pb2.RenewManyRequest(
            renewals=[worker_pb2.RenewRequest(fence=held.fence, progress="p")]
        ),
        metadata=who("agent-0", "worker"),
        timeout=10,
    )
    assert [r.renewal.outcome for r in renewed.results] == [types_pb2.OUTCOME_OK]
    health = health_pb2_grpc.HealthStub(replica.channels[2])
    serving = health.Check(health_pb2.HealthCheckRequest(), timeout=10).status
    assert serving == health_pb2.HealthCheckResponse.SERVING

    for n in range(50):
        create(store, f"t-{n}", queue=QUEUE)
    answers = [p.result(timeout=60) for p in polls]
    outcomes = collections.Counter(a.outcome for a in answers)
    assert outcomes == {
        types_pb2.OUTCOME_CLAIMED: 50,
        types_pb2.OUTCOME_NO_READY_TASK: AGENTS + SHARED - 50,
    }
    won = sorted(a.fence.task_id for a in answers if a.outcome == types_pb2.OUTCOME_CLAIMED)
    assert won == sorted(f"t-{n}" for n in range(50))
    refused = store.ctx.metrics.registry.get_sample_value
    assert refused("coordinator_streams_refused_total", {"reason": "principal_full"}) is None
    eventually(lambda: replica.gauge("coordinator_claim_waiters") == 0)


def test_a_thousand_follow_streams_are_admitted_and_each_gets_the_next_event(
    replica: Replica, store: Store, etcd_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a replica's own process does (serve): each stream's etcd watch is read by a thread
    # that grpc would otherwise wake 10 times a second (coordinator.server.grpc_waits).
    monkeypatch.setattr(grpc_common, "MAXIMUM_WAIT_TIMEOUT", grpc_common.MAXIMUM_WAIT_TIMEOUT)
    lengthen_wait_slices()
    # Followed from now: a follow from the start would replay the session etcd's whole history
    # once per stream, which is the replay bound's business (tests/lifecycle/test_replays.py).
    now = etcd_client.put("/pools-of-hundreds/now", "").header.revision
    request = tasks_pb2.WatchEventsRequest(follow=True, from_revision=now)
    follows = [
        replica.tasks[n % CHANNELS].WatchEvents(
            request, metadata=who(_pool_principal(n), "pm"), timeout=120
        )
        for n in range(AGENTS + SHARED)
    ]
    try:
        eventually(
            lambda: replica.gauge("coordinator_streams_open") == AGENTS + SHARED,
            timeout=30,
            message="not every follow stream was admitted",
        )
        answer = replica.tasks[0].ListTasks(
            tasks_pb2.ListTasksRequest(queue=QUEUE), metadata=who("pm", "pm"), timeout=10
        )
        assert list(answer.tasks) == []
        create(store, "t-1", queue=QUEUE)
        firsts = collections.Counter((e.task_id, e.op) for e in map(next_of, follows))
        assert firsts == {("t-1", "create"): AGENTS + SHARED}
    finally:
        for follow in follows:
            cancel(follow)
    eventually(lambda: replica.gauge("coordinator_streams_open") == 0)


class Clock:
    """The refusal log's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _refusals(logs: list[MutableMapping[str, Any]], principal: str) -> list[Any]:
    return [e for e in logs if e["event"] == "rpc refused" and e["principal"] == principal]


def test_past_its_share_a_principal_is_refused_typed_and_logged_once_per_interval(
    store: Store,
) -> None:
    clock = Clock()
    # 40 slots, a guaranteed share of 2: the pool borrows up to 30, the last 10 stay for others.
    replica = Replica(
        store,
        streams=StreamLimits(max_streams=40, max_per_principal=2),
        refusals=RefusalLog(interval=10.0, monotonic=clock),
    )
    polls: list[grpc.Future] = []  # type: ignore[type-arg]
    try:
        with capture_logs() as logs:
            # Polls that wait the longest: none of the admitted ones ends during the test.
            polls = [replica.poll(n, "pool", wait=20.0) for n in range(40)]
            eventually(lambda: _refused(polls) == 10)
            eventually(lambda: replica.gauge("coordinator_claim_waiters") == 30)
            # Another principal still gets its share out of the reserve, and no more.
            agent = [replica.poll(n, "agent-1", wait=20.0) for n in range(3)]
            # Sent at once on three channels, they arrive in any order: which one is refused
            # is not fixed, that exactly one is.
            eventually(lambda: _refused(agent) == 1)
            polls += agent
            eventually(lambda: replica.gauge("coordinator_claim_waiters") == 32)
        refused = next(p for p in polls if p.done())
        error = refused.exception()
        assert isinstance(error, grpc.RpcError)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (error.details() or "").startswith(
            "principal 'pool' already holds its share of 2 open streams or more "
            "(max_streams_per_principal) and the replica's last 10 of 40 slots are kept for "
            "other principals"
        )
        (pool_line,) = _refusals(logs, "pool")
        assert (pool_line["code"], pool_line["refusals_not_logged"]) == ("RESOURCE_EXHAUSTED", 0)
        (agent_line,) = _refusals(logs, "agent-1")
        assert agent_line["refusals_not_logged"] == 0

        clock.now += 10.0  # the pool's interval passed: its next refusal is logged, with the count
        with capture_logs() as later:
            one_more = replica.poll(0, "pool")
            eventually(lambda: _refused([one_more]) == 1)
        (again,) = _refusals(later, "pool")
        assert again["refusals_not_logged"] == 9
        count = store.ctx.metrics.registry.get_sample_value
        assert count("coordinator_streams_refused_total", {"reason": "principal_full"}) == 12
    finally:
        for poll in polls:
            poll.cancel()
        replica.close()


def _refused(polls: list[grpc.Future]) -> int:  # type: ignore[type-arg]
    """How many of ``polls`` were refused RESOURCE_EXHAUSTED (at once: an admitted poll waits
    far longer than the test runs)."""
    codes = [_code(poll.exception()) for poll in polls if poll.done()]
    return codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)


def _code(error: BaseException | None) -> grpc.StatusCode | None:
    return error.code() if isinstance(error, grpc.RpcError) else None
