"""The coordinator compacts etcd's history above the high-water mark (store/etcd/history_trim.py),
against a real etcd: to the newest reading at least ``keep`` seconds old, never below it, only
above the mark, once across replicas, and a user etcd will not let compact is warned about once."""

from __future__ import annotations

from typing import Any

import grpc
from etcd3 import etcdrpc

from coordinator.domain.space import SpaceState
from coordinator.errors import StoreRefused
from coordinator.metrics import Metrics
from coordinator.store import EtcdKV
from coordinator.store.etcd.history_trim import HistoryTrim


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _bump(raw: Any, n: int = 3) -> int:
    """Overwrite one key ``n`` times; etcd's revision after."""
    for i in range(n):
        raw.put("/history/key", f"value {i}")
    return int(raw.get("/history/key")[1].mod_revision)


def _readable_at(raw: Any, revision: int) -> bool:
    """Whether etcd still serves a read at ``revision`` (False once it is compacted)."""
    request = etcdrpc.RangeRequest(key=b"/history/key", revision=revision)
    try:
        raw.kvstub.Range(request, 5)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.OUT_OF_RANGE, exc.details()
        return False
    return True


def _compactions(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("coordinator_etcd_compactions_total")


def test_above_high_water_history_older_than_keep_is_compacted(
    raw: Any, kv: EtcdKV, metrics: Metrics
) -> None:
    clock = _Clock()
    trim = HistoryTrim(kv, keep=10.0, every=0.0, metrics=metrics, clock=clock)
    first = _bump(raw)
    assert trim.observe(first, SpaceState.HIGH_WATER) is None  # nothing is 10 s old yet
    clock.now = 5.0
    middle = _bump(raw)
    assert trim.observe(middle, SpaceState.CLEAR) is None  # below the mark: never
    clock.now = 12.0
    assert trim.observe(_bump(raw), SpaceState.HIGH_WATER) == first  # 12 s old; 5 s is not
    assert not _readable_at(raw, first - 1)
    assert _readable_at(raw, first) and _readable_at(raw, middle)
    assert _compactions(metrics) == 1.0
    # Nothing new is old enough: no second compaction to the same revision.
    clock.now = 13.0
    assert trim.observe(_bump(raw), SpaceState.FULL) is None
    clock.now = 16.0
    assert trim.observe(_bump(raw), SpaceState.NOSPACE) == middle  # at NOSPACE too
    assert not _readable_at(raw, middle - 1)
    assert _compactions(metrics) == 2.0


def test_another_replica_that_compacted_first_costs_nothing(
    raw: Any, kv: EtcdKV, metrics: Metrics
) -> None:
    clock = _Clock()
    ours = HistoryTrim(kv, keep=1.0, every=0.0, metrics=metrics, clock=clock)
    old = _bump(raw)
    ours.observe(old, SpaceState.HIGH_WATER)
    raw.compact(_bump(raw))  # another replica (or etcd's own compactor) went further
    clock.now = 2.0
    assert ours.observe(_bump(raw), SpaceState.HIGH_WATER) is None
    assert _compactions(metrics) in (None, 0.0)


def test_compactions_are_spaced_by_every(raw: Any, kv: EtcdKV, metrics: Metrics) -> None:
    clock = _Clock()
    trim = HistoryTrim(kv, keep=1.0, every=30.0, metrics=metrics, clock=clock)
    trim.observe(_bump(raw), SpaceState.HIGH_WATER)
    clock.now = 2.0
    assert trim.observe(_bump(raw), SpaceState.HIGH_WATER) is not None
    clock.now = 20.0
    assert trim.observe(_bump(raw), SpaceState.HIGH_WATER) is None  # 18 s since: not yet
    clock.now = 33.0
    assert trim.observe(_bump(raw), SpaceState.HIGH_WATER) is not None
    assert _compactions(metrics) == 2.0


class _NoCompaction(EtcdKV):
    """An etcd that keeps compaction to its root user (as etcd with auth does)."""

    tries = 0

    def compact(self, revision: int) -> bool:
        type(self).tries += 1
        raise StoreRefused("etcd refused compact: PERMISSION_DENIED: permission denied")


def test_a_user_etcd_will_not_let_compact_is_warned_once_and_not_asked_again(
    raw: Any, quota_etcd: Any, metrics: Metrics
) -> None:
    kv = _NoCompaction.connect([quota_etcd.endpoint])
    clock = _Clock()
    try:
        trim = HistoryTrim(kv, keep=1.0, every=0.0, metrics=metrics, clock=clock)
        trim.observe(_bump(raw), SpaceState.HIGH_WATER)
        for now in (2.0, 4.0, 6.0):
            clock.now = now
            assert trim.observe(_bump(raw), SpaceState.HIGH_WATER) is None
        assert _NoCompaction.tries == 1
        assert _compactions(metrics) in (None, 0.0)
    finally:
        kv.close()
