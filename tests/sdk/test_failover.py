"""A worker's calls across coordinator replicas that crash and restart: real ``coordinator
serve`` processes on fixed loopback ports, SIGKILLed and started again, over the session etcd.

The SDK retries a transport failure for its whole retry budget (not a count of tries), no
longer than a claim's lease, moves to another replica when it was given several, and says
OutcomeUnknown when it gives up on a call that may have landed.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from chaos.proxy import TcpProxy
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import (
    CallRetry,
    Claim,
    CommitOutcome,
    OutcomeUnknown,
    TransportError,
    WorkerClient,
)
from coordinator.sdk._rpc import Rpc
from coordinator.sdk.aio._rpc import AsyncRpc
from coordinator.v1 import admin_pb2
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.sdk.replicas import Replica, replicas
from tests.sdk.support import QUEUE, CallCounter

# The default budget (15 s) with a backoff short enough to reach many tries quickly.
QUICK = CallRetry(initial_backoff=timedelta(milliseconds=50), max_backoff=timedelta(seconds=0.5))
# Tries the SDK made before it had a budget: a call then gave up after these.
OLD_TRIES = 5


def client_for(target: str, policy: CallRetry, *interceptors: Any) -> WorkerClient:
    """A worker client whose every try passes through ``interceptors``."""
    return WorkerClient(
        target,
        principal="worker-1",
        channel_options=GRPC_OPTIONS,
        retry=policy,
        interceptors=list(interceptors),
    )


def claimed(client: WorkerClient, task_id: str) -> Claim:
    """A new task, claimed with a lease that outlasts every outage here."""
    client.create_task(task_id, input=b"x", queue=QUEUE)
    claim = client.claim(task_id, ttl=timedelta(seconds=30))
    assert isinstance(claim, Claim), claim
    return claim


def test_a_commit_rides_out_a_replica_restart_within_the_budget(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    counter = CallCounter()
    with (
        replicas(etcd, prefix, tmp_path, 1) as (replica,),
        client_for(replica.target, QUICK, counter) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        claim = claimed(client, "t1")
        replica.kill()
        committing = pool.submit(claim.commit, b"result")
        # Still trying after more tries than the SDK used to make in all...
        eventually(lambda: counter.calls.get("Commit", 0) > OLD_TRIES + 1, timeout=15)
        assert not committing.done()
        replica.start()  # ...and the same port answers again within the budget.
        outcome = committing.result(timeout=60)
        assert outcome.committed, outcome
        assert client.get_task("t1").result_commit_id == outcome.result_commit_id


class _Lost(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the replica died before it answered"


class CrashAfterCommit(CallCounter):
    """Lets the first Commit land on the replica, then kills the replica before the answer
    arrives: the worker sees UNAVAILABLE for a commit that is canonical."""

    def __init__(self, replica: Replica) -> None:
        super().__init__()
        self._replica = replica

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        response = super().intercept_unary_unary(continuation, details, request)
        if details.method.endswith("/Commit") and self.calls["Commit"] == 1:
            response.result()  # landed
            self._replica.kill()
            raise _Lost()
        return response


def test_a_commit_given_up_is_outcome_unknown_and_its_retry_answers_committed(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    short = CallRetry(
        budget=timedelta(seconds=1),
        initial_backoff=timedelta(milliseconds=50),
        max_backoff=timedelta(milliseconds=200),
    )
    with replicas(etcd, prefix, tmp_path, 1) as (replica,):
        crash = CrashAfterCommit(replica)
        with client_for(replica.target, short, crash) as client:
            claim = claimed(client, "t1")
            with pytest.raises(OutcomeUnknown) as raised:
                claim.commit(b"result")
            assert crash.calls["Commit"] > 2  # it retried the dead replica for the budget
            assert str(raised.value).endswith(
                "outcome unknown, not failed; retry the same call on the same attempt to learn it"
            )
            assert not claim.committed and claim.lost_reason is None
            replica.start()

            def commit_again() -> CommitOutcome | None:
                # The same call on the same attempt, repeated until a try reaches the replica
                # (with a 1 s budget, one call may end inside the channel's reconnect back-off:
                # a plain TransportError, "no try reached a coordinator").
                try:
                    return claim.commit(b"result")
                except TransportError:
                    return None

            outcome = eventually(commit_again, timeout=15, message="the replica never answered")
            assert outcome.committed, outcome  # the truth: the first try had landed
            assert claim.committed
            assert client.get_task("t1").result_commit_id == outcome.result_commit_id


def test_calls_move_to_the_replica_that_is_up(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    policy = CallRetry(budget=timedelta(seconds=5), max_backoff=timedelta(milliseconds=500))
    with (
        replicas(etcd, prefix, tmp_path, 2) as (a, b),
        client_for(f"{a.target},{b.target}", policy) as client,
    ):
        client.epoch()
        a.kill()
        claim = claimed(client, "t1")  # reaches b
        a.start()
        b.kill()
        outcome = claim.commit(b"result")  # reaches a, which did not grant the claim
        assert outcome.committed, outcome
        assert client.get_task("t1").result_commit_id == outcome.result_commit_id


def test_a_held_claim_is_renewed_through_the_other_replica_when_its_own_goes_away(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    # Renewals are sent without the transport's retries (the keepalive retries them itself):
    # a renewal that cannot reach its replica must still move the client on, or every later
    # renewal goes to the dead replica until the claim's lease runs out.
    policy = CallRetry(budget=timedelta(seconds=5), max_backoff=timedelta(milliseconds=500))
    with (
        replicas(etcd, prefix, tmp_path, 2) as (a, b),
        client_for(f"{a.target},{b.target}", policy) as client,
    ):
        client.epoch()
        a.kill()
        client.create_task("t1", input=b"x", queue=QUEUE)
        claim = client.claim("t1", ttl=timedelta(seconds=3))  # reaches b
        assert isinstance(claim, Claim), claim
        with claim:  # the keepalive
            a.start()
            b.kill()
            renewed = claim.renewals
            # Three TTLs of renewals, all through a: the claim never runs out.
            eventually(lambda: claim.renewals >= renewed + 6, timeout=60, message="not renewed")
            assert not claim.is_lost(), claim
            outcome = claim.commit(b"result")
            assert outcome.committed, outcome


def test_a_retry_after_a_replica_answers_unavailable_itself_goes_to_another(
    etcd: EtcdProcess, prefix: str, tmp_path: Path
) -> None:
    # "sick" reaches etcd through a proxy the test cuts: its process and its connections are
    # fine, and it answers every call UNAVAILABLE itself (StoreUnavailable), which gRPC's own
    # failover (a connection that fails) never leaves.
    proxy = TcpProxy(etcd.endpoint)
    sick = Replica(etcd, prefix, tmp_path, "sick", etcd_endpoint=proxy.endpoint, etcd_timeout=1)
    well = Replica(etcd, prefix, tmp_path, "well")
    try:
        sick.start()
        well.start()
        proxy.drop()
        once = CallRetry(attempts=1)
        alone = Rpc(sick.target, principal="w", retry=once, channel_options=GRPC_OPTIONS)
        with pytest.raises(TransportError, match=r"^UNAVAILABLE: etcd") as refused:
            alone.call(alone.admin.GetEpoch, admin_pb2.GetEpochRequest())
        # A read: nothing to learn, so no unknown outcome.
        assert not isinstance(refused.value, OutcomeUnknown)
        assert str(refused.value).endswith("; a read, nothing changed: repeat it")
        alone.close()
        counter = CallCounter()
        rpc = Rpc(
            [sick.target, well.target],
            principal="w",
            retry=QUICK,
            channel_options=GRPC_OPTIONS,
            interceptors=[counter],
            pick=_sick_first,
        )
        # The first try is answered UNAVAILABLE by sick; the retry goes to well and answers.
        assert rpc.call(rpc.admin.GetEpoch, admin_pb2.GetEpochRequest()).epoch >= 1
        assert counter.calls["GetEpoch"] == 2
        # The client stays with the replica that answered.
        rpc.call(rpc.admin.GetEpoch, admin_pb2.GetEpochRequest())
        assert counter.calls["GetEpoch"] == 3
        rpc.close()
        assert asyncio.run(_async_epoch([sick.target, well.target])) == (0, 1)
    finally:
        sick.stop()
        well.stop()
        proxy.close()


def _sick_first(count: int) -> int:
    """Start on the first replica given (the sick one), not a random one."""
    del count
    return 0


async def _async_epoch(targets: list[str]) -> tuple[int, int]:
    """The asyncio transport the same way: (replica it started on, replica that answered)."""
    rpc = AsyncRpc(
        targets, principal="w", retry=QUICK, channel_options=GRPC_OPTIONS, pick=_sick_first
    )
    try:
        started = rpc.endpoints.current
        await rpc.call(rpc.admin.GetEpoch, admin_pb2.GetEpochRequest())
        return started, rpc.endpoints.current
    finally:
        await rpc.close()
