"""Idempotency keys on every mutating RPC, through a real gRPC channel: a retried business
command creates no duplicate work."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from coordinator.clock import ManualClock
from coordinator.domain.digests import digest_of
from coordinator.domain.idempotency import KeyedClaims
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import decode
from coordinator.errors import ResourceExhausted
from coordinator.server import build_server
from coordinator.server.interceptors.idempotency import READ_ONLY, is_mutating
from coordinator.server.status import status_code_of
from coordinator.store import Store
from coordinator.store.control.idempotency import MIN_KEPT, IdempotencyStore, Reservation
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
from tests.helpers import eventually
from tests.lifecycle.conftest import StoreFactory
from tests.lifecycle.support import LIMITS, RESULT, snapshot, who

PM = who("pm-1", key="create-csv-export")


def _create(tasks: tasks_pb2_grpc.TaskServiceStub, metadata: Any, **fields: Any) -> Any:
    request = tasks_pb2.CreateTaskRequest(input=b"export the report as CSV", **fields)
    return tasks.CreateTask(request, metadata=metadata)


def _task_ids(tasks: tasks_pb2_grpc.TaskServiceStub) -> list[str]:
    listed = tasks.ListTasks(tasks_pb2.ListTasksRequest(), metadata=who("pm-1"))
    return [t.task_id for t in listed.tasks]


def test_retried_business_command_creates_no_duplicate_work(
    tasks: tasks_pb2_grpc.TaskServiceStub, store: Store, etcd_client: Any
) -> None:
    first = _create(tasks, PM)  # the id is generated: a blind retry would make a second task
    before = snapshot(store, etcd_client)
    again = _create(tasks, PM)
    assert again == first
    assert snapshot(store, etcd_client) == before  # no second write of any kind
    assert _task_ids(tasks) == [first.task.task_id]
    stored = etcd_client.get(store.ctx.keys.idem("pm-1", "create-csv-export"))
    assert stored[1] is not None and stored[1].lease_id != 0  # kept on a lease: it expires


def test_same_key_with_a_different_request_is_already_exists(
    tasks: tasks_pb2_grpc.TaskServiceStub, store: Store, etcd_client: Any
) -> None:
    _create(tasks, PM)
    before = snapshot(store, etcd_client)
    with pytest.raises(grpc.RpcError) as refused:
        _create(tasks, PM, priority=5)
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "idempotency key 'create-csv-export' was already used for a different" in (
        refused.value.details() or ""
    )
    with pytest.raises(grpc.RpcError) as other_method:
        tasks.CancelTask(tasks_pb2.CancelTaskRequest(task_id="x"), metadata=PM)
    assert other_method.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "already used for /coordinator.v1.TaskService/CreateTask" in (
        other_method.value.details() or ""
    )
    assert snapshot(store, etcd_client) == before


def test_keys_are_scoped_to_the_calling_principal(tasks: tasks_pb2_grpc.TaskServiceStub) -> None:
    a = _create(tasks, who("pm-a", key="k1"), task_id="from-a")
    b = _create(tasks, who("pm-b", key="k1"), task_id="from-b")
    assert (a.task.task_id, b.task.task_id) == ("from-a", "from-b")
    assert _task_ids(tasks) == ["from-a", "from-b"]


def test_errors_are_not_stored_so_a_corrected_retry_runs(
    tasks: tasks_pb2_grpc.TaskServiceStub, store: Store, etcd_client: Any
) -> None:
    metadata = who("pm-1", key="k-dep")
    for _ in range(2):  # the same failing request runs (and fails) again: nothing was stored
        with pytest.raises(grpc.RpcError) as refused:
            _create(tasks, metadata, task_id="qa", depends_on=["dev"])
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert etcd_client.get(store.ctx.keys.idem("pm-1", "k-dep"))[1] is None
    fixed = _create(tasks, metadata, task_id="qa")
    assert fixed.task.state == types_pb2.TASK_STATE_READY


def test_business_outcomes_are_stored_and_replayed(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
) -> None:
    _create(tasks, who("pm-1"), task_id="t")
    claim = worker_pb2.ClaimRequest(task_id="t", scheduler_epoch=1, ttl_seconds=30)
    won = worker.Claim(claim, metadata=who("w1", key="claim-t"))
    assert won.outcome == types_pb2.OUTCOME_CLAIMED
    # The response was lost; the retry gets the same credential, not ALREADY_CLAIMED.
    assert worker.Claim(claim, metadata=who("w1", key="claim-t")) == won
    lost = worker.Claim(claim, metadata=who("w2", key="claim-t2"))
    assert lost.outcome == types_pb2.OUTCOME_ALREADY_CLAIMED
    released = worker.Release(
        worker_pb2.ReleaseRequest(fence=won.fence), metadata=who("w1", key="release-t")
    )
    assert released.outcome == types_pb2.OUTCOME_OK
    # w2's retry is answered with its stored outcome: it does not silently claim now.
    assert worker.Claim(claim, metadata=who("w2", key="claim-t2")) == lost
    assert store.tasks.get("t").attempt == 1


def _kept_for(etcd_client: Any, etcd_key: str) -> int:
    """The granted TTL of the lease a stored response lives on."""
    lease = etcd_client.get(etcd_key)[1].lease_id
    return int(etcd_client.get_lease_info(lease).grantedTTL)


def test_a_keyed_claim_batch_is_replayed_whole_and_kept_only_as_long_as_a_lease(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    etcd_client: Any,
) -> None:
    for name in ("b0", "b1", "b2", "b3"):
        _create(tasks, who("pm-1"), task_id=name, queue="batch")
    poll = worker_pb2.ClaimNextRequest(
        queue="batch", scheduler_epoch=1, ttl_seconds=30, wait_seconds=5, max_tasks=2
    )
    keyed = who("w1", key="poll-1")
    won = worker.ClaimNext(poll, metadata=keyed)
    assert [won.outcome, *(m.outcome for m in won.more_claims)] == [types_pb2.OUTCOME_CLAIMED] * 2
    before = snapshot(store, etcd_client)
    # Its answer was lost: the retry gets both claims again, and nothing is written.
    assert worker.ClaimNext(poll, metadata=keyed) == won
    assert snapshot(store, etcd_client) == before
    # A commit that claims the next task is a claim too; a plain commit is not.
    commit = worker_pb2.CommitRequest(
        fence=won.fence,
        input_digest=won.input_digest,
        result_digest=digest_of(RESULT),
        result=RESULT,
        next=worker_pb2.ClaimNextRequest(queue="batch", scheduler_epoch=1, ttl_seconds=30),
    )
    committed = worker.Commit(commit, metadata=who("w1", key="commit-next"))
    assert committed.next.outcome == types_pb2.OUTCOME_CLAIMED
    # A commit with next keys its claims itself: the retry commits again (COMMITTED, saying
    # so, nothing written) and gets the next claim as first answered.
    before = snapshot(store, etcd_client)
    again = worker.Commit(commit, metadata=who("w1", key="commit-next"))
    assert snapshot(store, etcd_client) == before
    assert again.message == "already committed by this attempt"
    again.message = committed.message
    assert again == committed
    plain = worker_pb2.CommitRequest(
        fence=won.more_claims[0].fence,
        input_digest=won.more_claims[0].input_digest,
        result_digest=digest_of(RESULT),
        result=RESULT,
    )
    worker.Commit(plain, metadata=who("w1", key="commit-plain"))
    tried = {name: store.tasks.get(name).attempt for name in ("b0", "b1", "b2", "b3")}
    assert sorted(tried.values()) == [0, 1, 1, 1]  # one attempt per claim handed out
    # A replay is worth something only while the lease it granted can live (LIMITS.max_ttl,
    # plus the lease window's second or two); other answers are kept idempotency_ttl.
    longest = LIMITS.max_ttl + 2
    keys = store.ctx.keys
    assert _kept_for(etcd_client, keys.keyed_claims("w1", "poll-1")) <= longest
    assert _kept_for(etcd_client, keys.keyed_claims("w1", "commit-next")) <= longest
    assert _kept_for(etcd_client, keys.idem("w1", "commit-plain")) > 24 * 3600


def test_a_keyed_batch_of_large_inputs_is_replayed_from_its_claims_not_a_stored_copy(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    etcd_client: Any,
) -> None:
    # Eight inputs of 250 kB: a copy of the answer would be past what etcd takes in one request.
    for n in range(8):
        request = tasks_pb2.CreateTaskRequest(task_id=f"big{n}", queue="big", input=b"x" * 250_000)
        tasks.CreateTask(request, metadata=who("pm-1"))
    poll = worker_pb2.ClaimNextRequest(queue="big", scheduler_epoch=1, ttl_seconds=30, max_tasks=8)
    won = worker.ClaimNext(poll, metadata=who("w1", key="big-batch"))
    assert len(won.more_claims) == 7
    # The key's record names the eight claims, not their inputs.
    kept = etcd_client.get(store.ctx.keys.keyed_claims("w1", "big-batch"))[0]
    record = decode(KeyedClaims, kept)
    assert len(kept) < 2_000
    assert sorted(record.task_ids) == [f"big{n}" for n in range(8)]
    before = snapshot(store, etcd_client)
    assert worker.ClaimNext(poll, metadata=who("w1", key="big-batch")) == won
    assert snapshot(store, etcd_client) == before


def test_a_keyed_claim_keeps_its_answer_without_the_input_and_replays_it_whole(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    store: Store,
    etcd_client: Any,
) -> None:
    """Kept whole, each keyed Claim stored its task's input again (250 kB here), uncharged: one
    worker minting a key per claim stored 244 MiB of answers in 15 s. A replay reads the input
    back; once the task's input changed, it answers without one rather than the wrong one."""
    data = b"x" * 250_000
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="big", input=data), metadata=who("pm-1"))
    claim = worker_pb2.ClaimRequest(task_id="big", scheduler_epoch=1, ttl_seconds=30)
    won = worker.Claim(claim, metadata=who("w1", key="claim-big"))
    assert (won.outcome, won.input) == (types_pb2.OUTCOME_CLAIMED, data)
    [(kept, _)] = etcd_client.get_prefix(store.ctx.keys.idem("w1", "", claims=True))
    assert len(kept) < 2_000
    before = snapshot(store, etcd_client)
    assert worker.Claim(claim, metadata=who("w1", key="claim-big")) == won
    assert snapshot(store, etcd_client) == before
    etcd_client.put(store.ctx.keys.input("big"), b"changed by hand")  # digest no longer matches
    replay = worker.Claim(claim, metadata=who("w1", key="claim-big"))
    assert (replay.fence, replay.input_digest, replay.input) == (won.fence, won.input_digest, b"")


