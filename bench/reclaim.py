"""Item 2: reclaim latency. A worker holding a claim is SIGSTOPped; how long until the task is
claimable again, and until another worker holds it?

Per sample: one task is seeded in a queue of its own; a real worker process
(``bench.reclaim_worker``) claims it with a 2 s TTL, starts its keepalive and reports the
server's ``lease_expires_at`` (lease grant time + TTL); the benchmark SIGSTOPs it at once. Then,
relative to ``lease_expires_at``, it records when

* the claim key vanished (etcd's own lease expiry: the floor, seen through a watch here),
* the task record turned READY again (the reclaimer's txn: claimable by ClaimNext), and
* another worker, polling ClaimNext every 10 ms from just before the expiry, held the task.

Samples run on a few worker processes at once, each waiting a random 0-0.5 s before its claim
so that the claims fall at random phases of etcd's 500 ms lease-expiry check. A sample whose
worker might have renewed before it was stopped (stopped later than TTL/3 after the claim) is
discarded, since its lease would outlive ``lease_expires_at``.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.harness import say
from bench.procs import GRPC_OPTIONS
from bench.scenarios.coordinator import RESULT
from bench.seed import TaskSeeder, task_id
from bench.stats import percentile
from coordinator import lifeline
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import TaskRecord, decode
from coordinator.domain.states import TaskState
from coordinator.sdk import ClaimRefused, Outcome, WorkerClient
from coordinator.store.etcd import EtcdKV
from coordinator.store.watch import WatchEvent

TTL = 2
_POLL = 0.010  # the taker's ClaimNext interval
_REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sample:
    """One paused claim, in seconds after its lease's expiry (lease grant time + TTL)."""

    task: str
    ttl: float
    lease_gone: float | None
    ready: float | None
    held: float | None


class KeyWatch:
    """When claim keys vanish and tasks turn READY again, seen by etcd watches in this process."""

    def __init__(self, kv: EtcdKV, keys: Keyspace) -> None:
        self._cond = threading.Condition()
        self._expected: set[str] = set()
        self.gone: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        _, revision = kv.range_page(keys.epoch, keys.epoch + "\0")
        self._watches = [
            kv.watch_prefix(
                prefix,
                start_revision=revision + 1,
                on_events=callback,
                on_compacted=lambda: None,  # nothing is compacted during a benchmark
            )
            for prefix, callback in (
                (keys.claims_prefix, self._on_claims),
                (keys.tasks_prefix, self._on_tasks),
            )
        ]

    def expect(self, task: str) -> None:
        """Start recording the times of ``task``."""
        with self._cond:
            self._expected.add(task)

    def wait(self, task: str, timeout: float) -> None:
        """Wait until both times of ``task`` are known (or ``timeout`` passes)."""
        with self._cond:
            self._cond.wait_for(lambda: task in self.gone and task in self.ready, timeout)

    def _on_claims(self, events: list[WatchEvent]) -> None:
        now = time.time()
        for event in events:
            if event.deleted:
                self._note(self.gone, event.key.rsplit("/", 1)[1], now)

    def _on_tasks(self, events: list[WatchEvent]) -> None:
        now = time.time()
        for event in events:
            task = event.key.rsplit("/", 1)[1]
            if event.deleted or task not in self._expected:
                continue
            record = decode(TaskRecord, event.value)
            # attempt >= 1: READY after a claim (the reclaim), not the READY of its creation.
            if record.state is TaskState.READY and record.attempt >= 1:
                self._note(self.ready, task, now)

    def _note(self, times: dict[str, float], task: str, at: float) -> None:
        with self._cond:
            if task in self._expected and task not in times:
                times[task] = at
                self._cond.notify_all()

    def close(self) -> None:
        """Stop the watches."""
        for watch in self._watches:
            watch.close()


