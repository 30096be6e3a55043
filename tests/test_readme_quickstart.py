"""The README's quickstart runs by copy-paste: every block of it, as written, against a real
``coordinator up`` (so the README cannot drift from the code again).

An HTML comment before a block says what it is (see DEVELOPERS.md): ``quickstart: install`` is
skipped (the test runs inside what it installs), ``quickstart: server`` runs in the background,
``quickstart: file NAME`` is written to NAME; every other block runs in bash and must exit 0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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
    kinds = [b.kind.split()[0] for b in quickstart()]
    assert kinds[:2] == ["install", "server"], kinds
    assert "file" in kinds and kinds.count("run") >= 2, kinds


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


def test_every_quickstart_block_runs_as_written(tmp_path: Path) -> None:
    # The blocks run from a scratch folder whose .venv is this interpreter's: exactly what
    # `make demo` leaves in a clone, without touching the real one.
    venv = Path(os.environ.get("VIRTUAL_ENV") or Path(sys.executable).parents[1])
    (tmp_path / ".venv").symlink_to(venv)
    env = {**os.environ, "COORDINATOR_LISTEN": "127.0.0.1:0", "PYTHONUNBUFFERED": "1"}
    env.pop("COORDINATOR_TARGET", None)
    blocks = quickstart()
    server = next(b for b in blocks if b.kind == "server")
    up = subprocess.Popen(
        ["bash", "-c", server.body],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert up.stdout is not None
        exports: dict[str, str] = {}
        for line in up.stdout:
            if line.strip().startswith("export "):
                exports = dict(pair.split("=", 1) for pair in line.split()[1:])
            if "press Ctrl-C" in line:
                break
        assert "COORDINATOR_TARGET" in exports, "coordinator up printed no export line"
        # It listens on a free port here, not the default the worker falls back to: the
        # second terminal takes the export line up printed.
        env.update(exports)
        for block in blocks:
            if block.kind.startswith("file "):
                (tmp_path / block.kind.split()[1]).write_text(block.body)
        # The second terminal: its blocks one after another in one shell, as a person types.
        worked = _bash("\n".join(b.body for b in blocks if b.kind == "run"), tmp_path, env)
        assert worked.splitlines()[0] == "welcome-1"  # `tasks create` prints the id
        assert re.search(r"welcome-1 +emails +READY", worked), worked
        assert "COMMITTED at generation" in worked
        assert "Dear Ada, Welcome Aboard" in worked  # `tasks result` prints the payload
        assert "READY->CLAIMED op=claim by=worker-1" in worked
        assert "CLAIMED->DONE op=commit" in worked
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=30)
    eventually(lambda: up.poll() is not None, timeout=5)
