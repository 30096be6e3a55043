"""The etcd connection's security settings reach etcd: a store opens over TLS with a client
certificate and etcd user/password taken from a Config, and is refused without them.

The etcd here is started by the test itself (EtcdProcess speaks plain HTTP only): TLS with
client-certificate auth on loopback, then etcd auth enabled through its Auth API.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from etcd3 import etcdrpc

from coordinator.cli import main as cli
from coordinator.config import Config
from coordinator.errors import CoordinatorError
from coordinator.etcd_process import find_etcd_binary, free_port
from coordinator.store import EtcdKV, Keyspace, Store
from tests.auth.certs import CertificateAuthority, Pem
from tests.helpers import eventually

PASSWORD = "s3cret-pw"


@dataclass
class SecureEtcd:
    """A TLS etcd with auth enabled: its endpoint, CA, a client certificate, a root password."""

    endpoint: str
    ca: Path
    client: Pem


def _connect(etcd: SecureEtcd, **overrides: str | None) -> EtcdKV:
    config = Config(
        etcd=(etcd.endpoint,),
        etcd_ca_cert=str(etcd.ca),
        etcd_cert=str(etcd.client.cert),
        etcd_key=str(etcd.client.key),
        etcd_user="root",
        etcd_password=PASSWORD,
    )
    security = {**config.etcd_security(), **overrides}
    return EtcdKV.connect(list(config.etcd), timeout=3.0, **security)


@pytest.fixture
def secure_etcd(tmp_path: Path) -> Iterator[SecureEtcd]:
    ca = CertificateAuthority(tmp_path)
    server = ca.issue(
        "etcd", common_name="etcd", dns=("localhost",), ips=("127.0.0.1",), server=True
    )
    # etcd takes a client certificate's CN as its user when no password is given: not a user here.
    client = ca.issue("client", common_name="nobody")
    client_port, peer_port = free_port(), free_port()
    url, peer = f"https://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    with (tmp_path / "etcd.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                str(find_etcd_binary()),
                "--name=secure",
                f"--data-dir={tmp_path / 'data'}",
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
        # Until auth is on, the client certificate alone gets in; turn etcd auth on with it.
        kv = eventually(lambda: _ready(etcd), timeout=30, message="TLS etcd never answered")
        auth = etcdrpc.AuthStub(kv._client.channel)
        auth.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password=PASSWORD), 5)
        auth.RoleAdd(etcdrpc.AuthRoleAddRequest(name="root"), 5)
        auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"), 5)
        auth.AuthEnable(etcdrpc.AuthEnableRequest(), 5)
        kv.close()
        yield etcd
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _ready(etcd: SecureEtcd) -> EtcdKV | None:
    try:
        kv = _connect(etcd, user=None, password=None)
        kv.get("/probe")
    except CoordinatorError:
        return None
    return kv


def test_a_store_opens_over_tls_with_a_client_certificate_and_a_password(
    secure_etcd: SecureEtcd,
) -> None:
    kv = _connect(secure_etcd)
    try:
        store = Store.open(kv, keys=Keyspace("/secure"))
        store.start()
        try:
            assert store.admin.epoch() == 1
            assert store.admin.bump_epoch() == 2
        finally:
            store.close()
    finally:
        kv.close()


@pytest.mark.parametrize(
    "overrides",
    [
        {"password": "wrong"},
        {"user": None, "password": None},
        {"cert_cert": None, "cert_key": None},
    ],
    ids=["wrong-password", "no-credentials", "no-client-certificate"],
)
def test_etcd_refuses_a_connection_missing_a_credential(
    secure_etcd: SecureEtcd, overrides: dict[str, str | None]
) -> None:
    with pytest.raises(CoordinatorError):
        kv = _connect(secure_etcd, **overrides)
        try:
            kv.get("/secure/epoch")
        finally:
            kv.close()


def _doctor(etcd: SecureEtcd, *flags: str) -> Result:
    return CliRunner().invoke(
        cli, ["doctor", "--etcd", etcd.endpoint, "--prefix", "/doctored", *flags]
    )


def test_doctor_reads_a_keyspace_over_tls_with_etcd_credentials(
    secure_etcd: SecureEtcd,
) -> None:
    result = _doctor(
        secure_etcd,
        f"--etcd-ca-cert={secure_etcd.ca}",
        f"--etcd-cert={secure_etcd.client.cert}",
        f"--etcd-key={secure_etcd.client.key}",
        "--etcd-user=root",
        f"--etcd-password={PASSWORD}",
    )
    assert result.exit_code == 0, result.output
    assert "doctor: keyspace /doctored is consistent at revision" in result.output


def test_doctor_without_the_etcd_password_fails_with_a_message(secure_etcd: SecureEtcd) -> None:
    result = _doctor(
        secure_etcd,
        f"--etcd-ca-cert={secure_etcd.ca}",
        f"--etcd-cert={secure_etcd.client.cert}",
        f"--etcd-key={secure_etcd.client.key}",
    )
    assert result.exit_code == 1
    assert result.output.startswith("Error: ")
    assert "consistent" not in result.output
