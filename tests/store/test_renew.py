"""Renew and AuthorizeTool: fenced, owner-checked and bounded (TTL, deadline, stall)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.decisions import PROGRESS_WRITE_INTERVAL, ClaimLimits, Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.records import ClaimRecord, decode
from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import InvalidArgument, PermissionDenied
from coordinator.store import RenewResult, Store
from tests.helpers import RETRY_AT_ONCE
from tests.store.support import (
    StoreFactory,
    claim,
    commit,
    create,
    raw,
    snapshot,
    wait_claim_gone,
)


def _renew(store: Store, fence: Fence, progress: str = "", principal: str = "w1") -> RenewResult:
    return store.renewals.renew(fence, principal=principal, progress=progress)


def _claim_record(store: Store, etcd_client: Any, task_id: str) -> ClaimRecord:
    value, _ = etcd_client.get(store.ctx.keys.claim(task_id))
    return decode(ClaimRecord, value)


def test_renew_restores_at_most_the_granted_ttl(store: Store, etcd_client: Any) -> None:
    create(store, "t1")
    fence = claim(store, "t1", ttl=4)
    lease_id = raw(etcd_client, store.ctx.keys.claim("t1")).lease_id
    for step in range(5):
        renewed = _renew(store, fence, progress=f"step-{step}")
        assert (renewed.verdict.outcome, renewed.ttl) == (Outcome.OK, 4)
        lease = etcd_client.get_lease_info(lease_id)
        assert lease.grantedTTL == 4
        assert 0 < lease.TTL <= 4


def test_renew_reports_the_claim_deadline(store: Store, clock: ManualClock) -> None:
    create(store, "t1")
    claimed_at = clock.now()
    fence = claim(store, "t1")
    clock.advance(7)
    renewed = _renew(store, fence, progress="p")
    assert renewed.deadline == claimed_at + store.ctx.limits.max_claim_duration
    assert renewed.lease_expires_at == clock.now() + renewed.ttl


def test_renew_cannot_pass_max_claim_duration(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    limits = ClaimLimits(
        min_ttl=1, max_ttl=30, max_claim_duration=100.0, stall_timeout=0.0, retry=RETRY_AT_ONCE
    )
    store = make_store(limits=limits)
    create(store, "t1")
    fence = claim(store, "t1", ttl=10)
    clock.advance(90)  # now + ttl == deadline: the last renewal that fits
    assert _renew(store, fence, progress="a").verdict.outcome is Outcome.OK
    clock.advance(1)
    before = snapshot(store, etcd_client)
    for progress in ("a", "b"):  # new progress does not lift the limit
        refused = _renew(store, fence, progress=progress)
        assert (refused.verdict.outcome, refused.verdict.reason) == (
            Outcome.RENEW_LIMIT,
            FenceReason.NONE,
        )
        assert refused.ttl == 0
    assert snapshot(store, etcd_client) == before


def test_renew_with_unchanged_progress_past_stall_timeout_is_stalled(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    limits = ClaimLimits(
        min_ttl=1, max_ttl=30, max_claim_duration=1000.0, stall_timeout=10.0, retry=RETRY_AT_ONCE
    )
    store = make_store(limits=limits)
    create(store, "t1")
    fence = claim(store, "t1")
    clock.advance(10)  # exactly stall_timeout: still fine
    assert _renew(store, fence).verdict.outcome is Outcome.OK
    clock.advance(1)
    assert _renew(store, fence).verdict.outcome is Outcome.STALLED
    moved = _renew(store, fence, progress="step-1")
    assert moved.verdict.outcome is Outcome.OK
    record = _claim_record(store, etcd_client, "t1")
    assert (record.progress, record.progress_at) == ("step-1", clock.now())
    clock.advance(5)
    assert _renew(store, fence, progress="step-1").verdict.outcome is Outcome.OK
    clock.advance(6)  # 11 s since step-1
    assert _renew(store, fence, progress="step-1").verdict.outcome is Outcome.STALLED
    assert _renew(store, fence, progress="step-2").verdict.outcome is Outcome.OK


def test_progress_update_keeps_the_claim_key_on_its_lease(
    store: Store, etcd_client: Any, clock: ManualClock
) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    before = raw(etcd_client, store.ctx.keys.claim("t1"))
    clock.advance(PROGRESS_WRITE_INTERVAL)
    assert _renew(store, fence, progress="p1").verdict.outcome is Outcome.OK
    after = raw(etcd_client, store.ctx.keys.claim("t1"))
    assert after.create_revision == before.create_revision == fence.claim_generation
    assert after.lease_id == before.lease_id
    assert after.mod_revision > before.mod_revision
    assert _renew(store, fence, progress="p1").verdict.outcome is Outcome.OK
    # A marker that moves again within the interval is not written; a renewal after it is.
    clock.advance(PROGRESS_WRITE_INTERVAL - 1)
    assert _renew(store, fence, progress="p2").verdict.outcome is Outcome.OK
    assert raw(etcd_client, store.ctx.keys.claim("t1")).mod_revision == after.mod_revision
    clock.advance(1)
    assert _renew(store, fence, progress="p2").verdict.outcome is Outcome.OK
    assert _claim_record(store, etcd_client, "t1").progress == "p2"


def test_renew_by_another_principal_is_denied_and_nothing_changes(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t1")
    fence = claim(store, "t1", principal="owner")
    before = snapshot(store, etcd_client)
    with pytest.raises(PermissionDenied):
        _renew(store, fence, progress="hijack", principal="intruder")
    assert snapshot(store, etcd_client) == before


def test_a_generation_that_is_not_the_attempts_is_invalid(store: Store) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    # A write after the claim: the forged generation is a past revision the claimed index has
    # not seen a claim at, so it is read (one beyond etcd's revision is refused FENCED unread:
    # tests/store/test_renew_screen.py).
    create(store, "t2")
    forged = Fence(
        fence.task_id,
        fence.attempt_id,
        fence.claim_generation + 1,
        fence.scheduler_epoch,
        fence.cancel_generation,
    )
    with pytest.raises(InvalidArgument):
        _renew(store, forged)


def test_renew_and_authorize_after_expiry_then_after_reclaim(
    make_store: StoreFactory, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)
    create(store, "t1")
    fence = claim(store, "t1", ttl=1)
    wait_claim_gone(store, etcd_client, "t1")

    def verdicts() -> list[tuple[Outcome, FenceReason]]:
        renewed = _renew(store, fence, progress="late").verdict
        authorized = store.acceptance.authorize_tool(fence, principal="w1", tool="t", action="a")
        return [(renewed.outcome, renewed.reason), (authorized.outcome, authorized.reason)]

    assert verdicts() == [(Outcome.FENCED, FenceReason.LEASE_EXPIRED)] * 2
    claim(store, "t1", principal="w2")
    assert verdicts() == [(Outcome.FENCED, FenceReason.SUPERSEDED)] * 2


def test_renew_after_cancel_or_input_change(store: Store) -> None:
    create(store, "cancelled")
    create(store, "changed")
    cancelled, changed = claim(store, "cancelled"), claim(store, "changed")
    store.tasks.cancel("cancelled", by="pm", reason="stop")
    store.tasks.update_input(
        "changed", data=b"v2", input_digest=digest_of(b"v2"), expected_revision=1, by="pm"
    )
    assert _renew(store, cancelled).verdict.outcome is Outcome.CANCELLED
    assert _renew(store, changed).verdict.outcome is Outcome.STALE_INPUT
    for fence, outcome in ((cancelled, Outcome.CANCELLED), (changed, Outcome.STALE_INPUT)):
        verdict = store.acceptance.authorize_tool(fence, principal="w1", tool="t", action="a")
        assert verdict.outcome is outcome


def test_authorize_tool_is_ok_for_the_holder_and_writes_nothing(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    before = snapshot(store, etcd_client)
    verdict = store.acceptance.authorize_tool(fence, principal="w1", tool="git", action="push")
    assert (verdict.outcome, verdict.reason) == (Outcome.OK, FenceReason.NONE)
    assert snapshot(store, etcd_client) == before


@pytest.mark.parametrize(
    ("interloper", "expected"),
    [
        ("cancel", (Outcome.CANCELLED, FenceReason.NONE)),
        ("release", (Outcome.FENCED, FenceReason.RELEASED)),
        ("commit", (Outcome.FENCED, FenceReason.ALREADY_COMMITTED)),
    ],
)
def test_a_call_landing_between_renew_txn_and_keepalive_is_named(
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    interloper: str,
    expected: tuple[Outcome, FenceReason],
) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    keepalive = store.ctx.kv.keepalive_many

    def interlope_then_keepalive(lease_ids: Iterable[int]) -> dict[int, int]:
        # Each of these revokes the lease after the renew txn passed its compares.
        if interloper == "cancel":
            store.tasks.cancel("t1", by="pm", reason="stop")
        elif interloper == "release":
            store.acceptance.release(fence, principal="w1", reason="")
        else:
            commit(store, fence)
        return keepalive(lease_ids)

    monkeypatch.setattr(store.ctx.kv, "keepalive_many", interlope_then_keepalive)
    renewed = _renew(store, fence, progress="p")
    assert ((renewed.verdict.outcome, renewed.verdict.reason), renewed.ttl) == (expected, 0)
