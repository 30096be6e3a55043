"""Children that die with their parent, even on SIGKILL, and take their temporary directories.

A parent that is SIGKILLed runs no cleanup: the etcd it started (in a session of its own, so a
terminal's Ctrl-C reaches the parent only) ran on, and its temporary data directory stayed
(issue 29: ``kill -9`` of ``coordinator up``, a failed benchmark). PR_SET_PDEATHSIG would kill
the child but leave the directory, and it fires when the *thread* that forked the child ends,
not the process, so a child started from a worker thread would die early.

Instead each process that ties a child starts one reaper on first use: a tiny Python process
(``python -S``, no imports beyond the standard library) in a session of its own, whose stdin is
a pipe only this process holds open. This process tells it, one JSON line each, which children
to kill and which directories to remove when this process is gone, and which to forget once it
stopped or removed them itself (a child that ended is dropped by the reaper anyway, so it holds
one pidfd per live child only). When the pipe reads end-of-file (this process exited, however
it died), the reaper SIGKILLs every child still registered, and the process group it leads (a
child started in a session of its own), through a pidfd taken when the child was registered (so
a reused pid is never hit), waits for each to end, removes the directories and exits. A process
forked without exec keeps the pipe open too: its parent's children then die when both are gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

_REAPER = r"""
import json, os, select, shutil, signal, sys
kids, dirs = {}, set()
for line in sys.stdin:
    op, arg = json.loads(line)
    if op == "kill":
        for pid, fd in list(kids.items()):  # those that ended: only live children are held
            if select.select([fd], [], [], 0)[0]:
                os.close(kids.pop(pid))
        try:
            kids[arg] = os.pidfd_open(arg)
        except OSError:
            pass
    elif op == "spare" and arg in kids:
        os.close(kids.pop(arg))
    elif op == "remove":
        dirs.add(arg)
    elif op == "keep":
        dirs.discard(arg)
for pid, fd in kids.items():
    try:
        if not select.select([fd], [], [], 0)[0]:  # alive: its pid cannot have been reused
            os.killpg(pid, signal.SIGKILL)  # the group it leads too (its own session)
    except OSError:
        pass
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        select.select([fd], [], [], 10.0)
    except OSError:
        pass
for path in dirs:
    shutil.rmtree(path, ignore_errors=True)
"""


class _Reaper:
    """This process's reaper, started on first use (again in a forked child, which must not
    write into its parent's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner = 0  # the pid that started the reaper below
        self._proc: subprocess.Popen[bytes] | None = None
        self._write_end = -1

    def tell(self, op: str, arg: int | str) -> None:
        """Send one line; a reaper that was killed is not replaced (best effort)."""
        line = (json.dumps([op, arg]) + "\n").encode()
        with self._lock:
            fd = self._started()
            with contextlib.suppress(OSError):  # far below PIPE_BUF: written whole, or not
                os.write(fd, line)

    def _started(self) -> int:
        if self._proc is not None and self._owner == os.getpid():
            return self._write_end
        read_end, write_end = os.pipe()  # not inheritable: no other child holds it open
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _REAPER],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # Its own session: a terminal's Ctrl-C or a group kill must not end it first.
                start_new_session=True,
            )
        finally:
            os.close(read_end)
        self._owner, self._write_end = os.getpid(), write_end
        return write_end


_REAPER_OF_THIS_PROCESS = _Reaper()


def kill_with_parent(pid: int) -> None:
    """SIGKILL child ``pid`` when this process is gone, unless ``spare(pid)`` came first."""
    _REAPER_OF_THIS_PROCESS.tell("kill", pid)


def spare(pid: int) -> None:
    """Forget child ``pid`` (it was stopped, or is to outlive this process)."""
    _REAPER_OF_THIS_PROCESS.tell("spare", pid)


def remove_with_parent(path: Path) -> None:
    """Remove directory ``path`` once this process is gone (after its children were killed),
    unless ``keep(path)`` came first."""
    _REAPER_OF_THIS_PROCESS.tell("remove", str(path))


def keep(path: Path) -> None:
    """Forget directory ``path`` (it was removed already, or is to stay)."""
    _REAPER_OF_THIS_PROCESS.tell("keep", str(path))
