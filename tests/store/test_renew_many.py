"""RenewMany in the store: every claim of a batch gets the answer a lone Renew gives it, a batch
never keeps alive the lease of a claim that is gone, and a batch costs a few round trips."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.decisions import PROGRESS_WRITE_INTERVAL, ClaimLimits, Fence
from coordinator.domain.records import AttemptRecord, ClaimRecord, decode
from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import CoordinatorError, InvalidArgument, PermissionDenied
from coordinator.store import Renewal, RenewAnswer, Store
from tests.helpers import RETRY_AT_ONCE, eventually
from tests.store.support import StoreFactory, claim, create, raw, wait_claim_gone

# Claims end 100 s after they start and stall after 40 s without progress (manual clock).
LIMITS = ClaimLimits(
    min_ttl=1, max_ttl=30, max_claim_duration=100.0, stall_timeout=40.0, retry=RETRY_AT_ONCE
)

Answer = tuple[Outcome, FenceReason] | type[CoordinatorError]


def _answer(answer: RenewAnswer) -> Answer:
    if isinstance(answer, CoordinatorError):
        return type(answer)
    return answer.verdict.outcome, answer.verdict.reason


def _lone(store: Store, renewal: Renewal) -> Answer:
    """What a lone Renew answers for ``renewal``."""
    try:
        result = store.renewals.renew(
            renewal.fence, principal="w1", progress=renewal.progress, checkpoint=renewal.checkpoint
        )
    except CoordinatorError as exc:
        return type(exc)
    return result.verdict.outcome, result.verdict.reason


def test_each_claim_of_a_mixed_batch_gets_exactly_what_a_lone_renew_answers(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(limits=LIMITS, reclaim=False)
    other = make_store(limits=LIMITS, reclaim=False)  # another replica
    names = ("limited", "stalled", "moving", "checkpoint", "quiet", "cancelled", "superseded")
    for task_id in (*names, "old-epoch", "foreign", "lost"):
        create(store, task_id)
    old_epoch = claim(store, "old-epoch")  # epoch 1, then the epoch moves on
    assert store.admin.bump_epoch() == 2
    limited = claim(store, "limited", epoch=2)  # t=0: its claim ends at t=100
    clock.advance(50)
    fences = {t: claim(store, t, epoch=2) for t in (*names[1:], "lost")}
    foreign = claim(store, "foreign", principal="w2", epoch=2)
    store.tasks.cancel("cancelled", by="pm", reason="not needed")
    # superseded: its lease ends and another worker takes the task at a higher generation;
    # lost: its lease ends and nobody has taken it yet.
    for task_id in ("superseded", "lost"):
        store.ctx.kv.revoke(raw(etcd_client, store.ctx.keys.claim(task_id)).lease_id)
        wait_claim_gone(store, etcd_client, task_id)
    assert claim(other, "superseded", principal="w3", epoch=2).claim_generation > 0
    clock.advance(45)  # t=95: limited reaches its end; stalled has not moved for 45 s
    # quiet moves now, so that at the batch its marker is unchanged and recent.
    store.renewals.renew(fences["quiet"], principal="w1", progress="q")

    batch = [
        Renewal(limited),
        Renewal(fences["stalled"]),
        Renewal(fences["moving"], progress="step-2"),
        Renewal(fences["checkpoint"], progress="step-1", checkpoint=b"halfway"),
        Renewal(fences["quiet"], progress="q"),
        Renewal(fences["cancelled"]),
        Renewal(fences["superseded"]),
        Renewal(old_epoch),
        Renewal(foreign),
        Renewal(fences["lost"]),
        Renewal(Fence("no-such-task", "a1", 5, 2, 0)),
        Renewal(fences["moving"], progress="step-3"),  # the same task twice in one call
    ]
    answers = [_answer(a) for a in store.renewals.renew_many(batch, principal="w1")]
    assert answers == [
        (Outcome.RENEW_LIMIT, FenceReason.NONE),
        (Outcome.STALLED, FenceReason.NONE),
        (Outcome.OK, FenceReason.NONE),
        (Outcome.OK, FenceReason.NONE),
        (Outcome.OK, FenceReason.NONE),
        (Outcome.CANCELLED, FenceReason.NONE),
        (Outcome.FENCED, FenceReason.SUPERSEDED),
        (Outcome.FENCED, FenceReason.EPOCH_CHANGED),
        PermissionDenied,
        (Outcome.FENCED, FenceReason.LEASE_EXPIRED),
        # No claim of that generation in the claimed index: refused from memory, no read.
        (Outcome.FENCED, FenceReason.NONE),
        InvalidArgument,
    ]
    # A lone Renew of each (but the duplicate) answers the same, now and through the other
    # replica (which remembers none of these views).
    for renewal, expected in zip(batch[:-1], answers[:-1], strict=True):
        assert _lone(store, renewal) == expected, renewal.fence.task_id
        assert _lone(other, renewal) == expected, renewal.fence.task_id
    # The batch wrote what a lone Renew writes: the moved marker, the checkpoint.
    moving = decode(ClaimRecord, etcd_client.get(store.ctx.keys.claim("moving"))[0])
    assert (moving.progress, moving.progress_at) == ("step-2", clock.now())
    cp = fences["checkpoint"]
    attempt_value, _ = etcd_client.get(store.ctx.keys.attempt("checkpoint", cp.attempt_id))
    assert decode(AttemptRecord, attempt_value).checkpoint == b"halfway"


def test_a_batch_never_keeps_alive_the_lease_of_a_claim_that_is_gone(
    store: Store, etcd_client: Any
) -> None:
    """A released claim's lease stays alive in the replica's pool (store/etcd/leases.py); a batch
    naming that claim answers FENCED RELEASED and leaves the lease to run down."""
    create(store, "gone")
    create(store, "held")
    gone = claim(store, "gone", ttl=30)
    held = claim(store, "held", ttl=30)
    lease_id = raw(etcd_client, store.ctx.keys.claim("gone")).lease_id
    assert store.acceptance.release(gone, principal="w1", reason="done").accepted
    eventually(lambda: etcd_client.get_lease_info(lease_id).TTL < 29, timeout=5)
    before = etcd_client.get_lease_info(lease_id).TTL
    answers = store.renewals.renew_many([Renewal(gone), Renewal(held)], principal="w1")
    assert [_answer(a) for a in answers] == [
        (Outcome.FENCED, FenceReason.RELEASED),
        (Outcome.OK, FenceReason.NONE),
    ]
    assert 0 < etcd_client.get_lease_info(lease_id).TTL <= before  # not refreshed


def test_a_batch_of_200_claims_costs_five_round_trips_and_no_reads_once_known(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims granted here are renewed on their remembered views: two nested txns for the
    fences, one keepalive stream, two nested txns for the after-keepalive compares."""
    fences = []
    for n in range(200):
        create(store, f"t{n}")
        fences.append(claim(store, f"t{n}"))
    calls: dict[str, int] = {"txn": 0, "keepalive": 0, "read": 0}
    kv = store.ctx.kv
    monkeypatch.setattr(kv, "_send_txn", _counting(calls, "txn", kv._send_txn))
    monkeypatch.setattr(kv, "keepalive_many", _counting(calls, "keepalive", kv.keepalive_many))
    monkeypatch.setattr(kv, "read", _counting(calls, "read", kv.read))
    answers = store.renewals.renew_many([Renewal(f, progress="p") for f in fences], principal="w1")
    assert {_answer(a) for a in answers} == {(Outcome.OK, FenceReason.NONE)}
    assert calls == {"txn": 4, "keepalive": 1, "read": 0}


