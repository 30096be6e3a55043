"""Prometheus metrics of a coordinator replica, on one module-level registry.

``REGISTRY`` holds every metric the coordinator exports; serve it with
``prometheus_client.generate_latest(REGISTRY)`` or ``start_http_server(port, registry=REGISTRY)``
(nothing here starts a server). Counts are per replica process, since it started.

Fence-check coverage (DESIGN.md, Observability): for every acceptance point, the operations it
accepted and, of those, the ones whose accepting etcd txn compared both the scheduler epoch and
the claim generation. The second number is derived from the compares actually sent to etcd
(``coordinator.store.coverage``), not counted beside the first, so a point that skips its fence
shows up as coverage below 1.0. A fenced count of zero is not health if the checks never ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from prometheus_client import CollectorRegistry, Counter


class AcceptancePoint(IntEnum):
    """Where a credential is checked; the values equal the wire's AcceptancePoint."""

    CLAIM = 1
    RENEW = 2
    AUTHORIZE = 3
    PREPARE = 4
    RECORD = 5
    COMMIT = 6
    RELEASE = 7

    @property
    def label(self) -> str:
        """The metric label value (lower case)."""
        return self.name.lower()


REGISTRY = CollectorRegistry(auto_describe=True)
"""Every coordinator metric lives here (not in prometheus_client's global registry)."""

FENCE_ACCEPTED = Counter(
    "coordinator_fence_accepted",
    "Operations an acceptance point accepted (answered from a txn whose compares held).",
    ["point"],
    registry=REGISTRY,
)
FENCE_VALIDATED = Counter(
    "coordinator_fence_validated",
    "Accepted operations whose txn compared both the scheduler epoch and the claim generation.",
    ["point"],
    registry=REGISTRY,
)


@dataclass(frozen=True)
class PointCoverage:
    """Accepted and validated counts of one acceptance point in this process."""

    point: AcceptancePoint
    accepted: int
    validated: int

    @property
    def coverage(self) -> float:
        """validated / accepted; 1.0 while nothing was accepted."""
        return self.validated / self.accepted if self.accepted else 1.0


def count_acceptance(point: AcceptancePoint, *, validated: bool) -> None:
    """Count one accepted operation at ``point`` (and whether its fence was validated)."""
    FENCE_ACCEPTED.labels(point=point.label).inc()
    if validated:
        FENCE_VALIDATED.labels(point=point.label).inc()


def fence_coverage() -> list[PointCoverage]:
    """Coverage of every acceptance point, in point order."""
    return [
        PointCoverage(
            point,
            _sample("coordinator_fence_accepted_total", point),
            _sample("coordinator_fence_validated_total", point),
        )
        for point in AcceptancePoint
    ]


def _sample(name: str, point: AcceptancePoint) -> int:
    return int(REGISTRY.get_sample_value(name, {"point": point.label}) or 0)
