"""Leases shared per time window (store/etcd/lease_window.py), against a real etcd."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from coordinator.errors import LeaseGone
from coordinator.etcd_process import EtcdProcess
from coordinator.store import EtcdKV
from coordinator.store.etcd.lease_window import LeaseWindow
from coordinator.store.etcd.ops import put


@pytest.fixture
def kv(etcd: EtcdProcess) -> Iterator[EtcdKV]:
    client = EtcdKV.connect([etcd.endpoint])
    yield client
    client.close()


def test_keys_of_one_window_share_a_lease_that_outlives_the_ttl(kv: EtcdKV) -> None:
    grants: list[int] = []

    def grant(ttl: int) -> tuple[int, int]:
        grants.append(ttl)
        return kv.grant(ttl)

    window = LeaseWindow(grant, 300.0)
    assert window.lease() == window.lease() == window.lease()
    assert grants == [300 + 3 + 1]  # the TTL, the window (1 % of it), and a second


def test_a_lease_etcd_lost_is_replaced_at_the_next_key(kv: EtcdKV, prefix: str) -> None:
    window = LeaseWindow(kv.grant, 300.0)
    first = window.lease()
    kv.revoke(first)
    with pytest.raises(LeaseGone):
        kv.txn([], [put(f"{prefix}/k", b"v", lease=first)])
    window.lost(12345)  # another lease: nothing changes
    assert window.lease() == first
    window.lost(first)
    second = window.lease()
    assert second != first
    assert kv.txn([], [put(f"{prefix}/k", b"v", lease=second)]).succeeded
