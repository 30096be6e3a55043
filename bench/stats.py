"""Small statistics helpers: percentiles and medians that tolerate empty samples."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float | None:
    """The median; None for no values."""
    return statistics.median(values) if values else None


def spread_ms(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50 / p95 / p99 of latencies given in seconds, in milliseconds (3 decimals)."""
    out: dict[str, float | None] = {}
    for q in (50, 95, 99):
        value = percentile(seconds, q)
        out[f"p{q}"] = round(value * 1000, 3) if value is not None else None
    return out


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def ms(seconds: float | None) -> float | None:
    """``seconds`` in milliseconds, to 0.01 (None stays None: nothing was measured)."""
    return None if seconds is None else round(seconds * 1000, 2)
