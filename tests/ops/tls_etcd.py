"""A TLS etcd on loopback for the etcd-security tests: client-certificate auth required, etcd
auth still off (each test decides how to turn it on). EtcdProcess speaks plain HTTP only."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from coordinator import lifeline
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


@dataclass(frozen=True)
class Certificates:
    """The PEM files of a TLS etcd: its CA, its own certificate, and a client certificate."""

    ca: Path
    server: Pem
    client: Pem

    @classmethod
    def make(cls, directory: Path) -> Certificates:
        """A fresh CA in ``directory``, a server certificate for loopback, a client one."""
        ca = CertificateAuthority(directory)
        server = ca.issue(
            "etcd", common_name="etcd", dns=("localhost",), ips=("127.0.0.1",), server=True
        )
        # etcd takes a client certificate's CN as its user when no password is given: not a
        # user here.
        return cls(ca.pem.cert, server, ca.issue("client", common_name="nobody"))

    def etcd_flags(self) -> list[str]:
        """Client TLS with client-certificate auth."""
        return [
            f"--cert-file={self.server.cert}",
            f"--key-file={self.server.key}",
            f"--trusted-ca-file={self.ca}",
            "--client-cert-auth",
        ]


@contextmanager
def tls_etcd(
    directory: Path, certs: Certificates | None = None, flags: list[str] | None = None
) -> Iterator[SecureEtcd]:
    """Start a TLS etcd with its data in ``directory``; stop it afterwards. ``certs`` defaults
    to fresh ones, ``flags`` (its TLS flags) to ``certs.etcd_flags()``."""
    certs = certs or Certificates.make(directory)
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
                *(flags if flags is not None else certs.etcd_flags()),
            ],
            stdout=log,
            stderr=log,
        )
        lifeline.kill_with_parent(proc.pid)  # dies with this test run
    etcd = SecureEtcd(f"127.0.0.1:{client_port}", certs.ca, certs.client)
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
