"""``--target`` over TLS: the pause scenario against a real ``coordinator serve`` process that
serves mutual TLS and bearer tokens, as a staging deployment would."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from chaos.harness import CHANNEL_OPTIONS, TlsFiles
from chaos.runner import run_scenario
from coordinator import lifeline
from coordinator.etcd_process import EtcdProcess, free_ports
from coordinator.sdk import CallRetry, TransportError, WorkerClient
from tests.auth.certs import CertificateAuthority
from tests.auth.conftest import TokenRing
from tests.helpers import eventually

pytestmark = pytest.mark.slow

ROLES = ["worker", "pm", "admin"]


@pytest.fixture
def staging(etcd: EtcdProcess, prefix: str, tmp_path: Path) -> Iterator[tuple[str, str, TlsFiles]]:
    """A TLS ``coordinator serve`` (client certificates required); its target, a token, and
    the client's PEM files."""
    ca = CertificateAuthority(tmp_path)
    server = ca.issue(
        "server", common_name="localhost", dns=("localhost",), ips=("127.0.0.1",), server=True
    )
    client = ca.issue("client", common_name="chaos-client")
    ring = TokenRing(tmp_path / "tokens.json")
    ring.certificates = {"chaos-client": ROLES}
    token = ring.issue("chaos", ROLES)
    port, metrics = free_ports("127.0.0.1", 2)
    target = f"127.0.0.1:{port}"
    args = [
        *("serve", "--etcd", etcd.endpoint, "--listen", target, "--prefix", prefix),
        *("--metrics-listen", f"127.0.0.1:{metrics}", "--token-file", str(ring.path)),
        *("--tls-cert", str(server.cert), "--tls-key", str(server.key)),
        *("--tls-client-ca", str(ca.pem.cert), "--min-ttl", "1"),
        *("--reclaim-scan-interval", "1", "--log-level", "warning", "--shutdown-grace", "1"),
    ]
    code = "from coordinator.cli import main; main()"
    log = (tmp_path / "serve.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=log, stderr=log)
    lifeline.kill_with_parent(proc.pid)  # dies with this test run
    tls = TlsFiles(str(ca.pem.cert), str(client.cert), str(client.key))
    try:
        with WorkerClient(
            target,
            principal="probe",
            token=token,
            credentials=tls.credentials(),
            channel_options=CHANNEL_OPTIONS,
            retry=CallRetry(attempts=1, timeout=timedelta(seconds=2)),
        ) as probe:
            eventually(lambda: _answers(probe), timeout=30, message="coordinator serve (TLS)")
        yield target, token, tls
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _answers(client: WorkerClient) -> bool:
    try:
        client.epoch()
    except TransportError:
        return False
    return True


def test_the_pause_scenario_runs_over_mutual_tls_against_coordinator_serve(
    staging: tuple[str, str, TlsFiles], tmp_path: Path
) -> None:
    target, token, tls = staging
    with (
        WorkerClient(
            target,
            principal="plain",
            token=token,
            channel_options=CHANNEL_OPTIONS,
            retry=CallRetry(attempts=1, timeout=timedelta(seconds=2)),
        ) as plaintext,
        pytest.raises(TransportError),
    ):
        plaintext.epoch()  # the port speaks TLS only
    (tmp_path / "run").mkdir()
    result = run_scenario(
        "worker-pause",
        duration=3,
        seed=3,
        root=tmp_path / "run",
        target=target,
        token=token,
        tls=tls,
    )
    assert result.verdict is not None and result.verdict.violations == ()
    assert result.verdict.fenced.get("SUPERSEDED", 0) >= 1
    assert result.verdict.fence_checks > 0  # GetStats over TLS too
    assert result.verdict.commits > 0
