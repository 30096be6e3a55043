"""Everything a scenario runs on loopback, started and stopped by PID: 3 etcd members, 2
coordinator replicas, the outbox downstream and a pool of chaos workers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from chaos.checker import Coverage, FinalTask
from chaos.cluster import EtcdCluster
from chaos.proxy import TcpProxy
from coordinator.etcd_process import _free_ports
from coordinator.outbox import OutboxProcess
from coordinator.sdk import PRINCIPAL_METADATA, TaskState, WorkerClient
from coordinator.v1 import admin_pb2, admin_pb2_grpc

CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]
PREFIX = "/chaos"
QUEUE = "chaos"
TTL = 2
REPO = Path(__file__).resolve().parents[1]
"""Where ``python -m chaos.worker`` finds the chaos package (``chaos/`` is not installed)."""


def _stop(proc: subprocess.Popen[Any] | None, grace: float = 5.0) -> None:
    """SIGCONT, SIGTERM, then SIGKILL one process by its PID."""
    if proc is None or proc.poll() is not None:
        return
    for sig in (signal.SIGCONT, signal.SIGTERM):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def fence_coverage(name: str, target: str, token: str = "") -> list[Coverage]:
    """A coordinator's fence-check counters (AdminService.GetStats), over plaintext gRPC."""
    metadata: tuple[tuple[str, str | bytes], ...] = ((PRINCIPAL_METADATA, "checker"),)
    if token:
        metadata += (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        stats = stub.GetStats(admin_pb2.GetStatsRequest(), metadata=metadata, timeout=5)
    return [
        Coverage(name, admin_pb2.AcceptancePoint.Name(c.point), c.accepted, c.validated)
        for c in stats.fence_coverage
    ]


class Replica:
    """One ``coordinator serve`` process on a fixed port (a restart reuses it)."""

    def __init__(self, name: str, etcd: list[str], root: Path) -> None:
        self.name = name
        self.port, self.metrics_port = _free_ports("127.0.0.1", 2)
        self._etcd, self._log = etcd, root / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        """Its gRPC address."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start serving (``--insecure`` on loopback: callers name their principal)."""
        args = [
            *("serve", "--etcd", ",".join(self._etcd), "--listen", self.target),
            *("--metrics-listen", f"127.0.0.1:{self.metrics_port}", "--prefix", PREFIX),
            *("--insecure", "--min-ttl", "1", "--reclaim-scan-interval", "1"),
            *("--log-level", "warning", "--shutdown-grace", "1"),
        ]
        code = "from coordinator.cli import main; main()"
        with self._log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, *args], stdout=log, stderr=subprocess.STDOUT
            )

    def coverage(self) -> list[Coverage]:
        """Its fence-check counters (AdminService.GetStats)."""
        return fence_coverage(self.name, self.target)


class Harness:
    """The processes of one run; ``close()`` stops every one of them, whatever happened."""

    def __init__(
        self,
        root: Path,
        *,
        replicas: int = 2,
        proxied: bool = False,
        remote: str = "",
        token: str = "",
    ) -> None:
        self.root = root
        # ``remote``: an already deployed coordinator (staging): nothing server-side is started,
        # and the run uses a queue of its own so it never touches anyone else's tasks.
        self.remote, self.token = remote, token
        self.queue = f"{QUEUE}-{uuid.uuid4().hex[:8]}" if remote else QUEUE
        self.cluster = EtcdCluster(root)
        # With ``proxied``, replicas reach every etcd member through a TcpProxy (delay, drop).
        self.proxies = [TcpProxy(e) for e in self.cluster.endpoints] if proxied else []
        etcd = [p.endpoint for p in self.proxies] or self.cluster.endpoints
        self.replicas = [] if remote else [Replica(f"r{i}", etcd, root) for i in range(replicas)]
        self.outbox: OutboxProcess | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.histories: list[Path] = []

    @property
    def target(self) -> str:
        """Every replica, for gRPC's pick_first: workers fail over between them."""
        if self.remote:
            return self.remote
        return "ipv4:" + ",".join(r.target for r in self.replicas)

    def start(self) -> None:
        """etcd, the replicas, the outbox; waits until the coordinator answers."""
        if not self.remote:
            self.cluster.start()
        for replica in self.replicas:
            replica.start()
        self.outbox = OutboxProcess()
        with self.client("producer") as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    client.epoch()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

    def client(self, name: str) -> WorkerClient:
        """A client of the replicas, acting as ``name``."""
        return WorkerClient(
            self.target, principal=name, channel_options=CHANNEL_OPTIONS, token=self.token or None
        )

    def start_worker(self, name: str, *flags: str) -> subprocess.Popen[bytes]:
        """A chaos worker process recording into ``{root}/{name}.jsonl``."""
        history = self.root / f"{name}.jsonl"
        self.histories.append(history)
        args = ["--target", self.target, "--name", name, "--history", str(history)]
        args += ["--queue", self.queue, "--ttl", str(TTL)]
        if self.token:
            args += ["--token", self.token]
        if self.outbox is not None:
            args += ["--outbox", self.outbox.url]
        proc = subprocess.Popen(
            [sys.executable, "-m", "chaos.worker", *args, *flags],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=(self.root / f"{name}.err").open("ab"),
        )
        self.workers[name] = proc
        return proc

    def stop_workers(self) -> None:
        """Stop every worker (SIGCONT first: a frozen one ignores SIGTERM)."""
        for proc in self.workers.values():
            _stop(proc)

    def final_tasks(self) -> dict[str, FinalTask]:
        """Every task of the queue as etcd holds it now."""
        with self.client("checker") as client:
            return {
                t.task_id: FinalTask(t.task_id, t.state.name, t.revision, t.result_commit_id)
                for t in client.list_tasks(queue=self.queue)
            }

    def unsettled(self) -> int:
        """Tasks neither DONE nor CANCELLED."""
        done = {TaskState.DONE.name, TaskState.CANCELLED.name}
        return sum(t.state not in done for t in self.final_tasks().values())

    def coverage(self) -> list[Coverage]:
        """Fence coverage of every running replica (of the deployed one, with ``remote``)."""
        if self.remote:
            return fence_coverage("remote", self.remote, self.token)
        return [c for r in self.replicas if r.proc and r.proc.poll() is None for c in r.coverage()]

    def performed(self) -> dict[str, int]:
        """Per downstream key, how many times the outbox performed it."""
        if self.outbox is None:
            return {}
        return {k: int(v) for k, v in self.outbox.counts()["performed"].items()}

    def close(self) -> None:
        """Stop everything this harness started, by PID."""
        self.stop_workers()
        for replica in self.replicas:
            _stop(replica.proc)
        if self.outbox is not None:
            self.outbox.stop()
        self.cluster.stop()
        for proxy in self.proxies:
            proxy.close()
