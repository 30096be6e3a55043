"""The command line: help, settings validation, and real `up`/`serve` processes shut down by
SIGTERM with exit code 0."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import click
import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator import lifeline
from coordinator.cli import main
from coordinator.cli.local_up import STATE_DIR_ENV, record_file
from coordinator.config import Config
from coordinator.config_values import parse_endpoints
from coordinator.errors import ConfigError
from coordinator.etcd_process import EtcdProcess, find_etcd_binary, free_port
from coordinator.v1 import admin_pb2, admin_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parent.parent
# Run the CLI from this checkout, whichever way the package is installed.
COMMAND = [sys.executable, "-c", "from coordinator.cli import main; main()"]


def test_serve_help_lists_every_setting_and_its_env_var() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for name in ("etcd", "listen", "prefix", "min-ttl", "max-ttl", "max-claim-duration"):
        assert f"--{name}" in result.output
        assert f"COORDINATOR_{name.upper().replace('-', '_')}" in result.output
    for name in ("stall-timeout", "log-level"):
        assert f"--{name}" in result.output


def _commands(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command and subcommand of the CLI, with the words that name it (through
    ``get_command``: the top level imports each command only when asked for it)."""
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None and sub.name == name, (path, name)
            yield from _commands(sub, (*path, name))


def test_every_help_explains_each_option_in_plain_text() -> None:
    walked = list(_commands(main))
    assert len(walked) > 40  # every group was walked
    for path, command in walked:
        shown = CliRunner().invoke(main, [*path, "--help"], terminal_width=100)
        assert shown.exit_code == 0, (path, shown.output)
        assert command.help, f"`coordinator {' '.join(path)}` has no help"
        assert "``" not in shown.output, f"reST markup in `coordinator {' '.join(path)} --help`"
        bare = [
            param.opts[0]
            for param in command.params
            if isinstance(param, click.Option) and not param.hidden and not param.help
        ]
        assert bare == [], f"`coordinator {' '.join(path)}`: options without help: {bare}"


def test_config_keys_are_named_only_where_a_config_file_is_read() -> None:
    # `up`, `doctor` and `etcd-auth` share serve's options but read no --config file.
    for path, command in _commands(main):
        shown = CliRunner().invoke(main, [*path, "--help"], terminal_width=100).output
        reads_a_file = any("--config" in param.opts for param in command.params)
        assert ("Config key:" in shown) == reads_a_file, path
    serve_help = CliRunner().invoke(main, ["serve", "--help"], terminal_width=1000).output
    for key in ("max_ttl", "token_file", "insecure", "etcd_password"):
        assert f"Config key: {key}." in serve_help


def test_a_task_id_is_called_task_id_in_every_verb() -> None:
    named = 0
    for path, command in _commands(main):
        for param in command.params:
            metavar = param.make_metavar(click.Context(command)).removesuffix("...")
            assert "TASK" not in metavar.split("/") or metavar == "REV/TASK/VERSION", path
            if isinstance(param, click.Argument) and param.name == "task_id":
                # An optional one (`tasks retry [TASK_ID]` or `--queue`) shows in brackets.
                assert metavar.removeprefix("[").removesuffix("]") == "TASK_ID", (path, metavar)
                named += 1
    assert named >= 8  # tasks get/result/cancel/accept/reject/deps/retry, effects approve, ...


def test_the_top_level_help_says_where_to_start() -> None:
    shown = CliRunner().invoke(main, ["--help"], terminal_width=100)
    assert shown.exit_code == 0
    said = " ".join(shown.output.split())  # click wraps it
    assert "New here? `coordinator demo`" in said
    assert "`coordinator up` starts a local playground" in said


def test_up_help() -> None:
    result = CliRunner().invoke(main, ["up", "--help"])
    assert result.exit_code == 0, result.output
    assert "--etcd-bin" in result.output and "--data-dir" in result.output


