"""Claim views: what an acceptance point decides on, read in one place and remembered in one
kind of cache.

A view is a claim's task, attempt, live claim and the epoch, read at one revision
(``read_view`` for one fence, ``aread_views`` for a batch: the same reads in the same order;
each as a coroutine over a ``StepIO``, store/etcd/step_io.py).
``diagnose`` names why a fence's compares failed, from a fresh read; every acceptance point and
Renew answer a lost txn with it.

Two caches remember views by fence (``fence_key``), both a ``FenceCache``:

- ``HeldClaims``: the records this replica's claim txns wrote, so the holder's commit can skip
  its read. A commit reads the task, the attempt, the live claim, the epoch and the task's
  result keys, decides, then writes behind compares. When this replica granted the claim, it
  knows what the claim txn wrote: the commit decides on those records and its txn additionally
  compares the task and attempt keys' mod_revision with the claim generation (the claim txn's
  revision). The write therefore lands only if those records are still exactly what was
  remembered; if anything moved (a renewal elsewhere cannot move them, a cancel, an input change
  or a takeover does), the txn fails and the commit takes the ordinary path: read, decide, write
  (and, if that txn fails, read once more to name why).
- the renewals' views (``attempts/renewals.py``), without task inputs, kept while a claim is
  renewed.

A remembered view can only save a read, never make a stale decision stick: a refusal decided on
it is not final either, a read decides it again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from coordinator.domain.decisions import Fence, FenceView, Verdict, check_fence
from coordinator.domain.records import ResultRecord, decode, with_changes
from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import NotFound
from coordinator.store.context import (
    StoreContext,
    attempt_of,
    claim_from_kv,
    epoch_from_kv,
    task_from_kv,
)
from coordinator.store.etcd.ops import RequestOp, TxnResult, get, get_prefix
from coordinator.store.etcd.step_io import StepIO, run_now

CAPACITY = 4096
"""Views ``HeldClaims`` remembers at most (the oldest go first)."""
INPUT_BUDGET = 16 << 20
"""Task input bytes held in ``HeldClaims``' views at most (inputs may be 256 KiB each)."""

MOVED = Verdict(Outcome.FENCED, FenceReason.TASK_MOVED, "the task moved on during the call")
"""Every acceptance point's answer when its compares failed yet the fresh read finds the fence
current: something changed and changed back between the two."""

V = TypeVar("V")


def fence_key(fence: Fence) -> tuple[str, str, int]:
    """What a remembered view is filed under: one claim of one attempt."""
    return fence.task_id, fence.attempt_id, fence.claim_generation


class FenceCache(Generic[V]):
    """Views by fence, the least recently remembered dropped first once there are more than
    ``capacity`` or their ``weight`` passes ``budget``."""

    def __init__(
        self, capacity: int, *, weight: Callable[[V], int] = lambda _: 0, budget: int = 0
    ) -> None:
        self._capacity = capacity
        self._weight = weight
        self._budget = budget
        self._lock = threading.Lock()
        self._views: OrderedDict[tuple[str, str, int], V] = OrderedDict()
        self._weighed = 0

    def remember(self, fence: Fence, view: V) -> None:
        """``view`` is what ``fence``'s claim is now known to be."""
        key = fence_key(fence)
        with self._lock:
            old = self._views.pop(key, None)
            if old is not None:
                self._weighed -= self._weight(old)
            self._views[key] = view
            self._weighed += self._weight(view)
            # A budget of 0 weighs nothing: only the count bounds the cache.
            while len(self._views) > self._capacity or self._weighed > self._budget > 0:
                _, oldest = self._views.popitem(last=False)
                self._weighed -= self._weight(oldest)

    def peek(self, fence: Fence) -> V | None:
        """The remembered view of ``fence``, kept."""
        with self._lock:
            return self._views.get(fence_key(fence))

    def take(self, fence: Fence) -> V | None:
        """The remembered view of ``fence``, forgotten (for a commit: a second use would be a
        retry, and a retry must read what happened)."""
        with self._lock:
            view = self._views.pop(fence_key(fence), None)
            if view is not None:
                self._weighed -= self._weight(view)
            return view

    def __len__(self) -> int:
        with self._lock:
            return len(self._views)


class HeldClaims(FenceCache[FenceView]):
    """FenceViews of claims granted here, by fence, until their commit or release."""

    def __init__(self, capacity: int = CAPACITY, input_budget: int = INPUT_BUDGET) -> None:
        super().__init__(capacity, weight=lambda view: len(view.task.input), budget=input_budget)


