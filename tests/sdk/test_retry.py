"""Transport retries: UNAVAILABLE / DEADLINE_EXCEEDED are retried (bounded), nothing else is.

Tries are counted by a client interceptor, so every retry the SDK makes is seen.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import grpc
import pytest

from coordinator.errors import InvalidArgument, NotFound
from coordinator.etcd_process import EtcdProcess, free_port
from coordinator.sdk import (
    CallRetry,
    Claim,
    OutcomeUnknown,
    TaskState,
    TransportError,
    WorkerClient,
)
from coordinator.sdk._status import NO_COORDINATOR_HINT
from tests.conftest import GRPC_OPTIONS
from tests.sdk.support import QUEUE, CallCounter, served

FAST = CallRetry(
    timeout=timedelta(seconds=2),
    attempts=20,
    initial_backoff=timedelta(milliseconds=50),
    max_backoff=timedelta(milliseconds=300),
)


def client_for(target: str, counter: CallCounter, policy: CallRetry = FAST) -> WorkerClient:
    """A client whose every try passes through ``counter``."""
    return WorkerClient(
        target,
        principal="retrier",
        channel_options=GRPC_OPTIONS,
        retry=policy,
        interceptors=[counter],
    )


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    """Servers started in the background are stopped after the test."""
    with ExitStack() as exits:
        yield exits


def serve_later(stack: ExitStack, etcd: EtcdProcess, prefix: str, port: int) -> threading.Timer:
    """Start a coordinator on ``port`` half a second from now (stopped with ``stack``)."""
    listen = f"127.0.0.1:{port}"
    timer = threading.Timer(
        0.5, lambda: stack.enter_context(served(etcd.endpoint, prefix, listen=listen))
    )
    timer.start()
    return timer


def test_a_call_succeeds_once_the_server_comes_up(
    etcd: EtcdProcess, prefix: str, stack: ExitStack
) -> None:
    port = free_port()
    counter = CallCounter()
    with client_for(f"127.0.0.1:{port}", counter) as client:
        timer = serve_later(stack, etcd, prefix, port)
        assert client.epoch() == 1
        timer.join()
    assert counter.calls["GetEpoch"] > 1


def test_a_commit_survives_a_coordinator_restart_on_the_same_port(
    etcd: EtcdProcess, prefix: str, stack: ExitStack
) -> None:
    first = ExitStack()
    stack.callback(first.close)  # a no-op once closed below
    running = first.enter_context(served(etcd.endpoint, prefix))
    port = int(running.target.rsplit(":", 1)[1])
    counter = CallCounter()
    with client_for(running.target, counter) as client:
        client.create_task("t1", input=b"x", queue=QUEUE)
        claim = client.claim("t1", ttl=timedelta(seconds=10))
        assert isinstance(claim, Claim)
        first.close()  # the coordinator goes away...
        timer = serve_later(stack, etcd, prefix, port)
        outcome = claim.commit(b"result")
        timer.join()
    assert outcome.committed
    assert counter.calls["Commit"] > 1


def test_a_commit_is_retried_past_what_the_local_clock_says_is_left_of_the_lease(
    etcd: EtcdProcess, prefix: str, stack: ExitStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit stopped retrying when the lease by the local clock ran out: in an etcd or
    coordinator outage longer than what was left, finished work was thrown away and ran again,
    although etcd still held the lease (it keeps leases across its own restart). The fence
    decides: a commit after a takeover is FENCED."""
    first = ExitStack()
    stack.callback(first.close)
    running = first.enter_context(served(etcd.endpoint, prefix))
    port = int(running.target.rsplit(":", 1)[1])
    with client_for(running.target, CallCounter()) as client:
        client.create_task("t1", input=b"x", queue=QUEUE)
        claim = client.claim("t1", ttl=timedelta(seconds=30))
        assert isinstance(claim, Claim)
        monkeypatch.setattr(claim, "remaining", lambda: timedelta(seconds=0.2))
        first.close()  # the coordinator is away longer than the local clock gives the lease
        timer = serve_later(stack, etcd, prefix, port)
        outcome = claim.commit(b"result")
        timer.join()
    assert outcome.committed


class LoseFirstResponse(CallCounter):
    """Lets the first try of ``method`` reach the server, then reports UNAVAILABLE instead."""

    def __init__(self, method: str) -> None:
        super().__init__()
        self._method = method

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        response = super().intercept_unary_unary(continuation, details, request)
        if details.method.endswith(self._method) and self.calls[self._method] == 1:
            response.result()  # the call completed on the server...
            raise _Unavailable()  # ...but its answer is lost
        return response


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the response was lost"