def test_a_setting_from_the_environment_that_conflicts_is_named(tmp_path: Path) -> None:
    # The shell of `eval "$(coordinator up --print-env)"` keeps COORDINATOR_INSECURE=1.
    env = {"COORDINATOR_INSECURE": "1"}
    tokens = tmp_path / "tokens.json"
    tokens.write_text("{}")
    result = CliRunner().invoke(main, ["serve", "--token-file", str(tokens)], env=env)
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "insecure cannot be combined with token_file" in said
    assert "insecure from the environment variable COORDINATOR_INSECURE" in said
    assert "token_file from --token-file" in said
    result = CliRunner().invoke(
        main, ["tasks", "list", "--target", "127.0.0.1:1", "--token", "tok"], env=env
    )
    assert result.exit_code == 2, result.output
    assert (
        "the environment variable COORDINATOR_INSECURE says to send no credentials, but "
        "--token gives some: drop one of them" in " ".join(result.output.split())
    )


def test_up_on_a_remote_address_points_to_serve_with_tokens() -> None:
    result = CliRunner().invoke(main, ["up", "--listen", "0.0.0.0:7070"])
    assert result.exit_code == 2, result.output
    assert "'0.0.0.0:7070' is not a loopback address" in result.output
    assert "`coordinator serve` with --token-file" in result.output
    assert "--insecure-allow-remote" not in result.output  # up has no such flag


