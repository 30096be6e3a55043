"""The renewal screen: fences that name no claim are refused FENCED from the claimed index with
no etcd request, while claims of this replica, of another replica, and claims that just ended
are answered exactly as before."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from coordinator.domain.decisions import Fence
from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import CoordinatorError
from coordinator.store import Renewal, RenewAnswer, Store
from tests.helpers import eventually
from tests.store.support import StoreFactory, claim, commit, create


def _answer(answer: RenewAnswer) -> tuple[Outcome, FenceReason]:
    assert not isinstance(answer, CoordinatorError), answer
    return answer.verdict.outcome, answer.verdict.reason


def _indexed(store: Store) -> None:
    """Wait until ``store``'s claimed index has seen the one claim of the test."""
    eventually(lambda: store.claimed.counts().get("default") == 1)


@pytest.fixture
def etcd_requests(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every request ``store`` sends etcd from now on from the test's own thread (txns, reads,
    keepalives): the store's background loops (promoter, sweepers, pruner) read etcd on their
    own threads whenever they wake, which says nothing of what a renewal costs."""
    sent: list[str] = []
    kv = store.ctx.kv
    caller = threading.get_ident()

    def counting(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == caller:
                sent.append(name)
            return fn(*args, **kwargs)

        return counted

    for name in ("read", "txn", "txn_many", "keepalive_many", "range_page"):
        monkeypatch.setattr(kv, name, counting(name, getattr(kv, name)))
    yield sent


def test_a_thousand_made_up_fences_are_refused_with_no_etcd_request(
    store: Store, etcd_requests: list[str]
) -> None:
    create(store, "real")
    real = claim(store, "real")
    _indexed(store)
    etcd_requests.clear()
    made_up = [
        Renewal(Fence(f"made-up-{n}", f"a{n}", 1 + n % real.claim_generation, 1, 0))
        for n in range(1000)
    ]
    answers = store.renewals.renew_many(made_up, principal="flooder")
    assert {_answer(a) for a in answers} == {(Outcome.FENCED, FenceReason.NONE)}
    assert etcd_requests == []
    assert "no live claim" in answers[0].verdict.message  # type: ignore[union-attr]


def test_a_generation_beyond_the_stores_revision_costs_one_read_per_batch(
    store: Store, etcd_requests: list[str]
) -> None:
    create(store, "real")
    real = claim(store, "real")
    _indexed(store)
    etcd_requests.clear()
    future = [
        Renewal(Fence(f"future-{n}", "a", real.claim_generation + 10**9 + n, 1, 0))
        for n in range(100)
    ]
    answers = store.renewals.renew_many(future, principal="flooder")
    assert {_answer(a) for a in answers} == {(Outcome.FENCED, FenceReason.NONE)}
    assert etcd_requests == ["read", "txn"]  # one read (a txn): etcd's revision


def test_a_claim_granted_by_another_replica_still_renews_here(
    make_store: StoreFactory,
) -> None:
    here, other = make_store(), make_store()
    create(other, "t1")
    fence = claim(other, "t1")  # here remembers nothing of it
    _indexed(here)
    [answer] = here.renewals.renew_many([Renewal(fence, progress="p")], principal="w1")
    assert _answer(answer) == (Outcome.OK, FenceReason.NONE)


def test_a_claim_that_just_ended_elsewhere_keeps_its_exact_reason(
    make_store: StoreFactory,
) -> None:
    """A renewal racing its own commit must read ALREADY_COMMITTED (the SDK then knows the
    claim ended by its own hand), not a bare FENCED from memory."""
    here, other = make_store(), make_store()
    create(other, "t1")
    fence = claim(other, "t1")
    _indexed(here)
    assert commit(other, fence).verdict.outcome is Outcome.COMMITTED
    eventually(lambda: not here.claimed.counts())  # the end is in here's index
    [answer] = here.renewals.renew_many([Renewal(fence)], principal="w1")
    assert _answer(answer) == (Outcome.FENCED, FenceReason.ALREADY_COMMITTED)
