"""``coordinator etcd-auth`` closes a TLS etcd: afterwards nothing gets in without a password,
the coordinator's user runs a whole claim cycle in its prefix and is refused outside it, and a
second run (every ``helm upgrade``) applies a new password and prefix.

A real TLS etcd (tests/ops/tls_etcd.py) with auth off at the start, as the chart's bundled etcd
starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from coordinator.cli import main as cli
from coordinator.domain.states import Outcome
from coordinator.errors import CoordinatorError
from coordinator.store import Keyspace, Store
from coordinator.store.etcd.ops import put
from tests.ops.tls_etcd import SecureEtcd, tls_etcd
from tests.store.support import claim, commit, create

ROOT_PASSWORD = "root-pw-1"
USER = "coordinator"


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[SecureEtcd]:
    with tls_etcd(tmp_path) as etcd:
        yield etcd


def _etcd_auth(
    etcd: SecureEtcd, *, prefix: str, password: str, root_password: str = ROOT_PASSWORD
) -> Result:
    args = ["etcd-auth", "--etcd", etcd.endpoint, "--prefix", prefix, "--etcd-user", USER]
    args += [f"--etcd-ca-cert={etcd.ca}", f"--etcd-cert={etcd.client.cert}"]
    args += [f"--etcd-key={etcd.client.key}"]
    env = {"COORDINATOR_ETCD_ROOT_PASSWORD": root_password, "COORDINATOR_ETCD_PASSWORD": password}
    return CliRunner().invoke(cli, args, env=env)


def _writes(etcd: SecureEtcd, key: str, **login: str | None) -> bool:
    """Whether a put of ``key`` with these credentials is accepted (False: refused)."""
    try:
        kv = etcd.connect(**login)
    except CoordinatorError:
        return False
    try:
        return kv.txn([], [put(key, b"x")]).succeeded
    except CoordinatorError:
        return False
    finally:
        kv.close()


def _claim_cycle(etcd: SecureEtcd, prefix: str, password: str) -> None:
    """Open a store as the coordinator's user; create, claim (a lease) and commit one task."""
    kv = etcd.connect(user=USER, password=password)
    try:
        store = Store.open(kv, keys=Keyspace(prefix))
        store.start()
        try:
            create(store, "t1")
            fence = claim(store, "t1")
            assert commit(store, fence).verdict.outcome is Outcome.COMMITTED
        finally:
            store.close()
    finally:
        kv.close()


def test_etcd_auth_leaves_only_the_coordinator_user_on_its_prefix(etcd: SecureEtcd) -> None:
    assert _writes(etcd, "/open/before"), "auth must start off, as in the bundled etcd"

    result = _etcd_auth(etcd, prefix="/coord", password="pw-1")
    assert result.exit_code == 0, result.output
    assert result.output == "etcd auth enabled: user 'coordinator' may use /coord/ only\n"

    # The client certificate alone no longer gets in: every request needs a login.
    assert not _writes(etcd, "/coord/x")
    assert not _writes(etcd, "/coord/x", user=USER, password="wrong")
    _claim_cycle(etcd, "/coord", "pw-1")
    as_coordinator = {"user": USER, "password": "pw-1"}
    assert _writes(etcd, "/coord/x", **as_coordinator)
    for outside in ("/other/x", "/coordx/y", "/coord", "/"):
        assert not _writes(etcd, outside, **as_coordinator), outside
    assert _writes(etcd, "/other/x", user="root", password=ROOT_PASSWORD)


def test_a_second_run_applies_a_new_password_and_prefix(etcd: SecureEtcd) -> None:
    assert _etcd_auth(etcd, prefix="/coord", password="pw-1").exit_code == 0

    result = _etcd_auth(etcd, prefix="/moved", password="pw-2")
    assert result.exit_code == 0, result.output
    assert result.output == "etcd auth reconciled: user 'coordinator' may use /moved/ only\n"
    assert not _writes(etcd, "/moved/x", user=USER, password="pw-1")
    assert _writes(etcd, "/moved/x", user=USER, password="pw-2")
    assert not _writes(etcd, "/coord/x", user=USER, password="pw-2"), "old range not revoked"


def test_a_wrong_root_password_once_auth_is_on_fails_naming_it(etcd: SecureEtcd) -> None:
    assert _etcd_auth(etcd, prefix="/coord", password="pw-1").exit_code == 0

    result = _etcd_auth(etcd, prefix="/coord", password="pw-1", root_password="guess")
    assert result.exit_code == 1
    assert "root's password is not the one given" in result.output
    assert _writes(etcd, "/coord/x", user=USER, password="pw-1")


def test_the_coordinator_user_is_required_and_never_root(etcd: SecureEtcd) -> None:
    args = ["etcd-auth", "--etcd", etcd.endpoint, "--etcd-ca-cert", str(etcd.ca)]
    env = {"COORDINATOR_ETCD_ROOT_PASSWORD": ROOT_PASSWORD, "COORDINATOR_ETCD_PASSWORD": "pw"}
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 2 and "--etcd-user" in result.output, result.output
    result = CliRunner().invoke(cli, [*args, "--etcd-user", "root"], env=env)
    assert result.exit_code == 2 and "must not be root" in result.output, result.output
    assert _writes(etcd, "/anything"), "a refused run must change nothing"


def test_the_passwords_may_come_from_files_as_the_chart_mounts_them(
    etcd: SecureEtcd, tmp_path: Path
) -> None:
    (tmp_path / "root-password").write_text(ROOT_PASSWORD + "\n")
    (tmp_path / "password").write_text("pw-files\n")
    args = ["etcd-auth", "--etcd", etcd.endpoint, "--prefix", "/coord", "--etcd-user", USER]
    args += [f"--etcd-ca-cert={etcd.ca}", f"--etcd-cert={etcd.client.cert}"]
    args += [f"--etcd-key={etcd.client.key}"]
    env = {
        "COORDINATOR_ETCD_ROOT_PASSWORD_FILE": str(tmp_path / "root-password"),
        "COORDINATOR_ETCD_PASSWORD_FILE": str(tmp_path / "password"),
    }
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    assert _writes(etcd, "/coord/x", user=USER, password="pw-files")
    assert _writes(etcd, "/other/x", user="root", password=ROOT_PASSWORD)


def test_without_a_root_password_nothing_is_done(etcd: SecureEtcd) -> None:
    args = ["etcd-auth", "--etcd", etcd.endpoint, "--prefix", "/coord", "--etcd-user", USER]
    result = CliRunner().invoke(cli, args, env={"COORDINATOR_ETCD_PASSWORD": "pw"})
    assert result.exit_code == 2
    assert "COORDINATOR_ETCD_ROOT_PASSWORD_FILE" in result.output
    assert _writes(etcd, "/open/after"), "auth must still be off"
