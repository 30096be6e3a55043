"""``python -m bench --profile DIR``: where the coordinator's CPU goes per claim+commit cycle.

Runs scenario a alone (``--profile-workers`` threads, ``--profile-seconds`` long) with py-spy
recording the coordinator process and this client process, then ranks functions by the share of
samples they appear in (inclusive) and by the samples spent in them (self). Writes the folded
stacks (``coordinator.folded``, ``client.folded``; flame-graph tools read them), etcd's own CPU
profile of the same window (``etcd.pb.gz``: etcd runs with ``--enable-pprof``; its areas close
the summary, bench/etcd_pprof.py) and ``summary.md`` into DIR, and prints the summary. Needs
py-spy (``pip install -e '.[bench]'``), which attaches with ptrace; it samples the thread
holding the GIL (``--gil``: Python CPU) without stopping the target (``--nonblocking``). The
summary starts with the coordinator's context switches per cycle by group of threads (``/proc``
counts, the threads named by ``py-spy dump``): where its hand-offs are, which no sample of
Python shows.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from bench import etcd_pprof
from bench.harness import RunSpec, run_workers, say
from bench.procs import CoordinatorProcess, Meter, scratch_dir
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
        EtcdProcess(binary=find_etcd_binary(ns.etcd_bin), extra_args=["--enable-pprof"]) as etcd,
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
            etcd_profile = _EtcdRecorder(etcd.client_url, out / "etcd.pb.gz", seconds)
            before = meter.switches()
            result = run_workers("a", spec, cycles, duration=seconds, meter=meter)
            after = meter.switches()
            etcd_profile.join()
            for proc in spies:
                proc.wait(timeout=seconds + 60)
                lifeline.spare(proc.pid)
            names = thread_names(_dump(spy, coordinator.pid))  # once the recorders let go
            scenario.finish()
            scenario.close()
        kv.close()
    n = max(result.cycles, 1)
    switches = sum(after.values()) - sum(before.get(tid, 0) for tid in after)
    header = (
        f"scenario a, {workers} workers, {result.elapsed:.1f} s: {result.rate:.1f} cycles/s, "
        f"CPU ms/cycle client {result.cpu.client * 1000 / n:.2f}, coordinator "
        f"{result.cpu.coordinator * 1000 / n:.2f}, etcd {result.cpu.etcd * 1000 / n:.2f}; "
        f"etcd calls/cycle {(result.etcd_calls or 0) / n:.2f}; coordinator context switches/cycle "
        f"{switches / n:.0f}"
    )
    parts = [f"# Profile\n\n{header}\n", switches_by_thread(before, after, names, n)]
    for name in ("coordinator", "client"):
        folded = out / f"{name}.folded"
        if folded.exists():
            parts.append(summarize_folded(name, folded.read_text()))
    if (out / "etcd.pb.gz").exists():
        raw = (out / "etcd.pb.gz").read_bytes()
        parts.append(etcd_pprof.summarize(etcd_pprof.areas(raw), n))
    summary = "\n".join(parts)
    (out / "summary.md").write_text(summary)
    sys.stdout.write(summary)
    return 0


class _EtcdRecorder:
    """etcd's CPU profile of the next ``seconds``, fetched on a thread into ``path`` (a failed
    fetch is said and leaves no file: the rest of the profile still stands)."""

    def __init__(self, client_url: str, path: Path, seconds: float) -> None:
        self._thread = threading.Thread(
            target=self._fetch, args=(client_url, path, max(1, round(seconds))), daemon=True
        )
        self._thread.start()

    @staticmethod
    def _fetch(client_url: str, path: Path, seconds: int) -> None:
        try:
            path.write_bytes(etcd_pprof.record(client_url, seconds))
        except OSError as exc:
            say(f"etcd's profile not recorded: {exc}")

    def join(self) -> None:
        self._thread.join()


def _dump(spy: str, pid: int) -> str:
    """``py-spy dump`` of ``pid`` (every thread's id, name and stack), "" if it failed."""
    done = subprocess.run(
        [spy, "dump", "--pid", str(pid), "--nonblocking"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout


_THREAD = re.compile(r'^Thread (\d+) \([^)]*\): "(?P<name>[^"]*)"', re.MULTILINE)


def thread_names(dump: str) -> dict[int, str]:
    """Thread id -> Python thread name, from ``py-spy dump``'s thread lines."""
    return {int(m.group(1)): m["name"] for m in _THREAD.finditer(dump)}


def thread_group(name: str | None) -> str:
    """The group a thread counts in: its name with numbers as N (``rpc_12`` -> ``rpc_N``, the
    handler pool), or, for a thread Python does not know, grpc's and the runtime's own."""
    if name is None:
        return "(not a Python thread: grpc core, the runtime)"
    return re.sub(r"\d+", "N", name)


def switches_by_thread(
    before: dict[int, int], after: dict[int, int], names: dict[int, str], cycles: int
) -> str:
    """A table of the context switches per cycle each group of threads made between two
    ``thread_switches`` readings, most first (a thread started meanwhile counts from 0)."""
    groups: dict[str, tuple[int, int]] = {}
    for tid, count in after.items():
        group = thread_group(names.get(tid))
        threads, switches = groups.get(group, (0, 0))
        groups[group] = (threads + 1, switches + count - before.get(tid, 0))
    total = max(sum(switches for _, switches in groups.values()), 1)
    lines = [
        "## coordinator context switches per cycle, by thread",
        "",
        "| threads | group | switches/cycle | % |",
        "| ---: | --- | ---: | ---: |",
    ]
    for group, (threads, switches) in sorted(groups.items(), key=lambda g: -g[1][1]):
        lines.append(
            f"| {threads} | `{group}` | {switches / max(cycles, 1):.1f} "
            f"| {100 * switches / total:.0f} |"
        )
    return "\n".join([*lines, ""])


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
