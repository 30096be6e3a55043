"""A replica's shutdown: the first SIGTERM or SIGINT lets open calls run out their grace; a
second one cancels them now. An operator's Ctrl-C on `up` with a follow stream open once waited
out the whole grace, told only by a JSON line. A long poll waiting then answers at once without
a task: one it won in the grace would go to a worker whose renewals the replica refuses."""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import grpc

from coordinator.etcd_process import EtcdProcess
from coordinator.server.app import SOONER
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.test_cli import Process, _records, _wait_for_log, processes

__all__ = ["processes"]  # the fixture, used by name


def test_a_second_signal_cancels_the_calls_still_open(
    etcd: EtcdProcess, prefix: str, tmp_path: Path, processes: list[Process]
) -> None:
    serve, address = _serving(etcd, prefix, tmp_path, processes)
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t"))
        follow = tasks.WatchEvents(tasks_pb2.WatchEventsRequest(follow=True), timeout=600)
        assert next(iter(follow)).task_id == "t"  # the stream is open on the server
        serve.proc.send_signal(signal.SIGTERM)
        said = _wait_for_log(serve, "shutting down", "sooner")
        assert said == SOONER
        assert serve.proc.poll() is None  # the follow stream has an hour of grace
        serve.proc.send_signal(signal.SIGINT)
        assert serve.proc.wait(timeout=60) == 0, serve.logs()
        ended = eventually(lambda: _ended(follow), message="the stream was not ended")
    assert ended in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    events = [r.get("event") for r in _records(serve)]
    assert events.index("stopping now: open calls cancelled") < events.index("stopped")


def test_a_waiting_long_poll_answers_without_a_task_as_the_shutdown_starts(
    etcd: EtcdProcess, prefix: str, tmp_path: Path, processes: list[Process]
) -> None:
    serve, address = _serving(etcd, prefix, tmp_path, processes)
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        worker = worker_pb2_grpc.WorkerServiceStub(channel)
        request = worker_pb2.ClaimNextRequest(
            queue="q", scheduler_epoch=1, ttl_seconds=30, wait_seconds=20
        )
        poll = worker.ClaimNext.future(request, timeout=120)
        metrics = _wait_for_log(serve, "serving", "metrics")
        eventually(lambda: _waiting(metrics), message="the long poll never waited")
        serve.proc.send_signal(signal.SIGTERM)
        answer = poll.result()  # not after its 20 s, nor the hour of grace
    assert answer.outcome == types_pb2.OUTCOME_NO_READY_TASK and not answer.HasField("fence")
    assert answer.message == (
        "this coordinator is shutting down: poll queue 'q' again (another answers)"
    )
    assert serve.proc.wait(timeout=60) == 0, serve.logs()


def _waiting(metrics: str) -> bool:
    """Whether the replica's metrics count a long poll waiting."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as page:
        return "coordinator_claim_waiters 1.0" in page.read().decode()


def _serving(
    etcd: EtcdProcess, prefix: str, tmp_path: Path, processes: list[Process]
) -> tuple[Process, str]:
    """`coordinator serve` with an hour of shutdown grace, and the address it serves on."""
    env = {"COORDINATOR_ETCD": etcd.endpoint, "COORDINATOR_PREFIX": prefix}
    env["COORDINATOR_METRICS_LISTEN"] = "127.0.0.1:0"
    args = ["serve", "--listen", "127.0.0.1:0", "--insecure", "--shutdown-grace", "3600"]
    serve = Process(args, tmp_path / "serve.log", env)
    processes.append(serve)
    return serve, _wait_for_log(serve, "serving", "listen")


def _ended(stream: Iterable[tasks_pb2.TaskEvent]) -> grpc.StatusCode:
    """The status the stream ended with (read to its end)."""
    try:
        for _ in stream:
            pass
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK
