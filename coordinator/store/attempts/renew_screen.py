"""The screen in front of renewals: fences that name no claim are answered from memory.

A fence's claim is decided by a read of its task, attempt and claim keys. A made-up fence costs
that read too, so a flood of them (50 callers x RenewMany of 1,000) kept etcd and the replica
busy until legitimate claims expired. The claimed index every replica follows
(store/indexes/claimed.py) screens each fence first (domain/fence_screen.py): NO_CLAIM is answered
FENCED without a read; a generation the index has not seen yet costs one read of etcd's
revision for the whole batch (a generation beyond it was never a claim's); the rest are read as
before. Fences this replica remembers (claims it granted or renewed) skip the screen: their
reads are already saved, and their refusals keep their exact reasons.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from coordinator.domain.decisions import Fence, Verdict
from coordinator.domain.fence_screen import Screen, no_claim_message
from coordinator.domain.states import FenceReason, Outcome
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import get
from coordinator.store.etcd.step_io import StepIO
from coordinator.store.indexes.claimed import ClaimedIndex
from coordinator.store.types import RenewResult


async def screen_fences(
    io: StepIO,
    ctx: StoreContext,
    claimed: ClaimedIndex,
    fences: Mapping[int, Fence],
    *,
    skip: Collection[int] = (),
) -> dict[int, RenewResult]:
    """The FENCED answer of each of ``fences`` (by position) that names no live claim; those
    in ``skip`` and those that may be live are left out (to be read)."""
    refused: dict[int, RenewResult] = {}
    unseen: list[int] = []
    for i, fence in fences.items():
        if i in skip:
            continue
        found = claimed.screen(fence.task_id, fence.claim_generation)
        if found is Screen.NO_CLAIM:
            refused[i] = _no_claim(fence)
        elif found is Screen.UNSEEN:
            unseen.append(i)
    if unseen:
        revision = (await io.read(get(ctx.keys.epoch))).revision
        refused.update(
            (i, _no_claim(fences[i])) for i in unseen if fences[i].claim_generation > revision
        )
    if refused:
        ctx.metrics.count_screened_renewals(len(refused))
    return refused


def _no_claim(fence: Fence) -> RenewResult:
    message = no_claim_message(fence.task_id, fence.claim_generation)
    return RenewResult(Verdict(Outcome.FENCED, FenceReason.NONE, message))
