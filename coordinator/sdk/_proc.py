"""Process facts from /proc (Linux): start times, process groups, and terminating a group.

A pid alone names nobody for long: the kernel reuses it. ``pid`` plus the process start time
(field 22 of /proc/<pid>/stat, clock ticks since boot) names one process ever, so every
signal this SDK sends to a process it did not just spawn is preceded by that check.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

_POLL = 0.02
# After SIGKILL a group is gone within milliseconds; waiting longer means something is stuck in
# the kernel (uninterruptible sleep), which no signal can fix: give up and report it.
_KILL_WAIT = 5.0


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 is index 0)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may itself contain ") ".
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot), or None if gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def is_running(pid: int, ticks: int) -> bool:
    """Whether the process with this pid AND start time exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == ticks


def group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(name))
    return members


def has_marker(pid: int, marker: bytes) -> bool:
    """Whether ``marker`` (``NAME=value``) is in the process's environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to a process group; a group already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def terminate_group(
    pgid: int,
    grace: float,
    *,
    still_ours: Callable[[], bool] = lambda: True,
) -> bool:
    """SIGTERM the group, wait up to ``grace`` seconds, then SIGKILL whatever is left.

    ``still_ours`` is asked before each signal: a group whose identity can no longer be
    confirmed is not signalled. Returns True if the whole group is gone.
    """
    if not group_members(pgid):
        return True
    if not still_ours():
        return False
    signal_group(pgid, signal.SIGTERM)
    if _wait_empty(pgid, grace):
        return True
    if not still_ours():
        return False
    signal_group(pgid, signal.SIGKILL)
    return _wait_empty(pgid, _KILL_WAIT)


def _wait_empty(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)
    return True
