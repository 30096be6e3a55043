"""Running a process with its wall clock minutes off: libfaketime, monotonic clock untouched.

The clock-skew fault starts coordinator replicas and workers (never etcd) under
``LD_PRELOAD=libfaketime`` with a relative ``FAKETIME`` offset and
``FAKETIME_DONT_FAKE_MONOTONIC=1`` (``DONT_FAKE_MONOTONIC=1`` for older builds): wall-clock
readers see the skew, while timed waits, gRPC deadlines and the SDK's lease arithmetic (all
CLOCK_MONOTONIC) keep working. ``chaos/skew/sitecustomize.py`` re-routes ``time.sleep``, the one
call that libfaketime 0.9.10 breaks in that mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

LIBRARIES = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)
SITE = Path(__file__).resolve().parent / "skew"
REPO = Path(__file__).resolve().parents[1]

_PROBE = """
import sys, threading, time
real = float(sys.argv[1])
time.sleep(0.05)
threading.Event().wait(0.05)
sys.exit(0 if abs(time.time() - real - 300) < 60 else 3)
"""


def library() -> str:
    """The path of libfaketime.so.1, or "" when it is not installed."""
    return next((p for p in LIBRARIES if Path(p).exists()), "")


def environment(offset: str) -> dict[str, str]:
    """Environment additions that run a Python process with its clock ``offset`` off
    (libfaketime's relative syntax: "+5m", "-5m")."""
    path = os.pathsep.join([str(SITE), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {
        "LD_PRELOAD": library(),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": path.rstrip(os.pathsep),
    }


def unavailable() -> str:
    """Why a skewed Python process cannot run here ("" when it can): the library is missing,
    or a probe (+5m: sleep, a timed wait, the wall clock) fails under it."""
    if not library():
        return "libfaketime is not installed (apt-get install faketime)"
    env = {**os.environ, **environment("+5m")}
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE, str(time.time())],
            env=env,
            capture_output=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "a Python process under libfaketime hangs in a timed wait"
    if probe.returncode != 0:
        err = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return f"a Python process under libfaketime fails its probe: {err[0]}"
    return ""
