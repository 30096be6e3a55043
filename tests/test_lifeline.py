"""coordinator/lifeline.py: a parent SIGKILLed takes its registered children and directories with
it; what it spared or kept stays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import eventually

REPO = Path(__file__).resolve().parents[1]

# A parent that starts two sleeping children in sessions of their own (as etcd is started),
# ties one to itself and spares the other, does the same with two directories, says so and
# waits to be killed.
_PARENT = """
import subprocess, sys, time
from pathlib import Path
from coordinator import lifeline
root = Path(sys.argv[1])
tied, spared = (
    subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(2)
)
for child in (tied, spared):
    lifeline.kill_with_parent(child.pid)
lifeline.spare(spared.pid)
for name in ("scratch", "kept"):
    (root / name).mkdir()
    lifeline.remove_with_parent(root / name)
lifeline.keep(root / "kept")
print(tied.pid, spared.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie is dead: only its parent (gone) could reap it


def _argv(pid: int) -> list[str]:
    """The command line of ``pid`` (empty once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _children(pid: int) -> list[int]:
    """The live children of ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _reaper_of(pid: int) -> int:
    """The pid of ``pid``'s reaper (its one child named lifeline-reaper), once there is one."""
    reapers: list[int] = []

    def found() -> bool:
        reapers[:] = [c for c in _children(pid) if _argv(c)[:1] == ["lifeline-reaper"]]
        return len(reapers) == 1

    eventually(found, timeout=30, message="no reaper")
    return reapers[0]


class _Parent:
    """The parent above, started; ``tied`` and ``spared`` are its children's pids."""

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PARENT, str(root)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert self.proc.stdout is not None
        self.tied, self.spared = (int(pid) for pid in self.proc.stdout.readline().split())

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        os.kill(self.spared, signal.SIGKILL)


def _taken_and_left(parent: _Parent, root: Path) -> None:
    eventually(lambda: not _alive(parent.tied), timeout=30, message="the tied child outlived it")
    eventually(lambda: not (root / "scratch").exists(), message="the scratch dir stayed")
    assert _alive(parent.spared) and (root / "kept").is_dir()


def test_a_sigkilled_parent_takes_what_it_tied_and_leaves_what_it_spared(tmp_path: Path) -> None:
    parent = _Parent(tmp_path)
    try:
        parent.kill()
        _taken_and_left(parent, tmp_path)
    finally:
        parent.close()


def test_the_reaper_outlives_a_pkill_of_the_checkout_that_ends_its_parent(tmp_path: Path) -> None:
    # `pkill -f <checkout>` (or the interpreter's path) ends every process whose command line
    # names it: the parent does, its reaper must not.
    parent = _Parent(tmp_path)
    try:
        reaper = _reaper_of(parent.proc.pid)
        named = [str(REPO), sys.executable]
        family = [parent.proc.pid, *_children(parent.proc.pid)]
        matched = [pid for pid in family if any(n in " ".join(_argv(pid)) for n in named)]
        assert matched == [parent.proc.pid], {pid: _argv(pid) for pid in family}
        parent.kill()
        _taken_and_left(parent, tmp_path)
        assert not _alive(reaper)  # its work done, it ended
    finally:
        parent.close()


def test_a_killed_reaper_is_replaced_and_its_successor_does_the_work(tmp_path: Path) -> None:
    parent = _Parent(tmp_path)
    try:
        first = _reaper_of(parent.proc.pid)
        os.kill(first, signal.SIGKILL)
        eventually(
            lambda: not _alive(first) and _reaper_of(parent.proc.pid) != first,
            timeout=30,
            message="no new reaper",
        )
        # The successor took the tied child and the scratch dir over; the first took nothing
        # with it when it was killed.
        assert _alive(parent.tied) and (tmp_path / "scratch").is_dir()
        parent.kill()
        _taken_and_left(parent, tmp_path)
    finally:
        parent.close()
