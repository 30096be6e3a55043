"""The etcd adapter tells a refused request (a bug, not retryable) from an outage."""

from __future__ import annotations

import pytest

from coordinator.errors import StoreRefused, StoreUnavailable
from coordinator.etcd_process import EtcdProcess
from coordinator.store import EtcdKV
from coordinator.store.etcd.ops import put


def test_a_txn_etcd_refuses_is_not_reported_as_an_outage(etcd: EtcdProcess, prefix: str) -> None:
    kv = EtcdKV.connect([etcd.endpoint])
    key = f"{prefix}/k"
    with pytest.raises(StoreRefused, match="etcd refused txn: INVALID_ARGUMENT") as caught:
        kv.txn((), [put(key, b"1"), put(key, b"2")])  # etcd: duplicate key given in txn request
    assert not isinstance(caught.value, StoreUnavailable)
    assert kv.get(key) is None
    kv.close()


def test_an_unreachable_etcd_is_store_unavailable() -> None:
    with EtcdProcess() as gone:
        endpoint = gone.endpoint
    kv = EtcdKV.connect([endpoint], timeout=1)
    with pytest.raises(StoreUnavailable, match="etcd txn failed"):
        kv.txn((), [put("/x", b"1")])
    kv.close()


def test_lease_readings_say_what_etcd_says_and_none_for_a_lease_gone(etcd: EtcdProcess) -> None:
    kv = EtcdKV.connect([etcd.endpoint])
    kept, granted = kv.grant(30)
    gone, _ = kv.grant(30)
    kv.revoke(gone)
    alive, missing = kv.lease_readings([kept, gone])
    assert missing is None
    assert alive is not None and alive.granted == granted == 30
    assert 0 < alive.remaining <= 30
    assert kv.lease_readings([]) == []
    kv.revoke(kept)
    kv.close()


def test_lease_readings_of_an_unreachable_etcd_are_store_unavailable() -> None:
    with EtcdProcess() as gone:
        endpoint = gone.endpoint
    kv = EtcdKV.connect([endpoint], timeout=1)
    with pytest.raises(StoreUnavailable, match="etcd lease time-to-live failed"):
        kv.lease_readings([1])
    kv.close()
