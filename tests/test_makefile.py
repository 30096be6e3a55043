"""The two commands of a fresh machine, as make would run them (``make -n -B``: every recipe
printed, none run): ``make demo`` installs the runtime only, ``make test`` says which phase
runs, ``make test-fast`` leaves the slow marks out."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _planned(target: str) -> list[str]:
    # Run from within `make test` (as CI does), a nested make would print "Entering directory"
    # lines and inherit the outer flags: plan as a fresh shell would.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", target],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_make_demo_installs_only_what_the_demo_needs() -> None:
    planned = _planned("demo")
    installs = [line for line in planned if "pip install" in line]
    assert installs == [".venv/bin/python -m pip install -e ."], planned  # no '.[dev]' tools
    assert planned[-1] == ".venv/bin/coordinator demo"


def test_make_test_announces_each_phase_in_order() -> None:
    headers = [line for line in _planned("test") if line.startswith('echo "== ')]
    phases = [line.split("== ")[1].split(" ")[0] for line in headers]
    assert phases == ["lint", "types", "chart", "unit", "integration", "chaos"]


def test_make_test_fast_skips_the_slow_marks() -> None:
    assert _planned("test-fast")[-1] == '.venv/bin/pytest -q -m "not slow"'
