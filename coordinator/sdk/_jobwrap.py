"""The leader of a managed job's process group (run as a script, standard library only).

    python -I -S _jobwrap.py GATE_FD EXIT_FILE -- COMMAND [ARG ...]

The SDK starts this in a new session (its pid is the group id), with output going to the
job's log file, records StartJob with this process's pid and start time, and only then writes
``g`` to the gate. Anything else on the gate (the start was FENCED, or the worker died and the
pipe closed) ends this process before the command ever runs. Once started, the command's exit
status is written to EXIT_FILE, so a worker that died meanwhile can still learn how the job
ended after a restart (``rediscover``); the same status is this process's exit code (128 + N
for a command killed by signal N).
"""

from __future__ import annotations

import os
import subprocess
import sys

NOT_STARTED = 125
CANNOT_RUN = 127


def _write_status(path: str, code: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(str(code))
    os.replace(tmp, path)  # never a half-written status


def main(argv: list[str]) -> int:
    """Wait for the gate, run the command, record its exit status."""
    gate, exit_file, command = int(argv[1]), argv[2], argv[4:]
    go = os.read(gate, 1)
    os.close(gate)
    if go != b"g":
        return NOT_STARTED
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"managed job: cannot run {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        _write_status(exit_file, CANNOT_RUN)
        return CANNOT_RUN
    code = child.wait()
    _write_status(exit_file, code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
