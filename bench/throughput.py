"""Item 1: the four scenarios side by side, interleaved, at each concurrency level.

Order: for each round, for each level, every scenario once, in an order rotated per round and
level, so that drift (page cache, etcd's growing history, thermal) hits every scenario alike.
Before each run the coordinator and etcd are left to go idle, so one run's leftovers (the
reclaimer draining its watch, etcd applying revokes) do not land in the next one's window; after
each run etcd's history is compacted (off the clock), else every run pays for all earlier ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.harness import RunResult, RunSpec, Scenario, run_workers, say
from bench.procs import CpuSnapshot, Meter
from bench.stats import median, ratio, spread_ms

# Cycles/s per scenario assumed to size the seeding until a run has measured it.
_FIRST_GUESS = {"a": 1200.0, "b": 2000.0, "e": 1500.0}
_SEED_MARGIN = 1.6
_MAX_SEED = 20_000


@dataclass(frozen=True)
class ThroughputPlan:
    """Levels, rounds and the length of each run."""

    levels: tuple[int, ...]
    rounds: int
    duration: float
    settle: float = 3.0


def run_throughput(
    scenarios: Sequence[Scenario],
    plan: ThroughputPlan,
    meter: Meter,
    *,
    compact: Callable[[], None],
    deadline: float,
) -> list[RunResult]:
    """Every (round, level, scenario) run that fits before ``deadline`` (monotonic seconds).

    ``compact`` runs after each run, off the clock: it compacts etcd's history, as a deployment's
    periodic compaction would, so that later runs do not pay for the history of earlier ones.
    """
    for scenario in scenarios:
        if scenario.skip_reason is None:
            scenario.setup(max(plan.levels))
    active = [s for s in scenarios if s.skip_reason is None]
    measured: dict[tuple[str, int], float] = {}
    results: list[RunResult] = []
    for rnd in range(plan.rounds):
        for li, level in enumerate(plan.levels):
            shift = (rnd + li) % max(len(active), 1)
            for scenario in [*active[shift:], *active[:shift]]:
                if time.monotonic() + plan.duration + plan.settle > deadline:
                    say(f"time budget reached: skipping the rest from round {rnd} level {level}")
                    return results
                rate = measured.get((scenario.key, level), _FIRST_GUESS.get(scenario.key, 0.0))
                spec = RunSpec(
                    name=f"r{rnd}-l{level:02d}-{scenario.key}",
                    level=level,
                    round=rnd,
                    expected_cycles=min(
                        _MAX_SEED, math.ceil(rate * plan.duration * _SEED_MARGIN) + 8 * level
                    ),
                )
                cycles = scenario.prepare(spec)
                meter.settle(plan.settle)
                result = run_workers(
                    scenario.key, spec, cycles, duration=plan.duration, meter=meter
                )
                result.extra = scenario.counters()
                scenario.finish()
                compact()
                if not result.errors:
                    # A run that ran out of tasks went faster than seeded for: seed the next
                    # one for twice that (its own figure is kept, marked as such).
                    rate_seen = result.rate * (2 if result.exhausted else 1)
                    measured[(scenario.key, level)] = max(
                        measured.get((scenario.key, level), 0.0), rate_seen
                    )
                results.append(result)
                say(
                    f"round {rnd} level {level:2d} {scenario.key}: {result.rate:8.1f} cycles/s"
                    f" ({result.cycles} cycles, {result.errors} errors"
                    f"{', ran out of tasks' if result.exhausted else ''})"
                )
    return results


def summarize(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One row per (scenario, level): median rate over rounds, pooled latencies, CPU/cycle."""
    rows: list[dict[str, Any]] = []
    keys = sorted({(r.scenario, r.level) for r in results})
    for scenario, level in keys:
        runs = [r for r in results if r.scenario == scenario and r.level == level]
        cycles = sum(r.cycles for r in runs)
        cpu = CpuSnapshot(0.0, 0.0, 0.0)
        for r in runs:
            cpu = CpuSnapshot(
                cpu.client + r.cpu.client,
                cpu.coordinator + r.cpu.coordinator,
                cpu.etcd + r.cpu.etcd,
            )
        claim = [x for r in runs for x in r.claim]
        commit = [x for r in runs for x in r.commit]
        rows.append(
            {
                "scenario": scenario,
                "workers": level,
                "rounds": len(runs),
                "cycles": cycles,
                "cycles_per_s": _round(median([r.rate for r in runs])),
                "cycles_per_s_rounds": [round(r.rate, 1) for r in runs],
                "claim_ms": spread_ms(claim),
                "commit_ms": spread_ms(commit),
                "cpu_ms_per_cycle": {
                    "client": _per_cycle(cpu.client, cycles),
                    "coordinator": _per_cycle(cpu.coordinator, cycles),
                    "etcd": _per_cycle(cpu.etcd, cycles),
                },
                "etcd_calls_per_cycle": _calls_per_cycle(runs),
                "errors": sum(r.errors for r in runs),
                "first_error": next((r.first_error for r in runs if r.first_error), ""),
                "ran_out_of_tasks": sum(r.exhausted for r in runs),
                "counters": _sum_counters(runs),
            }
        )
    return rows


def paired_ratio(results: Sequence[RunResult], num: str, den: str, level: int) -> float | None:
    """Median over rounds of rate(num) / rate(den) at ``level``, paired by round."""
    by_round: dict[int, dict[str, float]] = {}
    for r in results:
        if r.level == level and r.scenario in (num, den):
            by_round.setdefault(r.round, {})[r.scenario] = r.rate
    ratios = [
        value
        for pair in by_round.values()
        if (value := ratio(pair.get(num), pair.get(den))) is not None
    ]
    return _round(median(ratios), 3)


def _sum_counters(runs: Sequence[RunResult]) -> dict[str, int]:
    total: dict[str, int] = {}
    for r in runs:
        for key, value in r.extra.items():
            total[key] = total.get(key, 0) + value
    return total


def _calls_per_cycle(runs: Sequence[RunResult]) -> float | None:
    """etcd round trips per cycle (every gRPC call etcd answered in the windows, background
    loops included), or None if a run did not read them."""
    counted = [r.etcd_calls for r in runs]
    cycles = sum(r.cycles for r in runs)
    if not cycles or any(c is None for c in counted):
        return None
    return round(sum(c for c in counted if c is not None) / cycles, 2)


def _per_cycle(seconds: float, cycles: int) -> float | None:
    return round(seconds * 1000 / cycles, 3) if cycles else None


def _round(value: float | None, digits: int = 1) -> float | None:
    return round(value, digits) if value is not None else None
