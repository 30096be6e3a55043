"""``python -m bench.compare NAME=DIR[@ARG,...] ...``: coordinator checkouts side by side.

What one change buys, measured the only way that means anything on a shared machine: in one run,
interleaved. Each checkout's ``coordinator serve`` runs from its own directory (so its own code:
see ``CoordinatorProcess(cwd=...)``) on its own key prefix of one etcd, with any extra serve
flags after ``@`` (comma-separated). Scenario a runs against each in turn and the raw floor b
beside them, in an order reversed every other round; etcd's history is compacted after each run.

One markdown row per checkout: median cycles/s, median ratio to the floor (paired by round), and
medians of CPU ms per cycle of the client, of the coordinator and of etcd, of etcd calls per
cycle and of the coordinator's context switches per cycle (its thread hand-offs, every thread's
count from ``/proc``); the coordinator's CPU, its switches and the etcd calls include the tail
its background loops leave once the window closes (deferred work is not a saving). Below it,
the machine's load average before and after the comparison (how busy the machine was). To
measure a change, copy the tree before it (``git archive HEAD | tar -x -C /tmp/before``) and run
``python -m bench.compare before=/tmp/before after=.``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import etcd3

from bench.harness import RunSpec, Scenario, run_workers, say
from bench.machine import busier_than, cores, load_average
from bench.procs import (
    GRPC_OPTIONS,
    CoordinatorProcess,
    Meter,
    compact_now,
    cpu_seconds,
    scratch_dir,
)
from bench.scenarios import CoordinatorScenario, RawFloorScenario
from bench.seed import TaskSeeder
from coordinator.domain.keys import Keyspace
from coordinator.etcd_process import EtcdProcess, find_etcd_binary
from coordinator.store.etcd.kv import EtcdKV

FLOOR = "floor"


@dataclass(frozen=True)
class Checkout:
    """One version under test: a name, the directory it runs from, extra ``serve`` flags."""

    name: str
    path: Path
    args: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Checkout:
        """``NAME=DIR[@ARG,ARG]``."""
        name, sep, rest = text.partition("=")
        if not sep or not name or not rest or name == FLOOR:
            raise ValueError(f"expected NAME=DIR[@ARG,...] (NAME not {FLOOR!r}), got {text!r}")
        path, _, args = rest.partition("@")
        return cls(name, Path(path).resolve(), tuple(a for a in args.split(",") if a))


@dataclass
class _Runs:
    rates: list[float] = field(default_factory=list)
    # (client, coordinator incl. tail, etcd) CPU ms per cycle, etcd calls per cycle, and the
    # coordinator's context switches per cycle (incl. tail).
    per_cycle: list[tuple[float, float, float, float, float]] = field(default_factory=list)


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n")[0])
    p.add_argument("checkouts", nargs="+", help="NAME=DIR[@ARG,...] (DIR holds coordinator/)")
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=3.0, help="seconds per run")
    p.add_argument("--etcd-bin")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the table; 2 on a bad argument."""
    ns = parse(argv)
    try:
        checkouts = [Checkout.parse(text) for text in ns.checkouts]
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    missing = [c.path for c in checkouts if not (c.path / "coordinator").is_dir()]
    if missing or len({c.name for c in checkouts}) < len(checkouts):
        print(
            f"each NAME once, each DIR with a coordinator/ package (not: {missing})",
            file=sys.stderr,
        )
        return 2
    load_before = load_average()
    runs = compare(
        checkouts,
        workers=ns.workers,
        rounds=ns.rounds,
        duration=ns.duration,
        etcd_bin=ns.etcd_bin,
    )
    sys.stdout.write(table([c.name for c in checkouts], runs))
    sys.stdout.write(load_line(load_before, load_average()))
    return 0


def load_line(before: list[float], after: list[float]) -> str:
    """The machine's load average around the comparison, beside its core count: how busy the
    machine was (the interleaved rounds share it alike; docs/performance.md)."""
    n = cores()

    def fmt(load: list[float]) -> str:
        return " / ".join(f"{v:.2f}" for v in load)

    busy = ", busier than its cores" if busier_than(n, before, after) else ""
    return (
        f"\nLoad average (1 / 5 / 15 min) before {fmt(before)}, after {fmt(after)}; "
        f"{n} cores{busy}.\n"
    )


