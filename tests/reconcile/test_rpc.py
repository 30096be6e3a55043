"""Owned reconciliation over real gRPC, with the server's own sweeper on the real clock: an
UNKNOWN effect past its deadline moves the task to NEEDS_APPROVAL while several workers poll
ClaimNext and get nothing; and every bad input of the new fields is refused, writing nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import grpc
import pytest

from coordinator import request_ids
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.digests import digest_of
from coordinator.domain.effect_ids import effect_id
from coordinator.domain.effects import MAX_REF_CHARS, EffectRecord
from coordinator.domain.records import EventRecord, decode
from coordinator.domain.states import Op, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.store import EtcdKV, Keyspace, Store
from coordinator.v1 import (
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from tests import helpers
from tests.helpers import Probe, eventually
from tests.reconcile.support import escalations

RECONCILE_TIMEOUT = 2.0
INPUT = b"input"
X = digest_of(b"payload X")
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
DENIED = grpc.StatusCode.PERMISSION_DENIED


def who(principal: str, roles: str = "worker") -> tuple[tuple[str, str], ...]:
    return (("x-coordinator-principal", principal), ("x-coordinator-roles", roles))


A, B, OPS = who("worker-a"), who("worker-b"), who("ops", "admin")

# Bad requests are sent as worker-a, so the one bad field is all that is wrong.
refused = partial(helpers.refused, metadata=A)


@pytest.fixture
def store(etcd: EtcdProcess, prefix: str, metrics: Metrics) -> Iterator[Store]:
    """The server's store: a 2 s reconcile timeout, no takeover, a sweep every 0.1 s, a task
    claimable again at once after its attempt ends (RETRY_AT_ONCE)."""
    kv = EtcdKV.connect([etcd.endpoint], timeout=5.0)
    limits = ClaimLimits(
        min_ttl=1,
        reconcile_timeout=RECONCILE_TIMEOUT,
        reconcile_handoffs=0,
        retry=helpers.RETRY_AT_ONCE,
    )
    store = Store.open(kv, keys=Keyspace(prefix), limits=limits, scan_interval=0.1, metrics=metrics)
    store.start()
    try:
        yield store
    finally:
        store.close()
        kv.close()


def claim(worker: worker_pb2_grpc.WorkerServiceStub, tasks: Any) -> worker_pb2.ClaimResponse:
    tasks.CreateTask(
        tasks_pb2.CreateTaskRequest(task_id="t-1", input=INPUT, input_digest=digest_of(INPUT)),
        metadata=who("pm", "pm"),
    )
    claimed = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=1, ttl_seconds=30), metadata=A
    )
    assert claimed.outcome == types_pb2.OUTCOME_CLAIMED, claimed.message
    return claimed


def prepare(worker: worker_pb2_grpc.WorkerServiceStub, claimed: worker_pb2.ClaimResponse) -> str:
    prepared = worker.PrepareEffect(
        worker_pb2.PrepareEffectRequest(
            fence=claimed.fence, node_id="notify", effect_slot="email", payload_digest=X
        ),
        metadata=A,
    )
    assert prepared.action == types_pb2.EFFECT_ACTION_EXECUTE
    return prepared.effect_id


def record_unknown(
    worker: worker_pb2_grpc.WorkerServiceStub, claimed: worker_pb2.ClaimResponse, eid: str
) -> worker_pb2.RecordEffectResponse:
    recorded = worker.RecordEffect(
        worker_pb2.RecordEffectRequest(
            fence=claimed.fence, effect_id=eid, state=types_pb2.EFFECT_STATE_UNKNOWN
        ),
        metadata=A,
    )
    assert recorded.outcome == types_pb2.OUTCOME_OK, recorded.message
    return recorded


def task_events(etcd_client: Any, prefix: str) -> list[EventRecord]:
    found = sorted(etcd_client.get_prefix(Keyspace(prefix).events_prefix("t-1")), key=_key)
    return [decode(EventRecord, value) for value, _ in found]


def _key(item: tuple[bytes, Any]) -> bytes:
    return bytes(item[1].key)


def test_polling_workers_get_nothing_until_the_deadline_escalates_the_task(
    worker: worker_pb2_grpc.WorkerServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    store: Store,
    etcd_client: Any,
    prefix: str,
) -> None:
    claimed = claim(worker, tasks)
    eid = prepare(worker, claimed)
    recorded = record_unknown(worker, claimed, eid).effect
    assert (recorded.reconcile_owner, recorded.reconcile_open) == ("worker-a", True)
    assert recorded.reconcile_owner_attempt_id == claimed.fence.attempt_id
    assert recorded.reconcile_escalation == "NEEDS_APPROVAL"
    window = recorded.reconcile_deadline.ToMilliseconds() - (
        recorded.reconcile_opened_at.ToMilliseconds()
    )
    assert window == RECONCILE_TIMEOUT * 1000
    got = worker.GetEffect(worker_pb2.GetEffectRequest(effect_id=eid), metadata=A).effect
    assert got == recorded
    worker.Release(worker_pb2.ReleaseRequest(fence=claimed.fence, reason="timeout"), metadata=A)
    before = escalations(store, "sweeper")

    # Three workers poll ClaimNext until the task has escalated.
    stop = threading.Event()
    answers: list[int] = []
    lock = threading.Lock()

    def poll(name: str) -> None:
        request = worker_pb2.ClaimNextRequest(queue="default", scheduler_epoch=1, ttl_seconds=30)
        while not stop.is_set():
            outcome = worker.ClaimNext(request, metadata=who(name)).outcome
            with lock:
                answers.append(outcome)
            stop.wait(0.02)

    pollers = [threading.Thread(target=poll, args=(f"poller-{n}",)) for n in range(3)]
    for t in pollers:
        t.start()
    try:
        eventually(
            lambda: (
                tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t-1"), metadata=A).task.state
                == types_pb2.TASK_STATE_NEEDS_APPROVAL
            ),
            timeout=15,
            message="the reconciliation never escalated",
        )
    finally:
        stop.set()
        for t in pollers:
            t.join(timeout=10)

    assert len(answers) >= 30  # they really polled through the window (2 s, every 20 ms)
    assert set(answers) == {types_pb2.OUTCOME_NO_READY_TASK}
    history = task_events(etcd_client, prefix)
    assert [e.op for e in history].count(Op.CLAIM) == 1  # worker-a's, before UNKNOWN
    (escalated,) = [e for e in history if e.op is Op.ESCALATE_RECONCILE]
    assert (escalated.from_state, escalated.to_state) == (
        TaskState.READY,
        TaskState.NEEDS_APPROVAL,
    )
    assert eid in escalated.detail and "deadline" in escalated.detail
    assert escalations(store, "sweeper") - before == 1
    after = worker.GetEffect(worker_pb2.GetEffectRequest(effect_id=eid), metadata=A).effect
    assert after.reconcile_open is False and after.HasField("reconcile_escalated_at")
    assert after.state == types_pb2.EFFECT_STATE_UNKNOWN


def test_the_owner_resolves_over_the_wire(
    worker: worker_pb2_grpc.WorkerServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    etcd_client: Any,
    prefix: str,
) -> None:
    claimed = claim(worker, tasks)
    eid = prepare(worker, claimed)
    record_unknown(worker, claimed, eid)
    worker.Release(worker_pb2.ReleaseRequest(fence=claimed.fence), metadata=A)
    refused = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=1, ttl_seconds=30), metadata=B
    )
    assert refused.outcome == types_pb2.OUTCOME_RECONCILING and "worker-a" in refused.message
    resolved = worker.ResolveEffect(
        worker_pb2.ResolveEffectRequest(
            effect_id=eid,
            resolution=types_pb2.EFFECT_STATE_COMMITTED,
            external_ref="msg-1",
            reason="found it",
        ),
        metadata=(*A, (request_ids.METADATA_KEY, "resolve-1")),
    ).effect
    assert (resolved.state, resolved.external_ref, resolved.reconcile_open) == (
        types_pb2.EFFECT_STATE_COMMITTED,
        "msg-1",
        False,
    )
    # The resolution carries the request id of its call (the chaos checker settles by it).
    value, _ = etcd_client.get(Keyspace(prefix).effect(eid))
    assert decode(EffectRecord, value).request_id == "resolve-1"
    taken = worker.ClaimNext(
        worker_pb2.ClaimNextRequest(queue="default", scheduler_epoch=1, ttl_seconds=30),
        metadata=B,
    )
    assert taken.outcome == types_pb2.OUTCOME_CLAIMED


# --- bad input ---------------------------------------------------------------------------------


def test_record_effect_refuses_a_bad_reconcile_principal(
    worker: worker_pb2_grpc.WorkerServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    keyspace: Probe,
) -> None:
    claimed = claim(worker, tasks)
    eid = prepare(worker, claimed)

    def request(
        state: types_pb2.EffectState.ValueType, owner: str
    ) -> worker_pb2.RecordEffectRequest:
        return worker_pb2.RecordEffectRequest(
            fence=claimed.fence, effect_id=eid, state=state, reconcile_principal=owner
        )

    for state, owner, message in [
        (types_pb2.EFFECT_STATE_COMMITTED, "bot", "only with state UNKNOWN"),
        (types_pb2.EFFECT_STATE_ABSENT, "bot", "only with state UNKNOWN"),
        (types_pb2.EFFECT_STATE_UNKNOWN, "b" * 129, "1-128 characters"),
        (types_pb2.EFFECT_STATE_UNKNOWN, "bot\n", "1-128 characters"),
        (types_pb2.EFFECT_STATE_UNKNOWN, "mail ops", "1-128 characters"),
    ]:
        refused(
            worker.RecordEffect, request(state, owner), INVALID, "reconcile_principal", keyspace
        )
        refused(worker.RecordEffect, request(state, owner), INVALID, message, keyspace)
    named = worker.RecordEffect(request(types_pb2.EFFECT_STATE_UNKNOWN, "bot"), metadata=A)
    assert (named.effect.reconcile_owner, named.effect.reconcile_named) == ("bot", True)


def test_resolve_effect_refuses_bad_input_and_writes_nothing(
    worker: worker_pb2_grpc.WorkerServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    keyspace: Probe,
) -> None:
    claimed = claim(worker, tasks)
    eid = prepare(worker, claimed)
    record_unknown(worker, claimed, eid)

    def request(**changes: Any) -> worker_pb2.ResolveEffectRequest:
        fields: dict[str, Any] = {
            "effect_id": eid,
            "resolution": types_pb2.EFFECT_STATE_ABSENT,
        }
        fields.update(changes)
        return worker_pb2.ResolveEffectRequest(**fields)

    resolve = worker.ResolveEffect
    refused(resolve, request(effect_id=""), INVALID, "effect_id is required", keyspace)
    refused(resolve, request(effect_id="eff-nope"), INVALID, "effect_id must be", keyspace)
    refused(resolve, request(resolution=0), INVALID, "resolution is required", keyspace)
    refused(
        resolve,
        request(resolution=types_pb2.EFFECT_STATE_UNKNOWN),
        INVALID,
        "resolution must be",
        keyspace,
    )
    refused(resolve, request(resolution=99), INVALID, "resolution 99", keyspace)
    refused(
        resolve,
        request(external_ref="r" * (MAX_REF_CHARS + 1)),
        INVALID,
        "external_ref",
        keyspace,
    )
    refused(resolve, request(reason="x" * 100_000), INVALID, "reason", keyspace)
    never = effect_id("t-1", 1, 1, "notify", "never")
    refused(resolve, request(effect_id=never), grpc.StatusCode.NOT_FOUND, never, keyspace)
    # While worker-a holds the claim, it reconciles with RecordEffect, behind the fence.
    refused(resolve, request(), PRECONDITION, "live claim", keyspace, metadata=OPS)
    worker.Release(worker_pb2.ReleaseRequest(fence=claimed.fence), metadata=A)
    # Neither another worker nor a pm may resolve it (the store's owner check; the role table).
    refused(resolve, request(), DENIED, "worker-a", keyspace, metadata=B)
    refused(resolve, request(), DENIED, "ResolveEffect", keyspace, metadata=who("pm-1", "pm"))
    # An admin may.
    done = resolve(request(reason="checked the log"), metadata=OPS).effect
    assert done.state == types_pb2.EFFECT_STATE_ABSENT
    # And a settled effect is not resolved twice.
    refused(resolve, request(), PRECONDITION, "nothing to resolve", keyspace, metadata=OPS)
