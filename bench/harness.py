"""Run N worker threads through claim-and-commit cycles for a fixed time, and measure them.

All workers of a run wait on one barrier; the CPU of the three processes is read just before
it opens and again once every worker has stopped, so the throughput and the CPU cover the same
window. A worker stops at the deadline (it finishes the cycle in flight), when its scenario
runs out of tasks, or after too many errors.

Workers are threads of this one process. Why: it is how the issue's reference figures were
taken, it gives every scenario the same client (one interpreter, one GIL, whose CPU is read
from one /proc entry), and on a 2-core machine more client processes would only take CPU from
etcd and the coordinator, which are what is being compared.
"""

from __future__ import annotations

import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.procs import CpuSnapshot, Meter

CycleFn = Callable[[], tuple[float, float]]
"""One claim-and-commit cycle on a fresh task; returns (claim seconds, commit seconds)."""

_MAX_ERRORS_PER_WORKER = 20


def say(message: str) -> None:
    """One progress line on stderr (stdout carries only the report)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


class Exhausted(Exception):
    """The scenario has no task left for this run: the worker stops."""


@dataclass(frozen=True)
class RunSpec:
    """One timed run of one scenario at one concurrency level."""

    name: str
    level: int
    round: int
    # How many tasks to seed so that the workers never run dry before the deadline.
    expected_cycles: int


class Scenario(ABC):
    """One way to claim a task, write its result and let it go (a, b, c or d)."""

    key: str = ""
    title: str = ""

    def __init__(self) -> None:
        # Set when the scenario cannot run here (say, a missing optional package).
        self.skip_reason: str | None = None

    @abstractmethod
    def setup(self, max_level: int) -> None:
        """Create one client per worker (off the clock); may set ``skip_reason``."""

    @abstractmethod
    def prepare(self, spec: RunSpec) -> list[CycleFn]:
        """Seed what the run needs and return one cycle function per worker."""

    def finish(self) -> None:  # noqa: B027 - optional hook
        """Clean up after a run, off the clock."""

    def counters(self) -> dict[str, int]:
        """Scenario-specific counts of the last run (reported beside the figures)."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Close the clients."""


@dataclass
class RunResult:
    """What one run measured."""

    scenario: str
    level: int
    round: int
    cycles: int
    elapsed: float
    cpu: CpuSnapshot
    claim: list[float] = field(default_factory=list)
    commit: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    exhausted: bool = False
    extra: dict[str, int] = field(default_factory=dict)
    # gRPC calls etcd answered during the window (every client's), None if not read.
    etcd_calls: float | None = None

    @property
    def rate(self) -> float:
        """Cycles per second over the window."""
        return self.cycles / self.elapsed if self.elapsed > 0 else 0.0


@dataclass
class _WorkerLog:
    claim: list[float] = field(default_factory=list)
    commit: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    exhausted: bool = False


def run_workers(
    scenario: str, spec: RunSpec, cycles: list[CycleFn], *, duration: float, meter: Meter
) -> RunResult:
    """Run one thread per cycle function until ``duration`` has passed; measure the window."""
    barrier = threading.Barrier(len(cycles) + 1)
    logs = [_WorkerLog() for _ in cycles]
    deadline = [0.0]

    def work(fn: CycleFn, log: _WorkerLog) -> None:
        barrier.wait()
        while time.monotonic() < deadline[0]:
            try:
                claim, commit = fn()
            except Exhausted:
                log.exhausted = True
                return
            except Exception as exc:
                log.errors += 1
                log.first_error = log.first_error or f"{type(exc).__name__}: {exc}"[:300]
                if log.errors >= _MAX_ERRORS_PER_WORKER:
                    return
                time.sleep(0.01)
                continue
            log.claim.append(claim)
            log.commit.append(commit)

    threads = [
        threading.Thread(target=work, args=(fn, log), name=f"bench-{scenario}-{i}", daemon=True)
        for i, (fn, log) in enumerate(zip(cycles, logs, strict=True))
    ]
    for thread in threads:
        thread.start()
    calls_before = meter.etcd_calls()
    before = meter.snapshot()
    started = time.monotonic()
    deadline[0] = started + duration
    barrier.wait()
    hung = 0
    for thread in threads:
        # A cycle in flight ends by its RPC deadlines (10 s at most).
        thread.join(timeout=max(0.0, deadline[0] + 30 - time.monotonic()))
        hung += thread.is_alive()
    elapsed = time.monotonic() - started
    cpu = meter.snapshot() - before
    calls_after = meter.etcd_calls()
    result = RunResult(
        scenario=scenario,
        level=spec.level,
        round=spec.round,
        cycles=sum(len(log.claim) for log in logs),
        elapsed=elapsed,
        cpu=cpu,
        claim=[x for log in logs for x in log.claim],
        commit=[x for log in logs for x in log.commit],
        errors=sum(log.errors for log in logs) + hung,
        first_error=next((log.first_error for log in logs if log.first_error), ""),
        exhausted=any(log.exhausted for log in logs),
        etcd_calls=(
            calls_after - calls_before
            if calls_after is not None and calls_before is not None
            else None
        ),
    )
    if hung:
        result.first_error = result.first_error or f"{hung} worker(s) still running after 30 s"
    return result
