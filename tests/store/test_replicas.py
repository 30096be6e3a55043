"""Several coordinator replicas on one keyspace: every decision is an etcd txn, so racing
replicas give exactly the outcomes one replica would."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.digests import digest_of
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import EventRecord, decode
from coordinator.domain.states import Op, Outcome, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.store import EtcdKV, Store, TaskSpec
from coordinator.store.context import attempt_from_kv
from tests.helpers import RETRY_AT_ONCE, eventually

REPLICAS = 3


@pytest.fixture
def replicas(etcd: EtcdProcess, prefix: str) -> Iterator[list[Store]]:
    stores = []
    for _ in range(REPLICAS):
        store = Store.open(
            EtcdKV.connect([etcd.endpoint]),
            keys=Keyspace(prefix),
            limits=ClaimLimits(min_ttl=1, max_ttl=10, retry=RETRY_AT_ONCE),
            scan_interval=0.2,
        )
        store.start()
        stores.append(store)
    yield stores
    for store in stores:
        store.close()


def test_claims_racing_through_three_replicas_grant_one_credential(replicas: list[Store]) -> None:
    replicas[0].tasks.create(TaskSpec(task_id="t"), by="pm")
    outcomes: list[Outcome] = []
    barrier = threading.Barrier(12)

    def claim(i: int) -> None:
        barrier.wait()
        result = replicas[i % REPLICAS].claims.claim("t", principal=f"w{i}", epoch=1, ttl=10)
        outcomes.append(result.verdict.outcome)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counter(outcomes) == {Outcome.CLAIMED: 1, Outcome.ALREADY_CLAIMED: 11}


def test_claim_next_through_replicas_hands_each_task_out_once(replicas: list[Store]) -> None:
    for i in range(30):
        replicas[0].tasks.create(TaskSpec(task_id=f"t{i:02d}", queue="q"), by="pm")
    eventually(lambda: all(r.ready.size("q") == 30 for r in replicas), message="indexes loaded")
    claimed: list[str] = []
    lock = threading.Lock()

    def drain(i: int) -> None:
        while True:
            result = replicas[i % REPLICAS].claims.claim_next(
                "q", principal=f"w{i}", epoch=1, ttl=10
            )
            if result.verdict.outcome is Outcome.NO_READY_TASK:
                return
            assert result.verdict.outcome is Outcome.CLAIMED, result.verdict
            assert result.fence is not None
            with lock:
                claimed.append(result.fence.task_id)

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == [f"t{i:02d}" for i in range(30)]


def test_every_replica_reclaims_but_an_expired_claim_is_reclaimed_once(
    replicas: list[Store], etcd_client: object, prefix: str
) -> None:
    store = replicas[0]
    task = store.tasks.create(TaskSpec(task_id="t", input=b"x"), by="pm")
    first = store.claims.claim("t", principal="w1", epoch=1, ttl=1)
    assert first.fence is not None
    eventually(
        lambda: store.tasks.get("t").state is TaskState.READY, timeout=15, message="reclaimed"
    )
    events = etcd_client.get_prefix(f"{prefix}/events/t/")  # type: ignore[attr-defined]
    ops = [decode(EventRecord, value).op for value, _ in events]
    # Three replicas raced to reclaim; the CAS let exactly one transition through.
    assert ops == [Op.CREATE, Op.CLAIM, Op.RECLAIM]
    second = replicas[1].claims.claim("t", principal="w2", epoch=1, ttl=10)
    assert second.fence is not None
    assert second.fence.claim_generation > first.fence.claim_generation
    late = store.acceptance.commit(
        first.fence,
        principal="w1",
        input_digest=task.input_digest,
        result_digest=digest_of(b"late"),
        result=b"late",
        result_ref="",
    )
    assert (late.verdict.outcome, late.verdict.reason.name) == (Outcome.FENCED, "SUPERSEDED")
    attempt_kv = store.ctx.kv.get(store.ctx.keys.attempt("t", first.fence.attempt_id))
    assert attempt_kv is not None
    assert attempt_from_kv(attempt_kv).end.name == "EXPIRED"
