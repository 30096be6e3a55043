"""The Prometheus endpoint of a real ``coordinator serve`` process, scraped over HTTP while a
scenario runs through a real gRPC channel: every seed figure moves exactly as it must.

The server is a child process with its own registry, but the assertions are still deltas
(scrape before, scrape after), as they would have to be against any long-lived replica.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator import lifeline
from coordinator.domain.digests import digest_of
from coordinator.etcd_process import EtcdProcess
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

COMMAND = [sys.executable, "-c", "from coordinator.cli import main; main()"]
INPUT = b"metrics input"
RESULT = b"metrics result"
WORKER_A = (("x-coordinator-principal", "worker-a"),)
WORKER_B = (("x-coordinator-principal", "worker-b"),)
TASKS = "/coordinator.v1.TaskService/"
WORKER = "/coordinator.v1.WorkerService/"
ADMIN = "/coordinator.v1.AdminService/"
AS_WORKER_ONLY = (("x-coordinator-principal", "worker-a"), ("x-coordinator-roles", "worker"))

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Served:
    """A ``coordinator serve`` child process: its gRPC target and its metrics URL."""

    def __init__(self, etcd: EtcdProcess, prefix: str, log: Path) -> None:
        args = ["serve", "--etcd", etcd.endpoint, "--prefix", prefix, "--insecure"]
        args += ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
        args += ["--min-ttl", "1", "--reclaim-scan-interval", "30"]
        self._log = log
        with log.open("wb") as stderr:
            self.process = subprocess.Popen(
                [*COMMAND, *args], stdout=subprocess.DEVNULL, stderr=stderr, env=dict(os.environ)
            )
            lifeline.kill_with_parent(self.process.pid)  # dies with this test run
        serving = eventually(self._serving, timeout=30, message="serve did not start")
        self.target: str = serving["listen"]
        self.metrics_url = f"http://{serving['metrics']}/metrics"

    def _serving(self) -> dict[str, str] | None:
        if self.process.poll() is not None:  # fail now, not at the deadline
            raise RuntimeError(f"serve exited: {self._log.read_text()}")
        for line in self._log.read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "serving":
                return json.loads(line)  # type: ignore[no-any-return]
        return None

    def scrape(self) -> Samples:
        """Every sample of one scrape, by (name, labels)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.metrics_url, timeout=10) as response:
            text = response.read().decode()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def stop(self) -> None:
        """SIGTERM, and the exit code must be 0."""
        self.process.terminate()
        assert self.process.wait(timeout=30) == 0, self._log.read_text()


@pytest.fixture
def served(etcd: EtcdProcess, prefix: str, tmp_path: Path) -> Iterator[Served]:
    """A serve process on this test's keyspace, stopped (exit 0) afterwards."""
    proc = Served(etcd, prefix, tmp_path / "serve.log")
    try:
        yield proc
    finally:
        if proc.process.poll() is None:
            proc.stop()


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when absent: a labelled counter appears at its first count)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def _commit(fence: types_pb2.Fence) -> worker_pb2.CommitRequest:
    return worker_pb2.CommitRequest(
        fence=fence, input_digest=digest_of(INPUT), result_digest=digest_of(RESULT), result=RESULT
    )


def test_a_fenced_scenario_moves_every_seed_metric(served: Served) -> None:
    before = served.scrape()
    elapsed, ready_to_commit, a_wasted = _paused_worker_scenario(served)
    after = eventually(lambda: _settled(served.scrape()))

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # Claim contention: one ALREADY_CLAIMED among three claim txns.
    assert delta("coordinator_claims_total", outcome="CLAIMED") == 2
    assert delta("coordinator_claims_total", outcome="ALREADY_CLAIMED") == 1
    # Renew failure rate: one OK, one FENCED.
    assert delta("coordinator_renewals_total", outcome="OK") == 1
    assert delta("coordinator_renewals_total", outcome="FENCED") == 1
    # The late commit, with its reason, and nothing else fenced.
    assert delta("coordinator_fenced_commits_total", reason="SUPERSEDED") == 1
    assert (
        sum(
            v - value(before, n, **dict(lb))
            for (n, lb), v in after.items()
            if n == "coordinator_fenced_commits_total"
        )
        == 1
    )
    # Reclaim latency: one reclaim, observed once, quickly (the watch, not the 30 s scan).
    assert delta("coordinator_reclaim_latency_seconds_count") == 1
    assert 0 <= delta("coordinator_reclaim_latency_seconds_sum") < 5
    # Attempts per task: one task final, after 2 attempts.
    assert delta("coordinator_attempts_per_task_count") == 1
    assert delta("coordinator_attempts_per_task_sum") == 2
    # READY -> canonical commit: one observation, covering the expired attempt (> 1 s TTL).
    assert delta("coordinator_ready_to_commit_seconds_count") == 1
    # (kept across the reclaim: measured from the creation, not from the reclaim)
    # The server's wall clock against this process's monotonic one, both ways: under load the
    # two drifted 11 ms apart over this scenario.
    slack = 0.05
    ready_sum = delta("coordinator_ready_to_commit_seconds_sum")
    assert ready_to_commit - slack <= ready_sum <= elapsed + slack
    # Wasted compute: A's attempt, start -> expiry (>= its 1 s lease) plus expiry -> late commit.
    assert a_wasted - slack <= delta("coordinator_wasted_compute_seconds_total") <= elapsed + slack
    # RPC metrics: the unknown task is a NOT_FOUND error; three Claim calls were timed.
    assert delta("coordinator_rpc_errors_total", method=TASKS + "GetTask", code="NOT_FOUND") == 1
    assert delta("coordinator_rpc_duration_seconds_count", method=WORKER + "Claim") == 3
    assert delta("coordinator_rpc_errors_total", method=WORKER + "Commit", code="NOT_FOUND") == 0
    # An authorization refusal is an error of the method it refused.
    assert (
        delta("coordinator_rpc_errors_total", method=ADMIN + "BumpEpoch", code="PERMISSION_DENIED")
        == 1
    )
    # Fence-check coverage stays 100% at every point that accepted something.
    for point in ("claim", "renew", "prepare", "record", "commit"):
        accepted = delta("coordinator_fence_accepted_total", point=point)
        assert accepted >= 1, point
        assert delta("coordinator_fence_validated_total", point=point) == accepted, point


