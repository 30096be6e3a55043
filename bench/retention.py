"""The retention phase: does etcd stay the same size while tasks keep finishing, and what does
the pruner cost?

1. **db size**: one coordinator with a retention of a few seconds (and its pruner archiving to a
   local directory; tombstones living 5 s) takes ``tasks`` short tasks through claim ->
   commit, seeded in chunks. At a quarter of them and at all of them, once every finished task
   was pruned and its tombstone expired, etcd's history is compacted, the db defragmented, and
   its size read (Status ``dbSize``): ``etcd_db_mib_at_200k_over_50k`` is the second over the
   first (target <= 1.1: nothing of a pruned task stays; without retention the db grows with
   the count). The keys left by section are reported too.
2. **throughput**: the same cycle for ``duration`` seconds against a coordinator with the pruner
   on (retention 2 s) and one with it off (retention 0), interleaved ``rounds`` times; the
   pruner's backlog is drained (off the clock) before each run, so neither run pays for the
   other: ``throughput_pruner_on_over_off`` is the ratio of the medians (target >= 0.9).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import etcd3
from etcd3 import etcdrpc

from bench.harness import say
from bench.procs import GRPC_OPTIONS, CoordinatorProcess
from bench.seed import TaskSeeder
from coordinator.domain.keys import Keyspace
from coordinator.domain.states import Outcome
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import ClaimRefused, WorkerClient
from coordinator.store.etcd import EtcdKV

RETENTION_S = 2.0
TOMBSTONE_S = 5.0
_CHUNK = 2_000
_TTL = timedelta(seconds=60)
_RESULT = b"retention benchmark result"


def run_retention(
    etcd: EtcdProcess,
    workdir: Path,
    *,
    tasks: int,
    workers: int,
    duration: float,
    rounds: int,
    log_level: str = "info",
) -> dict[str, Any]:
    """Both measurements into one dict (see the module docstring)."""
    client = etcd3.client(etcd.host, etcd.port, timeout=120, grpc_options=GRPC_OPTIONS)
    kv = EtcdKV.connect([etcd.endpoint], timeout=60)
    try:
        doc = _db_size(etcd, kv, client, workdir, tasks=tasks, workers=workers, log=log_level)
        doc.update(
            _throughput(
                etcd,
                kv,
                workdir,
                workers=workers,
                duration=duration,
                rounds=rounds,
                log=log_level,
            )
        )
        return doc
    finally:
        kv.close()
        client.close()


def _coordinator(
    etcd: EtcdProcess, workdir: Path, name: str, retention: str, log: str
) -> CoordinatorProcess:
    return CoordinatorProcess(
        etcd.endpoint,
        prefix=f"/bench-retention-{name}",
        log_path=workdir / f"coordinator-retention-{name}.log",
        log_level=log,
        extra_args=(
            f"--retention={retention}",
            "--prune-interval=0.5",
            "--prune-rate=100000",
            # Tombstones last a day by default; a short life lets the run reach the steady state
            # (live tasks + a retention's worth of pruned ones + a tombstone life's of tombstones).
            f"--tombstone-retention={TOMBSTONE_S}s",
            f"--archive={workdir / ('archive-' + name)}",
        ),
    ).start()


def _db_size(
    etcd: EtcdProcess,
    kv: EtcdKV,
    client: Any,
    workdir: Path,
    *,
    tasks: int,
    workers: int,
    log: str,
) -> dict[str, Any]:
    keys = Keyspace("/bench-retention-db")
    seeder = TaskSeeder(kv, keys)
    quarter = max(1, tasks // 4)
    sizes: dict[int, float] = {}
    keys_left: dict[int, dict[str, int]] = {}
    started = time.monotonic()
    with _coordinator(etcd, workdir, "db", f"{RETENTION_S}s", log) as coordinator:
        done, chunk = 0, 0
        while done < tasks:
            count = min(_CHUNK, tasks - done, (quarter - done) if done < quarter else tasks)
            queue = f"r{chunk:05d}"
            seeder.seed(queue, count)
            _drain_queue(coordinator.target, queue, workers, count)
            done, chunk = done + count, chunk + 1
            if done in (quarter, tasks):
                _wait_pruned(kv, keys)
                sizes[done] = _defragmented_mib(client)
                left = _keys_by_section(kv, keys)
                say(
                    f"retention: {done} tasks, etcd db {sizes[done]:.1f} MiB after defrag; "
                    f"keys left {left}"
                )
                keys_left[done] = left
    ratio = sizes[tasks] / sizes[quarter] if sizes.get(quarter) else None
    return {
        "retention_tasks": tasks,
        "retention_s": RETENTION_S,
        "tombstone_retention_s": TOMBSTONE_S,
        "etcd_db_mib_quarter": round(sizes[quarter], 2),
        "etcd_db_mib_full": round(sizes[tasks], 2),
        "etcd_db_mib_full_over_quarter": round(ratio, 3) if ratio else None,
        "retention_db_phase_s": round(time.monotonic() - started, 1),
        "keys_left": {str(k): v for k, v in keys_left.items()},
    }


def _throughput(
    etcd: EtcdProcess,
    kv: EtcdKV,
    workdir: Path,
    *,
    workers: int,
    duration: float,
    rounds: int,
    log: str,
) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"on": [], "off": []}
    with (
        _coordinator(etcd, workdir, "on", f"{RETENTION_S}s", log) as on,
        _coordinator(etcd, workdir, "off", "0", log) as off,
    ):
        targets = {"on": on.target, "off": off.target}
        for round_ in range(rounds):
            for mode in ("off", "on"):
                keys = Keyspace(f"/bench-retention-{mode}")
                _wait_pruned(kv, keys)  # the other run's backlog is not this run's cost
                queue = f"t{round_:03d}"
                # More than a run can take on this hardware (about 400 cycles/s at most).
                TaskSeeder(kv, keys).seed(queue, int(duration * 1_000) + 1_000)
                rate = _timed_cycles(targets[mode], queue, workers, duration)
                rates[mode].append(rate)
                say(f"retention: pruner {mode}, round {round_ + 1}: {rate:.0f} cycles/s")
    on_rate, off_rate = statistics.median(rates["on"]), statistics.median(rates["off"])
    return {
        "pruner_on_cycles_per_s": [round(r, 1) for r in rates["on"]],
        "pruner_off_cycles_per_s": [round(r, 1) for r in rates["off"]],
        "pruner_on_over_off": round(on_rate / off_rate, 3) if off_rate else None,
    }


def _workers(target: str, n: int, body: Callable[[WorkerClient], None]) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with WorkerClient(target, principal="bench-retention") as worker:
                body(worker)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _cycle(worker: WorkerClient, queue: str) -> bool:
    """One claim -> commit; False when the queue is empty."""
    claim = worker.claim_next(queue, ttl=_TTL)
    if isinstance(claim, ClaimRefused):
        if claim.outcome is Outcome.NO_READY_TASK:
            return False
        raise RuntimeError(f"claim refused: {claim.outcome.name}")
    if not claim.commit(_RESULT).committed:
        raise RuntimeError("commit not accepted")
    return True


def _drain_queue(target: str, queue: str, workers: int, count: int) -> None:
    """Claim and commit every task of ``queue`` (a ClaimNext may miss briefly: retried)."""
    left = [count]
    lock = threading.Lock()

    def body(worker: WorkerClient) -> None:
        misses = 0
        while True:
            with lock:
                if left[0] <= 0:
                    return
            if _cycle(worker, queue):
                with lock:
                    left[0] -= 1
                misses = 0
            else:
                misses += 1
                if misses > 50:
                    return
                time.sleep(0.01)

    _workers(target, workers, body)


def _timed_cycles(target: str, queue: str, workers: int, duration: float) -> float:
    counts = [0] * workers
    index = iter(range(workers))
    stop_at = time.monotonic() + duration
    lock = threading.Lock()

    def body(worker: WorkerClient) -> None:
        with lock:
            me = next(index)
        while time.monotonic() < stop_at:
            if not _cycle(worker, queue):
                raise RuntimeError("the seeded queue ran dry; seed more tasks per run")
            counts[me] += 1

    started = time.monotonic()
    _workers(target, workers, body)
    return sum(counts) / (time.monotonic() - started)


def _wait_pruned(kv: EtcdKV, keys: Keyspace, limit: float = 600.0) -> None:
    """Until the pruner pruned every finished task and their tombstones expired (both indexes
    empty): what stays then is what a pruned task leaks. Bounded by ``limit``."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        pending = [
            kv.range_page(prefix, kv.prefix_end(prefix), limit=1, keys_only=True)[0]
            for prefix in (keys.prune_due_prefix, keys.tombstone_due_prefix)
        ]
        if not any(pending):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the pruner did not catch up within {limit:.0f} s")


def _defragmented_mib(client: Any) -> float:
    """Compact etcd's history, defragment, and read the db size (MiB)."""
    status = client.maintenancestub.Status(etcdrpc.StatusRequest(), 120)
    client.compact(status.header.revision, physical=True)
    client.defragment()
    size = client.maintenancestub.Status(etcdrpc.StatusRequest(), 120).dbSize
    return float(size) / (1 << 20)


def _keys_by_section(kv: EtcdKV, keys: Keyspace) -> dict[str, int]:
    """How many keys each top-level section of the keyspace holds (what stays behind)."""
    root = keys.prefix + "/"
    found, _ = kv.range_page(root, kv.prefix_end(root), keys_only=True)
    counts: dict[str, int] = {}
    for item in found:
        section = item.key[len(root) :].split("/", 1)[0]
        counts[section] = counts.get(section, 0) + 1
    return counts
