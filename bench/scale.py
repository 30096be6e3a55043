"""Item 3: ClaimNext latency against the number of ready tasks, and what 100k tasks cost etcd.

For each size (1k and 100k by default, 1M with ``--million``) one queue is seeded with that many
READY tasks (as CreateTask writes them); etcd's db size and RSS are read before and after, and
the coordinator is left to go idle (it loads the new ready keys through its watch). Then, in
alternation so drift hits both alike, one worker times ``claim_next`` on each queue (through
gRPC, as a worker sees it; each claimed task is committed off the clock), and the naive "first
ready key" read, a ``limit=1`` range over the queue's ready prefix, is timed beside it. The
caller drops the seeded queues once the coordinator is stopped (see ``bench.cli``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import etcd3
from etcd3 import etcdrpc

from bench.harness import say
from bench.procs import GRPC_OPTIONS, Meter, rss_mib
from bench.scenarios.coordinator import RESULT
from bench.seed import TaskSeeder
from bench.stats import median, percentile, ratio
from coordinator.sdk import ClaimRefused, WorkerClient
from coordinator.store.etcd.kv import EtcdKV


def etcd_db_size(client: Any) -> int:
    """etcd's backend size in bytes (Status.dbSize)."""
    return int(client.maintenancestub.Status(etcdrpc.StatusRequest(), 10).dbSize)


def queue_of(size: int) -> str:
    """The queue seeded with ``size`` tasks."""
    return f"scale{size}"


def run_scale(
    target: str,
    etcd_host: str,
    etcd_port: int,
    seeder: TaskSeeder,
    kv: EtcdKV,
    meter: Meter,
    *,
    sizes: Sequence[int],
    samples: int,
) -> dict[str, Any]:
    """Seed each size, then time ClaimNext and the naive range on every queue in turn."""
    client = etcd3.client(etcd_host, etcd_port, timeout=30, grpc_options=GRPC_OPTIONS)
    footprint: list[dict[str, Any]] = []
    try:
        for size in sizes:
            db0, rss0 = etcd_db_size(client), rss_mib(meter.etcd_pid)
            started = time.monotonic()
            seeder.seed(queue_of(size), size)
            seeded_in = time.monotonic() - started
            waited = meter.settle(limit=max(10.0, size / 2000))
            db1, rss1 = etcd_db_size(client), rss_mib(meter.etcd_pid)
            footprint.append(
                {
                    "tasks": size,
                    "seed_s": round(seeded_in, 2),
                    "coordinator_settle_s": round(waited, 2),
                    "etcd_db_mib_before": round(db0 / 2**20, 2),
                    "etcd_db_mib_after": round(db1 / 2**20, 2),
                    "etcd_rss_mib_before": round(rss0, 1),
                    "etcd_rss_mib_after": round(rss1, 1),
                }
            )
            say(f"scale: seeded {size} tasks in {seeded_in:.1f} s")
    finally:
        client.close()
    claim_s, range_s = _time_reads(target, seeder, kv, sizes, samples)
    small, large = min(sizes), max(sizes)
    biggest = next(f for f in footprint if f["tasks"] == large)
    per_100k = 100_000 / large
    result: dict[str, Any] = {
        "sizes": list(sizes),
        "samples": samples,
        "claim_next_ms": {str(n): _ms(claim_s[n]) for n in sizes},
        "etcd_range_limit1_ms": {str(n): _ms(range_s[n]) for n in sizes},
        "claim_next_ratio_large_over_small": _ratio(claim_s[large], claim_s[small]),
        "etcd_range_ratio_large_over_small": _ratio(range_s[large], range_s[small]),
        "footprint": footprint,
        "etcd_db_mib_per_100k_tasks": round(
            (biggest["etcd_db_mib_after"] - biggest["etcd_db_mib_before"]) * per_100k, 2
        ),
        "etcd_rss_mib_per_100k_tasks": round(
            (biggest["etcd_rss_mib_after"] - biggest["etcd_rss_mib_before"]) * per_100k, 1
        ),
    }
    return result


def _time_reads(
    target: str, seeder: TaskSeeder, kv: EtcdKV, sizes: Sequence[int], samples: int
) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    claim_s: dict[int, list[float]] = {n: [] for n in sizes}
    range_s: dict[int, list[float]] = {n: [] for n in sizes}
    with WorkerClient(target, principal="bench-scale", channel_options=GRPC_OPTIONS) as worker:
        for i in range(samples + 5):  # the first five warm up the channel and caches
            for n in sizes if i % 2 else reversed(sizes):
                queue = queue_of(n)
                t0 = time.perf_counter()
                claim = worker.claim_next(queue, ttl=timedelta(seconds=60))
                t1 = time.perf_counter()
                if isinstance(claim, ClaimRefused):
                    raise RuntimeError(f"scale: claim on {queue} refused: {claim.outcome.name}")
                claim.commit(RESULT)
                prefix = seeder.keys.ready_prefix(queue)
                t2 = time.perf_counter()
                kv.range_page(prefix, kv.prefix_end(prefix), limit=1)
                t3 = time.perf_counter()
                if i >= 5:
                    claim_s[n].append(t1 - t0)
                    range_s[n].append(t3 - t2)
    return claim_s, range_s


def _ms(values: list[float]) -> dict[str, float | None]:
    p50, p95 = median(values), percentile(values, 95)
    return {
        "p50": round(p50 * 1000, 3) if p50 is not None else None,
        "p95": round(p95 * 1000, 3) if p95 is not None else None,
    }


def _ratio(large: list[float], small: list[float]) -> float | None:
    value = ratio(median(large), median(small))
    return round(value, 3) if value is not None else None
