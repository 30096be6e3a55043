"""Issue 25's first row at full size: one worker token churning the largest checkpoints and
staged results it may send, against an etcd with a small quota, while a normal pool runs.

The abuser holds one claim and, ``RATE`` rounds a second, sends a RenewMany carrying a new
``CHECKPOINT``-byte checkpoint and a StageResult of ``STAGED`` bytes (the largest the server
takes): about 11.5 MiB/s offered, the issue's 20 MiB/s order. A legitimate producer and worker
(other principals) create, claim and commit small tasks back to back. Every second etcd's db
size and alarm list are read. Figures: what the abuser got (kept, not kept, refused and how),
what the pool got (successes and every refusal by operation and code: the target is none),
whether NOSPACE was ever raised, and the db size over time against the quota.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import etcd3
import grpc

from bench.harness import say
from bench.procs import GRPC_OPTIONS
from bench.stats import ms, percentile
from coordinator.domain.digests import digest_of
from coordinator.server.identity import PRINCIPAL_METADATA_KEY, ROLES_METADATA_KEY
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)

CHECKPOINT = 64 << 10
STAGED = 512 << 10  # coordinator.domain.validation.MAX_RESULT_BYTES
RATE = 20.0
"""Abuser rounds a second at most: refusals answer at once, and an unpaced loop would only
measure how fast a refusal comes back on two shared cores, not the space guard."""
SAMPLE = 1.0
"""Seconds between readings of etcd's db size and alarms."""
SERIES_POINTS = 60
"""The db-size series in the report is thinned to at most this many points."""


def who(principal: str, role: str) -> tuple[tuple[str, str], ...]:
    """Insecure-mode metadata naming the caller and its role."""
    return ((PRINCIPAL_METADATA_KEY, principal), (ROLES_METADATA_KEY, role))


ABUSER, PM, WORKER = who("abuser", "worker"), who("legit-pm", "pm"), who("legit-worker", "worker")


class _Stubs:
    def __init__(self, channel: grpc.Channel) -> None:
        self.tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        self.worker = worker_pb2_grpc.WorkerServiceStub(channel)
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        self.epoch = admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=PM).epoch

    def create(self, task_id: str, data: bytes) -> None:
        request = tasks_pb2.CreateTaskRequest(
            task_id=task_id, queue="hostile", input=data, input_digest=digest_of(data)
        )
        self.tasks.CreateTask(request, metadata=PM, timeout=30)

    def claim(self, task_id: str, metadata: Any) -> types_pb2.Fence:
        request = worker_pb2.ClaimRequest(
            task_id=task_id, scheduler_epoch=self.epoch, ttl_seconds=60
        )
        answer = self.worker.Claim(request, metadata=metadata, timeout=30)
        if answer.outcome != types_pb2.OUTCOME_CLAIMED:
            raise RuntimeError(f"claim of {task_id} refused: {answer.message}")
        return answer.fence


