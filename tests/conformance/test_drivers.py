"""The harness's side of a driver process (drivers.py), with stand-in drivers: a reply and an
event are told apart, anything else on stdout is a protocol violation, a driver that dies fails
the step at once, and only a driver whose build is missing is skipped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conformance.drivers import DRIVERS, TS_DRIVER, DriverProcess, DriverSpec

# Answers every request with ok, after a lost event and a stray log line on stdout.
_ECHO = """
import json, sys
for line in sys.stdin:
    request = json.loads(line)
    print(json.dumps({"event": "lost", "claim": "a1", "reason": "SUPERSEDED"}), flush=True)
    print("a log line on stdout", flush=True)
    print(json.dumps({"id": request["id"], "ok": True, "op": request["op"]}), flush=True)
    if request["op"] == "exit":
        break
"""


def _start(tmp_path: Path, *argv: str) -> DriverProcess:
    spec = DriverSpec("stand-in", argv)
    return DriverProcess(spec, target="127.0.0.1:1", worker_id="a-stand-in", log=tmp_path / "log")


def test_replies_events_and_stray_lines_are_told_apart(tmp_path: Path) -> None:
    driver = _start(tmp_path, sys.executable, "-c", _ECHO)
    assert driver.call("held", {}) == {"ok": True, "op": "held"}
    assert driver.events() == [{"event": "lost", "claim": "a1", "reason": "SUPERSEDED"}]
    assert driver.exit() == 0
    assert driver.violations() == ["a log line on stdout", "a log line on stdout"]


def test_a_driver_that_dies_fails_the_step_instead_of_hanging(tmp_path: Path) -> None:
    driver = _start(tmp_path, sys.executable, "-c", "import sys; sys.exit(3)")
    with pytest.raises(AssertionError, match="the driver exited"):
        driver.call("held", {})
    assert driver.exit() != 0


def test_only_a_driver_whose_build_is_missing_is_skipped(tmp_path: Path) -> None:
    python, typescript = DRIVERS
    assert python.missing() is None
    assert typescript.built == TS_DRIVER
    absent = DriverSpec("ts", ("node", "x.js"), built=tmp_path / "dist" / "driver.js")
    assert "driver not built" in (absent.missing() or "")
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "driver.js").write_text("")
    assert absent.missing() is None
