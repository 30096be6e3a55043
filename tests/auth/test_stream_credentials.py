"""A stream's credentials are checked for its whole life: a token revoked (the file rewritten)
or expired while its stream is open ends that stream UNAUTHENTICATED, and only that one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from coordinator.config import Config
from coordinator.domain.states import TaskState
from coordinator.server import build_server
from coordinator.server.interceptors.auth import TokenAuth
from coordinator.server.tokens import TokenFile, token_hash
from coordinator.store import Store
from coordinator.store.lifecycle.events import FOLLOW_POLL
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from tests.auth.conftest import TokenRing
from tests.conftest import GRPC_OPTIONS
from tests.helpers import cancel, eventually, next_of
from tests.lifecycle.support import create

RELOAD = 0.2
FOLLOW = tasks_pb2.WatchEventsRequest(follow=True)
LIMITS = Config(token_reload_interval=RELOAD, insecure=True).stream_limits
SLACK = 1.0
ENDS_WITHIN = RELOAD + RELOAD + FOLLOW_POLL + SLACK
"""How soon a revoked token's stream must end, from the configured interval (not a latency
figure): the file's change is seen within RELOAD, every stream is re-checked at least every
RELOAD (serve's sweep, derived from the setting), a follower's handler looks every FOLLOW_POLL,
and SLACK covers scheduling on a busy machine. A sweep that ignored the setting fails it."""


@pytest.fixture
def tasks(store: Store, ring: TokenRing) -> Iterator[tasks_pb2_grpc.TaskServiceStub]:
    """TaskService of a server that reloads the token file every RELOAD seconds, with the
    stream limits ``serve`` derives from that setting (the sweep re-checks at that interval)."""
    auth = TokenAuth(TokenFile(ring.path, reload_interval=RELOAD))
    server, port = build_server(
        store, listen="127.0.0.1:0", max_workers=8, streams=LIMITS, auth=auth
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS)
    try:
        yield tasks_pb2_grpc.TaskServiceStub(channel)
    finally:
        channel.close()
        server.stop(grace=None).wait()


def _ended(call: grpc.CallIterator[tasks_pb2.TaskEvent]) -> grpc.RpcError:
    """The error that ends ``call`` (which has no more events to deliver)."""
    with pytest.raises(grpc.RpcError) as info:
        next_of(call)
    return info.value


def test_a_revoked_tokens_stream_ends_unauthenticated(
    store: Store, ring: TokenRing, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    create(store, "t-1")
    # A deadline far past the reload interval: a stream that is not ended fails DEADLINE_EXCEEDED.
    revoked = tasks.WatchEvents(FOLLOW, metadata=ring.metadata("worker-a"), timeout=30)
    kept = tasks.WatchEvents(FOLLOW, metadata=ring.metadata("worker-b"), timeout=30)
    assert next_of(revoked).task_id == next_of(kept).task_id == "t-1"

    ring.revoke("worker-a")
    revoked_at = time.monotonic()
    error = _ended(revoked)
    assert time.monotonic() - revoked_at <= ENDS_WITHIN
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error.details() == "unknown or revoked bearer token"

    create(store, "t-2")
    assert next_of(kept).task_id == "t-2"  # the other holder's stream goes on
    cancel(kept)


def test_an_expired_tokens_stream_ends_unauthenticated(
    store: Store, ring: TokenRing, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    expires = datetime.now(UTC) + timedelta(seconds=2)
    entry = {"principal": "brief", "roles": ["pm"], "expires_at": expires.isoformat()}
    ring.write(tokens={token_hash("brief-token"): entry})
    create(store, "t-1")
    brief = (("authorization", "Bearer brief-token"),)

    # The server takes the new token at its next reload.
    def accepted() -> bool:
        try:
            tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t-1"), metadata=brief)
        except grpc.RpcError:
            return False
        return True

    eventually(accepted, message="the new token was not taken")
    call = tasks.WatchEvents(FOLLOW, metadata=brief, timeout=30)
    assert next_of(call).task_id == "t-1"
    error = _ended(call)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error.details() == f"bearer token expired at {expires.isoformat()}"


def test_a_long_poll_revoked_while_waiting_wins_nothing(store: Store, ring: TokenRing) -> None:
    # The token file is re-read and long polls re-checked only every hour here: only the check
    # made when the poll wins a task can see the revocation.
    hourly = Config(token_reload_interval=3600, insecure=True).stream_limits
    auth = TokenAuth(TokenFile(ring.path, reload_interval=3600))
    server, port = build_server(
        store, listen="127.0.0.1:0", max_workers=8, streams=hourly, auth=auth
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS)
    try:
        worker = worker_pb2_grpc.WorkerServiceStub(channel)
        epoch = store.admin.epoch()
        poll = worker.ClaimNext.future(
            worker_pb2.ClaimNextRequest(
                queue="default", scheduler_epoch=epoch, ttl_seconds=30, wait_seconds=20
            ),
            metadata=ring.metadata("worker-a"),
            timeout=30,
        )
        eventually(lambda: store.long_poll.waiting() == 1, message="the poll never waited")
        ring.revoke("worker-a")
        create(store, "t-1")
        with pytest.raises(grpc.RpcError) as refused:
            poll.result()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.details() == "unknown or revoked bearer token"
        assert store.tasks.get("t-1").state is TaskState.READY  # given back at once
        again = worker.ClaimNext(
            worker_pb2.ClaimNextRequest(queue="default", scheduler_epoch=epoch, ttl_seconds=30),
            metadata=ring.metadata("worker-b"),
        )
        assert (again.outcome, again.fence.task_id) == (types_pb2.OUTCOME_CLAIMED, "t-1")
    finally:
        channel.close()
        server.stop(grace=None).wait()
