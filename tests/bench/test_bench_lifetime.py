"""``python -m bench`` on a shared machine, as real processes: SIGKILLed mid-run it leaves no etcd,
no server, no worker process and no directory behind; past its time bound it stops by itself,
cleanly, and reports what ran.

Each run gets a TMPDIR of its own, so "no directory behind" is exact: it must end empty. The
phase used is ``promote`` with many small batches: it runs as long as asked while costing the
shared CPU little (one delayed task every half second).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import alive, eventually

REPO = Path(__file__).resolve().parents[2]
LONG_PROMOTE = ["--only", "promote", "--promote-batches", "1000", "--promote-batch-size", "1"]
# Only against a hang: far beyond the bound asked for.
HANG_GUARD = 600
BUDGET = 60


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """The bench in a child process; its stderr goes to a file (read while it runs)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    stderr = tmp_path / "stderr.txt"
    env = {**os.environ, "TMPDIR": str(scratch)}
    with stderr.open("wb") as err, (tmp_path / "stdout.txt").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench", "--smoke", *LONG_PROMOTE, *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=err,
        )
    return proc, scratch, stderr


def _started(stderr: Path) -> tuple[int, Path, int] | None:
    """(etcd pid, etcd data dir, coordinator pid) once the bench said so, else None."""
    text = stderr.read_text(errors="replace")
    etcd = re.search(r"etcd pid (\d+), data in (\S+)", text)
    server = re.search(r"coordinator pid (\d+)", text)
    if etcd is None or server is None:
        return None
    return int(etcd[1]), Path(etcd[2]), int(server[1])


def _all_gone(scratch: Path, etcd: int, server: int) -> bool:
    assert not alive(etcd), f"etcd {etcd} still runs"
    assert not alive(server), f"coordinator {server} still runs"
    assert list(scratch.iterdir()) == [], "a temporary directory stayed"
    return True


@pytest.mark.slow
def test_a_sigkilled_bench_leaves_no_process_and_no_directory(tmp_path: Path) -> None:
    proc, scratch, stderr = _start(tmp_path)
    try:
        etcd, data_dir, server = eventually(
            lambda: _started(stderr), timeout=120, message="the bench did not start its servers"
        )
        assert alive(etcd) and alive(server) and data_dir.is_dir()
        assert data_dir.is_relative_to(scratch)
        proc.send_signal(signal.SIGKILL)  # no cleanup of its own runs
        proc.wait(timeout=30)
        eventually(lambda: _all_gone(scratch, etcd, server), timeout=60, message="left behind")
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_a_sigkilled_bench_leaves_no_multi_slot_worker_behind(tmp_path: Path) -> None:
    # Killed once its 4 worker processes exist (before the seeding: the test costs little CPU).
    multislot = ["--only", "multislot", "--duration", "600"]
    proc, scratch, stderr = _start(tmp_path, *multislot)
    try:
        etcd, _, server = eventually(
            lambda: _started(stderr), timeout=120, message="the bench did not start its servers"
        )
        workers = eventually(
            lambda: _worker_pids(stderr), timeout=120, message="no multi-slot worker started"
        )
        assert len(workers) == 4 and all(alive(pid) for pid in workers)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        eventually(lambda: _all_gone(scratch, etcd, server), timeout=60, message="left behind")
        eventually(lambda: not any(alive(pid) for pid in workers), message="a worker still runs")
    finally:
        if proc.poll() is None:
            proc.kill()


def _worker_pids(stderr: Path) -> list[int] | None:
    """The multi-slot phase's worker pids once it said so, else None."""
    found = re.search(r"multislot worker pids ([\d ]+),", stderr.read_text(errors="replace"))
    return [int(pid) for pid in found[1].split()] if found else None


@pytest.mark.slow
def test_past_its_time_bound_the_bench_stops_itself_and_reports_what_ran(tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    proc, scratch, stderr = _start(tmp_path, "--budget", str(BUDGET), "--json", str(report))
    try:
        code = proc.wait(timeout=HANG_GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, stderr.read_text()[-4000:]
    started = _started(stderr)
    assert started is not None
    etcd, _, server = started
    eventually(lambda: _all_gone(scratch, etcd, server), message="left behind")
    doc = json.loads(report.read_text())
    cut = f"cut off: the {BUDGET} s budget ran out during it"
    assert doc["budget_reached"] is True
    assert doc["skipped_phases"] == {"promote": cut}
    assert "promote" not in doc
    assert doc["promote_claimable_p95_s_after_due"] is None
    assert doc["reasons"]["promote_claimable_p95_s_after_due"] == cut
    assert set(doc["load_average"]) == {"promote"}
    assert "- phase promote cut off:" in (tmp_path / "stdout.txt").read_text()
