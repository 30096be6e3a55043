"""The two reconcile settings: validated naming the setting, plumbed config -> serve -> store."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from click.testing import CliRunner, Result

from coordinator.cli import main
from coordinator.config import Config
from coordinator.config_file import SETTINGS
from coordinator.domain.decisions import ClaimLimits
from coordinator.errors import ConfigError

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
    base = {f"COORDINATOR_{name.upper()}": "" for name in SETTINGS}
    base["COORDINATOR_CONFIG"] = ""
    return CliRunner().invoke(main, ["serve", "--insecure", *args], env={**base, **(env or {})})


def test_defaults_are_ten_minutes_and_one_takeover() -> None:
    assert (ClaimLimits().reconcile_timeout, ClaimLimits().reconcile_handoffs) == (600.0, 1)
    limits = Config().limits
    assert (limits.reconcile_timeout, limits.reconcile_handoffs) == (600.0, 1)


def test_flags_and_env_reach_the_store_limits(captured: list[Config]) -> None:
    assert _serve(["--reconcile-timeout", "90", "--reconcile-handoffs", "0"]).exit_code == 0
    assert _serve([], env={"COORDINATOR_RECONCILE_TIMEOUT": "45"}).exit_code == 0
    first, second = captured
    assert (first.limits.reconcile_timeout, first.limits.reconcile_handoffs) == (90.0, 0)
    assert (second.limits.reconcile_timeout, second.limits.reconcile_handoffs) == (45.0, 1)


@pytest.mark.parametrize(
    ("args", "setting"),
    [
        (["--reconcile-timeout", "0"], "reconcile-timeout"),
        (["--reconcile-timeout", "-5"], "reconcile-timeout"),
        (["--reconcile-handoffs", "-1"], "reconcile-handoffs"),
    ],
)
def test_invalid_values_exit_2_naming_the_setting(
    args: list[str], setting: str, captured: list[Config]
) -> None:
    result = _serve(args)
    assert result.exit_code == 2, result.output
    assert setting in result.output or setting.replace("-", "_") in result.output
    assert captured == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"reconcile_timeout": 0.0}, "reconcile_timeout"),
        ({"reconcile_handoffs": -1}, "reconcile_handoffs must be >= 0"),
    ],
)
def test_config_refuses_them_directly(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config(**changes)