def test_up_on_a_data_dir_another_etcd_holds_is_refused_at_once(tmp_path: Path) -> None:
    # It once waited 30 s for etcd's health, the cause ("db file is flocked") in etcd's log.
    db = tmp_path / "member" / "snap" / "db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"")
    with db.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the running etcd holds it
        result = CliRunner().invoke(
            main, ["up", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0"]
        )
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert f"--data-dir {tmp_path} is in use: another etcd" in said, said


@pytest.mark.parametrize(
    ("args", "setting"),
    [
        (["--etcd", "nohost"], "etcd"),
        (["--etcd", ""], "etcd"),
        (["--listen", "127.0.0.1:99999"], "listen"),
        (["--prefix", "no-leading-slash"], "prefix"),
        (["--prefix", "/trailing/"], "prefix"),
        (["--min-ttl", "10", "--max-ttl", "5"], "max_ttl"),
        (["--max-ttl", "600", "--max-claim-duration", "60"], "max_claim_duration"),
    ],
)
def test_serve_refuses_bad_settings_naming_them(args: list[str], setting: str) -> None:
    result = CliRunner().invoke(main, ["serve", *args])
    assert result.exit_code == 2, result.output
    assert setting in result.output


def test_settings_come_from_env_vars() -> None:
    env = {"COORDINATOR_MAX_TTL": "5", "COORDINATOR_MIN_TTL": "9"}
    result = CliRunner().invoke(main, ["serve"], env=env)
    assert result.exit_code == 2
    assert "max_ttl (5) must be >= min_ttl (9)" in result.output


@pytest.mark.parametrize(
    ("changes", "setting"),
    [
        ({"etcd": ()}, "etcd"),
        ({"min_ttl": 0}, "min_ttl"),
        ({"stall_timeout": -1.0}, "stall_timeout"),
        ({"log_level": "loud"}, "log_level"),
        ({"max_workers": 0}, "max_workers"),
        ({"max_streams": 0}, "max_streams"),
        ({"max_streams_per_principal": 0}, "max_streams_per_principal"),
        ({"max_stream_age": 0.0}, "max_stream_age"),
        ({"shutdown_grace": -1.0}, "shutdown_grace"),
        ({"health_interval": 0.0}, "health_interval"),
    ],
)
def test_config_errors_name_the_setting(changes: dict[str, object], setting: str) -> None:
    with pytest.raises(ConfigError, match=setting):
        Config(**changes)  # type: ignore[arg-type]


def test_stream_limits_come_from_their_settings() -> None:
    config = Config(
        max_streams=5, max_streams_per_principal=2, max_stream_age=30.0, token_reload_interval=0.3
    )
    limits = config.stream_limits
    assert (limits.max_streams, limits.max_per_principal, limits.max_age) == (5, 2, 30.0)
    assert limits.sweep_interval == 0.3  # credentials re-checked at every token-file reload
    assert Config(token_reload_interval=5.0).stream_limits.sweep_interval == 1.0


def test_config_defaults_and_endpoints() -> None:
    config = Config(etcd=parse_endpoints(" a:1, [::1]:2379 ,"))
    assert config.etcd == ("a:1", "[::1]:2379")
    assert config.limits.max_ttl == config.max_ttl


class Process:
    """A CLI subprocess whose stdout lines can be awaited with a deadline."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._lines: queue.Queue[str] = queue.Queue()
        with log.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [*COMMAND, *args],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env={**os.environ, **(env or {})},
            )
            lifeline.kill_with_parent(self.proc.pid)  # dies with this test run
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def expect(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        """The first stdout line matching ``pattern`` (fails with the stderr log on timeout)."""
        seen: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"no line matching {pattern!r}; stdout {seen}; log:\n{self.logs()}")
            seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def logs(self) -> str:
        """What the process wrote to stderr."""
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """Last resort after a failed test."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    """Processes a test started; killed if the test left them running."""
    started: list[Process] = []
    yield started
    for process in started:
        process.kill()


def _get_epoch(address: str) -> admin_pb2.GetEpochResponse:
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return stub.GetEpoch(admin_pb2.GetEpochRequest(), timeout=10, wait_for_ready=True)


def _accepts_connections(endpoint: str) -> bool:
    host, _, port = endpoint.rpartition(":")
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, int(port))) == 0


def _child_commands(pid: int) -> list[list[str]]:
    """The command lines of ``pid``'s child processes (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if parent == pid:
                found.append((stat.parent / "cmdline").read_bytes().decode().split("\0")[:-1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return found


def test_up_serves_and_stops_cleanly_on_sigterm(tmp_path: Path, processes: list[Process]) -> None:
    up = Process(["up", "--listen", "127.0.0.1:0"], tmp_path / "up.log")
    processes.append(up)

    address = up.expect(r"listening on (\S+)")[1]
    etcd_endpoint = up.expect(r"etcd at (\S+)")[1]
    reply = _get_epoch(address)
    assert reply.epoch == 1 and not reply.claims_paused
    (etcd_args,) = [
        args
        for args in _child_commands(up.proc.pid)
        if f"--listen-client-urls=http://{etcd_endpoint}" in args
    ]
    # A kept --data-dir must not grow forever: the embedded etcd compacts old history.
    assert "--auto-compaction-mode=periodic" in etcd_args
    assert "--auto-compaction-retention=3600s" in etcd_args

    # A second terminal finds it: the remote verbs and doctor take no address or credentials.
    assert (
        f"export COORDINATOR_TARGET={address} COORDINATOR_INSECURE=1" in up.expect(r"export .*")[0]
    )
    shown = CliRunner().invoke(main, ["epoch", "show"], catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    assert "epoch 1" in shown.output
    checked = CliRunner().invoke(main, ["doctor", "--json"], catch_exceptions=False)
    assert checked.exit_code == 0, checked.output
    assert record_file(up.proc.pid).exists()

    assert up.terminate() == 0, up.logs()
    assert not record_file(up.proc.pid).exists(), "`up` left its record behind"
    assert not _accepts_connections(etcd_endpoint), "the embedded etcd outlived `up`"
    events = [r.get("event") for r in _records(up)]
    assert events.index("shutting down") < events.index("stopped")


def test_up_hands_a_second_terminal_its_environment(
    tmp_path: Path, processes: list[Process]
) -> None:
    data = tmp_path / "data"
    up = Process(["up", "--listen", "127.0.0.1:0", "--data-dir", str(data)], tmp_path / "up.log")
    processes.append(up)
    address = up.expect(r"listening on (\S+)")[1]
    etcd_endpoint = up.expect(r"etcd at (\S+)")[1]
    printed = up.expect(r"^  export .*")[0].strip()
    exports = (
        f"export COORDINATOR_TARGET={address} COORDINATOR_INSECURE=1 "
        f"COORDINATOR_ETCD={etcd_endpoint}"
    )
    assert printed == exports
    assert (data / "env").read_text() == exports + "\n"  # `. <data-dir>/env` in a shell
    asked = CliRunner().invoke(main, ["up", "--print-env"], catch_exceptions=False)
    assert (asked.exit_code, asked.output) == (0, exports + "\n")
    # What the line gives a shell works: the etcd named is the one `up` runs.
    sourced = subprocess.run(
        ["bash", "-c", f'eval "$({shlex.join(COMMAND)} up --print-env)"; echo "$COORDINATOR_ETCD"'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert sourced.stdout.strip() == etcd_endpoint
    assert _accepts_connections(etcd_endpoint)

    # Typed twice: the second `up` says the first one runs, and starts nothing.
    again = subprocess.run(
        [*COMMAND, "up", "--listen", address],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 2, again.stderr
    assert f"a `coordinator up` is already running on {address} (pid {up.proc.pid})" in (
        " ".join(again.stderr.split())
    )
    assert again.stdout == "" and "Traceback" not in again.stderr

    assert up.terminate() == 0, up.logs()
    assert not (data / "env").exists(), "`up` left an env file naming a server that is gone"
    gone = CliRunner().invoke(main, ["up", "--print-env"])
    assert gone.exit_code == 1 and gone.stdout == "", gone.output
    assert "no `coordinator up` is running" in gone.stderr


def test_without_up_or_a_target_the_cli_says_that_up_is_not_running(tmp_path: Path) -> None:
    # A second terminal whose `coordinator up` is not (or no longer) running.
    env: dict[str, str | None] = {STATE_DIR_ENV: str(tmp_path)}  # nothing published here
    env |= dict.fromkeys(
        ("COORDINATOR_TARGET", "COORDINATOR_TOKEN", "COORDINATOR_INSECURE", "COORDINATOR_ETCD")
    )
    for verb in (["epoch", "show"], ["tasks", "list"], ["events"], ["drain"], ["jobs"]):
        shown = CliRunner().invoke(main, verb, env=env)
        assert shown.exit_code == 2, (verb, shown.output)
        assert "no `coordinator up` is running (start one in another terminal)" in shown.stderr
        assert "no credentials" not in shown.stderr  # not what is missing
    if _accepts_connections("127.0.0.1:2379"):
        pytest.skip("an etcd answers on the default 127.0.0.1:2379 here")
    checked = CliRunner().invoke(main, ["doctor"], env=env)
    assert checked.exit_code == 1, checked.output
    assert "Connection refused" in checked.stderr
    assert (
        "(no --etcd given and no `coordinator up` running, so 127.0.0.1:2379 was tried: start "
        "`coordinator up`, or give --etcd HOST:PORT)"
    ) in checked.stderr


def test_serve_uses_env_settings_and_exits_zero_on_sigterm(
    etcd: EtcdProcess, prefix: str, tmp_path: Path, processes: list[Process]
) -> None:
    env = {"COORDINATOR_ETCD": etcd.endpoint, "COORDINATOR_PREFIX": prefix}
    env["COORDINATOR_METRICS_LISTEN"] = "127.0.0.1:0"  # not the default 9090: runs may overlap
    serve = Process(["serve", "--listen", "127.0.0.1:0", "--insecure"], tmp_path / "serve.log", env)
    processes.append(serve)

    # `serve` prints nothing on stdout; the address is in its JSON "serving" log line.
    address = _wait_for_log(serve, "serving", "listen")
    assert _get_epoch(address).epoch == 1
    assert serve.terminate() == 0, serve.logs()
    serving = next(r for r in _records(serve) if r.get("event") == "serving")
    assert serving["prefix"] == prefix and serving["etcd"] == etcd.endpoint


def _records(process: Process) -> list[dict[str, Any]]:
    """The JSON log lines the process wrote to stderr so far."""
    records = []
    for line in process.logs().splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return records


def _wait_for_log(process: Process, event: str, field: str, timeout: float = 30.0) -> str:
    """``field`` of the first JSON log line whose event is ``event``."""

    def found() -> str | None:
        hits = [r[field] for r in _records(process) if r.get("event") == event]
        return str(hits[0]) if hits else None

    return str(eventually(found, timeout=timeout, message=f"no {event!r} log line"))


@pytest.mark.parametrize(
    ("flag", "setting"), [("--listen", "listen"), ("--metrics-listen", "metrics_listen")]
)
def test_serve_refuses_a_taken_port_before_it_touches_etcd(
    etcd: EtcdProcess, etcd_client: Any, prefix: str, flag: str, setting: str
) -> None:
    """Exit 2 naming the setting, and nothing written under the prefix: a taken metrics port
    was found only after the store had started (its watches, a prune pass) and written."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "--etcd", etcd.endpoint, "--prefix", prefix, "--insecure"]
        free = ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
        result = subprocess.run(
            [*COMMAND, *args, *free, flag, f"127.0.0.1:{port}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 2, result.stderr  # an invalid setting, like any other
    assert f"{setting}: cannot bind '127.0.0.1:{port}'" in result.stderr
    assert "is another process listening there?" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(etcd_client.get_prefix(prefix + "/", keys_only=True)) == []


def _health(address: str, service: str) -> int:
    # The first check waits for the process to start listening: seconds of imports on a busy
    # machine (5 s were not always enough at a load of 15 on 2 cores).
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        return int(stub.Check(request, timeout=30, wait_for_ready=True).status)


def test_serve_waits_for_etcd_not_ready_then_serves_once_it_answers(
    prefix: str, tmp_path: Path, processes: list[Process]
) -> None:
    later = EtcdProcess(binary=find_etcd_binary())  # ports chosen, nothing running yet
    port = free_port()
    args = ["serve", "--etcd", later.endpoint, "--prefix", prefix, "--insecure"]
    env = {"COORDINATOR_METRICS_LISTEN": "127.0.0.1:0"}
    serve = Process([*args, "--listen", f"127.0.0.1:{port}"], tmp_path / "serve.log", env)
    processes.append(serve)
    address = f"127.0.0.1:{port}"
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, 2
    assert _health(address, "liveness") == serving  # alive: no restart while etcd is away
    assert _health(address, "") == not_serving  # not ready: no calls routed here
    eventually(lambda: "etcd not reachable; waiting" in serve.logs(), timeout=10)
    assert serve.proc.poll() is None
    with later:
        eventually(lambda: _health(address, "") == serving, timeout=30)
        assert _get_epoch(address).epoch == 1
        assert serve.terminate() == 0, serve.logs()


def test_serve_stops_cleanly_while_waiting_for_etcd(
    prefix: str, tmp_path: Path, processes: list[Process]
) -> None:
    port = free_port()
    args = ["serve", "--etcd", f"127.0.0.1:{port}", "--prefix", prefix, "--insecure"]
    env = {"COORDINATOR_METRICS_LISTEN": "127.0.0.1:0"}
    serve = Process([*args, "--listen", "127.0.0.1:0"], tmp_path / "serve.log", env)
    processes.append(serve)
    eventually(lambda: "etcd not reachable; waiting" in serve.logs(), timeout=10)
    assert serve.terminate() == 0, serve.logs()
    assert "Traceback" not in serve.logs()


@pytest.fixture
def not_etcd() -> Iterator[str]:
    """A gRPC server that is not etcd (health only): every etcd call is UNIMPLEMENTED."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_serve_against_a_grpc_server_that_is_not_etcd_exits_2_naming_it(
    not_etcd: str, prefix: str
) -> None:
    args = ["serve", "--etcd", not_etcd, "--prefix", prefix, "--insecure"]
    args += ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
    result = subprocess.run(
        [*COMMAND, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr  # a bad setting: waiting cannot help
    assert f"Error: etcd: {not_etcd} answered but refused the first request" in result.stderr
    assert "UNIMPLEMENTED" in result.stderr
    assert "is it an etcd v3 client endpoint (--etcd / COORDINATOR_ETCD)" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_against_a_plain_tcp_port_waits_as_for_an_absent_etcd(
    prefix: str, tmp_path: Path, processes: list[Process]
) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does) and says nothing
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        args = ["serve", "--etcd", endpoint, "--prefix", prefix, "--insecure"]
        args += ["--etcd-timeout", "1", "--listen", "127.0.0.1:0"]
        env = {"COORDINATOR_METRICS_LISTEN": "127.0.0.1:0"}
        serve = Process(args, tmp_path / "serve.log", env)
        processes.append(serve)
        eventually(lambda: "etcd not reachable; waiting" in serve.logs(), timeout=20)
        assert serve.proc.poll() is None
        assert serve.terminate() == 0, serve.logs()
    assert "Traceback" not in serve.logs()


def test_a_sigkilled_up_with_a_data_dir_leaves_its_data_but_no_env_file(
    tmp_path: Path, processes: list[Process]
) -> None:
    data = tmp_path / "data"
    up = Process(["up", "--listen", "127.0.0.1:0", "--data-dir", str(data)], tmp_path / "up.log")
    processes.append(up)
    up.expect(r"press Ctrl-C")
    assert (data / "env").exists()
    up.proc.kill()  # no cleanup of its own: the reaper's
    up.proc.wait()
    eventually(lambda: not (data / "env").exists(), timeout=30, message="a stale env file stayed")
    assert (data / "member").is_dir()  # the kept data is kept
