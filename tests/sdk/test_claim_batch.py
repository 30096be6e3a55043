"""The SDK's batched claims and commit-then-next: ``claim_many`` and ``commit_and_next``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import grpc
import pytest

from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Claim, ClaimRefused, Outcome, TaskState
from coordinator.sdk.aio import AsyncClaim, AsyncWorkerClient
from tests.conftest import GRPC_OPTIONS
from tests.sdk.support import QUEUE, CallCounter, Served, served

TTL = timedelta(seconds=30)


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    with served(etcd.endpoint, prefix) as running:
        with running.client("producer") as producer:
            for n in range(6):
                producer.create_task(f"t{n}", input=f"in-{n}".encode(), queue=QUEUE)
        yield running


def test_claim_many_then_commit_and_next_take_one_call_per_task(coordinator: Served) -> None:
    counter = CallCounter()
    with coordinator.client("w", interceptors=[counter]) as worker:
        claims = worker.claim_many(QUEUE, ttl=TTL, max_tasks=2)
        assert isinstance(claims, list) and len(claims) == 2
        done: list[str] = []
        for first in claims:
            held: Claim | None = first
            while held is not None:
                with held:
                    outcome, more = held.commit_and_next(b"ok", queue=QUEUE, ttl=TTL)
                assert outcome.committed
                done.append(held.task_id)
                held = more[0] if more else None
        assert sorted(done) == [f"t{n}" for n in range(6)]
        assert isinstance(worker.claim_many(QUEUE, ttl=TTL, max_tasks=5), ClaimRefused)
    # One ClaimNext for two claims and one for the empty queue; a Commit per task, nothing else.
    assert (counter.calls.get("ClaimNext"), counter.calls.get("Commit")) == (2, 6)


def test_after_an_epoch_bump_the_commit_is_fenced_and_no_next_is_won(coordinator: Served) -> None:
    with coordinator.client("w") as worker, coordinator.client("admin") as admin:
        claim = worker.claim_next(QUEUE, ttl=TTL)
        assert isinstance(claim, Claim)
        admin.admin.bump_epoch()
        outcome, more = claim.commit_and_next(b"late", queue=QUEUE, ttl=TTL)
        assert (outcome.outcome, more) == (Outcome.FENCED, [])
        again = worker.claim_next(QUEUE, ttl=TTL)  # follows the new epoch by itself
        assert isinstance(again, Claim) and again.fence.scheduler_epoch == 2


class _Unavailable(grpc.RpcError):
    """A call whose answer was lost on the way back (``result()`` raises it)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection reset"

    def result(self) -> None:
        raise self


class _LoseFirstAnswer(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Loses the answer of the first call of ``method`` after the server ran it."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.lost = False

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = continuation(details, request)
        if details.method.endswith(self.method) and not self.lost:
            call.result()  # it landed on the server
            self.lost = True
            return _Unavailable()
        return call


def test_a_lost_answer_is_replayed_with_its_next_claim_which_costs_no_attempt(
    coordinator: Served,
) -> None:
    lose = _LoseFirstAnswer("/Commit")
    with coordinator.client("w", interceptors=[lose]) as worker:
        claim = worker.claim_next(QUEUE, ttl=timedelta(seconds=2))
        assert isinstance(claim, Claim)
        outcome, more = claim.commit_and_next(b"ok", queue=QUEUE, ttl=timedelta(seconds=2))
        # The retry, under the same key, got the lost answer: the commit and the claim it won.
        assert lose.lost and outcome.committed and len(more) == 1
        tasks = [worker.get_task(f"t{n}") for n in range(6)]
        held = [t for t in tasks if t.state is TaskState.CLAIMED]
        assert [t.task_id for t in held] == [more[0].task_id]  # no claim held by nobody
        assert (held[0].attempt, held[0].attempt_id) == (1, more[0].fence.attempt_id)
        with more[0]:
            assert more[0].commit(b"next").committed


def test_a_lost_claim_many_answer_is_replayed_with_the_same_attempts(coordinator: Served) -> None:
    lose = _LoseFirstAnswer("/ClaimNext")
    with coordinator.client("w", interceptors=[lose]) as worker:
        claims = worker.claim_many(QUEUE, ttl=TTL, max_tasks=3, wait=timedelta(seconds=5))
        assert lose.lost and isinstance(claims, list) and len(claims) == 3
        tasks = [worker.get_task(f"t{n}") for n in range(6)]
        held = {t.task_id: t for t in tasks if t.state is TaskState.CLAIMED}
        # Exactly the three the retry handed back, each on its first attempt.
        assert sorted(held) == sorted(c.task_id for c in claims)
        for claim in claims:
            assert (held[claim.task_id].attempt, held[claim.task_id].attempt_id) == (
                1,
                claim.fence.attempt_id,
            )
            with claim:
                assert claim.commit(b"done").committed


def test_the_asyncio_twin_claims_many_and_commits_with_next_alike(coordinator: Served) -> None:
    async def run() -> tuple[int, list[str], ClaimRefused | list[AsyncClaim]]:
        async with AsyncWorkerClient(
            coordinator.target, principal="w", channel_options=GRPC_OPTIONS
        ) as worker:
            claims = await worker.claim_many(QUEUE, ttl=TTL, max_tasks=2)
            assert isinstance(claims, list)
            done: list[str] = []
            for first in claims:
                held: AsyncClaim | None = first
                while held is not None:
                    async with held:
                        outcome, more = await held.commit_and_next(b"ok", queue=QUEUE, ttl=TTL)
                    assert outcome.committed
                    done.append(held.task_id)
                    held = more[0] if more else None
            return len(claims), done, await worker.claim_many(QUEUE, ttl=TTL, max_tasks=5)

    first_call, done, after = asyncio.run(run())
    assert first_call == 2  # one call, two claims
    assert sorted(done) == [f"t{n}" for n in range(6)]  # the other four came with commits
    assert isinstance(after, ClaimRefused) and after.outcome is Outcome.NO_READY_TASK


def test_a_batch_of_large_inputs_stops_where_its_answer_still_fits_a_message(
    coordinator: Served,
) -> None:
    """30 tasks of 256 KiB: the answer came to 7.9 MB, past gRPC's 4 MiB a message, so the
    (keyed) call failed on every try while its 30 claims stayed CLAIMED by nobody, each attempt
    counted when its lease ran out. The batch now stops at 3 MiB of inputs."""
    data = b"i" * 256 * 1024
    with coordinator.client("pm") as producer, coordinator.client("w") as worker:
        for n in range(30):
            producer.create_task(f"big-{n}", input=data, queue="big")
        claims = worker.claim_many("big", ttl=timedelta(seconds=30), max_tasks=30)
        assert isinstance(claims, list) and len(claims) == 11
        assert all(c.input == data for c in claims)
        for claim in claims:
            claim.release("done looking")
        states = [t.state for t in producer.list_tasks(queue="big")]
        assert states == [TaskState.READY] * 30
        assert sum(t.attempt for t in producer.list_tasks(queue="big")) == 11
