"""etcd's quota against nested txns, and the space guard that closes the hole (real etcd).

etcd prices a txn by its top-level puts only (``costTxnReq``), so with the NOSPACE alarm raised
a plain put is refused and the same put nested in a txn's ``RequestTxn`` is applied: group
commit nests every txn it batches, so without the guard a full etcd keeps growing. etcd 3.5.0
to 3.5.6 refuse every txn at NOSPACE instead, reads and deletes too (``refuses_every_txn``):
there the coordinator still reads, by Range reads, and its deletes are refused."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest
from etcd3 import etcdrpc
from structlog.testing import capture_logs

from coordinator.domain.space import SpaceState
from coordinator.errors import SpaceRefused, StoreRefused
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.store import EtcdKV
from coordinator.store.etcd.db_size import DbSizeWatch
from coordinator.store.etcd.ops import delete, get, nested_txn, put
from coordinator.store.etcd.space_guard import SpaceGuard
from tests.space.conftest import QUOTA, fill, refuses_every_txn


def _put_op(key: bytes) -> Any:
    return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=b"v" * 1024))


def _state(kv: EtcdKV) -> SpaceState:
    return kv.space.state  # read afresh each time (mypy would narrow the attribute)


def _watch(kv: EtcdKV, metrics: Metrics) -> DbSizeWatch:
    return DbSizeWatch(kv, quota_bytes=QUOTA, warn_ratio=0.8, high_water=0.8, metrics=metrics)


def test_etcd_quota_refuses_a_plain_put_and_applies_a_nested_one(raw: Any) -> None:
    fill(raw)
    alarms = raw.maintenancestub.Alarm(
        etcdrpc.AlarmRequest(action=etcdrpc.AlarmRequest.GET, memberID=0), 10
    ).alarms
    assert [a.alarm for a in alarms] == [etcdrpc.NOSPACE]

    with pytest.raises(grpc.RpcError) as info:
        raw.kvstub.Txn(etcdrpc.TxnRequest(success=[_put_op(b"/plain")]), 10)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "database space exceeded" in str(info.value.details())

    nested = etcdrpc.TxnRequest(
        success=[etcdrpc.RequestOp(request_txn=etcdrpc.TxnRequest(success=[_put_op(b"/nested")]))]
    )
    read = etcdrpc.TxnRequest(
        success=[etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=b"/filler/0"))]
    )
    if refuses_every_txn(raw):  # the nested put is refused like a read
        for request in (nested, read):
            with pytest.raises(grpc.RpcError) as refused:
                raw.kvstub.Txn(request, 10)
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert raw.get("/nested")[0] is None
    else:
        assert raw.kvstub.Txn(read, 10).responses[0].response_range.count == 1
        assert raw.kvstub.Txn(nested, 10).succeeded
        assert raw.get("/nested")[0] == b"v" * 1024  # applied, alarm or not
    assert raw.get("/plain")[0] is None


def test_at_nospace_the_guard_sends_no_put_nested_or_not(
    raw: Any, kv: EtcdKV, metrics: Metrics
) -> None:
    fill(raw)
    _watch(kv, metrics).check()
    assert _state(kv) is SpaceState.NOSPACE
    keys = [f"/guarded/{i}" for i in range(8)]

    with pytest.raises(SpaceRefused, match="NOSPACE"):
        kv.txn_many([nested_txn([], [put(key, b"v")]) for key in keys])
    errors: list[BaseException] = []

    def one(key: str) -> None:  # concurrent txns: group commit nests them in one batch
        try:
            kv.txn([], [put(key, b"v")])
        except SpaceRefused as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(key,)) for key in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == len(keys)
    assert all(raw.get(key)[0] is None for key in keys)
    # What puts nothing still goes: reads (by Range reads where etcd refuses the txn), and
    # deletes (what frees space after a compaction) where etcd takes them.
    assert kv.read(get("/filler/0")).range_one(0) is not None
    refused_deletes = 0
    if refuses_every_txn(raw):
        with pytest.raises(SpaceRefused, match="NOSPACE"):
            kv.txn([], [delete("/filler/0")])
        assert raw.get("/filler/0")[0] is not None
        refused_deletes = 1
    else:
        assert kv.txn([], [delete("/filler/0")]).succeeded
        assert raw.get("/filler/0")[0] is None
    refusals = metrics.registry.get_sample_value(
        "coordinator_space_refusals_total", {"state": "nospace"}
    )
    assert refusals == 1 + len(keys) + refused_deletes
    assert metrics.registry.get_sample_value("coordinator_space_guard_state") == 2


def test_etcd_own_refusal_trips_the_guard_before_the_next_reading(
    raw: Any, kv: EtcdKV, metrics: Metrics
) -> None:
    fill(raw)
    assert _state(kv) is SpaceState.CLEAR  # no reading yet: etcd's answer is the first sign
    with pytest.raises(SpaceRefused, match="NOSPACE"):
        kv.txn([], [put("/first", b"v")])
    assert _state(kv) is SpaceState.NOSPACE
    with pytest.raises(SpaceRefused):  # the nested put etcd would have applied
        kv.txn_many([nested_txn([], [put(f"/nested/{i}", b"v")]) for i in range(2)])
    assert raw.get("/nested/0")[0] is None and raw.get("/nested/1")[0] is None


def test_the_guard_clears_once_etcd_is_compacted_defragmented_and_disarmed(
    raw: Any, kv: EtcdKV, metrics: Metrics
) -> None:
    fill(raw)
    watch = _watch(kv, metrics)
    watch.check()
    assert _state(kv) is SpaceState.NOSPACE
    revision = raw.delete_prefix("/filler/").header.revision
    raw.compact(revision, physical=True)
    raw.defragment()
    watch.check()
    assert _state(kv) is SpaceState.NOSPACE  # still armed: etcd would refuse every put
    for alarm in raw.list_alarms():  # what `etcdctl alarm disarm` does: each by its member
        raw.disarm_alarm(alarm.member_id)
    watch.check()
    assert _state(kv) is SpaceState.CLEAR
    assert kv.txn([], [put("/after", b"v")]).succeeded


class _AlarmsHidden(EtcdKV):
    """An EtcdKV of a user etcd will not list alarms to (some etcd versions keep the
    Maintenance API to the root role); everything else is the real connection."""

    def nospace_alarm(self) -> bool:
        raise StoreRefused("etcd refused alarm list: PERMISSION_DENIED: permission denied")


def test_without_the_alarm_list_a_tripped_guard_holds_until_the_db_shrinks(
    raw: Any, quota_etcd: EtcdProcess, metrics: Metrics
) -> None:
    kv = _AlarmsHidden.connect([quota_etcd.endpoint])
    kv.space = SpaceGuard(metrics=metrics)
    try:
        fill(raw)
        with pytest.raises(SpaceRefused):  # etcd's refusal trips the guard
            kv.txn([], [put("/first", b"v")])
        watch = _watch(kv, metrics)
        watch.check()
        assert _state(kv) is SpaceState.NOSPACE  # not cleared on a guess: the db is still big
        revision = raw.delete_prefix("/filler/").header.revision
        raw.compact(revision, physical=True)
        raw.defragment()
        for alarm in raw.list_alarms():
            raw.disarm_alarm(alarm.member_id)
        watch.check()
        assert _state(kv) is SpaceState.CLEAR
        assert kv.txn([], [put("/after", b"v")]).succeeded
    finally:
        kv.close()


def test_the_first_reading_warns_once_of_an_etcd_that_refuses_every_txn_at_nospace(
    raw: Any, kv: EtcdKV, metrics: Metrics
) -> None:
    watch = _watch(kv, metrics)
    with capture_logs() as logs:
        watch.check()
        watch.check()
    warned = [e for e in logs if e.get("hint") == "run etcd 3.5.7 or later (docs/retention.md)"]
    version = str(raw.status().version)
    assert [e["etcd_version"] for e in warned] == ([version] if refuses_every_txn(raw) else [])