def _settled(samples: Samples) -> Samples | None:
    """The scrape once no lease and no uncertain effect is left (the gauges are cached)."""
    gauges = ("coordinator_active_leases", "coordinator_unknown_effects")
    return samples if all(value(samples, g) == 0 for g in gauges) else None


def _paused_worker_scenario(served: Served) -> tuple[float, float, float]:
    """A claims with a 1 s lease (B loses the race), renews, expires; B takes over, prepares an
    effect; A's late renew and commit are fenced; B records, commits; an unknown task is looked
    up. Checks the gauges on the way. Returns the seconds it took, and the shortest READY ->
    commit and A's shortest start -> fenced commit the server can have measured (from after
    the first call returned to before the last one was sent)."""
    started = time.monotonic()
    with grpc.insecure_channel(served.target, options=GRPC_OPTIONS) as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        worker = worker_pb2_grpc.WorkerServiceStub(channel)
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="m-1", input=INPUT))
        created = time.monotonic()
        epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch

        def claim(who: tuple[tuple[str, str], ...], ttl: int) -> worker_pb2.ClaimResponse:
            request = worker_pb2.ClaimRequest(task_id="m-1", scheduler_epoch=epoch, ttl_seconds=ttl)
            return worker.Claim(request, metadata=who)

        # A holds a 1 s lease; B loses the race; A renews once.
        a = claim(WORKER_A, 1)
        a_started = time.monotonic()
        assert a.outcome == types_pb2.OUTCOME_CLAIMED
        assert claim(WORKER_B, 30).outcome == types_pb2.OUTCOME_ALREADY_CLAIMED
        renew = worker.Renew(worker_pb2.RenewRequest(fence=a.fence), metadata=WORKER_A)
        assert renew.outcome == types_pb2.OUTCOME_OK
        eventually(lambda: value(served.scrape(), "coordinator_active_leases") == 1)

        # A's lease runs out: the reclaimer's watch puts the task back to READY.
        def ready() -> bool:
            got = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="m-1")).task
            return got.state == types_pb2.TASK_STATE_READY

        eventually(ready, timeout=15, message="the expired claim was not reclaimed")

        # B takes over and prepares an effect (PREPARED: the backlog is 1 until recorded).
        b = claim(WORKER_B, 30)
        assert b.outcome == types_pb2.OUTCOME_CLAIMED
        prepared = worker.PrepareEffect(
            worker_pb2.PrepareEffectRequest(
                fence=b.fence, node_id="n", effect_slot="mail", payload_digest=digest_of(b"x")
            ),
            metadata=WORKER_B,
        )
        assert prepared.outcome == types_pb2.OUTCOME_OK
        eventually(lambda: value(served.scrape(), "coordinator_unknown_effects") == 1)

        # The paused A wakes up: its renew and its commit are fenced.
        late_renew = worker.Renew(worker_pb2.RenewRequest(fence=a.fence), metadata=WORKER_A)
        assert late_renew.outcome == types_pb2.OUTCOME_FENCED
        a_wasted = time.monotonic() - a_started
        late = worker.Commit(_commit(a.fence), metadata=WORKER_A)
        assert late.outcome == types_pb2.OUTCOME_FENCED
        assert late.reason == types_pb2.FENCE_REASON_SUPERSEDED

        recorded = worker.RecordEffect(
            worker_pb2.RecordEffectRequest(
                fence=b.fence, effect_id=prepared.effect_id, state=types_pb2.EFFECT_STATE_COMMITTED
            ),
            metadata=WORKER_B,
        )
        assert recorded.outcome == types_pb2.OUTCOME_OK
        ready_to_commit = time.monotonic() - created
        assert worker.Commit(_commit(b.fence), metadata=WORKER_B).outcome == (
            types_pb2.OUTCOME_COMMITTED
        )

        with pytest.raises(grpc.RpcError) as missing:
            tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="no-such-task"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as refused:  # a worker may not bump the epoch
            admin.BumpEpoch(admin_pb2.BumpEpochRequest(), metadata=AS_WORKER_ONLY)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    return time.monotonic() - started, ready_to_commit, a_wasted


def test_serve_refuses_a_taken_metrics_port_naming_the_setting(
    etcd: EtcdProcess, prefix: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "--etcd", etcd.endpoint, "--prefix", prefix, "--insecure"]
        args += ["--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{port}"]
        result = subprocess.run(
            [*COMMAND, *args], capture_output=True, text=True, timeout=60, check=False
        )
    assert result.returncode == 2, result.stderr
    assert f"metrics_listen: cannot bind '127.0.0.1:{port}'" in result.stderr
