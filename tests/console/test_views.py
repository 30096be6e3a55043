"""The console's pure view helpers: spans for reading, and a live claim's spans as the claims
page counts them (from the coordinator's reading, never the browser's clock)."""

from __future__ import annotations

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.console.views import claim_row, duration
from coordinator.v1 import tasks_pb2


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.4, "0 s"),
        (59.9, "59 s"),
        (60, "1 min"),
        (125, "2 min 5 s"),
        (3600, "1 h"),
        (7500, "2 h 5 min"),
        (90000, "1 d 1 h"),
        (-1, "-"),
    ],
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def _at(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def test_a_claim_row_counts_from_the_coordinators_reading() -> None:
    claim = tasks_pb2.LiveClaim(
        claimed_at=_at(1000.0),
        lease_granted_seconds=30,
        lease_remaining_seconds=22,
        renewed=True,
        progress="step-3",
        progress_at=_at(1010.5),
    )
    row = claim_row(claim, _at(1040.0))
    assert (row.held, row.expires_in, row.renewed_ago, row.progress_ago) == (40, 22, 8, 29)


def test_a_claim_never_renewed_has_no_renewal_age() -> None:
    claim = tasks_pb2.LiveClaim(
        claimed_at=_at(1000.0),
        lease_granted_seconds=30,
        lease_remaining_seconds=25,
        progress_at=_at(1000.0),
    )
    row = claim_row(claim, _at(1005.0))
    assert (row.held, row.expires_in, row.renewed_ago, row.progress_ago) == (5, 25, None, 5)
