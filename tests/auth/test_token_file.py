"""The token file: parsing (every mistake named), reload on change only and at most once per
interval, and the ``coordinator token`` verbs that write it."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from coordinator.cli import main
from coordinator.domain.roles import ALL_ROLES, Identity, Role, parse_roles
from coordinator.errors import ConfigError, InvalidArgument, Unauthenticated
from coordinator.server.interceptors.auth import TokenAuth
from coordinator.server.tokens import TokenFile, parse_token_file, token_hash, write_token_file

HASH = token_hash("s3cret")


def _doc(**tokens: object) -> str:
    return json.dumps({"tokens": tokens})


def test_a_valid_file_parses() -> None:
    table = parse_token_file(
        json.dumps(
            {
                "tokens": {HASH: {"principal": "w-1", "roles": ["worker", "pm"], "note": "x"}},
                "certificates": {"w-2.pool": {"roles": ["admin"]}},
            }
        )
    )
    assert table.tokens[HASH].principal == "w-1"
    assert table.tokens[HASH].roles == frozenset({Role.WORKER, Role.PM})
    assert table.certificates == {"w-2.pool": frozenset({Role.ADMIN})}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "top level must be an object"),
        ('{"tokenz": {}}', "unknown key(s) ['tokenz']"),
        (_doc(**{"abc": {"principal": "p", "roles": ["worker"]}}), "64-character"),
        (_doc(**{HASH: {"roles": ["worker"]}}), "principal is required"),
        (_doc(**{HASH: {"principal": "bad principal", "roles": ["worker"]}}), "principal must"),
        (_doc(**{HASH: {"principal": "p", "roles": ["wrker"]}}), "unknown role 'wrker'"),
        (_doc(**{HASH: {"principal": "p", "roles": []}}), "at least one role"),
        (_doc(**{HASH: {"principal": "p", "roles": "worker"}}), "roles must be a list"),
        (_doc(**{HASH: {"principal": "p", "roles": ["pm"], "expiry": 1}}), "unknown key(s)"),
        (
            _doc(**{HASH: {"principal": "p", "roles": ["pm"], "expires_at": "2030-01-01T00:00"}}),
            "time zone",
        ),
        (
            _doc(**{HASH: {"principal": "p", "roles": ["pm"], "expires_at": "soon"}}),
            "RFC 3339",
        ),
        (
            f'{{"tokens": {{"{HASH}": {{"principal": "a", "roles": ["pm"]}}, '
            f'"{HASH}": {{"principal": "b", "roles": ["admin"]}}}}}}',
            "duplicate key",
        ),
    ],
)
def test_every_mistake_is_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_token_file(text)
    assert message in str(info.value)
    assert str(info.value).startswith("token_file")


def test_roles_parse_and_check() -> None:
    assert parse_roles("r", ["Worker", " admin ", ""]) == {Role.WORKER, Role.ADMIN}
    with pytest.raises(InvalidArgument, match="r: unknown role 'root'"):
        parse_roles("r", ["root"])
    identity = Identity("p", frozenset({Role.PM}))
    assert identity.may(frozenset({Role.PM, Role.ADMIN}))
    assert not identity.may(frozenset({Role.WORKER}))
    assert Identity("p", ALL_ROLES).may(frozenset({Role.ADMIN}))


class FakeMonotonic:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reload_happens_on_change_and_at_most_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(_doc(**{HASH: {"principal": "a", "roles": ["pm"]}}))
    clock = FakeMonotonic()
    tokens = TokenFile(path, reload_interval=5.0, monotonic=clock)
    auth = TokenAuth(tokens)
    assert auth.authenticate([("authorization", "Bearer s3cret")], {}).principal == "a"

    path.write_text(_doc(**{HASH: {"principal": "renamed", "roles": ["pm"]}}))
    clock.now += 4.9  # within the interval: the old table still answers
    assert auth.authenticate([("authorization", "Bearer s3cret")], {}).principal == "a"
    clock.now += 0.1
    assert auth.authenticate([("authorization", "Bearer s3cret")], {}).principal == "renamed"

    path.write_text(_doc())
    assert tokens.reload() is True  # an explicit reload does not wait for the interval
    with pytest.raises(Unauthenticated, match="unknown or revoked"):
        auth.authenticate([("authorization", "Bearer s3cret")], {})
    assert tokens.reload() is False  # unchanged file: nothing to do


def test_a_missing_or_broken_file_fails_at_start_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="token_file: cannot read"):
        TokenFile(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ConfigError, match=r"token_file .*not valid JSON"):
        TokenFile(broken)


def test_token_verbs_issue_revoke_and_grant_certificates(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "tokens.json"
    runner = CliRunner()
    issued = runner.invoke(
        main,
        ["token", "new", "--principal", "worker-1", "--role", "worker", "--file", str(path)],
    )
    assert issued.exit_code == 0, issued.output
    secret = issued.output.strip()
    assert len(secret) >= 40 and secret not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600

    tokens = TokenFile(path, reload_interval=0.0)
    auth = TokenAuth(tokens, client_certificates=True)
    who = auth.authenticate([("authorization", f"Bearer {secret}")], {})
    assert who == Identity("worker-1", frozenset({Role.WORKER}))

    expiring = runner.invoke(
        main,
        [
            *("token", "new", "--principal", "pm-1", "--role", "pm", "--role", "admin"),
            *("--file", str(path), "--expires-in", "7", "--note", "CI"),
        ],
    )
    assert expiring.exit_code == 0, expiring.output
    entry = tokens.table().tokens[token_hash(expiring.output.strip())]
    assert entry.roles == {Role.PM, Role.ADMIN} and entry.expires_at is not None

    cert = runner.invoke(
        main, ["token", "cert", "--principal", "w.pool", "--role", "worker", "--file", str(path)]
    )
    assert cert.exit_code == 0, cert.output
    assert tokens.table().certificates == {"w.pool": frozenset({Role.WORKER})}

    revoked = runner.invoke(
        main, ["token", "revoke", "--principal", "worker-1", "--file", str(path)]
    )
    assert revoked.exit_code == 0 and "revoked 1 token(s)" in revoked.output
    with pytest.raises(Unauthenticated):
        auth.authenticate([("authorization", f"Bearer {secret}")], {})
    again = runner.invoke(main, ["token", "revoke", "--principal", "worker-1", "--file", str(path)])
    assert again.exit_code == 1 and "no token or certificate entry" in again.output

    bad = runner.invoke(
        main, ["token", "new", "--principal", "has space", "--role", "pm", "--file", str(path)]
    )
    assert bad.exit_code == 2 and "--principal" in bad.output


def _table_doc(principal: str = "a") -> dict[str, Any]:
    return {"tokens": {HASH: {"principal": principal, "roles": ["pm"]}}, "certificates": {}}


def test_the_file_is_written_0600_through_a_fresh_exclusive_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tokens.json"
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    # Links planted at a predictable temp name (this process's pid), and at the very name the
    # writer picks (as if guessed): the exclusive create fails on a link and takes the next name
    # instead of writing through it.
    (tmp_path / f".tokens.json.{os.getpid()}.tmp").symlink_to(victim)
    (tmp_path / ".tokens.json.planted.tmp").symlink_to(victim)
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: names)

    write_token_file(path, _table_doc())

    assert victim.read_text() == "untouched"
    assert not path.is_symlink()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert TokenFile(path).table().tokens[HASH].principal == "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".tokens.json.{os.getpid()}.tmp",
        ".tokens.json.planted.tmp",
        "tokens.json",
        "victim",
    ]  # no temp file left behind


def test_a_link_at_the_file_name_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    path = tmp_path / "tokens.json"
    path.symlink_to(victim)
    write_token_file(path, _table_doc())
    assert victim.read_text() == "untouched"
    assert not path.is_symlink()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602, 0o660])
def test_a_group_or_world_writable_file_is_refused_naming_mode_and_fix(
    tmp_path: Path, mode: int
) -> None:
    path = tmp_path / "tokens.json"
    write_token_file(path, _table_doc())
    path.chmod(mode)
    with pytest.raises(ConfigError) as info:
        TokenFile(path)
    message = str(info.value)
    assert message.startswith(f"token_file {str(path)!r} has mode {mode:04o}")
    assert f"Fix: chmod 600 {path}" in message


@pytest.mark.parametrize("mode", [0o600, 0o644, 0o400, 0o444])
def test_readable_but_not_writable_by_others_loads(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "tokens.json"
    write_token_file(path, _table_doc())
    path.chmod(mode)
    assert TokenFile(path).table().tokens[HASH].principal == "a"


def _secret_volume(tmp_path: Path, mode: int) -> Path:
    """A Kubernetes Secret volume's layout: tokens.json -> ..data/tokens.json, ..data -> a
    timestamped directory holding the real file."""
    mount = tmp_path / "mount"
    real = mount / "..2026_01_01_00_00_00.1"
    real.mkdir(parents=True)
    write_token_file(real / "tokens.json", _table_doc())
    (real / "tokens.json").chmod(mode)
    (mount / "..data").symlink_to(real.name, target_is_directory=True)
    (mount / "tokens.json").symlink_to("..data/tokens.json")
    return mount / "tokens.json"


def test_a_secret_volume_file_loads_by_the_mode_of_its_target(tmp_path: Path) -> None:
    path = _secret_volume(tmp_path, 0o644)
    assert stat.S_IMODE(path.lstat().st_mode) == 0o777  # the link itself: never the point
    assert TokenFile(path).table().tokens[HASH].principal == "a"


def test_a_secret_volume_file_with_a_writable_target_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="has mode 0666"):
        TokenFile(_secret_volume(tmp_path, 0o666))


def test_a_file_made_writable_while_serving_keeps_the_previous_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    write_token_file(path, _table_doc("a"))
    tokens = TokenFile(path, reload_interval=0.0)
    auth = TokenAuth(tokens)
    bearer = [("authorization", "Bearer s3cret")]

    path.chmod(0o666)  # a chmod alone changes no mtime: the reload must still notice it
    with capture_logs() as logs:
        assert tokens.reload() is False
    assert auth.authenticate(bearer, {}).principal == "a"
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1
    assert "has mode 0666" in errors[0]["error"] and "chmod 600" in errors[0]["error"]

    write_token_file(path, _table_doc("b"))  # fixed (0600) and changed: it takes effect
    assert tokens.reload() is True
    assert auth.authenticate(bearer, {}).principal == "b"


def test_serve_refuses_a_writable_token_file_as_an_invalid_setting(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    write_token_file(path, _table_doc())
    path.chmod(0o666)
    result = CliRunner().invoke(main, ["serve", "--token-file", str(path)])
    assert result.exit_code == 2, result.output
    assert "has mode 0666" in result.output
    assert "chmod 600" in result.output
