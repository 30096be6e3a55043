"""Fence-check coverage: did the txn an acceptance point just ran compare epoch and generation?

Each acceptance point calls ``observe`` with the compares of the txn that accepted the
operation. The answer is read off those compares (the very objects sent to etcd), so if a point
ever builds its txn without ``fence_compares`` - or drops one of them - its validated count
falls behind its accepted count and the coverage drops below 100% (coordinator.metrics).

What "validated" means:

* a held claim (renew, authorize, prepare, record, commit, release): the txn compares the claim
  key's create_revision and the task key's mod_revision to the fence's generation, and the
  epoch key to the fence's epoch;
* a new claim (``generation=0``): the txn compares the epoch, that no claim key exists (no live
  generation) and the task key's mod_revision to what the claim read (no generation issued in
  between); its own revision becomes the new generation.
"""

from __future__ import annotations

from collections.abc import Iterable

from etcd3 import etcdrpc

from coordinator.domain.decisions import Fence
from coordinator.domain.keys import Keyspace
from coordinator.metrics import AcceptancePoint
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import Compare


def observe(
    point: AcceptancePoint,
    compares: Iterable[Compare],
    ctx: StoreContext,
    *,
    task_id: str,
    epoch: int,
    generation: int,
) -> None:
    """Count one accepted operation at ``point``, validated if ``compares`` pin the fence."""
    ctx.metrics.count_acceptance(
        point,
        validated=fence_validated(
            list(compares), ctx.keys, task_id=task_id, epoch=epoch, generation=generation
        ),
    )


def observe_fence(
    point: AcceptancePoint, compares: Iterable[Compare], ctx: StoreContext, fence: Fence
) -> None:
    """``observe`` for an acceptance point of a held claim: the fence names what to look for."""
    observe(
        point,
        compares,
        ctx,
        task_id=fence.task_id,
        epoch=fence.scheduler_epoch,
        generation=fence.claim_generation,
    )


def fence_validated(
    compares: list[Compare], keys: Keyspace, *, task_id: str, epoch: int, generation: int
) -> bool:
    """Whether ``compares`` check the epoch and the generation (see the module doc)."""
    epoch_ok = _has(compares, keys.epoch, etcdrpc.Compare.VALUE, str(epoch).encode())
    claim_ok = _has(compares, keys.claim(task_id), etcdrpc.Compare.CREATE, generation)
    if generation:
        task_ok = _has(compares, keys.task(task_id), etcdrpc.Compare.MOD, generation)
    else:
        task_ok = _has(compares, keys.task(task_id), etcdrpc.Compare.MOD, None)
    return epoch_ok and claim_ok and task_ok


def _has(compares: list[Compare], key: str, target: int, expected: object) -> bool:
    """An EQUAL compare of ``key``'s ``target`` against ``expected`` (None: any value > 0)."""
    raw = key.encode()
    for c in compares:
        if c.key != raw or c.target != target or c.result != etcdrpc.Compare.EQUAL or c.range_end:
            continue
        if target == etcdrpc.Compare.VALUE:
            actual: object = c.value
        elif target == etcdrpc.Compare.CREATE:
            actual = c.create_revision
        else:
            actual = c.mod_revision
        if (expected is None and isinstance(actual, int) and actual > 0) or actual == expected:
            return True
    return False
