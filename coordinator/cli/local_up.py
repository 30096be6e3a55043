"""How a second terminal finds the coordinator that ``coordinator up`` started.

``up`` listens on a fixed port but runs etcd on a random one, in insecure mode. Each running
``up`` publishes where both are in a record of its own, ``up-<pid>.json`` in the state folder
(``$XDG_STATE_HOME/coordinator``, by default under ``~/.local/state``;
``$COORDINATOR_STATE_DIR`` overrides it), and removes only that record on exit, so any number
can run at once and none hides another (issue 29: a second ``up`` took over a single ``up.json``
and deleted it on exit). The remote verbs and ``doctor`` fall back to the one that runs when
given no target, credentials or etcd; with several, to the only one started from the same
Python environment (each clone's terminals find their clone's own), else they refuse, naming
each with its environment, and ask for the flag that picks one. A flag or environment
variable always wins. A record whose process is gone
(an ``up`` that was SIGKILLed) is ignored and removed by the next reader.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import click

STATE_DIR_ENV = "COORDINATOR_STATE_DIR"
MAX_RECORDS = 256
"""Records read from the state folder at most (more cannot be a person's terminals)."""


@dataclass(frozen=True)
class LocalUp:
    """One running ``coordinator up``: its gRPC target and etcd endpoint."""

    target: str
    etcd: str
    pid: int
    home: str = ""
    """The Python environment it runs from (``sys.prefix``: a clone's ``.venv``), so a terminal
    of that clone finds its own ``up`` among several; empty in a record of an older ``up``."""

    def exports(self) -> str:
        """The shell line that points a second terminal at it."""
        return (
            f"export COORDINATOR_TARGET={self.target} COORDINATOR_INSECURE=1 "
            f"COORDINATOR_ETCD={self.etcd}"
        )

    def describe(self) -> str:
        """How a choice is named to the user."""
        where = f", from {self.home}" if self.home else ""
        return f"{self.target} (etcd {self.etcd}, pid {self.pid}{where})"


class SeveralUps(click.UsageError):
    """More than one ``coordinator up`` runs and nothing said which one to use."""

    def __init__(self, running: list[LocalUp], flag: str) -> None:
        choices = "; ".join(up.describe() for up in running)
        super().__init__(
            f"{len(running)} `coordinator up` are running: {choices}. Give {flag} naming the "
            "one to use"
        )
        self.running = running


def state_dir() -> Path:
    """The folder where each running ``up`` publishes its record."""
    folder = os.environ.get(STATE_DIR_ENV)
    if folder:
        return Path(folder)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "coordinator"


def record_file(pid: int) -> Path:
    """The record of the ``up`` with process id ``pid``."""
    return state_dir() / f"up-{pid}.json"


def publish(up: LocalUp) -> Path:
    """Write ``up``'s own record (atomically, mode 0600); returns its path."""
    path = record_file(up.pid)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".up-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(up), out)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def withdraw(pid: int) -> None:
    """Remove the record of ``pid`` (every other ``up``'s stays)."""
    record_file(pid).unlink(missing_ok=True)


def running() -> list[LocalUp]:
    """Every ``up`` whose record names a live process, by pid; stale records are removed."""
    found = []
    paths = sorted(state_dir().glob("up-*.json"))[:MAX_RECORDS]
    for path in paths:
        up = _read(path)
        if up is None:
            continue
        if _alive(up.pid):
            found.append(up)
        else:  # left by an `up` that was killed: nobody else removes it
            with contextlib.suppress(OSError):
                path.unlink()
    return sorted(found, key=lambda up: up.pid)


def discover(*, target: str | None = None, flag: str = "--target") -> LocalUp | None:
    """The running ``up`` to use: the one listening on ``target`` if given, else the only one,
    else the only one started from this Python environment (two clones' terminals each find
    their own); None if there is none (or none on ``target``). Raises SeveralUps (a usage error
    naming the choices and ``flag``) if several run and nothing picked one."""
    ups = running()
    if target is not None:
        return next((up for up in ups if up.target == target), None)
    if len(ups) > 1:
        ours = [up for up in ups if up.home == sys.prefix]
        if len(ours) != 1:
            raise SeveralUps(ups, flag)
        return ours[0]
    return ups[0] if ups else None


def _read(path: Path) -> LocalUp | None:
    try:
        data = json.loads(path.read_text())
        return LocalUp(
            target=str(data["target"]),
            etcd=str(data["etcd"]),
            pid=int(data["pid"]),
            home=str(data.get("home", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: not a zombie (a SIGKILLed ``up`` its parent has not reaped yet,
    which ``kill(pid, 0)`` still finds: an ``up`` started right after was refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (not Linux), or it ended meanwhile
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]
