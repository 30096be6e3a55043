"""ListClaims over real gRPC: each live claim with its holder, fence, progress marker and its
lease as etcd reports it (LeaseTimeToLive), a page at a time, a queue's only, and bad input
refused with the field named and nothing written."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from coordinator.domain.decisions import PROGRESS_WRITE_INTERVAL
from coordinator.server import PRINCIPAL_METADATA_KEY
from coordinator.store.claims import live_claims
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from tests import helpers
from tests.helpers import Probe, eventually

WORKER_A = ((PRINCIPAL_METADATA_KEY, "worker-a"),)


def _seconds(ts: Any) -> float:
    return float(ts.ToNanoseconds()) / 1e9


def _list(tasks: tasks_pb2_grpc.TaskServiceStub, **fields: Any) -> tasks_pb2.ListClaimsResponse:
    return tasks.ListClaims(tasks_pb2.ListClaimsRequest(**fields))


def _claim(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    task_id: str,
    queue: str = "default",
) -> worker_pb2.ClaimResponse:
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id=task_id, queue=queue, input=b"in"))
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch
    request = worker_pb2.ClaimRequest(task_id=task_id, scheduler_epoch=epoch, ttl_seconds=30)
    claim = worker.Claim(request, metadata=WORKER_A)
    assert claim.outcome == types_pb2.OUTCOME_CLAIMED, claim.message
    return claim


def _renew(
    worker: worker_pb2_grpc.WorkerServiceStub, claim: worker_pb2.ClaimResponse, progress: str
) -> None:
    request = worker_pb2.RenewRequest(fence=claim.fence, progress=progress)
    assert worker.Renew(request, metadata=WORKER_A).outcome == types_pb2.OUTCOME_OK


def test_a_live_claim_is_listed_with_its_fence_and_the_lease_etcd_reports(
    claimed: worker_pb2.ClaimResponse,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    etcd_client: Any,
    prefix: str,
) -> None:
    reply = _list(tasks)
    (live,) = reply.claims
    fence = claimed.fence
    assert (live.task_id, live.queue, live.owner_id, live.attempt) == (
        "t-1",
        "default",
        "worker-a",
        1,
    )
    assert (live.attempt_id, live.claim_generation, live.scheduler_epoch) == (
        fence.attempt_id,
        fence.claim_generation,
        fence.scheduler_epoch,
    )
    assert reply.next_page_token == ""
    # The lease is the claim key's, read from etcd: never longer-lived than etcd says now.
    _, meta = etcd_client.get(f"{prefix}/claims/t-1")
    assert live.lease_id == meta.lease_id
    etcd_now = etcd_client.get_lease_info(live.lease_id)
    assert live.lease_granted_seconds == etcd_now.grantedTTL == 30
    assert etcd_now.TTL <= live.lease_remaining_seconds <= 30
    read_at = _seconds(reply.read_at)
    assert _seconds(live.lease_expires_at) == pytest.approx(read_at + live.lease_remaining_seconds)
    assert _seconds(live.lease_refreshed_at) == pytest.approx(
        read_at - (30 - live.lease_remaining_seconds)
    )
    # Granted for the claim and never renewed: the last refresh is the grant, before the claim.
    assert not live.renewed
    assert _seconds(live.lease_refreshed_at) <= _seconds(live.claimed_at)
    assert (live.progress, live.progress_at) == ("", live.claimed_at)
    assert _seconds(live.renew_limit_at) > _seconds(live.claimed_at)


def test_a_renewal_shows_as_a_later_refresh_and_its_progress_marker_as_moved(
    claimed: worker_pb2.ClaimResponse,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    # The server writes a marker at most every 5 s (PROGRESS_WRITE_INTERVAL): from then on
    # after the claim, a renewal carrying one shows it.
    def moved() -> tasks_pb2.LiveClaim | None:
        _renew(worker, claimed, "step-1")
        (now,) = _list(tasks).claims
        return now if now.progress == "step-1" else None

    live = eventually(moved, timeout=20)
    assert _seconds(live.progress_at) >= _seconds(live.claimed_at) + PROGRESS_WRITE_INTERVAL - 1

    # etcd counts whole seconds: renew until a refresh lands a second past the claim.
    def renewed() -> tasks_pb2.LiveClaim | None:
        _renew(worker, claimed, "step-1")
        (now,) = _list(tasks).claims
        return now if now.renewed else None

    live = eventually(renewed, timeout=10)
    assert _seconds(live.lease_refreshed_at) > _seconds(live.claimed_at)
    assert live.progress == "step-1"


def test_pages_in_task_order_filter_by_queue_and_drop_ended_claims(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
) -> None:
    claims = {
        t: _claim(tasks, worker, admin, t, q) for t, q in [("a", "x"), ("b", "y"), ("c", "x")]
    }
    first = _list(tasks, page_size=2)
    assert [c.task_id for c in first.claims] == ["a", "b"]
    assert helpers.resumes_at(first.next_page_token) == "b"
    second = _list(tasks, page_size=2, page_token=first.next_page_token)
    assert ([c.task_id for c in second.claims], second.next_page_token) == (["c"], "")
    of_x = _list(tasks, queue="x")
    assert [c.task_id for c in of_x.claims] == ["a", "c"]

    release = worker_pb2.ReleaseRequest(fence=claims["a"].fence)
    assert worker.Release(release, metadata=WORKER_A).outcome == types_pb2.OUTCOME_OK
    assert [c.task_id for c in _list(tasks).claims] == ["b", "c"]


def test_a_claim_whose_lease_is_gone_is_not_live(
    claimed: worker_pb2.ClaimResponse, tasks: tasks_pb2_grpc.TaskServiceStub, etcd_client: Any
) -> None:
    (live,) = _list(tasks).claims
    etcd_client.revoke_lease(live.lease_id)
    assert list(_list(tasks).claims) == []


def test_a_filtered_scan_stops_at_its_bound_with_a_token_to_go_on(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for task_id, queue in [("a", "x"), ("b", "x"), ("c", "y")]:
        _claim(tasks, worker, admin, task_id, queue)
    monkeypatch.setattr(live_claims, "MAX_SCANNED", 2)
    short = _list(tasks, queue="y")
    assert (list(short.claims), helpers.resumes_at(short.next_page_token)) == ([], "b")
    rest = _list(tasks, queue="y", page_token=short.next_page_token)
    assert ([c.task_id for c in rest.claims], rest.next_page_token) == (["c"], "")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"page_size": 101}, "page_size"),
        ({"page_size": -1}, "page_size"),
        ({"queue": "no spaces"}, "queue"),
        ({"page_token": "not a task id"}, "page_token"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(
    claimed: worker_pb2.ClaimResponse,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    keyspace: Probe,
    fields: dict[str, Any],
    named: str,
) -> None:
    helpers.refused(
        tasks.ListClaims,
        tasks_pb2.ListClaimsRequest(**fields),
        grpc.StatusCode.INVALID_ARGUMENT,
        named,
        keyspace,
    )
