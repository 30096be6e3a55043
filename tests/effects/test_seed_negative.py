"""The seed's negative test, with real processes.

Worker A (a real ``coordinator.demo.worker`` process) claims the task and sends payload X
through the outbox (a real ``coordinator.demo.outbox`` process). The outbox performs the call and
never answers (the response is lost), and A is SIGKILLed right then: it never records anything,
the effect stays PREPARED. Worker B takes the task over and drafts payload Y for the same slot.
B must get PAYLOAD_CONFLICT with X's digest, reconcile X by its key, and the outbox must have
performed that key exactly once: zero second calls.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import timedelta

import grpc
import pytest

from coordinator.demo.outbox import OutboxProcess
from coordinator.demo.worker import EFFECT_NODE, EFFECT_SLOT, WorkerProcess, effect_payload
from coordinator.domain.digests import digest_of
from coordinator.etcd_process import EtcdProcess
from coordinator.fence_wire import fence_to_proto
from coordinator.sdk import Claim, EffectState, EffectStatus, HttpDownstream, TaskState
from coordinator.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.sdk.support import QUEUE, Served, served

pytestmark = pytest.mark.slow

X, Y = effect_payload("t1", "A"), effect_payload("t1", "B")


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    with served(etcd.endpoint, prefix) as running, running.client("pm") as pm:
        pm.create_task("t1", input=b"input", queue=QUEUE)
        yield running


def test_a_lost_response_is_reconciled_and_never_sent_twice(coordinator: Served) -> None:
    key = coordinator.effect_id("t1", EFFECT_NODE, EFFECT_SLOT)
    with OutboxProcess() as outbox:
        outbox.drop(next=1, mode="hang")  # performed, then the answer never comes
        worker_a = WorkerProcess("A", coordinator.target, queue=QUEUE, ttl=1, outbox=outbox.url)
        worker_a.start()
        try:
            eventually(lambda: outbox.performed(key) == 1, timeout=20, message="A never sent")
            worker_a.signal(signal.SIGKILL)  # right after the downstream performed the call
            worker_a.proc.wait(timeout=10)
        finally:
            worker_a.stop()
        claim_a = worker_a.wait_for("claim", timeout=1, task="t1")
        assert claim_a is not None
        assert worker_a.wait_for("effect", timeout=0) is None  # A never learnt the answer

        with coordinator.client("B") as b:
            effect = b.get_effect(key)
            assert (effect.state, effect.payload_digest) == (EffectState.PREPARED, digest_of(X))
            assert effect.prepared_generation == claim_a["generation"]

            def claim_b() -> Claim | None:
                claim = b.claim("t1", ttl=timedelta(seconds=30))
                return claim if isinstance(claim, Claim) else None

            job_b = eventually(claim_b, timeout=15, message="A's lease never expired")
            # On the wire: B's draft Y conflicts, and the answer names X's digest.
            with grpc.insecure_channel(coordinator.target, options=GRPC_OPTIONS) as channel:
                raw = worker_pb2_grpc.WorkerServiceStub(channel).PrepareEffect(
                    worker_pb2.PrepareEffectRequest(
                        fence=fence_to_proto(job_b.fence),
                        node_id=EFFECT_NODE,
                        effect_slot=EFFECT_SLOT,
                        payload_digest=digest_of(Y),
                    ),
                    metadata=(("x-coordinator-principal", "B"),),
                )
            assert raw.outcome == types_pb2.OUTCOME_PAYLOAD_CONFLICT
            assert raw.effect.payload_digest == digest_of(X)
            assert raw.action == types_pb2.EFFECT_ACTION_RECONCILE
            assert raw.effect_id == key

            # The SDK does the same and reconciles X instead of sending Y.
            with job_b:
                outcome = job_b.effect(EFFECT_NODE, EFFECT_SLOT, Y, HttpDownstream(outbox.url))
                assert (outcome.status, outcome.conflict, outcome.sent) == (
                    EffectStatus.RECONCILED,
                    True,
                    False,
                )
                assert outcome.payload_digest == digest_of(X)
                assert outcome.external_ref.startswith("msg-")
                assert job_b.commit(b"report by B").committed

            effect = b.get_effect(key)
            assert (effect.state, effect.payload_digest, effect.external_ref) == (
                EffectState.COMMITTED,
                digest_of(X),
                outcome.external_ref,
            )
            assert effect.recorded_generation == job_b.generation > effect.prepared_generation
            assert b.get_task("t1").state is TaskState.DONE

        counts = outbox.counts()
        assert counts["performed"] == {key: 1}  # exactly one performed call, ever
        assert counts["calls"] == {key: 1}  # and zero second calls
        assert counts["lookups"] == {key: 1}
