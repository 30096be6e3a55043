"""The retention phase: does etcd stay the same size while tasks keep finishing, and what does
the pruner cost?

1. **db size, in the steady state**: one coordinator with a retention of 2 s, tombstones living
   10 s (and the idempotency window with them, as the server requires), its pruner at the
   server's default rate archiving to a local directory, takes ``tasks`` short tasks through
   claim -> commit, seeded in chunks, while a compactor compacts etcd's history every few
   seconds **throughout** the run. At a quarter, half, three quarters and all of the tasks
   (50k/100k/150k/200k for a 200k run) the history is compacted, the db defragmented and its
   size read (Status ``dbSize``; the median of the samples after the last five chunks before
   it) **without waiting for the pruner**: what is there is the steady
   state - the tasks finished within the last retention (plus the pruner's lag) and the
   tombstones of the last tombstone window, i.e. finish rate x (retention + tombstone window) x
   record size, not the count of tasks ever run. ``etcd_db_mib_at_200k_over_50k`` is the last
   checkpoint over the first (target <= 1.1: flat). Keys by section and the finish rate of each
   segment are reported too.
2. **throughput**: the same cycle for ``duration`` seconds against a coordinator with the pruner
   on (retention 2 s, the default prune rate) and one with it off (retention 0), interleaved
   ``rounds`` times, compaction running as in 1; the pruner's backlog is drained (off the clock)
   before each run, so neither run pays for the other: ``throughput_pruner_on_over_off`` is the
   ratio of the medians (target >= 0.9).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import etcd3
from etcd3 import etcdrpc

from bench.harness import say
from bench.procs import GRPC_OPTIONS, CoordinatorProcess, compact_now
from bench.seed import TaskSeeder
from coordinator.domain.keys import Keyspace
from coordinator.domain.states import Outcome
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import ClaimRefused, WorkerClient
from coordinator.store.etcd.kv import EtcdKV

RETENTION_S = 2.0
TOMBSTONE_S = 10.0
PRUNE_INTERVAL_S = 1.0
COMPACT_EVERY_S = 5.0
CHECKPOINTS = 4
# Each checkpoint's size is the median of the samples after its last chunks (up to this many):
# one sample falls anywhere in a pass of the pruner, so a backlog of one pass (~5 s of tasks)
# comes and goes between two samples.
SAMPLES = 5
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
        with _compacting(client) as compactions:
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
        doc["compactions"] = compactions[0]
        return doc
    finally:
        kv.close()
        client.close()


@contextmanager
def _compacting(client: Any) -> Iterator[list[int]]:
    """Compact etcd's history every COMPACT_EVERY_S while the block runs (as the chart's etcd
    does, only more often); yields the count of compactions, read after the block."""
    stop, count = threading.Event(), [0]

    def run() -> None:
        while not stop.wait(COMPACT_EVERY_S):
            try:
                compact_now(client)
                count[0] += 1
            except Exception as exc:  # a compaction racing a checkpoint's: the next one
                say(f"retention: compaction skipped ({type(exc).__name__})")

    thread = threading.Thread(target=run, name="bench-compactor", daemon=True)
    thread.start()
    try:
        yield count
    finally:
        stop.set()
        thread.join(timeout=120)


def _coordinator(
    etcd: EtcdProcess, workdir: Path, name: str, retention: str, log: str
) -> CoordinatorProcess:
    """A coordinator of the phase, not yet started."""
    return CoordinatorProcess(
        etcd.endpoint,
        prefix=f"/bench-retention-{name}",
        log_path=workdir / f"coordinator-retention-{name}.log",
        log_level=log,
        extra_args=(
            f"--retention={retention}",
            f"--prune-interval={PRUNE_INTERVAL_S}",
            # The server's default --prune-rate: the limiter is part of what is measured.
            # Tombstones last a day by default; a short life lets a run reach the steady state
            # (a tombstone window's worth of tombstones). The idempotency window may not be
            # longer than it (the server refuses that), so it is as short.
            f"--tombstone-retention={TOMBSTONE_S}s",
            f"--idempotency-ttl={TOMBSTONE_S}",
            f"--archive={workdir / ('archive-' + name)}",
        ),
    )  # started by ``with`` (its __enter__): starting it here too left one running unstopped


def checkpoints(tasks: int) -> list[int]:
    """The task counts the db is measured at: a quarter, half, three quarters and all."""
    return sorted({max(1, tasks * n // CHECKPOINTS) for n in range(1, CHECKPOINTS + 1)})


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
    marks = checkpoints(tasks)
    samples: dict[int, list[float]] = {m: [] for m in marks}
    keys_left: dict[int, dict[str, int]] = {}
    rates: dict[int, float] = {}
    started = time.monotonic()
    with _coordinator(etcd, workdir, "db", f"{RETENTION_S}s", log) as coordinator:
        done, chunk, segment_start, segment_done = 0, 0, time.monotonic(), 0
        for n, mark in enumerate(marks):
            earliest = max(marks[n - 1] if n else mark // 2, mark - SAMPLES * _CHUNK)
            while done < mark:
                count = min(_CHUNK, mark - done)
                queue = f"r{chunk:05d}"
                seeder.seed(queue, count)
                _drain_queue(coordinator.target, queue, workers, count)
                done, chunk = done + count, chunk + 1
                if done > earliest:
                    # No wait for the pruner: the steady state is what a running pool has.
                    samples[mark].append(_defragmented_mib(client))
            rates[mark] = (done - segment_done) / (time.monotonic() - segment_start)
            keys_left[mark] = _keys_by_section(kv, keys)
            say(
                f"retention: {mark} tasks ({rates[mark]:.0f}/s), etcd db "
                f"{statistics.median(samples[mark]):.2f} MiB after compaction + defrag "
                f"(samples {[round(x, 2) for x in samples[mark]]}); keys {keys_left[mark]}"
            )
            segment_start, segment_done = time.monotonic(), done
    sizes = {m: statistics.median(samples[m]) for m in marks}
    first, last = sizes[marks[0]], sizes[marks[-1]]
    return {
        "retention_tasks": tasks,
        "retention_s": RETENTION_S,
        "tombstone_retention_s": TOMBSTONE_S,
        "prune_interval_s": PRUNE_INTERVAL_S,
        "compact_every_s": COMPACT_EVERY_S,
        "etcd_db_mib_at": {str(m): round(sizes[m], 3) for m in marks},
        "etcd_db_mib_samples": {str(m): [round(x, 3) for x in samples[m]] for m in marks},
        "etcd_db_mib_last_over_first": round(last / first, 3) if first else None,
        "finish_rate_per_s": {str(m): round(rates[m], 1) for m in marks},
        "retention_db_phase_s": round(time.monotonic() - started, 1),
        "keys_at": {str(k): v for k, v in keys_left.items()},
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

    # Daemons: a phase cut off at the bench's time bound must not hold its exit.
    threads = [threading.Thread(target=run, daemon=True) for _ in range(n)]
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
    """Until the pruner pruned every finished task (the prune index is empty): the backlog of
    one run is not the next run's cost. Bounded by ``limit``."""
    deadline = time.monotonic() + limit
    prefix = keys.prune_due_prefix
    while time.monotonic() < deadline:
        if not kv.range_page(prefix, kv.prefix_end(prefix), limit=1, keys_only=True)[0]:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the pruner did not catch up within {limit:.0f} s")


def _defragmented_mib(client: Any) -> float:
    """Compact etcd's history, defragment, and read the db size (MiB)."""
    compact_now(client)
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
