"""The S3 archive sink against moto's S3 server on loopback (boto3 and moto are in the ``dev``
extra, so CI runs these; skipped with the reason where they are not installed)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from coordinator import lifeline
from coordinator.archive import ArchiveError, open_sink
from coordinator.clock import ManualClock
from coordinator.etcd_process import free_port
from tests.helpers import eventually
from tests.retention.test_pruner import PAST, finish

pytest.importorskip("boto3", reason="the S3 sink needs boto3: pip install 'coordinator[s3]'")
pytest.importorskip("moto", reason="moto's S3 server stands in for S3: pip install 'moto[server]'")


@pytest.fixture
def s3_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty bucket on a moto server of this test: the archive URL for it."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
    }.items():
        monkeypatch.setenv(name, value)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ),
    )
    lifeline.kill_with_parent(server.pid)  # dies with this test run
    endpoint = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def up() -> bool:
        try:
            with opener.open(endpoint, timeout=1):
                return True
        except OSError:
            return False

    try:
        eventually(up, timeout=30, message="moto did not start")
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="archive"
        )
        yield f"s3://archive/coord?endpoint_url={endpoint}&region=us-east-1"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_the_pruner_archives_to_s3_and_reads_it_back(
    s3_url: str, make_store: Any, clock: ManualClock
) -> None:
    sink = open_sink(s3_url)
    store = make_store(archive=sink)
    finish(store, "t1")
    finish(store, "t2")
    clock.advance(PAST)
    assert store.pruner is not None

    report = store.pruner.run_pass()

    assert (report.archived, report.pruned) == (2, 2)
    objects = list(sink.read())
    assert sorted(o["task_id"] for o in objects) == ["t1", "t2"]
    assert all(o["state"] == "DONE" and len(o["events"]) == 3 for o in objects)
    with pytest.raises(Exception, match="s3://archive/coord/"):
        store.tasks.get("t1")


def test_an_unreachable_s3_confirms_nothing(s3_url: str) -> None:
    sink = open_sink(s3_url.replace("archive/coord", "no-such-bucket/x"))
    with pytest.raises(ArchiveError, match="no-such-bucket"):
        sink.write([{"task_id": "t1"}])
