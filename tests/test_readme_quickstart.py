"""The README's quickstart runs by copy-paste: every block of it, as written, against a real
``coordinator up`` (so the README cannot drift from the code again).

An HTML comment before a block says what it is (see DEVELOPERS.md): ``quickstart: install`` is
skipped (the test runs inside what it installs), ``quickstart: server`` runs in the background,
``quickstart: file NAME`` is written to NAME; every other block runs in bash and must exit 0.
The second terminal starts with no ``COORDINATOR_*`` variable (but the test's own state folder):
what its programs need, they must get from a step the README shows.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from coordinator import lifeline
from coordinator.cli.local_up import STATE_DIR_ENV
from coordinator.cli.remote import DEFAULT_TARGET
from coordinator.config import DEFAULT_LISTEN
from coordinator.sdk import environment
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(
    r"(?:<!-- quickstart: (?P<kind>[^>]*?) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```", re.S
)


@dataclass(frozen=True)
class Block:
    """One fenced block of the quickstart and what its comment says it is."""

    kind: str
    body: str


def quickstart() -> list[Block]:
    """The blocks of the README's Quickstart section, in order."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    return [Block(m["kind"] or "run", m["body"]) for m in BLOCK.finditer(section)]


def test_the_quickstart_has_the_blocks_this_test_expects() -> None:
    kinds = [b.kind for b in quickstart()]
    assert kinds[:2] == ["install", "server"], kinds
    files = {kind.split()[1] for kind in kinds if kind.startswith("file ")}
    assert files == {"producer.py", "worker.py", "results.py"}, kinds
    assert kinds.count("run") >= 2, kinds


def test_the_worker_falls_back_to_the_address_up_listens_on() -> None:
    # Run without the `eval` line, the worker still finds a default `coordinator up`: it names
    # no target, and the SDK's fallback is where `up` listens by default.
    (worker,) = [b.body for b in quickstart() if b.kind == "file worker.py"]
    assert 'WorkerClient(principal="worker-1")' in worker, worker
    assert DEFAULT_LISTEN == DEFAULT_TARGET == environment.DEFAULT_TARGET


def _bash(body: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", body],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"block failed ({done.returncode}):\n{body}\n{done.stderr}"
    return done.stdout


def _start_up(body: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """The first terminal: the server block in the background, once it says it serves."""
    # The one change from what a person types: a free port instead of the default 50051, which
    # another run on this machine may hold. Nothing below depends on the port: the second
    # terminal asks `up` where it is (and the worker's fallback is pinned to the default above).
    up = subprocess.Popen(
        ["bash", "-c", body],
        cwd=cwd,
        env={**env, "COORDINATOR_LISTEN": "127.0.0.1:0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lifeline.kill_with_parent(up.pid)  # dies with this test run
    assert up.stdout is not None
    for line in up.stdout:
        if "press Ctrl-C" in line:
            return up
    os.killpg(up.pid, signal.SIGINT)
    raise AssertionError("coordinator up exited before it served")


def test_every_quickstart_block_runs_as_written(tmp_path: Path) -> None:
    # The blocks run from a scratch folder whose .venv is this interpreter's: exactly what
    # `make demo` leaves in a clone, without touching the real one.
    venv = Path(os.environ.get("VIRTUAL_ENV") or Path(sys.executable).parents[1])
    (tmp_path / ".venv").symlink_to(venv)
    # A shell as a newcomer has it: no coordinator settings of ours leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    env |= {"PYTHONUNBUFFERED": "1", STATE_DIR_ENV: os.environ[STATE_DIR_ENV]}
    blocks = quickstart()
    up = _start_up(next(b.body for b in blocks if b.kind == "server"), tmp_path, env)
    try:
        for block in blocks:
            if block.kind.startswith("file "):
                (tmp_path / block.kind.split()[1]).write_text(block.body)
        # The second terminal: its blocks one after another in one shell, as a person types.
        worked = _bash("\n".join(b.body for b in blocks if b.kind == "run"), tmp_path, env)
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=30)
    lines = worked.splitlines()
    assert lines[:2] == ["welcome-1", "welcome-2"]  # `tasks create` prints the id
    assert re.search(r"welcome-1 +emails +READY", worked), worked
    assert "welcome-3 READY" in lines  # producer.py: create_task
    # worker.py, in whatever order it claimed them: two commits and the bad input failed.
    generations = {
        task: int(gen)
        for task, gen in re.findall(r"^(\S+) COMMITTED at generation (\d+)$", worked, re.M)
    }
    assert set(generations) == {"welcome-1", "welcome-3"}, worked
    assert "welcome-2 FAILED" in lines
    # `tasks result` prints the payload (piped: its bytes, no newline), then results.py does.
    assert worked.count("Dear Ada, Welcome Aboard") == 2, worked
    # results.py: get_result, the payload and the attempt@generation that committed it.
    for task, payload in (("welcome-1", "Dear Ada, Welcome Aboard"), ("welcome-3", "Dear Grace")):
        assert re.search(
            rf"{task} {payload}[^\n]* by worker-1 a1-\w+@{generations[task]}$", worked, re.M
        ), worked
    assert re.search(r"welcome-2 +emails +FAILED", worked), worked
    assert "READY->CLAIMED op=claim by=worker-1" in worked
    assert "CLAIMED->DONE op=commit" in worked
    assert "welcome-2 CLAIMED->FAILED op=dead_letter by=worker-1" in worked
    assert "last error: empty-input: nothing to say" in worked
    eventually(lambda: up.poll() is not None, timeout=5)
