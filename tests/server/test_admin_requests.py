"""AdminService's requests parsed in one place (coordinator/server/wire/admin_requests.py)."""

from __future__ import annotations

import pytest

from coordinator.errors import InvalidArgument
from coordinator.server.wire import admin_requests as requests
from coordinator.v1 import admin_pb2


def test_a_bump_from_a_negative_epoch_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"^expected_epoch"):
        requests.parse_bump_epoch(admin_pb2.BumpEpochRequest(expected_epoch=-1))


def test_an_unset_sdk_rule_is_left_unchanged_and_versions_are_trimmed() -> None:
    args = requests.parse_set_minimum_versions(
        admin_pb2.SetMinimumVersionsRequest(min_sdk_version=" 1.2.0 ")
    )
    assert args == requests.MinimumsArgs(
        min_coordinator_version="",
        min_sdk_version="1.2.0",
        require_sdk_version=None,
        allow_lower=False,
        schema_version=0,
    )
    forced = admin_pb2.SetMinimumVersionsRequest(require_sdk_version=False)
    assert requests.parse_set_minimum_versions(forced).require_sdk_version is False


def test_a_negative_schema_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"^schema_version must be >= 0, got -1"):
        requests.parse_set_minimum_versions(admin_pb2.SetMinimumVersionsRequest(schema_version=-1))


def test_approve_retry_needs_a_task() -> None:
    with pytest.raises(InvalidArgument, match=r"^task_id is required"):
        requests.parse_approve_retry(admin_pb2.ApproveRetryRequest())
