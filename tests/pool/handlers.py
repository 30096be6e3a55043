"""Handlers the ``coordinator worker`` processes of these tests run (``tests.pool.handlers:...``).

A task's input says what its handler does: ``gate <path>`` works until ``path`` exists, giving
up when cancelled; ``stubborn <path>`` does the same but never looks at its cancellation;
``job <path>`` runs a managed job (a shell and its child, for 300 s), writes its process group
to ``<task id>.job`` beside ``path`` and waits for it, deaf to its cancellation. Each first
creates ``<task id>.started`` beside ``path``: the worker holds the claim from then on.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

from coordinator.sdk import Cancellation, Claim

_STEP = timedelta(milliseconds=50)
# A stubborn handler stops by itself after this long, so its thread never outlives a test run.
_STUBBORN_LIMIT = 120.0


def gated(claim: Claim, cancel: Cancellation) -> bytes | None:
    """Finish (result ``done <task id>``) once the gate file in the input exists."""
    mode, _, path = claim.input.decode().partition(" ")
    gate = Path(path)
    (gate.parent / f"{claim.task_id}.started").touch()
    if mode == "job":
        job = claim.run(["sh", "-c", "sleep 300 & wait"], log_dir=gate.parent, grace=_STEP * 20)
        (gate.parent / f"{claim.task_id}.job").write_text(str(job.pid))
        job.wait()
        return b"the job ended"
    if mode == "stubborn":
        started = time.monotonic()
        while not gate.exists() and time.monotonic() - started < _STUBBORN_LIMIT:
            time.sleep(_STEP.total_seconds())  # deaf to its cancellation, on purpose
        return b"stubborn finished anyway"
    while not gate.exists():
        if cancel.wait_for_cancelled(_STEP):
            return None  # cancelled: nothing to commit, the pool settles the claim
    return f"done {claim.task_id}".encode()