class Holder:
    """One ``bench.reclaim_worker`` process and the lines it reports."""

    def __init__(self, target: str, name: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.reclaim_worker", "--target", target, "--principal", name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        lifeline.kill_with_parent(self.proc.pid)  # even if the bench is SIGKILLed
        self._lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, name=f"read-{name}", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._lines.put(json.loads(line))
            except ValueError:
                continue

    def next_line(self, timeout: float) -> dict[str, Any]:
        """The next reported line; ``{"op": "timeout"}`` if none came in time."""
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return {"op": "timeout"}

    def send(self, line: str) -> None:
        """One command line."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` if the process still runs."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        """Resume it if paused, ask it to exit, kill it if it does not."""
        self.signal(signal.SIGCONT)
        try:
            self.send("exit")
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        lifeline.spare(self.proc.pid)


def _one_sample(
    holder: Holder, taker: WorkerClient, seeder: TaskSeeder, watch: KeyWatch, queue_name: str
) -> Sample | str:
    """Pause one holder on one task; returns the sample, or why it is not one."""
    seeder.seed(queue_name, 1)
    task = task_id(queue_name, 0)
    watch.expect(task)
    time.sleep(random.uniform(0.0, 0.5))
    holder.send(f"claim {queue_name} {TTL}")
    line = holder.next_line(timeout=20)
    if line.get("op") == "holding":
        holder.signal(signal.SIGSTOP)
    stopped_at = time.time()
    try:
        if line.get("op") != "holding":
            return f"worker did not hold the task: {line}"
        expires, ttl = float(line["lease_expires_at"]), float(line["ttl"])
        if stopped_at - float(line["claimed_at"]) > ttl / 3 - 0.05:
            return "stopped too late: the keepalive may have renewed first"
        time.sleep(max(0.0, expires - 0.1 - time.time()))
        held_at = _take(taker, queue_name, until=expires + 15)
        watch.wait(task, timeout=5)
        return Sample(
            task=task,
            ttl=ttl,
            lease_gone=_after(watch.gone.get(task), expires),
            ready=_after(watch.ready.get(task), expires),
            held=_after(held_at, expires),
        )
    finally:
        holder.signal(signal.SIGCONT)


def _take(taker: WorkerClient, queue_name: str, *, until: float) -> float | None:
    """Poll ClaimNext until this worker holds the task; the time it did (then commit it)."""
    while time.time() < until:
        claimed = taker.claim_next(queue_name, ttl=timedelta(seconds=30))
        if not isinstance(claimed, ClaimRefused):
            held_at = time.time()
            claimed.commit(RESULT)
            return held_at
        if claimed.outcome is not Outcome.NO_READY_TASK:
            return None
        time.sleep(_POLL)
    return None


def _after(at: float | None, expires: float) -> float | None:
    return round(at - expires, 4) if at is not None else None


def run_reclaim(
    target: str, kv: EtcdKV, seeder: TaskSeeder, *, samples: int, parallel: int
) -> dict[str, Any]:
    """Take ``samples`` samples on ``parallel`` worker processes; returns the summary."""
    watch = KeyWatch(kv, seeder.keys)
    holders = [Holder(target, f"reclaim-holder-{i}") for i in range(parallel)]
    takers = [
        WorkerClient(target, principal=f"reclaim-taker-{i}", channel_options=GRPC_OPTIONS)
        for i in range(parallel)
    ]
    taken: list[Sample] = []
    problems: list[str] = []
    lock = threading.Lock()

    def drive(i: int) -> None:
        if holders[i].next_line(timeout=60).get("op") != "started":
            with lock:
                problems.append(f"reclaim worker {i} did not start")
            return
        for n in range(i, samples, parallel):
            outcome = _one_sample(holders[i], takers[i], seeder, watch, f"rc-{n:03d}")
            with lock:
                if isinstance(outcome, Sample):
                    taken.append(outcome)
                else:
                    problems.append(outcome)

    try:
        # Daemons: a phase cut off at the bench's time bound must not hold its exit.
        threads = [threading.Thread(target=drive, args=(i,), daemon=True) for i in range(parallel)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for holder in holders:
            holder.stop()
        for taker in takers:
            taker.close()
        watch.close()
    for n in range(samples):
        seeder.drop(f"rc-{n:03d}")
    say(f"reclaim: {len(taken)} samples, {len(problems)} discarded")
    return summarize(taken, problems)


def summarize(taken: list[Sample], problems: list[str]) -> dict[str, Any]:
    """p50 / p95 / max of each delay, plus the raw samples."""

    def spread(values: list[float | None]) -> dict[str, float | None]:
        known = [v for v in values if v is not None]
        out: dict[str, float | None] = {
            "p50": percentile(known, 50),
            "p95": percentile(known, 95),
            "max": max(known) if known else None,
        }
        return {k: round(v, 3) if v is not None else None for k, v in out.items()}

    return {
        "ttl_s": taken[0].ttl if taken else float(TTL),
        "samples": len(taken),
        "discarded": problems,
        "lease_gone_s_after_ttl": spread([s.lease_gone for s in taken]),
        "ready_s_after_ttl": spread([s.ready for s in taken]),
        "held_by_another_s_after_ttl": spread([s.held for s in taken]),
        "raw": [
            {"task": s.task, "lease_gone": s.lease_gone, "ready": s.ready, "held": s.held}
            for s in taken
        ],
    }
