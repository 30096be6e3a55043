"""The value rules of a replica's settings (coordinator.config): endpoint lists and addresses,
per-queue retry policies, and the checks several settings share. Each raises ConfigError naming
the setting, so a bad value stops ``coordinator serve`` before anything connects.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from coordinator.domain import validation
from coordinator.domain.retention import (
    RetentionPolicy,
    parse_per_queue,
    parse_setting_duration,
)
from coordinator.domain.retry import RetryDefaults, RetryPolicy, check_policy
from coordinator.errors import ConfigError, InvalidArgument

if TYPE_CHECKING:  # config.py imports this module
    from coordinator.config import Config

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]*):(?P<port>[0-9]{1,5})$")


def parse_endpoints(text: str) -> tuple[str, ...]:
    """``"h1:p1,h2:p2"`` -> ``("h1:p1", "h2:p2")``; blanks around commas are ignored."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def check_address(setting: str, value: str, *, allow_port_zero: bool = False) -> str:
    """A ``host:port`` address (``[v6]:port`` too); ConfigError naming ``setting`` if not."""
    match = _HOST_PORT.match(value)
    if match is None:
        raise ConfigError(f"{setting} must be host:port, got {value!r}")
    port = int(match["port"])
    lowest = 0 if allow_port_zero else 1
    if not lowest <= port <= 65535:
        raise ConfigError(f"{setting} port must be {lowest}-65535, got {value!r}")
    return value


def error_codes(text: str) -> tuple[str, ...]:
    """Comma-separated error codes (blanks ignored)."""
    return tuple(code.strip() for code in text.split(",") if code.strip())


def build_retry_defaults(server: RetryPolicy, per_queue: str) -> RetryDefaults:
    """The server's retry policy, checked (ConfigError naming its ``retry_*`` setting), and
    each queue's from ``queue_retry_policies`` (unset fields take the server's)."""
    try:
        check_policy(server, "retry_")
    except InvalidArgument as exc:
        raise ConfigError(str(exc)) from None
    return RetryDefaults(server, MappingProxyType(_queue_policies(per_queue, server)))


_POLICY_FIELDS: dict[str, Callable[[str], Any]] = {
    "max_attempts": int,
    "initial_backoff": float,
    "backoff_multiplier": float,
    "max_backoff": float,
    "backoff_jitter": float,
    "non_retryable_errors": lambda text: tuple(c for c in text.split("|") if c),
}


def _queue_policies(text: str, server: RetryPolicy) -> dict[str, RetryPolicy]:
    """Parse queue_retry_policies ('QUEUE:field=value,...;...'); ConfigError naming it."""
    policies: dict[str, RetryPolicy] = {}
    for entry in filter(None, (part.strip() for part in text.split(";"))):
        queue, _, assignments = entry.partition(":")
        queue = queue.strip()
        try:
            validation.queue(queue)
            changes = {}
            for assignment in filter(None, (a.strip() for a in assignments.split(","))):
                name, _, value = assignment.partition("=")
                convert = _POLICY_FIELDS.get(name.strip())
                if convert is None:
                    raise InvalidArgument(
                        f"unknown field {name.strip()!r} (one of {', '.join(_POLICY_FIELDS)})"
                    )
                changes[name.strip()] = convert(value.strip())
            policy = replace(server, **changes)
            check_policy(policy)
        except (InvalidArgument, ValueError) as exc:
            raise ConfigError(f"queue_retry_policies: queue {queue!r}: {exc}") from None
        policies[queue] = policy
    return policies


def parse_retention(
    retention: object,
    per_queue: object,
    tombstone_retention: object,
    ended_attempt_retention: object,
    *,
    idempotency_ttl: float,
) -> RetentionPolicy:
    """The retention settings (seconds or 90s / 15m / 1h / 7d / 2w; a table or ``q=1h,r=0``
    per queue) as one policy; ConfigError naming the first bad setting."""
    default = parse_setting_duration("retention", retention)
    queues = MappingProxyType(parse_per_queue("retention_per_queue", per_queue))
    tombstone = parse_setting_duration("tombstone_retention", tombstone_retention)
    if tombstone <= 0:
        raise ConfigError(
            "tombstone_retention must be > 0: a tombstone is what refuses a pruned task's id"
        )
    ended_attempt = parse_setting_duration("ended_attempt_retention", ended_attempt_retention)
    # Refused, not warned: a tombstone shorter than the idempotency window frees a pruned
    # id while a client may still retry its create within the window the server promises,
    # and that late retry silently makes a second task. One setting fixes it at start.
    if tombstone < idempotency_ttl:
        raise ConfigError(
            f"tombstone_retention ({tombstone:g}s) must be >= idempotency_ttl "
            f"({idempotency_ttl:g}s): a pruned task's id must stay refused as long as "
            "a retry of its create may still come"
        )
    return RetentionPolicy(default, queues, tombstone, ended_attempt)


def require_together(a: str, a_value: object, b: str, b_value: object) -> None:
    """ConfigError unless settings ``a`` and ``b`` are both given or both left out."""
    if bool(a_value) != bool(b_value):
        missing, given = (b, a) if a_value else (a, b)
        raise ConfigError(f"{missing} is required together with {given}")


def require_positive(setting: str, value: float) -> None:
    """ConfigError naming ``setting`` unless ``value`` is > 0."""
    if value <= 0:
        raise ConfigError(f"{setting} must be > 0, got {value}")


def check_space(config: Config) -> None:
    """ConfigError naming the first bad space-guard setting of ``config``."""
    for name in ("etcd_quota_warn_ratio", "etcd_quota_high_water", "etcd_quota_full"):
        ratio = getattr(config, name)
        if not 0 < ratio <= 1:
            raise ConfigError(f"{name} must be in (0, 1], got {ratio}")
    if config.etcd_quota_full < config.etcd_quota_high_water:
        raise ConfigError(
            f"etcd_quota_full ({config.etcd_quota_full}) must be at least "
            f"etcd_quota_high_water ({config.etcd_quota_high_water})"
        )
    share = config.write_budget_high_water_share
    if not 0 <= share <= 1:
        raise ConfigError(f"write_budget_high_water_share must be in [0, 1], got {share}")
    if config.etcd_compact_keep < 0:
        raise ConfigError(f"etcd_compact_keep must be >= 0, got {config.etcd_compact_keep}")
    require_positive("etcd_space_interval", config.etcd_space_interval)