def test_a_view_another_replica_moved_is_read_again_and_the_renewal_lands(
    make_store: StoreFactory,
    etcd_client: Any,
    monkeypatch: pytest.MonkeyPatch,
    clock: ManualClock,
) -> None:
    store, other = make_store(), make_store()
    for task_id in ("a", "b"):
        create(store, task_id)
    a, b = claim(store, "a"), claim(store, "b")
    clock.advance(PROGRESS_WRITE_INTERVAL)  # each marker below is written
    store.renewals.renew_many([Renewal(a, "1"), Renewal(b, "1")], principal="w1")
    clock.advance(PROGRESS_WRITE_INTERVAL)
    other.renewals.renew(b, principal="w1", progress="2")  # moves b's claim record
    clock.advance(PROGRESS_WRITE_INTERVAL)
    reads: list[int] = []
    read = store.ctx.kv.read

    def counted(*ops: Any) -> Any:
        reads.append(len(ops))
        return read(*ops)

    monkeypatch.setattr(store.ctx.kv, "read", counted)
    answers = store.renewals.renew_many([Renewal(a, "3"), Renewal(b, "3")], principal="w1")
    assert [_answer(x) for x in answers] == [(Outcome.OK, FenceReason.NONE)] * 2
    assert reads == [4]  # b alone: task, attempt, claim, epoch
    value, _ = etcd_client.get(store.ctx.keys.claim("b"))
    assert decode(ClaimRecord, value).progress == "3"


def test_more_than_the_bound_is_refused_whole(store: Store) -> None:
    fence = Fence("t", "a", 1, 1, 0)
    with pytest.raises(InvalidArgument, match="at most 1000 renewals per call, got 1001"):
        store.renewals.renew_many([Renewal(fence)] * 1001, principal="w1")


def _counting(calls: dict[str, int], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return fn(*args, **kwargs)

    return counted


def test_a_checkpoint_on_a_claim_granted_here_lands_on_its_first_txn_without_a_read(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The renewal pins the attempt key as the claim left it: absent at schema 3 (the task
    # record holds the attempt). Pinned at the claim's revision instead, every first
    # checkpoint failed its txn and was read and sent again.
    create(store, "t")
    fence = claim(store, "t")
    calls: dict[str, int] = {"txn": 0, "keepalive": 0, "read": 0}
    kv = store.ctx.kv
    monkeypatch.setattr(kv, "_send_txn", _counting(calls, "txn", kv._send_txn))
    monkeypatch.setattr(kv, "keepalive_many", _counting(calls, "keepalive", kv.keepalive_many))
    monkeypatch.setattr(kv, "read", _counting(calls, "read", kv.read))
    (answer,) = store.renewals.renew_many([Renewal(fence, "p", b"step 1")], principal="w1")
    assert _answer(answer) == (Outcome.OK, FenceReason.NONE)
    assert calls == {"txn": 2, "keepalive": 1, "read": 0}
