"""A TLS etcd on loopback for the etcd-security tests: client-certificate auth required, etcd
auth still off (each test decides how to turn it on). EtcdProcess speaks plain HTTP only."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from coordinator.errors import CoordinatorError
from coordinator.etcd_process import find_etcd_binary, free_port
from coordinator.store import EtcdKV
from tests.auth.certs import CertificateAuthority, Pem
from tests.helpers import eventually


@dataclass
class SecureEtcd:
    """A TLS etcd: its endpoint, its CA, and a client certificate it accepts."""

    endpoint: str
    ca: Path
    client: Pem

    def connect(self, **security: str | None) -> EtcdKV:
        """An EtcdKV over TLS with the client certificate, plus ``security`` overrides."""
        settings: dict[str, str | None] = {
            "ca_cert": str(self.ca),
            "cert_cert": str(self.client.cert),
            "cert_key": str(self.client.key),
            **security,
        }
        return EtcdKV.connect([self.endpoint], timeout=3.0, **settings)


@contextmanager
def tls_etcd(directory: Path) -> Iterator[SecureEtcd]:
    """Start a TLS etcd with its data and certificates in ``directory``; stop it afterwards."""
    ca = CertificateAuthority(directory)
    server = ca.issue(
        "etcd", common_name="etcd", dns=("localhost",), ips=("127.0.0.1",), server=True
    )
    # etcd takes a client certificate's CN as its user when no password is given: not a user here.
    client = ca.issue("client", common_name="nobody")
    client_port, peer_port = free_port(), free_port()
    url, peer = f"https://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    with (directory / "etcd.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                str(find_etcd_binary()),
                "--name=secure",
                f"--data-dir={directory / 'data'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=secure={peer}",
                f"--cert-file={server.cert}",
                f"--key-file={server.key}",
                f"--trusted-ca-file={ca.pem.cert}",
                "--client-cert-auth",
            ],
            stdout=log,
            stderr=log,
        )
    etcd = SecureEtcd(f"127.0.0.1:{client_port}", ca.pem.cert, client)
    try:
        eventually(lambda: _answers(etcd), timeout=30, message="TLS etcd never answered")
        yield etcd
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _answers(etcd: SecureEtcd) -> bool:
    try:
        kv = etcd.connect()
    except CoordinatorError:
        return False
    try:
        kv.get("/probe")
    except CoordinatorError:
        return False
    finally:
        kv.close()
    return True
