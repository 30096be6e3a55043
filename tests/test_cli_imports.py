"""A remote verb imports what it needs: the SDK's transport and its own module, never the server,
the store or the demo (cli/__init__.py imports a command's module only when it runs, and
``coordinator.sdk`` imports each public name on first use).

Each verb runs for real, in a child process, against a real server; the child reports the
modules it loaded when it exits. Its CPU time is printed for the record, never asserted: it
depends on the machine and its load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

HEAVY = ("coordinator.server", "coordinator.store", "coordinator.demo")

CHILD = """
import atexit, json, resource, sys

def report():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    heavy = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
    sys.stderr.write("IMPORTS " + json.dumps(
        {"heavy": heavy, "cpu": usage.ru_utime + usage.ru_stime}) + "\\n")

atexit.register(report)
from coordinator.cli import main
main()
"""


def _run(argv: list[str]) -> tuple[int, dict[str, Any], str]:
    code = f"HEAVY = {HEAVY!r}\n{CHILD}"
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    reports = [line for line in done.stderr.splitlines() if line.startswith("IMPORTS ")]
    assert len(reports) == 1, done.stderr
    return done.returncode, json.loads(reports[0].removeprefix("IMPORTS ")), done.stdout


@pytest.mark.parametrize(
    ("argv", "exit_code"),
    [
        (["tasks", "list"], 0),
        (["tasks", "get", "no-such-task"], 1),
        (["events"], 0),
        (["epoch", "show"], 0),
        (["jobs"], 0),
        (["effects", "show", "no-such-effect"], 1),
        (["versions", "show"], 0),
    ],
)
def test_a_remote_verb_loads_neither_server_store_nor_demo(
    server: str, argv: list[str], exit_code: int
) -> None:
    code, report, _ = _run([*argv, "--target", server, "--insecure"])
    assert code == exit_code
    assert report["heavy"] == []
    print(f"coordinator {' '.join(argv)}: {report['cpu']:.3f} s of CPU")  # informational


def test_the_worker_loads_neither_server_nor_store_without_a_ready_endpoint() -> None:
    code, report, stdout = _run(["worker", "--help"])
    assert code == 0 and "MODULE:FUNCTION" in stdout
    assert report["heavy"] == []


def test_serve_still_loads_the_server() -> None:
    # The check above is not vacuous: a verb that needs the server does load it.
    code, report, _ = _run(["serve", "--help"])
    assert code == 0
    assert "coordinator.server.app" in report["heavy"]
