"""The safe-rollback controls: scheduler epoch, paused claims and drain status."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import coordinator.store.control.admin as admin_module
from coordinator.domain.digests import digest_of
from coordinator.domain.states import FenceReason, Outcome, TaskState
from coordinator.domain.validation import MAX_RESULT_BYTES
from coordinator.errors import FailedPrecondition
from coordinator.store import Store
from tests.store.support import (
    StoreFactory,
    claim,
    claim_result,
    commit,
    create,
    snapshot,
)

EPOCH_CHANGED = (Outcome.FENCED, FenceReason.EPOCH_CHANGED)


def test_an_old_epoch_is_refused_at_every_acceptance_point(store: Store, etcd_client: Any) -> None:
    create(store, "held")
    create(store, "free")
    fence = claim(store, "held", epoch=1)
    assert store.admin.bump_epoch() == 2
    before = snapshot(store, etcd_client)
    acceptance = store.acceptance
    verdicts = {
        "claim": claim_result(store, "free", epoch=1).verdict,
        "claim_next": store.claims.claim_next("default", principal="w1", epoch=1, ttl=30).verdict,
        "renew": store.renewals.renew(fence, principal="w1", progress="p").verdict,
        "authorize": acceptance.authorize_tool(fence, principal="w1", tool="t", action="a"),
        "commit": commit(store, fence).verdict,
        "release": acceptance.release(fence, principal="w1", reason="r"),
    }
    assert {name: (v.outcome, v.reason) for name, v in verdicts.items()} == dict.fromkeys(
        verdicts, EPOCH_CHANGED
    )
    assert snapshot(store, etcd_client) == before
    assert store.tasks.get("held").state is TaskState.CLAIMED
    fresh = claim(store, "free", epoch=2)
    assert fresh.scheduler_epoch == 2


def test_a_future_epoch_is_refused_too(store: Store) -> None:
    create(store, "t1")
    result = claim_result(store, "t1", epoch=2)
    assert ((result.verdict.outcome, result.verdict.reason), result.fence) == (EPOCH_CHANGED, None)


def test_bump_epoch_is_a_cas(make_store: StoreFactory) -> None:
    store = make_store()
    assert store.admin.epoch() == 1
    with ThreadPoolExecutor(8) as pool:
        bumped = sorted(pool.map(lambda _: store.admin.bump_epoch(), range(8)))
    assert bumped == list(range(2, 10))
    assert store.admin.epoch() == 9
    with pytest.raises(FailedPrecondition):
        store.admin.bump_epoch(expected=3)
    assert store.admin.bump_epoch(expected=9) == 10
    replica = make_store()  # starting another replica must not reset the epoch
    assert replica.admin.epoch() == store.admin.epoch() == 10


def test_claims_are_refused_while_paused_and_accepted_after_resume(
    store: Store, etcd_client: Any
) -> None:
    create(store, "held")
    create(store, "t1")
    held = claim(store, "held")
    store.admin.pause_claims("rollback")
    assert store.admin.claims_paused() is True
    before = snapshot(store, etcd_client)
    paused = claim_result(store, "t1")
    assert (paused.verdict.outcome, paused.fence) == (Outcome.CLAIMS_PAUSED, None)
    paused_next = store.claims.claim_next("default", principal="w1", epoch=1, ttl=30)
    assert (paused_next.verdict.outcome, paused_next.fence) == (Outcome.CLAIMS_PAUSED, None)
    assert snapshot(store, etcd_client) == before
    assert store.admin.drain_status().claims_paused is True
    # A held claim keeps working while paused: pausing stops new claims only.
    assert store.renewals.renew(held, principal="w1", progress="p").verdict.outcome is (Outcome.OK)
    assert commit(store, held).verdict.outcome is Outcome.COMMITTED
    store.admin.resume_claims()
    assert store.admin.claims_paused() is False
    assert claim_result(store, "t1").verdict.outcome is Outcome.CLAIMED


def test_drain_status_counts_active_leases_and_staged_uncommitted_results(store: Store) -> None:
    create(store, "t1")
    create(store, "t2")
    f1, f2 = claim(store, "t1"), claim(store, "t2")
    store.admin.bump_epoch()

    def counts() -> tuple[bool, int, int, int, bool]:
        s = store.admin.drain_status()
        return s.claims_paused, s.active_leases, s.staged_uncommitted, s.epoch, s.drained

    assert counts() == (False, 2, 0, 2, False)
    store.acceptance.stage_result(
        f1, principal="w1", result_digest=digest_of(b"r"), result=b"r", result_ref=""
    )
    assert counts() == (False, 2, 1, 2, False)
    store.admin.pause_claims("rollback")
    assert counts() == (True, 2, 1, 2, False)
    # The old-epoch holders cannot commit; they release (or their leases expire).
    assert commit(store, f1).verdict.reason is FenceReason.EPOCH_CHANGED
    assert store.acceptance.release(f2, principal="w1", reason="r").reason is (
        FenceReason.EPOCH_CHANGED
    )
    store.tasks.cancel("t2", by="admin", reason="rollback")
    assert counts() == (True, 1, 1, 2, False)


def test_drain_status_counts_staged_results_far_past_the_message_limit(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 12 results of the largest size a worker may stage: 6 MiB, past gRPC's 4 MB message limit
    # that one read of every staged value would hit.
    big = bytes(MAX_RESULT_BYTES)
    fences = []
    for n in range(12):
        create(store, f"t{n:02}")
        fences.append(claim(store, f"t{n:02}"))
        store.acceptance.stage_result(
            fences[-1], principal="w1", result_digest=digest_of(big), result=big, result_ref=""
        )
    # One released: its staged result can never be committed.
    store.acceptance.release(fences[0], principal="w1", reason="giving it back")
    monkeypatch.setattr(admin_module, "_READ_BATCH", 5)  # the staging keys in pages of 5
    status = store.admin.drain_status()
    assert (status.active_leases, status.staged_uncommitted) == (11, 11)


def test_drain_completes_once_leases_end_and_staged_results_are_committed(store: Store) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    store.acceptance.stage_result(
        fence, principal="w1", result_digest=digest_of(b"r"), result=b"r", result_ref=""
    )
    store.admin.pause_claims("rollback")
    status = store.admin.drain_status()
    assert (status.active_leases, status.staged_uncommitted, status.drained) == (1, 1, False)
    assert commit(store, fence, result=b"r").verdict.outcome is Outcome.COMMITTED
    status = store.admin.drain_status()
    assert (status.active_leases, status.staged_uncommitted, status.unknown_effects) == (0, 0, 0)
    assert status.drained is True


@pytest.mark.parametrize("ending", ["cancel", "update_input"])
def test_staging_that_can_never_be_committed_does_not_block_the_drain(
    store: Store, ending: str
) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    store.acceptance.stage_result(
        fence, principal="w1", result_digest=digest_of(b"r"), result=b"r", result_ref=""
    )
    store.admin.pause_claims("rollback")
    if ending == "cancel":
        store.tasks.cancel("t1", by="admin", reason="rollback")
    else:
        store.tasks.update_input(
            "t1", data=b"v2", input_digest=digest_of(b"v2"), expected_revision=1, by="pm"
        )
    status = store.admin.drain_status()
    assert (status.active_leases, status.staged_uncommitted) == (0, 0)
    assert status.drained is True
