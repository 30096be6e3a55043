"""The effect RPCs over real gRPC: the happy path, and every bad input refused with the exact
status code, a message naming the field, and nothing written (checked on etcd itself)."""

from __future__ import annotations

from functools import partial
from typing import Any

import grpc
import pytest

from coordinator import request_ids
from coordinator.domain.digests import digest_of
from coordinator.domain.effect_ids import effect_id
from coordinator.domain.effects import (
    MAX_ETAG_CHARS,
    MAX_REF_CHARS,
    EffectRecord,
    EffectState,
)
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import decode, encode
from coordinator.v1 import admin_pb2, admin_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests import helpers
from tests.helpers import Probe, slot_effect_id

Claim = worker_pb2.ClaimResponse

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
WORKER_A = (("x-coordinator-principal", "worker-a"),)

# Every bad request is sent as the claim's holder, so the one bad field is all that is wrong.
refused = partial(helpers.refused, metadata=WORKER_A)
X = digest_of(b"payload X")
NEVER = effect_id("t-1", 1, 1, "notify", "never-prepared")


@pytest.fixture
def email(claimed: Claim, etcd_client: Any, prefix: str) -> str:
    """The effect id of t-1's slot notify/email."""
    return slot_effect_id(etcd_client, prefix, "t-1", "notify", "email")


def prepare_request(claim: Claim, **changes: Any) -> worker_pb2.PrepareEffectRequest:
    fields: dict[str, Any] = {
        "fence": claim.fence,
        "node_id": "notify",
        "effect_slot": "email",
        "payload_digest": X,
    }
    fields.update(changes)
    return worker_pb2.PrepareEffectRequest(**{k: v for k, v in fields.items() if v is not None})


def test_prepare_record_get_and_stats_over_the_wire(
    claimed: Claim,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    email: str,
) -> None:
    prepared = worker.PrepareEffect(prepare_request(claimed), metadata=WORKER_A)
    assert (prepared.outcome, prepared.action) == (
        types_pb2.OUTCOME_OK,
        types_pb2.EFFECT_ACTION_EXECUTE,
    )
    assert prepared.effect_id == email
    assert prepared.effect.state == types_pb2.EFFECT_STATE_PREPARED
    assert prepared.effect.prepared_generation == claimed.fence.claim_generation
    assert admin.DrainStatus(admin_pb2.DrainStatusRequest()).unknown_effects == 1

    conflict = worker.PrepareEffect(
        prepare_request(claimed, payload_digest=digest_of(b"Y")), metadata=WORKER_A
    )
    assert conflict.outcome == types_pb2.OUTCOME_PAYLOAD_CONFLICT
    assert conflict.effect.payload_digest == X

    recorded = worker.RecordEffect(
        worker_pb2.RecordEffectRequest(
            fence=claimed.fence,
            effect_id=prepared.effect_id,
            state=types_pb2.EFFECT_STATE_COMMITTED,
            external_ref="msg-1",
            etag="e-1",
        ),
        metadata=WORKER_A,
    )
    assert recorded.outcome == types_pb2.OUTCOME_OK
    assert (recorded.effect.state, recorded.effect.external_ref, recorded.effect.etag) == (
        types_pb2.EFFECT_STATE_COMMITTED,
        "msg-1",
        "e-1",
    )
    got = worker.GetEffect(worker_pb2.GetEffectRequest(effect_id=prepared.effect_id)).effect
    assert got == recorded.effect
    assert admin.DrainStatus(admin_pb2.DrainStatusRequest()).unknown_effects == 0

    stats = admin.GetStats(admin_pb2.GetStatsRequest()).fence_coverage
    # 8: START_JOB (managed jobs), 9: FAIL (tests/workqueue)
    assert [s.point for s in stats] == list(range(1, 10))
    by_point = {s.point: s for s in stats}
    assert by_point[admin_pb2.ACCEPTANCE_POINT_PREPARE].accepted >= 2
    assert by_point[admin_pb2.ACCEPTANCE_POINT_RECORD].accepted >= 1
    assert all(s.coverage == 1.0 and s.validated == s.accepted for s in stats)


