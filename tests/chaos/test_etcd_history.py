"""etcd's own history, read by a watch from revision 1: every event with its request id."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import etcd3
import pytest

from chaos.etcd_history import collect, collect_effects
from coordinator import request_ids
from coordinator.domain.effects import EffectState
from coordinator.domain.states import Op, TaskState
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Claim, DownstreamResult
from coordinator.store import EventFilter
from tests.conftest import GRPC_OPTIONS
from tests.lifecycle.support import create_concurrently
from tests.sdk.support import QUEUE, served

PREFIX = "/h"


@pytest.fixture
def own_etcd() -> Iterator[tuple[EtcdProcess, Any]]:
    """An etcd of this test's own: other tests compact the session etcd's history."""
    with EtcdProcess(compaction_retention=None) as proc:  # the checker reads every revision
        client = etcd3.client(proc.host, proc.port, timeout=10, grpc_options=GRPC_OPTIONS)
        try:
            yield proc, client
        finally:
            client.close()


def test_the_watch_from_revision_one_returns_every_transition_with_its_request_id(
    own_etcd: tuple[EtcdProcess, Any],
) -> None:
    proc, client = own_etcd
    with served(proc.endpoint, PREFIX) as running, running.client("w1") as worker:
        with request_ids.bound("create-1"):
            worker.create_task("t1", input=b"x", queue=QUEUE)
        with request_ids.bound("claim-1"):
            claim = worker.claim("t1", ttl=timedelta(seconds=5))
        assert isinstance(claim, Claim)
        with request_ids.bound("commit-1"):
            claim.commit(b"r")
        writes = collect(client, PREFIX, timeout=10)
    assert [(w.task, w.op, w.to_state, w.request_id) for w in writes] == [
        ("t1", Op.CREATE, TaskState.READY, "create-1"),
        ("t1", Op.CLAIM, TaskState.CLAIMED, "claim-1"),
        ("t1", Op.COMMIT, TaskState.DONE, "commit-1"),
    ]
    claimed, commit = writes[1], writes[2]
    assert (
        claimed.generation == claimed.revision == claim.generation
    )  # g = the claim txn's revision
    assert (commit.attempt_id, commit.generation) == (claim.fence.attempt_id, claim.generation)
    assert writes[0].revision < claimed.revision < commit.revision


def test_every_event_of_revisions_many_transitions_share_is_collected_once_in_order(
    own_etcd: tuple[EtcdProcess, Any],
) -> None:
    proc, client = own_etcd
    with served(proc.endpoint, PREFIX) as running:
        # 16 writers at once: group commit puts several creations in one revision.
        create_concurrently(running.store, [f"t{i:03}" for i in range(160)], queue=QUEUE)
        log = [e.position for e in running.store.events.history(EventFilter())]
        writes = collect(client, PREFIX, timeout=10)
    assert [w.position for w in writes] == log  # each event once, in position order
    assert len(log) == 160
    shared = Counter(p.revision for p in log)
    assert max(shared.values()) > 1, "group commit shared no revision: the test proves nothing"


class _Outbox:
    """A downstream that performs every call (in memory)."""

    def execute(self, idempotency_key: str, generation: int, payload: bytes) -> DownstreamResult:
        return DownstreamResult(f"msg-{idempotency_key[-6:]}")

    def lookup(self, idempotency_key: str, generation: int) -> DownstreamResult | None:
        return None


def test_the_effect_watch_returns_every_effect_write_with_its_request_id(
    own_etcd: tuple[EtcdProcess, Any],
) -> None:
    proc, client = own_etcd
    with served(proc.endpoint, PREFIX) as running, running.client("w1") as worker:
        worker.create_task("t1", input=b"x", queue=QUEUE)
        worker.create_task("t2", input=b"y", queue=QUEUE)
        t1_email = running.effect_id("t1", "notify", "email")
        claims = [worker.claim(t, ttl=timedelta(seconds=5)) for t in ("t1", "t2")]
        for n, claim in enumerate(claims, 1):
            assert isinstance(claim, Claim)
            with request_ids.bound(f"effect-{n}"):
                assert claim.effect("notify", "email", b"hi", _Outbox()).done
        writes = collect_effects(client, PREFIX, timeout=10)
    assert [(w.task, w.state, w.request_id) for w in writes] == [
        ("t1", EffectState.PREPARED, "effect-1"),
        ("t1", EffectState.COMMITTED, "effect-1"),
        ("t2", EffectState.PREPARED, "effect-2"),
        ("t2", EffectState.COMMITTED, "effect-2"),
    ]
    assert {w.effect_id for w in writes[:2]} == {t1_email}
    assert [w.revision for w in writes] == sorted({w.revision for w in writes})


def test_a_compacted_history_is_refused(own_etcd: tuple[EtcdProcess, Any]) -> None:
    proc, client = own_etcd
    with served(proc.endpoint, PREFIX) as running, running.client("w1") as worker:
        worker.create_task("t1", input=b"x", queue=QUEUE)
        worker.create_task("t2", input=b"y", queue=QUEUE)
    revision = client.get_response("/").header.revision
    client.compact(revision)
    with pytest.raises(RuntimeError, match="compacted"):
        collect(client, PREFIX, timeout=10)
