"""coordinator.domain.when: "since" and "not before" as people write them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from coordinator.domain.when import parse_not_before, parse_since
from coordinator.errors import InvalidArgument

NOW = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)
ISO_TIMES = [
    ("2026-12-01T22:00:00Z", datetime(2026, 12, 1, 22, tzinfo=UTC)),
    ("2026-12-01T22:00:00", datetime(2026, 12, 1, 22, tzinfo=UTC)),  # no zone: UTC
    ("2026-12-01T23:00:00+01:00", datetime(2026, 12, 1, 22, tzinfo=UTC)),
]


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("30m", NOW - timedelta(minutes=30)),
        ("2h", NOW - timedelta(hours=2)),
        ("1.5d", NOW - timedelta(hours=36)),
        ("45s", NOW - timedelta(seconds=45)),
        *ISO_TIMES,
    ],
)
def test_since_takes_a_span_back_or_an_iso_time(text: str, at: datetime) -> None:
    assert parse_since(text, NOW) == at


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("90s", NOW + timedelta(seconds=90)),
        ("30m", NOW + timedelta(minutes=30)),
        (" 2h ", NOW + timedelta(hours=2)),
        *ISO_TIMES,
    ],
)
def test_not_before_takes_a_span_ahead_or_an_iso_time(text: str, at: datetime) -> None:
    assert parse_not_before(text, NOW) == at


@pytest.mark.parametrize("text", ["yesterday", "2h ago", "-5m", "5w", "", "1" * 20 + "h"])
def test_anything_else_is_refused_naming_both_forms(text: str) -> None:
    with pytest.raises(
        InvalidArgument, match=r"since .* neither an ISO 8601 time .* nor a span back"
    ):
        parse_since(text, NOW)
    with pytest.raises(InvalidArgument, match=r"not before .* nor a span ahead from now \(90s"):
        parse_not_before(text, NOW)
