"""The two commands of a fresh machine, as make would run them (``make -n -B``: every recipe
printed, none run): ``make demo`` installs the runtime only, ``make test`` says which phase
runs, and runs them all even when one fails, ``make test-fast`` leaves the slow marks out."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
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


def test_make_bench_installs_what_scenario_d_needs_then_runs_the_bench() -> None:
    planned = _planned("bench")
    assert ".venv/bin/python -m pip install -e '.[bench]'" in planned
    assert planned[-1].rstrip() == ".venv/bin/python -m bench --json bench.json"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bench = {re.split(r"[<>=\[ ]", dep)[0] for dep in project["optional-dependencies"]["bench"]}
    assert {"tooz", "etcd3gw"} <= bench  # what bench/scenarios/tooz_locks.py imports


def test_make_test_announces_each_phase_in_order() -> None:
    headers = [line for line in _planned("test") if line.startswith('echo "== ')]
    phases = [line.split("== ")[1].split(" ")[0] for line in headers]
    assert phases == [
        "lint",
        "types",
        "chart",
        "contract",
        "unit",
        "integration",
        "etcd",
        "conformance",
        "chaos",
        "typescript",
    ]


def test_make_test_fast_skips_the_slow_marks() -> None:
    assert _planned("test-fast")[-1] == '.venv/bin/pytest -q -m "not slow"'


# Stands in for pytest: says what it was asked to run, and fails the integration phase (the
# only one that ignores the others' directories).
_FAILING_INTEGRATION = """#!/bin/sh
echo "ran pytest $*"
case "$*" in *--ignore=*) exit 1;; esac
"""
# Stands in for npm (the TypeScript phase finds it first on PATH): says what it was asked.
_NPM = """#!/bin/sh
echo "ran npm $*"
"""


def test_make_test_runs_the_chaos_phase_after_a_failed_one_and_then_fails(tmp_path: Path) -> None:
    for name, script in (("pytest", _FAILING_INTEGRATION), ("npm", _NPM)):
        fake = tmp_path / name
        fake.write_text(script)
        fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    # -o: the prerequisites (venv, lint, chart, ...) count as done; only the phases run.
    skip = [
        f"-o{target}"
        for target in (
            "venv",
            "etcd",
            "etcd-wheel",
            "chaos-tools",
            "browser",
            "lint",
            "chart",
            "contract",
            "ts-build",
        )
    ]
    done = subprocess.run(
        ["make", "--no-print-directory", *skip, "test", f"BIN={tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert [line.split(" ")[1] for line in lines if line.startswith("== ")] == [
        "unit",
        "integration",
        "etcd",
        "conformance",
        "chaos",
        "typescript",
    ]
    assert "ran pytest -q tests/conformance" in lines
    assert "ran pytest -q tests/chaos tests/chaos_lite" in lines  # not hidden by the failure
    assert "ran npm test" in lines
    assert lines[-1] == "failed phases: integration"
    assert done.returncode != 0
