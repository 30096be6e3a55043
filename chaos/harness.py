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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from chaos import clock_skew
from chaos.checker import Coverage, FinalTask
from chaos.cluster import EtcdCluster
from chaos.etcd_history import collect, collect_effects, from_watch_events
from chaos.follower import Follower
from chaos.health import etcd_problems, replica_problems
from chaos.history import EffectWrite, EtcdWrite, Recorder
from chaos.netns import Netns
from chaos.proxy import TcpProxy
from coordinator import lifeline
from coordinator.demo.outbox import OutboxProcess
from coordinator.etcd_process import free_ports
from coordinator.sdk import PRINCIPAL_METADATA, TaskState, WorkerClient, tls_credentials
from coordinator.v1 import admin_pb2, admin_pb2_grpc, tasks_pb2, tasks_pb2_grpc

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
    lifeline.spare(proc.pid)


def stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS connection to a deployed coordinator: the CA that signed its
    certificate, and (mutual TLS) a client certificate and key."""

    ca: str
    cert: str = ""
    key: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials from the files."""
        return tls_credentials(ca=self.ca, cert=self.cert or None, key=self.key or None)

    def flags(self) -> list[str]:
        """The same files as chaos worker options."""
        flags = ["--ca", self.ca]
        if self.cert:
            flags += ["--cert", self.cert, "--key", self.key]
        return flags


def _channel(target: str, tls: TlsFiles | None) -> grpc.Channel:
    if tls is not None:
        return grpc.secure_channel(target, tls.credentials(), options=CHANNEL_OPTIONS)
    return grpc.insecure_channel(target, options=CHANNEL_OPTIONS)


def _checker(token: str, principal: str = "checker") -> tuple[tuple[str, str | bytes], ...]:
    """Call metadata of the checker, or another of the harness's own callers (its bearer
    token, if any)."""
    metadata: tuple[tuple[str, str | bytes], ...] = ((PRINCIPAL_METADATA, principal),)
    if token:
        metadata += (("authorization", f"Bearer {token}"),)
    return metadata


def watched_events(
    target: str, queue: str, token: str = "", tls: TlsFiles | None = None
) -> list[EtcdWrite]:
    """Every transition event of ``queue`` so far, through TaskService.WatchEvents."""
    request = tasks_pb2.WatchEventsRequest(queue=queue, from_revision=0, follow=False)
    with _channel(target, tls) as channel:
        stream = tasks_pb2_grpc.TaskServiceStub(channel).WatchEvents(
            request, metadata=_checker(token), timeout=60
        )
        return from_watch_events(stream)


def fence_coverage(
    name: str, target: str, token: str = "", tls: TlsFiles | None = None
) -> list[Coverage]:
    """A coordinator's fence-check counters (AdminService.GetStats), over gRPC (TLS with
    ``tls``)."""
    with _channel(target, tls) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        stats = stub.GetStats(admin_pb2.GetStatsRequest(), metadata=_checker(token), timeout=5)
    return [
        Coverage(name, admin_pb2.AcceptancePoint.Name(c.point), c.accepted, c.validated)
        for c in stats.fence_coverage
    ]


