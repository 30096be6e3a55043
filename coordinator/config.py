"""Every setting of a coordinator replica, with defaults, validated in one place.

The CLI (``coordinator serve``, ``coordinator up``) fills a ``Config`` from flags and
``COORDINATOR_*`` environment variables; an invalid value raises ConfigError naming the setting,
before anything connects or listens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from coordinator.domain.decisions import ClaimLimits
from coordinator.errors import ConfigError
from coordinator.logging import LEVELS

DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_ETCD = ("127.0.0.1:2379",)
DEFAULT_PREFIX = "/coordinator"

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]*):(?P<port>[0-9]{1,5})$")
_PREFIX = re.compile(r"^(/[A-Za-z0-9._-]+)+$")


@dataclass(frozen=True)
class Config:
    """Settings of one replica. Durations are seconds; every field has a working default."""

    etcd: tuple[str, ...] = DEFAULT_ETCD
    """etcd client endpoints, ``host:port`` each; the client fails over between them."""
    listen: str = DEFAULT_LISTEN
    """gRPC listen address; port 0 picks a free port."""
    prefix: str = DEFAULT_PREFIX
    """The etcd key prefix of this coordinator's keyspace."""
    min_ttl: int = ClaimLimits.min_ttl
    """Smallest lease TTL a claim is granted (requests below are raised to it)."""
    max_ttl: int = ClaimLimits.max_ttl
    """Largest lease TTL a claim is granted (requests above are lowered to it)."""
    max_claim_duration: float = ClaimLimits.max_claim_duration
    """A claim cannot be renewed past claim start + this."""
    stall_timeout: float = ClaimLimits.stall_timeout
    """Renewal is refused when the progress marker has not moved for this long (0: never)."""
    log_level: str = "info"
    """One of debug, info, warning, error, critical."""
    max_workers: int = 32
    """gRPC handler threads (concurrent calls served)."""
    shutdown_grace: float = 10.0
    """On SIGTERM, in-flight calls get this long to finish before they are cancelled."""
    etcd_timeout: float = 5.0
    """Timeout of each etcd request; a slower etcd makes calls fail with UNAVAILABLE."""
    health_interval: float = 3.0
    """How often the health status is re-checked against etcd."""

    def __post_init__(self) -> None:
        if not self.etcd:
            raise ConfigError("etcd: at least one endpoint is required")
        for endpoint in self.etcd:
            check_address("etcd", endpoint)
        check_address("listen", self.listen, allow_port_zero=True)
        if not _PREFIX.match(self.prefix):
            raise ConfigError(
                "prefix must start with '/', have no trailing '/' and use only "
                f"[A-Za-z0-9._-] between slashes, got {self.prefix!r}"
            )
        if self.min_ttl < 1:
            raise ConfigError(f"min_ttl must be >= 1 second, got {self.min_ttl}")
        if self.max_ttl < self.min_ttl:
            raise ConfigError(f"max_ttl ({self.max_ttl}) must be >= min_ttl ({self.min_ttl})")
        # Otherwise one grant could keep a lease alive past the claim's deadline.
        if self.max_claim_duration < self.max_ttl:
            raise ConfigError(
                f"max_claim_duration ({self.max_claim_duration}) must be >= max_ttl "
                f"({self.max_ttl})"
            )
        if self.stall_timeout < 0:
            raise ConfigError(f"stall_timeout must be >= 0 (0 disables), got {self.stall_timeout}")
        if self.log_level not in LEVELS:
            raise ConfigError(
                f"log_level must be one of {', '.join(LEVELS)}, got {self.log_level!r}"
            )
        _positive("max_workers", self.max_workers)
        _positive("etcd_timeout", self.etcd_timeout)
        _positive("health_interval", self.health_interval)
        if self.shutdown_grace < 0:
            raise ConfigError(f"shutdown_grace must be >= 0, got {self.shutdown_grace}")

    @property
    def limits(self) -> ClaimLimits:
        """The claim bounds the store enforces."""
        return ClaimLimits(
            min_ttl=self.min_ttl,
            max_ttl=self.max_ttl,
            max_claim_duration=self.max_claim_duration,
            stall_timeout=self.stall_timeout,
        )


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


def _positive(setting: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{setting} must be > 0, got {value}")
