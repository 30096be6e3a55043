"""Owned reconciliation through the worker SDK: the reconcile fields on EffectInfo, RECONCILING
as a ClaimRefused, and ``WorkerClient.resolve_effect`` by the owner."""

from __future__ import annotations

from datetime import timedelta

from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import (
    Claim,
    ClaimRefused,
    DownstreamResult,
    DownstreamUncertain,
    EffectState,
    EffectStatus,
    Outcome,
)
from coordinator.store import TaskSpec
from tests.sdk.support import served

TTL = timedelta(seconds=30)


class LostAnswers:
    """A downstream whose sends and lookups never answer (nobody can tell what happened)."""

    def __init__(self) -> None:
        self.sends = 0

    def execute(self, idempotency_key: str, generation: int, payload: bytes) -> DownstreamResult:
        self.sends += 1
        raise DownstreamUncertain("the response was lost")

    def lookup(self, idempotency_key: str, generation: int) -> DownstreamResult | None:
        raise DownstreamUncertain("the lookup timed out")


def test_uncertain_then_one_takeover_then_reconciling_until_the_owner_resolves(
    etcd: EtcdProcess, prefix: str
) -> None:
    down = LostAnswers()
    with served(etcd.endpoint, prefix) as coord:
        coord.store.tasks.create(TaskSpec(task_id="t1", queue="q", input=b"in"), by="pm")
        with coord.client("A") as a, coord.client("B") as b, coord.client("C") as c:
            job_a = a.claim("t1", ttl=TTL)
            assert isinstance(job_a, Claim)
            lost = job_a.effect("notify", "email", b"hello", down)
            assert lost.status is EffectStatus.UNCERTAIN
            info = a.get_effect(lost.effect_id)
            assert (info.state, info.reconcile_owner, info.reconcile_open) == (
                EffectState.UNKNOWN,
                "A",
                True,
            )
            assert info.reconcile_opened_at is not None and info.reconcile_deadline is not None
            assert info.reconcile_deadline - info.reconcile_opened_at == timedelta(minutes=10)
            job_a.release()

            # One takeover may reconcile; its lookup fails too, and it gives up.
            job_b = b.claim("t1", ttl=TTL)
            assert isinstance(job_b, Claim)
            again = job_b.effect("notify", "email", b"hello", down)
            assert again.status is EffectStatus.UNCERTAIN and down.sends == 1
            job_b.release()

            # Nobody else is handed the task now.
            refused = c.claim("t1", ttl=TTL)
            assert isinstance(refused, ClaimRefused)
            assert refused.outcome is Outcome.RECONCILING and "'A'" in refused.message
            assert isinstance(c.claim_next("q", ttl=TTL), ClaimRefused)

            resolved = a.resolve_effect(
                lost.effect_id, EffectState.COMMITTED, external_ref="msg-1", reason="mail log"
            )
            assert (resolved.state, resolved.external_ref, resolved.reconcile_open) == (
                EffectState.COMMITTED,
                "msg-1",
                False,
            )
            job_c = c.claim_next("q", ttl=TTL)
            assert isinstance(job_c, Claim)
            skipped = job_c.effect("notify", "email", b"hello", down)
            assert (skipped.status, skipped.external_ref) == (EffectStatus.SKIPPED, "msg-1")
            assert job_c.commit(b"done").committed
    assert down.sends == 1


def test_a_named_reconcile_principal_owns_it_and_no_claim_takes_it_over(
    etcd: EtcdProcess, prefix: str
) -> None:
    down = LostAnswers()
    with served(etcd.endpoint, prefix) as coord:
        coord.store.tasks.create(TaskSpec(task_id="t1", queue="q", input=b"in"), by="pm")
        with coord.client("A") as a, coord.client("B") as b:
            job_a = a.claim("t1", ttl=TTL)
            assert isinstance(job_a, Claim)
            lost = job_a.effect("notify", "email", b"hello", down, reconcile_principal="mail-ops")
            assert lost.status is EffectStatus.UNCERTAIN
            info = a.get_effect(lost.effect_id)
            assert (info.reconcile_owner, info.reconcile_open) == ("mail-ops", True)
            job_a.release()
            refused = b.claim("t1", ttl=TTL)  # a named owner allows no takeover
            assert isinstance(refused, ClaimRefused)
            assert refused.outcome is Outcome.RECONCILING and "'mail-ops'" in refused.message
            assert down.sends == 1
