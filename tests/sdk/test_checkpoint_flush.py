"""A checkpoint recorded after the last renewal is sent before the attempt ends: a release or
a failure (the pools' give-back at shutdown too) first sends one renewal carrying it, so the
next attempt resumes from it. Before, one recorded in the last TTL/3 of an attempt was lost."""

from __future__ import annotations

from datetime import timedelta

import pytest

from coordinator.domain.validation import MAX_CHECKPOINT_BYTES
from coordinator.errors import InvalidArgument
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import ClaimRefused, Outcome
from tests.sdk.both import Held, Sdk, Sent
from tests.sdk.support import served_with_task

# Long enough that no keepalive renewal runs during the test (the first is due at TTL/3).
TTL = timedelta(seconds=60)
CHECKPOINT = b"step 7 of 9"


@pytest.mark.parametrize("ending", ["release", "fail"])
def test_a_checkpoint_no_renewal_carried_yet_goes_before_the_attempt_ends(
    sdk: Sdk, etcd: EtcdProcess, prefix: str, ending: str
) -> None:
    with served_with_task(etcd.endpoint, prefix) as coordinator:
        sent = Sent()
        worker = sdk.client(coordinator.target, "worker-a", sent=sent)
        claim = worker.claim("t1", ttl=TTL)
        assert not isinstance(claim, ClaimRefused), claim
        with claim:
            claim.checkpoint(CHECKPOINT)
            assert claim.checkpoint_pending
            _end(claim, ending)
            assert not claim.checkpoint_pending
        assert [r.checkpoint for r in sent.renewals()] == [CHECKPOINT]  # one, and only then
        again = worker.claim("t1", ttl=TTL)
        assert not isinstance(again, ClaimRefused), again
        with again:
            assert again.previous_checkpoint == CHECKPOINT
            _end(again, ending)  # nothing pending: no renewal first
        assert len(sent.renewals()) == 1


def test_a_saved_checkpoint_is_stored_at_once_and_a_fenced_one_says_so(
    sdk: Sdk, etcd: EtcdProcess, prefix: str
) -> None:
    """``save_checkpoint`` stores it now (before an expensive step), not with the renewal due
    at TTL/3: a worker that dies right after it loses nothing. On a claim the server fences it
    answers False and the claim is lost; on a lost claim it sends nothing."""
    with served_with_task(etcd.endpoint, prefix) as coordinator:
        sent = Sent()
        worker = sdk.client(coordinator.target, "worker-a", sent=sent)
        claim = worker.claim("t1", ttl=TTL)
        assert not isinstance(claim, ClaimRefused), claim
        assert claim.save_checkpoint(CHECKPOINT) is True
        assert not claim.checkpoint_pending
        assert [r.checkpoint for r in sent.renewals()] == [CHECKPOINT]
        assert worker.get_task("t1").checkpoint_size == len(CHECKPOINT)  # stored, not pending

        coordinator.store.tasks.cancel("t1", by="pm", reason="not needed")
        assert claim.save_checkpoint(b"step 8 of 9") is False
        assert claim.is_lost() and claim.lost_reason is not None
        assert claim.lost_reason.outcome is Outcome.CANCELLED
        assert claim.save_checkpoint(b"step 9 of 9") is False
        assert len(sent.renewals()) == 2  # nothing sent for a claim known lost
        worker.close()


def test_a_checkpoint_or_marker_past_its_bound_is_refused_where_it_is_recorded(
    sdk: Sdk, etcd: EtcdProcess, prefix: str
) -> None:
    """The server refuses a renewal carrying a checkpoint over 64 KiB or a marker over 1,024
    characters (INVALID_ARGUMENT), and the SDK then took the claim for lost although nothing
    fenced it (its worker stopped; the lease ran out and the attempt was counted). Refused
    when recorded instead: the claim and what it had recorded stay as they were."""
    with served_with_task(etcd.endpoint, prefix) as coordinator:
        worker = sdk.client(coordinator.target, "worker-a")
        claim = worker.claim("t1", ttl=TTL)
        assert not isinstance(claim, ClaimRefused), claim
        with claim:
            claim.checkpoint(b"c" * MAX_CHECKPOINT_BYTES)  # at the bound: fine
            with pytest.raises(InvalidArgument, match="checkpoint is 65537 bytes, the limit is"):
                claim.checkpoint(b"c" * (MAX_CHECKPOINT_BYTES + 1))
            with pytest.raises(InvalidArgument, match="progress is 1025 characters"):
                claim.progress("p" * 1025)
            assert claim.release("done").released  # the kept checkpoint went first
            assert not claim.is_lost()
        again = worker.claim("t1", ttl=TTL)
        assert not isinstance(again, ClaimRefused), again
        with again:
            assert again.previous_checkpoint == b"c" * MAX_CHECKPOINT_BYTES
            again.release("done")


def _end(claim: Held, ending: str) -> None:
    if ending == "release":
        assert claim.release("stopping").released
    else:
        assert claim.fail("Flaky").recorded