@dataclass(frozen=True)
class ReadView:
    """A fence's view as read, and its attempt key's mod_revision (a renewal's txn pins it;
    the claim key's is in the view; 0: the attempt has no key, its task record holds it)."""

    view: FenceView
    attempt_revision: int


async def aread_views(
    io: StepIO, ctx: StoreContext, fences: Sequence[Fence], *, inputs: bool = True
) -> list[ReadView | NotFound]:
    """Task, attempt, live claim and epoch of each fence, all at one revision; NotFound for a
    fence whose task or attempt does not exist. ``inputs=False`` leaves task inputs out (what a
    renewal remembers)."""
    _, found = await _read(io, ctx, fences, inputs=inputs)
    return found


def read_view(ctx: StoreContext, fence: Fence, *, with_result: bool = False) -> FenceView:
    """``aread_view``, run on this thread."""
    return run_now(aread_view(ctx.io, ctx, fence, with_result=with_result))


async def aread_view(
    io: StepIO, ctx: StoreContext, fence: Fence, *, with_result: bool = False
) -> FenceView:
    """One fence's view (NotFound as ``aread_views``), and for a commit the canonical result of
    the attempt's task revision."""
    keys = ctx.keys
    # Which revisions have a result, in the same snapshot: the (large) value is fetched only in
    # the rare case that this attempt's revision has one (a retried commit).
    more = [get_prefix(keys.results_of(fence.task_id), keys_only=True)] if with_result else []
    snap, [found] = await _read(io, ctx, [fence], inputs=True, more=more)
    if isinstance(found, NotFound):
        raise found
    if not with_result:
        return found.view
    result_key = keys.result(fence.task_id, found.view.attempt.revision)
    after_epoch = 4  # one fence's three gets, then the epoch, then the result keys
    if not any(kv.key == result_key for kv in snap.range_kvs(after_epoch)):
        return found.view
    result_kv = (await io.read(get(result_key, revision=snap.revision))).range_one(0)
    result = decode(ResultRecord, result_kv.value) if result_kv is not None else None
    return with_changes(found.view, result=result)


def diagnose(ctx: StoreContext, fence: Fence) -> Verdict:
    """``adiagnose``, run on this thread."""
    return run_now(adiagnose(ctx.io, ctx, fence))


async def adiagnose(io: StepIO, ctx: StoreContext, fence: Fence) -> Verdict:
    """Why the fence compares failed, from a fresh read."""
    verdict = check_fence(await aread_view(io, ctx, fence), fence, now=ctx.clock.now())
    # The compares failed yet everything reads as current: a race.
    return MOVED if verdict.accepted else verdict


async def _read(
    io: StepIO,
    ctx: StoreContext,
    fences: Sequence[Fence],
    *,
    inputs: bool,
    more: Sequence[RequestOp] = (),
) -> tuple[TxnResult, list[ReadView | NotFound]]:
    """One read: three gets per fence, the epoch, then ``more`` (at index ``3 * len + 1``)."""
    keys = ctx.keys
    ops: list[RequestOp] = []
    for fence in fences:
        ops += [
            get(keys.task(fence.task_id)),
            get(keys.attempt(fence.task_id, fence.attempt_id)),
            get(keys.claim(fence.task_id)),
        ]
    ops.append(get(keys.epoch))
    snap = await io.read(*ops, *more)
    epoch = epoch_from_kv(snap.range_one(3 * len(fences)))
    out: list[ReadView | NotFound] = []
    for n, fence in enumerate(fences):
        task_kv, attempt_kv, claim_kv = (snap.range_one(3 * n + k) for k in range(3))
        task = task_from_kv(task_kv) if task_kv is not None else None
        attempt = attempt_of(task, fence.attempt_id, attempt_kv) if task is not None else None
        if task is None:
            out.append(NotFound(f"task {fence.task_id!r} does not exist"))
        elif attempt is None:
            out.append(
                NotFound(f"attempt {fence.attempt_id!r} of task {fence.task_id!r} does not exist")
            )
        else:
            view = FenceView(
                task=task if inputs else with_changes(task, input=b""),
                attempt=attempt,
                claim=claim_from_kv(claim_kv) if claim_kv is not None else None,
                epoch=epoch,
            )
            out.append(ReadView(view, attempt.mod_revision))
    return snap, out