def _abuse(stubs: _Stubs, fence: types_pb2.Fence, stop: threading.Event, out: Counter[str]) -> None:
    n = 0
    while not stop.wait(1 / RATE):
        n += 1
        own = worker_pb2.RenewRequest(
            fence=fence, checkpoint=n.to_bytes(4, "big") * (CHECKPOINT // 4)
        )
        try:
            many = stubs.worker.RenewMany(
                worker_pb2.RenewManyRequest(renewals=[own]), metadata=ABUSER, timeout=30
            )
            renewal = many.results[0].renewal
            if renewal.outcome != types_pb2.OUTCOME_OK:
                out["claim_lost"] += 1
            out["checkpoint_not_kept" if renewal.checkpoint_refused else "checkpoint_kept"] += 1
        except grpc.RpcError as exc:
            out[f"renew_{exc.code().name}"] += 1
        result = n.to_bytes(4, "big") * (STAGED // 4)
        stage = worker_pb2.StageResultRequest(
            fence=fence, result=result, result_digest=digest_of(result)
        )
        try:
            stubs.worker.StageResult(stage, metadata=ABUSER, timeout=30)
            out["staged"] += 1
        except grpc.RpcError as exc:
            out[f"stage_{exc.code().name}"] += 1


def _pool(stubs: _Stubs, stop: threading.Event, out: Counter[str], took: list[float]) -> None:
    """Create, claim and commit small tasks back to back; each refusal counted by step and
    code, the cycle's time kept for its spread."""
    n = 0
    while not stop.is_set():
        n += 1
        task_id, data = f"legit-{n}", f"input {n}".encode()
        started, step = time.perf_counter(), "create"
        try:
            stubs.create(task_id, data)
            step = "claim"
            fence = stubs.claim(task_id, WORKER)
            step = "commit"
            commit = worker_pb2.CommitRequest(
                fence=fence,
                input_digest=digest_of(data),
                result=b"ok",
                result_digest=digest_of(b"ok"),
            )
            answer = stubs.worker.Commit(commit, metadata=WORKER, timeout=30)
            if answer.outcome != types_pb2.OUTCOME_COMMITTED:
                raise RuntimeError(answer.message)
        except grpc.RpcError as exc:
            out[f"{step}_{exc.code().name}"] += 1
            stop.wait(0.1)
            continue
        except RuntimeError:
            out[f"{step}_refused"] += 1
            stop.wait(0.1)
            continue
        out["cycles"] += 1
        took.append(time.perf_counter() - started)


def _sample(
    client: Any, stop: threading.Event, series: list[tuple[float, int]], alarms: list[str]
) -> None:
    started = time.monotonic()
    while True:
        series.append((time.monotonic() - started, int(client.status().db_size)))
        alarms.extend(str(a.alarm_type) for a in client.list_alarms())
        if stop.wait(SAMPLE):
            return


def run_writes(target: str, etcd: tuple[str, int], *, quota: int, seconds: float) -> dict[str, Any]:
    """The row on the coordinator at ``target`` over the etcd at ``etcd`` (host, port) whose
    --quota-backend-bytes is ``quota``, for ``seconds``; the figures."""
    client = etcd3.client(*etcd, timeout=30, grpc_options=GRPC_OPTIONS)
    channel = grpc.insecure_channel(target, options=GRPC_OPTIONS)
    try:
        stubs = _Stubs(channel)
        stubs.create("abused", b"abused")
        fence = stubs.claim("abused", ABUSER)
        stop = threading.Event()
        abuser, pool = Counter[str](), Counter[str]()
        took: list[float] = []
        series: list[tuple[float, int]] = []
        alarms: list[str] = []
        threads = [
            threading.Thread(target=_abuse, args=(stubs, fence, stop, abuser), daemon=True),
            threading.Thread(target=_pool, args=(stubs, stop, pool, took), daemon=True),
            threading.Thread(target=_sample, args=(client, stop, series, alarms), daemon=True),
        ]
        for thread in threads:
            thread.start()
        stop.wait(seconds)
        stop.set()
        for thread in threads:
            thread.join(60)
    finally:
        channel.close()
        client.close()
    return _figures(quota, seconds, abuser, pool, took, series, alarms)


def _figures(
    quota: int,
    seconds: float,
    abuser: Counter[str],
    pool: Counter[str],
    took: list[float],
    series: list[tuple[float, int]],
    alarms: list[str],
) -> dict[str, Any]:
    peak = max(size for _, size in series)
    step = max(1, len(series) // SERIES_POINTS)
    refused = {k: v for k, v in pool.items() if k != "cycles"}
    result = {
        "seconds": seconds,
        "quota_mib": round(quota / 2**20, 1),
        "offered_mib_per_s": round(RATE * (CHECKPOINT + STAGED) / 2**20, 1),
        "abuser": dict(abuser),
        "legit_cycles": pool["cycles"],
        "legit_refusals": refused,
        "legit_cycle_ms": {q: ms(percentile(took, q)) for q in (50, 99)},
        "nospace_alarms": len(alarms),
        "db_mib_peak": round(peak / 2**20, 1),
        "db_peak_over_quota": round(peak / quota, 3),
        "db_mib_series": [[round(t), round(s / 2**20, 1)] for t, s in series[::step]],
    }
    say(
        f"hostile writes: {seconds:.0f}s, db peak {result['db_mib_peak']} MiB of "
        f"{result['quota_mib']} ({len(alarms)} NOSPACE readings); pool {pool['cycles']} cycles, "
        f"refused {refused}; abuser {dict(abuser)}"
    )
    return result