def test_concurrent_duplicates_execute_once(
    tasks: tasks_pb2_grpc.TaskServiceStub, store: Store
) -> None:
    barrier = threading.Barrier(8)
    answers: list[Any] = []

    def send() -> None:
        barrier.wait()
        try:
            answers.append(_create(tasks, who("pm-1", key="burst")).task.task_id)
        except grpc.RpcError as exc:
            answers.append(exc.code())

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    created = _task_ids(tasks)
    assert len(created) == 1
    # Every duplicate got the stored response, or ABORTED (still in flight): never a 2nd task.
    assert set(answers) <= {created[0], grpc.StatusCode.ABORTED}
    assert answers.count(created[0]) >= 1


@pytest.mark.parametrize(
    ("name", "call"),
    [
        (
            "BumpEpoch",
            lambda s: s["admin"].BumpEpoch(admin_pb2.BumpEpochRequest(), metadata=s["md"]),
        ),
        (
            "CancelTask",
            lambda s: s["tasks"].CancelTask(
                tasks_pb2.CancelTaskRequest(task_id="t", reason="dropped"), metadata=s["md"]
            ),
        ),
        (
            "UpdateInput",
            lambda s: s["tasks"].UpdateInput(
                tasks_pb2.UpdateInputRequest(task_id="t", input=b"new"), metadata=s["md"]
            ),
        ),
        (
            "SetDependencies",
            lambda s: s["tasks"].SetDependencies(
                tasks_pb2.SetDependenciesRequest(task_id="t", depends_on=["u"]), metadata=s["md"]
            ),
        ),
        (
            "PauseClaims",
            lambda s: s["admin"].PauseClaims(admin_pb2.PauseClaimsRequest(), metadata=s["md"]),
        ),
    ],
)
def test_a_keyed_mutating_call_runs_once(
    name: str,
    call: Callable[[dict[str, Any]], Any],
    tasks: tasks_pb2_grpc.TaskServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    store: Store,
    etcd_client: Any,
) -> None:
    _create(tasks, who("admin-1"), task_id="t")
    _create(tasks, who("admin-1"), task_id="u")
    stubs = {"tasks": tasks, "admin": admin, "md": who("admin-1", key=f"once-{name}")}
    first = call(stubs)
    before = snapshot(store, etcd_client)
    assert call(stubs) == first
    assert snapshot(store, etcd_client) == before
    assert store.admin.epoch() == (2 if name == "BumpEpoch" else 1)


