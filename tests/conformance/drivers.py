"""The SDK drivers the suite runs (``DRIVERS``: a driver is a command line) and a running
driver process as the harness sees it: requests out, replies and lost events in
(conformance/PROTOCOL.md), SIGSTOP / SIGCONT, and a clean exit at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from coordinator import lifeline

ROOT = Path(__file__).resolve().parents[2]

REPLY_TIMEOUT = 60.0
"""Seconds the harness waits for one reply: long enough for a long poll or an SDK's whole
retry budget on a loaded machine; a driver that says nothing for that long is hung."""


@dataclass(frozen=True)
class DriverSpec:
    """One SDK's driver: how to start it, and the file whose absence skips it (None: always
    run; a required driver that is missing fails to start rather than being skipped)."""

    name: str
    argv: tuple[str, ...]
    built: Path | None = None

    def missing(self) -> str | None:
        """Why this driver cannot run here, or None."""
        if self.built is not None and not self.built.exists():
            return f"{self.name} driver not built: {self.built} is missing"
        return None


TS_DRIVER = ROOT / "sdks" / "typescript" / "dist" / "conformance" / "driver.js"

DRIVERS = (
    DriverSpec("python", (sys.executable, "-m", "conformance.driver_py")),
    # Skipped until the TypeScript package is built here; drop `built=` to make it required.
    DriverSpec("typescript", ("node", str(TS_DRIVER)), built=TS_DRIVER),
)


class DriverProcess:
    """A running driver: one SDK client, one worker id."""

    def __init__(self, spec: DriverSpec, *, target: str, worker_id: str, log: Path) -> None:
        # The SDK's standard environment only, and nothing inherited that could contradict it.
        env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
        env |= {"COORDINATOR_TARGET": target, "COORDINATOR_WORKER_ID": worker_id}
        self.name = worker_id
        self._log = log.open("w")
        self._proc = subprocess.Popen(
            spec.argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        lifeline.kill_with_parent(self._proc.pid)  # dies with this test run
        self._cond = threading.Condition()
        self._replies: dict[int, dict[str, Any]] = {}
        self._events: list[dict[str, Any]] = []
        self._violations: list[str] = []
        self._closed = False  # stdout reached EOF: the driver exited (or closed it)
        self._log_path = log
        self._next_id = 0
        self._reader = threading.Thread(target=self._read, name=f"driver-{worker_id}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stdout: IO[str] | None = self._proc.stdout
        assert stdout is not None
        for line in stdout:
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            with self._cond:
                if isinstance(message, dict) and "id" in message:
                    self._replies[message["id"]] = message
                elif isinstance(message, dict) and "event" in message:
                    self._events.append(message)
                else:  # the protocol keeps stdout for replies and events: logs go to stderr
                    self._violations.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def send(self, op: str, args: dict[str, Any]) -> int:
        """Send one request; its id (the reply comes to ``reply``)."""
        assert self._proc.stdin is not None
        self._next_id += 1
        request = {"id": self._next_id, "op": op, **args}
        try:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        except OSError as exc:  # a broken pipe: the driver is gone
            raise AssertionError(f"{self.name}: cannot send {op}, the driver exited") from exc
        return self._next_id

    def reply(self, request_id: int, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
        """The reply to ``request_id`` (without its id); AssertionError after ``timeout``."""
        with self._cond:
            self._cond.wait_for(lambda: request_id in self._replies or self._closed, timeout)
            if request_id not in self._replies:
                gone = "exited" if self._closed else f"said nothing for {timeout}s"
                raise AssertionError(
                    f"{self.name}: no reply to request {request_id}, the driver {gone} "
                    f"(its stderr: {self._log_path})"
                )
            reply = dict(self._replies.pop(request_id))
        reply.pop("id")
        return reply

    def call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Send one request and wait for its reply."""
        return self.reply(self.send(op, args))

    def events(self) -> list[dict[str, Any]]:
        """The events received so far, oldest first."""
        with self._cond:
            return list(self._events)

    def violations(self) -> list[str]:
        """stdout lines that were neither a reply nor an event."""
        with self._cond:
            return list(self._violations)

    def stop(self) -> None:
        """SIGSTOP: the process freezes as a GC pause or a frozen node would."""
        os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT."""
        os.kill(self._proc.pid, signal.SIGCONT)

    def exit(self) -> int:
        """Ask the driver to exit (op ``exit``) and return its exit status; killed if it does
        not exit within the reply timeout."""
        self.resume()  # a stopped driver cannot read its exit
        try:
            self.call("exit", {})
            code = self._proc.wait(timeout=REPLY_TIMEOUT)
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            code = self._proc.wait()
        finally:
            lifeline.spare(self._proc.pid)
            self._reader.join(timeout=5)
            self._log.close()
        return code
