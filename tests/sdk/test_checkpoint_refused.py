"""A checkpoint the server did not keep (``RenewResponse.checkpoint_refused``: the worker's
write budget is spent) stays pending in either SDK and goes again with the next renewal until
one keeps it; the claim counts the refusals, and the next attempt starts from the checkpoint."""

from __future__ import annotations

from datetime import timedelta

from coordinator.domain.roles import Role
from coordinator.domain.write_budget import BudgetPolicy
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import ClaimRefused
from tests.helpers import eventually
from tests.sdk.both import Sdk, Sent
from tests.sdk.support import served_with_task

# A worker's budget of 2,000 bytes refilling 200 bytes/s: a staged result of 500 bytes (1,692
# charged: stored base64, with its key) spends most of it, and a 900-byte checkpoint fits again
# only 3 s later, several 1 s renewals on.
BUDGETS = {Role.WORKER: BudgetPolicy(rate=200.0, window=10.0)}
CHECKPOINT = b"c" * 900
TTL = timedelta(seconds=3)


def test_a_refused_checkpoint_is_sent_again_until_it_is_kept(
    sdk: Sdk, etcd: EtcdProcess, prefix: str
) -> None:
    with served_with_task(etcd.endpoint, prefix, write_budgets=BUDGETS) as coordinator:
        sent = Sent()
        worker = sdk.client(coordinator.target, "worker-a", sent=sent)
        claim = worker.claim("t1", ttl=TTL)
        assert not isinstance(claim, ClaimRefused), claim
        with claim:
            assert claim.stage(b"r" * 500).staged  # most of the budget
            claim.checkpoint(CHECKPOINT)
            eventually(lambda: claim.checkpoint_refusals >= 1, message="no refusal")
            assert "write budget of 'worker-a'" in claim.last_checkpoint_refusal
            assert claim.checkpoint_pending
            eventually(lambda: not claim.checkpoint_pending, timeout=30, message="never kept")
            carried = [r.checkpoint for r in sent.renewals() if r.HasField("checkpoint")]
            # Every refused renewal carried it, and so did the one that kept it.
            assert carried == [CHECKPOINT] * (claim.checkpoint_refusals + 1)
            assert not claim.is_lost()
            claim.release("the next attempt resumes")
        again = worker.claim("t1", ttl=TTL)
        assert not isinstance(again, ClaimRefused), again
        with again:
            assert again.previous_checkpoint == CHECKPOINT
            assert (again.checkpoint_refusals, again.last_checkpoint_refusal) == (0, "")
            again.release("done")