def test_a_malformed_key_is_refused(tasks: tasks_pb2_grpc.TaskServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        _create(tasks, who("pm-1", key="has space"), task_id="t")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "idempotency-key must be 1-128 characters" in (refused.value.details() or "")
    assert _task_ids(tasks) == []


def test_stored_responses_expire_after_the_configured_ttl(
    make_store: StoreFactory, etcd_client: Any, prefix: str
) -> None:
    store = make_store(idempotency_ttl=2.0)
    server, port = build_server(store, listen="127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            stub = tasks_pb2_grpc.TaskServiceStub(channel)
            _create(stub, who("pm-1", key="short"), task_id="t1")
            key = Keyspace(prefix).idem("pm-1", "short")
            lease = etcd_client.get(key)[1].lease_id
            assert 2 <= etcd_client.get_lease_info(lease).grantedTTL <= 5
            eventually(lambda: etcd_client.get(key)[1] is None, timeout=10)
            # Expired: the key is free for a new request.
            assert _create(stub, who("pm-1", key="short"), task_id="t2").task.task_id == "t2"
    finally:
        server.stop(None)


def _methods() -> set[str]:
    from coordinator.v1 import admin_pb2 as a
    from coordinator.v1 import tasks_pb2 as t
    from coordinator.v1 import worker_pb2 as w

    found = set()
    for module in (a, t, w):
        for service in module.DESCRIPTOR.services_by_name.values():
            found |= {f"/{service.full_name}/{m.name}" for m in service.methods}
    return found


def test_every_mutating_rpc_takes_idempotency_keys() -> None:
    methods = _methods()
    assert methods >= READ_ONLY  # no stale or misspelt entry
    reads = {m for m in methods if m.rsplit("/", 1)[1].startswith(("Get", "List", "Watch"))}
    assert reads | {"/coordinator.v1.AdminService/DrainStatus"} == READ_ONLY
    mutating = {m for m in methods if is_mutating(m)}
    assert mutating == methods - READ_ONLY
    assert "/coordinator.v1.TaskService/Accept" in mutating
    assert "/coordinator.v1.WorkerService/Commit" in mutating


def test_a_principal_holds_a_bounded_number_of_keys_its_oldest_making_room(
    store: Store,
) -> None:
    """Past the bound the oldest keys make room once they are MIN_KEPT old: refusing stopped a
    steady producer that keys its creates for a day after its 10,000th create."""
    clock = ManualClock()
    keys = IdempotencyStore(dataclasses.replace(store.ctx, clock=clock), max_keys=3)
    for n in range(3):
        reserved = keys.reserve("pm-1", f"k{n}", method="/m", digest=f"d{n}")
        assert isinstance(reserved, Reservation)
        assert keys.complete(reserved, b"response")
        clock.advance(1)
    with pytest.raises(ResourceExhausted) as refused:
        keys.reserve("pm-1", "k3", method="/m", digest="d3")
    assert str(refused.value) == (
        "principal 'pm-1' holds 3 idempotency keys, the limit, and none of its oldest is 10 "
        "minutes old yet (older ones make room for new ones); reuse a key only for a retry, "
        "send this request without one, or retry in a few minutes"
    )
    assert status_code_of(refused.value) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert store.ctx.kv.get(store.ctx.keys.idem("pm-1", "k3")) is None  # nothing written
    # A retry under a held key still replays, and another principal has its own bound.
    assert keys.reserve("pm-1", "k0", method="/m", digest="d0") == b"response"
    assert isinstance(keys.reserve("pm-2", "k0", method="/m", digest="d0"), Reservation)

    clock.advance(MIN_KEPT - 2)  # k0 is MIN_KEPT old, the others not yet
    assert isinstance(keys.reserve("pm-1", "k3", method="/m", digest="d3"), Reservation)
    held = [n for n in range(4) if store.ctx.kv.get(store.ctx.keys.idem("pm-1", f"k{n}"))]
    assert held == [1, 2, 3]  # the oldest went, only it


def test_claim_calls_keys_live_apart_and_never_count_against_the_bound(store: Store) -> None:
    """A pool sharing one token keys every claim (the SDK): those keys expire with a lease and
    must not use up the principal's bound, or its creates would be refused."""
    keys = IdempotencyStore(store.ctx, max_keys=2)
    for n in range(5):
        reserved = keys.reserve("pool", f"c{n}", method="/claim", digest=f"d{n}", claims=True)
        assert isinstance(reserved, Reservation)
        assert keys.complete(reserved, b"claimed", claims=True)
    for n in range(2):
        assert isinstance(keys.reserve("pool", f"k{n}", method="/m", digest=f"e{n}"), Reservation)
    with pytest.raises(ResourceExhausted):
        keys.reserve("pool", "k2", method="/m", digest="e2")
    assert store.ctx.kv.get(store.ctx.keys.idem("pool", "c0", claims=True)) is not None
    assert keys.reserve("pool", "c0", method="/claim", digest="d0", claims=True) == b"claimed"
