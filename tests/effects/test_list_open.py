"""ListOpenEffects over real gRPC: uncertain effects in (task, effect) order, a page at a time,
a settled effect leaves the listing, and bad input is refused with the field named."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from coordinator.domain.digests import digest_of
from coordinator.domain.effect_ids import effect_id
from coordinator.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from tests import helpers
from tests.helpers import slot_effect_id

WORKER_A = (("x-coordinator-principal", "worker-a"),)


def _prepare(worker: worker_pb2_grpc.WorkerServiceStub, fence: types_pb2.Fence, slot: str) -> str:
    reply = worker.PrepareEffect(
        worker_pb2.PrepareEffectRequest(
            fence=fence, node_id="notify", effect_slot=slot, payload_digest=digest_of(b"p")
        ),
        metadata=WORKER_A,
    )
    assert reply.outcome == types_pb2.OUTCOME_OK
    return reply.effect_id


def test_pages_through_the_uncertain_effects_and_drops_settled_ones(
    claimed: worker_pb2.ClaimResponse,
    worker: worker_pb2_grpc.WorkerServiceStub,
    etcd_client: Any,
    prefix: str,
) -> None:
    ids = sorted(_prepare(worker, claimed.fence, slot) for slot in ("a", "b", "c"))
    slots = ("a", "b", "c")
    assert ids == sorted(slot_effect_id(etcd_client, prefix, "t-1", "notify", s) for s in slots)

    first = worker.ListOpenEffects(worker_pb2.ListOpenEffectsRequest(page_size=2))
    assert [e.effect_id for e in first.effects] == ids[:2]
    assert helpers.resumes_at(first.next_page_token) == f"t-1/{ids[1]}"
    second = worker.ListOpenEffects(
        worker_pb2.ListOpenEffectsRequest(page_size=2, page_token=first.next_page_token)
    )
    assert [e.effect_id for e in second.effects] == ids[2:]
    assert second.next_page_token == ""
    assert {e.state for e in second.effects} == {types_pb2.EFFECT_STATE_PREPARED}

    worker.RecordEffect(
        worker_pb2.RecordEffectRequest(
            fence=claimed.fence, effect_id=ids[0], state=types_pb2.EFFECT_STATE_COMMITTED
        ),
        metadata=WORKER_A,
    )
    of_task = worker.ListOpenEffects(worker_pb2.ListOpenEffectsRequest(task_id="t-1"))
    assert [e.effect_id for e in of_task.effects] == ids[1:]
    other = worker.ListOpenEffects(worker_pb2.ListOpenEffectsRequest(task_id="t-2"))
    assert list(other.effects) == []


@pytest.mark.parametrize(
    ("request_fields", "named"),
    [
        ({"page_size": 1001}, "page_size"),
        ({"task_id": "bad id"}, "task_id"),
        ({"page_token": "t-1/not-an-effect"}, "page_token"),
        ({"task_id": "t-2", "page_token": f"t-1/{effect_id('t-1', 1, 1, 'n', 's')}"}, "t-2"),
    ],
)
def test_refuses_bad_input(
    worker: worker_pb2_grpc.WorkerServiceStub, request_fields: dict[str, object], named: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        worker.ListOpenEffects(worker_pb2.ListOpenEffectsRequest(**request_fields))  # type: ignore[arg-type]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in str(info.value.details())
