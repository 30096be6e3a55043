"""The server's retry defaults: settings, per-queue policies, and the errors that name them."""

from __future__ import annotations

import pytest

from coordinator.config import Config
from coordinator.errors import ConfigError


def test_queue_policies_override_the_server_defaults_field_by_field() -> None:
    config = Config(
        retry_max_attempts=7,
        retry_initial_backoff=1.0,
        retry_non_retryable_errors="BadInput, Fatal",
        queue_retry_policies="emails:max_attempts=3,non_retryable_errors=Bounce|Spam; reports:",
    )
    defaults = config.limits.retry
    assert (defaults.server.max_attempts, defaults.server.non_retryable_errors) == (
        7,
        ("BadInput", "Fatal"),
    )
    emails = defaults.for_queue("emails")
    assert (emails.max_attempts, emails.initial_backoff, emails.non_retryable_errors) == (
        3,
        1.0,
        ("Bounce", "Spam"),
    )
    assert defaults.for_queue("reports") == defaults.server
    assert defaults.for_queue("other") == defaults.server


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"retry_max_attempts": -1}, "retry_max_attempts must be 0 (unlimited) to 10000"),
        ({"retry_initial_backoff": 400.0}, "retry_initial_backoff (400 s) must not exceed"),
        ({"retry_backoff_multiplier": 0.5}, "retry_backoff_multiplier must be 1 to 100"),
        ({"queue_retry_policies": "emails:tries=3"}, "queue 'emails': unknown field 'tries'"),
        ({"queue_retry_policies": "emails:max_attempts=x"}, "queue 'emails': invalid literal"),
        ({"queue_retry_policies": "bad queue:max_attempts=1"}, "queue must be 1-64 characters"),
        ({"promote_interval": 0.0}, "promote_interval must be > 0"),
    ],
)
def test_a_bad_retry_setting_stops_the_server_naming_it(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        Config(**settings)  # type: ignore[arg-type]
    assert message in str(raised.value)
