"""``python -m bench --profile DIR``: where the coordinator's CPU goes per claim+commit cycle.

Runs scenario a alone (``--profile-workers`` threads, ``--profile-seconds`` long) with py-spy
recording the coordinator process and this client process, then ranks functions by the share of
samples they appear in (inclusive) and by the samples spent in them (self). Writes the folded
stacks (``coordinator.folded``, ``client.folded``; flame-graph tools read them) and
``summary.md`` into DIR, and prints the summary. Needs py-spy (``pip install -e '.[bench]'``),
which attaches with ptrace; it samples the thread holding the GIL (``--gil``: Python CPU) without
stopping the target (``--nonblocking``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.harness import RunSpec, run_workers, say
from bench.procs import CoordinatorProcess, Meter, context_switches, scratch_dir
from bench.scenarios import CoordinatorScenario
from bench.seed import TaskSeeder
from coordinator import lifeline
from coordinator.domain.keys import Keyspace
from coordinator.etcd_process import EtcdProcess, find_etcd_binary
from coordinator.store.etcd.kv import EtcdKV

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^:()]*)(?::\d+)?\)$")
_TOP = 30


def run_profile(ns: argparse.Namespace) -> int:
    """Profile scenario a under load; 0 on success, 2 without py-spy."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.access(spy, os.X_OK):
        print("py-spy is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    out: Path = ns.profile
    out.mkdir(parents=True, exist_ok=True)
    seconds, workers = float(ns.profile_seconds), int(ns.profile_workers)
    with (
        scratch_dir("coordinator-profile-") as tmp,
        EtcdProcess(binary=find_etcd_binary(ns.etcd_bin)) as etcd,
    ):
        kv = EtcdKV.connect([etcd.endpoint], timeout=60)
        seeder = TaskSeeder(kv, Keyspace("/coordinator-bench"))
        with CoordinatorProcess(
            etcd.endpoint,
            prefix="/coordinator-bench",
            log_path=tmp / "coordinator.log",
            log_level=ns.coordinator_log_level,
        ) as coordinator:
            meter = Meter(coordinator.pid, etcd.pid, etcd.client_url)
            scenario = CoordinatorScenario(coordinator.target, seeder)
            scenario.setup(workers)
            spec = RunSpec("profile", workers, 0, expected_cycles=int(1500 * seconds) + 100)
            cycles = scenario.prepare(spec)
            meter.settle(5.0)
            spies = [
                _spy(spy, coordinator.pid, out / "coordinator.folded", seconds),
                _spy(spy, os.getpid(), out / "client.folded", seconds),
            ]
            switches = context_switches(coordinator.pid)
            result = run_workers("a", spec, cycles, duration=seconds, meter=meter)
            switches = context_switches(coordinator.pid) - switches
            for proc in spies:
                proc.wait(timeout=seconds + 60)
                lifeline.spare(proc.pid)
            scenario.finish()
            scenario.close()
        kv.close()
    n = max(result.cycles, 1)
    header = (
        f"scenario a, {workers} workers, {result.elapsed:.1f} s: {result.rate:.1f} cycles/s, "
        f"CPU ms/cycle client {result.cpu.client * 1000 / n:.2f}, coordinator "
        f"{result.cpu.coordinator * 1000 / n:.2f}, etcd {result.cpu.etcd * 1000 / n:.2f}; "
        f"etcd calls/cycle {(result.etcd_calls or 0) / n:.2f}; coordinator context switches/cycle "
        f"{switches / n:.0f}"
    )
    parts = [f"# Profile\n\n{header}\n"]
    for name in ("coordinator", "client"):
        folded = out / f"{name}.folded"
        if folded.exists():
            parts.append(summarize_folded(name, folded.read_text()))
    summary = "\n".join(parts)
    (out / "summary.md").write_text(summary)
    sys.stdout.write(summary)
    return 0


def _spy(spy: str, pid: int, output: Path, seconds: float) -> subprocess.Popen[bytes]:
    say(f"py-spy recording pid {pid} for {seconds:.0f} s -> {output}")
    proc = subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "200",
            "--format",
            "raw",
            "--nonblocking",
            # Only the thread holding the GIL: Python CPU, not threads parked in gRPC calls.
            "--gil",
            "--output",
            str(output),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lifeline.kill_with_parent(proc.pid)  # a SIGKILLed bench must not leave it attached
    return proc


def summarize_folded(name: str, folded: str) -> str:
    """Top functions of one folded-stack file, by inclusive and by self samples."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in folded.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_function(frame) for frame in stack.split(";")]
        for func in set(frames):
            inclusive[func] += count
        own[frames[-1]] += count
    lines = [f"## {name}: {total} samples (GIL holder)", ""]
    for title, counter in (("inclusive", inclusive), ("self", own)):
        lines += [f"### by {title} share", "", "| % | function |", "| ---: | --- |"]
        for func, count in counter.most_common(_TOP):
            lines.append(f"| {100 * count / max(total, 1):.1f} | `{func}` |")
        lines.append("")
    return "\n".join(lines)


def _function(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``path/to/file.py:func`` (lines merged)."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    return f"{match['file']}:{match['func']}"
