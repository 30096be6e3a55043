"""One read path and one cache for claim views (store/attempts/views.py): a batch read answers
each fence exactly as a lone read does, and both caches file views by the same key."""

from __future__ import annotations

from dataclasses import replace

from coordinator.domain.attempt_in_record import recorded_attempt
from coordinator.domain.decisions import Fence
from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import NotFound
from coordinator.store import Store
from coordinator.store.attempts.views import (
    FenceCache,
    ReadView,
    aread_views,
    diagnose,
    read_view,
)
from coordinator.store.etcd.step_io import run_now
from tests.store.support import claim, create


def test_a_batch_read_answers_each_fence_as_a_lone_read_does(store: Store) -> None:
    for name in ("t1", "t2"):
        create(store, name, data=b"input of " + name.encode())
    fences = [claim(store, "t1"), claim(store, "t2")]
    ghost = replace(fences[0], task_id="ghost")
    no_attempt = replace(fences[1], attempt_id="a-none")
    *found, missing_task, missing_attempt = run_now(
        aread_views(store.ctx.io, store.ctx, [*fences, ghost, no_attempt], inputs=True)
    )
    assert [r.view for r in found if isinstance(r, ReadView)] == [
        read_view(store.ctx, f) for f in fences
    ]
    assert str(missing_task) == "task 'ghost' does not exist"
    assert str(missing_attempt) == "attempt 'a-none' of task 't2' does not exist"
    assert isinstance(missing_task, NotFound) and isinstance(missing_attempt, NotFound)
    # What the renewals remember: the same view without the input.
    [light] = run_now(aread_views(store.ctx.io, store.ctx, fences[:1], inputs=False))
    assert isinstance(light, ReadView) and isinstance(found[0], ReadView)
    assert light.view == replace(found[0].view, task=replace(found[0].view.task, input=b""))
    # The attempt has no key: the task record holds it (schema 3), and a renewal pins its absence.
    assert light.attempt_revision == found[0].attempt_revision == 0
    assert light.view.attempt == recorded_attempt(light.view.task)


def test_diagnose_names_a_superseded_fence_and_a_race(store: Store) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    # Everything reads as current, yet the caller's compares failed: something moved and back.
    assert (diagnose(store.ctx, fence).outcome, diagnose(store.ctx, fence).reason) == (
        Outcome.FENCED,
        FenceReason.TASK_MOVED,
    )
    stale = replace(fence, claim_generation=fence.claim_generation - 1)
    verdict = diagnose(store.ctx, stale)
    assert (verdict.outcome, verdict.reason) == (Outcome.FENCED, FenceReason.SUPERSEDED)


def test_remembering_a_fence_again_replaces_its_view_and_its_weight() -> None:
    cache: FenceCache[bytes] = FenceCache(10, weight=len, budget=5)
    fence = Fence("t1", "a1", 7, 1, 0)
    cache.remember(fence, b"abcd")
    cache.remember(fence, b"abcd")  # counted once, so it still fits the budget of 5
    assert len(cache) == 1 and cache.peek(fence) == b"abcd"
    cache.remember(Fence("t2", "a1", 8, 1, 0), b"x")
    assert len(cache) == 2
    assert cache.take(fence) == b"abcd" and cache.take(fence) is None and len(cache) == 1


def test_both_caches_file_a_view_under_the_same_fence_key(store: Store) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    assert store.renewals.renew(fence, principal="w1", progress="p").verdict.accepted
    # The epoch and the cancel generation are not part of the key: one claim, one entry.
    same = Fence(fence.task_id, fence.attempt_id, fence.claim_generation, 99, 99)
    assert store.acceptance._held.peek(same) is not None
    assert store.renewals._views.peek(same) is not None
    other = replace(fence, claim_generation=fence.claim_generation + 1)
    assert store.acceptance._held.peek(other) is None and store.renewals._views.peek(other) is None
