"""The processes under test: etcd and one coordinator server, each in its own process.

CPU and memory are read from ``/proc/<pid>/stat`` and ``/proc/<pid>/status`` before and after
each run, so every figure belongs to one process: the client (this process), the coordinator
and etcd. The coordinator is ``coordinator serve`` in a child process, started with the same
interpreter, so a profile or an RSS reading never mixes in the benchmark's own threads.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import etcd3
import grpc
from etcd3 import etcdrpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator import lifeline
from coordinator.etcd_process import EtcdProcess, free_port, stop_child_group

_TICK = os.sysconf("SC_CLK_TCK")

# Loopback only: an $http_proxy meant for the web must never carry the benchmark's traffic.
GRPC_OPTIONS = [("grpc.enable_http_proxy", 0)]

_SERVE = "import sys; from coordinator.cli import main; sys.exit(main())"


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory (logs, py-spy output) removed when the block is left, and by this
    process's reaper if the bench is SIGKILLed first (coordinator/lifeline.py)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    lifeline.remove_with_parent(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        lifeline.keep(path)  # only once it is gone: a kill in between still removes it


def compact_now(client: etcd3.Etcd3Client) -> None:
    """Compact etcd's history up to its current revision; returns once it is dropped.

    A history already compacted that far (nothing written since the last compaction, or the
    coordinator's own trim got there first) is what was asked for: etcd answers OUT_OF_RANGE
    "required revision has been compacted", which once failed a CI run's smoke bench."""
    revision = client.maintenancestub.Status(etcdrpc.StatusRequest(), 120).header.revision
    try:
        client.compact(revision, physical=True)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.OUT_OF_RANGE:
            raise


@contextlib.contextmanager
def etcd_compactor(etcd: EtcdProcess) -> Iterator[Callable[[], None]]:
    """A function that compacts etcd's history up to now, off the clock (as a deployment's
    periodic compaction would), so later runs do not pay for earlier runs' history."""
    client = etcd3.client(etcd.host, etcd.port, timeout=60, grpc_options=GRPC_OPTIONS)
    try:
        yield lambda: compact_now(client)
    finally:
        client.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of every thread of ``pid`` so far (``/proc/<pid>/stat``)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of the whole line
    return (utime + stime) / _TICK


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of ``pid`` so far (each
    ``/proc/<pid>/task/<tid>/status``; a thread that ended meanwhile takes its count with it).
    A thread that sleeps on a lock, a condition, the GIL or a completion queue and is woken
    costs one: the figure that says how many hand-offs a call costs."""
    return sum(thread_switches(pid).values())


def thread_switches(pid: int) -> dict[int, int]:
    """``context_switches`` of each live thread of ``pid``, by thread id."""
    counts: dict[int, int] = {}
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        with contextlib.suppress(OSError):  # the thread ended between the listing and the read
            counts[int(status.parent.name)] = sum(
                int(line.split()[1])
                for line in status.read_text().splitlines()
                if "ctxt_switches:" in line
            )
    return counts


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident memory of ``pid`` in MiB (``VmRSS``, or ``VmHWM`` for the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # the kernel reports kB
    raise ValueError(f"/proc/{pid}/status has no {field}")


def wait_quiet(pids: list[int], *, limit: float, interval: float = 0.1) -> float:
    """Wait until none of ``pids`` used CPU during two consecutive intervals (or ``limit``
    seconds passed) so that work left from one run does not land in the next one's window.
    Returns the seconds waited."""
    started = time.monotonic()
    quiet = 0
    last = [cpu_seconds(p) for p in pids]
    while time.monotonic() - started < limit and quiet < 2:
        time.sleep(interval)
        now = [cpu_seconds(p) for p in pids]
        # One clock tick of slack: the health checker and the reclaimer's scan tick by themselves.
        busy = any(b - a > 1.5 / _TICK for a, b in zip(last, now, strict=True))
        quiet = 0 if busy else quiet + 1
        last = now
    return time.monotonic() - started


_HANDLED = re.compile(r"^grpc_server_handled_total\{[^}]*\} (\S+)$", re.MULTILINE)


def etcd_calls(url: str) -> float:
    """Every gRPC call etcd has answered (unary and streams, any method and code) so far."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(count) for count in _HANDLED.findall(text))


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds of each measured process at one instant."""

    client: float
    coordinator: float
    etcd: float

    def __sub__(self, other: CpuSnapshot) -> CpuSnapshot:
        return CpuSnapshot(
            self.client - other.client,
            self.coordinator - other.coordinator,
            self.etcd - other.etcd,
        )


class Meter:
    """Reads the CPU of the client (this process), the coordinator and etcd, the coordinator's
    context switches by thread, and (given etcd's client URL) how many gRPC calls etcd has
    answered."""

    def __init__(self, coordinator_pid: int, etcd_pid: int, etcd_url: str | None = None) -> None:
        self.coordinator_pid = coordinator_pid
        self.etcd_pid = etcd_pid
        self.etcd_url = etcd_url

    def etcd_calls(self) -> float | None:
        """gRPC calls etcd has answered so far, from its ``/metrics`` (None without a URL)."""
        return etcd_calls(self.etcd_url) if self.etcd_url else None

    def switches(self) -> dict[int, int]:
        """The coordinator's context switches so far, by thread (``thread_switches``): by thread
        so that a caller may count a thread started meanwhile from 0, or group them by name."""
        return thread_switches(self.coordinator_pid)

    def snapshot(self) -> CpuSnapshot:
        """CPU so far of the three processes."""
        return CpuSnapshot(
            cpu_seconds(os.getpid()),
            cpu_seconds(self.coordinator_pid),
            cpu_seconds(self.etcd_pid),
        )

    def settle(self, limit: float) -> float:
        """Wait for the coordinator and etcd to go idle (see ``wait_quiet``)."""
        return wait_quiet([self.coordinator_pid, self.etcd_pid], limit=limit)


def serve_supports(flag: str) -> bool:
    """Whether this checkout's ``coordinator serve`` accepts ``flag`` (its --help lists it)."""
    return flag in _serve_help()


@functools.cache
def _serve_help() -> str:
    out = subprocess.run(
        [sys.executable, "-c", _SERVE, "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return out.stdout


class CoordinatorProcess:
    """``coordinator serve`` in a child process, on a free loopback port.

    In insecure mode the caller's principal is the ``x-coordinator-principal`` metadata; when
    this checkout's ``serve`` has an ``--insecure`` flag it is passed (loopback only). ``cwd``
    runs the server from another checkout: ``python -c`` puts the working directory first on
    ``sys.path``, so that checkout's ``coordinator`` package is the one served (bench.compare).
    """

    def __init__(
        self,
        etcd_endpoint: str,
        *,
        prefix: str,
        log_path: Path,
        log_level: str = "info",
        max_ttl: int = 600,
        cwd: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self._args = [
            "serve",
            f"--etcd={etcd_endpoint}",
            f"--listen={self.target}",
            f"--prefix={prefix}",
            "--min-ttl=1",
            f"--max-ttl={max_ttl}",
            f"--max-claim-duration={max(3600, max_ttl)}",
            f"--log-level={log_level}",
        ]
        if serve_supports("--insecure"):
            self._args.append("--insecure")
        if serve_supports("--metrics-listen"):  # a free port: never collide on the default
            self._args.append("--metrics-listen=127.0.0.1:0")
        if serve_supports("--retry-initial-backoff"):
            # The reclaim benchmark times expiry to READY: a retry backoff would be measured
            # instead (the server's default waits 1 s and more before an expired task's retry).
            self._args.append("--retry-initial-backoff=0")
        self._args += extra_args
        self._cwd = cwd
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The server's process id."""
        if self._proc is None:
            raise RuntimeError("the coordinator was never started")
        return self._proc.pid

    def start(self, timeout: float = 60.0) -> Self:
        """Start the server and wait until its health check answers SERVING."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("COORDINATOR_")}
        with self._log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVE, *self._args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._cwd,
                start_new_session=True,
            )
        lifeline.kill_with_parent(self._proc.pid)  # even if the bench is SIGKILLed
        self._wait_serving(timeout)
        return self

    def _wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.target, options=GRPC_OPTIONS) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                assert self._proc is not None
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"coordinator exited with {self._proc.returncode}; log: {self._log_path}"
                    )
                with contextlib.suppress(grpc.RpcError):
                    answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                    if answer.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                time.sleep(0.1)
        raise RuntimeError(f"coordinator not SERVING after {timeout}s; log: {self._log_path}")

    def stop(self) -> None:
        """SIGTERM (graceful), then SIGKILL after 10 s."""
        if self._proc is not None:
            stop_child_group(self._proc, 10.0)
            lifeline.spare(self._proc.pid)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
