"""docs/sdk-typescript.md's quickstart runs by copy-paste: a TypeScript producer, an agent
worker (a WorkerPool stopped by SIGTERM) and a reader, as written, against a real
``coordinator up``, the way tests/test_readme_quickstart.py runs the README's.

The blocks' comments mean what they mean there (``install`` is skipped: the test builds the
SDK itself, as that block does; ``file NAME`` may name a folder, e.g. ``agent/agent.ts``). The
second terminal starts in a scratch folder holding the clone's ``.venv`` and ``sdks`` (links),
with no ``COORDINATOR_*`` variable but the test's own state folder.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from coordinator.cli.local_up import STATE_DIR_ENV
from tests.test_readme_quickstart import BLOCK, Block, _bash, _start_up

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "sdk-typescript.md"
SDK = ROOT / "sdks" / "typescript"


def quickstart() -> list[Block]:
    """The blocks of the doc's Quickstart section, in order."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    return [Block(m["kind"] or "run", m["body"]) for m in BLOCK.finditer(section)]


def test_the_quickstart_has_the_blocks_this_test_expects() -> None:
    kinds = [b.kind for b in quickstart()]
    assert kinds[:2] == ["install", "server"], kinds
    files = {kind.split()[1] for kind in kinds if kind.startswith("file ")}
    names = ("tsconfig.json", "producer.ts", "agent.ts", "results.ts")
    assert files == {f"agent/{name}" for name in names}, kinds
    assert kinds.count("run") == 2, kinds


def _build_sdk(venv: Path) -> None:
    """What the install block does after `make ts-deps` (which `make test` runs first)."""
    assert (SDK / "node_modules").is_dir(), "run `make ts-deps` first (node and npm ci)"
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["npm", "run", "build"],
        cwd=SDK,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_quickstart_block_runs_as_written(tmp_path: Path) -> None:
    venv = Path(os.environ.get("VIRTUAL_ENV") or Path(sys.executable).parents[1])
    _build_sdk(venv)
    (tmp_path / ".venv").symlink_to(venv)
    (tmp_path / "sdks").symlink_to(ROOT / "sdks")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    env |= {STATE_DIR_ENV: os.environ[STATE_DIR_ENV]}
    blocks = quickstart()
    up = _start_up(next(b.body for b in blocks if b.kind == "server"), tmp_path, env)
    try:
        for block in blocks:
            if block.kind.startswith("file "):
                path = tmp_path / block.kind.split()[1]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block.body)
        runs = "\n".join(b.body for b in blocks if b.kind == "run")
        worked = _bash(runs, tmp_path, env, timeout=600)
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=30)
    lines = worked.splitlines()
    assert [line for line in lines if line.endswith(" READY")] == [
        "research-1 READY",
        "research-2 READY",
        "research-3 READY",
    ], worked
    for task, question in (("research-1", "fencing tokens"), ("research-3", "etcd leases")):
        assert re.search(
            rf"^{task} {question}: 3 sources on {question} by agent-1 a1-\w+@\d+$", worked, re.M
        ), worked
    assert "research-2 FAILED: empty-question: nothing to research" in lines, worked
    stopped = next(line for line in lines if line.startswith("agent stopped: "))
    assert '"committed":2' in stopped and '"failed":1' in stopped, stopped
    assert lines[-1].strip() == "2", worked  # two emails, each sent once
