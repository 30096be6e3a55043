"""The run's WatchEvents follower against a real coordinator: it resumes after the last position
it received whenever its stream breaks - refused RESOURCE_EXHAUSTED at the stream caps, ended
UNAVAILABLE at its maximum age - and ends up with exactly the log, each event once, in order."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import grpc

from chaos.follow_check import follower_agreement
from chaos.follower import Follower
from chaos.harness import watched_events
from coordinator.domain.keys import Keyspace
from coordinator.domain.stream_limits import StreamLimits
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import PRINCIPAL_METADATA, Claim
from coordinator.server import build_server
from coordinator.store import EtcdKV, Store
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import cancel, eventually, next_of
from tests.sdk.support import LIMITS, QUEUE, Served

# One stream per principal, and each lives about a second: the follower meets both bounds.
STREAMS = StreamLimits(max_streams=1, max_per_principal=1, max_age=1.0, sweep_interval=0.2)
AS_FOLLOWER = ((PRINCIPAL_METADATA, "follower"),)


@contextmanager
def served_with(endpoint: str, prefix: str) -> Iterator[Served]:
    kv = EtcdKV.connect([endpoint])
    store = Store.open(kv, keys=Keyspace(prefix), limits=LIMITS, scan_interval=1.0)
    store.start()
    server, port = build_server(store, streams=STREAMS)
    try:
        yield Served(f"127.0.0.1:{port}", server, store)
    finally:
        server.stop(0)
        store.close()
        kv.close()


def test_the_follower_resumes_after_every_break_without_gaps_or_repeats(
    etcd: EtcdProcess, prefix: str
) -> None:
    with served_with(etcd.endpoint, prefix) as running, running.client("pm") as pm:
        pm.create_task("t0", input=b"x", queue=QUEUE)
        channel = grpc.insecure_channel(running.target, options=GRPC_OPTIONS)
        # Another stream of the same principal holds its only slot: the follower is refused.
        blocker = tasks_pb2_grpc.TaskServiceStub(channel).WatchEvents(
            tasks_pb2.WatchEventsRequest(queue=QUEUE, follow=True), metadata=AS_FOLLOWER
        )
        assert next_of(blocker).task_id == "t0"  # admitted: it holds the slot
        follower = Follower(
            lambda: grpc.insecure_channel(running.target, options=GRPC_OPTIONS),
            QUEUE,
            AS_FOLLOWER,
        ).start()
        try:
            eventually(lambda: follower.breaks.get("RESOURCE_EXHAUSTED", 0) >= 1)
            cancel(blocker)
            channel.close()
            for n in range(1, 4):
                pm.create_task(f"t{n}", input=b"x", queue=QUEUE)
            eventually(lambda: follower.breaks.get("UNAVAILABLE", 0) >= 1)  # maximum age
            claim = pm.claim("t1", ttl=timedelta(seconds=5))
            assert isinstance(claim, Claim)
            claim.commit(b"r")
            log = watched_events(running.target, QUEUE)
            eventually(lambda: follower.last() == log[-1].position)
        finally:
            follower.stop()
    assert len(log) == 6  # 4 creates, a claim, a commit
    assert follower_agreement(follower.received, log) == []
    assert follower.received == log
