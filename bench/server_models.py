"""``python -m bench.server_models``: what one call costs a server in each model, same work.

The coordinator's CPU per claim -> commit cycle is mostly not its own logic: on 2 cores about
45% of its samples are in the kernel, switching threads (docs/performance.md, "Where the rest
goes: thread hand-offs"). This measures that cost apart from the coordinator: six servers
that do the same work per call (bench/model_server.py: an etcd read, ~120 us of Python, an etcd
txn) and differ only in how a call reaches it - grpc's sync server with a thread per call, its
txns sent one by one or through the coordinator's group commit (as it serves today); grpc.aio
with the work and the etcd calls on one event loop, its txns sent one by one or batched per
turn of the loop; grpc.aio handing the sync handler to a thread pool; and the sync server
handing each call's work to one event loop thread.

Each model serves ``--workers`` client threads (this process) for ``--seconds``, in an order
reversed every other round, on one etcd. One row per model: medians over the rounds of calls a
second, the server's CPU per call and its context switches per call (every thread's, from
``/proc``), with the lowest and highest, and etcd's CPU and calls answered per call (its own
``/metrics``), which batching cuts. Bounded: rounds x models runs of ``--seconds`` plus a
few seconds each to start; etcd's history is compacted after each run, off the clock (a store
that lives on needs a bound, and a model must not pay for the history the ones before it left);
every server and the etcd die with this process, even on SIGKILL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc

from bench.harness import say
from bench.machine import load_average
from bench.model_server import METHOD, MODELS
from bench.procs import GRPC_OPTIONS, context_switches, cpu_seconds, etcd_calls, etcd_compactor
from coordinator import lifeline
from coordinator.etcd_process import EtcdProcess, find_etcd_binary, stop_child_group

_ROOT = Path(__file__).resolve().parent.parent
_WARM_UP = 1.0


@dataclass(frozen=True)
class Sample:
    """One model's figures over one run's window."""

    calls_per_s: float
    cpu_ms_per_call: float
    switches_per_call: float
    etcd_cpu_ms_per_call: float
    etcd_calls_per_call: float


def main(argv: list[str] | None = None) -> int:
    """Run every model ``--rounds`` times; print the table (and write ``--json``)."""
    ns = _parser().parse_args(argv)
    models = [m for m in ns.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        print(f"unknown model(s) {unknown}; choose from {MODELS}", file=sys.stderr)
        return 2
    before = load_average()
    samples: dict[str, list[Sample]] = {m: [] for m in models}
    with (
        EtcdProcess(binary=find_etcd_binary(ns.etcd_bin)) as etcd,
        etcd_compactor(etcd) as compact,
    ):
        for rnd in range(ns.rounds):
            for model in models if rnd % 2 == 0 else models[::-1]:
                sample = run_model(model, etcd, workers=ns.workers, seconds=ns.seconds)
                compact()
                samples[model].append(sample)
                say(
                    f"round {rnd} {model}: {sample.calls_per_s:.0f} calls/s, "
                    f"{sample.cpu_ms_per_call:.3f} ms CPU and "
                    f"{sample.switches_per_call:.1f} switches per call"
                )
    report = {
        "workers": ns.workers,
        "seconds": ns.seconds,
        "load_before": before,
        "load_after": load_average(),
        "models": {m: [asdict(s) for s in samples[m]] for m in models},
    }
    print(table(samples))
    print(f"load average before {before}, after {report['load_after']}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(report, indent=2))
    return 0


def run_model(model: str, etcd: EtcdProcess, *, workers: int, seconds: float) -> Sample:
    """One run: start the model's server, load it from ``workers`` threads, stop it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.model_server", model, etcd.endpoint],
        cwd=_ROOT,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    lifeline.kill_with_parent(proc.pid)  # even if this process is SIGKILLed
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().decode().strip()
        if not port.isdigit():
            raise RuntimeError(f"{model} server did not start (exit code {proc.poll()})")
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
            call(b"warm-up", wait_for_ready=True, timeout=30)
            return _load(call, proc.pid, etcd, workers=workers, seconds=seconds)
    finally:
        stop_child_group(proc, 5.0)
        lifeline.spare(proc.pid)


def _load(
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes],
    pid: int,
    etcd: EtcdProcess,
    *,
    workers: int,
    seconds: float,
) -> Sample:
    counts = [0] * workers
    stop = threading.Event()

    def loop(index: int) -> None:
        key = b"k%d" % index
        while not stop.is_set():
            call(key, timeout=30)
            counts[index] += 1

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    time.sleep(_WARM_UP)
    calls, started = sum(counts), time.monotonic()
    cpu, switches = cpu_seconds(pid), context_switches(pid)
    etcd_cpu, etcd_answered = cpu_seconds(etcd.pid), etcd_calls(etcd.client_url)
    time.sleep(seconds)
    calls = sum(counts) - calls
    cpu, switches = cpu_seconds(pid) - cpu, context_switches(pid) - switches
    etcd_cpu = cpu_seconds(etcd.pid) - etcd_cpu
    etcd_answered = etcd_calls(etcd.client_url) - etcd_answered
    elapsed = time.monotonic() - started
    stop.set()
    for thread in threads:
        thread.join(timeout=35)
    n = max(calls, 1)
    return Sample(
        calls / elapsed, cpu * 1000 / n, switches / n, etcd_cpu * 1000 / n, etcd_answered / n
    )


def table(samples: dict[str, list[Sample]]) -> str:
    """Markdown: one row per model, medians (lowest - highest) over the rounds."""

    def cell(values: list[float], digits: int) -> str:
        return (
            f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f} - {max(values):.{digits}f})"
        )

    lines = [
        "| model | calls/s | server CPU ms/call | context switches/call | etcd CPU ms/call "
        "| etcd calls/call |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model, runs in samples.items():
        if runs:
            lines.append(
                f"| {model} | {cell([s.calls_per_s for s in runs], 0)} "
                f"| {cell([s.cpu_ms_per_call for s in runs], 3)} "
                f"| {cell([s.switches_per_call for s in runs], 1)} "
                f"| {cell([s.etcd_cpu_ms_per_call for s in runs], 3)} "
                f"| {cell([s.etcd_calls_per_call for s in runs], 2)} |"
            )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.server_models",
        description="The cost of a call in each server model, the same work per call.",
    )
    p.add_argument("--workers", type=int, default=32, help="client threads (default 32)")
    p.add_argument(
        "--seconds", type=float, default=8.0, help="seconds measured per run (default 8)"
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated ({','.join(MODELS)})"
    )
    p.add_argument("--json", help="also write the figures as JSON")
    p.add_argument("--etcd-bin", help="the etcd binary (default: found as for coordinator demo)")
    return p


if __name__ == "__main__":
    sys.exit(main())
