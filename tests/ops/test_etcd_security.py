"""The etcd connection's security settings reach etcd: a store opens over TLS with a client
certificate and etcd user/password taken from a Config, and is refused without them.

The etcd here is started by the test itself (EtcdProcess speaks plain HTTP only): TLS with
client-certificate auth on loopback, then etcd auth enabled through its Auth API.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from etcd3 import etcdrpc

from coordinator.cli import main as cli
from coordinator.config import Config
from coordinator.domain.versions import VersionRecord
from coordinator.errors import CoordinatorError
from coordinator.store import EtcdKV, Keyspace, Store
from coordinator.store.etcd.ops import put
from tests.ops.tls_etcd import SecureEtcd, tls_etcd

PASSWORD = "s3cret-pw"


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
    with tls_etcd(tmp_path) as etcd:
        # Until auth is on, the client certificate alone gets in; turn etcd auth on with it.
        kv = etcd.connect()
        try:
            auth = etcdrpc.AuthStub(kv._client.channel)
            auth.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password=PASSWORD), 5)
            auth.RoleAdd(etcdrpc.AuthRoleAddRequest(name="root"), 5)
            auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"), 5)
            auth.AuthEnable(etcdrpc.AuthEnableRequest(), 5)
        finally:
            kv.close()
        yield etcd


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
    kv = _connect(secure_etcd)
    try:  # a coordinator served the prefix (doctor refuses one no coordinator ever served)
        kv.txn([], [put(Keyspace("/doctored").versions, VersionRecord().encode())])
    finally:
        kv.close()
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
