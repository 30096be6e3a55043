"""THE fence: the etcd compares every acceptance point puts in front of its writes.

One function builds them, and renew, authorize, release and commit all call it, so no write path
can reach a canonical result without them. Together with the pre-check in
``coordinator.domain.decisions.check_fence`` (which names the reason when they fail):

* the claim key exists with ``create_revision == claim_generation`` - the lease of *this* claim is
  alive (an expired lease deletes the key; a re-claim recreates it at a higher revision);
* the task key's ``mod_revision == claim_generation`` - nothing wrote the task since the claim
  (cancel, input change, reclaim and commit all do), which also pins cancel_generation and the
  input digest the pre-check saw;
* ``{prefix}/epoch`` equals the caller's scheduler epoch.
"""

from __future__ import annotations

from coordinator.domain.decisions import Fence
from coordinator.domain.keys import Keyspace
from coordinator.store.etcd.ops import Compare, create_revision_is, mod_revision_is, value_is


def fence_compares(keys: Keyspace, fence: Fence) -> list[Compare]:
    """The compares that make a write conditional on ``fence`` being current."""
    return [
        create_revision_is(keys.claim(fence.task_id), fence.claim_generation),
        mod_revision_is(keys.task(fence.task_id), fence.claim_generation),
        epoch_is(keys, fence.scheduler_epoch),
    ]


def epoch_is(keys: Keyspace, epoch: int) -> Compare:
    """The scheduler epoch equals ``epoch``."""
    return value_is(keys.epoch, str(epoch).encode())
