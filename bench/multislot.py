"""Multi-slot workers (issue 27 item 2): ``PROCESSES`` worker processes of ``SLOTS`` slots each
against the raw floor at the same total concurrency (b with ``PROCESSES * SLOTS`` workers).

Each round runs both, the order alternating per round: b exactly as in the throughput phase
(worker threads of this process, bench/harness.py), then or before it the multi-slot run. That
run lets the coordinator and etcd go idle, starts the real ``coordinator worker --slots SLOTS``
processes on its empty queue (handler ``bench.multislot:handle``, which returns the result at
once: as in every scenario, the cycle is what is measured), waits until every one claims (its
ready file exists), then seeds the queue; the window opens once the seeding is done, so it
measures the processes at full speed, and lasts the run's duration.

Its cycles are the tasks claimed in the window: the queue's ready-index keys counted at both
ends. A claimed task is committed milliseconds later, so claims and commits differ by at most
the claims in flight (``PROCESSES * SLOTS``). The workers' CPU (every process's, read from
/proc) is the client's; the coordinator's and etcd's are read as in every run. The ratio is the
median over rounds of multi-slot / b, paired by round.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import RunResult, RunSpec, Scenario, run_workers, say
from bench.procs import CpuSnapshot, Meter, cpu_seconds, etcd_compactor, scratch_dir
from bench.scenarios.coordinator import RESULT
from bench.scenarios.raw import RawFloorScenario
from bench.seed import TaskSeeder
from bench.throughput import paired_ratio, summarize
from coordinator import lifeline
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Cancellation, Claim

PROCESSES, SLOTS = 4, 8
"""The multi-slot scenario's shape: its total concurrency is b's worker count."""

KEY = "m"
"""The scenario's key in the report's rows (b's rows beside it keep theirs)."""

# Seeding: cycles/s assumed until a run measured it, the margin over the window, the bound.
_FIRST_GUESS, _SEED_MARGIN, _MAX_SEED = 1500.0, 1.6, 20_000
# Seconds a worker process may take to start claiming (imports on a busy machine), and to exit.
_START_LIMIT, _STOP_LIMIT = 60.0, 20.0
_REPO = Path(__file__).resolve().parents[1]
_WORKER = "import sys; from coordinator.cli import main; sys.exit(main())"


def handle(claim: Claim, cancel: Cancellation) -> bytes:
    """The workers' handler: the result at once (``coordinator worker bench.multislot:handle``)."""
    return RESULT


@dataclass(frozen=True)
class MultiSlotPlan:
    """Rounds, the window of each run, and where the workers' ready files and logs go."""

    rounds: int
    duration: float
    workdir: Path
    settle: float = 3.0


def run_multislot(
    target: str,
    raw: Scenario,
    seeder: TaskSeeder,
    meter: Meter,
    plan: MultiSlotPlan,
    *,
    compact: Callable[[], None],
) -> dict[str, Any]:
    """Every round of b and the multi-slot run side by side; rows, the paired ratio."""
    level = PROCESSES * SLOTS
    raw.setup(level)
    results: list[RunResult] = []
    rate = {"b": _FIRST_GUESS, KEY: _FIRST_GUESS}
    for rnd in range(plan.rounds):
        order = ("b", KEY) if rnd % 2 == 0 else (KEY, "b")
        for key in order:
            spec = RunSpec(f"ms{rnd}-{key}", level, rnd, _seed_size(rate[key], plan.duration))
            if key == "b":
                cycles = raw.prepare(spec)
                meter.settle(plan.settle)
                result = run_workers("b", spec, cycles, duration=plan.duration, meter=meter)
                raw.finish()
            else:
                result = _multi_slot_run(target, seeder, meter, plan, spec)
            compact()
            if not result.errors:
                rate[key] = max(rate[key], result.rate * (2 if result.exhausted else 1))
            results.append(result)
            say(f"multislot round {rnd} {key}: {result.rate:8.1f} cycles/s ({result.cycles})")
    return {
        "processes": PROCESSES,
        "slots": SLOTS,
        "rows": summarize(results),
        "ratio_m_b": paired_ratio(results, KEY, "b", level),
    }


def multislot_need(config: dict[str, Any]) -> float:
    """Seconds the phase needs at most (for the run's budget): per round, two windows, their
    settling and the workers' start and stop on a busy machine."""
    rounds, duration = int(config["rounds"]), float(config["duration_s"])
    return rounds * (2 * (duration + 3.0) + 30.0)


def _seed_size(rate: float, duration: float) -> int:
    # The multi-slot run's workers also claim while it seeds: the margin covers that too.
    return min(_MAX_SEED, math.ceil(rate * duration * _SEED_MARGIN) + 8 * PROCESSES * SLOTS)


def _multi_slot_run(
    target: str, seeder: TaskSeeder, meter: Meter, plan: MultiSlotPlan, spec: RunSpec
) -> RunResult:
    """One window of the worker processes (see the module). They start on the empty queue and
    long-poll it, and are fed by the seeding: tasks seeded before they all claim would be
    worked through by the first one up while the others still import."""
    queue = f"ms-{spec.name}"
    meter.settle(plan.settle)
    workers = [_Worker(target, queue, plan.workdir / f"{spec.name}-w{i}") for i in range(PROCESSES)]
    # Said as soon as they exist (each is tied to this process's life already): a killed bench
    # must leave none behind, whether or not they got to claim.
    say(f"multislot worker pids {' '.join(str(w.proc.pid) for w in workers)}, on {queue}")
    try:
        problem = _wait_claiming(workers)
        seeder.seed(queue, spec.expected_cycles)
        left, calls, cpu, workers_cpu = _reading(seeder, queue, meter, workers)
        started = time.monotonic()
        time.sleep(plan.duration)  # the window: the processes work on their own
        elapsed = time.monotonic() - started
        left_after, calls_after, cpu_after, workers_after = _reading(seeder, queue, meter, workers)
        problem = problem or next((w.died() for w in workers if w.died()), "")
    finally:
        for worker in workers:
            worker.stop()
        seeder.drop(queue)
    used = cpu_after - cpu
    return RunResult(
        scenario=KEY,
        level=spec.level,
        round=spec.round,
        cycles=left - left_after,
        elapsed=elapsed,
        cpu=CpuSnapshot(workers_after - workers_cpu, used.coordinator, used.etcd),
        errors=1 if problem else 0,
        first_error=problem,
        exhausted=left_after == 0,
        etcd_calls=calls_after - calls if calls is not None and calls_after is not None else None,
    )


def _reading(
    seeder: TaskSeeder, queue: str, meter: Meter, workers: list[_Worker]
) -> tuple[int, float | None, CpuSnapshot, float]:
    """The queue's ready tasks, etcd's calls, the three processes' CPU and the workers'."""
    return seeder.ready(queue), meter.etcd_calls(), meter.snapshot(), sum(w.cpu() for w in workers)


def _wait_claiming(workers: list[_Worker]) -> str:
    """Wait until every worker claims; what went wrong if one died or never got there."""
    deadline = time.monotonic() + _START_LIMIT
    while time.monotonic() < deadline:
        if died := next((w.died() for w in workers if w.died()), ""):
            return died
        if all(w.claiming() for w in workers):
            return ""
        time.sleep(0.05)
    return f"a worker process did not start claiming within {_START_LIMIT:g} s"


class _Worker:
    """One ``coordinator worker --slots SLOTS`` process, tied to this one's life."""

    def __init__(self, target: str, queue: str, base: Path) -> None:
        self._ready, self._log = base.with_suffix(".ready"), base.with_suffix(".log")
        args = ["worker", "bench.multislot:handle", "--queue", queue, "--slots", str(SLOTS)]
        args += ["--grace", "0", "--ready-file", str(self._ready), "--log-level", "warning"]
        args += ["--target", target, "--insecure", "--principal", base.name]
        env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
        with self._log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER, *args], cwd=_REPO, stderr=log, env=env
            )
        lifeline.kill_with_parent(self.proc.pid)  # a killed bench leaves no worker behind

    def claiming(self) -> bool:
        """Whether the pool claims (its ready file exists)."""
        return self._ready.exists()

    def died(self) -> str:
        """Why the process ended before it was stopped, or ''."""
        code = self.proc.poll()
        if code is None:
            return ""
        tail = self._log.read_text(errors="replace").strip().splitlines()[-1:]
        return f"worker {self._log.stem} exited {code}: {' '.join(tail)}"[:300]

    def cpu(self) -> float:
        """CPU seconds of the process so far (0 once it is gone)."""
        try:
            return cpu_seconds(self.proc.pid)
        except (FileNotFoundError, ProcessLookupError):
            return 0.0

    def stop(self) -> None:
        """SIGTERM (grace 0: the claims in flight are given back), then SIGKILL if it hangs."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(_STOP_LIMIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        lifeline.spare(self.proc.pid)


def multislot_phase(
    target: str,
    etcd: EtcdProcess,
    seeder: TaskSeeder,
    meter: Meter,
    *,
    rounds: int,
    duration: float,
) -> dict[str, Any]:
    """The phase on the first coordinator, with a raw floor of its own and a scratch directory
    for the workers' ready files and logs (removed even if the bench is SIGKILLed)."""
    raw = RawFloorScenario(etcd.host, etcd.port)
    with scratch_dir("coordinator-bench-multislot-") as workdir, etcd_compactor(etcd) as compact:
        try:
            return run_multislot(
                target,
                raw,
                seeder,
                meter,
                MultiSlotPlan(rounds, duration, workdir),
                compact=compact,
            )
        finally:
            raw.close()