def test_each_effect_write_carries_the_request_id_of_its_call(
    claimed: Claim,
    worker: worker_pb2_grpc.WorkerServiceStub,
    etcd_client: Any,
    prefix: str,
    email: str,
) -> None:
    def stored() -> EffectRecord:
        value, _ = etcd_client.get(Keyspace(prefix).effect(email))
        return decode(EffectRecord, value)

    prepared = worker.PrepareEffect(
        prepare_request(claimed), metadata=(*WORKER_A, (request_ids.METADATA_KEY, "prepare-9"))
    )
    assert prepared.action == types_pb2.EFFECT_ACTION_EXECUTE
    assert (stored().state, stored().request_id) == (EffectState.PREPARED, "prepare-9")
    record = worker_pb2.RecordEffectRequest(
        fence=claimed.fence,
        effect_id=prepared.effect_id,
        state=types_pb2.EFFECT_STATE_COMMITTED,
        external_ref="msg-1",
    )
    rid = (request_ids.METADATA_KEY, "record-9")
    assert worker.RecordEffect(record, metadata=(*WORKER_A, rid)).outcome == types_pb2.OUTCOME_OK
    assert (stored().state, stored().request_id) == (EffectState.COMMITTED, "record-9")
    # A repeat writes nothing: the record still names the call that wrote it.
    again = (request_ids.METADATA_KEY, "record-10")
    assert worker.RecordEffect(record, metadata=(*WORKER_A, again)).outcome == types_pb2.OUTCOME_OK
    assert stored().request_id == "record-9"
    # Records written before the field existed still decode.
    old = encode(stored()).replace(b',"request_id":"record-9"', b"")
    assert b"request_id" not in old and decode(EffectRecord, old).request_id == ""


_PREPARE_CASES: list[tuple[str, dict[str, Any], grpc.StatusCode, str]] = [
    ("no-fence", {"fence": None}, INVALID, "fence is required"),
    ("empty-node", {"node_id": ""}, INVALID, "node_id is required"),
    ("bad-node", {"node_id": "a b"}, INVALID, "node_id"),
    ("long-node", {"node_id": "n" * 129}, INVALID, "node_id"),
    ("dotdot-node", {"node_id": ".."}, INVALID, "node_id must not be '.' or '..'"),
    ("dotdot-part-node", {"node_id": "plan/../notify"}, INVALID, "node_id must not be"),
    ("dot-slot", {"effect_slot": "."}, INVALID, "effect_slot must not be '.' or '..'"),
    ("empty-slot", {"effect_slot": ""}, INVALID, "effect_slot is required"),
    ("bad-slot", {"effect_slot": "e\nmail"}, INVALID, "effect_slot"),
    ("empty-digest", {"payload_digest": ""}, INVALID, "payload_digest is required"),
    ("short-digest", {"payload_digest": "sha256:abc"}, INVALID, "payload_digest"),
    ("upper-digest", {"payload_digest": X.upper()}, INVALID, "payload_digest"),
    ("md5-digest", {"payload_digest": "md5:" + "0" * 32}, INVALID, "payload_digest"),
]


@pytest.mark.parametrize(
    ("changes", "code", "named"),
    [c[1:] for c in _PREPARE_CASES],
    ids=[c[0] for c in _PREPARE_CASES],
)
def test_prepare_refuses_bad_input(
    claimed: Claim,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
    changes: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
) -> None:
    refused(worker.PrepareEffect, prepare_request(claimed, **changes), code, named, keyspace)


def test_prepare_refuses_an_unknown_task(
    claimed: Claim, worker: worker_pb2_grpc.WorkerServiceStub, keyspace: Probe
) -> None:
    fence = types_pb2.Fence()
    fence.CopyFrom(claimed.fence)
    fence.task_id = "nope"
    refused(
        worker.PrepareEffect, prepare_request(claimed, fence=fence), NOT_FOUND, "'nope'", keyspace
    )


def record_request(claim: Claim, email: str, **changes: Any) -> worker_pb2.RecordEffectRequest:
    fields: dict[str, Any] = {
        "fence": claim.fence,
        "effect_id": email,
        "state": types_pb2.EFFECT_STATE_COMMITTED,
        "external_ref": "msg-1",
    }
    fields.update(changes)
    return worker_pb2.RecordEffectRequest(**{k: v for k, v in fields.items() if v is not None})


