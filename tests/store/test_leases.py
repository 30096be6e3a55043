"""Claim leases are reused only when that is exactly as good as a fresh grant
(store/etcd/leases.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from coordinator.domain.states import FenceReason, Outcome
from coordinator.etcd_process import EtcdProcess
from coordinator.store import EtcdKV, Store
from coordinator.store.etcd.leases import ClaimLeases
from tests.store.support import claim, claim_result, commit, create, raw, wait_claim_gone


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kv(etcd: EtcdProcess) -> Iterator[EtcdKV]:
    client = EtcdKV.connect([etcd.endpoint])
    yield client
    client.close()


def _keepalive(kv: EtcdKV, lease_id: int) -> int:
    """The lease's TTL after etcd refreshed it, 0 if etcd no longer has it (the renewals' own
    keepalive path)."""
    return kv.keepalive_many([lease_id])[lease_id]


def _grants(kv: EtcdKV, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    granted: list[int] = []
    grant = kv.grant

    def counted(ttl: int) -> tuple[int, int]:
        lease_id, ttl_granted = grant(ttl)
        granted.append(lease_id)
        return lease_id, ttl_granted

    monkeypatch.setattr(kv, "grant", counted)
    return granted


def test_a_young_released_lease_carries_the_next_claim_and_reports_what_remains(
    kv: EtcdKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    leases = ClaimLeases(kv, monotonic=clock)
    grants = _grants(kv, monkeypatch)
    first = leases.acquire(30)
    assert (first.ttl, first.remaining) == (30, 30.0)
    leases.release(first.lease_id)
    clock.now += 9  # under a third of the TTL
    second = leases.acquire(30)
    assert (second.lease_id, second.ttl, second.remaining) == (first.lease_id, 30, 21.0)
    assert grants == [first.lease_id]
    assert _keepalive(kv, first.lease_id) == 30  # still alive in etcd: it was never revoked


def test_an_old_lease_is_never_handed_out(kv: EtcdKV, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    leases = ClaimLeases(kv, monotonic=clock)
    grants = _grants(kv, monkeypatch)
    first = leases.acquire(30)
    leases.release(first.lease_id)
    clock.now += 10  # a third of the TTL has run: the next claim would get only two thirds
    second = leases.acquire(30)
    assert second.lease_id != first.lease_id and second.remaining == 30.0
    assert grants == [first.lease_id, second.lease_id]


def test_a_lease_released_late_is_revoked_not_pooled(kv: EtcdKV) -> None:
    clock = _Clock()
    leases = ClaimLeases(kv, monotonic=clock)
    lease = leases.acquire(30)
    clock.now += 12
    leases.release(lease.lease_id)
    assert leases.pooled() == 0
    assert _keepalive(kv, lease.lease_id) == 0  # revoked in etcd


def test_a_renewal_through_this_replica_makes_the_lease_young_again(kv: EtcdKV) -> None:
    clock = _Clock()
    leases = ClaimLeases(kv, monotonic=clock)
    lease = leases.acquire(30)
    clock.now += 25
    leases.renewed_many({lease.lease_id: _keepalive(kv, lease.lease_id)})
    clock.now += 2
    leases.release(lease.lease_id)
    again = leases.acquire(30)
    assert (again.lease_id, again.remaining) == (lease.lease_id, 28.0)


def test_only_leases_of_the_same_ttl_are_reused(kv: EtcdKV) -> None:
    leases = ClaimLeases(kv, monotonic=_Clock())
    short = leases.acquire(10)
    leases.release(short.lease_id)
    long = leases.acquire(20)
    assert long.lease_id != short.lease_id and long.ttl == 20
    assert leases.acquire(10).lease_id == short.lease_id


def test_a_leases_nobody_granted_here_is_revoked(kv: EtcdKV) -> None:
    """A claim granted (or last renewed) by another replica: its age is unknown here."""
    other, _ = kv.grant(30)
    leases = ClaimLeases(kv, monotonic=_Clock())
    leases.release(other)
    assert leases.pooled() == 0
    assert _keepalive(kv, other) == 0


# --- through the store -----------------------------------------------------------------------


def test_back_to_back_claims_and_commits_grant_one_lease(
    store: Store, etcd_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    grants = _grants(store.ctx.kv, monkeypatch)
    revoked: list[int] = []
    monkeypatch.setattr(store.ctx.kv, "revoke", revoked.append)
    leases_seen = []
    for i in range(5):
        create(store, f"t{i}")
        fence = claim(store, f"t{i}")
        leases_seen.append(raw(etcd_client, store.ctx.keys.claim(f"t{i}")).lease_id)
        assert commit(store, fence).verdict.outcome is Outcome.COMMITTED
    assert len(grants) == 1 and leases_seen == grants * 5
    assert revoked == []
    assert store.ctx.leases.pooled() == 1


def test_a_pooled_lease_etcd_lost_is_replaced_and_the_claim_succeeds(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t1")
    assert commit(store, claim(store, "t1")).verdict.outcome is Outcome.COMMITTED
    (lost,) = [store.ctx.leases.acquire(30).lease_id]
    store.ctx.leases.release(lost)
    store.ctx.kv.revoke(lost)  # behind the pool's back (say, a paused process outlived it)

    create(store, "t2")
    result = claim_result(store, "t2")
    assert result.verdict.outcome is Outcome.CLAIMED
    claim_kv = raw(etcd_client, store.ctx.keys.claim("t2"))
    assert claim_kv.lease_id != lost
    assert _keepalive(store.ctx.kv, claim_kv.lease_id) == 30


def test_one_lost_pooled_lease_empties_the_pool(kv: EtcdKV) -> None:
    """Whatever took one (a restore from backup) may have taken all: three claim tries must
    not each burn a dead lease."""
    leases = ClaimLeases(kv, monotonic=_Clock())
    held = [leases.acquire(30) for _ in range(4)]
    for lease in held:
        leases.release(lease.lease_id)
    assert leases.pooled() == 4
    leases.lost(held[-1].lease_id)
    assert leases.pooled() == 0
    assert leases.acquire(30).lease_id not in {lease.lease_id for lease in held}


def test_a_cancelled_claims_lease_is_revoked_and_never_reused(store: Store) -> None:
    create(store, "t1")
    claim(store, "t1")
    lease_id = store.tasks.get("t1").lease_id
    store.tasks.cancel("t1", by="pm", reason="not needed")
    assert store.ctx.leases.pooled() == 0
    assert _keepalive(store.ctx.kv, lease_id) == 0
    create(store, "t2")
    claim(store, "t2")
    assert store.tasks.get("t2").lease_id != lease_id


def test_a_claim_on_a_reused_lease_still_expires_and_its_late_commit_is_fenced(
    store: Store, etcd_client: Any
) -> None:
    """The paused-worker story on a reused lease: nobody renews, the lease runs out (sooner
    than a fresh one would: what remained of it), the task is claimable again, another worker
    takes it, and the first worker's late commit is refused."""
    create(store, "t1")
    assert commit(store, claim(store, "t1", ttl=3)).verdict.outcome is Outcome.COMMITTED
    pooled = store.ctx.leases.pooled()
    create(store, "t2")
    late = claim_result(store, "t2", ttl=3)
    assert late.fence is not None and late.lease_expires_at is not None
    assert store.ctx.leases.pooled() == pooled - 1  # the claim took the pooled lease
    assert late.lease_expires_at - store.ctx.clock.now() <= 3

    wait_claim_gone(store, etcd_client, "t2")
    taken = claim(store, "t2", principal="w2")
    assert taken.claim_generation > late.fence.claim_generation
    refused = commit(store, late.fence)
    assert (refused.verdict.outcome, refused.verdict.reason) == (
        Outcome.FENCED,
        FenceReason.SUPERSEDED,
    )
    assert commit(store, taken, principal="w2").verdict.outcome is Outcome.COMMITTED
