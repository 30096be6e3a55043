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

The reaper must outlive its parent, so it does not show the parent's paths: its command line is
``lifeline-reaper -S -c ...`` (a ``pkill -f <checkout>`` that ended a test run once killed the
reaper with it, leaving two etcd processes behind). A reaper killed on its own is noticed by a
thread of the parent waiting on it, which starts another (at most MAX_RESTARTS times) and hands
it what the first held: the parent keeps its own pidfd of every registered child, passes them
to the new reaper (the same processes, never a reused pid) and names the directories again.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_NAME = "lifeline-reaper"
"""The reaper's ``argv[0]``, what ``ps`` shows."""

MAX_RESTARTS = 5
"""How often one process starts its reaper again after it was killed."""

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
    elif op == "adopt":  # a pidfd inherited from the parent (a reaper started again)
        kids[arg[0]] = arg[1]
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
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass
"""


class _Reaper:
    """This process's reaper, started on first use (again in a forked child, which must not
    write into its parent's), and started again if it ends while this process lives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner = 0  # the pid that started the reaper below
        self._proc: subprocess.Popen[bytes] | None = None
        self._write_end = -1
        self._restarts = 0
        # What this process told its reaper, so a new one can take it over: each child's pidfd
        # (held here, so a new reaper gets the same process, never a reused pid) and each dir.
        self._kids: dict[int, int] = {}
        self._dirs: set[str] = set()

    def tell(self, op: str, arg: int | str) -> None:
        """Record ``op`` and send it to the reaper as one line."""
        with self._lock:
            fd = self._started()
            if self._record(op, arg):
                _send(fd, op, arg)

    def _record(self, op: str, arg: int | str) -> bool:
        """Keep this process's own copy of what the reaper holds; False for a child already
        gone (nothing to tell)."""
        if op == "kill" and isinstance(arg, int) and arg not in self._kids:
            for pid, pidfd in list(self._kids.items()):  # those that ended: held while alive
                if select.select([pidfd], [], [], 0)[0]:
                    os.close(self._kids.pop(pid))
            try:
                self._kids[arg] = os.pidfd_open(arg)
            except OSError:  # it ended and was reaped already
                return False
        elif op == "spare" and isinstance(arg, int) and arg in self._kids:
            os.close(self._kids.pop(arg))
        elif op == "remove":
            self._dirs.add(str(arg))
        elif op == "keep":
            self._dirs.discard(str(arg))
        return True

    def _started(self) -> int:
        """The write end of a live reaper's pipe (called with the lock held)."""
        if self._proc is not None and self._owner == os.getpid():
            return self._write_end
        if self._owner != os.getpid():  # first use, or a forked child: its parent's are not its
            self._kids, self._dirs, self._restarts = {}, set(), 0
        return self._start()

    def _start(self) -> int:
        read_end, write_end = os.pipe()  # not inheritable: no other child holds it open
        try:
            proc = subprocess.Popen(
                # No path in its command line: a `pkill -f <checkout>` that ends this process
                # does not end its reaper with it (the interpreter finds its library alone).
                [_NAME, "-S", "-c", _REAPER],
                executable=sys.executable,
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # Its own session: a terminal's Ctrl-C or a group kill must not end it first.
                start_new_session=True,
                pass_fds=tuple(self._kids.values()),  # a new reaper adopts them (see _ended)
            )
        finally:
            os.close(read_end)
        if self._write_end >= 0 and self._owner == os.getpid():
            os.close(self._write_end)  # the pipe of the reaper that ended
        self._proc, self._owner, self._write_end = proc, os.getpid(), write_end
        for pid, pidfd in self._kids.items():
            _send(write_end, "adopt", [pid, pidfd])
        for path in self._dirs:
            _send(write_end, "remove", path)
        threading.Thread(target=self._ended, args=(proc,), name="lifeline", daemon=True).start()
        return write_end

    def _ended(self, proc: subprocess.Popen[bytes]) -> None:
        """Wait for ``proc``, the reaper; if it ended while this process lives (someone killed
        it), start another that takes over every child and directory, at most MAX_RESTARTS
        times."""
        code = proc.wait()
        with self._lock:
            if proc is not self._proc or self._owner != os.getpid():
                return
            if self._restarts >= MAX_RESTARTS:
                log.warning(
                    "lifeline reaper ended; not started again",
                    exit_code=code,
                    restarts=MAX_RESTARTS,
                )
                return
            self._restarts += 1
            self._start()
        log.warning(
            "lifeline reaper ended; a new one took over",
            exit_code=code,
            children=len(self._kids),
            directories=len(self._dirs),
        )


def _send(fd: int, op: str, arg: object) -> None:
    """One line to the reaper; a dead reaper's pipe refuses it (its successor gets the state)."""
    with contextlib.suppress(OSError):  # far below PIPE_BUF: written whole, or not
        os.write(fd, (json.dumps([op, arg]) + "\n").encode())


_REAPER_OF_THIS_PROCESS = _Reaper()


def kill_with_parent(pid: int) -> None:
    """SIGKILL child ``pid`` when this process is gone, unless ``spare(pid)`` came first."""
    _REAPER_OF_THIS_PROCESS.tell("kill", pid)


def spare(pid: int) -> None:
    """Forget child ``pid`` (it was stopped, or is to outlive this process)."""
    _REAPER_OF_THIS_PROCESS.tell("spare", pid)


def remove_with_parent(path: Path) -> None:
    """Remove directory (or file) ``path`` once this process is gone (after its children were
    killed), unless ``keep(path)`` came first."""
    _REAPER_OF_THIS_PROCESS.tell("remove", str(path))


def keep(path: Path) -> None:
    """Forget directory (or file) ``path`` (it was removed already, or is to stay)."""
    _REAPER_OF_THIS_PROCESS.tell("keep", str(path))
