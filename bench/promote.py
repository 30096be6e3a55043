"""Delayed tasks: how soon after its not_before is a task claimed by a long-polling worker?

Tasks are created through CreateTask in batches, each with ``not_before`` = now + ``delay``
(DELAYED, in the delayed index), while ``workers`` threads (one principal each: the server caps
long polls per principal) long-poll ClaimNext (``wait`` seconds) and commit what they get. Per
task the figure is its claim's arrival at the worker minus its not_before: the promoter's pass
interval, its promotion txn, the ready index's watch waking a waiter, and the claim itself.
Client and coordinator share one host, so one wall clock. The phase is bounded: it stops when
every task was claimed, or ``delay`` + the batches' spread + ``GRACE`` seconds after it began.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.harness import say
from bench.procs import GRPC_OPTIONS
from bench.scenarios.coordinator import RESULT
from bench.stats import percentile
from coordinator.sdk import ClaimRefused, WorkerClient

QUEUE = "bench-promote"
TTL = 30
GRACE = 15.0
"""Seconds past the last batch's due time after which unclaimed tasks count as missed."""


class _Claims:
    """When each task was claimed (wall clock), shared by the worker threads."""

    def __init__(self, expected: int) -> None:
        self._lock = threading.Lock()
        self._expected = expected
        self.at: dict[str, float] = {}
        self.errors = 0
        self.first_error = ""
        self.done = threading.Event()

    def claimed(self, task_id: str, at: float) -> None:
        with self._lock:
            self.at.setdefault(task_id, at)
            if len(self.at) >= self._expected:
                self.done.set()

    def failed(self, exc: Exception) -> None:
        with self._lock:
            self.errors += 1
            self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"[:300]


def _work(client: WorkerClient, claims: _Claims, wait: float, until: float) -> None:
    """Long-poll ClaimNext and commit, until every task was claimed or ``until`` (monotonic)."""
    while not claims.done.is_set() and time.monotonic() < until:
        try:
            got = client.claim_next(QUEUE, ttl=timedelta(seconds=TTL), wait=timedelta(seconds=wait))
            at = time.time()
            if isinstance(got, ClaimRefused):
                continue  # NO_READY_TASK: the wait ended empty
            claims.claimed(got.task_id, at)
            got.commit(RESULT)
        except Exception as exc:
            claims.failed(exc)
            time.sleep(0.05)


def run_promote(
    target: str,
    *,
    batches: int,
    batch_size: int,
    delay: float,
    spacing: float,
    workers: int,
    wait: float,
) -> dict[str, Any]:
    """Create ``batches`` batches of ``batch_size`` delayed tasks, ``spacing`` seconds apart,
    each due ``delay`` seconds after its creation; long-poll them with ``workers`` workers."""
    total = batches * batch_size
    claims = _Claims(total)
    due: dict[str, float] = {}
    until = time.monotonic() + delay + batches * spacing + GRACE
    clients = [
        WorkerClient(target, principal=f"bench-promote-{i}", channel_options=GRPC_OPTIONS)
        for i in range(workers)
    ]
    threads = [
        threading.Thread(target=_work, args=(c, claims, wait, until), daemon=True) for c in clients
    ]
    started = time.monotonic()
    try:
        for thread in threads:
            thread.start()
        with WorkerClient(target, principal="bench-producer", channel_options=GRPC_OPTIONS) as pm:
            for b in range(batches):
                began = time.monotonic()
                not_before = time.time() + delay
                when = datetime.fromtimestamp(not_before, UTC)
                for i in range(batch_size):
                    task = f"promote-{b:03d}-{i:04d}"
                    pm.create_task(task, input=task.encode(), queue=QUEUE, not_before=when)
                    due[task] = not_before
                time.sleep(max(0.0, spacing - (time.monotonic() - began)))
        claims.done.wait(max(0.0, until - time.monotonic()))
        for thread in threads:
            thread.join(timeout=wait + 10)  # a long poll in flight ends within its wait
    finally:
        for client in clients:
            client.close()
    after_due = [claims.at[t] - due[t] for t in due if t in claims.at]
    result: dict[str, Any] = {
        "tasks": total,
        "claimed": len(after_due),
        "batches": batches,
        "batch_size": batch_size,
        "delay_s": delay,
        "workers": workers,
        "wait_s": wait,
        "claimable_s_after_due": {
            "p50": _round(percentile(after_due, 50)),
            "p95": _round(percentile(after_due, 95)),
            "max": _round(max(after_due, default=None)),
            # Claimed before its not_before: must stay 0 (a DELAYED task is not claimable).
            "early": sum(x < 0 for x in after_due),
        },
        "errors": claims.errors,
        "first_error": claims.first_error,
        "seconds": round(time.monotonic() - started, 1),
    }
    spread = result["claimable_s_after_due"]
    say(
        f"promote: {len(after_due)}/{total} claimed, s after not_before p50 {spread['p50']} "
        f"p95 {spread['p95']} max {spread['max']}"
    )
    return result


def _round(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None
