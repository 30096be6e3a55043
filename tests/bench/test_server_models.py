"""bench.server_models: every server model measured on a real etcd, and gone after."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import etcd3
import grpc
import pytest
from etcd3 import etcdrpc

from bench import procs
from bench.model_server import MODELS
from bench.model_server import main as model_server_main
from bench.procs import context_switches
from bench.server_models import main


def _model_servers() -> list[int]:
    """Live processes of this test run that serve a model."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"bench.model_server" in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_context_switches_counts_every_threads_sleeps() -> None:
    slept, release = threading.Event(), threading.Event()

    def nap() -> None:
        for _ in range(20):
            time.sleep(0.001)  # each one blocks the thread: one voluntary switch
        slept.set()
        release.wait()  # alive while counted: an ended thread's count leaves with it

    before = context_switches(os.getpid())
    thread = threading.Thread(target=nap)
    thread.start()
    try:
        assert slept.wait(10)
        assert context_switches(os.getpid()) - before >= 20
    finally:
        release.set()
        thread.join()


def _compacted_below(client: etcd3.Etcd3Client) -> tuple[int, grpc.StatusCode | None]:
    """etcd's revision and the code of a read one revision before it (OUT_OF_RANGE once the
    history up to the revision is compacted)."""
    revision = client.maintenancestub.Status(etcdrpc.StatusRequest(), 10).header.revision
    try:
        client.kvstub.Range(etcdrpc.RangeRequest(key=b"k0", revision=revision - 1), 10)
    except grpc.RpcError as exc:
        return revision, exc.code()
    return revision, None


def test_every_model_answers_and_is_measured_then_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compacted: list[tuple[int, grpc.StatusCode | None]] = []
    compact_now = procs.compact_now

    def observed(client: etcd3.Etcd3Client) -> None:
        compact_now(client)
        compacted.append(_compacted_below(client))

    monkeypatch.setattr(procs, "compact_now", observed)
    out = tmp_path / "models.json"
    code = main(["--workers", "4", "--seconds", "0.5", "--rounds", "1", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert list(report["models"]) == list(MODELS)
    for runs in report["models"].values():
        (sample,) = runs
        assert sample["calls_per_s"] > 0
        assert sample["cpu_ms_per_call"] > 0
        assert sample["switches_per_call"] > 0
        assert sample["etcd_cpu_ms_per_call"] > 0
        # Two txns per call, fewer etcd round trips only where the loop batched them.
        assert 0 < sample["etcd_calls_per_call"] <= 2.5
    assert report["workers"] == 4
    assert _model_servers() == []
    # etcd's history is compacted after every run, each time further (every model writes).
    assert [code for _, code in compacted] == [grpc.StatusCode.OUT_OF_RANGE] * len(MODELS)
    revisions = [revision for revision, _ in compacted]
    assert revisions == sorted(set(revisions))


def test_unknown_model_is_refused_before_anything_starts(capsys: object) -> None:
    assert main(["--models", "threads,fibers"]) == 2
    assert model_server_main(["fibers", "127.0.0.1:1"]) == 2
