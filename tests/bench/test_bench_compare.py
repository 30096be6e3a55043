"""``python -m bench.compare``: checkouts side by side (what a change buys). No timing asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.compare import Checkout

REPO = Path(__file__).resolve().parents[2]


def test_a_checkout_is_a_name_a_directory_and_optional_serve_flags() -> None:
    plain = Checkout.parse("before=/tmp/before")
    assert (plain.name, plain.path, plain.args) == ("before", Path("/tmp/before"), ())
    flagged = Checkout.parse("w8=/tmp/x@--max-workers=8,--log-level=warning")
    assert flagged.args == ("--max-workers=8", "--log-level=warning")
    for bad in ("no-equals", "=/tmp/x", "x=", "floor=/tmp/x"):
        with pytest.raises(ValueError):
            Checkout.parse(bad)


@pytest.mark.slow
def test_a_tiny_comparison_prints_a_row_per_checkout_and_the_floor() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.compare",
            "--workers=2",
            "--rounds=1",
            "--duration=0.3",
            f"here={REPO}",
            f"quiet={REPO}@--log-level=warning",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table, load = proc.stdout.split("\n\n")
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert rows == ["here", "quiet", "floor"], proc.stdout
    # The last column: the coordinator's context switches per cycle (none for the floor).
    switches = [int(line.split("|")[-2]) for line in table.splitlines()[2:]]
    assert switches[0] > 0 and switches[1] > 0 and switches[2] == 0, proc.stdout
    assert re.fullmatch(
        r"Load average \(1 / 5 / 15 min\) before [\d.]+ / [\d.]+ / [\d.]+, "
        r"after [\d.]+ / [\d.]+ / [\d.]+; \d+ cores(, busier than its cores)?\.\n",
        load,
    ), load
    runs = [line for line in proc.stderr.splitlines() if line.startswith("[bench] round")]
    assert len(runs) == 3 and all(", 0 errors" in line for line in runs), runs


def test_a_missing_checkout_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.compare", "x=/nonexistent-checkout"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
