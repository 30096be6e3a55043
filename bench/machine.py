"""What the benchmark ran on, and how busy that machine was while it ran.

Figures taken on a shared machine depend on what else ran there: the load average (the
kernel's count of runnable and uninterruptible tasks, averaged over 1, 5 and 15 minutes) is
read before and after each phase and reported beside its figures, so that a reader can tell a
slow phase from a busy machine. A 1-minute load above the core count means other work waited for
the CPU, the benchmark's own processes included (docs/performance.md).
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from coordinator.etcd_process import find_etcd_binary


def load_average() -> list[float]:
    """The machine's load average over 1, 5 and 15 minutes (``os.getloadavg``), rounded."""
    return [round(value, 2) for value in os.getloadavg()]


def busier_than(cores: int | None, *readings: list[float]) -> bool:
    """Whether any 1-minute reading exceeds ``cores`` (other work waited for the CPU)."""
    return cores is not None and any(reading[0] > cores for reading in readings)


def machine(etcd_bin: str | None) -> dict[str, Any]:
    """What this ran on: cores, CPU model, Python, etcd, the checkout."""
    info: dict[str, Any] = {
        "cpus": cores(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        out = subprocess.run(
            [str(find_etcd_binary(etcd_bin)), "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        info["etcd"] = out.splitlines()[0].split()[-1] if out else None
    except Exception as exc:
        info["etcd"] = f"unknown ({exc})"
    repo = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
        info["commit"] = (rev + ("+dirty" if dirty else "")) or None
    except OSError:
        info["commit"] = None
    return info


def cores() -> int | None:
    """The cores this process may run on (its affinity mask, as ``nproc`` counts them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None
