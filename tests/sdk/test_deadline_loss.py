"""Both SDKs against a real coordinator whose clock the test moves: once the task's
schedule_to_close has passed, stage and commit are answered FENCED with reason
DEADLINE_EXCEEDED, and the claim is lost once, with that reason, named by the call that saw it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.keys import Keyspace
from coordinator.domain.states import FenceReason, Outcome
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import ClaimLost, ClaimRefused, LossSource, LostReason, WorkerClient
from coordinator.server import build_server
from coordinator.store import EtcdKV, Store
from tests.conftest import GRPC_OPTIONS
from tests.sdk.both import Sdk
from tests.store.support import LIMITS, NO_SCAN

SCHEDULE_TO_CLOSE = timedelta(seconds=60)


@pytest.fixture
def clock() -> ManualClock:
    """The coordinator's clock."""
    return ManualClock()


@pytest.fixture
def target(etcd: EtcdProcess, prefix: str, clock: ManualClock) -> Iterator[str]:
    """A coordinator on ``clock`` (no background pass) with task "t1", 60 s to close."""
    kv = EtcdKV.connect([etcd.endpoint])
    store = Store.open(kv, keys=Keyspace(prefix), limits=LIMITS, clock=clock, scan_interval=NO_SCAN)
    store.start(reclaim=False)
    server, port = build_server(store, listen="127.0.0.1:0")
    try:
        address = f"127.0.0.1:{port}"
        with WorkerClient(address, principal="pm", channel_options=GRPC_OPTIONS) as producer:
            producer.create_task("t1", input=b"x", schedule_to_close=SCHEDULE_TO_CLOSE)
        yield address
    finally:
        server.stop(0)
        store.close()
        kv.close()


def test_a_stage_and_a_commit_past_the_deadline_lose_the_claim_deadline_exceeded(
    sdk: Sdk, target: str, clock: ManualClock
) -> None:
    seen: list[LostReason] = []
    claim = sdk.client(target, "worker-a").claim(
        "t1", ttl=timedelta(seconds=30), on_lost=seen.append
    )  # never entered: no keepalive, so the stage is the first call to see the deadline
    assert not isinstance(claim, ClaimRefused), claim
    assert claim.stage(b"draft").outcome is Outcome.OK
    clock.advance(SCHEDULE_TO_CLOSE.total_seconds())

    staged = claim.stage(b"late draft")
    committed = claim.commit(b"late")

    fenced = (Outcome.FENCED, FenceReason.DEADLINE_EXCEEDED)
    assert ((staged.outcome, staged.reason), staged.staged) == (fenced, False)
    assert (committed.outcome, committed.reason, committed.committed) == (*fenced, False)
    assert [(r.outcome, r.reason, r.source) for r in seen] == [(*fenced, LossSource.STAGE)]
    assert claim.is_lost() and claim.lost_reason == seen[0]
    assert "schedule_to_close deadline passed" in str(seen[0])
    with pytest.raises(ClaimLost) as lost:
        claim.check()  # what a handler calls before its next step
    assert lost.value.reason == seen[0] and "FENCED/DEADLINE_EXCEEDED (stage)" in str(lost.value)
