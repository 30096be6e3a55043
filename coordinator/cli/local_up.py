"""How a second terminal finds the coordinator that ``coordinator up`` started.

``up`` listens on a fixed port but runs etcd on a random one, in insecure mode. It publishes
where both are in a small state file (``$XDG_STATE_HOME/coordinator/up.json``, by default under
``~/.local/state``; ``$COORDINATOR_STATE_DIR`` overrides the folder) and removes it on exit. The
remote verbs and ``doctor`` fall back to it when given no target, credentials or etcd: a flag or
environment variable always wins, and a file left by a process that is gone is ignored.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_DIR_ENV = "COORDINATOR_STATE_DIR"


@dataclass(frozen=True)
class LocalUp:
    """One running ``coordinator up``: its gRPC target and etcd endpoint."""

    target: str
    etcd: str
    pid: int

    def exports(self) -> str:
        """The shell line that points a second terminal at it."""
        return (
            f"export COORDINATOR_TARGET={self.target} COORDINATOR_INSECURE=1 "
            f"COORDINATOR_ETCD={self.etcd}"
        )


def state_file() -> Path:
    """Where ``up`` publishes itself."""
    folder = os.environ.get(STATE_DIR_ENV)
    if folder:
        return Path(folder) / "up.json"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "coordinator" / "up.json"


def publish(up: LocalUp) -> Path:
    """Write the state file (atomically, mode 0600); returns its path."""
    path = state_file()
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
    """Remove the state file if it still names ``pid`` (a newer ``up`` may have replaced it)."""
    found = _read()
    if found is not None and found.pid == pid:
        state_file().unlink(missing_ok=True)


def discover() -> LocalUp | None:
    """The running ``up``, if the state file names a live process."""
    found = _read()
    if found is None or not _alive(found.pid):
        return None
    return found


def _read() -> LocalUp | None:
    try:
        data = json.loads(state_file().read_text())
        return LocalUp(target=str(data["target"]), etcd=str(data["etcd"]), pid=int(data["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
