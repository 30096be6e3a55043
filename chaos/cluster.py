"""A 3-member etcd cluster on loopback, one process per member, each stoppable by PID.

``EtcdProcess`` runs single members only; a chaos run needs a real quorum, so members can be
killed, restarted on their data and frozen while the other two keep serving.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import etcd3

from coordinator import lifeline
from coordinator.etcd_process import find_etcd_binary, free_ports

GRPC_OPTIONS = [("grpc.enable_http_proxy", 0)]
"""Loopback: never route etcd's gRPC through an http_proxy from the environment."""


class Member:
    """One etcd member: its ports, data dir and (while running) process."""

    def __init__(self, name: str, client_port: int, peer_port: int, root: Path) -> None:
        self.name = name
        self.client_port, self.peer_port = client_port, peer_port
        self.data_dir = root / name
        self.log_path = root / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:port`` of its client listener."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        """Its peer URL."""
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        """Whether its process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the member's process (by PID), if it runs."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)


class EtcdCluster:
    """Three members with ``--initial-cluster``; ``stop()`` kills every one it started."""

    def __init__(self, root: Path, size: int = 3) -> None:
        ports = free_ports("127.0.0.1", 2 * size)
        self.members = [Member(f"m{i}", ports[2 * i], ports[2 * i + 1], root) for i in range(size)]
        self._binary = find_etcd_binary()
        self._initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> list[str]:
        """Every member's client endpoint."""
        return [m.endpoint for m in self.members]

    def start(self, timeout: float = 30.0) -> None:
        """Start every member and wait until the cluster has a leader."""
        for member in self.members:
            self.start_member(member)
        self.wait_healthy(timeout)

    def start_member(self, member: Member) -> None:
        """(Re)start one member on its data dir (a restart rejoins the existing cluster)."""
        existing = member.data_dir.exists()
        url = f"http://{member.endpoint}"
        args = [
            str(self._binary),
            f"--name={member.name}",
            f"--data-dir={member.data_dir}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={member.peer_url}",
            f"--initial-advertise-peer-urls={member.peer_url}",
            f"--initial-cluster={self._initial}",
            f"--initial-cluster-state={'existing' if existing else 'new'}",
            "--initial-cluster-token=chaos",
            # Off, unlike an embedded or deployed etcd: the history checker reads every
            # revision of the run (chaos/etcd_history.py).
            "--auto-compaction-retention=0",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        with member.log_path.open("ab") as log:
            member.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        # Its own session escapes a group kill: tied, it dies even if the run is SIGKILLed.
        lifeline.kill_with_parent(member.proc.pid)

    def client(self, member: Member | None = None) -> Any:
        """An etcd3 client of one member (the first running one by default)."""
        target = member or next(m for m in self.members if m.running)
        return etcd3.client("127.0.0.1", target.client_port, timeout=5, grpc_options=GRPC_OPTIONS)

    def leader(self) -> Member:
        """The member that currently leads (asked of a running member)."""
        for member in self.members:
            if not member.running:
                continue
            with contextlib.suppress(Exception):
                client = self.client(member)
                try:
                    name = client.status().leader.name
                finally:
                    client.close()
                found = next(m for m in self.members if m.name == name)
                if found.running:
                    return found
        raise RuntimeError("no etcd member answers status with a leader")

    def wait_healthy(self, timeout: float = 30.0) -> Member:
        """Wait until a running member reports a leader; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.leader()
            except (RuntimeError, StopIteration):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        """SIGCONT (a frozen member ignores SIGTERM), then SIGKILL every member, by PID."""
        for member in self.members:
            member.signal(signal.SIGCONT)
            member.signal(signal.SIGKILL)
            if member.proc is not None:
                member.proc.wait()
                lifeline.spare(member.proc.pid)