def compare(
    checkouts: Sequence[Checkout],
    *,
    workers: int,
    rounds: int,
    duration: float,
    etcd_bin: str | None = None,
) -> dict[str, _Runs]:
    """Every checkout and the floor, ``rounds`` times each, interleaved."""
    runs = {name: _Runs() for name in [*(c.name for c in checkouts), FLOOR]}
    with (
        scratch_dir("coordinator-compare-") as tmp,
        EtcdProcess(binary=find_etcd_binary(etcd_bin)) as etcd,
    ):
        kv = EtcdKV.connect([etcd.endpoint], timeout=60)
        client = etcd3.client(etcd.host, etcd.port, timeout=60, grpc_options=GRPC_OPTIONS)
        servers: dict[str, CoordinatorProcess] = {}
        scenarios: dict[str, Scenario] = {}
        try:
            for c in checkouts:
                server = CoordinatorProcess(
                    etcd.endpoint,
                    prefix=f"/compare-{c.name}",
                    log_path=tmp / f"{c.name}.log",
                    cwd=c.path,
                    extra_args=c.args,
                )
                servers[c.name] = server.start()
                seeder = TaskSeeder(kv, Keyspace(f"/compare-{c.name}"))
                scenarios[c.name] = CoordinatorScenario(server.target, seeder)
            scenarios[FLOOR] = RawFloorScenario(etcd.host, etcd.port)
            for scenario in scenarios.values():
                scenario.setup(workers)
            names = list(scenarios)
            for rnd in range(rounds):
                for name in names if rnd % 2 == 0 else names[::-1]:
                    server_pid = servers[name].pid if name in servers else os.getpid()
                    meter = Meter(server_pid, etcd.pid, etcd.client_url)
                    _one(name, scenarios[name], meter, runs[name], workers, rnd, duration)
                    compact_now(client)
        finally:
            for scenario in scenarios.values():
                scenario.close()
            for server in servers.values():
                server.stop()
            client.close()
            kv.close()
    return runs


def _one(
    name: str,
    scenario: Scenario,
    meter: Meter,
    into: _Runs,
    workers: int,
    rnd: int,
    duration: float,
) -> None:
    spec = RunSpec(f"{name}-r{rnd}", workers, rnd, expected_cycles=int(2000 * duration) + 100)
    cycles = scenario.prepare(spec)
    meter.settle(5.0)
    server_cpu = cpu_seconds(meter.coordinator_pid)
    switches = sum(meter.switches().values())
    calls = meter.etcd_calls() or 0.0
    result = run_workers(name, spec, cycles, duration=duration, meter=meter)
    meter.settle(10.0)  # the background loops' tail belongs to this run
    server_cpu = cpu_seconds(meter.coordinator_pid) - server_cpu
    switches = sum(meter.switches().values()) - switches
    calls = (meter.etcd_calls() or 0.0) - calls
    scenario.finish()
    n = max(result.cycles, 1)
    coordinator_ms = 0.0 if name == FLOOR else server_cpu * 1000 / n
    coordinator_switches = 0.0 if name == FLOOR else switches / n
    into.rates.append(result.rate)
    into.per_cycle.append(
        (
            result.cpu.client * 1000 / n,
            coordinator_ms,
            result.cpu.etcd * 1000 / n,
            calls / n,
            coordinator_switches,
        )
    )
    say(
        f"round {rnd} {name}: {result.rate:.1f} cycles/s, coordinator {coordinator_ms:.2f} "
        f"ms/cycle, {result.errors} errors {result.first_error[:80]}"
    )


def table(names: Sequence[str], runs: dict[str, _Runs]) -> str:
    """The markdown table (checkouts in the order given, then the floor)."""
    lines = [
        "| checkout | cycles/s | / floor | CPU ms/cycle client / coordinator (+tail) / etcd "
        "| etcd calls/cycle | coordinator context switches/cycle |",
        "| --- | ---: | ---: | --- | ---: | ---: |",
    ]
    floor = runs[FLOOR].rates
    for name in [*names, FLOOR]:
        r = runs[name]
        if not r.rates:
            continue
        paired = [a / b for a, b in zip(r.rates, floor, strict=False) if b]
        vs_floor = statistics.median(paired) if paired else float("nan")
        client, server, etcd, calls, switches = (
            statistics.median(x[i] for x in r.per_cycle) for i in range(5)
        )
        lines.append(
            f"| {name} | {statistics.median(r.rates):.0f} | {vs_floor:.2f} "
            f"| {client:.2f} / {server:.2f} / {etcd:.2f} | {calls:.2f} | {switches:.0f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
