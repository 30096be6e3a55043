"""coordinator/lifeline.py: a parent SIGKILLed takes its registered children and directories with
it; what it spared or kept stays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import eventually

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


def test_a_sigkilled_parent_takes_what_it_tied_and_leaves_what_it_spared(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    spared = 0
    try:
        assert parent.stdout is not None
        tied, spared = (int(pid) for pid in parent.stdout.readline().split())
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        eventually(lambda: not _alive(tied), timeout=30, message="the tied child outlived it")
        eventually(lambda: not (tmp_path / "scratch").exists(), message="the scratch dir stayed")
        assert _alive(spared) and (tmp_path / "kept").is_dir()
    finally:
        if parent.poll() is None:
            parent.kill()
        if spared:
            os.kill(spared, signal.SIGKILL)
