"""Concurrent claims of one task give exactly one executor; the losers get a deterministic
refusal and no credential to start anything with."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from coordinator.domain.states import Op
from coordinator.store import Store
from coordinator.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from tests.lifecycle.support import create, events, who


def test_concurrent_claims_give_one_executor(
    store: Store,
    worker: worker_pb2_grpc.WorkerServiceStub,
    etcd_client: Any,
) -> None:
    create(store, "t")
    barrier = threading.Barrier(8)
    answers: dict[str, worker_pb2.ClaimResponse] = {}

    def race(principal: str) -> None:
        barrier.wait()
        request = worker_pb2.ClaimRequest(task_id="t", scheduler_epoch=1, ttl_seconds=30)
        answers[principal] = worker.Claim(request, metadata=who(principal))

    threads = [threading.Thread(target=race, args=(f"w{n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [p for p, a in answers.items() if a.outcome == types_pb2.OUTCOME_CLAIMED]
    assert len(winners) == 1
    for principal, answer in answers.items():
        if principal in winners:
            continue
        assert answer.outcome in (
            types_pb2.OUTCOME_ALREADY_CLAIMED,
            types_pb2.OUTCOME_STALE_STATE_VERSION,
        )
        assert not answer.HasField("fence")  # nothing to start a session or a tool with
    assert [e.op for e in events(store, etcd_client, "t")] == [Op.CREATE, Op.CLAIM]
    task = store.tasks.get("t")
    assert (task.attempt, task.owner_id) == (1, winners[0])
    assert len(store.tasks.attempts("t")) == 1
    # A loser that asks the tool gate anyway, with the winner's public fence fields, is not
    # the owner: refused before any side effect.
    fence = answers[winners[0]].fence
    loser = next(p for p in answers if p not in winners)
    gate = worker_pb2.AuthorizeToolRequest(fence=fence, tool="git", action="push")
    with pytest.raises(grpc.RpcError) as refused:
        worker.AuthorizeTool(gate, metadata=who(loser))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
