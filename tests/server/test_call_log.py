"""The call log: one line per call, written by one interceptor, with what the handler bound."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from coordinator.server import PRINCIPAL_METADATA_KEY
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)

AS_WORKER_A = ((PRINCIPAL_METADATA_KEY, "worker-a"),)
RENEW = "/coordinator.v1.WorkerService/Renew"


def _calls(logs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] in ("rpc", "rpc refused")]


def test_an_accepted_renewal_is_one_line_with_the_fence_and_the_verdict(
    worker: worker_pb2_grpc.WorkerServiceStub, claimed: worker_pb2.ClaimResponse
) -> None:
    fence = claimed.fence
    with capture_logs() as logs:
        worker.Renew(
            worker_pb2.RenewRequest(fence=fence, progress="half way"),
            metadata=(*AS_WORKER_A, ("x-request-id", "req-1")),
        )
    (line,) = _calls(logs)
    assert line["event"] == "rpc"
    assert line["log_level"] == "info"
    assert {k: line[k] for k in ("method", "code", "principal", "request_id")} == {
        "method": RENEW,
        "code": "OK",
        "principal": "worker-a",
        "request_id": "req-1",
    }
    assert (line["task_id"], line["attempt"], line["generation"], line["epoch"]) == (
        "t-1",
        fence.attempt_id,
        fence.claim_generation,
        fence.scheduler_epoch,
    )
    assert (line["accepted"], line["outcome"], line["reason"]) == (True, "OK", "NONE")
    assert line["duration_ms"] >= 0
    assert not [e for e in logs if e["event"] not in ("rpc", "rpc refused")], logs


def test_a_claim_line_carries_the_winners_fence(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
) -> None:
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t-2"))
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch
    with capture_logs() as logs:
        claim = worker.Claim(
            worker_pb2.ClaimRequest(task_id="t-2", scheduler_epoch=epoch, ttl_seconds=30),
            metadata=AS_WORKER_A,
        )
    (line,) = _calls(logs)
    assert (line["outcome"], line["attempt"], line["generation"]) == (
        "CLAIMED",
        claim.fence.attempt_id,
        claim.fence.claim_generation,
    )


def test_a_refused_call_is_one_line_with_its_code_and_message(
    worker: worker_pb2_grpc.WorkerServiceStub,
) -> None:
    with capture_logs() as logs, pytest.raises(grpc.RpcError) as raised:
        worker.Renew(worker_pb2.RenewRequest(), metadata=AS_WORKER_A)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    (line,) = _calls(logs)
    assert line["event"] == "rpc refused"
    assert line["log_level"] == "info"  # the caller's fault, not ours
    assert (line["method"], line["code"], line["principal"]) == (
        RENEW,
        "INVALID_ARGUMENT",
        "worker-a",
    )
    assert "fence is required" in line["error"]
    assert "task_id" not in line  # nothing was bound: the request never got that far


def test_one_calls_fields_do_not_reach_the_next_call(
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    claimed: worker_pb2.ClaimResponse,
) -> None:
    with capture_logs() as logs:
        for _ in range(3):  # more calls than one pool thread, fewer than many
            worker.Renew(worker_pb2.RenewRequest(fence=claimed.fence), metadata=AS_WORKER_A)
            admin.GetEpoch(admin_pb2.GetEpochRequest())
    epochs = [e for e in _calls(logs) if e["method"].endswith("/GetEpoch")]
    assert len(epochs) == 3
    for line in epochs:
        assert "task_id" not in line and "outcome" not in line, line


def test_a_stream_is_one_line_when_it_ends(tasks: tasks_pb2_grpc.TaskServiceStub) -> None:
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t-3"))
    with capture_logs() as logs:
        events = list(tasks.WatchEvents(tasks_pb2.WatchEventsRequest(task_id="t-3")))
    assert [e.op for e in events] == ["create"]
    (line,) = _calls(logs)
    assert (line["method"], line["code"]) == ("/coordinator.v1.TaskService/WatchEvents", "OK")


def test_health_checks_are_not_logged(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    with capture_logs() as logs:
        health.Check(health_pb2.HealthCheckRequest(service=""))
    assert _calls(logs) == []
