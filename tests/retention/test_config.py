"""Retention settings: flag, environment and TOML forms; every bad value stops ``serve`` with
exit code 2 naming the setting, before anything connects; and the etcd db-size warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from coordinator.config import Config
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.store import EtcdKV
from coordinator.store.etcd.db_size import DbSizeWatch
from tests.ops.test_config import _file, _serve, captured

__all__ = ["captured"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--retention", "soon"], "retention must be a duration"),
        (["--retention", "-1h"], "retention must be a duration"),
        (["--retention-per-queue", "q"], "retention_per_queue must be QUEUE=DURATION"),
        (["--retention-per-queue", "q=forever"], "retention_per_queue.q must be a duration"),
        (["--retention-per-queue", "a/b=1h"], "retention_per_queue: 'a/b' is not a queue"),
        (["--tombstone-retention", "0"], "tombstone_retention must be > 0"),
        (["--ended-attempt-retention", "soon"], "ended_attempt_retention must be a duration"),
        (["--prune-rate", "0"], "--prune-rate"),
        (["--etcd-quota-warn-ratio", "1.5"], "--etcd-quota-warn-ratio"),
    ],
)
def test_a_bad_retention_setting_exits_2_naming_it(args: list[str], named: str) -> None:
    result = _serve(["--insecure", *args])
    assert result.exit_code == 2, result.output
    assert named in result.output


def test_a_tombstone_shorter_than_the_idempotency_window_exits_2_naming_both(
    captured: list[Config],
) -> None:
    result = _serve(["--insecure", "--tombstone-retention", "1h"])  # idempotency: a day
    assert result.exit_code == 2, result.output
    assert "tombstone_retention (3600s) must be >= idempotency_ttl (86400s)" in result.output
    assert captured == []
    equal = ["--insecure", "--tombstone-retention", "1h", "--idempotency-ttl", "3600"]
    assert _serve(equal).exit_code == 0
    assert _serve(["--insecure", "--tombstone-retention", "2d"]).exit_code == 0
    assert [c.tombstone_retention for c in captured] == [3600.0, 2 * 86400.0]


def test_an_archive_that_cannot_be_written_exits_2_naming_it(
    tmp_path: Path,
    captured: list[Config],
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for archive, why in (
        (str(blocker), "is not a directory"),
        (f"{blocker}/sub", "is not a directory"),
        ("ftp://host/x", "unsupported archive"),
        ("s3://", "names no bucket"),
    ):
        result = _serve(["--insecure", "--archive", archive])
        assert result.exit_code == 2, result.output
        assert "archive" in result.output and why in result.output, result.output
    assert captured == []


def test_retention_per_queue_is_a_toml_table_or_a_flag(
    tmp_path: Path,
    captured: list[Config],
) -> None:
    config_file = _file(
        tmp_path,
        'insecure = true\nretention = "2d"\n'
        f'archive = "{tmp_path}/a"\n[retention_per_queue]\nfast = "1h"\nkeep = 0\n',
    )
    assert _serve(["--config", config_file]).exit_code == 0
    assert _serve(["--config", config_file, "--retention-per-queue", "x=90s"]).exit_code == 0
    from_file, from_flag = captured
    assert from_file.retention_policy.for_queue("fast") == 3600.0
    assert from_file.retention_policy.for_queue("keep") == 0.0
    assert from_file.retention_policy.for_queue("other") == 2 * 86400.0
    assert from_flag.retention_per_queue == {"x": 90.0}
    assert not (tmp_path / "a").exists()  # checked, never created by a refused or faked start


def test_the_defaults_keep_a_week_and_tombstones_a_day() -> None:
    policy = Config().retention_policy
    assert (policy.default, policy.tombstone, dict(policy.per_queue)) == (7 * 86400.0, 86400.0, {})


def test_the_db_size_watch_publishes_the_ratio_and_warns_past_it(
    etcd: EtcdProcess, metrics: Metrics
) -> None:
    registry = metrics.registry
    kv = EtcdKV.connect([etcd.endpoint])
    try:
        size = kv.db_size()
        assert size > 0
        quiet = DbSizeWatch(kv, quota_bytes=size * 10, warn_ratio=0.8, metrics=metrics)
        loud = DbSizeWatch(kv, quota_bytes=size, warn_ratio=0.5, metrics=metrics)
        with capture_logs() as logs:
            low = quiet.check()
            high = loud.check()
            loud.check()  # still above: not repeated before _REPEAT
    finally:
        kv.close()
    assert low < 0.8 and high >= 1.0
    warnings = [e for e in logs if e["log_level"] == "warning" and "quota_bytes" in e]
    assert len(warnings) == 1 and warnings[0]["quota_bytes"] == size
    # At the quota itself (past the default full mark, 1.0): the guard says so once.
    changes = [e for e in logs if e["event"] == "space guard state changed"]
    assert [(e["before"], e["after"]) for e in changes] == [("clear", "full")]
    # The loud watch checked last; etcd (shared by the session) may have grown since ``size``.
    ratio: Any = registry.get_sample_value("coordinator_etcd_quota_ratio")
    assert ratio >= 1.0
    db_size: Any = registry.get_sample_value("coordinator_etcd_db_size_bytes")
    assert db_size >= size
