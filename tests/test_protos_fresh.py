"""The checked-in coordinator/v1 code is exactly what scripts/gen_protos.py makes today."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED_IN = ROOT / "coordinator" / "v1"
HINT = "coordinator/v1 is out of date with protos/: run `make protos` and commit the result"


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_matches_checked_in(tmp_path: Path) -> None:
    # protoc finds its mypy plugins (protoc-gen-mypy*) on PATH, next to this interpreter.
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
    }
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, f"gen_protos.py failed:\n{run.stdout}\n{run.stderr}"

    fresh = _files(tmp_path / "coordinator" / "v1")
    checked = _files(CHECKED_IN)
    missing = sorted(fresh.keys() - checked.keys())
    extra = sorted(checked.keys() - fresh.keys())
    stale = sorted(name for name in fresh.keys() & checked.keys() if fresh[name] != checked[name])
    assert not missing, f"{HINT}; not checked in: {missing}"
    assert not extra, f"{HINT}; checked in but no longer generated: {extra}"
    assert not stale, f"{HINT}; differ from fresh output: {stale}"