_RECORD_CASES: list[tuple[str, dict[str, Any], grpc.StatusCode, str]] = [
    ("no-fence", {"fence": None}, INVALID, "fence is required"),
    ("empty-id", {"effect_id": ""}, INVALID, "effect_id is required"),
    ("bad-id", {"effect_id": "eff-xyz"}, INVALID, "effect_id must be"),
    ("upper-id", {"effect_id": NEVER.upper()}, INVALID, "effect_id must be"),
    ("never-prepared", {"effect_id": NEVER}, NOT_FOUND, "never prepared"),
    ("no-state", {"state": None}, INVALID, "state is required"),
    ("prepared", {"state": types_pb2.EFFECT_STATE_PREPARED}, INVALID, "PREPARED is reached"),
    ("unknown-enum", {"state": 99}, INVALID, "state 99"),
    ("long-ref", {"external_ref": "r" * (MAX_REF_CHARS + 1)}, INVALID, "external_ref"),
    ("long-etag", {"etag": "e" * (MAX_ETAG_CHARS + 1)}, INVALID, "etag"),
]


@pytest.mark.parametrize(
    ("changes", "code", "named"), [c[1:] for c in _RECORD_CASES], ids=[c[0] for c in _RECORD_CASES]
)
def test_record_refuses_bad_input(
    claimed: Claim,
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
    email: str,
    changes: dict[str, Any],
    code: grpc.StatusCode,
    named: str,
) -> None:
    worker.PrepareEffect(prepare_request(claimed), metadata=WORKER_A)  # "email" exists
    refused(worker.RecordEffect, record_request(claimed, email, **changes), code, named, keyspace)


def test_record_refuses_a_move_the_state_does_not_allow(
    claimed: Claim, worker: worker_pb2_grpc.WorkerServiceStub, keyspace: Probe, email: str
) -> None:
    worker.PrepareEffect(prepare_request(claimed), metadata=WORKER_A)
    worker.RecordEffect(record_request(claimed, email), metadata=WORKER_A)
    request = record_request(claimed, email, state=types_pb2.EFFECT_STATE_ABSENT, external_ref="")
    refused(worker.RecordEffect, request, PRECONDITION, "is COMMITTED", keyspace)


@pytest.mark.parametrize(
    ("effect", "code", "named"),
    [
        ("", INVALID, "effect_id is required"),
        ("eff-1", INVALID, "effect_id"),
        (NEVER, NOT_FOUND, NEVER),
    ],
)
def test_get_effect_refuses_unknown_and_malformed_ids(
    worker: worker_pb2_grpc.WorkerServiceStub,
    keyspace: Probe,
    effect: str,
    code: grpc.StatusCode,
    named: str,
) -> None:
    refused(worker.GetEffect, worker_pb2.GetEffectRequest(effect_id=effect), code, named, keyspace)


@pytest.mark.parametrize(
    ("task", "resolution", "code", "named"),
    [
        ("", types_pb2.EFFECT_STATE_ABSENT, INVALID, "task_id is required"),
        ("t-1", types_pb2.EFFECT_STATE_UNSPECIFIED, INVALID, "resolution is required"),
        ("t-1", types_pb2.EFFECT_STATE_UNKNOWN, INVALID, "resolution must be"),
        ("t-1", types_pb2.EFFECT_STATE_PREPARED, INVALID, "resolution must be"),
        ("nope", types_pb2.EFFECT_STATE_ABSENT, NOT_FOUND, "'nope'"),
        ("t-1", types_pb2.EFFECT_STATE_ABSENT, PRECONDITION, "only a NEEDS_APPROVAL task"),
    ],
)
def test_approve_retry_refuses_bad_input(
    claimed: Claim,
    admin: admin_pb2_grpc.AdminServiceStub,
    keyspace: Probe,
    task: str,
    resolution: int,
    code: grpc.StatusCode,
    named: str,
) -> None:
    request = admin_pb2.ApproveRetryRequest(task_id=task, resolution=resolution)  # type: ignore[arg-type]
    refused(admin.ApproveRetry, request, code, named, keyspace)
