"""``coordinator serve`` child processes on fixed loopback ports, killed and restarted by PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from coordinator import lifeline
from coordinator.etcd_process import EtcdProcess, free_port
from tests.helpers import eventually

COMMAND = [sys.executable, "-c", "from coordinator.cli import main; main()"]


class Replica:
    """One coordinator replica: a serve process whose restarts keep its port (as a pod's do)."""

    def __init__(
        self,
        etcd: EtcdProcess,
        prefix: str,
        logs: Path,
        name: str,
        *,
        etcd_endpoint: str = "",
        etcd_timeout: float = 5.0,
    ) -> None:
        """``etcd_endpoint``: reach etcd there instead (a proxy the test can cut)."""
        self.port = free_port()
        endpoint = etcd_endpoint or etcd.endpoint
        self._args = ["serve", "--etcd", endpoint, "--prefix", prefix, "--insecure"]
        self._args += ["--etcd-timeout", str(etcd_timeout)]
        self._args += ["--listen", self.target, "--metrics-listen", "127.0.0.1:0"]
        self._args += ["--min-ttl", "1", "--shutdown-grace", "0"]
        self._logs, self._name = logs, name
        self._starts = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        """Its gRPC address."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait until it logs that it serves."""
        self._starts += 1
        log = self._logs / f"{self._name}-{self._starts}.log"
        with log.open("wb") as out:
            self._proc = subprocess.Popen(
                [*COMMAND, *self._args], stdout=subprocess.DEVNULL, stderr=out, env=dict(os.environ)
            )
            lifeline.kill_with_parent(self._proc.pid)  # dies with this test run
        eventually(lambda: self._serving(log), timeout=60, message=f"{self._name} did not serve")

    def _serving(self, log: Path) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:  # fail now, not at the deadline
            raise RuntimeError(f"{self._name} exited: {log.read_text()}")
        events = [json.loads(line) for line in log.read_text().splitlines() if line[:1] == "{"]
        return any(event.get("event") == "serving" for event in events)

    def kill(self) -> None:
        """SIGKILL, as a crash: no call in flight is answered."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGKILL)
        self._proc.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP: its connections stay open, and nothing sent on them is answered."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Kill it if it still runs."""
        if self._proc is not None and self._proc.poll() is None:
            self.kill()


@contextmanager
def replicas(etcd: EtcdProcess, prefix: str, logs: Path, count: int) -> Iterator[list[Replica]]:
    """``count`` started replicas of one keyspace; every one is killed on exit."""
    started: list[Replica] = []
    try:
        for i in range(count):
            started.append(Replica(etcd, prefix, logs, f"r{i}"))
            started[-1].start()
        yield started
    finally:
        for replica in started:
            replica.stop()
