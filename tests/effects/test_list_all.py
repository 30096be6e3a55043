"""ListEffects over real gRPC: every effect of a task whatever its state (COMMITTED, ABSENT,
UNKNOWN, PREPARED), from the per-task effect index, a page at a time, and bad input refused
with the field named and nothing written."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from coordinator.domain.digests import digest_of
from coordinator.domain.effect_ids import effect_id
from coordinator.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from tests import helpers
from tests.helpers import Probe

WORKER_A = (("x-coordinator-principal", "worker-a"),)
S = types_pb2


def _prepare(worker: worker_pb2_grpc.WorkerServiceStub, fence: types_pb2.Fence, slot: str) -> str:
    reply = worker.PrepareEffect(
        worker_pb2.PrepareEffectRequest(
            fence=fence, node_id="notify", effect_slot=slot, payload_digest=digest_of(b"p")
        ),
        metadata=WORKER_A,
    )
    assert reply.outcome == S.OUTCOME_OK
    return reply.effect_id


def _record(
    worker: worker_pb2_grpc.WorkerServiceStub,
    fence: types_pb2.Fence,
    eid: str,
    state: types_pb2.EffectState.ValueType,
) -> None:
    request = worker_pb2.RecordEffectRequest(fence=fence, effect_id=eid, state=state)
    assert worker.RecordEffect(request, metadata=WORKER_A).outcome == S.OUTCOME_OK


def test_every_effect_of_a_task_is_listed_with_its_state(
    claimed: worker_pb2.ClaimResponse, worker: worker_pb2_grpc.WorkerServiceStub
) -> None:
    fence = claimed.fence
    ids = {slot: _prepare(worker, fence, slot) for slot in ("sent", "absent", "lost", "open")}
    _record(worker, fence, ids["sent"], S.EFFECT_STATE_COMMITTED)
    _record(worker, fence, ids["absent"], S.EFFECT_STATE_ABSENT)
    _record(worker, fence, ids["lost"], S.EFFECT_STATE_UNKNOWN)

    listed = worker.ListEffects(worker_pb2.ListEffectsRequest(task_id="t-1"))
    states = {e.effect_slot: e.state for e in listed.effects}
    assert states == {
        "sent": S.EFFECT_STATE_COMMITTED,
        "absent": S.EFFECT_STATE_ABSENT,
        "lost": S.EFFECT_STATE_UNKNOWN,
        "open": S.EFFECT_STATE_PREPARED,
    }
    assert [e.effect_id for e in listed.effects] == sorted(ids.values())
    assert listed.next_page_token == ""
    # The open listing still shows only the uncertain two.
    still_open = worker.ListOpenEffects(worker_pb2.ListOpenEffectsRequest(task_id="t-1"))
    assert sorted(e.effect_slot for e in still_open.effects) == ["lost", "open"]

    first = worker.ListEffects(worker_pb2.ListEffectsRequest(task_id="t-1", page_size=3))
    assert [e.effect_id for e in first.effects] == sorted(ids.values())[:3]
    assert helpers.resumes_at(first.next_page_token) == f"t-1/{sorted(ids.values())[2]}"
    rest = worker.ListEffects(
        worker_pb2.ListEffectsRequest(task_id="t-1", page_token=first.next_page_token)
    )
    assert [e.effect_id for e in rest.effects] == sorted(ids.values())[3:]
    assert list(worker.ListEffects(worker_pb2.ListEffectsRequest(task_id="t-2")).effects) == []
    everyone = worker.ListEffects(worker_pb2.ListEffectsRequest())
    assert len(everyone.effects) == 4


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"page_size": 1001}, "page_size"),
        ({"task_id": "bad id"}, "task_id"),
        ({"page_token": "t-1/not-an-effect"}, "not one ListEffects returned"),
        ({"task_id": "t-2", "page_token": f"t-1/{effect_id('t-1', 1, 1, 'n', 's')}"}, "t-2"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(
    claimed: worker_pb2.ClaimResponse,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
    fields: dict[str, Any],
    named: str,
) -> None:
    helpers.refused(
        worker.ListEffects,
        worker_pb2.ListEffectsRequest(**fields),
        grpc.StatusCode.INVALID_ARGUMENT,
        named,
        keyspace,
    )
