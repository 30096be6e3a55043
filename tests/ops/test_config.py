"""Configuration: every setting from a flag, an environment variable or a TOML file, with
precedence flag > env > file > default; every invalid setting stops ``serve`` with exit code 2
and a message naming it, before anything connects."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from coordinator.cli import main
from coordinator.config import Config
from coordinator.config_file import SETTINGS

# The package re-exports the `serve` command under the module's name; take the module itself.
serve_module = importlib.import_module("coordinator.cli.serve")


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    """The Config ``serve`` would run with (nothing is served)."""
    seen: list[Config] = []

    def fake_run(config: Config, **kwargs: Any) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr(serve_module, "run", fake_run)
    return seen


def _serve(args: list[str], env: dict[str, str] | None = None) -> Result:
    # An empty env var is "unset" for click; clear any COORDINATOR_* from the outer shell.
    base = {f"COORDINATOR_{name.upper()}": "" for name in SETTINGS}
    base["COORDINATOR_CONFIG"] = ""
    return CliRunner().invoke(main, ["serve", *args], env={**base, **(env or {})})


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "coordinator.toml"
    path.write_text(text)
    return str(path)


# name, flag value, env value, file value (TOML), expected python values (flag, env, file)
PRECEDENCE = [
    ("max_ttl", "300", "200", "100", (300, 200, 100)),
    (
        "etcd",
        "f:1",
        "e:1,e:2",
        '["c:1", "c:2", "c:3"]',
        (("f:1",), ("e:1", "e:2"), ("c:1", "c:2", "c:3")),
    ),
    ("log_level", "error", "warning", '"debug"', ("error", "warning", "debug")),
    ("token_reload_interval", "3", "2", "1.5", (3.0, 2.0, 1.5)),
    ("max_streams_per_principal", "3", "2", "1", (3, 2, 1)),
    ("max_stream_age", "90", "60", "30.5", (90.0, 60.0, 30.5)),
    ("etcd_user", "flag-user", "env-user", '"file-user"', ("flag-user", "env-user", "file-user")),
    (
        "metrics_listen",
        "0.0.0.0:9100",
        "127.0.0.1:9200",
        '"127.0.0.1:9300"',
        ("0.0.0.0:9100", "127.0.0.1:9200", "127.0.0.1:9300"),
    ),
]


@pytest.mark.parametrize(("name", "flag", "env", "file", "expected"), PRECEDENCE)
def test_flag_beats_env_beats_file_beats_default(
    tmp_path: Path,
    captured: list[Config],
    name: str,
    flag: str,
    env: str,
    file: str,
    expected: tuple[Any, Any, Any],
) -> None:
    extra = {"etcd_password": "pw"} if name == "etcd_user" else {}
    lines = [f"{name} = {file}", "insecure = true", *(f'{k} = "{v}"' for k, v in extra.items())]
    config_file = _file(tmp_path, "\n".join(lines))
    env_vars = {f"COORDINATOR_{name.upper()}": env}
    option = f"--{name.replace('_', '-')}"
    runs = [
        _serve(["--config", config_file, option, flag], env_vars),
        _serve(["--config", config_file], env_vars),
        _serve(["--config", config_file]),
        _serve(["--insecure"]),
    ]
    for run in runs:
        assert run.exit_code == 0, run.output
    values = [getattr(c, name) for c in captured]
    assert values == [*expected, getattr(Config(), name)]


def test_the_config_file_may_come_from_the_environment(
    tmp_path: Path, captured: list[Config]
) -> None:
    config_file = _file(tmp_path, 'insecure = true\nprefix = "/from-file"\nmax_workers = 7\n')
    result = _serve([], {"COORDINATOR_CONFIG": config_file})
    assert result.exit_code == 0, result.output
    assert (captured[0].prefix, captured[0].max_workers, captured[0].insecure) == (
        "/from-file",
        7,
        True,
    )


def test_a_bad_value_in_the_config_file_is_blamed_on_the_file_and_its_key(
    tmp_path: Path, captured: list[Config]
) -> None:
    config_file = _file(tmp_path, 'insecure = true\nmax_ttl = "abc"\n')
    result = _serve(["--config", config_file])
    assert result.exit_code == 2
    assert f"max_ttl = 'abc' in {config_file}: 'abc' is not a valid integer" in result.output
    assert "COORDINATOR_MAX_TTL" not in result.output and "--max-ttl" not in result.output
    assert captured == []


def test_help_documents_every_setting_with_its_env_var_and_config_key() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"], terminal_width=400)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for name in SETTINGS:
        assert f"--{name.replace('_', '-')}" in text, name
        assert f"COORDINATOR_{name.upper()}" in text, name
        assert f"Config key: {name}." in text, name


@pytest.mark.parametrize(
    ("args", "setting"),
    [
        (["--listen", "nohost"], "listen"),
        (["--metrics-listen", "127.0.0.1:70000"], "metrics_listen"),
        (["--etcd", "a:1,b"], "etcd"),
        (["--prefix", "x/"], "prefix"),
        (["--min-ttl", "0"], "min-ttl"),
        (["--min-ttl", "9", "--max-ttl", "5"], "max_ttl"),
        (["--max-claim-duration", "1"], "max_claim_duration"),
        (["--stall-timeout", "-1"], "stall-timeout"),
        (["--log-level", "loud"], "log-level"),
        (["--max-workers", "0"], "max-workers"),
        (["--max-streams", "0"], "max-streams"),
        (["--max-streams-per-principal", "0"], "max-streams-per-principal"),
        (["--max-stream-age", "0"], "max-stream-age"),
        (["--shutdown-grace", "-1"], "shutdown-grace"),
        (["--etcd-timeout", "0"], "etcd-timeout"),
        (["--health-interval", "0"], "health-interval"),
        (["--reclaim-scan-interval", "0"], "reclaim-scan-interval"),
        (["--token-reload-interval", "0"], "token-reload-interval"),
        (["--tls-cert", "c.pem"], "tls_key"),
        (["--tls-client-ca", "ca.pem"], "tls_client_ca"),
        (["--etcd-cert", "c.pem"], "etcd_key"),
        (["--etcd-cert", "c.pem", "--etcd-key", "k.pem"], "etcd_ca_cert"),
        (["--etcd-user", "root"], "etcd_password"),
        (["--metrics-tls"], "metrics_tls needs tls_cert"),
        (["--metrics-read-timeout", "0"], "metrics-read-timeout"),
        (["--metrics-max-connections", "0"], "metrics-max-connections"),
    ],
)
def test_each_invalid_setting_fails_with_exit_2_naming_it(
    args: list[str], setting: str, captured: list[Config]
) -> None:
    result = _serve(["--insecure", *args])
    assert result.exit_code == 2, result.output
    assert setting in result.output or setting.replace("-", "_") in result.output
    assert captured == []


@pytest.mark.parametrize(
    ("args", "setting"),
    [
        ([], "token_file: authentication is required"),
        (["--listen", "0.0.0.0:50051", "--insecure"], "insecure: refusing"),
        (["--listen", "10.1.2.3:50051", "--insecure"], "insecure: refusing"),
        (["--insecure", "--token-file", "t.json"], "insecure cannot be combined"),
        (["--insecure-allow-remote"], "insecure_allow_remote only applies together with"),
        (["--token-file", "/nonexistent/tokens.json"], "token_file: cannot read"),
    ],
)
def test_authentication_is_required_unless_explicitly_insecure_on_loopback(
    args: list[str], setting: str, captured: list[Config]
) -> None:
    result = _serve(args)
    assert result.exit_code == 2, result.output
    assert setting in " ".join(result.output.split())
    assert captured == []


def test_insecure_on_any_address_needs_the_explicit_override(captured: list[Config]) -> None:
    result = _serve(["--listen", "0.0.0.0:50051", "--insecure", "--insecure-allow-remote"])
    assert result.exit_code == 0, result.output
    assert captured[0].listen == "0.0.0.0:50051"
    assert _serve(["--listen", "[::1]:50051", "--insecure"]).exit_code == 0
    assert _serve(["--listen", "localhost:50051", "--insecure"]).exit_code == 0


def test_an_invalid_token_file_or_tls_file_fails_at_start(
    tmp_path: Path, captured: list[Config]
) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text('{"tokens": {"x": {}}}')
    result = _serve(["--token-file", str(tokens)])
    assert result.exit_code == 2 and "64-character" in result.output, result.output
    tokens.write_text("{}")
    cert = tmp_path / "cert.pem"
    cert.write_text("not pem")
    result = _serve(["--token-file", str(tokens), "--tls-cert", str(cert), "--tls-key", str(cert)])
    assert result.exit_code == 2 and "tls_key" in result.output, result.output
    result = _serve(["--token-file", str(tokens)])
    assert result.exit_code == 0 and captured[0].token_file == str(tokens)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_tll = 5", "unknown setting 'max_tll'"),
        ("max_ttl = ", "not valid TOML"),
        ('max_ttl = "lots"', "max_ttl = 'lots' in "),
        ("[etcd]\nendpoints = []", "etcd must be a value"),
    ],
)
def test_a_bad_config_file_fails_naming_the_problem(
    tmp_path: Path, text: str, message: str, captured: list[Config]
) -> None:
    result = _serve(["--config", _file(tmp_path, text), "--insecure"])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert captured == []


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    result = _serve(["--config", str(tmp_path / "nope.toml"), "--insecure"])
    assert result.exit_code == 2 and "config: cannot read" in result.output


def test_up_is_insecure_and_therefore_loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_etcd(**kwargs: Any) -> None:
        raise AssertionError("up must refuse before starting etcd")

    monkeypatch.setattr(importlib.import_module("coordinator.cli.up"), "EtcdProcess", no_etcd)
    result = CliRunner().invoke(main, ["up", "--listen", "0.0.0.0:0"])
    assert result.exit_code == 2, result.output
    assert "'0.0.0.0:0' is not a loopback address" in result.output


def test_etcd_credentials_may_come_from_files_a_mounted_secret_holds(
    tmp_path: Path, captured: list[Config]
) -> None:
    (tmp_path / "user").write_text("coordinator\n")
    (tmp_path / "password").write_text("s3cret\n")
    files = {
        "COORDINATOR_ETCD_USER_FILE": str(tmp_path / "user"),
        "COORDINATOR_ETCD_PASSWORD_FILE": str(tmp_path / "password"),
    }
    config_file = _file(tmp_path, 'insecure = true\netcd_password = "from-config"')
    runs = [
        _serve(["--config", config_file], files),
        _serve(["--config", config_file], {**files, "COORDINATOR_ETCD_PASSWORD": "from-env"}),
        _serve(["--config", config_file, "--etcd-password", "from-flag"], files),
    ]
    for run in runs:
        assert run.exit_code == 0, run.output
    assert [(c.etcd_user, c.etcd_password) for c in captured] == [
        ("coordinator", "s3cret"),  # the file's variable beats the config file, stripped
        ("coordinator", "from-env"),
        ("coordinator", "from-flag"),
    ]


def test_an_unreadable_secret_file_is_refused_naming_its_variable(
    tmp_path: Path, captured: list[Config]
) -> None:
    missing = str(tmp_path / "nope")
    run = _serve(["--insecure"], {"COORDINATOR_ETCD_PASSWORD_FILE": missing})
    assert run.exit_code == 2
    assert "COORDINATOR_ETCD_PASSWORD_FILE" in run.output and missing in run.output
    assert captured == []