def test_a_commit_whose_response_was_lost_is_retried_into_committed(
    etcd: EtcdProcess, prefix: str
) -> None:
    counter = LoseFirstResponse("Commit")
    with served(etcd.endpoint, prefix) as running, client_for(running.target, counter) as client:
        client.create_task("t1", input=b"x", queue=QUEUE)
        claim = client.claim("t1", ttl=timedelta(seconds=10))
        assert isinstance(claim, Claim)
        outcome = claim.commit(b"result")
        assert outcome.committed  # the retry found its own commit: COMMITTED, not FENCED
        assert client.get_task("t1").result_commit_id == outcome.result_commit_id
    assert counter.calls["Commit"] == 2


def test_a_job_left_on_an_unknown_commit_learns_from_its_release_that_it_landed(
    etcd: EtcdProcess, prefix: str
) -> None:
    counter = LoseFirstResponse("Commit")
    once = CallRetry(attempts=1)  # the lost answer is the last word: OutcomeUnknown
    with (
        served(etcd.endpoint, prefix) as running,
        client_for(running.target, counter, once) as client,
    ):
        client.create_task("t1", input=b"x", queue=QUEUE)
        claim = client.claim("t1", ttl=timedelta(seconds=10))
        assert isinstance(claim, Claim)
        with pytest.raises(OutcomeUnknown, match="outcome unknown, not failed"), claim:
            claim.commit(b"result")
        # Leaving the block on the exception reported a failure; the answer (FENCED /
        # ALREADY_COMMITTED) told the claim its own commit had landed.
        assert claim.committed and not claim.is_lost(), claim.lost_reason
        assert client.get_task("t1").state is TaskState.DONE
    assert counter.calls == {
        "CreateTask": 1,
        "GetEpoch": 1,
        "Claim": 1,
        "Commit": 1,
        "Fail": 1,
        "GetTask": 1,
    }


def test_errors_that_are_not_transport_errors_are_not_retried(
    etcd: EtcdProcess, prefix: str
) -> None:
    counter = CallCounter()
    with served(etcd.endpoint, prefix) as running, client_for(running.target, counter) as client:
        with pytest.raises(NotFound):
            client.get_task("missing")
        with pytest.raises(InvalidArgument):
            client.create_task("not a valid id!", input=b"x")
    assert counter.calls == {"GetTask": 1, "CreateTask": 1}


def test_retries_are_bounded() -> None:
    counter = CallCounter()
    policy = CallRetry(
        timeout=timedelta(seconds=1),
        attempts=3,
        initial_backoff=timedelta(milliseconds=10),
        max_backoff=timedelta(milliseconds=50),
    )
    with client_for(f"127.0.0.1:{free_port()}", counter, policy) as client:
        with pytest.raises(TransportError) as raised:
            client.get_task("t1")
        assert raised.value.code == "UNAVAILABLE"
        # No coordinator ever took a try: gRPC says so, and the error is not OutcomeUnknown.
        assert type(raised.value) is TransportError
        assert str(raised.value).endswith("no try reached a coordinator" + NO_COORDINATOR_HINT)
        # Without an id a retried create could create a second task: one try only.
        with pytest.raises(TransportError):
            client.create_task(input=b"x")
    assert counter.calls == {"GetTask": 3, "CreateTask": 1}


class _LostResponse(grpc.RpcError):
    """What a client sees when the server's answer never arrives."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the response was lost on the way back"


class LoseFirstCreateResponse(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Lets the first CreateTask reach the server and finish there, then loses its answer."""

    def __init__(self) -> None:
        self.tries = 0

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        outcome = continuation(details, request)
        if details.method.endswith("/CreateTask"):
            self.tries += 1
            if self.tries == 1:
                outcome.result()  # it landed: the task exists now
                raise _LostResponse()
        return outcome


@pytest.mark.parametrize("key", ["create-once-1", ""])
def test_a_generated_id_create_is_retried_only_with_an_idempotency_key(
    etcd: EtcdProcess, prefix: str, key: str
) -> None:
    lose = LoseFirstCreateResponse()
    with (
        served(etcd.endpoint, prefix) as running,
        WorkerClient(
            running.target,
            principal="producer",
            channel_options=GRPC_OPTIONS,
            retry=FAST,
            interceptors=[lose],
        ) as client,
    ):
        if key:
            created = client.create_task(input=b"x", queue=QUEUE, idempotency_key=key)
            # The retry got the landed try's answer: its generated id, and no second task.
            assert lose.tries == 2
            assert [t.task_id for t in client.list_tasks(queue=QUEUE)] == [created.task_id]
        else:
            with pytest.raises(TransportError):
                client.create_task(input=b"x", queue=QUEUE)
            assert lose.tries == 1  # no retry without an id or a key: it could duplicate
            assert len(client.list_tasks(queue=QUEUE)) == 1
