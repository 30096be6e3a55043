"""Times as people write them on the command line and in the console (pure, no I/O): an ISO
8601 time (UTC when it names no zone) or a span from now ("90s", "30m", "2h", "1d")."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from coordinator.errors import InvalidArgument

_SPAN = re.compile(r"^(\d{1,9}(?:\.\d{1,6})?)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _parse(text: str, now: datetime, *, name: str, sign: int, example: str) -> datetime:
    """``text`` as an ISO 8601 time or a span ``sign``-wards from ``now``; InvalidArgument
    naming ``name`` and both forms otherwise."""
    found = _SPAN.match(text.strip())
    if found:
        return now + sign * timedelta(seconds=float(found[1]) * _UNIT[found[2]])
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgument(
            f"{name} {text[:40]!r} is neither an ISO 8601 time (2026-12-02T05:00:00Z) nor a "
            f"span {example}"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def parse_since(text: str, now: datetime) -> datetime:
    """A "failed since": an ISO 8601 time or a span back from ``now`` ("30m": half an hour
    ago). The CLI's ``--since`` and the console's dead-letter form both read it."""
    return _parse(text, now, name="since", sign=-1, example="back from now (30m, 2h, 1d)")


def parse_not_before(text: str, now: datetime) -> datetime:
    """When a new task may run at the earliest: an ISO 8601 time or a span ahead of ``now``
    ("30m": in half an hour)."""
    return _parse(text, now, name="not before", sign=1, example="ahead from now (90s, 30m, 2h)")
