"""The runnable examples of docs/sdk.md run as written against a real server.

A block preceded by ``<!-- example: NAME -->`` is run by ``python -c`` in a shell that has only
``COORDINATOR_TARGET`` (the SDK reads it, as the docs say); its output is compared exactly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = re.compile(r"<!-- example: (?P<name>[\w-]+) -->\n```python\n(?P<body>.*?)```", re.S)


def examples() -> dict[str, str]:
    """Every named example of docs/sdk.md."""
    text = (ROOT / "docs" / "sdk.md").read_text(encoding="utf-8")
    return {m["name"]: m["body"] for m in EXAMPLE.finditer(text)}


def _run(body: str, target: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
    env["COORDINATOR_TARGET"] = target
    done = subprocess.run(
        [sys.executable, "-c", body],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_effects_example_shows_each_status_it_names(server: str) -> None:
    printed = _run(examples()["effects"], server).splitlines()
    assert printed == [
        "welcome-email EXECUTED True False msg-1",
        "welcome-email SKIPPED False False msg-1",
        "welcome-email SKIPPED False True msg-1",
        "sms NOT_PERFORMED True False ",
        "sms CONFLICT False True ",
        "reminder UNCERTAIN True False ",
    ]