class Replica:
    """One ``coordinator serve`` process on a fixed port (a restart reuses it)."""

    def __init__(self, name: str, etcd: list[str], root: Path, flags: tuple[str, ...] = ()) -> None:
        self.name = name
        self._flags = flags  # more serve options (a scenario's stream bounds)
        self.port, self.metrics_port = free_ports("127.0.0.1", 2)
        self._etcd, self._log = etcd, root / f"{name}.log"
        self.env: dict[str, str] = {}  # additions to the environment (clock skew)
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
            # The scenarios are about fencing under faults, and their budgets assume a task taken
            # over as soon as its lease expires: no retry backoff (the default is 1 s and more).
            *("--retry-initial-backoff", "0"),
            *self._flags,
        ]
        code = "from coordinator.cli import main; main()"
        with self._log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env} if self.env else None,
            )
        lifeline.kill_with_parent(self.proc.pid)  # even if the run is SIGKILLed

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
        skews: tuple[str, ...] = (),
        partitioned: bool = False,
        tls: TlsFiles | None = None,
        replica_flags: tuple[str, ...] = (),
    ) -> None:
        self.root = root
        self.tls = tls  # TLS to a deployed coordinator (``remote``)
        # ``partitioned``: worker w0 runs in a network namespace of its own (chaos/netns.py)
        # and reaches the replicas and the outbox through proxies on its veth's host address.
        self.netns: Netns | None = Netns() if partitioned else None
        self._gates: list[TcpProxy] = []
        # ``skews``: libfaketime offsets ("+5m", ...) for replicas and workers, round robin.
        self.skews = skews
        # ``remote``: an already deployed coordinator (staging): nothing server-side is started,
        # and the run uses a queue of its own so it never touches anyone else's tasks.
        self.remote, self.token = remote, token
        self.queue = f"{QUEUE}-{uuid.uuid4().hex[:8]}" if remote else QUEUE
        self.cluster = EtcdCluster(root)
        # With ``proxied``, replicas reach every etcd member through a TcpProxy (delay, drop).
        self.proxies = [TcpProxy(e) for e in self.cluster.endpoints] if proxied else []
        etcd = [p.endpoint for p in self.proxies] or self.cluster.endpoints
        self.replicas = (
            [] if remote else [Replica(f"r{i}", etcd, root, replica_flags) for i in range(replicas)]
        )
        for i, replica in enumerate(self.replicas):
            replica.env = self._skewed(i)
        self.outbox: OutboxProcess | None = None
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.histories: list[Path] = []
        self._recorders: list[Recorder] = []

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
        if self.netns is not None:
            self.netns.create()
            ups = [r.target for r in self.replicas] + [self.outbox.url.removeprefix("http://")]
            self._gates = [TcpProxy(up.split("/")[0], host=self.netns.host_ip) for up in ups]
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
            self.target,
            principal=name,
            channel_options=CHANNEL_OPTIONS,
            token=self.token or None,
            credentials=self.tls.credentials() if self.tls else None,
        )

    def _skewed(self, i: int) -> dict[str, str]:
        return clock_skew.environment(self.skews[i % len(self.skews)]) if self.skews else {}

    def start_worker(
        self, name: str, *flags: str, isolated: bool = False
    ) -> subprocess.Popen[bytes]:
        """A chaos worker process recording into ``{root}/{name}.jsonl`` (``isolated``: inside
        the run's network namespace, through its gates)."""
        history = self.root / f"{name}.jsonl"
        self.histories.append(history)
        target, outbox = self.target, self.outbox.url if self.outbox is not None else ""
        if isolated:
            assert self.netns is not None and self._gates, "start() a partitioned harness first"
            *replicas, mailbox = self._gates
            target = "ipv4:" + ",".join(g.endpoint for g in replicas)
            outbox = f"http://{mailbox.endpoint}"
        args = ["--target", target, "--name", name, "--history", str(history)]
        args += ["--queue", self.queue, "--ttl", str(TTL)]
        if self.token:
            args += ["--token", self.token]
        if self.tls is not None:
            args += self.tls.flags()
        if outbox:
            args += ["--outbox", outbox]
        argv = [sys.executable, "-m", "chaos.worker", *args, *flags]
        proc = subprocess.Popen(
            self.netns.command(argv) if isolated and self.netns else argv,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=(self.root / f"{name}.err").open("ab"),
            env={**os.environ, **env} if (env := self._skewed(len(self.workers))) else None,
        )
        lifeline.kill_with_parent(proc.pid)  # even if the run is SIGKILLed
        self.workers[name] = proc
        return proc

    def channel(self) -> grpc.Channel:
        """A new gRPC channel to the replicas (for the harness's own raw calls)."""
        return _channel(self.target, self.tls)

    def metadata(self, principal: str) -> tuple[tuple[str, str | bytes], ...]:
        """Call metadata naming ``principal`` (with the run's bearer token, if any)."""
        return _checker(self.token, principal)

    def follower(self, principal: str = "follower") -> Follower:
        """A WatchEvents follower of the run's queue (chaos/follower.py), not yet started."""
        return Follower(self.channel, self.queue, self.metadata(principal))

    def recorder(self, name: str) -> Recorder:
        """A history of this process's own calls (an operator's), read with the workers'."""
        path = self.root / f"{name}.jsonl"
        self.histories.append(path)
        self._recorders.append(Recorder(path, name))
        return self._recorders[-1]

    def stop_workers(self) -> None:
        """Stop every worker (SIGCONT first: a frozen one ignores SIGTERM)."""
        for proc in self.workers.values():
            _stop(proc)

    def final_tasks(self) -> dict[str, FinalTask]:
        """Every task of the queue as etcd holds it now."""
        with self.client("checker") as client:
            return {
                t.task_id: FinalTask(
                    t.task_id,
                    t.state,
                    t.revision,
                    t.result_commit_id,
                    max_attempts=t.retry_policy.max_attempts or 0,
                    attempts_counted=t.attempts_counted,
                    dead_letter_reason=t.dead_letter_reason,
                )
                for t in client.list_tasks(queue=self.queue)
            }

    def etcd_history(self) -> list[EtcdWrite]:
        """etcd's own event log of the run, watched from revision 1 (chaos/etcd_history.py);
        of a deployed coordinator, its events of the run's queue through WatchEvents."""
        if self.remote:
            return watched_events(self.remote, self.queue, self.token, self.tls)
        client = self.cluster.client()
        try:
            return collect(client, PREFIX)
        finally:
            client.close()

    def effect_history(self) -> list[EffectWrite] | None:
        """etcd's history of the effect keys, watched from revision 1 (chaos/etcd_history.py);
        None against a deployed coordinator (no RPC serves it)."""
        if self.remote:
            return None
        client = self.cluster.client()
        try:
            return collect_effects(client, PREFIX)
        finally:
            client.close()

    def health_problems(self) -> list[str]:
        """What is wrong with the cluster now (chaos/health.py); empty when it is healthy."""
        if self.remote:
            return replica_problems("remote", self.remote, lambda t: _channel(t, self.tls))
        problems = etcd_problems(self.cluster)
        for replica in self.replicas:
            problems += replica_problems(replica.name, replica.target, lambda t: _channel(t, None))
        return problems

    def unsettled(self) -> int:
        """Tasks not yet DONE, CANCELLED or FAILED (a dead letter is settled too: the checker
        judges whether it may be)."""
        done = {TaskState.DONE, TaskState.CANCELLED, TaskState.FAILED}
        return sum(t.state not in done for t in self.final_tasks().values())

    def coverage(self) -> list[Coverage]:
        """Fence coverage of every running replica (of the deployed one, with ``remote``)."""
        if self.remote:
            return fence_coverage("remote", self.remote, self.token, self.tls)
        return [c for r in self.replicas if r.proc and r.proc.poll() is None for c in r.coverage()]

    def performed(self) -> dict[str, int]:
        """Per downstream key, how many times the outbox performed it."""
        if self.outbox is None:
            return {}
        return {k: int(v) for k, v in self.outbox.counts()["performed"].items()}

    def close(self) -> None:
        """Stop everything this harness started, by PID; the network namespace goes last,
        whatever failed before it."""
        try:
            self.stop_workers()
            for recorder in self._recorders:
                recorder.close()
            for replica in self.replicas:
                _stop(replica.proc)
            if self.outbox is not None:
                self.outbox.stop()
            self.cluster.stop()
            for proxy in self.proxies + self._gates:
                proxy.close()
        finally:
            if self.netns is not None:
                self.netns.delete()
